//! Arrays (`hipMallocArray`, `hipMalloc3DArray`, `hipArrayCreate`, `hipArray3DCreate` and their
//! destroys): charged what their cells hold (width × height × depth × element size) on the
//! current device. The runtime may pad an array beyond that; no query says by how much.

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
