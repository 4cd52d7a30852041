//! Copies and memsets that run on the device: with a compute share they take GPU time like a
//! kernel, so they are paced by the same clock ([`crate::compute`]). Copies from or to the host
//! are left alone: the copy engines move them beside the neighbours' kernels (the CUDA side's
//! measurement, docs/compute-limit.md).
//!
//! Where a copy runs is known from its kind: device to device (and peer copies, and an array or
//! symbol end) is on the device; host to or from anything is not. A `hipMemcpyDefault` copy (the
//! runtime decides from the addresses) is on the device when `hipPointerGetAttributes` says both
//! ends are device or managed memory (a symbol or an array is device memory, never asked); that
//! query is made only when the device has a share, so a process without one pays nothing. A copy
//! described driver-style (`hip_Memcpy2D`, `HIP_MEMCPY3D`) names each end's memory type. Every
//! memset runs on the device.

// Pointers, arrays and streams are the application's, passed on, never dereferenced.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

use std::ffi::{c_int, c_void};
use std::ptr::null_mut;

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

/// A copy with one end on the device (an array, or a symbol: a `__device__` variable) and
/// `address` at the other.
fn with_device_end(runtime: &Runtime, kind: c_int, address: *const c_void) -> bool {
    on_device(kind, || true, || is_device_memory(runtime, address))
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

/// Whether a copy described driver-style runs on the device: each end's memory type says, and
/// for unified or managed memory the runtime is asked about its address. `None` (a NULL
/// descriptor) is the runtime's to refuse.
fn typed_on_device(runtime: &Runtime, copy: Option<TypedEnds>) -> bool {
    let Some(copy) = copy else { return false };
    let types = memory_types(runtime.version);
    let end = |kind: i32, address: usize| {
        kind == types.device
            || kind == types.array
            || ((kind == types.unified || kind == types.managed)
                && is_device_memory(runtime, address as *const c_void))
    };
    end(copy.src_type, copy.src_device) && end(copy.dst_type, copy.dst_device)
}

/// Declares one hook a row: `hook(C arguments) => runtime.real.hipEntryPoint, stream: S,
/// on_device: D;` becomes `pub unsafe fn hook(runtime: &Runtime, C arguments…)`, which forwards
/// the arguments unchanged to the runtime's entry point, paced on stream `S` when `D` says the
/// work runs on the device ([`compute::launch_if`]; `D` is asked only when the device has a
/// share). `runtime` and the arguments are in scope in `S` and `D`.
macro_rules! paced_hooks {
    ($(
        fn $hook:ident($($arg:ident: $ty:ty),* $(,)?) => $runtime:ident.real.$entry:ident,
            stream: $stream:expr, on_device: $on_device:expr;
    )*) => { $(
        #[doc = concat!("`", stringify!($entry), "`, paced on `", stringify!($stream),
            "` when `", stringify!($on_device), "`.")]
        ///
        /// # Safety
        /// The application's arguments, per the runtime's contract for this entry point.
        #[allow(clippy::too_many_arguments)]
        pub unsafe fn $hook($runtime: &Runtime, $($arg: $ty),*) -> Result<(), HookError> {
            // SAFETY: the application's arguments, forwarded unchanged to the entry point whose
            // contract this function's caller vouches for.
            let call = || unsafe { $runtime.real.$entry($($arg),*) };
            compute::launch_if($runtime, $stream, || $on_device, call)
        }
    )* };
}

paced_hooks! {
    // Copies between two addresses: on the device when the kind (or, for `hipMemcpyDefault`,
    // both addresses) says so.
    fn memcpy(dst: *mut c_void, src: *const c_void, size: usize, kind: c_int)
        => runtime.real.hipMemcpy, stream: null_mut(), on_device: between(runtime, kind, dst, src);
    fn memcpy_spt(dst: *mut c_void, src: *const c_void, size: usize, kind: c_int)
        => runtime.real.hipMemcpy_spt,
        stream: per_thread(null_mut()), on_device: between(runtime, kind, dst, src);
    fn memcpy_async(dst: *mut c_void, src: *const c_void, size: usize, kind: c_int, stream: Opaque)
        => runtime.real.hipMemcpyAsync, stream: stream, on_device: between(runtime, kind, dst, src);
    fn memcpy_async_spt(dst: *mut c_void, src: *const c_void, size: usize, kind: c_int, stream: Opaque)
        => runtime.real.hipMemcpyAsync_spt,
        stream: per_thread(stream), on_device: between(runtime, kind, dst, src);
    // A synchronous copy on `stream`.
    fn memcpy_with_stream(dst: *mut c_void, src: *const c_void, size: usize, kind: c_int, stream: Opaque)
        => runtime.real.hipMemcpyWithStream, stream: stream, on_device: between(runtime, kind, dst, src);
    fn memcpy_2d(
        dst: *mut c_void, dpitch: usize, src: *const c_void, spitch: usize, width: usize, height: usize,
        kind: c_int,
    ) => runtime.real.hipMemcpy2D, stream: null_mut(), on_device: between(runtime, kind, dst, src);
    fn memcpy_2d_async(
        dst: *mut c_void, dpitch: usize, src: *const c_void, spitch: usize, width: usize, height: usize,
        kind: c_int, stream: Opaque,
    ) => runtime.real.hipMemcpy2DAsync, stream: stream, on_device: between(runtime, kind, dst, src);
    fn memcpy_2d_spt(
        dst: *mut c_void, dpitch: usize, src: *const c_void, spitch: usize, width: usize, height: usize,
        kind: c_int,
    ) => runtime.real.hipMemcpy2D_spt,
        stream: per_thread(null_mut()), on_device: between(runtime, kind, dst, src);

    // Copies with an array at one end.
    fn memcpy_2d_to_array(
        dst: Opaque, w_offset: usize, h_offset: usize, src: *const c_void, spitch: usize, width: usize,
        height: usize, kind: c_int,
    ) => runtime.real.hipMemcpy2DToArray, stream: null_mut(), on_device: with_device_end(runtime, kind, src);
    fn memcpy_2d_to_array_async(
        dst: Opaque, w_offset: usize, h_offset: usize, src: *const c_void, spitch: usize, width: usize,
        height: usize, kind: c_int, stream: Opaque,
    ) => runtime.real.hipMemcpy2DToArrayAsync, stream: stream, on_device: with_device_end(runtime, kind, src);
    fn memcpy_2d_to_array_spt(
        dst: Opaque, w_offset: usize, h_offset: usize, src: *const c_void, spitch: usize, width: usize,
        height: usize, kind: c_int,
    ) => runtime.real.hipMemcpy2DToArray_spt,
        stream: per_thread(null_mut()), on_device: with_device_end(runtime, kind, src);
    fn memcpy_2d_from_array(
        dst: *mut c_void, dpitch: usize, src: Opaque, w_offset: usize, h_offset: usize, width: usize,
        height: usize, kind: c_int,
    ) => runtime.real.hipMemcpy2DFromArray, stream: null_mut(), on_device: with_device_end(runtime, kind, dst);
    fn memcpy_2d_from_array_async(
        dst: *mut c_void, dpitch: usize, src: Opaque, w_offset: usize, h_offset: usize, width: usize,
        height: usize, kind: c_int, stream: Opaque,
    ) => runtime.real.hipMemcpy2DFromArrayAsync,
        stream: stream, on_device: with_device_end(runtime, kind, dst);
    fn memcpy_2d_from_array_spt(
        dst: *mut c_void, dpitch: usize, src: Opaque, w_offset: usize, h_offset: usize, width: usize,
        height: usize, kind: c_int,
    ) => runtime.real.hipMemcpy2DFromArray_spt,
        stream: per_thread(null_mut()), on_device: with_device_end(runtime, kind, dst);

    // Copies described by a struct, which the runtime's contract makes `p` (NULL or the
    // application's `hipMemcpy3DParms` / `hip_Memcpy2D` / `HIP_MEMCPY3D`).
    fn memcpy_3d(p: *const u8) => runtime.real.hipMemcpy3D, stream: null_mut(),
        // SAFETY: `p` is NULL or a `hipMemcpy3DParms`, per the hook's contract.
        on_device: unsafe { copy_3d_on_device(runtime, p) };
    fn memcpy_3d_async(p: *const u8, stream: Opaque) => runtime.real.hipMemcpy3DAsync, stream: stream,
        // SAFETY: as for `memcpy_3d`.
        on_device: unsafe { copy_3d_on_device(runtime, p) };
    fn memcpy_3d_spt(p: *const u8) => runtime.real.hipMemcpy3D_spt, stream: per_thread(null_mut()),
        // SAFETY: as for `memcpy_3d`.
        on_device: unsafe { copy_3d_on_device(runtime, p) };
    fn memcpy_param_2d(p: *const u8) => runtime.real.hipMemcpyParam2D, stream: null_mut(),
        // SAFETY: `p` is NULL or a `hip_Memcpy2D`, per the hook's contract.
        on_device: typed_on_device(runtime, unsafe { param_2d(p) });
    fn memcpy_param_2d_async(p: *const u8, stream: Opaque) => runtime.real.hipMemcpyParam2DAsync,
        stream: stream,
        // SAFETY: as for `memcpy_param_2d`.
        on_device: typed_on_device(runtime, unsafe { param_2d(p) });
    fn drv_memcpy_3d(p: *const u8) => runtime.real.hipDrvMemcpy3D, stream: null_mut(),
        // SAFETY: `p` is NULL or a `HIP_MEMCPY3D` of the runtime's release, per the hook's contract.
        on_device: typed_on_device(runtime, unsafe { drv_copy_3d(p, runtime.version) });
    fn drv_memcpy_3d_async(p: *const u8, stream: Opaque) => runtime.real.hipDrvMemcpy3DAsync,
        stream: stream,
        // SAFETY: as for `drv_memcpy_3d`.
        on_device: typed_on_device(runtime, unsafe { drv_copy_3d(p, runtime.version) });

    // Copies to and from a symbol (device memory) at `offset`: on the device by the kind, or for
    // `hipMemcpyDefault` by where the other end is. ROCm 5.2 exports the synchronous `_spt`
    // forms, 6.x also the asynchronous ones.
    fn memcpy_to_symbol(symbol: *const c_void, src: *const c_void, size: usize, offset: usize, kind: c_int)
        => runtime.real.hipMemcpyToSymbol, stream: null_mut(), on_device: with_device_end(runtime, kind, src);
    fn memcpy_to_symbol_async(
        symbol: *const c_void, src: *const c_void, size: usize, offset: usize, kind: c_int, stream: Opaque,
    ) => runtime.real.hipMemcpyToSymbolAsync, stream: stream, on_device: with_device_end(runtime, kind, src);
    fn memcpy_to_symbol_spt(symbol: *const c_void, src: *const c_void, size: usize, offset: usize, kind: c_int)
        => runtime.real.hipMemcpyToSymbol_spt,
        stream: per_thread(null_mut()), on_device: with_device_end(runtime, kind, src);
    fn memcpy_to_symbol_async_spt(
        symbol: *const c_void, src: *const c_void, size: usize, offset: usize, kind: c_int, stream: Opaque,
    ) => runtime.real.hipMemcpyToSymbolAsync_spt,
        stream: per_thread(stream), on_device: with_device_end(runtime, kind, src);
    fn memcpy_from_symbol(dst: *mut c_void, symbol: *const c_void, size: usize, offset: usize, kind: c_int)
        => runtime.real.hipMemcpyFromSymbol, stream: null_mut(), on_device: with_device_end(runtime, kind, dst);
    fn memcpy_from_symbol_async(
        dst: *mut c_void, symbol: *const c_void, size: usize, offset: usize, kind: c_int, stream: Opaque,
    ) => runtime.real.hipMemcpyFromSymbolAsync, stream: stream, on_device: with_device_end(runtime, kind, dst);
    fn memcpy_from_symbol_spt(dst: *mut c_void, symbol: *const c_void, size: usize, offset: usize, kind: c_int)
        => runtime.real.hipMemcpyFromSymbol_spt,
        stream: per_thread(null_mut()), on_device: with_device_end(runtime, kind, dst);
    fn memcpy_from_symbol_async_spt(
        dst: *mut c_void, symbol: *const c_void, size: usize, offset: usize, kind: c_int, stream: Opaque,
    ) => runtime.real.hipMemcpyFromSymbolAsync_spt,
        stream: per_thread(stream), on_device: with_device_end(runtime, kind, dst);

    // Device to device, and peer copies (paced on the current device): always on the device.
    fn memcpy_peer(dst: *mut c_void, dst_device: c_int, src: *const c_void, src_device: c_int, size: usize)
        => runtime.real.hipMemcpyPeer, stream: null_mut(), on_device: true;
    fn memcpy_peer_async(
        dst: *mut c_void, dst_device: c_int, src: *const c_void, src_device: c_int, size: usize,
        stream: Opaque,
    ) => runtime.real.hipMemcpyPeerAsync, stream: stream, on_device: true;
    fn memcpy_dtod(dst: *mut c_void, src: *mut c_void, size: usize)
        => runtime.real.hipMemcpyDtoD, stream: null_mut(), on_device: true;
    fn memcpy_dtod_async(dst: *mut c_void, src: *mut c_void, size: usize, stream: Opaque)
        => runtime.real.hipMemcpyDtoDAsync, stream: stream, on_device: true;

    // Memsets: always on the device.
    fn memset(dst: *mut c_void, value: c_int, size: usize)
        => runtime.real.hipMemset, stream: null_mut(), on_device: true;
    fn memset_async(dst: *mut c_void, value: c_int, size: usize, stream: Opaque)
        => runtime.real.hipMemsetAsync, stream: stream, on_device: true;
    fn memset_spt(dst: *mut c_void, value: c_int, size: usize)
        => runtime.real.hipMemset_spt, stream: per_thread(null_mut()), on_device: true;
    fn memset_d8(dst: *mut c_void, value: u8, count: usize)
        => runtime.real.hipMemsetD8, stream: null_mut(), on_device: true;
    fn memset_d8_async(dst: *mut c_void, value: u8, count: usize, stream: Opaque)
        => runtime.real.hipMemsetD8Async, stream: stream, on_device: true;
    fn memset_d16(dst: *mut c_void, value: u16, count: usize)
        => runtime.real.hipMemsetD16, stream: null_mut(), on_device: true;
    fn memset_d16_async(dst: *mut c_void, value: u16, count: usize, stream: Opaque)
        => runtime.real.hipMemsetD16Async, stream: stream, on_device: true;
    fn memset_d32(dst: *mut c_void, value: c_int, count: usize)
        => runtime.real.hipMemsetD32, stream: null_mut(), on_device: true;
    fn memset_d32_async(dst: *mut c_void, value: c_int, count: usize, stream: Opaque)
        => runtime.real.hipMemsetD32Async, stream: stream, on_device: true;
    fn memset_2d(dst: *mut c_void, pitch: usize, value: c_int, width: usize, height: usize)
        => runtime.real.hipMemset2D, stream: null_mut(), on_device: true;
    fn memset_2d_async(
        dst: *mut c_void, pitch: usize, value: c_int, width: usize, height: usize, stream: Opaque,
    ) => runtime.real.hipMemset2DAsync, stream: stream, on_device: true;
    fn memset_2d_spt(dst: *mut c_void, pitch: usize, value: c_int, width: usize, height: usize)
        => runtime.real.hipMemset2D_spt, stream: per_thread(null_mut()), on_device: true;
    fn memset_3d(pitched: PitchedPtr, value: c_int, extent: Extent)
        => runtime.real.hipMemset3D, stream: null_mut(), on_device: true;
    fn memset_3d_async(pitched: PitchedPtr, value: c_int, extent: Extent, stream: Opaque)
        => runtime.real.hipMemset3DAsync, stream: stream, on_device: true;
    fn memset_3d_spt(pitched: PitchedPtr, value: c_int, extent: Extent)
        => runtime.real.hipMemset3D_spt, stream: per_thread(null_mut()), on_device: true;
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

    #[test]
    fn a_drv_3d_descriptor_is_read_in_the_layout_of_the_runtimes_release() {
        // The same copy, device (5.x: 1) to array (5.x: 2), in ROCm 5.x's `unsigned int` layout.
        let mut r5 = [0u8; 128];
        r5[16..20].copy_from_slice(&1i32.to_ne_bytes());
        r5[32..40].copy_from_slice(&0x1000usize.to_ne_bytes());
        r5[72..76].copy_from_slice(&2i32.to_ne_bytes());
        r5[88..96].copy_from_slice(&0x2000usize.to_ne_bytes());
        let ends = TypedEnds { src_type: 1, src_device: 0x1000, dst_type: 2, dst_device: 0x2000 };
        // SAFETY: a 128-byte 5.x HIP_MEMCPY3D.
        assert_eq!(unsafe { drv_copy_3d(r5.as_ptr(), 50_200_000) }, Some(ends));
        // 6.x (`size_t` fields): device 2 to array 10, every field after `srcXInBytes` moved.
        let mut r6 = [0u8; 184];
        r6[32..36].copy_from_slice(&2i32.to_ne_bytes());
        r6[48..56].copy_from_slice(&0x1000usize.to_ne_bytes());
        r6[112..116].copy_from_slice(&10i32.to_ne_bytes());
        r6[128..136].copy_from_slice(&0x2000usize.to_ne_bytes());
        let ends = TypedEnds { src_type: 2, src_device: 0x1000, dst_type: 10, dst_device: 0x2000 };
        // SAFETY: a 184-byte 6.x HIP_MEMCPY3D.
        assert_eq!(unsafe { drv_copy_3d(r6.as_ptr(), 60_200_000) }, Some(ends));
        // SAFETY: NULL is allowed.
        assert!(unsafe { drv_copy_3d(std::ptr::null(), 60_200_000) }.is_none());
    }
}
