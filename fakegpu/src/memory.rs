//! Linear device memory (`cuMemAlloc`, `cuMemAllocPitch`, `cuMemAllocManaged`, and the blocks that
//! stream-ordered allocation takes from pools) and the device address space every family draws from.
//!
//! Linear blocks are charged to their device exactly, without rounding; addresses are 512-byte aligned.
//! They have no contents: only VMM memory holds bytes (`contents`). The other families live in the
//! submodules; all of them keep their records in the one `Registry`.

pub mod arrays;
pub mod contents;
pub mod graphs;
pub mod host;
pub mod ipc;
pub mod modules;
pub mod pools;
pub mod vmm;

use std::collections::BTreeMap;
use std::ops::Range;

use crate::state::{Fake, Refusal};

/// Device pointers are aligned like the real driver's smallest allocation granularity.
pub const ALIGN: u64 = 512;
/// `cuMemAllocPitch` rounds each row up to a multiple of this.
const PITCH_ALIGN: u64 = 512;
/// Addresses handed out by the 32-bit v1 ABIs (`cuMemAlloc`, `cuMemAllocPitch`); reused once freed.
const NARROW: Range<u64> = 0x10_0000..0x1_0000_0000;
/// First of the 64-bit addresses, which every family shares and which are never reused.
const WIDE_BASE: u64 = 1 << 40;

/// Which ABI asked for a device pointer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Width {
    Bits32,
    Bits64,
}

/// Where a block's bytes go when it is freed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Owner {
    /// Straight back to the device: `cuMemAlloc`, `cuMemAllocPitch`, `cuMemAllocManaged`.
    Device,
    /// Into the cache of the pool with this key: `cuMemAllocAsync`, `cuMemAllocFromPoolAsync`.
    Pool(u64),
}

/// What kind of linear memory a block is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavor {
    Device,
    Managed,
}

pub struct Block {
    pub device: usize,
    pub size: u64,
    span: u64,
    pub owner: Owner,
    pub flavor: Flavor,
    /// Freed by `cuMemFreeAsync`; the bytes come back at the next synchronize.
    pub freeing: bool,
}

/// Live linear blocks and the placement of every device address.
pub struct AddressSpace {
    pub blocks: BTreeMap<u64, Block>,
    /// Blocks freed by `cuMemFreeAsync`, not yet synchronized.
    pub freeing: Vec<u64>,
    next_wide: u64,
}

impl AddressSpace {
    pub fn new() -> AddressSpace {
        AddressSpace { blocks: BTreeMap::new(), freeing: Vec::new(), next_wide: WIDE_BASE }
    }

    /// Picks an address for `size` bytes: bump allocation for 64-bit, first fit below 4 GiB for 32-bit.
    /// Returns (address, span).
    fn place(&mut self, size: u64, width: Width) -> Option<(u64, u64)> {
        let span = size.checked_next_multiple_of(ALIGN)?;
        match width {
            Width::Bits64 => Some((self.take_wide(span, ALIGN, 0)?, span)),
            Width::Bits32 => {
                let mut candidate = NARROW.start;
                for (&start, block) in self.blocks.range(NARROW) {
                    if start - candidate >= span {
                        break;
                    }
                    candidate = start + block.span;
                }
                (NARROW.end - candidate >= span).then_some((candidate, span))
            }
        }
    }

    /// Takes `size` bytes of 64-bit address space aligned to `align` (a power of two): at `hint` when
    /// that is aligned and was never handed out, else at the next free address.
    pub fn take_wide(&mut self, size: u64, align: u64, hint: u64) -> Option<u64> {
        let start = if hint >= self.next_wide && hint.is_multiple_of(align) {
            hint
        } else {
            self.next_wide.checked_next_multiple_of(align)?
        };
        self.next_wide = start.checked_add(size)?.checked_next_multiple_of(ALIGN)?;
        Some(start)
    }

    /// The live block that contains `address`, with its start.
    pub fn block_containing(&self, address: u64) -> Option<(u64, &Block)> {
        let (&start, block) = self.blocks.range(..=address).next_back()?;
        (address - start < block.size).then_some((start, block))
    }

    /// Places a block of `size` (> 0) bytes; `None` when the address range of that width is full.
    pub fn insert(&mut self, block: Block, width: Width) -> Option<u64> {
        let (address, span) = self.place(block.size, width)?;
        self.blocks.insert(address, Block { span, ..block });
        Some(address)
    }
}

/// The row pitch `cuMemAllocPitch` picks for rows of `width` bytes.
pub fn pitch(width: u64) -> Option<u64> {
    width.checked_next_multiple_of(PITCH_ALIGN)
}

impl Fake {
    /// Charges `size` (> 0) bytes to physical `device` and returns a fresh address of that width.
    /// Managed memory is counted apart and never refused for the card's size: the real driver
    /// backs it with host memory and migrates its pages (it may exceed the card).
    pub fn allocate(&self, device: usize, size: u64, width: Width, flavor: Flavor) -> Result<u64, Refusal> {
        let mut registry = self.lock();
        match flavor {
            Flavor::Device => self.charge(device, size)?,
            Flavor::Managed => self.ledger.add_managed(device, size as i64),
        }
        let block = Block { device, size, span: 0, owner: Owner::Device, flavor, freeing: false };
        registry.space.insert(block, width).ok_or_else(|| {
            self.uncharge(device, size, flavor);
            Refusal::OutOfMemory
        })
    }

    pub(crate) fn uncharge(&self, device: usize, size: u64, flavor: Flavor) {
        match flavor {
            Flavor::Device => self.credit(device, size),
            Flavor::Managed => self.ledger.add_managed(device, -(size as i64)),
        }
    }

    /// Checks that `[address, address + size)` lies inside one live managed block (what
    /// `cuMemAdvise` and `cuMemPrefetchAsync` accept) and returns its device.
    pub fn managed_range(&self, address: u64, size: u64) -> Result<usize, Refusal> {
        let registry = self.lock();
        let (start, block) = registry.space.block_containing(address).ok_or(Refusal::Unknown)?;
        let inside = address.checked_add(size).is_some_and(|end| end <= start + block.size);
        (block.flavor == Flavor::Managed && inside && size > 0)
            .then_some(block.device)
            .ok_or(Refusal::Unknown)
    }

    /// Frees a live block at once (`cuMemFree`): its bytes go back to the device, or to its pool, which
    /// then trims to its release threshold as `cuMemFree` synchronizes.
    pub fn free(&self, address: u64) -> Result<(), Refusal> {
        let mut registry = self.lock();
        let registry = &mut *registry;
        if registry.space.blocks.get(&address).is_none_or(|block| block.freeing) {
            return Err(Refusal::Unknown);
        }
        let Some(block) = registry.space.blocks.remove(&address) else {
            return Err(Refusal::Unknown);
        };
        match block.owner {
            Owner::Device => self.uncharge(block.device, block.size, block.flavor),
            Owner::Pool(key) => self.return_to_pool(&mut registry.pools, key, block.size, true),
        }
        Ok(())
    }

    /// (base, size) of the allocation that contains `address`: a linear block, an IPC mapping, or a VMM
    /// mapping.
    pub fn address_range(&self, address: u64) -> Result<(u64, u64), Refusal> {
        let registry = self.lock();
        let block = registry.space.block_containing(address).map(|(start, block)| (start, block.size));
        block
            .or_else(|| registry.ipc.containing(address))
            .or_else(|| registry.vmm.mapping_containing(address))
            .ok_or(Refusal::Unknown)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn narrow_addresses_fit_and_refill_gaps() {
        let mut space = AddressSpace::new();
        let take = |space: &mut AddressSpace, size| {
            let block = Block {
                device: 0,
                size,
                span: 0,
                owner: Owner::Device,
                flavor: Flavor::Device,
                freeing: false,
            };
            space.insert(block, Width::Bits32)
        };
        let a = take(&mut space, 1).expect("room");
        let b = take(&mut space, 1000).expect("room");
        assert_eq!((a, b), (NARROW.start, NARROW.start + 512));
        space.blocks.remove(&a);
        assert_eq!(take(&mut space, 512), Some(a));
        assert_eq!(take(&mut space, 513), Some(b + 1024));
        assert!(take(&mut space, 1 << 32).is_none());
        assert_eq!(space.place(10, Width::Bits64), Some((WIDE_BASE, 512)));
    }

    #[test]
    fn wide_addresses_honour_alignment_and_fresh_hints() {
        let mut space = AddressSpace::new();
        assert_eq!(space.take_wide(512, 512, 0), Some(WIDE_BASE));
        let two_mib = 2 << 20;
        assert_eq!(space.take_wide(two_mib, two_mib, 0), Some(WIDE_BASE + two_mib));
        assert_eq!(space.take_wide(512, 512, WIDE_BASE), Some(WIDE_BASE + 2 * two_mib), "used: ignored");
        assert_eq!(space.take_wide(512, 512, 1 << 45), Some(1 << 45));
        assert_eq!(space.take_wide(512, 512, 0), Some((1 << 45) + 512));
    }

    #[test]
    fn pitch_rounds_rows_up_to_512() {
        assert_eq!(pitch(1), Some(512));
        assert_eq!(pitch(512), Some(512));
        assert_eq!(pitch(513), Some(1024));
        assert_eq!(pitch(u64::MAX), None);
    }
}
