//! Compute shares for Vulkan: queue submissions wait for the container's pacing clock, the one
//! CUDA launches use, and their GPU time is measured by timestamps the layer writes around them
//! on the GPU, or by fences where it cannot.
//!
//! A submission is admitted on an estimate of its GPU time (the recent average). Its fence is the
//! pacer's own: when the application passes none, the pacer's fence rides on the application's
//! own submission and signals when its batches finish; otherwise an empty submission queued right
//! after it carries the pacer's fence, which signals when everything submitted before it has
//! finished. A waiter thread per device watches those fences. When a submission is known
//! finished, its GPU time is the span between the layer's two timestamps around its command
//! buffers ([`crate::timestamps`]); a submission that could not be wrapped (no command buffers, a
//! queue family without timestamps, every slot lent) is timed on the host instead: from when it
//! was submitted (or the queue's previous submission finished, if later) until its fence was
//! seen signalled. The clock is corrected by the difference from what was charged. The
//! application's thread never waits for the GPU, so submissions that wait on host-signalled
//! semaphores cannot deadlock.
//!
//! The application's own waits say sooner when work is done: a successful `vkWaitForFences` or
//! `vkGetFenceStatus` on the fence of a metered submission, or `vkQueueWaitIdle` and
//! `vkDeviceWaitIdle`, settle the submissions they cover at that moment, without waiting for the
//! pacer's marker behind them (`vkResetFences` and `vkDestroyFence` settle a signalled one before
//! the handle goes). A submission that must wait settles the fences that have signalled before it
//! looks at the clock, and naps at most [`NAP`] at a time: the application usually learns that its work is done
//! (its own fence or semaphore) before the waiter thread does, and a submission admitted on a
//! clock that still holds the estimate of finished work, or one asleep through a correction, would
//! leave the GPU idle for time the container was owed (docs/vulkan.md, "Shares on real work").

use std::collections::HashMap;
use std::ffi::CStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use ash::vk;
use ash::vk::Handle;

use crate::dispatch::cast;
use crate::runtime;
use crate::timestamps::{self, Slot, Timestamps, Wrap};
use vgpu_ledger::pace;

/// Submissions metered at once per device; past this, work is charged its estimate only.
const MAX_IN_FLIGHT: usize = 256;
/// How long the waiter blocks on fences before looking for newly queued ones.
const WAIT_SLICE_NS: u64 = 10_000_000;
/// The longest nap of a submission waiting for the clock, so that corrections made while it
/// waits (its predecessors' real GPU time) reach it promptly.
const NAP: Duration = Duration::from_millis(1);

struct FenceFns {
    create: vk::PFN_vkCreateFence,
    destroy: vk::PFN_vkDestroyFence,
    wait: vk::PFN_vkWaitForFences,
    reset: vk::PFN_vkResetFences,
    status: vk::PFN_vkGetFenceStatus,
}

struct InFlight {
    fence: vk::Fence,
    /// The application's own fence of this submission (null when the pacer's rides on it): when
    /// the application sees it signalled, the submission is done, often well before the pacer's
    /// marker behind it signals.
    app_fence: vk::Fence,
    queue: u64,
    /// When the submission call began (none of the work can have run before) and returned.
    called: u64,
    submitted: u64,
    charged: u64,
    /// The timestamp slot around its command buffers, if it has one; given back once the
    /// pacer's fence has signalled.
    slot: Option<Slot>,
    /// Its GPU time was charged. The waiter recycles the pacer's fence once it has signalled (only
    /// the waiter resets fences, never while it waits on them).
    settled: bool,
}

#[derive(Default)]
struct Flight {
    in_flight: Vec<InFlight>,
    spare: Vec<vk::Fence>,
    /// When each queue's latest metered submission finished.
    last_done: HashMap<u64, u64>,
    stopping: bool,
}

struct Shared {
    device: vk::Device,
    fns: FenceFns,
    ordinal: usize,
    /// The share of the latest admitted submission, in percent.
    percent: AtomicU64,
    flight: Mutex<Flight>,
    wake: Condvar,
    /// Recent GPU time per submission, nanoseconds.
    estimate: AtomicU64,
    /// GPU timestamps around submissions; `None`: every submission is timed on the host.
    timestamps: Option<Timestamps>,
    /// Debug counters since the last report.
    report: Mutex<Report>,
}

/// What the debug line reports: submissions settled since `since`, how many of them were timed
/// by GPU timestamps, their GPU time and what was charged for them on admission (nanoseconds),
/// and the submissions made while every metering fence was in flight, which are charged their
/// estimate only: together, every successful submission.
#[derive(Clone, Copy, Default)]
struct Report {
    settled: u64,
    timed: u64,
    unmetered: u64,
    busy: u64,
    charged: u64,
    since: u64,
}

/// The pacer of one device whose GPU has a compute share.
pub struct Pacer {
    shared: Arc<Shared>,
    waiter: Mutex<Option<JoinHandle<()>>>,
}

impl Pacer {
    /// A pacer for `device` at `percent`; `None` (submissions not paced) if the driver lacks the
    /// fence entry points. `timing` says what its GPU timestamps need.
    ///
    /// # Safety
    /// `gdpa` is the next layer's `vkGetDeviceProcAddr` and `device` the device it created on
    /// the physical device `timing` describes.
    pub unsafe fn new(
        device: vk::Device,
        gdpa: vk::PFN_vkGetDeviceProcAddr,
        ordinal: usize,
        percent: u64,
        timing: timestamps::Source,
    ) -> Option<Pacer> {
        // SAFETY: per the contract.
        let next = |name: &CStr| unsafe { gdpa(device, name.as_ptr()) };
        // SAFETY: each cast names the type of the entry point it was asked for.
        let fns = unsafe {
            FenceFns {
                create: cast(next(c"vkCreateFence"))?,
                destroy: cast(next(c"vkDestroyFence"))?,
                wait: cast(next(c"vkWaitForFences"))?,
                reset: cast(next(c"vkResetFences"))?,
                status: cast(next(c"vkGetFenceStatus"))?,
            }
        };
        let shared = Shared {
            device,
            fns,
            ordinal,
            percent: AtomicU64::new(percent),
            flight: Mutex::new(Flight::default()),
            wake: Condvar::new(),
            estimate: AtomicU64::new(0),
            // SAFETY: per the contract.
            timestamps: unsafe { Timestamps::new(device, gdpa, timing) },
            report: Mutex::new(Report { since: pace::now(), ..Report::default() }),
        };
        if shared.timestamps.is_none() {
            tracing::debug!(
                "Vulkan pacing on device {ordinal}: no GPU timestamps on this device; submissions are timed on the host"
            );
        }
        Some(Pacer { shared: Arc::new(shared), waiter: Mutex::new(None) })
    }

    /// The application got `queue`, of queue family `family`.
    pub fn queue_created(&self, queue: vk::Queue, family: u32) {
        if let Some(timestamps) = &self.shared.timestamps {
            timestamps.queue_created(queue, family);
        }
    }

    /// Runs `call`, the application's submission to `queue` with the fence it is given, once the
    /// clock admits it. `fence` is the application's own: when it has none, `call` is given the
    /// pacer's; else `marker(pacer's fence)` queues an empty submission after it. When
    /// `wrappable` (the submission has command buffers the layer's can go around), `call` may be
    /// given the begin and end command buffers of a timestamp slot, to submit around the
    /// application's (the family's first such submission first calibrates the stamps on `queue`).
    ///
    /// # Safety
    /// Called inside the application's submission call on `queue` (externally synchronised), and
    /// `call` is that submission.
    pub unsafe fn submit(
        &self,
        queue: vk::Queue,
        fence: vk::Fence,
        wrappable: bool,
        call: impl FnOnce(vk::Fence, Option<Wrap>) -> vk::Result,
        marker: impl FnOnce(vk::Fence) -> vk::Result,
    ) -> vk::Result {
        let shared = &self.shared;
        let runtime = runtime::get();
        let ledger = runtime.ledger();
        ledger.touch_last_kernel(unix_seconds());
        if !runtime.gate.enforced(ledger) {
            return call(fence, None);
        }
        let Some(clock) = ledger.pace_clock(shared.ordinal) else { return call(fence, None) };
        // The share as the container's region says now (a resize reaches the next submission).
        let Some(percent) = ledger.share(shared.ordinal) else { return call(fence, None) };
        shared.percent.store(percent, Ordering::Relaxed);
        let wall = loop {
            // Work that finished since the last look is charged what it took before this
            // submission looks at the clock.
            shared.account(&mut self.lock(), pace::now());
            let wall = pace::wall_cost(shared.estimate.load(Ordering::Relaxed), percent);
            match pace::try_admit(clock, pace::now(), wall) {
                Ok(()) => break wall,
                Err(wait) => {
                    std::thread::sleep(wait.min(NAP));
                    if !runtime.gate.enforced(ledger) {
                        return call(fence, None);
                    }
                }
            }
        };
        let ours = self.take_fence();
        // A slot only for a submission the pacer follows to its end: the slot comes back then.
        let stamps = match (&ours, &shared.timestamps) {
            // SAFETY: per the contract; the application's work is not queued yet.
            (Some(_), Some(timestamps)) if wrappable => unsafe { timestamps.take(queue) },
            _ => None,
        };
        let rides = fence == vk::Fence::null() && ours.is_some();
        let called = pace::now();
        let status = call(if rides { ours.unwrap_or(fence) } else { fence }, stamps.map(|(_, wrap)| wrap));
        let submitted = pace::now();
        let slot = stamps.map(|(slot, _)| slot);
        let Some(ours) = ours else {
            if status == vk::Result::SUCCESS {
                shared.count(Report { unmetered: 1, ..Report::default() }, submitted);
            } else {
                pace::correct(clock, -(wall as i64));
            }
            return status;
        };
        if status != vk::Result::SUCCESS {
            // A failed submission signals nothing; the fence is unused, and the slot's command
            // buffers are as they were (after a lost device nothing is reused anyway).
            pace::correct(clock, -(wall as i64));
            self.lock().spare.push(ours);
            if let (Some(slot), Some(timestamps), false) =
                (slot, &shared.timestamps, status == vk::Result::ERROR_DEVICE_LOST)
            {
                timestamps.release(slot);
            }
            return status;
        }
        if !rides && marker(ours) != vk::Result::SUCCESS {
            // Nothing will say when the submission ends: its slot, if any, is not lent again.
            self.lock().spare.push(ours);
            shared.count(Report { unmetered: 1, ..Report::default() }, submitted);
            return status;
        }
        let app_fence = if rides { vk::Fence::null() } else { fence };
        let entry = InFlight {
            fence: ours,
            app_fence,
            queue: queue.as_raw(),
            called,
            submitted,
            charged: wall,
            slot,
            settled: false,
        };
        self.lock().in_flight.push(entry);
        shared.wake.notify_one();
        self.ensure_waiter();
        status
    }

    fn lock(&self) -> MutexGuard<'_, Flight> {
        self.shared.flight.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The application saw `fences` signalled (its `vkWaitForFences` or `vkGetFenceStatus`
    /// succeeded): the submissions they belong to, and those before them on the same queues, are
    /// done now. Called inside the application's call on those fences, so they are alive.
    pub fn app_fences_signalled(&self, fences: &[vk::Fence], all: bool) {
        let shared = &self.shared;
        let mut flight = self.lock();
        if !flight.in_flight.iter().any(|f| !f.settled && fences.contains(&f.app_fence)) {
            return;
        }
        let done = pace::now();
        let signalled: Vec<usize> = (0..flight.in_flight.len())
            .filter(|&i| {
                let entry = &flight.in_flight[i];
                // SAFETY: the application's fence, alive during its own call on it.
                !entry.settled
                    && fences.contains(&entry.app_fence)
                    && (all
                        || unsafe { (shared.fns.status)(shared.device, entry.app_fence) }
                            == vk::Result::SUCCESS)
            })
            .collect();
        shared.settle_through(&mut flight, &signalled, done);
    }

    /// The application is about to reset or destroy `fences`: a submission whose fence has
    /// signalled is settled now, and none is matched to those handles again.
    pub fn app_fences_released(&self, fences: &[vk::Fence]) {
        let shared = &self.shared;
        let mut flight = self.lock();
        if !flight.in_flight.iter().any(|f| fences.contains(&f.app_fence)) {
            return;
        }
        let done = pace::now();
        let signalled: Vec<usize> = (0..flight.in_flight.len())
            .filter(|&i| {
                let entry = &flight.in_flight[i];
                // SAFETY: the application's fence, alive until the call it is about to make.
                !entry.settled
                    && fences.contains(&entry.app_fence)
                    && unsafe { (shared.fns.status)(shared.device, entry.app_fence) } == vk::Result::SUCCESS
            })
            .collect();
        shared.settle_through(&mut flight, &signalled, done);
        for entry in flight.in_flight.iter_mut().filter(|f| fences.contains(&f.app_fence)) {
            entry.app_fence = vk::Fence::null();
        }
    }

    /// The application's `vkQueueWaitIdle` on `queue` (or, with `None`, `vkDeviceWaitIdle`)
    /// returned: everything submitted there is done now.
    pub fn idle(&self, queue: Option<vk::Queue>) {
        let mut flight = self.lock();
        let last: Vec<usize> = (0..flight.in_flight.len())
            .filter(|&i| {
                let entry = &flight.in_flight[i];
                !entry.settled && queue.is_none_or(|q| q.as_raw() == entry.queue)
            })
            .collect();
        self.shared.settle_through(&mut flight, &last, pace::now());
    }

    /// A fence for the next marker: a spare one, or a new one while few are in flight.
    fn take_fence(&self) -> Option<vk::Fence> {
        {
            let most = if runtime::get().two_pacer_fences_fault { 2 } else { MAX_IN_FLIGHT };
            let mut flight = self.lock();
            if flight.in_flight.len() >= most {
                return None;
            }
            if let Some(fence) = flight.spare.pop() {
                return Some(fence);
            }
        }
        let info = vk::FenceCreateInfo::default();
        let mut fence = vk::Fence::null();
        // SAFETY: valid create-info and out-pointer; `device` is live while the pacer is.
        let status =
            unsafe { (self.shared.fns.create)(self.shared.device, &info, std::ptr::null(), &mut fence) };
        (status == vk::Result::SUCCESS).then_some(fence)
    }

    fn ensure_waiter(&self) {
        let mut waiter = self.waiter.lock().unwrap_or_else(PoisonError::into_inner);
        if waiter.is_some() {
            return;
        }
        let shared = Arc::clone(&self.shared);
        match std::thread::Builder::new().name("vgpu-vk-pacer".into()).spawn(move || shared.watch()) {
            Ok(handle) => *waiter = Some(handle),
            Err(error) => tracing::warn!(
                "cannot start the Vulkan pacing thread ({error}); submissions are charged estimates"
            ),
        }
    }

    /// Stops the waiter and destroys the pacer's fences and timestamp rings. Called at
    /// `vkDestroyDevice`, before the device goes (the application has waited for its work by
    /// then).
    pub fn stop(&self) {
        self.lock().stopping = true;
        self.shared.wake.notify_all();
        if let Some(waiter) = self.waiter.lock().unwrap_or_else(PoisonError::into_inner).take() {
            let _ = waiter.join();
        }
        let mut flight = self.lock();
        let mut fences: Vec<vk::Fence> = flight.in_flight.drain(..).map(|f| f.fence).collect();
        fences.append(&mut flight.spare);
        drop(flight);
        for fence in fences {
            // SAFETY: our own fence, no longer in use by any queue or thread.
            unsafe { (self.shared.fns.destroy)(self.shared.device, fence, std::ptr::null()) };
        }
        if let Some(timestamps) = &self.shared.timestamps {
            timestamps.destroy();
        }
        self.shared.flush_report();
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Flight> {
        self.flight.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The waiter thread: settles each metered submission as its fence signals, and recycles the
    /// fences of settled ones.
    fn watch(&self) {
        loop {
            let fences: Vec<vk::Fence> = {
                let mut flight = self.lock();
                loop {
                    self.recycle(&mut flight);
                    if !flight.in_flight.is_empty() || flight.stopping {
                        break;
                    }
                    flight = self.wake.wait(flight).unwrap_or_else(PoisonError::into_inner);
                }
                if flight.in_flight.is_empty() {
                    return;
                }
                flight.in_flight.iter().map(|f| f.fence).collect()
            };
            // SAFETY: our own fences, alive until `stop` (which joins this thread first) and reset
            // only by this thread.
            let status = unsafe {
                (self.fns.wait)(self.device, fences.len() as u32, fences.as_ptr(), vk::FALSE, WAIT_SLICE_NS)
            };
            let done = pace::now();
            match status {
                vk::Result::SUCCESS => self.account(&mut self.lock(), done),
                vk::Result::TIMEOUT => {}
                _ => {
                    // A lost device: nothing more will be measured on it (and no timestamp slot
                    // is lent again).
                    let mut flight = self.lock();
                    let lost: Vec<InFlight> = flight.in_flight.drain(..).collect();
                    flight.spare.extend(lost.iter().map(|f| f.fence));
                    drop(flight);
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
            if self.lock().stopping {
                self.account(&mut self.lock(), pace::now());
                return;
            }
        }
    }

    /// Resets the fences of settled submissions and keeps them for later ones. Only the waiter
    /// calls this, so no fence is reset while it is being waited on.
    fn recycle(&self, flight: &mut Flight) {
        let mut i = 0;
        while i < flight.in_flight.len() {
            let entry = &flight.in_flight[i];
            // A submission settled by the application's own fence may still have the pacer's
            // marker pending on the queue: it cannot be reset until it signals.
            // SAFETY: our own fence, alive while it is in flight.
            if !entry.settled || unsafe { (self.fns.status)(self.device, entry.fence) } != vk::Result::SUCCESS
            {
                i += 1;
                continue;
            }
            let entry = flight.in_flight.remove(i);
            // The submission, and so its begin and end command buffers, has finished (the
            // pacer's fence is on it or behind it), and its stamps were read when it settled.
            if let (Some(slot), Some(timestamps)) = (entry.slot, &self.timestamps) {
                timestamps.release(slot);
            }
            // SAFETY: our own fence, signalled and no longer in use by any queue or wait.
            if unsafe { (self.fns.reset)(self.device, 1, &entry.fence) } == vk::Result::SUCCESS {
                flight.spare.push(entry.fence);
            } else {
                // SAFETY: as above; a fence that cannot be reset is not used again.
                unsafe { (self.fns.destroy)(self.device, entry.fence, std::ptr::null()) };
            }
        }
    }

    /// Charges every unsettled submission whose fence has signalled by `done` its GPU time. Called
    /// by the waiter and by submissions about to look at the clock.
    fn account(&self, flight: &mut Flight, done: u64) {
        let signalled: Vec<usize> = (0..flight.in_flight.len())
            .filter(|&i| {
                let entry = &flight.in_flight[i];
                // SAFETY: our own fence, alive while it is in flight.
                !entry.settled
                    && unsafe { (self.fns.status)(self.device, entry.fence) } == vk::Result::SUCCESS
            })
            .collect();
        self.settle_through(flight, &signalled, done);
    }

    /// Charges, as finished by `done`, the unsettled submissions at `indices` of the flight and
    /// every unsettled one before them on the same queue (a fence signal covers all earlier
    /// work on its queue): what their timestamps say, or else the host's span.
    fn settle_through(&self, flight: &mut Flight, indices: &[usize], done: u64) {
        let Some(&last) = indices.iter().max() else { return };
        let Some(clock) = runtime::get().ledger().pace_clock(self.ordinal) else { return };
        let (mut settled, mut timed, mut total, mut charged) = (0, 0, 0, 0);
        let percent = self.percent.load(Ordering::Relaxed);
        let Flight { in_flight, last_done, .. } = flight;
        for i in 0..=last {
            let finished = indices.iter().any(|&j| j >= i && in_flight[j].queue == in_flight[i].queue);
            let entry = &mut in_flight[i];
            if entry.settled || !finished {
                continue;
            }
            entry.settled = true;
            let queue_done = last_done.entry(entry.queue).or_insert(0);
            let host = done.saturating_sub(entry.submitted.max(*queue_done));
            *queue_done = done;
            // The work ran between the submission call and now, whatever the stamps say (a
            // wrong stamp must not charge more than the host could see).
            let gpu = (entry.slot.zip(self.timestamps.as_ref()))
                .and_then(|(slot, timestamps)| timestamps.read(slot))
                .map(|ns| ns.min(done.saturating_sub(entry.called)));
            timed += u64::from(gpu.is_some());
            let busy = gpu.unwrap_or(host);
            pace::correct(clock, pace::wall_cost(busy, percent) as i64 - entry.charged as i64);
            settled += 1;
            total += busy;
            charged += entry.charged;
        }
        if settled > 0 {
            self.count(Report { settled, timed, busy: total, charged, ..Report::default() }, done);
            let average = total / settled;
            let old = self.estimate.load(Ordering::Relaxed);
            self.estimate.store(if old == 0 { average } else { (old + average) / 2 }, Ordering::Relaxed);
        }
    }
}

impl Shared {
    /// Adds to the debug counters and, once a second, logs them (`LIBCUDA_LOG_LEVEL=4`).
    fn count(&self, more: Report, now: u64) {
        let mut report = self.report.lock().unwrap_or_else(PoisonError::into_inner);
        report.settled += more.settled;
        report.timed += more.timed;
        report.unmetered += more.unmetered;
        report.busy += more.busy;
        report.charged += more.charged;
        if now.saturating_sub(report.since) >= 1_000_000_000 {
            self.log(&mut report, now);
        }
    }

    /// Logs what the counters hold since the last line, at the device's end.
    fn flush_report(&self) {
        let mut report = self.report.lock().unwrap_or_else(PoisonError::into_inner);
        if report.settled + report.unmetered > 0 {
            self.log(&mut report, pace::now());
        }
    }

    fn log(&self, report: &mut Report, now: u64) {
        tracing::debug!(
            "Vulkan pacing on device {}: {} submissions, GPU time {} us, admitted at {} us of clock, over {} us; \
             timed by GPU timestamps: {} of {} submissions; charged the estimate only: {} submissions",
            self.ordinal,
            report.settled,
            report.busy / 1000,
            report.charged / 1000,
            now.saturating_sub(report.since) / 1000,
            report.timed,
            report.settled,
            report.unmetered
        );
        *report = Report { since: now, ..Report::default() };
    }
}

fn unix_seconds() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |since| since.as_secs())
}
