//! Page-locked host memory: `cuMemHostAlloc`, `cuMemAllocHost_v2`, `cuMemFreeHost`,
//! `cuMemHostRegister_v2`, `cuMemHostUnregister`. Never charged to a device; allocations are real heap
//! memory (page-aligned) that the caller may read and write.

use std::ffi::{c_uint, c_void};

use super::{CUresult, CuError, answer, current, initialized, non_null, put};
use crate::stats;

/// `CU_MEMHOSTALLOC_PORTABLE`, `_DEVICEMAP`, `_WRITECOMBINED`.
const HOST_ALLOC_FLAGS: c_uint = 0x7;
/// `CU_MEMHOSTREGISTER_PORTABLE`, `_DEVICEMAP`, `_IOMEMORY`, `_READ_ONLY`.
const HOST_REGISTER_FLAGS: c_uint = 0xf;
const PAGE: usize = 4096;

/// Allocates `size` bytes of real, page-aligned memory and records it as the driver's.
///
/// # Safety
/// `out` must be NULL or valid for writing a pointer.
unsafe fn host_alloc(out: *mut *mut c_void, size: usize, flags: c_uint) -> Result<(), CuError> {
    let fake = initialized()?;
    current(fake)?;
    non_null(out)?;
    if size == 0 || flags & !HOST_ALLOC_FLAGS != 0 {
        return Err(CuError::InvalidValue);
    }
    let mut memory = std::ptr::null_mut();
    // SAFETY: `memory` is a valid out-pointer and PAGE a power of two multiple of the pointer size.
    if unsafe { libc::posix_memalign(&mut memory, PAGE, size) } != 0 || memory.is_null() {
        return Err(CuError::OutOfMemory);
    }
    fake.record_host_allocation(memory.addr(), size);
    // SAFETY: a non-NULL out-pointer by this function's contract.
    unsafe { put(out, memory) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemHostAlloc(pp: *mut *mut c_void, bytesize: usize, flags: c_uint) -> CUresult {
    stats::record_call("cuMemHostAlloc");
    // SAFETY: `pp` is NULL or a valid out-pointer per the cuMemHostAlloc contract.
    answer(|| unsafe { host_alloc(pp, bytesize, flags) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocHost_v2(pp: *mut *mut c_void, bytesize: usize) -> CUresult {
    stats::record_call("cuMemAllocHost_v2");
    // SAFETY: `pp` is NULL or a valid out-pointer per the cuMemAllocHost_v2 contract.
    answer(|| unsafe { host_alloc(pp, bytesize, 0) })
}

/// Only memory from `cuMemHostAlloc`/`cuMemAllocHost_v2`; anything else → INVALID_VALUE.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFreeHost(p: *mut c_void) -> CUresult {
    stats::record_call("cuMemFreeHost");
    answer(|| {
        let fake = initialized()?;
        non_null(p)?;
        fake.forget_host_allocation(p.addr())?;
        // SAFETY: `p` came from posix_memalign in `host_alloc` and was just forgotten, so it is freed once.
        unsafe { libc::free(p) };
        Ok(())
    })
}

/// Records the range; memory already page-locked (in part) → `CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED`.
#[unsafe(no_mangle)]
pub extern "C" fn cuMemHostRegister_v2(p: *mut c_void, bytesize: usize, flags: c_uint) -> CUresult {
    stats::record_call("cuMemHostRegister_v2");
    answer(|| {
        let fake = initialized()?;
        current(fake)?;
        non_null(p)?;
        if flags & !HOST_REGISTER_FLAGS != 0 {
            return Err(CuError::InvalidValue);
        }
        Ok(fake.register_host(p.addr(), bytesize)?)
    })
}

/// `p` must start a registered range, else `CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED`.
#[unsafe(no_mangle)]
pub extern "C" fn cuMemHostUnregister(p: *mut c_void) -> CUresult {
    stats::record_call("cuMemHostUnregister");
    answer(|| {
        let fake = initialized()?;
        non_null(p)?;
        Ok(fake.unregister_host(p.addr())?)
    })
}
