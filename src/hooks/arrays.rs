//! CUDA arrays (textures and surfaces): charged by their logical size, credited when destroyed.
//!
//! The driver lays arrays out with its own padding and tiling, which no API reports; we charge
//! width × height × depth × channels × element size (per mip level for mipmapped arrays), the
//! memory the array holds at the least.

// Streams, pools, arrays and contexts are opaque driver handles: passed on, never dereferenced.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

use crate::driver::{self, sys::*};
use crate::error::HookError;
use crate::hooks::memory::{budgeted_current, charge, credit};
use crate::runtime::Runtime;

/// Bytes per channel of a `CUarray_format`; formats we do not know count as 4.
fn element_size(format: i32) -> u64 {
    match format {
        0x01 | 0x08 => 1,        // unsigned/signed int8
        0x02 | 0x09 | 0x10 => 2, // unsigned/signed int16, half
        _ => 4,                  // int32, float, and anything newer
    }
}

/// Logical bytes of an array of the given shape (0 in a dimension means "not used", i.e. 1).
pub fn array_bytes(width: usize, height: usize, depth: usize, format: i32, channels: u32) -> u64 {
    [width, height.max(1), depth.max(1)]
        .iter()
        .fold(u64::from(channels.max(1)) * element_size(format), |acc, &d| acc.saturating_mul(d as u64))
}

/// Sum over `levels` mip levels, each dimension halved per level (never below 1).
pub fn mipmapped_bytes(desc: &Array3dDescriptor, levels: u32) -> u64 {
    let (mut w, mut h, mut d) = (desc.width.max(1), desc.height, desc.depth);
    let mut total = 0u64;
    for _ in 0..levels.max(1) {
        total = total.saturating_add(array_bytes(w, h, d, desc.format, desc.num_channels));
        (w, h, d) = (
            (w / 2).max(1),
            if h == 0 { 0 } else { (h / 2).max(1) },
            if d == 0 { 0 } else { (d / 2).max(1) },
        );
    }
    total
}

/// `cuArrayCreate_v2`.
///
/// # Safety
/// `array` and `desc` are the application's pointers, handed to the driver as they are.
pub unsafe fn create(
    runtime: &Runtime,
    array: *mut CUarray,
    desc: *const ArrayDescriptor,
) -> Result<(), HookError> {
    let cuda = driver::cuda();
    let make = || {
        driver::invoke(cuda.array_create_v2, "cuArrayCreate_v2", |f| {
            // SAFETY: the arguments are forwarded unchanged; the driver validates them.
            unsafe { f(array, desc) }
        })
    };
    let device = if array.is_null() || desc.is_null() { None } else { budgeted_current(runtime) };
    let Some(device) = device else { return make() };
    // SAFETY: a non-null `desc` points to the caller's descriptor, per the contract.
    let d = unsafe { desc.read() };
    charge(
        runtime,
        &runtime.arrays,
        device,
        array_bytes(d.width, d.height, 0, d.format, d.num_channels),
        || {
            make()?;
            // SAFETY: the driver succeeded, so it wrote the non-null `array`.
            Ok(unsafe { array.read() } as u64)
        },
    )
}

/// `cuArray3DCreate_v2`.
///
/// # Safety
/// `array` and `desc` are the application's pointers, handed to the driver as they are.
pub unsafe fn create_3d(
    runtime: &Runtime,
    array: *mut CUarray,
    desc: *const Array3dDescriptor,
) -> Result<(), HookError> {
    let cuda = driver::cuda();
    let make = || {
        driver::invoke(cuda.array_3d_create_v2, "cuArray3DCreate_v2", |f| {
            // SAFETY: the arguments are forwarded unchanged; the driver validates them.
            unsafe { f(array, desc) }
        })
    };
    let device = if array.is_null() || desc.is_null() { None } else { budgeted_current(runtime) };
    let Some(device) = device else { return make() };
    // SAFETY: a non-null `desc` points to the caller's descriptor, per the contract.
    let d = unsafe { desc.read() };
    let bytes = array_bytes(d.width, d.height, d.depth, d.format, d.num_channels);
    charge(runtime, &runtime.arrays, device, bytes, || {
        make()?;
        // SAFETY: the driver succeeded, so it wrote the non-null `array`.
        Ok(unsafe { array.read() } as u64)
    })
}

/// `cuMipmappedArrayCreate`.
///
/// # Safety
/// `array` and `desc` are the application's pointers, handed to the driver as they are.
pub unsafe fn create_mipmapped(
    runtime: &Runtime,
    array: *mut CUmipmappedArray,
    desc: *const Array3dDescriptor,
    levels: u32,
) -> Result<(), HookError> {
    let cuda = driver::cuda();
    let make = || {
        // SAFETY: the application's arguments, forwarded unchanged.
        driver::invoke(cuda.mipmapped_array_create, "cuMipmappedArrayCreate", |f| unsafe {
            f(array, desc, levels)
        })
    };
    let device = if array.is_null() || desc.is_null() { None } else { budgeted_current(runtime) };
    let Some(device) = device else { return make() };
    // SAFETY: a non-null `desc` points to the caller's descriptor, per the contract.
    let bytes = mipmapped_bytes(&unsafe { desc.read() }, levels);
    charge(runtime, &runtime.arrays, device, bytes, || {
        make()?;
        // SAFETY: the driver succeeded, so it wrote the non-null `array`.
        Ok(unsafe { array.read() } as u64)
    })
}

/// `cuArrayDestroy`.
pub fn destroy(runtime: &Runtime, array: CUarray) -> Result<(), HookError> {
    let cuda = driver::cuda();
    credit(runtime, &runtime.arrays, array as u64, || {
        driver::invoke(cuda.array_destroy, "cuArrayDestroy", |f| {
            // SAFETY: the arguments are forwarded unchanged; the driver validates them.
            unsafe { f(array) }
        })
    })
}

/// `cuMipmappedArrayDestroy`.
pub fn destroy_mipmapped(runtime: &Runtime, array: CUmipmappedArray) -> Result<(), HookError> {
    let cuda = driver::cuda();
    credit(runtime, &runtime.arrays, array as u64, || {
        driver::invoke(cuda.mipmapped_array_destroy, "cuMipmappedArrayDestroy", |f| {
            // SAFETY: the arguments are forwarded unchanged; the driver validates them.
            unsafe { f(array) }
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn array_sizes() {
        assert_eq!(array_bytes(1024, 1024, 0, 0x20, 4), 16 << 20);
        assert_eq!(array_bytes(100, 0, 0, 0x01, 1), 100);
        assert_eq!(array_bytes(64, 64, 64, 0x10, 2), 64 * 64 * 64 * 4);
    }

    #[test]
    fn mip_levels_halve_each_dimension() {
        let desc =
            Array3dDescriptor { width: 8, height: 8, depth: 0, format: 0x01, num_channels: 1, flags: 0 };
        assert_eq!(mipmapped_bytes(&desc, 4), 64 + 16 + 4 + 1);
    }
}
