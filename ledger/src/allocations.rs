//! Which live object was charged to which device, so a free credits the right budget.
//!
//! The table is on every allocation and free, so it takes no lock: a thread of the application
//! that is stopped or descheduled in the middle of a call (or a fork taken at that moment) must
//! not hold up the others. A key hashes to a bucket of eight slots, whose keys share one cache
//! line. A slot is claimed by one compare-and-swap of its key (free → claimed), its record written,
//! and the key published with a release store; it is taken out by one compare-and-swap back to
//! free, after its record is read. A key whose bucket is full, and the two reserved key values, go
//! to a small map under a mutex that is touched only while it holds something.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use parking_lot::Mutex;

/// One charged allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Allocation {
    pub device: usize,
    pub bytes: u64,
    pub owner: super::Owner,
}

const BUCKET: usize = 8;
const BUCKET_BITS: u32 = 8;
const SLOTS: usize = BUCKET << BUCKET_BITS;

/// A slot no one holds.
const FREE: u64 = 0;
/// A slot whose record is being written by the thread that claimed it.
const CLAIMED: u64 = u64::MAX;

/// Live allocations of this process, keyed by device address (or driver handle).
#[derive(Debug)]
pub struct AllocationTable {
    /// Fixed-size arrays: a bucket's slots are in range by construction, with no bounds checks.
    keys: Box<[AtomicU64; SLOTS]>,
    /// Per slot: device, bytes, owner.
    records: Box<[[AtomicU64; 3]; SLOTS]>,
    overflow: Mutex<HashMap<u64, Allocation>>,
    /// Entries in `overflow`: a removal looks there only when this is not zero.
    overflowed: AtomicUsize,
}

impl Default for AllocationTable {
    fn default() -> Self {
        let keys: Box<[AtomicU64]> = (0..SLOTS).map(|_| AtomicU64::new(FREE)).collect();
        let records: Box<[[AtomicU64; 3]]> = (0..SLOTS).map(|_| Default::default()).collect();
        let table = AllocationTable {
            keys: keys.try_into().expect("SLOTS keys"),
            records: records.try_into().expect("SLOTS records"),
            overflow: Mutex::default(),
            overflowed: AtomicUsize::new(0),
        };
        // Touch every page now (the allocator may hand out untouched zero pages): the first store
        // into a page must not fault, and possibly sleep, inside an application's allocation call.
        for (key, record) in table.keys.iter().zip(table.records.iter()) {
            key.store(FREE, Ordering::Relaxed);
            record[0].store(0, Ordering::Relaxed);
        }
        table
    }
}

impl AllocationTable {
    #[inline(always)]
    pub fn insert(&self, key: u64, allocation: Allocation) {
        if key != FREE && key != CLAIMED {
            for slot in bucket(key) {
                let held = &self.keys[slot];
                if held.load(Ordering::Relaxed) == FREE
                    && held.compare_exchange(FREE, CLAIMED, Ordering::Acquire, Ordering::Relaxed).is_ok()
                {
                    let [device, bytes, owner] = &self.records[slot];
                    device.store(allocation.device as u64, Ordering::Relaxed);
                    bytes.store(allocation.bytes, Ordering::Relaxed);
                    owner.store(allocation.owner, Ordering::Relaxed);
                    held.store(key, Ordering::Release);
                    return;
                }
            }
        }
        self.insert_overflow(key, allocation);
    }

    /// A key whose bucket is full, or a reserved key value.
    #[cold]
    #[inline(never)]
    fn insert_overflow(&self, key: u64, allocation: Allocation) {
        if self.overflow.lock().insert(key, allocation).is_none() {
            self.overflowed.fetch_add(1, Ordering::Release);
        }
    }

    #[inline(always)]
    pub fn remove(&self, key: u64) -> Option<Allocation> {
        if key != FREE && key != CLAIMED {
            for slot in bucket(key) {
                if let Some(allocation) = self.take(slot, key) {
                    return Some(allocation);
                }
            }
        }
        if self.overflowed.load(Ordering::Acquire) == 0 {
            return None;
        }
        self.remove_overflow(key)
    }

    #[cold]
    #[inline(never)]
    fn remove_overflow(&self, key: u64) -> Option<Allocation> {
        let taken = self.overflow.lock().remove(&key);
        if taken.is_some() {
            self.overflowed.fetch_sub(1, Ordering::Release);
        }
        taken
    }

    /// Removes and returns every live allocation (their owner is going away).
    pub fn drain(&self) -> Vec<Allocation> {
        let mut drained: Vec<Allocation> = (0..SLOTS)
            .filter_map(|slot| {
                let key = self.keys[slot].load(Ordering::Acquire);
                if key == FREE || key == CLAIMED { None } else { self.take(slot, key) }
            })
            .collect();
        let mut overflow = self.overflow.lock();
        self.overflowed.fetch_sub(overflow.len(), Ordering::Release);
        drained.extend(overflow.drain().map(|(_, allocation)| allocation));
        drained
    }

    /// Removes and returns the live allocations on `device` (its memory was freed at once, as by
    /// `hipDeviceReset`).
    pub fn drain_device(&self, device: usize) -> Vec<Allocation> {
        let mut drained: Vec<Allocation> = (0..SLOTS)
            .filter_map(|slot| {
                let key = self.keys[slot].load(Ordering::Acquire);
                let on_device = self.records[slot][0].load(Ordering::Relaxed) == device as u64;
                if key == FREE || key == CLAIMED || !on_device { None } else { self.take(slot, key) }
            })
            .filter(|allocation| allocation.device == device)
            .collect();
        let mut overflow = self.overflow.lock();
        let keys: Vec<u64> =
            overflow.iter().filter(|(_, a)| a.device == device).map(|(&key, _)| key).collect();
        for key in keys {
            drained.extend(overflow.remove(&key));
            self.overflowed.fetch_sub(1, Ordering::Release);
        }
        drained
    }

    /// The record in `slot` if it holds `key`, freeing the slot. Of two threads taking the same
    /// key, one gets it.
    #[inline]
    fn take(&self, slot: usize, key: u64) -> Option<Allocation> {
        let held = &self.keys[slot];
        if held.load(Ordering::Acquire) != key {
            return None;
        }
        let [device, bytes, owner] = &self.records[slot];
        let allocation = Allocation {
            device: device.load(Ordering::Relaxed) as usize,
            bytes: bytes.load(Ordering::Relaxed),
            owner: owner.load(Ordering::Relaxed),
        };
        // Release: the record is read before the slot can be claimed and rewritten.
        held.compare_exchange(key, FREE, Ordering::Release, Ordering::Relaxed).ok()?;
        Some(allocation)
    }
}

/// The slots of `key`'s bucket. Device addresses are already well spread; one multiply mixes
/// their aligned low bits into the bucket number.
#[inline]
fn bucket(key: u64) -> std::ops::Range<usize> {
    let mixed = (key ^ (key >> 29)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let first = (mixed >> (64 - BUCKET_BITS)) as usize * BUCKET;
    first..first + BUCKET
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(n: u64) -> Allocation {
        Allocation { device: (n % 3) as usize, bytes: n * 4096, owner: n << 32 | 7 }
    }

    #[test]
    fn draining_a_device_leaves_the_others() {
        let table = AllocationTable::default();
        for n in 1..=300 {
            table.insert(0x7000_0000 + n * 4096, record(n));
        }
        let drained = table.drain_device(1);
        assert_eq!(drained.len(), 100);
        assert!(drained.iter().all(|a| a.device == 1));
        assert_eq!(table.remove(0x7000_0000 + 4096), None, "on device 1: drained");
        assert_eq!(table.remove(0x7000_0000 + 2 * 4096), Some(record(2)), "on device 2: kept");
        assert_eq!(table.remove(0x7000_0000 + 3 * 4096), Some(record(3)), "on device 0: kept");
        assert_eq!(table.drain().len(), 198);
    }

    #[test]
    fn insert_then_remove_once() {
        let table = AllocationTable::default();
        let a = Allocation { device: 1, bytes: 4096, owner: 0 };
        table.insert(0x7000_0000, a);
        assert_eq!(table.remove(0x7000_0000), Some(a));
        assert_eq!(table.remove(0x7000_0000), None);
    }

    #[test]
    fn reserved_key_values_and_full_buckets_go_to_the_overflow_map() {
        let table = AllocationTable::default();
        table.insert(FREE, record(1));
        table.insert(CLAIMED, record(2));
        // Twice as many keys of one bucket as it has slots.
        let first = bucket(0x1000).start;
        let same_bucket: Vec<u64> =
            (1u64..).map(|n| n << 12).filter(|&key| bucket(key).start == first).take(2 * BUCKET).collect();
        for (n, &key) in same_bucket.iter().enumerate() {
            table.insert(key, record(n as u64 + 10));
        }
        assert_eq!(table.overflowed.load(Ordering::Relaxed), 2 + BUCKET);
        assert_eq!(table.remove(CLAIMED), Some(record(2)));
        assert_eq!(table.remove(FREE), Some(record(1)));
        for (n, &key) in same_bucket.iter().enumerate().rev() {
            assert_eq!(table.remove(key), Some(record(n as u64 + 10)), "key {key:#x}");
        }
        assert_eq!(table.overflowed.load(Ordering::Relaxed), 0);
        assert!(table.drain().is_empty());
    }

    #[test]
    fn drain_takes_everything_once() {
        let table = AllocationTable::default();
        for n in 1..=3 * SLOTS as u64 / 2 {
            table.insert(n << 8, record(n));
        }
        let mut drained: Vec<u64> = table.drain().iter().map(|a| a.bytes / 4096).collect();
        drained.sort_unstable();
        assert_eq!(drained, (1..=3 * SLOTS as u64 / 2).collect::<Vec<_>>());
        assert!(table.drain().is_empty());
        assert_eq!(table.remove(1 << 8), None);
    }

    #[test]
    fn threads_inserting_and_removing_never_lose_or_duplicate_a_record() {
        const THREADS: u64 = 4;
        const ROUNDS: u64 = 20_000;
        let table = AllocationTable::default();
        let taken = AtomicU64::new(0);
        std::thread::scope(|scope| {
            for t in 0..THREADS {
                let (table, taken) = (&table, &taken);
                scope.spawn(move || {
                    for round in 0..ROUNDS {
                        // Each thread's keys are its own; their buckets are shared with the others'.
                        let key = (round % 64 + 1) << 20 | t << 8;
                        let n = t * ROUNDS + round;
                        table.insert(key, record(n));
                        // Another thread racing for our key must find nothing.
                        let stranger = (round % 64 + 1) << 20 | ((t + 1) % THREADS) << 8 | 1;
                        assert_eq!(table.remove(stranger), None);
                        assert_eq!(table.remove(key), Some(record(n)));
                        taken.fetch_add(1, Ordering::Relaxed);
                    }
                });
            }
        });
        assert_eq!(taken.load(Ordering::Relaxed), THREADS * ROUNDS);
        assert!(table.drain().is_empty());
    }

    #[test]
    fn of_two_threads_removing_one_key_exactly_one_gets_it() {
        let table = AllocationTable::default();
        for round in 0..2_000u64 {
            let key = round << 12 | 0x100;
            table.insert(key, record(round));
            let winners = AtomicU64::new(0);
            std::thread::scope(|scope| {
                for _ in 0..2 {
                    scope.spawn(|| {
                        if table.remove(key).is_some() {
                            winners.fetch_add(1, Ordering::Relaxed);
                        }
                    });
                }
            });
            assert_eq!(winners.load(Ordering::Relaxed), 1, "round {round}");
        }
    }
}
