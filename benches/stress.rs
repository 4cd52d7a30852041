//! Many processes allocating at once under one 1 GiB budget: the shared ledger against the
//! process-local one and against the fake driver alone, in one run.
//!
//!     cargo bench --bench stress
//!     STRESS_PROCS=8 STRESS_THREADS=2 STRESS_SECONDS=5 STRESS_ROUNDS=5 cargo bench --bench stress
//!
//! Every setup runs STRESS_PROCS client processes of STRESS_THREADS threads each (defaults 4 × 4)
//! for STRESS_SECONDS (default 3); each thread allocates 1..STRESS_CHUNK_MIB MiB (default 64) or
//! frees, at random, with at most 8 live allocations. The fake driver's ledger is shared by all
//! processes (`FAKEGPU_SHARED`), so its peak is what the "card" really carried at once:
//!
//! - shared: libvgpu with `CUDA_DEVICE_MEMORY_LIMIT_0=1g` and one region file; the peak must stay
//!   within 1 GiB (asserted).
//! - local: the same with `LIBVGPU_LEDGER=local`, each process counting only itself; its peak
//!   shows the overshoot the shared ledger exists to prevent.
//! - native: no libvgpu; the fake driver itself is 1 GiB and refuses.
//!
//! Setups alternate over STRESS_ROUNDS rounds (default 3), each with fresh files; the table gives
//! medians, the peak the maximum. "ns/op" is per thread: the threads' loop time (wall, and CPU
//! alone) divided by the operations (allocation and free calls). Results: docs/benchmarks.md.

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::Duration;

use common::{GIB, MIB, Report, Run, SHARED_CACHE_VAR, Scratch};

#[derive(Clone, Copy, PartialEq)]
enum Ledger {
    Shared,
    Local,
    Native,
}

impl Ledger {
    fn name(self) -> &'static str {
        match self {
            Ledger::Shared => "shared ledger",
            Ledger::Local => "process-local ledger",
            Ledger::Native => "native (fake refuses)",
        }
    }
}

struct Params {
    procs: usize,
    threads: usize,
    seconds: f64,
    chunk_mib: u64,
    rounds: usize,
}

fn env_number<T: std::str::FromStr>(key: &str, default: T) -> T {
    match std::env::var(key) {
        Ok(value) => value.parse().unwrap_or_else(|_| panic!("{key}={value} is not a number")),
        Err(_) => default,
    }
}

/// One setup's run: every process's counters added up, and the driver's peak.
struct Sample {
    ops_per_s: f64,
    wall_ns_per_op: f64,
    cpu_ns_per_op: f64,
    refused_share: f64,
    peak: u64,
}

fn number(r: &Report, key: &str) -> f64 {
    r.values
        .get(key)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key} in output:\n{}\n{}", r.stdout, r.stderr))
}

fn run(ledger: Ledger, p: &Params, round: usize) -> Sample {
    let tag = match ledger {
        Ledger::Shared => "shared",
        Ledger::Local => "local",
        Ledger::Native => "native",
    };
    let scratch = Scratch::new(&format!("stress-{tag}-{round}"));
    let fake = scratch.path("fake");
    let fake = fake.to_str().expect("utf-8 path");
    let cache = scratch.path("cudevshr.cache");
    let (seconds, threads, chunk) = (p.seconds.to_string(), p.threads.to_string(), p.chunk_mib.to_string());
    let mut command = Run::new("direct", &["stress", &seconds, &threads, &chunk])
        .env("FAKEGPU_SHARED", fake)
        .env(SHARED_CACHE_VAR, cache.to_str().expect("utf-8 path"))
        .env("CUDA_DEVICE_MEMORY_LIMIT_0", "1g");
    command = match ledger {
        Ledger::Shared => command.env("FAKEGPU_MEMORY", "16g"),
        Ledger::Local => command.env("FAKEGPU_MEMORY", "16g").env("LIBVGPU_LEDGER", "local"),
        Ledger::Native => command.env("FAKEGPU_MEMORY", "1g").native(),
    };
    let clients: Vec<_> = (0..p.procs).map(|_| command.spawn()).collect();
    let limit = Duration::from_secs_f64(p.seconds + 60.0);
    let reports: Vec<Report> = clients.into_iter().map(|c| c.finish(limit)).collect();
    let (mut ops_per_s, mut ops, mut wall, mut cpu, mut refused, mut allocs) = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
    for r in &reports {
        assert!(r.success, "{}: {r:?}", ledger.name());
        ops_per_s += number(r, "ops") / (number(r, "elapsed_ns") / 1e9);
        ops += number(r, "ops");
        wall += number(r, "thread_ns");
        cpu += number(r, "thread_cpu_ns");
        refused += number(r, "refused");
        allocs += number(r, "allocs");
    }
    let stats = Run::new("direct", &["driver_stats"])
        .native()
        .env("FAKEGPU_SHARED", fake)
        .report_within(Duration::from_secs(30));
    Sample {
        ops_per_s,
        wall_ns_per_op: wall / ops,
        cpu_ns_per_op: cpu / ops,
        refused_share: refused / (refused + allocs),
        peak: stats.get("driver_peak"),
    }
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    let p = Params {
        procs: env_number("STRESS_PROCS", 4),
        threads: env_number("STRESS_THREADS", 4),
        seconds: env_number("STRESS_SECONDS", 3.0),
        chunk_mib: env_number("STRESS_CHUNK_MIB", 64),
        rounds: env_number("STRESS_ROUNDS", 3),
    };
    assert!(p.procs > 0 && p.threads > 0 && p.chunk_mib > 0 && p.rounds > 0, "every STRESS_* must be > 0");
    common::artifacts();
    let setups = [Ledger::Shared, Ledger::Local, Ledger::Native];
    let mut samples: Vec<Vec<Sample>> = setups.iter().map(|_| Vec::new()).collect();
    for round in 0..p.rounds {
        for (i, &ledger) in setups.iter().enumerate() {
            samples[i].push(run(ledger, &p, round));
        }
    }

    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "{} processes x {} threads, {} s, 1..{} MiB allocations, 1 GiB budget, {} rounds, {} cores",
        p.procs, p.threads, p.seconds, p.chunk_mib, p.rounds, cores
    );
    println!("medians; ns/op per thread (wall, and CPU only); peak = the fake driver's most bytes at once");
    println!(
        "{:<22} {:>12} {:>9} {:>10} {:>9} {:>12} {:>12} {:>10}",
        "setup", "ops/s", "refused", "ns/op", "cpu ns", "vs native", "vs local", "peak MiB"
    );
    let wall: Vec<f64> =
        samples.iter().map(|s| median(s.iter().map(|x| x.wall_ns_per_op).collect())).collect();
    let (native, local) = (wall[2], wall[1]);
    for (i, &ledger) in setups.iter().enumerate() {
        let s = &samples[i];
        let peak = s.iter().map(|x| x.peak).max().unwrap_or(0);
        let vs_local = if ledger == Ledger::Shared {
            format!("{:+12.1}", wall[i] - local)
        } else {
            format!("{:>12}", "")
        };
        println!(
            "{:<22} {:>12.0} {:>8.1}% {:>10.1} {:>9.1} {:>+12.1} {} {:>10}",
            ledger.name(),
            median(s.iter().map(|x| x.ops_per_s).collect()),
            100.0 * median(s.iter().map(|x| x.refused_share).collect()),
            wall[i],
            median(s.iter().map(|x| x.cpu_ns_per_op).collect()),
            wall[i] - native,
            vs_local,
            peak / MIB
        );
    }
    let shared_peak = samples[0].iter().map(|x| x.peak).max().unwrap_or(0);
    assert!(
        shared_peak <= GIB,
        "overshoot: the shared ledger let {shared_peak} bytes reach the driver at once"
    );
    println!("zero overshoot with the shared ledger: peak {} MiB <= 1024 MiB", shared_peak / MIB);
}
