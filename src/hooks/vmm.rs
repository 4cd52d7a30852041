//! Virtual memory management (`cuMemCreate` and friends): physical memory is charged when created
//! and credited when the driver really frees it.
//!
//! The driver reference-counts a physical allocation: `cuMemCreate` and every
//! `cuMemRetainAllocationHandle` add a reference that `cuMemRelease` drops, and every `cuMemMap`
//! keeps the memory alive until its `cuMemUnmap`. A handle released while still mapped (PyTorch's
//! expandable segments and NCCL do this) is still device memory, so the credit waits for the last
//! reference and the last mapping both. Address reservations cost nothing and are never seen here.
//!
//! Under a swap arbiter, device memory a budget may overcommit is made swappable: the application
//! gets a handle of the swap's (`hooks::swap`'s `vmm`), counted here like a driver's, and every call
//! that names one goes through the swap, which holds the driver's handle.

use std::collections::{BTreeMap, HashMap};
use std::ffi::{c_int, c_void};

use parking_lot::Mutex;

use crate::driver::{self, sys::*};
use crate::error::HookError;
use crate::hooks::memory::{self, Backing, budgeted, reserve_for};
use crate::ledger::Allocation;
use crate::runtime::Runtime;

/// A charged physical allocation and what keeps it alive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Physical {
    allocation: Allocation,
    references: u32,
    mappings: u32,
}

impl Physical {
    fn is_dead(&self) -> bool {
        self.references == 0 && self.mappings == 0
    }
}

#[derive(Debug, Default)]
struct State {
    /// Charged handles that the driver still holds memory for.
    handles: HashMap<CUmemGenericAllocationHandle, Physical>,
    /// Mappings of charged handles: start address → (size, handle).
    mappings: BTreeMap<CUdeviceptr, (usize, CUmemGenericAllocationHandle)>,
}

/// Charged `cuMemCreate` handles, their references and their mappings.
#[derive(Debug, Default)]
pub struct VmmTable {
    state: Mutex<State>,
}

impl VmmTable {
    fn created(&self, handle: CUmemGenericAllocationHandle, allocation: Allocation) {
        let physical = Physical { allocation, references: 1, mappings: 0 };
        self.state.lock().handles.insert(handle, physical);
    }

    /// Drops one reference; returns the handle's record as it was, to restore if the driver
    /// refuses, and the allocation to credit if that was the last hold on it.
    fn release(&self, handle: CUmemGenericAllocationHandle) -> Option<(Physical, Option<Allocation>)> {
        let mut state = self.state.lock();
        let physical = state.handles.get_mut(&handle)?;
        let before = *physical;
        physical.references = physical.references.saturating_sub(1);
        if physical.is_dead() {
            state.handles.remove(&handle);
            return Some((before, Some(before.allocation)));
        }
        Some((before, None))
    }

    fn restore(&self, handle: CUmemGenericAllocationHandle, physical: Physical) {
        self.state.lock().handles.insert(handle, physical);
    }

    fn retained(&self, handle: CUmemGenericAllocationHandle) {
        if let Some(physical) = self.state.lock().handles.get_mut(&handle) {
            physical.references += 1;
        }
    }

    fn mapped(&self, address: CUdeviceptr, size: usize, handle: CUmemGenericAllocationHandle) {
        let mut state = self.state.lock();
        if let Some(physical) = state.handles.get_mut(&handle) {
            physical.mappings += 1;
            state.mappings.insert(address, (size, handle));
        }
    }

    /// Takes out the mappings that start inside `[address, address + size)`.
    fn unmap(
        &self,
        address: CUdeviceptr,
        size: usize,
    ) -> Vec<(CUdeviceptr, usize, CUmemGenericAllocationHandle)> {
        let mut state = self.state.lock();
        let end = address.saturating_add(size as u64);
        let starts: Vec<CUdeviceptr> = state.mappings.range(address..end).map(|(&start, _)| start).collect();
        starts
            .into_iter()
            .filter_map(|start| state.mappings.remove(&start).map(|(size, handle)| (start, size, handle)))
            .collect()
    }

    /// The driver unmapped `removed`: each handle loses a mapping. Returns the handles nothing holds
    /// any more, with their allocations.
    fn unmapped(
        &self,
        removed: &[(CUdeviceptr, usize, CUmemGenericAllocationHandle)],
    ) -> Vec<(CUmemGenericAllocationHandle, Allocation)> {
        let mut state = self.state.lock();
        let mut dead = Vec::new();
        for &(_, _, handle) in removed {
            let Some(physical) = state.handles.get_mut(&handle) else { continue };
            physical.mappings = physical.mappings.saturating_sub(1);
            if physical.is_dead() {
                dead.push((handle, physical.allocation));
                state.handles.remove(&handle);
            }
        }
        dead
    }

    fn remap(&self, removed: Vec<(CUdeviceptr, usize, CUmemGenericAllocationHandle)>) {
        let mut state = self.state.lock();
        for (start, size, handle) in removed {
            state.mappings.insert(start, (size, handle));
        }
    }
}

/// `cuMemCreate`: charged to the device named in `prop` (not the current one).
///
/// # Safety
/// `handle` and `prop` are the application's pointers, handed to the driver as they are.
pub unsafe fn mem_create(
    runtime: &Runtime,
    handle: *mut CUmemGenericAllocationHandle,
    size: usize,
    prop: *const CUmemAllocationProp,
    flags: u64,
) -> Result<(), HookError> {
    let cuda = driver::cuda();
    let create = || {
        driver::invoke(cuda.mem_create, "cuMemCreate", |f| {
            // SAFETY: the arguments are forwarded unchanged; the driver validates them.
            unsafe { f(handle, size, prop, flags) }
        })
    };
    let device = if handle.is_null() || prop.is_null() {
        None
    } else {
        // SAFETY: a non-null `prop` points to the caller's CUmemAllocationProp, per the contract.
        let location = unsafe { prop.read() }.location;
        (location.kind == CU_MEM_LOCATION_TYPE_DEVICE)
            .then_some(location.id)
            .and_then(|id| budgeted(runtime, id))
    };
    let Some(device) = device else { return create() };
    // SAFETY: `prop` is non-null here (else `device` is None), the caller's CUmemAllocationProp.
    let wanted = unsafe { prop.read() };
    if flags == 0
        && wanted.kind == CU_MEM_ALLOCATION_TYPE_PINNED
        && memory::backing(runtime, device, size) == Backing::Swappable
    {
        let (created, allocation) = reserve_for(runtime, device, size as u64, || {
            runtime.swap.create_handle(runtime, device, size, &wanted)
        })?;
        runtime.swap.charged_handle(created, allocation);
        runtime.vmm.created(created, allocation);
        // SAFETY: the caller's non-null out-pointer.
        unsafe { handle.write(created) };
        return Ok(());
    }
    let (created, allocation) = reserve_for(runtime, device, size as u64, || {
        create()?;
        // SAFETY: the driver succeeded, so it wrote the non-null `handle`.
        Ok(unsafe { handle.read() })
    })?;
    runtime.vmm.created(created, allocation);
    Ok(())
}

/// `cuMemRelease`: drops a reference; the memory is credited once nothing holds it.
pub fn mem_release(runtime: &Runtime, handle: CUmemGenericAllocationHandle) -> Result<(), HookError> {
    let cuda = driver::cuda();
    let release = || {
        driver::invoke(cuda.mem_release, "cuMemRelease", |f| {
            // SAFETY: the arguments are forwarded unchanged; the driver validates them.
            unsafe { f(handle) }
        })
    };
    if runtime.swap.owns_handle(handle) {
        // The application's references are counted here alone; the swap holds the driver's one.
        let Some((_, freed)) = runtime.vmm.release(handle) else {
            return Err(HookError::Driver(CUDA_ERROR_INVALID_VALUE));
        };
        if let Some(allocation) = freed {
            runtime.swap.forget_handle(handle);
            runtime.ledger().release(allocation.device, allocation.bytes, allocation.owner);
        }
        return Ok(());
    }
    // Updated before the driver call: once it frees the memory, the handle value may be reused.
    let Some((before, freed)) = runtime.vmm.release(handle) else { return release() };
    if let Err(error) = release() {
        runtime.vmm.restore(handle, before);
        return Err(error);
    }
    if let Some(allocation) = freed {
        runtime.ledger().release(allocation.device, allocation.bytes, allocation.owner);
    }
    Ok(())
}

/// `cuMemMap`: a mapping keeps the physical memory alive past its `cuMemRelease`.
pub fn mem_map(
    runtime: &Runtime,
    address: CUdeviceptr,
    size: usize,
    offset: usize,
    handle: CUmemGenericAllocationHandle,
    flags: u64,
) -> Result<(), HookError> {
    let map = |handle| {
        driver::invoke(driver::cuda().mem_map, "cuMemMap", |f| {
            // SAFETY: the arguments are forwarded, the handle the driver's own; it validates them.
            unsafe { f(address, size, offset, handle, flags) }
        })
    };
    if runtime.swap.owns_handle(handle) {
        runtime.swap.map_handle(runtime, address, size, offset, handle, map)?;
    } else {
        map(handle)?;
    }
    runtime.vmm.mapped(address, size, handle);
    Ok(())
}

/// `cuMemUnmap`: credits the allocations whose last hold this was.
pub fn mem_unmap(runtime: &Runtime, address: CUdeviceptr, size: usize) -> Result<(), HookError> {
    let removed = runtime.vmm.unmap(address, size);
    let unmap = || {
        driver::invoke(driver::cuda().mem_unmap, "cuMemUnmap", |f| {
            // SAFETY: the arguments are forwarded unchanged; the driver validates them.
            unsafe { f(address, size) }
        })
    };
    let swapped = removed.iter().any(|&(_, _, handle)| runtime.swap.owns_handle(handle));
    let result = if swapped { runtime.swap.unmap_handles(runtime, &removed, unmap) } else { unmap() };
    if result.is_err() {
        runtime.vmm.remap(removed);
        return result;
    }
    for (handle, allocation) in runtime.vmm.unmapped(&removed) {
        if swapped {
            runtime.swap.forget_handle(handle);
        }
        runtime.ledger().release(allocation.device, allocation.bytes, allocation.owner);
    }
    Ok(())
}

/// `cuMemRetainAllocationHandle`: one more reference, which needs its own `cuMemRelease`.
///
/// # Safety
/// `handle` is the application's out-pointer, handed to the driver as it is.
pub unsafe fn retain_allocation_handle(
    runtime: &Runtime,
    handle: *mut CUmemGenericAllocationHandle,
    address: *mut c_void,
) -> Result<(), HookError> {
    if !handle.is_null()
        && let Some(ours) = runtime.swap.handle_at(runtime, address as CUdeviceptr)
    {
        // SAFETY: the caller's non-null out-pointer.
        unsafe { handle.write(ours) };
        runtime.vmm.retained(ours);
        return Ok(());
    }
    driver::invoke(driver::cuda().mem_retain_allocation_handle, "cuMemRetainAllocationHandle", |f| {
        // SAFETY: the arguments are forwarded unchanged; the driver validates them.
        unsafe { f(handle, address) }
    })?;
    if !handle.is_null() {
        // SAFETY: the driver succeeded, so it wrote the non-null `handle`.
        let real = unsafe { handle.read() };
        // A mapping in part of one of the swap's handles: the application knows it by ours, and
        // its reference is counted here, not by the driver.
        if let Some(ours) = runtime.swap.handle_of_real(real) {
            driver::invoke(driver::cuda().mem_release, "cuMemRelease", |f| {
                // SAFETY: the reference the driver just added.
                unsafe { f(real) }
            })?;
            // SAFETY: as above.
            unsafe { handle.write(ours) };
            runtime.vmm.retained(ours);
            return Ok(());
        }
        runtime.vmm.retained(real);
    }
    Ok(())
}

/// `cuMemSetAccess`: the access of the swap's blocks is kept, to be set again when their memory
/// comes back.
///
/// # Safety
/// `desc` is the application's array of `count` `CUmemAccessDesc`, handed to the driver as it is.
pub unsafe fn set_access(
    runtime: &Runtime,
    address: CUdeviceptr,
    size: usize,
    desc: *const c_void,
    count: usize,
) -> Result<(), HookError> {
    let set = || {
        driver::invoke(driver::cuda().mem_set_access, "cuMemSetAccess", |f| {
            // SAFETY: the arguments are forwarded unchanged; the driver validates them.
            unsafe { f(address, size, desc, count) }
        })
    };
    if !runtime.swap.holds_any() || desc.is_null() || count == 0 || count > 64 {
        return set();
    }
    // SAFETY: the driver reads `count` descriptors there too; a bad pointer fails both alike.
    let access = unsafe { std::slice::from_raw_parts(desc as *const crate::hooks::swap::AccessDesc, count) };
    runtime.swap.set_access(runtime, address, size, access, set)
}

/// `cuMemExportToShareableHandle`: one of the swap's handles is exported through the driver's,
/// and stays on the card from then on.
///
/// # Safety
/// `shareable` is the application's out-pointer, handed to the driver as it is.
pub unsafe fn export_to_shareable_handle(
    runtime: &Runtime,
    shareable: *mut c_void,
    handle: CUmemGenericAllocationHandle,
    kind: c_int,
    flags: u64,
) -> Result<(), HookError> {
    let export = |handle| {
        driver::invoke(driver::cuda().mem_export_to_shareable_handle, "cuMemExportToShareableHandle", |f| {
            // SAFETY: the arguments are forwarded, the handle the driver's own; it validates them.
            unsafe { f(shareable, handle, kind, flags) }
        })
    };
    if runtime.swap.owns_handle(handle) {
        return runtime.swap.export_handle(runtime, handle, export);
    }
    export(handle)
}

/// `cuMemGetAllocationPropertiesFromHandle`: asked of the driver's handle behind one of the swap's.
///
/// # Safety
/// `prop` is the application's out-pointer, handed to the driver as it is.
pub unsafe fn allocation_properties(
    runtime: &Runtime,
    prop: *mut CUmemAllocationProp,
    handle: CUmemGenericAllocationHandle,
) -> Result<(), HookError> {
    let ask = |handle| {
        driver::invoke(
            driver::cuda().mem_get_allocation_properties_from_handle,
            "cuMemGetAllocationPropertiesFromHandle",
            |f| {
                // SAFETY: the arguments are forwarded, the handle the driver's own; it validates them.
                unsafe { f(prop, handle) }
            },
        )
    };
    if runtime.swap.owns_handle(handle) {
        return runtime
            .swap
            .with_real(runtime, handle, ask)
            .unwrap_or(Err(HookError::Driver(CUDA_ERROR_INVALID_VALUE)));
    }
    ask(handle)
}

#[cfg(test)]
mod tests {
    use super::*;

    const HANDLE: CUmemGenericAllocationHandle = 7;
    const CHARGE: Allocation = Allocation { device: 0, bytes: 2 << 20, owner: 0 };

    #[test]
    fn released_while_mapped_lives_until_unmapped() {
        let table = VmmTable::default();
        table.created(HANDLE, CHARGE);
        table.mapped(0x1000_0000, 2 << 20, HANDLE);
        assert_eq!(table.release(HANDLE).map(|(_, freed)| freed), Some(None));
        let removed = table.unmap(0x1000_0000, 2 << 20);
        assert_eq!(removed.len(), 1);
        assert_eq!(table.unmapped(&removed), vec![(HANDLE, CHARGE)]);
        assert!(table.release(HANDLE).is_none(), "gone once credited");
    }

    #[test]
    fn a_retained_handle_needs_two_releases() {
        let table = VmmTable::default();
        table.created(HANDLE, CHARGE);
        table.retained(HANDLE);
        assert_eq!(table.release(HANDLE).map(|(_, freed)| freed), Some(None));
        assert_eq!(table.release(HANDLE).map(|(_, freed)| freed), Some(Some(CHARGE)));
    }

    #[test]
    fn unmapping_one_of_two_mappings_keeps_the_memory() {
        let table = VmmTable::default();
        table.created(HANDLE, CHARGE);
        table.mapped(0x1000_0000, 1 << 20, HANDLE);
        table.mapped(0x2000_0000, 1 << 20, HANDLE);
        let _ = table.release(HANDLE);
        let first = table.unmap(0x1000_0000, 1 << 20);
        assert!(table.unmapped(&first).is_empty());
        let second = table.unmap(0x2000_0000, 1 << 20);
        assert_eq!(table.unmapped(&second), vec![(HANDLE, CHARGE)]);
    }
}
