//! `rocm-smi`'s memory view inside the container: ROCm SMI's VRAM total is the budget and its VRAM
//! usage what the container holds, as NVML's memory info is on the CUDA side.
//!
//! ROCm SMI numbers devices its own way (every GPU of the machine, whatever
//! `HIP_VISIBLE_DEVICES` says), so a device is found in the region by its unique id:
//! `rsmi_dev_unique_id_get`'s 64 bits, whose 16 hex digits are, on ROCm, the ASCII characters of
//! the HSA agent's UUID (`GPU-` and those digits) that `hipDeviceGetUuid` returns. Both spellings
//! (lower and upper case) are tried. That correspondence comes from ROCm's documentation and
//! sources, not from a run on AMD hardware. A device the region does not know passes through.

use std::ffi::c_int;

use vgpu_ledger::config::Config;
use vgpu_ledger::inspect::{self, DeviceView};
use vgpu_ledger::region::uuid_name;

use crate::error::HookError;
use crate::runtime::SmiRuntime;
use crate::sys::*;

/// The region's view of SMI device `device`, if the container budgets it.
fn budgeted_device(runtime: &SmiRuntime, device: u32) -> Option<DeviceView> {
    let mut id = 0u64;
    // SAFETY: `id` is a valid out-pointer.
    unsafe { runtime.real.rsmi_dev_unique_id_get(device, &mut id) }.ok()?;
    budgeted_unique_id(runtime.config, id)
}

/// The region's view of the GPU whose ROCm unique id is `id`, if the container budgets it: the
/// region names it by the HIP UUID whose 16 bytes are the id's hex digits (either case). Id 0 is
/// a GPU without one (ROCm's HIP UUID is then `GPU-XX`): never matched.
pub fn budgeted_unique_id(config: &Config, id: u64) -> Option<DeviceView> {
    if id == 0 {
        return None;
    }
    let snapshot = inspect::inspect(&config.shared_cache).ok()?;
    let names: Vec<[u8; 40]> = [format!("{id:016x}"), format!("{id:016X}")]
        .iter()
        .filter_map(|digits| Some(uuid_name(&<[u8; 16]>::try_from(digits.as_bytes()).ok()?)))
        .collect();
    snapshot
        .devices
        .into_iter()
        .find(|view| names.iter().any(|name| view.uuid.as_bytes().eq_ignore_ascii_case(name)))
        .filter(|view| view.budget.is_some())
}

/// `rsmi_dev_memory_total_get`: VRAM is min(budget, physical).
///
/// # Safety
/// `total` is the caller's out-pointer, handed to ROCm SMI as it is.
pub unsafe fn memory_total(
    runtime: &SmiRuntime,
    device: u32,
    kind: c_int,
    total: *mut u64,
) -> Result<(), HookError> {
    // SAFETY: forwarded unchanged.
    unsafe { runtime.real.rsmi_dev_memory_total_get(device, kind, total) }?;
    if kind != RSMI_MEM_TYPE_VRAM || total.is_null() {
        return Ok(());
    }
    let Some(budget) = budgeted_device(runtime, device).and_then(|view| view.budget) else { return Ok(()) };
    // SAFETY: ROCm SMI succeeded, so `total` holds its answer and is writable.
    unsafe { total.write(total.read().min(budget)) };
    Ok(())
}

/// `rsmi_dev_memory_usage_get`: VRAM in use is what the container holds.
///
/// # Safety
/// `used` is the caller's out-pointer, handed to ROCm SMI as it is.
pub unsafe fn memory_usage(
    runtime: &SmiRuntime,
    device: u32,
    kind: c_int,
    used: *mut u64,
) -> Result<(), HookError> {
    // SAFETY: forwarded unchanged.
    unsafe { runtime.real.rsmi_dev_memory_usage_get(device, kind, used) }?;
    if kind != RSMI_MEM_TYPE_VRAM || used.is_null() {
        return Ok(());
    }
    let Some(view) = budgeted_device(runtime, device) else { return Ok(()) };
    // SAFETY: as above.
    unsafe { used.write(view.used) };
    Ok(())
}
