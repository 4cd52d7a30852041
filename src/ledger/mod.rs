//! The budget ledger: bytes in use per device, with an atomic check-and-reserve.
//!
//! [`Ledger`] is the seam between the hooks and where usage lives. [`LocalLedger`] keeps it in
//! this process; the shared-region ledger (one budget for every process of a container) plugs in
//! behind the same trait.

mod allocations;

pub use allocations::{Allocation, AllocationTable};

use std::sync::atomic::{AtomicU64, Ordering};

use crate::config::MAX_DEVICES;
use crate::error::HookError;

/// Where the bytes in use on each device are counted.
pub trait Ledger: Send + Sync {
    /// Adds `bytes` to `device` if the total stays within `limit`, as one atomic step; otherwise
    /// changes nothing and returns [`HookError::BudgetExceeded`].
    fn try_reserve(&self, device: usize, bytes: u64, limit: u64) -> Result<(), HookError>;
    /// Gives back bytes reserved earlier.
    fn release(&self, device: usize, bytes: u64);
    /// Bytes in use on `device`.
    fn used(&self, device: usize) -> u64;
}

/// A ledger private to this process.
#[derive(Debug, Default)]
pub struct LocalLedger {
    used: [AtomicU64; MAX_DEVICES],
}

impl Ledger for LocalLedger {
    fn try_reserve(&self, device: usize, bytes: u64, limit: u64) -> Result<(), HookError> {
        let Some(used) = self.used.get(device) else {
            return Err(HookError::BudgetExceeded { device, requested: bytes, used: 0, limit: 0 });
        };
        used.fetch_update(Ordering::AcqRel, Ordering::Acquire, |now| {
            now.checked_add(bytes).filter(|&after| after <= limit)
        })
        .map(drop)
        .map_err(|now| HookError::BudgetExceeded { device, requested: bytes, used: now, limit })
    }

    fn release(&self, device: usize, bytes: u64) {
        if let Some(used) = self.used.get(device) {
            // Saturate rather than wrap: a credit we cannot match must not create budget.
            let _ =
                used.fetch_update(Ordering::AcqRel, Ordering::Acquire, |now| Some(now.saturating_sub(bytes)));
        }
    }

    fn used(&self, device: usize) -> u64 {
        self.used.get(device).map_or(0, |used| used.load(Ordering::Acquire))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserve_up_to_the_limit_and_no_further() {
        let ledger = LocalLedger::default();
        assert!(ledger.try_reserve(0, 600, 1000).is_ok());
        assert!(ledger.try_reserve(0, 400, 1000).is_ok());
        assert_eq!(
            ledger.try_reserve(0, 1, 1000),
            Err(HookError::BudgetExceeded { device: 0, requested: 1, used: 1000, limit: 1000 })
        );
        ledger.release(0, 400);
        assert_eq!(ledger.used(0), 600);
        assert!(ledger.try_reserve(0, 400, 1000).is_ok());
    }

    #[test]
    fn devices_are_independent() {
        let ledger = LocalLedger::default();
        assert!(ledger.try_reserve(1, 1000, 1000).is_ok());
        assert!(ledger.try_reserve(2, 1000, 1000).is_ok());
        assert_eq!(ledger.used(0), 0);
    }

    #[test]
    fn overflow_and_bad_devices_are_refused() {
        let ledger = LocalLedger::default();
        assert!(ledger.try_reserve(0, u64::MAX, u64::MAX).is_ok());
        assert!(ledger.try_reserve(0, 1, u64::MAX).is_err());
        assert!(ledger.try_reserve(MAX_DEVICES, 1, 10).is_err());
        ledger.release(3, 5);
        assert_eq!(ledger.used(3), 0);
    }

    #[test]
    fn concurrent_reservations_never_overshoot() {
        let ledger = LocalLedger::default();
        let granted = AtomicU64::new(0);
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    for _ in 0..1000 {
                        if ledger.try_reserve(0, 7, 10_000).is_ok() {
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
