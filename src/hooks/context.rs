//! CUDA contexts cost device memory that no allocation call shows (hundreds of MiB on a real
//! card), so creating one is charged and destroying it credited.
//!
//! The cost is what NVML's figure for this process grew by while the driver created the context,
//! less what this process's other threads charged meanwhile: no other process moves that figure,
//! so a neighbour allocating or freeing at the same instant changes nothing (a device-wide
//! difference, which release 0.1.0 took and the container remembered, charged one container
//! 1.5-2.0 GiB of its neighbour's memory). Where NVML does not list this process, the context is
//! charged a bound (the container's remembered cost or a device-wide difference, whichever is
//! larger) until the driver-memory reconciliation can read the figure and settles it
//! ([`crate::hooks::driver_memory`]).

// Streams, pools, arrays and contexts are opaque driver handles: passed on, never dereferenced.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

use parking_lot::Mutex;

use crate::driver::{self, sys::*};
use crate::error::HookError;
use crate::hooks::memory::budgeted;
use crate::ledger::{Allocation, ContextCost};
use crate::runtime::Runtime;

/// This process's references to a device's primary context and what its creation was charged.
#[derive(Debug, Default)]
pub struct Primary {
    references: u64,
    charge: Option<Allocation>,
}

/// Which kind of context is created.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A full context: the container remembers its cost, the bound for a process NVML does not
    /// list and what release 0.1.0's processes in the container charge.
    Full,
    /// A green context shares much of its device's primary context (measured on an H100: 6 MiB,
    /// against 524 MiB for a full context): its cost is its own.
    Green,
}

/// The key a primary context's bound is known by in [`crate::hooks::driver_memory`]; other
/// contexts are known by their handle.
fn primary_key(device: usize) -> u64 {
    u64::MAX - device as u64
}

/// Runs `create` on budgeted `device` and charges the memory the new context takes. If the
/// context does not fit in the budget, `destroy` undoes it and the call is refused. `key` names
/// the context once created (its handle, or [`primary_key`]), for a bound to be settled later.
fn create_charged(
    runtime: &Runtime,
    device: usize,
    kind: Kind,
    create: impl FnOnce() -> Result<(), HookError>,
    key: impl FnOnce() -> u64,
    destroy: impl FnOnce(),
) -> Result<Allocation, HookError> {
    let ledger = runtime.ledger();
    let uuid = driver::cuda_device_uuids().get(device).copied();
    let nvml = driver::nvml();
    let own = || uuid.and_then(|uuid| nvml.process_used_by_uuid(&uuid, std::process::id()).ok().flatten());
    let wide = || uuid.and_then(|uuid| nvml.used_by_uuid(&uuid).ok());
    let remembered = if kind == Kind::Full { ledger.remembered_context_cost(device) } else { None };
    // NVML counts a context's memory while the driver is still making it: the container is charged
    // what a context cost here before, ahead of the driver call, so that it is never charged less
    // than the card holds for it, and a context that cannot fit is refused before it is made.
    let ahead = remembered.map_or(0, |known| known.bytes);
    let owner = runtime.reserve(device, ahead)?;
    // No reconciliation runs while the context comes into being: it would count the new context
    // as the driver's own memory before it is charged.
    let measured = runtime.driver_memory.paused(|| {
        let held_before = ledger.held(device);
        let own_before = own();
        let wide_before = wide();
        create()?;
        let Some(own_after) = own() else {
            let wide_after = wide();
            return Ok::<_, HookError>(ContextCost {
                bytes: wide_before.zip(wide_after).map_or(0, |(before, after)| after.saturating_sub(before)),
                exact: false,
            });
        };
        // Another thread of this process may have charged (or credited) an allocation meanwhile:
        // the ledger holds those already.
        let others = ledger.held(device) as i128 - held_before as i128;
        let grew = own_after as i128 - own_before.unwrap_or(0) as i128;
        Ok(ContextCost { bytes: (grew - others).clamp(0, u64::MAX as i128) as u64, exact: true })
    });
    let cost = match measured {
        Ok(cost) => cost,
        Err(error) => {
            ledger.release(device, ahead, owner);
            return Err(error);
        }
    };
    let key = key();
    let bytes = match remembered {
        Some(known) if !cost.exact => cost.bytes.max(known.bytes),
        _ => cost.bytes,
    };
    if kind == Kind::Full {
        ledger.remember_context_cost(device, ContextCost { bytes, exact: cost.exact });
    }
    // The owner of the last charge: a zero-byte charge ahead took no lease.
    let owner = if bytes > ahead {
        match runtime.reserve(device, bytes - ahead) {
            Ok(owner) => owner,
            Err(error) => {
                destroy();
                ledger.release(device, ahead, owner);
                return Err(error);
            }
        }
    } else {
        ledger.release(device, ahead - bytes, owner);
        owner
    };
    ledger.note_context(device, bytes as i64);
    if !cost.exact {
        runtime.driver_memory.bound(key, device, bytes);
    }
    runtime.driver_memory.watch();
    Ok(Allocation { device, bytes, owner })
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
        primary.charge =
            Some(create_charged(runtime, device, Kind::Full, retain, || primary_key(device), release)?);
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
        runtime.driver_memory.forget(primary_key(charge.device));
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
    unsafe { create_recorded(runtime, ctx, dev, Kind::Full, make, destroy) }
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
/// on a budgeted device charges it and records it in the context table. A context that does not
/// fit is undone with `destroy`.
///
/// # Safety
/// `ctx` is the application's out-pointer, which `make` hands to the driver.
unsafe fn create_recorded(
    runtime: &Runtime,
    ctx: *mut CUcontext,
    dev: CUdevice,
    kind: Kind,
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
    // SAFETY: called only after the driver succeeded, so it wrote the non-null `ctx`.
    let key = || unsafe { ctx.read() } as u64;
    let charge = create_charged(runtime, device, kind, make, key, undo)?;
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
            runtime.driver_memory.forget(ctx as u64);
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
    unsafe { create_recorded(runtime, ctx, dev, Kind::Green, make, destroy) }
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
