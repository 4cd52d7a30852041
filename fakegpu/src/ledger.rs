//! Per-device counters (bytes, and the simulated device's busy time), process-local or in a file mapped
//! by every process sharing the card.
//!
//! The shared file (`FAKEGPU_SHARED`) holds tables of 32 slots, one slot per physical device, of
//! native-endian `u64`s updated only atomically. The first table is the original 1024-byte file; the
//! others were appended later, so an older fake that maps only the first bytes still works beside a
//! newer one (files are grown, never shrunk). The third table is used only with `FAKEGPU_PREEMPT`
//! (all zero otherwise); the fourth, the process table, by every fake.
//!
//! ```text
//! offset        32*i + 0     used         bytes allocated now
//!               32*i + 8     peak         most bytes ever allocated at once
//!               32*i + 16    alloc_calls  allocation calls that reached the fake
//!               32*i + 24    managed      bytes of managed memory allocated now (not in `used`)
//!        1024 + 32*i + 0     busy_until   CLOCK_MONOTONIC ns at which the device's queued work ends
//!        1024 + 32*i + 8     busy_total   ns of work ever queued on the device, by every process
//!        1024 + 32*i + 16    processes    processes holding a context on the device
//!        1024 + 32*i + 24    (spare)
//!        2048 + 1568*i + 0   lock         spin lock over this slot and busy_until: 0 free, 1 held
//!        2048 + 1568*i + 8   owner        pid of the process whose work is at the device's tail
//!        2048 + 1568*i + 16  seq          sequence number of the device's latest occupy
//!        2048 + 1568*i + 24  cut_ins      cut-ins ever recorded; cut-in n lies in ring entry n % 64
//!        2048 + 1568*i + 32  ring         64 entries of 24 bytes: seq, at (ns), len (ns); seq 0 = empty
//!       52224 + 320*k        process slot k (k < 128): see `processes`
//! ```
//!
//! With `FAKEGPU_PREEMPT` the devices time-slice between processes, as a real GPU does between
//! contexts: work a process queues while another process's queued work is running cuts in at once and
//! pushes that queue back by its length. Times a process stored before (its streams' ready times, its
//! events) carry the sequence number current when they were computed ([`Stamp`]); reading one applies
//! the later cut-ins that started before it ([`Ledger::effective`]). The ring keeps the last 64 cut-ins
//! per device: a time is read within milliseconds of being stored in practice, and one whose later
//! cut-ins fell out of the ring is pushed back by those still in it only.
//!
//! Nothing releases what a process that died still held: its bytes stay in `used`, and the work it
//! queued still occupies the device until `busy_until`. A process killed while it holds a device's
//! lock (a few loads and stores) would leave it held; use a fresh file per test.

use std::ffi::c_void;
use std::fs::{OpenOptions, Permissions};
use std::io;
use std::mem::{offset_of, size_of};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::config::MAX_DEVICES;
use crate::processes::ProcessTable;

/// Cut-ins each device remembers.
const CUT_IN_RING: usize = 64;

#[repr(C)]
pub struct DeviceCounters {
    used: AtomicU64,
    peak: AtomicU64,
    alloc_calls: AtomicU64,
    /// Managed memory lives in host memory and migrates: it can exceed the card, so it is counted
    /// apart from the physical `used`.
    managed: AtomicU64,
}

impl DeviceCounters {
    const fn new() -> DeviceCounters {
        DeviceCounters {
            used: AtomicU64::new(0),
            peak: AtomicU64::new(0),
            alloc_calls: AtomicU64::new(0),
            managed: AtomicU64::new(0),
        }
    }
}

/// One simulated device's timeline: when its queued work ends, and how much work it was ever given.
#[repr(C)]
pub struct DeviceClock {
    busy_until: AtomicU64,
    busy_total: AtomicU64,
    /// Processes holding at least one context on the device (NVML's running compute processes).
    processes: AtomicU64,
    _spare: AtomicU64,
}

impl DeviceClock {
    const fn new() -> DeviceClock {
        DeviceClock {
            busy_until: AtomicU64::new(0),
            busy_total: AtomicU64::new(0),
            processes: AtomicU64::new(0),
            _spare: AtomicU64::new(0),
        }
    }
}

/// Work that ran at once while another process's queued work was running, pushing that work back.
#[repr(C)]
struct CutIn {
    /// The sequence number of the occupy that cut in; 0 for an entry never written.
    seq: AtomicU64,
    /// When it started on the device.
    at: AtomicU64,
    /// How long it ran.
    len: AtomicU64,
}

impl CutIn {
    const fn new() -> CutIn {
        CutIn { seq: AtomicU64::new(0), at: AtomicU64::new(0), len: AtomicU64::new(0) }
    }
}

/// One simulated device's turns between processes (`FAKEGPU_PREEMPT`). Every field, and the device's
/// `busy_until`, changes only under `lock`, so a cut-in and the times it moves are seen together.
#[repr(C)]
pub struct DeviceTurns {
    lock: AtomicU64,
    owner: AtomicU64,
    seq: AtomicU64,
    cut_ins: AtomicU64,
    ring: [CutIn; CUT_IN_RING],
}

impl DeviceTurns {
    const fn new() -> DeviceTurns {
        DeviceTurns {
            lock: AtomicU64::new(0),
            owner: AtomicU64::new(0),
            seq: AtomicU64::new(0),
            cut_ins: AtomicU64::new(0),
            ring: [const { CutIn::new() }; CUT_IN_RING],
        }
    }

    /// Spins until this process holds the device. Holders keep it for a few loads and stores, but may
    /// be descheduled meanwhile, so a long wait yields the CPU.
    fn lock(&self) -> TurnsGuard<'_> {
        let mut tries = 0u32;
        while self.lock.compare_exchange_weak(0, 1, Ordering::Acquire, Ordering::Relaxed).is_err() {
            tries = tries.wrapping_add(1);
            if tries.is_multiple_of(64) {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        TurnsGuard(&self.lock)
    }

    /// The next sequence number, for an occupy. Lock held.
    fn next_seq(&self) -> u64 {
        let seq = self.seq.load(Ordering::Relaxed).wrapping_add(1);
        self.seq.store(seq, Ordering::Relaxed);
        seq
    }

    /// Remembers a cut-in, over the oldest one once the ring is full. Lock held.
    fn record_cut_in(&self, seq: u64, at: u64, len: u64) {
        if len == 0 {
            return; // An event cutting in moves nothing; keep the ring for work that does.
        }
        let count = self.cut_ins.load(Ordering::Relaxed);
        let entry = &self.ring[(count % CUT_IN_RING as u64) as usize];
        entry.seq.store(seq, Ordering::Relaxed);
        entry.at.store(at, Ordering::Relaxed);
        entry.len.store(len, Ordering::Relaxed);
        self.cut_ins.store(count.wrapping_add(1), Ordering::Relaxed);
    }

    /// `stamp`'s time pushed back by each remembered cut-in numbered after it and up to `upto`, in
    /// order, that started before the time as pushed so far (a cut-in at or after it ran once that work
    /// was done). Lock held.
    fn shift(&self, stamp: Stamp, upto: u64) -> u64 {
        let count = self.cut_ins.load(Ordering::Relaxed);
        let oldest = count.saturating_sub(CUT_IN_RING as u64);
        let mut time = stamp.time;
        for n in oldest..count {
            let entry = &self.ring[(n % CUT_IN_RING as u64) as usize];
            let seq = entry.seq.load(Ordering::Relaxed);
            if seq > stamp.seq && seq <= upto && entry.at.load(Ordering::Relaxed) < time {
                time = time.saturating_add(entry.len.load(Ordering::Relaxed));
            }
        }
        time
    }
}

/// Holds a device's `DeviceTurns::lock` until dropped.
struct TurnsGuard<'a>(&'a AtomicU64);

impl Drop for TurnsGuard<'_> {
    fn drop(&mut self) {
        self.0.store(0, Ordering::Release);
    }
}

#[repr(C)]
struct LedgerFile {
    devices: [DeviceCounters; MAX_DEVICES],
    clocks: [DeviceClock; MAX_DEVICES],
    turns: [DeviceTurns; MAX_DEVICES],
    processes: ProcessTable,
}

impl LedgerFile {
    const fn new() -> LedgerFile {
        LedgerFile {
            devices: [const { DeviceCounters::new() }; MAX_DEVICES],
            clocks: [const { DeviceClock::new() }; MAX_DEVICES],
            turns: [const { DeviceTurns::new() }; MAX_DEVICES],
            processes: ProcessTable::new(),
        }
    }
}

/// The file a fake before the process table mapped without `FAKEGPU_PREEMPT`: the tables before
/// `turns`. Every fake now maps the whole file (the `turns` table stays untouched without it).
const FIFO_FILE_SIZE: usize = offset_of!(LedgerFile, turns);
const FILE_SIZE: usize = size_of::<LedgerFile>();
const _: () = assert!(size_of::<DeviceCounters>() == 32);
const _: () = assert!(offset_of!(DeviceCounters, peak) == 8);
const _: () = assert!(offset_of!(DeviceCounters, alloc_calls) == 16);
const _: () = assert!(size_of::<DeviceClock>() == 32);
const _: () = assert!(offset_of!(DeviceClock, busy_total) == 8);
const _: () = assert!(size_of::<CutIn>() == 24);
const _: () = assert!(size_of::<DeviceTurns>() == 1568);
const _: () = assert!(offset_of!(DeviceTurns, owner) == 8);
const _: () = assert!(offset_of!(DeviceTurns, seq) == 16);
const _: () = assert!(offset_of!(DeviceTurns, cut_ins) == 24);
const _: () = assert!(offset_of!(DeviceTurns, ring) == 32);
const _: () = assert!(offset_of!(LedgerFile, clocks) == 1024);
const _: () = assert!(FIFO_FILE_SIZE == 2048);
const _: () = assert!(offset_of!(LedgerFile, processes) == 2048 + 32 * 1568);
const _: () = assert!(FILE_SIZE == 2048 + 32 * 1568 + 128 * 320);

static LOCAL: LedgerFile = LedgerFile::new();

/// A time on a device's timeline as an occupy computed it, with the device's sequence number then:
/// cut-ins numbered later may push it back ([`Ledger::effective`]). The number is always 0 without
/// `FAKEGPU_PREEMPT`, where nothing cuts in. The default is time 0, before any work.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stamp {
    pub time: u64,
    pub seq: u64,
}

/// Where a piece of work landed on a device's timeline, in `CLOCK_MONOTONIC` nanoseconds, and the
/// sequence number of the occupy that put it there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slot {
    pub start: u64,
    pub end: u64,
    pub seq: u64,
}

impl Slot {
    pub fn start_stamp(self) -> Stamp {
        Stamp { time: self.start, seq: self.seq }
    }

    pub fn end_stamp(self) -> Stamp {
        Stamp { time: self.end, seq: self.seq }
    }
}

/// A snapshot of one device's counters.
#[derive(Clone, Copy, Debug)]
pub struct DeviceStats {
    pub used: u64,
    pub peak: u64,
    pub alloc_calls: u64,
    pub managed: u64,
}

pub struct Ledger {
    devices: &'static [DeviceCounters; MAX_DEVICES],
    clocks: &'static [DeviceClock; MAX_DEVICES],
    /// With `FAKEGPU_PREEMPT` only: without it nothing takes a device's lock or reads its cut-ins.
    turns: Option<&'static [DeviceTurns; MAX_DEVICES]>,
    /// The processes on the card, for NVML's lists.
    pub processes: &'static ProcessTable,
    /// The owner of the work this process queues: its pid.
    process: u64,
}

/// A table of the ledger file mapped at `base`.
///
/// # Safety
/// `base` must be a mapping at least `offset + size_of::<T>()` bytes long that lives for 'static, and
/// every byte there must be part of an `AtomicU64` that is only ever accessed atomically.
unsafe fn table<T>(base: *mut c_void, offset: usize) -> &'static T {
    // SAFETY: in bounds of the mapping, by the contract; every offset used is a multiple of 8 and the
    // mapping is page-aligned, so the `AtomicU64`s in `T` are aligned; all-zero bytes (a fresh file)
    // are valid atomics, and other processes change them only atomically, so a shared reference is sound.
    unsafe { &*base.cast::<u8>().add(offset).cast::<T>() }
}

impl Ledger {
    /// This process's own ledger; `preempt` as `FAKEGPU_PREEMPT` says (with one process, nothing ever
    /// cuts in, but the rules are the same).
    pub fn local(preempt: bool) -> Ledger {
        Ledger::over(&LOCAL, preempt, u64::from(std::process::id()))
    }

    fn over(file: &'static LedgerFile, preempt: bool, process: u64) -> Ledger {
        Ledger {
            devices: &file.devices,
            clocks: &file.clocks,
            turns: preempt.then_some(&file.turns),
            processes: &file.processes,
            process,
        }
    }

    /// Maps the ledger file at `path`, creating it (mode 0666) or growing it as needed, to every
    /// table; the one `FAKEGPU_PREEMPT` needs is used only with `preempt`.
    pub fn shared(path: &Path, preempt: bool) -> io::Result<Ledger> {
        let size = FILE_SIZE;
        let file =
            OpenOptions::new().read(true).write(true).create(true).truncate(false).mode(0o666).open(path)?;
        // Best effort: the umask narrowed the mode, and a file another user created is theirs to chmod.
        let _ = file.set_permissions(Permissions::from_mode(0o666));
        if file.metadata()?.len() < size as u64 {
            file.set_len(size as u64)?;
        }
        // SAFETY: a fresh shared read-write mapping of an open descriptor; the kernel picks the address.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the mapping is `size` long, the whole `LedgerFile`, backed by a file at least that
        // long (it is only ever grown) and never unmapped, so it lives for 'static; every byte of it
        // is an `AtomicU64` that every process only accesses atomically.
        let (devices, clocks, turns, processes) = unsafe {
            let turns = if preempt { Some(table(base, offset_of!(LedgerFile, turns))) } else { None };
            (
                table(base, offset_of!(LedgerFile, devices)),
                table(base, offset_of!(LedgerFile, clocks)),
                turns,
                table(base, offset_of!(LedgerFile, processes)),
            )
        };
        Ok(Ledger { devices, clocks, turns, processes, process: u64::from(std::process::id()) })
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

    /// Adds (or with a negative `delta`, takes back) managed bytes on `device`: never refused, as
    /// managed memory is backed by the host and pages in and out of the card.
    pub fn add_managed(&self, device: usize, delta: i64) {
        let _ = self.devices[device]
            .managed
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |now| Some(now.saturating_add_signed(delta)));
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
            managed: counters.managed.load(Ordering::Acquire),
        }
    }

    /// Queues `duration` ns of work on `device`, to start no earlier than `not_before` nor than `after`
    /// (its stream's ready time, as [`Ledger::effective`] reads it): after everything already queued
    /// there (by any process sharing the file), first come first served; with `FAKEGPU_PREEMPT`, work
    /// that another process's running queue is ahead of cuts in instead (`take_turn`).
    pub fn occupy(&self, device: usize, not_before: u64, after: Stamp, duration: u64) -> Slot {
        let clock = &self.clocks[device];
        // Counted first, so a concurrent reader errs towards work done rather than below zero.
        clock.busy_total.fetch_add(duration, Ordering::AcqRel);
        match self.turns {
            None => Ledger::queue_last(clock, not_before.max(after.time), duration),
            Some(turns) => self.take_turn(clock, &turns[device], not_before, after, duration),
        }
    }

    /// First come first served: after the work queued so far.
    fn queue_last(clock: &DeviceClock, earliest: u64, duration: u64) -> Slot {
        let mut until = clock.busy_until.load(Ordering::Acquire);
        loop {
            let start = earliest.max(until);
            let end = start.saturating_add(duration);
            match clock.busy_until.compare_exchange_weak(until, end, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Slot { start, end, seq: 0 },
                Err(now) => until = now,
            }
        }
    }

    /// Time-slicing between processes: work queues behind the device's tail when the device is idle
    /// by then or that tail is this process's own; otherwise another process's queue is running, and
    /// the work runs at once, pushing that queue (and everything queued behind it) back by `duration`,
    /// as a real GPU switches contexts at its next time slice.
    fn take_turn(
        &self,
        clock: &DeviceClock,
        turns: &DeviceTurns,
        not_before: u64,
        after: Stamp,
        duration: u64,
    ) -> Slot {
        let _held = turns.lock();
        let earliest = not_before.max(turns.shift(after, u64::MAX));
        let seq = turns.next_seq();
        let until = clock.busy_until.load(Ordering::Acquire);
        if until <= earliest || turns.owner.load(Ordering::Relaxed) == self.process {
            let start = earliest.max(until);
            let end = start.saturating_add(duration);
            clock.busy_until.store(end, Ordering::Release);
            turns.owner.store(self.process, Ordering::Relaxed);
            return Slot { start, end, seq };
        }
        clock.busy_until.store(until.saturating_add(duration), Ordering::Release);
        turns.record_cut_in(seq, earliest, duration);
        Slot { start: earliest, end: earliest.saturating_add(duration), seq }
    }

    /// `stamp`'s time now: pushed back by every later cut-in on `device` that started before it. Just
    /// its time without `FAKEGPU_PREEMPT`.
    pub fn effective(&self, device: usize, stamp: Stamp) -> u64 {
        self.shifted(device, stamp, u64::MAX)
    }

    /// The later of two stamps of `device`, where `newer` comes from a later occupy than `older`: as
    /// one stamp numbered like `newer`, so `older` takes the cut-ins between the two now.
    pub fn later(&self, device: usize, older: Stamp, newer: Stamp) -> Stamp {
        let older = self.shifted(device, older, newer.seq);
        Stamp { time: older.max(newer.time), seq: newer.seq }
    }

    /// `stamp`'s time pushed back by the cut-ins on `device` numbered up to `upto`.
    fn shifted(&self, device: usize, stamp: Stamp, upto: u64) -> u64 {
        let Some(turns) = self.turns else { return stamp.time };
        let turns = &turns[device];
        let _held = turns.lock();
        turns.shift(stamp, upto)
    }

    /// This process now holds a context on `device` (its first there).
    pub fn join(&self, device: usize) {
        self.clocks[device].processes.fetch_add(1, Ordering::AcqRel);
    }

    /// This process no longer holds any context on `device`.
    pub fn leave(&self, device: usize) {
        let processes = &self.clocks[device].processes;
        let _ = processes.fetch_update(Ordering::AcqRel, Ordering::Relaxed, |n| Some(n.saturating_sub(1)));
    }

    /// How many processes hold a context on `device`; one that died holding one still counts.
    pub fn processes(&self, device: usize) -> u64 {
        self.clocks[device].processes.load(Ordering::Acquire)
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

    const DEVICE: usize = 3;

    /// Two processes sharing a fresh file (leaked: a ledger's tables live for 'static).
    fn two_processes(preempt: bool) -> (Ledger, Ledger) {
        let file: &'static LedgerFile = Box::leak(Box::new(LedgerFile::new()));
        (Ledger::over(file, preempt, 100), Ledger::over(file, preempt, 200))
    }

    /// Queues `duration` ns from `earliest` on a stream with nothing queued yet.
    fn run(ledger: &Ledger, earliest: u64, duration: u64) -> Slot {
        ledger.occupy(DEVICE, earliest, Stamp::default(), duration)
    }

    #[test]
    fn work_queues_first_come_first_served() {
        let (ledger, other) = two_processes(false);
        assert_eq!(run(&ledger, 1000, 50), Slot { start: 1000, end: 1050, seq: 0 });
        assert_eq!(run(&other, 1010, 20), Slot { start: 1050, end: 1070, seq: 0 }, "queued behind");
        assert_eq!(ledger.work_done(DEVICE, 1010), 10);
        assert_eq!(ledger.work_done(DEVICE, 1060), 60);
        assert_eq!(run(&ledger, 2000, 30), Slot { start: 2000, end: 2030, seq: 0 }, "idle device");
        assert_eq!(ledger.work_done(DEVICE, 2000), 70);
        assert_eq!(ledger.work_done(DEVICE, 2010), 80);
        assert_eq!(ledger.work_done(DEVICE, 5000), 100);
        let after = Stamp { time: 6000, seq: 0 };
        assert_eq!(ledger.occupy(DEVICE, 5000, after, 10).start, 6000, "after its stream's work");
        assert_eq!(ledger.effective(DEVICE, Stamp { time: 1050, seq: 0 }), 1050);
    }

    #[test]
    fn the_process_local_ledger_queues_too() {
        let ledger = Ledger::local(false);
        let device = MAX_DEVICES - 1;
        let first = ledger.occupy(device, 1000, Stamp::default(), 50);
        assert_eq!(ledger.occupy(device, 1000, Stamp::default(), 50).start, first.end);
    }

    #[test]
    fn work_cuts_in_while_another_process_runs() {
        let (y, x) = two_processes(true);
        // Y: an event, a 400 ns kernel, an event, on one stream.
        let y_start = run(&y, 1000, 0);
        let y_kernel = y.occupy(DEVICE, 1000, y_start.start_stamp(), 400);
        let y_end = y.occupy(DEVICE, 1000, y_kernel.end_stamp(), 0);
        assert_eq!((y_start.start, y_kernel.start, y_kernel.end, y_end.start), (1000, 1000, 1400, 1400));
        // X, at 1100: its event and kernel run at once, and Y's queue moves back by the kernel.
        let x_start = run(&x, 1100, 0);
        let x_kernel = x.occupy(DEVICE, 1100, x_start.start_stamp(), 100);
        let x_end = x.occupy(DEVICE, 1100, x_kernel.end_stamp(), 0);
        assert_eq!((x_start.start, x_kernel.start, x_kernel.end, x_end.start), (1100, 1100, 1200, 1200));
        assert_eq!(y.effective(DEVICE, y_end.start_stamp()), 1500, "Y's kernel plus X's");
        assert_eq!(y.effective(DEVICE, y_start.start_stamp()), 1000, "before the cut-in");
        assert_eq!(x.effective(DEVICE, x_end.start_stamp()), 1200, "not moved by itself");
        assert_eq!(y.work_done(DEVICE, 1500), 500, "the device never idled");
        // Y's next work still queues behind its own, now later, tail.
        assert_eq!(y.occupy(DEVICE, 1150, y_kernel.end_stamp(), 50).start, 1500);
    }

    #[test]
    fn work_queues_when_the_device_is_idle_or_the_tail_is_its_own() {
        let (y, x) = two_processes(true);
        assert_eq!(run(&x, 2000, 50).start, 2000, "idle device");
        assert_eq!(run(&x, 2010, 50).start, 2050, "its own tail");
        assert_eq!(run(&y, 2020, 10).start, 2020, "cuts in");
        assert_eq!(run(&x, 2030, 10).start, 2110, "still its own tail, pushed back");
        assert_eq!(run(&y, 5000, 10).start, 5000, "idle by then: Y now owns the tail");
        assert_eq!(run(&y, 5000, 10).start, 5010);
        assert_eq!(run(&x, 5015, 10).start, 5015, "X cuts in");
    }

    #[test]
    fn stored_times_move_only_for_later_cut_ins_before_them() {
        let (y, x) = two_processes(true);
        let long = run(&y, 1000, 1000); // Y owns [1000, 2000].
        let early = Stamp { time: 1100, seq: long.seq };
        let late = Stamp { time: 1400, seq: long.seq };
        let first = run(&x, 1300, 100); // Cuts in at 1300: moves `late`, not `early`.
        assert_eq!((y.effective(DEVICE, early), y.effective(DEVICE, late)), (1100, 1500));
        assert_eq!(x.effective(DEVICE, first.end_stamp()), 1400, "numbered like the cut-in");
        // At 1450 it starts after `late` as stored, but before `late` as moved by the first cut-in.
        run(&x, 1450, 50);
        assert_eq!(y.effective(DEVICE, late), 1550, "applied in order");
        assert_eq!(y.effective(DEVICE, long.end_stamp()), 2150);
        // Merging keeps the newer number: the older time has taken the cut-ins before it.
        let newer = run(&y, 1460, 10);
        assert_eq!(newer.start, 2150, "behind Y's own tail");
        assert_eq!(y.later(DEVICE, late, newer.end_stamp()), newer.end_stamp());
        assert_eq!(y.later(DEVICE, Stamp { time: 9000, seq: 1 }, newer.end_stamp()).time, 9150);
    }

    #[test]
    fn the_ring_keeps_the_latest_cut_ins() {
        let (y, x) = two_processes(true);
        run(&y, 0, 1_000_000);
        let stored = Stamp { time: 900_000, seq: 1 };
        for at in 1..=CUT_IN_RING as u64 + 6 {
            run(&x, at, 1);
        }
        assert_eq!(y.effective(DEVICE, stored), 900_000 + CUT_IN_RING as u64, "older cut-ins are lost");
    }
}
