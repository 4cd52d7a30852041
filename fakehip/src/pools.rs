//! Stream-ordered memory pools: each device's default pool and `hipMemPoolCreate`'s, the current
//! pool of each device (`hipDeviceSetMemPool`), and what they hold.
//!
//! The model is the fake CUDA driver's: a pool holds `reserved` bytes of its device, its `used`
//! bytes (live allocations, including those freed with `hipFreeAsync` but not yet synchronized)
//! plus a cache of freed bytes. The device's counters count every pool's reserved bytes, not its
//! used bytes. An allocation is served from the cache first; only what the cache lacks is taken
//! from the device. A `hipFreeAsync` takes effect at the next `hipStreamSynchronize` or
//! `hipDeviceSynchronize`: its bytes return to the cache, then every pool gives back to its device
//! whatever keeps it above its release threshold (default 0: everything). `hipFree` of a pool
//! allocation does that for its pool at once. `hipMemPoolTrimTo` gives cache back down to a floor.

use std::collections::{BTreeMap, HashMap};

use crate::abi::*;
use crate::config::MAX_DEVICES;

/// Pool handles are this plus the pool's key: keys 1..=MAX_DEVICES are the default pools of
/// physical devices 0.., created pools follow.
const HANDLE_BASE: u64 = 0x9001_0000;

/// `hipMemPoolAttr`.
pub const ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES: i32 = 1;
pub const ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES: i32 = 3;
pub const ATTR_RELEASE_THRESHOLD: i32 = 4;
pub const ATTR_RESERVED_MEM_CURRENT: i32 = 5;
pub const ATTR_RESERVED_MEM_HIGH: i32 = 6;
pub const ATTR_USED_MEM_CURRENT: i32 = 7;
pub const ATTR_USED_MEM_HIGH: i32 = 8;

/// An attribute's value: the three reuse policies are `int`s, the rest `uint64_t`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Value {
    Flag(i32),
    Bytes(u64),
}

/// Whether `attribute` is one of the `int` reuse policies.
pub fn is_flag(attribute: i32) -> bool {
    (ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES..=ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES).contains(&attribute)
}

#[derive(Debug)]
pub struct Pool {
    /// Physical device.
    pub device: usize,
    release_threshold: u64,
    reserved: u64,
    used: u64,
    reserved_high: u64,
    used_high: u64,
    reuse: [i32; 3],
    /// Destroyed while allocations were outstanding: unknown to every call, gone once empty.
    destroyed: bool,
}

impl Pool {
    fn new(device: usize) -> Pool {
        Pool {
            device,
            release_threshold: 0,
            reserved: 0,
            used: 0,
            reserved_high: 0,
            used_high: 0,
            reuse: [1; 3],
            destroyed: false,
        }
    }

    /// Bytes the device must give for an allocation of `size`: what the cache cannot cover.
    pub fn growth_for(&self, size: u64) -> u64 {
        self.used.saturating_add(size).saturating_sub(self.reserved)
    }

    pub fn take(&mut self, size: u64, growth: u64) {
        self.used += size;
        self.reserved += growth;
        self.used_high = self.used_high.max(self.used);
        self.reserved_high = self.reserved_high.max(self.reserved);
    }

    /// Returns `size` freed bytes to the cache.
    pub fn give_back(&mut self, size: u64) {
        self.used = self.used.saturating_sub(size);
    }

    /// Gives cache back until at most `keep` bytes are reserved; returns the bytes given back.
    pub fn trim_to(&mut self, keep: u64) -> u64 {
        let released = self.reserved.saturating_sub(keep.max(self.used));
        self.reserved -= released;
        released
    }

    /// What a synchronize does: trim to the release threshold (to nothing once destroyed).
    pub fn settle(&mut self) -> u64 {
        self.trim_to(if self.destroyed { 0 } else { self.release_threshold })
    }

    fn get(&self, attribute: i32) -> Result<Value, HipError> {
        Ok(match attribute {
            1..=3 => Value::Flag(self.reuse[attribute as usize - 1]),
            ATTR_RELEASE_THRESHOLD => Value::Bytes(self.release_threshold),
            ATTR_RESERVED_MEM_CURRENT => Value::Bytes(self.reserved),
            ATTR_RESERVED_MEM_HIGH => Value::Bytes(self.reserved_high),
            ATTR_USED_MEM_CURRENT => Value::Bytes(self.used),
            ATTR_USED_MEM_HIGH => Value::Bytes(self.used_high),
            _ => return Err(HIP_ERROR_INVALID_VALUE),
        })
    }

    /// Like the runtime: the reuse flags and threshold are writable, the high-water marks may only
    /// be reset (to the current value, by writing 0), the current counters are read-only.
    fn set(&mut self, attribute: i32, value: Value) -> Result<(), HipError> {
        match (attribute, value) {
            (1..=3, Value::Flag(flag)) => self.reuse[attribute as usize - 1] = flag,
            (ATTR_RELEASE_THRESHOLD, Value::Bytes(bytes)) => self.release_threshold = bytes,
            (ATTR_RESERVED_MEM_HIGH, Value::Bytes(0)) => self.reserved_high = self.reserved,
            (ATTR_USED_MEM_HIGH, Value::Bytes(0)) => self.used_high = self.used,
            _ => return Err(HIP_ERROR_INVALID_VALUE),
        }
        Ok(())
    }
}

/// Every pool, each device's current pool, and the pool allocations freed but not yet synchronized.
#[derive(Default)]
pub struct Pools {
    pools: BTreeMap<u64, Pool>,
    /// Physical device → key of its current pool, when it is not the default one.
    current: HashMap<usize, u64>,
    next_key: u64,
    /// Addresses freed with `hipFreeAsync`, returned to their pools at the next synchronize.
    pub pending: Vec<u64>,
}

impl Pools {
    pub fn handle(key: u64) -> u64 {
        HANDLE_BASE + key
    }

    /// The default pool of physical `device`, created on first use.
    pub fn default_pool(&mut self, device: usize) -> u64 {
        let key = device as u64 + 1;
        self.pools.entry(key).or_insert_with(|| Pool::new(device));
        key
    }

    /// The current pool of physical `device`.
    pub fn current_pool(&mut self, device: usize) -> u64 {
        match self.current.get(&device) {
            Some(&key) => key,
            None => self.default_pool(device),
        }
    }

    /// Makes the live pool `handle` the current pool of physical `device`, whose pool it must be.
    pub fn set_current(&mut self, device: usize, handle: u64) -> Result<(), HipError> {
        let key = self.key(handle)?;
        if self.pools[&key].device != device {
            return Err(HIP_ERROR_INVALID_VALUE);
        }
        self.current.insert(device, key);
        Ok(())
    }

    pub fn create(&mut self, device: usize) -> u64 {
        let key = self.next_key.max(MAX_DEVICES as u64 + 1);
        self.next_key = key + 1;
        self.pools.insert(key, Pool::new(device));
        key
    }

    /// The key of a live (not destroyed) pool's handle.
    pub fn key(&self, handle: u64) -> Result<u64, HipError> {
        handle
            .checked_sub(HANDLE_BASE)
            .filter(|key| self.pools.get(key).is_some_and(|pool| !pool.destroyed))
            .ok_or(HIP_ERROR_INVALID_VALUE)
    }

    pub fn pool(&mut self, key: u64) -> Option<&mut Pool> {
        self.pools.get_mut(&key)
    }

    /// Destroys a created pool: returns its device and the cache it gives back now; its
    /// outstanding allocations go back when they are freed. A default pool cannot be destroyed.
    pub fn destroy(&mut self, handle: u64) -> Result<(usize, u64), HipError> {
        let key = self.key(handle)?;
        if key <= MAX_DEVICES as u64 {
            return Err(HIP_ERROR_INVALID_VALUE);
        }
        self.current.retain(|_, current| *current != key);
        let pool = self.pools.get_mut(&key).ok_or(HIP_ERROR_INVALID_VALUE)?;
        pool.destroyed = true;
        let given = (pool.device, pool.settle());
        self.forget_if_empty(key);
        Ok(given)
    }

    /// Removes a destroyed pool that holds nothing any more.
    pub fn forget_if_empty(&mut self, key: u64) {
        if self.pools.get(&key).is_some_and(|pool| pool.destroyed && pool.reserved == 0) {
            self.pools.remove(&key);
        }
    }

    pub fn get(&self, handle: u64, attribute: i32) -> Result<Value, HipError> {
        self.pools[&self.key(handle)?].get(attribute)
    }

    pub fn set(&mut self, handle: u64, attribute: i32, value: Value) -> Result<(), HipError> {
        let key = self.key(handle)?;
        self.pools.get_mut(&key).ok_or(HIP_ERROR_INVALID_VALUE)?.set(attribute, value)
    }

    /// Every pool trims to its threshold: (device, bytes given back) of each.
    pub fn settle_all(&mut self) -> Vec<(usize, u64)> {
        let given = self.pools.values_mut().map(|pool| (pool.device, pool.settle())).collect();
        self.pools.retain(|_, pool| !pool.destroyed || pool.reserved > 0);
        given
    }

    /// `hipDeviceReset` of physical `device`: its created pools are gone and its default pool is
    /// empty. Returns the bytes they held.
    pub fn reset(&mut self, device: usize) -> u64 {
        let mut held = 0;
        self.pools.retain(|&key, pool| {
            if pool.device != device {
                return true;
            }
            held += pool.reserved;
            if key <= MAX_DEVICES as u64 {
                *pool = Pool::new(device);
                return true;
            }
            false
        });
        self.current.remove(&device);
        held
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_serves_first_and_the_threshold_bounds_what_stays() {
        let mut pool = Pool::new(0);
        assert_eq!(pool.growth_for(100), 100);
        pool.take(100, 100);
        pool.give_back(100);
        assert_eq!(pool.growth_for(60), 0, "served from the cache");
        assert_eq!(pool.growth_for(160), 60);
        pool.release_threshold = 30;
        assert_eq!(pool.settle(), 70);
        pool.take(50, pool.growth_for(50));
        assert_eq!((pool.used, pool.reserved), (50, 50));
        assert_eq!(pool.trim_to(0), 0, "live bytes cannot be trimmed");
        assert_eq!(pool.set(ATTR_USED_MEM_CURRENT, Value::Bytes(0)), Err(HIP_ERROR_INVALID_VALUE));
        assert_eq!(pool.get(ATTR_RESERVED_MEM_HIGH), Ok(Value::Bytes(100)));
    }

    #[test]
    fn destroyed_pools_stay_until_their_allocations_are_freed() {
        let mut pools = Pools::default();
        let key = pools.create(1);
        let pool = pools.pool(key).unwrap();
        pool.take(10, 10);
        assert_eq!(pools.destroy(Pools::handle(key)), Ok((1, 0)));
        assert!(pools.key(Pools::handle(key)).is_err(), "unknown to every call");
        let pool = pools.pool(key).unwrap();
        pool.give_back(10);
        assert_eq!(pool.settle(), 10);
        pools.forget_if_empty(key);
        assert!(pools.pool(key).is_none());
        let default = Pools::handle(pools.default_pool(0));
        assert_eq!(pools.destroy(default), Err(HIP_ERROR_INVALID_VALUE));
    }
}
