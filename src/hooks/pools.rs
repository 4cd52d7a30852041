//! Stream-ordered allocation (`cuMemAllocAsync`, `cuMemAllocFromPoolAsync`, `cuMemFreeAsync`):
//! what a pool costs is the device memory it holds, not what it has handed out.
//!
//! A pool keeps freed memory cached up to its release threshold (PyTorch's `cudaMallocAsync`
//! backend sets it to "never release"), so the container's real usage is every pool's *reserved*
//! bytes. Each pool is charged exactly that: before an allocation we reserve what the pool may
//! have to grow by (the request less the pool's idle cache, in 2 MiB granules, at least 32 MiB); after
//! it we read the pool's reserved bytes from the driver and settle the charge to them. Frees settle
//! the same way, so memory a pool keeps stays charged and memory it gives back is credited.
//!
//! The bound: a pool that grows by more than we reserved (the driver's own chunking) is charged
//! what it really took, even past the budget, and later allocations are refused until usage is back
//! within it. Charges can lag behind a pool that shrinks at a synchronize; before refusing anything
//! this process re-reads its pools, so stale charges never cost it an allocation.
//!
//! Under a swap arbiter, allocations from a device's default pool are the swap's instead
//! (`hooks/swap/ordered.rs`): the driver's pool holds memory the swap cannot move.

// Streams and pools are opaque driver handles: passed on, never dereferenced.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::{Mutex, MutexGuard};

use crate::driver::{self, sys::*};
use crate::error::HookError;
use crate::hooks::memory::{Backing, backing, budgeted_current, credit};
use crate::ledger::Owner;
use crate::runtime::Runtime;

/// Pools grow in whole granules of physical memory...
const GRANULE: u64 = 2 << 20;
/// ...and by at least this much at a time (measured: a 1 MiB allocation from an empty default pool
/// reserves 32 MiB on an H200 with driver 580).
const SMALLEST_GROWTH: u64 = 32 << 20;

/// A pool's key: its handle's address.
pub(crate) type PoolKey = usize;

/// What one pool is charged.
#[derive(Clone, Copy, Debug)]
struct PoolCharge {
    device: usize,
    charged: u64,
    owner: Owner,
}

/// The pools this process allocated from, and which pool each live pointer came from.
#[derive(Debug, Default)]
pub struct PoolTable {
    charges: Mutex<HashMap<PoolKey, PoolCharge>>,
    pointers: Mutex<HashMap<CUdeviceptr, PoolKey>>,
    /// Set once any pool is charged: frees and queries look at pools only after that.
    in_use: AtomicBool,
}

/// The pool's `attribute` (a `cuuint64_t`).
pub(crate) fn pool_bytes(pool: PoolKey, attribute: i32) -> Result<u64, HookError> {
    let mut value: u64 = 0;
    driver::invoke(driver::cuda().mem_pool_get_attribute, "cuMemPoolGetAttribute", |f| {
        // SAFETY: both attributes we ask for are `cuuint64_t`, and `value` is one.
        unsafe { f(pool as CUmemoryPool, attribute, (&raw mut value).cast::<c_void>()) }
    })?;
    Ok(value)
}

impl PoolTable {
    pub fn in_use(&self) -> bool {
        self.in_use.load(Ordering::Acquire)
    }

    /// What an allocation of `bytes` may make `pool` grow by: the request less the pool's idle
    /// cache, in whole granules, and at least the driver's smallest growth step.
    fn growth_bound(pool: PoolKey, bytes: u64) -> u64 {
        let reserved = pool_bytes(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
        let used = pool_bytes(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT);
        let idle = match (reserved, used) {
            (Ok(reserved), Ok(used)) => reserved.saturating_sub(used),
            _ => 0,
        };
        match bytes.saturating_sub(idle) {
            0 => 0,
            short => short.div_ceil(GRANULE).saturating_mul(GRANULE).max(SMALLEST_GROWTH),
        }
    }

    /// Brings `pool`'s charge to the bytes it holds now, folding in `held` bytes reserved for it
    /// ahead of an allocation.
    fn settle(&self, runtime: &Runtime, pool: PoolKey, device: usize, held: u64, owner: Owner) {
        let ledger = runtime.ledger();
        let mut charges = self.charges.lock();
        let entry = charges.entry(pool).or_insert(PoolCharge { device, charged: 0, owner });
        let mut held = held;
        if entry.device != device {
            // Reserved on another device than the pool's: give that back, charge the pool's.
            ledger.release(device, held, owner);
            held = 0;
        }
        let charged = entry.charged.saturating_add(held);
        let Ok(reserved) = pool_bytes(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) else {
            // The pool is gone (destroyed): it holds nothing any more.
            let device = entry.device;
            ledger.release(device, charged, entry.owner);
            charges.remove(&pool);
            note_pooled(runtime, device, charges);
            return;
        };
        if reserved > charged {
            match ledger.record_committed(entry.device, reserved - charged) {
                Ok(owner) => entry.owner = owner,
                Err(error) => tracing::warn!(?error, "cannot record a pool's growth"),
            }
        } else {
            ledger.release(entry.device, charged - reserved, owner);
        }
        entry.charged = reserved;
        let device = entry.device;
        self.in_use.store(true, Ordering::Release);
        note_pooled(runtime, device, charges);
    }

    /// Re-reads every pool: memory given back at a synchronize is credited.
    fn settle_all(&self, runtime: &Runtime) {
        let pools: Vec<(PoolKey, PoolCharge)> = self.charges.lock().iter().map(|(&k, &v)| (k, v)).collect();
        for (pool, charge) in pools {
            self.settle(runtime, pool, charge.device, 0, charge.owner);
        }
    }

    /// Settles this process's pools if it has any, so a query or a refusal sees what they hold
    /// now.
    pub fn refresh(&self, runtime: &Runtime) {
        if self.in_use() {
            self.settle_all(runtime);
        }
    }
}

/// On an overcommitted device, tells the swap what this process's pools hold there (`charges`,
/// released first): memory that stays on the card through a swap, which its record shows.
fn note_pooled(runtime: &Runtime, device: usize, charges: MutexGuard<'_, HashMap<PoolKey, PoolCharge>>) {
    if !runtime.ledger().overcommit(device) {
        return;
    }
    let pooled = charges.values().filter(|charge| charge.device == device).map(|charge| charge.charged).sum();
    drop(charges);
    runtime.swap.note_pooled(runtime, device, pooled);
}

/// Allocates `bytes` from `pool` on `device` through `allocate`, then settles the pool's charge.
///
/// # Safety
/// `dptr` is non-null and is the out-pointer `allocate` hands to the driver.
unsafe fn allocate_from(
    runtime: &Runtime,
    device: usize,
    pool: PoolKey,
    dptr: *mut CUdeviceptr,
    bytes: usize,
    allocate: impl FnOnce() -> Result<(), HookError>,
) -> Result<(), HookError> {
    let held = PoolTable::growth_bound(pool, bytes as u64);
    let owner = runtime.reserve(device, held)?;
    if let Err(error) = allocate() {
        runtime.ledger().release(device, held, owner);
        return Err(error);
    }
    // SAFETY: the driver succeeded, so it wrote the new address through the non-null `dptr`.
    let address = unsafe { dptr.read() };
    runtime.pools.pointers.lock().insert(address, pool);
    runtime.pools.settle(runtime, pool, device, held, owner);
    Ok(())
}

/// The default-stream or per-thread-stream (`_ptsz`) variant of a stream-ordered entry point.
pub fn stream_variant<F>(
    per_thread: bool,
    legacy: (Option<F>, &'static str),
    ptsz: (Option<F>, &'static str),
) -> (Option<F>, &'static str) {
    if per_thread { ptsz } else { legacy }
}

/// The current memory pool of `device`.
pub(crate) fn current_pool(device: usize) -> Result<PoolKey, HookError> {
    let mut pool: CUmemoryPool = std::ptr::null_mut();
    driver::invoke(driver::cuda().device_get_mem_pool, "cuDeviceGetMemPool", |f| {
        // SAFETY: `pool` is a valid out-pointer; `device` is an ordinal of this process.
        unsafe { f(&mut pool, device as CUdevice) }
    })?;
    Ok(pool as PoolKey)
}

/// Serves a stream-ordered allocation from the swap's own pool where the device is overcommitted
/// under a live arbiter and the allocation is one the swap takes (`hooks/swap/ordered.rs`):
/// `Ok(true)` when it did.
///
/// # Safety
/// `dptr` is the application's non-null out-pointer.
unsafe fn swappable(
    runtime: &Runtime,
    device: usize,
    dptr: *mut CUdeviceptr,
    bytes: usize,
    pool: Option<CUmemoryPool>,
    stream: CUstream,
    per_thread: bool,
) -> Result<bool, HookError> {
    let swap = &runtime.swap;
    if backing(runtime, device, bytes) != Backing::Swappable
        || !swap.ordered_takes(device, pool, stream, per_thread)
    {
        return Ok(false);
    }
    // SAFETY: as this function's contract.
    unsafe { swap.alloc_ordered(runtime, device, dptr, bytes, stream, per_thread) }
}

/// `cuMemAllocAsync` and its `_ptsz` twin (`per_thread`): from the current device's current pool.
///
/// # Safety
/// `dptr` is the application's out-pointer, handed to the driver as it is.
pub unsafe fn alloc_async(
    runtime: &Runtime,
    dptr: *mut CUdeviceptr,
    bytes: usize,
    stream: CUstream,
    per_thread: bool,
) -> Result<(), HookError> {
    let cuda = driver::cuda();
    let (entry, name) = stream_variant(
        per_thread,
        (cuda.mem_alloc_async, "cuMemAllocAsync"),
        (cuda.mem_alloc_async_ptsz, "cuMemAllocAsync_ptsz"),
    );
    let allocate = || {
        driver::invoke(entry, name, |f| {
            // SAFETY: the application's arguments, forwarded unchanged.
            unsafe { f(dptr, bytes, stream) }
        })
    };
    let device = if dptr.is_null() { None } else { budgeted_current(runtime) };
    let Some(device) = device else { return allocate() };
    // SAFETY: `dptr` is the application's non-null out-pointer.
    if unsafe { swappable(runtime, device, dptr, bytes, None, stream, per_thread) }? {
        return Ok(());
    }
    let pool = current_pool(device)?;
    // SAFETY: `dptr` is non-null and `allocate` hands it to the driver.
    unsafe { allocate_from(runtime, device, pool, dptr, bytes, allocate) }
}

/// `cuMemAllocFromPoolAsync` and its `_ptsz` twin. The pool's device is taken to be the current
/// one (pools are made for the device their user works on).
///
/// # Safety
/// `dptr` is the application's out-pointer, handed to the driver as it is.
pub unsafe fn alloc_from_pool_async(
    runtime: &Runtime,
    dptr: *mut CUdeviceptr,
    bytes: usize,
    pool: CUmemoryPool,
    stream: CUstream,
    per_thread: bool,
) -> Result<(), HookError> {
    let cuda = driver::cuda();
    let (entry, name) = stream_variant(
        per_thread,
        (cuda.mem_alloc_from_pool_async, "cuMemAllocFromPoolAsync"),
        (cuda.mem_alloc_from_pool_async_ptsz, "cuMemAllocFromPoolAsync_ptsz"),
    );
    let allocate = || {
        driver::invoke(entry, name, |f| {
            // SAFETY: the application's arguments, forwarded unchanged.
            unsafe { f(dptr, bytes, pool, stream) }
        })
    };
    let device = if dptr.is_null() || pool.is_null() { None } else { budgeted_current(runtime) };
    let Some(device) = device else { return allocate() };
    // SAFETY: `dptr` is the application's non-null out-pointer.
    if unsafe { swappable(runtime, device, dptr, bytes, Some(pool), stream, per_thread) }? {
        return Ok(());
    }
    // SAFETY: `dptr` is non-null and `allocate` hands it to the driver.
    unsafe { allocate_from(runtime, device, pool as PoolKey, dptr, bytes, allocate) }
}

/// Frees `dptr` with `free`. A pointer from a pool settles that pool's charge afterwards; any
/// other goes through the ordinary credit.
#[inline]
pub fn free_pointer(
    runtime: &Runtime,
    dptr: CUdeviceptr,
    free: impl FnOnce() -> Result<(), HookError>,
) -> Result<(), HookError> {
    let pools = &runtime.pools;
    let pool = if pools.in_use() { pools.pointers.lock().remove(&dptr) } else { None };
    let Some(pool) = pool else { return credit(runtime, &runtime.allocations, dptr, free) };
    if let Err(error) = free() {
        pools.pointers.lock().insert(dptr, pool);
        return Err(error);
    }
    let charge = pools.charges.lock().get(&pool).copied();
    if let Some(charge) = charge {
        pools.settle(runtime, pool, charge.device, 0, charge.owner);
    }
    Ok(())
}

/// `cuMemPoolTrimTo`: the pool gives back what it keeps past `keep` bytes, and its charge follows;
/// the swap's own pool does the same where `pool` is a device's default pool.
pub fn trim_to(runtime: &Runtime, pool: CUmemoryPool, keep: usize) -> Result<(), HookError> {
    runtime.swap.trim_kept_to(runtime, pool, keep as u64);
    driver::invoke(driver::cuda().mem_pool_trim_to, "cuMemPoolTrimTo", |f| {
        // SAFETY: the application's arguments, forwarded unchanged; the driver validates the pool.
        unsafe { f(pool, keep) }
    })?;
    let pools = &runtime.pools;
    let charge = if pools.in_use() { pools.charges.lock().get(&(pool as PoolKey)).copied() } else { None };
    if let Some(charge) = charge {
        pools.settle(runtime, pool as PoolKey, charge.device, 0, charge.owner);
    }
    Ok(())
}

/// `cuMemPoolGetAttribute`: the driver's answer; a default pool's memory statistics count the
/// swap's own pool too (`hooks/swap/ordered.rs`).
///
/// # Safety
/// `value` is the application's out-pointer for `attribute`.
pub unsafe fn get_attribute(
    runtime: &Runtime,
    pool: CUmemoryPool,
    attribute: c_int,
    value: *mut c_void,
) -> Result<(), HookError> {
    driver::invoke(driver::cuda().mem_pool_get_attribute, "cuMemPoolGetAttribute", |f| {
        // SAFETY: the application's arguments, forwarded unchanged.
        unsafe { f(pool, attribute, value) }
    })?;
    let bytes = (CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT..=CU_MEMPOOL_ATTR_USED_MEM_HIGH).contains(&attribute);
    if bytes && !value.is_null() {
        let value = value.cast::<u64>();
        // SAFETY: the driver wrote a `cuuint64_t` there for these attributes.
        unsafe {
            value.write_unaligned(runtime.swap.pool_statistic(pool, attribute, value.read_unaligned()))
        };
    }
    Ok(())
}

/// `cuMemPoolSetAttribute`: the driver's; a reset of a default pool's high-water mark resets the
/// swap's own pool's too.
///
/// # Safety
/// `value` is the application's pointer to the attribute's new value.
pub unsafe fn set_attribute(
    runtime: &Runtime,
    pool: CUmemoryPool,
    attribute: c_int,
    value: *mut c_void,
) -> Result<(), HookError> {
    driver::invoke(driver::cuda().mem_pool_set_attribute, "cuMemPoolSetAttribute", |f| {
        // SAFETY: the application's arguments, forwarded unchanged.
        unsafe { f(pool, attribute, value) }
    })?;
    runtime.swap.reset_pool_high(pool, attribute);
    Ok(())
}

/// `cuMemFreeAsync` and its `_ptsz` twin.
pub fn free_async(
    runtime: &Runtime,
    dptr: CUdeviceptr,
    stream: CUstream,
    per_thread: bool,
) -> Result<(), HookError> {
    let cuda = driver::cuda();
    let (entry, name) = stream_variant(
        per_thread,
        (cuda.mem_free_async, "cuMemFreeAsync"),
        (cuda.mem_free_async_ptsz, "cuMemFreeAsync_ptsz"),
    );
    if let Some(freed) = runtime.swap.free_ordered(runtime, dptr, stream, per_thread) {
        return freed;
    }
    // Spillable memory freed in stream order stops counting as spillable with its charge.
    runtime.spill.free(runtime, dptr, || {
        free_pointer(runtime, dptr, || {
            driver::invoke(entry, name, |f| {
                // SAFETY: the arguments are forwarded unchanged; the driver validates them.
                unsafe { f(dptr, stream) }
            })
        })
    })
}
