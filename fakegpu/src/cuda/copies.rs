//! Copies and memsets: the `cuMemcpy*` and `cuMemset*` families, every variant a real driver
//! exports (`_v2`, and `_ptds`/`_ptsz` for the per-thread default stream).
//!
//! Only VMM memory has contents (`memory::contents`): the 1D copies and the memsets move its bytes at
//! the call, `Async` or not, and are refused when their device range touches reserved addresses that
//! nothing maps. Everywhere else device memory is addresses only and nothing moves. Work between two
//! device-side places (device memory, arrays, a peer device) and every memset queues
//! `bytes × FAKEGPU_COPY_NS_PER_MIB / MiB` ns on its stream, like a kernel; a copy with a host side
//! takes no simulated time (it runs on a copy engine, beside kernels). Sizes are not checked
//! against linear allocations, so a test can make one call take as long as it likes. A synchronous
//! call (no `Async` in its name) returns once its stream is done. The name decides the rest: a
//! `_ptds`/`_ptsz` call's NULL stream is the per-thread default stream.

#![allow(clippy::too_many_arguments)]

use std::ffi::{c_uint, c_void};
use std::mem::{offset_of, size_of};
use std::ptr::null_mut;

use super::{
    CUcontext, CUdeviceptr, CUresult, CUstream, CuError, answer, as_handle, current, initialized, non_null,
};
use crate::state::{Fake, Refusal};
use crate::stats;
use crate::timeline::Copy;

pub type CUarray = *mut c_void;

const MIB: u128 = 1 << 20;

/// `CUmemorytype`.
const MEMORYTYPE_HOST: c_uint = 1;
const MEMORYTYPE_DEVICE: c_uint = 2;
const MEMORYTYPE_ARRAY: c_uint = 3;
const MEMORYTYPE_UNIFIED: c_uint = 4;

/// `CU_POINTER_ATTRIBUTE_MEMORY_TYPE`, `_RANGE_START_ADDR` and `_RANGE_SIZE`: the attributes
/// `cuPointerGetAttribute` answers.
const POINTER_ATTRIBUTE_MEMORY_TYPE: i32 = 2;
const POINTER_ATTRIBUTE_RANGE_START_ADDR: i32 = 11;
const POINTER_ATTRIBUTE_RANGE_SIZE: i32 = 12;

/// `CUDA_MEMCPY2D`, as far as the fake reads it (x86-64 and AArch64 layout).
#[repr(C)]
pub struct Copy2D {
    src_x_y: [usize; 2],
    src_memory_type: c_uint,
    src_host: *const c_void,
    src_device: CUdeviceptr,
    src_array_pitch: [usize; 2],
    dst_x_y: [usize; 2],
    dst_memory_type: c_uint,
    dst_host: *mut c_void,
    dst_device: CUdeviceptr,
    dst_array_pitch: [usize; 2],
    width_in_bytes: usize,
    height: usize,
}

const _: () = assert!(size_of::<Copy2D>() == 128);
const _: () = assert!(offset_of!(Copy2D, src_memory_type) == 16);
const _: () = assert!(offset_of!(Copy2D, dst_memory_type) == 72);
const _: () = assert!(offset_of!(Copy2D, dst_device) == 88);
const _: () = assert!(offset_of!(Copy2D, width_in_bytes) == 112);

/// `CUDA_MEMCPY3D`, and `CUDA_MEMCPY3D_PEER`, whose contexts sit where the reserved fields are.
#[repr(C)]
pub struct Copy3D {
    src_x_y_z_lod: [usize; 4],
    src_memory_type: c_uint,
    src_host: *const c_void,
    src_device: CUdeviceptr,
    src_array_context_pitch_height: [usize; 4],
    dst_x_y_z_lod: [usize; 4],
    dst_memory_type: c_uint,
    dst_host: *mut c_void,
    dst_device: CUdeviceptr,
    dst_array_context_pitch_height: [usize; 4],
    width_in_bytes: usize,
    height: usize,
    depth: usize,
}

const _: () = assert!(size_of::<Copy3D>() == 200);
const _: () = assert!(offset_of!(Copy3D, src_memory_type) == 32);
const _: () = assert!(offset_of!(Copy3D, dst_memory_type) == 120);
const _: () = assert!(offset_of!(Copy3D, dst_device) == 136);
const _: () = assert!(offset_of!(Copy3D, width_in_bytes) == 176);
const _: () = assert!(offset_of!(Copy3D, depth) == 192);

/// Where a copy runs, as far as simulated time goes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Sides {
    /// Both sides on the GPU (or a memset): takes GPU time.
    Device,
    /// One side in host memory: takes none.
    Host,
}

/// One copy or memset call: `name` (the export called), its destination and size, its stream;
/// `contents` moves its bytes (VMM memory only) once the call is known good, and may refuse it.
fn queue(
    name: &'static str,
    dst: u64,
    bytes: u64,
    stream: CUstream,
    sides: Sides,
    contents: impl FnOnce(&Fake) -> Result<(), Refusal>,
) -> Result<(), CuError> {
    let fake = initialized()?;
    current(fake)?;
    if dst == 0 {
        return Err(CuError::InvalidValue);
    }
    let per_thread = name.ends_with("_ptds") || name.ends_with("_ptsz");
    let resolved = fake.resolve_stream(as_handle(stream), per_thread)?;
    contents(fake)?;
    let duration = match sides {
        Sides::Device => {
            (u128::from(bytes) * u128::from(fake.copy_ns_per_mib) / MIB).min(u128::from(u64::MAX)) as u64
        }
        Sides::Host => 0,
    };
    fake.copy(Copy { name, bytes, dst, stream: as_handle(stream) }, resolved, duration);
    if !name.contains("Async") {
        fake.wait_for_stream(resolved);
    }
    Ok(())
}

/// A copy between two device-side places whose bytes do not move: to, from or between arrays.
/// `checked` is its side in device memory, if any, which must still be mapped if it is VMM memory.
fn device(
    name: &'static str,
    dst: u64,
    bytes: usize,
    stream: CUstream,
    checked: Option<CUdeviceptr>,
) -> Result<(), CuError> {
    let bytes = bytes as u64;
    queue(name, dst, bytes, stream, Sides::Device, |fake| match checked {
        Some(address) => fake.check_device(address, bytes),
        None => Ok(()),
    })
}

/// A copy between an array and the host: nothing moves.
fn host(name: &'static str, dst: u64, bytes: usize, stream: CUstream) -> Result<(), CuError> {
    queue(name, dst, bytes as u64, stream, Sides::Host, |_| Ok(()))
}

/// A device-to-device copy (`cuMemcpyDtoD`, `cuMemcpyPeer`): bytes move between VMM memory.
fn device_to_device(
    name: &'static str,
    dst: CUdeviceptr,
    src: CUdeviceptr,
    bytes: usize,
    stream: CUstream,
) -> Result<(), CuError> {
    let bytes = bytes as u64;
    queue(name, dst, bytes, stream, Sides::Device, |fake| fake.copy_device(dst, src, bytes))
}

/// The caller's host memory at `pointer`, `bytes` long; `None` for NULL.
///
/// # Safety
/// `pointer` is NULL or valid for reading `bytes` bytes for `'a`.
unsafe fn host_bytes<'a>(pointer: *const c_void, bytes: usize) -> Option<&'a [u8]> {
    if pointer.is_null() {
        return None;
    }
    // SAFETY: not NULL, and valid for reading `bytes` bytes by this function's contract.
    Some(unsafe { std::slice::from_raw_parts(pointer.cast::<u8>(), bytes) })
}

/// The caller's host memory at `pointer`, `bytes` long, to be written; `None` for NULL.
///
/// # Safety
/// `pointer` is NULL or valid for writing `bytes` bytes for `'a`, and nothing else refers to them.
unsafe fn host_bytes_mut<'a>(pointer: *mut c_void, bytes: usize) -> Option<&'a mut [u8]> {
    if pointer.is_null() {
        return None;
    }
    // SAFETY: not NULL, valid for writing `bytes` bytes and unaliased by this function's contract.
    Some(unsafe { std::slice::from_raw_parts_mut(pointer.cast::<u8>(), bytes) })
}

/// A host-to-device copy: bytes move into VMM memory.
///
/// # Safety
/// `src` is NULL or valid for reading `bytes` bytes, per the driver's contract for the copy, when
/// `dst` is device memory of that size.
unsafe fn host_to_device(
    name: &'static str,
    dst: CUdeviceptr,
    src: *const c_void,
    bytes: usize,
    stream: CUstream,
) -> Result<(), CuError> {
    queue(name, dst, bytes as u64, stream, Sides::Host, |fake| {
        // SAFETY: per this function's contract; asked for only when `dst` is mapped throughout.
        fake.write_device(dst, bytes as u64, || unsafe { host_bytes(src, bytes) })
    })
}

/// A device-to-host copy: bytes move out of VMM memory.
///
/// # Safety
/// `dst` is NULL or valid for writing `bytes` bytes, per the driver's contract for the copy, when
/// `src` is device memory of that size.
unsafe fn device_to_host(
    name: &'static str,
    dst: *mut c_void,
    src: CUdeviceptr,
    bytes: usize,
    stream: CUstream,
) -> Result<(), CuError> {
    queue(name, at(dst), bytes as u64, stream, Sides::Host, |fake| {
        // SAFETY: per this function's contract; asked for only when `src` is mapped throughout.
        fake.read_device(src, bytes as u64, || unsafe { host_bytes_mut(dst, bytes) })
    })
}

/// What a unified address is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Place {
    /// VMM address space, mapped or not.
    Vmm,
    /// Other device memory the fake handed out.
    Device,
    /// Anything else is taken for the caller's host memory.
    Host,
}

/// `cuMemcpy`/`cuMemcpyAsync`: unified addresses, on the device when the fake allocated both; bytes
/// move between VMM memory and VMM memory or the host.
///
/// # Safety
/// A side that is not the fake's device memory is host memory valid for `bytes` bytes (for writing,
/// the destination), per the driver's contract for the copy.
unsafe fn unified(
    name: &'static str,
    dst: u64,
    src: u64,
    bytes: usize,
    stream: CUstream,
) -> Result<(), CuError> {
    let fake = initialized()?;
    let place = |address| {
        if fake.is_vmm_address(address) {
            Place::Vmm
        } else if fake.address_range(address).is_ok() {
            Place::Device
        } else {
            Place::Host
        }
    };
    let (to, from) = (place(dst), place(src));
    let sides = if to != Place::Host && from != Place::Host { Sides::Device } else { Sides::Host };
    // Addresses that came through the C ABI as integers: pointers to the caller's memory.
    let host_dst = std::ptr::with_exposed_provenance_mut(dst as usize);
    let host_src = std::ptr::with_exposed_provenance(src as usize);
    queue(name, dst, bytes as u64, stream, sides, |fake| match (to, from) {
        (Place::Host, Place::Host) => Ok(()),
        (Place::Vmm, Place::Host) => fake.write_device(dst, bytes as u64, || {
            // SAFETY: per this function's contract: `src` is host memory.
            unsafe { host_bytes(host_src, bytes) }
        }),
        (Place::Host, Place::Vmm) => fake.read_device(src, bytes as u64, || {
            // SAFETY: per this function's contract: `dst` is host memory.
            unsafe { host_bytes_mut(host_dst, bytes) }
        }),
        _ => fake.copy_device(dst, src, bytes as u64),
    })
}

/// A memset of `elements` copies of `element` (1, 2 or 4 bytes).
fn memset(
    name: &'static str,
    dst: u64,
    elements: usize,
    element: &[u8],
    stream: CUstream,
) -> Result<(), CuError> {
    let bytes = (elements as u64).saturating_mul(element.len() as u64);
    queue(name, dst, bytes, stream, Sides::Device, |fake| fake.fill_device(dst, bytes, element))
}

/// A 2D memset: `height` rows of `width` copies of `element`, `pitch` bytes apart.
fn memset_2d(
    name: &'static str,
    dst: u64,
    pitch: usize,
    width: usize,
    height: usize,
    element: &[u8],
    stream: CUstream,
) -> Result<(), CuError> {
    let size = element.len() as u64;
    let bytes = (width as u64).saturating_mul(height as u64).saturating_mul(size);
    let row = (width as u64).saturating_mul(size);
    queue(name, dst, bytes, stream, Sides::Device, |fake| {
        fake.fill_device_2d(dst, pitch as u64, row, height as u64, element)
    })
}

/// Whether one side of a 2D or 3D copy is on the device.
fn device_side(memory_type: c_uint, address: u64) -> Result<bool, CuError> {
    match memory_type {
        MEMORYTYPE_DEVICE | MEMORYTYPE_ARRAY => Ok(true),
        MEMORYTYPE_HOST => Ok(false),
        MEMORYTYPE_UNIFIED => Ok(initialized()?.address_range(address).is_ok()),
        _ => Err(CuError::InvalidValue),
    }
}

/// One side of a 2D or 3D copy: its `CUmemorytype`, device address and host pointer.
struct Side {
    memory_type: c_uint,
    device: CUdeviceptr,
    host: u64,
}

/// A 2D or 3D copy of `bytes` between `src` and `dst`; its destination is reported as the device
/// address, or the host pointer when that is NULL.
fn described(
    name: &'static str,
    src: Side,
    dst: Side,
    bytes: usize,
    stream: CUstream,
) -> Result<(), CuError> {
    let device = device_side(src.memory_type, src.device)? && device_side(dst.memory_type, dst.device)?;
    let sides = if device { Sides::Device } else { Sides::Host };
    queue(name, dst.device.max(dst.host), bytes as u64, stream, sides, |_| Ok(()))
}

/// A 2D copy.
///
/// # Safety
/// `copy` is NULL or valid for reading a `CUDA_MEMCPY2D`.
unsafe fn copy_2d(name: &'static str, copy: *const Copy2D, stream: CUstream) -> Result<(), CuError> {
    // SAFETY: per this function's contract.
    let c = unsafe { copy.as_ref() }.ok_or(CuError::InvalidValue)?;
    let src = Side { memory_type: c.src_memory_type, device: c.src_device, host: at(c.src_host) };
    let dst = Side { memory_type: c.dst_memory_type, device: c.dst_device, host: at(c.dst_host) };
    described(name, src, dst, c.width_in_bytes.saturating_mul(c.height), stream)
}

/// A 3D copy (`CUDA_MEMCPY3D` or `CUDA_MEMCPY3D_PEER`).
///
/// # Safety
/// `copy` is NULL or valid for reading one of those structures.
unsafe fn copy_3d(name: &'static str, copy: *const Copy3D, stream: CUstream) -> Result<(), CuError> {
    // SAFETY: per this function's contract.
    let c = unsafe { copy.as_ref() }.ok_or(CuError::InvalidValue)?;
    let src = Side { memory_type: c.src_memory_type, device: c.src_device, host: at(c.src_host) };
    let dst = Side { memory_type: c.dst_memory_type, device: c.dst_device, host: at(c.dst_host) };
    described(name, src, dst, c.width_in_bytes.saturating_mul(c.height).saturating_mul(c.depth), stream)
}

/// One export per line: `name(args) => helper(args…);` calls `helper(name, args…)` after counting
/// the call under its own name.
macro_rules! entries {
    ($($name:ident($($arg:ident: $ty:ty),*) => $helper:ident($($value:expr),*);)*) => {
        $(
            #[unsafe(no_mangle)]
            #[allow(unused_unsafe, unused_variables)]
            pub unsafe extern "C" fn $name($($arg: $ty),*) -> CUresult {
                stats::record_call(stringify!($name));
                // SAFETY: the caller's pointers, valid per the driver's contract for this call.
                answer(|| unsafe { $helper(stringify!($name), $($value),*) })
            }
        )*
    };
}

/// The address of a host pointer or an array handle, as a destination.
fn at<T>(pointer: *const T) -> u64 {
    pointer.addr() as u64
}

entries! {
    cuMemcpy(dst: CUdeviceptr, src: CUdeviceptr, n: usize) => unified(dst, src, n, null_mut());
    cuMemcpy_ptds(dst: CUdeviceptr, src: CUdeviceptr, n: usize) => unified(dst, src, n, null_mut());
    cuMemcpyAsync(dst: CUdeviceptr, src: CUdeviceptr, n: usize, s: CUstream) => unified(dst, src, n, s);
    cuMemcpyAsync_ptsz(dst: CUdeviceptr, src: CUdeviceptr, n: usize, s: CUstream) => unified(dst, src, n, s);
    cuMemcpyPeer(dst: CUdeviceptr, dc: CUcontext, src: CUdeviceptr, sc: CUcontext, n: usize)
        => device_to_device(dst, src, n, null_mut());
    cuMemcpyPeer_ptds(dst: CUdeviceptr, dc: CUcontext, src: CUdeviceptr, sc: CUcontext, n: usize)
        => device_to_device(dst, src, n, null_mut());
    cuMemcpyPeerAsync(dst: CUdeviceptr, dc: CUcontext, src: CUdeviceptr, sc: CUcontext, n: usize, s: CUstream)
        => device_to_device(dst, src, n, s);
    cuMemcpyPeerAsync_ptsz(dst: CUdeviceptr, dc: CUcontext, src: CUdeviceptr, sc: CUcontext, n: usize, s: CUstream)
        => device_to_device(dst, src, n, s);
    cuMemcpyDtoD_v2(dst: CUdeviceptr, src: CUdeviceptr, n: usize)
        => device_to_device(dst, src, n, null_mut());
    cuMemcpyDtoD_v2_ptds(dst: CUdeviceptr, src: CUdeviceptr, n: usize)
        => device_to_device(dst, src, n, null_mut());
    cuMemcpyDtoDAsync_v2(dst: CUdeviceptr, src: CUdeviceptr, n: usize, s: CUstream)
        => device_to_device(dst, src, n, s);
    cuMemcpyDtoDAsync_v2_ptsz(dst: CUdeviceptr, src: CUdeviceptr, n: usize, s: CUstream)
        => device_to_device(dst, src, n, s);
    cuMemcpyDtoA_v2(dst: CUarray, offset: usize, src: CUdeviceptr, n: usize)
        => device(at(dst), n, null_mut(), Some(src));
    cuMemcpyDtoA_v2_ptds(dst: CUarray, offset: usize, src: CUdeviceptr, n: usize)
        => device(at(dst), n, null_mut(), Some(src));
    cuMemcpyAtoD_v2(dst: CUdeviceptr, src: CUarray, offset: usize, n: usize)
        => device(dst, n, null_mut(), Some(dst));
    cuMemcpyAtoD_v2_ptds(dst: CUdeviceptr, src: CUarray, offset: usize, n: usize)
        => device(dst, n, null_mut(), Some(dst));
    cuMemcpyAtoA_v2(dst: CUarray, dst_offset: usize, src: CUarray, src_offset: usize, n: usize)
        => device(at(dst), n, null_mut(), None);
    cuMemcpyAtoA_v2_ptds(dst: CUarray, dst_offset: usize, src: CUarray, src_offset: usize, n: usize)
        => device(at(dst), n, null_mut(), None);
    cuMemcpyHtoD_v2(dst: CUdeviceptr, src: *const c_void, n: usize)
        => host_to_device(dst, src, n, null_mut());
    cuMemcpyHtoD_v2_ptds(dst: CUdeviceptr, src: *const c_void, n: usize)
        => host_to_device(dst, src, n, null_mut());
    cuMemcpyHtoDAsync_v2(dst: CUdeviceptr, src: *const c_void, n: usize, s: CUstream)
        => host_to_device(dst, src, n, s);
    cuMemcpyHtoDAsync_v2_ptsz(dst: CUdeviceptr, src: *const c_void, n: usize, s: CUstream)
        => host_to_device(dst, src, n, s);
    cuMemcpyDtoH_v2(dst: *mut c_void, src: CUdeviceptr, n: usize) => device_to_host(dst, src, n, null_mut());
    cuMemcpyDtoH_v2_ptds(dst: *mut c_void, src: CUdeviceptr, n: usize)
        => device_to_host(dst, src, n, null_mut());
    cuMemcpyDtoHAsync_v2(dst: *mut c_void, src: CUdeviceptr, n: usize, s: CUstream)
        => device_to_host(dst, src, n, s);
    cuMemcpyDtoHAsync_v2_ptsz(dst: *mut c_void, src: CUdeviceptr, n: usize, s: CUstream)
        => device_to_host(dst, src, n, s);
    cuMemcpyHtoA_v2(dst: CUarray, offset: usize, src: *const c_void, n: usize)
        => host(at(dst), n, null_mut());
    cuMemcpyHtoA_v2_ptds(dst: CUarray, offset: usize, src: *const c_void, n: usize)
        => host(at(dst), n, null_mut());
    cuMemcpyHtoAAsync_v2(dst: CUarray, offset: usize, src: *const c_void, n: usize, s: CUstream)
        => host(at(dst), n, s);
    cuMemcpyHtoAAsync_v2_ptsz(dst: CUarray, offset: usize, src: *const c_void, n: usize, s: CUstream)
        => host(at(dst), n, s);
    cuMemcpyAtoH_v2(dst: *mut c_void, src: CUarray, offset: usize, n: usize) => host(at(dst), n, null_mut());
    cuMemcpyAtoH_v2_ptds(dst: *mut c_void, src: CUarray, offset: usize, n: usize)
        => host(at(dst), n, null_mut());
    cuMemcpyAtoHAsync_v2(dst: *mut c_void, src: CUarray, offset: usize, n: usize, s: CUstream)
        => host(at(dst), n, s);
    cuMemcpyAtoHAsync_v2_ptsz(dst: *mut c_void, src: CUarray, offset: usize, n: usize, s: CUstream)
        => host(at(dst), n, s);
    cuMemcpy2D_v2(copy: *const Copy2D) => copy_2d(copy, null_mut());
    cuMemcpy2D_v2_ptds(copy: *const Copy2D) => copy_2d(copy, null_mut());
    cuMemcpy2DUnaligned_v2(copy: *const Copy2D) => copy_2d(copy, null_mut());
    cuMemcpy2DUnaligned_v2_ptds(copy: *const Copy2D) => copy_2d(copy, null_mut());
    cuMemcpy2DAsync_v2(copy: *const Copy2D, s: CUstream) => copy_2d(copy, s);
    cuMemcpy2DAsync_v2_ptsz(copy: *const Copy2D, s: CUstream) => copy_2d(copy, s);
    cuMemcpy3D_v2(copy: *const Copy3D) => copy_3d(copy, null_mut());
    cuMemcpy3D_v2_ptds(copy: *const Copy3D) => copy_3d(copy, null_mut());
    cuMemcpy3DAsync_v2(copy: *const Copy3D, s: CUstream) => copy_3d(copy, s);
    cuMemcpy3DAsync_v2_ptsz(copy: *const Copy3D, s: CUstream) => copy_3d(copy, s);
    cuMemcpy3DPeer(copy: *const Copy3D) => copy_3d(copy, null_mut());
    cuMemcpy3DPeer_ptds(copy: *const Copy3D) => copy_3d(copy, null_mut());
    cuMemcpy3DPeerAsync(copy: *const Copy3D, s: CUstream) => copy_3d(copy, s);
    cuMemcpy3DPeerAsync_ptsz(copy: *const Copy3D, s: CUstream) => copy_3d(copy, s);
    cuMemsetD8_v2(dst: CUdeviceptr, value: u8, n: usize) => memset(dst, n, &value.to_ne_bytes(), null_mut());
    cuMemsetD8_v2_ptds(dst: CUdeviceptr, value: u8, n: usize)
        => memset(dst, n, &value.to_ne_bytes(), null_mut());
    cuMemsetD16_v2(dst: CUdeviceptr, value: u16, n: usize)
        => memset(dst, n, &value.to_ne_bytes(), null_mut());
    cuMemsetD16_v2_ptds(dst: CUdeviceptr, value: u16, n: usize)
        => memset(dst, n, &value.to_ne_bytes(), null_mut());
    cuMemsetD32_v2(dst: CUdeviceptr, value: u32, n: usize)
        => memset(dst, n, &value.to_ne_bytes(), null_mut());
    cuMemsetD32_v2_ptds(dst: CUdeviceptr, value: u32, n: usize)
        => memset(dst, n, &value.to_ne_bytes(), null_mut());
    cuMemsetD8Async(dst: CUdeviceptr, value: u8, n: usize, s: CUstream)
        => memset(dst, n, &value.to_ne_bytes(), s);
    cuMemsetD8Async_ptsz(dst: CUdeviceptr, value: u8, n: usize, s: CUstream)
        => memset(dst, n, &value.to_ne_bytes(), s);
    cuMemsetD16Async(dst: CUdeviceptr, value: u16, n: usize, s: CUstream)
        => memset(dst, n, &value.to_ne_bytes(), s);
    cuMemsetD16Async_ptsz(dst: CUdeviceptr, value: u16, n: usize, s: CUstream)
        => memset(dst, n, &value.to_ne_bytes(), s);
    cuMemsetD32Async(dst: CUdeviceptr, value: u32, n: usize, s: CUstream)
        => memset(dst, n, &value.to_ne_bytes(), s);
    cuMemsetD32Async_ptsz(dst: CUdeviceptr, value: u32, n: usize, s: CUstream)
        => memset(dst, n, &value.to_ne_bytes(), s);
    cuMemsetD2D8_v2(dst: CUdeviceptr, pitch: usize, value: u8, w: usize, h: usize)
        => memset_2d(dst, pitch, w, h, &value.to_ne_bytes(), null_mut());
    cuMemsetD2D8_v2_ptds(dst: CUdeviceptr, pitch: usize, value: u8, w: usize, h: usize)
        => memset_2d(dst, pitch, w, h, &value.to_ne_bytes(), null_mut());
    cuMemsetD2D16_v2(dst: CUdeviceptr, pitch: usize, value: u16, w: usize, h: usize)
        => memset_2d(dst, pitch, w, h, &value.to_ne_bytes(), null_mut());
    cuMemsetD2D16_v2_ptds(dst: CUdeviceptr, pitch: usize, value: u16, w: usize, h: usize)
        => memset_2d(dst, pitch, w, h, &value.to_ne_bytes(), null_mut());
    cuMemsetD2D32_v2(dst: CUdeviceptr, pitch: usize, value: u32, w: usize, h: usize)
        => memset_2d(dst, pitch, w, h, &value.to_ne_bytes(), null_mut());
    cuMemsetD2D32_v2_ptds(dst: CUdeviceptr, pitch: usize, value: u32, w: usize, h: usize)
        => memset_2d(dst, pitch, w, h, &value.to_ne_bytes(), null_mut());
    cuMemsetD2D8Async(dst: CUdeviceptr, pitch: usize, value: u8, w: usize, h: usize, s: CUstream)
        => memset_2d(dst, pitch, w, h, &value.to_ne_bytes(), s);
    cuMemsetD2D8Async_ptsz(dst: CUdeviceptr, pitch: usize, value: u8, w: usize, h: usize, s: CUstream)
        => memset_2d(dst, pitch, w, h, &value.to_ne_bytes(), s);
    cuMemsetD2D16Async(dst: CUdeviceptr, pitch: usize, value: u16, w: usize, h: usize, s: CUstream)
        => memset_2d(dst, pitch, w, h, &value.to_ne_bytes(), s);
    cuMemsetD2D16Async_ptsz(dst: CUdeviceptr, pitch: usize, value: u16, w: usize, h: usize, s: CUstream)
        => memset_2d(dst, pitch, w, h, &value.to_ne_bytes(), s);
    cuMemsetD2D32Async(dst: CUdeviceptr, pitch: usize, value: u32, w: usize, h: usize, s: CUstream)
        => memset_2d(dst, pitch, w, h, &value.to_ne_bytes(), s);
    cuMemsetD2D32Async_ptsz(dst: CUdeviceptr, pitch: usize, value: u32, w: usize, h: usize, s: CUstream)
        => memset_2d(dst, pitch, w, h, &value.to_ne_bytes(), s);
}

/// One attribute of `ptr` into `data`: `CU_POINTER_ATTRIBUTE_MEMORY_TYPE` (`CU_MEMORYTYPE_DEVICE`
/// for the fake's device memory, `CU_MEMORYTYPE_HOST` for its page-locked host memory), and for
/// device memory `_RANGE_START_ADDR` and `_RANGE_SIZE` (what `cuMemGetAddressRange_v2` answers).
///
/// # Safety
/// `data` is NULL or valid for writing the attribute's type.
unsafe fn pointer_attribute(data: *mut c_void, attribute: i32, ptr: CUdeviceptr) -> Result<(), CuError> {
    let fake = initialized()?;
    non_null(data)?;
    let range = fake.address_range(ptr);
    match attribute {
        POINTER_ATTRIBUTE_MEMORY_TYPE => {
            let memory_type = if range.is_ok() {
                MEMORYTYPE_DEVICE
            } else if fake.is_pinned_host(ptr as usize) {
                MEMORYTYPE_HOST
            } else {
                return Err(CuError::InvalidValue);
            };
            // SAFETY: a non-NULL `data` holds a `CUmemorytype` for this attribute, per the contract.
            unsafe { data.cast::<c_uint>().write(memory_type) };
        }
        POINTER_ATTRIBUTE_RANGE_START_ADDR => {
            let (start, _) = range.map_err(|_| CuError::InvalidValue)?;
            // SAFETY: a non-NULL `data` holds a `CUdeviceptr` for this attribute, per the contract.
            unsafe { data.cast::<CUdeviceptr>().write(start) };
        }
        POINTER_ATTRIBUTE_RANGE_SIZE => {
            let (_, size) = range.map_err(|_| CuError::InvalidValue)?;
            // SAFETY: a non-NULL `data` holds a `size_t` for this attribute, per the contract.
            unsafe { data.cast::<usize>().write(size as usize) };
        }
        _ => return Err(CuError::InvalidValue),
    }
    Ok(())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuPointerGetAttribute(
    data: *mut c_void,
    attribute: i32,
    ptr: CUdeviceptr,
) -> CUresult {
    stats::record_call("cuPointerGetAttribute");
    // SAFETY: `data` is NULL or valid for the attribute's type, per the contract.
    answer(|| unsafe { pointer_attribute(data, attribute, ptr) })
}

/// `cuPointerGetAttributes`: each of `count` attributes as `cuPointerGetAttribute` answers it.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuPointerGetAttributes(
    count: c_uint,
    attributes: *const i32,
    data: *const *mut c_void,
    ptr: CUdeviceptr,
) -> CUresult {
    stats::record_call("cuPointerGetAttributes");
    answer(|| {
        non_null(attributes)?;
        non_null(data)?;
        for at in 0..count as usize {
            // SAFETY: both arrays hold `count` entries, per the contract; each `data` entry is
            // valid for its attribute's type.
            unsafe { pointer_attribute(*data.add(at), *attributes.add(at), ptr) }?;
        }
        Ok(())
    })
}
