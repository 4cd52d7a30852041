//! `amd-smi`'s memory view inside the container: libamd_smi's VRAM total is the budget and its VRAM
//! usage what the container holds, as ROCm SMI's are (`smi.rs`) and NVML's on the CUDA side.
//!
//! `amd-smi metric --mem-usage` reads `amdsmi_get_gpu_memory_total`/`_usage`, `amd-smi monitor
//! --vram-usage` reads `amdsmi_get_gpu_vram_usage` (whole MiB). A processor handle is found in the
//! region by `amdsmi_get_gpu_device_uuid`, a string libamd_smi builds (AMD SMI's sources,
//! `amdsmi_uuid_gen`) from the GPU's 64-bit unique id, the one `rsmi_dev_unique_id_get` returns
//! and whose 16 hex digits are HIP's UUID: `XXffDDDD-0000-1000-80YY-ZZZZZZZZZZZZ`, with XX the
//! id's top byte, YY the next, ZZ… its low 48 bits and DDDD the PCI device id. A UUID of any other
//! shape (some versions read the kernel's `uuid_info` instead) matches no device and passes
//! through. This rests on AMD's sources and documentation, not on a run on AMD hardware.

use std::ffi::{c_char, c_int, c_uint};

use vgpu_ledger::inspect::DeviceView;

use crate::error::HookError;
use crate::hooks::smi::budgeted_unique_id;
use crate::runtime::AmdSmiRuntime;
use crate::sys::*;

const MIB: u64 = 1 << 20;

/// The unique id inside a UUID that libamd_smi generated, or `None` for any other string.
pub fn unique_id(uuid: &[u8]) -> Option<u64> {
    let uuid = uuid.split(|&b| b == 0).next().unwrap_or(uuid);
    if uuid.len() != 36 || [8, 13, 18, 23].iter().any(|&at| uuid[at] != b'-') {
        return None;
    }
    let hex = |from: usize, to: usize| -> Option<u64> {
        let digits = &uuid[from..to];
        if !digits.iter().all(u8::is_ascii_hexdigit) {
            return None;
        }
        u64::from_str_radix(std::str::from_utf8(digits).ok()?, 16).ok()
    };
    // What libamd_smi always writes: the function byte 0xff, a zero time, version 1, variant 2.
    let fixed = hex(2, 4)? == 0xff && hex(9, 13)? == 0 && hex(14, 18)? == 0x1000 && hex(19, 21)? == 0x80;
    hex(4, 8)?; // the PCI device id: any
    fixed.then_some(hex(0, 2)? << 56 | hex(21, 23)? << 48 | hex(24, 36)?)
}

/// The region's view of the GPU behind `processor`, if the container budgets it.
fn budgeted(runtime: &AmdSmiRuntime, processor: AmdSmiProcessor) -> Option<DeviceView> {
    let mut uuid = [0u8; 64];
    let mut length = uuid.len() as c_uint;
    // SAFETY: `uuid` holds `length` bytes (more than AMDSMI_GPU_UUID_SIZE); `processor` is the
    // caller's handle, which libamd_smi has just accepted.
    unsafe {
        runtime.real.amdsmi_get_gpu_device_uuid(processor, &mut length, uuid.as_mut_ptr().cast::<c_char>())
    }
    .ok()?;
    budgeted_unique_id(runtime.config, unique_id(&uuid)?)
}

/// Whole MiB of `bytes`, as libamd_smi rounds them (down), at most `u32::MAX`.
fn whole_mib(bytes: u64) -> u32 {
    u32::try_from(bytes / MIB).unwrap_or(u32::MAX)
}

/// `amdsmi_get_gpu_memory_total`: VRAM is min(budget, physical).
///
/// # Safety
/// `total` is the caller's out-pointer, handed to libamd_smi as it is.
pub unsafe fn memory_total(
    runtime: &AmdSmiRuntime,
    processor: AmdSmiProcessor,
    kind: c_int,
    total: *mut u64,
) -> Result<(), HookError> {
    // SAFETY: forwarded unchanged.
    unsafe { runtime.real.amdsmi_get_gpu_memory_total(processor, kind, total) }?;
    if kind != AMDSMI_MEM_TYPE_VRAM || total.is_null() {
        return Ok(());
    }
    let Some(budget) = budgeted(runtime, processor).and_then(|view| view.budget) else { return Ok(()) };
    // SAFETY: libamd_smi succeeded, so `total` holds its answer and is writable.
    unsafe { total.write(total.read().min(budget)) };
    Ok(())
}

/// `amdsmi_get_gpu_memory_usage`: VRAM in use is what the container holds.
///
/// # Safety
/// `used` is the caller's out-pointer, handed to libamd_smi as it is.
pub unsafe fn memory_usage(
    runtime: &AmdSmiRuntime,
    processor: AmdSmiProcessor,
    kind: c_int,
    used: *mut u64,
) -> Result<(), HookError> {
    // SAFETY: forwarded unchanged.
    unsafe { runtime.real.amdsmi_get_gpu_memory_usage(processor, kind, used) }?;
    if kind != AMDSMI_MEM_TYPE_VRAM || used.is_null() {
        return Ok(());
    }
    let Some(view) = budgeted(runtime, processor) else { return Ok(()) };
    // SAFETY: as above.
    unsafe { used.write(view.used) };
    Ok(())
}

/// `amdsmi_get_gpu_vram_usage`: the same two numbers in whole MiB.
///
/// # Safety
/// `usage` is the caller's out-pointer, handed to libamd_smi as it is.
pub unsafe fn vram_usage(
    runtime: &AmdSmiRuntime,
    processor: AmdSmiProcessor,
    usage: *mut VramUsage,
) -> Result<(), HookError> {
    // SAFETY: forwarded unchanged.
    unsafe { runtime.real.amdsmi_get_gpu_vram_usage(processor, usage) }?;
    if usage.is_null() {
        return Ok(());
    }
    let Some(view) = budgeted(runtime, processor) else { return Ok(()) };
    let Some(budget) = view.budget else { return Ok(()) };
    // SAFETY: libamd_smi succeeded, so `usage` points to an `amdsmi_vram_usage_t` it filled; the
    // struct is read and written unaligned to ask nothing of the caller's buffer.
    unsafe {
        let mut answer = usage.read_unaligned();
        answer.vram_total = answer.vram_total.min(whole_mib(budget));
        answer.vram_used = whole_mib(view.used);
        usage.write_unaligned(answer);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_unique_id_comes_back_out_of_libamd_smis_uuid() {
        // Unique id 0x0123456789abcdef on PCI device 0x740f, as amdsmi_uuid_gen lays it out.
        assert_eq!(unique_id(b"01ff740f-0000-1000-8023-456789abcdef\0junk"), Some(0x0123_4567_89ab_cdef));
        assert_eq!(unique_id(b"FEFF0001-0000-1000-80DC-BA9876543210"), Some(0xfedc_ba98_7654_3210));
    }

    #[test]
    fn any_other_uuid_matches_nothing() {
        for other in [
            &b"01ff740f-0000-1000-8023-456789abcde"[..], // short
            b"0100740f-0000-1000-8023-456789abcdef",     // not libamd_smi's function byte
            b"01ff740f-0001-1000-8023-456789abcdef",     // a time
            b"01ff740f-0000-4000-8023-456789abcdef",     // version 4 (random)
            b"01ff740f-0000-1000-c023-456789abcdef",     // another variant
            b"01ff740f-0000-1000-8023-456789abcdeg",
            b"01ff740f+0000-1000-8023-456789abcdef",
            b"GPU-0123456789abcdef",
            b"",
        ] {
            assert_eq!(unique_id(other), None, "{}", String::from_utf8_lossy(other));
        }
    }

    #[test]
    fn whole_mib_rounds_down_and_saturates() {
        assert_eq!(whole_mib(MIB - 1), 0);
        assert_eq!(whole_mib(1 << 30), 1024);
        assert_eq!(whole_mib(u64::MAX), u32::MAX);
    }
}
