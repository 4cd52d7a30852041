//! How long this process's launches occupy the GPU, measured by pairs of events around some of
//! them.
//!
//! The start event completes when the stream reaches the launch, the end event when the launch
//! is done, so their distance is the launch's own time on the GPU. Pairs are checked without
//! waiting on later launches; what finished is settled against the pacing clock (it was admitted
//! on an estimate) and teaches the estimate for the next launch of the same work.
//!
//! A pair costs two `cuEventRecord` calls (about 2.7 µs of CPU on an H100, against ~5 µs for the
//! launch itself), so timing every launch slowed launch-bound inference by a quarter. Work is
//! therefore *sampled by its GPU time*: work never measured is timed, and then a launch of the same
//! work is timed once the launches since its last timed one have been charged about
//! `TIME_EVERY` of GPU time (a random point between half and one and a half of it, so that work
//! whose durations follow a pattern is not sampled in step with it). The launches in between are
//! charged the mean of the work's recent durations. Work of `TIME_EVERY` or more is timed at
//! every launch, as before; a loop of 10 µs kernels is timed about once in twenty launches, and
//! what timing costs grows with the GPU time used, never with the number of launches.
//!
//! Another process on the same GPU spoils that distance: the GPU time-slices between processes,
//! and when another process's context cuts in while one of our launches runs, the pair measures
//! our launch plus the other's slice (on an H200 this alone turned a 30/70 split into 38/62).
//! Cut-ins only ever add, so while NVML shows other processes on the device a launch is charged
//! the least of the recent durations of the same work, the way a network filters queueing delay
//! out of round-trip times with a windowed minimum. Alone on the device, a timed launch is charged what
//! it measured, and an untimed one the mean of its work's recent durations, so work whose duration
//! varies with its data is not under-charged there.
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
/// The GPU time a work identity runs untimed, on average, between two timed launches (see the
/// module's comment). Two event records per 200 µs of GPU time cost at most ~1.4 % of a CPU.
const TIME_EVERY: u64 = 200_000;
/// A context MPS holds to part of the SMs, beside other processes, times at most one launch in
/// this many of the same work, however long. Its charge there is the least of the recent durations
/// whatever one launch measured, so timing every launch only refreshes that window, and each pair
/// of events costs the GPU a little time of its own (measured: a matmul loop at 6500 launches a
/// second kept its SMs busy 1 % less than MPS's own limit, and did 2–4 % less work).
const SAMPLE_CAPPED: u32 = 4;
/// Finished pairs are looked for at most this often (each look is a `cuEventQuery`), unless
/// `MAX_PENDING` are in flight.
const POLL_EVERY: u64 = 50_000;
/// How often the measured utilisation is shown to the monitor.
const PUBLISH_EVERY: u64 = 1_000_000_000;

/// How one launch goes ([`Meter::plan`]): what the clock is charged for it (`None`: work never
/// measured, charged nothing until it is), and whether a pair of events times it.
#[derive(Clone, Copy, Debug)]
pub struct Plan {
    pub estimate: Option<u64>,
    pub timed: bool,
}

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
    /// Host nanoseconds the launch call took after the start was recorded, when the start was
    /// already stamped as the call returned (see `own_part`); else 0.
    host_gap: u64,
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
    /// The least and the mean of `recent`, kept as each duration comes in (every launch reads
    /// one, only timed launches push).
    least: u64,
    mean: u64,
    /// Launches, and GPU nanoseconds charged, since the last one timed.
    untimed: u32,
    untimed_ns: u64,
    /// The untimed GPU time after which the next launch is timed (about `TIME_EVERY`).
    time_at: u64,
    /// When it was last measured, in the table's own count: the least recent gives way.
    measured_at: u64,
}

impl History {
    fn push(&mut self, nanos: u64) {
        self.recent[self.next] = nanos;
        self.next = (self.next + 1) % WINDOW;
        self.len = (self.len + 1).min(WINDOW);
        let recent = &self.recent[..self.len];
        self.least = recent.iter().copied().min().unwrap_or(0);
        let sum: u128 = recent.iter().map(|&nanos| u128::from(nanos)).sum();
        self.mean = (sum / self.len as u128) as u64;
    }

    #[cfg(test)]
    fn last(&self) -> u64 {
        self.recent[(self.next + WINDOW - 1) % WINDOW]
    }

    fn least(&self) -> u64 {
        self.least
    }

    /// Whether the launch about to be charged `estimate` is timed (see `Meter::goes_untimed`); a
    /// timed one draws, from `random`, the untimed GPU time after which the next one is.
    fn times(&mut self, estimate: u64, capped_beside_others: bool, random: &mut u64) -> bool {
        let ran = self.untimed_ns.saturating_add(estimate);
        let sampled_enough = !capped_beside_others || self.untimed + 1 >= SAMPLE_CAPPED;
        if ran >= self.time_at && sampled_enough {
            self.untimed = 0;
            self.untimed_ns = 0;
            self.time_at = TIME_EVERY / 2 + next_random(random) % TIME_EVERY;
            return true;
        }
        self.untimed += 1;
        self.untimed_ns = ran;
        false
    }

    fn mean(&self) -> u64 {
        self.mean
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
    #[cfg(test)]
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
    pub device: usize,
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
    /// When finished pairs were last looked for.
    polled: u64,
    /// Draws the points at which work is timed next.
    random: u64,
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
            polled: 0,
            random: pace::now() | 1,
        }
    }

    /// How a launch of `key` goes now: what the clock is charged for it (its work's own time,
    /// [`own_time`]; `None` for work never measured), and whether it is timed (see
    /// `History::times`; work never measured always is). Asked once per launch.
    pub fn plan(&mut self, key: usize) -> Plan {
        let (shared_gpu, sm_part) = (self.shared_gpu, self.sm_part);
        let random = &mut self.random;
        match self.estimates.get_mut(key) {
            None => Plan { estimate: None, timed: true },
            Some(history) => {
                let estimate = own_time(history, shared_gpu, sm_part);
                let timed = history.times(estimate, shared_gpu && sm_part < 1000, random);
                Plan { estimate: Some(estimate), timed }
            }
        }
    }

    /// Waits until no launch admitted without an estimate is still running, and settles. An
    /// application queues far ahead of the GPU, so without this a loop of new work would all be
    /// admitted before the first launch of it had been measured.
    pub fn await_guesses(&mut self, clock: &AtomicU64, percent: u64, ledger: &dyn Ledger) {
        let cuda = driver::cuda();
        if let Some(last) = self.pending.iter().rev().find(|pending| pending.guessed) {
            let end = last.events.end;
            cuda.with_relaxed_capture(|| cuda.event_wait(end)).ok();
            self.polled = 0;
            self.settle(clock, percent, ledger);
        }
    }

    /// Settles every launch that has finished, oldest first, and shows the utilisation to the
    /// monitor now and then. When `MAX_PENDING` are in flight, waits for the oldest first.
    /// Launches were admitted on the clock at `percent`; corrections use the same rate.
    pub fn settle(&mut self, clock: &AtomicU64, percent: u64, ledger: &dyn Ledger) {
        self.settle_at(clock, percent, ledger, pace::now());
    }

    /// [`Meter::settle`] at `now`, a [`pace::now`] the caller has just read.
    pub fn settle_at(&mut self, clock: &AtomicU64, percent: u64, ledger: &dyn Ledger, now: u64) {
        let cuda = driver::cuda();
        // Nothing in flight (the common case between sparse launches), or looked very recently:
        // no driver call at all.
        let full = self.pending.len() >= MAX_PENDING;
        let due = now.saturating_sub(self.polled) >= POLL_EVERY || full;
        let in_flight = !self.pending.is_empty() && due;
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
                        let host_gap = oldest.host_gap;
                        let measured = cuda.elapsed_ns(oldest.events.start, oldest.events.end);
                        self.finish(clock, percent, measured.map(|measured| own_part(measured, host_gap)));
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
            self.polled = now;
        }
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
        let own = own_time(&history, self.shared_gpu, self.sm_part);
        self.busy = self.busy.saturating_add(own);
        self.measured = self.measured.saturating_add(measured);
        self.launches += 1;
        let correction = pace::wall_cost(own.abs_diff(done.charged), percent) as i64;
        pace::correct(clock, if own >= done.charged { correction } else { -correction });
    }

    /// Launches through `call` between the two events of a pair on `stream`. A launch whose
    /// events cannot be recorded still happens; it is then not measured (its estimate stands).
    pub fn measure(&mut self, launch: Launch, plan: Plan, call: impl FnOnce() -> CUresult) -> CUresult {
        let Launch { stream, key, uses_sms } = launch;
        let charged = plan.estimate;
        if let Some(estimate) = charged
            && !plan.timed
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
        let recorded = pace::now();
        let status = call();
        let returned = pace::now();
        if status == CUDA_SUCCESS && cuda.event_record(events.end, stream).is_ok() {
            // A kernel or graph launch returns once its work is queued; a synchronous copy only
            // once it is done, so its call's time is the copy's own.
            let stamped =
                uses_sms && cuda.with_relaxed_capture(|| cuda.event_done(events.start)).unwrap_or(false);
            let host_gap = if stamped { returned.saturating_sub(recorded) } else { 0 };
            let (guessed, charged) = (charged.is_none(), charged.unwrap_or(0));
            self.pending.push_back(Pending { events, key, charged, guessed, uses_sms, host_gap });
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

/// The least GPU time a timed launch is charged once its host gap is taken out (see `own_part`):
/// back-to-back kernels start about a microsecond apart on an H100, so no launch costs the GPU
/// less, and a charge of nothing would let tiny work run unpaced.
const LEAST_LAUNCH_NS: u64 = 1_000;

/// The part of a pair's `measured` distance that is the launch's own GPU time.
///
/// The start event is stamped when its stream reaches it: at once on an idle stream, before the
/// launch call has spent its CPU time (3-5 µs of a real driver, more for a graph) and its work
/// has reached the GPU. A loop of short kernels launched one by one finds its stream idle at
/// nearly every launch, and was charged those gaps too: it looked twice as busy as it was, so
/// shares of 50 cost a decode loop 4 % of its throughput on an H200, and empty kernels under a
/// share of 90 ran at 0.55 of their rate under a budget alone (docs/compute-limit.md,
/// "Launch-bound inference"). So when the start was already stamped as a kernel or graph launch
/// returned, the call's time after the start was recorded (`host_gap`) is taken out. A start
/// stamped later waited for earlier work on its stream, and the launch's work followed it at once.
fn own_part(measured: u64, host_gap: u64) -> u64 {
    if host_gap == 0 {
        return measured;
    }
    measured.saturating_sub(host_gap).max(LEAST_LAUNCH_NS.min(measured))
}

/// The GPU time of `history`'s work that is its own: the mean of its recent durations, or while
/// other processes share the GPU (`shared_gpu`) the least of them; for work on SMs an MPS cap holds
/// to `sm_part` thousandths of the GPU, that part of it.
fn own_time(history: &History, shared_gpu: bool, sm_part: u64) -> u64 {
    let duration = if shared_gpu { history.least() } else { history.mean() };
    if history.uses_sms { scale(duration, sm_part) } else { duration }
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

/// The next number of a xorshift sequence (never 0 from a seed that is not).
fn next_random(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
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
    fn a_launch_whose_start_was_stamped_before_its_call_returned_is_charged_what_followed_the_call() {
        // Stamped later (the stream was busy): the pair's distance.
        assert_eq!(own_part(20_000, 0), 20_000);
        // A 15 µs launch call on an idle stream before a 5 µs kernel.
        assert_eq!(own_part(20_000, 15_000), 5_000);
        // Never less than the least a launch costs, never more than the pair measured.
        assert_eq!(own_part(20_000, 19_900), LEAST_LAUNCH_NS);
        assert_eq!(own_part(600, 900), 600);
    }

    #[test]
    fn a_history_keeps_the_last_window_of_durations() {
        let mut history = History::default();
        assert_eq!(history.least(), 0);
        history.push(30);
        history.push(10);
        history.push(20);
        assert_eq!((history.last(), history.least(), history.mean()), (20, 10, 20));
        // Eight later durations push the 10 out of the window.
        for nanos in 11..=18 {
            history.push(nanos * 2);
        }
        assert_eq!((history.last(), history.least(), history.mean()), (36, 22, 29));
    }

    /// Timed launches of work estimated at `estimate` among `launches` of it.
    fn timed_among(estimate: u64, launches: u64, capped_beside_others: bool) -> u64 {
        let mut history = History::default();
        let mut random = 0x2545_f491_4f6c_dd1d;
        (0..launches).filter(|_| history.times(estimate, capped_beside_others, &mut random)).count() as u64
    }

    #[test]
    fn short_work_is_timed_about_once_per_time_every_of_gpu_time_and_long_work_at_every_launch() {
        // 10 µs launches: 10 s of GPU time in 1 000 000 launches, about one timed in 20.
        let timed = timed_among(10_000, 1_000_000, false);
        let expected = 1_000_000 * 10_000 / TIME_EVERY;
        assert!(timed.abs_diff(expected) <= expected / 20, "{timed} timed, about {expected} expected");
        assert_eq!(timed_among(TIME_EVERY * 3 / 2, 1000, false), 1000);
        // Beside others under an MPS cap: one in SAMPLE_CAPPED of long work, as often as the GPU
        // time says of short work.
        assert_eq!(timed_among(2_000_000, 400, true), 100);
        let timed = timed_among(10_000, 1_000_000, true);
        assert!(timed.abs_diff(expected) <= expected / 20, "{timed} timed beside others");
    }

    #[test]
    fn the_points_at_which_work_is_timed_do_not_follow_a_pattern_of_its_launches() {
        // Work whose launches take 20 µs and 100 µs in turn: a fixed period of an even number of
        // launches would only ever time one of the two.
        let mut history = History::default();
        let mut random = 0x9e37_79b9_7f4a_7c15;
        let mut timed = [0u64; 2];
        for launch in 0..200_000 {
            let estimate = 60_000;
            if history.times(estimate, false, &mut random) {
                timed[launch % 2] += 1;
            }
        }
        let total = timed[0] + timed[1];
        assert!(timed[0].abs_diff(timed[1]) <= total / 10, "timed by parity {timed:?}");
    }
}
