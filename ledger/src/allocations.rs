//! Which live device pointer was charged to which device, so a free credits the right budget.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use parking_lot::Mutex;

/// One charged allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Allocation {
    pub device: usize,
    pub bytes: u64,
    pub owner: super::Owner,
}

/// Live allocations of this process, keyed by device address.
#[derive(Debug, Default)]
pub struct AllocationTable {
    live: Mutex<HashMap<u64, Allocation, BuildHasherDefault<AddressHasher>>>,
}

impl AllocationTable {
    pub fn insert(&self, address: u64, allocation: Allocation) {
        self.live.lock().insert(address, allocation);
    }

    pub fn remove(&self, address: u64) -> Option<Allocation> {
        self.live.lock().remove(&address)
    }

    /// Removes and returns every live allocation (their owner is going away).
    pub fn drain(&self) -> Vec<Allocation> {
        self.live.lock().drain().map(|(_, allocation)| allocation).collect()
    }
}

/// Device addresses are already well spread; one multiply mixes the aligned low bits away.
/// SipHash would cost more than the rest of the hook.
#[derive(Default)]
struct AddressHasher(u64);

impl Hasher for AddressHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 = (self.0 ^ u64::from(byte)).wrapping_mul(0x100_0000_01b3);
        }
    }

    fn write_u64(&mut self, value: u64) {
        self.0 = (value ^ (value >> 29)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_then_remove_once() {
        let table = AllocationTable::default();
        let a = Allocation { device: 1, bytes: 4096, owner: 0 };
        table.insert(0x7000_0000, a);
        assert_eq!(table.remove(0x7000_0000), Some(a));
        assert_eq!(table.remove(0x7000_0000), None);
    }
}
