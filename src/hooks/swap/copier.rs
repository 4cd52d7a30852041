//! The threads that copy a chunk between pageable memory and a pinned buffer, in parts.
//!
//! A chunk's host copy runs at the speed of the host's memory only on several threads: one thread
//! copies about 7 GB/s into memory already faulted in, and a copy into fresh memory also faults it
//! in (the kernel zeroes each page first). On an H200's 16-CPU host, 64 MiB chunks went at 20.8
//! GB/s into fresh huge pages on 8 threads and 32.9 on 16, and at 44.8 and 57.9 into pages that
//! existed (`ci/gpu/host_copy.c`, docs/overcommit.md; those figures start and join each chunk's
//! threads for it). The threads here are started at the first copy and then wait for the next:
//! starting and joining 15 threads costs 821 µs a round on this project's 2-core development VM,
//! waking 15 waiting ones 145 µs (host_copy.c's last two lines), where a chunk's copy takes
//! 1.2-3 ms on a GPU host; and a thread's start maps its stack, which the copies' own page faults
//! then wait for.

use super::*;

/// The most threads that copy one chunk, the caller's included.
const MAX_COPY_THREADS: usize = 16;
/// Copies smaller than this are not split: waking a thread costs more than it would copy.
const SMALLEST_SPLIT: usize = 1 << 20;

/// Threads that copy one chunk ([`copy_parallel`]): as many as the process may run at once
/// (its CPU affinity and cgroup quota, as the standard library reads them), at most
/// [`MAX_COPY_THREADS`].
pub(super) fn copy_threads() -> usize {
    static THREADS: OnceLock<usize> = OnceLock::new();
    *THREADS.get_or_init(|| {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get).clamp(1, MAX_COPY_THREADS)
    })
}

/// One copy, split into `parts` parts of `part` bytes (the last shorter), which the caller and the
/// workers take in turn.
#[derive(Default)]
struct Job {
    target: usize,
    source: usize,
    size: usize,
    part: usize,
    parts: usize,
    /// Parts taken so far, and those finished.
    taken: usize,
    finished: usize,
}

/// A part of a job, taken by one thread.
struct Part {
    target: usize,
    source: usize,
    len: usize,
}

impl Job {
    fn take(&mut self) -> Option<Part> {
        (self.taken < self.parts).then(|| {
            let start = self.taken * self.part;
            self.taken += 1;
            let len = self.part.min(self.size - start.min(self.size));
            Part { target: self.target + start, source: self.source + start, len }
        })
    }
}

impl Part {
    /// # Safety
    /// The job's buffers are those [`copy_parallel`]'s caller vouched for, alive until every part
    /// has finished.
    unsafe fn copy(&self) {
        // SAFETY: per the contract; each part is copied by one thread only.
        unsafe { std::ptr::copy_nonoverlapping(self.source as *const u8, self.target as *mut u8, self.len) }
    }
}

struct Copier {
    /// One copy at a time.
    turn: Mutex<()>,
    job: Mutex<Job>,
    /// A new job's parts are there to take.
    posted: Condvar,
    /// The job's last part has finished.
    done: Condvar,
}

/// The copy threads, started on first use; `None` where the process needs no more than itself.
fn copier() -> Option<&'static Copier> {
    static COPIER: OnceLock<Option<&'static Copier>> = OnceLock::new();
    *COPIER.get_or_init(|| {
        let workers = copy_threads() - 1;
        if workers == 0 {
            return None;
        }
        let copier: &'static Copier = Box::leak(Box::new(Copier {
            turn: Mutex::new(()),
            job: Mutex::new(Job::default()),
            posted: Condvar::new(),
            done: Condvar::new(),
        }));
        let started = (0..workers)
            .filter(|_| std::thread::Builder::new().name("vgpu-copy".into()).spawn(|| copier.work()).is_ok())
            .count();
        (started > 0).then_some(copier)
    })
}

impl Copier {
    /// A worker: takes parts of each job as it is posted, for the process's life.
    fn work(&self) {
        let mut job = self.job.lock();
        loop {
            let Some(part) = job.take() else {
                self.posted.wait(&mut job);
                continue;
            };
            drop(job);
            // SAFETY: a part of the job posted by `copy_parallel`, whose caller waits until every
            // part has finished.
            unsafe { part.copy() };
            job = self.job.lock();
            job.finished += 1;
            if job.finished == job.parts {
                self.done.notify_all();
            }
        }
    }
}

/// `memcpy` of `size` bytes by up to [`copy_threads`] threads: this one and the copy threads
/// (this one alone where none could be started, for a small copy, or in a child process after
/// `fork`, where the parent's threads are not: it then takes every part itself).
///
/// # Safety
/// `source` and `target` hold `size` bytes each and do not overlap.
pub(super) unsafe fn copy_parallel(target: *mut u8, source: *const u8, size: usize) {
    let copier = if size < SMALLEST_SPLIT { None } else { copier() };
    let Some(copier) = copier else {
        // SAFETY: per the contract.
        unsafe { std::ptr::copy_nonoverlapping(source, target, size) };
        return;
    };
    let _turn = copier.turn.lock();
    let parts = copy_threads();
    let mut job = copier.job.lock();
    *job = Job {
        target: target as usize,
        source: source as usize,
        size,
        part: size.div_ceil(parts),
        parts,
        taken: 0,
        finished: 0,
    };
    copier.posted.notify_all();
    while let Some(part) = job.take() {
        drop(job);
        // SAFETY: per the contract; this thread waits below until every part has finished.
        unsafe { part.copy() };
        job = copier.job.lock();
        job.finished += 1;
    }
    while job.finished < job.parts {
        copier.done.wait(&mut job);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_in_parts_is_the_whole_copy_and_the_threads_serve_one_copy_after_another() {
        let size = 3 * SMALLEST_SPLIT + 12_345;
        let source: Vec<u8> = (0..size).map(|i| (i * 7 + i / 4096) as u8).collect();
        for round in 0..20 {
            let mut target = vec![round as u8; size];
            // SAFETY: two distinct buffers of `size` bytes.
            unsafe { copy_parallel(target.as_mut_ptr(), source.as_ptr(), size) };
            assert!(target == source, "round {round}: the copy differs");
        }
        // The same threads served every copy: started once, waiting between copies.
        let copy_threads_now = std::fs::read_dir("/proc/self/task")
            .expect("this process's threads")
            .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
            .filter(|name| name.trim() == "vgpu-copy")
            .count();
        assert_eq!(copy_threads_now, copy_threads() - 1, "copy threads after 20 copies");
        // From several threads at once: each copy waits for its turn.
        std::thread::scope(|scope| {
            for _ in 0..3 {
                scope.spawn(|| {
                    let mut target = vec![0u8; size];
                    // SAFETY: as above.
                    unsafe { copy_parallel(target.as_mut_ptr(), source.as_ptr(), size) };
                    assert!(target == source);
                });
            }
        });
    }
}
