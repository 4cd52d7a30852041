//! Copies and memsets (`cuMemcpy*`, `cuMemset*`): paced by the container's clock like kernel
//! launches when the device has a compute share, and timed the same way.
//!
//! A copy between two device-side places (device memory, arrays, a peer device) and every memset
//! run on the GPU and take its memory bandwidth from the neighbours' kernels, so their GPU time is
//! charged. A copy with a host side (`HtoD`, `DtoH`, `HtoA`, `AtoH`, or a unified-addressing copy
//! whose source or destination the driver says is host memory) runs on a copy engine beside the
//! neighbours' kernels and is not charged (docs/compute-limit.md, "Copies and memsets", has the
//! measurement behind that): the explicit host copies are not hooked at all, and a unified copy
//! with a host side goes to the driver untouched.
//!
//! The work of a copy is known by its kind and size, which key its estimate as a kernel's function
//! and grid do. A synchronous copy is timed like an asynchronous one, by events around it on its
//! stream: what it waits for before it starts is the stream's earlier work, not its own.

use crate::compute::Launch;
use crate::driver::{self, sys::*};
use crate::hooks::launch::{self, DefaultStream};
use crate::runtime;

/// What a copy or memset puts on the GPU, when its time is charged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Work {
    kind: Kind,
    bytes: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Copy,
    Memset,
}

impl Work {
    /// Identifies the work for estimates: copies and memsets of one size take about the same time.
    fn key(self) -> usize {
        let tag: usize = match self.kind {
            Kind::Copy => 0x636f_7079,
            Kind::Memset => 0x6d65_6d73,
        };
        tag ^ (self.bytes as usize).rotate_left(29)
    }
}

/// A copy of `bytes` between two device-side places.
pub fn device(bytes: usize) -> Option<Work> {
    Some(Work { kind: Kind::Copy, bytes: bytes as u64 })
}

/// A memset of `elements` elements of `size` bytes.
pub fn memset(elements: usize, size: usize) -> Option<Work> {
    Some(Work { kind: Kind::Memset, bytes: elements.saturating_mul(size) as u64 })
}

/// A memset of a `width` × `height` block of `size`-byte elements.
pub fn memset_2d(width: usize, height: usize, size: usize) -> Option<Work> {
    memset(width.saturating_mul(height), size)
}

/// `cuMemcpy` and `cuMemcpyAsync`: both addresses are unified, and the driver says which are
/// device memory.
pub fn unified(dst: CUdeviceptr, src: CUdeviceptr, bytes: usize) -> Option<Work> {
    let cuda = driver::cuda();
    (cuda.is_device_memory(dst) && cuda.is_device_memory(src)).then_some(device(bytes)).flatten()
}

/// Whether one side of a 2D or 3D copy is on the device.
fn device_side(memory_type: std::ffi::c_uint, address: CUdeviceptr) -> bool {
    match memory_type {
        CU_MEMORYTYPE_DEVICE | CU_MEMORYTYPE_ARRAY => true,
        CU_MEMORYTYPE_UNIFIED => driver::cuda().is_device_memory(address),
        _ => false,
    }
}

/// A 2D copy (`CUDA_MEMCPY2D`).
///
/// # Safety
/// `copy` is NULL or points to a `CUDA_MEMCPY2D`, as the driver requires.
pub unsafe fn two_d(copy: *const CudaMemcpy2D) -> Option<Work> {
    // SAFETY: per the contract; NULL is the driver's to refuse.
    let copy = unsafe { copy.as_ref() }?;
    let on_device = device_side(copy.src_memory_type, copy.src_device)
        && device_side(copy.dst_memory_type, copy.dst_device);
    on_device.then_some(device(copy.width_in_bytes.saturating_mul(copy.height))).flatten()
}

/// A 3D copy (`CUDA_MEMCPY3D`, or `CUDA_MEMCPY3D_PEER`, which has the same layout).
///
/// # Safety
/// `copy` is NULL or points to one of those structures, as the driver requires.
pub unsafe fn three_d(copy: *const CudaMemcpy3D) -> Option<Work> {
    // SAFETY: per the contract; NULL is the driver's to refuse.
    let copy = unsafe { copy.as_ref() }?;
    let on_device = device_side(copy.src_memory_type, copy.src_device)
        && device_side(copy.dst_memory_type, copy.dst_device);
    let bytes = copy.width_in_bytes.saturating_mul(copy.height).saturating_mul(copy.depth);
    on_device.then_some(device(bytes)).flatten()
}

/// Runs a copy or memset: `call` receives the driver's entry point. With no compute share this is
/// one check and the call; `work` is only looked at when the device may be limited.
pub fn run<F: Copy>(
    entry: Option<F>,
    stream: CUstream,
    default: DefaultStream,
    work: impl FnOnce() -> Option<Work>,
    call: impl FnOnce(F) -> CUresult,
) -> CUresult {
    let Some(real) = entry else { return CUDA_ERROR_NOT_FOUND };
    let Ok(runtime) = runtime::get() else { return call(real) };
    // The process's memory is on the card while the copy is queued (brought back if it was out).
    let _inside = runtime.swap.enter(runtime);
    let Some(limiter) = runtime.compute.as_ref().filter(|limiter| limiter.any_share()) else {
        return call(real);
    };
    let Ok(Some(work)) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)) else {
        return call(real);
    };
    if work.bytes == 0 {
        return call(real);
    }
    let launch = Launch { stream: default.resolve(stream), key: work.key(), uses_sms: false };
    launch::paced(limiter, runtime, launch, real, call)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_and_memsets_of_one_size_are_different_work() {
        let copy = device(1 << 20).unwrap();
        let set = memset(1 << 18, 4).unwrap();
        assert_eq!(copy.bytes, set.bytes);
        assert_ne!(copy.key(), set.key());
        assert_ne!(copy.key(), device(2 << 20).unwrap().key());
        assert_eq!(memset_2d(1024, 3, 2).unwrap().bytes, 6144);
    }

    #[test]
    fn a_2d_copy_with_a_host_side_is_not_charged() {
        // SAFETY: all-zero is a valid CUDA_MEMCPY2D (null pointers, zero sizes).
        let mut copy: CudaMemcpy2D = unsafe { std::mem::zeroed() };
        copy.src_memory_type = CU_MEMORYTYPE_DEVICE;
        copy.dst_memory_type = CU_MEMORYTYPE_ARRAY;
        copy.width_in_bytes = 256;
        copy.height = 4;
        // SAFETY: a valid structure.
        assert_eq!(unsafe { two_d(&copy) }.map(|work| work.bytes), Some(1024));
        copy.dst_memory_type = CU_MEMORYTYPE_HOST;
        // SAFETY: as above.
        assert_eq!(unsafe { two_d(&copy) }, None);
        // SAFETY: NULL is allowed.
        assert_eq!(unsafe { two_d(std::ptr::null()) }, None);
    }
}
