//! The gate every call that touches device memory passes: one relaxed load while the process holds
//! no swappable memory; otherwise a count of the calls inside, which a swap-out waits to drain, and
//! the swap-in of memory that is out before the call goes on.

use super::*;

impl Swap {
    /// Passes the gate before a call that touches device memory: brings the process's memory back
    /// first if it is out. One relaxed load for a process with no swappable memory.
    #[inline]
    pub fn enter(&self, runtime: &Runtime) -> Option<Inside<'_>> {
        if !self.active.load(Ordering::Relaxed) {
            return None;
        }
        self.enter_slow(runtime)
    }

    #[cold]
    pub(super) fn enter_slow(&self, runtime: &Runtime) -> Option<Inside<'_>> {
        loop {
            self.inside.fetch_add(1, Ordering::SeqCst);
            if !self.closed.load(Ordering::SeqCst) {
                self.note_activity(runtime);
                return Some(Inside(self));
            }
            self.inside.fetch_sub(1, Ordering::SeqCst);
            self.bring_back(runtime);
        }
    }

    /// Runs a call that waits for the process's queued work, or asks whether it is done: the
    /// process counts as inside the gate meanwhile (work in flight: an ordinary request is
    /// declined, and host memory is pinned only at a wait's own pace, [`PIN_IN_WAIT_NS`]), and as
    /// active when the call returns. Memory that is out is not brought back for it: nothing of the
    /// process is queued then.
    pub fn waiting<T>(&self, runtime: &Runtime, call: impl FnOnce() -> T) -> T {
        if !self.active.load(Ordering::Relaxed) {
            return call();
        }
        self.inside.fetch_add(1, Ordering::SeqCst);
        let inside = Inside(self);
        if self.closed.load(Ordering::SeqCst) {
            drop(inside);
            return call();
        }
        self.note_activity(runtime);
        if self.waits.fetch_add(1, Ordering::SeqCst) == 0 {
            self.wait_pins.store(0, Ordering::Relaxed);
            self.wait_started.store(now(), Ordering::SeqCst);
            self.mark_in_flight(runtime, true);
        }
        let result = call();
        if self.waits.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.wait_started.store(0, Ordering::SeqCst);
            self.mark_in_flight(runtime, false);
            // A wait that began meanwhile found the bit set and left it so; it must stay set.
            if self.waits.load(Ordering::SeqCst) > 0 {
                self.mark_in_flight(runtime, true);
            }
        }
        drop(inside);
        self.note_activity(runtime);
        result
    }

    /// Runs a query of the process's queued work (`cuStreamQuery`, `cuEventQuery`): one that finds
    /// work still running counts as activity; one that finds it done does not (a thread polling an
    /// idle stream leaves its process idle). It never waits, so it never holds the gate.
    pub fn query(&self, runtime: &Runtime, call: impl FnOnce() -> CUresult) -> CUresult {
        let status = call();
        if status == CUDA_ERROR_NOT_READY && self.active.load(Ordering::Relaxed) {
            self.note_activity(runtime);
        }
        status
    }

    /// Charged bytes of this process on `device` that are off the card now.
    pub fn swapped(&self, device: usize) -> u64 {
        self.swapped.get(device).map_or(0, |bytes| bytes.load(Ordering::Relaxed))
    }

    pub(super) fn note_activity(&self, runtime: &Runtime) {
        let now = now();
        if now.saturating_sub(self.last_active.load(Ordering::Relaxed)) < ACTIVITY_GRAIN_NS {
            return;
        }
        self.last_active.store(now, Ordering::Relaxed);
        self.each_record(runtime, |table, lease, index| {
            table.get(lease, index, Word::ActiveNs).store(now, Ordering::Relaxed);
        });
    }

    /// The lock over the blocks, with the process's memory on the card (brought back first if it
    /// was out).
    pub(super) fn resident_inner(&self, runtime: &Runtime) -> parking_lot::MutexGuard<'_, Inner> {
        loop {
            let inner = self.inner.lock();
            if !inner.out {
                return inner;
            }
            drop(inner);
            self.bring_back(runtime);
        }
    }
}
