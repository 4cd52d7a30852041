//! A swap-in's staging ring for chunks held in pageable memory, through the pinned ring and the
//! pinned buffers of chunks already copied in, filled by several threads.

use super::*;

/// A swap-in's staging ring for chunks held in pageable memory. The driver copies pageable memory
/// through small buffers of its own, one copy at a time (2.5-9 GB/s on an H100, against 50 for
/// pinned memory). Here the pinned ring ([`ring`]) and the pinned buffers of chunks already copied
/// in serve instead: once a buffer's copy has landed (its event), its bytes are no longer needed
/// (the card holds them, and the next swap-out writes the buffer again), so a pageable chunk is
/// copied into it by several threads and sent from there, while the other buffers' copies run.
/// With no pinned buffer of the chunk's context, the driver's own path is taken.
///
/// The pinned ring's buffers serve from the start of a swap-in, so that chunks held in pageable
/// memory are copied as they are placed, while the process that makes room for them is still
/// going out. A chunk's own pinned buffer is *held* until every chunk is placed: before that, the
/// arbiter may ask this process to give back what it placed, and the buffer must still hold the
/// chunk's bytes.
#[derive(Default)]
pub(super) struct Staging {
    buffers: Vec<Buffer>,
    next: usize,
    /// Bytes carried through the buffers.
    pub(super) staged: u64,
}

/// A pinned buffer a staging ring takes in turn.
struct Buffer {
    context: usize,
    /// Recorded after the buffer's latest copy.
    event: usize,
    at: usize,
    size: usize,
    /// A chunk's own buffer, not to be written yet ([`Staging::unhold`]).
    held: bool,
}

impl Buffer {
    /// Whether it may carry a chunk of `size` bytes of `context` now.
    fn serves(&self, context: usize, size: usize) -> bool {
        !self.held && self.context == context && self.size >= size
    }
}

impl Staging {
    /// Offers the pinned `buffer` of `size` bytes, whose copy was just queued on `stream` (or none:
    /// a ring buffer), `held` while it is a chunk's own.
    pub(super) fn offer(
        &mut self,
        calls: &Calls,
        (context, stream): (usize, CUstream),
        buffer: usize,
        size: usize,
        held: bool,
    ) {
        if self.buffers.iter().filter(|buffer| buffer.context == context).count() >= STAGING_BUFFERS {
            return;
        }
        let event = with_context(calls, context, || {
            let mut event: *mut c_void = std::ptr::null_mut();
            // SAFETY: a valid out-pointer; our own stream.
            unsafe {
                if (calls.event_create)(&mut event, EVENT_DISABLE_TIMING) != CUDA_SUCCESS {
                    return None;
                }
                (calls.event_record)(event, stream);
            }
            Some(event as usize)
        });
        if let Some(event) = event {
            self.buffers.push(Buffer { context, event, at: buffer, size, held });
        }
    }

    /// Whether a pageable chunk of `size` bytes of `context` can be carried now.
    pub(super) fn can_carry(&self, context: usize, size: usize) -> bool {
        self.buffers.iter().any(|buffer| buffer.serves(context, size))
    }

    /// Every chunk is placed: the chunks' own buffers may carry others now.
    pub(super) fn unhold(&mut self) {
        for buffer in &mut self.buffers {
            buffer.held = false;
        }
    }

    /// Copies `size` bytes at pageable `source` to the card at `target` on `stream`.
    pub(super) fn carry(
        &mut self,
        calls: &Calls,
        context: usize,
        stream: CUstream,
        target: CUdeviceptr,
        source: usize,
        size: usize,
    ) {
        let count = self.buffers.len();
        let found =
            (0..count).map(|k| (self.next + k) % count).find(|&k| self.buffers[k].serves(context, size));
        let Some(k) = found else {
            with_context(calls, context, || {
                // SAFETY: the chunk is mapped; `source` holds `size` bytes.
                unsafe { (calls.htod)(target, source as *const c_void, size, stream) }
            });
            return;
        };
        self.next = k + 1;
        self.staged += size as u64;
        let Buffer { event, at: buffer, .. } = self.buffers[k];
        with_context(calls, context, || {
            // SAFETY: our own event; the buffer's previous copy is done once it returns, and
            // nothing else uses the buffer; `source` and `buffer` hold `size` bytes.
            unsafe {
                (calls.event_sync)(event as *mut c_void);
                copy_parallel(buffer as *mut u8, source as *const u8, size);
                (calls.htod)(target, buffer as *const c_void, size, stream);
                (calls.event_record)(event as *mut c_void, stream);
            }
        });
    }

    /// Destroys the events (the caller has synchronised the streams).
    pub(super) fn release(&mut self, calls: &Calls) {
        for Buffer { context, event, .. } in self.buffers.drain(..) {
            with_context(calls, context, || {
                // SAFETY: our own event, used no more.
                unsafe { (calls.event_destroy)(event as *mut c_void) }
            });
        }
        self.next = 0;
    }
}

/// Pinned buffers per context a swap-in's staging ring takes in turn: enough to keep the copy
/// streams busy while threads fill the next ones.
pub(super) const STAGING_BUFFERS: usize = 8;
