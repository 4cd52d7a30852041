//! Copies and memsets that run on the device: with a compute share they take GPU time like a
//! kernel, so they are paced by the same clock ([`crate::compute`]). Copies from or to the host
//! are left alone (the copy engines move them, and `hipMemcpyDefault` is not looked into:
//! deciding it would take a pointer query per call).

// Pointers and streams are the application's, passed on, never dereferenced.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

use std::ffi::{c_int, c_void};

use crate::compute;
use crate::error::HookError;
use crate::runtime::Runtime;
use crate::sys::*;

/// `hipMemcpyDeviceToDevice`.
const MEMCPY_DEVICE_TO_DEVICE: c_int = 3;

/// `hipMemcpy`: paced when device to device.
///
/// # Safety
/// The application's arguments, per the runtime's contract.
pub unsafe fn memcpy(
    runtime: &Runtime,
    dst: *mut c_void,
    src: *const c_void,
    size: usize,
    kind: c_int,
) -> Result<(), HookError> {
    // SAFETY: forwarded unchanged.
    let call = || unsafe { runtime.real.hipMemcpy(dst, src, size, kind) };
    if kind == MEMCPY_DEVICE_TO_DEVICE {
        compute::launch(runtime, std::ptr::null_mut(), call)
    } else {
        call()
    }
}

/// `hipMemcpyAsync`: paced when device to device.
///
/// # Safety
/// The application's arguments, per the runtime's contract.
pub unsafe fn memcpy_async(
    runtime: &Runtime,
    dst: *mut c_void,
    src: *const c_void,
    size: usize,
    kind: c_int,
    stream: Opaque,
) -> Result<(), HookError> {
    // SAFETY: forwarded unchanged.
    let call = || unsafe { runtime.real.hipMemcpyAsync(dst, src, size, kind, stream) };
    if kind == MEMCPY_DEVICE_TO_DEVICE { compute::launch(runtime, stream, call) } else { call() }
}

/// `hipMemcpyDtoD`.
///
/// # Safety
/// The application's arguments, per the runtime's contract.
pub unsafe fn memcpy_dtod(
    runtime: &Runtime,
    dst: *mut c_void,
    src: *mut c_void,
    size: usize,
) -> Result<(), HookError> {
    // SAFETY: forwarded unchanged.
    compute::launch(runtime, std::ptr::null_mut(), || unsafe { runtime.real.hipMemcpyDtoD(dst, src, size) })
}

/// `hipMemcpyDtoDAsync`.
///
/// # Safety
/// The application's arguments, per the runtime's contract.
pub unsafe fn memcpy_dtod_async(
    runtime: &Runtime,
    dst: *mut c_void,
    src: *mut c_void,
    size: usize,
    stream: Opaque,
) -> Result<(), HookError> {
    // SAFETY: forwarded unchanged.
    compute::launch(runtime, stream, || unsafe { runtime.real.hipMemcpyDtoDAsync(dst, src, size, stream) })
}

/// `hipMemset`.
///
/// # Safety
/// The application's arguments, per the runtime's contract.
pub unsafe fn memset(
    runtime: &Runtime,
    dst: *mut c_void,
    value: c_int,
    size: usize,
) -> Result<(), HookError> {
    // SAFETY: forwarded unchanged.
    compute::launch(runtime, std::ptr::null_mut(), || unsafe { runtime.real.hipMemset(dst, value, size) })
}

/// `hipMemsetAsync`.
///
/// # Safety
/// The application's arguments, per the runtime's contract.
pub unsafe fn memset_async(
    runtime: &Runtime,
    dst: *mut c_void,
    value: c_int,
    size: usize,
    stream: Opaque,
) -> Result<(), HookError> {
    // SAFETY: forwarded unchanged.
    compute::launch(runtime, stream, || unsafe { runtime.real.hipMemsetAsync(dst, value, size, stream) })
}

/// `hipMemsetD8`.
///
/// # Safety
/// The application's arguments, per the runtime's contract.
pub unsafe fn memset_d8(
    runtime: &Runtime,
    dst: *mut c_void,
    value: u8,
    count: usize,
) -> Result<(), HookError> {
    // SAFETY: forwarded unchanged.
    compute::launch(runtime, std::ptr::null_mut(), || unsafe { runtime.real.hipMemsetD8(dst, value, count) })
}

/// `hipMemsetD8Async`.
///
/// # Safety
/// The application's arguments, per the runtime's contract.
pub unsafe fn memset_d8_async(
    runtime: &Runtime,
    dst: *mut c_void,
    value: u8,
    count: usize,
    stream: Opaque,
) -> Result<(), HookError> {
    // SAFETY: forwarded unchanged.
    compute::launch(runtime, stream, || unsafe { runtime.real.hipMemsetD8Async(dst, value, count, stream) })
}

/// `hipMemsetD32`.
///
/// # Safety
/// The application's arguments, per the runtime's contract.
pub unsafe fn memset_d32(
    runtime: &Runtime,
    dst: *mut c_void,
    value: c_int,
    count: usize,
) -> Result<(), HookError> {
    // SAFETY: forwarded unchanged.
    compute::launch(runtime, std::ptr::null_mut(), || unsafe { runtime.real.hipMemsetD32(dst, value, count) })
}

/// `hipMemsetD32Async`.
///
/// # Safety
/// The application's arguments, per the runtime's contract.
pub unsafe fn memset_d32_async(
    runtime: &Runtime,
    dst: *mut c_void,
    value: c_int,
    count: usize,
    stream: Opaque,
) -> Result<(), HookError> {
    // SAFETY: forwarded unchanged.
    compute::launch(runtime, stream, || unsafe { runtime.real.hipMemsetD32Async(dst, value, count, stream) })
}
