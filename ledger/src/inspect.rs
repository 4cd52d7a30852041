//! A read-only look at a region file, for tools (`vgpu-smi`): each device's budget and usage, each
//! process's lease and whether its owner lives, the HAMi slots the monitor reads, and the
//! monitor's switches.
//!
//! [`inspect`] and [`inspect_file`] copy at most the region's size of the file with `pread`; they
//! never write, create, map or lock it. Liveness is asked of the kernel as the library asks it (an OFD lock query
//! on the lease's byte, which works on a read-only descriptor). The copy is not one atomic
//! instant: a value that changes while the file is read may come from a moment earlier or later
//! than its neighbours, as with any reader that does not stop the container.
//!
//! Closing the file wakes the watcher threads of the container's live processes (they sleep on
//! the file's close events), which then reclaim leases whose owners died: a dead lease seldom
//! outlives the next look at a container that still has a live process.

use std::fmt;
use std::fs::File;
use std::io::ErrorKind;
use std::mem::offset_of;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use crate::region::layout::{
    BYTE_BITS, BYTE_MASK, COMPATIBLE_CONTEXT_COST_EXACT, COMPATIBLE_OVERCOMMIT, CONTEXT_COST_KNOWN,
    DeviceMemory, DeviceUtil, FILE_SIZE, HAMI_MAGIC, HAMI_MAJOR, HAMI_MIN_SIZE, HamiSlot, LEASE_FREE,
    LEASE_LIVE, LEASE_REAPING, LEDGER_MAGIC, LEDGER_VERSION, Lease, Ledger, MAX_DEVICES, MAX_PROCESSES,
    OWNER_COUNTS_SPILLABLE, OWNER_FOLLOWS_RESIZE, RegionFile, UNLIMITED, UUID_LEN, release_name,
};
use crate::region::tenant_file::{self, Access};

/// Why a file cannot be shown as a region. Each names the file.
#[derive(Debug)]
pub enum InspectError {
    /// No file at the path.
    Missing { path: PathBuf },
    /// The file exists but cannot be opened or read (permissions, a directory, an I/O error).
    Unreadable { path: PathBuf, error: std::io::Error },
    /// Shorter than what its header says it should hold: `needed` bytes for `what`.
    Truncated { path: PathBuf, size: u64, needed: u64, what: &'static str },
    /// Full-sized but its magic was never stored: its creator has not finished, or died mid-way
    /// (the next process that opens it initialises it).
    NotInitialised { path: PathBuf },
    /// Not a vGPU region at all.
    NotARegion { path: PathBuf, magic: i32 },
    /// A HAMi region of a major version other than 1.
    UnknownHamiVersion { path: PathBuf, major: u32 },
    /// A HAMi v1 region without libvgpu's ledger past the HAMi area (HAMi-core made it).
    NoLedger { path: PathBuf },
    /// libvgpu's ledger, of a version this build does not know.
    UnknownLedgerVersion { path: PathBuf, version: u32 },
}

impl InspectError {
    pub fn path(&self) -> &Path {
        match self {
            InspectError::Missing { path }
            | InspectError::Unreadable { path, .. }
            | InspectError::Truncated { path, .. }
            | InspectError::NotInitialised { path }
            | InspectError::NotARegion { path, .. }
            | InspectError::UnknownHamiVersion { path, .. }
            | InspectError::NoLedger { path }
            | InspectError::UnknownLedgerVersion { path, .. } => path,
        }
    }

    /// A short stable name for machines (`vgpu-smi --json`, metrics labels).
    pub fn kind(&self) -> &'static str {
        match self {
            InspectError::Missing { .. } => "missing",
            InspectError::Unreadable { .. } => "unreadable",
            InspectError::Truncated { .. } => "truncated",
            InspectError::NotInitialised { .. } => "not_initialised",
            InspectError::NotARegion { .. } => "not_a_region",
            InspectError::UnknownHamiVersion { .. } => "unknown_hami_version",
            InspectError::NoLedger { .. } => "no_ledger",
            InspectError::UnknownLedgerVersion { .. } => "unknown_ledger_version",
        }
    }

    /// Whether the file could not be read at all, as opposed to read and found wrong.
    pub fn is_unreadable(&self) -> bool {
        matches!(self, InspectError::Missing { .. } | InspectError::Unreadable { .. })
    }
}

impl fmt::Display for InspectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let path = self.path().display();
        match self {
            InspectError::Missing { .. } => write!(f, "{path}: no such file"),
            InspectError::Unreadable { error, .. } => write!(f, "{path}: cannot read: {error}"),
            InspectError::Truncated { size: 0, .. } => {
                write!(f, "{path}: file is empty (its creator found no room, or nothing has written it)")
            }
            InspectError::Truncated { size, needed, what, .. } => {
                write!(f, "{path}: truncated: {size} bytes, {what} needs {needed}")
            }
            InspectError::NotInitialised { .. } => write!(
                f,
                "{path}: not initialised (magic 0): its creator has not finished or died mid-way; \
                 the next process to open it initialises it"
            ),
            InspectError::NotARegion { magic, .. } => {
                write!(f, "{path}: not a vGPU region (magic {magic}, expected {HAMI_MAGIC})")
            }
            InspectError::UnknownHamiVersion { major, .. } => {
                write!(f, "{path}: HAMi region of major version {major}; this build reads {HAMI_MAJOR}")
            }
            InspectError::NoLedger { .. } => write!(
                f,
                "{path}: a HAMi v1 region without libvgpu's ledger (made by HAMi-core or another \
                 implementation)"
            ),
            InspectError::UnknownLedgerVersion { version, .. } => {
                let age = if *version > LEDGER_VERSION { "newer" } else { "older" };
                write!(
                    f,
                    "{path}: libvgpu ledger version {version} ({age} than this build's {LEDGER_VERSION}); \
                     use the vgpu-smi of the libvgpu that made it"
                )
            }
        }
    }
}

impl std::error::Error for InspectError {}

/// What one HAMi slot says about one device, or such figures summed over slots.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SlotUsage {
    /// Bytes of the process's contexts.
    pub context: u64,
    /// Bytes of loaded modules (HAMi-core's; libvgpu leaves it 0).
    pub module: u64,
    /// Bytes of everything else the process charged (buffers).
    pub data: u64,
    /// HAMi-core's `offset` field (libvgpu leaves it 0).
    pub offset: u64,
    /// All the process's bytes on the device.
    pub total: u64,
    /// The process's measured share of the device's time, in percent.
    pub sm_util: u64,
}

impl SlotUsage {
    fn add(&mut self, other: &SlotUsage) {
        self.context = self.context.saturating_add(other.context);
        self.module = self.module.saturating_add(other.module);
        self.data = self.data.saturating_add(other.data);
        self.offset = self.offset.saturating_add(other.offset);
        self.total = self.total.saturating_add(other.total);
        self.sm_util = self.sm_util.saturating_add(other.sm_util);
    }
}

/// One device of the region (a region device index, which is the creator's CUDA ordinal).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceView {
    pub index: usize,
    /// `GPU-…`, as the creating process's driver spelt it.
    pub uuid: String,
    /// The ledger's budget; `None` when the device has none.
    pub budget: Option<u64>,
    /// The limit in the HAMi header, as HAMi's monitor reads it (0: none).
    pub hami_limit: u64,
    /// The container's charged bytes, as the ledger counts them.
    pub used: u64,
    /// Dead leases reclaimed with an update in flight, not yet settled by a recount.
    pub suspect: u64,
    /// What a new context costs here, once a process has measured it.
    pub context_cost: Option<u64>,
    /// `context_cost` was measured from a process's own NVML figure; otherwise it is a
    /// device-wide difference (release 0.1.0's, or a process NVML did not list), which a neighbour
    /// could have skewed.
    pub context_cost_exact: bool,
    /// Compute share in percent (0 or 100: none).
    pub sm_limit: u64,
    /// The HAMi slots summed as HAMi's monitor sums them (every slot below `proc_num`).
    pub slots: SlotUsage,
    /// Memory overcommit is on for this device (`CUDA_OVERSUBSCRIBE`, docs/overcommit.md).
    pub overcommit: bool,
    /// Of `used`, the bytes the live processes hold as spillable managed memory.
    pub spillable: u64,
    /// Some process of the container has allocated spillable memory here.
    pub spilled: bool,
}

/// A lease's state word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseState {
    Live,
    /// A reclaimer is giving its bytes back.
    Reaping,
    /// A value no libvgpu writes.
    Other(u32),
}

impl LeaseState {
    pub fn name(self) -> &'static str {
        match self {
            LeaseState::Live => "live",
            LeaseState::Reaping => "reaping",
            LeaseState::Other(_) => "corrupt",
        }
    }
}

/// One process's lease on one device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LeaseDevice {
    /// Bytes the process holds, as the ledger counts them.
    pub bytes: u64,
    /// Its updates in flight at the moment of the copy.
    pub in_flight: u64,
    /// What its HAMi slot shows the monitor.
    pub slot: SlotUsage,
    /// Of `bytes`, those allocated as spillable managed memory (overcommit); 0 for an owner that
    /// does not count them ([`LeaseView::counts_spillable`]).
    pub spillable: u64,
}

/// One lease that is not free: a process that charged the budget.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseView {
    /// Lease index, which is also its HAMi slot.
    pub lease: usize,
    pub state: LeaseState,
    /// The pid the process had when it took the lease, in its own pid namespace.
    pub pid: i32,
    /// Whether some process holds the lease's OFD lock (its owner lives).
    pub alive: bool,
    /// HAMi slot status (1: running; 0: the monitor skips it).
    pub slot_status: i32,
    /// Whether its owner's release reads budgets from the region at every charge, so that a
    /// resize reaches it (release 0.1.0 keeps the budgets it started with).
    pub follows_resize: bool,
    /// Whether its owner's release keeps its spillable bytes in its slot (0.1.0 does not).
    pub counts_spillable: bool,
    /// Per region device, in device order.
    pub devices: Vec<LeaseDevice>,
}

impl LeaseView {
    /// Bytes held over every device.
    pub fn bytes(&self) -> u64 {
        self.devices.iter().map(|d| d.bytes).fold(0, u64::saturating_add)
    }
}

/// The footer HAMi's monitor and the container's processes talk through.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MonitorView {
    /// Slots in use (the highest one plus one).
    pub proc_num: i32,
    /// 0: the monitor says compute shares need not be enforced now.
    pub utilization_switch: i32,
    /// Positive: the container launched work lately; negative: the monitor holds its launches.
    pub recent_kernel: i32,
    /// `CUDA_TASK_PRIORITY` of the creating process.
    pub priority: i32,
    /// When the container last launched work, Unix seconds (0: never).
    pub last_kernel_time: u64,
}

impl MonitorView {
    /// The monitor holds this container's launches (a higher-priority container is running).
    pub fn holds_launches(&self) -> bool {
        self.recent_kernel < 0
    }

    /// Compute shares are enforced (unless a process's `GPU_CORE_UTILIZATION_POLICY` says otherwise).
    pub fn enforces_shares(&self) -> bool {
        self.utilization_switch != 0
    }
}

/// A region file as it was when it was read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    pub path: PathBuf,
    pub size: u64,
    pub hami_version: (u32, u32),
    pub ledger_version: u32,
    /// The release that created the region (`major.minor.patch`).
    pub created_by: String,
    /// Feature bits the region has that a release may ignore, and that it must know.
    pub compatible_features: u64,
    pub required_features: u64,
    /// Devices `0..device_num`.
    pub devices: Vec<DeviceView>,
    /// Leases that are not free, by index.
    pub leases: Vec<LeaseView>,
    pub monitor: MonitorView,
}

impl Snapshot {
    /// Leases whose owner is gone and whose bytes still count (`vgpu-smi reclaim` drops them).
    pub fn dead_leases(&self) -> impl Iterator<Item = &LeaseView> {
        self.leases.iter().filter(|lease| lease.state == LeaseState::Live && !lease.alive)
    }
}

/// Reads the region at `path` without changing anything. Links in `path` are followed (it is the
/// caller's path); anything but a regular file is refused without being opened. Tools outside the
/// container open a tenant's file themselves ([`crate::region::tenant_file`]) and call
/// [`inspect_file`].
pub fn inspect(path: &Path) -> Result<Snapshot, InspectError> {
    let file = tenant_file::open_named(path, Access::Read)
        .map_err(|refusal| unreadable(path, refusal.into_io_error()))?;
    inspect_file(&file, path)
}

/// Reads the region open as `file` (named `path` in what is reported): at most the region's
/// size, whatever the file's; a file that shrinks while it is read is what was read.
pub fn inspect_file(file: &File, path: &Path) -> Result<Snapshot, InspectError> {
    let metadata = file.metadata().map_err(|error| unreadable(path, error))?;
    if !metadata.is_file() {
        return Err(unreadable(path, std::io::Error::other("not a regular file")));
    }
    let bytes = tenant_file::read_at_most(file, FILE_SIZE).map_err(|error| unreadable(path, error))?;
    let size =
        if bytes.len() < FILE_SIZE { bytes.len() as u64 } else { metadata.len().max(FILE_SIZE as u64) };
    let lease_alive = |lease| crate::region::lease_is_held(file.as_raw_fd(), lease);
    from_bytes(path, size, &bytes, lease_alive)
}

fn unreadable(path: &Path, error: std::io::Error) -> InspectError {
    match error.kind() {
        ErrorKind::NotFound => InspectError::Missing { path: path.to_owned() },
        _ => InspectError::Unreadable { path: path.to_owned(), error },
    }
}

/// Parses a copy of the file's first `bytes.len()` bytes (of `size` in all); `lease_alive` tells
/// whether a lease's owner lives. Any bytes give a snapshot or an error, never a panic (fuzzed:
/// `fuzz/`).
pub fn from_bytes(
    path: &Path,
    size: u64,
    bytes: &[u8],
    lease_alive: impl Fn(usize) -> bool,
) -> Result<Snapshot, InspectError> {
    let path = path.to_owned();
    let file = Bytes(bytes);
    let magic = file.i32(offset_of!(RegionFile, magic));
    if size < HAMI_MIN_SIZE as u64 {
        // A short file of another magic is something else altogether; of ours, a cut region.
        if bytes.len() >= 4 && magic != HAMI_MAGIC && magic != 0 {
            return Err(InspectError::NotARegion { path, magic });
        }
        let needed = HAMI_MIN_SIZE as u64;
        return Err(InspectError::Truncated { path, size, needed, what: "a HAMi v1 region" });
    }
    if magic == 0 {
        return Err(InspectError::NotInitialised { path });
    }
    if magic != HAMI_MAGIC {
        return Err(InspectError::NotARegion { path, magic });
    }
    let major = file.u32(offset_of!(RegionFile, major));
    if major != HAMI_MAJOR {
        return Err(InspectError::UnknownHamiVersion { path, major });
    }
    let ledger = offset_of!(RegionFile, ledger);
    let header_end = ledger + offset_of!(Ledger, version) + size_of::<u32>();
    if bytes.len() < header_end || file.u64(ledger + offset_of!(Ledger, magic)) != LEDGER_MAGIC {
        return Err(InspectError::NoLedger { path });
    }
    let version = file.u32(ledger + offset_of!(Ledger, version));
    if version != LEDGER_VERSION {
        return Err(InspectError::UnknownLedgerVersion { path, version });
    }
    if size < FILE_SIZE as u64 {
        let needed = FILE_SIZE as u64;
        return Err(InspectError::Truncated { path, size, needed, what: "libvgpu's ledger" });
    }

    let monitor = MonitorView {
        proc_num: file.i32(offset_of!(RegionFile, proc_num)),
        utilization_switch: file.i32(offset_of!(RegionFile, utilization_switch)),
        recent_kernel: file.i32(offset_of!(RegionFile, recent_kernel)),
        priority: file.i32(offset_of!(RegionFile, priority)),
        last_kernel_time: file.u64(offset_of!(RegionFile, last_kernel_time)),
    };
    let device_count = (file.u64(offset_of!(RegionFile, device_num)) as usize).min(MAX_DEVICES);
    let compatible = file.u64(ledger + offset_of!(Ledger, compatible));
    let overcommit_known = compatible & COMPATIBLE_OVERCOMMIT != 0;
    let exact_costs = if compatible & COMPATIBLE_CONTEXT_COST_EXACT != 0 {
        file.u64(ledger + offset_of!(Ledger, context_cost_exact))
    } else {
        0
    };
    // HAMi's monitor sums every slot below proc_num, whatever its status.
    let monitored = usize::try_from(monitor.proc_num).unwrap_or(0).min(MAX_PROCESSES);
    let devices = (0..device_count)
        .map(|d| {
            let mut slots = SlotUsage::default();
            for k in 0..monitored {
                slots.add(&file.slot_usage(k, d));
            }
            let budget = file.u64(ledger + offset_of!(Ledger, limit) + 8 * d);
            let context_cost = file.u64(ledger + offset_of!(Ledger, context_cost) + 8 * d);
            DeviceView {
                index: d,
                uuid: file.uuid(d),
                budget: (budget != UNLIMITED).then_some(budget),
                hami_limit: file.u64(offset_of!(RegionFile, limit) + 8 * d),
                used: file.u64(ledger + offset_of!(Ledger, used) + 8 * d) & BYTE_MASK,
                suspect: file.u64(ledger + offset_of!(Ledger, suspect) + 8 * d),
                context_cost: (context_cost & CONTEXT_COST_KNOWN != 0)
                    .then_some(context_cost & !CONTEXT_COST_KNOWN),
                context_cost_exact: context_cost & CONTEXT_COST_KNOWN != 0 && exact_costs & (1 << d) != 0,
                sm_limit: file.u64(offset_of!(RegionFile, sm_limit) + 8 * d),
                slots,
                overcommit: overcommit_known
                    && file.u64(ledger + offset_of!(Ledger, overcommit)) & (1 << d) != 0,
                spillable: 0,
                spilled: overcommit_known && file.u64(ledger + offset_of!(Ledger, spilled)) & (1 << d) != 0,
            }
        })
        .collect::<Vec<DeviceView>>();
    let leases = (0..MAX_PROCESSES)
        .filter_map(|k| {
            let base = ledger + offset_of!(Ledger, leases) + k * size_of::<Lease>();
            let state = match file.u32(base + offset_of!(Lease, state)) {
                LEASE_FREE => return None,
                LEASE_LIVE => LeaseState::Live,
                LEASE_REAPING => LeaseState::Reaping,
                other => LeaseState::Other(other),
            };
            let owner = file.u32(base + offset_of!(Lease, slot));
            let counts_spillable = owner & OWNER_COUNTS_SPILLABLE != 0;
            let devices = (0..device_count)
                .map(|d| {
                    let word = file.u64(base + offset_of!(Lease, used) + 8 * d);
                    LeaseDevice {
                        bytes: word & BYTE_MASK,
                        in_flight: word >> BYTE_BITS,
                        slot: file.slot_usage(k, d),
                        spillable: if counts_spillable { file.spillable(k, d) } else { 0 },
                    }
                })
                .collect();
            Some(LeaseView {
                lease: k,
                state,
                pid: file.i32(base + offset_of!(Lease, pid)),
                alive: lease_alive(k),
                slot_status: file.i32(slot_base(k) + offset_of!(HamiSlot, status)),
                follows_resize: owner & OWNER_FOLLOWS_RESIZE != 0,
                counts_spillable,
                devices,
            })
        })
        .collect::<Vec<LeaseView>>();
    let mut devices = devices;
    for lease in leases.iter().filter(|lease| lease.state == LeaseState::Live) {
        for (device, held) in devices.iter_mut().zip(&lease.devices) {
            device.spillable = device.spillable.saturating_add(held.spillable);
        }
    }
    Ok(Snapshot {
        path,
        size,
        hami_version: (major, file.u32(offset_of!(RegionFile, minor))),
        ledger_version: version,
        created_by: release_name(file.u32(ledger + offset_of!(Ledger, created_by))),
        compatible_features: file.u64(ledger + offset_of!(Ledger, compatible)),
        required_features: file.u64(ledger + offset_of!(Ledger, required)),
        devices,
        leases,
        monitor,
    })
}

fn slot_base(k: usize) -> usize {
    offset_of!(RegionFile, slots) + k * size_of::<HamiSlot>()
}

/// Little-endian fields of a copy of the file; every offset read lies within what was checked.
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn array<const N: usize>(&self, at: usize) -> [u8; N] {
        self.0.get(at..at + N).and_then(|b| b.try_into().ok()).unwrap_or([0; N])
    }

    fn u32(&self, at: usize) -> u32 {
        u32::from_le_bytes(self.array(at))
    }

    fn i32(&self, at: usize) -> i32 {
        i32::from_le_bytes(self.array(at))
    }

    fn u64(&self, at: usize) -> u64 {
        u64::from_le_bytes(self.array(at))
    }

    fn uuid(&self, d: usize) -> String {
        let at = offset_of!(RegionFile, uuids) + UUID_LEN * d;
        let raw = self.0.get(at..at + UUID_LEN).unwrap_or(&[]);
        let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
        // The tenant wrote these bytes: no control character reaches a terminal that shows them.
        String::from_utf8_lossy(&raw[..end])
            .chars()
            .map(|c| if c.is_control() { char::REPLACEMENT_CHARACTER } else { c })
            .collect()
    }

    fn spillable(&self, k: usize, d: usize) -> u64 {
        let memory = slot_base(k) + offset_of!(HamiSlot, memory) + d * size_of::<DeviceMemory>();
        self.u64(memory + offset_of!(DeviceMemory, spillable))
    }

    fn slot_usage(&self, k: usize, d: usize) -> SlotUsage {
        let memory = slot_base(k) + offset_of!(HamiSlot, memory) + d * size_of::<DeviceMemory>();
        let util = slot_base(k) + offset_of!(HamiSlot, util) + d * size_of::<DeviceUtil>();
        SlotUsage {
            context: self.u64(memory + offset_of!(DeviceMemory, context)),
            module: self.u64(memory + offset_of!(DeviceMemory, module)),
            data: self.u64(memory + offset_of!(DeviceMemory, data)),
            offset: self.u64(memory + offset_of!(DeviceMemory, offset)),
            total: self.u64(memory + offset_of!(DeviceMemory, total)),
            sm_util: self.u64(util + offset_of!(DeviceUtil, sm_util)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;

    /// A region file's bytes, written field by field as the library lays them out.
    struct Image(Vec<u8>);

    impl Image {
        /// A full-size region with `devices` devices, initialised as a new region is.
        fn new(devices: usize) -> Image {
            let mut image = Image(vec![0; FILE_SIZE]);
            image.put_i32(offset_of!(RegionFile, magic), HAMI_MAGIC);
            image.put_u32(offset_of!(RegionFile, major), HAMI_MAJOR);
            image.put_u32(offset_of!(RegionFile, minor), 2);
            image.put_u64(offset_of!(RegionFile, device_num), devices as u64);
            image.put_i32(offset_of!(RegionFile, utilization_switch), 1);
            image.put_u64(LEDGER + offset_of!(Ledger, magic), LEDGER_MAGIC);
            image.put_u32(LEDGER + offset_of!(Ledger, version), LEDGER_VERSION);
            for d in 0..MAX_DEVICES {
                image.put_u64(LEDGER + offset_of!(Ledger, limit) + 8 * d, UNLIMITED);
            }
            for d in 0..devices {
                let uuid = format!("GPU-face0000-0000-4e00-8000-0000000000{d:02}");
                let at = offset_of!(RegionFile, uuids) + UUID_LEN * d;
                image.0[at..at + uuid.len()].copy_from_slice(uuid.as_bytes());
            }
            image
        }

        fn put_i32(&mut self, at: usize, value: i32) {
            self.0[at..at + 4].copy_from_slice(&value.to_le_bytes());
        }

        fn put_u32(&mut self, at: usize, value: u32) {
            self.0[at..at + 4].copy_from_slice(&value.to_le_bytes());
        }

        fn put_u64(&mut self, at: usize, value: u64) {
            self.0[at..at + 8].copy_from_slice(&value.to_le_bytes());
        }

        fn budget(&mut self, d: usize, bytes: u64) {
            self.put_u64(LEDGER + offset_of!(Ledger, limit) + 8 * d, bytes);
            self.put_u64(offset_of!(RegionFile, limit) + 8 * d, bytes);
        }

        /// Lease `k` of `pid`, live, holding `bytes[d]` (of which `context[d]` a context's).
        fn lease(&mut self, k: usize, pid: i32, bytes: &[u64], context: &[u64]) {
            let base = LEDGER + offset_of!(Ledger, leases) + k * size_of::<Lease>();
            self.put_u32(base + offset_of!(Lease, state), LEASE_LIVE);
            self.put_i32(base + offset_of!(Lease, pid), pid);
            let slot = slot_base(k);
            self.put_i32(slot + offset_of!(HamiSlot, pid), pid);
            self.put_i32(slot + offset_of!(HamiSlot, status), 1);
            for (d, (&bytes, &context)) in bytes.iter().zip(context).enumerate() {
                self.put_u64(base + offset_of!(Lease, used) + 8 * d, bytes);
                let memory = slot + offset_of!(HamiSlot, memory) + d * size_of::<DeviceMemory>();
                self.put_u64(memory + offset_of!(DeviceMemory, context), context);
                self.put_u64(memory + offset_of!(DeviceMemory, data), bytes - context);
                self.put_u64(memory + offset_of!(DeviceMemory, total), bytes);
                let total = LEDGER + offset_of!(Ledger, used) + 8 * d;
                let now = u64::from_le_bytes(self.0[total..total + 8].try_into().unwrap());
                self.put_u64(total, now + bytes);
            }
            let proc_num = offset_of!(RegionFile, proc_num);
            let now = i32::from_le_bytes(self.0[proc_num..proc_num + 4].try_into().unwrap());
            self.put_i32(proc_num, now.max(k as i32 + 1));
        }

        fn read(&self, alive: &[usize]) -> Result<Snapshot, InspectError> {
            from_bytes(Path::new("/r.cache"), self.0.len() as u64, &self.0, |k| alive.contains(&k))
        }

        fn read_cut(&self, size: usize) -> Result<Snapshot, InspectError> {
            from_bytes(Path::new("/r.cache"), size as u64, &self.0[..size], |_| true)
        }
    }

    const LEDGER: usize = offset_of!(RegionFile, ledger);

    #[test]
    fn a_region_reads_back_as_written() {
        let mut image = Image::new(2);
        image.budget(0, GIB);
        image.put_u64(offset_of!(RegionFile, sm_limit), 30);
        image.put_u64(LEDGER + offset_of!(Ledger, context_cost), (64 * MIB) | CONTEXT_COST_KNOWN);
        image.put_u64(LEDGER + offset_of!(Ledger, compatible), COMPATIBLE_CONTEXT_COST_EXACT);
        image.put_u64(LEDGER + offset_of!(Ledger, context_cost_exact), 0b11);
        image.put_i32(offset_of!(RegionFile, priority), 1);
        image.put_i32(offset_of!(RegionFile, recent_kernel), -1);
        image.put_u64(offset_of!(RegionFile, last_kernel_time), 1_700_000_000);
        image.lease(0, 4242, &[300 * MIB, 0], &[64 * MIB, 0]);
        image.lease(3, 4243, &[100 * MIB, 5 * MIB], &[0, 0]);
        let util = slot_base(3) + offset_of!(HamiSlot, util) + offset_of!(DeviceUtil, sm_util);
        image.put_u64(util, 12);

        let snapshot = image.read(&[0]).expect("a valid region");
        assert_eq!(snapshot.hami_version, (1, 2));
        assert_eq!(snapshot.ledger_version, LEDGER_VERSION);
        assert_eq!(snapshot.devices.len(), 2);
        let d0 = &snapshot.devices[0];
        assert_eq!(d0.uuid, "GPU-face0000-0000-4e00-8000-000000000000");
        assert_eq!(d0.budget, Some(GIB));
        assert_eq!(d0.hami_limit, GIB);
        assert_eq!(d0.used, 400 * MIB);
        assert_eq!(d0.sm_limit, 30);
        assert_eq!(d0.context_cost, Some(64 * MIB));
        assert!(d0.context_cost_exact);
        assert_eq!(
            d0.slots,
            SlotUsage {
                context: 64 * MIB,
                data: 336 * MIB,
                total: 400 * MIB,
                sm_util: 12,
                ..Default::default()
            }
        );
        let d1 = &snapshot.devices[1];
        assert_eq!((d1.budget, d1.hami_limit, d1.used, d1.context_cost), (None, 0, 5 * MIB, None));
        assert!(!d1.context_cost_exact, "no cost is known there, exact or not");

        assert_eq!(snapshot.leases.len(), 2);
        let (a, b) = (&snapshot.leases[0], &snapshot.leases[1]);
        assert_eq!((a.lease, a.pid, a.state, a.alive, a.slot_status), (0, 4242, LeaseState::Live, true, 1));
        assert_eq!((b.lease, b.pid, b.alive), (3, 4243, false));
        assert_eq!(a.devices[0].bytes, 300 * MIB);
        assert_eq!(a.devices[0].slot.context, 64 * MIB);
        assert_eq!(b.bytes(), 105 * MIB);
        assert_eq!(b.devices[0].slot.sm_util, 12);
        assert_eq!(snapshot.dead_leases().map(|l| l.pid).collect::<Vec<_>>(), [4243]);

        assert_eq!(snapshot.monitor.proc_num, 4);
        assert!(snapshot.monitor.holds_launches());
        assert!(snapshot.monitor.enforces_shares());
        assert_eq!(snapshot.monitor.priority, 1);
        assert_eq!(snapshot.monitor.last_kernel_time, 1_700_000_000);
    }

    #[test]
    fn updates_in_flight_and_version_bits_are_split_off() {
        let mut image = Image::new(1);
        image.lease(0, 7, &[MIB], &[0]);
        let lease_word = LEDGER + offset_of!(Ledger, leases) + offset_of!(Lease, used);
        image.put_u64(lease_word, (1 << BYTE_BITS) | MIB);
        image.put_u64(LEDGER + offset_of!(Ledger, used), (5 << BYTE_BITS) | MIB);
        let snapshot = image.read(&[0]).unwrap();
        assert_eq!(snapshot.devices[0].used, MIB);
        assert_eq!(
            snapshot.leases[0].devices[0],
            LeaseDevice {
                bytes: MIB,
                in_flight: 1,
                slot: SlotUsage { data: MIB, total: MIB, ..Default::default() },
                spillable: 0,
            }
        );
    }

    #[test]
    fn spillable_bytes_count_only_for_owners_that_keep_them() {
        let mut image = Image::new(1);
        image.lease(0, 7, &[2 * GIB], &[0]);
        image.lease(1, 8, &[GIB], &[0]);
        let spillable_of = |k: usize| {
            offset_of!(RegionFile, slots)
                + k * size_of::<HamiSlot>()
                + offset_of!(HamiSlot, memory)
                + offset_of!(DeviceMemory, spillable)
        };
        image.put_u64(spillable_of(0), GIB);
        // A 0.1.0 owner (bare slot index) with a stale value left by an earlier owner.
        image.put_u64(spillable_of(1), 512 * MIB);
        let slot_word =
            |k: usize| LEDGER + offset_of!(Ledger, leases) + k * size_of::<Lease>() + offset_of!(Lease, slot);
        image.put_u32(slot_word(0), OWNER_COUNTS_SPILLABLE);
        image.put_u32(slot_word(1), 1);
        // Without the feature bit nothing of overcommit is shown.
        let snapshot = image.read(&[0, 1]).unwrap();
        assert!(!snapshot.devices[0].overcommit && !snapshot.devices[0].spilled);
        image.put_u64(LEDGER + offset_of!(Ledger, compatible), COMPATIBLE_OVERCOMMIT);
        image.put_u64(LEDGER + offset_of!(Ledger, overcommit), 1);
        image.put_u64(LEDGER + offset_of!(Ledger, spilled), 1);
        let snapshot = image.read(&[0, 1]).unwrap();
        let device = &snapshot.devices[0];
        assert!(device.overcommit && device.spilled);
        assert_eq!(device.spillable, GIB, "the 0.1.0 owner's stale bytes are not counted");
        assert_eq!(snapshot.leases[0].devices[0].spillable, GIB);
        assert!(snapshot.leases[0].counts_spillable && !snapshot.leases[1].counts_spillable);
        assert_eq!(snapshot.leases[1].devices[0].spillable, 0);
    }

    #[test]
    fn short_files_are_truncated_or_foreign() {
        let image = Image::new(1);
        for size in [0, 3, 100, HAMI_MIN_SIZE - 1] {
            match image.read_cut(size) {
                Err(InspectError::Truncated { size: got, needed, .. }) => {
                    assert_eq!((got, needed), (size as u64, HAMI_MIN_SIZE as u64))
                }
                other => panic!("{size} bytes: {other:?}"),
            }
        }
        let junk = b"this is a text file, not a region\n";
        let error = from_bytes(Path::new("/j"), junk.len() as u64, junk, |_| true).unwrap_err();
        assert!(matches!(error, InspectError::NotARegion { .. }), "{error:?}");
        // Our ledger's header is there, but not the whole of it.
        let error = image.read_cut(FILE_SIZE - 1).unwrap_err();
        assert!(
            matches!(error, InspectError::Truncated { needed, .. } if needed == FILE_SIZE as u64),
            "{error:?}"
        );
        assert!(error.to_string().contains("libvgpu's ledger needs"), "{error}");
    }

    #[test]
    fn a_hami_core_region_has_no_ledger() {
        let mut image = Image::new(1);
        image.put_u64(LEDGER + offset_of!(Ledger, magic), 0);
        assert!(matches!(image.read(&[]), Err(InspectError::NoLedger { .. })));
        // HAMi-core's own file ends where the HAMi area does.
        let error = Image::new(1).read_cut(HAMI_MIN_SIZE).unwrap_err();
        assert!(matches!(error, InspectError::NoLedger { .. }), "{error:?}");
        assert!(error.to_string().contains("HAMi-core"), "{error}");
    }

    #[test]
    fn foreign_uninitialised_and_other_versions_are_named() {
        let mut image = Image::new(1);
        image.put_i32(0, 0x1234);
        let error = image.read(&[]).unwrap_err();
        assert!(matches!(error, InspectError::NotARegion { magic: 0x1234, .. }), "{error:?}");
        assert_eq!(error.kind(), "not_a_region");

        image.put_i32(0, 0);
        assert!(matches!(image.read(&[]), Err(InspectError::NotInitialised { .. })));

        let mut image = Image::new(1);
        image.put_u32(offset_of!(RegionFile, major), 2);
        assert!(matches!(image.read(&[]), Err(InspectError::UnknownHamiVersion { major: 2, .. })));

        let mut image = Image::new(1);
        image.put_u32(LEDGER + offset_of!(Ledger, version), LEDGER_VERSION + 1);
        let error = image.read(&[]).unwrap_err();
        assert!(matches!(error, InspectError::UnknownLedgerVersion { .. }), "{error:?}");
        assert!(error.to_string().contains("newer"), "{error}");
        // A newer ledger may be larger or smaller: the version is named, not the size.
        let error = image.read_cut(FILE_SIZE - 100).unwrap_err();
        assert_eq!(error.kind(), "unknown_ledger_version");
        image.put_u32(LEDGER + offset_of!(Ledger, version), 3);
        assert!(image.read(&[]).unwrap_err().to_string().contains("older"));
    }

    #[test]
    fn missing_and_unreadable_files_are_told_apart() {
        let error = inspect(Path::new("/nonexistent/vgpu/cudevshr.cache")).unwrap_err();
        assert!(matches!(error, InspectError::Missing { .. }), "{error:?}");
        assert!(error.is_unreadable());
        for (path, what) in [("/", "a directory"), ("/dev/null", "a character device")] {
            let error = inspect(Path::new(path)).unwrap_err();
            assert!(matches!(error, InspectError::Unreadable { .. }), "{error:?}");
            assert_eq!(error.to_string(), format!("{path}: cannot read: not a regular file ({what})"));
        }
    }

    #[test]
    fn control_characters_in_a_uuid_never_reach_the_reader() {
        let mut image = Image::new(1);
        let at = offset_of!(RegionFile, uuids);
        image.0[at..at + 9].copy_from_slice(b"GPU-\x1b[2J\0");
        let snapshot = image.read(&[]).unwrap();
        assert_eq!(snapshot.devices[0].uuid, "GPU-\u{fffd}[2J");
    }

    #[test]
    fn a_file_is_read_up_to_the_region_size_only() {
        let dir = std::env::temp_dir().join(format!("vgpu-inspect-sparse-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("big.cache");
        let mut image = Image::new(1);
        image.budget(0, GIB);
        std::fs::write(&path, &image.0).unwrap();
        File::options().write(true).open(&path).unwrap().set_len(1 << 30).unwrap();
        let snapshot = inspect(&path).expect("a region with a long tail");
        assert_eq!((snapshot.size, snapshot.devices[0].budget), (1 << 30, Some(GIB)));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn device_count_is_clamped_to_the_region() {
        let mut image = Image::new(1);
        image.put_u64(offset_of!(RegionFile, device_num), 1000);
        image.put_i32(offset_of!(RegionFile, proc_num), 1 << 30);
        let snapshot = image.read(&[]).unwrap();
        assert_eq!(snapshot.devices.len(), MAX_DEVICES);
        assert_eq!(snapshot.devices[0].slots, SlotUsage::default());
    }
}
