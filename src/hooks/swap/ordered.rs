//! Stream-ordered memory under the arbiter: `cuMemAllocAsync` from a device's default pool, and
//! `cuMemAllocFromPoolAsync` from that pool, as PyTorch's `cudaMallocAsync` backend, CuPy's
//! `MemoryAsyncPool` and XLA's `cuda_malloc_async` allocator use them. The driver's pool keeps its
//! physical memory where the swap cannot move it, so while an arbiter runs these allocations come
//! from a pool of libvgpu's own, made of swappable blocks ([`Swap::alloc`]):
//!
//! - A free in stream order (`cuMemFreeAsync`) keeps its block, with an event recorded on the
//!   freeing stream: the work queued before the free may still use it.
//! - An allocation takes the smallest kept block of its span (up to a quarter more) that its own
//!   stream freed, which stream order makes safe at once, or whose event has completed. Otherwise
//!   it makes a new block.
//! - Kept blocks whose work is done are given back beyond the default pool's release threshold
//!   (`CU_MEMPOOL_ATTR_RELEASE_THRESHOLD`, which the application sets on the driver's pool: 0
//!   unless it does, "never" under PyTorch) at the next stream-ordered call or `cuMemGetInfo`;
//!   down to what `cuMemPoolTrimTo` of the default pool keeps (PyTorch's `empty_cache`); all of
//!   them, waiting for their work, before a new block would not fit the budget; and all of them at
//!   a swap-out, which never copies memory the application has freed.
//! - A free made while its stream is captured into a graph keeps its block until the process
//!   ends: the graph's nodes may use it whenever the graph is launched.
//!
//! Kept blocks stay charged, as the driver's pool's reserved memory is (`hooks/pools.rs`). The
//! default pool's memory statistics (`cuMemPoolGetAttribute`'s reserved and used bytes and their
//! high-water marks) count this pool too, added to the driver's.
//! Allocations below [`SMALLEST`], from any other pool, or made during capture (a graph's
//! allocation node) stay the driver's.

use super::*;
use crate::hooks::pools::{PoolKey, current_pool, pool_bytes};

/// A kept block serves a request whose span is at least this part of its own (4/5: up to a quarter
/// more than the request).
const FIT_NUMERATOR: usize = 4;
const FIT_DENOMINATOR: usize = 5;

/// The high-water marks of the swap's own pool on a device since the application last reset them.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct High {
    used: u64,
    reserved: u64,
}

/// A block freed in stream order and kept for reuse.
#[derive(Debug)]
pub(super) struct Kept {
    address: CUdeviceptr,
    span: usize,
    device: usize,
    /// The freeing stream, when a later allocation on it may take the block at once (a stream the
    /// application made, or a context's legacy stream); `None` for a thread's per-thread stream.
    stream: Option<(usize, usize)>,
    context: usize,
    /// Recorded on the freeing stream after the free; 0: freed during capture, never reused.
    event: usize,
}

/// The device's default pool, or `None` when the driver has none.
fn default_pool(device: usize) -> Option<PoolKey> {
    let f = driver::cuda().device_get_default_mem_pool?;
    let mut pool: CUmemoryPool = std::ptr::null_mut();
    // SAFETY: a valid out-pointer; `device` is an ordinal of this process.
    let status = unsafe { f(&mut pool, device as CUdevice) };
    (status == CUDA_SUCCESS && !pool.is_null()).then_some(pool as PoolKey)
}

/// The default pool's release threshold (0 when it cannot be read).
fn release_threshold(device: usize) -> u64 {
    default_pool(device)
        .and_then(|pool| pool_bytes(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD).ok())
        .unwrap_or(0)
}

/// The stream a stream-ordered call means: a NULL stream of a `_ptsz` entry point is the thread's
/// per-thread stream.
fn stream_of(stream: CUstream, per_thread: bool) -> CUstream {
    if per_thread && stream.is_null() { CU_STREAM_PER_THREAD } else { stream }
}

/// The stream as a key a later allocation's stream may equal: the handle and its context, or
/// `None` for a per-thread stream (the same handle names another stream on every thread).
fn stream_key(stream: CUstream, context: usize) -> Option<(usize, usize)> {
    (stream != CU_STREAM_PER_THREAD).then_some((stream as usize, context))
}

impl Swap {
    /// Whether the swap's own pool serves a stream-ordered allocation of swappable memory on
    /// `device` from `pool` (`None`: the current pool) on `stream`: the pool is the device's
    /// default one, and the stream is not being captured.
    pub fn ordered_takes(
        &self,
        device: usize,
        pool: Option<CUmemoryPool>,
        stream: CUstream,
        per_thread: bool,
    ) -> bool {
        let pool = match pool {
            Some(pool) => Some(pool as usize),
            None => current_pool(device).ok(),
        };
        pool.is_some()
            && pool == default_pool(device)
            && !driver::cuda().stream_capturing(stream_of(stream, per_thread)).unwrap_or(true)
    }

    /// A stream-ordered allocation of `bytes` on `device` for `stream`: a kept block, or a new one.
    /// `Ok(false)` as [`Swap::alloc`].
    ///
    /// # Safety
    /// `dptr` is the application's non-null out-pointer.
    pub unsafe fn alloc_ordered(
        &self,
        runtime: &Runtime,
        device: usize,
        dptr: *mut CUdeviceptr,
        bytes: usize,
        stream: CUstream,
        per_thread: bool,
    ) -> Result<bool, HookError> {
        let Some(calls) = calls() else { return Ok(false) };
        let granularity = granularity(calls, device);
        let span = bytes.div_ceil(granularity) * granularity;
        {
            let mut inner = self.resident_inner(runtime);
            let key = stream_key(stream_of(stream, per_thread), current_context(calls));
            if let Some(at) = reusable(calls, &inner.kept, device, span, key) {
                let kept = inner.kept.remove(at);
                inner.spare_events.push((kept.context, kept.event));
                asked_for(&mut inner, kept.address, bytes);
                drop(inner);
                self.note_activity(runtime);
                // SAFETY: the caller's non-null out-pointer.
                unsafe { dptr.write(kept.address) };
                return Ok(true);
            }
            self.give_back_kept(runtime, calls, &mut inner, device, release_threshold(device), false);
            let ledger = runtime.ledger();
            let room = ledger.limit(device).unwrap_or(u64::MAX).saturating_sub(ledger.used(device));
            if room < span as u64 {
                self.give_back_kept(runtime, calls, &mut inner, device, 0, true);
            }
        }
        // SAFETY: the caller's non-null out-pointer.
        let made = unsafe { self.alloc(runtime, device, dptr, span) }?;
        if made {
            // SAFETY: `alloc` wrote the new block's address there.
            let address = unsafe { dptr.read() };
            asked_for(&mut self.inner.lock(), address, bytes);
        }
        Ok(made)
    }

    /// `cuMemFreeAsync` of `address` on `stream`: `None` when it is not swappable memory of ours
    /// (the caller frees it as before).
    pub fn free_ordered(
        &self,
        runtime: &Runtime,
        address: CUdeviceptr,
        stream: CUstream,
        per_thread: bool,
    ) -> Option<Result<(), HookError>> {
        if !self.active.load(Ordering::Relaxed) {
            return None;
        }
        let calls = calls()?;
        let mut inner = self.inner.lock();
        let (device, span) = match inner.blocks.get(&address)? {
            block if matches!(block.origin, Origin::Ours { .. }) => (block.allocation.device, block.span),
            _ => return None,
        };
        if Swap::is_kept(&inner, address) {
            // Freed twice: the driver's answer for a pointer it no longer knows.
            return Some(Err(HookError::Driver(CUDA_ERROR_INVALID_VALUE)));
        }
        let stream = stream_of(stream, per_thread);
        let context = current_context(calls);
        // A stream the driver cannot answer for gets its answer, as the free would natively.
        let capturing = match driver::cuda().stream_capturing(stream) {
            Ok(capturing) => capturing,
            Err(error) => return Some(Err(error)),
        };
        let event = if capturing {
            0
        } else {
            let event = spare_event(calls, &mut inner.spare_events, context);
            // SAFETY: our event and the application's stream, both of the current context.
            match check(unsafe { (calls.event_record)(event as *mut c_void, stream) }) {
                Ok(()) => event,
                Err(error) => {
                    inner.spare_events.push((context, event));
                    return Some(Err(error));
                }
            }
        };
        let key = if event == 0 { None } else { stream_key(stream, context) };
        inner.kept.push(Kept { address, span, device, stream: key, context, event });
        self.give_back_kept(runtime, calls, &mut inner, device, release_threshold(device), false);
        Some(Ok(()))
    }

    /// Whether `address` is a block freed in stream order and kept (a `cuMemFree` of it is a
    /// second free).
    pub(super) fn is_kept(inner: &Inner, address: CUdeviceptr) -> bool {
        inner.kept.iter().any(|kept| kept.address == address)
    }

    /// Gives kept blocks of this process back as the pool's threshold allows (`cuMemGetInfo`).
    pub fn trim_kept(&self, runtime: &Runtime) {
        if !self.active.load(Ordering::Relaxed) {
            return;
        }
        let Some(calls) = calls() else { return };
        let mut inner = self.inner.lock();
        let devices: Vec<usize> = inner.kept.iter().map(|kept| kept.device).collect();
        for device in devices {
            self.give_back_kept(runtime, calls, &mut inner, device, release_threshold(device), false);
        }
    }

    /// Gives every kept block back before a swap-out: the gate is closed, and none of them holds
    /// anything the application will read.
    pub(super) fn give_back_all_kept(&self, runtime: &Runtime, calls: &Calls, inner: &mut Inner) {
        let devices: Vec<usize> = inner.kept.iter().map(|kept| kept.device).collect();
        for device in devices {
            self.give_back_kept(runtime, calls, inner, device, 0, true);
        }
    }

    /// The device whose default pool `pool` is, among those the swap serves.
    fn device_of_default(&self, pool: CUmemoryPool) -> Option<usize> {
        let devices = self.devices.load(Ordering::Relaxed);
        (0..MAX_DEVICES)
            .find(|&device| devices & (1 << device) != 0 && default_pool(device) == Some(pool as usize))
    }

    /// `cuMemPoolGetAttribute` of `pool`, whose driver's answer is `value`: for a device's default
    /// pool, the memory statistics count the swap's own pool too (what PyTorch's `memory_stats`
    /// reads under its `cudaMallocAsync` backend).
    pub fn pool_statistic(&self, pool: CUmemoryPool, attribute: c_int, value: u64) -> u64 {
        if !self.active.load(Ordering::Relaxed)
            || !(CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT..=CU_MEMPOOL_ATTR_USED_MEM_HIGH).contains(&attribute)
        {
            return value;
        }
        let Some(device) = self.device_of_default(pool) else { return value };
        let inner = self.inner.lock();
        let (used, reserved) = own_pool(&inner, device);
        let high = inner.own_pool_high[device];
        value.saturating_add(match attribute {
            CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT => reserved,
            CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH => high.reserved,
            CU_MEMPOOL_ATTR_USED_MEM_CURRENT => used,
            _ => high.used,
        })
    }

    /// The application reset a high-water mark of `pool` (`cuMemPoolSetAttribute` of
    /// `_RESERVED_MEM_HIGH` or `_USED_MEM_HIGH` to 0): the swap's own pool's goes to its current
    /// value too.
    pub fn reset_pool_high(&self, pool: CUmemoryPool, attribute: c_int) {
        if !self.active.load(Ordering::Relaxed)
            || !matches!(attribute, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH | CU_MEMPOOL_ATTR_USED_MEM_HIGH)
        {
            return;
        }
        let Some(device) = self.device_of_default(pool) else { return };
        let mut inner = self.inner.lock();
        let (used, reserved) = own_pool(&inner, device);
        let high = &mut inner.own_pool_high[device];
        if attribute == CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH {
            high.reserved = reserved;
        } else {
            high.used = used;
        }
    }

    /// `cuMemPoolTrimTo` of `pool`: where it is a device's default pool, kept blocks of that device
    /// whose work is done are given back until `keep` bytes or fewer are left.
    pub fn trim_kept_to(&self, runtime: &Runtime, pool: CUmemoryPool, keep: u64) {
        if !self.active.load(Ordering::Relaxed) {
            return;
        }
        let Some(calls) = calls() else { return };
        let mut inner = self.inner.lock();
        let mut devices: Vec<usize> = inner.kept.iter().map(|kept| kept.device).collect();
        devices.sort_unstable();
        devices.dedup();
        for device in devices.into_iter().filter(|&device| default_pool(device) == Some(pool as usize)) {
            self.give_back_kept(runtime, calls, &mut inner, device, keep, false);
        }
    }

    /// Gives kept blocks of `device` back to the driver and the budget, oldest first, until `keep`
    /// bytes or fewer are left: those whose work is done, or with `wait` every one after its work.
    /// Blocks freed during capture stay.
    fn give_back_kept(
        &self,
        runtime: &Runtime,
        calls: &Calls,
        inner: &mut Inner,
        device: usize,
        keep: u64,
        wait: bool,
    ) {
        let mut kept_bytes: u64 =
            inner.kept.iter().filter(|kept| kept.device == device).map(|kept| kept.span as u64).sum();
        let mut at = 0;
        while at < inner.kept.len() && kept_bytes > keep {
            let kept = &inner.kept[at];
            let done = || {
                with_context(calls, kept.context, || {
                    // SAFETY: our event, recorded on the freeing stream.
                    let status = unsafe {
                        if wait {
                            (calls.event_sync)(kept.event as *mut c_void)
                        } else {
                            (calls.event_query)(kept.event as *mut c_void)
                        }
                    };
                    status == CUDA_SUCCESS
                })
            };
            if kept.device != device || kept.event == 0 || !done() {
                at += 1;
                continue;
            }
            let kept = inner.kept.remove(at);
            inner.spare_events.push((kept.context, kept.event));
            kept_bytes -= kept.span as u64;
            self.release_block(runtime, calls, inner, kept.address, false);
        }
    }
}

/// The kept block an allocation of `span` on `device` on the stream `key` may take now: the
/// smallest that fits, its work done or freed on that very stream.
fn reusable(
    calls: &Calls,
    kept: &[Kept],
    device: usize,
    span: usize,
    key: Option<(usize, usize)>,
) -> Option<usize> {
    let fits = |k: &Kept| {
        k.device == device
            && k.event != 0
            && k.span >= span
            && span.saturating_mul(FIT_DENOMINATOR) >= k.span.saturating_mul(FIT_NUMERATOR)
    };
    let ready = |k: &Kept| {
        (key.is_some() && k.stream == key)
            || with_context(calls, k.context, || {
                // SAFETY: our event, recorded on the freeing stream.
                unsafe { (calls.event_query)(k.event as *mut c_void) == CUDA_SUCCESS }
            })
    };
    let mut candidates: Vec<usize> = (0..kept.len()).filter(|&at| fits(&kept[at])).collect();
    candidates.sort_by_key(|&at| kept[at].span);
    candidates.into_iter().find(|&at| ready(&kept[at]))
}

/// The block at `address` now holds a stream-ordered allocation of `bytes` (its span, and charge,
/// stay); the pool's high-water marks follow.
fn asked_for(inner: &mut Inner, address: CUdeviceptr, bytes: usize) {
    let Some(block) = inner.blocks.get_mut(&address) else { return };
    block.origin = Origin::Ours { size: bytes, ordered: true };
    let device = block.allocation.device;
    let (used, reserved) = own_pool(inner, device);
    let high = &mut inner.own_pool_high[device];
    high.used = high.used.max(used);
    high.reserved = high.reserved.max(reserved);
}

/// The swap's own pool on `device`: bytes handed out (what live allocations asked for) and bytes
/// held (the spans of live and kept blocks), as a driver pool counts its used and reserved memory.
fn own_pool(inner: &Inner, device: usize) -> (u64, u64) {
    let (mut used, mut reserved) = (0, 0);
    for (&address, block) in &inner.blocks {
        if let Origin::Ours { size, ordered: true } = block.origin
            && block.allocation.device == device
        {
            reserved += block.span as u64;
            if !Swap::is_kept(inner, address) {
                used += size as u64;
            }
        }
    }
    (used, reserved)
}

/// An event of `context` for recording a free: a spare one, or a new one.
fn spare_event(calls: &Calls, spare: &mut Vec<(usize, usize)>, context: usize) -> usize {
    if let Some(at) = spare.iter().position(|&(of, _)| of == context) {
        return spare.swap_remove(at).1;
    }
    let mut event: *mut c_void = std::ptr::null_mut();
    // SAFETY: a valid out-pointer; the event belongs to the current context, `context`.
    unsafe { (calls.event_create)(&mut event, EVENT_DISABLE_TIMING) };
    event as usize
}
