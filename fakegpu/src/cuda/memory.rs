//! Linear device memory: `cuMemAlloc`, `cuMemAllocPitch`, `cuMemAllocManaged`, `cuMemFree`,
//! `cuMemGetInfo`, `cuMemGetAddressRange`.

use std::ffi::c_uint;

use std::ffi::c_int;
use std::sync::atomic::{AtomicU64, Ordering};

use super::{
    CUdevice, CUdeviceptr, CUmemLocation, CUresult, CUstream, CuError, answer, clamp32, current, initialized,
    non_null, put,
};
use crate::memory::{self, Flavor, Width};
use crate::state::Fake;
use crate::stats;

/// `CU_MEM_ATTACH_GLOBAL`, `CU_MEM_ATTACH_HOST`: the flags `cuMemAllocManaged` accepts.
const MANAGED_FLAGS: [c_uint; 2] = [1, 2];

/// The device an allocation call charges (the current context's), counting the call, whatever its
/// outcome, once it has one.
pub(super) fn charged_device() -> Result<(&'static Fake, usize), CuError> {
    let fake = initialized()?;
    let (_, device) = current(fake)?;
    fake.ledger.count_call(device);
    Ok((fake, device))
}

/// Places `size` bytes on the current context's device; NULL `dptr` or size 0 → INVALID_VALUE.
fn allocate(size: u64, width: Width, flavor: Flavor, out_is_null: bool) -> Result<u64, CuError> {
    let (fake, device) = charged_device()?;
    if out_is_null || size == 0 {
        return Err(CuError::InvalidValue);
    }
    Ok(fake.allocate(device, size, width, flavor)?)
}

/// (pitch, bytes) of a pitched allocation: rows rounded up to 512 bytes; `elementSize` must be 4, 8
/// or 16, and neither dimension 0. Bytes past `u64` saturate, and then cannot fit.
fn pitched(width: u64, height: u64, element_size: c_uint) -> Result<(u64, u64), CuError> {
    if !matches!(element_size, 4 | 8 | 16) || width == 0 || height == 0 {
        return Err(CuError::InvalidValue);
    }
    let pitch = memory::pitch(width).ok_or(CuError::OutOfMemory)?;
    Ok((pitch, pitch.saturating_mul(height)))
}

fn free(address: u64) -> Result<(), CuError> {
    let fake = initialized()?;
    current(fake)?;
    Ok(fake.free(address)?)
}

/// (free, total) bytes of the current context's device.
fn memory_info(out_is_null: bool) -> Result<(u64, u64), CuError> {
    let fake = initialized()?;
    if out_is_null {
        return Err(CuError::InvalidValue);
    }
    let (_, device) = current(fake)?;
    Ok((fake.memory.saturating_sub(fake.ledger.used(device)), fake.memory))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize) -> CUresult {
    stats::record_call("cuMemAlloc_v2");
    answer(|| {
        let address = allocate(bytesize as u64, Width::Bits64, Flavor::Device, dptr.is_null())?;
        // SAFETY: `allocate` refused NULL; `dptr` is a valid out-pointer per the cuMemAlloc_v2 contract.
        unsafe { put(dptr, address) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAlloc(dptr: *mut c_uint, bytesize: c_uint) -> CUresult {
    stats::record_call("cuMemAlloc");
    answer(|| {
        // 32-bit addresses come from a range that ends at 4 GiB, so the cast keeps every bit.
        let address = allocate(u64::from(bytesize), Width::Bits32, Flavor::Device, dptr.is_null())? as c_uint;
        // SAFETY: `allocate` refused NULL; `dptr` is a valid out-pointer per the cuMemAlloc contract.
        unsafe { put(dptr, address) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocPitch_v2(
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    width_bytes: usize,
    height: usize,
    element_size: c_uint,
) -> CUresult {
    stats::record_call("cuMemAllocPitch_v2");
    answer(|| {
        let (fake, device) = charged_device()?;
        non_null(dptr)?;
        non_null(pitch)?;
        let (row, bytes) = pitched(width_bytes as u64, height as u64, element_size)?;
        let address = fake.allocate(device, bytes, Width::Bits64, Flavor::Device)?;
        // SAFETY: both are non-NULL out-pointers per the cuMemAllocPitch_v2 contract.
        unsafe { put(dptr, address).and(put(pitch, row as usize)) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocPitch(
    dptr: *mut c_uint,
    pitch: *mut c_uint,
    width_bytes: c_uint,
    height: c_uint,
    element_size: c_uint,
) -> CUresult {
    stats::record_call("cuMemAllocPitch");
    answer(|| {
        let (fake, device) = charged_device()?;
        non_null(dptr)?;
        non_null(pitch)?;
        let (row, bytes) = pitched(u64::from(width_bytes), u64::from(height), element_size)?;
        let row = c_uint::try_from(row).map_err(|_| CuError::InvalidValue)?;
        // 32-bit addresses come from a range that ends at 4 GiB, so the cast keeps every bit.
        let address = fake.allocate(device, bytes, Width::Bits32, Flavor::Device)? as c_uint;
        // SAFETY: both are non-NULL out-pointers per the cuMemAllocPitch contract.
        unsafe { put(dptr, address).and(put(pitch, row)) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocManaged(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    flags: c_uint,
) -> CUresult {
    stats::record_call("cuMemAllocManaged");
    answer(|| {
        let (fake, device) = charged_device()?;
        non_null(dptr)?;
        if bytesize == 0 || !MANAGED_FLAGS.contains(&flags) {
            return Err(CuError::InvalidValue);
        }
        let address = fake.allocate(device, bytesize as u64, Width::Bits64, Flavor::Managed)?;
        // SAFETY: a non-NULL out-pointer per the cuMemAllocManaged contract.
        unsafe { put(dptr, address) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult {
    stats::record_call("cuMemFree_v2");
    answer(|| free(dptr))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemFree(dptr: c_uint) -> CUresult {
    stats::record_call("cuMemFree");
    answer(|| free(u64::from(dptr)))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    stats::record_call("cuMemGetInfo_v2");
    answer(|| {
        let (free_bytes, total_bytes) = memory_info(free.is_null() || total.is_null())?;
        // SAFETY: `memory_info` refused NULLs; both are valid out-pointers per the cuMemGetInfo_v2 contract.
        unsafe { put(free, free_bytes as usize).and(put(total, total_bytes as usize)) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetInfo(free: *mut c_uint, total: *mut c_uint) -> CUresult {
    stats::record_call("cuMemGetInfo");
    answer(|| {
        let (free_bytes, total_bytes) = memory_info(free.is_null() || total.is_null())?;
        // SAFETY: `memory_info` refused NULLs; both are valid out-pointers per the cuMemGetInfo contract.
        unsafe { put(free, clamp32(free_bytes)).and(put(total, clamp32(total_bytes))) }
    })
}

/// Like the driver: either out-pointer may be NULL (it is skipped), and an address in no allocation
/// is `CUDA_ERROR_NOT_FOUND`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetAddressRange_v2(
    base: *mut CUdeviceptr,
    size: *mut usize,
    dptr: CUdeviceptr,
) -> CUresult {
    stats::record_call("cuMemGetAddressRange_v2");
    answer(|| {
        let fake = initialized()?;
        current(fake)?;
        let (start, bytes) = fake.address_range(dptr).map_err(|_| CuError::NotFound)?;
        // SAFETY: each is NULL (skipped) or a valid out-pointer per the cuMemGetAddressRange_v2 contract.
        unsafe {
            if !base.is_null() {
                put(base, start)?;
            }
            if !size.is_null() {
                put(size, bytes as usize)?;
            }
        }
        Ok(())
    })
}

/// `CU_MEM_LOCATION_TYPE_DEVICE`: the only location kind the fake's advice and prefetch accept.
const LOCATION_DEVICE: c_int = 1;
/// `CUmem_advise` values: read-mostly, preferred location, accessed-by, each set and unset (1–6).
const ADVICE: std::ops::RangeInclusive<c_int> = 1..=6;

/// Bytes this process asked to prefetch (`fakegpu_prefetched_bytes`).
pub(crate) static PREFETCHED: AtomicU64 = AtomicU64::new(0);

/// Accepted `cuMemAdvise(_v2)` calls of this process, by advice value (`fakegpu_advice_count`).
pub(crate) static ADVISED: [AtomicU64; 7] = [const { AtomicU64::new(0) }; 7];

/// Counts an accepted advice for `fakegpu_advice_count`.
fn advised(advice: c_int, result: Result<(), CuError>) -> Result<(), CuError> {
    if result.is_ok() {
        ADVISED[advice as usize].fetch_add(1, Ordering::Relaxed);
    }
    result
}

/// What `cuMemAdvise` and `cuMemPrefetchAsync` check: a context, a range inside one live managed
/// block, a known advice, and a device ordinal that is visible (or `CU_DEVICE_CPU`, -1).
fn managed_call(ptr: CUdeviceptr, count: usize, device: c_int) -> Result<(), CuError> {
    let fake = initialized()?;
    current(fake)?;
    if device < -1 || device >= fake.ordinals.len() as c_int {
        return Err(CuError::InvalidDevice);
    }
    fake.managed_range(ptr, count as u64)?;
    Ok(())
}

fn location_device(location: CUmemLocation) -> Result<c_int, CuError> {
    if location.kind == LOCATION_DEVICE { Ok(location.id) } else { Err(CuError::InvalidValue) }
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemAdvise(ptr: CUdeviceptr, count: usize, advice: c_int, device: CUdevice) -> CUresult {
    stats::record_call("cuMemAdvise");
    answer(|| {
        if !ADVICE.contains(&advice) {
            return Err(CuError::InvalidValue);
        }
        advised(advice, managed_call(ptr, count, device))
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemAdvise_v2(
    ptr: CUdeviceptr,
    count: usize,
    advice: c_int,
    location: CUmemLocation,
) -> CUresult {
    stats::record_call("cuMemAdvise_v2");
    answer(|| {
        if !ADVICE.contains(&advice) {
            return Err(CuError::InvalidValue);
        }
        advised(advice, managed_call(ptr, count, location_device(location)?))
    })
}

/// Prefetches complete at once in the fake (its managed memory has no residency); the bytes are
/// counted for `fakegpu_prefetched_bytes`.
#[unsafe(no_mangle)]
pub extern "C" fn cuMemPrefetchAsync(
    ptr: CUdeviceptr,
    count: usize,
    device: CUdevice,
    _stream: CUstream,
) -> CUresult {
    stats::record_call("cuMemPrefetchAsync");
    answer(|| {
        managed_call(ptr, count, device)?;
        PREFETCHED.fetch_add(count as u64, Ordering::Relaxed);
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemPrefetchAsync_v2(
    ptr: CUdeviceptr,
    count: usize,
    location: CUmemLocation,
    flags: std::ffi::c_uint,
    _stream: CUstream,
) -> CUresult {
    stats::record_call("cuMemPrefetchAsync_v2");
    answer(|| {
        if flags != 0 {
            return Err(CuError::InvalidValue);
        }
        managed_call(ptr, count, location_device(location)?)?;
        PREFETCHED.fetch_add(count as u64, Ordering::Relaxed);
        Ok(())
    })
}
