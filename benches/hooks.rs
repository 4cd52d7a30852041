//! Cost of libvgpu's bookkeeping: the same client loop against the fake driver, natively and under
//! `LD_PRELOAD=libvgpu.so` (with a budget set, so every call is accounted), in one run.
//!
//!     cargo bench --bench hooks
//!
//! Prints the median nanoseconds per call of each setup over alternating rounds, and what
//! libvgpu adds: the median over rounds of its difference from the native run of the same round,
//! which holds when the machine's speed drifts between rounds. Every client runs on one CPU (the
//! last), so that moving between CPUs is not part of what is timed. Results are recorded in
//! docs/benchmarks.md.

#[path = "../tests/common/mod.rs"]
mod common;

use common::Run;
#[path = "../ledger/benches/support/pin.rs"]
mod pin;
use pin::pin_to_one_cpu;

const ROUNDS: usize = 21;
const ITERATIONS: &str = "200000";

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// What a setup adds: the median over rounds of its difference from that round's native run.
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
    let setups: [(&str, Run); 3] = [
        ("native fake driver", Run::new("direct", &["bench", ITERATIONS]).native()),
        ("libvgpu, no limit", Run::new("direct", &["bench", ITERATIONS])),
        (
            "libvgpu, 8 GiB limit",
            Run::new("direct", &["bench", ITERATIONS]).env("CUDA_DEVICE_MEMORY_LIMIT_0", "8g"),
        ),
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
        "setup", "alloc+free pair", "added", "cuMemGetInfo_v2", "added"
    );
    for (i, (name, _)) in setups.iter().enumerate() {
        let pair = median(samples[i].0.clone());
        let info = median(samples[i].1.clone());
        println!(
            "{:<22} {:>13.1} ({:>6.1}) {:>+10.1} {:>13.1} ({:>6.1}) {:>+10.1}",
            name,
            pair,
            spread(&samples[i].0),
            added(&samples[i].0, &samples[0].0),
            info,
            spread(&samples[i].1),
            added(&samples[i].1, &samples[0].1)
        );
    }
}
