//! Host buffers: where a chunk's bytes are kept while it is off the card, pinned ahead while the
//! process is idle and as host memory allows, or pageable when made at swap-out time.

use super::*;

impl Swap {
    /// Whether host memory may be pinned now for a process on the card: it has been idle
    /// [`PIN_WHEN_IDLE_NS`], or every call inside is a wait that has lasted long enough for one
    /// more chunk. Returns the wait's start when the pin counts against a wait (else 0).
    pub(super) fn may_pin_on_card(&self) -> Option<u64> {
        let inside = self.inside.load(Ordering::SeqCst);
        if inside == 0 {
            let idle = now().saturating_sub(self.last_active.load(Ordering::Relaxed)) >= PIN_WHEN_IDLE_NS;
            return idle.then_some(0);
        }
        let started = self.wait_started.load(Ordering::SeqCst);
        if started == 0 || inside != self.waits.load(Ordering::SeqCst) {
            return None;
        }
        let due = PIN_IN_WAIT_NS + self.wait_pins.load(Ordering::Relaxed) * PIN_IN_WAIT_GAP_NS;
        (now().saturating_sub(started) >= due).then_some(started)
    }

    /// Pins host memory for one chunk, outside the lock (pinning is slow), while the host keeps
    /// memory to spare: a chunk on the card with no host buffer, or, while the process is out, a
    /// chunk held in pageable memory (its bytes move into the pinned buffer, so that the next
    /// swap runs at the link's speed). A thread pinning holds the driver: it cut a neighbour
    /// thread's kernels to 1-20 % of their speed on an H100 (docs/overcommit.md, "What pinning
    /// costs"). So a process on the card is pinned for only while it is idle, or at the pace of
    /// its own waits for its kernels ([`Swap::may_pin_on_card`]).
    pub(super) fn pin_one(&self, runtime: &Runtime) -> Next {
        if !self.pinning.load(Ordering::Relaxed) {
            return Next::Sleep;
        }
        let Some(calls) = calls() else { return Next::Sleep };
        let (wanted, spell, bare) = {
            let inner = self.inner.lock();
            let out = inner.out;
            let chunks = || {
                inner.blocks.iter().filter(|(_, block)| block.swappable()).flat_map(|(&address, block)| {
                    block.chunks.iter().map(move |chunk| (address, block.context, chunk))
                })
            };
            // A chunk on the card with no host buffer first gets a pageable one, faulted in
            // ahead ([`Swap::fault_in_some`]; pinned at once within a wait); then buffers are
            // pinned: off the card its bytes move into the pinned buffer, on the card the pageable
            // buffer is given back for it.
            let bare: Vec<_> = if out {
                Vec::new()
            } else {
                chunks().filter(|(_, _, chunk)| chunk.host == Host::None).take(fault_in_threads()).collect()
            };
            let wanted = bare.first().map(|&found| (found, false)).or_else(|| {
                chunks()
                    .find(|(_, _, chunk)| {
                        matches!(chunk.host, Host::Pageable(_)) && (out == (chunk.handle == 0))
                    })
                    .map(|found| (found, true))
            });
            let spell = if out || wanted.is_none() { Some(0) } else { self.may_pin_on_card() };
            (
                wanted.map(|((address, context, chunk), pin)| {
                    (address, chunk.offset, chunk.size, context, pin)
                }),
                spell,
                bare.iter()
                    .map(|&(address, _, chunk)| (address, chunk.offset, chunk.size))
                    .collect::<Vec<_>>(),
            )
        };
        let Some((address, offset, size, context, to_pin)) = wanted else {
            self.pinning.store(false, Ordering::Relaxed);
            return Next::Sleep;
        };
        // Busy: the agent looks again soon.
        let Some(spell) = spell else { return Next::Soon };
        // Buffers are made ahead only while the process is idle: within a wait for its kernels
        // (`spell`) the chunk is pinned at the wait's pace, as before.
        if !to_pin && spell == 0 {
            return self.fault_in_some(&bare);
        }
        if self.pinned(runtime).saturating_add(size as u64) > pin_cap() {
            self.pinning.store(false, Ordering::Relaxed);
            tracing::debug!("LIBVGPU_SWAP_PIN's cap is reached: later chunks swap through pageable memory");
            return Next::Sleep;
        }
        if !pin_ahead_allowed(size) {
            self.pinning.store(false, Ordering::Relaxed);
            tracing::debug!(
                "host memory is short: no more pinned ahead; later chunks swap through pageable memory"
            );
            return Next::Sleep;
        }
        if spell != 0 {
            self.wait_pins.fetch_add(1, Ordering::Relaxed);
        }
        let Some(pinned) = pin(calls, context, size) else {
            self.pinning.store(false, Ordering::Relaxed);
            return Next::Sleep;
        };
        let mut inner = self.inner.lock();
        let out = inner.out;
        let chunk = inner.chunk_mut(address, offset, size);
        let taken = match chunk {
            Some(chunk) if chunk.host == Host::None && !out => {
                chunk.host = Host::Pinned(pinned);
                true
            }
            Some(chunk) if !out && chunk.handle != 0 && matches!(chunk.host, Host::Pageable(_)) => {
                drop_host(calls, context, &mut chunk.host);
                chunk.host = Host::Pinned(pinned);
                true
            }
            Some(chunk) if out && chunk.handle == 0 => match chunk.host {
                Host::Pageable(from) => {
                    // SAFETY: both buffers hold at least `size` bytes and are ours; the lock keeps
                    // the chunk out (a swap-in takes it first).
                    unsafe { std::ptr::copy_nonoverlapping(from as *const u8, pinned as *mut u8, size) };
                    drop_host(calls, context, &mut chunk.host);
                    chunk.host = Host::Pinned(pinned);
                    true
                }
                _ => false,
            },
            _ => false,
        };
        if taken {
            let device = inner.blocks.get(&address).map_or(0, |block| block.allocation.device);
            drop(inner);
            self.add(runtime, device, Word::Pinned, size as i64);
        } else {
            drop(inner);
            let mut host = Host::Pinned(pinned);
            drop_host(calls, context, &mut host);
        }
        Next::Now
    }
}

impl Swap {
    /// Gives the chunks `bare` (address of the block, offset and size of each; on the card, with
    /// no host buffer) pageable buffers faulted in now, one thread each, as host memory allows, so
    /// that the first swap-out writes into pages that exist: faulting fresh pages in (the kernel
    /// zeroes each first) held a first swap-out to 20.8 GB/s on 8 threads of an H200's host,
    /// against 44.8 into pages that existed, while pinning ahead takes 0.84 s per GiB; and one
    /// thread faults in only 1.7-4 GB/s. The pages are then left for the kernel to take back under
    /// memory pressure ([`keep`]), and the agent pins the buffers later as it can.
    fn fault_in_some(&self, bare: &[(CUdeviceptr, usize, usize)]) -> Next {
        let room = vgpu_ledger::host_memory::room().bytes / CHUNK as u64;
        let bare = &bare[..bare.len().min(usize::try_from(room).unwrap_or(usize::MAX))];
        if bare.is_empty() {
            self.pinning.store(false, Ordering::Relaxed);
            tracing::debug!("host memory is short: no host buffers made ahead");
            return Next::Sleep;
        }
        let buffers: Vec<usize> = bare.iter().map_while(|&(_, _, size)| pageable(size)).collect();
        std::thread::scope(|scope| {
            for &at in buffers.iter().skip(1) {
                // One thread per buffer; one that cannot be started faults its buffer in here.
                if std::thread::Builder::new().spawn_scoped(scope, move || fault_in(at)).is_err() {
                    fault_in(at);
                }
            }
            if let Some(&first) = buffers.first() {
                fault_in(first);
            }
        });
        for &at in &buffers {
            keep(at);
        }
        let mut inner = self.inner.lock();
        let out = inner.out;
        for (&(address, offset, size), &at) in bare.iter().zip(&buffers) {
            let chunk =
                inner.chunk_mut(address, offset, size).filter(|chunk| chunk.host == Host::None && !out);
            match chunk {
                Some(chunk) => chunk.host = Host::Pageable(at),
                // SAFETY: our own mapping of a chunk's size, never handed out.
                None => unsafe {
                    libc::munmap(at as *mut c_void, CHUNK);
                },
            }
        }
        if buffers.is_empty() { Next::Sleep } else { Next::Now }
    }
}

/// Chunks whose buffers are faulted in at once ([`Swap::fault_in_some`]): one thread each, as many
/// as copy a chunk ([`copy_threads`]), at most 8 (the process is idle; 8 leave the host's other
/// half to its neighbours on a 16-CPU host).
fn fault_in_threads() -> usize {
    copy_threads().min(8)
}

/// Faults in the pages of the pageable chunk buffer at `at` (`MADV_POPULATE_WRITE`, Linux 5.14;
/// on an older kernel, a write to each page).
fn fault_in(at: usize) {
    // SAFETY: our own mapping of a whole chunk.
    if unsafe { libc::madvise(at as *mut c_void, CHUNK, libc::MADV_POPULATE_WRITE) } == 0 {
        return;
    }
    for page in (0..CHUNK).step_by(page_size()) {
        // SAFETY: within our own writable mapping, whose contents nothing reads yet.
        unsafe { ((at + page) as *mut u8).write_volatile(0) };
    }
}

/// `size` bytes of host memory pinned for `context` (`cuMemHostAlloc`), or `None`.
pub(super) fn pin(calls: &Calls, context: usize, size: usize) -> Option<usize> {
    with_context(calls, context, || {
        let mut host: *mut c_void = std::ptr::null_mut();
        // SAFETY: a valid out-pointer.
        let status = unsafe { (calls.host_alloc)(&mut host, size, 0) };
        (status == CUDA_SUCCESS).then_some(host as usize)
    })
}

pub(super) fn drop_host(calls: &Calls, context: usize, host: &mut Host) {
    match *host {
        Host::Pinned(at) => {
            with_context(calls, context, || {
                // SAFETY: our own pinned allocation.
                unsafe { (calls.free_host)(at as *mut c_void) }
            });
        }
        Host::Pageable(at) => {
            // SAFETY: our own mapping of a chunk's size; see `pageable`.
            unsafe { libc::munmap(at as *mut c_void, CHUNK) };
        }
        Host::None => {}
    }
    *host = Host::None;
}

/// Pageable host memory for one chunk (always a whole [`CHUNK`], so that it can be unmapped
/// without its size), on huge pages where the kernel can.
pub(super) fn pageable(size: usize) -> Option<usize> {
    debug_assert!(size <= CHUNK);
    map_chunk(libc::MADV_HUGEPAGE)
}

/// An anonymous private mapping of a whole [`CHUNK`], with `advice` given for its pages.
fn map_chunk(advice: libc::c_int) -> Option<usize> {
    // SAFETY: an anonymous private mapping; nothing else is touched.
    let at = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            CHUNK,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if at == libc::MAP_FAILED {
        return None;
    }
    // SAFETY: our own mapping; a hint.
    unsafe { libc::madvise(at, CHUNK, advice) };
    Some(at as usize)
}

/// The kernel's page size.
fn page_size() -> usize {
    // SAFETY: no arguments but the name.
    usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096).max(1)
}

/// Keeps a chunk's pageable buffer at `at` for its next swap-out once its bytes are back on the
/// card: its pages are left for the kernel to take back under memory pressure (`MADV_FREE`), and
/// until it does, the next swap-out writes into pages that exist instead of faulting fresh ones
/// in, which the kernel must zero first. On an H200's host, 64 MiB chunks copied on 8 threads went
/// at 44.8 GB/s into pages that existed and 20.8 into fresh huge pages (docs/overcommit.md,
/// "Swapping from the first second on the H200"). A page the kernel took back reads as zeros and
/// is faulted in again when written; a swap-out writes the whole chunk before a swap-in reads it.
pub(super) fn keep(at: usize) {
    // SAFETY: our own mapping of a whole chunk; a hint, whose only effect is on the pages' contents,
    // which nothing reads before the next swap-out writes them.
    unsafe { libc::madvise(at as *mut c_void, CHUNK, libc::MADV_FREE) };
}

/// Bytes of the first `size` of the kept pageable buffer at `at` whose pages are still in memory
/// (`mincore`): the kernel may have taken the others back ([`keep`]). 0 when it cannot say.
pub(super) fn resident_bytes(at: usize, size: usize) -> u64 {
    let page = page_size();
    let mut pages = vec![0u8; size.div_ceil(page)];
    // SAFETY: our own mapping of at least `size` bytes; `pages` holds a byte per page of it.
    if unsafe { libc::mincore(at as *mut c_void, size, pages.as_mut_ptr()) } != 0 {
        return 0;
    }
    let resident = pages.iter().filter(|&&state| state & 1 != 0).count();
    (resident * page).min(size) as u64
}

/// Whether `size` more bytes may be pinned ahead: the host keeps a tenth of its memory, and at least
/// 4 GiB, available after it (`MemAvailable` in /proc/meminfo), and the container's memory cgroup
/// a quarter of its limit, so that pinning ahead never starves the host or the container's other
/// processes. (A quarter stopped the second of two 44 GiB
/// notebooks at 21 GiB on a 125 GiB host; swapping out needs that host memory anyway, pinned or
/// not.) `LIBVGPU_SWAP_PIN` caps it further ([`pin_cap`]).
pub(super) fn pin_ahead_allowed(size: usize) -> bool {
    let Ok(meminfo) = std::fs::read_to_string("/proc/meminfo") else { return false };
    let field = |name: &str| {
        meminfo
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map(|kib| kib * 1024)
    };
    let (Some(total), Some(available)) = (field("MemTotal:"), field("MemAvailable:")) else { return false };
    // A quarter of the container's memory cgroup stays free too: pinned memory cannot be reclaimed,
    // and the application's own host memory must still fit beside it.
    let cgroup = vgpu_ledger::host_memory::room().cgroup;
    available.saturating_sub(size as u64) >= (total / 10).max(4 << 30)
        && cgroup
            .is_none_or(|(limit, used)| limit.saturating_sub(used).saturating_sub(size as u64) >= limit / 4)
}

/// How long a new allocation waits for room before falling back: `LIBVGPU_SWAP_PATIENCE_MS`
/// (milliseconds; 0 falls back at once), else [`ALLOCATION_PATIENCE_NS`]. A value that is not a
/// number is said once and ignored.
pub(super) fn patience_ns() -> u64 {
    static PATIENCE: OnceLock<u64> = OnceLock::new();
    *PATIENCE.get_or_init(|| {
        let Ok(value) = std::env::var("LIBVGPU_SWAP_PATIENCE_MS") else { return ALLOCATION_PATIENCE_NS };
        match value.trim().parse::<u64>() {
            Ok(ms) => ms.saturating_mul(1_000_000),
            Err(_) => {
                tracing::warn!(
                    "LIBVGPU_SWAP_PATIENCE_MS={value:?} is not a number of milliseconds (such as 0 or 30000); \
                     new allocations wait up to {} s for room",
                    ALLOCATION_PATIENCE_NS / 1_000_000_000
                );
                ALLOCATION_PATIENCE_NS
            }
        }
    })
}

/// The most host memory this process pins ahead: `LIBVGPU_SWAP_PIN`, a size (`0` turns pinning
/// ahead off; `16g`: at most 16 GiB, so that processes sharing a host that cannot pin all of them
/// each keep a part), else no cap but the host's ([`pin_ahead_allowed`]). A value that is not a
/// size is said once and ignored.
pub(super) fn pin_cap() -> u64 {
    static CAP: OnceLock<u64> = OnceLock::new();
    *CAP.get_or_init(|| {
        let Ok(value) = std::env::var("LIBVGPU_SWAP_PIN") else { return u64::MAX };
        match vgpu_ledger::config::parse_size(value.trim()) {
            Some(bytes) => bytes,
            None => {
                tracing::warn!(
                    "LIBVGPU_SWAP_PIN={value:?} is not a size (such as 0, 512m or 16g); pinning ahead is not capped"
                );
                u64::MAX
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kept_buffer_counts_only_the_pages_still_in_memory() {
        // A chunk's mapping in small pages, so that a page written is a page in memory and no
        // more (a huge page would bring its neighbours in).
        let at = map_chunk(libc::MADV_NOHUGEPAGE).expect("a chunk's mapping");
        assert_eq!(resident_bytes(at, CHUNK), 0, "nothing in memory yet");
        for offset in (0..CHUNK / 2).step_by(page_size()) {
            // SAFETY: within our own writable mapping.
            unsafe { ((at + offset) as *mut u8).write_volatile(1) };
        }
        assert_eq!(resident_bytes(at, CHUNK), (CHUNK / 2) as u64, "the half written");
        // SAFETY: our own mapping, used no more.
        unsafe { libc::munmap(at as *mut c_void, CHUNK) };
    }
}
