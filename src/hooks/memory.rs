//! Device memory: every call that creates or destroys it, and the queries that report the virtual
//! GPU (docs/architecture.md, "Accounting").
//!
//! Every creating hook follows one shape ([`charge`]): find the device and size, reserve in the
//! ledger, call the driver, record the new object, or roll the reservation back if the driver
//! refuses. Every destroying hook ([`credit`]) takes the record out before the driver call (so an
//! address handed out again at once is not confused with the old one) and gives the bytes back
//! once the driver has freed it. Out-pointers the driver would reject (NULL) are never read: such
//! calls go to the driver unaccounted and return its own error.

// Streams, pools, arrays and contexts are opaque driver handles: passed on, never dereferenced.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

use std::ffi::{c_int, c_uint, c_void};
use std::sync::Once;

use crate::config::MAX_DEVICES;
use crate::driver::{self, sys::*};
use crate::error::HookError;
use crate::hooks::{overcommit, pools};
use crate::ledger::{Allocation, AllocationTable};
use crate::runtime::Runtime;

/// `device` if it has a budget (so its memory must be counted). In a container with budgets, an
/// ordinal past the 16 a region can describe is treated as budgeted too: the ledger has no room
/// for it, so its allocations are refused rather than left unlimited.
pub fn budgeted(runtime: &Runtime, device: CUdevice) -> Option<usize> {
    let ledger = runtime.ledger();
    let device = usize::try_from(device).ok()?;
    if device >= MAX_DEVICES && ledger.any_limit() {
        static REPORTED: Once = Once::new();
        REPORTED.call_once(|| {
            tracing::error!(
                device,
                "libvgpu budgets at most {MAX_DEVICES} devices per container; allocations on CUDA \
                 device {device} and above are refused"
            );
        });
        return Some(device);
    }
    ledger.budgeted(device).then_some(device)
}

/// The calling thread's current device if it has a budget. No context → `None`: the driver then
/// gives its own error. With one device visible (most containers), a current context can only be
/// on it, so the driver is not asked; without a context the driver refuses the call, and its
/// reservation is rolled back.
pub fn budgeted_current(runtime: &Runtime) -> Option<usize> {
    if !runtime.ledger().any_limit() {
        return None;
    }
    if driver::cuda_device_uuids().len() == 1 {
        return budgeted(runtime, 0);
    }
    budgeted(runtime, driver::cuda().current_device().ok()?)
}

/// Reserves `bytes` on `device` and runs `create`, which returns the new object's key; rolls the
/// reservation back if `create` fails. Returns the key and what it was charged.
pub fn reserve_for(
    runtime: &Runtime,
    device: usize,
    bytes: u64,
    create: impl FnOnce() -> Result<u64, HookError>,
) -> Result<(u64, Allocation), HookError> {
    let owner = runtime.reserve(device, bytes)?;
    match create() {
        Ok(key) => Ok((key, Allocation { device, bytes, owner })),
        Err(error) => {
            runtime.ledger().release(device, bytes, owner);
            Err(error)
        }
    }
}

/// [`reserve_for`], recording the new object in `table`.
pub fn charge(
    runtime: &Runtime,
    table: &AllocationTable,
    device: usize,
    bytes: u64,
    create: impl FnOnce() -> Result<u64, HookError>,
) -> Result<(), HookError> {
    let (key, allocation) = reserve_for(runtime, device, bytes, create)?;
    table.insert(key, allocation);
    Ok(())
}

/// Runs `destroy` for the object `key` and credits what it was charged, if we charged it.
pub fn credit(
    runtime: &Runtime,
    table: &AllocationTable,
    key: u64,
    destroy: impl FnOnce() -> Result<(), HookError>,
) -> Result<(), HookError> {
    credit_then(runtime, table, key, destroy, |_| {})
}

/// [`credit`], running `credited` with the charge once it has been given back.
#[inline]
pub fn credit_then(
    runtime: &Runtime,
    table: &AllocationTable,
    key: u64,
    destroy: impl FnOnce() -> Result<(), HookError>,
    credited: impl FnOnce(&Allocation),
) -> Result<(), HookError> {
    if !runtime.ledger().any_limit() {
        return destroy();
    }
    let record = table.remove(key);
    match (destroy(), record) {
        (Ok(()), Some(allocation)) => {
            runtime.ledger().release(allocation.device, allocation.bytes, allocation.owner);
            credited(&allocation);
            Ok(())
        }
        (Err(error), Some(allocation)) => {
            table.insert(key, allocation);
            Err(error)
        }
        (result, None) => result,
    }
}

/// Charges an allocation that writes its address through `dptr`, on the current device.
///
/// # Safety
/// `dptr` is the application's out-pointer; `allocate` hands it to the driver.
unsafe fn charge_linear(
    runtime: &Runtime,
    dptr: *mut CUdeviceptr,
    bytes: usize,
    allocate: impl FnOnce() -> Result<(), HookError>,
) -> Result<(), HookError> {
    let device = if dptr.is_null() { None } else { budgeted_current(runtime) };
    // SAFETY: per this function's contract.
    unsafe { charge_linear_on(runtime, device, dptr, bytes, allocate) }
}

/// [`charge_linear`] on `device`, which the caller found (`None`: no budget, or a NULL `dptr`).
///
/// # Safety
/// As [`charge_linear`]; `device` is `None` whenever `dptr` is NULL.
#[inline]
unsafe fn charge_linear_on(
    runtime: &Runtime,
    device: Option<usize>,
    dptr: *mut CUdeviceptr,
    bytes: usize,
    allocate: impl FnOnce() -> Result<(), HookError>,
) -> Result<(), HookError> {
    let Some(device) = device else { return allocate() };
    charge(runtime, &runtime.allocations, device, bytes as u64, || {
        allocate()?;
        // SAFETY: the driver succeeded, so it wrote the new address through the non-null `dptr`.
        Ok(unsafe { dptr.read() })
    })
}

/// What backs new device memory (docs/overcommit.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backing {
    /// The driver's device memory, as asked for: a device that is not overcommitted, or a size of
    /// 0 (the driver's error to give).
    Device,
    /// Memory that spills through unified memory: an overcommitted device without a swap arbiter,
    /// or memory the swap does not take (under 1 MiB, a budget past the card).
    Spillable,
    /// Memory the swap moves whole with its process (`hooks/swap/`): an overcommitted device under
    /// a live arbiter.
    Swappable,
}

/// The one place where the backing of `bytes` of new memory on budgeted `device` is chosen. Each
/// family takes what it can of it: `cuMemAlloc` all three; stream-ordered allocations and
/// `cuMemCreate` the swap's or the driver's (a pool's blocks and a physical handle cannot be
/// made managed).
#[inline]
pub fn backing(runtime: &Runtime, device: usize, bytes: usize) -> Backing {
    if bytes == 0 || !runtime.ledger().overcommit(device) {
        Backing::Device
    } else if runtime.swap.wants(runtime, device, bytes) {
        Backing::Swappable
    } else {
        Backing::Spillable
    }
}

/// `cuMemAlloc_v2`.
///
/// # Safety
/// `dptr` is the application's out-pointer, handed to the driver as it is.
pub unsafe fn alloc(runtime: &Runtime, dptr: *mut CUdeviceptr, bytes: usize) -> Result<(), HookError> {
    let cuda = driver::cuda();
    // One look for the device (it is the hot path): the backing and the charge share it.
    let device = if dptr.is_null() { None } else { budgeted_current(runtime) };
    let backing = device.map_or(Backing::Device, |device| backing(runtime, device, bytes));
    match (device, backing) {
        // Swappable memory without room in time spills, as memory without an arbiter does.
        (Some(device), Backing::Swappable)
            // SAFETY: `dptr` is the application's non-null out-pointer.
            if unsafe { runtime.swap.alloc(runtime, device, dptr, bytes) }? => Ok(()),
        // SAFETY: `dptr` is the application's non-null out-pointer.
        (Some(device), Backing::Swappable | Backing::Spillable) => unsafe {
            overcommit::alloc_spillable(runtime, device, dptr, bytes)
        },
        // SAFETY: `dptr` is the application's, forwarded unchanged; `device` is None when it is NULL.
        _ => unsafe { charge_linear_on(runtime, device, dptr, bytes, || cuda.mem_alloc(dptr, bytes)) },
    }
}

/// `cuMemAllocManaged`: managed memory lives on the device while in use, so it is charged. On an
/// overcommitted device it is also counted as spillable.
///
/// # Safety
/// `dptr` is the application's out-pointer, handed to the driver as it is.
pub unsafe fn alloc_managed(
    runtime: &Runtime,
    dptr: *mut CUdeviceptr,
    bytes: usize,
    flags: u32,
) -> Result<(), HookError> {
    let cuda = driver::cuda();
    // SAFETY: the application's arguments, forwarded unchanged.
    unsafe {
        charge_linear(runtime, dptr, bytes, || {
            driver::invoke(cuda.mem_alloc_managed, "cuMemAllocManaged", |f| f(dptr, bytes, flags))
        })
    }?;
    if let Some(device) = budgeted_current(runtime).filter(|_| !dptr.is_null())
        && runtime.ledger().overcommit(device)
    {
        // SAFETY: the driver succeeded, so it wrote the new address through the non-null `dptr`.
        let address = unsafe { dptr.read() };
        overcommit::note_managed(runtime, device, address, bytes as u64);
    }
    Ok(())
}

/// `cuMemAllocPitch_v2`: charged `pitch × height`. The pitch is known only after the call, so the
/// row width rounded up to 512 bytes is reserved first and the difference settled afterwards; if
/// the real pitch does not fit, the allocation is freed again and refused.
///
/// # Safety
/// `dptr` and `pitch` are the application's out-pointers, handed to the driver as they are.
pub unsafe fn alloc_pitch(
    runtime: &Runtime,
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    element_size: u32,
) -> Result<(), HookError> {
    let cuda = driver::cuda();
    let allocate = || {
        driver::invoke(cuda.mem_alloc_pitch_v2, "cuMemAllocPitch_v2", |f| {
            // SAFETY: the application's arguments, forwarded unchanged.
            unsafe { f(dptr, pitch, width, height, element_size) }
        })
    };
    let device = if dptr.is_null() || pitch.is_null() { None } else { budgeted_current(runtime) };
    let Some(device) = device else { return allocate() };
    let estimate = (width as u64).div_ceil(512).saturating_mul(512).saturating_mul(height as u64);
    let ledger = runtime.ledger();
    let owner = runtime.reserve(device, estimate)?;
    if let Err(error) = allocate() {
        ledger.release(device, estimate, owner);
        return Err(error);
    }
    // SAFETY: the driver succeeded, so it wrote both non-null out-pointers.
    let (address, real_pitch) = unsafe { (dptr.read(), pitch.read()) };
    let actual = (real_pitch as u64).saturating_mul(height as u64);
    if actual > estimate {
        if let Err(error) = ledger.try_reserve(device, actual - estimate) {
            let _ = cuda.mem_free(address);
            ledger.release(device, estimate, owner);
            return Err(error.into());
        }
    } else {
        ledger.release(device, estimate - actual, owner);
    }
    runtime.allocations.insert(address, Allocation { device, bytes: actual, owner });
    Ok(())
}

/// `cuMemFree_v2` (also frees stream-ordered allocations).
pub fn free(runtime: &Runtime, dptr: CUdeviceptr) -> Result<(), HookError> {
    if let Some(freed) = runtime.swap.free(runtime, dptr) {
        return freed;
    }
    runtime.spill.free(runtime, dptr, || pools::free_pointer(runtime, dptr, || driver::cuda().mem_free(dptr)))
}

/// `cuMemGetAddressRange_v2`: the driver's answer, except for swappable memory of ours, which the
/// driver sees as chunks (`hooks/swap/ranges.rs`).
///
/// # Safety
/// `base` and `size` are the application's out-pointers, each NULL or valid.
pub unsafe fn address_range(
    runtime: &Runtime,
    base: *mut CUdeviceptr,
    size: *mut usize,
    dptr: CUdeviceptr,
) -> Result<(), HookError> {
    let Some((start, bytes)) = runtime.swap.range_of(dptr) else {
        return driver::invoke(driver::cuda().mem_get_address_range, "cuMemGetAddressRange_v2", |f| {
            // SAFETY: the application's arguments, forwarded unchanged.
            unsafe { f(base, size, dptr) }
        });
    };
    // SAFETY: each is NULL (skipped) or the application's valid out-pointer.
    unsafe {
        if !base.is_null() {
            base.write(start);
        }
        if !size.is_null() {
            size.write(bytes);
        }
    }
    Ok(())
}

/// Puts `range` (an allocation's start and size) into `data` if `attribute` asks for one of them;
/// false otherwise.
///
/// # Safety
/// `data` is NULL or valid for writing the attribute's type.
unsafe fn put_range(range: (CUdeviceptr, usize), data: *mut c_void, attribute: c_int) -> bool {
    if data.is_null() {
        return false;
    }
    // SAFETY: the attribute's type, per the caller's contract.
    unsafe {
        match attribute {
            CU_POINTER_ATTRIBUTE_RANGE_START_ADDR => data.cast::<CUdeviceptr>().write(range.0),
            CU_POINTER_ATTRIBUTE_RANGE_SIZE => data.cast::<usize>().write(range.1),
            _ => return false,
        }
    }
    true
}

/// `cuPointerGetAttribute`: the driver's answer, except the range of swappable memory of ours
/// (`hooks/swap/ranges.rs`). Asked anything else about such memory while it is off the card, the
/// driver would know nothing of it: it is brought back first.
///
/// # Safety
/// `data` is the application's out-pointer for `attribute`.
pub unsafe fn pointer_attribute(
    runtime: &Runtime,
    data: *mut c_void,
    attribute: c_int,
    dptr: CUdeviceptr,
) -> Result<(), HookError> {
    let ours = runtime.swap.range_of(dptr);
    // SAFETY: the application's out-pointer for `attribute`.
    if ours.is_some_and(|range| unsafe { put_range(range, data, attribute) }) {
        return Ok(());
    }
    let _inside = ours.and_then(|_| runtime.swap.enter(runtime));
    driver::invoke(driver::cuda().pointer_get_attribute, "cuPointerGetAttribute", |f| {
        // SAFETY: the application's arguments, forwarded unchanged.
        unsafe { f(data, attribute, dptr) }
    })
}

/// `cuPointerGetAttributes`: as [`pointer_attribute`], for each of `count` attributes.
///
/// # Safety
/// `attributes` and `data` are the application's arrays of `count` entries.
pub unsafe fn pointer_attributes(
    runtime: &Runtime,
    count: c_uint,
    attributes: *const c_int,
    data: *const *mut c_void,
    dptr: CUdeviceptr,
) -> Result<(), HookError> {
    let ours = runtime.swap.range_of(dptr);
    let _inside = ours.and_then(|_| runtime.swap.enter(runtime));
    driver::invoke(driver::cuda().pointer_get_attributes, "cuPointerGetAttributes", |f| {
        // SAFETY: the application's arguments, forwarded unchanged.
        unsafe { f(count, attributes, data, dptr) }
    })?;
    let Some(range) = ours.filter(|_| !attributes.is_null() && !data.is_null()) else { return Ok(()) };
    for at in 0..count as usize {
        // SAFETY: the driver accepted both arrays of `count` entries.
        unsafe { put_range(range, *data.add(at), *attributes.add(at)) };
    }
    Ok(())
}

/// The size of the virtual card: the budget, but never more than the physical card unless the
/// device is overcommitted (then the budget, as HAMi advertises it).
pub fn virtual_size(limit: u64, physical_total: u64, overcommit: bool) -> u64 {
    if overcommit { limit } else { limit.min(physical_total) }
}

/// `cuMemGetInfo_v2`: (min(size − used, physical free), size) for a budgeted device; on an
/// overcommitted one (size − used, size), since what the card cannot hold spills.
///
/// # Safety
/// `free` and `total` are the application's out-pointers, handed to the driver as they are.
pub unsafe fn get_info(runtime: &Runtime, free: *mut usize, total: *mut usize) -> Result<(), HookError> {
    // SAFETY: passed through unchanged; the driver validates both pointers.
    unsafe { driver::cuda().mem_get_info(free, total) }?;
    let Some(device) = budgeted_current(runtime) else { return Ok(()) };
    let Some(limit) = runtime.ledger().limit(device) else { return Ok(()) };
    if free.is_null() || total.is_null() {
        return Ok(());
    }
    runtime.pools.refresh(runtime);
    runtime.swap.trim_kept(runtime);
    // SAFETY: the driver accepted and filled both non-null out-pointers.
    let (physical_free, physical_total) = unsafe { (free.read() as u64, total.read() as u64) };
    let overcommit = runtime.ledger().overcommit(device);
    let size = virtual_size(limit, physical_total, overcommit);
    let mut available = size.saturating_sub(runtime.ledger().used(device));
    if !overcommit {
        available = available.min(physical_free);
    }
    // SAFETY: as above; both point to writable `size_t`s.
    unsafe {
        free.write(available as usize);
        total.write(size as usize);
    }
    Ok(())
}

/// `cuDeviceTotalMem_v2`: the virtual card's size for a budgeted device.
///
/// # Safety
/// `bytes` is the application's out-pointer, handed to the driver as it is.
pub unsafe fn device_total(runtime: &Runtime, bytes: *mut usize, device: CUdevice) -> Result<(), HookError> {
    // SAFETY: passed through unchanged; the driver validates `bytes` and `device`.
    unsafe { driver::cuda().device_total_mem(bytes, device) }?;
    let ordinal = usize::try_from(device).ok();
    let limit = ordinal.and_then(|d| runtime.ledger().limit(d));
    if let (Some(limit), Some(ordinal), false) = (limit, ordinal, bytes.is_null()) {
        let overcommit = runtime.ledger().overcommit(ordinal);
        // SAFETY: the driver accepted and filled the non-null out-pointer.
        unsafe { bytes.write(virtual_size(limit, bytes.read() as u64, overcommit) as usize) };
    }
    Ok(())
}
