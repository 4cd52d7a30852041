//! Byte layout of the shared region file, pinned by compile-time asserts.
//!
//! ```text
//! 0         HAMi v1 header      magic, version, device UUIDs, limits        (read by HAMi's monitor)
//! 1856      1024 HAMi slots     one per live process, 1960 bytes each        (read by HAMi's monitor)
//! 2008896   HAMi footer         proc_num, utilization switch, priority, …   (read by HAMi's monitor)
//! 2008960   libvgpu ledger      our magic and version, the authoritative limits and per-device
//!                               totals, 1024 leases (one per process, lease k mirrored in HAMi
//!                               slot k), bytes possibly leaked by processes killed mid-update,
//!                               context costs and the compute pacing clocks
//! ```
//!
//! Only raw pointers and atomics ever touch the mapping; these structs exist for `offset_of!` and
//! `size_of`, never as references.

use std::mem::{offset_of, size_of};

pub const HAMI_MAGIC: i32 = 19920718;
pub const HAMI_MAJOR: u32 = 1;
pub const HAMI_MINOR: u32 = 2;
pub const MAX_DEVICES: usize = 16;
pub const MAX_PROCESSES: usize = 1024;
pub const UUID_LEN: usize = 96;

/// Smallest file HAMi's monitor accepts as a v1 region.
pub const HAMI_MIN_SIZE: usize = 2_008_952;

/// "VGPULDG1" read as a little-endian u64: marks our ledger past the HAMi area.
pub const LEDGER_MAGIC: u64 = u64::from_le_bytes(*b"VGPULDG1");
/// The ledger's generation. 4 is the generation of release 0.1.0 and stays 4: later releases
/// change the region only as docs/shared-ledger.md ("Compatibility between releases") allows,
/// announcing each change as a feature bit, never by a new number.
pub const LEDGER_VERSION: u32 = 4;

/// Compatible feature: memory overcommit (`CUDA_OVERSUBSCRIBE`, docs/overcommit.md). The header's
/// [`Ledger::overcommit`] and [`Ledger::spilled`] words are meaningful, and a lease whose slot word
/// shows [`OWNER_COUNTS_SPILLABLE`] keeps its spillable bytes in its HAMi slot's
/// [`DeviceMemory::spillable`]. Spillable bytes are already charged in `used`: a release that
/// ignores them keeps the books right, it only shows less.
pub const COMPATIBLE_OVERCOMMIT: u64 = 1 << 0;
/// Compatible feature: [`Ledger::context_cost_exact`] says which remembered context costs were
/// measured from a process's own NVML figure. A release unaware of it uses the remembered costs as
/// they are; exact ones are only better than what it would have measured itself.
pub const COMPATIBLE_CONTEXT_COST_EXACT: u64 = 1 << 1;
/// Compatible feature: the container's swap table (`crate::swap`) lives in this file, at
/// `crate::swap::TABLE_AT`, past everything release 0.1.0 reads. Set by the process that grew the
/// file for it, once the table's bytes are in place; a release unaware of it never touches them.
pub const COMPATIBLE_SWAP_TABLE: u64 = 1 << 2;
/// Feature bits of [`Ledger::compatible`] every region of this release has from its creation: what
/// a release unaware of them may ignore and still keep the books right.
pub const KNOWN_COMPATIBLE: u64 = COMPATIBLE_OVERCOMMIT | COMPATIBLE_CONTEXT_COST_EXACT;
/// Feature bits of [`Ledger::required`]: what a process must understand to use this region at all.
/// A release that finds a bit it does not know fails closed. None is defined yet.
pub const KNOWN_REQUIRED: u64 = 0;

/// Bits of [`Lease::slot`] above the slot index: what the lease's owner honours. Release 0.1.0
/// writes the bare index, which clears them, so a lease that shows a bit was taken by a release
/// that has it.
pub const SLOT_INDEX_MASK: u32 = 0xffff;
/// The owner reads its budgets from the region at every charge and query, so a resize reaches it
/// (`vgpu-smi resize`); an owner without it keeps the budgets it started with.
pub const OWNER_FOLLOWS_RESIZE: u32 = 1 << 16;
/// The owner keeps its spillable (overcommitted) bytes in its HAMi slot's
/// [`DeviceMemory::spillable`]; an owner without it may leave stale bytes there (release 0.1.0
/// never clears them), so readers honour the field only with this bit.
pub const OWNER_COUNTS_SPILLABLE: u32 = 1 << 17;
/// What this build's leases honour.
pub const OWNER_FEATURES: u32 = OWNER_FOLLOWS_RESIZE | OWNER_COUNTS_SPILLABLE;

/// This build's release, `major << 16 | minor << 8 | patch`, recorded in the regions it creates.
pub const RELEASE: u32 = release(env!("CARGO_PKG_VERSION"));

/// Packs a `major.minor.patch` version string at compile time.
const fn release(version: &str) -> u32 {
    let bytes = version.as_bytes();
    let (mut parts, mut part, mut i) = ([0u32; 3], 0, 0);
    while i < bytes.len() && part < 3 {
        match bytes[i] {
            b'.' => part += 1,
            b @ b'0'..=b'9' => parts[part] = parts[part] * 10 + (b - b'0') as u32,
            _ => break,
        }
        i += 1;
    }
    (parts[0] & 0xffff) << 16 | (parts[1] & 0xff) << 8 | (parts[2] & 0xff)
}

/// `major.minor.patch` of a packed release; release 0.1.0 recorded none (0).
pub fn release_name(packed: u32) -> String {
    if packed == 0 {
        return "0.1.0".to_owned();
    }
    format!("{}.{}.{}", packed >> 16, packed >> 8 & 0xff, packed & 0xff)
}

/// A limit the ledger treats as "no budget on this device".
pub const UNLIMITED: u64 = u64::MAX;

/// Per-device memory of one HAMi slot.
#[repr(C)]
pub struct DeviceMemory {
    pub context: u64,
    pub module: u64,
    pub data: u64,
    pub offset: u64,
    pub total: u64,
    /// libvgpu's own (HAMi-core's `unused[0]`, which the monitor never reads): of `total`, the
    /// bytes allocated as spillable managed memory under overcommit. Honoured only for a lease
    /// whose slot word shows [`OWNER_COUNTS_SPILLABLE`].
    pub spillable: u64,
    _unused: [u64; 2],
}

/// Per-device utilisation of one HAMi slot: `sm_util` is the process's measured share of the GPU.
#[repr(C)]
pub struct DeviceUtil {
    _unused_a: [u64; 2],
    pub sm_util: u64,
    _unused_b: [u64; 3],
}

/// One process as HAMi's monitor sees it.
#[repr(C)]
pub struct HamiSlot {
    pub pid: i32,
    pub host_pid: i32,
    pub memory: [DeviceMemory; MAX_DEVICES],
    _monitor_used: [u64; MAX_DEVICES],
    pub util: [DeviceUtil; MAX_DEVICES],
    pub status: i32,
    _tail: [u8; 28],
}

/// The whole file.
#[repr(C)]
pub struct RegionFile {
    pub magic: i32,
    pub major: u32,
    pub minor: u32,
    _hami_semaphore: [u8; 44],
    pub device_num: u64,
    pub uuids: [[u8; UUID_LEN]; MAX_DEVICES],
    pub limit: [u64; MAX_DEVICES],
    pub sm_limit: [u64; MAX_DEVICES],
    pub slots: [HamiSlot; MAX_PROCESSES],
    pub proc_num: i32,
    pub utilization_switch: i32,
    pub recent_kernel: i32,
    pub priority: i32,
    pub last_kernel_time: u64,
    _hami_tail: [u8; 40],
    pub ledger: Ledger,
}

/// Our part of the file, which HAMi's monitor never reads.
#[repr(C, align(64))]
pub struct Ledger {
    pub magic: u64,
    /// [`LEDGER_VERSION`], the generation; see [`Ledger::required`] for what may change within one.
    pub version: u32,
    /// The release that created the region ([`RELEASE`]); 0 for release 0.1.0, which wrote none.
    pub created_by: u32,
    /// Compatible features this region has (bits of [`KNOWN_COMPATIBLE`] and later ones).
    pub compatible: u64,
    /// Features a process must understand to use this region ([`KNOWN_REQUIRED`] and later ones).
    pub required: u64,
    /// [`COMPATIBLE_OVERCOMMIT`]: bit `i` set when device index `i` is overcommitted
    /// (`CUDA_OVERSUBSCRIBE` in the container's environment when the region was made or a process
    /// attached), so that a process started without the variable follows the container. Taken
    /// from the header's first reserved bytes, which release 0.1.0 never writes.
    pub overcommit: u64,
    /// [`COMPATIBLE_OVERCOMMIT`]: bit `i` set once any process of the container has allocated
    /// spillable memory on device index `i` (the one whose bit flips logs it).
    pub spilled: u64,
    /// [`COMPATIBLE_CONTEXT_COST_EXACT`]: bit `i` set when device index `i`'s remembered
    /// [`Ledger::context_cost`] was measured from a process's own figure, which no neighbour
    /// moves; clear, the figure is a device-wide difference (all release 0.1.0 measured) and is
    /// measured again by the next process that can.
    pub context_cost_exact: u64,
    /// Zero, for later features. Release 0.1.0 never writes here (ledger version 3 kept a mutex in
    /// these bytes, and version 3 regions are refused).
    _reserved: [u8; 24],
    /// Authoritative budget per device index ([`UNLIMITED`] for none): a later process's
    /// environment cannot change it.
    pub limit: [u64; MAX_DEVICES],
    /// Per device index, the container's charged bytes in the low [`BYTE_BITS`] bits (what
    /// check-and-reserve compares and swaps) and a version in the high bits, bumped by every
    /// change. The bytes equal the sum of the live leases' bytes, but for updates in flight and
    /// what killed processes left (see `suspect`).
    pub used: [u64; MAX_DEVICES],
    pub leases: [Lease; MAX_PROCESSES],
    /// Per device index: dead leases reclaimed with an update in flight, whose bytes may still be
    /// in `used`, until a recount settles them.
    pub suspect: [u64; MAX_DEVICES],
    /// What a new context costs on each device index, as last measured in this container, with
    /// [`CONTEXT_COST_KNOWN`] set; 0 while nobody has measured it. Exact where
    /// [`Ledger::context_cost_exact`] says so.
    pub context_cost: [u64; MAX_DEVICES],
    /// The container's compute pacing clock per device index: the `CLOCK_MONOTONIC` instant, in
    /// nanoseconds, by which the GPU time its processes have been admitted is earned (see
    /// `compute::pace`).
    pub pace: [u64; MAX_DEVICES],
}

/// Marks a remembered context cost (a context may measure at 0 bytes).
pub const CONTEXT_COST_KNOWN: u64 = 1 << 63;

/// One process's claim on the budget. Lease `k` is alive exactly while its owner holds an OFD
/// lock on byte [`LEASE_LOCK_BASE`]` + k`; the kernel drops that lock when the owner dies. Only
/// the owner writes `used` and `pending`; HAMi slot `k` mirrors the lease for the monitor.
#[repr(C)]
pub struct Lease {
    /// [`LEASE_FREE`], [`LEASE_LIVE`] or [`LEASE_REAPING`].
    pub state: u32,
    /// Index of the HAMi slot that mirrors this lease (always the lease's own index) in the low
    /// 16 bits ([`SLOT_INDEX_MASK`]); above them, what the owner honours ([`OWNER_FEATURES`]).
    pub slot: u32,
    pub pid: i32,
    _pad: u32,
    /// Per device index: the bytes this process holds in the low [`BYTE_BITS`] bits, and in the
    /// high bits how many of its updates are in flight (announced before the container total
    /// moves, withdrawn once the lease agrees with it).
    pub used: [u64; MAX_DEVICES],
}

/// Bytes take the low 48 bits of a total or lease word (256 TiB per device).
pub const BYTE_BITS: u32 = 48;
pub const BYTE_MASK: u64 = (1 << BYTE_BITS) - 1;
/// One version step of a total, or one update in flight in a lease.
pub const HIGH_STEP: u64 = 1 << BYTE_BITS;

pub const LEASE_FREE: u32 = 0;
pub const LEASE_LIVE: u32 = 1;
/// A dead owner's bytes are being given back by one reclaimer.
pub const LEASE_REAPING: u32 = 2;

/// Lease locks live far past the end of the file (a lock may cover bytes that don't exist).
pub const LEASE_LOCK_BASE: i64 = 1 << 40;
/// Just below them, one byte per device index: release 0.1.0 holds it while it measures a
/// context's cost device-wide. Later releases measure a process's own figure and need no lock.
pub const MEASURE_LOCK_BASE: i64 = LEASE_LOCK_BASE - MAX_DEVICES as i64;

pub const FILE_SIZE: usize = size_of::<RegionFile>();

const _: () = {
    assert!(offset_of!(RegionFile, magic) == 0);
    assert!(offset_of!(RegionFile, major) == 4);
    assert!(offset_of!(RegionFile, minor) == 8);
    assert!(offset_of!(RegionFile, device_num) == 56);
    assert!(offset_of!(RegionFile, uuids) == 64);
    assert!(offset_of!(RegionFile, limit) == 1600);
    assert!(offset_of!(RegionFile, sm_limit) == 1728);
    assert!(offset_of!(RegionFile, slots) == 1856);
    assert!(size_of::<HamiSlot>() == 1960);
    assert!(offset_of!(HamiSlot, pid) == 0);
    assert!(offset_of!(HamiSlot, host_pid) == 4);
    assert!(offset_of!(HamiSlot, memory) == 8);
    assert!(size_of::<DeviceMemory>() == 64);
    assert!(offset_of!(DeviceMemory, context) == 0);
    assert!(offset_of!(DeviceMemory, data) == 16);
    assert!(offset_of!(DeviceMemory, total) == 32);
    assert!(offset_of!(DeviceMemory, spillable) == 40);
    assert!(offset_of!(HamiSlot, util) == 1160);
    assert!(size_of::<DeviceUtil>() == 48);
    assert!(offset_of!(DeviceUtil, sm_util) == 16);
    assert!(offset_of!(HamiSlot, status) == 1928);
    assert!(offset_of!(RegionFile, proc_num) == 2_008_896);
    assert!(offset_of!(RegionFile, utilization_switch) == 2_008_900);
    assert!(offset_of!(RegionFile, recent_kernel) == 2_008_904);
    assert!(offset_of!(RegionFile, priority) == 2_008_908);
    assert!(offset_of!(RegionFile, last_kernel_time) == 2_008_912);
    assert!(offset_of!(RegionFile, ledger) >= HAMI_MIN_SIZE);
    assert!(offset_of!(RegionFile, ledger) == 2_008_960);
    assert!(size_of::<Lease>() == 144);
    // tests/shared_ledger.rs writes lease states at this offset.
    assert!(offset_of!(RegionFile, ledger) + offset_of!(Ledger, leases) == 2_008_960 + 336);
    assert!(offset_of!(Lease, state) == 0);
    // The ledger header as release 0.1.0 laid it out: its fields may never move.
    assert!(offset_of!(Ledger, magic) == 0);
    assert!(offset_of!(Ledger, version) == 8);
    assert!(offset_of!(Ledger, created_by) == 12);
    assert!(offset_of!(Ledger, compatible) == 16);
    assert!(offset_of!(Ledger, required) == 24);
    // Overcommit (0.2.x), in the reserved header bytes 32..80.
    assert!(offset_of!(Ledger, overcommit) == 32);
    assert!(offset_of!(Ledger, spilled) == 40);
    // Exact context costs (0.2.x), in the reserved header bytes.
    assert!(offset_of!(Ledger, context_cost_exact) == 48);
    assert!(offset_of!(Ledger, limit) == 80);
    assert!(offset_of!(Ledger, used) == 208);
    assert!(offset_of!(Lease, slot) == 4);
    assert!(FILE_SIZE == RELEASE_0_1_0_FILE_SIZE);
};

/// The size of the file release 0.1.0 creates (and checks for). A later release that needs more
/// room grows the file in place (docs/shared-ledger.md); until then, this build's is the same.
pub const RELEASE_0_1_0_FILE_SIZE: usize = 2_157_184;
