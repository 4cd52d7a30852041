//! Compute shares for HIP launches (`CUDA_DEVICE_SM_LIMIT`, `CUDA_DEVICE_SM_LIMIT_<N>`): kernels
//! and graphs launched through `hipLaunchKernel`, `hipModuleLaunchKernel` and `hipGraphLaunch`, and
//! copies and memsets that run on the device, wait for the container's pacing clock, the one CUDA
//! launches and Vulkan submissions use.
//!
//! A launch is admitted on an estimate of its GPU time (the last one measured on that device in
//! this process) and timed on the GPU by a pair of events recorded on its stream around it. Later
//! launches look at the pairs in flight; each finished one corrects the clock by the difference
//! between its real duration and what was charged, and becomes the next estimate. The
//! application's thread waits for the GPU only when more than [`MAX_IN_FLIGHT`] pairs are out.

// Streams are opaque runtime handles: passed on, never dereferenced.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

use std::collections::VecDeque;
use std::ffi::c_uint;
use std::sync::atomic::AtomicU64;

use parking_lot::Mutex;
use vgpu_ledger::config::{Config, MAX_DEVICES};
use vgpu_ledger::pace::{self, Gate};

use crate::error::HookError;
use crate::runtime::Runtime;
use crate::sys::{Opaque, STREAM_PER_THREAD};

/// Event pairs in flight per device before a launch waits for the oldest.
const MAX_IN_FLIGHT: usize = 64;

/// `hipEventDefault`: timed events.
const EVENT_DEFAULT: c_uint = 0;

/// One launch being timed: its events (kept as numbers: runtime handles) and what was charged.
#[derive(Debug)]
struct InFlight {
    start: usize,
    stop: usize,
    charged: u64,
}

#[derive(Debug, Default)]
struct Meter {
    /// GPU nanoseconds of the last launch measured.
    estimate: u64,
    in_flight: VecDeque<InFlight>,
    spare: Vec<(usize, usize)>,
}

/// The compute limiter of this process.
pub struct Limiter {
    gate: Gate,
    meters: Mutex<Vec<Meter>>,
}

impl Limiter {
    /// The limiter, when any device has a compute share (here or in the container's region). Each
    /// launch reads its device's share from the ledger, so the region's share applies and a resize
    /// reaches the next launch.
    pub fn from_config(config: &Config) -> Option<Limiter> {
        config.any_compute_limit().then(|| Limiter {
            gate: Gate::new(config.core_policy),
            meters: Mutex::new((0..MAX_DEVICES).map(|_| Meter::default()).collect()),
        })
    }
}

/// The stream a `_spt` call's work goes to: NULL there is the per-thread default stream.
pub fn per_thread(stream: Opaque) -> Opaque {
    if stream.is_null() { STREAM_PER_THREAD as Opaque } else { stream }
}

/// Runs `call`, a launch onto `stream`, under the share of the current device (if it has one).
pub fn launch(
    runtime: &Runtime,
    stream: Opaque,
    call: impl FnOnce() -> Result<(), HookError>,
) -> Result<(), HookError> {
    launch_if(runtime, stream, || true, call)
}

/// Runs `call` as [`launch`] does, but paced only if `on_device` says its work runs on the GPU;
/// `on_device` is asked only when the device has a share (it may cost a pointer query).
pub fn launch_if(
    runtime: &Runtime,
    stream: Opaque,
    on_device: impl FnOnce() -> bool,
    call: impl FnOnce() -> Result<(), HookError>,
) -> Result<(), HookError> {
    let Some(limiter) = &runtime.compute else { return call() };
    let device = if runtime.device_count() == 1 { Some(0) } else { runtime.current_device().ok() };
    let Some((device, percent)) =
        device.and_then(|d| usize::try_from(d).ok()).and_then(|d| Some((d, runtime.ledger().share(d)?)))
    else {
        return call();
    };
    if !on_device() {
        return call();
    }
    let ledger = runtime.ledger();
    ledger.mark_launch();
    let Some(clock) = ledger.pace_clock(device) else { return call() };
    if !limiter.gate.enforced(ledger) {
        return call();
    }
    let estimate = {
        let mut meters = limiter.meters.lock();
        settle(runtime, &mut meters[device], clock, percent, false);
        meters[device].estimate
    };
    let charged = pace::wall_cost(estimate, percent);
    if !limiter.gate.admit(ledger, clock, charged) {
        return call();
    }
    let pair = limiter.meters.lock()[device].spare.pop().or_else(|| event_pair(runtime));
    // SAFETY: events this library created, recorded on the application's own stream.
    let timed =
        pair.filter(|&(start, _)| unsafe { runtime.real.hipEventRecord(start as Opaque, stream) }.is_ok());
    let result = call();
    let mut meters = limiter.meters.lock();
    let meter = &mut meters[device];
    match (result, timed) {
        (Err(error), pair) => {
            pace::correct(clock, -(charged as i64));
            meter.spare.extend(pair);
            Err(error)
        }
        (Ok(()), Some((start, stop))) => {
            // SAFETY: as above.
            if unsafe { runtime.real.hipEventRecord(stop as Opaque, stream) }.is_ok() {
                meter.in_flight.push_back(InFlight { start, stop, charged });
                if meter.in_flight.len() > MAX_IN_FLIGHT {
                    settle(runtime, meter, clock, percent, true);
                }
            } else {
                meter.spare.push((start, stop));
            }
            Ok(())
        }
        (Ok(()), None) => Ok(()),
    }
}

/// Two fresh timed events, or `None` if the runtime cannot make them (the launch is then charged
/// its estimate only).
fn event_pair(runtime: &Runtime) -> Option<(usize, usize)> {
    let make = || {
        let mut event: Opaque = std::ptr::null_mut();
        // SAFETY: `event` is a valid out-pointer.
        unsafe { runtime.real.hipEventCreateWithFlags(&mut event, EVENT_DEFAULT) }.ok()?;
        Some(event as usize)
    };
    Some((make()?, make()?))
}

/// Corrects the clock for every finished launch at the front of `meter`'s queue; with `wait`,
/// first waits for the oldest to finish.
fn settle(runtime: &Runtime, meter: &mut Meter, clock: &AtomicU64, percent: u64, wait: bool) {
    if wait && let Some(oldest) = meter.in_flight.front() {
        // SAFETY: an event this library created and recorded.
        let _ = unsafe { runtime.real.hipEventSynchronize(oldest.stop as Opaque) };
    }
    while let Some(oldest) = meter.in_flight.front() {
        // SAFETY: as above.
        if unsafe { runtime.real.hipEventQuery(oldest.stop as Opaque) }.is_err() {
            break;
        }
        let mut ms = 0f32;
        // SAFETY: `ms` is a valid out-pointer; both events were recorded and are complete.
        let measured = unsafe {
            runtime.real.hipEventElapsedTime(&mut ms, oldest.start as Opaque, oldest.stop as Opaque)
        };
        if measured.is_ok() && ms.is_finite() && ms >= 0.0 {
            let gpu_ns = (f64::from(ms) * 1e6) as u64;
            let real = pace::wall_cost(gpu_ns, percent);
            pace::correct(clock, real as i64 - oldest.charged as i64);
            meter.estimate = gpu_ns;
        }
        meter.spare.push((oldest.start, oldest.stop));
        meter.in_flight.pop_front();
    }
}
