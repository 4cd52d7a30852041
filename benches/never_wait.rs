//! Siblings stopped and killed at random while others churn: the longer run of
//! `tests/never_wait.rs`, with the slowest call and the peak usage reported.
//!
//!     cargo bench --bench never_wait
//!     NEVER_WAIT_STOPS=1000 NEVER_WAIT_KILLS=300 NEVER_WAIT_RUNNERS=4 cargo bench --bench never_wait
//!
//! NEVER_WAIT_RUNNERS processes (default 2) run `vgpu_client timed-churn` (allocate 1..64 MiB or
//! free, at random, at most 4 live, every call timed) under a 1 GiB budget while NEVER_WAIT_VICTIMS
//! (default 4) churning siblings are stopped NEVER_WAIT_STOPS times (default 1000, each for up to
//! 20 ms, then continued) and killed NEVER_WAIT_KILLS times (default 300, each replaced at once).
//! Prints, per runner, its calls, how many slept (a voluntary context switch inside the call:
//! waiting on something), how many were off the CPU for more than 1 ms (preempted: 2 cores for all
//! the processes) and the longest; then the peak of the container's usage sampled every 0.5 ms.
//! The region lives on tmpfs (`/dev/shm`), as in the test; `NEVER_WAIT_ON_DISK=1` puts it under
//! the target directory instead, where the kernel's writeback of its pages makes some stores
//! fault and sleep on the filesystem (the `faulted` column: slept calls that took a page fault).
//! Results: docs/benchmarks.md.

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::{Client, GIB, MIB, Run, SHARED_CACHE_VAR, Scratch, stop_and_kill};

fn setting(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn main() {
    let stops = setting("NEVER_WAIT_STOPS", 1000);
    let kills = setting("NEVER_WAIT_KILLS", 300);
    let runners = setting("NEVER_WAIT_RUNNERS", 2);
    let victims = setting("NEVER_WAIT_VICTIMS", 4);
    let s = if setting("NEVER_WAIT_ON_DISK", 0) == 1 {
        Scratch::new("never-wait-bench")
    } else {
        Scratch::in_memory("never-wait-bench")
    };
    let cache = s.path("cudevshr.cache");
    let container = |command: &[&str]| {
        Run::new("direct", command)
            .env(SHARED_CACHE_VAR, cache.to_str().expect("utf-8"))
            .env("CUDA_DEVICE_MEMORY_LIMIT_0", "1g")
    };
    let started = Instant::now();
    // Runners churn for long enough to see every stop and kill; the estimate errs long.
    let seconds = (stops as f64 * 0.012 + kills as f64 * 0.02 + 2.0).to_string();
    let mut running: Vec<Client> =
        (0..runners).map(|_| container(&["timed-churn", &seconds, "64"]).spawn()).collect();
    for r in &mut running {
        r.wait_for("ready", Duration::from_secs(10));
    }
    let storm = stop_and_kill(&cache, || container(&["churn", "64"]).spawn(), victims, stops, kills);
    println!(
        "{stops} stops and {kills} kills of {victims} siblings over {:.1} s",
        started.elapsed().as_secs_f64()
    );
    println!("runner      calls    slept  faulted   >1 ms off CPU   longest off CPU   longest call");
    for (i, r) in running.into_iter().enumerate() {
        let r = r.finish(Duration::from_secs(60));
        println!(
            "{i:>6} {:>10} {:>8} {:>8} {:>15} {:>14.3} ms {:>11.3} ms",
            r.get("calls"),
            r.get("slept_calls"),
            r.get("slept_faulted"),
            r.get("over_1ms_off_cpu"),
            r.get("max_off_cpu_ns") as f64 / 1e6,
            r.get("max_wall_ns") as f64 / 1e6
        );
    }
    println!("peak usage {} MiB of a 1024 MiB budget over {} samples", storm.peak / MIB, storm.samples);
    assert!(storm.peak <= GIB, "usage passed the budget");
}
