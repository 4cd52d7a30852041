//! The device memory the driver takes on a process's behalf, which no allocation call shows:
//! kernel code loaded lazily (`CUDA_MODULE_LOADING=LAZY`, the default since CUDA 12.2), modules and
//! libraries, local memory and stack resizes, the context's own growth. On an H100 with PyTorch,
//! about 6 % of a process after its first matmul, convolution and attention kernels.
//!
//! It is charged by reconciling with NVML's figure for this process: what NVML counts for it, less
//! what the ledger already charged it for allocations and contexts (managed memory aside: NVML's
//! figure never includes it, resident or not), is charged as the driver's
//! (never less than nothing: a ledger that counts more than NVML, as for graph memory not yet
//! backed, charges nothing extra). A thread asks NVML every 100 ms while the figure moves, backing
//! off to once a second while it does not; NVML's per-process query takes milliseconds and the
//! driver's lock, so it is kept off every hook. What the driver took is therefore charged after the
//! fact, within that interval, and past the budget if need be: allocations are then refused until
//! usage is back within it. NVML lists processes by the pid they have in the caller's pid namespace
//! on current drivers; one that lists host pids never shows this process's own pid inside a
//! container, and then nothing is charged this way (debug line once).
//!
//! A context charged a *bound* because NVML did not list this process when it was created
//! ([`crate::hooks::context`]) is settled here once NVML does: the bound counts as unknown, and the
//! driver's charge goes negative by as much of the bound as NVML's figure does not need, never by
//! more than the bound.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use parking_lot::Mutex;

use crate::config::MAX_DEVICES;
use crate::driver;
use crate::ledger::Owner;
use crate::runtime::Runtime;

/// How soon the thread asks NVML again after the figure moved, and at most how long it waits.
const QUICK: Duration = Duration::from_millis(100);
const SLOW: Duration = Duration::from_secs(1);

/// What this process has been charged for the driver's own memory, per CUDA ordinal, and the
/// contexts charged a bound that NVML has yet to settle.
#[derive(Default)]
pub struct DriverMemory {
    state: Mutex<State>,
    /// The pid whose thread runs (0: none): a forked child starts its own.
    running: AtomicU32,
}

#[derive(Default)]
struct State {
    charged: [Charge; MAX_DEVICES],
    bounds: Vec<Bound>,
}

/// Bytes charged (negative: given back from contexts' bounds) beyond allocations and measured
/// contexts.
#[derive(Clone, Copy, Default)]
struct Charge {
    bytes: i64,
    owner: Owner,
}

/// A context charged a bound rather than its measured cost.
struct Bound {
    key: u64,
    device: usize,
    bytes: u64,
}

impl DriverMemory {
    /// Runs `f` with no reconciliation under way: a context being created is not yet charged, and
    /// a reconciliation would count it as the driver's memory.
    pub fn paused<T>(&self, f: impl FnOnce() -> T) -> T {
        let _state = self.state.lock();
        f()
    }

    /// Context `key` on `device` was charged a bound of `bytes`, to settle once NVML lists this
    /// process.
    pub fn bound(&self, key: u64, device: usize, bytes: u64) {
        self.state.lock().bounds.push(Bound { key, device, bytes });
    }

    /// Context `key` is gone, and so is its charge.
    pub fn forget(&self, key: u64) {
        let mut state = self.state.lock();
        state.bounds.retain(|bound| bound.key != key);
    }

    /// Starts reconciling this process's budgeted devices, once per process (and again in a fork
    /// child). Called once a context on a budgeted device has been charged.
    pub fn watch(&self) {
        let pid = std::process::id();
        let before = self.running.load(Ordering::Acquire);
        if before == pid
            || self.running.compare_exchange(before, pid, Ordering::AcqRel, Ordering::Acquire).is_err()
        {
            return;
        }
        if before != 0 {
            // A fork child: what the parent charged is the parent's.
            *self.state.lock() = State::default();
        }
        let started = std::thread::Builder::new().name("vgpu-driver-mem".into()).spawn(move || {
            let Ok(runtime) = crate::runtime::get() else { return };
            let mut pause = QUICK;
            loop {
                std::thread::sleep(pause);
                let moved = (0..driver::cuda_device_uuids().len().min(MAX_DEVICES))
                    .fold(false, |moved, device| runtime.driver_memory.reconcile(runtime, device) | moved);
                pause = if moved { QUICK } else { (pause * 2).min(SLOW) };
            }
        });
        if started.is_err() {
            tracing::debug!("no thread to charge the driver's own memory; only allocations are charged");
        }
    }

    /// Brings what `device` is charged for the driver's memory to what NVML now says it holds
    /// beyond the ledger's charges. True if the charge changed.
    fn reconcile(&self, runtime: &Runtime, device: usize) -> bool {
        let ledger = runtime.ledger();
        if ledger.limit(device).is_none() || ledger.held(device) == 0 {
            return false;
        }
        let Some(uuid) = driver::cuda_device_uuids().get(device) else { return false };
        // Under the lock: no context is being created meanwhile.
        let mut state = self.state.lock();
        let nvml = match driver::nvml().process_used_by_uuid(uuid, std::process::id()) {
            Ok(Some(bytes)) => bytes,
            Ok(None) | Err(_) => {
                static SAID: std::sync::Once = std::sync::Once::new();
                SAID.call_once(|| {
                    tracing::debug!(
                        "NVML does not list this process (pid {}) with its memory on device {device}; the \
                         driver's own memory is not charged",
                        std::process::id()
                    )
                });
                return false;
            }
        };
        let bound: i64 = state.bounds.iter().filter(|b| b.device == device).map(|b| b.bytes as i64).sum();
        let charge = &mut state.charged[device];
        // Read after NVML: an allocation in between is counted here and not there, which only
        // makes this round charge less; the next one corrects it. Managed memory is charged in
        // full when allocated and NVML never counts it.
        // Swapped-out memory (issue 37) is charged and off the card.
        let exact = ledger.held(device) as i64
            - charge.bytes
            - bound
            - ledger.spillable(device) as i64
            - runtime.swap.swapped(device) as i64;
        let want = (nvml as i64 - exact).max(0) - bound;
        if want > charge.bytes {
            let Ok(owner) = ledger.record_committed(device, (want - charge.bytes) as u64) else {
                return false;
            };
            if charge.bytes <= 0 && want > 0 {
                tracing::debug!(
                    "device {device}: the driver holds {want} bytes for this process beyond its charges"
                );
            }
            *charge = Charge { bytes: want, owner };
            past_budget(device, want.max(0) as u64, ledger.used(device), ledger.limit(device));
        } else if want < charge.bytes {
            if charge.bytes == 0 {
                // Giving back part of a bound: credited under this process's current membership.
                let Ok(owner) = ledger.record_committed(device, 0) else { return false };
                charge.owner = owner;
            }
            ledger.release(device, (charge.bytes - want) as u64, charge.owner);
            charge.bytes = want;
        } else {
            return false;
        }
        true
    }
}

/// Says once per process when what the driver holds beyond the allocations takes the container
/// past its budget: no hook saw that memory taken, and only the node's policy (`vgpu-smi serve
/// --policy`) can hold it. Hundreds of MiB are graphics (OpenGL, Vulkan interop) or a codec far
/// more often than kernel code, which is a few percent of a process.
fn past_budget(device: usize, charged: u64, used: u64, limit: Option<u64>) {
    static SAID: std::sync::Once = std::sync::Once::new();
    let Some(limit) = limit.filter(|&limit| used > limit) else { return };
    let source = if charged >= 256 << 20 { "graphics (OpenGL, Vulkan) or a video codec" } else { "other" };
    SAID.call_once(|| {
        tracing::warn!(
            "device {device}: the driver holds {charged} bytes for this process that no allocation call \
             took (likely source: {source}), and the container is now past its budget ({used} of {limit} \
             bytes); allocations are refused until it is back within it, and only the node agent's policy \
             (vgpu-smi serve --policy) can reclaim that memory"
        )
    });
}
