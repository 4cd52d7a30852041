//! Stream-ordered memory (`hipMallocAsync`, `hipMallocFromPoolAsync`, `hipFreeAsync`) and the
//! pools it comes from: what a pool costs is the device memory it holds, not what it has handed
//! out. This is the CUDA side's rule (src/hooks/pools.rs) in HIP terms.
//!
//! A pool keeps freed memory cached up to its release threshold (`hipMemPoolAttrReleaseThreshold`;
//! PyTorch's `hipMallocAsync` backend sets it to "never release"), so each pool is charged its
//! reserved bytes (`hipMemPoolAttrReservedMemCurrent`). Before an allocation we reserve what the pool
//! may have to grow by, the request less its idle cache (reserved − used); after it we read the
//! pool's reserved bytes and settle the charge to them. Frees, `hipMemPoolTrimTo` and
//! `hipMemGetInfo` settle the same way, and before refusing an allocation this process re-reads its
//! pools, so memory they gave back at a synchronize never costs it one. `hipMemPoolDestroy` gives the
//! cache back at once; the pool's allocations still outstanding stay charged until they are freed
//! (the runtime keeps the pool until then), and a destroyed pool is never queried again.
//!
//! Which device: `hipMallocAsync` allocates from the current pool (`hipDeviceGetMemPool`) of its
//! stream's device (`hipStreamGetDevice`, else ROCm 5.x's `hipGetStreamDeviceId`; the null and
//! per-thread streams are the calling thread's current device). `hipMallocFromPoolAsync` charges its
//! pool's device: the location `hipMemPoolCreate` was given, or the device whose default pool it
//! is; a pool of host memory is not charged.
//!
//! The bound, as on the CUDA side: a pool that grows by more than was reserved (its cache could not
//! serve the request) is charged what it really took, even past the budget, and later allocations
//! are refused until usage is back within it. How ROCm's pools reuse their cache was never measured
//! here. A pool whose size cannot be read is charged what it has handed out.

// Streams and pools are opaque runtime handles: passed on, never dereferenced.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;
use vgpu_ledger::{Allocation, Owner};

use crate::error::HookError;
use crate::hooks::memory::{budgeted, charge, credit};
use crate::runtime::Runtime;
use crate::sys::*;

/// A pool's key: its handle's address.
type PoolKey = usize;

/// What one pool is charged.
#[derive(Clone, Copy, Debug)]
struct PoolCharge {
    device: usize,
    charged: u64,
    owner: Owner,
    /// Bytes of its allocations not yet freed: what a pool holds when its size cannot be read.
    live: u64,
    /// Destroyed with allocations outstanding: it holds `live` bytes, and is never queried again.
    destroyed: bool,
}

impl PoolCharge {
    /// A pool on `device` charged nothing yet.
    fn new(device: usize, owner: Owner) -> PoolCharge {
        PoolCharge { device, charged: 0, owner, live: 0, destroyed: false }
    }
}

#[derive(Debug, Default)]
struct Tables {
    /// Pools whose place is known: created ones (`None`: not device memory) and default pools.
    devices: HashMap<PoolKey, Option<HipDevice>>,
    charges: HashMap<PoolKey, PoolCharge>,
    /// Each live pool allocation: its pool and size.
    pointers: HashMap<u64, (PoolKey, u64)>,
}

/// The pools this process allocated from. One lock, held across the pool-size query of a settle
/// (so two settles of one pool cannot cross) but never across an allocation or a free.
#[derive(Debug, Default)]
pub struct PoolTable {
    tables: Mutex<Tables>,
    /// Set once any pool is charged: frees and refusals look at pools only after that.
    in_use: AtomicBool,
}

/// `pool`'s attribute `attribute` (a `uint64_t`).
fn pool_bytes(runtime: &Runtime, pool: PoolKey, attribute: i32) -> Result<u64, HookError> {
    let mut value: u64 = 0;
    // SAFETY: both attributes asked for are `uint64_t`s, and `value` is one.
    unsafe {
        runtime.real.hipMemPoolGetAttribute(pool as Opaque, attribute, (&raw mut value).cast::<c_void>())
    }?;
    Ok(value)
}

impl PoolTable {
    #[inline]
    pub fn in_use(&self) -> bool {
        self.in_use.load(Ordering::Acquire)
    }

    /// What an allocation of `bytes` may make `pool` grow by: the request less the pool's idle
    /// cache; the whole request when the pool cannot say.
    fn growth_bound(runtime: &Runtime, pool: PoolKey, bytes: u64) -> u64 {
        let reserved = pool_bytes(runtime, pool, POOL_ATTR_RESERVED_MEM_CURRENT);
        let used = pool_bytes(runtime, pool, POOL_ATTR_USED_MEM_CURRENT);
        match (reserved, used) {
            (Ok(reserved), Ok(used)) => bytes.saturating_sub(reserved.saturating_sub(used)),
            _ => bytes,
        }
    }

    /// Brings `pool`'s charge to the bytes it holds now, folding in `held` bytes reserved for it
    /// on `device` ahead of an allocation.
    fn settle(runtime: &Runtime, tables: &mut Tables, pool: PoolKey, device: usize, held: u64, owner: Owner) {
        let ledger = runtime.ledger();
        let entry = tables.charges.entry(pool).or_insert(PoolCharge::new(device, owner));
        let mut held = held;
        if entry.device != device {
            // Reserved on another device than the pool's: give that back, charge the pool's.
            ledger.release(device, held, owner);
            held = 0;
        }
        let charged = entry.charged.saturating_add(held);
        let holds = if entry.destroyed {
            entry.live
        } else {
            pool_bytes(runtime, pool, POOL_ATTR_RESERVED_MEM_CURRENT).unwrap_or(entry.live)
        };
        entry.charged = holds;
        if holds > charged {
            match ledger.record_committed(entry.device, holds - charged) {
                Ok(owner) => entry.owner = owner,
                Err(error) => {
                    tracing::warn!(?error, "cannot record a pool's growth");
                    entry.charged = charged;
                }
            }
        } else {
            ledger.release(entry.device, charged - holds, owner);
        }
        if entry.destroyed && entry.charged == 0 {
            tables.charges.remove(&pool);
        }
    }

    /// Settles `pool` if it is charged.
    fn settle_one(&self, runtime: &Runtime, pool: PoolKey) {
        let mut tables = self.tables.lock();
        if let Some(charge) = tables.charges.get(&pool).copied() {
            PoolTable::settle(runtime, &mut tables, pool, charge.device, 0, charge.owner);
        }
    }

    /// Settles this process's pools if it has any, so a query or a refusal sees what they hold
    /// now (memory given back at a synchronize is credited).
    pub fn refresh(&self, runtime: &Runtime) {
        if !self.in_use() {
            return;
        }
        let mut tables = self.tables.lock();
        let pools: Vec<(PoolKey, PoolCharge)> = tables.charges.iter().map(|(&k, &v)| (k, v)).collect();
        for (pool, charge) in pools {
            PoolTable::settle(runtime, &mut tables, pool, charge.device, 0, charge.owner);
        }
    }

    /// Takes out every pool charge on `device` (`hipDeviceReset` frees its pools' memory) and
    /// forgets its pools and their allocations.
    pub fn drain_device(&self, device: usize) -> Vec<Allocation> {
        if !self.in_use() {
            return Vec::new();
        }
        let mut tables = self.tables.lock();
        let Tables { devices, charges, pointers } = &mut *tables;
        let mut drained = Vec::new();
        charges.retain(|_, charge| {
            let doomed = charge.device == device;
            if doomed {
                drained.push(Allocation { device, bytes: charge.charged, owner: charge.owner });
            }
            !doomed
        });
        pointers.retain(|_, (pool, _)| charges.contains_key(pool));
        devices.retain(|_, place| usize::try_from(place.unwrap_or(-1)).ok() != Some(device));
        drained
    }
}

/// The device a stream's work runs on: the null and per-thread streams run on the calling
/// thread's current device.
fn stream_device(runtime: &Runtime, stream: Opaque) -> Option<HipDevice> {
    if runtime.device_count() == 1 {
        return Some(0);
    }
    if stream.is_null() || stream as usize == STREAM_PER_THREAD {
        return runtime.current_device().ok();
    }
    let mut device: HipDevice = 0;
    // SAFETY: the application's stream; `device` is a valid out-pointer.
    if unsafe { runtime.real.hipStreamGetDevice(stream, &mut device) }.is_ok() {
        return Some(device);
    }
    // SAFETY: as above.
    unsafe { runtime.real.stream_device_id(stream) }.or_else(|| runtime.current_device().ok())
}

/// `device`'s current pool, which `hipMallocAsync` allocates from.
fn current_pool(runtime: &Runtime, device: HipDevice) -> Option<PoolKey> {
    let mut pool: Opaque = std::ptr::null_mut();
    // SAFETY: `pool` is a valid out-pointer; `device` an ordinal of this process.
    let found = unsafe { runtime.real.hipDeviceGetMemPool(&mut pool, device) }.is_ok()
        // SAFETY: as above.
        || unsafe { runtime.real.hipDeviceGetDefaultMemPool(&mut pool, device) }.is_ok();
    (found && !pool.is_null()).then_some(pool as PoolKey)
}

/// Where `pool` keeps its memory: `Some(device)`, or `None` for a pool of host memory. A pool
/// neither created here nor a device's default pool is taken to be on the stream's device.
fn pool_device(runtime: &Runtime, pool: PoolKey, stream: Opaque) -> Option<HipDevice> {
    if let Some(&place) = runtime.pools.tables.lock().devices.get(&pool) {
        return place;
    }
    if runtime.device_count() == 1 {
        return Some(0);
    }
    let default = (0..runtime.device_count() as HipDevice).find(|&device| {
        let mut default: Opaque = std::ptr::null_mut();
        // SAFETY: `default` is a valid out-pointer; `device` an ordinal of this process.
        unsafe { runtime.real.hipDeviceGetDefaultMemPool(&mut default, device) }.is_ok()
            && default as PoolKey == pool
    });
    match default {
        Some(device) => {
            runtime.pools.tables.lock().devices.insert(pool, Some(device));
            Some(device)
        }
        None => stream_device(runtime, stream),
    }
}

/// Allocates `bytes` from `pool` on `device` through `allocate`, then settles the pool's charge.
///
/// # Safety
/// `ptr` is non-null and is the out-pointer `allocate` hands to the runtime.
unsafe fn allocate_from(
    runtime: &Runtime,
    device: usize,
    pool: PoolKey,
    ptr: *mut *mut c_void,
    bytes: usize,
    allocate: impl FnOnce() -> Result<(), HookError>,
) -> Result<(), HookError> {
    let held = PoolTable::growth_bound(runtime, pool, bytes as u64);
    let owner = runtime.reserve(device, held)?;
    if let Err(error) = allocate() {
        runtime.ledger().release(device, held, owner);
        return Err(error);
    }
    // SAFETY: the runtime succeeded, so it wrote the new address through the non-null `ptr`.
    let address = unsafe { ptr.read() } as u64;
    let pools = &runtime.pools;
    let mut tables = pools.tables.lock();
    if address != 0 {
        tables.pointers.insert(address, (pool, bytes as u64));
        let entry = tables.charges.entry(pool).or_insert(PoolCharge::new(device, owner));
        entry.live = entry.live.saturating_add(bytes as u64);
    }
    PoolTable::settle(runtime, &mut tables, pool, device, held, owner);
    pools.in_use.store(true, Ordering::Release);
    Ok(())
}

/// `hipMallocAsync`: from the current pool of the stream's device. Should the runtime not name
/// that pool, the allocation is charged its size.
///
/// # Safety
/// `ptr` is the application's out-pointer; `stream` a runtime handle.
pub unsafe fn malloc_async(
    runtime: &Runtime,
    ptr: *mut *mut c_void,
    size: usize,
    stream: Opaque,
) -> Result<(), HookError> {
    // SAFETY: the application's arguments, forwarded unchanged.
    let allocate = || unsafe { runtime.real.hipMallocAsync(ptr, size, stream) };
    if ptr.is_null() || !runtime.ledger().any_limit() {
        return allocate();
    }
    let Some(device) = stream_device(runtime, stream) else { return allocate() };
    let Some(index) = budgeted(runtime, device) else { return allocate() };
    match current_pool(runtime, device) {
        // SAFETY: `ptr` is non-null and `allocate` hands it to the runtime.
        Some(pool) => unsafe { allocate_from(runtime, index, pool, ptr, size, allocate) },
        None => charge(runtime, &runtime.allocations, index, size as u64, || {
            allocate()?;
            // SAFETY: the runtime succeeded, so it wrote the non-null out-pointer.
            Ok(unsafe { ptr.read() } as u64)
        }),
    }
}

/// `hipMallocFromPoolAsync`: charged to the pool's device.
///
/// # Safety
/// `ptr` is the application's out-pointer; `pool` and `stream` runtime handles.
pub unsafe fn malloc_from_pool_async(
    runtime: &Runtime,
    ptr: *mut *mut c_void,
    size: usize,
    pool: Opaque,
    stream: Opaque,
) -> Result<(), HookError> {
    // SAFETY: the application's arguments, forwarded unchanged.
    let allocate = || unsafe { runtime.real.hipMallocFromPoolAsync(ptr, size, pool, stream) };
    if ptr.is_null() || pool.is_null() || !runtime.ledger().any_limit() {
        return allocate();
    }
    let device = pool_device(runtime, pool as PoolKey, stream).and_then(|device| budgeted(runtime, device));
    let Some(device) = device else { return allocate() };
    // SAFETY: `ptr` is non-null and `allocate` hands it to the runtime.
    unsafe { allocate_from(runtime, device, pool as PoolKey, ptr, size, allocate) }
}

/// Frees `ptr` with `free`. A pool allocation settles its pool's charge afterwards; any other
/// goes through the ordinary credit.
#[inline]
pub fn free_pointer(
    runtime: &Runtime,
    ptr: u64,
    free: impl FnOnce() -> Result<(), HookError>,
) -> Result<(), HookError> {
    let pools = &runtime.pools;
    let found = if pools.in_use() { pools.tables.lock().pointers.remove(&ptr) } else { None };
    let Some((pool, bytes)) = found else { return credit(runtime, &runtime.allocations, ptr, free) };
    if let Err(error) = free() {
        pools.tables.lock().pointers.insert(ptr, (pool, bytes));
        return Err(error);
    }
    let mut tables = pools.tables.lock();
    if let Some(entry) = tables.charges.get_mut(&pool) {
        entry.live = entry.live.saturating_sub(bytes);
        let (device, owner) = (entry.device, entry.owner);
        PoolTable::settle(runtime, &mut tables, pool, device, 0, owner);
    }
    Ok(())
}

/// `hipFreeAsync`: the pool keeps the memory (charged) until a synchronize returns it to its
/// cache and the release threshold lets it go.
///
/// # Safety
/// `ptr` is the application's pointer; `stream` a runtime handle.
pub unsafe fn free_async(runtime: &Runtime, ptr: *mut c_void, stream: Opaque) -> Result<(), HookError> {
    // SAFETY: forwarded unchanged.
    free_pointer(runtime, ptr as u64, || unsafe { runtime.real.hipFreeAsync(ptr, stream) })
}

/// `hipMemPoolCreate`: remembers where the new pool keeps its memory.
///
/// # Safety
/// The application's arguments, per the runtime's contract.
pub unsafe fn create(runtime: &Runtime, pool: *mut Opaque, props: *const u8) -> Result<(), HookError> {
    // SAFETY: forwarded unchanged.
    unsafe { runtime.real.hipMemPoolCreate(pool, props) }?;
    if pool.is_null() || props.is_null() {
        return Ok(());
    }
    // SAFETY: the runtime accepted both, so `props` is a hipMemPoolProps and `pool` holds the new
    // pool.
    let (made, place) = unsafe { (pool.read() as PoolKey, pool_location(props)) };
    runtime.pools.tables.lock().devices.insert(made, place);
    Ok(())
}

/// `hipMemPoolDestroy`: the cache goes back at once; outstanding allocations stay charged until
/// freed.
///
/// # Safety
/// `pool` is the application's pool handle.
pub unsafe fn destroy(runtime: &Runtime, pool: Opaque) -> Result<(), HookError> {
    // SAFETY: forwarded unchanged.
    unsafe { runtime.real.hipMemPoolDestroy(pool) }?;
    let key = pool as PoolKey;
    let mut tables = runtime.pools.tables.lock();
    tables.devices.remove(&key);
    if let Some(entry) = tables.charges.get_mut(&key) {
        entry.destroyed = true;
        let (device, owner) = (entry.device, entry.owner);
        PoolTable::settle(runtime, &mut tables, key, device, 0, owner);
    }
    Ok(())
}

/// `hipMemPoolTrimTo`: what the pool gives back is credited at once.
///
/// # Safety
/// `pool` is the application's pool handle.
pub unsafe fn trim_to(runtime: &Runtime, pool: Opaque, keep: usize) -> Result<(), HookError> {
    // SAFETY: forwarded unchanged.
    unsafe { runtime.real.hipMemPoolTrimTo(pool, keep) }?;
    if runtime.pools.in_use() {
        runtime.pools.settle_one(runtime, pool as PoolKey);
    }
    Ok(())
}
