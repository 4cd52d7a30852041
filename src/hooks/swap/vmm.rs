//! The application's own VMM memory (`cuMemCreate` + `cuMemMap`: PyTorch's expandable segments,
//! vLLM's and NCCL's allocators), made swappable under the arbiter.
//!
//! A driver handle cannot outlive its physical memory, so the application is given a handle of
//! ours ([`APPLICATION_HANDLE`] marks it) and the driver's stays here. The application's references
//! (`cuMemCreate`, `cuMemRetainAllocationHandle`, `cuMemRelease`) are counted by `hooks::vmm` on
//! our handle; the driver sees one reference, ours. A handle mapped whole at one address becomes a
//! block of one chunk: swapped out like `cuMemAlloc`'s chunks (unmapped, the physical memory given
//! back), and brought back at the same address with the properties it was created with and the
//! access the application last set. A handle mapped in part or twice, or exported to another
//! process, stays on the card: another mapping or process would still see the memory.
//!
//! Every call here takes the swap's lock with the process's memory on the card, so no swap-out
//! moves a handle while the application's call uses it.

use super::*;

/// Set in every handle the swap gives the application: the driver's handles are addresses in user
/// space, which never have these bits.
pub(super) const APPLICATION_HANDLE: u64 = 0xfeed_0000_0000_0000;

impl Swap {
    /// Whether the process holds swappable memory (its VMM calls then go through the swap).
    pub fn holds_any(&self) -> bool {
        self.active.load(Ordering::Relaxed)
    }

    /// Whether `handle` is one of the application's handles of this swap.
    pub fn owns_handle(&self, handle: CUmemGenericAllocationHandle) -> bool {
        handle & APPLICATION_HANDLE == APPLICATION_HANDLE
            && self.active.load(Ordering::Relaxed)
            && self.inner.lock().handles.contains_key(&handle)
    }

    /// `cuMemCreate` of `size` bytes on `device` with `prop`, swappable: the physical memory is
    /// made (waiting for room as a swap-in does, up to the allocation's patience) and the
    /// application's handle returned. `allocation` is what the caller charged.
    pub fn create_handle(
        &self,
        runtime: &Runtime,
        device: usize,
        size: usize,
        prop: &CUmemAllocationProp,
    ) -> Result<CUmemGenericAllocationHandle, HookError> {
        let Some(calls) = calls() else { return Err(HookError::Driver(CUDA_ERROR_NOT_FOUND)) };
        let mut inner = self.resident_inner(runtime);
        self.take_part(runtime, &mut inner, device);
        let props = Props::of(prop);
        let deadline = Some(self.allocation_deadline(device));
        let real = loop {
            match self.create_waiting(runtime, calls, size, &props.prop(), deadline, || size as u64) {
                Ok(real) => break real,
                // Two processes each holding part of the card: this one lets go of nothing it
                // made for this call, and asks again.
                Err(Unplaced::Yield(request)) => self.mark_handled(runtime, request),
                Err(Unplaced::Driver(error)) => return Err(error),
                Err(Unplaced::Deadline) => {
                    self.ran_out_of_room(device);
                    return Err(HookError::Driver(CUDA_ERROR_OUT_OF_MEMORY));
                }
            }
        };
        inner.last_handle += 1;
        let handle = APPLICATION_HANDLE | inner.last_handle;
        let record = ApplicationHandle {
            device,
            size,
            props,
            allocation: Allocation { device, bytes: size as u64, owner: 0 },
            real,
            block: None,
            other_mappings: 0,
            exported: false,
        };
        inner.handles.insert(handle, record);
        self.active.store(true, Ordering::Relaxed);
        Ok(handle)
    }

    /// Records what the caller charged for `handle` (its owner, for the block's charge).
    pub fn charged_handle(&self, handle: CUmemGenericAllocationHandle, allocation: Allocation) {
        if let Some(record) = self.inner.lock().handles.get_mut(&handle) {
            record.allocation = allocation;
        }
    }

    /// The driver's handle behind the application's `handle`, on the card, for `call`; the swap's
    /// lock is held meanwhile.
    pub fn with_real<T>(
        &self,
        runtime: &Runtime,
        handle: CUmemGenericAllocationHandle,
        call: impl FnOnce(CUmemGenericAllocationHandle) -> T,
    ) -> Option<T> {
        let inner = self.resident_inner(runtime);
        self.note_activity(runtime);
        let real = inner.real_of(handle)?;
        Some(call(real))
    }

    /// `cuMemMap` of the application's `handle` at `address`: mapped through the driver's handle
    /// by `map`; a mapping of the whole handle, its first, becomes a swappable block.
    pub fn map_handle(
        &self,
        runtime: &Runtime,
        address: CUdeviceptr,
        size: usize,
        offset: usize,
        handle: CUmemGenericAllocationHandle,
        map: impl FnOnce(CUmemGenericAllocationHandle) -> Result<(), HookError>,
    ) -> Result<(), HookError> {
        let Some(calls) = calls() else { return Err(HookError::Driver(CUDA_ERROR_NOT_FOUND)) };
        let mut inner = self.resident_inner(runtime);
        self.note_activity(runtime);
        let real = inner.real_of(handle).ok_or(HookError::Driver(CUDA_ERROR_INVALID_VALUE))?;
        map(real)?;
        let Inner { handles, blocks, .. } = &mut *inner;
        let Some(record) = handles.get_mut(&handle) else { return Ok(()) };
        let whole = offset == 0 && size == record.size;
        if whole && record.block.is_none() && record.other_mappings == 0 && !record.exported {
            let chunk = Chunk { offset: 0, size, handle: record.real, host: Host::None };
            record.real = 0;
            record.block = Some(address);
            let origin =
                Origin::Application { handle, props: record.props, access: Vec::new(), stays: false };
            let block = Block {
                allocation: record.allocation,
                span: size,
                context: current_context(calls),
                chunks: vec![chunk],
                origin,
            };
            blocks.insert(address, block);
            self.add(runtime, record.device, Word::Resident, size as i64);
            self.pinning.store(true, Ordering::Relaxed);
            let device = record.device;
            self.count_unswappable(runtime, &inner, device);
        } else {
            record.other_mappings += 1;
            self.keep_on_card(runtime, &mut inner, handle);
        }
        Ok(())
    }

    /// The application's `handle` stays on the card from now on (mapped again, or exported): its
    /// block, if it has one, leaves the swappable bytes, and the record counts it as unswappable.
    fn keep_on_card(&self, runtime: &Runtime, inner: &mut Inner, handle: CUmemGenericAllocationHandle) {
        let Inner { handles, blocks, .. } = inner;
        let Some(record) = handles.get(&handle) else { return };
        if let Some(block) = record.block.and_then(|at| blocks.get_mut(&at))
            && block.stay()
        {
            self.add(runtime, record.device, Word::Resident, -(block.span as i64));
        }
        let device = record.device;
        self.count_unswappable(runtime, inner, device);
    }

    /// Writes what of the application's memory on `device` cannot leave the card to the record:
    /// its VMM handles that stay, and what the driver's stream-ordered pools hold.
    pub(super) fn count_unswappable(&self, runtime: &Runtime, inner: &Inner, device: usize) {
        let Some(table) = self.table.get().and_then(Option::as_ref) else { return };
        let Some(place) = runtime.ledger().swap_place(device) else { return };
        let pooled = self.pooled[device].load(Ordering::Relaxed);
        table
            .get(place.lease, place.index, Word::Unswappable)
            .store(inner.unswappable(device).saturating_add(pooled), Ordering::Release);
    }

    /// This process's stream-ordered pools of the driver hold `bytes` on `device` now.
    pub fn note_pooled(&self, runtime: &Runtime, device: usize, bytes: u64) {
        let Some(pooled) = self.pooled.get(device) else { return };
        if pooled.swap(bytes, Ordering::Relaxed) != bytes
            && self.devices.load(Ordering::Relaxed) & (1 << device) != 0
        {
            let inner = self.inner.lock();
            self.count_unswappable(runtime, &inner, device);
        }
    }

    /// `cuMemUnmap` of mappings `removed` (start, size and handle, as `hooks::vmm` recorded them),
    /// by `unmap`: the blocks of the application's handles among them go, their memory staying
    /// with the handle.
    pub fn unmap_handles(
        &self,
        runtime: &Runtime,
        removed: &[(CUdeviceptr, usize, CUmemGenericAllocationHandle)],
        unmap: impl FnOnce() -> Result<(), HookError>,
    ) -> Result<(), HookError> {
        let Some(calls) = calls() else { return unmap() };
        let mut inner = self.resident_inner(runtime);
        self.note_activity(runtime);
        unmap()?;
        for &(start, _, handle) in removed {
            let Inner { handles, blocks, .. } = &mut *inner;
            let Some(record) = handles.get_mut(&handle) else { continue };
            if record.block != Some(start) {
                record.other_mappings = record.other_mappings.saturating_sub(1);
                continue;
            }
            record.block = None;
            let Some(mut block) = blocks.remove(&start) else { continue };
            let swappable = block.swappable();
            let Some(mut chunk) = block.chunks.pop() else { continue };
            record.real = chunk.handle;
            if matches!(chunk.host, Host::Pinned(_)) {
                self.add(runtime, record.device, Word::Pinned, -(chunk.size as i64));
            }
            drop_host(calls, block.context, &mut chunk.host);
            if swappable {
                self.add(runtime, record.device, Word::Resident, -(chunk.size as i64));
            }
        }
        let devices: HashSet<usize> =
            removed.iter().filter_map(|(_, _, handle)| inner.handles.get(handle)).map(|r| r.device).collect();
        for device in devices {
            self.count_unswappable(runtime, &inner, device);
        }
        Ok(())
    }

    /// The application's `handle` is gone (its last reference and mapping): the driver's handle is
    /// released.
    pub fn forget_handle(&self, handle: CUmemGenericAllocationHandle) {
        let Some(calls) = calls() else { return };
        let Some(record) = self.inner.lock().handles.remove(&handle) else { return };
        if record.real != 0 {
            // SAFETY: the driver's handle we made for it; nothing maps it any more.
            unsafe { (calls.release)(record.real) };
        }
    }

    /// `cuMemRetainAllocationHandle` at `address`: the application's handle mapped whole there,
    /// if one is (the caller counts the reference).
    pub fn handle_at(&self, runtime: &Runtime, address: CUdeviceptr) -> Option<CUmemGenericAllocationHandle> {
        if !self.active.load(Ordering::Relaxed) {
            return None;
        }
        let inner = self.resident_inner(runtime);
        let (_, block) = inner.blocks.range(..=address).next_back()?;
        match block.origin {
            Origin::Application { handle, .. } => {
                let record = inner.handles.get(&handle)?;
                let start = record.block?;
                (address < start + block.span as CUdeviceptr).then_some(handle)
            }
            Origin::Ours { .. } => None,
        }
    }

    /// The application's handle whose driver handle is `real` (one the driver answered), if any.
    pub fn handle_of_real(&self, real: CUmemGenericAllocationHandle) -> Option<CUmemGenericAllocationHandle> {
        if !self.active.load(Ordering::Relaxed) {
            return None;
        }
        let inner = self.inner.lock();
        inner.handles.keys().copied().find(|&handle| inner.real_of(handle) == Some(real))
    }

    /// `cuMemSetAccess` on `[address, address + size)` by `set`: the blocks of application handles
    /// inside it are given `access` again when they come back.
    pub fn set_access(
        &self,
        runtime: &Runtime,
        address: CUdeviceptr,
        size: usize,
        access: &[AccessDesc],
        set: impl FnOnce() -> Result<(), HookError>,
    ) -> Result<(), HookError> {
        let mut inner = self.resident_inner(runtime);
        self.note_activity(runtime);
        set()?;
        let end = address.saturating_add(size as CUdeviceptr);
        for (&start, block) in inner.blocks.range_mut(address..end) {
            if start + block.span as CUdeviceptr > end {
                continue;
            }
            if let Origin::Application { access: kept, .. } = &mut block.origin {
                *kept = access.to_vec();
            }
        }
        Ok(())
    }

    /// `cuMemExportToShareableHandle` of the application's `handle` by `export`: another process
    /// may map the memory from now on, so it stays on the card.
    pub fn export_handle(
        &self,
        runtime: &Runtime,
        handle: CUmemGenericAllocationHandle,
        export: impl FnOnce(CUmemGenericAllocationHandle) -> Result<(), HookError>,
    ) -> Result<(), HookError> {
        let mut inner = self.resident_inner(runtime);
        self.note_activity(runtime);
        let real = inner.real_of(handle).ok_or(HookError::Driver(CUDA_ERROR_INVALID_VALUE))?;
        export(real)?;
        if let Some(record) = inner.handles.get_mut(&handle) {
            record.exported = true;
            self.keep_on_card(runtime, &mut inner, handle);
        }
        Ok(())
    }
}
