//! CUDA arrays (`cuArrayCreate_v2`, `cuArray3DCreate_v2`) and mipmapped arrays
//! (`cuMipmappedArrayCreate`), charged to the current context's device until destroyed.
//!
//! The fake's size model, without the driver's padding or tiling: an array costs
//! `Width × max(Height, 1) × max(Depth, 1) × NumChannels × element size`; a mipmapped array costs the sum
//! over its levels, each halving every dimension (never below 1), with the level count clamped to
//! `1 + floor(log2(largest dimension))` like the driver does.

use std::collections::BTreeMap;

use crate::handles::{self, Keys, Kind};
use crate::state::{Fake, Refusal};

/// An array's shape, from either descriptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    pub width: u64,
    pub height: u64,
    pub depth: u64,
    /// `CUarray_format`.
    pub format: i32,
    pub channels: u32,
}

/// Bytes per channel of a `CUarray_format`, for the formats the fake knows.
fn element_size(format: i32) -> Option<u64> {
    Some(match format {
        0x01 | 0x08 => 1,        // UNSIGNED_INT8, SIGNED_INT8
        0x02 | 0x09 | 0x10 => 2, // UNSIGNED_INT16, SIGNED_INT16, HALF
        0x03 | 0x0a | 0x20 => 4, // UNSIGNED_INT32, SIGNED_INT32, FLOAT
        _ => return None,
    })
}

impl Extent {
    /// Bytes per element (all channels); refuses a zero width, unknown formats and channel counts.
    fn element_bytes(&self) -> Result<u64, Refusal> {
        let size = element_size(self.format).ok_or(Refusal::BadArgument)?;
        if self.width == 0 || !matches!(self.channels, 1 | 2 | 4) {
            return Err(Refusal::BadArgument);
        }
        Ok(size * u64::from(self.channels))
    }

    /// (width, height, depth) with 0 counted as 1.
    fn dimensions(&self) -> [u64; 3] {
        [self.width, self.height.max(1), self.depth.max(1)]
    }

    /// What a plain array of this shape costs; sizes past `u64` saturate (and then cannot fit).
    pub fn bytes(&self) -> Result<u64, Refusal> {
        let element = self.element_bytes()?;
        Ok(self.dimensions().iter().fold(element, |bytes, &d| bytes.saturating_mul(d)))
    }

    /// What a mipmapped array of this shape with `levels` (≥ 1) levels costs.
    pub fn mipmapped_bytes(&self, levels: u32) -> Result<u64, Refusal> {
        let element = self.element_bytes()?;
        if levels == 0 {
            return Err(Refusal::BadArgument);
        }
        let mut dimensions = self.dimensions();
        let largest = dimensions.iter().copied().max().unwrap_or(1);
        let levels = levels.min(largest.ilog2() + 1);
        let mut total = 0u64;
        for _ in 0..levels {
            let level = dimensions.iter().fold(element, |bytes, &d| bytes.saturating_mul(d));
            total = total.saturating_add(level);
            dimensions = dimensions.map(|d| (d / 2).max(1));
        }
        Ok(total)
    }
}

struct ArrayRecord {
    device: usize,
    bytes: u64,
    kind: Kind,
}

pub struct Arrays {
    arrays: BTreeMap<u64, ArrayRecord>,
    keys: Keys,
}

impl Arrays {
    pub fn new() -> Arrays {
        Arrays { arrays: BTreeMap::new(), keys: Keys::starting_at(1) }
    }
}

impl Fake {
    /// Charges `bytes` to physical `device` for an array of `kind` (`Array` or `MipmappedArray`).
    pub fn create_array(&self, device: usize, bytes: u64, kind: Kind) -> Result<u64, Refusal> {
        let mut registry = self.lock();
        self.charge(device, bytes)?;
        let key = registry.arrays.keys.next();
        registry.arrays.arrays.insert(key, ArrayRecord { device, bytes, kind });
        Ok(handles::encode(kind, key))
    }

    pub fn destroy_array(&self, handle: u64, kind: Kind) -> Result<(), Refusal> {
        let mut registry = self.lock();
        let arrays = &mut registry.arrays.arrays;
        let key =
            handles::decode(kind, handle).filter(|key| arrays.contains_key(key)).ok_or(Refusal::Unknown)?;
        let Some(array) = arrays.remove(&key) else { return Err(Refusal::Unknown) };
        debug_assert_eq!(array.kind, kind);
        self.credit(array.device, array.bytes);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn extent(width: u64, height: u64, depth: u64, format: i32, channels: u32) -> Extent {
        Extent { width, height, depth, format, channels }
    }

    #[test]
    fn array_sizes() {
        assert_eq!(extent(100, 0, 0, 0x20, 1).bytes(), Ok(400));
        assert_eq!(extent(100, 10, 0, 0x01, 4).bytes(), Ok(4000));
        assert_eq!(extent(8, 8, 8, 0x10, 2).bytes(), Ok(2048));
        assert_eq!(extent(1, 1, 1, 0x0a, 1).bytes(), Ok(4));
        assert_eq!(extent(0, 1, 1, 0x20, 1).bytes(), Err(Refusal::BadArgument));
        assert_eq!(extent(1, 1, 1, 0x07, 1).bytes(), Err(Refusal::BadArgument));
        assert_eq!(extent(1, 1, 1, 0x20, 3).bytes(), Err(Refusal::BadArgument));
        assert_eq!(extent(u64::MAX, 2, 1, 0x20, 4).bytes(), Ok(u64::MAX));
    }

    #[test]
    fn mipmapped_sizes_halve_per_level() {
        // 8x4 floats: 32 + 8 + 2 + 1 elements of 4 bytes, and the clamp stops at 4 levels.
        assert_eq!(extent(8, 4, 0, 0x20, 1).mipmapped_bytes(4), Ok(4 * (32 + 8 + 2 + 1)));
        assert_eq!(extent(8, 4, 0, 0x20, 1).mipmapped_bytes(99), Ok(4 * (32 + 8 + 2 + 1)));
        assert_eq!(extent(8, 4, 0, 0x20, 1).mipmapped_bytes(1), Ok(4 * 32));
        assert_eq!(extent(8, 4, 0, 0x20, 1).mipmapped_bytes(0), Err(Refusal::BadArgument));
        assert_eq!(extent(4, 4, 4, 0x01, 1).mipmapped_bytes(3), Ok(64 + 8 + 1));
    }
}
