//! Swappable memory as chunks of physical memory under a fixed address range: made (`cuMemAlloc`),
//! freed, placed on the card while waiting for room, and copied out and back in.

use super::*;

impl Swap {
    /// Whether new memory of `bytes` on overcommitted `device` should be swappable
    /// (`hooks::memory::backing`): an arbiter runs, the allocation is not tiny, and the budget fits
    /// the card (a budget past the card needs memory that spills, which unified memory gives).
    pub fn wants(&self, runtime: &Runtime, device: usize, bytes: usize) -> bool {
        if bytes < SMALLEST || calls().is_none() {
            return false;
        }
        let Some(limit) = runtime.ledger().limit(device) else { return false };
        let mut total = 0usize;
        // SAFETY: a valid out-pointer.
        if unsafe { driver::cuda().device_total_mem(&mut total, device as CUdevice) }.is_err()
            || limit > total as u64
        {
            return false;
        }
        self.arbiter_alive(runtime, device)
    }

    /// `cuMemAlloc_v2` of swappable memory on `device`: charged, reserved, backed chunk by chunk.
    /// `Ok(false)`: no room came within the patience (nothing was charged); the caller falls back
    /// to managed memory.
    ///
    /// # Safety
    /// `dptr` is the application's non-null out-pointer.
    pub unsafe fn alloc(
        &self,
        runtime: &Runtime,
        device: usize,
        dptr: *mut CUdeviceptr,
        bytes: usize,
    ) -> Result<bool, HookError> {
        let Some(calls) = calls() else { return Ok(false) };
        let mut inner = self.resident_inner(runtime);
        self.take_part(runtime, &mut inner, device);
        let context = current_context(calls);
        let granularity = granularity(calls, device);
        let span = bytes.div_ceil(granularity) * granularity;
        let mut made = None;
        let mut no_room = false;
        let created = reserve_for(runtime, device, bytes as u64, || {
            let mut address: CUdeviceptr = 0;
            // SAFETY: a valid out-pointer; the driver picks the address.
            check(unsafe { (calls.reserve)(&mut address, span, 0, 0, 0) })?;
            let mut chunks = Vec::with_capacity(span.div_ceil(CHUNK));
            let mut offset = 0;
            while offset < span {
                chunks.push(Chunk { offset, size: CHUNK.min(span - offset), handle: 0, host: Host::None });
                offset += CHUNK;
            }
            let deadline = self.allocation_deadline(device);
            loop {
                let error = match self.place(
                    runtime,
                    calls,
                    device,
                    address,
                    &Origin::Ours { size: bytes, ordered: false },
                    &mut chunks,
                    Wait { deadline: Some(deadline), beyond: 0 },
                ) {
                    Ok(()) => break,
                    Err(error) => error,
                };
                for chunk in chunks.iter_mut().filter(|chunk| chunk.handle != 0) {
                    unplace(calls, address, chunk);
                }
                if let Unplaced::Yield(request) = error {
                    // Two processes each holding part of the card and waiting for the rest would
                    // wait forever: the arbiter asked this one to let go of what it had made.
                    self.mark_handled(runtime, request);
                    continue;
                }
                // SAFETY: the range we reserved, with nothing mapped in it any more.
                unsafe { (calls.address_free)(address, span) };
                return Err(match error {
                    Unplaced::Driver(error) => error,
                    _ => {
                        no_room = true;
                        self.ran_out_of_room(device);
                        HookError::Driver(CUDA_ERROR_OUT_OF_MEMORY)
                    }
                });
            }
            made = Some(chunks);
            Ok(address)
        });
        let (address, allocation) = match created {
            Ok(created) => created,
            Err(_) if no_room => return Ok(false),
            Err(error) => return Err(error),
        };
        let Some(chunks) = made else { return Ok(false) };
        inner.blocks.insert(
            address,
            Block { allocation, span, context, chunks, origin: Origin::Ours { size: bytes, ordered: false } },
        );
        self.add(runtime, device, Word::Resident, span as i64);
        self.active.store(true, Ordering::Relaxed);
        // An allocation is activity: its memory is pinned for once the process is idle.
        self.note_activity(runtime);
        self.pinning.store(true, Ordering::Relaxed);
        // SAFETY: the caller's non-null out-pointer, written once the allocation exists.
        unsafe { dptr.write(address) };
        Ok(true)
    }

    /// `cuMemFree_v2` of `address`: `None` when it is not swappable memory of ours (the caller
    /// frees it as before). Memory off the card is not brought back to be freed.
    pub fn free(&self, runtime: &Runtime, address: CUdeviceptr) -> Option<Result<(), HookError>> {
        if !self.active.load(Ordering::Relaxed) {
            return None;
        }
        let calls = calls()?;
        let mut inner = self.inner.lock();
        // The application's VMM ranges are unmapped, never freed, by it.
        if !matches!(inner.blocks.get(&address)?.origin, Origin::Ours { .. }) {
            return None;
        }
        if Swap::is_kept(&inner, address) {
            // Freed in stream order already ([`ordered`]): the driver's answer to a second free.
            return Some(Err(HookError::Driver(CUDA_ERROR_INVALID_VALUE)));
        }
        self.release_block(runtime, calls, &mut inner, address, true);
        Some(Ok(()))
    }

    /// Gives the block at `address` back: its chunks to the driver, its host memory, its range,
    /// its charge. With `wait`, work still queued in its context finishes first, as `cuMemFree`
    /// waits for it.
    pub(super) fn release_block(
        &self,
        runtime: &Runtime,
        calls: &Calls,
        inner: &mut Inner,
        address: CUdeviceptr,
        wait: bool,
    ) {
        let Some(mut block) = inner.blocks.remove(&address) else { return };
        let device = block.allocation.device;
        if wait && block.chunks.iter().any(|chunk| chunk.handle != 0) {
            with_context(calls, block.context, || {
                // SAFETY: no arguments.
                unsafe { (calls.ctx_sync)() }
            });
        }
        let mut resident = 0;
        let mut off_card = 0;
        for chunk in &mut block.chunks {
            if chunk.handle != 0 {
                resident += chunk.size;
                unplace(calls, address, chunk);
            } else {
                off_card += chunk.size;
            }
            if matches!(chunk.host, Host::Pinned(_)) {
                self.add(runtime, device, Word::Pinned, -(chunk.size as i64));
            }
            drop_host(calls, block.context, &mut chunk.host);
        }
        // SAFETY: the range we reserved, with nothing mapped in it any more.
        unsafe { (calls.address_free)(address, block.span) };
        if off_card > 0 {
            // What `copy_out` counted for this block: all of it, or the part a forced request moved.
            let charged = block.charged(off_card as u64);
            self.swapped[device].fetch_sub(charged.min(self.swapped(device)), Ordering::Relaxed);
        }
        self.add(runtime, device, Word::Resident, -(resident as i64));
        self.add(runtime, device, Word::Swapped, -(off_card as i64));
        runtime.ledger().release(device, block.allocation.bytes, block.allocation.owner);
    }

    /// The process takes part in the swap on `device` from now on: its record shows it (waiting
    /// included) and its agent thread runs.
    pub(super) fn take_part(&self, runtime: &Runtime, inner: &mut Inner, device: usize) {
        self.devices.fetch_or(1 << device, Ordering::Relaxed);
        if inner.agent != std::process::id() {
            inner.agent = std::process::id();
            self.set_phase(runtime, Phase::Resident, false);
            start_agent();
        }
        self.count_unswappable(runtime, inner, device);
    }

    /// Backs every chunk of the range at `address` that is off the card with new physical memory,
    /// mapped and made accessible. While the card has no room, says so in the table and waits,
    /// until `deadline` if there is one, or until the arbiter asks this process to let go.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn place(
        &self,
        runtime: &Runtime,
        calls: &Calls,
        device: usize,
        address: CUdeviceptr,
        origin: &Origin,
        chunks: &mut [Chunk],
        wait: Wait,
    ) -> Result<(), Unplaced> {
        // Ours are read-write for their device; the application's get what it asked for.
        let ours = [AccessDesc {
            location: CUmemLocation { kind: CU_MEM_LOCATION_TYPE_DEVICE, id: device as c_int },
            flags: ACCESS_READ_WRITE,
        }];
        let (prop, access) = match origin {
            Origin::Ours { .. } => (allocation_prop(device), &ours[..]),
            Origin::Application { props, access, .. } => (props.prop(), &access[..]),
        };
        for index in 0..chunks.len() {
            if chunks[index].handle != 0 {
                continue;
            }
            let handle =
                self.create_waiting(runtime, calls, chunks[index].size, &prop, wait.deadline, || {
                    wait.beyond
                        + chunks[index..]
                            .iter()
                            .filter(|chunk| chunk.handle == 0)
                            .map(|chunk| chunk.size as u64)
                            .sum::<u64>()
                })?;
            let chunk = &mut chunks[index];
            let at = address + chunk.offset as CUdeviceptr;
            // SAFETY: `at..at+size` lies in the block's reservation and is unmapped; the handle
            // is ours.
            let mapped = check(unsafe { (calls.map)(at, chunk.size, 0, handle, 0) }).and_then(|()| {
                if access.is_empty() {
                    return Ok(());
                }
                // SAFETY: the range just mapped; `access.len()` descriptors.
                check(unsafe { (calls.set_access)(at, chunk.size, access.as_ptr(), access.len()) })
            });
            if let Err(error) = mapped {
                // SAFETY: our own handle (and mapping, if the map succeeded).
                unsafe {
                    (calls.unmap)(at, chunk.size);
                    (calls.release)(handle);
                }
                return Err(Unplaced::Driver(error));
            }
            chunk.handle = handle;
        }
        Ok(())
    }

    /// A new allocation's wait for room on `device` ran out: the next ones there do not wait
    /// ([`Swap::allocation_deadline`]).
    pub(super) fn ran_out_of_room(&self, device: usize) {
        if let Some(at) = self.no_room_at.get(device) {
            at.store(now().max(1), Ordering::Relaxed);
        }
    }

    /// Until when a new allocation on `device` waits for room ([`patience_ns`]): not at all
    /// within [`NO_ROOM_MEMORY_NS`] of a wait that ran out.
    pub(super) fn allocation_deadline(&self, device: usize) -> u64 {
        let now = now();
        let ran_out = self.no_room_at.get(device).map_or(0, |at| at.load(Ordering::Relaxed));
        if ran_out != 0 && now.saturating_sub(ran_out) < NO_ROOM_MEMORY_NS {
            return now;
        }
        now.saturating_add(patience_ns())
    }

    /// `cuMemCreate` of `size` bytes with `prop` (on its device), waiting for room while the card
    /// is full: the record says the process waits, and for how many bytes (`wanted`), so that the arbiter asks
    /// an idle process to make room.
    pub(super) fn create_waiting(
        &self,
        runtime: &Runtime,
        calls: &Calls,
        size: usize,
        prop: &CUmemAllocationProp,
        deadline: Option<u64>,
        wanted: impl Fn() -> u64,
    ) -> Result<CUmemGenericAllocationHandle, Unplaced> {
        let device = prop.location.id.max(0) as usize;
        let mut waiting = false;
        let mut said = false;
        loop {
            let mut handle = 0;
            // SAFETY: valid out-pointer and properties.
            let status = unsafe { (calls.create)(&mut handle, size, prop, 0) };
            if status == CUDA_SUCCESS {
                if waiting {
                    self.set_waiting(runtime, device, 0);
                    if let Some(at) = self.no_room_at.get(device) {
                        at.store(0, Ordering::Relaxed);
                    }
                }
                return Ok(handle);
            }
            if status != CUDA_ERROR_OUT_OF_MEMORY {
                if waiting {
                    self.set_waiting(runtime, device, 0);
                }
                return Err(Unplaced::Driver(HookError::Driver(status)));
            }
            let now = now();
            if deadline.is_some_and(|deadline| now >= deadline) {
                self.set_waiting(runtime, device, 0);
                return Err(Unplaced::Deadline);
            }
            if let Some(request) = self.pending_request(runtime) {
                self.set_waiting(runtime, device, 0);
                return Err(Unplaced::Yield(request));
            }
            if !waiting {
                waiting = true;
                self.set_waiting(runtime, device, wanted());
            }
            if !said && !self.arbiter_alive(runtime, device) {
                said = true;
                tracing::warn!(
                    "device {device}: waiting for room on the card to bring this process's memory back, \
                     and no swap arbiter is running (vgpu-smi serve --swap)"
                );
            }
            std::thread::sleep(Duration::from_micros(500));
        }
    }

    /// Brings every chunk that is off the card back, then opens the gate. Any thread may call it;
    /// one does the work while the others wait for the lock and find it done.
    pub(super) fn bring_back(&self, runtime: &Runtime) {
        let Some(calls) = calls() else { return };
        let started = now();
        let mut inner = self.inner.lock();
        if !inner.out {
            drop(inner);
            // A swap-out that was declined closed the gate for a moment.
            let mut guard = self.inner.lock();
            if self.closed.load(Ordering::SeqCst) && !guard.out {
                self.opened.wait_for(&mut guard, Duration::from_millis(1));
            }
            return;
        }
        self.set_phase(runtime, Phase::SwappingIn, false);
        let devices = self.devices.load(Ordering::Relaxed);
        let CopiedIn { bytes: copied, staged, early } = runtime.driver_memory.paused(|| {
            let copied = self.copy_in(runtime, calls, &mut inner);
            // Back on the card, before the reconciliation may look again: between the two it
            // would read the memory in NVML's count and still off the card in ours, and charge
            // it twice until its next round.
            for device in (0..MAX_DEVICES).filter(|device| devices & (1 << device) != 0) {
                self.swapped[device].store(0, Ordering::Relaxed);
            }
            copied
        });
        let done = now();
        for device in 0..MAX_DEVICES {
            if devices & (1 << device) != 0 {
                self.add(runtime, device, Word::SwapIns, 1);
                self.add(runtime, device, Word::WaitNs, done.saturating_sub(started) as i64);
                self.add(runtime, device, Word::InNs, done.saturating_sub(started) as i64);
            }
        }
        // ci/gpu-swap reads the rate from the line's start.
        let staged = if staged > 0 {
            format!(", {staged} of them staged through pinned buffers, {early} of them as they were placed")
        } else {
            String::new()
        };
        tracing::info!(
            "swapped in {copied} bytes in {} ms ({:.1} GB/s){staged}",
            done.saturating_sub(started) / 1_000_000,
            copied as f64 / done.saturating_sub(started).max(1) as f64
        );
        inner.out = false;
        self.set_phase(runtime, Phase::Resident, false);
        self.closed.store(false, Ordering::SeqCst);
        self.opened.notify_all();
    }

    /// Maps new physical memory under every chunk that is off the card and copies its bytes back,
    /// on the copy streams of its context.
    pub(super) fn copy_in(&self, runtime: &Runtime, calls: &Calls, inner: &mut Inner) -> CopiedIn {
        let mut copied = 0u64;
        let mut contexts: Vec<usize> = Vec::new();
        // The chunks placed in this round, to give back if the arbiter asks this process to let go.
        let mut placed: Vec<(CUdeviceptr, usize)> = Vec::new();
        // Chunks held in pageable memory go through the pinned ring as they are placed; those of a
        // context with no ring are copied once every chunk is placed, through the pinned buffers
        // of chunks already copied (see `Staging`).
        let mut deferred: Vec<(CUdeviceptr, usize)> = Vec::new();
        let mut staging = Staging::default();
        'round: loop {
            let Inner { blocks, streams, rings, .. } = &mut *inner;
            for (&context, buffers) in rings.iter() {
                let stream = streams_of(calls, streams, context)[0] as CUstream;
                for &buffer in buffers {
                    staging.offer(calls, (context, stream), buffer, CHUNK, false);
                }
            }
            // What is still off the card, for the record's `wanted` while this process waits.
            let mut missing: u64 = blocks
                .values()
                .flat_map(|block| &block.chunks)
                .filter(|chunk| chunk.handle == 0)
                .map(|chunk| chunk.size as u64)
                .sum();
            for (&address, block) in blocks.iter_mut() {
                let device = block.allocation.device;
                let streams = streams_of(calls, streams, block.context);
                if !contexts.contains(&block.context) {
                    contexts.push(block.context);
                }
                for index in 0..block.chunks.len() {
                    if block.chunks[index].handle != 0 {
                        continue;
                    }
                    // Waits as long as it takes: the memory is the application's.
                    missing -= block.chunks[index].size as u64;
                    let chunk = &mut block.chunks[index..=index];
                    match self.place(
                        runtime,
                        calls,
                        device,
                        address,
                        &block.origin,
                        chunk,
                        Wait { deadline: None, beyond: missing },
                    ) {
                        Ok(()) => placed.push((address, index)),
                        Err(Unplaced::Yield(request)) => {
                            // The arbiter asks this waiting process for room (another process
                            // waits too, each holding part of the card; or one of higher priority
                            // waits): give back what this round placed (the host copies still
                            // hold the bytes: no pinned buffer has been used for staging yet).
                            sync_streams(calls, &inner.streams, &contexts);
                            deferred.clear();
                            staging.release(calls);
                            staging.staged = 0;
                            let amount = self.amount(runtime);
                            let mut given = 0u64;
                            for (address, index) in placed.drain(..) {
                                let Some(block) = inner.blocks.get_mut(&address) else { continue };
                                let chunk = &mut block.chunks[index];
                                unplace(calls, address, chunk);
                                copied -= chunk.size as u64;
                                given += chunk.size as u64;
                                self.add(
                                    runtime,
                                    block.allocation.device,
                                    Word::Resident,
                                    -(chunk.size as i64),
                                );
                                self.add(runtime, block.allocation.device, Word::Swapped, chunk.size as i64);
                            }
                            // A process that went out only in part (a forced request) still holds
                            // the rest: what the request asks for goes too (everything, for an
                            // amount of 0), or the other waiter could wait for ever; as much as
                            // host memory takes.
                            if amount == 0 || given < amount {
                                let rest = if amount == 0 { 0 } else { amount - given };
                                if let Some(rest) = self.fit_to_host(inner, rest, request) {
                                    self.copy_out(runtime, calls, inner, rest);
                                }
                            }
                            self.mark_handled(runtime, request);
                            tracing::debug!(
                                "let go of the card for another waiting process (request {request})"
                            );
                            continue 'round;
                        }
                        Err(_) => {
                            tracing::error!("device {device}: cannot map memory back at {address:#x}");
                            continue;
                        }
                    }
                    let chunk = &block.chunks[index];
                    let stream = streams[index % STREAMS] as CUstream;
                    let source = match chunk.host {
                        Host::Pinned(at) => at,
                        Host::Pageable(source) => {
                            if staging.can_carry(block.context, chunk.size) {
                                let target = address + chunk.offset as CUdeviceptr;
                                staging.carry(calls, block.context, stream, target, source, chunk.size);
                            } else {
                                deferred.push((address, index));
                            }
                            copied += chunk.size as u64;
                            self.add(runtime, device, Word::Resident, chunk.size as i64);
                            self.add(runtime, device, Word::Swapped, -(chunk.size as i64));
                            continue;
                        }
                        Host::None => continue,
                    };
                    with_context(calls, block.context, || {
                        // SAFETY: the chunk is mapped again; the host buffer holds its bytes.
                        unsafe {
                            (calls.htod)(
                                address + chunk.offset as CUdeviceptr,
                                source as *const c_void,
                                chunk.size,
                                stream,
                            )
                        }
                    });
                    staging.offer(calls, (block.context, stream), source, chunk.size, true);
                    copied += chunk.size as u64;
                    self.add(runtime, device, Word::Resident, chunk.size as i64);
                    self.add(runtime, device, Word::Swapped, -(chunk.size as i64));
                }
            }
            break;
        }
        // Every chunk is placed: nothing can be given back unplaced any more, so the pinned
        // buffers of the chunks copied above may carry the pageable ones left. Until now only the
        // ring has carried: what it carried went as the chunks were placed.
        let early = staging.staged;
        staging.unhold();
        for (address, index) in deferred {
            let Some(block) = inner.blocks.get(&address) else { continue };
            let chunk = &block.chunks[index];
            let Host::Pageable(source) = chunk.host else { continue };
            let streams = streams_of(calls, &mut inner.streams, block.context);
            let stream = streams[index % STREAMS] as CUstream;
            let target = address + chunk.offset as CUdeviceptr;
            staging.carry(calls, block.context, stream, target, source, chunk.size);
        }
        sync_streams(calls, &inner.streams, &contexts);
        staging.release(calls);
        // Pageable buffers are kept for the next swap-out, their pages left for the kernel to take
        // back ([`keep`]); a chunk with one, or none (a partial swap-out left it on the card
        // unpinned: only chunks off the card are pinned while out), may be pinned ahead again.
        for block in inner.blocks.values_mut() {
            for chunk in &mut block.chunks {
                if let Host::Pageable(at) = chunk.host {
                    keep(at);
                }
                if !matches!(chunk.host, Host::Pinned(_)) {
                    self.pinning.store(true, Ordering::Relaxed);
                }
            }
        }
        CopiedIn { bytes: copied, staged: staging.staged, early }
    }

    /// Copies chunks on the card to host memory and gives each one's physical memory back as soon
    /// as its copy is done: every chunk (`amount` 0), or chunks until at least `amount` bytes have
    /// moved, those with a pinned host buffer first (they copy at the link's speed). A chunk whose
    /// copy fails stays on the card, and others are tried in its place. Returns the bytes moved.
    pub(super) fn copy_out(&self, runtime: &Runtime, calls: &Calls, inner: &mut Inner, amount: u64) -> Moved {
        let Inner { blocks, streams, rings, .. } = inner;
        // Work the application queued finishes first.
        let mut contexts: Vec<usize> = blocks.values().map(|block| block.context).collect();
        contexts.dedup();
        for &context in &contexts {
            with_context(calls, context, || {
                // SAFETY: no arguments.
                unsafe { (calls.ctx_sync)() }
            });
        }
        let mut moved = Moved::default();
        // Chunks chosen so far, and bytes moved by block (for the charge).
        let mut tried: HashSet<(CUdeviceptr, usize)> = HashSet::new();
        let mut moved_of: HashMap<CUdeviceptr, u64> = HashMap::new();
        let mut failed = Failed::default();
        loop {
            let on_card =
                blocks.iter().filter(|(_, block)| block.swappable()).flat_map(|(&address, block)| {
                    block.chunks.iter().enumerate().filter(|(_, chunk)| chunk.handle != 0).map(
                        move |(index, chunk)| ((address, index), chunk.size as u64, chunk.host != Host::None),
                    )
                });
            // What is still to move (a pass ends short only where copies failed).
            let left = if amount == 0 { 0 } else { amount.saturating_sub(moved.bytes) };
            let chosen = choose(on_card.filter(|(key, _, _)| !tried.contains(key)), left);
            if chosen.is_empty() {
                break;
            }
            tried.extend(chosen.iter().copied());
            for (&address, block) in blocks.iter_mut() {
                let before = moved.bytes;
                self.move_chunks(
                    runtime,
                    calls,
                    (streams, rings),
                    address,
                    block,
                    &chosen,
                    &mut failed,
                    &mut moved,
                );
                *moved_of.entry(address).or_default() += moved.bytes - before;
            }
            if amount == 0 || moved.bytes >= amount {
                break;
            }
        }
        if let Some(first) = failed.first {
            tracing::warn!(
                "{} chunks ({} bytes) could not be copied out and stay on the card; the first: {first}",
                failed.chunks,
                failed.bytes
            );
        }
        // NVML stops counting the chunks; the reconciliation must not read that as the driver
        // giving memory back.
        for (address, bytes) in moved_of {
            if let Some(block) = blocks.get(&address) {
                self.swapped[block.allocation.device].fetch_add(block.charged(bytes), Ordering::Relaxed);
            }
        }
        moved
    }

    /// Copies the `chosen` chunks of the block at `address` to host memory on its context's copy
    /// streams and gives each one's physical memory back once its copy is done: a chunk with a
    /// pinned buffer straight into it, one held in pageable memory through the context's pinned
    /// ring ([`ring`]) when there is one. Adds what moved to `moved`; chunks that could not be
    /// copied are counted in `failed`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn move_chunks(
        &self,
        runtime: &Runtime,
        calls: &Calls,
        (streams, rings): (&mut Streams, &mut Rings),
        address: CUdeviceptr,
        block: &mut Block,
        chosen: &HashSet<(CUdeviceptr, usize)>,
        failed: &mut Failed,
        moved: &mut Moved,
    ) {
        if !(0..block.chunks.len()).any(|index| chosen.contains(&(address, index))) {
            return;
        }
        let device = block.allocation.device;
        let context = block.context;
        let streams = streams_of(calls, streams, context);
        let mut pending: Vec<(usize, usize)> = Vec::new(); // (chunk index, event)
        // The ring's buffers, each with the chunk whose copy into it is in flight, and its event;
        // made only for a chunk that goes out through pageable memory.
        let pageable_chosen = block.chunks.iter().enumerate().any(|(index, chunk)| {
            chunk.handle != 0 && chosen.contains(&(address, index)) && !matches!(chunk.host, Host::Pinned(_))
        });
        let ring: Vec<usize> = if pageable_chosen {
            self.ring(runtime, calls, rings, context, device).map(<[usize]>::to_vec).unwrap_or_default()
        } else {
            Vec::new()
        };
        let mut slots: Vec<Option<(usize, usize)>> = vec![None; ring.len()];
        let mut turn = 0usize;
        for index in 0..block.chunks.len() {
            let chunk = &mut block.chunks[index];
            if chunk.handle == 0 || !chosen.contains(&(address, index)) {
                continue;
            }
            if chunk.host == Host::None {
                chunk.host = pageable(chunk.size).map_or(Host::None, Host::Pageable);
                // While out, the agent moves it into pinned memory.
                self.pinning.store(true, Ordering::Relaxed);
            } else if matches!(chunk.host, Host::Pageable(_)) {
                moved.kept += chunk.size as u64;
            }
            let (Host::Pinned(mut to) | Host::Pageable(mut to)) = chunk.host else {
                tracing::warn!(
                    "device {device}: no host memory for {} bytes; they stay on the card",
                    chunk.size
                );
                continue;
            };
            let ringed = matches!(chunk.host, Host::Pageable(_)) && !ring.is_empty();
            let slot = turn % ring.len().max(1);
            if ringed {
                // The slot's previous chunk lands in its pageable buffer first.
                turn += 1;
                if let Some((earlier, event)) = slots[slot].take() {
                    self.land(runtime, calls, (address, block), earlier, event, ring[slot], failed, moved);
                }
                to = ring[slot];
            }
            let chunk = &mut block.chunks[index];
            let stream = streams[index % STREAMS] as CUstream;
            let event = with_context(calls, context, || {
                let mut event: *mut c_void = std::ptr::null_mut();
                // SAFETY: the chunk is mapped; `to` holds `size` bytes; our own stream/event.
                unsafe {
                    let status = (calls.dtoh)(
                        to as *mut c_void,
                        address + chunk.offset as CUdeviceptr,
                        chunk.size,
                        stream,
                    );
                    if status != CUDA_SUCCESS {
                        return Err(("cuMemcpyDtoHAsync", status));
                    }
                    let status = (calls.event_create)(&mut event, EVENT_DISABLE_TIMING);
                    if status != CUDA_SUCCESS {
                        return Err(("cuEventCreate", status));
                    }
                    (calls.event_record)(event, stream);
                }
                Ok(event as usize)
            });
            match event {
                Ok(event) if ringed => slots[slot] = Some((index, event)),
                Ok(event) => pending.push((index, event)),
                Err((call, status)) => failed.add(device, chunk, context, call, status),
            }
        }
        for (slot, taken) in slots.into_iter().enumerate() {
            if let Some((index, event)) = taken {
                self.land(runtime, calls, (address, block), index, event, ring[slot], failed, moved);
            }
        }
        for (index, event) in pending {
            self.land(runtime, calls, (address, block), index, event, 0, failed, moved);
        }
    }

    /// Finishes chunk `index` of the block at `address`, whose copy to host memory `event` follows:
    /// once it has landed, from the ring's `buffer` (0: none, the copy went straight to the
    /// chunk's own buffer) on into the chunk's pageable buffer by several threads; then the chunk's
    /// physical memory is given back.
    #[allow(clippy::too_many_arguments)]
    fn land(
        &self,
        runtime: &Runtime,
        calls: &Calls,
        (address, block): (CUdeviceptr, &mut Block),
        index: usize,
        event: usize,
        buffer: usize,
        failed: &mut Failed,
        moved: &mut Moved,
    ) {
        let (device, context) = (block.allocation.device, block.context);
        let chunk = &mut block.chunks[index];
        let copied = with_context(calls, context, || {
            // SAFETY: our own event.
            unsafe {
                let status = (calls.event_sync)(event as *mut c_void);
                (calls.event_destroy)(event as *mut c_void);
                status
            }
        });
        if copied != CUDA_SUCCESS {
            failed.add(device, chunk, context, "cuEventSynchronize", copied);
            return;
        }
        if buffer != 0 {
            let Host::Pageable(to) = chunk.host else { return };
            // SAFETY: the ring buffer holds the chunk's bytes now that its copy has landed, and
            // the pageable buffer a chunk's size; both are ours and distinct.
            unsafe { copy_parallel(to as *mut u8, buffer as *const u8, chunk.size) };
            moved.ringed += chunk.size as u64;
        }
        unplace(calls, address, chunk);
        moved.bytes += chunk.size as u64;
        self.add(runtime, device, Word::Resident, -(chunk.size as i64));
        self.add(runtime, device, Word::Swapped, chunk.size as i64);
    }
}

/// What a swap-in copied back ([`Swap::copy_in`]): bytes, those of them staged through pinned
/// buffers ([`Staging`]), and those of them carried before the last chunk was placed (while the
/// process making room for it may still have been going out).
pub(super) struct CopiedIn {
    bytes: u64,
    staged: u64,
    early: u64,
}

/// Waits for the copy streams of `contexts`.
pub(super) fn sync_streams(calls: &Calls, streams: &HashMap<usize, [usize; STREAMS]>, contexts: &[usize]) {
    for &context in contexts {
        let Some(streams) = streams.get(&context) else { continue };
        for &stream in streams {
            with_context(calls, context, || {
                // SAFETY: our own stream.
                unsafe { (calls.stream_sync)(stream as CUstream) }
            });
        }
    }
}

/// Chunks a swap-out could not copy, said in one line at its end rather than one per chunk.
#[derive(Default)]
pub(super) struct Failed {
    chunks: usize,
    bytes: u64,
    /// The first failure: the call, its status, the chunk's host memory and its context.
    first: Option<String>,
}

impl Failed {
    fn add(&mut self, device: usize, chunk: &Chunk, context: usize, call: &str, status: CUresult) {
        self.chunks += 1;
        self.bytes += chunk.size as u64;
        if self.first.is_none() {
            let host = match chunk.host {
                Host::Pinned(_) => "pinned",
                Host::Pageable(_) => "pageable",
                Host::None => "no",
            };
            self.first = Some(format!(
                "device {device}: {call} returned {status} copying {} bytes into {host} host memory (context {context:#x})",
                chunk.size
            ));
        }
    }
}

/// The copy streams of `context`, made on first use.
pub(super) fn streams_of(
    calls: &Calls,
    streams: &mut HashMap<usize, [usize; STREAMS]>,
    context: usize,
) -> [usize; STREAMS] {
    *streams.entry(context).or_insert_with(|| {
        with_context(calls, context, || {
            std::array::from_fn(|_| {
                let mut stream: CUstream = std::ptr::null_mut();
                // SAFETY: a valid out-pointer. A failure leaves the NULL stream, which still works.
                unsafe { (calls.stream_create)(&mut stream, STREAM_NON_BLOCKING) };
                stream as usize
            })
        })
    })
}

/// Runs `f` with `context` current on this thread, then puts the thread's own context back.
pub(super) fn with_context<T>(calls: &Calls, context: usize, f: impl FnOnce() -> T) -> T {
    let before = current_context(calls);
    if before != context {
        // SAFETY: a context of this process (or NULL).
        unsafe { (calls.ctx_set)(context as CUcontext) };
    }
    let result = f();
    if before != context {
        // SAFETY: as above.
        unsafe { (calls.ctx_set)(before as CUcontext) };
    }
    result
}

pub(super) fn current_context(calls: &Calls) -> usize {
    let mut context: CUcontext = std::ptr::null_mut();
    // SAFETY: a valid out-pointer.
    unsafe { (calls.ctx_get)(&mut context) };
    context as usize
}

pub(super) fn allocation_prop(device: usize) -> CUmemAllocationProp {
    CUmemAllocationProp {
        kind: ALLOCATION_PINNED,
        requested_handle_types: 0,
        location: CUmemLocation { kind: CU_MEM_LOCATION_TYPE_DEVICE, id: device as c_int },
        win32_handle_metadata: std::ptr::null_mut(),
        alloc_flags: [0; 8],
    }
}

/// The device's allocation granularity for VMM memory (at least 2 MiB).
pub(super) fn granularity(calls: &Calls, device: usize) -> usize {
    let prop = allocation_prop(device);
    let mut granularity = 0usize;
    // SAFETY: valid out-pointer and properties; option 0 is the minimum granularity.
    unsafe { (calls.granularity)(&mut granularity, &prop, 0) };
    granularity.max(2 << 20)
}

/// Unmaps a chunk and gives its physical memory back to the driver.
pub(super) fn unplace(calls: &Calls, address: CUdeviceptr, chunk: &mut Chunk) {
    // SAFETY: the chunk's own mapping and handle.
    unsafe {
        (calls.unmap)(address + chunk.offset as CUdeviceptr, chunk.size);
        (calls.release)(chunk.handle);
    }
    chunk.handle = 0;
}
