//! What the driver answers about an address in swappable memory of ours: `cuMemGetAddressRange_v2`
//! and the range start and size of `cuPointerGetAttribute(s)`. The driver sees our chunks as
//! separate mappings, and nothing at all while they are off the card; the application made one
//! allocation, so the answer is that allocation, as the driver gives it for `cuMemAlloc` and a
//! pool's allocations: its address and the size asked for. NCCL's buffer registration and
//! PyTorch's sharing of tensors look allocations up this way.

use super::*;

impl Swap {
    /// The allocation of ours (`cuMemAlloc`'s or stream-ordered, not freed) that `address` lies in:
    /// its address and size. `None` for any other address; the application's own VMM ranges are
    /// mapped as it mapped them, so the driver's answer for them stands.
    pub fn range_of(&self, address: CUdeviceptr) -> Option<(CUdeviceptr, usize)> {
        if !self.active.load(Ordering::Relaxed) {
            return None;
        }
        let inner = self.inner.lock();
        let (&base, block) = inner.blocks.range(..=address).next_back()?;
        let Origin::Ours { size, .. } = block.origin else { return None };
        let inside = address - base < size as CUdeviceptr;
        (inside && !Swap::is_kept(&inner, base)).then_some((base, size))
    }
}
