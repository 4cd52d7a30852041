//! The read-only inspection API and `reclaim_dead` against real region files: leases kept alive
//! by an OFD lock held here read as alive, leases without one as dead, and `reclaim_dead` frees
//! exactly the dead ones, never creating or initialising a file.

use std::fs::{File, OpenOptions};
use std::mem::{offset_of, size_of};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use vgpu_ledger::inspect::{InspectError, LeaseState, inspect};
use vgpu_ledger::reclaim_dead;
use vgpu_ledger::region::layout::{
    DeviceMemory, FILE_SIZE, HAMI_MIN_SIZE, HamiSlot, LEASE_LIVE, LEASE_REAPING, Lease, Ledger, MAX_DEVICES,
    RegionFile, UNLIMITED,
};
use vgpu_ledger::region::{InitialContents, Region, RegionError, claim_lease};

const MIB: u64 = 1 << 20;
const LEDGER: usize = offset_of!(RegionFile, ledger);

/// A file of its own under cargo's scratch directory for integration tests.
fn scratch(name: &str) -> PathBuf {
    let dir =
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("ledger-inspect-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let path = dir.join(name);
    let _ = std::fs::remove_file(&path);
    path
}

/// A new region with one device budgeted at 1 GiB.
fn new_region(path: &Path) -> Region {
    let mut limits = [UNLIMITED; MAX_DEVICES];
    limits[0] = 1 << 30;
    let contents = InitialContents {
        uuids: vec![b"GPU-face0000-0000-4e00-8000-000000000000".to_vec()],
        limits,
        sm_limits: [0; MAX_DEVICES],
        priority: 0,
    };
    Region::open(path, &contents).expect("create region")
}

/// Writes lease `k` as a live process `pid` holding `bytes` on device 0, with its HAMi slot, and
/// adds them to the container's total, as a process that charged them would have.
fn write_lease(file: &File, k: usize, pid: i32, bytes: u64) {
    let lease = LEDGER + offset_of!(Ledger, leases) + k * size_of::<Lease>();
    let slot = offset_of!(RegionFile, slots) + k * size_of::<HamiSlot>();
    let memory = slot + offset_of!(HamiSlot, memory);
    let put = |at: usize, value: &[u8]| file.write_all_at(value, at as u64).expect("write region");
    put(lease + offset_of!(Lease, pid), &pid.to_le_bytes());
    put(lease + offset_of!(Lease, used), &bytes.to_le_bytes());
    put(lease + offset_of!(Lease, state), &LEASE_LIVE.to_le_bytes());
    put(slot + offset_of!(HamiSlot, pid), &pid.to_le_bytes());
    put(memory + offset_of!(DeviceMemory, data), &bytes.to_le_bytes());
    put(memory + offset_of!(DeviceMemory, total), &bytes.to_le_bytes());
    put(slot + offset_of!(HamiSlot, status), &1i32.to_le_bytes());
    let total = (LEDGER + offset_of!(Ledger, used)) as u64;
    let mut word = [0u8; 8];
    file.read_exact_at(&mut word, total).expect("read total");
    put(total as usize, &(u64::from_le_bytes(word) + bytes).to_le_bytes());
    let proc_num = offset_of!(RegionFile, proc_num);
    put(proc_num, &(k as i32 + 1).max(read_i32(file, proc_num)).to_le_bytes());
}

fn read_i32(file: &File, at: usize) -> i32 {
    let mut bytes = [0u8; 4];
    file.read_exact_at(&mut bytes, at as u64).expect("read");
    i32::from_le_bytes(bytes)
}

#[test]
fn live_and_dead_leases_and_reclaiming_only_the_dead() {
    let path = scratch("region.cache");
    let _region = new_region(&path);
    let file = OpenOptions::new().read(true).write(true).open(&path).expect("open region");
    // Lease 0's owner lives: this test's own open file description holds its lock.
    let owner = OpenOptions::new().read(true).write(true).open(&path).expect("open region");
    assert!(claim_lease(owner.as_raw_fd(), 0));
    write_lease(&file, 0, 1111, 300 * MIB);
    // Lease 2's owner died: nothing holds its lock.
    write_lease(&file, 2, 2222, 200 * MIB);
    let before = std::fs::read(&path).expect("read region");

    let snapshot = inspect(&path).expect("inspect");
    assert_eq!(std::fs::read(&path).expect("read region"), before, "inspect changed the file");
    let device = &snapshot.devices[0];
    assert_eq!((device.budget, device.used, device.slots.total), (Some(1 << 30), 500 * MIB, 500 * MIB));
    let leases: Vec<_> =
        snapshot.leases.iter().map(|l| (l.lease, l.pid, l.state, l.alive, l.bytes())).collect();
    assert_eq!(
        leases,
        [(0, 1111, LeaseState::Live, true, 300 * MIB), (2, 2222, LeaseState::Live, false, 200 * MIB)]
    );

    let report = reclaim_dead(&path).expect("reclaim");
    assert!(report.changed);
    assert_eq!(report.reclaimed.len(), 1, "{report:?}");
    assert_eq!((report.reclaimed[0].lease, report.reclaimed[0].pid), (2, 2222));
    assert_eq!(report.reclaimed[0].bytes[0], 200 * MIB);
    assert_eq!((report.used_before[0], report.used_after[0]), (500 * MIB, 300 * MIB));

    let after = inspect(&path).expect("inspect");
    assert_eq!(after.devices[0].used, 300 * MIB);
    assert_eq!(after.devices[0].slots.total, 300 * MIB, "the dead slot is cleared for the monitor");
    assert_eq!(after.leases.iter().map(|l| (l.pid, l.alive)).collect::<Vec<_>>(), [(1111, true)]);

    // Nothing left to do: a second run changes nothing.
    let again = reclaim_dead(&path).expect("reclaim");
    assert!(!again.changed && again.reclaimed.is_empty(), "{again:?}");
    drop(owner);
    let _ = std::fs::remove_file(&path);
}

/// Sets lease `k`'s state word.
fn set_state(file: &File, k: usize, state: u32) {
    let at = LEDGER + offset_of!(Ledger, leases) + k * size_of::<Lease>() + offset_of!(Lease, state);
    file.write_all_at(&state.to_le_bytes(), at as u64).expect("write state");
}

/// Sets lease `k`'s bytes on device 0, leaving the container's total as it is.
fn set_lease_bytes(file: &File, k: usize, bytes: u64) {
    let at = LEDGER + offset_of!(Ledger, leases) + k * size_of::<Lease>() + offset_of!(Lease, used);
    file.write_all_at(&bytes.to_le_bytes(), at as u64).expect("write lease");
}

#[test]
fn a_lease_whose_reclaimer_died_half_way_is_finished_by_the_next() {
    let path = scratch("reaper-died.cache");
    let _region = new_region(&path);
    let file = OpenOptions::new().read(true).write(true).open(&path).expect("open region");
    let owner = OpenOptions::new().read(true).write(true).open(&path).expect("open region");
    assert!(claim_lease(owner.as_raw_fd(), 0));
    write_lease(&file, 0, 1111, 300 * MIB);
    // Lease 1's reclaimer died right after taking it (LIVE → REAPING): its bytes are still in it.
    write_lease(&file, 1, 2222, 100 * MIB);
    set_state(&file, 1, LEASE_REAPING);
    // Lease 2's died after taking its bytes out of the lease, before taking them out of the total.
    write_lease(&file, 2, 3333, 200 * MIB);
    set_lease_bytes(&file, 2, 0);
    set_state(&file, 2, LEASE_REAPING);
    // Lease 3's reclaimer lives (this test holds the lease's lock): it is left to finish.
    let reclaimer = OpenOptions::new().read(true).write(true).open(&path).expect("open region");
    assert!(claim_lease(reclaimer.as_raw_fd(), 3));
    write_lease(&file, 3, 4444, 50 * MIB);
    set_state(&file, 3, LEASE_REAPING);
    assert_eq!(inspect(&path).expect("inspect").devices[0].used, 650 * MIB);

    // Leases 1 and 2 are finished: lease 1's bytes come out of the total at once; lease 2's wait
    // for a recount, which cannot settle while lease 3 is being reclaimed.
    let report = reclaim_dead(&path).expect("reclaim");
    assert!(report.changed, "{report:?}");
    assert_eq!((report.used_before[0], report.used_after[0]), (650 * MIB, 550 * MIB), "{report:?}");
    let after = inspect(&path).expect("inspect");
    let leases: Vec<_> = after.leases.iter().map(|l| (l.lease, l.state)).collect();
    assert_eq!(leases, [(0, LeaseState::Live), (3, LeaseState::Reaping)], "leases 1 and 2 are free again");
    assert_eq!(after.devices[0].slots.total, 350 * MIB, "their slots are cleared for the monitor");

    // Lease 3's reclaimer dies too: the next reclaim finishes lease 3, and the recount returns
    // what lease 2's reclaimer left in the total.
    drop(reclaimer);
    let report = reclaim_dead(&path).expect("reclaim");
    assert!(report.changed, "{report:?}");
    assert_eq!(report.used_after[0], 300 * MIB, "only the live lease's bytes: {report:?}");
    let after = inspect(&path).expect("inspect");
    assert_eq!(after.leases.iter().map(|l| l.lease).collect::<Vec<_>>(), [0]);
    assert_eq!(after.devices[0].slots.total, 300 * MIB);
    drop(owner);
    let _ = std::fs::remove_file(&path);
}

#[test]
fn reclaim_never_creates_or_initialises_a_file() {
    let missing = scratch("missing.cache");
    match reclaim_dead(&missing) {
        Err(RegionError::Io { error, .. }) => assert_eq!(error.kind(), std::io::ErrorKind::NotFound),
        other => panic!("{other:?}"),
    }
    assert!(!missing.exists(), "reclaim created the file");

    let empty = scratch("empty.cache");
    File::create(&empty).expect("create");
    assert!(matches!(reclaim_dead(&empty), Err(RegionError::TooSmall { size: 0, .. })));
    assert_eq!(std::fs::metadata(&empty).expect("stat").len(), 0, "reclaim initialised an empty file");
    assert!(matches!(inspect(&empty), Err(InspectError::Truncated { size: 0, .. })));

    // Full size, magic never stored: the library would initialise it, reclaim must not.
    let unfinished = scratch("unfinished.cache");
    std::fs::write(&unfinished, vec![0u8; FILE_SIZE]).expect("write");
    assert!(matches!(reclaim_dead(&unfinished), Err(RegionError::ForeignMagic { magic: 0, .. })));
    assert!(std::fs::read(&unfinished).expect("read").iter().all(|&b| b == 0));
    assert!(matches!(inspect(&unfinished), Err(InspectError::NotInitialised { .. })));

    // HAMi-core's region: the HAMi area alone.
    let hami = scratch("hami.cache");
    let mut bytes = vec![0u8; HAMI_MIN_SIZE];
    bytes[..4].copy_from_slice(&19920718i32.to_le_bytes());
    bytes[4..8].copy_from_slice(&1u32.to_le_bytes());
    std::fs::write(&hami, &bytes).expect("write");
    assert!(matches!(reclaim_dead(&hami), Err(RegionError::NoLedger { .. })));
    assert!(matches!(inspect(&hami), Err(InspectError::NoLedger { .. })));
    assert_eq!(std::fs::read(&hami).expect("read"), bytes);

    for path in [empty, unfinished, hami] {
        let _ = std::fs::remove_file(path);
    }
}
