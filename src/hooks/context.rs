//! CUDA contexts cost device memory that no allocation call shows (hundreds of MiB on a real
//! card), so creating one is charged and destroying it credited.
//!
//! The cost is measured, not guessed: NVML's device-wide "used" just before and just after the
//! driver creates the context. The first context on a device in the container is measured, one
//! process at a time, and every later one is charged that figure without asking NVML again: a
//! burst of sibling processes starting together would otherwise count each other's contexts. A
//! process outside the container allocating at the instant of the measurement can still skew it.

// Streams, pools, arrays and contexts are opaque driver handles: passed on, never dereferenced.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

use parking_lot::Mutex;

use crate::driver::{self, sys::*};
use crate::error::HookError;
use crate::hooks::memory::budgeted;
use crate::ledger::Allocation;
use crate::runtime::Runtime;

/// This process's references to a device's primary context and what its creation was charged.
#[derive(Debug, Default)]
pub struct Primary {
    references: u64,
    charge: Option<Allocation>,
}

/// How a new context's cost is found.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Cost {
    /// Measured the first time in the container, remembered after (see
    /// [`crate::ledger::Ledger::context_cost`]): every full context of a device costs the same.
    Remembered,
    /// Measured every time: a green context shares much of its device's primary context (measured
    /// on an H100: 6 MiB, against 524 MiB for a full context).
    Measured,
}

/// Runs `create` on budgeted `device` and charges the memory the new context takes, found as
/// `cost` says. If the context does not fit in the budget, `destroy` undoes it and the call is
/// refused.
fn create_charged(
    runtime: &Runtime,
    device: usize,
    cost: Cost,
    create: impl FnOnce() -> Result<(), HookError>,
    destroy: impl FnOnce(),
) -> Result<Allocation, HookError> {
    let mut create = Some(create);
    let mut failure = HookError::NotReady;
    let mut make = |measure: bool| {
        let create = create.take()?;
        if !measure {
            return create().map(|()| 0).map_err(|error| failure = error).ok();
        }
        let uuid = driver::cuda_device_uuids().get(device).copied();
        let nvml = driver::nvml();
        let before = uuid.and_then(|uuid| nvml.used_by_uuid(&uuid).ok());
        create().map_err(|error| failure = error).ok()?;
        let after = uuid.and_then(|uuid| nvml.used_by_uuid(&uuid).ok());
        Some(match (before, after) {
            (Some(before), Some(after)) => after.saturating_sub(before),
            _ => 0,
        })
    };
    let bytes = match cost {
        Cost::Remembered => runtime.ledger().context_cost(device, &mut make),
        Cost::Measured => make(true),
    };
    let bytes = bytes.ok_or(failure)?;
    match runtime.reserve(device, bytes) {
        Ok(owner) => {
            runtime.ledger().note_context(device, bytes as i64);
            runtime.driver_memory.watch();
            Ok(Allocation { device, bytes, owner })
        }
        Err(error) => {
            destroy();
            Err(error)
        }
    }
}

/// `cuDevicePrimaryCtxRetain`: the retain that brings the primary context into being is charged.
///
/// # Safety
/// `ctx` is the application's out-pointer, handed to the driver as it is.
pub unsafe fn primary_retain(runtime: &Runtime, ctx: *mut CUcontext, dev: CUdevice) -> Result<(), HookError> {
    let cuda = driver::cuda();
    let retain = || {
        driver::invoke(cuda.device_primary_ctx_retain, "cuDevicePrimaryCtxRetain", |f| {
            // SAFETY: the arguments are forwarded unchanged; the driver validates them.
            unsafe { f(ctx, dev) }
        })
    };
    let release = || {
        // Undoes the retain that just succeeded on the same device.
        let _ = driver::invoke(cuda.device_primary_ctx_release_v2, "cuDevicePrimaryCtxRelease_v2", |f| {
            // SAFETY: a device ordinal passed by value.
            unsafe { f(dev) }
        });
    };
    let Some(slot) = budgeted(runtime, dev).and_then(|d| runtime.primary.get(d)) else { return retain() };
    let mut primary = slot.lock();
    if primary.references == 0 {
        let device = dev as usize;
        primary.charge = Some(create_charged(runtime, device, Cost::Remembered, retain, release)?);
    } else {
        retain()?;
    }
    primary.references += 1;
    Ok(())
}

/// `cuDevicePrimaryCtxRelease_v2`: the release that drops our last reference credits the charge.
pub fn primary_release(runtime: &Runtime, dev: CUdevice) -> Result<(), HookError> {
    let cuda = driver::cuda();
    let release = || {
        driver::invoke(cuda.device_primary_ctx_release_v2, "cuDevicePrimaryCtxRelease_v2", |f| {
            // SAFETY: a device ordinal passed by value; the driver validates it.
            unsafe { f(dev) }
        })
    };
    let Some(slot) = budgeted(runtime, dev).and_then(|d| runtime.primary.get(d)) else { return release() };
    let mut primary: parking_lot::MutexGuard<'_, Primary> = slot.lock();
    release()?;
    primary.references = primary.references.saturating_sub(1);
    if primary.references == 0
        && let Some(charge) = primary.charge.take()
    {
        runtime.ledger().release(charge.device, charge.bytes, charge.owner);
        runtime.ledger().note_context(charge.device, -(charge.bytes as i64));
    }
    Ok(())
}

/// The three `cuCtxCreate` ABIs, each a new context charged until `cuCtxDestroy`.
pub enum CtxCreate {
    V2 { flags: u32 },
    V3 { params: *mut std::ffi::c_void, num_params: i32, flags: u32 },
    V4 { params: *mut std::ffi::c_void, flags: u32 },
}

/// `cuCtxCreate_v2`, `_v3`, `_v4`.
///
/// # Safety
/// `ctx` and the parameters in `abi` are the application's, handed to the driver as they are.
pub unsafe fn create(
    runtime: &Runtime,
    ctx: *mut CUcontext,
    abi: CtxCreate,
    dev: CUdevice,
) -> Result<(), HookError> {
    let cuda = driver::cuda();
    let affinity = match abi {
        CtxCreate::V2 { .. } => None,
        // SAFETY: the application's parameters, which the driver reads the same way.
        CtxCreate::V3 { params, num_params, .. } => unsafe { sm_affinity(params.cast_const(), num_params) },
        // SAFETY: as above; `params` is NULL or a `CUctxCreateParams`.
        CtxCreate::V4 { params, .. } => unsafe { sm_affinity_of_create_params(params.cast_const()) },
    };
    if let Some(sm_count) = affinity {
        crate::compute::mps::note_affinity(runtime.ledger(), dev as usize, sm_count);
    }
    let make = || match abi {
        CtxCreate::V2 { flags } => {
            driver::invoke(cuda.ctx_create_v2, "cuCtxCreate_v2", |f| {
                // SAFETY: the arguments are forwarded unchanged; the driver validates them.
                unsafe { f(ctx, flags, dev) }
            })
        }
        CtxCreate::V3 { params, num_params, flags } => {
            driver::invoke(cuda.ctx_create_v3, "cuCtxCreate_v3", |f| {
                // SAFETY: the arguments are forwarded unchanged; the driver validates them.
                unsafe { f(ctx, params, num_params, flags, dev) }
            })
        }
        CtxCreate::V4 { params, flags } => {
            driver::invoke(cuda.ctx_create_v4, "cuCtxCreate_v4", |f| {
                // SAFETY: the arguments are forwarded unchanged; the driver validates them.
                unsafe { f(ctx, params, flags, dev) }
            })
        }
    };
    let destroy = |created| {
        driver::invoke(cuda.ctx_destroy_v2, "cuCtxDestroy_v2", |f| {
            // SAFETY: the arguments are forwarded unchanged; the driver validates them.
            unsafe { f(created) }
        })
    };
    // SAFETY: per this function's contract.
    unsafe { create_recorded(runtime, ctx, dev, Cost::Remembered, make, destroy) }
}

/// The SM count of an execution-affinity list (`CUexecAffinityParam[count]`), if it has one.
///
/// # Safety
/// `params` is NULL or points to `count` parameters.
unsafe fn sm_affinity(params: *const std::ffi::c_void, count: i32) -> Option<u32> {
    if params.is_null() || count <= 0 {
        return None;
    }
    let params = params.cast::<CUexecAffinityParam>();
    (0..count as usize).find_map(|k| {
        // SAFETY: `k < count` entries, per this function's contract.
        let param = unsafe { params.add(k).read_unaligned() };
        (param.kind == CU_EXEC_AFFINITY_TYPE_SM_COUNT).then_some(param.sm_count)
    })
}

/// The SM count of a `CUctxCreateParams` (its affinity list pointer, then the list's length).
///
/// # Safety
/// `params` is NULL or points to a `CUctxCreateParams`.
unsafe fn sm_affinity_of_create_params(params: *const std::ffi::c_void) -> Option<u32> {
    if params.is_null() {
        return None;
    }
    // SAFETY: the struct starts with `CUexecAffinityParam *execAffinityParams; int numExecAffinityParams`.
    let (list, count) = unsafe {
        let list = params.cast::<*const std::ffi::c_void>().read_unaligned();
        let count = params.cast::<u8>().add(size_of::<usize>()).cast::<i32>().read_unaligned();
        (list, count)
    };
    // SAFETY: the list the application gave the driver, of `count` entries.
    unsafe { sm_affinity(list, count) }
}

/// `cuCtxDestroy_v2`.
pub fn destroy(runtime: &Runtime, ctx: CUcontext) -> Result<(), HookError> {
    let cuda = driver::cuda();
    destroy_recorded(runtime, ctx, |ctx| {
        driver::invoke(cuda.ctx_destroy_v2, "cuCtxDestroy_v2", |f| {
            // SAFETY: the arguments are forwarded unchanged; the driver validates them.
            unsafe { f(ctx) }
        })
    })
}

/// Runs `make`, which creates a context (full or green) on `dev` and writes it through `ctx`;
/// on a budgeted device charges it as `cost` says and records it in the context table. A context
/// that does not fit is undone with `destroy`.
///
/// # Safety
/// `ctx` is the application's out-pointer, which `make` hands to the driver.
unsafe fn create_recorded(
    runtime: &Runtime,
    ctx: *mut CUcontext,
    dev: CUdevice,
    cost: Cost,
    make: impl FnOnce() -> Result<(), HookError>,
    destroy: impl Fn(CUcontext) -> Result<(), HookError>,
) -> Result<(), HookError> {
    let device = if ctx.is_null() { None } else { budgeted(runtime, dev) };
    let Some(device) = device else { return make() };
    let undo = || {
        // SAFETY: called only after the driver succeeded, so it wrote the non-null `ctx`.
        let created = unsafe { ctx.read() };
        let _ = destroy(created);
    };
    let charge = create_charged(runtime, device, cost, make, undo)?;
    // SAFETY: as above: the context was created and written through `ctx`.
    runtime.contexts.insert(unsafe { ctx.read() } as u64, charge);
    Ok(())
}

/// Runs `destroy` on the context `ctx` and credits what its creation was charged.
fn destroy_recorded(
    runtime: &Runtime,
    ctx: CUcontext,
    destroy: impl FnOnce(CUcontext) -> Result<(), HookError>,
) -> Result<(), HookError> {
    crate::hooks::memory::credit_then(
        runtime,
        &runtime.contexts,
        ctx as u64,
        || destroy(ctx),
        |charge| {
            runtime.ledger().note_context(charge.device, -(charge.bytes as i64));
        },
    )
}

/// Per-device primary-context state, one per possible device.
pub type PrimaryTable = [Mutex<Primary>; crate::config::MAX_DEVICES];

/// `cuGreenCtxCreate`: a green context (on part of the device's SMs) is charged what its creation
/// measured to cost, until `cuGreenCtxDestroy`.
///
/// # Safety
/// `ctx` and `desc` are the application's, handed to the driver as they are.
pub unsafe fn green_create(
    runtime: &Runtime,
    ctx: *mut CUgreenCtx,
    desc: *mut std::ffi::c_void,
    dev: CUdevice,
    flags: u32,
) -> Result<(), HookError> {
    let cuda = driver::cuda();
    let make = || {
        driver::invoke(cuda.green_ctx_create, "cuGreenCtxCreate", |f| {
            // SAFETY: the arguments are forwarded unchanged; the driver validates them.
            unsafe { f(ctx, desc, dev, flags) }
        })
    };
    let destroy = |created| {
        driver::invoke(cuda.green_ctx_destroy, "cuGreenCtxDestroy", |f| {
            // SAFETY: the arguments are forwarded unchanged; the driver validates them.
            unsafe { f(created) }
        })
    };
    // SAFETY: per this function's contract.
    unsafe { create_recorded(runtime, ctx, dev, Cost::Measured, make, destroy) }
}

/// `cuGreenCtxDestroy`.
pub fn green_destroy(runtime: &Runtime, ctx: CUgreenCtx) -> Result<(), HookError> {
    let cuda = driver::cuda();
    destroy_recorded(runtime, ctx, |ctx| {
        driver::invoke(cuda.green_ctx_destroy, "cuGreenCtxDestroy", |f| {
            // SAFETY: the arguments are forwarded unchanged; the driver validates them.
            unsafe { f(ctx) }
        })
    })
}
