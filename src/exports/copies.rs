//! The `cuMemcpy*` and `cuMemset*` shims: each passes its arguments to the driver's function of
//! the same name, through the compute limiter when the device has a share (`hooks::copies`).
//!
//! Copies with a host side (`HtoD`, `DtoH`, `HtoA`, `AtoH`) are not charged: their shims exist for
//! swapping alone ([`host_hooks`]: a copy waits while its process's memory is off the card), and
//! are handed out only where overcommit may apply. The rest are handed out by `dlsym` and
//! `cuGetProcAddress` when some device has a compute share or overcommit may apply; otherwise the
//! application gets the driver's own functions. Each shim resolves the
//! driver's function of its own exact name once, so every variant (`_v2`, `_ptds`, `_ptsz`) goes
//! to its own twin.

use std::ffi::{CStr, c_void};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::Hook;
use crate::driver::{self, sys::*};
use crate::hooks::copies::{self, Work, device, memset, memset_2d, unified};
use crate::hooks::launch::DefaultStream;

/// The driver's function of one name, resolved on first use: 0 not yet, 1 missing, else its
/// address.
pub(super) struct RealEntry(AtomicUsize);

impl RealEntry {
    pub(super) const fn new() -> RealEntry {
        RealEntry(AtomicUsize::new(0))
    }

    /// `name` is the function's name with its terminating NUL, read only on the first call.
    pub(super) fn get(&self, name: &'static str) -> Option<usize> {
        let address = match self.0.load(Ordering::Acquire) {
            0 => {
                let symbol = CStr::from_bytes_with_nul(name.as_bytes()).ok();
                let found = symbol.and_then(driver::cuda_symbol).map_or(1, |f| f as usize);
                self.0.store(found, Ordering::Release);
                found
            }
            known => known,
        };
        (address != 1).then_some(address)
    }
}

/// A 2D copy's work, for the shims alone: their caller's pointer is valid under the driver's
/// contract for the call it came with.
fn two_d(copy: *const CudaMemcpy2D) -> Option<Work> {
    // SAFETY: only the shims call this, with their caller's pointer (see above).
    unsafe { copies::two_d(copy) }
}

/// A 3D copy's work (`CUDA_MEMCPY3D` or `_PEER`), for the shims alone, as [`two_d`].
fn three_d(copy: *const CudaMemcpy3D) -> Option<Work> {
    // SAFETY: only the shims call this, with their caller's pointer.
    unsafe { copies::three_d(copy) }
}

/// Defines one shim per entry and a function listing their hooks. An entry reads
/// `name(args) on STREAM, DEFAULT => WORK;`: the stream its work queues on, what a NULL stream
/// means to it, and the `Work` it puts on the GPU (`None`: not charged).
macro_rules! copy_entries {
    (fn $list:ident; $($name:ident($($arg:ident: $ty:ty),*) on $stream:expr, $default:ident => $work:expr;)*) => {
        $(
            #[doc = concat!("Called by C with `", stringify!($name), "`'s contract; every argument goes to the driver unchanged.")]
            #[unsafe(no_mangle)]
            pub unsafe extern "C" fn $name($($arg: $ty),*) -> CUresult {
                type Real = unsafe extern "C" fn($($ty),*) -> CUresult;
                static REAL: RealEntry = RealEntry::new();
                let real = REAL.get(concat!(stringify!($name), "\0"));
                // SAFETY: the driver's function of this exact name has this signature (cuda.h).
                let real = real.map(|address| unsafe { std::mem::transmute::<usize, Real>(address) });
                // SAFETY: the caller's arguments, passed on unchanged under the same contract.
                copies::run(real, $stream, DefaultStream::$default, || $work, |real| unsafe { real($($arg),*) })
            }
        )*

        pub fn $list() -> Vec<Hook> {
            vec![$(hook!($name)),*]
        }
    };
}

copy_entries! {
    fn host_hooks;
    cuMemcpyHtoD_v2(dst: CUdeviceptr, src: *const c_void, n: usize) on null_mut(), Legacy => None;
    cuMemcpyHtoD_v2_ptds(dst: CUdeviceptr, src: *const c_void, n: usize) on null_mut(), PerThread => None;
    cuMemcpyDtoH_v2(dst: *mut c_void, src: CUdeviceptr, n: usize) on null_mut(), Legacy => None;
    cuMemcpyDtoH_v2_ptds(dst: *mut c_void, src: CUdeviceptr, n: usize) on null_mut(), PerThread => None;
    cuMemcpyHtoDAsync_v2(dst: CUdeviceptr, src: *const c_void, n: usize, s: CUstream) on s, Legacy => None;
    cuMemcpyHtoDAsync_v2_ptsz(dst: CUdeviceptr, src: *const c_void, n: usize, s: CUstream) on s, PerThread => None;
    cuMemcpyDtoHAsync_v2(dst: *mut c_void, src: CUdeviceptr, n: usize, s: CUstream) on s, Legacy => None;
    cuMemcpyDtoHAsync_v2_ptsz(dst: *mut c_void, src: CUdeviceptr, n: usize, s: CUstream) on s, PerThread => None;
}

copy_entries! {
    fn device_hooks;
    cuMemcpy(dst: CUdeviceptr, src: CUdeviceptr, n: usize) on null_mut(), Legacy => unified(dst, src, n);
    cuMemcpy_ptds(dst: CUdeviceptr, src: CUdeviceptr, n: usize) on null_mut(), PerThread => unified(dst, src, n);
    cuMemcpyAsync(dst: CUdeviceptr, src: CUdeviceptr, n: usize, s: CUstream) on s, Legacy => unified(dst, src, n);
    cuMemcpyAsync_ptsz(dst: CUdeviceptr, src: CUdeviceptr, n: usize, s: CUstream) on s, PerThread
        => unified(dst, src, n);
    cuMemcpyPeer(dst: CUdeviceptr, dc: CUcontext, src: CUdeviceptr, sc: CUcontext, n: usize)
        on null_mut(), Legacy => device(n);
    cuMemcpyPeer_ptds(dst: CUdeviceptr, dc: CUcontext, src: CUdeviceptr, sc: CUcontext, n: usize)
        on null_mut(), PerThread => device(n);
    cuMemcpyPeerAsync(dst: CUdeviceptr, dc: CUcontext, src: CUdeviceptr, sc: CUcontext, n: usize, s: CUstream)
        on s, Legacy => device(n);
    cuMemcpyPeerAsync_ptsz(dst: CUdeviceptr, dc: CUcontext, src: CUdeviceptr, sc: CUcontext, n: usize, s: CUstream)
        on s, PerThread => device(n);
    cuMemcpyDtoD_v2(dst: CUdeviceptr, src: CUdeviceptr, n: usize) on null_mut(), Legacy => device(n);
    cuMemcpyDtoD_v2_ptds(dst: CUdeviceptr, src: CUdeviceptr, n: usize) on null_mut(), PerThread => device(n);
    cuMemcpyDtoDAsync_v2(dst: CUdeviceptr, src: CUdeviceptr, n: usize, s: CUstream) on s, Legacy => device(n);
    cuMemcpyDtoDAsync_v2_ptsz(dst: CUdeviceptr, src: CUdeviceptr, n: usize, s: CUstream) on s, PerThread
        => device(n);
    cuMemcpyDtoA_v2(dst: CUarray, offset: usize, src: CUdeviceptr, n: usize) on null_mut(), Legacy => device(n);
    cuMemcpyDtoA_v2_ptds(dst: CUarray, offset: usize, src: CUdeviceptr, n: usize) on null_mut(), PerThread
        => device(n);
    cuMemcpyAtoD_v2(dst: CUdeviceptr, src: CUarray, offset: usize, n: usize) on null_mut(), Legacy => device(n);
    cuMemcpyAtoD_v2_ptds(dst: CUdeviceptr, src: CUarray, offset: usize, n: usize) on null_mut(), PerThread
        => device(n);
    cuMemcpyAtoA_v2(dst: CUarray, dst_offset: usize, src: CUarray, src_offset: usize, n: usize)
        on null_mut(), Legacy => device(n);
    cuMemcpyAtoA_v2_ptds(dst: CUarray, dst_offset: usize, src: CUarray, src_offset: usize, n: usize)
        on null_mut(), PerThread => device(n);
    cuMemcpy2D_v2(copy: *const CudaMemcpy2D) on null_mut(), Legacy => two_d(copy);
    cuMemcpy2D_v2_ptds(copy: *const CudaMemcpy2D) on null_mut(), PerThread => two_d(copy);
    cuMemcpy2DUnaligned_v2(copy: *const CudaMemcpy2D) on null_mut(), Legacy => two_d(copy);
    cuMemcpy2DUnaligned_v2_ptds(copy: *const CudaMemcpy2D) on null_mut(), PerThread
        => two_d(copy);
    cuMemcpy2DAsync_v2(copy: *const CudaMemcpy2D, s: CUstream) on s, Legacy => two_d(copy);
    cuMemcpy2DAsync_v2_ptsz(copy: *const CudaMemcpy2D, s: CUstream) on s, PerThread
        => two_d(copy);
    cuMemcpy3D_v2(copy: *const CudaMemcpy3D) on null_mut(), Legacy => three_d(copy);
    cuMemcpy3D_v2_ptds(copy: *const CudaMemcpy3D) on null_mut(), PerThread => three_d(copy);
    cuMemcpy3DAsync_v2(copy: *const CudaMemcpy3D, s: CUstream) on s, Legacy => three_d(copy);
    cuMemcpy3DAsync_v2_ptsz(copy: *const CudaMemcpy3D, s: CUstream) on s, PerThread
        => three_d(copy);
    cuMemcpy3DPeer(copy: *const CudaMemcpy3D) on null_mut(), Legacy => three_d(copy);
    cuMemcpy3DPeer_ptds(copy: *const CudaMemcpy3D) on null_mut(), PerThread => three_d(copy);
    cuMemcpy3DPeerAsync(copy: *const CudaMemcpy3D, s: CUstream) on s, Legacy => three_d(copy);
    cuMemcpy3DPeerAsync_ptsz(copy: *const CudaMemcpy3D, s: CUstream) on s, PerThread
        => three_d(copy);
    cuMemsetD8_v2(dst: CUdeviceptr, value: u8, n: usize) on null_mut(), Legacy => memset(n, 1);
    cuMemsetD8_v2_ptds(dst: CUdeviceptr, value: u8, n: usize) on null_mut(), PerThread => memset(n, 1);
    cuMemsetD16_v2(dst: CUdeviceptr, value: u16, n: usize) on null_mut(), Legacy => memset(n, 2);
    cuMemsetD16_v2_ptds(dst: CUdeviceptr, value: u16, n: usize) on null_mut(), PerThread => memset(n, 2);
    cuMemsetD32_v2(dst: CUdeviceptr, value: u32, n: usize) on null_mut(), Legacy => memset(n, 4);
    cuMemsetD32_v2_ptds(dst: CUdeviceptr, value: u32, n: usize) on null_mut(), PerThread => memset(n, 4);
    cuMemsetD8Async(dst: CUdeviceptr, value: u8, n: usize, s: CUstream) on s, Legacy => memset(n, 1);
    cuMemsetD8Async_ptsz(dst: CUdeviceptr, value: u8, n: usize, s: CUstream) on s, PerThread => memset(n, 1);
    cuMemsetD16Async(dst: CUdeviceptr, value: u16, n: usize, s: CUstream) on s, Legacy => memset(n, 2);
    cuMemsetD16Async_ptsz(dst: CUdeviceptr, value: u16, n: usize, s: CUstream) on s, PerThread => memset(n, 2);
    cuMemsetD32Async(dst: CUdeviceptr, value: u32, n: usize, s: CUstream) on s, Legacy => memset(n, 4);
    cuMemsetD32Async_ptsz(dst: CUdeviceptr, value: u32, n: usize, s: CUstream) on s, PerThread => memset(n, 4);
    cuMemsetD2D8_v2(dst: CUdeviceptr, pitch: usize, value: u8, w: usize, h: usize) on null_mut(), Legacy
        => memset_2d(w, h, 1);
    cuMemsetD2D8_v2_ptds(dst: CUdeviceptr, pitch: usize, value: u8, w: usize, h: usize) on null_mut(), PerThread
        => memset_2d(w, h, 1);
    cuMemsetD2D16_v2(dst: CUdeviceptr, pitch: usize, value: u16, w: usize, h: usize) on null_mut(), Legacy
        => memset_2d(w, h, 2);
    cuMemsetD2D16_v2_ptds(dst: CUdeviceptr, pitch: usize, value: u16, w: usize, h: usize) on null_mut(), PerThread
        => memset_2d(w, h, 2);
    cuMemsetD2D32_v2(dst: CUdeviceptr, pitch: usize, value: u32, w: usize, h: usize) on null_mut(), Legacy
        => memset_2d(w, h, 4);
    cuMemsetD2D32_v2_ptds(dst: CUdeviceptr, pitch: usize, value: u32, w: usize, h: usize) on null_mut(), PerThread
        => memset_2d(w, h, 4);
    cuMemsetD2D8Async(dst: CUdeviceptr, pitch: usize, value: u8, w: usize, h: usize, s: CUstream) on s, Legacy
        => memset_2d(w, h, 1);
    cuMemsetD2D8Async_ptsz(dst: CUdeviceptr, pitch: usize, value: u8, w: usize, h: usize, s: CUstream)
        on s, PerThread => memset_2d(w, h, 1);
    cuMemsetD2D16Async(dst: CUdeviceptr, pitch: usize, value: u16, w: usize, h: usize, s: CUstream) on s, Legacy
        => memset_2d(w, h, 2);
    cuMemsetD2D16Async_ptsz(dst: CUdeviceptr, pitch: usize, value: u16, w: usize, h: usize, s: CUstream)
        on s, PerThread => memset_2d(w, h, 2);
    cuMemsetD2D32Async(dst: CUdeviceptr, pitch: usize, value: u32, w: usize, h: usize, s: CUstream) on s, Legacy
        => memset_2d(w, h, 4);
    cuMemsetD2D32Async_ptsz(dst: CUdeviceptr, pitch: usize, value: u32, w: usize, h: usize, s: CUstream)
        on s, PerThread => memset_2d(w, h, 4);
}
