//! The pinned ring: a few pinned buffers of a chunk's size per context, through which chunks held
//! in pageable memory move at the link's speed (issue 49).
//!
//! The driver copies pageable memory through small buffers of its own, one copy at a time (2.5-9
//! GB/s on an H100, against 54 for pinned memory), and pinning a chunk's own buffer costs 0.84 s per
//! GiB, so a process whose memory was not pinned ahead swapped slowly: its first swap, a busy
//! process forced out, a host that cannot pin it all. Through the ring, a swap-out copies a chunk
//! into a ring buffer at the link's speed and several threads copy it on into pageable memory while
//! the next chunks' copies run; a swap-in takes the same path backwards ([`Staging`]). The ring is
//! made at the first swap-out that needs it (`RING_BUFFERS` chunks: 256 MiB, about 0.2 s of pinning
//! on an H100), as host memory allows ([`pin_ahead_allowed`]), and kept for the process's life; it
//! counts in the record's pinned bytes.

use super::*;

/// Pinned buffers per context: enough that copies to and from the card keep running while threads
/// copy the others on.
pub(super) const RING_BUFFERS: usize = 4;

impl Swap {
    /// The ring of `context` (on `device`), made now if it has none: `None` when the host cannot
    /// pin it (chunks then take the driver's pageable path).
    pub(super) fn ring<'a>(
        &self,
        runtime: &Runtime,
        calls: &Calls,
        rings: &'a mut Rings,
        context: usize,
        device: usize,
    ) -> Option<&'a [usize]> {
        if let std::collections::hash_map::Entry::Vacant(entry) = rings.entry(context) {
            if !pin_ahead_allowed(RING_BUFFERS * CHUNK) {
                return None;
            }
            let mut buffers = Vec::with_capacity(RING_BUFFERS);
            buffers.extend((0..RING_BUFFERS).map_while(|_| pin(calls, context, CHUNK)));
            if buffers.is_empty() {
                return None;
            }
            self.add(runtime, device, Word::Pinned, (buffers.len() * CHUNK) as i64);
            entry.insert(buffers);
        }
        rings.get(&context).map(Vec::as_slice)
    }
}
