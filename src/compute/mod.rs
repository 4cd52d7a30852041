//! Compute limits (`CUDA_DEVICE_SM_LIMIT`): a container's launches occupy the GPU for at most its
//! share of the time.
//!
//! Every launch path (kernels, cooperative and `Ex` launches, graph launches) comes here when a
//! device has a share. A launch is admitted by the container's pacing clock ([`pace`]) on an
//! estimate of its GPU time; sampled launches are timed on the GPU by pairs of events
//! ([`meter`]), which correct the clock and the next estimates. The share is time, not SMs: a kernel runs on the whole GPU,
//! and the container's kernels are spaced out so that together they hold it for the share.
//! Work captured into a graph is not run at capture, so it is not paced there; the graph's
//! launches are.
//!
//! Nothing here is reached when no device has a share: the launch hooks are then not even
//! handed out by `dlsym` or `cuGetProcAddress` (see `exports`).

pub mod meter;
pub mod mps;

pub use vgpu_ledger::pace;

use std::sync::atomic::AtomicU64;

use parking_lot::Mutex;

use crate::config::Config;
use crate::driver::{self, sys::*};
use crate::ledger::Ledger;
use meter::{Meter, Plan};

/// The compute limiter of this process.
pub struct Limiter {
    /// Whether any device had a share at start-up (the copy hooks ask on every call). Each
    /// launch reads its device's share from the ledger, so a resize reaches it at once.
    any_share: bool,
    /// The policy and the monitor's switches, shared with the Vulkan layer's pacing.
    gate: pace::Gate,
    /// One meter per context that has launched under a limit.
    meters: Mutex<Vec<Meter>>,
}

/// Where a launch goes: the stream its work is queued on (a `_ptsz` call's NULL stream already
/// turned into `CU_STREAM_PER_THREAD`), what identifies its work for estimates, and whether it runs
/// on the SMs (kernels and graphs; not copies and memsets).
#[derive(Clone, Copy, Debug)]
pub struct Launch {
    pub stream: CUstream,
    pub key: usize,
    pub uses_sms: bool,
}

impl Limiter {
    /// The limiter, when any device has a compute share or the container has a priority (its
    /// launches then take part in HAMi's monitor protocol even without a share).
    pub fn from_config(config: &Config) -> Option<Limiter> {
        (config.any_compute_limit() || config.has_priority()).then(|| Limiter {
            any_share: config.any_compute_limit(),
            gate: pace::Gate::new(config.core_policy),
            meters: Mutex::new(Vec::new()),
        })
    }

    /// Whether any device has a compute share (the limiter may exist for a priority alone).
    pub fn any_share(&self) -> bool {
        self.any_share
    }

    /// Runs `call`, the application's launch, once the container's clock admits it, and times it.
    /// Anything the limiter cannot do (no context, a driver without events) lets the launch
    /// through rather than fail it.
    pub fn launch(&self, ledger: &dyn Ledger, launch: Launch, call: impl FnOnce() -> CUresult) -> CUresult {
        let cuda = driver::cuda();
        ledger.touch_last_kernel(unix_seconds());
        // As HAMi-core does: wait while the monitor holds this container, then mark activity (the
        // monitor holds lower-priority containers while a higher one's mark is fresh).
        let switches = self.gate.hold(ledger);
        ledger.mark_launch();
        // The context's meter knows its device: one driver call fewer per launch.
        let Ok(context) = cuda.current_context() else { return call() };
        if context.is_null() {
            return call();
        }
        // One clock read serves the meter and the first try at admission.
        let mut now = pace::now();
        let (index, clock, plan, wall) = {
            let mut meters = self.meters.lock();
            let Some(index) = meter_for(&mut meters, context as usize) else { return call() };
            let meter = &mut meters[index];
            let Some(percent) = ledger.share(meter.device) else { return call() };
            let Some(clock) = ledger.pace_clock(meter.device).filter(|_| self.gate.applies(switches)) else {
                return call();
            };
            // Captured work runs when its graph is launched, and is paced then.
            if cuda.stream_capturing(launch.stream).unwrap_or(true) {
                return call();
            }
            meter.settle_at(clock, percent, ledger, now);
            let mut plan = meter.plan(launch.key);
            if plan.estimate.is_none() {
                meter.await_guesses(clock, percent, ledger);
                plan = meter.plan(launch.key);
                now = pace::now();
            }
            let wall = pace::wall_cost(plan.estimate.unwrap_or(0), percent);
            // Admitted at once (a container under its share): launched without letting go.
            if pace::try_admit(clock, now, wall).is_ok() {
                return measured(meter, clock, wall, launch, plan, call);
            }
            (index, clock, plan, wall)
        };
        if !self.gate.admit(ledger, clock, wall) {
            return call();
        }
        // Meters are never removed, so the index still names this context's.
        measured(&mut self.meters.lock()[index], clock, wall, launch, plan, call)
    }
}

/// Launches through `meter`, admitted on `clock` at `wall`, which is given back when the launch
/// fails.
fn measured(
    meter: &mut Meter,
    clock: &AtomicU64,
    wall: u64,
    launch: Launch,
    plan: Plan,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    let status = meter.measure(launch, plan, call);
    if status != CUDA_SUCCESS {
        pace::correct(clock, -(wall as i64));
    }
    status
}

/// The index of `context`'s meter, made on its first launch (then the current context's device
/// is asked for); `None` when the driver cannot say which device that is.
fn meter_for(meters: &mut Vec<Meter>, context: usize) -> Option<usize> {
    if let Some(index) = meters.iter().position(|meter| meter.context == context) {
        return Some(index);
    }
    let device = driver::cuda().current_device().ok()?;
    meters.push(Meter::new(context, device as usize));
    Some(meters.len() - 1)
}

/// The wall clock's seconds, from the kernel's coarse clock (read at every launch: a second's
/// precision is all the monitor's `last_kernel_time` has).
fn unix_seconds() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid out-pointer; CLOCK_REALTIME_COARSE exists on every Linux we run on.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut ts) };
    ts.tv_sec.max(0) as u64
}
