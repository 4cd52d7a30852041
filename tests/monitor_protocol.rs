//! The rest of HAMi's monitor protocol: context memory shown apart from buffers, and launches that
//! mark activity and wait while the monitor holds a lower-priority container. The test plays the
//! monitor, writing the region as HAMi's `vGPUmonitor` does.

mod common;

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant};

use common::{MIB, Run, SHARED_CACHE_VAR, Scratch};

const READY: Duration = Duration::from_secs(10);
const EXIT: Duration = Duration::from_secs(20);
/// HAMi v1 offsets (docs/architecture.md, the region file).
const SLOTS: u64 = 1856;
const RECENT_KERNEL: u64 = 2_008_904;
const PROC_NUM: u64 = 2_008_896;

fn read_u64(path: &Path, offset: u64) -> u64 {
    let mut bytes = [0u8; 8];
    std::fs::File::open(path).and_then(|f| f.read_exact_at(&mut bytes, offset)).expect("read region");
    u64::from_le_bytes(bytes)
}

fn read_i32(path: &Path, offset: u64) -> i32 {
    let mut bytes = [0u8; 4];
    std::fs::File::open(path).and_then(|f| f.read_exact_at(&mut bytes, offset)).expect("read region");
    i32::from_le_bytes(bytes)
}

/// What the monitor does to hold (-1) or release (0) a container.
fn write_recent_kernel(path: &Path, value: i32) {
    let file = std::fs::OpenOptions::new().write(true).open(path).expect("open region");
    file.write_all_at(&value.to_le_bytes(), RECENT_KERNEL).expect("write recent_kernel");
}

#[test]
fn context_memory_shows_in_the_context_field_and_buffers_apart() {
    let s = Scratch::new("context-field");
    let cache = s.path("cudevshr.cache");
    let mut client = Run::new("direct", &["hold", "100", "100"])
        .env(SHARED_CACHE_VAR, cache.to_str().expect("utf-8"))
        .env("CUDA_DEVICE_MEMORY_LIMIT_0", "1g")
        .env("FAKEGPU_CONTEXT_MEMORY", "64m")
        .spawn();
    client.wait_for("ready", READY);
    assert_eq!(read_i32(&cache, PROC_NUM), 1);
    // Slot 0, device 0: context at +8, data at +24, total at +40.
    let device0 = SLOTS + 8;
    assert_eq!(read_u64(&cache, device0), 64 * MIB, "context bytes");
    assert_eq!(read_u64(&cache, device0 + 16), 100 * MIB, "buffer bytes");
    assert_eq!(read_u64(&cache, device0 + 32), 164 * MIB, "total bytes");
    client.close_stdin();
    assert!(client.finish(EXIT).success);
    assert_eq!(read_u64(&cache, device0), 0, "a freed slot shows no context");
}

/// Container B has a lower priority (`CUDA_TASK_PRIORITY=1`) and no compute share: while the
/// monitor holds it (recent_kernel -1), its launches wait; released, they run. Container A
/// (priority 0) marks its launches for the monitor to see.
#[test]
fn a_held_low_priority_container_waits_and_a_running_one_marks_its_launches() {
    let s = Scratch::new("priority");
    let low = s.path("low.cache");
    let high = s.path("high.cache");
    let run = |cache: &Path, priority: &str, command: &[&str]| {
        Run::compute("direct", command)
            .env(SHARED_CACHE_VAR, cache.to_str().expect("utf-8"))
            .env("CUDA_DEVICE_MEMORY_LIMIT_0", "1g")
            .env("CUDA_TASK_PRIORITY", priority)
    };
    // A launches; its region shows the mark HAMi-core leaves (2).
    let a = run(&high, "0", &["loop", "kernel", "100", "20"]).report_within(EXIT);
    assert!(a.success && a.get("launches") == 20, "{a:?}");
    assert_eq!(read_i32(&high, RECENT_KERNEL), 2, "the high-priority container's launches are not marked");

    // B's region exists (a first run), then the monitor holds B.
    let first = run(&low, "1", &["loop", "kernel", "100", "1"]).report_within(EXIT);
    assert!(first.success, "{first:?}");
    write_recent_kernel(&low, -1);
    let started = Instant::now();
    let mut b = run(&low, "1", &["loop", "kernel", "100", "20"]).spawn();
    std::thread::sleep(Duration::from_millis(600));
    assert!(!b.has_exited(), "B launched while the monitor held it");
    write_recent_kernel(&low, 0);
    let r = b.finish(EXIT);
    assert!(r.success && r.get("launches") == 20, "{r:?}");
    assert!(started.elapsed() >= Duration::from_millis(600));
    assert_eq!(read_i32(&low, RECENT_KERNEL), 2, "B marks its launches once released");
    assert!(r.stderr.contains("recent_kernel < 0"), "no line says why B waited:\n{}", r.stderr);
}

/// With neither a priority nor a share, launches are not handed to libvgpu at all: nothing is
/// marked, nothing waits.
#[test]
fn without_priority_or_share_launches_stay_unhooked() {
    let s = Scratch::new("no-priority");
    let cache = s.path("cudevshr.cache");
    let run = Run::compute("direct", &["loop", "kernel", "100", "5"])
        .env(SHARED_CACHE_VAR, cache.to_str().expect("utf-8"))
        .env("CUDA_DEVICE_MEMORY_LIMIT_0", "1g");
    assert!(run.report_within(EXIT).success);
    write_recent_kernel(&cache, -1);
    let r = run.report_within(EXIT);
    assert!(r.success && r.get("launches") == 5, "a held container without priority waited: {r:?}");
    assert_eq!(read_i32(&cache, RECENT_KERNEL), -1, "an unhooked launch changed the mark");
}
