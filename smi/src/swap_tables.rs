//! Containers' swap tables (in their regions, `vgpu_ledger::swap`; an earlier build's beside them)
//! as the node opens them: files a tenant can write, opened and mapped so that nothing in them can
//! steer or stop `vgpu-smi`; and the operator's view of one table.
//!
//! A table is opened as `tenant_file` opens a region (one component at a time from an open
//! directory, no link followed, a regular file only, through the checked descriptor, one name
//! only), read-write because the table is a shared mapping (`SwapTable::from_checked_file`). It is
//! never created here: a container's processes make it.
//!
//! A mapping of a tenant's file has one more hazard than a read: the tenant can truncate the file
//! under it, and touching a page past the new end raises SIGBUS, which would stop `serve` for
//! every container. So every table is mapped under a guard: its address is registered, and a
//! SIGBUS inside a registered table replaces the table's pages with anonymous zero pages (the
//! faulting access is then retried on them; Wayland compositors treat clients' shared buffers so)
//! and marks the table [`MappedTable::cut`]. Whoever reads or writes a table asks `cut()`
//! afterwards and drops a cut table: what it read there were zeros, what it wrote reached nobody.
//! A SIGBUS anywhere else takes the default action.

use std::cell::Cell;
use std::ffi::{OsStr, c_int, c_void};
use std::fs::File;
use std::io::ErrorKind;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Once;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use vgpu_ledger::inspect::{LeaseState, Snapshot};
use vgpu_ledger::region::tenant_file::{Access, Dir, Refusal};
use vgpu_ledger::swap::{REGION_WITH_TABLE, Record, SwapTable, TABLE_SIZE};

/// How fresh the arbiter's heartbeat must be for a process to count on it (a process treats an
/// older one as "no arbiter" and spills through unified memory instead).
pub const ARBITER_FRESH: Duration = Duration::from_secs(3);

/// Tables mapped at once, at most: the arbiter's and one scrape's, for every container a scan
/// reads.
const SLOTS: usize = 2 * crate::containers::MAX_CONTAINERS;
/// Each slot: the address of a mapped table (page-aligned), with [`CUT`] set once it was replaced.
static MAPPED: [AtomicUsize; SLOTS] = [const { AtomicUsize::new(0) }; SLOTS];
const CUT: usize = 1;
static PAGE: AtomicUsize = AtomicUsize::new(4096);
/// The heartbeat word's offset in the file (`vgpu_ledger::swap`'s layout: the header's third
/// word), from which the mapping's start is found.
const HEARTBEAT_AT: usize = 16;

thread_local! {
    /// Set while this thread maps a table it has not registered yet (`from_checked_file` reads the
    /// header before it returns the mapping).
    static OPENING: Cell<bool> = const { Cell::new(false) };
    /// A SIGBUS hit this thread while `OPENING`.
    static FAULTED: Cell<bool> = const { Cell::new(false) };
}

const SHRANK: &str = "the file shrank while it was mapped (truncated by its container)";

/// A container's swap table, mapped under the guard. Dropping it unmaps it.
pub struct MappedTable {
    table: SwapTable,
    slot: usize,
    /// The file's device and inode: which table this is, across openings.
    pub id: (u64, u64),
}

impl MappedTable {
    pub fn table(&self) -> &SwapTable {
        &self.table
    }

    /// The file shrank under the mapping: everything read from it since is zeros. Drop it.
    pub fn cut(&self) -> bool {
        MAPPED[self.slot].load(Ordering::Acquire) & CUT != 0
    }

    pub fn path(&self) -> &Path {
        self.table.path()
    }
}

impl Drop for MappedTable {
    fn drop(&mut self) {
        // Unregistered before the mapping goes (the field is dropped after this).
        MAPPED[self.slot].store(0, Ordering::Release);
    }
}

/// Opens the swap table of the region `region_name` of `dir` (whose path is `region`): `None` when
/// the container has none, else the mapped table or why it was refused. The table is in the region
/// file (`vgpu_ledger::swap`); an earlier build's file beside the region (`<region>.swap`) is read
/// only while the region holds none, and removed once it does, so that the container's folder
/// holds what HAMi's monitors accept (docs/overcommit.md, "The swap table and HAMi's monitors").
pub fn open(dir: &Dir, region_name: &OsStr, region: &Path) -> Option<Result<MappedTable, String>> {
    let mut legacy_name = region_name.to_owned();
    legacy_name.push(".swap");
    let file = match dir.open_file(region_name, Access::ReadWrite) {
        Ok(file) => file,
        Err(Refusal::Io(error)) if error.kind() == ErrorKind::NotFound => return None,
        Err(refusal) => return Some(Err(refusal.to_string())),
    };
    if file.metadata().is_ok_and(|m| m.len() >= REGION_WITH_TABLE as u64) {
        match dir.remove_file(&legacy_name) {
            Ok(()) => eprintln!(
                "vgpu-smi: swap: removed {}, an earlier libvgpu's swap table: the region holds the table now",
                crate::containers::printable(&vgpu_ledger::swap::legacy_path_for(region))
            ),
            Err(Refusal::Io(error)) if error.kind() == ErrorKind::NotFound => {}
            // A link or a folder of that name is the tenant's, never followed nor read.
            Err(_) => {}
        }
        return Some(map(&file, region, SwapTable::from_checked_file));
    }
    let legacy = vgpu_ledger::swap::legacy_path_for(region);
    match dir.open_file(&legacy_name, Access::ReadWrite) {
        Ok(file) => Some(map(&file, &legacy, SwapTable::from_checked_legacy_file)),
        Err(Refusal::Io(error)) if error.kind() == ErrorKind::NotFound => None,
        Err(refusal) => Some(Err(refusal.to_string())),
    }
}

fn map(
    file: &File,
    path: &Path,
    checked: fn(&File, &Path) -> std::io::Result<SwapTable>,
) -> Result<MappedTable, String> {
    install_guard();
    let metadata = file.metadata().map_err(|error| error.to_string())?;
    OPENING.with(|opening| opening.set(true));
    FAULTED.with(|faulted| faulted.set(false));
    let mapped = checked(file, path);
    OPENING.with(|opening| opening.set(false));
    let table = mapped.map_err(|error| without_path(&error.to_string(), path))?;
    if FAULTED.with(Cell::get) {
        return Err(SHRANK.to_owned());
    }
    let base = (table.heartbeat() as *const AtomicU64 as usize).wrapping_sub(HEARTBEAT_AT);
    if !base.is_multiple_of(PAGE.load(Ordering::Relaxed)) {
        // The ledger's layout moved the heartbeat: the guard would not cover the right pages.
        return Err("this vgpu-smi does not know the table's layout".to_owned());
    }
    let slot = MAPPED
        .iter()
        .position(|slot| slot.compare_exchange(0, base, Ordering::AcqRel, Ordering::Relaxed).is_ok())
        .ok_or_else(|| format!("more than {SLOTS} swap tables mapped at once"))?;
    Ok(MappedTable { table, slot, id: (metadata.dev(), metadata.ino()) })
}

/// The ledger's messages name the file; ours name it once, before them.
fn without_path(message: &str, path: &Path) -> String {
    let prefix = format!("{}: ", path.display());
    message.strip_prefix(&prefix).unwrap_or(message).to_owned()
}

fn install_guard() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if page > 0 {
            PAGE.store(page as usize, Ordering::Relaxed);
        }
        // SAFETY: the handler only reads atomics and this thread's flags and calls mmap and
        // sigaction, which are system calls; `sigaction` is plain data.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction =
                on_sigbus as extern "C" fn(c_int, *mut libc::siginfo_t, *mut c_void) as libc::sighandler_t;
            action.sa_flags = libc::SA_SIGINFO;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(libc::SIGBUS, &action, std::ptr::null_mut());
        }
    });
}

/// Anonymous zero pages over `[start, start + len)`, in place of what was mapped there.
fn replace_with_zeros(start: usize, len: usize) -> bool {
    // SAFETY: the range is a mapping of ours (a registered table, or a page of the one being
    // opened); MAP_FIXED replaces it in one step and nothing else lives there.
    let replaced = unsafe {
        libc::mmap(
            start as *mut c_void,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
            -1,
            0,
        )
    };
    replaced != libc::MAP_FAILED
}

extern "C" fn on_sigbus(_: c_int, info: *mut libc::siginfo_t, _: *mut c_void) {
    // SAFETY: the kernel hands an SA_SIGINFO handler a valid siginfo; SIGBUS fills `si_addr`.
    let address = unsafe { (*info).si_addr() } as usize;
    for slot in &MAPPED {
        let word = slot.load(Ordering::Acquire);
        let base = word & !CUT;
        if base != 0 && (base..base + TABLE_SIZE).contains(&address) {
            if replace_with_zeros(base, TABLE_SIZE) {
                slot.fetch_or(CUT, Ordering::AcqRel);
                return;
            }
            break;
        }
    }
    if OPENING.with(Cell::get) {
        // A table being opened: its header was read before it could be registered.
        let page = PAGE.load(Ordering::Relaxed);
        if replace_with_zeros(address & !(page - 1), page) {
            FAULTED.with(|faulted| faulted.set(true));
            return;
        }
    }
    // Not a table's: the default action (the access faults again and ends the process).
    // SAFETY: `sigaction` is plain data; restoring the default disposition is async-signal-safe.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = libc::SIG_DFL;
        libc::sigaction(libc::SIGBUS, &action, std::ptr::null_mut());
    }
}

/// One live process's record for one device, as read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessSwap {
    pub lease: usize,
    /// The lease's pid, as the region has it (the container's pid namespace).
    pub pid: i32,
    /// The region's device index.
    pub index: usize,
    pub record: Record,
}

/// What one table says about a container's live processes, as read at one moment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SwapView {
    pub path: PathBuf,
    /// `CLOCK_MONOTONIC` ns of the arbiter's latest pass (0: never) and its pid on the node.
    pub heartbeat: u64,
    pub arbiter_pid: u64,
    /// `CLOCK_MONOTONIC` ns when the table was read.
    pub read_at: u64,
    /// Records of live leases that say something, by lease and device.
    pub processes: Vec<ProcessSwap>,
}

/// One device's figures, summed over the container's live processes.
#[derive(Debug)]
pub struct DeviceSwap<'a> {
    pub index: usize,
    pub resident: u64,
    pub swapped: u64,
    pub swap_ins: u64,
    pub swap_outs: u64,
    pub wait_ns: u64,
    /// Processes waiting for room.
    pub waiting: usize,
    pub processes: Vec<&'a ProcessSwap>,
}

/// Reads the records of `snapshot`'s live leases from `table` (the words of a dead lease mean
/// nothing, and a live one's are whatever its process wrote: every sum saturates).
pub fn view(table: &MappedTable, snapshot: &Snapshot) -> Result<SwapView, String> {
    let swap = table.table();
    let mut processes = Vec::new();
    for lease in snapshot.leases.iter().filter(|lease| lease.state == LeaseState::Live && lease.alive) {
        for index in 0..snapshot.devices.len() {
            let record = swap.read(lease.lease, index);
            if shown(&record) {
                processes.push(ProcessSwap { lease: lease.lease, pid: lease.pid, index, record });
            }
        }
    }
    let heartbeat = swap.heartbeat().load(Ordering::Acquire);
    let arbiter_pid = swap.arbiter_pid().load(Ordering::Acquire);
    // After the heartbeat: an arbiter on this clock never wrote one later than this.
    let read_at = vgpu_ledger::pace::now();
    if table.cut() {
        return Err(SHRANK.to_owned());
    }
    Ok(SwapView { path: table.path().to_owned(), heartbeat, arbiter_pid, read_at, processes })
}

/// A record worth showing: swappable memory, a wait, or swaps done.
fn shown(record: &Record) -> bool {
    record.in_use() || record.swap_ins != 0 || record.swap_outs != 0 || record.wait_ns != 0
}

impl SwapView {
    /// How long ago the arbiter's latest pass was; `None` if none ever ran, or its heartbeat is
    /// ahead of this clock (not an arbiter on this node's clock).
    pub fn since_arbiter(&self) -> Option<Duration> {
        (self.heartbeat != 0 && self.heartbeat <= self.read_at)
            .then(|| Duration::from_nanos(self.read_at - self.heartbeat))
    }

    /// An arbiter ran lately enough for the container's processes to count on it.
    pub fn arbiter_active(&self) -> bool {
        self.since_arbiter().is_some_and(|since| since < ARBITER_FRESH)
    }

    /// Per region device with a record worth showing, in device order.
    pub fn devices(&self) -> Vec<DeviceSwap<'_>> {
        let mut devices: Vec<DeviceSwap> = Vec::new();
        for process in &self.processes {
            let at = match devices.iter().position(|d| d.index == process.index) {
                Some(at) => at,
                None => {
                    devices.push(DeviceSwap {
                        index: process.index,
                        resident: 0,
                        swapped: 0,
                        swap_ins: 0,
                        swap_outs: 0,
                        wait_ns: 0,
                        waiting: 0,
                        processes: Vec::new(),
                    });
                    devices.len() - 1
                }
            };
            let device = &mut devices[at];
            let record = &process.record;
            device.resident = device.resident.saturating_add(record.resident);
            device.swapped = device.swapped.saturating_add(record.swapped);
            device.swap_ins = device.swap_ins.saturating_add(record.swap_ins);
            device.swap_outs = device.swap_outs.saturating_add(record.swap_outs);
            device.wait_ns = device.wait_ns.saturating_add(record.wait_ns);
            device.waiting += usize::from(record.waiting);
            device.processes.push(process);
        }
        devices.sort_by_key(|d| d.index);
        devices
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::containers::tests::scratch;
    use std::sync::atomic::Ordering;

    /// A region-sized file of zeros in `dir` (all a swap table needs of a region).
    fn region(dir: &Path, name: &str) -> PathBuf {
        let region = dir.join(name);
        std::fs::write(&region, vec![0u8; vgpu_ledger::region::layout::FILE_SIZE]).unwrap();
        region
    }

    #[test]
    fn a_table_truncated_under_the_mapping_is_cut_not_a_crash() {
        let dir = scratch("truncate");
        let region = region(&dir, "r.cache");
        let own = SwapTable::open_for_process(&region).unwrap();
        own.heartbeat().store(7, Ordering::Release);
        let tree = Dir::open(&dir).unwrap();
        let mapped = open(&tree, OsStr::new("r.cache"), &region).unwrap().unwrap();
        assert_eq!(mapped.table().heartbeat().load(Ordering::Acquire), 7);
        assert!(!mapped.cut());
        // The tenant cuts its file: the next access would raise SIGBUS.
        File::options().write(true).open(&region).unwrap().set_len(0).unwrap();
        mapped.table().heartbeat().store(9, Ordering::Release);
        assert_eq!(mapped.table().request_swap_out(5, 1), 1);
        assert!(mapped.cut());
        drop(mapped);
        // A cut region has no table, and links and missing files are refused as ever.
        assert!(open(&tree, OsStr::new("r.cache"), &region).is_none());
        assert!(open(&tree, OsStr::new("none.cache"), &dir.join("none.cache")).is_none());
        std::os::unix::fs::symlink(&region, dir.join("l.cache")).unwrap();
        let refused = open(&tree, OsStr::new("l.cache"), &dir.join("l.cache")).unwrap().err().unwrap();
        assert!(refused.contains("symbolic link"), "{refused}");
        drop(own);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_earlier_builds_table_file_is_read_until_the_region_holds_the_table() {
        let dir = scratch("legacy");
        let region = region(&dir, "r.cache");
        let legacy = vgpu_ledger::swap::legacy_path_for(&region);
        // The earlier build's file: the table's layout from its start.
        let mut bytes = vec![0u8; TABLE_SIZE];
        bytes[..8].copy_from_slice(&vgpu_ledger::swap::MAGIC.to_ne_bytes());
        bytes[8..16].copy_from_slice(&vgpu_ledger::swap::VERSION.to_ne_bytes());
        bytes[16..24].copy_from_slice(&5u64.to_ne_bytes());
        std::fs::write(&legacy, &bytes).unwrap();
        let tree = Dir::open(&dir).unwrap();
        let mapped = open(&tree, OsStr::new("r.cache"), &region).unwrap().unwrap();
        assert_eq!(mapped.path(), legacy.as_path());
        assert_eq!(mapped.table().heartbeat().load(Ordering::Acquire), 5);
        drop(mapped);
        // The region gets its table (a process of this build removes the old file itself; the
        // node removes one made again by a process of the earlier build).
        let own = SwapTable::open_for_process(&region).unwrap();
        assert!(!legacy.exists());
        std::fs::write(&legacy, &bytes).unwrap();
        own.heartbeat().store(8, Ordering::Release);
        let mapped = open(&tree, OsStr::new("r.cache"), &region).unwrap().unwrap();
        assert_eq!(mapped.path(), region.as_path());
        assert_eq!(mapped.table().heartbeat().load(Ordering::Acquire), 8);
        assert!(!legacy.exists());
        drop(mapped);
        drop(own);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
