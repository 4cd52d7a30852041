//! Page-locked host memory: `cuMemHostAlloc` / `cuMemAllocHost_v2` (real heap memory the caller may
//! touch, allocated by the shims) and `cuMemHostRegister_v2` of the caller's own memory. None of it is
//! device memory: nothing here is charged to a device.

use std::collections::BTreeMap;

use crate::state::{Fake, Refusal};

pub struct HostMemory {
    /// Start → size of the driver's own allocations.
    allocations: BTreeMap<usize, usize>,
    /// Start → size of registered caller memory.
    registered: BTreeMap<usize, usize>,
}

impl HostMemory {
    pub fn new() -> HostMemory {
        HostMemory { allocations: BTreeMap::new(), registered: BTreeMap::new() }
    }

    /// Whether `[start, end)` overlaps memory that is already page-locked.
    fn pinned_within(&self, start: usize, end: usize) -> bool {
        [&self.allocations, &self.registered]
            .iter()
            .any(|ranges| ranges.range(..end).next_back().is_some_and(|(&s, &size)| s + size > start))
    }
}

impl Fake {
    pub fn record_host_allocation(&self, start: usize, size: usize) {
        self.lock().host.allocations.insert(start, size);
    }

    /// Whether `address` lies in the driver's host memory or in registered caller memory.
    pub fn is_pinned_host(&self, address: usize) -> bool {
        self.lock().host.pinned_within(address, address.saturating_add(1))
    }

    /// Forgets one of the driver's host allocations, so the shim may free it.
    pub fn forget_host_allocation(&self, start: usize) -> Result<(), Refusal> {
        self.lock().host.allocations.remove(&start).map(drop).ok_or(Refusal::Unknown)
    }

    /// `cuMemHostRegister_v2`: refuses memory that is already page-locked, in part or whole.
    pub fn register_host(&self, start: usize, size: usize) -> Result<(), Refusal> {
        let end = start.checked_add(size).filter(|_| size > 0).ok_or(Refusal::BadArgument)?;
        let mut registry = self.lock();
        if registry.host.pinned_within(start, end) {
            return Err(Refusal::AlreadyRegistered);
        }
        registry.host.registered.insert(start, size);
        Ok(())
    }

    /// `cuMemHostUnregister`: `start` must be where a registration began.
    pub fn unregister_host(&self, start: usize) -> Result<(), Refusal> {
        self.lock().host.registered.remove(&start).map(drop).ok_or(Refusal::NotRegistered)
    }
}
