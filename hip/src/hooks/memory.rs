//! Device memory freed with `hipFree`: linear, managed, `hipExtMallocWithFlags`, pitched and 3D
//! allocations (docs/architecture.md, "HIP"); stream-ordered ones are [`super::pools`]'.
//!
//! Every creating hook has one shape ([`charge`]): find the device and size, reserve in the
//! ledger, call the runtime, record the new pointer, or roll the reservation back if the runtime
//! refuses. Every freeing hook ([`credit`]) takes the record out before the runtime call and gives
//! the bytes back once the runtime has freed it. NULL out-pointers are never read: such calls go
//! to the runtime unaccounted and return its own error.

// Streams and pools are opaque runtime handles: passed on, never dereferenced.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

use std::ffi::{c_uint, c_void};
use std::sync::Once;

use vgpu_ledger::config::MAX_DEVICES;
use vgpu_ledger::{Allocation, AllocationTable};

use crate::error::HookError;
use crate::hooks::pools;
use crate::runtime::Runtime;
use crate::sys::*;

/// `device` if it has a budget. In a container with budgets, an ordinal past what a region can
/// describe is treated as budgeted too, so that its allocations are refused, not unlimited.
pub fn budgeted(runtime: &Runtime, device: HipDevice) -> Option<usize> {
    let ledger = runtime.ledger();
    let device = usize::try_from(device).ok()?;
    if device >= MAX_DEVICES && ledger.any_limit() {
        static REPORTED: Once = Once::new();
        REPORTED.call_once(|| {
            tracing::error!(
                device,
                "libvgpu_hip budgets at most {MAX_DEVICES} devices; HIP device {device} is refused"
            );
        });
        return Some(device);
    }
    ledger.budgeted(device).then_some(device)
}

/// The calling thread's current device, if it has a budget. With one device visible the runtime
/// is not asked: it can only be device 0.
pub fn budgeted_current(runtime: &Runtime) -> Option<usize> {
    if !runtime.ledger().any_limit() {
        return None;
    }
    if runtime.device_count() == 1 {
        return budgeted(runtime, 0);
    }
    budgeted(runtime, runtime.current_device().ok()?)
}

/// Reserves `bytes` on `device`, runs `create` (which returns the new object's key), records it in
/// `table`, or rolls the reservation back if `create` fails. A key of 0 (a zero-byte allocation
/// gives NULL) holds nothing.
pub fn charge(
    runtime: &Runtime,
    table: &AllocationTable,
    device: usize,
    bytes: u64,
    create: impl FnOnce() -> Result<u64, HookError>,
) -> Result<(), HookError> {
    let ledger = runtime.ledger();
    let owner = runtime.reserve(device, bytes)?;
    match create() {
        Ok(0) => {
            ledger.release(device, bytes, owner);
            Ok(())
        }
        Ok(key) => {
            table.insert(key, Allocation { device, bytes, owner });
            Ok(())
        }
        Err(error) => {
            ledger.release(device, bytes, owner);
            Err(error)
        }
    }
}

/// Runs `destroy` for the object `key` and credits what it was charged, if we charged it.
pub fn credit(
    runtime: &Runtime,
    table: &AllocationTable,
    key: u64,
    destroy: impl FnOnce() -> Result<(), HookError>,
) -> Result<(), HookError> {
    if !runtime.ledger().any_limit() {
        return destroy();
    }
    let record = table.remove(key);
    match (destroy(), record) {
        (Ok(()), Some(allocation)) => {
            runtime.ledger().release(allocation.device, allocation.bytes, allocation.owner);
            Ok(())
        }
        (Err(error), Some(allocation)) => {
            table.insert(key, allocation);
            Err(error)
        }
        (result, None) => result,
    }
}

/// A plain allocation of `size` bytes on the current device through `call`, which writes the
/// new pointer to `ptr`.
///
/// # Safety
/// `ptr` is the application's out-pointer, handed to the runtime as it is.
unsafe fn allocate(
    runtime: &Runtime,
    ptr: *mut *mut c_void,
    size: usize,
    call: impl FnOnce() -> Result<(), HookError>,
) -> Result<(), HookError> {
    let device = if ptr.is_null() { None } else { budgeted_current(runtime) };
    let Some(device) = device else { return call() };
    charge(runtime, &runtime.allocations, device, size as u64, || {
        call()?;
        // SAFETY: the runtime succeeded, so it wrote the non-null out-pointer.
        Ok(unsafe { ptr.read() } as u64)
    })
}

/// `hipMalloc`.
///
/// # Safety
/// `ptr` is the application's out-pointer.
pub unsafe fn malloc(runtime: &Runtime, ptr: *mut *mut c_void, size: usize) -> Result<(), HookError> {
    // SAFETY: the application's arguments, forwarded unchanged.
    unsafe { allocate(runtime, ptr, size, || runtime.real.hipMalloc(ptr, size)) }
}

/// `hipExtMallocWithFlags`: device memory whatever the flags (fine- or coarse-grained, uncached).
///
/// # Safety
/// `ptr` is the application's out-pointer.
pub unsafe fn ext_malloc_with_flags(
    runtime: &Runtime,
    ptr: *mut *mut c_void,
    size: usize,
    flags: c_uint,
) -> Result<(), HookError> {
    // SAFETY: the application's arguments, forwarded unchanged.
    unsafe { allocate(runtime, ptr, size, || runtime.real.hipExtMallocWithFlags(ptr, size, flags)) }
}

/// `hipMallocManaged`: charged in full to the current device, as `cuMemAllocManaged` is.
///
/// # Safety
/// `ptr` is the application's out-pointer.
pub unsafe fn malloc_managed(
    runtime: &Runtime,
    ptr: *mut *mut c_void,
    size: usize,
    flags: c_uint,
) -> Result<(), HookError> {
    // SAFETY: the application's arguments, forwarded unchanged.
    unsafe { allocate(runtime, ptr, size, || runtime.real.hipMallocManaged(ptr, size, flags)) }
}

/// `hipFree` (also frees stream-ordered, managed and pitched memory).
///
/// # Safety
/// `ptr` is the application's pointer, handed to the runtime as it is.
pub unsafe fn free(runtime: &Runtime, ptr: *mut c_void) -> Result<(), HookError> {
    // SAFETY: forwarded unchanged.
    pools::free_pointer(runtime, ptr as u64, || unsafe { runtime.real.hipFree(ptr) })
}

/// `hipDeviceReset`: the runtime frees everything on the current device, so everything charged
/// there (allocations, arrays, VMM handles, stream-ordered pools) is credited.
///
/// # Safety
/// No arguments; `unsafe` as every hook is.
pub unsafe fn device_reset(runtime: &Runtime) -> Result<(), HookError> {
    let device = if runtime.device_count() == 1 { Some(0) } else { runtime.current_device().ok() };
    // SAFETY: no arguments.
    unsafe { runtime.real.hipDeviceReset() }?;
    let Some(device) = device.and_then(|d| budgeted(runtime, d)) else { return Ok(()) };
    let ledger = runtime.ledger();
    let drained = runtime
        .allocations
        .drain_device(device)
        .into_iter()
        .chain(runtime.arrays.drain_device(device))
        .chain(runtime.vmm.drain_device(device))
        .chain(runtime.pools.drain_device(device));
    for allocation in drained {
        ledger.release(allocation.device, allocation.bytes, allocation.owner);
    }
    Ok(())
}

/// A pitched allocation of `rows` rows of `width` bytes: charged `pitch × rows`. The pitch is known
/// only after the call, so the width rounded up to 512 bytes is reserved first and the difference
/// settled afterwards; if the real pitch does not fit, the memory is freed again and refused.
/// `call` returns the new pointer and its pitch.
fn pitched(
    runtime: &Runtime,
    width: usize,
    rows: u64,
    call: impl FnOnce() -> Result<(u64, u64), HookError>,
) -> Result<(), HookError> {
    let Some(device) = budgeted_current(runtime) else { return call().map(drop) };
    let ledger = runtime.ledger();
    let estimate = (width as u64).div_ceil(512).saturating_mul(512).saturating_mul(rows);
    let owner = runtime.reserve(device, estimate)?;
    let (address, pitch) = match call() {
        Ok(made) => made,
        Err(error) => {
            ledger.release(device, estimate, owner);
            return Err(error);
        }
    };
    let actual = pitch.saturating_mul(rows);
    if actual > estimate {
        if let Err(error) = runtime.reserve(device, actual - estimate) {
            // SAFETY: `address` is the allocation the runtime just made for us.
            let _ = unsafe { runtime.real.hipFree(address as *mut c_void) };
            ledger.release(device, estimate, owner);
            return Err(error);
        }
    } else {
        ledger.release(device, estimate - actual, owner);
    }
    if address != 0 {
        runtime.allocations.insert(address, Allocation { device, bytes: actual, owner });
    } else {
        ledger.release(device, actual, owner);
    }
    Ok(())
}

/// `hipMallocPitch`.
///
/// # Safety
/// `ptr` and `pitch` are the application's out-pointers.
pub unsafe fn malloc_pitch(
    runtime: &Runtime,
    ptr: *mut *mut c_void,
    pitch: *mut usize,
    width: usize,
    height: usize,
) -> Result<(), HookError> {
    // SAFETY: forwarded unchanged.
    let call = || unsafe { runtime.real.hipMallocPitch(ptr, pitch, width, height) };
    if ptr.is_null() || pitch.is_null() {
        return call();
    }
    pitched(runtime, width, height as u64, || {
        call()?;
        // SAFETY: the runtime succeeded, so it wrote both non-null out-pointers.
        Ok(unsafe { (ptr.read() as u64, pitch.read() as u64) })
    })
}

/// `hipMemAllocPitch` (the driver-API form).
///
/// # Safety
/// `ptr` and `pitch` are the application's out-pointers.
pub unsafe fn mem_alloc_pitch(
    runtime: &Runtime,
    ptr: *mut *mut c_void,
    pitch: *mut usize,
    width: usize,
    height: usize,
    element_size: c_uint,
) -> Result<(), HookError> {
    // SAFETY: forwarded unchanged.
    let call = || unsafe { runtime.real.hipMemAllocPitch(ptr, pitch, width, height, element_size) };
    if ptr.is_null() || pitch.is_null() {
        return call();
    }
    pitched(runtime, width, height as u64, || {
        call()?;
        // SAFETY: the runtime succeeded, so it wrote both non-null out-pointers.
        Ok(unsafe { (ptr.read() as u64, pitch.read() as u64) })
    })
}

/// `hipMalloc3D`: charged `pitch × height × depth`.
///
/// # Safety
/// `pitched_ptr` is the application's out-pointer.
pub unsafe fn malloc_3d(
    runtime: &Runtime,
    pitched_ptr: *mut PitchedPtr,
    extent: Extent,
) -> Result<(), HookError> {
    // SAFETY: forwarded unchanged.
    let call = || unsafe { runtime.real.hipMalloc3D(pitched_ptr, extent) };
    if pitched_ptr.is_null() {
        return call();
    }
    let rows = (extent.height.max(1) as u64).saturating_mul(extent.depth.max(1) as u64);
    pitched(runtime, extent.width, rows, || {
        call()?;
        // SAFETY: the runtime succeeded, so it wrote the non-null out-pointer.
        let made = unsafe { pitched_ptr.read() };
        Ok((made.ptr as u64, made.pitch as u64))
    })
}
