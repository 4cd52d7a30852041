//! What a budgeted allocation and free cost the ledger itself, against the floor of its protocol:
//! the locked read-modify-writes that no implementation of it can leave out.
//!
//!     cargo bench -p vgpu-ledger --bench charge_floor
//!
//! Three loops of the same length, alternating over rounds on one CPU (the last), region on
//! /dev/shm:
//! - *floor*: the protocol's atomic steps alone, on a file mapped `MAP_SHARED` as the region is:
//!   per charge the lease's announcement, the compare-and-swap of the container total and the
//!   lease's apply; per credit the lease, the total and the withdrawal; and one compare-and-swap
//!   on the process's allocation table each way (eight locked instructions a pair);
//! - *ledger*: the same pair through the real code: `try_reserve`, the allocation table's
//!   `insert` and `remove`, `release` (what the hooks add per pair but the hook plumbing and the
//!   runtime call);
//! - *empty*: the loop alone.
//!
//! It prints the median ns per pair of each and the ledger's cost as a multiple of the floor.
//! Results are recorded in docs/benchmarks.md.

use std::fs::OpenOptions;
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use memmap2::MmapOptions;
use vgpu_ledger::config::Config;
use vgpu_ledger::{Allocation, AllocationTable};
#[path = "support/pin.rs"]
mod pin;
use pin::pin_to_one_cpu;

const ROUNDS: usize = 21;
const PAIRS: u64 = 1_000_000;
const MIB: u64 = 1 << 20;
const HIGH_STEP: u64 = 1 << 48;

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// Nanoseconds per pair of `pair`, run [`PAIRS`] times.
fn time(mut pair: impl FnMut(u64)) -> f64 {
    let start = Instant::now();
    for n in 0..PAIRS {
        pair(n);
    }
    start.elapsed().as_nanos() as f64 / PAIRS as f64
}

fn main() {
    pin_to_one_cpu();
    let dir = std::path::PathBuf::from("/dev/shm").join(format!("charge-floor-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir on /dev/shm");

    // The floor: the words of a region-sized shared mapping, a lease word and a total word on
    // their own cache lines, as in the region; the table's key word in process memory.
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(dir.join("floor"))
        .expect("floor file");
    file.set_len(1 << 16).expect("size floor file");
    let map = MmapOptions::new().len(1 << 16).map_raw(&file).expect("map floor file");
    // SAFETY: the mapping is 64 KiB, page-aligned, and lives until the end of `main`; its words
    // are touched only through these atomics.
    let (lease, total) = unsafe {
        let words = map.as_mut_ptr().cast::<u64>();
        (AtomicU64::from_ptr(words.add(8)), AtomicU64::from_ptr(words.add(64)))
    };
    let key = AtomicU64::new(0);
    let floor = |n: u64| {
        let bytes = black_box(MIB);
        // Charge: announce, check-and-reserve, apply.
        lease.fetch_add(HIGH_STEP, Ordering::SeqCst);
        let _ = total.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |word| Some(word + bytes));
        lease.fetch_add(bytes.wrapping_sub(HIGH_STEP), Ordering::SeqCst);
        // The table: claim a slot, publish; take it back.
        let _ = key.compare_exchange(0, u64::MAX, Ordering::Acquire, Ordering::Relaxed);
        key.store(n | 1, Ordering::Release);
        let _ = key.compare_exchange(n | 1, 0, Ordering::Release, Ordering::Relaxed);
        // Credit: the lease (announcing), the total, the withdrawal.
        lease.fetch_add(HIGH_STEP.wrapping_sub(bytes), Ordering::SeqCst);
        total.fetch_sub(bytes, Ordering::SeqCst);
        lease.fetch_sub(HIGH_STEP, Ordering::SeqCst);
    };

    // The real ledger on a region of its own, with an 8 GiB budget on device 0.
    let region = dir.join("region.cache");
    let config = Config::from_vars([
        ("CUDA_DEVICE_MEMORY_LIMIT_0".to_owned(), "8g".to_owned()),
        ("CUDA_DEVICE_MEMORY_SHARED_CACHE".to_owned(), region.to_string_lossy().into_owned()),
    ]);
    let ledger = vgpu_ledger::attach(&config, || vec![b"GPU-face0000-0000-4e00-8000-000000000000".to_vec()]);
    let table = AllocationTable::default();
    let through_ledger = |n: u64| {
        // Addresses as a runtime hands them out: a fresh one per allocation.
        let address = 0x7f00_0000_0000 + (n % 4096) * 2 * MIB;
        let owner = ledger.try_reserve(0, MIB).expect("8 GiB holds 1 MiB");
        table.insert(address, Allocation { device: 0, bytes: MIB, owner });
        let allocation = table.remove(black_box(address)).expect("just inserted");
        ledger.release(allocation.device, allocation.bytes, allocation.owner);
    };
    let empty = |n: u64| {
        black_box(n);
    };

    let mut samples = [Vec::new(), Vec::new(), Vec::new()];
    for _ in 0..ROUNDS {
        samples[0].push(time(empty));
        samples[1].push(time(floor));
        samples[2].push(time(through_ledger));
    }
    assert_eq!(ledger.used(0), 0, "every charge was credited");
    let [empty, floor, through_ledger] = samples.map(median);
    println!("{ROUNDS} rounds of {PAIRS} pairs, pinned to one CPU; median ns per pair (loop subtracted)");
    println!("{:<58} {:>8.1}", "floor: the protocol's 8 locked read-modify-writes", floor - empty);
    println!(
        "{:<58} {:>8.1}   {:.2}x the floor",
        "ledger: try_reserve + table insert/remove + release",
        through_ledger - empty,
        (through_ledger - empty) / (floor - empty)
    );
    let _ = std::fs::remove_dir_all(&dir);
}
