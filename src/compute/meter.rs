//! How long this process's launches occupy the GPU, measured by a pair of events around each.
//!
//! The start event completes when the stream reaches the launch, the end event when the launch
//! is done, so their distance is the launch's own time on the GPU. Pairs are checked without
//! waiting on later launches; what finished is settled against the pacing clock (it was admitted
//! on an estimate) and teaches the estimate for the next launch of the same work.
//!
//! Another process on the same GPU spoils that distance: the GPU time-slices between processes,
//! and when another process's context cuts in while one of our launches runs, the pair measures
//! our launch plus the other's slice (on an H200 this alone turned a 30/70 split into 38/62).
//! Cut-ins only ever add, so while NVML shows other processes on the device a launch is charged
//! the least of the recent durations of the same work, the way a network filters queueing delay
//! out of round-trip times with a windowed minimum. Alone on the device, a launch is charged what
//! it measured, so work whose duration varies with its data is never under-charged there.
//!
//! Under MPS a context may be held to part of the SMs (the client's
//! `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`, or an execution affinity it was created with). Its kernels
//! then occupy at most that part of the GPU while they run, and are charged that part of their
//! time: a share of 30 with a cap of 30 % of the SMs runs all the time on its 30 %, instead of 30 %
//! of the time on 30 % (the product, 9 %). Copies and memsets do not run on the capped SMs and are
//! charged their whole time.

use std::collections::VecDeque;
use std::sync::atomic::AtomicU64;

use crate::compute::{Launch, mps, pace};
use crate::driver::{self, sys::*};
use crate::error::HookError;
use crate::ledger::Ledger;

/// Launches in flight per context before a launch waits for the oldest to finish: bounds what
/// the clock has admitted on estimates alone.
const MAX_PENDING: usize = 256;
/// The table of remembered work: sets, chosen by a work identity's hash, of a few identities each,
/// the least recently measured giving way. (A direct-mapped table of 64 let two kinds of work that
/// one loop launches in turn evict each other: neither ever had an estimate, so every launch waited
/// for the one before it. Seen on an H100: a 70 % share's matmul loop did 0.58 of a process alone
/// where it did 0.68 in the runs before and after.)
const SETS: usize = 64;
const WAYS: usize = 4;
/// Durations remembered per work identity: enough that some were not cut into even when another
/// process cuts in on most of our launches.
const WINDOW: usize = 8;
/// A context MPS holds to part of the SMs, beside other processes, times one launch in this many
/// of the same work. Its charge there is the least of the recent durations whatever one launch
/// measured, so timing every launch only refreshes that window, and each pair of events costs the
/// GPU a little time of its own (measured: a matmul loop at 6500 launches a second kept its SMs
/// busy 1 % less than MPS's own limit, and did 2–4 % less work).
const SAMPLE_CAPPED: u32 = 4;
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
    /// Kernels or a graph, which run on the context's SMs (not a copy or memset).
    uses_sms: bool,
}

/// The recent measured durations of one work identity.
#[derive(Clone, Copy, Default)]
struct History {
    key: usize,
    /// The work runs on the context's SMs (see `Pending`).
    uses_sms: bool,
    recent: [u64; WINDOW],
    len: usize,
    next: usize,
    /// Launches since the last one timed (see `SAMPLE_CAPPED`).
    untimed: u32,
    /// When it was last measured, in the table's own count: the least recent gives way.
    measured_at: u64,
}

impl History {
    fn push(&mut self, nanos: u64) {
        self.recent[self.next] = nanos;
        self.next = (self.next + 1) % WINDOW;
        self.len = (self.len + 1).min(WINDOW);
    }

    fn last(&self) -> u64 {
        self.recent[(self.next + WINDOW - 1) % WINDOW]
    }

    fn least(&self) -> u64 {
        self.recent[..self.len].iter().copied().min().unwrap_or(0)
    }
}

/// What is remembered of each work identity, set-associative (see `SETS`).
struct Estimates {
    entries: Vec<History>,
    measurements: u64,
}

impl Estimates {
    fn new() -> Estimates {
        Estimates { entries: vec![History::default(); SETS * WAYS], measurements: 0 }
    }

    fn set(key: usize) -> std::ops::Range<usize> {
        let set = (key ^ key >> 7 ^ key >> 17) % SETS;
        set * WAYS..(set + 1) * WAYS
    }

    /// The history of `key`, if it has one (key 0 identifies no work).
    fn get(&self, key: usize) -> Option<&History> {
        self.entries[Self::set(key)].iter().find(|history| history.key == key && key != 0 && history.len > 0)
    }

    fn get_mut(&mut self, key: usize) -> Option<&mut History> {
        self.entries[Self::set(key)]
            .iter_mut()
            .find(|history| history.key == key && key != 0 && history.len > 0)
    }

    /// The history a new measurement of `key` goes into: its own, else the least recently measured
    /// of its set, started afresh.
    fn measured(&mut self, key: usize, uses_sms: bool) -> &mut History {
        self.measurements += 1;
        let now = self.measurements;
        let set = &mut self.entries[Self::set(key)];
        let way = match set.iter().position(|history| history.key == key) {
            Some(way) => way,
            None => {
                let way = (0..WAYS).min_by_key(|&way| set[way].measured_at).unwrap_or(0);
                set[way] = History { key, uses_sms, ..History::default() };
                way
            }
        };
        set[way].measured_at = now;
        &mut set[way]
    }
}

/// The launches of one context (one device) and what they have taught us.
pub struct Meter {
    pub context: usize,
    device: usize,
    idle: Vec<EventPair>,
    pending: VecDeque<Pending>,
    estimates: Estimates,
    /// The context's part of the device's SMs, in thousandths: 1000 unless MPS caps it.
    sm_part: u64,
    /// Other processes have contexts on the device, so measurements may include their slices.
    shared_gpu: bool,
    /// Since `since`: GPU nanoseconds charged, measured (with any cut-ins), and launches settled.
    busy: u64,
    measured: u64,
    launches: u64,
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
            estimates: Estimates::new(),
            sm_part: sm_part(device),
            shared_gpu: others_on_device(device),
            busy: 0,
            measured: 0,
            launches: 0,
            since: pace::now(),
        }
    }

    /// What the clock should be charged for launching `key` now: what its last launch was
    /// charged. Work never measured yet gets `None`.
    pub fn estimate(&self, key: usize) -> Option<u64> {
        self.estimates.get(key).map(|history| self.own_time(history))
    }

    /// The GPU time of `history`'s work that is its own: the last duration, or while other
    /// processes share the GPU the least recent one; for work on SMs an MPS cap holds to part of
    /// the GPU, that part of it.
    fn own_time(&self, history: &History) -> u64 {
        let duration = if self.shared_gpu { history.least() } else { history.last() };
        if history.uses_sms { scale(duration, self.sm_part) } else { duration }
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
            tracing::debug!(
                device = self.device,
                launches = self.launches,
                charged_us = self.busy / 1000,
                measured_us = self.measured / 1000,
                elapsed_us = (now - self.since) / 1000,
                shared_gpu = self.shared_gpu,
                "launches settled"
            );
            (self.busy, self.measured, self.launches) = (0, 0, 0);
            self.since = now;
            self.shared_gpu = others_on_device(self.device);
        }
    }

    fn finish(&mut self, clock: &AtomicU64, percent: u64, measured: Result<u64, HookError>) {
        let Some(done) = self.pending.pop_front() else { return };
        self.idle.push(done.events);
        let Ok(measured) = measured else { return };
        let history = self.estimates.measured(done.key, done.uses_sms);
        history.push(measured);
        let history = *history;
        let own = self.own_time(&history);
        self.busy = self.busy.saturating_add(own);
        self.measured = self.measured.saturating_add(measured);
        self.launches += 1;
        let correction = pace::wall_cost(own.abs_diff(done.charged), percent) as i64;
        pace::correct(clock, if own >= done.charged { correction } else { -correction });
    }

    /// Launches through `call` between the two events of a pair on `stream`. A launch whose
    /// events cannot be recorded still happens; it is then not measured (its estimate stands).
    pub fn measure(
        &mut self,
        launch: Launch,
        charged: Option<u64>,
        call: impl FnOnce() -> CUresult,
    ) -> CUresult {
        let Launch { stream, key, uses_sms } = launch;
        if let Some(estimate) = charged
            && self.goes_untimed(key)
        {
            let status = call();
            if status == CUDA_SUCCESS {
                self.busy = self.busy.saturating_add(estimate);
                self.launches += 1;
            }
            return status;
        }
        let cuda = driver::cuda();
        let Some(events) = self.pair() else { return call() };
        if cuda.event_record(events.start, stream).is_err() {
            self.idle.push(events);
            return call();
        }
        let status = call();
        if status == CUDA_SUCCESS && cuda.event_record(events.end, stream).is_ok() {
            let guessed = charged.is_none();
            self.pending.push_back(Pending { events, key, charged: charged.unwrap_or(0), guessed, uses_sms });
        } else {
            self.idle.push(events);
        }
        status
    }

    /// Whether this launch of `key` is charged its estimate without being timed: only on a
    /// context MPS caps, beside other processes, for work with a history, all but one launch in
    /// `SAMPLE_CAPPED`.
    fn goes_untimed(&mut self, key: usize) -> bool {
        if !self.shared_gpu || self.sm_part == 1000 {
            return false;
        }
        let Some(history) = self.estimates.get_mut(key) else { return false };
        history.untimed = (history.untimed + 1) % SAMPLE_CAPPED;
        history.untimed != 0
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

/// The current context's part of CUDA device `device`'s SMs, in thousandths (`mps::sm_part`,
/// with the context's SM count as the driver reports it: its execution affinity, else the
/// device's SM count as this process sees it).
fn sm_part(device: usize) -> u64 {
    let cuda = driver::cuda();
    let sms = cuda.current_sm_affinity().or_else(|_| {
        cuda.device_attribute(device as i32, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map(|sms| sms.max(0) as u32)
    });
    let Ok(sms) = sms else { return 1000 };
    let part = mps::sm_part(device, sms);
    if part < 1000 {
        tracing::debug!(
            "device {device}: under MPS this context's kernels may use {}.{} % of the SMs; they are charged that \
             part of their time",
            part / 10,
            part % 10
        );
    }
    part
}

/// `nanos` scaled by `part` thousandths.
fn scale(nanos: u64, part: u64) -> u64 {
    (u128::from(nanos) * u128::from(part) / 1000) as u64
}

/// Whether NVML shows processes other than this one with a context on CUDA device `device`.
/// Unknown (no NVML, a device it cannot match) counts as alone: launches are then charged what
/// they measured, which never lets the container exceed its share.
fn others_on_device(device: usize) -> bool {
    let Some(uuid) = driver::cuda_device_uuids().get(device) else { return false };
    driver::nvml().compute_processes_by_uuid(uuid).is_ok_and(|count| count > 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_launched_in_turn_keeps_its_estimates_and_the_least_recent_gives_way() {
        // WAYS + 1 identities that fall in one set.
        let keys: Vec<usize> =
            (1..).filter(|&k| Estimates::set(k) == Estimates::set(1)).take(WAYS + 1).collect();
        let mut estimates = Estimates::new();
        for round in 0..3 {
            for (n, &key) in keys[..WAYS].iter().enumerate() {
                estimates.measured(key, true).push(1000 * (n as u64 + 1) + round);
            }
        }
        for (n, &key) in keys[..WAYS].iter().enumerate() {
            assert_eq!(estimates.get(key).map(History::last), Some(1000 * (n as u64 + 1) + 2), "key {key}");
        }
        // One more identity in the full set takes the place of the least recently measured.
        estimates.measured(keys[WAYS], true).push(7);
        assert!(estimates.get(keys[0]).is_none());
        assert_eq!(estimates.get(keys[WAYS]).map(History::last), Some(7));
        assert!(keys[1..WAYS].iter().all(|&key| estimates.get(key).is_some()));
        assert!(estimates.get(0).is_none(), "key 0 identifies no work");
    }

    #[test]
    fn a_history_keeps_the_last_window_of_durations() {
        let mut history = History::default();
        assert_eq!(history.least(), 0);
        history.push(30);
        history.push(10);
        history.push(20);
        assert_eq!((history.last(), history.least()), (20, 10));
        // Eight later durations push the 10 out of the window.
        for nanos in 11..=18 {
            history.push(nanos * 2);
        }
        assert_eq!((history.last(), history.least()), (36, 22));
    }
}
