//! Memory overcommit (`CUDA_OVERSUBSCRIBE`, docs/overcommit.md) against the fake driver, whose
//! managed memory may exceed its card while device memory cannot: what a container may allocate
//! and is told, and how its spillable and device memory are counted across processes, kills
//! included.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{GIB, MIB, Run, Scratch};

const CUDA_ERROR_OUT_OF_MEMORY: u64 = 2;
const WAIT: Duration = Duration::from_secs(10);

/// `fill 256` on a 2 GiB fake card under a 4 GiB budget, with `extra` variables.
fn fill_on_small_card(extra: &[(&str, &str)]) -> common::Report {
    let mut run = Run::new("procaddr", &["fill", "256"])
        .env("FAKEGPU_MEMORY", "2g")
        .env("FAKEGPU_CONTEXT_MEMORY", "0")
        .env("CUDA_DEVICE_MEMORY_LIMIT_0", "4g");
    for (key, value) in extra {
        run = run.env(key, value);
    }
    run.report()
}

#[test]
fn a_budget_past_the_card_is_usable_and_reported_with_the_variable() {
    for spelling in ["true", "TRUE", "1"] {
        let r = fill_on_small_card(&[("CUDA_OVERSUBSCRIBE", spelling)]);
        assert!(r.success, "{spelling}: {r:?}");
        assert_eq!(r.get("device_total"), 4 * GIB, "{spelling}: cuDeviceTotalMem_v2 is the budget");
        assert_eq!(r.get("info_total"), 4 * GIB, "{spelling}: cuMemGetInfo_v2 total");
        assert_eq!(r.get("info_free"), 4 * GIB, "{spelling}: cuMemGetInfo_v2 free");
        assert_eq!(r.get("first_bytes"), 4 * GIB, "{spelling}: the whole budget is usable");
        assert_eq!(r.get("first_status"), CUDA_ERROR_OUT_OF_MEMORY, "{spelling}: refused at the budget");
        assert_eq!(r.get("full_free"), 0, "{spelling}");
        assert_eq!(
            r.get("driver_peak"),
            0,
            "{spelling}: all of it managed, none of the card's device memory"
        );
        assert_eq!(r.get("advised_preferred"), 16, "{spelling}: each block prefers the GPU");
        assert_eq!(
            r.get("advised_accessed_by"),
            0,
            "{spelling}: no accessed-by mapping, which makes a first eviction and its way back slow"
        );
        assert_eq!(r.get("freed_free"), 4 * GIB, "{spelling}: the budget whole after freeing");
        assert_eq!(r.get("second_bytes"), 4 * GIB, "{spelling}: second fill");
    }
}

#[test]
fn without_the_variable_the_card_bounds_the_budget_as_before() {
    for extra in [&[][..], &[("CUDA_OVERSUBSCRIBE", "false")][..]] {
        let r = fill_on_small_card(extra);
        assert!(r.success, "{extra:?}: {r:?}");
        assert_eq!(r.get("device_total"), 2 * GIB, "{extra:?}");
        assert_eq!(r.get("info_total"), 2 * GIB, "{extra:?}");
        assert_eq!(r.get("info_free"), 2 * GIB, "{extra:?}");
        assert_eq!(r.get("first_bytes"), 2 * GIB, "{extra:?}: the card's device memory");
        assert_eq!(r.get("first_status"), CUDA_ERROR_OUT_OF_MEMORY, "{extra:?}: the driver's refusal");
        assert_eq!(r.get("driver_peak"), 2 * GIB, "{extra:?}: device memory");
        assert_eq!(r.get("advised_preferred"), 0, "{extra:?}: device memory takes no advice");
    }
}

#[test]
fn nvml_reports_the_budget_past_the_card() {
    let nvml = |oversubscribe: bool| {
        let mut run =
            Run::new("direct", &["nvml"]).env("FAKEGPU_MEMORY", "2g").env("CUDA_DEVICE_MEMORY_LIMIT_0", "4g");
        if oversubscribe {
            run = run.env("CUDA_OVERSUBSCRIBE", "true");
        }
        run.report()
    };
    let on = nvml(true);
    assert_eq!((on.get("nvml0_total"), on.get("nvml0_v2_total")), (4 * GIB, 4 * GIB), "{on:?}");
    let off = nvml(false);
    assert_eq!((off.get("nvml0_total"), off.get("nvml0_v2_total")), (2 * GIB, 2 * GIB), "{off:?}");
}

#[test]
fn a_bad_value_is_reported_and_overcommit_stays_off() {
    let r = fill_on_small_card(&[("CUDA_OVERSUBSCRIBE", "sometimes")]);
    assert_eq!(r.get("first_bytes"), 2 * GIB);
    assert!(r.stderr.contains("CUDA_OVERSUBSCRIBE=\"sometimes\" is not true or false"), "{}", r.stderr);
}

/// One container on one shared 2 GiB fake card with a 4 GiB budget on device 0.
struct Container {
    scratch: Scratch,
}

impl Container {
    fn new(name: &str) -> Container {
        Container { scratch: Scratch::new(name) }
    }

    fn region(&self) -> std::path::PathBuf {
        self.scratch.path("region.cache")
    }

    /// A `steps` client of the container; `oversubscribe` sets the variable in its environment.
    fn process(&self, oversubscribe: bool) -> common::Client {
        let mut run = Run::new("direct", &["steps"])
            .env("FAKEGPU_MEMORY", "2g")
            .env("FAKEGPU_CONTEXT_MEMORY", "0")
            .env("FAKEGPU_SHARED", self.scratch.path("card").to_str().expect("utf-8"))
            .env("CUDA_DEVICE_MEMORY_SHARED_CACHE", self.region().to_str().expect("utf-8"))
            .env("CUDA_DEVICE_MEMORY_LIMIT_0", "4g")
            .env("LIBCUDA_LOG_LEVEL", "3");
        if oversubscribe {
            run = run.env("CUDA_OVERSUBSCRIBE", "true");
        }
        let mut client = run.spawn();
        client.wait_for("ready", WAIT);
        client
    }
}

/// Sends `step` (whose tag is `tag`) and returns the value of `TAG_key`.
fn step(client: &mut common::Client, line: &str, key: &str) -> u64 {
    client.send(line);
    client.wait_for(key, WAIT)
}

/// (used, spillable) of device 0 of the region at `path`, and the spillable bytes of each live
/// lease of `pids`.
fn books(path: &Path, pids: &[u32]) -> (u64, u64, Vec<u64>) {
    let snapshot = vgpu_ledger::inspect::inspect(path).expect("a region");
    let device = &snapshot.devices[0];
    let per_pid = pids
        .iter()
        .map(|&pid| {
            snapshot
                .leases
                .iter()
                .find(|lease| lease.pid == pid as i32 && lease.alive)
                .map_or(0, |lease| lease.devices[0].spillable)
        })
        .collect();
    (device.used, device.spillable, per_pid)
}

/// Waits until device 0 of the region shows `used` and `spillable`.
fn wait_for_books(path: &Path, used: u64, spillable: u64) {
    let deadline = Instant::now() + WAIT;
    loop {
        let (now_used, now_spillable, _) = books(path, &[]);
        if (now_used, now_spillable) == (used, spillable) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "used {now_used}, spillable {now_spillable}; expected {used}, {spillable}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn spillable_and_device_memory_are_counted_across_processes_and_kills() {
    let c = Container::new("overcommit-books");
    // The first process has the variable; the second was started without it (a stripped shell)
    // and follows the container through the region.
    let mut first = c.process(true);
    assert_eq!(step(&mut first, "alloc a1 1024", "a1_status"), 0);
    assert_eq!(step(&mut first, "alloc a2 1024", "a2_status"), 0);
    assert_eq!(step(&mut first, "async a3 512", "a3_status"), 0, "stream-ordered: device memory");
    let mut second = c.process(false);
    assert_eq!(step(&mut second, "alloc b1 512", "b1_status"), 0);
    assert_eq!(step(&mut second, "async b2 1024", "b2_status"), 0);
    let (used, spillable, per_process) = books(&c.region(), &[first.pid(), second.pid()]);
    assert_eq!(used, 4 * GIB, "the budget is charged the same for both kinds");
    assert_eq!(spillable, 2 * GIB + 512 * MIB);
    assert_eq!(per_process, vec![2 * GIB, 512 * MIB]);
    // The card holds the device memory; the managed memory is beyond it.
    assert_eq!(step(&mut second, "driver d1", "d1_used"), 1536 * MIB);
    assert_eq!(second.wait_for("d1_managed", WAIT), 2 * GIB + 512 * MIB);
    // The budget is full: neither kind is handed out past it.
    assert_eq!(step(&mut second, "alloc b3 64", "b3_status"), CUDA_ERROR_OUT_OF_MEMORY);
    assert_eq!(step(&mut second, "async b4 64", "b4_status"), CUDA_ERROR_OUT_OF_MEMORY);
    // A free gives back both the charge and the spillable count.
    assert_eq!(step(&mut first, "free f1", "f1_freed"), 1, "the newest: a3, device memory");
    assert_eq!(step(&mut first, "free f2", "f2_freed"), 1, "then a2, spillable");
    let (used, spillable, per_process) = books(&c.region(), &[first.pid(), second.pid()]);
    assert_eq!((used, spillable), (2 * GIB + 512 * MIB, GIB + 512 * MIB));
    assert_eq!(per_process, vec![GIB, 512 * MIB]);

    first.kill();
    let first = first.finish(WAIT);
    assert!(
        first.stderr.contains("now holds spillable memory"),
        "the container's first spill is logged: {}",
        first.stderr
    );
    wait_for_books(&c.region(), 1536 * MIB, 512 * MIB);
    second.kill();
    let second = second.finish(WAIT);
    assert!(!second.stderr.contains("now holds spillable memory"), "only once: {}", second.stderr);
    // Nobody is left to reclaim on a close event of theirs: a new process of the container does.
    let mut third = c.process(true);
    assert_eq!(step(&mut third, "info i", "i_total"), 4 * GIB);
    wait_for_books(&c.region(), 0, 0);
}

#[test]
fn device_memory_is_refused_at_the_card_and_rolled_back() {
    let c = Container::new("overcommit-card");
    let mut p = c.process(true);
    assert_eq!(step(&mut p, "async a1 1536", "a1_status"), 0);
    // Within the budget but past the card: the driver refuses and the charge is rolled back.
    assert_eq!(step(&mut p, "async a2 1024", "a2_status"), CUDA_ERROR_OUT_OF_MEMORY);
    assert_eq!(books(&c.region(), &[]).0, 1536 * MIB);
    // Spillable memory still fits the rest of the budget.
    assert_eq!(step(&mut p, "alloc a3 2560", "a3_status"), 0);
    let (used, spillable, _) = books(&c.region(), &[]);
    assert_eq!((used, spillable), (4 * GIB, 2560 * MIB));
    // What can never be managed memory: an IPC export of a spillable allocation is the driver's
    // refusal (CUDA_ERROR_INVALID_VALUE), not a crash.
    assert_eq!(step(&mut p, "ipc e1", "e1_status"), 1);
    p.close_stdin();
    assert!(p.finish(WAIT).success);
}

#[test]
fn a_process_that_launches_again_after_idling_prefetches_its_memory() {
    let c = Container::new("overcommit-prefetch");
    let mut run = Run::new("direct", &["steps"])
        .env("FAKEGPU_MEMORY", "2g")
        .env("CUDA_DEVICE_MEMORY_SHARED_CACHE", c.region().to_str().expect("utf-8"))
        .env("CUDA_DEVICE_MEMORY_LIMIT_0", "4g")
        .env("CUDA_OVERSUBSCRIBE", "true")
        .env("LIBVGPU_PREFETCH_IDLE_MS", "100")
        .spawn();
    run.wait_for("ready", WAIT);
    assert_eq!(step(&mut run, "alloc a1 256", "a1_status"), 0);
    assert_eq!(step(&mut run, "alloc a2 256", "a2_status"), 0);
    // The first launch finds the process idle since it started: everything is migrated.
    assert_eq!(step(&mut run, "launch l1", "l1_status"), 0);
    assert_eq!(run.wait_for("l1_prefetched", WAIT), 512 * MIB);
    // Busy: launches go straight through.
    assert_eq!(step(&mut run, "launch l2", "l2_status"), 0);
    assert_eq!(run.wait_for("l2_prefetched", WAIT), 512 * MIB);
    // Idle past 100 ms: migrated back (the first launch's placement does not count as one).
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(step(&mut run, "launch l3", "l3_status"), 0);
    assert_eq!(run.wait_for("l3_prefetched", WAIT), GIB, "a resume right after the first launch");
    // Idle again, but within ten idle spans of that migration: not yet.
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(step(&mut run, "launch l4", "l4_status"), 0);
    assert_eq!(run.wait_for("l4_prefetched", WAIT), GIB);
    std::thread::sleep(Duration::from_millis(1100));
    assert_eq!(step(&mut run, "launch l5", "l5_status"), 0);
    assert_eq!(
        run.wait_for("l5_prefetched", WAIT),
        3 * 512 * MIB,
        "idle, and a second since: migrated again"
    );
    run.close_stdin();
    assert!(run.finish(WAIT).success);

    // Off with 0, and never without the variable.
    for (var, value) in [("LIBVGPU_PREFETCH_IDLE_MS", "0"), ("CUDA_OVERSUBSCRIBE", "false")] {
        let mut run = Run::new("direct", &["steps"])
            .env("FAKEGPU_MEMORY", "2g")
            .env("CUDA_DEVICE_MEMORY_LIMIT_0", "4g")
            .env("CUDA_OVERSUBSCRIBE", "true")
            .env(var, value)
            .spawn();
        run.wait_for("ready", WAIT);
        assert_eq!(step(&mut run, "alloc a1 256", "a1_status"), 0);
        assert_eq!(step(&mut run, "launch l1", "l1_status"), 0);
        assert_eq!(run.wait_for("l1_prefetched", WAIT), 0, "{var}={value}");
        run.close_stdin();
        assert!(run.finish(WAIT).success);
    }
}

#[test]
fn without_the_variable_allocations_are_device_memory() {
    let c = Container::new("overcommit-off");
    let mut run = Run::new("direct", &["steps"])
        .env("FAKEGPU_MEMORY", "2g")
        .env("FAKEGPU_CONTEXT_MEMORY", "0")
        .env("FAKEGPU_SHARED", c.scratch.path("card").to_str().expect("utf-8"))
        .env("CUDA_DEVICE_MEMORY_SHARED_CACHE", c.region().to_str().expect("utf-8"))
        .env("CUDA_DEVICE_MEMORY_LIMIT_0", "4g")
        .spawn();
    run.wait_for("ready", WAIT);
    assert_eq!(step(&mut run, "alloc a1 256", "a1_status"), 0);
    assert_eq!(step(&mut run, "driver d", "d_used"), 256 * MIB);
    assert_eq!(run.wait_for("d_managed", WAIT), 0);
    assert_eq!(step(&mut run, "ipc e", "e_status"), 0, "device memory exports as before");
    let snapshot = vgpu_ledger::inspect::inspect(&c.region()).expect("a region");
    assert!(!snapshot.devices[0].overcommit && snapshot.devices[0].spillable == 0);
    run.close_stdin();
    assert!(run.finish(WAIT).success);
}
