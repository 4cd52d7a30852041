//! No process waits on another, and nothing in the environment kills the application: real
//! client processes against the fake driver, with siblings stopped, killed, and the region's
//! filesystem full.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{GIB, MIB, Run, SHARED_CACHE_VAR, Scratch, ledger_used0, stop_and_kill};

const READY: Duration = Duration::from_secs(10);
const EXIT: Duration = Duration::from_secs(20);

/// `ledger.suspect[0]` (ledger/src/region/layout.rs), past the per-device totals and the 1024
/// leases of 144 bytes.
const LEDGER_SUSPECT0: u64 = 2_008_960 + 208 + 128 + 1024 * 144;

fn u64_at(path: &Path, offset: u64) -> u64 {
    use std::os::unix::fs::FileExt;
    let file = std::fs::File::open(path).expect("open");
    let mut bytes = [0u8; 8];
    file.read_exact_at(&mut bytes, offset).expect("read");
    u64::from_le_bytes(bytes)
}

/// Async page faults the hypervisor has delivered on this machine so far: the `HYP` row of
/// `/proc/interrupts`, summed over CPUs (0 where there is none: bare metal, or a hypervisor that
/// does not pass faults to the guest).
///
/// A KVM guest with async page faults puts a *user-mode* thread to sleep when it touches guest
/// memory the host has not brought in (a VM restored from a snapshot loads its memory lazily), and
/// wakes it with one of these interrupts. The thread sees a voluntary context switch and no page
/// fault of its own, in the middle of any instruction. CI's fresh VMs show a few.
fn hypervisor_page_ins() -> u64 {
    let interrupts = std::fs::read_to_string("/proc/interrupts").unwrap_or_default();
    let Some(row) = interrupts.lines().find(|line| line.trim_start().starts_with("HYP:")) else {
        return 0;
    };
    row.split_whitespace().skip(1).map_while(|field| field.parse::<u64>().ok()).sum()
}

/// Two processes churn allocations while siblings are stopped (SIGSTOP, up to 20 ms, then
/// SIGCONT) and killed at random moments. The churners' calls never sleep (a wait for a lock
/// shows as a voluntary context switch), usage never passes the budget, and at the end the ledger
/// and the driver read zero. The region is on tmpfs when the machine has `/dev/shm`.
///
/// The one sleep no process can avoid is the hypervisor's: each sleeping call of that kind comes
/// with one interrupt in [`hypervisor_page_ins`], so the churners may sleep at most as many times
/// as those interrupts arrived during the run (none on a machine without them). A lock held by a
/// stopped sibling would put hundreds of calls to sleep with no such interrupt.
#[test]
fn stopped_and_killed_siblings_never_hold_up_the_others() {
    const STOPS: usize = 200;
    const KILLS: usize = 100;
    const VICTIMS: usize = 3;
    // On tmpfs: this test times the ledger's calls, not the filesystem's writeback (see
    // `Scratch::in_memory`).
    let s = Scratch::in_memory("never-wait");
    let cache = s.path("cudevshr.cache");
    let fake = s.path("fake");
    let container = |command: &[&str]| {
        Run::new("direct", command)
            .env(SHARED_CACHE_VAR, cache.to_str().expect("utf-8"))
            .env("CUDA_DEVICE_MEMORY_LIMIT_0", "1g")
    };
    // The churners share a driver ledger with each other; victims count on private ones (a real
    // driver frees a killed process's memory, the fake cannot know it died).
    let runner = || {
        container(&["timed-churn", "8", "64"]).env("FAKEGPU_SHARED", fake.to_str().expect("utf-8")).spawn()
    };
    let victim = || container(&["churn", "64"]).spawn();
    let page_ins_before = hypervisor_page_ins();
    let mut runners = [runner(), runner()];
    for r in &mut runners {
        r.wait_for("ready", READY);
    }
    let storm = stop_and_kill(&cache, victim, VICTIMS, STOPS, KILLS);
    let (mut slowest, mut slept, mut reports) = (0, 0, String::new());
    for r in runners {
        let r = r.finish(EXIT);
        assert!(r.success, "{r:?}");
        assert!(r.get("calls") > 1000, "{r:?}");
        slept += r.get("slept_calls");
        slowest = slowest.max(r.get("max_off_cpu_ns"));
        reports.push_str(&r.stdout);
    }
    let page_ins = hypervisor_page_ins() - page_ins_before;
    eprintln!(
        "{STOPS} stops, {KILLS} kills: slowest churner call off CPU {slowest} ns; {slept} calls slept, \
         {page_ins} hypervisor page-ins; peak usage {} MiB over {} samples",
        storm.peak / MIB,
        storm.samples
    );
    assert!(
        slept <= page_ins,
        "{slept} churner calls slept (waited on something), {page_ins} of them can be the hypervisor's:\n{reports}"
    );
    assert!(storm.peak <= GIB, "usage passed the budget: {}", storm.peak);
    assert!(storm.samples > 100);
    // Everyone is gone: the next process reclaims what the killed ones held, to the byte.
    let last = container(&["fill", "64"]).report_within(EXIT);
    assert_eq!(last.get("first_bytes"), GIB, "{last:?}");
    assert_eq!(ledger_used0(&cache), 0, "the ledger after everyone left");
    assert_eq!(u64_at(&cache, LEDGER_SUSPECT0), 0, "bytes still in doubt");
    let driver = Run::new("direct", &["driver_stats"])
        .native()
        .env("FAKEGPU_SHARED", fake.to_str().expect("utf-8"))
        .report_within(EXIT);
    assert_eq!(driver.get("driver_used"), 0, "{driver:?}");
}

/// A killed process's bytes leave the ledger and the monitor's view within 2 s while its
/// siblings sit idle: nobody allocates after the kill.
#[test]
fn an_idle_container_sees_a_killed_process_go_within_two_seconds() {
    let s = Scratch::new("idle-reclaim");
    let cache = s.path("cudevshr.cache");
    let container = |command: &[&str]| {
        Run::new("direct", command)
            .env(SHARED_CACHE_VAR, cache.to_str().expect("utf-8"))
            .env("CUDA_DEVICE_MEMORY_LIMIT_0", "1g")
            .spawn()
    };
    let mut idle = container(&["hold", "100", "100"]);
    idle.wait_for("ready", READY);
    let mut victim = container(&["hold", "300", "300"]);
    victim.wait_for("ready", READY);
    assert_eq!(ledger_used0(&cache), 400 * MIB);
    let killed = Instant::now();
    victim.kill();
    let _ = victim.finish(EXIT);
    while ledger_used0(&cache) != 100 * MIB && killed.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(10));
    }
    let took = killed.elapsed();
    eprintln!("the killed process's 300 MiB left the ledger {took:?} after the kill");
    assert_eq!(ledger_used0(&cache), 100 * MIB, "still counted after {took:?}");
    assert!(took < Duration::from_secs(2), "{took:?}");
    // The monitor's view: the victim's slot is empty, the idle process's shows its 100 MiB.
    let bytes = std::fs::read(&cache).expect("read region");
    let slot = |k: usize, at: usize| {
        let o = 1856 + 1960 * k + at;
        u64::from_le_bytes(bytes[o..o + 8].try_into().expect("8 bytes"))
    };
    let status =
        |k: usize| i32::from_le_bytes(bytes[1856 + 1960 * k + 1928..][..4].try_into().expect("4 bytes"));
    let proc_num = i32::from_le_bytes(bytes[2_008_896..2_008_900].try_into().expect("4 bytes")) as usize;
    let live: Vec<u64> = (0..proc_num).filter(|&k| status(k) == 1).map(|k| slot(k, 8 + 32)).collect();
    assert_eq!(live, vec![100 * MIB], "the monitor's live slots (device-0 totals)");
    idle.close_stdin();
    assert!(idle.finish(EXIT).success);
}

/// With the region on a filesystem that has no room for it, the application keeps running:
/// budgeted allocations are refused with a message naming the path and the free space.
#[test]
fn a_full_filesystem_refuses_budgeted_memory_and_kills_nothing() {
    let s = Scratch::new("tiny-fs");
    let mount = s.path("tiny");
    std::fs::create_dir_all(&mount).expect("mount point");
    let cache = mount.join("cudevshr.cache");
    let run = Run::new("direct", &["fill", "64"])
        .env(SHARED_CACHE_VAR, cache.to_str().expect("utf-8"))
        .env("CUDA_DEVICE_MEMORY_LIMIT_0", "1g");
    let inner = run.command();
    // A private mount namespace (as root, or in a user namespace) with a 64 KiB tmpfs.
    let mut command = Command::new("unshare");
    command
        .args(["-rm", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs \"$0\" && exec \"$@\""])
        .arg(&mount)
        .arg(inner.get_program())
        .args(inner.get_args());
    for (key, value) in inner.get_envs() {
        match value {
            Some(value) => command.env(key, value),
            None => command.env_remove(key),
        };
    }
    let output = command.output().expect("run unshare");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "status {:?}\n{stdout}\n{stderr}", output.status);
    assert!(stdout.contains("first_bytes=0\n"), "{stdout}");
    assert!(stdout.contains("first_status=2\n"), "{stdout}");
    assert!(
        stderr.contains(cache.to_str().expect("utf-8"))
            && stderr.contains("no room")
            && stderr.contains("bytes free"),
        "{stderr}"
    );
}

/// A process that never uses CUDA pays nothing: with budgets set and `LIBCUDA_LOG_LEVEL=4`, a
/// program that looks up other names through `dlsym` prints nothing of ours and creates no region.
#[test]
fn a_process_that_never_touches_cuda_is_left_alone() {
    let s = Scratch::new("no-cuda");
    let cache = s.path("cudevshr.cache");
    let run = Run::new("direct", &[])
        .env(SHARED_CACHE_VAR, cache.to_str().expect("utf-8"))
        .env("CUDA_DEVICE_MEMORY_LIMIT_0", "1g")
        .env("LIBCUDA_LOG_LEVEL", "4");
    let command = run.command();
    // python3 resolves many names through dlsym as it loads its extension modules, under our
    // preload and the fake driver's library path.
    let output = Command::new("python3")
        .args(["-c", "import ctypes, json, ssl, sqlite3; ctypes.CDLL(None).malloc"])
        .envs(command.get_envs().filter_map(|(k, v)| Some((k, v?))))
        .output()
        .expect("run python3");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(stderr.is_empty(), "a process that never touched CUDA logged:\n{stderr}");
    assert!(!cache.exists(), "a process that never touched CUDA created the region");
}

/// A region file truncated while processes use it (by a person, or a careless cleanup) is given
/// its size back at once by the watchers, so the processes are not killed by SIGBUS when they
/// next touch it; the truncation is logged.
#[test]
fn a_truncated_region_is_restored_before_anyone_faults() {
    let s = Scratch::new("truncated");
    let cache = s.path("cudevshr.cache");
    let mut holder = Run::new("direct", &["hold", "100", "100"])
        .env(SHARED_CACHE_VAR, cache.to_str().expect("utf-8"))
        .env("CUDA_DEVICE_MEMORY_LIMIT_0", "1g")
        .spawn();
    holder.wait_for("ready", READY);
    let size = std::fs::metadata(&cache).expect("region").len();
    std::fs::OpenOptions::new().write(true).open(&cache).expect("open").set_len(0).expect("truncate");
    let deadline = Instant::now() + Duration::from_secs(2);
    while std::fs::metadata(&cache).expect("region").len() < size && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(std::fs::metadata(&cache).expect("region").len(), size, "the size was not restored");
    // The holder frees its memory (touching its lease and slot) and exits normally.
    holder.close_stdin();
    let r = holder.finish(EXIT);
    assert!(r.success, "{r:?}");
    assert!(r.stderr.contains("was truncated"), "{}", r.stderr);
}
