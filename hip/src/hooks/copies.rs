//! Copies and memsets that run on the device: with a compute share they take GPU time like a
//! kernel, so they are paced by the same clock ([`crate::compute`]). Copies from or to the host
//! are left alone: the copy engines move them beside the neighbours' kernels (the CUDA side's
//! measurement, docs/compute-limit.md).
//!
//! Where a copy runs is known from its kind: device to device (and peer copies, and an array end)
//! is on the device; host to or from anything is not. A `hipMemcpyDefault` copy (the runtime
//! decides from the addresses) is on the device when `hipPointerGetAttributes` says both ends are
//! device or managed memory; that query is made only when the device has a share, so a process
//! without one pays nothing. Every memset runs on the device.

// Pointers, arrays and streams are the application's, passed on, never dereferenced.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

use std::ffi::{c_int, c_void};

use crate::compute::{self, per_thread};
use crate::error::HookError;
use crate::runtime::Runtime;
use crate::sys::*;

/// Whether the runtime says `address` is device (or managed) memory. An address it does not know
/// (pageable host memory) fails the query, and a failure becomes the thread's last error
/// (`hipGetLastError`); so unless an error of the application's own was pending already, the
/// failure is cleared again.
fn is_device_memory(runtime: &Runtime, address: *const c_void) -> bool {
    if address.is_null() {
        return false;
    }
    let mut attributes: PointerAttributes = [0; 4];
    // SAFETY: no arguments.
    let nothing_pending = unsafe { runtime.real.hipPeekAtLastError() }.is_ok();
    // SAFETY: `attributes` is a writable hipPointerAttribute_t (32 bytes); `address` is only looked up.
    match unsafe { runtime.real.hipPointerGetAttributes(attributes.as_mut_ptr().cast(), address) } {
        Ok(()) => describes_device_memory(&attributes, runtime.version),
        Err(_) => {
            if nothing_pending {
                // SAFETY: no arguments; clears the failure of our own query.
                let _ = unsafe { runtime.real.hipGetLastError() };
            }
            false
        }
    }
}

/// Whether a copy of `kind` runs on the device, its ends being where `dst` and `src` say
/// (each asked only for `hipMemcpyDefault`).
fn on_device(kind: c_int, dst: impl FnOnce() -> bool, src: impl FnOnce() -> bool) -> bool {
    match kind {
        MEMCPY_DEVICE_TO_DEVICE | MEMCPY_DEVICE_TO_DEVICE_NO_CU => true,
        MEMCPY_DEFAULT => dst() && src(),
        _ => false,
    }
}

/// A copy between two addresses.
fn between(runtime: &Runtime, kind: c_int, dst: *const c_void, src: *const c_void) -> bool {
    on_device(kind, || is_device_memory(runtime, dst), || is_device_memory(runtime, src))
}

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
    compute::launch_if(runtime, std::ptr::null_mut(), || between(runtime, kind, dst, src), call)
}

/// `hipMemcpy_spt`.
///
/// # Safety
/// The application's arguments, per the runtime's contract.
pub unsafe fn memcpy_spt(
    runtime: &Runtime,
    dst: *mut c_void,
    src: *const c_void,
    size: usize,
    kind: c_int,
) -> Result<(), HookError> {
    // SAFETY: forwarded unchanged.
    let call = || unsafe { runtime.real.hipMemcpy_spt(dst, src, size, kind) };
    compute::launch_if(runtime, per_thread(std::ptr::null_mut()), || between(runtime, kind, dst, src), call)
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
    compute::launch_if(runtime, stream, || between(runtime, kind, dst, src), call)
}

/// `hipMemcpyAsync_spt`.
///
/// # Safety
/// The application's arguments, per the runtime's contract.
pub unsafe fn memcpy_async_spt(
    runtime: &Runtime,
    dst: *mut c_void,
    src: *const c_void,
    size: usize,
    kind: c_int,
    stream: Opaque,
) -> Result<(), HookError> {
    // SAFETY: forwarded unchanged.
    let call = || unsafe { runtime.real.hipMemcpyAsync_spt(dst, src, size, kind, stream) };
    compute::launch_if(runtime, per_thread(stream), || between(runtime, kind, dst, src), call)
}

/// `hipMemcpyWithStream`: a synchronous copy on `stream`.
///
/// # Safety
/// The application's arguments, per the runtime's contract.
pub unsafe fn memcpy_with_stream(
    runtime: &Runtime,
    dst: *mut c_void,
    src: *const c_void,
    size: usize,
    kind: c_int,
    stream: Opaque,
) -> Result<(), HookError> {
    // SAFETY: forwarded unchanged.
    let call = || unsafe { runtime.real.hipMemcpyWithStream(dst, src, size, kind, stream) };
    compute::launch_if(runtime, stream, || between(runtime, kind, dst, src), call)
}

/// `hipMemcpy2D`.
///
/// # Safety
/// The application's arguments, per the runtime's contract.
#[allow(clippy::too_many_arguments)]
pub unsafe fn memcpy_2d(
    runtime: &Runtime,
    dst: *mut c_void,
    dpitch: usize,
    src: *const c_void,
    spitch: usize,
    width: usize,
    height: usize,
    kind: c_int,
) -> Result<(), HookError> {
    // SAFETY: forwarded unchanged.
    let call = || unsafe { runtime.real.hipMemcpy2D(dst, dpitch, src, spitch, width, height, kind) };
    compute::launch_if(runtime, std::ptr::null_mut(), || between(runtime, kind, dst, src), call)
}

/// `hipMemcpy2DAsync`.
///
/// # Safety
/// The application's arguments, per the runtime's contract.
#[allow(clippy::too_many_arguments)]
pub unsafe fn memcpy_2d_async(
    runtime: &Runtime,
    dst: *mut c_void,
    dpitch: usize,
    src: *const c_void,
    spitch: usize,
    width: usize,
    height: usize,
    kind: c_int,
    stream: Opaque,
) -> Result<(), HookError> {
    // SAFETY: forwarded unchanged.
    let call =
        || unsafe { runtime.real.hipMemcpy2DAsync(dst, dpitch, src, spitch, width, height, kind, stream) };
    compute::launch_if(runtime, stream, || between(runtime, kind, dst, src), call)
}

/// `hipMemcpy2D_spt`.
///
/// # Safety
/// The application's arguments, per the runtime's contract.
#[allow(clippy::too_many_arguments)]
pub unsafe fn memcpy_2d_spt(
    runtime: &Runtime,
    dst: *mut c_void,
    dpitch: usize,
    src: *const c_void,
    spitch: usize,
    width: usize,
    height: usize,
    kind: c_int,
) -> Result<(), HookError> {
    // SAFETY: forwarded unchanged.
    let call = || unsafe { runtime.real.hipMemcpy2D_spt(dst, dpitch, src, spitch, width, height, kind) };
    compute::launch_if(runtime, per_thread(std::ptr::null_mut()), || between(runtime, kind, dst, src), call)
}

/// A copy with an array at one end (on the device) and `address` at the other.
fn with_array(runtime: &Runtime, kind: c_int, address: *const c_void) -> bool {
    on_device(kind, || true, || is_device_memory(runtime, address))
}

/// `hipMemcpy2DToArray`.
///
/// # Safety
/// The application's arguments, per the runtime's contract.
#[allow(clippy::too_many_arguments)]
pub unsafe fn memcpy_2d_to_array(
    runtime: &Runtime,
    dst: Opaque,
    w_offset: usize,
    h_offset: usize,
    src: *const c_void,
    spitch: usize,
    width: usize,
    height: usize,
    kind: c_int,
) -> Result<(), HookError> {
    // SAFETY: forwarded unchanged.
    let call = || unsafe {
        runtime.real.hipMemcpy2DToArray(dst, w_offset, h_offset, src, spitch, width, height, kind)
    };
    compute::launch_if(runtime, std::ptr::null_mut(), || with_array(runtime, kind, src), call)
}

/// `hipMemcpy2DToArrayAsync`.
///
/// # Safety
/// The application's arguments, per the runtime's contract.
#[allow(clippy::too_many_arguments)]
pub unsafe fn memcpy_2d_to_array_async(
    runtime: &Runtime,
    dst: Opaque,
    w_offset: usize,
    h_offset: usize,
    src: *const c_void,
    spitch: usize,
    width: usize,
    height: usize,
    kind: c_int,
    stream: Opaque,
) -> Result<(), HookError> {
    let call = || {
        // SAFETY: forwarded unchanged.
        unsafe {
            runtime
                .real
                .hipMemcpy2DToArrayAsync(dst, w_offset, h_offset, src, spitch, width, height, kind, stream)
        }
    };
    compute::launch_if(runtime, stream, || with_array(runtime, kind, src), call)
}

/// `hipMemcpy2DToArray_spt`.
///
/// # Safety
/// The application's arguments, per the runtime's contract.
#[allow(clippy::too_many_arguments)]
pub unsafe fn memcpy_2d_to_array_spt(
    runtime: &Runtime,
    dst: Opaque,
    w_offset: usize,
    h_offset: usize,
    src: *const c_void,
    spitch: usize,
    width: usize,
    height: usize,
    kind: c_int,
) -> Result<(), HookError> {
    let call = || {
        // SAFETY: forwarded unchanged.
        unsafe {
            runtime.real.hipMemcpy2DToArray_spt(dst, w_offset, h_offset, src, spitch, width, height, kind)
        }
    };
    compute::launch_if(runtime, per_thread(std::ptr::null_mut()), || with_array(runtime, kind, src), call)
}

/// `hipMemcpy2DFromArray`.
///
/// # Safety
/// The application's arguments, per the runtime's contract.
#[allow(clippy::too_many_arguments)]
pub unsafe fn memcpy_2d_from_array(
    runtime: &Runtime,
    dst: *mut c_void,
    dpitch: usize,
    src: Opaque,
    w_offset: usize,
    h_offset: usize,
    width: usize,
    height: usize,
    kind: c_int,
) -> Result<(), HookError> {
    let call = || {
        // SAFETY: forwarded unchanged.
        unsafe {
            runtime.real.hipMemcpy2DFromArray(dst, dpitch, src, w_offset, h_offset, width, height, kind)
        }
    };
    compute::launch_if(runtime, std::ptr::null_mut(), || with_array(runtime, kind, dst), call)
}

/// `hipMemcpy2DFromArrayAsync`.
///
/// # Safety
/// The application's arguments, per the runtime's contract.
#[allow(clippy::too_many_arguments)]
pub unsafe fn memcpy_2d_from_array_async(
    runtime: &Runtime,
    dst: *mut c_void,
    dpitch: usize,
    src: Opaque,
    w_offset: usize,
    h_offset: usize,
    width: usize,
    height: usize,
    kind: c_int,
    stream: Opaque,
) -> Result<(), HookError> {
    let call = || {
        // SAFETY: forwarded unchanged.
        unsafe {
            runtime
                .real
                .hipMemcpy2DFromArrayAsync(dst, dpitch, src, w_offset, h_offset, width, height, kind, stream)
        }
    };
    compute::launch_if(runtime, stream, || with_array(runtime, kind, dst), call)
}

/// `hipMemcpy2DFromArray_spt`.
///
/// # Safety
/// The application's arguments, per the runtime's contract.
#[allow(clippy::too_many_arguments)]
pub unsafe fn memcpy_2d_from_array_spt(
    runtime: &Runtime,
    dst: *mut c_void,
    dpitch: usize,
    src: Opaque,
    w_offset: usize,
    h_offset: usize,
    width: usize,
    height: usize,
    kind: c_int,
) -> Result<(), HookError> {
    let call = || {
        // SAFETY: forwarded unchanged.
        unsafe {
            runtime.real.hipMemcpy2DFromArray_spt(dst, dpitch, src, w_offset, h_offset, width, height, kind)
        }
    };
    compute::launch_if(runtime, per_thread(std::ptr::null_mut()), || with_array(runtime, kind, dst), call)
}

/// Whether a `hipMemcpy3DParms` copy runs on the device: each end is an array or an address.
///
/// # Safety
/// `p` is NULL or the application's `hipMemcpy3DParms`.
unsafe fn copy_3d_on_device(runtime: &Runtime, p: *const u8) -> bool {
    // SAFETY: per the contract; NULL is the runtime's to refuse.
    let Some(copy) = (unsafe { copy_3d(p) }) else { return false };
    let end = |array: usize, ptr: usize| array != 0 || is_device_memory(runtime, ptr as *const c_void);
    on_device(copy.kind, || end(copy.dst_array, copy.dst_ptr), || end(copy.src_array, copy.src_ptr))
}

/// `hipMemcpy3D`.
///
/// # Safety
/// `p` is NULL or the application's `hipMemcpy3DParms`.
pub unsafe fn memcpy_3d(runtime: &Runtime, p: *const u8) -> Result<(), HookError> {
    // SAFETY: forwarded unchanged.
    let call = || unsafe { runtime.real.hipMemcpy3D(p) };
    // SAFETY: per the contract.
    compute::launch_if(runtime, std::ptr::null_mut(), || unsafe { copy_3d_on_device(runtime, p) }, call)
}

/// `hipMemcpy3DAsync`.
///
/// # Safety
/// `p` is NULL or the application's `hipMemcpy3DParms`; `stream` a runtime handle.
pub unsafe fn memcpy_3d_async(runtime: &Runtime, p: *const u8, stream: Opaque) -> Result<(), HookError> {
    // SAFETY: forwarded unchanged.
    let call = || unsafe { runtime.real.hipMemcpy3DAsync(p, stream) };
    // SAFETY: per the contract.
    compute::launch_if(runtime, stream, || unsafe { copy_3d_on_device(runtime, p) }, call)
}

/// `hipMemcpy3D_spt`.
///
/// # Safety
/// `p` is NULL or the application's `hipMemcpy3DParms`.
pub unsafe fn memcpy_3d_spt(runtime: &Runtime, p: *const u8) -> Result<(), HookError> {
    // SAFETY: forwarded unchanged.
    let call = || unsafe { runtime.real.hipMemcpy3D_spt(p) };
    // SAFETY: per the contract.
    compute::launch_if(
        runtime,
        per_thread(std::ptr::null_mut()),
        || unsafe { copy_3d_on_device(runtime, p) },
        call,
    )
}

/// Whether a `hip_Memcpy2D` copy runs on the device: each end's memory type says, and for
/// unified or managed memory the runtime is asked about its address.
///
/// # Safety
/// `p` is NULL or the application's `hip_Memcpy2D`.
unsafe fn param_2d_on_device(runtime: &Runtime, p: *const u8) -> bool {
    // SAFETY: per the contract; NULL is the runtime's to refuse.
    let Some(copy) = (unsafe { param_2d(p) }) else { return false };
    let types = memory_types(runtime.version);
    let end = |kind: i32, address: usize| {
        kind == types.device
            || kind == types.array
            || ((kind == types.unified || kind == types.managed)
                && is_device_memory(runtime, address as *const c_void))
    };
    end(copy.src_type, copy.src_device) && end(copy.dst_type, copy.dst_device)
}

/// `hipMemcpyParam2D`.
///
/// # Safety
/// `p` is NULL or the application's `hip_Memcpy2D`.
pub unsafe fn memcpy_param_2d(runtime: &Runtime, p: *const u8) -> Result<(), HookError> {
    // SAFETY: forwarded unchanged.
    let call = || unsafe { runtime.real.hipMemcpyParam2D(p) };
    // SAFETY: per the contract.
    compute::launch_if(runtime, std::ptr::null_mut(), || unsafe { param_2d_on_device(runtime, p) }, call)
}

/// `hipMemcpyParam2DAsync`.
///
/// # Safety
/// `p` is NULL or the application's `hip_Memcpy2D`; `stream` a runtime handle.
pub unsafe fn memcpy_param_2d_async(
    runtime: &Runtime,
    p: *const u8,
    stream: Opaque,
) -> Result<(), HookError> {
    // SAFETY: forwarded unchanged.
    let call = || unsafe { runtime.real.hipMemcpyParam2DAsync(p, stream) };
    // SAFETY: per the contract.
    compute::launch_if(runtime, stream, || unsafe { param_2d_on_device(runtime, p) }, call)
}

/// `hipMemcpyPeer`: device to device, paced on the current device.
///
/// # Safety
/// The application's arguments, per the runtime's contract.
pub unsafe fn memcpy_peer(
    runtime: &Runtime,
    dst: *mut c_void,
    dst_device: c_int,
    src: *const c_void,
    src_device: c_int,
    size: usize,
) -> Result<(), HookError> {
    // SAFETY: forwarded unchanged.
    let call = || unsafe { runtime.real.hipMemcpyPeer(dst, dst_device, src, src_device, size) };
    compute::launch(runtime, std::ptr::null_mut(), call)
}

/// `hipMemcpyPeerAsync`.
///
/// # Safety
/// The application's arguments, per the runtime's contract.
pub unsafe fn memcpy_peer_async(
    runtime: &Runtime,
    dst: *mut c_void,
    dst_device: c_int,
    src: *const c_void,
    src_device: c_int,
    size: usize,
    stream: Opaque,
) -> Result<(), HookError> {
    // SAFETY: forwarded unchanged.
    let call = || unsafe { runtime.real.hipMemcpyPeerAsync(dst, dst_device, src, src_device, size, stream) };
    compute::launch(runtime, stream, call)
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

/// `hipMemset_spt`.
///
/// # Safety
/// The application's arguments, per the runtime's contract.
pub unsafe fn memset_spt(
    runtime: &Runtime,
    dst: *mut c_void,
    value: c_int,
    size: usize,
) -> Result<(), HookError> {
    // SAFETY: forwarded unchanged.
    compute::launch(runtime, per_thread(std::ptr::null_mut()), || unsafe {
        runtime.real.hipMemset_spt(dst, value, size)
    })
}

/// `hipMemsetD16`.
///
/// # Safety
/// The application's arguments, per the runtime's contract.
pub unsafe fn memset_d16(
    runtime: &Runtime,
    dst: *mut c_void,
    value: u16,
    count: usize,
) -> Result<(), HookError> {
    // SAFETY: forwarded unchanged.
    compute::launch(runtime, std::ptr::null_mut(), || unsafe { runtime.real.hipMemsetD16(dst, value, count) })
}

/// `hipMemsetD16Async`.
///
/// # Safety
/// The application's arguments, per the runtime's contract.
pub unsafe fn memset_d16_async(
    runtime: &Runtime,
    dst: *mut c_void,
    value: u16,
    count: usize,
    stream: Opaque,
) -> Result<(), HookError> {
    // SAFETY: forwarded unchanged.
    compute::launch(runtime, stream, || unsafe { runtime.real.hipMemsetD16Async(dst, value, count, stream) })
}

/// `hipMemset2D`.
///
/// # Safety
/// The application's arguments, per the runtime's contract.
pub unsafe fn memset_2d(
    runtime: &Runtime,
    dst: *mut c_void,
    pitch: usize,
    value: c_int,
    width: usize,
    height: usize,
) -> Result<(), HookError> {
    // SAFETY: forwarded unchanged.
    let call = || unsafe { runtime.real.hipMemset2D(dst, pitch, value, width, height) };
    compute::launch(runtime, std::ptr::null_mut(), call)
}

/// `hipMemset2DAsync`.
///
/// # Safety
/// The application's arguments, per the runtime's contract.
pub unsafe fn memset_2d_async(
    runtime: &Runtime,
    dst: *mut c_void,
    pitch: usize,
    value: c_int,
    width: usize,
    height: usize,
    stream: Opaque,
) -> Result<(), HookError> {
    // SAFETY: forwarded unchanged.
    let call = || unsafe { runtime.real.hipMemset2DAsync(dst, pitch, value, width, height, stream) };
    compute::launch(runtime, stream, call)
}

/// `hipMemset2D_spt`.
///
/// # Safety
/// The application's arguments, per the runtime's contract.
pub unsafe fn memset_2d_spt(
    runtime: &Runtime,
    dst: *mut c_void,
    pitch: usize,
    value: c_int,
    width: usize,
    height: usize,
) -> Result<(), HookError> {
    // SAFETY: forwarded unchanged.
    let call = || unsafe { runtime.real.hipMemset2D_spt(dst, pitch, value, width, height) };
    compute::launch(runtime, per_thread(std::ptr::null_mut()), call)
}

/// `hipMemset3D`.
///
/// # Safety
/// The application's arguments, per the runtime's contract.
pub unsafe fn memset_3d(
    runtime: &Runtime,
    pitched: PitchedPtr,
    value: c_int,
    extent: Extent,
) -> Result<(), HookError> {
    // SAFETY: forwarded unchanged.
    compute::launch(runtime, std::ptr::null_mut(), || unsafe {
        runtime.real.hipMemset3D(pitched, value, extent)
    })
}

/// `hipMemset3DAsync`.
///
/// # Safety
/// The application's arguments, per the runtime's contract.
pub unsafe fn memset_3d_async(
    runtime: &Runtime,
    pitched: PitchedPtr,
    value: c_int,
    extent: Extent,
    stream: Opaque,
) -> Result<(), HookError> {
    // SAFETY: forwarded unchanged.
    compute::launch(runtime, stream, || unsafe {
        runtime.real.hipMemset3DAsync(pitched, value, extent, stream)
    })
}

/// `hipMemset3D_spt`.
///
/// # Safety
/// The application's arguments, per the runtime's contract.
pub unsafe fn memset_3d_spt(
    runtime: &Runtime,
    pitched: PitchedPtr,
    value: c_int,
    extent: Extent,
) -> Result<(), HookError> {
    // SAFETY: forwarded unchanged.
    let call = || unsafe { runtime.real.hipMemset3D_spt(pitched, value, extent) };
    compute::launch(runtime, per_thread(std::ptr::null_mut()), call)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kind_decides_and_only_a_default_copy_asks_about_its_ends() {
        let asked = std::cell::Cell::new(0);
        let ask = |answer: bool| {
            asked.set(asked.get() + 1);
            answer
        };
        assert!(on_device(MEMCPY_DEVICE_TO_DEVICE, || ask(false), || ask(false)));
        assert!(on_device(MEMCPY_DEVICE_TO_DEVICE_NO_CU, || ask(false), || ask(false)));
        assert!(!on_device(1, || ask(true), || ask(true)), "host to device");
        assert_eq!(asked.get(), 0);
        assert!(on_device(MEMCPY_DEFAULT, || ask(true), || ask(true)));
        assert!(!on_device(MEMCPY_DEFAULT, || ask(false), || ask(true)));
        assert_eq!(asked.get(), 3, "a host destination settles it");
    }

    #[test]
    fn pointer_attributes_read_by_the_runtimes_memory_types() {
        let attributes = |kind: u64, managed: u64| [kind, 0, 0, managed];
        assert!(describes_device_memory(&attributes(1, 0), 50_200_000));
        assert!(!describes_device_memory(&attributes(1, 0), 60_200_000), "6.x: 1 is host");
        assert!(describes_device_memory(&attributes(2, 0), 60_200_000));
        assert!(describes_device_memory(&attributes(3, 0), 60_200_000), "6.x managed");
        assert!(describes_device_memory(&attributes(0, 1), 50_200_000), "isManaged");
        assert!(!describes_device_memory(&attributes(0, 0), 50_200_000), "5.x host");
    }

    #[test]
    fn copy_descriptors_are_read_at_their_offsets() {
        let mut p3d = [0u8; 160];
        p3d[32..40].copy_from_slice(&0x1000usize.to_ne_bytes());
        p3d[64..72].copy_from_slice(&0x2000usize.to_ne_bytes());
        p3d[152..156].copy_from_slice(&MEMCPY_DEFAULT.to_ne_bytes());
        // SAFETY: a 160-byte hipMemcpy3DParms.
        let copy = unsafe { copy_3d(p3d.as_ptr()) }.unwrap();
        assert_eq!(
            (copy.src_array, copy.src_ptr, copy.dst_array, copy.kind),
            (0, 0x1000, 0x2000, MEMCPY_DEFAULT)
        );
        let mut p2d = [0u8; 128];
        p2d[16..20].copy_from_slice(&2i32.to_ne_bytes());
        p2d[88..96].copy_from_slice(&0x3000usize.to_ne_bytes());
        // SAFETY: a 128-byte hip_Memcpy2D.
        let copy = unsafe { param_2d(p2d.as_ptr()) }.unwrap();
        assert_eq!((copy.src_type, copy.dst_device), (2, 0x3000));
        // SAFETY: NULL is allowed.
        assert!(unsafe { copy_3d(std::ptr::null()) }.is_none());
    }
}
