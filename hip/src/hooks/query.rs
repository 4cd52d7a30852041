//! The queries that report a device's memory: on a budgeted device they report the virtual GPU,
//! whose size is min(budget, physical total).

use crate::error::HookError;
use crate::hooks::memory::{budgeted, budgeted_current};
use crate::runtime::Runtime;
use crate::sys::*;

/// The virtual card's size on `device`, given the physical total.
fn virtual_size(runtime: &Runtime, device: usize, physical_total: u64) -> Option<u64> {
    runtime.ledger().limit(device).map(|limit| limit.min(physical_total))
}

/// `hipMemGetInfo`: (min(size − used, physical free), size) for a budgeted current device.
///
/// # Safety
/// `free` and `total` are the application's out-pointers, handed to the runtime as they are.
pub unsafe fn mem_get_info(runtime: &Runtime, free: *mut usize, total: *mut usize) -> Result<(), HookError> {
    // SAFETY: forwarded unchanged; the runtime validates both pointers.
    unsafe { runtime.real.hipMemGetInfo(free, total) }?;
    if free.is_null() || total.is_null() {
        return Ok(());
    }
    let Some(device) = budgeted_current(runtime) else { return Ok(()) };
    // SAFETY: the runtime succeeded, so it wrote both non-null out-pointers.
    let (physical_free, physical_total) = unsafe { (free.read() as u64, total.read() as u64) };
    let Some(size) = virtual_size(runtime, device, physical_total) else { return Ok(()) };
    runtime.pools.refresh(runtime);
    let left = size.saturating_sub(runtime.ledger().used(device)).min(physical_free);
    // SAFETY: as above; valid out-pointers.
    unsafe {
        free.write(left as usize);
        total.write(size as usize);
    }
    Ok(())
}

/// `hipDeviceTotalMem`: the virtual card's size.
///
/// # Safety
/// `bytes` is the application's out-pointer.
pub unsafe fn device_total_mem(
    runtime: &Runtime,
    bytes: *mut usize,
    device: HipDevice,
) -> Result<(), HookError> {
    // SAFETY: forwarded unchanged.
    unsafe { runtime.real.hipDeviceTotalMem(bytes, device) }?;
    if bytes.is_null() {
        return Ok(());
    }
    let Some(index) = budgeted(runtime, device) else { return Ok(()) };
    // SAFETY: the runtime succeeded, so `bytes` holds its answer and is writable.
    unsafe {
        if let Some(size) = virtual_size(runtime, index, bytes.read() as u64) {
            bytes.write(size as usize);
        }
    }
    Ok(())
}

/// Clamps the `totalGlobalMem` field at `offset` of a properties struct the runtime filled.
///
/// # Safety
/// `prop` is NULL or a properties struct of the layout `offset` belongs to, filled by the runtime.
unsafe fn clamp_total(runtime: &Runtime, prop: *mut u8, device: HipDevice, offset: usize) {
    if prop.is_null() {
        return;
    }
    let Some(index) = budgeted(runtime, device) else { return };
    // SAFETY: `offset` + 8 lies within the struct (sys.rs gives both layouts).
    let field = unsafe { prop.add(offset) }.cast::<usize>();
    // SAFETY: as above; the field is a size_t, read and written unaligned to be safe.
    unsafe {
        if let Some(size) = virtual_size(runtime, index, field.read_unaligned() as u64) {
            field.write_unaligned(size as usize);
        }
    }
}

/// `hipGetDeviceProperties` (the ROCm 5.x `hipDeviceProp_t`): `totalGlobalMem` is the budget.
///
/// # Safety
/// `prop` is the application's out-pointer.
pub unsafe fn device_properties(
    runtime: &Runtime,
    prop: *mut u8,
    device: HipDevice,
) -> Result<(), HookError> {
    // SAFETY: forwarded unchanged.
    unsafe { runtime.real.hipGetDeviceProperties(prop, device) }?;
    // SAFETY: the runtime filled the 5.x struct.
    unsafe { clamp_total(runtime, prop, device, PROP_R0000_TOTAL_GLOBAL_MEM) };
    Ok(())
}

/// `hipGetDevicePropertiesR0600` (ROCm 6.x's `hipDeviceProp_tR0600`).
///
/// # Safety
/// `prop` is the application's out-pointer.
pub unsafe fn device_properties_r0600(
    runtime: &Runtime,
    prop: *mut u8,
    device: HipDevice,
) -> Result<(), HookError> {
    // SAFETY: forwarded unchanged.
    unsafe { runtime.real.hipGetDevicePropertiesR0600(prop, device) }?;
    // SAFETY: the runtime filled the 6.x struct.
    unsafe { clamp_total(runtime, prop, device, PROP_R0600_TOTAL_GLOBAL_MEM) };
    Ok(())
}
