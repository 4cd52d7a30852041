//! Virtual memory management: `cuMemGetAllocationGranularity`, `cuMemCreate`, `cuMemRelease`,
//! `cuMemRetainAllocationHandle`, `cuMemAddressReserve`, `cuMemAddressFree`, `cuMemMap`, `cuMemUnmap`, `cuMemSetAccess`,
//! `cuMemGetAllocationPropertiesFromHandle`, `cuMemExportToShareableHandle`.

use std::ffi::{c_int, c_ulonglong, c_void};

use super::{
    CUdeviceptr, CUresult, CuError, MemoryPropsHead, answer, as_handle, initialized, non_null, props_device,
    put,
};
use crate::memory::vmm::GRANULARITY;
use crate::stats;

pub type CUmemGenericAllocationHandle = c_ulonglong;

/// `CU_MEM_ALLOC_GRANULARITY_MINIMUM`, `CU_MEM_ALLOC_GRANULARITY_RECOMMENDED`.
const GRANULARITY_OPTIONS: [c_int; 2] = [0, 1];

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetAllocationGranularity(
    granularity: *mut usize,
    prop: *const MemoryPropsHead,
    option: c_int,
) -> CUresult {
    stats::record_call("cuMemGetAllocationGranularity");
    answer(|| {
        let fake = initialized()?;
        non_null(granularity)?;
        // SAFETY: `prop` is NULL or a `CUmemAllocationProp` per the cuMemGetAllocationGranularity contract.
        unsafe { props_device(fake, prop) }?;
        if !GRANULARITY_OPTIONS.contains(&option) {
            return Err(CuError::InvalidValue);
        }
        // SAFETY: a non-NULL out-pointer per the cuMemGetAllocationGranularity contract.
        unsafe { put(granularity, GRANULARITY as usize) }
    })
}

/// Charges `size` (a multiple of 2 MiB) to device `prop->location.id`; counted as an allocation call
/// once that device is known.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemCreate(
    handle: *mut CUmemGenericAllocationHandle,
    size: usize,
    prop: *const MemoryPropsHead,
    flags: c_ulonglong,
) -> CUresult {
    stats::record_call("cuMemCreate");
    answer(|| {
        let fake = initialized()?;
        non_null(handle)?;
        // SAFETY: `prop` is NULL or a `CUmemAllocationProp` per the cuMemCreate contract.
        let device = unsafe { props_device(fake, prop) }?;
        fake.ledger.count_call(device);
        if flags != 0 {
            return Err(CuError::InvalidValue);
        }
        let created = fake.create_physical(device, size as u64)?;
        // SAFETY: a non-NULL out-pointer per the cuMemCreate contract.
        unsafe { put(handle, created) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemRelease(handle: CUmemGenericAllocationHandle) -> CUresult {
    stats::record_call("cuMemRelease");
    answer(|| Ok(initialized()?.release_physical(handle)?))
}

/// One more reference to the allocation mapped at `addr`, which its own `cuMemRelease` drops.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemRetainAllocationHandle(
    handle: *mut CUmemGenericAllocationHandle,
    addr: *mut c_void,
) -> CUresult {
    stats::record_call("cuMemRetainAllocationHandle");
    answer(|| {
        let fake = initialized()?;
        non_null(handle)?;
        let retained = fake.retain_physical(as_handle(addr))?;
        // SAFETY: a non-NULL out-pointer per the cuMemRetainAllocationHandle contract.
        unsafe { put(handle, retained) }
    })
}

/// Address space only: charged to no device. `addr` is honoured when it is aligned and unused.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAddressReserve(
    ptr: *mut CUdeviceptr,
    size: usize,
    alignment: usize,
    addr: CUdeviceptr,
    flags: c_ulonglong,
) -> CUresult {
    stats::record_call("cuMemAddressReserve");
    answer(|| {
        let fake = initialized()?;
        non_null(ptr)?;
        if flags != 0 {
            return Err(CuError::InvalidValue);
        }
        let start = fake.reserve_addresses(size as u64, alignment as u64, addr)?;
        // SAFETY: a non-NULL out-pointer per the cuMemAddressReserve contract.
        unsafe { put(ptr, start) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemAddressFree(ptr: CUdeviceptr, size: usize) -> CUresult {
    stats::record_call("cuMemAddressFree");
    answer(|| Ok(initialized()?.free_addresses(ptr, size as u64)?))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemMap(
    ptr: CUdeviceptr,
    size: usize,
    offset: usize,
    handle: CUmemGenericAllocationHandle,
    flags: c_ulonglong,
) -> CUresult {
    stats::record_call("cuMemMap");
    answer(|| {
        let fake = initialized()?;
        if flags != 0 {
            return Err(CuError::InvalidValue);
        }
        Ok(fake.map(ptr, size as u64, offset as u64, handle)?)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemUnmap(ptr: CUdeviceptr, size: usize) -> CUresult {
    stats::record_call("cuMemUnmap");
    answer(|| Ok(initialized()?.unmap(ptr, size as u64)?))
}

/// Succeeds for a wholly mapped range and at least one descriptor (whose contents are not checked).
#[unsafe(no_mangle)]
pub extern "C" fn cuMemSetAccess(
    ptr: CUdeviceptr,
    size: usize,
    desc: *const c_void,
    count: usize,
) -> CUresult {
    stats::record_call("cuMemSetAccess");
    answer(|| {
        let fake = initialized()?;
        non_null(desc)?;
        if count == 0 {
            return Err(CuError::InvalidValue);
        }
        Ok(fake.check_mapped(ptr, size as u64)?)
    })
}

/// Pinned device memory on the handle's device; the requested handle types are not kept (0).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetAllocationPropertiesFromHandle(
    prop: *mut MemoryPropsHead,
    handle: CUmemGenericAllocationHandle,
) -> CUresult {
    stats::record_call("cuMemGetAllocationPropertiesFromHandle");
    answer(|| {
        let fake = initialized()?;
        non_null(prop)?;
        let device = fake.physical_device(handle)?;
        let head = MemoryPropsHead {
            alloc_type: 1,
            handle_types: 0,
            location: super::CUmemLocation { kind: 1, id: device as c_int },
        };
        // SAFETY: a non-NULL out-pointer to a CUmemAllocationProp, whose head this is.
        unsafe { put(prop, head) }
    })
}

/// The next stand-in file descriptor `cuMemExportToShareableHandle` gives.
static NEXT_EXPORT: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(1000);

/// A POSIX file descriptor's stand-in (the fake shares nothing between processes): a number no
/// other export of this process had, for a live handle and `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemExportToShareableHandle(
    shareable: *mut c_void,
    handle: CUmemGenericAllocationHandle,
    kind: c_int,
    flags: c_ulonglong,
) -> CUresult {
    stats::record_call("cuMemExportToShareableHandle");
    answer(|| {
        let fake = initialized()?;
        non_null(shareable)?;
        if kind != 1 || flags != 0 {
            return Err(CuError::InvalidValue);
        }
        fake.physical_device(handle)?;
        let fd = NEXT_EXPORT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // SAFETY: a non-NULL out-pointer to an int, per the POSIX file descriptor handle type.
        unsafe { put(shareable as *mut c_int, fd) }
    })
}
