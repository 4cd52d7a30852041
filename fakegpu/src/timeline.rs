//! Simulated GPU time: kernels that take a set time, the streams they queue on, each device's queue of
//! work, and what the synchronize calls, NVML and the test hooks read from it.
//!
//! The model, in `CLOCK_MONOTONIC` nanoseconds: a launch of `d` ns at host time `now` on a stream starts
//! at max(`now`, the stream's ready time, the device's `busy_until`) and ends `d` later; both the
//! device's `busy_until` and the stream's ready time become that end. The host never waits in a launch;
//! the synchronize calls and events wait. `busy_until` (and the device's total of work ever queued)
//! live in the ledger, so with `FAKEGPU_SHARED` every process queues on the same simulated device, first
//! come first served; or, with `FAKEGPU_PREEMPT`, time-sliced: work cuts in ahead of another process's
//! running queue and pushes it back. So the times kept here are [`Stamp`]s, read through
//! `Ledger::effective`, which adds the cut-ins since. Everything else here belongs to this process.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::clock;
use crate::config::MAX_DEVICES;
use crate::contexts::Bound;
use crate::handles::{self, Keys, Kind};
use crate::ledger::{Ledger, Stamp};
use crate::state::{Fake, Refusal, Registry};

/// `CU_STREAM_LEGACY` and `CU_STREAM_PER_THREAD`, the default streams a `CUstream` may name.
const STREAM_LEGACY: u64 = 1;
const STREAM_PER_THREAD: u64 = 2;

/// Which stream work queues on. Default streams belong to a context (by its handle).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum StreamKey {
    /// NULL (outside `_ptsz` calls) or `CU_STREAM_LEGACY`: the context's legacy default stream.
    Legacy { context: u64 },
    /// `CU_STREAM_PER_THREAD`, or NULL in a `_ptsz` call: the calling thread's default stream.
    PerThread { context: u64, thread: u64 },
    /// A stream from `cuStreamCreate`, by its handle.
    Created(u64),
}

/// A stream as a call named it: its key and the physical device its work runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResolvedStream {
    pub key: StreamKey,
    pub device: usize,
}

/// The launch entry points, numbered as `fakegpu_last_launch` reports them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(i32)]
pub enum EntryPoint {
    LaunchKernel = 1,
    LaunchKernelPtsz = 2,
    LaunchCooperativeKernel = 3,
    LaunchCooperativeKernelPtsz = 4,
    LaunchKernelEx = 5,
    LaunchKernelExPtsz = 6,
    GraphLaunch = 7,
    GraphLaunchPtsz = 8,
}

impl EntryPoint {
    /// A `_ptsz` variant, whose NULL stream is the per-thread default stream.
    pub fn is_per_thread(self) -> bool {
        matches!(
            self,
            EntryPoint::LaunchKernelPtsz
                | EntryPoint::LaunchCooperativeKernelPtsz
                | EntryPoint::LaunchKernelExPtsz
                | EntryPoint::GraphLaunchPtsz
        )
    }

    pub fn is_graph(self) -> bool {
        matches!(self, EntryPoint::GraphLaunch | EntryPoint::GraphLaunchPtsz)
    }
}

/// A launch as it reached the fake, for `fakegpu_last_launch`; pointers are kept as addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Launch {
    pub entry_point: EntryPoint,
    /// The `CUfunction`, or the `CUgraphExec` of a graph launch.
    pub function: u64,
    /// Zero for a graph launch, like the three fields after it.
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_mem_bytes: u32,
    pub stream: u64,
    pub kernel_params: u64,
    pub extra: u64,
}

/// A copy or memset as it reached the fake, for `fakegpu_last_copy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Copy {
    /// The exported name that was called.
    pub name: &'static str,
    pub bytes: u64,
    /// The destination as passed: an address, or the `CUarray` of a copy to an array.
    pub dst: u64,
    /// The `CUstream` as passed (NULL for the synchronous calls, which take none).
    pub stream: u64,
}

/// A device's work done at some moment, as `nvmlDeviceGetUtilizationRates` last read it.
#[derive(Clone, Copy, Debug)]
struct Sample {
    at: u64,
    done: u64,
}

pub struct Timeline {
    /// Kernel key → duration in ns.
    kernels: BTreeMap<u64, u64>,
    kernel_keys: Keys,
    /// When the work queued so far on each stream ends.
    ready: BTreeMap<StreamKey, Stamp>,
    /// When the work this process queued so far on each physical device ends.
    process_ready: [Stamp; MAX_DEVICES],
    /// Nanoseconds of work this process queued on each physical device.
    busy: [u64; MAX_DEVICES],
    samples: [Sample; MAX_DEVICES],
    last_launch: Option<Launch>,
    last_copy: Option<Copy>,
}

impl Timeline {
    /// A timeline whose utilization samples start now.
    pub fn new(ledger: &Ledger, device_count: usize) -> Timeline {
        let now = clock::now_ns();
        let mut samples = [Sample { at: now, done: 0 }; MAX_DEVICES];
        for (device, sample) in samples.iter_mut().enumerate().take(device_count) {
            sample.done = ledger.work_done(device, now);
        }
        Timeline {
            kernels: BTreeMap::new(),
            kernel_keys: Keys::starting_at(1),
            ready: BTreeMap::new(),
            process_ready: [Stamp::default(); MAX_DEVICES],
            busy: [0; MAX_DEVICES],
            samples,
            last_launch: None,
            last_copy: None,
        }
    }

    /// When the work queued so far on `stream` ends, as stored (time 0 for a stream that never had any).
    pub fn ready(&self, stream: StreamKey) -> Stamp {
        self.ready.get(&stream).copied().unwrap_or_default()
    }

    /// `cuStreamDestroy`: the stream's queued work still runs, but nothing can wait for it by name.
    pub fn forget(&mut self, stream: StreamKey) {
        self.ready.remove(&stream);
    }
}

static NEXT_THREAD: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// This thread's number, which keys its per-thread default streams.
    static THREAD: Cell<u64> = const { Cell::new(0) };
}

/// The calling thread's number, assigned on first use (0 while the thread is being torn down).
fn thread_number() -> u64 {
    THREAD
        .try_with(|number| {
            if number.get() == 0 {
                number.set(NEXT_THREAD.fetch_add(1, Ordering::Relaxed));
            }
            number.get()
        })
        .unwrap_or(0)
}

/// Percent of `elapsed` that `busy` nanoseconds make, rounded, at most 100 (0 for an empty interval).
fn percent(busy: u64, elapsed: u64) -> u32 {
    if elapsed == 0 {
        return 0;
    }
    let rounded = (u128::from(busy) * 100 + u128::from(elapsed) / 2) / u128::from(elapsed);
    rounded.min(100) as u32
}

/// The `fakegpu_kernel` duration that makes each launch take as many ns as its first argument.
pub const DURATION_FROM_ARGUMENT: u64 = u64::MAX;

impl Fake {
    /// `fakegpu_kernel`: a new kernel whose launches take `duration` ns.
    pub fn create_kernel(&self, duration: u64) -> u64 {
        let mut registry = self.lock();
        let key = registry.timeline.kernel_keys.next();
        registry.timeline.kernels.insert(key, duration);
        handles::encode(Kind::Function, key)
    }

    /// How long a kernel the fake handed out takes.
    pub fn kernel_duration(&self, function: u64) -> Result<u64, Refusal> {
        let key = handles::decode(Kind::Function, function).ok_or(Refusal::BadHandle)?;
        self.lock().timeline.kernels.get(&key).copied().ok_or(Refusal::BadHandle)
    }

    /// The stream a `CUstream` names: NULL is the legacy default stream, or the per-thread one when
    /// `null_is_per_thread` (the `_ptsz` calls); default streams need a current context.
    pub fn resolve_stream(&self, stream: u64, null_is_per_thread: bool) -> Result<ResolvedStream, Refusal> {
        let per_thread = stream == STREAM_PER_THREAD || (stream == 0 && null_is_per_thread);
        if per_thread || stream == 0 || stream == STREAM_LEGACY {
            let (bound, device) = self.current_context()?;
            let context = Bound::handle(bound).addr() as u64;
            let key = if per_thread {
                StreamKey::PerThread { context, thread: thread_number() }
            } else {
                StreamKey::Legacy { context }
            };
            return Ok(ResolvedStream { key, device });
        }
        Ok(ResolvedStream { key: StreamKey::Created(stream), device: self.stream_device(stream)? })
    }

    /// Queues `duration` ns on `stream`, from now.
    fn queue(&self, registry: &mut Registry, stream: ResolvedStream, duration: u64) {
        let timeline = &mut registry.timeline;
        let slot = self.ledger.occupy(stream.device, clock::now_ns(), timeline.ready(stream.key), duration);
        timeline.ready.insert(stream.key, slot.end_stamp());
        let device_ready = &mut timeline.process_ready[stream.device];
        *device_ready = self.ledger.later(stream.device, *device_ready, slot.end_stamp());
        timeline.busy[stream.device] = timeline.busy[stream.device].saturating_add(duration);
    }

    /// A kernel launch of `duration` ns, or a graph launch whose kernel nodes take `duration` ns one
    /// after another; remembered as this process's last launch (and counted if VMM memory of the
    /// process is unmapped now). A graph without kernel nodes takes no time and leaves the timeline
    /// alone. The host first spends `FAKEGPU_LAUNCH_HOST_NS` on the call, as a real driver's
    /// launch does before its work reaches the GPU.
    pub fn launch(&self, launch: Launch, stream: ResolvedStream, duration: u64) {
        let queued_at = clock::now_ns().saturating_add(self.launch_host_ns);
        while clock::now_ns() < queued_at {
            std::hint::spin_loop();
        }
        let mut registry = self.lock();
        if duration > 0 || !launch.entry_point.is_graph() {
            self.queue(&mut registry, stream, duration);
        }
        registry.timeline.last_launch = Some(launch);
        registry.vmm.note_launch();
    }

    /// A copy or memset of `duration` ns on `stream` (none for work with a host side, which takes
    /// no GPU time here); remembered as this process's last copy.
    pub fn copy(&self, copy: Copy, stream: ResolvedStream, duration: u64) {
        let mut registry = self.lock();
        if duration > 0 {
            self.queue(&mut registry, stream, duration);
        }
        registry.timeline.last_copy = Some(copy);
    }

    /// `cuStreamSynchronize`: waits until the stream's queued work is done.
    pub fn wait_for_stream(&self, stream: ResolvedStream) {
        let ready = self.lock().timeline.ready(stream.key);
        self.wait_until_reached(stream.device, ready);
    }

    /// `cuStreamQuery`: done once the stream's queued work is, else NotReady.
    pub fn query_stream(&self, stream: ResolvedStream) -> Result<(), Refusal> {
        let ready = self.lock().timeline.ready(stream.key);
        if self.ledger.effective(stream.device, ready) > clock::now_ns() {
            Err(Refusal::NotReady)
        } else {
            Ok(())
        }
    }

    /// `cuCtxSynchronize`: waits until every stream of this process on physical `device` is done.
    pub fn wait_for_device(&self, device: usize) {
        let ready = self.lock().timeline.process_ready[device];
        self.wait_until_reached(device, ready);
    }

    /// Sleeps until physical `device` reaches `stamp`, reading it again on waking: work that cut in
    /// meanwhile (`FAKEGPU_PREEMPT`) pushed it back.
    pub fn wait_until_reached(&self, device: usize, stamp: Stamp) {
        loop {
            let time = self.ledger.effective(device, stamp);
            if clock::now_ns() >= time {
                return;
            }
            clock::sleep_until(time);
        }
    }

    /// Nanoseconds of work this process queued on physical `device` (kernels, graph kernel nodes,
    /// device-side copies and memsets).
    pub fn busy_ns(&self, device: usize) -> u64 {
        self.lock().timeline.busy[device]
    }

    pub fn last_launch(&self) -> Option<Launch> {
        self.lock().timeline.last_launch
    }

    pub fn last_copy(&self) -> Option<Copy> {
        self.lock().timeline.last_copy
    }

    /// `nvmlDeviceGetUtilizationRates`: percent of the time since this process's previous reading for
    /// physical `device` (or since the fake started here) that the device was busy, by every process
    /// that shares it.
    pub fn utilization(&self, device: usize) -> u32 {
        let mut registry = self.lock();
        let now = clock::now_ns();
        let done = self.ledger.work_done(device, now);
        let sample = &mut registry.timeline.samples[device];
        let busy = done.saturating_sub(sample.done);
        let elapsed = now.saturating_sub(sample.at);
        *sample = Sample { at: now, done: done.max(sample.done) };
        percent(busy, elapsed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentages_round_and_clamp() {
        assert_eq!(percent(0, 1000), 0);
        assert_eq!(percent(505, 1000), 51);
        assert_eq!(percent(1000, 1000), 100);
        assert_eq!(percent(2000, 1000), 100);
        assert_eq!(percent(1, 1), 100);
        assert_eq!(percent(5, 0), 0);
        assert_eq!(percent(u64::MAX, u64::MAX), 100);
    }

    #[test]
    fn threads_get_their_own_numbers() {
        let here = thread_number();
        assert_eq!(thread_number(), here);
        let there = std::thread::spawn(thread_number).join().expect("thread");
        assert_ne!(here, there);
        assert_ne!(here, 0);
    }
}
