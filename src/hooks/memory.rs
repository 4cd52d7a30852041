//! Device-memory allocation, free and the queries that report the virtual GPU (DESIGN §3).

use crate::driver::{self, sys::*};
use crate::error::HookError;
use crate::ledger::Allocation;
use crate::runtime::Runtime;

/// The budget of the device the calling thread's context is on, or `None` when the call should
/// pass straight through (no limit, or no context: then the driver gives its own error).
fn budgeted_device(runtime: &Runtime) -> Option<(usize, u64)> {
    let ledger = runtime.ledger();
    if !ledger.any_limit() {
        return None;
    }
    let device = usize::try_from(driver::cuda().current_device().ok()?).ok()?;
    Some((device, ledger.limit(device)?))
}

/// `cuMemAlloc_v2`: reserve in the ledger, then allocate; roll the reservation back if the driver
/// refuses.
///
/// # Safety
/// `dptr` is the application's out-pointer, handed to the driver as it is.
pub unsafe fn alloc(runtime: &Runtime, dptr: *mut CUdeviceptr, bytes: usize) -> Result<(), HookError> {
    let cuda = driver::cuda();
    let budget = if dptr.is_null() { None } else { budgeted_device(runtime) };
    let Some((device, _)) = budget else {
        // SAFETY: passed through unchanged; the driver validates its arguments.
        return unsafe { cuda.mem_alloc(dptr, bytes) };
    };
    let bytes64 = bytes as u64;
    let owner = runtime.ledger().try_reserve(device, bytes64)?;
    // SAFETY: `dptr` is non-null and the application's out-pointer.
    match unsafe { cuda.mem_alloc(dptr, bytes) } {
        Ok(()) => {
            // SAFETY: the driver succeeded, so it wrote the new address through `dptr`.
            let address = unsafe { dptr.read() };
            runtime.allocations.insert(address, Allocation { device, bytes: bytes64, owner });
            Ok(())
        }
        Err(error) => {
            runtime.ledger().release(device, bytes64, owner);
            Err(error)
        }
    }
}

/// `cuMemFree_v2`: free, and credit the device the allocation was charged to. The record is taken
/// out before the driver call, so an address the driver hands out again at once is not confused
/// with the old one.
pub fn free(runtime: &Runtime, dptr: CUdeviceptr) -> Result<(), HookError> {
    let cuda = driver::cuda();
    if !runtime.ledger().any_limit() {
        return cuda.mem_free(dptr);
    }
    let record = runtime.allocations.remove(dptr);
    match (cuda.mem_free(dptr), record) {
        (Ok(()), Some(allocation)) => {
            runtime.ledger().release(allocation.device, allocation.bytes, allocation.owner);
            Ok(())
        }
        (Err(error), Some(allocation)) => {
            runtime.allocations.insert(dptr, allocation);
            Err(error)
        }
        (result, None) => result,
    }
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
    let Some((device, limit)) = budgeted_device(runtime) else { return Ok(()) };
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
