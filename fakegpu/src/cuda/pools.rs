//! Stream-ordered allocation and memory pools: `cuMemAllocAsync`, `cuMemAllocFromPoolAsync`,
//! `cuMemFreeAsync` (each with its `_ptsz` twin), `cuDeviceGetDefaultMemPool`, `cuDeviceGetMemPool`,
//! `cuMemPoolCreate`, `cuMemPoolDestroy`, `cuMemPoolSetAttribute`, `cuMemPoolGetAttribute`,
//! `cuMemPoolTrimTo`.

use std::ffi::{c_int, c_void};

use super::{
    CUdevice, CUdeviceptr, CUresult, CUstream, CuError, MemoryPropsHead, answer, as_handle, as_pointer,
    initialized, non_null, physical, props_device, put,
};
use crate::memory::pools::{Attribute, Value};
use crate::stats;

pub type CUmemoryPool = *mut c_void;

/// `cuMemAllocAsync`: from the current pool of the stream's device (the fake's is always the default
/// pool). Counted as an allocation call once the device is known.
///
/// # Safety
/// `dptr` must be NULL or valid for writing a `CUdeviceptr`.
unsafe fn allocate_async(dptr: *mut CUdeviceptr, size: usize, stream: CUstream) -> Result<(), CuError> {
    let fake = initialized()?;
    let device = fake.stream_device(as_handle(stream))?;
    fake.ledger.count_call(device);
    non_null(dptr)?;
    if size == 0 {
        return Err(CuError::InvalidValue);
    }
    let address = fake.allocate_from_pool(device, None, size as u64)?;
    // SAFETY: a non-NULL out-pointer by this function's contract.
    unsafe { put(dptr, address) }
}

/// `cuMemAllocFromPoolAsync`: charged to the pool's device.
///
/// # Safety
/// `dptr` must be NULL or valid for writing a `CUdeviceptr`.
unsafe fn allocate_from_pool_async(
    dptr: *mut CUdeviceptr,
    size: usize,
    pool: CUmemoryPool,
    stream: CUstream,
) -> Result<(), CuError> {
    let fake = initialized()?;
    fake.stream_device(as_handle(stream))?;
    let device = fake.pool_device(as_handle(pool))?;
    fake.ledger.count_call(device);
    non_null(dptr)?;
    if size == 0 {
        return Err(CuError::InvalidValue);
    }
    let address = fake.allocate_from_pool(device, Some(as_handle(pool)), size as u64)?;
    // SAFETY: a non-NULL out-pointer by this function's contract.
    unsafe { put(dptr, address) }
}

fn free_async(dptr: CUdeviceptr, stream: CUstream) -> Result<(), CuError> {
    let fake = initialized()?;
    fake.stream_device(as_handle(stream))?;
    Ok(fake.free_async(dptr)?)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocAsync(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    stream: CUstream,
) -> CUresult {
    stats::record_call("cuMemAllocAsync");
    // SAFETY: `dptr` is NULL or a valid out-pointer per the cuMemAllocAsync contract.
    answer(|| unsafe { allocate_async(dptr, bytesize, stream) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocAsync_ptsz(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    stream: CUstream,
) -> CUresult {
    stats::record_call("cuMemAllocAsync_ptsz");
    // SAFETY: `dptr` is NULL or a valid out-pointer per the cuMemAllocAsync contract.
    answer(|| unsafe { allocate_async(dptr, bytesize, stream) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    pool: CUmemoryPool,
    stream: CUstream,
) -> CUresult {
    stats::record_call("cuMemAllocFromPoolAsync");
    // SAFETY: `dptr` is NULL or a valid out-pointer per the cuMemAllocFromPoolAsync contract.
    answer(|| unsafe { allocate_from_pool_async(dptr, bytesize, pool, stream) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync_ptsz(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    pool: CUmemoryPool,
    stream: CUstream,
) -> CUresult {
    stats::record_call("cuMemAllocFromPoolAsync_ptsz");
    // SAFETY: `dptr` is NULL or a valid out-pointer per the cuMemAllocFromPoolAsync contract.
    answer(|| unsafe { allocate_from_pool_async(dptr, bytesize, pool, stream) })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemFreeAsync(dptr: CUdeviceptr, stream: CUstream) -> CUresult {
    stats::record_call("cuMemFreeAsync");
    answer(|| free_async(dptr, stream))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemFreeAsync_ptsz(dptr: CUdeviceptr, stream: CUstream) -> CUresult {
    stats::record_call("cuMemFreeAsync_ptsz");
    answer(|| free_async(dptr, stream))
}

/// The default pool of a device, which is also its current pool.
///
/// # Safety
/// `pool` must be NULL or valid for writing a `CUmemoryPool`.
unsafe fn device_pool(pool: *mut CUmemoryPool, device: CUdevice) -> Result<(), CuError> {
    let fake = initialized()?;
    non_null(pool)?;
    let handle = fake.default_pool(physical(fake, device)?);
    // SAFETY: a non-NULL out-pointer by this function's contract.
    unsafe { put(pool, as_pointer(handle)) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetDefaultMemPool(pool: *mut CUmemoryPool, device: CUdevice) -> CUresult {
    stats::record_call("cuDeviceGetDefaultMemPool");
    // SAFETY: `pool` is NULL or a valid out-pointer per the cuDeviceGetDefaultMemPool contract.
    answer(|| unsafe { device_pool(pool, device) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetMemPool(pool: *mut CUmemoryPool, device: CUdevice) -> CUresult {
    stats::record_call("cuDeviceGetMemPool");
    // SAFETY: `pool` is NULL or a valid out-pointer per the cuDeviceGetMemPool contract.
    answer(|| unsafe { device_pool(pool, device) })
}

/// Only pinned device pools: `allocType` 1 and `location.type` 1, `location.id` a CUDA ordinal.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolCreate(pool: *mut CUmemoryPool, props: *const MemoryPropsHead) -> CUresult {
    stats::record_call("cuMemPoolCreate");
    answer(|| {
        let fake = initialized()?;
        non_null(pool)?;
        // SAFETY: `props` is NULL or a `CUmemPoolProps` per the cuMemPoolCreate contract.
        let device = unsafe { props_device(fake, props) }?;
        let handle = fake.create_pool(device);
        // SAFETY: a non-NULL out-pointer per the cuMemPoolCreate contract.
        unsafe { put(pool, as_pointer(handle)) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemPoolDestroy(pool: CUmemoryPool) -> CUresult {
    stats::record_call("cuMemPoolDestroy");
    answer(|| Ok(initialized()?.destroy_pool(as_handle(pool))?))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolSetAttribute(
    pool: CUmemoryPool,
    attribute: c_int,
    value: *mut c_void,
) -> CUresult {
    stats::record_call("cuMemPoolSetAttribute");
    answer(|| {
        let fake = initialized()?;
        let attribute = Attribute::from_raw(attribute).ok_or(CuError::InvalidValue)?;
        non_null(value)?;
        // SAFETY: `value` points to an `int` (reuse flags) or a `cuuint64_t` (the rest) per the
        // cuMemPoolSetAttribute contract.
        let value = unsafe {
            if attribute.is_flag() {
                Value::Flag(value.cast::<c_int>().read_unaligned())
            } else {
                Value::Bytes(value.cast::<u64>().read_unaligned())
            }
        };
        Ok(fake.set_pool_attribute(as_handle(pool), attribute, value)?)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolGetAttribute(
    pool: CUmemoryPool,
    attribute: c_int,
    value: *mut c_void,
) -> CUresult {
    stats::record_call("cuMemPoolGetAttribute");
    answer(|| {
        let fake = initialized()?;
        let attribute = Attribute::from_raw(attribute).ok_or(CuError::InvalidValue)?;
        non_null(value)?;
        match fake.pool_attribute(as_handle(pool), attribute)? {
            // SAFETY: for the reuse flags, `value` points to an `int` per the cuMemPoolGetAttribute
            // contract.
            Value::Flag(flag) => unsafe { put(value.cast::<c_int>(), flag) },
            // SAFETY: for the other attributes, `value` points to a `cuuint64_t` per the
            // cuMemPoolGetAttribute contract.
            Value::Bytes(bytes) => unsafe { put(value.cast::<u64>(), bytes) },
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemPoolTrimTo(pool: CUmemoryPool, min_bytes_to_keep: usize) -> CUresult {
    stats::record_call("cuMemPoolTrimTo");
    answer(|| Ok(initialized()?.trim_pool(as_handle(pool), min_bytes_to_keep as u64)?))
}
