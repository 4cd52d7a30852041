//! Cost of libvgpu_hip's bookkeeping: the same HIP client loop against the fake HIP runtime,
//! natively and under `LD_PRELOAD=libvgpu_hip.so` (without and with a budget), in one run.
//!
//!     cargo bench --bench hip_hooks
//!
//! As `benches/hooks.rs` does for CUDA: the median nanoseconds per call of each setup over
//! alternating rounds, and what libvgpu_hip adds, the median over rounds of its difference from
//! the native run of the same round. Every client runs on one CPU (the last). The region lives on
//! /dev/shm. Results are recorded in docs/benchmarks.md.

#[path = "../tests/common/mod.rs"]
mod common;

use common::{Run, SHARED_CACHE_VAR, Scratch};
#[path = "../ledger/benches/support/pin.rs"]
mod pin;
use pin::pin_to_one_cpu;

const ROUNDS: usize = 21;
const ITERATIONS: &str = "200000";

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn added(runs: &[f64], native: &[f64]) -> f64 {
    median(runs.iter().zip(native).map(|(run, native)| run - native).collect())
}

fn spread(values: &[f64]) -> f64 {
    let lo = values.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    hi - lo
}

fn main() {
    pin_to_one_cpu();
    let scratch = Scratch::in_memory("hip-bench");
    let cache = scratch.path("cudevshr.cache");
    let cache = cache.to_str().expect("utf-8 path");
    let bench = || Run::hip("direct", &["bench", ITERATIONS]);
    let setups: [(&str, Run); 3] = [
        ("native fake runtime", bench().native()),
        ("libvgpu_hip, no limit", bench()),
        ("libvgpu_hip, 8 GiB", bench().env("CUDA_DEVICE_MEMORY_LIMIT_0", "8g").env(SHARED_CACHE_VAR, cache)),
    ];
    let mut samples = vec![(Vec::new(), Vec::new()); setups.len()];
    for _ in 0..ROUNDS {
        for (i, (name, run)) in setups.iter().enumerate() {
            let r = run.report();
            assert!(r.success, "{name}: {r:?}");
            samples[i].0.push(r.values["alloc_free_ns"].parse::<f64>().expect("number"));
            samples[i].1.push(r.values["get_info_ns"].parse::<f64>().expect("number"));
        }
    }
    println!("{ROUNDS} rounds of {ITERATIONS} calls; median ns per call (max-min spread)");
    println!(
        "{:<22} {:>22} {:>10} {:>22} {:>10}",
        "setup", "hipMalloc+hipFree", "added", "hipMemGetInfo", "added"
    );
    for (i, (name, _)) in setups.iter().enumerate() {
        println!(
            "{:<22} {:>13.1} ({:>6.1}) {:>+10.1} {:>13.1} ({:>6.1}) {:>+10.1}",
            name,
            median(samples[i].0.clone()),
            spread(&samples[i].0),
            added(&samples[i].0, &samples[0].0),
            median(samples[i].1.clone()),
            spread(&samples[i].1),
            added(&samples[i].1, &samples[0].1)
        );
    }
}
