//! The container's GPU budget, shared by every process and every API of a container: bytes in use
//! per device with an atomic check-and-reserve, the compute pacing clock, and the environment
//! contract that sets both.
//!
//! This crate knows nothing about CUDA or Vulkan. `libvgpu.so` (the CUDA/NVML preload library)
//! and `libvgpu_vk.so` (the Vulkan layer) each link it and charge the same region file, so a
//! container's CUDA and Vulkan allocations draw on one budget per device.
//!
//! [`Ledger`] is the seam between the hooks and where usage lives. [`SharedLedger`] keeps it in
//! the container's shared region ([`region`]), so all its processes draw on one budget;
//! [`LocalLedger`] keeps it in this process (used when nothing is budgeted, when the region is
//! unusable — then failing closed — and as the baseline in benchmarks).

mod allocations;
pub mod config;
pub mod host_memory;
pub mod inspect;
pub mod logging;
pub mod pace;
pub mod region;
pub mod resize;
mod shared;
pub mod sources;
pub mod swap;

pub use allocations::{Allocation, AllocationTable};
pub use shared::{ReclaimReport, ReclaimedLease, SharedLedger, reclaim_dead, reclaim_dead_file};

use std::sync::atomic::{AtomicU64, Ordering};

use crate::config::{Config, Limit, MAX_DEVICES};
use crate::region::layout::CONTEXT_COST_KNOWN;

/// Why the ledger refused a charge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LedgerError {
    /// The charge would take the device past its budget.
    BudgetExceeded { device: usize, requested: u64, used: u64, limit: u64 },
    /// The shared region cannot be used (this process has no lease, or its lock is broken); the
    /// charge is refused rather than left uncounted.
    RegionUnavailable,
}

/// What a context cost its device, and how it was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ContextCost {
    pub bytes: u64,
    /// Measured from the creating process's own figure (NVML's per-process memory), which no
    /// other process moves. Otherwise a device-wide difference, which a neighbour allocating or
    /// freeing at the same instant skews (what release 0.1.0 remembered).
    pub exact: bool,
}

/// Which process membership a charge was made under. A free credits only charges of the current
/// membership: a forked child must not credit its parent's bytes to itself.
pub type Owner = u64;

/// What HAMi's monitor tells the processes of a container through the region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MonitorSwitches {
    /// 0: the monitor says compute limits need not be enforced now; otherwise enforce.
    pub utilization_switch: i32,
    /// Negative: the monitor holds this container's launches (a higher-priority task runs).
    pub recent_kernel: i32,
}

impl MonitorSwitches {
    /// What a container without a monitor gets: enforce, never hold.
    pub const NONE: MonitorSwitches = MonitorSwitches { utilization_switch: 1, recent_kernel: 0 };
}

/// Where the bytes in use on each device are counted, and where the container's compute clock
/// lives. Devices are the process's CUDA ordinals.
pub trait Ledger: Send + Sync {
    /// Whether any device has a budget; when none has, the memory hooks pass straight through.
    fn any_limit(&self) -> bool;
    /// The budget of `device`, `None` when it has none. A shared ledger reads it from the region
    /// at every call, so a resize (`vgpu-smi resize`) reaches every process at once.
    fn limit(&self, device: usize) -> Option<u64>;
    /// Whether `device` has a budget, so that its memory must be counted: what the hooks ask on
    /// every call before they charge. Fixed for the life of the process (a resize changes a
    /// budget, never whether there is one), so it needs no read of the region; the charge
    /// itself reads the budget there ([`Ledger::try_reserve`]).
    fn budgeted(&self, device: usize) -> bool {
        self.limit(device).is_some()
    }
    /// The compute share of `device` in percent, `None` when it has none (0 or 100). Read from the
    /// region at every call by a shared ledger, like [`Ledger::limit`].
    fn share(&self, device: usize) -> Option<u64>;
    /// Adds `bytes` to `device` if the total stays within its budget, as one atomic step;
    /// otherwise changes nothing and returns [`LedgerError::BudgetExceeded`].
    fn try_reserve(&self, device: usize, bytes: u64) -> Result<Owner, LedgerError>;
    /// Adds `bytes` the driver has already committed, past the budget if need be (a pool that grew
    /// by more than we could foresee). Later reservations are refused until usage is back within it.
    fn record_committed(&self, device: usize, bytes: u64) -> Result<Owner, LedgerError>;
    /// Gives back bytes reserved earlier under `owner`.
    fn release(&self, device: usize, bytes: u64, owner: Owner);
    /// Bytes in use on `device` (by the whole container, for a shared ledger).
    fn used(&self, device: usize) -> u64;
    /// Bytes this process holds on `device`.
    fn held(&self, device: usize) -> u64 {
        self.used(device)
    }
    /// The process is exiting normally.
    fn on_exit(&self) {}
    /// What a full context on `device` was last measured to cost in this container, if anyone
    /// measured it.
    fn remembered_context_cost(&self, device: usize) -> Option<ContextCost>;
    /// Remembers what a full context on `device` cost. An exact cost replaces whatever was
    /// remembered (a skewed figure heals); an estimate only fills an empty field.
    fn remember_context_cost(&self, device: usize, cost: ContextCost);
    /// The container's compute pacing clock for `device`, shared by all its processes (see
    /// [`pace`]); `None` for a device the ledger does not know.
    fn pace_clock(&self, device: usize) -> Option<&AtomicU64>;
    /// The monitor's current switches.
    fn monitor(&self) -> MonitorSwitches {
        MonitorSwitches::NONE
    }
    /// Shows `percent`, this process's measured share of `device`, to the monitor.
    fn publish_utilisation(&self, _device: usize, _percent: u64) {}
    /// Shows the monitor when this container last launched work (Unix seconds).
    fn touch_last_kernel(&self, _unix_seconds: u64) {}
    /// Tells the monitor this container is launching work (HAMi-core's `recent_kernel` mark),
    /// unless the monitor is holding it.
    fn mark_launch(&self) {}
    /// `bytes` (negative: given back) of what this process has charged on `device` are a
    /// context's, shown to the monitor apart from its buffers.
    fn note_context(&self, _device: usize, _bytes: i64) {}
    /// Whether `device` is overcommitted (`CUDA_OVERSUBSCRIBE` and a budget): its budget may
    /// exceed the card, and its linear allocations are made spillable (docs/overcommit.md).
    fn overcommit(&self, _device: usize) -> bool {
        false
    }
    /// `bytes` (negative: given back) of what this process has charged on `device` are spillable
    /// managed memory, shown to operators apart from the rest. The first spillable allocation of
    /// the container on a device is logged at info level.
    fn note_spillable(&self, _device: usize, _bytes: i64) {}
    /// Of what this process holds on `device`, the bytes of managed memory (spillable or the
    /// application's own), which NVML's per-process figure never counts (measured on an H100,
    /// driver 580: 4 GiB of managed memory, resident or not, added nothing to it).
    fn spillable(&self, _device: usize) -> u64 {
        0
    }
    /// Where this process's swap record for `device` lives: the region's path, this process's
    /// lease, and the device's index in the region ([`swap`]). `None` without a shared region or
    /// a lease.
    fn swap_place(&self, _device: usize) -> Option<SwapPlace> {
        None
    }
}

/// A process's place in its container's swap table ([`swap::SwapTable`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SwapPlace {
    pub region: std::path::PathBuf,
    pub lease: usize,
    pub index: usize,
}

/// The info line of a container's first spillable allocation on `device`.
fn report_first_spill(device: usize, where_: &str) {
    tracing::info!(
        "{where_}: device {device} is overcommitted and this container now holds spillable memory: \
         allocations the card cannot hold spill to host memory (CUDA_OVERSUBSCRIBE)"
    );
}

/// Reserves `bytes` on `device`; refused, asks `reclaim` to give back what it can (a process's
/// stream-ordered pools hold memory their last charge still counts) and, when it says it did,
/// tries once more. Both preload libraries reserve through this, so the rule is one.
#[inline]
pub fn reserve_or_reclaim(
    ledger: &dyn Ledger,
    device: usize,
    bytes: u64,
    reclaim: impl FnOnce() -> bool,
) -> Result<Owner, LedgerError> {
    match ledger.try_reserve(device, bytes) {
        Err(refused @ LedgerError::BudgetExceeded { .. }) => {
            retry_after(ledger, device, bytes, refused, reclaim)
        }
        result => result,
    }
}

/// The refused path of [`reserve_or_reclaim`], out of line: the hot path is the granted one.
#[cold]
#[inline(never)]
fn retry_after(
    ledger: &dyn Ledger,
    device: usize,
    bytes: u64,
    refused: LedgerError,
    reclaim: impl FnOnce() -> bool,
) -> Result<Owner, LedgerError> {
    if reclaim() { ledger.try_reserve(device, bytes) } else { Err(refused) }
}

/// The ledger a library of this process charges: the shared region when anything is limited (by
/// our environment or by a region some process of the container already made), a process-local
/// ledger otherwise. A region we cannot trust fails closed. `uuids` gives the `GPU-…` UUIDs of
/// the process's CUDA ordinals, asked for only when the region is used.
pub fn attach(config: &Config, uuids: impl FnOnce() -> Vec<Vec<u8>>) -> &'static dyn Ledger {
    let path = &config.shared_cache;
    if let Some(why) = &config.fail_closed {
        tracing::error!("{why}");
        return Box::leak(Box::new(LocalLedger::refusing_everything()));
    }
    let limited = config.any_memory_limit() || config.any_compute_limit();
    if config.local_ledger || (!limited && !path.exists()) {
        return Box::leak(Box::new(LocalLedger::from_config(config)));
    }
    match SharedLedger::attach(config, path, &uuids()) {
        Ok(ledger) => ledger,
        Err(error) => {
            tracing::error!("shared region {error}; allocations on budgeted devices are refused");
            Box::leak(Box::new(LocalLedger::fail_closed(config)))
        }
    }
}

/// A ledger private to this process.
#[derive(Debug)]
pub struct LocalLedger {
    limits: [Option<u64>; MAX_DEVICES],
    shares: [Option<u64>; MAX_DEVICES],
    /// Whether any of `limits` is set: asked on every hooked call.
    any_limit: bool,
    used: [AtomicU64; MAX_DEVICES],
    /// Remembered context costs, as in the shared region (`CONTEXT_COST_KNOWN` set when known),
    /// and which of them are exact (bit per device).
    context_cost: [AtomicU64; MAX_DEVICES],
    context_cost_exact: AtomicU64,
    pace: [AtomicU64; MAX_DEVICES],
    /// `CUDA_OVERSUBSCRIBE` was on (applies to budgeted devices only).
    overcommit: bool,
    /// This process's spillable bytes per device, and whether each device has spilled yet.
    spillable: [AtomicU64; MAX_DEVICES],
    spilled: AtomicU64,
}

impl LocalLedger {
    pub fn new(limits: [Option<u64>; MAX_DEVICES]) -> LocalLedger {
        LocalLedger {
            any_limit: limits.iter().any(Option::is_some),
            limits,
            shares: [None; MAX_DEVICES],
            used: Default::default(),
            context_cost: Default::default(),
            context_cost_exact: AtomicU64::new(0),
            pace: Default::default(),
            overcommit: false,
            spillable: Default::default(),
            spilled: AtomicU64::new(0),
        }
    }

    /// The budgets and shares the configuration asks for.
    pub fn from_config(config: &Config) -> LocalLedger {
        LocalLedger {
            shares: std::array::from_fn(|d| config.sm_share(d)),
            overcommit: config.overcommit,
            ..LocalLedger::new(std::array::from_fn(|d| config.memory_limit(d)))
        }
    }

    /// Every device gets a zero budget: a container the node budgets whose budget is nowhere to
    /// be found.
    pub fn refusing_everything() -> LocalLedger {
        LocalLedger::new([Some(0); MAX_DEVICES])
    }

    /// Every budgeted device gets a zero budget: used when the shared region cannot be trusted.
    pub fn fail_closed(config: &Config) -> LocalLedger {
        let region_budgeted =
            config.region.is_some_and(|region| region.limits.iter().any(|&limit| limit != 0));
        LocalLedger {
            shares: std::array::from_fn(|d| config.sm_share(d)),
            // The region's budgets are by its own device index, which only the region maps to
            // this process's ordinals: a budget there refuses every device.
            ..LocalLedger::new(
                config.memory.map(|limit| (region_budgeted || matches!(limit, Limit::Bytes(_))).then_some(0)),
            )
        }
    }
}

impl Ledger for LocalLedger {
    fn any_limit(&self) -> bool {
        self.any_limit
    }

    fn limit(&self, device: usize) -> Option<u64> {
        self.limits.get(device).copied().flatten()
    }

    fn share(&self, device: usize) -> Option<u64> {
        self.shares.get(device).copied().flatten()
    }

    fn try_reserve(&self, device: usize, bytes: u64) -> Result<Owner, LedgerError> {
        let limit = self.limit(device).unwrap_or(u64::MAX);
        let Some(used) = self.used.get(device) else {
            return Err(LedgerError::BudgetExceeded { device, requested: bytes, used: 0, limit: 0 });
        };
        used.fetch_update(Ordering::AcqRel, Ordering::Acquire, |now| {
            now.checked_add(bytes).filter(|&after| after <= limit)
        })
        .map(|_| 0)
        .map_err(|now| LedgerError::BudgetExceeded { device, requested: bytes, used: now, limit })
    }

    fn record_committed(&self, device: usize, bytes: u64) -> Result<Owner, LedgerError> {
        let used = self.used.get(device).ok_or(LedgerError::BudgetExceeded {
            device,
            requested: bytes,
            used: 0,
            limit: 0,
        })?;
        let _ = used.fetch_update(Ordering::AcqRel, Ordering::Acquire, |now| Some(now.saturating_add(bytes)));
        Ok(0)
    }

    fn release(&self, device: usize, bytes: u64, _owner: Owner) {
        if let Some(used) = self.used.get(device) {
            // Saturate rather than wrap: a credit we cannot match must not create budget.
            let _ =
                used.fetch_update(Ordering::AcqRel, Ordering::Acquire, |now| Some(now.saturating_sub(bytes)));
        }
    }

    fn used(&self, device: usize) -> u64 {
        self.used.get(device).map_or(0, |used| used.load(Ordering::Acquire))
    }

    fn remembered_context_cost(&self, device: usize) -> Option<ContextCost> {
        let exact = self.context_cost_exact.load(Ordering::Acquire) & (1 << device) != 0;
        let known = self.context_cost.get(device)?.load(Ordering::Acquire);
        (known & CONTEXT_COST_KNOWN != 0).then_some(ContextCost { bytes: known & !CONTEXT_COST_KNOWN, exact })
    }

    fn remember_context_cost(&self, device: usize, cost: ContextCost) {
        let Some(remembered) = self.context_cost.get(device) else { return };
        if cost.exact {
            remembered.store(cost.bytes | CONTEXT_COST_KNOWN, Ordering::Release);
            self.context_cost_exact.fetch_or(1 << device, Ordering::Release);
        } else {
            let _ = remembered.compare_exchange(
                0,
                cost.bytes | CONTEXT_COST_KNOWN,
                Ordering::AcqRel,
                Ordering::Acquire,
            );
        }
    }

    fn pace_clock(&self, device: usize) -> Option<&AtomicU64> {
        self.pace.get(device)
    }

    fn overcommit(&self, device: usize) -> bool {
        self.overcommit && self.limit(device).is_some()
    }

    fn spillable(&self, device: usize) -> u64 {
        self.spillable.get(device).map_or(0, |bytes| bytes.load(Ordering::Relaxed))
    }

    fn note_spillable(&self, device: usize, bytes: i64) {
        let Some(spillable) = self.spillable.get(device) else { return };
        let _ = spillable
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |now| Some(now.saturating_add_signed(bytes)));
        if bytes > 0 && self.spilled.fetch_or(1 << device, Ordering::Relaxed) & (1 << device) == 0 {
            report_first_spill(device, "this process");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ledger(limit: u64) -> LocalLedger {
        let mut limits = [None; MAX_DEVICES];
        limits[0] = Some(limit);
        limits[1] = Some(limit);
        limits[2] = Some(limit);
        LocalLedger::new(limits)
    }

    #[test]
    fn reserve_up_to_the_limit_and_no_further() {
        let ledger = ledger(1000);
        assert!(ledger.try_reserve(0, 600).is_ok());
        assert!(ledger.try_reserve(0, 400).is_ok());
        assert_eq!(
            ledger.try_reserve(0, 1),
            Err(LedgerError::BudgetExceeded { device: 0, requested: 1, used: 1000, limit: 1000 })
        );
        ledger.release(0, 400, 0);
        assert_eq!(ledger.used(0), 600);
        assert!(ledger.try_reserve(0, 400).is_ok());
    }

    #[test]
    fn devices_are_independent() {
        let ledger = ledger(1000);
        assert!(ledger.try_reserve(1, 1000).is_ok());
        assert!(ledger.try_reserve(2, 1000).is_ok());
        assert_eq!(ledger.used(0), 0);
        assert_eq!(ledger.limit(3), None);
    }

    #[test]
    fn overflow_and_bad_devices_are_refused() {
        let ledger = LocalLedger::new([None; MAX_DEVICES]);
        assert!(ledger.try_reserve(0, u64::MAX).is_ok());
        assert!(ledger.try_reserve(0, 1).is_err());
        assert!(ledger.try_reserve(MAX_DEVICES, 1).is_err());
        ledger.release(3, 5, 0);
        assert_eq!(ledger.used(3), 0);
    }

    #[test]
    fn fail_closed_zeroes_only_budgeted_devices() {
        let config = Config::from_vars([("CUDA_DEVICE_MEMORY_LIMIT_1".to_string(), "1g".to_string())]);
        let ledger = LocalLedger::fail_closed(&config);
        assert_eq!(ledger.limit(0), None);
        assert_eq!(ledger.limit(1), Some(0));
        assert!(ledger.try_reserve(1, 1).is_err());
    }

    #[test]
    fn overcommit_applies_to_budgeted_devices_only() {
        let config = Config::from_vars([
            ("CUDA_DEVICE_MEMORY_LIMIT_0".to_string(), "4g".to_string()),
            ("CUDA_OVERSUBSCRIBE".to_string(), "true".to_string()),
        ]);
        let ledger = LocalLedger::from_config(&config);
        assert!(ledger.overcommit(0));
        assert!(!ledger.overcommit(1));
        ledger.note_spillable(0, 100);
        ledger.note_spillable(0, -40);
        assert_eq!(ledger.spillable(0), 60);
        ledger.note_spillable(0, -100);
        assert_eq!(ledger.spillable(0), 0, "saturates, never wraps");
        assert!(
            !LocalLedger::from_config(&Config::from_vars([(
                "CUDA_DEVICE_MEMORY_LIMIT_0".to_string(),
                "4g".to_string()
            )]))
            .overcommit(0)
        );
    }

    #[test]
    fn concurrent_reservations_never_overshoot() {
        let ledger = ledger(10_000);
        let granted = AtomicU64::new(0);
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    for _ in 0..1000 {
                        if ledger.try_reserve(0, 7).is_ok() {
                            granted.fetch_add(7, Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        assert_eq!(granted.load(Ordering::Relaxed), ledger.used(0));
        assert!(ledger.used(0) <= 10_000 && ledger.used(0) > 10_000 - 7);
    }
}
