//! Virtual memory management: physical allocations (`cuMemCreate` / `cuMemRelease`), address
//! reservations (`cuMemAddressReserve` / `cuMemAddressFree`) and the mappings between them
//! (`cuMemMap` / `cuMemUnmap`).
//!
//! Only physical allocations cost device memory: `cuMemCreate` charges its size, and the bytes come back
//! once every handle reference is released and the last mapping unmapped, like the driver's reference
//! counting. `cuMemCreate` hands out one handle reference; `cuMemRetainAllocationHandle` adds one more
//! for the allocation mapped at an address, each dropped by a `cuMemRelease`.
//! Reserving or mapping address space charges nothing (PyTorch reserves more than the card holds).
//!
//! Physical allocations hold bytes ([`Contents`]); a mapping names the allocation and the offset in it
//! that its first address shows. Ranges that were mapped and are unmapped now (swapped out, say) are
//! kept as *vacated* until mapped again or their reservation is freed: a launch while any is left
//! counts in `launch_while_unmapped`.

use std::collections::BTreeMap;

use crate::handles::{self, Keys, Kind};
use crate::memory::ALIGN;
use crate::memory::contents::Contents;
use crate::state::{Fake, Refusal};

/// What `cuMemGetAllocationGranularity` answers (minimum and recommended alike).
pub const GRANULARITY: u64 = 2 << 20;
/// Reservations are whole host pages.
const PAGE: u64 = 4096;

pub(super) struct Physical {
    device: usize,
    size: u64,
    /// Handle references not yet released; at 0 the handle is dead (though mappings may keep the
    /// memory, and a retain on a mapped address revives it).
    handles: u32,
    mappings: u32,
    pub(super) contents: Contents,
}

impl Physical {
    /// Whether nothing refers to the memory any more, so it goes back to its device.
    fn unreferenced(&self) -> bool {
        self.handles == 0 && self.mappings == 0
    }
}

pub(super) struct Mapping {
    pub(super) size: u64,
    /// The physical allocation's key.
    pub(super) key: u64,
    /// Where in the physical allocation the mapping's first byte lies.
    pub(super) offset: u64,
}

pub struct Vmm {
    pub(super) physical: BTreeMap<u64, Physical>,
    /// start → size.
    reservations: BTreeMap<u64, u64>,
    mappings: BTreeMap<u64, Mapping>,
    /// Ranges of live reservations that were mapped and are not now: start → end, disjoint and not
    /// touching.
    vacated: BTreeMap<u64, u64>,
    keys: Keys,
    /// Copies and memsets refused for touching reserved addresses that nothing maps.
    pub(super) unmapped_access: u64,
    /// Launches made while some range was vacated.
    launch_while_unmapped: u64,
}

impl Vmm {
    pub fn new() -> Vmm {
        Vmm {
            physical: BTreeMap::new(),
            reservations: BTreeMap::new(),
            mappings: BTreeMap::new(),
            vacated: BTreeMap::new(),
            keys: Keys::starting_at(1),
            unmapped_access: 0,
            launch_while_unmapped: 0,
        }
    }

    /// (start, size) of the mapping that contains `address`.
    pub fn mapping_containing(&self, address: u64) -> Option<(u64, u64)> {
        self.mapping_at(address).map(|(start, mapping)| (start, mapping.size))
    }

    /// The mapping that contains `address`, with its start.
    pub(super) fn mapping_at(&self, address: u64) -> Option<(u64, &Mapping)> {
        let (&start, mapping) = self.mappings.range(..=address).next_back()?;
        (address - start < mapping.size).then_some((start, mapping))
    }

    /// Whether any reservation overlaps `[start, end)`.
    pub(super) fn reserved_within(&self, start: u64, end: u64) -> bool {
        self.reservations.range(..end).next_back().is_some_and(|(&s, &size)| s + size > start)
    }

    /// Counts a launch, as made while memory was out when some mapped range is vacated now.
    pub fn note_launch(&mut self) {
        if !self.vacated.is_empty() {
            self.launch_while_unmapped += 1;
        }
    }

    /// Copies and memsets refused for touching reserved addresses that nothing maps.
    pub fn unmapped_access(&self) -> u64 {
        self.unmapped_access
    }

    /// Launches made while a range that was mapped is not.
    pub fn launch_while_unmapped(&self) -> u64 {
        self.launch_while_unmapped
    }

    /// Whether any mapping overlaps `[start, end)`.
    fn mapped_within(&self, start: u64, end: u64) -> bool {
        self.mappings.range(..end).next_back().is_some_and(|(&s, m)| s + m.size > start)
    }

    /// Whether every byte of `[start, end)` is mapped.
    pub(super) fn fully_mapped(&self, start: u64, end: u64) -> bool {
        let mut covered = start;
        while covered < end {
            match self.mapping_containing(covered) {
                Some((s, size)) => covered = s + size,
                None => return false,
            }
        }
        true
    }

    /// Drops one mapping of physical allocation `key`; returns (device, bytes) to credit when that was
    /// the last reference.
    fn unreference(&mut self, key: u64) -> Option<(usize, u64)> {
        let physical = self.physical.get_mut(&key)?;
        physical.mappings = physical.mappings.saturating_sub(1);
        if physical.unreferenced() {
            return self.physical.remove(&key).map(|p| (p.device, p.size));
        }
        None
    }
}

/// Adds `[start, end)` to `ranges` (start → end, disjoint), merged with every range it overlaps or
/// touches.
fn add_range(ranges: &mut BTreeMap<u64, u64>, mut start: u64, mut end: u64) {
    let touching: Vec<u64> =
        ranges.range(..=end).rev().take_while(|&(_, &e)| e >= start).map(|(&s, _)| s).collect();
    for s in touching {
        if let Some(e) = ranges.remove(&s) {
            start = start.min(s);
            end = end.max(e);
        }
    }
    ranges.insert(start, end);
}

/// Takes `[start, end)` out of `ranges`, cutting the ranges it overlaps.
fn remove_range(ranges: &mut BTreeMap<u64, u64>, start: u64, end: u64) {
    let overlapping: Vec<(u64, u64)> =
        ranges.range(..end).rev().take_while(|&(_, &e)| e > start).map(|(&s, &e)| (s, e)).collect();
    for (s, e) in overlapping {
        ranges.remove(&s);
        if s < start {
            ranges.insert(s, start);
        }
        if e > end {
            ranges.insert(end, e);
        }
    }
}

fn aligned(value: u64) -> bool {
    value.is_multiple_of(GRANULARITY)
}

impl Fake {
    /// `cuMemCreate`: charges `size` (a non-zero multiple of the granularity) to physical `device`.
    pub fn create_physical(&self, device: usize, size: u64) -> Result<u64, Refusal> {
        if size == 0 || !aligned(size) {
            return Err(Refusal::BadArgument);
        }
        let mut registry = self.lock();
        self.charge(device, size)?;
        let key = registry.vmm.keys.next();
        let physical = Physical { device, size, handles: 1, mappings: 0, contents: Contents::default() };
        registry.vmm.physical.insert(key, physical);
        Ok(handles::encode(Kind::Allocation, key))
    }

    /// `cuMemRelease`: drops one handle reference; the handle dies with its last reference, the memory
    /// when, besides, its last mapping goes.
    pub fn release_physical(&self, handle: u64) -> Result<(), Refusal> {
        let mut registry = self.lock();
        let vmm = &mut registry.vmm;
        let key = handles::decode(Kind::Allocation, handle).ok_or(Refusal::Unknown)?;
        let physical = vmm.physical.get_mut(&key).filter(|p| p.handles > 0).ok_or(Refusal::Unknown)?;
        physical.handles -= 1;
        if physical.unreferenced() {
            self.credit(physical.device, physical.size);
            vmm.physical.remove(&key);
        }
        Ok(())
    }

    /// `cuMemRetainAllocationHandle`: one more reference to the allocation mapped at `address` (anywhere
    /// inside a mapping), to be dropped by its own `cuMemRelease`.
    pub fn retain_physical(&self, address: u64) -> Result<u64, Refusal> {
        let mut registry = self.lock();
        let vmm = &mut registry.vmm;
        let (start, _) = vmm.mapping_containing(address).ok_or(Refusal::Unknown)?;
        let key = vmm.mappings.get(&start).ok_or(Refusal::Unknown)?.key;
        let physical = vmm.physical.get_mut(&key).ok_or(Refusal::Unknown)?;
        physical.handles = physical.handles.checked_add(1).ok_or(Refusal::BadArgument)?;
        Ok(handles::encode(Kind::Allocation, key))
    }

    /// The device of a live handle (`cuMemGetAllocationPropertiesFromHandle`,
    /// `cuMemExportToShareableHandle`).
    pub fn physical_device(&self, handle: u64) -> Result<usize, Refusal> {
        let registry = self.lock();
        let key = handles::decode(Kind::Allocation, handle).ok_or(Refusal::Unknown)?;
        let physical = registry.vmm.physical.get(&key).filter(|p| p.handles > 0).ok_or(Refusal::Unknown)?;
        Ok(physical.device)
    }

    /// `cuMemAddressReserve`: address space only, charged to no device.
    pub fn reserve_addresses(&self, size: u64, alignment: u64, hint: u64) -> Result<u64, Refusal> {
        if size == 0 || !size.is_multiple_of(PAGE) || !(alignment == 0 || alignment.is_power_of_two()) {
            return Err(Refusal::BadArgument);
        }
        let mut registry = self.lock();
        let start = registry
            .space
            .take_wide(size, alignment.max(GRANULARITY).max(ALIGN), hint)
            .ok_or(Refusal::OutOfMemory)?;
        registry.vmm.reservations.insert(start, size);
        Ok(start)
    }

    /// `cuMemAddressFree`: exactly one whole reservation, with nothing mapped in it.
    pub fn free_addresses(&self, start: u64, size: u64) -> Result<(), Refusal> {
        let mut registry = self.lock();
        let vmm = &mut registry.vmm;
        if vmm.reservations.get(&start) != Some(&size) {
            return Err(Refusal::Unknown);
        }
        if vmm.mapped_within(start, start + size) {
            return Err(Refusal::BadArgument);
        }
        vmm.reservations.remove(&start);
        remove_range(&mut vmm.vacated, start, start + size);
        Ok(())
    }

    /// `cuMemMap`: maps `size` bytes of a live physical allocation, from `offset`, at `start` inside one
    /// reservation, over nothing already mapped. Everything in granularity multiples.
    pub fn map(&self, start: u64, size: u64, offset: u64, handle: u64) -> Result<(), Refusal> {
        if size == 0 || !aligned(start) || !aligned(size) || !aligned(offset) {
            return Err(Refusal::BadArgument);
        }
        let end = start.checked_add(size).ok_or(Refusal::BadArgument)?;
        let mut registry = self.lock();
        let vmm = &mut registry.vmm;
        let key = handles::decode(Kind::Allocation, handle).ok_or(Refusal::Unknown)?;
        let physical = vmm.physical.get(&key).filter(|p| p.handles > 0).ok_or(Refusal::Unknown)?;
        if offset.checked_add(size).is_none_or(|last| last > physical.size) {
            return Err(Refusal::BadArgument);
        }
        let reserved = vmm.reservations.range(..=start).next_back().is_some_and(|(&s, &len)| end <= s + len);
        if !reserved || vmm.mapped_within(start, end) {
            return Err(Refusal::BadArgument);
        }
        vmm.mappings.insert(start, Mapping { size, key, offset });
        remove_range(&mut vmm.vacated, start, end);
        if let Some(physical) = vmm.physical.get_mut(&key) {
            physical.mappings += 1;
        }
        Ok(())
    }

    /// `cuMemUnmap`: every mapping that `[start, start + size)` touches must lie wholly inside it.
    pub fn unmap(&self, start: u64, size: u64) -> Result<(), Refusal> {
        let end = start.checked_add(size).filter(|_| size > 0).ok_or(Refusal::BadArgument)?;
        let mut registry = self.lock();
        let vmm = &mut registry.vmm;
        let first = vmm.mapping_containing(start).map_or(start, |(s, _)| s);
        let touched: Vec<(u64, u64)> =
            vmm.mappings.range(first..end).map(|(&s, m)| (s, s + m.size)).collect();
        if touched.is_empty() || touched.iter().any(|&(s, e)| s < start || e > end) {
            return Err(Refusal::BadArgument);
        }
        for (s, e) in touched {
            let Some(mapping) = vmm.mappings.remove(&s) else { continue };
            add_range(&mut vmm.vacated, s, e);
            if let Some((device, bytes)) = vmm.unreference(mapping.key) {
                self.credit(device, bytes);
            }
        }
        Ok(())
    }

    /// `cuMemSetAccess`: succeeds on a range that is wholly mapped.
    pub fn check_mapped(&self, start: u64, size: u64) -> Result<(), Refusal> {
        let end = start.checked_add(size).filter(|_| size > 0).ok_or(Refusal::BadArgument)?;
        self.lock().vmm.fully_mapped(start, end).then_some(()).ok_or(Refusal::BadArgument)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ranges(pairs: &[(u64, u64)]) -> BTreeMap<u64, u64> {
        pairs.iter().copied().collect()
    }

    #[test]
    fn added_ranges_merge_with_what_they_touch() {
        let mut vacated = BTreeMap::new();
        add_range(&mut vacated, 10, 20);
        add_range(&mut vacated, 30, 40);
        assert_eq!(vacated, ranges(&[(10, 20), (30, 40)]));
        add_range(&mut vacated, 20, 30);
        assert_eq!(vacated, ranges(&[(10, 40)]), "touching on both sides");
        add_range(&mut vacated, 50, 60);
        add_range(&mut vacated, 0, 55);
        assert_eq!(vacated, ranges(&[(0, 60)]), "overlapping several");
    }

    #[test]
    fn removed_ranges_cut_what_they_overlap() {
        let mut vacated = ranges(&[(0, 100), (200, 300)]);
        remove_range(&mut vacated, 40, 60);
        assert_eq!(vacated, ranges(&[(0, 40), (60, 100), (200, 300)]));
        remove_range(&mut vacated, 100, 200);
        assert_eq!(vacated, ranges(&[(0, 40), (60, 100), (200, 300)]), "a gap: nothing");
        remove_range(&mut vacated, 30, 250);
        assert_eq!(vacated, ranges(&[(0, 30), (250, 300)]));
        remove_range(&mut vacated, 0, 300);
        assert!(vacated.is_empty());
    }
}
