//! The simulated devices and what lives on them. Device memory is only a ledger: addresses are
//! unique numbers that must never be dereferenced.

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

use crate::abi::*;
use crate::config::Config;
use crate::counters::Counters;
use crate::pools::{Pools, Value};
use crate::timeline::Timeline;

/// What one live object costs, and where.
#[derive(Clone, Copy, Debug)]
pub struct Object {
    /// Physical device index.
    pub device: usize,
    pub bytes: u64,
    pub kind: Kind,
    /// The key of the pool a stream-ordered allocation came from; its bytes are the pool's.
    pub pool: Option<u64>,
    /// Freed with `hipFreeAsync`, not yet synchronized.
    pub freeing: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `hipMalloc` and every other call freed with `hipFree`/`hipFreeAsync`.
    Linear,
    /// Pinned host memory (`hipHostMalloc`): no device memory.
    Host,
    Array,
}

/// A physical allocation of `hipMemCreate`: freed when its last reference and mapping are gone.
#[derive(Clone, Copy, Debug)]
struct Physical {
    device: usize,
    bytes: u64,
    references: u32,
    mappings: u32,
}

#[derive(Default)]
struct Vmm {
    handles: HashMap<u64, Physical>,
    /// Mapped address → handle.
    mappings: HashMap<u64, u64>,
}

/// Locks are taken in this order: `pools`, then `objects`.
pub struct State {
    pub config: Config,
    counters: Counters,
    objects: Mutex<HashMap<u64, Object>>,
    vmm: Mutex<Vmm>,
    pools: Mutex<Pools>,
    /// Stream → the HIP ordinal it was created on.
    streams: Mutex<HashMap<u64, i32>>,
    next_address: AtomicU64,
    pub timeline: Timeline,
    /// `hipPointerGetAttributes` calls, for the tests.
    pub pointer_queries: AtomicU64,
    /// `hipEventRecord` calls, for the tests.
    pub event_records: AtomicU64,
}

thread_local! {
    /// The calling thread's current HIP ordinal.
    static CURRENT: Cell<usize> = const { Cell::new(0) };
}

/// The fake's state, or the status every call returns when the environment is unusable.
pub fn get() -> Result<&'static State, HipError> {
    static STATE: OnceLock<Result<State, HipError>> = OnceLock::new();
    STATE
        .get_or_init(|| {
            let config = Config::from_env().map_err(|bad| {
                eprintln!("fakehip: {}={:?}: unusable value", bad.var, bad.value);
                HIP_ERROR_UNKNOWN
            })?;
            let counters = match &config.shared_path {
                Some(path) => Counters::shared(path).map_err(|error| {
                    eprintln!("fakehip: FAKEGPU_SHARED={}: {error}", path.display());
                    HIP_ERROR_UNKNOWN
                })?,
                None => Counters::local(),
            };
            Ok(State {
                config,
                counters,
                objects: Mutex::default(),
                vmm: Mutex::default(),
                pools: Mutex::default(),
                streams: Mutex::default(),
                next_address: AtomicU64::new(0x7e00_0000_0000),
                timeline: Timeline::new(),
                pointer_queries: AtomicU64::new(0),
                event_records: AtomicU64::new(0),
            })
        })
        .as_ref()
        .map_err(|&status| status)
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl State {
    pub fn device_count(&self) -> usize {
        self.config.ordinals.len()
    }

    /// The physical device of HIP ordinal `ordinal`.
    pub fn physical(&self, ordinal: i32) -> Result<usize, HipError> {
        usize::try_from(ordinal)
            .ok()
            .and_then(|i| self.config.ordinals.get(i).copied())
            .ok_or(HIP_ERROR_INVALID_DEVICE)
    }

    pub fn current(&self) -> Result<i32, HipError> {
        if self.device_count() == 0 {
            return Err(HIP_ERROR_NO_DEVICE);
        }
        Ok(CURRENT.with(Cell::get) as i32)
    }

    pub fn set_current(&self, ordinal: i32) -> Result<(), HipError> {
        self.physical(ordinal)?;
        CURRENT.with(|current| current.set(ordinal as usize));
        Ok(())
    }

    pub fn current_physical(&self) -> Result<usize, HipError> {
        self.physical(self.current()?)
    }

    pub fn uuid(&self, ordinal: i32) -> Result<[u8; 16], HipError> {
        Ok(self.config.uuids[self.physical(ordinal)?])
    }

    /// (free, total) of a HIP ordinal.
    pub fn memory(&self, ordinal: i32) -> Result<(u64, u64), HipError> {
        let device = self.physical(ordinal)?;
        let total = self.config.memory;
        Ok((total.saturating_sub(self.counters.used(device)), total))
    }

    pub fn current_memory(&self) -> Result<(u64, u64), HipError> {
        self.memory(self.current()?)
    }

    /// A fresh address range of `bytes`, never handed out before in this process.
    fn address(&self, bytes: u64) -> u64 {
        let span = bytes.max(1).div_ceil(4096).saturating_add(1).saturating_mul(4096);
        self.next_address.fetch_add(span, Ordering::Relaxed)
    }

    /// Charges `bytes` on `device` (physical) and returns the new object's address.
    fn create(&self, device: usize, bytes: u64, kind: Kind) -> Result<u64, HipError> {
        if kind != Kind::Host && !self.counters.allocate(device, bytes, self.config.memory) {
            return Err(HIP_ERROR_OUT_OF_MEMORY);
        }
        let address = self.address(bytes);
        lock(&self.objects).insert(address, Object { device, bytes, kind, pool: None, freeing: false });
        Ok(address)
    }

    /// Device memory on the current device; size 0 gives NULL, as the runtime does.
    pub fn allocate(&self, bytes: u64) -> Result<u64, HipError> {
        let device = self.current_physical()?;
        if bytes == 0 {
            return Ok(0);
        }
        self.create(device, bytes, Kind::Linear)
    }

    pub fn host_allocate(&self, bytes: u64) -> Result<u64, HipError> {
        self.create(0, bytes, Kind::Host)
    }

    pub fn array(&self, bytes: u64) -> Result<u64, HipError> {
        let device = self.current_physical()?;
        self.create(device, bytes.max(1), Kind::Array)
    }

    /// Frees an object of `kind`; NULL is a no-op for linear memory. A pool allocation goes back
    /// to its pool, which then trims to its release threshold (`hipFree` synchronizes).
    pub fn free(&self, address: u64, kind: Kind) -> Result<(), HipError> {
        if address == 0 && kind == Kind::Linear {
            return Ok(());
        }
        let mut pools = lock(&self.pools);
        let mut objects = lock(&self.objects);
        let object = match objects.get(&address) {
            Some(object) if object.kind == kind && !object.freeing => *object,
            _ if kind == Kind::Array => return Err(HIP_ERROR_INVALID_HANDLE),
            _ => return Err(HIP_ERROR_INVALID_VALUE),
        };
        objects.remove(&address);
        drop(objects);
        match object.pool {
            Some(key) => {
                if let Some(pool) = pools.pool(key) {
                    pool.give_back(object.bytes);
                    self.counters.free(pool.device, pool.settle());
                }
                pools.forget_if_empty(key);
            }
            None if kind != Kind::Host => self.counters.free(object.device, object.bytes),
            None => {}
        }
        Ok(())
    }

    /// The live object `address` points into.
    pub fn pointer(&self, address: u64) -> Option<Object> {
        let objects = lock(&self.objects);
        objects
            .iter()
            .find(|&(&start, object)| address >= start && address - start < object.bytes.max(1))
            .map(|(_, object)| *object)
    }

    /// The HIP ordinal of physical `device`, if this process sees it.
    pub fn ordinal_of(&self, device: usize) -> Option<i32> {
        self.config.ordinals.iter().position(|&physical| physical == device).map(|i| i as i32)
    }

    /// The HIP ordinal a stream's work runs on: the null and per-thread streams run on the
    /// calling thread's current device.
    pub fn stream_device(&self, stream: u64) -> Result<i32, HipError> {
        if stream == 0 || stream == STREAM_PER_THREAD {
            return self.current();
        }
        lock(&self.streams).get(&stream).copied().ok_or(HIP_ERROR_INVALID_HANDLE)
    }

    /// A stream on the current device.
    pub fn stream_create(&self) -> Result<u64, HipError> {
        let device = self.current()?;
        let stream = self.address(0);
        lock(&self.streams).insert(stream, device);
        Ok(stream)
    }

    pub fn stream_destroy(&self, stream: u64) -> Result<(), HipError> {
        lock(&self.streams).remove(&stream).map(drop).ok_or(HIP_ERROR_INVALID_HANDLE)
    }

    /// The handle of HIP ordinal `ordinal`'s default pool.
    pub fn default_pool(&self, ordinal: i32) -> Result<u64, HipError> {
        let device = self.physical(ordinal)?;
        Ok(Pools::handle(lock(&self.pools).default_pool(device)))
    }

    /// The handle of HIP ordinal `ordinal`'s current pool.
    pub fn current_pool(&self, ordinal: i32) -> Result<u64, HipError> {
        let device = self.physical(ordinal)?;
        Ok(Pools::handle(lock(&self.pools).current_pool(device)))
    }

    pub fn set_current_pool(&self, ordinal: i32, pool: u64) -> Result<(), HipError> {
        let device = self.physical(ordinal)?;
        lock(&self.pools).set_current(device, pool)
    }

    /// A new pool of device memory on HIP ordinal `ordinal`.
    pub fn create_pool(&self, ordinal: i32) -> Result<u64, HipError> {
        let device = self.physical(ordinal)?;
        Ok(Pools::handle(lock(&self.pools).create(device)))
    }

    /// Destroys a created pool: its cache goes back to the device now, its outstanding allocations
    /// when they are freed.
    pub fn destroy_pool(&self, pool: u64) -> Result<(), HipError> {
        let (device, given) = lock(&self.pools).destroy(pool)?;
        self.counters.free(device, given);
        Ok(())
    }

    pub fn pool_attribute(&self, pool: u64, attribute: i32) -> Result<Value, HipError> {
        lock(&self.pools).get(pool, attribute)
    }

    pub fn set_pool_attribute(&self, pool: u64, attribute: i32, value: Value) -> Result<(), HipError> {
        lock(&self.pools).set(pool, attribute, value)
    }

    /// `hipMemPoolTrimTo`: gives cache back until at most `keep` bytes are reserved.
    pub fn trim_pool(&self, pool: u64, keep: u64) -> Result<(), HipError> {
        let mut pools = lock(&self.pools);
        let key = pools.key(pool)?;
        if let Some(pool) = pools.pool(key) {
            self.counters.free(pool.device, pool.trim_to(keep));
        }
        Ok(())
    }

    /// Allocates `size` bytes from `pool`, or else from HIP ordinal `ordinal`'s current pool,
    /// taking from the device only what the pool's cache cannot cover. Size 0 gives NULL.
    pub fn allocate_from_pool(&self, pool: Option<u64>, ordinal: i32, size: u64) -> Result<u64, HipError> {
        let mut pools = lock(&self.pools);
        let key = match pool {
            Some(handle) => pools.key(handle)?,
            None => pools.current_pool(self.physical(ordinal)?),
        };
        if size == 0 {
            return Ok(0);
        }
        let pool = pools.pool(key).ok_or(HIP_ERROR_INVALID_VALUE)?;
        let growth = pool.growth_for(size);
        if growth > 0 && !self.counters.allocate(pool.device, growth, self.config.memory) {
            return Err(HIP_ERROR_OUT_OF_MEMORY);
        }
        pool.take(size, growth);
        let address = self.address(size);
        let object =
            Object { device: pool.device, bytes: size, kind: Kind::Linear, pool: Some(key), freeing: false };
        lock(&self.objects).insert(address, object);
        Ok(address)
    }

    /// `hipFreeAsync`: a pool allocation stays allocated until the next synchronize; any other
    /// device memory is freed at once.
    pub fn free_async(&self, address: u64) -> Result<(), HipError> {
        {
            let mut pools = lock(&self.pools);
            let mut objects = lock(&self.objects);
            match objects.get_mut(&address) {
                Some(object) if object.kind == Kind::Linear && object.pool.is_some() => {
                    if object.freeing {
                        return Err(HIP_ERROR_INVALID_VALUE);
                    }
                    object.freeing = true;
                    pools.pending.push(address);
                    return Ok(());
                }
                _ => {}
            }
        }
        self.free(address, Kind::Linear)
    }

    /// What every synchronize does: completes the pending `hipFreeAsync`s, then lets every pool
    /// give back what its release threshold allows.
    pub fn synchronize(&self) {
        let mut pools = lock(&self.pools);
        let mut objects = lock(&self.objects);
        for address in std::mem::take(&mut pools.pending) {
            let Some(object) = objects.remove(&address) else { continue };
            if let Some(pool) = object.pool.and_then(|key| pools.pool(key)) {
                pool.give_back(object.bytes);
            }
        }
        drop(objects);
        for (device, given) in pools.settle_all() {
            self.counters.free(device, given);
        }
    }

    /// `hipMemCreate` on HIP ordinal `ordinal`.
    pub fn mem_create(&self, ordinal: i32, bytes: u64) -> Result<u64, HipError> {
        let device = self.physical(ordinal)?;
        if bytes == 0 {
            return Err(HIP_ERROR_INVALID_VALUE);
        }
        if !self.counters.allocate(device, bytes, self.config.memory) {
            return Err(HIP_ERROR_OUT_OF_MEMORY);
        }
        let handle = self.address(0);
        lock(&self.vmm).handles.insert(handle, Physical { device, bytes, references: 1, mappings: 0 });
        Ok(handle)
    }

    /// Applies `change` to `handle`'s counts, freeing its memory when nothing keeps it.
    fn vmm_update(
        &self,
        vmm: &mut Vmm,
        handle: u64,
        change: impl FnOnce(&mut Physical),
    ) -> Result<(), HipError> {
        let physical = vmm.handles.get_mut(&handle).ok_or(HIP_ERROR_INVALID_VALUE)?;
        change(physical);
        if physical.references == 0 && physical.mappings == 0 {
            let physical = *physical;
            vmm.handles.remove(&handle);
            self.counters.free(physical.device, physical.bytes);
        }
        Ok(())
    }

    pub fn mem_release(&self, handle: u64) -> Result<(), HipError> {
        let mut vmm = lock(&self.vmm);
        match vmm.handles.get(&handle) {
            Some(physical) if physical.references > 0 => {}
            _ => return Err(HIP_ERROR_INVALID_VALUE),
        }
        self.vmm_update(&mut vmm, handle, |physical| physical.references -= 1)
    }

    pub fn mem_map(&self, address: u64, handle: u64) -> Result<(), HipError> {
        let mut vmm = lock(&self.vmm);
        if address == 0 || vmm.mappings.contains_key(&address) {
            return Err(HIP_ERROR_INVALID_VALUE);
        }
        self.vmm_update(&mut vmm, handle, |physical| physical.mappings += 1)?;
        vmm.mappings.insert(address, handle);
        Ok(())
    }

    pub fn mem_unmap(&self, address: u64) -> Result<(), HipError> {
        let mut vmm = lock(&self.vmm);
        let handle = vmm.mappings.remove(&address).ok_or(HIP_ERROR_INVALID_VALUE)?;
        self.vmm_update(&mut vmm, handle, |physical| physical.mappings -= 1)
    }

    /// The handle mapped at `address`, with one more reference.
    pub fn retain(&self, address: u64) -> Result<u64, HipError> {
        let mut vmm = lock(&self.vmm);
        let handle = *vmm.mappings.get(&address).ok_or(HIP_ERROR_INVALID_VALUE)?;
        self.vmm_update(&mut vmm, handle, |physical| physical.references += 1)?;
        Ok(handle)
    }

    /// `hipDeviceReset`: frees everything on physical device `device` (VMM handles and pools
    /// included).
    pub fn reset(&self, device: usize) {
        let mut pools = lock(&self.pools);
        self.counters.free(device, pools.reset(device));
        let mut objects = lock(&self.objects);
        objects.retain(|_, object| {
            let doomed = object.device == device && object.kind != Kind::Host;
            if doomed && object.pool.is_none() {
                self.counters.free(device, object.bytes);
            }
            !doomed
        });
        pools.pending.retain(|address| objects.contains_key(address));
        drop(objects);
        drop(pools);
        let mut vmm = lock(&self.vmm);
        let Vmm { handles, mappings } = &mut *vmm;
        handles.retain(|_, physical| {
            let doomed = physical.device == device;
            if doomed {
                self.counters.free(device, physical.bytes);
            }
            !doomed
        });
        mappings.retain(|_, handle| handles.contains_key(handle));
    }

    /// The fake's own counters for physical device `device`: (used, peak, allocation calls).
    pub fn stats(&self, device: usize) -> Option<(u64, u64, u64)> {
        (device < self.config.device_count).then(|| {
            (self.counters.used(device), self.counters.peak(device), self.counters.alloc_calls(device))
        })
    }
}
