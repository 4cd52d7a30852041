//! Per-device counters (bytes, and the simulated device's busy time), process-local or in a file mapped
//! by every process sharing the card.
//!
//! The shared file (`FAKEGPU_SHARED`) is 2048 bytes: two tables of 32 slots of 32 bytes, one slot per
//! physical device, each four native-endian `u64`s updated only atomically. The first table is the
//! original 1024-byte file; the second was appended later, so an older fake that maps only the first
//! 1024 bytes still works beside a newer one (files are grown, never shrunk):
//!
//! ```text
//! offset        32*i + 0   used         bytes allocated now
//!               32*i + 8   peak         most bytes ever allocated at once
//!               32*i + 16  alloc_calls  allocation calls that reached the fake
//!               32*i + 24  (spare)
//!        1024 + 32*i + 0   busy_until   CLOCK_MONOTONIC ns at which the device's queued work ends
//!        1024 + 32*i + 8   busy_total   ns of work ever queued on the device, by every process
//!        1024 + 32*i + 16  (spare)
//!        1024 + 32*i + 24  (spare)
//! ```
//!
//! Nothing releases what a process that died still held: its bytes stay in `used`, and the work it
//! queued still occupies the device until `busy_until`.

use std::fs::{OpenOptions, Permissions};
use std::io;
use std::mem::{offset_of, size_of};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::config::MAX_DEVICES;

#[repr(C)]
pub struct DeviceCounters {
    used: AtomicU64,
    peak: AtomicU64,
    alloc_calls: AtomicU64,
    _spare: AtomicU64,
}

impl DeviceCounters {
    const fn new() -> DeviceCounters {
        DeviceCounters {
            used: AtomicU64::new(0),
            peak: AtomicU64::new(0),
            alloc_calls: AtomicU64::new(0),
            _spare: AtomicU64::new(0),
        }
    }
}

/// One simulated device's timeline: when its queued work ends, and how much work it was ever given.
#[repr(C)]
pub struct DeviceClock {
    busy_until: AtomicU64,
    busy_total: AtomicU64,
    _spare: [AtomicU64; 2],
}

impl DeviceClock {
    const fn new() -> DeviceClock {
        DeviceClock {
            busy_until: AtomicU64::new(0),
            busy_total: AtomicU64::new(0),
            _spare: [AtomicU64::new(0), AtomicU64::new(0)],
        }
    }
}

#[repr(C)]
struct LedgerFile {
    devices: [DeviceCounters; MAX_DEVICES],
    clocks: [DeviceClock; MAX_DEVICES],
}

const FILE_SIZE: usize = size_of::<LedgerFile>();
const _: () = assert!(size_of::<DeviceCounters>() == 32);
const _: () = assert!(offset_of!(DeviceCounters, peak) == 8);
const _: () = assert!(offset_of!(DeviceCounters, alloc_calls) == 16);
const _: () = assert!(size_of::<DeviceClock>() == 32);
const _: () = assert!(offset_of!(DeviceClock, busy_total) == 8);
const _: () = assert!(offset_of!(LedgerFile, clocks) == 1024);
const _: () = assert!(FILE_SIZE == 2048);

static LOCAL: LedgerFile = LedgerFile {
    devices: [const { DeviceCounters::new() }; MAX_DEVICES],
    clocks: [const { DeviceClock::new() }; MAX_DEVICES],
};

/// Where a piece of work landed on a device's timeline, in `CLOCK_MONOTONIC` nanoseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slot {
    pub start: u64,
    pub end: u64,
}

/// A snapshot of one device's counters.
#[derive(Clone, Copy, Debug)]
pub struct DeviceStats {
    pub used: u64,
    pub peak: u64,
    pub alloc_calls: u64,
}

pub struct Ledger {
    devices: &'static [DeviceCounters; MAX_DEVICES],
    clocks: &'static [DeviceClock; MAX_DEVICES],
}

impl Ledger {
    pub fn local() -> Ledger {
        Ledger { devices: &LOCAL.devices, clocks: &LOCAL.clocks }
    }

    /// Maps the ledger file at `path`, creating it (mode 0666) or growing it as needed.
    pub fn shared(path: &Path) -> io::Result<Ledger> {
        let file =
            OpenOptions::new().read(true).write(true).create(true).truncate(false).mode(0o666).open(path)?;
        // Best effort: the umask narrowed the mode, and a file another user created is theirs to chmod.
        let _ = file.set_permissions(Permissions::from_mode(0o666));
        if file.metadata()?.len() < FILE_SIZE as u64 {
            file.set_len(FILE_SIZE as u64)?;
        }
        // SAFETY: a fresh shared read-write mapping of an open descriptor; the kernel picks the address.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                FILE_SIZE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the mapping is page-aligned, FILE_SIZE long, backed by a file at least that long (it
        // is only ever grown) and never unmapped, so it lives for 'static. Every byte of it is an
        // `AtomicU64` that this and other processes only access atomically, and all-zero bytes are a
        // valid value, so a shared reference to atomics in it is sound.
        let file = unsafe { &*base.cast::<LedgerFile>() };
        Ok(Ledger { devices: &file.devices, clocks: &file.clocks })
    }

    /// Counts an allocation call that reached the fake, whatever its outcome.
    pub fn count_call(&self, device: usize) {
        self.devices[device].alloc_calls.fetch_add(1, Ordering::Relaxed);
    }

    /// Reserves `size` bytes on `device` unless that would take its usage past `memory`.
    pub fn reserve(&self, device: usize, size: u64, memory: u64) -> bool {
        let counters = &self.devices[device];
        let mut used = counters.used.load(Ordering::Relaxed);
        loop {
            let Some(new) = used.checked_add(size).filter(|&new| new <= memory) else {
                return false;
            };
            match counters.used.compare_exchange_weak(used, new, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => {
                    counters.peak.fetch_max(new, Ordering::AcqRel);
                    return true;
                }
                Err(now) => used = now,
            }
        }
    }

    pub fn release(&self, device: usize, size: u64) {
        // Saturate: someone may have zeroed the shared file underneath us.
        let _ = self.devices[device]
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |used| Some(used.saturating_sub(size)));
    }

    pub fn used(&self, device: usize) -> u64 {
        self.devices[device].used.load(Ordering::Acquire)
    }

    pub fn stats(&self, device: usize) -> DeviceStats {
        let counters = &self.devices[device];
        DeviceStats {
            used: counters.used.load(Ordering::Acquire),
            peak: counters.peak.load(Ordering::Acquire),
            alloc_calls: counters.alloc_calls.load(Ordering::Acquire),
        }
    }

    /// Queues `duration` ns of work on `device`, to start no earlier than `earliest`: after everything
    /// already queued there (by any process sharing the file), first come first served.
    pub fn occupy(&self, device: usize, earliest: u64, duration: u64) -> Slot {
        let clock = &self.clocks[device];
        // Counted first, so a concurrent reader errs towards work done rather than below zero.
        clock.busy_total.fetch_add(duration, Ordering::AcqRel);
        let mut until = clock.busy_until.load(Ordering::Acquire);
        loop {
            let start = earliest.max(until);
            let end = start.saturating_add(duration);
            match clock.busy_until.compare_exchange_weak(until, end, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Slot { start, end },
                Err(now) => until = now,
            }
        }
    }

    /// Nanoseconds of work `device` has finished by `now`, the present: the work ever queued minus what
    /// is still queued. Work never waits for anything but the work queued before it (a stream is ready
    /// no later than its device), so a device is never idle while work is queued and this is exact;
    /// but a reading that races a launch may be off by that launch's duration, once (the next reading
    /// makes up for it).
    pub fn work_done(&self, device: usize, now: u64) -> u64 {
        let clock = &self.clocks[device];
        let until = clock.busy_until.load(Ordering::Acquire);
        let total = clock.busy_total.load(Ordering::Acquire);
        total.saturating_sub(until.saturating_sub(now))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_queues_first_come_first_served() {
        let ledger = Ledger::local();
        let device = MAX_DEVICES - 1;
        assert_eq!(ledger.occupy(device, 1000, 50), Slot { start: 1000, end: 1050 });
        assert_eq!(ledger.occupy(device, 1010, 20), Slot { start: 1050, end: 1070 }, "queued behind");
        assert_eq!(ledger.work_done(device, 1010), 10);
        assert_eq!(ledger.work_done(device, 1060), 60);
        assert_eq!(ledger.occupy(device, 2000, 30), Slot { start: 2000, end: 2030 }, "idle device");
        assert_eq!(ledger.work_done(device, 2000), 70);
        assert_eq!(ledger.work_done(device, 2010), 80);
        assert_eq!(ledger.work_done(device, 5000), 100);
    }
}
