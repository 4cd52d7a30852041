//! The swap table: the part of a container's region file, past everything HAMi's monitor and
//! release 0.1.0 read, through which the node's swap arbiter (`vgpu-smi serve --swap`) and the
//! container's processes agree who holds the card (docs/overcommit.md, "Swapping whole
//! processes").
//!
//! It lives in the region file because HAMi's monitors judge a container by the entries of its
//! folder: release-v2.9 and volcano-vgpu-device-plugin drop a folder with more than the region and
//! the library's mount point in it (docs/overcommit.md, "HAMi's monitors and the container
//! folder"). The process that first needs the table grows the region to [`REGION_WITH_TABLE`]
//! bytes under the region's `flock`, writes the table's magic and only then sets the ledger's
//! compatible feature bit `COMPATIBLE_SWAP_TABLE` (docs/shared-ledger.md, "More room"). Builds
//! before this one kept the table in a file of its own beside the region (`<region>.swap`,
//! [`legacy_path_for`]); a process of this build that opens the table removes that file: a process
//! of such a build that still runs keeps its own mapping, no longer reaches an arbiter, and spills
//! through unified memory once the heartbeat it sees goes stale, as with no arbiter at all.
//!
//! Containers cannot see each other, so no process can decide alone to give the card up. Each
//! process says in its record what it holds on the card, what it has moved to host memory, when it
//! last put work on the GPU and whether it waits for room; the arbiter reads every container's
//! table and asks the least recently active process to swap out. The arbiter writes only the
//! header's heartbeat and a record's `request`, `forced` and `amount` words; everything else is
//! written by the record's owner. Every word is a native-endian `u64`, only ever accessed
//! atomically. Offsets below are from the table's start, [`TABLE_AT`] in the region file.
//!
//! | offset | field | written by |
//! |---|---|---|
//! | 0 | magic `VGPUSWP1` | the process that adds the table |
//! | 8 | version, 1 | the process that adds the table |
//! | 16 | heartbeat: `CLOCK_MONOTONIC` ns of the arbiter's latest pass (0: never) | the arbiter |
//! | 24 | the arbiter's pid, as the node sees it | the arbiter |
//! | 64 + 128·(16·k + i) | lease `k`'s record for region device index `i`: the words below | |
//!
//! A record's words ([`Word`]): `state` (phase in bits 0–7, [`WAITING`] bit 8, [`IN_FLIGHT`] bit 9,
//! the owner's pid in bits 32–63), `request` (swap-out requests, counted up by the arbiter), `handled` (the request
//! the owner last acted on), `active_ns`, `resident`, `swapped`, `wanted`, `swap_outs`,
//! `swap_ins`, `wait_ns`, `out_ns`, `in_ns`, `pinned`, `forced`, `amount`, `unswappable` (words
//! 0–15 of 16). A record belongs to the lease of the same index in the region: it is meaningful
//! only while that lease is live, and a process that takes the lease clears its records before it
//! writes them. `amount` was added to version 1 without changing the version: a process that does
//! not know the word ignores it and moves everything, as before, and 0 (the cleared word) means
//! everything. `IN_FLIGHT` was added the same way: a process that does not set it is judged by
//! `active_ns` alone, as before, and `unswappable` too (0 from a process that does not write it).
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
use crate::region::layout::{self, COMPATIBLE_SWAP_TABLE, Ledger, MAX_PROCESSES, RegionFile};

pub const MAGIC: u64 = u64::from_le_bytes(*b"VGPUSWP1");
pub const VERSION: u64 = 1;
const HEADER: usize = 64;
const RECORD: usize = 128;
/// The table's size: the header and one record per lease and device.
pub const TABLE_SIZE: usize = HEADER + MAX_PROCESSES * MAX_DEVICES * RECORD;
/// Where the table starts in the region file: past the ledger, on a 64 KiB boundary (the largest
/// page size of the kernels we run on), so that the table's pages are its own.
pub const TABLE_AT: usize = layout::FILE_SIZE.next_multiple_of(64 << 10);
/// The region file's size once it holds the table.
pub const REGION_WITH_TABLE: usize = TABLE_AT + TABLE_SIZE;
/// Where the ledger's compatible feature word is in the region file.
const COMPATIBLE_AT: usize =
    std::mem::offset_of!(RegionFile, ledger) + std::mem::offset_of!(Ledger, compatible);
const _: () = assert!(8 * (Word::Unswappable as usize + 1) <= RECORD);
// docs/overcommit.md, docs/shared-ledger.md and ci/gpu/swap.py name these offsets.
const _: () = assert!(TABLE_AT == 2_162_688 && REGION_WITH_TABLE == 4_259_904);

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
    /// Bytes of the owner's device memory under the swap that cannot leave the card: its own VMM
    /// handles exported to another process, or mapped twice or in part.
    Unswappable,
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

/// Where builds before this one kept the table of the region at `region`: a file beside it.
pub fn legacy_path_for(region: &Path) -> PathBuf {
    let mut name = region.as_os_str().to_owned();
    name.push(".swap");
    PathBuf::from(name)
}

/// A swap table, mapped with the region file that holds it (from the file's start, so the
/// ledger's feature word is in reach; only the pages touched are ever read in).
pub struct SwapTable {
    map: MmapRaw,
    /// Where the table starts in the mapping: [`TABLE_AT`] in a region, 0 in an earlier build's
    /// file of its own.
    at: usize,
    /// The path of the file that holds it.
    path: PathBuf,
    /// This process added the table to the region.
    created: bool,
}

// SAFETY: the mapping is only ever accessed through atomics.
unsafe impl Send for SwapTable {}
// SAFETY: as above.
unsafe impl Sync for SwapTable {}

impl SwapTable {
    /// Opens the table in the region file at `region` (a process of the container), adding it if
    /// the region has none yet: the file grows under its `flock`, its new blocks allocated before
    /// anything maps them (a full filesystem is an error here rather than SIGBUS later), and the
    /// feature bit is set once the table's magic is written. A table file of an earlier build
    /// beside the region is removed (this module's doc says why).
    pub fn open_for_process(region: &Path) -> io::Result<SwapTable> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(region)?;
        if !file.metadata()?.is_file() {
            return Err(io::Error::other("the region is not a regular file"));
        }
        let _lock = Flock::exclusive(&file)?;
        let size = file.metadata()?.len();
        if size < layout::FILE_SIZE as u64 {
            return Err(io::Error::other(format!("the region is {size} bytes, shorter than a region")));
        }
        if size < REGION_WITH_TABLE as u64 {
            // SAFETY: a plain system call on our own descriptor; the range is the grown file.
            let status =
                unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, REGION_WITH_TABLE as libc::off_t) };
            if status != 0 {
                return Err(io::Error::from_raw_os_error(status));
            }
        }
        let mut table = SwapTable::map(&file, region.to_owned(), REGION_WITH_TABLE, TABLE_AT)?;
        // New bytes are zero: the table gets its identity; a table with another one is not ours.
        let magic = table.header(MAGIC_AT);
        if magic.compare_exchange(0, MAGIC, Ordering::AcqRel, Ordering::Acquire).is_ok() {
            table.header(VERSION_AT).store(VERSION, Ordering::Release);
            table.created = true;
        }
        table.check()?;
        table.compatible().fetch_or(COMPATIBLE_SWAP_TABLE, Ordering::Release);
        remove_legacy(region);
        Ok(table)
    }

    /// Maps the table of a region file the caller opened (read-write) and checked: the arbiter
    /// opens a tenant's file without following links. The file must be a regular file that holds
    /// a table of this release's magic and version.
    pub fn from_checked_file(file: &File, path: &Path) -> io::Result<SwapTable> {
        let metadata = file.metadata()?;
        if !metadata.is_file() || metadata.len() < REGION_WITH_TABLE as u64 {
            return Err(io::Error::other(format!(
                "the region holds no swap table ({} bytes; {REGION_WITH_TABLE} with one)",
                metadata.len()
            )));
        }
        let table = SwapTable::map(file, path.to_owned(), REGION_WITH_TABLE, TABLE_AT)?;
        table.check()?;
        Ok(table)
    }

    /// Maps the table file of an earlier build (`<region>.swap`, [`legacy_path_for`]) the caller
    /// opened read-write and checked: the arbiter still serves a container whose processes are all
    /// of that build. Its layout is the table's, from the file's start.
    pub fn from_checked_legacy_file(file: &File, path: &Path) -> io::Result<SwapTable> {
        let metadata = file.metadata()?;
        if !metadata.is_file() || metadata.len() < TABLE_SIZE as u64 {
            return Err(io::Error::other(format!(
                "not a swap table ({} bytes; {TABLE_SIZE} expected)",
                metadata.len()
            )));
        }
        let table = SwapTable::map(file, path.to_owned(), TABLE_SIZE, 0)?;
        table.check()?;
        Ok(table)
    }

    fn map(file: &File, path: PathBuf, len: usize, at: usize) -> io::Result<SwapTable> {
        let map = MmapOptions::new().len(len).map_raw(file)?;
        Ok(SwapTable { map, at, path, created: false })
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

    /// The ledger's compatible feature word (a table in a region only).
    fn compatible(&self) -> &AtomicU64 {
        assert_eq!(self.at, TABLE_AT, "a table in a region");
        // SAFETY: in bounds and 8-byte aligned (the ledger's layout asserts its offsets), the
        // mapping lives as long as `self`, and every process touches the word atomically.
        unsafe { &*self.map.as_mut_ptr().add(COMPATIBLE_AT).cast::<AtomicU64>() }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether this process added the table (so no arbiter can have seen it yet).
    pub fn created(&self) -> bool {
        self.created
    }

    /// Word at `offset` from the table's start.
    fn word(&self, offset: usize) -> &AtomicU64 {
        assert!(offset.is_multiple_of(8) && offset + 8 <= TABLE_SIZE);
        // SAFETY: in bounds and aligned (checked above; the mapping is page-aligned and so is
        // the table's start), and the mapping lives as long as `self`. Every access to the table is
        // atomic.
        unsafe { &*self.map.as_mut_ptr().add(self.at + offset).cast::<AtomicU64>() }
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
            unswappable: load(Word::Unswappable),
        }
    }

    /// Asks lease `lease` to swap its memory on device index `index` out, all of it: counts its
    /// request word up and wakes the owner's thread that waits on it. Returns the new request
    /// number.
    pub fn request_swap_out(&self, lease: usize, index: usize) -> u64 {
        self.request(lease, index, false, 0)
    }

    /// As [`SwapTable::request_swap_out`], for at least `amount` bytes in whole chunks rather
    /// than everything (0: everything): an idle process that gives way to a higher priority moves
    /// only the room its waiter lacks. A process of a build that reads `amount` only on a forced
    /// request moves everything, as before.
    pub fn request_room(&self, lease: usize, index: usize, amount: u64) -> u64 {
        self.request(lease, index, false, amount)
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

/// The region file's `flock`, held while the table is added, released when dropped.
struct Flock<'a>(&'a File);

impl<'a> Flock<'a> {
    fn exclusive(file: &'a File) -> io::Result<Flock<'a>> {
        loop {
            // SAFETY: a valid open descriptor and a flock operation constant.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } == 0 {
                return Ok(Flock(file));
            }
            let error = io::Error::last_os_error();
            if error.kind() != io::ErrorKind::Interrupted {
                return Err(error);
            }
        }
    }
}

impl Drop for Flock<'_> {
    fn drop(&mut self) {
        // SAFETY: as above.
        unsafe { libc::flock(self.0.as_raw_fd(), libc::LOCK_UN) };
    }
}

/// Removes the table file an earlier build kept beside the region at `region`, if it is one (a
/// regular file, not followed if it is a link): the container's folder then holds the region
/// alone again.
fn remove_legacy(region: &Path) {
    let legacy = legacy_path_for(region);
    match std::fs::symlink_metadata(&legacy) {
        Ok(metadata) if metadata.is_file() => match std::fs::remove_file(&legacy) {
            Ok(()) => tracing::info!(
                "{}: removed the swap table file of an earlier libvgpu; the table is in the region now",
                legacy.display()
            ),
            Err(error) => {
                tracing::warn!("{}: cannot remove the old swap table file: {error}", legacy.display())
            }
        },
        _ => {}
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
    /// Bytes that cannot leave the card ([`Word::Unswappable`]).
    pub unswappable: u64,
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

    /// A scratch folder holding a region-sized file of zeros (all the table needs of a region).
    fn region_in(name: &str) -> (PathBuf, PathBuf) {
        let dir = std::env::temp_dir().join(format!("vgpu-swap-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let region = dir.join("cudevshr.cache");
        std::fs::write(&region, vec![0u8; layout::FILE_SIZE]).unwrap();
        (dir, region)
    }

    #[test]
    fn a_process_adds_the_table_to_the_region_and_the_arbiter_reads_it() {
        let (dir, region) = region_in("table");
        let table = SwapTable::open_for_process(&region).unwrap();
        assert!(table.created());
        assert_eq!(std::fs::metadata(&region).unwrap().len(), REGION_WITH_TABLE as u64);
        // The feature bit announces it, and the folder holds the region alone.
        let bytes = std::fs::read(&region).unwrap();
        let compatible = u64::from_ne_bytes(bytes[COMPATIBLE_AT..COMPATIBLE_AT + 8].try_into().unwrap());
        assert_eq!(compatible & COMPATIBLE_SWAP_TABLE, COMPATIBLE_SWAP_TABLE);
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
        // A second process finds the table there.
        assert!(!SwapTable::open_for_process(&region).unwrap().created());
        table.get(3, 1, Word::State).store(state_word(Phase::Out, true, 77), Ordering::Release);
        table.get(3, 1, Word::Swapped).store(1 << 30, Ordering::Release);
        let file = File::open(&region).unwrap();
        let arbiter = SwapTable::from_checked_file(&file, &region);
        // Read-only descriptors cannot be mapped for writing: the arbiter opens read-write.
        assert!(arbiter.is_err());
        let file = OpenOptions::new().read(true).write(true).open(&region).unwrap();
        let arbiter = SwapTable::from_checked_file(&file, &region).unwrap();
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
    fn an_earlier_builds_table_file_beside_the_region_is_removed() {
        let (dir, region) = region_in("legacy");
        std::fs::write(legacy_path_for(&region), vec![0u8; TABLE_SIZE]).unwrap();
        // A link of that name is never followed, nor removed.
        let (link_dir, link_region) = region_in("legacy-link");
        std::os::unix::fs::symlink(&region, legacy_path_for(&link_region)).unwrap();
        SwapTable::open_for_process(&region).unwrap();
        SwapTable::open_for_process(&link_region).unwrap();
        assert!(!legacy_path_for(&region).exists());
        assert!(std::fs::symlink_metadata(legacy_path_for(&link_region)).is_ok());
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
        std::fs::remove_dir_all(&link_dir).unwrap();
    }

    #[test]
    fn a_table_of_another_kind_or_a_short_region_is_refused() {
        let (dir, region) = region_in("bad");
        let mut bytes = vec![0u8; REGION_WITH_TABLE];
        bytes[TABLE_AT..TABLE_AT + 8].copy_from_slice(&0xabab_abab_abab_abab_u64.to_ne_bytes());
        std::fs::write(&region, &bytes).unwrap();
        assert!(SwapTable::open_for_process(&region).is_err());
        std::fs::write(&region, vec![0u8; 100]).unwrap();
        assert!(SwapTable::open_for_process(&region).is_err());
        let file = OpenOptions::new().read(true).write(true).open(&region).unwrap();
        assert!(SwapTable::from_checked_file(&file, &region).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
