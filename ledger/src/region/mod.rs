//! The shared region: one memory-mapped file per container, in HAMi-core's v1 layout, so that
//! every process draws on one budget and HAMi's node monitor can read what each process holds.
//!
//! This module owns the file: creating and initialising it exactly once (under `flock`, with its
//! blocks allocated before it is mapped), checking a file someone else made, and the OFD byte locks
//! that tell a live process from a dead one. What the ledger does with it lives in `shared.rs`.
//!
//! The `flock` is held only while a process opens the file (creation, checks, adding a device);
//! nothing that can block happens under it, and no charge or credit ever takes it.

pub mod confined;
pub mod layout;
pub mod tenant_file;

use std::fmt;
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering};

use memmap2::{MmapOptions, MmapRaw};

use layout::*;

/// Why the shared region cannot be used. Each names the file and what is wrong with it.
#[derive(Debug)]
pub enum RegionError {
    Io {
        path: PathBuf,
        what: &'static str,
        error: std::io::Error,
    },
    TooSmall {
        path: PathBuf,
        size: u64,
    },
    ForeignMagic {
        path: PathBuf,
        magic: i32,
    },
    UnknownVersion {
        path: PathBuf,
        major: u32,
    },
    NoLedger {
        path: PathBuf,
    },
    UnknownLedgerVersion {
        path: PathBuf,
        version: u32,
    },
    /// A later release made or extended the region with features this build cannot use safely.
    UnknownRequiredFeatures {
        path: PathBuf,
        unknown: u64,
        created_by: u32,
    },
    NoRoom {
        path: PathBuf,
        free: Option<u64>,
        error: std::io::Error,
    },
    Full {
        path: PathBuf,
    },
}

impl fmt::Display for RegionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RegionError::Io { path, what, error } => write!(f, "{}: cannot {what}: {error}", path.display()),
            RegionError::TooSmall { path, size } => write!(
                f,
                "{}: file is too small ({size} bytes; a v1 region has at least {HAMI_MIN_SIZE})",
                path.display()
            ),
            RegionError::ForeignMagic { path, magic } => {
                write!(f, "{}: bad magic {magic} (expected {HAMI_MAGIC}): not a vGPU region", path.display())
            }
            RegionError::UnknownVersion { path, major } => {
                write!(f, "{}: unknown region major version {major} (expected {HAMI_MAJOR})", path.display())
            }
            RegionError::NoLedger { path } => write!(
                f,
                "{}: region has no libvgpu ledger (made by another implementation, e.g. HAMi-core)",
                path.display()
            ),
            RegionError::UnknownLedgerVersion { path, version } => write!(
                f,
                "{}: unknown libvgpu ledger version {version} (expected {LEDGER_VERSION})",
                path.display()
            ),
            RegionError::UnknownRequiredFeatures { path, unknown, created_by } => write!(
                f,
                "{}: the region needs features {unknown:#x} that libvgpu {} does not know (it was \
                 made by libvgpu {}); run that release or a newer one in this container",
                path.display(),
                env!("CARGO_PKG_VERSION"),
                release_name(*created_by)
            ),
            RegionError::NoRoom { path, free, error } => {
                write!(f, "{}: no room for the {FILE_SIZE}-byte region ({error}; ", path.display())?;
                match free {
                    Some(free) => write!(f, "{free} bytes free on its filesystem)"),
                    None => write!(f, "free space unknown)"),
                }
            }
            RegionError::Full { path } => {
                write!(f, "{}: all {MAX_PROCESSES} process slots are taken by live processes", path.display())
            }
        }
    }
}

/// The name the region gives a device: its 16-byte UUID as NVML spells it, `GPU-` and lowercase
/// hex in 8-4-4-4-12 groups (40 bytes). HAMi's monitor looks devices up by this name.
pub fn uuid_name(uuid: &[u8; 16]) -> [u8; 40] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut name = [0u8; 40];
    name[..4].copy_from_slice(b"GPU-");
    let mut at = 4;
    for (i, byte) in uuid.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            name[at] = b'-';
            at += 1;
        }
        name[at] = HEX[usize::from(byte >> 4)];
        name[at + 1] = HEX[usize::from(byte & 0xf)];
        at += 2;
    }
    name
}

/// What a new region is filled with by the process that creates it.
#[derive(Clone, Debug)]
pub struct InitialContents {
    /// `GPU-…` UUIDs of the devices, by the creator's CUDA ordinal.
    pub uuids: Vec<Vec<u8>>,
    /// Budget per device index, [`UNLIMITED`] for none.
    pub limits: [u64; MAX_DEVICES],
    pub sm_limits: [u64; MAX_DEVICES],
    pub priority: i32,
}

/// An open, validated region file.
pub struct Region {
    _map: MmapRaw,
    base: *mut RegionFile,
    file: File,
    path: PathBuf,
}

// SAFETY: the mapping is shared memory touched only through atomics; the raw pointer is valid for
// the life of `_map`, which `Region` owns.
unsafe impl Send for Region {}
// SAFETY: as above.
unsafe impl Sync for Region {}

/// A raw pointer to one field of the mapping: `field!(region, ledger.used[d])`. Array indexes are
/// bounds-checked as usual.
macro_rules! field {
    ($region:expr, $($place:tt)+) => {{
        let base = $region.base();
        // SAFETY: `base` points to a live mapping that holds at least the bytes of every field
        // read through it (checked when the region was opened); taking an address reads nothing.
        unsafe { &raw mut (*base).$($place)+ }
    }};
}
pub(crate) use field;

/// Field accessors: every access to the mapping goes through these, as atomics.
pub(crate) fn u64_at<'a>(ptr: *mut u64) -> &'a AtomicU64 {
    // SAFETY: callers pass pointers to naturally aligned fields inside the live mapping (layout
    // asserts pin the alignment); other processes access them only atomically too.
    unsafe { AtomicU64::from_ptr(ptr) }
}

pub(crate) fn u32_at<'a>(ptr: *mut u32) -> &'a AtomicU32 {
    // SAFETY: as for `u64_at`.
    unsafe { AtomicU32::from_ptr(ptr) }
}

pub(crate) fn i32_at<'a>(ptr: *mut i32) -> &'a AtomicI32 {
    // SAFETY: as for `u64_at`.
    unsafe { AtomicI32::from_ptr(ptr) }
}

impl Region {
    /// Opens the region at `path`, creating and initialising it if it does not exist or is empty.
    pub fn open(path: &Path, contents: &InitialContents) -> Result<Region, RegionError> {
        Region::open_with(path, contents, |_| {})
    }

    /// As [`Region::open`], running `setup` on the opened region while the file lock is still
    /// held, so that what it writes (devices this process adds) is written by one process at a time.
    pub fn open_with(
        path: &Path,
        contents: &InitialContents,
        setup: impl FnOnce(&Region),
    ) -> Result<Region, RegionError> {
        Region::open_in(path, None, contents, setup)
    }

    /// As [`Region::open_with`]; with `below`, `path` lies in a folder other pods can write, and
    /// is opened under `below` without following any link there ([`confined`]).
    pub fn open_in(
        path: &Path,
        below: Option<&Path>,
        contents: &InitialContents,
        setup: impl FnOnce(&Region),
    ) -> Result<Region, RegionError> {
        let io = |what: &'static str| move |error| RegionError::Io { path: path.to_owned(), what, error };
        let file = match below {
            Some(below) => confined::open(below, path, confined::Make::Missing),
            None => {
                OpenOptions::new().read(true).write(true).create(true).truncate(false).mode(0o666).open(path)
            }
        }
        .map_err(io("open"))?;
        // Whoever holds this lock creates or checks the file; the kernel drops it if they die.
        flock(&file, libc::LOCK_EX).map_err(io("lock"))?;
        let result = Region::open_locked(path, file, Some(contents));
        if let Ok(region) = &result {
            setup(region);
            let _ = flock(&region.file, libc::LOCK_UN);
        }
        result
    }

    /// Opens the existing region at `path` for reading and writing, never creating or initialising
    /// it: a missing, empty or unfinished file is an error. For tools, on a path they trust (a
    /// tenant's file: [`Region::from_checked_file`]); the shared file lock waits for a process
    /// that is creating the file to finish.
    pub fn open_existing(path: &Path) -> Result<Region, RegionError> {
        let io = |what: &'static str| move |error| RegionError::Io { path: path.to_owned(), what, error };
        let file = OpenOptions::new().read(true).write(true).open(path).map_err(io("open"))?;
        Region::from_checked_file(file, path)
    }

    /// As [`Region::open_existing`], for a file the caller opened for reading and writing and
    /// checked itself: node-side tools open a tenant's file without following links
    /// ([`tenant_file`]) and write only through that descriptor. `path` names it in errors. It
    /// must be a regular file. The shared file lock is waited for at most [`LOCK_PATIENCE`]: a
    /// process of the container that holds it longer (only a hostile one does) makes this an
    /// error, not a hang.
    pub fn from_checked_file(file: File, path: &Path) -> Result<Region, RegionError> {
        let io = |what: &'static str| move |error| RegionError::Io { path: path.to_owned(), what, error };
        if !file.metadata().map_err(io("stat"))?.is_file() {
            return Err(io("map")(std::io::Error::other("not a regular file")));
        }
        flock_within(&file, libc::LOCK_SH, LOCK_PATIENCE).map_err(io("lock"))?;
        let result = Region::open_locked(path, file, None);
        if let Ok(region) = &result {
            let _ = flock(&region.file, libc::LOCK_UN);
        }
        result
    }

    /// Checks (and, given `contents` to fill it with, creates) the file under its lock.
    fn open_locked(
        path: &Path,
        file: File,
        contents: Option<&InitialContents>,
    ) -> Result<Region, RegionError> {
        let io = |what: &'static str| move |error| RegionError::Io { path: path.to_owned(), what, error };
        let size = file.metadata().map_err(io("stat"))?.len();
        let fresh = size == 0;
        if fresh && contents.is_none() {
            return Err(RegionError::TooSmall { path: path.to_owned(), size });
        }
        if fresh {
            // Every process of the container must be able to open it, whatever our umask.
            let _ = file.set_permissions(std::fs::Permissions::from_mode(0o666));
            allocate(&file, path)?;
        } else if size < HAMI_MIN_SIZE as u64 {
            return Err(RegionError::TooSmall { path: path.to_owned(), size });
        }
        let map_len = if fresh { FILE_SIZE } else { (size as usize).min(FILE_SIZE) };
        let map = MmapOptions::new().len(map_len).map_raw(&file).map_err(io("map"))?;
        let region = Region { base: map.as_mut_ptr().cast(), _map: map, file, path: path.to_owned() };
        let magic = i32_at(field!(region, magic)).load(Ordering::Acquire);
        // A full-size file whose magic was never stored is one whose creator died mid-way.
        let interrupted = magic == 0 && map_len == FILE_SIZE && region.ledger_magic() == 0;
        if let Some(contents) = contents.filter(|_| fresh || interrupted) {
            region.initialise(contents)?;
        } else {
            region.validate(magic, size)?;
        }
        Ok(region)
    }

    fn ledger_magic(&self) -> u64 {
        u64_at(field!(self, ledger.magic)).load(Ordering::Acquire)
    }

    fn validate(&self, magic: i32, size: u64) -> Result<(), RegionError> {
        let path = self.path.clone();
        if magic != HAMI_MAGIC {
            return Err(RegionError::ForeignMagic { path, magic });
        }
        let major = u32_at(field!(self, major)).load(Ordering::Acquire);
        if major != HAMI_MAJOR {
            return Err(RegionError::UnknownVersion { path, major });
        }
        // The ledger's header (magic, version) is readable once the file reaches past it; another
        // version of libvgpu may have made the file a different size.
        let header_end = (std::mem::offset_of!(RegionFile, ledger) + 16) as u64;
        if size < header_end || self.ledger_magic() != LEDGER_MAGIC {
            return Err(RegionError::NoLedger { path });
        }
        // One generation since release 0.1.0; within it, changes come as feature bits (see
        // `Ledger::required`). A file shorter than ours is not a region of this generation: a
        // later release only ever grows it.
        let version = u32_at(field!(self, ledger.version)).load(Ordering::Acquire);
        if version != LEDGER_VERSION || size < FILE_SIZE as u64 {
            return Err(RegionError::UnknownLedgerVersion { path, version });
        }
        let unknown = u64_at(field!(self, ledger.required)).load(Ordering::Acquire) & !KNOWN_REQUIRED;
        if unknown != 0 {
            let created_by = u32_at(field!(self, ledger.created_by)).load(Ordering::Relaxed);
            return Err(RegionError::UnknownRequiredFeatures { path, unknown, created_by });
        }
        Ok(())
    }

    /// Fills a new file. The HAMi magic is stored last, with release ordering, so a reader that
    /// sees it sees everything else.
    fn initialise(&self, contents: &InitialContents) -> Result<(), RegionError> {
        let devices = contents.uuids.len().min(MAX_DEVICES);
        u64_at(field!(self, device_num)).store(devices as u64, Ordering::Relaxed);
        for (i, uuid) in contents.uuids.iter().take(MAX_DEVICES).enumerate() {
            self.write_uuid(i, uuid);
        }
        for i in 0..MAX_DEVICES {
            let limit = contents.limits[i];
            let hami_limit = if limit == UNLIMITED { 0 } else { limit };
            u64_at(field!(self, limit[i])).store(hami_limit, Ordering::Relaxed);
            u64_at(field!(self, sm_limit[i])).store(contents.sm_limits[i], Ordering::Relaxed);
            u64_at(field!(self, ledger.limit[i])).store(limit, Ordering::Relaxed);
        }
        i32_at(field!(self, priority)).store(contents.priority, Ordering::Relaxed);
        // Compute limits are enforced until a monitor says the device is not shared.
        i32_at(field!(self, utilization_switch)).store(1, Ordering::Relaxed);
        u32_at(field!(self, ledger.version)).store(LEDGER_VERSION, Ordering::Relaxed);
        u32_at(field!(self, ledger.created_by)).store(RELEASE, Ordering::Relaxed);
        u64_at(field!(self, ledger.compatible)).store(KNOWN_COMPATIBLE, Ordering::Relaxed);
        u64_at(field!(self, ledger.required)).store(KNOWN_REQUIRED, Ordering::Relaxed);
        u64_at(field!(self, ledger.magic)).store(LEDGER_MAGIC, Ordering::Release);
        u32_at(field!(self, major)).store(HAMI_MAJOR, Ordering::Relaxed);
        u32_at(field!(self, minor)).store(HAMI_MINOR, Ordering::Relaxed);
        i32_at(field!(self, magic)).store(HAMI_MAGIC, Ordering::Release);
        Ok(())
    }

    /// Writes device `index`'s UUID string, NUL-padded.
    pub fn write_uuid(&self, index: usize, uuid: &[u8]) {
        let base = field!(self, uuids[index]).cast::<u8>();
        let text = &uuid[..uuid.len().min(UUID_LEN - 1)];
        for i in 0..UUID_LEN {
            let byte = text.get(i).copied().unwrap_or(0);
            // SAFETY: `base + i` lies inside the 96-byte UUID field of the mapping.
            unsafe { base.add(i).write_volatile(byte) };
        }
    }

    /// Reads device `index`'s UUID string, without the padding.
    pub fn read_uuid(&self, index: usize) -> Vec<u8> {
        let base = field!(self, uuids[index]).cast::<u8>();
        // SAFETY: `base + i` lies inside the 96-byte UUID field of the mapping.
        (0..UUID_LEN).map(|i| unsafe { base.add(i).read_volatile() }).take_while(|&b| b != 0).collect()
    }

    /// The start of the mapping; use [`field!`] to reach into it.
    pub fn base(&self) -> *mut RegionFile {
        self.base
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Gives the file back its full size if someone truncated it under us: past its end, a
    /// mapping faults (SIGBUS) in every process that touches it. The blocks come back zeroed, so
    /// the bookkeeping restarts (the next process to open the file initialises it again). True if
    /// the file had to be restored.
    pub fn restore_size(&self) -> bool {
        let size = self.file.metadata().map(|m| m.len()).unwrap_or(FILE_SIZE as u64);
        if size >= FILE_SIZE as u64 {
            return false;
        }
        // SAFETY: a valid open descriptor; offset and length are in range.
        let status = unsafe { libc::posix_fallocate(self.file.as_raw_fd(), 0, FILE_SIZE as libc::off_t) };
        tracing::error!(
            "{}: the region file was truncated to {size} bytes while in use; {}",
            self.path.display(),
            if status == 0 {
                "restored its size (its bookkeeping starts again)"
            } else {
                "could not restore it"
            }
        );
        true
    }

    /// The descriptor used for lease locks.
    pub fn fd(&self) -> i32 {
        self.file.as_raw_fd()
    }
}

/// The budgets in the region at `path`, read without mapping, locking or changing it; `None`
/// when there is no region there (no file, not a regular file, too short, not initialised).
/// A library asks before it attaches, to know whether anything of its container is budgeted.
pub fn peek(path: &Path) -> Option<crate::config::RegionBudgets> {
    let file =
        OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC).open(path).ok()?;
    peek_file(&file)
}

/// As [`peek`], for a file already opened (a region in a folder other pods can write, opened
/// through [`confined`]).
pub fn peek_file(file: &File) -> Option<crate::config::RegionBudgets> {
    use std::os::unix::fs::FileExt;
    let meta = file.metadata().ok()?;
    if !meta.is_file() || meta.len() < HAMI_MIN_SIZE as u64 {
        return None;
    }
    let mut header = [0u8; std::mem::offset_of!(RegionFile, slots)];
    file.read_exact_at(&mut header, 0).ok()?;
    let word = |at: usize| u64::from_le_bytes(header[at..at + 8].try_into().expect("8 bytes"));
    if i32::from_le_bytes(header[..4].try_into().expect("4 bytes")) != HAMI_MAGIC {
        return None;
    }
    let mut priority = [0u8; 4];
    file.read_exact_at(&mut priority, std::mem::offset_of!(RegionFile, priority) as u64).ok()?;
    // The overcommit mask counts only where the feature bit announces it (a short or older file:
    // none).
    let ledger = std::mem::offset_of!(RegionFile, ledger);
    let mut words = [0u8; 8 * 3];
    let compatible_at = ledger + std::mem::offset_of!(layout::Ledger, compatible);
    let overcommit_at = ledger + std::mem::offset_of!(layout::Ledger, overcommit);
    let overcommit = file.read_exact_at(&mut words[..8], compatible_at as u64).is_ok()
        && u64::from_le_bytes(words[..8].try_into().expect("8 bytes")) & layout::COMPATIBLE_OVERCOMMIT != 0
        && file.read_exact_at(&mut words[8..16], overcommit_at as u64).is_ok()
        && u64::from_le_bytes(words[8..16].try_into().expect("8 bytes")) != 0;
    Some(crate::config::RegionBudgets {
        limits: std::array::from_fn(|d| word(std::mem::offset_of!(RegionFile, limit) + 8 * d)),
        shares: std::array::from_fn(|d| word(std::mem::offset_of!(RegionFile, sm_limit) + 8 * d)),
        priority: i32::from_le_bytes(priority),
        overcommit,
    })
}

/// Gives a new, empty file its full size with every block allocated, so that the mapping can never
/// fault for want of room (a sparse file on a full filesystem kills the process with SIGBUS when a
/// page is first touched). No room: an error naming the path and the free space.
fn allocate(file: &File, path: &Path) -> Result<(), RegionError> {
    // SAFETY: a valid open descriptor; offset and length are in range.
    let status = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, FILE_SIZE as libc::off_t) };
    if status == 0 {
        return Ok(());
    }
    let error = std::io::Error::from_raw_os_error(status);
    // Leave the file empty: the next process tries again rather than mapping a short file.
    let _ = file.set_len(0);
    // SAFETY: `statvfs` is plain data and `fstatvfs` fills it for an open descriptor.
    let free = unsafe {
        let mut stat: libc::statvfs = std::mem::zeroed();
        (libc::fstatvfs(file.as_raw_fd(), &mut stat) == 0)
            .then(|| stat.f_bavail as u64 * stat.f_frsize as u64)
    };
    Err(RegionError::NoRoom { path: path.to_owned(), free, error })
}

/// How long a tool waits for a region's file lock: creating a region holds it for milliseconds.
pub const LOCK_PATIENCE: std::time::Duration = std::time::Duration::from_millis(500);

/// `flock`, giving up after `patience`.
fn flock_within(file: &File, operation: i32, patience: std::time::Duration) -> std::io::Result<()> {
    let deadline = std::time::Instant::now() + patience;
    loop {
        match flock(file, operation | libc::LOCK_NB) {
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {
                if std::time::Instant::now() >= deadline {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::WouldBlock,
                        format!("another process has held its lock for over {} ms", patience.as_millis()),
                    ));
                }
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            other => return other,
        }
    }
}

fn flock(file: &File, operation: i32) -> std::io::Result<()> {
    loop {
        // SAFETY: a valid open descriptor and a flock operation constant.
        if unsafe { libc::flock(file.as_raw_fd(), operation) } == 0 {
            return Ok(());
        }
        let error = std::io::Error::last_os_error();
        if error.kind() != std::io::ErrorKind::Interrupted {
            return Err(error);
        }
    }
}

fn byte_lock(kind: i16, at: i64) -> libc::flock {
    // SAFETY: `flock` is plain old data; all-zero is a valid value to fill in.
    let mut lock: libc::flock = unsafe { std::mem::zeroed() };
    lock.l_type = kind;
    lock.l_whence = libc::SEEK_SET as i16;
    lock.l_start = at;
    lock.l_len = 1;
    lock
}

fn lease_lock(kind: i16, lease: usize) -> libc::flock {
    byte_lock(kind, LEASE_LOCK_BASE + lease as i64)
}

/// Takes the OFD lock that marks lease `lease` as ours; `false` if another process holds it.
pub fn claim_lease(fd: i32, lease: usize) -> bool {
    let mut lock = lease_lock(libc::F_WRLCK as i16, lease);
    // SAFETY: `fd` is open and `lock` is a valid flock record.
    unsafe { libc::fcntl(fd, libc::F_OFD_SETLK, &mut lock) == 0 }
}

/// Drops our OFD lock on lease `lease`.
pub fn release_lease(fd: i32, lease: usize) {
    let mut lock = lease_lock(libc::F_UNLCK as i16, lease);
    // SAFETY: `fd` is open and `lock` is a valid flock record.
    unsafe { libc::fcntl(fd, libc::F_OFD_SETLK, &mut lock) };
}

/// Whether some other open file description holds lease `lease`'s lock, i.e. its owner lives.
pub fn lease_is_held(fd: i32, lease: usize) -> bool {
    let mut lock = lease_lock(libc::F_WRLCK as i16, lease);
    // SAFETY: `fd` is open and `lock` is a valid flock record the kernel fills in.
    let status = unsafe { libc::fcntl(fd, libc::F_OFD_GETLK, &mut lock) };
    // If we cannot tell, assume alive: wrongly freeing a live process's bytes would overshoot.
    status != 0 || lock.l_type != libc::F_UNLCK as i16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_are_named_as_nvml_spells_them() {
        let uuid = [0xfa, 0xce, 0, 0, 0, 0, 0x4e, 0, 0x80, 0, 0, 0, 0, 0, 0, 0x0a];
        assert_eq!(&uuid_name(&uuid), b"GPU-face0000-0000-4e00-8000-00000000000a");
    }
}
