//! How long this process's launches occupy the GPU, measured by a pair of events around each.
//!
//! The start event completes when the stream reaches the launch, the end event when the launch
//! is done, so their distance is the launch's own time on the GPU. Pairs are checked without
//! waiting on later launches; what finished is settled against the pacing clock (it was admitted
//! on an estimate) and teaches the estimate for the next launch of the same work.

use std::collections::VecDeque;
use std::sync::atomic::AtomicU64;

use crate::compute::pace;
use crate::driver::{self, sys::*};
use crate::error::HookError;
use crate::ledger::Ledger;

/// Launches in flight per context before a launch waits for the oldest to finish: bounds what
/// the clock has admitted on estimates alone.
const MAX_PENDING: usize = 256;
/// Work identities whose durations are remembered (direct-mapped).
const ESTIMATES: usize = 64;
/// How often the measured utilisation is shown to the monitor.
const PUBLISH_EVERY: u64 = 1_000_000_000;

#[derive(Clone, Copy)]
struct EventPair {
    start: CUevent,
    end: CUevent,
}

struct Pending {
    events: EventPair,
    key: usize,
    /// GPU nanoseconds the clock was charged at admission.
    charged: u64,
    /// Admitted before its work had ever been measured (charged nothing).
    guessed: bool,
}

/// The launches of one context (one device) and what they have taught us.
pub struct Meter {
    pub context: usize,
    device: usize,
    idle: Vec<EventPair>,
    pending: VecDeque<Pending>,
    estimates: [(usize, u64); ESTIMATES],
    busy: u64,
    since: u64,
}

// SAFETY: the event handles are driver objects usable from any thread; a `Meter` is only used
// under its limiter's mutex.
unsafe impl Send for Meter {}

impl Meter {
    pub fn new(context: usize, device: usize) -> Meter {
        Meter {
            context,
            device,
            idle: Vec::new(),
            pending: VecDeque::new(),
            estimates: [(0, 0); ESTIMATES],
            busy: 0,
            since: pace::now(),
        }
    }

    /// What the clock should be charged for launching `key` now: its last measured duration.
    /// Work never measured yet gets `None`.
    pub fn estimate(&self, key: usize) -> Option<u64> {
        let (seen, nanos) = self.estimates[slot(key)];
        (seen == key && key != 0).then_some(nanos)
    }

    /// Waits until no launch admitted without an estimate is still running, and settles. An
    /// application queues far ahead of the GPU, so without this a loop of new work would all be
    /// admitted before the first launch of it had been measured.
    pub fn await_guesses(&mut self, clock: &AtomicU64, percent: u64, ledger: &dyn Ledger) {
        let cuda = driver::cuda();
        if let Some(last) = self.pending.iter().rev().find(|pending| pending.guessed) {
            let end = last.events.end;
            cuda.with_relaxed_capture(|| cuda.event_wait(end)).ok();
            self.settle(clock, percent, ledger);
        }
    }

    /// Settles every launch that has finished, oldest first, and shows the utilisation to the
    /// monitor now and then. When `MAX_PENDING` are in flight, waits for the oldest first.
    /// Launches were admitted on the clock at `percent`; corrections use the same rate.
    pub fn settle(&mut self, clock: &AtomicU64, percent: u64, ledger: &dyn Ledger) {
        let cuda = driver::cuda();
        // Nothing in flight (the common case between sparse launches): no driver call at all.
        let in_flight = !self.pending.is_empty();
        let settle_finished = || {
            if self.pending.len() >= MAX_PENDING
                && let Some(oldest) = self.pending.front()
            {
                let _ = cuda.event_wait(oldest.events.end);
            }
            while let Some(oldest) = self.pending.front() {
                match cuda.event_done(oldest.events.end) {
                    Ok(false) => break,
                    Ok(true) => {
                        let measured = cuda.elapsed_ns(oldest.events.start, oldest.events.end);
                        self.finish(clock, percent, measured);
                    }
                    // The context is gone (or the events with it): forget the launch as charged.
                    Err(_) => {
                        self.pending.pop_front();
                    }
                }
            }
        };
        if in_flight {
            cuda.with_relaxed_capture(settle_finished);
        }
        let now = pace::now();
        if now.saturating_sub(self.since) >= PUBLISH_EVERY {
            let busy = (self.busy.saturating_mul(100) / (now - self.since)).min(100);
            ledger.publish_utilisation(self.device, busy);
            self.busy = 0;
            self.since = now;
        }
    }

    fn finish(&mut self, clock: &AtomicU64, percent: u64, measured: Result<u64, HookError>) {
        let Some(done) = self.pending.pop_front() else { return };
        self.idle.push(done.events);
        let Ok(measured) = measured else { return };
        self.busy = self.busy.saturating_add(measured);
        let correction = pace::wall_cost(measured.abs_diff(done.charged), percent) as i64;
        pace::correct(clock, if measured >= done.charged { correction } else { -correction });
        self.estimates[slot(done.key)] = (done.key, measured);
    }

    /// Launches through `call` between the two events of a pair on `stream`. A launch whose
    /// events cannot be recorded still happens; it is then not measured (its estimate stands).
    pub fn measure(
        &mut self,
        stream: CUstream,
        key: usize,
        charged: Option<u64>,
        call: impl FnOnce() -> CUresult,
    ) -> CUresult {
        let cuda = driver::cuda();
        let Some(events) = self.pair() else { return call() };
        if cuda.event_record(events.start, stream).is_err() {
            self.idle.push(events);
            return call();
        }
        let status = call();
        if status == CUDA_SUCCESS && cuda.event_record(events.end, stream).is_ok() {
            let guessed = charged.is_none();
            self.pending.push_back(Pending { events, key, charged: charged.unwrap_or(0), guessed });
        } else {
            self.idle.push(events);
        }
        status
    }

    fn pair(&mut self) -> Option<EventPair> {
        if let Some(events) = self.idle.pop() {
            return Some(events);
        }
        let cuda = driver::cuda();
        let start = cuda.event_create().ok()?;
        match cuda.event_create() {
            Ok(end) => Some(EventPair { start, end }),
            Err(_) => {
                cuda.event_destroy(start);
                None
            }
        }
    }
}

fn slot(key: usize) -> usize {
    (key ^ key >> 7 ^ key >> 17) % ESTIMATES
}
