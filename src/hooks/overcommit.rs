//! Memory overcommit (`CUDA_OVERSUBSCRIBE`, docs/overcommit.md): linear allocations on an
//! overcommitted device come back as managed memory that prefers the GPU, so that what the card
//! cannot hold spills to host memory instead of failing, and a process that starts launching
//! again after an idle spell gets its memory migrated back in bulk before its first kernel.
//!
//! Every `cuMemAlloc` of an overcommitted device is spillable, not only what exceeds the card's
//! free memory when it is asked for: memory that a process took first would otherwise stay pinned
//! to the card while it idles, and a neighbour taking its turn could never have it evicted (the
//! "notebooks taking turns" case). The budget is charged the same either way.

// Streams are opaque driver handles: passed on, never dereferenced.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use parking_lot::Mutex;

use crate::driver::{self, sys::*};
use crate::error::HookError;
use crate::hooks::memory::{budgeted_current, charge};
use crate::runtime::Runtime;

/// Idle time after which a process's next launch first migrates its spillable memory back to the
/// GPU, unless `LIBVGPU_PREFETCH_IDLE_MS` says otherwise (0 turns the migration off).
const DEFAULT_PREFETCH_IDLE_MS: u64 = 500;
const PREFETCH_IDLE_VAR: &str = "LIBVGPU_PREFETCH_IDLE_MS";
/// Migrations back are at least this many idle spans apart.
const PREFETCH_SPACING: u64 = 10;
/// `last_prefetch` after the process's first launch only (any value no clock reading takes).
const FIRST_LAUNCH: u64 = 1;

/// One spillable allocation of this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Spillable {
    device: usize,
    bytes: u64,
    /// Made spillable by us (migrated back on resume); the application's own managed memory is
    /// counted but left where its advice puts it.
    ours: bool,
}

/// This process's spillable allocations and when it last launched work.
#[derive(Debug)]
pub struct SpillTable {
    blocks: Mutex<HashMap<CUdeviceptr, Spillable>>,
    /// Entries of `blocks`: a free looks further only when this is not zero (no lock otherwise).
    entries: AtomicUsize,
    /// Entries of `blocks` that we made: a launch looks further only when this is not zero.
    ours: AtomicUsize,
    /// `CLOCK_MONOTONIC` ns of this process's latest launch (0: none yet).
    last_launch: AtomicU64,
    /// `CLOCK_MONOTONIC` ns of this process's latest migration back (0: none yet).
    last_prefetch: AtomicU64,
    /// Nanoseconds of idleness that make the next launch migrate memory back; 0: never.
    idle_ns: u64,
}

impl Default for SpillTable {
    fn default() -> SpillTable {
        SpillTable::with_idle_ms(prefetch_idle_ms())
    }
}

/// `LIBVGPU_PREFETCH_IDLE_MS` from the process's own environment (a tuning knob of the process,
/// like its log level); a value that is not a whole number is ignored.
fn prefetch_idle_ms() -> u64 {
    let Ok(value) = std::env::var(PREFETCH_IDLE_VAR) else { return DEFAULT_PREFETCH_IDLE_MS };
    value.trim().parse().unwrap_or_else(|_| {
        tracing::warn!(
            "{PREFETCH_IDLE_VAR}={value:?} is not a whole number of milliseconds; using \
             {DEFAULT_PREFETCH_IDLE_MS}"
        );
        DEFAULT_PREFETCH_IDLE_MS
    })
}

impl SpillTable {
    fn with_idle_ms(idle_ms: u64) -> SpillTable {
        SpillTable {
            blocks: Mutex::new(HashMap::new()),
            entries: AtomicUsize::new(0),
            ours: AtomicUsize::new(0),
            last_launch: AtomicU64::new(0),
            last_prefetch: AtomicU64::new(0),
            idle_ns: idle_ms.saturating_mul(1_000_000),
        }
    }

    fn insert(&self, runtime: &Runtime, address: CUdeviceptr, block: Spillable) {
        self.put_back(address, block);
        runtime.ledger().note_spillable(block.device, block.bytes as i64);
    }

    fn take(&self, address: CUdeviceptr) -> Option<Spillable> {
        let block = self.blocks.lock().remove(&address)?;
        self.entries.fetch_sub(1, Ordering::Relaxed);
        if block.ours {
            self.ours.fetch_sub(1, Ordering::Relaxed);
        }
        Some(block)
    }

    fn put_back(&self, address: CUdeviceptr, block: Spillable) {
        if block.ours {
            self.ours.fetch_add(1, Ordering::Relaxed);
        }
        // An address is live once: a record it replaces was of memory already freed.
        match self.blocks.lock().insert(address, block) {
            None => {
                self.entries.fetch_add(1, Ordering::Relaxed);
            }
            Some(stale) if stale.ours => {
                self.ours.fetch_sub(1, Ordering::Relaxed);
            }
            Some(_) => {}
        }
    }

    /// Runs `free` for `address`, then stops counting it as spillable. The record is taken out
    /// first (an address the driver hands out again at once is not confused with the old one)
    /// and put back if the driver refuses.
    #[inline]
    pub fn free(
        &self,
        runtime: &Runtime,
        address: CUdeviceptr,
        free: impl FnOnce() -> Result<(), HookError>,
    ) -> Result<(), HookError> {
        if self.entries.load(Ordering::Relaxed) == 0 {
            return free();
        }
        let Some(block) = self.take(address) else { return free() };
        match free() {
            Ok(()) => {
                runtime.ledger().note_spillable(block.device, -(block.bytes as i64));
                Ok(())
            }
            Err(error) => {
                self.put_back(address, block);
                Err(error)
            }
        }
    }

    /// Called before every launch on `stream`: after an idle spell of at least the configured
    /// time, queues a migration of this process's spillable memory on the current device back
    /// to the GPU, ahead of the launch on its own stream, so the first kernel finds its memory
    /// resident instead of faulting it in page by page. One relaxed load when this process has
    /// no spillable memory of its own.
    pub fn before_launch(&self, runtime: &Runtime, stream: CUstream) {
        if self.ours.load(Ordering::Relaxed) == 0 || self.idle_ns == 0 {
            return;
        }
        let now = vgpu_ledger::pace::now();
        let before = self.last_launch.swap(now, Ordering::Relaxed);
        if now.saturating_sub(before) < self.idle_ns {
            return;
        }
        // A gap between launches is also what a thrashing process shows while it waits for its
        // own work: migrating everything at each such gap would evict its own pages again. At most
        // one migration per ten idle spans.
        let last = self.last_prefetch.load(Ordering::Relaxed);
        if last > FIRST_LAUNCH && now.saturating_sub(last) < self.idle_ns.saturating_mul(PREFETCH_SPACING) {
            return;
        }
        // The process's first launch places its fresh memory; it is not a resume, and does not
        // hold back the first real one (a notebook's first turn can come within seconds of it).
        let mark = if before == 0 { FIRST_LAUNCH } else { now };
        if self.last_prefetch.compare_exchange(last, mark, Ordering::Relaxed, Ordering::Relaxed).is_err() {
            return; // another thread of this process is migrating it now
        }
        let Some(device) = budgeted_current(runtime) else { return };
        let cuda = driver::cuda();
        // A prefetch queued into a stream being captured would become part of the graph, or
        // invalidate the capture: never during one.
        if cuda.stream_capturing(stream).unwrap_or(true) {
            return;
        }
        let blocks: Vec<(CUdeviceptr, u64)> = self
            .blocks
            .lock()
            .iter()
            .filter(|(_, block)| block.ours && block.device == device)
            .map(|(&address, block)| (address, block.bytes))
            .collect();
        let total: u64 = blocks.iter().map(|(_, bytes)| bytes).sum();
        tracing::debug!(
            "launching again after {} ms idle: migrating {total} spillable bytes back to device {device}",
            now.saturating_sub(before) / 1_000_000
        );
        for (address, bytes) in blocks {
            if let Err(error) = cuda.mem_prefetch(address, bytes as usize, device as CUdevice, stream) {
                tracing::debug!("prefetch of {bytes} bytes at {address:#x} to device {device}: {error:?}");
                return;
            }
        }
    }
}

/// `cuMemAlloc_v2` on an overcommitted device: managed memory with the device as its preferred
/// location and mapped for it, charged to the budget like device memory. The driver places it on
/// the card while it fits and evicts it to host memory when the card is full.
///
/// # Safety
/// `dptr` is the application's non-null out-pointer.
pub unsafe fn alloc_spillable(
    runtime: &Runtime,
    device: usize,
    dptr: *mut CUdeviceptr,
    bytes: usize,
) -> Result<(), HookError> {
    let cuda = driver::cuda();
    let mut address: CUdeviceptr = 0;
    charge(runtime, &runtime.allocations, device, bytes as u64, || {
        driver::invoke(cuda.mem_alloc_managed, "cuMemAllocManaged", |f| {
            // SAFETY: `address` is a valid out-pointer; the size is the application's.
            unsafe { f(&mut address, bytes, CU_MEM_ATTACH_GLOBAL) }
        })?;
        // Preferred location only. Accessed-by kept the device's mapping of pages evicted to the
        // host, so a thrashing process read them across the link instead of faulting them back:
        // on an H100 a training step past a neighbour took 6.2-6.8 s with it and 2.8-5.3 s without
        // (docs/overcommit.md, "Why no accessed-by"). Advice is a hint: memory without it still
        // works, so a refusal is logged.
        if let Err(error) =
            cuda.mem_advise(address, bytes, CU_MEM_ADVISE_SET_PREFERRED_LOCATION, device as CUdevice)
        {
            tracing::debug!("cuMemAdvise(preferred location) on {bytes} spillable bytes: {error:?}");
        }
        Ok(address)
    })?;
    runtime.spill.insert(runtime, address, Spillable { device, bytes: bytes as u64, ours: true });
    // SAFETY: the caller's non-null out-pointer, written once the allocation exists.
    unsafe { dptr.write(address) };
    Ok(())
}

/// The application's own `cuMemAllocManaged` at `address` on an overcommitted device: counted
/// as spillable, left where its own advice puts it.
pub fn note_managed(runtime: &Runtime, device: usize, address: CUdeviceptr, bytes: u64) {
    runtime.spill.insert(runtime, address, Spillable { device, bytes, ours: false });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_our_blocks_count_for_migration() {
        let table = SpillTable::with_idle_ms(500);
        table.put_back(1, Spillable { device: 0, bytes: 10, ours: false });
        assert_eq!(table.ours.load(Ordering::Relaxed), 0);
        table.put_back(2, Spillable { device: 0, bytes: 10, ours: true });
        assert_eq!(table.ours.load(Ordering::Relaxed), 1);
        assert_eq!(table.take(2).map(|b| b.bytes), Some(10));
        assert_eq!(table.ours.load(Ordering::Relaxed), 0);
        assert_eq!(table.take(2), None);
        // A record replaced at the same address is not counted twice.
        table.put_back(3, Spillable { device: 0, bytes: 10, ours: true });
        table.put_back(3, Spillable { device: 0, bytes: 20, ours: true });
        assert_eq!(table.ours.load(Ordering::Relaxed), 1);
        assert_eq!(table.entries.load(Ordering::Relaxed), 2);
    }
}
