//! A swap-in's staging ring for chunks held in pageable memory, through pinned buffers already copied
//! in, filled by several threads.

use super::*;

/// A swap-in's staging ring for chunks held in pageable memory. The driver copies pageable memory
/// through small buffers of its own, one copy at a time (2.5-9 GB/s on an H100, against 50 for
/// pinned memory). Here the pinned buffers of chunks already copied in serve instead: once a
/// buffer's copy has landed (its event), its bytes are no longer needed (the card holds them, and
/// the next swap-out writes the buffer again), so a pageable chunk is copied into it by several
/// threads and sent from there, while the other buffers' copies run. With no pinned buffer of the
/// chunk's context, the driver's own path is taken.
#[derive(Default)]
pub(super) struct Staging {
    /// (context, event recorded after the buffer's latest copy, buffer, bytes), taken in turn.
    buffers: Vec<(usize, usize, usize, usize)>,
    next: usize,
    /// Bytes carried through the buffers.
    pub(super) staged: u64,
}

impl Staging {
    /// Offers the pinned `buffer` of `size` bytes, whose copy was just queued on `stream`.
    pub(super) fn offer(
        &mut self,
        calls: &Calls,
        context: usize,
        stream: CUstream,
        buffer: usize,
        size: usize,
    ) {
        if self.buffers.len() >= STAGING_BUFFERS {
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
            self.buffers.push((context, event, buffer, size));
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
        let found = (0..count)
            .map(|k| (self.next + k) % count)
            .find(|&k| self.buffers[k].0 == context && self.buffers[k].3 >= size);
        let Some(k) = found else {
            with_context(calls, context, || {
                // SAFETY: the chunk is mapped; `source` holds `size` bytes.
                unsafe { (calls.htod)(target, source as *const c_void, size, stream) }
            });
            return;
        };
        self.next = k + 1;
        self.staged += size as u64;
        let (_, event, buffer, _) = self.buffers[k];
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
        for (context, event, _, _) in self.buffers.drain(..) {
            with_context(calls, context, || {
                // SAFETY: our own event, used no more.
                unsafe { (calls.event_destroy)(event as *mut c_void) }
            });
        }
        self.next = 0;
    }
}

/// Pinned buffers a swap-in's staging ring takes in turn: enough to keep the copy streams busy
/// while threads fill the next ones.
pub(super) const STAGING_BUFFERS: usize = 8;

/// The most threads that copy one chunk between pageable memory and a pinned buffer. One thread
/// copies about 7 GB/s into memory already faulted in, and a copy into fresh memory also faults
/// it in (the kernel zeroes each page first): on an H200's 16-CPU host, 64 MiB chunks went at
/// 20.8 GB/s into fresh huge pages on 8 threads and 32.9 on 16, and at 44.8 and 57.9 into pages
/// that existed (`ci/gpu/host_copy.c`, docs/overcommit.md).
const MAX_COPY_THREADS: usize = 16;

/// Threads that copy one chunk ([`copy_parallel`]): as many as the process may run at once
/// (its CPU affinity and cgroup quota, as the standard library reads them), at most
/// [`MAX_COPY_THREADS`].
fn copy_threads() -> usize {
    static THREADS: OnceLock<usize> = OnceLock::new();
    *THREADS.get_or_init(|| {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get).clamp(1, MAX_COPY_THREADS)
    })
}

/// `memcpy` of `size` bytes by [`copy_threads`] threads (on this thread alone where one cannot
/// be started).
///
/// # Safety
/// `source` and `target` hold `size` bytes each and do not overlap.
pub(super) unsafe fn copy_parallel(target: *mut u8, source: *const u8, size: usize) {
    let threads = copy_threads();
    let part = size.div_ceil(threads);
    let (target, source) = (target as usize, source as usize);
    std::thread::scope(|scope| {
        for k in 1..threads {
            let (start, end) = ((k * part).min(size), ((k + 1) * part).min(size));
            let copy = move || {
                // SAFETY: the caller's buffers; each thread copies its own part.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        (source + start) as *const u8,
                        (target + start) as *mut u8,
                        end - start,
                    )
                }
            };
            if std::thread::Builder::new().spawn_scoped(scope, copy).is_err() {
                copy();
            }
        }
        // SAFETY: as above, the first part.
        unsafe { std::ptr::copy_nonoverlapping(source as *const u8, target as *mut u8, part.min(size)) };
    });
}
