//! CUDA IPC: `cuIpcGetMemHandle` encodes a linear allocation into the 64-byte handle,
//! `cuIpcOpenMemHandle_v2` maps it at a new address, `cuIpcCloseMemHandle` unmaps it. Opening maps
//! memory another process (or this one) already paid for, so it charges nothing.
//!
//! Handle layout (native-endian): bytes 0..8 the magic `fakegpu\x01`, 8..16 the allocation's base
//! address, 16..24 its size, 24..28 its physical device, the rest zero.

use std::collections::BTreeMap;

use crate::memory::{ALIGN, Flavor, Owner};
use crate::state::{Fake, Refusal};

pub const HANDLE_BYTES: usize = 64;
const MAGIC: [u8; 8] = *b"fakegpu\x01";

/// What a handle names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Exported {
    base: u64,
    size: u64,
    device: u32,
}

impl Exported {
    fn encode(self) -> [u8; HANDLE_BYTES] {
        let mut bytes = [0; HANDLE_BYTES];
        bytes[..8].copy_from_slice(&MAGIC);
        bytes[8..16].copy_from_slice(&self.base.to_ne_bytes());
        bytes[16..24].copy_from_slice(&self.size.to_ne_bytes());
        bytes[24..28].copy_from_slice(&self.device.to_ne_bytes());
        bytes
    }

    fn decode(bytes: &[u8; HANDLE_BYTES]) -> Option<Exported> {
        let word = |range: std::ops::Range<usize>| bytes.get(range).and_then(|b| b.try_into().ok());
        if bytes[..8] != MAGIC {
            return None;
        }
        Some(Exported {
            base: u64::from_ne_bytes(word(8..16)?),
            size: u64::from_ne_bytes(word(16..24)?),
            device: u32::from_ne_bytes(bytes[24..28].try_into().ok()?),
        })
    }
}

/// Addresses where this process opened IPC handles: start → size.
pub struct IpcMappings(BTreeMap<u64, u64>);

impl IpcMappings {
    pub fn new() -> IpcMappings {
        IpcMappings(BTreeMap::new())
    }

    /// (start, size) of the opened mapping that contains `address`.
    pub fn containing(&self, address: u64) -> Option<(u64, u64)> {
        let (&start, &size) = self.0.range(..=address).next_back()?;
        (address - start < size).then_some((start, size))
    }
}

impl Fake {
    /// `cuIpcGetMemHandle`: any address inside a live `cuMemAlloc`/`cuMemAllocPitch` block names that
    /// whole block (managed and pool memory cannot be exported this way).
    pub fn ipc_handle(&self, address: u64) -> Result<[u8; HANDLE_BYTES], Refusal> {
        let registry = self.lock();
        let (base, block) = registry.space.block_containing(address).ok_or(Refusal::Unknown)?;
        if block.owner != Owner::Device || block.flavor != Flavor::Device || block.freeing {
            return Err(Refusal::BadArgument);
        }
        Ok(Exported { base, size: block.size, device: block.device as u32 }.encode())
    }

    /// `cuIpcOpenMemHandle_v2`: a fresh address for the exported allocation, charged to no device.
    pub fn ipc_open(&self, handle: &[u8; HANDLE_BYTES]) -> Result<u64, Refusal> {
        let exported = Exported::decode(handle).ok_or(Refusal::BadArgument)?;
        if exported.device as usize >= self.device_count || exported.size == 0 {
            return Err(Refusal::BadArgument);
        }
        let mut registry = self.lock();
        let span = exported.size.checked_next_multiple_of(ALIGN).ok_or(Refusal::BadArgument)?;
        let start = registry.space.take_wide(span, ALIGN, 0).ok_or(Refusal::OutOfMemory)?;
        registry.ipc.0.insert(start, exported.size);
        Ok(start)
    }

    /// `cuIpcCloseMemHandle`: `address` must be what `ipc_open` returned.
    pub fn ipc_close(&self, address: u64) -> Result<(), Refusal> {
        self.lock().ipc.0.remove(&address).map(drop).ok_or(Refusal::Unknown)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_round_trip() {
        let exported = Exported { base: 1 << 40, size: 4096, device: 3 };
        let bytes = exported.encode();
        assert_eq!(Exported::decode(&bytes), Some(exported));
        assert_eq!(Exported::decode(&[0; HANDLE_BYTES]), None);
    }
}
