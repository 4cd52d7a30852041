//! Device memory: every call that creates or destroys it, and the queries that report the virtual
//! GPU (DESIGN §3).
//!
//! Every creating hook follows one shape ([`charge`]): find the device and size, reserve in the
//! ledger, call the driver, record the new object, or roll the reservation back if the driver
//! refuses. Every destroying hook ([`credit`]) takes the record out before the driver call (so an
//! address handed out again at once is not confused with the old one) and gives the bytes back
//! once the driver has freed it. Out-pointers the driver would reject (NULL) are never read: such
//! calls go to the driver unaccounted and return its own error.

// Streams, pools, arrays and contexts are opaque driver handles: passed on, never dereferenced.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

use crate::driver::{self, sys::*};
use crate::error::HookError;
use crate::ledger::{Allocation, AllocationTable};
use crate::runtime::Runtime;

/// `device` if it has a budget (so its memory must be counted).
pub fn budgeted(runtime: &Runtime, device: CUdevice) -> Option<usize> {
    let ledger = runtime.ledger();
    let device = usize::try_from(device).ok()?;
    (ledger.any_limit() && ledger.limit(device).is_some()).then_some(device)
}

/// The calling thread's current device if it has a budget. No context → `None`: the driver then
/// gives its own error.
pub fn budgeted_current(runtime: &Runtime) -> Option<usize> {
    if !runtime.ledger().any_limit() {
        return None;
    }
    budgeted(runtime, driver::cuda().current_device().ok()?)
}

/// Reserves `bytes` on `device`, runs `create` (which returns the new object's key), and records
/// the object in `table`; rolls back if `create` fails.
pub fn charge(
    runtime: &Runtime,
    table: &AllocationTable,
    device: usize,
    bytes: u64,
    create: impl FnOnce() -> Result<u64, HookError>,
) -> Result<(), HookError> {
    let owner = runtime.ledger().try_reserve(device, bytes)?;
    match create() {
        Ok(key) => {
            table.insert(key, Allocation { device, bytes, owner });
            Ok(())
        }
        Err(error) => {
            runtime.ledger().release(device, bytes, owner);
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

/// The default-stream or per-thread-stream (`_ptsz`) variant of a stream-ordered entry point.
fn stream_variant<F>(
    per_thread: bool,
    legacy: (Option<F>, &'static str),
    ptsz: (Option<F>, &'static str),
) -> (Option<F>, &'static str) {
    if per_thread { ptsz } else { legacy }
}

/// Charges an allocation that writes its address through `dptr`, on the current device.
///
/// # Safety
/// `dptr` is the application's out-pointer; `allocate` hands it to the driver.
unsafe fn charge_linear(
    runtime: &Runtime,
    dptr: *mut CUdeviceptr,
    bytes: usize,
    allocate: impl FnOnce() -> Result<(), HookError>,
) -> Result<(), HookError> {
    let device = if dptr.is_null() { None } else { budgeted_current(runtime) };
    let Some(device) = device else { return allocate() };
    charge(runtime, &runtime.allocations, device, bytes as u64, || {
        allocate()?;
        // SAFETY: the driver succeeded, so it wrote the new address through the non-null `dptr`.
        Ok(unsafe { dptr.read() })
    })
}

/// `cuMemAlloc_v2`.
///
/// # Safety
/// `dptr` is the application's out-pointer, handed to the driver as it is.
pub unsafe fn alloc(runtime: &Runtime, dptr: *mut CUdeviceptr, bytes: usize) -> Result<(), HookError> {
    let cuda = driver::cuda();
    // SAFETY: `dptr` is the application's, forwarded unchanged.
    unsafe { charge_linear(runtime, dptr, bytes, || cuda.mem_alloc(dptr, bytes)) }
}

/// `cuMemAllocManaged`: managed memory lives on the device while in use, so it is charged.
///
/// # Safety
/// `dptr` is the application's out-pointer, handed to the driver as it is.
pub unsafe fn alloc_managed(
    runtime: &Runtime,
    dptr: *mut CUdeviceptr,
    bytes: usize,
    flags: u32,
) -> Result<(), HookError> {
    let cuda = driver::cuda();
    // SAFETY: the application's arguments, forwarded unchanged.
    unsafe {
        charge_linear(runtime, dptr, bytes, || {
            driver::invoke(cuda.mem_alloc_managed, "cuMemAllocManaged", |f| f(dptr, bytes, flags))
        })
    }
}

/// `cuMemAllocAsync` and its `_ptsz` twin (`per_thread`): charged when allocated, credited when
/// freed with `cuMemFreeAsync`.
///
/// # Safety
/// `dptr` is the application's out-pointer, handed to the driver as it is.
pub unsafe fn alloc_async(
    runtime: &Runtime,
    dptr: *mut CUdeviceptr,
    bytes: usize,
    stream: CUstream,
    per_thread: bool,
) -> Result<(), HookError> {
    let cuda = driver::cuda();
    let (entry, name) = stream_variant(
        per_thread,
        (cuda.mem_alloc_async, "cuMemAllocAsync"),
        (cuda.mem_alloc_async_ptsz, "cuMemAllocAsync_ptsz"),
    );
    // SAFETY: the application's arguments, forwarded unchanged.
    unsafe { charge_linear(runtime, dptr, bytes, || driver::invoke(entry, name, |f| f(dptr, bytes, stream))) }
}

/// `cuMemAllocFromPoolAsync` and its `_ptsz` twin. The pool's device is taken to be the current
/// one (pools are made for the device their user works on).
///
/// # Safety
/// `dptr` is the application's out-pointer, handed to the driver as it is.
pub unsafe fn alloc_from_pool_async(
    runtime: &Runtime,
    dptr: *mut CUdeviceptr,
    bytes: usize,
    pool: CUmemoryPool,
    stream: CUstream,
    per_thread: bool,
) -> Result<(), HookError> {
    let cuda = driver::cuda();
    let (entry, name) = stream_variant(
        per_thread,
        (cuda.mem_alloc_from_pool_async, "cuMemAllocFromPoolAsync"),
        (cuda.mem_alloc_from_pool_async_ptsz, "cuMemAllocFromPoolAsync_ptsz"),
    );
    // SAFETY: the application's arguments, forwarded unchanged.
    unsafe {
        charge_linear(runtime, dptr, bytes, || driver::invoke(entry, name, |f| f(dptr, bytes, pool, stream)))
    }
}

/// `cuMemAllocPitch_v2`: charged `pitch × height`. The pitch is known only after the call, so the
/// row width rounded up to 512 bytes is reserved first and the difference settled afterwards; if
/// the real pitch does not fit, the allocation is freed again and refused.
///
/// # Safety
/// `dptr` and `pitch` are the application's out-pointers, handed to the driver as they are.
pub unsafe fn alloc_pitch(
    runtime: &Runtime,
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    element_size: u32,
) -> Result<(), HookError> {
    let cuda = driver::cuda();
    let allocate = || {
        driver::invoke(cuda.mem_alloc_pitch_v2, "cuMemAllocPitch_v2", |f| {
            // SAFETY: the application's arguments, forwarded unchanged.
            unsafe { f(dptr, pitch, width, height, element_size) }
        })
    };
    let device = if dptr.is_null() || pitch.is_null() { None } else { budgeted_current(runtime) };
    let Some(device) = device else { return allocate() };
    let estimate = (width as u64).div_ceil(512).saturating_mul(512).saturating_mul(height as u64);
    let ledger = runtime.ledger();
    let owner = ledger.try_reserve(device, estimate)?;
    if let Err(error) = allocate() {
        ledger.release(device, estimate, owner);
        return Err(error);
    }
    // SAFETY: the driver succeeded, so it wrote both non-null out-pointers.
    let (address, real_pitch) = unsafe { (dptr.read(), pitch.read()) };
    let actual = (real_pitch as u64).saturating_mul(height as u64);
    if actual > estimate {
        if let Err(error) = ledger.try_reserve(device, actual - estimate) {
            let _ = cuda.mem_free(address);
            ledger.release(device, estimate, owner);
            return Err(error);
        }
    } else {
        ledger.release(device, estimate - actual, owner);
    }
    runtime.allocations.insert(address, Allocation { device, bytes: actual, owner });
    Ok(())
}

/// `cuMemFree_v2`.
pub fn free(runtime: &Runtime, dptr: CUdeviceptr) -> Result<(), HookError> {
    credit(runtime, &runtime.allocations, dptr, || driver::cuda().mem_free(dptr))
}

/// `cuMemFreeAsync` and its `_ptsz` twin: credited when the free is enqueued. The pool may keep
/// the memory cached past this point (see README: stream-ordered pools).
pub fn free_async(
    runtime: &Runtime,
    dptr: CUdeviceptr,
    stream: CUstream,
    per_thread: bool,
) -> Result<(), HookError> {
    let cuda = driver::cuda();
    let (entry, name) = stream_variant(
        per_thread,
        (cuda.mem_free_async, "cuMemFreeAsync"),
        (cuda.mem_free_async_ptsz, "cuMemFreeAsync_ptsz"),
    );
    credit(runtime, &runtime.allocations, dptr, || {
        driver::invoke(entry, name, |f| {
            // SAFETY: the arguments are forwarded unchanged; the driver validates them.
            unsafe { f(dptr, stream) }
        })
    })
}

/// `cuMemCreate`: physical memory for virtual memory management, charged to the device named in
/// `prop` (not the current one). `cuMemAddressReserve` is address space only and never charged.
///
/// # Safety
/// `handle` and `prop` are the application's pointers, handed to the driver as they are.
pub unsafe fn mem_create(
    runtime: &Runtime,
    handle: *mut CUmemGenericAllocationHandle,
    size: usize,
    prop: *const CUmemAllocationProp,
    flags: u64,
) -> Result<(), HookError> {
    let cuda = driver::cuda();
    let create = || {
        driver::invoke(cuda.mem_create, "cuMemCreate", |f| {
            // SAFETY: the arguments are forwarded unchanged; the driver validates them.
            unsafe { f(handle, size, prop, flags) }
        })
    };
    let device = if handle.is_null() || prop.is_null() {
        None
    } else {
        // SAFETY: a non-null `prop` points to the caller's CUmemAllocationProp, per the contract.
        let location = unsafe { prop.read() }.location;
        (location.kind == CU_MEM_LOCATION_TYPE_DEVICE)
            .then_some(location.id)
            .and_then(|id| budgeted(runtime, id))
    };
    let Some(device) = device else { return create() };
    charge(runtime, &runtime.vmm_handles, device, size as u64, || {
        create()?;
        // SAFETY: the driver succeeded, so it wrote the non-null `handle`.
        Ok(unsafe { handle.read() })
    })
}

/// `cuMemRelease`.
pub fn mem_release(runtime: &Runtime, handle: CUmemGenericAllocationHandle) -> Result<(), HookError> {
    let cuda = driver::cuda();
    credit(runtime, &runtime.vmm_handles, handle, || {
        driver::invoke(cuda.mem_release, "cuMemRelease", |f| {
            // SAFETY: the arguments are forwarded unchanged; the driver validates them.
            unsafe { f(handle) }
        })
    })
}

/// The size of the virtual card: the budget, but never more than the physical card.
fn virtual_size(limit: u64, physical_total: u64) -> u64 {
    limit.min(physical_total)
}

/// `cuMemGetInfo_v2`: (min(size − used, physical free), size) for a budgeted device.
///
/// # Safety
/// `free` and `total` are the application's out-pointers, handed to the driver as they are.
pub unsafe fn get_info(runtime: &Runtime, free: *mut usize, total: *mut usize) -> Result<(), HookError> {
    // SAFETY: passed through unchanged; the driver validates both pointers.
    unsafe { driver::cuda().mem_get_info(free, total) }?;
    let Some(device) = budgeted_current(runtime) else { return Ok(()) };
    let Some(limit) = runtime.ledger().limit(device) else { return Ok(()) };
    if free.is_null() || total.is_null() {
        return Ok(());
    }
    // SAFETY: the driver accepted and filled both non-null out-pointers.
    let (physical_free, physical_total) = unsafe { (free.read() as u64, total.read() as u64) };
    let size = virtual_size(limit, physical_total);
    let available = size.saturating_sub(runtime.ledger().used(device)).min(physical_free);
    // SAFETY: as above; both point to writable `size_t`s.
    unsafe {
        free.write(available as usize);
        total.write(size as usize);
    }
    Ok(())
}

/// `cuDeviceTotalMem_v2`: the virtual card's size for a budgeted device.
///
/// # Safety
/// `bytes` is the application's out-pointer, handed to the driver as it is.
pub unsafe fn device_total(runtime: &Runtime, bytes: *mut usize, device: CUdevice) -> Result<(), HookError> {
    // SAFETY: passed through unchanged; the driver validates `bytes` and `device`.
    unsafe { driver::cuda().device_total_mem(bytes, device) }?;
    let limit = usize::try_from(device).ok().and_then(|d| runtime.ledger().limit(d));
    if let (Some(limit), false) = (limit, bytes.is_null()) {
        // SAFETY: the driver accepted and filled the non-null out-pointer.
        unsafe { bytes.write(virtual_size(limit, bytes.read() as u64) as usize) };
    }
    Ok(())
}
