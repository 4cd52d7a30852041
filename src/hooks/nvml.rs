//! NVML memory queries, answered for the virtual GPU so `nvidia-smi` shows the budget.
//!
//! NVML numbers devices differently from CUDA (and `CUDA_VISIBLE_DEVICES` reorders CUDA's side
//! only), so an NVML device is matched to its CUDA ordinal by UUID, never by index.

use crate::driver::{self, sys::*};
use crate::error::HookError;
use crate::runtime::Runtime;

/// The budget of the CUDA ordinal that NVML's `device` is, if it has one.
fn budget_of(runtime: &Runtime, device: NvmlDevice) -> Option<(usize, u64)> {
    let ledger = runtime.ledger();
    if !ledger.any_limit() {
        return None;
    }
    // SAFETY: `device` is the handle the application passed to the hooked NVML call.
    let uuid = unsafe { driver::nvml().device_uuid(device) }.ok()?;
    let ordinal = driver::cuda_device_uuids().iter().position(|known| known.as_bytes() == uuid.as_bytes())?;
    Some((ordinal, ledger.limit(ordinal)?))
}

/// (total, used, free) of the virtual card, from the physical total.
fn virtual_memory(
    runtime: &Runtime,
    ordinal: usize,
    limit: u64,
    physical_total: u64,
    reserved: u64,
) -> (u64, u64, u64) {
    let overcommit = runtime.ledger().overcommit(ordinal);
    let total = crate::hooks::memory::virtual_size(limit, physical_total, overcommit);
    let used = runtime.ledger().used(ordinal);
    (total, used, total.saturating_sub(used.saturating_add(reserved)))
}

/// `nvmlDeviceGetMemoryInfo`.
///
/// # Safety
/// `memory` is the application's out-pointer, handed to NVML as it is.
pub unsafe fn memory_info(
    runtime: &Runtime,
    device: NvmlDevice,
    memory: *mut NvmlMemory,
) -> Result<(), HookError> {
    // SAFETY: passed through unchanged; NVML validates its arguments.
    unsafe { driver::nvml().memory_info(device, memory) }?;
    if memory.is_null() {
        return Ok(());
    }
    let Some((ordinal, limit)) = budget_of(runtime, device) else { return Ok(()) };
    // SAFETY: NVML accepted and filled the non-null out-pointer.
    let mut info = unsafe { memory.read() };
    (info.total, info.used, info.free) = virtual_memory(runtime, ordinal, limit, info.total, 0);
    // SAFETY: as above.
    unsafe { memory.write(info) };
    Ok(())
}

/// `nvmlDeviceGetMemoryInfo_v2`; memory NVML reports as reserved stays reserved.
///
/// # Safety
/// `memory` is the application's out-pointer, handed to NVML as it is.
pub unsafe fn memory_info_v2(
    runtime: &Runtime,
    device: NvmlDevice,
    memory: *mut NvmlMemoryV2,
) -> Result<(), HookError> {
    // SAFETY: passed through unchanged; NVML validates its arguments and the version field.
    unsafe { driver::nvml().memory_info_v2(device, memory) }?;
    if memory.is_null() {
        return Ok(());
    }
    let Some((ordinal, limit)) = budget_of(runtime, device) else { return Ok(()) };
    // SAFETY: NVML accepted and filled the non-null out-pointer.
    let mut info = unsafe { memory.read() };
    (info.total, info.used, info.free) = virtual_memory(runtime, ordinal, limit, info.total, info.reserved);
    // SAFETY: as above.
    unsafe { memory.write(info) };
    Ok(())
}
