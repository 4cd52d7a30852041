//! Compute limits (`CUDA_DEVICE_SM_LIMIT`): a container's launches occupy the GPU for at most its
//! share of the time.
//!
//! Every launch path (kernels, cooperative and `Ex` launches, graph launches) comes here when a
//! device has a share. A launch is admitted by the container's pacing clock ([`pace`]) on an
//! estimate of its GPU time, and timed on the GPU by a pair of events ([`meter`]), which corrects
//! the clock and the next estimate. The share is time, not SMs: a kernel runs on the whole GPU,
//! and the container's kernels are spaced out so that together they hold it for the share.
//! Work captured into a graph is not run at capture, so it is not paced there; the graph's
//! launches are.
//!
//! Nothing here is reached when no device has a share: the launch hooks are then not even
//! handed out by `dlsym` or `cuGetProcAddress` (see `exports`).

pub mod meter;
pub mod mps;

pub use vgpu_ledger::pace;

use parking_lot::Mutex;

use crate::config::Config;
use crate::driver::{self, sys::*};
use crate::ledger::Ledger;
use meter::Meter;

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
        self.gate.hold(ledger);
        ledger.mark_launch();
        let Ok(device) = cuda.current_device() else { return call() };
        let device = device as usize;
        let Some(percent) = ledger.share(device) else { return call() };
        if !self.gate.enforced(ledger) {
            return call();
        }
        let (Some(clock), Ok(context)) = (ledger.pace_clock(device), cuda.current_context()) else {
            return call();
        };
        // Captured work runs when its graph is launched, and is paced then.
        if cuda.stream_capturing(launch.stream).unwrap_or(true) {
            return call();
        }
        let estimate = {
            let mut meters = self.meters.lock();
            let meter = meter_for(&mut meters, context as usize, device);
            meter.settle(clock, percent, ledger);
            if meter.estimate(launch.key).is_none() {
                meter.await_guesses(clock, percent, ledger);
            }
            meter.estimate(launch.key)
        };
        let wall = pace::wall_cost(estimate.unwrap_or(0), percent);
        if !self.gate.admit(ledger, clock, wall) {
            return call();
        }
        let mut meters = self.meters.lock();
        let meter = meter_for(&mut meters, context as usize, device);
        let status = meter.measure(launch, estimate, call);
        if status != CUDA_SUCCESS {
            pace::correct(clock, -(wall as i64));
        }
        status
    }
}

fn meter_for(meters: &mut Vec<Meter>, context: usize, device: usize) -> &mut Meter {
    let index = match meters.iter().position(|meter| meter.context == context) {
        Some(index) => index,
        None => {
            meters.push(Meter::new(context, device));
            meters.len() - 1
        }
    };
    &mut meters[index]
}

fn unix_seconds() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |since| since.as_secs())
}
