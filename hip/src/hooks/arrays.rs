//! Arrays (`hipMallocArray`, `hipMalloc3DArray`, `hipArrayCreate`, `hipArray3DCreate`, mipmapped
//! arrays, and their destroys): charged what their cells hold (width × height × depth × element
//! size, summed over mip levels, each dimension halved per level and never below 1, as on the CUDA
//! side) on the current device. The runtime may pad an array beyond that; no query says by how
//! much.

// Array handles are opaque: passed on, never dereferenced.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

use std::ffi::c_uint;

use crate::error::HookError;
use crate::hooks::memory::{budgeted_current, charge, credit};
use crate::runtime::Runtime;
use crate::sys::*;

/// Creates an array of `bytes` through `call`, which writes its handle to `array`.
///
/// # Safety
/// `array` is the application's out-pointer.
unsafe fn create(
    runtime: &Runtime,
    array: *mut Opaque,
    bytes: Option<u64>,
    call: impl FnOnce() -> Result<(), HookError>,
) -> Result<(), HookError> {
    let device = if array.is_null() { None } else { budgeted_current(runtime) };
    let (Some(device), Some(bytes)) = (device, bytes) else { return call() };
    charge(runtime, &runtime.arrays, device, bytes, || {
        call()?;
        // SAFETY: the runtime succeeded, so it wrote the non-null out-pointer.
        Ok(unsafe { array.read() } as u64)
    })
}

/// Reads `*p` when it is not NULL.
///
/// # Safety
/// `p` is NULL or points to a `T`.
unsafe fn read<T: Copy>(p: *const T) -> Option<T> {
    // SAFETY: non-null per the check, valid per the caller.
    (!p.is_null()).then(|| unsafe { p.read() })
}

fn cells(width: usize, height: usize, depth: usize) -> u64 {
    (width as u64).saturating_mul(height.max(1) as u64).saturating_mul(depth.max(1) as u64)
}

/// Bytes of `levels` mip levels of `element`-byte cells (a height or depth of 0 stays 0: the
/// array has fewer dimensions).
fn mip_bytes(element: u64, width: usize, height: usize, depth: usize, levels: c_uint) -> u64 {
    let (mut w, mut h, mut d) = (width.max(1), height, depth);
    let mut total = 0u64;
    for _ in 0..levels.max(1) {
        total = total.saturating_add(element.saturating_mul(cells(w, h, d)));
        (w, h, d) = (
            (w / 2).max(1),
            if h == 0 { 0 } else { (h / 2).max(1) },
            if d == 0 { 0 } else { (d / 2).max(1) },
        );
    }
    total
}

/// `hipMallocArray`.
///
/// # Safety
/// The application's arguments, per the runtime's contract.
pub unsafe fn malloc_array(
    runtime: &Runtime,
    array: *mut Opaque,
    desc: *const ChannelFormatDesc,
    width: usize,
    height: usize,
    flags: c_uint,
) -> Result<(), HookError> {
    // SAFETY: `desc` is NULL or the caller's descriptor.
    let bytes = unsafe { read(desc) }.map(|d| d.element_bytes().saturating_mul(cells(width, height, 1)));
    // SAFETY: forwarded unchanged.
    unsafe {
        create(runtime, array, bytes, || runtime.real.hipMallocArray(array, desc, width, height, flags))
    }
}

/// `hipMalloc3DArray`.
///
/// # Safety
/// The application's arguments, per the runtime's contract.
pub unsafe fn malloc_3d_array(
    runtime: &Runtime,
    array: *mut Opaque,
    desc: *const ChannelFormatDesc,
    extent: Extent,
    flags: c_uint,
) -> Result<(), HookError> {
    // SAFETY: `desc` is NULL or the caller's descriptor.
    let bytes = unsafe { read(desc) }
        .map(|d| d.element_bytes().saturating_mul(cells(extent.width, extent.height, extent.depth)));
    // SAFETY: forwarded unchanged.
    unsafe { create(runtime, array, bytes, || runtime.real.hipMalloc3DArray(array, desc, extent, flags)) }
}

/// `hipArrayCreate`.
///
/// # Safety
/// The application's arguments, per the runtime's contract.
pub unsafe fn array_create(
    runtime: &Runtime,
    array: *mut Opaque,
    desc: *const ArrayDescriptor,
) -> Result<(), HookError> {
    // SAFETY: `desc` is NULL or the caller's descriptor.
    let bytes = unsafe { read(desc) }.map(|d| {
        (format_bytes(d.format) * u64::from(d.num_channels)).saturating_mul(cells(d.width, d.height, 1))
    });
    // SAFETY: forwarded unchanged.
    unsafe { create(runtime, array, bytes, || runtime.real.hipArrayCreate(array, desc)) }
}

/// `hipArray3DCreate`.
///
/// # Safety
/// The application's arguments, per the runtime's contract.
pub unsafe fn array_3d_create(
    runtime: &Runtime,
    array: *mut Opaque,
    desc: *const Array3dDescriptor,
) -> Result<(), HookError> {
    // SAFETY: `desc` is NULL or the caller's descriptor.
    let bytes = unsafe { read(desc) }.map(|d| {
        (format_bytes(d.format) * u64::from(d.num_channels)).saturating_mul(cells(d.width, d.height, d.depth))
    });
    // SAFETY: forwarded unchanged.
    unsafe { create(runtime, array, bytes, || runtime.real.hipArray3DCreate(array, desc)) }
}

/// `hipMallocMipmappedArray`.
///
/// # Safety
/// The application's arguments, per the runtime's contract.
pub unsafe fn malloc_mipmapped_array(
    runtime: &Runtime,
    array: *mut Opaque,
    desc: *const ChannelFormatDesc,
    extent: Extent,
    levels: c_uint,
    flags: c_uint,
) -> Result<(), HookError> {
    // SAFETY: `desc` is NULL or the caller's descriptor.
    let bytes = unsafe { read(desc) }
        .map(|d| mip_bytes(d.element_bytes(), extent.width, extent.height, extent.depth, levels));
    // SAFETY: forwarded unchanged.
    unsafe {
        create(runtime, array, bytes, || {
            runtime.real.hipMallocMipmappedArray(array, desc, extent, levels, flags)
        })
    }
}

/// `hipMipmappedArrayCreate`.
///
/// # Safety
/// The application's arguments, per the runtime's contract.
pub unsafe fn mipmapped_array_create(
    runtime: &Runtime,
    array: *mut Opaque,
    desc: *const Array3dDescriptor,
    levels: c_uint,
) -> Result<(), HookError> {
    // SAFETY: `desc` is NULL or the caller's descriptor.
    let bytes = unsafe { read(desc) }.map(|d| {
        let element = format_bytes(d.format) * u64::from(d.num_channels);
        mip_bytes(element, d.width, d.height, d.depth, levels)
    });
    // SAFETY: forwarded unchanged.
    unsafe { create(runtime, array, bytes, || runtime.real.hipMipmappedArrayCreate(array, desc, levels)) }
}

/// `hipFreeMipmappedArray`.
///
/// # Safety
/// `array` is the application's handle.
pub unsafe fn free_mipmapped_array(runtime: &Runtime, array: Opaque) -> Result<(), HookError> {
    // SAFETY: forwarded unchanged.
    credit(runtime, &runtime.arrays, array as u64, || unsafe { runtime.real.hipFreeMipmappedArray(array) })
}

/// `hipMipmappedArrayDestroy`.
///
/// # Safety
/// `array` is the application's handle.
pub unsafe fn mipmapped_array_destroy(runtime: &Runtime, array: Opaque) -> Result<(), HookError> {
    // SAFETY: forwarded unchanged.
    credit(runtime, &runtime.arrays, array as u64, || unsafe { runtime.real.hipMipmappedArrayDestroy(array) })
}

/// `hipFreeArray`.
///
/// # Safety
/// `array` is the application's handle.
pub unsafe fn free_array(runtime: &Runtime, array: Opaque) -> Result<(), HookError> {
    // SAFETY: forwarded unchanged.
    credit(runtime, &runtime.arrays, array as u64, || unsafe { runtime.real.hipFreeArray(array) })
}

/// `hipArrayDestroy`.
///
/// # Safety
/// `array` is the application's handle.
pub unsafe fn array_destroy(runtime: &Runtime, array: Opaque) -> Result<(), HookError> {
    // SAFETY: forwarded unchanged.
    credit(runtime, &runtime.arrays, array as u64, || unsafe { runtime.real.hipArrayDestroy(array) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mip_levels_halve_each_dimension() {
        assert_eq!(mip_bytes(16, 1024, 64, 0, 2), 16 * (1024 * 64 + 512 * 32));
        assert_eq!(mip_bytes(4, 4, 0, 0, 4), 4 * (4 + 2 + 1 + 1));
        assert_eq!(mip_bytes(1, 8, 8, 8, 0), 512, "zero levels is one");
    }
}
