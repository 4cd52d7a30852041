//! One budget per device for every process of a container, kept in the shared region file
//! (docs/architecture.md, "The region file"): real client processes under `LD_PRELOAD`, each test
//! with a file of its own, and the file read back in HAMi-core's v1 layout as HAMi's node monitor
//! reads it.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{Client, GIB, MIB, Run, SHARED_CACHE_VAR, Scratch, XorShift};

const CUDA_ERROR_OUT_OF_MEMORY: u64 = 2;
/// Bound on a client's start-up (libraries loaded, region mapped, allocations done).
const READY: Duration = Duration::from_secs(10);
/// Bound on a client's exit once told to (stdin closed, or SIGKILL).
const EXIT: Duration = Duration::from_secs(10);

/// HAMi-core's v1 region, read from a snapshot of the file (offsets from docs/architecture.md,
/// "The region file").
mod layout {
    pub const MAGIC: i32 = 19920718;
    pub const DEVICE_NUM: usize = 56;
    pub const UUID: usize = 64;
    pub const UUID_LEN: usize = 96;
    pub const LIMIT: usize = 1600;
    pub const SLOTS: usize = 1856;
    pub const SLOT_LEN: usize = 1960;
    pub const MAX_SLOTS: usize = 1024;
    /// Device i's counters start at slot + 8 + 64·i; the tests budget device 0 only.
    pub const SLOT_DEVICE: usize = 8;
    pub const DEVICE_DATA: usize = 16;
    pub const DEVICE_TOTAL: usize = 32;
    pub const SLOT_STATUS: usize = 1928;
    pub const PROC_NUM: usize = 2_008_896;
    pub const PRIORITY: usize = 2_008_908;
    /// The smallest file HAMi's monitor accepts.
    pub const MIN_FILE: usize = 2_008_952;
}

struct Region {
    bytes: Vec<u8>,
}

/// One process slot as the monitor sees it.
#[derive(Debug)]
struct Slot {
    pid: i32,
    status: i32,
    /// `data` bytes on device 0.
    data0: u64,
    /// `total` bytes on device 0.
    total0: u64,
}

impl Region {
    fn read(path: &Path) -> Region {
        let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
        assert!(
            bytes.len() >= layout::MIN_FILE,
            "{} is {} bytes, HAMi's monitor needs {}",
            path.display(),
            bytes.len(),
            layout::MIN_FILE
        );
        Region { bytes }
    }

    fn array<const N: usize>(&self, offset: usize) -> [u8; N] {
        self.bytes[offset..offset + N].try_into().expect("in range")
    }

    fn i32_at(&self, offset: usize) -> i32 {
        i32::from_le_bytes(self.array(offset))
    }

    fn u32_at(&self, offset: usize) -> u32 {
        u32::from_le_bytes(self.array(offset))
    }

    fn u64_at(&self, offset: usize) -> u64 {
        u64::from_le_bytes(self.array(offset))
    }

    fn magic(&self) -> i32 {
        self.i32_at(0)
    }

    fn version(&self) -> (u32, u32) {
        (self.u32_at(4), self.u32_at(8))
    }

    fn device_num(&self) -> u64 {
        self.u64_at(layout::DEVICE_NUM)
    }

    fn uuid(&self, device: usize) -> String {
        let start = layout::UUID + layout::UUID_LEN * device;
        let raw = &self.bytes[start..start + layout::UUID_LEN];
        let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
        String::from_utf8_lossy(&raw[..end]).into_owned()
    }

    fn limit(&self, device: usize) -> u64 {
        self.u64_at(layout::LIMIT + 8 * device)
    }

    fn proc_num(&self) -> i32 {
        self.i32_at(layout::PROC_NUM)
    }

    fn priority(&self) -> i32 {
        self.i32_at(layout::PRIORITY)
    }

    fn slot(&self, k: usize) -> Slot {
        let base = layout::SLOTS + layout::SLOT_LEN * k;
        let device0 = base + layout::SLOT_DEVICE;
        Slot {
            pid: self.i32_at(base),
            status: self.i32_at(base + layout::SLOT_STATUS),
            data0: self.u64_at(device0 + layout::DEVICE_DATA),
            total0: self.u64_at(device0 + layout::DEVICE_TOTAL),
        }
    }

    /// The slots the monitor reports: status 1 within [0, proc_num).
    fn live_slots(&self) -> Vec<Slot> {
        let n = usize::try_from(self.proc_num()).unwrap_or(0).min(layout::MAX_SLOTS);
        (0..n).map(|k| self.slot(k)).filter(|slot| slot.status == 1).collect()
    }
}

/// A fresh scratch directory and the region file every client of one test shares.
struct Container {
    scratch: Scratch,
    cache: PathBuf,
}

impl Container {
    fn new(name: &str) -> Container {
        let scratch = Scratch::new(name);
        let cache = scratch.path("cudevshr.cache");
        Container { scratch, cache }
    }

    /// A client of this container under `limit` on device 0.
    fn run(&self, path: &str, command: &[&str], limit: &str) -> Run {
        Run::new(path, command)
            .env(SHARED_CACHE_VAR, self.cache.to_str().expect("utf-8 path"))
            .env("CUDA_DEVICE_MEMORY_LIMIT_0", limit)
    }

    fn region(&self) -> Region {
        Region::read(&self.cache)
    }
}

#[test]
fn siblings_starting_together_are_charged_one_context_each() {
    // Each context takes 200 ms to appear, so eight processes starting at once overlap: measured
    // around its own creation, each would also count the others' contexts.
    let c = Container::new("burst");
    let fake = c.scratch.path("fake");
    let mut clients: Vec<Client> = (0..8)
        .map(|_| {
            c.run("procaddr", &["hold", "64", "64"], "2g")
                .env("FAKEGPU_SHARED", fake.to_str().expect("utf-8 path"))
                .env("FAKEGPU_CONTEXT_MEMORY", "128m")
                .env("FAKEGPU_CONTEXT_DELAY_MS", "200")
                .spawn()
        })
        .collect();
    for client in &mut clients {
        client.wait_for("ready", READY);
        assert_eq!(client.get("held_bytes"), 64 * MIB, "pid {} was refused", client.pid());
    }
    let live = c.region().live_slots();
    assert_eq!(live.len(), 8, "{live:?}");
    for slot in &live {
        assert_eq!(slot.total0, 192 * MIB, "pid {}: one 128 MiB context and 64 MiB", slot.pid);
    }
    for client in &mut clients {
        client.close_stdin();
    }
    for client in clients {
        let r = client.finish(EXIT);
        assert!(r.success && r.get("released") == 1, "{r:?}");
    }
}

fn driver_stats(fake_shared: &Path) -> common::Report {
    let r = Run::new("direct", &["driver_stats"])
        .native()
        .env("FAKEGPU_SHARED", fake_shared.to_str().expect("utf-8 path"))
        .report_within(EXIT);
    assert!(r.success, "{r:?}");
    r
}

#[test]
fn processes_started_together_share_one_budget_and_show_in_the_region() {
    let c = Container::new("together");
    let fake = c.scratch.path("fake");
    let paths = ["direct", "dlsym", "procaddr", "procaddr_v1"];
    let mut clients: Vec<Client> = (0..8)
        .map(|i| {
            c.run(paths[i % paths.len()], &["hold", "64"], "1g")
                .env("FAKEGPU_DEVICES", "2")
                .env("FAKEGPU_SHARED", fake.to_str().expect("utf-8 path"))
                .env("CUDA_TASK_PRIORITY", "1")
                .spawn()
        })
        .collect();
    let mut held = BTreeMap::new();
    for client in &mut clients {
        client.wait_for("ready", READY);
        assert_eq!(client.get("hold_status"), CUDA_ERROR_OUT_OF_MEMORY, "pid {}", client.pid());
        held.insert(client.pid() as i32, client.get("held_bytes"));
    }
    let sum: u64 = held.values().sum();
    assert!(sum <= GIB, "8 processes hold {sum} bytes together under a 1 GiB budget: {held:?}");
    assert!(sum >= GIB - 8 * 64 * MIB, "only {sum} bytes granted: {held:?}");
    let driver = driver_stats(&fake);
    assert!(driver.get("driver_peak") <= GIB, "the driver saw {} bytes at once", driver.get("driver_peak"));
    assert_eq!(driver.get("driver_used"), sum);

    let region = c.region();
    assert_eq!(region.magic(), layout::MAGIC);
    assert_eq!(region.version(), (1, 2));
    assert_eq!(region.device_num(), 2);
    assert_eq!(region.uuid(0), "GPU-face0000-0000-4e00-8000-000000000000");
    assert_eq!(region.uuid(1), "GPU-face0000-0000-4e00-8000-000000000001");
    assert_eq!(region.limit(0), GIB);
    assert_eq!(region.limit(1), 0, "device 1 has no budget");
    assert_eq!(region.priority(), 1, "CUDA_TASK_PRIORITY");
    assert_eq!(region.proc_num(), 8);
    let live = region.live_slots();
    assert_eq!(live.len(), 8, "{live:?}");
    let pids: BTreeSet<i32> = live.iter().map(|slot| slot.pid).collect();
    assert_eq!(pids, held.keys().copied().collect(), "one slot per process: {live:?}");
    for slot in &live {
        assert_eq!(slot.total0, held[&slot.pid], "device-0 total of pid {}", slot.pid);
        assert_eq!(slot.data0, held[&slot.pid], "device-0 data of pid {}", slot.pid);
    }

    for client in &mut clients {
        client.close_stdin();
    }
    for client in clients {
        let r = client.finish(EXIT);
        assert!(r.success && r.get("released") == 1, "{r:?}");
    }
    let live = c.region().live_slots();
    assert!(live.is_empty(), "processes that exited normally still have live slots: {live:?}");
    assert_eq!(driver_stats(&fake).get("driver_used"), 0);
}

#[test]
fn a_killed_process_gives_its_bytes_back_at_once() {
    let c = Container::new("killed");
    let mut victim = c.run("direct", &["hold", "768", "768"], "1g").spawn();
    assert_eq!(victim.wait_for("held_bytes", READY), 768 * MIB);
    victim.wait_for("ready", READY);

    // The budget is shared: while the victim holds 768 MiB, nobody else gets another 768.
    let refused = c.run("procaddr", &["hold", "768", "768"], "1g").report_within(EXIT);
    assert_eq!(refused.get("held_bytes"), 0, "{refused:?}");
    assert_eq!(refused.get("hold_status"), CUDA_ERROR_OUT_OF_MEMORY);

    let killed_at = Instant::now();
    victim.kill();
    let r = victim.finish(EXIT);
    assert!(!r.success, "SIGKILL must end it: {r:?}");
    let mut heir = c.run("dlsym", &["hold", "768", "768"], "1g").spawn();
    heir.wait_for("ready", READY);
    let elapsed = killed_at.elapsed();
    assert_eq!(heir.get("held_bytes"), 768 * MIB, "the killed process's 768 MiB are still counted");
    assert!(elapsed < Duration::from_secs(2), "{elapsed:?} from the kill to the next grant");
    heir.close_stdin();
    assert!(heir.finish(EXIT).success);
}

#[test]
fn processes_killed_at_random_instants_lose_nothing_and_block_nobody() {
    const ROUNDS: usize = 50;
    let c = Container::new("churn");
    let mut rng = XorShift::from_clock();
    let mut killed_while_allocating = 0;
    // A live neighbour allocating all along: recovery must happen under its feet.
    let mut neighbour = c.run("procaddr", &["churn", "64"], "1g").spawn();
    neighbour.wait_for("ready", READY);
    for round in 0..ROUNDS {
        let mut victim = c.run("direct", &["churn", "64"], "1g").spawn();
        std::thread::sleep(Duration::from_millis(rng.below(31)));
        victim.kill();
        if victim.finish(EXIT).values.contains_key("ready") {
            killed_while_allocating += 1;
        }
        // The neighbour holds at most 4 × 64 MiB, so at least 768 MiB in 64 MiB chunks must be
        // granted; a leaked reservation of any victim would eat into it round after round.
        let probe = c.run("dlsym", &["fill", "64"], "1g").report_within(EXIT);
        assert!(probe.success, "round {round}: {probe:?}");
        assert!(
            probe.get("first_bytes") >= 768 * MIB,
            "round {round}: only {} MiB granted beside the neighbour",
            probe.get("first_bytes") / MIB
        );
    }
    eprintln!("{killed_while_allocating} of {ROUNDS} victims were killed after their start-up");
    neighbour.kill();
    let _ = neighbour.finish(EXIT);
    let mut last = c.run("direct", &["hold", "64"], "1g").spawn();
    assert_eq!(
        last.wait_for("held_bytes", READY),
        GIB,
        "after {ROUNDS} kills and the neighbour's, the whole budget"
    );
    last.wait_for("ready", READY);
    // ... and it is one budget: nothing is left for anyone else.
    let other = c.run("dlsym", &["fill", "64"], "1g").report_within(EXIT);
    assert_eq!(other.get("first_bytes"), 0, "{other:?}");
    last.close_stdin();
    assert!(last.finish(EXIT).success);
}

/// Writes `contents` as the region file, runs a budgeted client on it, and checks the outcome
/// is a clear message and a refusal, with the file left as it was.
fn assert_fails_closed(name: &str, contents: &[u8], phrase: &str) {
    let c = Container::new(name);
    std::fs::write(&c.cache, contents).expect("write region file");
    let before = std::fs::metadata(&c.cache).expect("stat region file");
    let r = c.run("direct", &["fill", "64"], "1g").report_within(EXIT);
    assert!(r.success, "{name}: the process must carry on: {r:?}");
    assert_eq!(r.get("first_bytes"), 0, "{name}: fail closed, never unlimited");
    assert_eq!(r.get("first_status"), CUDA_ERROR_OUT_OF_MEMORY, "{name}");
    assert_eq!(r.get("driver_alloc_calls"), 0, "{name}: refused before the driver");
    let path = c.cache.to_str().expect("utf-8 path");
    let lines: Vec<&str> = r.stderr.lines().filter(|line| line.contains(path)).collect();
    assert_eq!(lines.len(), 1, "{name}: one line naming the file:\n{}", r.stderr);
    assert!(lines[0].to_lowercase().contains(phrase), "{name}: {:?} should say {phrase:?}", lines[0]);
    let after = std::fs::metadata(&c.cache).expect("region file still there");
    assert_eq!(after.len(), before.len(), "{name}: the file's size changed");
    assert_eq!(after.ino(), before.ino(), "{name}: the file was replaced");
}

/// A region file as a correct process leaves it: created by one client that then exited.
fn valid_region_file() -> Vec<u8> {
    let c = Container::new("valid-region");
    let r = c.run("direct", &["fill", "64"], "1g").report_within(EXIT);
    assert!(r.success && r.get("first_bytes") == GIB, "{r:?}");
    let bytes = std::fs::read(&c.cache).expect("the client created the region file");
    assert!(bytes.len() >= layout::MIN_FILE, "{} bytes", bytes.len());
    assert_eq!(i32::from_le_bytes(bytes[..4].try_into().expect("4 bytes")), layout::MAGIC);
    bytes
}

#[test]
fn a_corrupt_region_file_fails_closed_with_a_clear_message() {
    let valid = valid_region_file();

    let truncated = &valid[..4096];
    assert_fails_closed("too-small", truncated, "too small");

    let mut foreign = valid.clone();
    foreign[..4].copy_from_slice(&12345i32.to_le_bytes());
    assert_fails_closed("magic", &foreign, "magic");

    let mut future = valid.clone();
    future[4..8].copy_from_slice(&7u32.to_le_bytes());
    assert_fails_closed("version", &future, "version");

    // Made by an older libvgpu: our ledger's magic, an older ledger version, a shorter file.
    let ledger_version_at = 2_008_960 + 8;
    let mut older = valid[..valid.len() - 128].to_vec();
    older[ledger_version_at..ledger_version_at + 4].copy_from_slice(&1u32.to_le_bytes());
    assert_fails_closed("older-ledger", &older, "ledger version 1");
}

#[test]
fn the_limits_in_the_file_win_over_a_later_environment() {
    let c = Container::new("limits");
    let creator = c.run("direct", &["fill", "64"], "1g").report_within(EXIT);
    assert!(creator.success && creator.get("first_bytes") == GIB, "{creator:?}");
    assert_eq!(c.region().limit(0), GIB);
    let mismatch_lines = |stderr: &str| {
        stderr
            .lines()
            .filter(|line| line.contains("CUDA_DEVICE_MEMORY_LIMIT") && line.contains("file"))
            .count()
    };

    // Nobody attached: the file alone carries the budget.
    let greedy = c.run("dlsym", &["fill", "64"], "4g").report_within(EXIT);
    assert!(greedy.success, "{greedy:?}");
    assert_eq!(greedy.get("first_bytes"), GIB, "the file's 1 GiB, not the environment's 4 GiB");
    assert_eq!(greedy.get("device_total"), GIB, "the card it is shown is the file's budget too");
    assert_eq!(greedy.get("info_total"), GIB);
    assert_eq!(mismatch_lines(&greedy.stderr), 1, "one line about the mismatch:\n{}", greedy.stderr);
    assert_eq!(c.region().limit(0), GIB, "the file's limit was overwritten");

    // With a process attached and holding 64 MiB, a 4g latecomer gets the rest of 1 GiB.
    let mut holder = c.run("direct", &["hold", "64", "64"], "1g").spawn();
    assert_eq!(holder.wait_for("held_bytes", READY), 64 * MIB);
    holder.wait_for("ready", READY);
    let late = c.run("procaddr", &["fill", "64"], "4g").report_within(EXIT);
    assert_eq!(late.get("first_bytes"), GIB - 64 * MIB, "{late:?}");
    assert_eq!(mismatch_lines(&late.stderr), 1, "{}", late.stderr);
    let agreeing = c.run("procaddr_v1", &["fill", "64"], "1g").report_within(EXIT);
    assert_eq!(agreeing.get("first_bytes"), GIB - 64 * MIB);
    assert_eq!(mismatch_lines(&agreeing.stderr), 0, "no mismatch:\n{}", agreeing.stderr);

    holder.close_stdin();
    let holder = holder.finish(EXIT);
    assert!(holder.success, "{holder:?}");
    assert_eq!(mismatch_lines(&holder.stderr), 0, "{}", holder.stderr);
    assert_eq!(c.region().limit(0), GIB);
}

#[test]
fn a_forked_child_allocates_on_a_slot_of_its_own() {
    let c = Container::new("fork");
    let mut parent = c.run("direct", &["fork", "64"], "1g").spawn();
    parent.wait_for("ready", READY);
    let parent_pid = parent.get("parent_pid") as i32;
    let child_pid = parent.get("child_pid") as i32;
    assert_eq!(parent_pid, parent.pid() as i32);
    assert_eq!(parent.get("child_status"), 0, "the child's allocations");
    assert_eq!(parent.get("child_bytes"), 128 * MIB);

    let live = c.region().live_slots();
    assert_eq!(live.len(), 2, "{live:?}");
    let total = |pid: i32| {
        let slots: Vec<&Slot> = live.iter().filter(|slot| slot.pid == pid).collect();
        assert_eq!(slots.len(), 1, "pid {pid} should have one live slot: {live:?}");
        slots[0].total0
    };
    assert_eq!(total(parent_pid), 64 * MIB, "the parent's slot is untouched by the child");
    assert_eq!(total(child_pid), 128 * MIB, "the child's own slot");

    parent.close_stdin();
    let r = parent.finish(EXIT);
    assert!(r.success, "{r:?}");
    assert_eq!(r.get("child_exit"), 0, "{r:?}");
    assert_eq!(r.get("child_released"), 1);
    let live = c.region().live_slots();
    assert!(live.is_empty(), "{live:?}");
}

/// libvgpu's own ledger past the HAMi area (src/region/layout.rs): lease `k`'s state word, and the
/// byte whose OFD lock keeps lease `k` alive.
const LEASE_STATE: usize = 2_008_960 + 336;
const LEASE_LEN: usize = 144;
const LEASE_LOCK_BASE: i64 = 1 << 40;

#[test]
fn a_process_past_the_1024th_gets_a_clear_error_and_the_others_carry_on() {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::FileExt;

    let c = Container::new("full-region");
    assert!(c.run("direct", &["fill", "64"], "1g").report_within(EXIT).success);
    // Play 1024 live processes: mark every lease live and hold every lease lock from this test
    // process's own open file description, as each live owner would.
    let file = std::fs::OpenOptions::new().read(true).write(true).open(&c.cache).expect("open region");
    for lease in 0..layout::MAX_SLOTS {
        file.write_all_at(&1u32.to_le_bytes(), (LEASE_STATE + LEASE_LEN * lease) as u64).expect("mark lease");
        // SAFETY: `flock` is plain data; zeroed is valid and filled in below.
        let mut lock: libc::flock = unsafe { std::mem::zeroed() };
        lock.l_type = libc::F_WRLCK as i16;
        lock.l_whence = libc::SEEK_SET as i16;
        lock.l_start = LEASE_LOCK_BASE + lease as i64;
        lock.l_len = 1;
        // SAFETY: an open descriptor and a valid flock record.
        assert_eq!(unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_SETLK, &mut lock) }, 0);
    }
    let extra = c.run("direct", &["fill", "64"], "1g").report_within(EXIT);
    assert!(extra.success, "the extra process must not crash: {extra:?}");
    assert_eq!(extra.get("first_bytes"), 0);
    assert_eq!(extra.get("first_status"), CUDA_ERROR_OUT_OF_MEMORY);
    assert_eq!(extra.stderr.matches("1024 process slots are taken").count(), 1, "{}", extra.stderr);
    // The "processes" die (their locks go with the descriptor): the next process reaps them all.
    drop(file);
    let after = c.run("direct", &["fill", "64"], "1g").report_within(EXIT);
    assert_eq!(after.get("first_bytes"), GIB, "{after:?}");
}
