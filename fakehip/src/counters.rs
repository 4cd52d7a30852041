//! Bytes in use on each physical device: process-local, or in the fake CUDA driver's ledger file
//! (`FAKEGPU_SHARED`), so that a HIP process and a CUDA process of one test use one card.
//!
//! The file's first table (fakegpu/src/ledger.rs) holds one 32-byte slot per physical device:
//! `used`, `peak`, `alloc_calls` and a spare `u64`, native-endian, only ever accessed atomically.
//! The file is created if absent and grown to the fake driver's 2048 bytes, never shrunk.

use std::fs::OpenOptions;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::config::MAX_DEVICES;

/// The fake CUDA driver's smallest file.
const FILE_SIZE: u64 = 2048;

/// One device's slot.
#[repr(C)]
pub struct Slot {
    used: AtomicU64,
    peak: AtomicU64,
    alloc_calls: AtomicU64,
    _spare: AtomicU64,
}

const _: () = assert!(size_of::<Slot>() == 32);
const _: () = assert!(size_of::<[Slot; MAX_DEVICES]>() <= FILE_SIZE as usize);

/// The counters of every physical device.
pub struct Counters {
    slots: &'static [Slot; MAX_DEVICES],
}

impl Counters {
    pub fn local() -> Counters {
        let slots: Box<[Slot; MAX_DEVICES]> = Box::new(std::array::from_fn(|_| Slot {
            used: AtomicU64::new(0),
            peak: AtomicU64::new(0),
            alloc_calls: AtomicU64::new(0),
            _spare: AtomicU64::new(0),
        }));
        Counters { slots: Box::leak(slots) }
    }

    /// Maps the shared file at `path`, creating or growing it.
    pub fn shared(path: &Path) -> std::io::Result<Counters> {
        let file =
            OpenOptions::new().read(true).write(true).create(true).truncate(false).mode(0o666).open(path)?;
        if file.metadata()?.len() < FILE_SIZE {
            file.set_len(FILE_SIZE)?;
        }
        // SAFETY: a fresh shared mapping of an open file at least FILE_SIZE bytes long; the result
        // is checked against MAP_FAILED.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                FILE_SIZE as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: the mapping is page-aligned, FILE_SIZE bytes, never unmapped, and holds only
        // atomics (any bit pattern is a valid u64), which every process touches atomically.
        Ok(Counters { slots: unsafe { &*base.cast::<[Slot; MAX_DEVICES]>() } })
    }

    /// Adds `bytes` to `device` if it stays within `capacity`.
    pub fn allocate(&self, device: usize, bytes: u64, capacity: u64) -> bool {
        let slot = &self.slots[device];
        slot.alloc_calls.fetch_add(1, Ordering::Relaxed);
        let taken = slot.used.fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
            used.checked_add(bytes).filter(|&after| after <= capacity)
        });
        match taken {
            Ok(before) => {
                slot.peak.fetch_max(before + bytes, Ordering::Relaxed);
                true
            }
            Err(_) => false,
        }
    }

    pub fn free(&self, device: usize, bytes: u64) {
        let _ = self.slots[device]
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| Some(used.saturating_sub(bytes)));
    }

    pub fn used(&self, device: usize) -> u64 {
        self.slots[device].used.load(Ordering::Acquire)
    }

    pub fn peak(&self, device: usize) -> u64 {
        self.slots[device].peak.load(Ordering::Acquire)
    }

    pub fn alloc_calls(&self, device: usize) -> u64 {
        self.slots[device].alloc_calls.load(Ordering::Acquire)
    }
}
