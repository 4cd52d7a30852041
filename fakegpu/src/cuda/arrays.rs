//! CUDA arrays: `cuArrayCreate_v2`, `cuArray3DCreate_v2`, `cuArrayDestroy`, `cuMipmappedArrayCreate`,
//! `cuMipmappedArrayDestroy`, and the unsimulated v1 `cuArrayCreate`. Sizes follow `memory::arrays`.

use std::ffi::{c_int, c_uint, c_void};

use super::memory::charged_device;
use super::{CUresult, CuError, answer, as_handle, as_pointer, current, get, initialized, non_null, put};
use crate::handles::Kind;
use crate::memory::arrays::Extent;
use crate::stats;

pub type CUarray = *mut c_void;
pub type CUmipmappedArray = *mut c_void;

/// `CUDA_ARRAY_DESCRIPTOR` (the `_v2` layout).
#[derive(Clone, Copy)]
#[repr(C)]
pub struct ArrayDescriptor {
    width: usize,
    height: usize,
    format: c_int,
    channels: c_uint,
}

/// `CUDA_ARRAY3D_DESCRIPTOR` (the `_v2` layout); `Flags` are accepted and ignored.
#[derive(Clone, Copy)]
#[repr(C)]
pub struct Array3dDescriptor {
    width: usize,
    height: usize,
    depth: usize,
    format: c_int,
    channels: c_uint,
    _flags: c_uint,
}

impl Array3dDescriptor {
    fn extent(&self) -> Extent {
        Extent {
            width: self.width as u64,
            height: self.height as u64,
            depth: self.depth as u64,
            format: self.format,
            channels: self.channels,
        }
    }
}

/// Charges `bytes` (what `size` makes of the extent) on the current context's device; counted as an
/// allocation call once that device is known.
///
/// # Safety
/// `out` must be NULL or valid for writing a pointer.
unsafe fn create(
    out: *mut *mut c_void,
    kind: Kind,
    size: impl FnOnce() -> Result<u64, CuError>,
) -> Result<(), CuError> {
    let (fake, device) = charged_device()?;
    non_null(out)?;
    let handle = fake.create_array(device, size()?, kind)?;
    // SAFETY: a non-NULL out-pointer by this function's contract.
    unsafe { put(out, as_pointer(handle)) }
}

fn destroy(handle: *mut c_void, kind: Kind) -> Result<(), CuError> {
    let fake = initialized()?;
    current(fake)?;
    Ok(fake.destroy_array(as_handle(handle), kind)?)
}

/// The v1 ABI (32-bit fields, CUDA 2.0) is not simulated.
#[unsafe(no_mangle)]
pub extern "C" fn cuArrayCreate(_array: *mut CUarray, _descriptor: *const c_void) -> CUresult {
    stats::record_call("cuArrayCreate");
    CuError::NotSupported as CUresult
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArrayCreate_v2(
    array: *mut CUarray,
    descriptor: *const ArrayDescriptor,
) -> CUresult {
    stats::record_call("cuArrayCreate_v2");
    // SAFETY: `array` is NULL or a valid out-pointer, and `descriptor` NULL or a
    // `CUDA_ARRAY_DESCRIPTOR`, per the cuArrayCreate_v2 contract.
    answer(|| unsafe {
        create(array, Kind::Array, || {
            let d = get(descriptor)?;
            let extent = Extent {
                width: d.width as u64,
                height: d.height as u64,
                depth: 0,
                format: d.format,
                channels: d.channels,
            };
            Ok(extent.bytes()?)
        })
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArray3DCreate_v2(
    array: *mut CUarray,
    descriptor: *const Array3dDescriptor,
) -> CUresult {
    stats::record_call("cuArray3DCreate_v2");
    // SAFETY: `array` is NULL or a valid out-pointer, and `descriptor` NULL or a
    // `CUDA_ARRAY3D_DESCRIPTOR`, per the cuArray3DCreate_v2 contract.
    answer(|| unsafe { create(array, Kind::Array, || Ok(get(descriptor)?.extent().bytes()?)) })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuArrayDestroy(array: CUarray) -> CUresult {
    stats::record_call("cuArrayDestroy");
    answer(|| destroy(array, Kind::Array))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMipmappedArrayCreate(
    array: *mut CUmipmappedArray,
    descriptor: *const Array3dDescriptor,
    levels: c_uint,
) -> CUresult {
    stats::record_call("cuMipmappedArrayCreate");
    // SAFETY: `array` is NULL or a valid out-pointer, and `descriptor` NULL or a
    // `CUDA_ARRAY3D_DESCRIPTOR`, per the cuMipmappedArrayCreate contract.
    answer(|| unsafe {
        create(array, Kind::MipmappedArray, || Ok(get(descriptor)?.extent().mipmapped_bytes(levels)?))
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMipmappedArrayDestroy(array: CUmipmappedArray) -> CUresult {
    stats::record_call("cuMipmappedArrayDestroy");
    answer(|| destroy(array, Kind::MipmappedArray))
}
