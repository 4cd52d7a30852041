//! Stream-ordered allocation: memory pools (each device's default pool and `cuMemPoolCreate`'s),
//! `cuMemAllocAsync` / `cuMemAllocFromPoolAsync`, and `cuMemFreeAsync`.
//!
//! The model: a pool holds `reserved` bytes of its device — its `used` bytes (live allocations,
//! including those freed asynchronously but not yet synchronized) plus a cache of freed bytes. The
//! device's ledger counts every pool's reserved bytes, not its used bytes. An allocation is served from
//! the cache first, and only what the cache lacks is charged to the device. `cuMemFreeAsync` takes
//! effect at the next `cuStreamSynchronize` or `cuCtxSynchronize` (of any stream): the bytes return to
//! the cache, then every pool gives back to its device whatever cache keeps its reserved bytes above
//! its release threshold (default 0: everything). `cuMemFree` of a pool allocation does the same for
//! that pool at once, since it synchronizes. `cuMemPoolTrimTo` gives back cache down to a floor.

use std::collections::BTreeMap;

use crate::config::MAX_DEVICES;
use crate::handles::{self, Keys, Kind};
use crate::memory::{Block, Flavor, Owner, Width};
use crate::state::{Fake, Refusal};

/// `CUmemPool_attribute`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attribute {
    ReuseFollowEventDependencies,
    ReuseAllowOpportunistic,
    ReuseAllowInternalDependencies,
    ReleaseThreshold,
    ReservedMemCurrent,
    ReservedMemHigh,
    UsedMemCurrent,
    UsedMemHigh,
}

impl Attribute {
    pub fn from_raw(raw: i32) -> Option<Attribute> {
        Some(match raw {
            1 => Attribute::ReuseFollowEventDependencies,
            2 => Attribute::ReuseAllowOpportunistic,
            3 => Attribute::ReuseAllowInternalDependencies,
            4 => Attribute::ReleaseThreshold,
            5 => Attribute::ReservedMemCurrent,
            6 => Attribute::ReservedMemHigh,
            7 => Attribute::UsedMemCurrent,
            8 => Attribute::UsedMemHigh,
            _ => return None,
        })
    }

    /// The three reuse policies are `int`s; the rest `cuuint64_t`.
    pub fn is_flag(self) -> bool {
        matches!(
            self,
            Attribute::ReuseFollowEventDependencies
                | Attribute::ReuseAllowOpportunistic
                | Attribute::ReuseAllowInternalDependencies
        )
    }
}

/// An attribute's value, typed as the driver passes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Value {
    Flag(i32),
    Bytes(u64),
}

#[derive(Debug)]
struct Pool {
    device: usize,
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

    /// Bytes the device must be charged for an allocation of `size`: what the cache cannot cover.
    fn growth_for(&self, size: u64) -> u64 {
        self.used.saturating_add(size).saturating_sub(self.reserved)
    }

    fn take(&mut self, size: u64, growth: u64) {
        self.used += size;
        self.reserved += growth;
        self.used_high = self.used_high.max(self.used);
        self.reserved_high = self.reserved_high.max(self.reserved);
    }

    /// Gives back cached bytes until at most `keep` are reserved; returns the bytes given back.
    fn trim_to(&mut self, keep: u64) -> u64 {
        let released = self.reserved.saturating_sub(keep.max(self.used));
        self.reserved -= released;
        released
    }

    /// What a synchronize does: trim to the release threshold (to nothing once destroyed).
    fn settle(&mut self) -> u64 {
        self.trim_to(if self.destroyed { 0 } else { self.release_threshold })
    }

    fn get(&self, attribute: Attribute) -> Value {
        match attribute {
            Attribute::ReuseFollowEventDependencies => Value::Flag(self.reuse[0]),
            Attribute::ReuseAllowOpportunistic => Value::Flag(self.reuse[1]),
            Attribute::ReuseAllowInternalDependencies => Value::Flag(self.reuse[2]),
            Attribute::ReleaseThreshold => Value::Bytes(self.release_threshold),
            Attribute::ReservedMemCurrent => Value::Bytes(self.reserved),
            Attribute::ReservedMemHigh => Value::Bytes(self.reserved_high),
            Attribute::UsedMemCurrent => Value::Bytes(self.used),
            Attribute::UsedMemHigh => Value::Bytes(self.used_high),
        }
    }

    /// Like the driver: the reuse flags and threshold are writable, the high-water marks may only be
    /// reset (to the current value, by writing 0), the current counters are read-only.
    fn set(&mut self, attribute: Attribute, value: Value) -> Result<(), Refusal> {
        match (attribute, value) {
            (Attribute::ReuseFollowEventDependencies, Value::Flag(flag)) => self.reuse[0] = flag,
            (Attribute::ReuseAllowOpportunistic, Value::Flag(flag)) => self.reuse[1] = flag,
            (Attribute::ReuseAllowInternalDependencies, Value::Flag(flag)) => self.reuse[2] = flag,
            (Attribute::ReleaseThreshold, Value::Bytes(bytes)) => self.release_threshold = bytes,
            (Attribute::ReservedMemHigh, Value::Bytes(0)) => self.reserved_high = self.reserved,
            (Attribute::UsedMemHigh, Value::Bytes(0)) => self.used_high = self.used,
            _ => return Err(Refusal::BadArgument),
        }
        Ok(())
    }
}

/// Every pool, by key: keys 1..=MAX_DEVICES are the default pools of physical devices 0.., created
/// pools follow.
pub struct Pools {
    pools: BTreeMap<u64, Pool>,
    keys: Keys,
}

impl Pools {
    pub fn new() -> Pools {
        Pools { pools: BTreeMap::new(), keys: Keys::starting_at(MAX_DEVICES as u64 + 1) }
    }

    fn default_key(device: usize) -> u64 {
        device as u64 + 1
    }

    /// The default pool of physical `device`, created on first use.
    fn default_pool(&mut self, device: usize) -> u64 {
        let key = Pools::default_key(device);
        self.pools.entry(key).or_insert_with(|| Pool::new(device));
        key
    }

    /// The key of a live (not destroyed) pool's handle.
    fn key(&self, handle: u64) -> Result<u64, Refusal> {
        handles::decode(Kind::Pool, handle)
            .filter(|key| self.pools.get(key).is_some_and(|pool| !pool.destroyed))
            .ok_or(Refusal::Unknown)
    }

    fn pool(&mut self, handle: u64) -> Result<&mut Pool, Refusal> {
        let key = self.key(handle)?;
        self.pools.get_mut(&key).ok_or(Refusal::Unknown)
    }
}

impl Fake {
    /// The handle of physical `device`'s default pool (also its current pool: the fake has no
    /// `cuDeviceSetMemPool`).
    pub fn default_pool(&self, device: usize) -> u64 {
        handles::encode(Kind::Pool, self.lock().pools.default_pool(device))
    }

    pub fn create_pool(&self, device: usize) -> u64 {
        let mut registry = self.lock();
        let key = registry.pools.keys.next();
        registry.pools.pools.insert(key, Pool::new(device));
        handles::encode(Kind::Pool, key)
    }

    /// Destroys a created pool: its cache goes back to the device now, its outstanding allocations when
    /// they are freed. A default pool cannot be destroyed.
    pub fn destroy_pool(&self, handle: u64) -> Result<(), Refusal> {
        let mut registry = self.lock();
        let key = registry.pools.key(handle)?;
        if key <= MAX_DEVICES as u64 {
            return Err(Refusal::BadArgument);
        }
        let pools = &mut registry.pools.pools;
        let Some(pool) = pools.get_mut(&key) else { return Err(Refusal::Unknown) };
        pool.destroyed = true;
        self.credit(pool.device, pool.settle());
        if pool.reserved == 0 {
            pools.remove(&key);
        }
        Ok(())
    }

    pub fn pool_attribute(&self, handle: u64, attribute: Attribute) -> Result<Value, Refusal> {
        Ok(self.lock().pools.pool(handle)?.get(attribute))
    }

    pub fn set_pool_attribute(&self, handle: u64, attribute: Attribute, value: Value) -> Result<(), Refusal> {
        self.lock().pools.pool(handle)?.set(attribute, value)
    }

    pub fn trim_pool(&self, handle: u64, keep: u64) -> Result<(), Refusal> {
        let mut registry = self.lock();
        let pool = registry.pools.pool(handle)?;
        self.credit(pool.device, pool.trim_to(keep));
        Ok(())
    }

    /// The physical device of a live pool.
    pub fn pool_device(&self, handle: u64) -> Result<usize, Refusal> {
        Ok(self.lock().pools.pool(handle)?.device)
    }

    /// Allocates `size` (> 0) bytes from a pool (`pool`, or else physical `device`'s default pool),
    /// charging the device only for what the pool's cache cannot cover.
    pub fn allocate_from_pool(&self, device: usize, pool: Option<u64>, size: u64) -> Result<u64, Refusal> {
        let mut registry = self.lock();
        let registry = &mut *registry;
        let key = match pool {
            Some(handle) => registry.pools.key(handle)?,
            None => registry.pools.default_pool(device),
        };
        let Some(pool) = registry.pools.pools.get_mut(&key) else { return Err(Refusal::Unknown) };
        let growth = pool.growth_for(size);
        self.charge(pool.device, growth)?;
        let block = Block {
            device: pool.device,
            size,
            span: 0,
            owner: Owner::Pool(key),
            flavor: Flavor::Device,
            freeing: false,
        };
        let Some(address) = registry.space.insert(block, Width::Bits64) else {
            self.credit(pool.device, growth);
            return Err(Refusal::OutOfMemory);
        };
        pool.take(size, growth);
        Ok(address)
    }

    /// `cuMemFreeAsync`: the block stays allocated until the next synchronize.
    pub fn free_async(&self, address: u64) -> Result<(), Refusal> {
        let mut registry = self.lock();
        let space = &mut registry.space;
        match space.blocks.get_mut(&address) {
            Some(block) if !block.freeing => block.freeing = true,
            _ => return Err(Refusal::Unknown),
        }
        space.freeing.push(address);
        Ok(())
    }

    /// What every synchronize does: completes the pending `cuMemFreeAsync`s, then lets every pool give
    /// back what its release threshold allows.
    pub fn synchronize(&self) {
        let mut registry = self.lock();
        let registry = &mut *registry;
        for address in std::mem::take(&mut registry.space.freeing) {
            let Some(block) = registry.space.blocks.remove(&address) else { continue };
            match block.owner {
                Owner::Device => self.uncharge(block.device, block.size, block.flavor),
                Owner::Pool(key) => self.return_to_pool(&mut registry.pools, key, block.size, false),
            }
        }
        for pool in registry.pools.pools.values_mut() {
            self.credit(pool.device, pool.settle());
        }
        registry.pools.pools.retain(|_, pool| !pool.destroyed || pool.reserved > 0);
    }

    /// Returns a freed block's bytes to its pool's cache; `settle` trims that pool to its threshold now.
    pub(super) fn return_to_pool(&self, pools: &mut Pools, key: u64, size: u64, settle: bool) {
        let Some(pool) = pools.pools.get_mut(&key) else { return };
        pool.used = pool.used.saturating_sub(size);
        if settle || pool.destroyed {
            self.credit(pool.device, pool.settle());
        }
        if pool.destroyed && pool.reserved == 0 {
            pools.pools.remove(&key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_serves_first_and_threshold_bounds_what_stays_reserved() {
        let mut pool = Pool::new(0);
        assert_eq!(pool.growth_for(100), 100);
        pool.take(100, 100);
        pool.used -= 100;
        assert_eq!(pool.growth_for(60), 0, "served from the cache");
        assert_eq!(pool.growth_for(160), 60);
        pool.release_threshold = 30;
        assert_eq!(pool.settle(), 70);
        assert_eq!(pool.reserved, 30);
        pool.take(50, pool.growth_for(50));
        assert_eq!((pool.used, pool.reserved), (50, 50));
        assert_eq!(pool.trim_to(0), 0, "live bytes cannot be trimmed");
        assert_eq!(pool.get(Attribute::ReservedMemHigh), Value::Bytes(100));
        assert_eq!(pool.set(Attribute::UsedMemCurrent, Value::Bytes(0)), Err(Refusal::BadArgument));
        assert_eq!(pool.set(Attribute::ReservedMemHigh, Value::Bytes(0)), Ok(()));
        assert_eq!(pool.get(Attribute::ReservedMemHigh), Value::Bytes(50));
    }
}
