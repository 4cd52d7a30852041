//! The swap table: a file beside a container's region (`<region>.swap`) through which the node's
//! swap arbiter (`vgpu-smi serve --swap`) and the container's processes agree who holds the card
//! (docs/overcommit.md, "Swapping whole processes").
//!
//! Containers cannot see each other, so no process can decide alone to give the card up. Each
//! process says in its record what it holds on the card, what it has moved to host memory, when it
//! last put work on the GPU and whether it waits for room; the arbiter reads every container's
//! table and asks the least recently active process to swap out. The arbiter writes only the
//! header's heartbeat and a record's `request`, `forced` and `amount` words; everything else is
//! written by the record's owner. Every word is a native-endian `u64`, only ever accessed
//! atomically.
//!
//! | offset | field | written by |
//! |---|---|---|
//! | 0 | magic `VGPUSWP1` | the process that creates the file |
//! | 8 | version, 1 | the process that creates the file |
//! | 16 | heartbeat: `CLOCK_MONOTONIC` ns of the arbiter's latest pass (0: never) | the arbiter |
//! | 24 | the arbiter's pid, as the node sees it | the arbiter |
//! | 64 + 128·(16·k + i) | lease `k`'s record for region device index `i`: the words below | |
//!
//! A record's words ([`Word`]): `state` (phase in bits 0–7, [`WAITING`] bit 8, [`IN_FLIGHT`] bit 9,
//! the owner's pid in bits 32–63), `request` (swap-out requests, counted up by the arbiter), `handled` (the request
//! the owner last acted on), `active_ns`, `resident`, `swapped`, `wanted`, `swap_outs`,
//! `swap_ins`, `wait_ns`, `out_ns`, `in_ns`, `pinned`, `forced`, `amount` (words 0–14 of 16; the
//! last is free). A record belongs to the lease of the same index in the region: it is meaningful
//! only while that lease is live, and a process that takes the lease clears its records before it
//! writes them. `amount` was added to version 1 without changing the version: a process that does
//! not know the word ignores it and moves everything, as before, and 0 (the cleared word) means
//! everything. `IN_FLIGHT` was added the same way: a process that does not set it is judged by
//! `active_ns` alone, as before.
//!
//! Everything read from the file may have been written by a hostile tenant: readers treat every
//! word as an untrusted number, and the arbiter acts only on the lease's liveness, which the
//! region's locks (not the file's words) decide.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use memmap2::{MmapOptions, MmapRaw};

use crate::config::MAX_DEVICES;
use crate::region::layout::MAX_PROCESSES;

pub const MAGIC: u64 = u64::from_le_bytes(*b"VGPUSWP1");
pub const VERSION: u64 = 1;
const HEADER: usize = 64;
const RECORD: usize = 128;
/// The file's size: the header and one record per lease and device.
pub const FILE_SIZE: usize = HEADER + MAX_PROCESSES * MAX_DEVICES * RECORD;
const _: () = assert!(8 * (Word::Amount as usize + 1) <= RECORD);

/// Header words.
const MAGIC_AT: usize = 0;
const VERSION_AT: usize = 8;
const HEARTBEAT_AT: usize = 16;
const ARBITER_PID_AT: usize = 24;

/// A record's words, by index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(usize)]
pub enum Word {
    /// Phase in bits 0–7, [`WAITING`] in bit 8, [`IN_FLIGHT`] in bit 9, the owner's pid in bits
    /// 32–63.
    State = 0,
    /// Swap-out requests the arbiter made of this record, counted up.
    Request,
    /// The request the owner last acted on (done, or declined because it was busy).
    Handled,
    /// `CLOCK_MONOTONIC` ns of the owner's latest work on the device.
    ActiveNs,
    /// Bytes of swappable memory on the card.
    Resident,
    /// Bytes of swappable memory in host memory.
    Swapped,
    /// Bytes the owner waits to bring in or allocate (0: not waiting).
    Wanted,
    SwapOuts,
    SwapIns,
    /// Nanoseconds the owner's calls spent waiting for its memory to come back.
    WaitNs,
    /// Nanoseconds spent copying out and in.
    OutNs,
    InNs,
    /// Bytes of host memory pinned ahead for swapping out.
    Pinned,
    /// The request number the arbiter made *forced*: the process swaps out even if it is busy
    /// (written by the arbiter before it counts `request` up to that number).
    Forced,
    /// Bytes the latest request asks for (0: everything); a forced request moves only this much,
    /// in whole chunks (written by the arbiter before it counts `request` up).
    Amount,
}

/// Swappable memory moves on and off the card in pieces of this size (a request's `amount` is
/// rounded up to it).
pub const CHUNK: u64 = 64 << 20;

/// The phase of a record (bits 0–7 of `state`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Phase {
    /// No swappable memory, or a record nobody uses.
    #[default]
    Idle = 0,
    /// Its swappable memory is on the card.
    Resident = 1,
    SwappingOut = 2,
    /// Its swappable memory is in host memory.
    Out = 3,
    SwappingIn = 4,
}

impl Phase {
    pub fn from_state(state: u64) -> Phase {
        match state & 0xff {
            1 => Phase::Resident,
            2 => Phase::SwappingOut,
            3 => Phase::Out,
            4 => Phase::SwappingIn,
            _ => Phase::Idle,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Phase::Idle => "idle",
            Phase::Resident => "resident",
            Phase::SwappingOut => "swapping out",
            Phase::Out => "swapped out",
            Phase::SwappingIn => "swapping in",
        }
    }
}

/// `state` bit: the owner waits for room on the card.
pub const WAITING: u64 = 1 << 8;

/// `state` bit: a call of the owner waits for its own kernels (a synchronize): it has work in
/// flight, so it is busy however long ago its latest call started.
pub const IN_FLIGHT: u64 = 1 << 9;

/// `state` for `phase`, `waiting` and the owner's `pid`.
pub fn state_word(phase: Phase, waiting: bool, pid: u32) -> u64 {
    phase as u64 | if waiting { WAITING } else { 0 } | u64::from(pid) << 32
}

/// The swap table's path for the region at `region`.
pub fn path_for(region: &Path) -> PathBuf {
    let mut name = region.as_os_str().to_owned();
    name.push(".swap");
    PathBuf::from(name)
}

/// A mapped swap table.
pub struct SwapTable {
    map: MmapRaw,
    path: PathBuf,
    /// This process made the file (it was missing or empty).
    created: bool,
}

// SAFETY: the mapping is only ever accessed through atomics.
unsafe impl Send for SwapTable {}
// SAFETY: as above.
unsafe impl Sync for SwapTable {}

impl SwapTable {
    /// Opens the table beside the region at `region`, creating it if it is missing or empty (a
    /// process of the container). The file gets all its blocks before it is mapped, so a full
    /// filesystem is an error here rather than SIGBUS later.
    pub fn open_for_process(region: &Path) -> io::Result<SwapTable> {
        let path = path_for(region);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o666)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path)?;
        // Every process of the container (possibly of other users) opens it.
        // SAFETY: a plain system call on our own descriptor.
        unsafe { libc::fchmod(file.as_raw_fd(), 0o666) };
        let size = file.metadata()?.len();
        let created = size == 0;
        if size < FILE_SIZE as u64 {
            // SAFETY: as above; the range is the file's whole size.
            let status = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, FILE_SIZE as libc::off_t) };
            if status != 0 {
                return Err(io::Error::from_raw_os_error(status));
            }
        }
        let mut table = SwapTable::map(&file, path)?;
        table.created = created;
        // A fresh (zeroed) file gets its identity; a file with another one is not ours to use.
        let magic = table.header(MAGIC_AT);
        if magic.compare_exchange(0, MAGIC, Ordering::AcqRel, Ordering::Acquire).is_ok() {
            table.header(VERSION_AT).store(VERSION, Ordering::Release);
        }
        table.check()?;
        Ok(table)
    }

    /// Maps a table the caller opened and checked (the arbiter opens a tenant's file without
    /// following links). It must be a regular file of at least [`FILE_SIZE`] bytes with the magic
    /// and version of this release; only the first [`FILE_SIZE`] bytes are mapped.
    pub fn from_checked_file(file: &File, path: &Path) -> io::Result<SwapTable> {
        let metadata = file.metadata()?;
        if !metadata.is_file() || metadata.len() < FILE_SIZE as u64 {
            return Err(io::Error::other(format!(
                "not a swap table ({} bytes; {FILE_SIZE} expected)",
                metadata.len()
            )));
        }
        let table = SwapTable::map(file, path.to_owned())?;
        table.check()?;
        Ok(table)
    }

    fn map(file: &File, path: PathBuf) -> io::Result<SwapTable> {
        let map = MmapOptions::new().len(FILE_SIZE).map_raw(file)?;
        Ok(SwapTable { map, path, created: false })
    }

    fn check(&self) -> io::Result<()> {
        let magic = self.header(MAGIC_AT).load(Ordering::Acquire);
        let version = self.header(VERSION_AT).load(Ordering::Acquire);
        if magic != MAGIC || version != VERSION {
            return Err(io::Error::other(format!(
                "{}: not a swap table of this release (magic {magic:#x}, version {version})",
                self.path.display()
            )));
        }
        Ok(())
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether this process made the file (so no arbiter can have seen it yet).
    pub fn created(&self) -> bool {
        self.created
    }

    fn word(&self, offset: usize) -> &AtomicU64 {
        assert!(offset.is_multiple_of(8) && offset + 8 <= FILE_SIZE);
        // SAFETY: in bounds and aligned (checked above; the mapping is page-aligned), and the
        // mapping lives as long as `self`. Every access to the file is atomic.
        unsafe { &*self.map.as_mut_ptr().add(offset).cast::<AtomicU64>() }
    }

    fn header(&self, offset: usize) -> &AtomicU64 {
        self.word(offset)
    }

    /// `CLOCK_MONOTONIC` ns of the arbiter's latest pass (0: never).
    pub fn heartbeat(&self) -> &AtomicU64 {
        self.header(HEARTBEAT_AT)
    }

    pub fn arbiter_pid(&self) -> &AtomicU64 {
        self.header(ARBITER_PID_AT)
    }

    /// Word `word` of lease `lease`'s record for region device index `index`.
    pub fn get(&self, lease: usize, index: usize, word: Word) -> &AtomicU64 {
        assert!(lease < MAX_PROCESSES && index < MAX_DEVICES);
        self.word(HEADER + (lease * MAX_DEVICES + index) * RECORD + 8 * word as usize)
    }

    /// Zeroes lease `lease`'s records (its owner, when it takes the lease).
    pub fn clear(&self, lease: usize) {
        for index in 0..MAX_DEVICES {
            for word in 0..RECORD / 8 {
                self.word(HEADER + (lease * MAX_DEVICES + index) * RECORD + 8 * word)
                    .store(0, Ordering::Relaxed);
            }
        }
    }

    /// A snapshot of lease `lease`'s record for device index `index`.
    pub fn read(&self, lease: usize, index: usize) -> Record {
        let load = |word| self.get(lease, index, word).load(Ordering::Acquire);
        let state = load(Word::State);
        Record {
            phase: Phase::from_state(state),
            waiting: state & WAITING != 0,
            in_flight: state & IN_FLIGHT != 0,
            pid: (state >> 32) as u32,
            request: load(Word::Request),
            handled: load(Word::Handled),
            active_ns: load(Word::ActiveNs),
            resident: load(Word::Resident),
            swapped: load(Word::Swapped),
            wanted: load(Word::Wanted),
            swap_outs: load(Word::SwapOuts),
            swap_ins: load(Word::SwapIns),
            wait_ns: load(Word::WaitNs),
            out_ns: load(Word::OutNs),
            in_ns: load(Word::InNs),
            pinned: load(Word::Pinned),
            forced: load(Word::Forced),
            amount: load(Word::Amount),
        }
    }

    /// Asks lease `lease` to swap its memory on device index `index` out, all of it: counts its
    /// request word up and wakes the owner's thread that waits on it. Returns the new request
    /// number.
    pub fn request_swap_out(&self, lease: usize, index: usize) -> u64 {
        self.request(lease, index, false, 0)
    }

    /// As [`SwapTable::request_swap_out`], and the process swaps out even if it is busy: its calls
    /// wait at its gate until it is brought back (a waiter must not wait forever on a process that
    /// never idles). It moves at least `amount` bytes, in whole chunks, pinned ones first (0:
    /// everything): a busy process gives up the room a waiter lacks, not all it holds.
    pub fn force_swap_out(&self, lease: usize, index: usize, amount: u64) -> u64 {
        self.request(lease, index, true, amount)
    }

    fn request(&self, lease: usize, index: usize, forced: bool, amount: u64) -> u64 {
        let word = self.get(lease, index, Word::Request);
        let next = word.load(Ordering::Acquire).wrapping_add(1);
        // Before the request is counted up: an owner that sees the request sees its amount.
        self.get(lease, index, Word::Amount).store(amount, Ordering::Release);
        if forced {
            self.get(lease, index, Word::Forced).store(next, Ordering::Release);
        }
        // Only the arbiter counts requests up, so the number it names is the one it makes.
        word.store(next, Ordering::Release);
        futex_wake(word);
        next
    }
}

/// One record as read (every field as written; a hostile tenant may have written anything).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Record {
    pub phase: Phase,
    pub waiting: bool,
    /// A call of the owner waits for its kernels ([`IN_FLIGHT`]).
    pub in_flight: bool,
    pub pid: u32,
    pub request: u64,
    pub handled: u64,
    pub active_ns: u64,
    pub resident: u64,
    pub swapped: u64,
    pub wanted: u64,
    pub swap_outs: u64,
    pub swap_ins: u64,
    pub wait_ns: u64,
    pub out_ns: u64,
    pub in_ns: u64,
    pub pinned: u64,
    pub forced: u64,
    /// Bytes the latest request asks for (0: everything).
    pub amount: u64,
}

impl Record {
    /// Whether the record says anything (a process with swappable memory, or one that waits).
    pub fn in_use(&self) -> bool {
        self.phase != Phase::Idle || self.waiting || self.resident != 0 || self.swapped != 0
    }
}

/// The low 32 bits of `word`, where a futex on it lives (both architectures we build for are
/// little-endian).
fn futex_half(word: &AtomicU64) -> *const u32 {
    const _: () = assert!(cfg!(target_endian = "little"));
    (word as *const AtomicU64).cast::<u32>()
}

/// Sleeps until `word`'s low 32 bits differ from `seen`'s, someone wakes it, or `timeout` passes.
/// Works across processes on the shared mapping (no private futex flag).
pub fn futex_wait(word: &AtomicU64, seen: u64, timeout: Duration) {
    let time = libc::timespec {
        tv_sec: timeout.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: the address is a live, aligned word of the mapping; the kernel only reads it.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            futex_half(word),
            libc::FUTEX_WAIT,
            seen as u32,
            &time as *const libc::timespec,
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

/// Wakes every thread sleeping in [`futex_wait`] on `word`.
pub fn futex_wake(word: &AtomicU64) {
    // SAFETY: as in `futex_wait`.
    unsafe {
        libc::syscall(libc::SYS_futex, futex_half(word), libc::FUTEX_WAKE, i32::MAX, 0usize, 0usize, 0u32);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_creates_the_table_and_the_arbiter_reads_it() {
        let dir = std::env::temp_dir().join(format!("vgpu-swap-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let region = dir.join("cudevshr.cache");
        let table = SwapTable::open_for_process(&region).unwrap();
        assert_eq!(std::fs::metadata(path_for(&region)).unwrap().len(), FILE_SIZE as u64);
        table.get(3, 1, Word::State).store(state_word(Phase::Out, true, 77), Ordering::Release);
        table.get(3, 1, Word::Swapped).store(1 << 30, Ordering::Release);
        let file = File::open(path_for(&region)).unwrap();
        let arbiter = SwapTable::from_checked_file(&file, &path_for(&region));
        // Read-only descriptors cannot be mapped for writing: the arbiter opens read-write.
        assert!(arbiter.is_err());
        let file = OpenOptions::new().read(true).write(true).open(path_for(&region)).unwrap();
        let arbiter = SwapTable::from_checked_file(&file, &path_for(&region)).unwrap();
        let record = arbiter.read(3, 1);
        assert_eq!(
            (record.phase, record.waiting, record.pid, record.swapped),
            (Phase::Out, true, 77, 1 << 30)
        );
        assert_eq!(arbiter.request_swap_out(3, 1), 1);
        assert_eq!(table.get(3, 1, Word::Request).load(Ordering::Acquire), 1);
        // A forced request names its amount; a plain one asks for everything again.
        assert_eq!(arbiter.force_swap_out(3, 1, 5 * CHUNK), 2);
        let record = table.read(3, 1);
        assert_eq!((record.request, record.forced, record.amount), (2, 2, 5 * CHUNK));
        assert_eq!(arbiter.request_swap_out(3, 1), 3);
        let record = table.read(3, 1);
        assert_eq!((record.request, record.forced, record.amount), (3, 2, 0));
        table.clear(3);
        assert!(!arbiter.read(3, 1).in_use());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_file_of_another_kind_is_refused() {
        let dir = std::env::temp_dir().join(format!("vgpu-swap-bad-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let region = dir.join("r.cache");
        std::fs::write(path_for(&region), vec![0xabu8; FILE_SIZE]).unwrap();
        assert!(SwapTable::open_for_process(&region).is_err());
        std::fs::write(path_for(&region), vec![0u8; 100]).unwrap();
        let file = OpenOptions::new().read(true).write(true).open(path_for(&region)).unwrap();
        assert!(SwapTable::from_checked_file(&file, &path_for(&region)).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
