//! The device memory the driver takes on a process's behalf (src/hooks/driver_memory.rs): the
//! fake driver's modules cost memory that no allocation call returns, and NVML's per-process
//! figure counts it, as kernel code does on a real card. libvgpu charges it to the budget, refuses
//! allocations past the budget once it is charged, and gives it back on unload and exit.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{Client, GIB, MIB, Run, SHARED_CACHE_VAR, Scratch};

const CUDA_ERROR_OUT_OF_MEMORY: u64 = 2;
const READY: Duration = Duration::from_secs(20);
const EXIT: Duration = Duration::from_secs(10);
/// How soon a change in the driver's memory must show in the region.
const CHARGED: Duration = Duration::from_secs(2);

fn step(client: &mut Client, line: &str, key: &str) -> u64 {
    client.send(line);
    client.wait_for(key, READY)
}

/// Waits until the region's usage on device 0 is `bytes`; fails the test after [`CHARGED`].
fn usage_becomes(cache: &Path, bytes: u64, what: &str) {
    let deadline = Instant::now() + CHARGED;
    loop {
        let seen = common::ledger_used0(cache);
        if seen == bytes {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: the region shows {} MiB, not {} MiB",
            seen / MIB,
            bytes / MIB
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn process(scratch: &Scratch, cache: &Path) -> Run {
    Run::new("direct", &["steps"])
        .env(SHARED_CACHE_VAR, cache.to_str().expect("utf-8 path"))
        .env("CUDA_DEVICE_MEMORY_LIMIT_0", "1g")
        .env("FAKEGPU_MODULE_MEMORY", "100m")
        .env("FAKEGPU_SHARED", scratch.path("fake").to_str().expect("utf-8 path"))
}

#[test]
fn module_memory_is_charged_refused_at_the_budget_and_given_back() {
    let scratch = Scratch::new("driver-memory");
    let cache = scratch.path("region.cache");
    let mut client = process(&scratch, &cache).spawn();
    client.wait_for("ready", READY);
    assert_eq!(step(&mut client, "alloc a 512", "a_status"), 0);
    usage_becomes(&cache, 512 * MIB, "an allocation");

    // Two modules take 200 MiB of the card that no allocation call returned: charged after the fact.
    assert_eq!(step(&mut client, "load m1", "m1_status"), 0);
    assert_eq!(step(&mut client, "load m2", "m2_status"), 0);
    usage_becomes(&cache, 712 * MIB, "two modules loaded");
    // What they hold counts against the budget: 400 MiB more no longer fits, 256 does.
    assert_eq!(step(&mut client, "alloc b 400", "b_status"), CUDA_ERROR_OUT_OF_MEMORY);
    assert_eq!(step(&mut client, "info i", "i_free"), GIB - 712 * MIB);
    assert_eq!(step(&mut client, "alloc c 256", "c_status"), 0);
    usage_becomes(&cache, 968 * MIB, "256 MiB more");

    // Unloading gives its memory back.
    assert_eq!(step(&mut client, "unload u1", "u1_status"), 0);
    usage_becomes(&cache, 868 * MIB, "one module unloaded");

    // A sibling sees the same budget, and a SIGKILL of the process gives everything back.
    let mut sibling = process(&scratch, &cache).spawn();
    sibling.wait_for("ready", READY);
    assert_eq!(step(&mut sibling, "alloc s 256", "s_status"), CUDA_ERROR_OUT_OF_MEMORY);
    client.kill();
    assert!(!client.finish(EXIT).success);
    assert_eq!(
        step(&mut sibling, "alloc t 64", "t_status"),
        0,
        "the killed process's bytes were not reclaimed"
    );
    // The sibling's own module is charged, and its exit gives it all back.
    assert_eq!(step(&mut sibling, "load m3", "m3_status"), 0);
    usage_becomes(&cache, 164 * MIB, "the sibling's allocation and module");
    sibling.close_stdin();
    assert!(sibling.finish(EXIT).success);
    usage_becomes(&cache, 0, "every process gone");
}

#[test]
fn serve_brings_a_container_whose_processes_all_died_to_zero() {
    let scratch = Scratch::new("serve-reclaim");
    let cache = scratch.path("region.cache");
    let smi = common::smi_binary().to_path_buf();
    let mut holders: Vec<Client> = (0..3)
        .map(|_| {
            let mut client = process(&scratch, &cache).spawn();
            client.wait_for("ready", READY);
            assert_eq!(step(&mut client, "alloc a 256", "a_status"), 0);
            client
        })
        .collect();
    usage_becomes(&cache, 768 * MIB, "three holders");
    let serve = |extra: &[&str]| {
        std::process::Command::new(&smi)
            .arg("serve")
            .args(["--listen", "127.0.0.1:0"])
            .args(extra)
            .arg(&cache)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start vgpu-smi serve")
    };
    // Every process of the container killed: nobody inside is left to give their bytes back.
    let mut idle = serve(&["--no-reclaim"]);
    for holder in &mut holders {
        holder.kill();
    }
    for holder in holders {
        assert!(!holder.finish(EXIT).success);
    }
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(common::ledger_used0(&cache), 768 * MIB, "without serve's reclaim the bytes stay counted");
    let _ = idle.kill();
    let _ = idle.wait();
    // `vgpu-smi serve` reclaims them, as the library would have.
    let started = Instant::now();
    let mut watching = serve(&[]);
    usage_becomes(&cache, 0, "serve watching a container whose processes all died");
    let _ = watching.kill();
    let _ = watching.wait();
    assert!(started.elapsed() < CHARGED, "{:?}", started.elapsed());
}

#[test]
fn module_memory_is_charged_beside_spillable_memory_nvml_does_not_count() {
    // On an overcommitted device allocations are managed memory, which NVML's per-process figure
    // never counts (H100, driver 580), nor does the fake's: the driver's own memory is what NVML
    // shows beyond the rest of the charges, not beyond all of them.
    let scratch = Scratch::new("driver-memory-spill");
    let cache = scratch.path("region.cache");
    let mut client = process(&scratch, &cache).env("CUDA_OVERSUBSCRIBE", "true").spawn();
    client.wait_for("ready", READY);
    assert_eq!(step(&mut client, "alloc a 512", "a_status"), 0);
    usage_becomes(&cache, 512 * MIB, "a spillable allocation");
    assert_eq!(step(&mut client, "driver d", "d_managed"), 512 * MIB, "the allocation is managed memory");
    assert_eq!(step(&mut client, "load m", "m_status"), 0);
    usage_becomes(&cache, 612 * MIB, "a module beside 512 MiB of managed memory");
    assert_eq!(step(&mut client, "unload u", "u_status"), 0);
    usage_becomes(&cache, 512 * MIB, "the module unloaded");
    client.close_stdin();
    assert!(client.finish(EXIT).success);
    usage_becomes(&cache, 0, "the process gone");
}
