//! Virtual memory management (`hipMemCreate` and friends): physical memory is charged when created
//! and credited when the runtime really frees it, with the CUDA side's reference rules.
//!
//! `hipMemCreate` and every `hipMemRetainAllocationHandle` add a reference that `hipMemRelease`
//! drops, and every `hipMemMap` keeps the memory alive until its `hipMemUnmap`. A handle released
//! while still mapped is still device memory, so the credit waits for the last reference and the
//! last mapping both. Address reservations cost nothing and are never seen here; handles imported
//! from another process (`hipMemImportFromShareableHandle`) are not in the table and cost nothing.

use std::collections::HashMap;
use std::ffi::c_void;

use parking_lot::Mutex;
use vgpu_ledger::Allocation;

use crate::error::HookError;
use crate::hooks::memory::budgeted;
use crate::runtime::Runtime;
use crate::sys::*;

/// A charged physical allocation and what keeps it alive.
#[derive(Clone, Copy, Debug)]
struct Physical {
    allocation: Allocation,
    references: u32,
    mappings: u32,
}

#[derive(Default, Debug)]
struct Tables {
    handles: HashMap<MemHandle, Physical>,
    /// Mapped address → handle, for mappings of charged handles.
    mappings: HashMap<u64, MemHandle>,
}

/// Charged handles. VMM calls are rare (a framework maps large segments), so one lock is enough;
/// it is never held across a runtime call.
#[derive(Default, Debug)]
pub struct VmmTable {
    tables: Mutex<Tables>,
}

impl VmmTable {
    /// Takes out every charged handle on `device` (its memory was freed at once).
    pub fn drain_device(&self, device: usize) -> Vec<Allocation> {
        let mut tables = self.tables.lock();
        let Tables { handles, mappings } = &mut *tables;
        let mut drained = Vec::new();
        handles.retain(|_, physical| {
            let doomed = physical.allocation.device == device;
            if doomed {
                drained.push(physical.allocation);
            }
            !doomed
        });
        mappings.retain(|_, handle| handles.contains_key(handle));
        drained
    }

    /// Applies `change` to `handle`, returning its charge if nothing keeps it alive any more.
    fn update(
        &self,
        handle: MemHandle,
        change: impl FnOnce(&mut Physical),
        mapping: Option<(u64, bool)>,
    ) -> Option<Allocation> {
        let mut tables = self.tables.lock();
        let physical = tables.handles.get_mut(&handle)?;
        change(physical);
        let dead = (physical.references == 0 && physical.mappings == 0).then_some(physical.allocation);
        if dead.is_some() {
            tables.handles.remove(&handle);
        }
        match mapping {
            Some((address, true)) => {
                tables.mappings.insert(address, handle);
            }
            Some((address, false)) => {
                tables.mappings.remove(&address);
            }
            None => {}
        }
        dead
    }
}

fn give_back(runtime: &Runtime, dead: Option<Allocation>) {
    if let Some(allocation) = dead {
        runtime.ledger().release(allocation.device, allocation.bytes, allocation.owner);
    }
}

/// `hipMemCreate`: charged `size` on the device its properties name.
///
/// # Safety
/// The application's arguments, per the runtime's contract.
pub unsafe fn create(
    runtime: &Runtime,
    handle: *mut MemHandle,
    size: usize,
    prop: *const u8,
    flags: u64,
) -> Result<(), HookError> {
    // SAFETY: forwarded unchanged.
    let call = || unsafe { runtime.real.hipMemCreate(handle, size, prop, flags) };
    // SAFETY: `prop` is NULL or the caller's hipMemAllocationProp of this runtime's layout.
    let device = unsafe { allocation_device(prop, runtime.version) };
    let device = if handle.is_null() { None } else { device.and_then(|device| budgeted(runtime, device)) };
    let Some(device) = device else { return call() };
    let ledger = runtime.ledger();
    let owner = runtime.reserve(device, size as u64)?;
    if let Err(error) = call() {
        ledger.release(device, size as u64, owner);
        return Err(error);
    }
    // SAFETY: the runtime succeeded, so it wrote the non-null out-pointer.
    let made = unsafe { handle.read() };
    let allocation = Allocation { device, bytes: size as u64, owner };
    runtime.vmm.tables.lock().handles.insert(made, Physical { allocation, references: 1, mappings: 0 });
    Ok(())
}

/// `hipMemRelease`: drops one reference.
///
/// # Safety
/// `handle` is the application's handle.
pub unsafe fn release(runtime: &Runtime, handle: MemHandle) -> Result<(), HookError> {
    // SAFETY: forwarded unchanged.
    unsafe { runtime.real.hipMemRelease(handle) }?;
    give_back(runtime, runtime.vmm.update(handle, |p| p.references = p.references.saturating_sub(1), None));
    Ok(())
}

/// `hipMemMap`: the mapping keeps the memory alive.
///
/// # Safety
/// The application's arguments, per the runtime's contract.
pub unsafe fn map(
    runtime: &Runtime,
    ptr: *mut c_void,
    size: usize,
    offset: usize,
    handle: MemHandle,
    flags: u64,
) -> Result<(), HookError> {
    // SAFETY: forwarded unchanged.
    unsafe { runtime.real.hipMemMap(ptr, size, offset, handle, flags) }?;
    give_back(runtime, runtime.vmm.update(handle, |p| p.mappings += 1, Some((ptr as u64, true))));
    Ok(())
}

/// `hipMemUnmap`: the memory mapped at `ptr` loses that mapping.
///
/// # Safety
/// The application's arguments, per the runtime's contract.
pub unsafe fn unmap(runtime: &Runtime, ptr: *mut c_void, size: usize) -> Result<(), HookError> {
    // SAFETY: forwarded unchanged.
    unsafe { runtime.real.hipMemUnmap(ptr, size) }?;
    let handle = runtime.vmm.tables.lock().mappings.get(&(ptr as u64)).copied();
    if let Some(handle) = handle {
        give_back(
            runtime,
            runtime.vmm.update(
                handle,
                |p| p.mappings = p.mappings.saturating_sub(1),
                Some((ptr as u64, false)),
            ),
        );
    }
    Ok(())
}

/// `hipMemRetainAllocationHandle`: one more reference to the handle mapped at `ptr`.
///
/// # Safety
/// `handle` is the application's out-pointer.
pub unsafe fn retain(runtime: &Runtime, handle: *mut MemHandle, ptr: *mut c_void) -> Result<(), HookError> {
    // SAFETY: forwarded unchanged.
    unsafe { runtime.real.hipMemRetainAllocationHandle(handle, ptr) }?;
    if !handle.is_null() {
        // SAFETY: the runtime succeeded, so it wrote the non-null out-pointer.
        let retained = unsafe { handle.read() };
        give_back(runtime, runtime.vmm.update(retained, |p| p.references += 1, None));
    }
    Ok(())
}
