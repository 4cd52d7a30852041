//! The bytes of VMM physical memory, and the copies and memsets that move them.
//!
//! Only physical allocations (`cuMemCreate`) hold bytes: linear memory, pools, arrays and graph memory
//! stay addresses only. An allocation's bytes live in pages of [`PAGE`] bytes, each made on the first
//! write of a byte that is not zero, so memory never written costs nothing and reads as zeros; the
//! pages go when the allocation does (its last release and last unmap).
//!
//! Copies and memsets reach the bytes through mapped addresses; one range may span several mappings.
//! A device range that touches a reservation must be mapped throughout, else the call is refused (the
//! driver's INVALID_VALUE for an unmapped range) and counted as an unmapped access. A range that
//! touches no reservation is linear memory or an array: nothing moves, as before.

use std::collections::HashMap;

use crate::memory::vmm::Vmm;
use crate::state::{Fake, Refusal};

/// Bytes per page of contents.
const PAGE: usize = 64 << 10;
/// A device-to-device copy moves at most this many bytes at a time, through a buffer.
const CHUNK: usize = 1 << 20;

/// Where a device range lies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Placement {
    /// Outside every reservation (linear memory, an array): nothing to move.
    Elsewhere,
    /// Mapped throughout.
    Mapped,
}

/// What a write puts in each of its bytes.
#[derive(Clone, Copy)]
enum Source<'a> {
    /// These bytes, in order.
    Bytes(&'a [u8]),
    /// This element over and over, from the write's first byte (a memset).
    Pattern(&'a [u8]),
}

impl Source<'_> {
    /// Whether bytes `[from, from + len)` of the write are all zero.
    fn zero(&self, from: usize, len: usize) -> bool {
        match self {
            Source::Bytes(bytes) => bytes[from..from + len].iter().all(|&byte| byte == 0),
            Source::Pattern(element) => element.iter().all(|&byte| byte == 0),
        }
    }

    /// Puts bytes `[from, from + out.len())` of the write into `out`.
    fn put(&self, from: usize, out: &mut [u8]) {
        match *self {
            Source::Bytes(bytes) => out.copy_from_slice(&bytes[from..from + out.len()]),
            Source::Pattern([byte]) => out.fill(*byte),
            Source::Pattern(element) => {
                if element.is_empty() {
                    return;
                }
                // A tile of whole elements, in the phase `from` starts at.
                let mut tile = [0; 64];
                let tile_len = tile.len() - tile.len() % element.len();
                for (i, byte) in tile.iter_mut().enumerate() {
                    *byte = element[(from + i) % element.len()];
                }
                for part in out.chunks_mut(tile_len) {
                    part.copy_from_slice(&tile[..part.len()]);
                }
            }
        }
    }
}

/// The bytes of one physical allocation: page index → page, for the pages ever written.
#[derive(Default)]
pub struct Contents {
    pages: HashMap<u64, Box<[u8]>>,
}

impl Contents {
    /// The pieces of `[offset, offset + len)` page by page: (page index, offset in the page, length).
    fn pages(offset: u64, len: usize) -> impl Iterator<Item = (u64, usize, usize)> {
        let mut done = 0;
        std::iter::from_fn(move || {
            (done < len).then(|| {
                let at = offset + done as u64;
                let within = (at % PAGE as u64) as usize;
                let part = (PAGE - within).min(len - done);
                done += part;
                (at / PAGE as u64, within, part)
            })
        })
    }

    /// Copies the bytes from `offset` into `out`.
    fn read(&self, offset: u64, out: &mut [u8]) {
        let mut done = 0;
        for (page, within, part) in Contents::pages(offset, out.len()) {
            let out = &mut out[done..done + part];
            match self.pages.get(&page) {
                Some(bytes) => out.copy_from_slice(&bytes[within..within + part]),
                None => out.fill(0),
            }
            done += part;
        }
    }

    /// Writes bytes `[from, from + len)` of `source` at `offset`.
    fn write(&mut self, offset: u64, from: usize, len: usize, source: Source<'_>) {
        let mut done = 0;
        for (page, within, part) in Contents::pages(offset, len) {
            let at = from + done;
            done += part;
            if !self.pages.contains_key(&page) && source.zero(at, part) {
                continue;
            }
            let bytes = self.pages.entry(page).or_insert_with(|| vec![0; PAGE].into_boxed_slice());
            source.put(at, &mut bytes[within..within + part]);
        }
    }

    /// Whether no byte of `[offset, offset + len)` was ever written (other than zero).
    fn unwritten(&self, offset: u64, len: usize) -> bool {
        Contents::pages(offset, len).all(|(page, _, _)| !self.pages.contains_key(&page))
    }

    /// Pages allocated, for tests.
    #[cfg(test)]
    fn page_count(&self) -> usize {
        self.pages.len()
    }
}

/// Part of a mapped range inside one mapping: the physical allocation, the offset there, and the
/// piece's place in the range.
struct Piece {
    key: u64,
    offset: u64,
    at: usize,
    len: usize,
}

/// Where `[start, start + len)` lies; counts and refuses a range that touches a reservation but is not
/// mapped throughout.
fn placement(vmm: &mut Vmm, start: u64, len: u64) -> Result<Placement, Refusal> {
    let end = start.saturating_add(len);
    if len == 0 || !vmm.reserved_within(start, end) {
        return Ok(Placement::Elsewhere);
    }
    if start.checked_add(len).is_some() && vmm.fully_mapped(start, end) {
        return Ok(Placement::Mapped);
    }
    vmm.unmapped_access += 1;
    Err(Refusal::BadArgument)
}

/// The pieces of `[start, start + len)`, which is mapped throughout.
fn pieces(vmm: &Vmm, start: u64, len: usize) -> Result<Vec<Piece>, Refusal> {
    let mut pieces = Vec::new();
    let mut done = 0;
    while done < len {
        let at = start + done as u64;
        let (mapped_at, mapping) = vmm.mapping_at(at).ok_or(Refusal::BadArgument)?;
        let part = (mapped_at + mapping.size - at).min((len - done) as u64) as usize;
        pieces.push(Piece {
            key: mapping.key,
            offset: mapping.offset + (at - mapped_at),
            at: done,
            len: part,
        });
        done += part;
    }
    Ok(pieces)
}

/// Reads the mapped range at `start` into `out`.
fn read(vmm: &Vmm, start: u64, out: &mut [u8]) -> Result<(), Refusal> {
    for piece in pieces(vmm, start, out.len())? {
        let physical = vmm.physical.get(&piece.key).ok_or(Refusal::Unknown)?;
        physical.contents.read(piece.offset, &mut out[piece.at..piece.at + piece.len]);
    }
    Ok(())
}

/// Whether the mapped range at `start` holds nothing ever written: zeros that cost nothing to copy.
fn unwritten(vmm: &Vmm, start: u64, len: usize) -> Result<bool, Refusal> {
    for piece in pieces(vmm, start, len)? {
        let physical = vmm.physical.get(&piece.key).ok_or(Refusal::Unknown)?;
        if !physical.contents.unwritten(piece.offset, piece.len) {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Writes `len` bytes of `source` into the mapped range at `start`.
fn write(vmm: &mut Vmm, start: u64, len: usize, source: Source<'_>) -> Result<(), Refusal> {
    for piece in pieces(vmm, start, len)? {
        let physical = vmm.physical.get_mut(&piece.key).ok_or(Refusal::Unknown)?;
        physical.contents.write(piece.offset, piece.at, piece.len, source);
    }
    Ok(())
}

impl Fake {
    /// Whether `address` lies in VMM address space (a reservation, mapped or not).
    pub fn is_vmm_address(&self, address: u64) -> bool {
        self.lock().vmm.reserved_within(address, address.saturating_add(1))
    }

    /// Checks the device side of a copy whose bytes do not move (to or from an array).
    pub fn check_device(&self, start: u64, len: u64) -> Result<(), Refusal> {
        placement(&mut self.lock().vmm, start, len).map(drop)
    }

    /// A host-to-device copy of `len` bytes to `dst`: when `dst` is VMM memory, from the host memory
    /// `host` yields (`None`: a NULL pointer), which it is asked for only then.
    pub fn write_device<'a>(
        &self,
        dst: u64,
        len: u64,
        host: impl FnOnce() -> Option<&'a [u8]>,
    ) -> Result<(), Refusal> {
        let mut registry = self.lock();
        let vmm = &mut registry.vmm;
        if placement(vmm, dst, len)? == Placement::Elsewhere {
            return Ok(());
        }
        let data = host().ok_or(Refusal::BadArgument)?;
        write(vmm, dst, data.len(), Source::Bytes(data))
    }

    /// A device-to-host copy of `len` bytes from `src`: when `src` is VMM memory, into the host memory
    /// `host` yields (`None`: a NULL pointer), which it is asked for only then.
    pub fn read_device<'a>(
        &self,
        src: u64,
        len: u64,
        host: impl FnOnce() -> Option<&'a mut [u8]>,
    ) -> Result<(), Refusal> {
        let mut registry = self.lock();
        let vmm = &mut registry.vmm;
        if placement(vmm, src, len)? == Placement::Elsewhere {
            return Ok(());
        }
        read(vmm, src, host().ok_or(Refusal::BadArgument)?)
    }

    /// A device-to-device copy of `len` bytes: moved when both sides are VMM memory (overlapping
    /// ranges as by `memmove`); with one side elsewhere nothing moves, but the other is still checked.
    pub fn copy_device(&self, dst: u64, src: u64, len: u64) -> Result<(), Refusal> {
        let mut registry = self.lock();
        let vmm = &mut registry.vmm;
        let to = placement(vmm, dst, len)?;
        let from = placement(vmm, src, len)?;
        if to == Placement::Elsewhere || from == Placement::Elsewhere {
            return Ok(());
        }
        let len = len as usize;
        let mut buffer = vec![0; CHUNK.min(len)];
        let chunks = len.div_ceil(CHUNK);
        // Back to front when the destination starts inside the source, so nothing is overwritten unread.
        let backwards = dst > src && dst < src + len as u64;
        for i in 0..chunks {
            let chunk = if backwards { chunks - 1 - i } else { i };
            let done = chunk * CHUNK;
            let part = CHUNK.min(len - done);
            let (from, to) = (src + done as u64, dst + done as u64);
            if unwritten(vmm, from, part)? {
                // Zeros: a page never written stays unmade (copies of fresh memory stay cheap).
                write(vmm, to, part, Source::Pattern(&[0]))?;
            } else {
                read(vmm, from, &mut buffer[..part])?;
                write(vmm, to, part, Source::Bytes(&buffer[..part]))?;
            }
        }
        Ok(())
    }

    /// A memset of `len` bytes at `dst` with `element` over and over, when `dst` is VMM memory.
    pub fn fill_device(&self, dst: u64, len: u64, element: &[u8]) -> Result<(), Refusal> {
        self.fill_device_2d(dst, len, len, 1, element)
    }

    /// A 2D memset: `rows` rows of `row` bytes, `pitch` bytes apart, each filled with `element` over
    /// and over from its first byte, when the rows' span is VMM memory.
    pub fn fill_device_2d(
        &self,
        dst: u64,
        pitch: u64,
        row: u64,
        rows: u64,
        element: &[u8],
    ) -> Result<(), Refusal> {
        if row == 0 || rows == 0 {
            return Ok(());
        }
        let span =
            (rows - 1).checked_mul(pitch).and_then(|before| before.checked_add(row)).unwrap_or(u64::MAX);
        let mut registry = self.lock();
        let vmm = &mut registry.vmm;
        if placement(vmm, dst, span)? == Placement::Elsewhere {
            return Ok(());
        }
        if rows > 1 && pitch < row {
            return Err(Refusal::BadArgument);
        }
        for i in 0..rows {
            write(vmm, dst + i * pitch, row as usize, Source::Pattern(element))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unwritten_bytes_read_as_zeros_and_cost_nothing() {
        let mut contents = Contents::default();
        let mut out = [7; 10];
        contents.read(1 << 40, &mut out);
        assert_eq!(out, [0; 10]);
        contents.write(3 * PAGE as u64, 0, 2 * PAGE, Source::Pattern(&[0, 0, 0, 0]));
        contents.write(PAGE as u64, 0, 5, Source::Bytes(&[0; 5]));
        assert_eq!(contents.page_count(), 0, "zeros take no page");
        contents.write(PAGE as u64 + 1, 0, 1, Source::Bytes(&[1]));
        assert!(!contents.unwritten(PAGE as u64 - 1, 2));
        assert!(contents.unwritten(0, PAGE) && contents.unwritten(2 * PAGE as u64, 5 * PAGE));
    }

    #[test]
    fn writes_span_pages() {
        let mut contents = Contents::default();
        let data: Vec<u8> = (0..3 * PAGE).map(|i| (i % 251) as u8 + 1).collect();
        contents.write(PAGE as u64 - 3, 0, data.len(), Source::Bytes(&data));
        assert_eq!(contents.page_count(), 4);
        let mut out = vec![0; data.len() + 6];
        contents.read(PAGE as u64 - 6, &mut out);
        assert_eq!(&out[..3], &[0; 3]);
        assert_eq!(&out[3..data.len() + 3], &data[..]);
        assert_eq!(&out[data.len() + 3..], &[0; 3]);
    }

    #[test]
    fn patterns_keep_their_phase_across_pages() {
        let mut contents = Contents::default();
        let element = 0x0403_0201_u32.to_le_bytes();
        contents.write(PAGE as u64 - 5, 0, 203, Source::Pattern(&element));
        let mut out = vec![0; 203];
        contents.read(PAGE as u64 - 5, &mut out);
        assert!(out.iter().enumerate().all(|(i, &byte)| byte == element[i % 4]), "{out:?}");
        contents.write(10, 0, 3, Source::Pattern(&[9]));
        let mut out = [0; 5];
        contents.read(9, &mut out);
        assert_eq!(out, [0, 9, 9, 9, 0]);
    }
}
