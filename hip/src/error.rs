//! What can go wrong inside a hook, and the one mapping from that to `hipError_t`.

use vgpu_ledger::{LedgerError, logging};

use crate::sys::*;

/// A hook's failure. Shims turn it into the status code the caller expects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HookError {
    /// The allocation would take the device past its budget; the runtime was not called.
    BudgetExceeded { device: usize, requested: u64, used: u64, limit: u64 },
    /// The shared region cannot be used; the allocation is refused rather than left uncounted.
    RegionUnavailable,
    /// The HIP runtime (or the entry point a hook needs) was not found.
    MissingEntryPoint(&'static str),
    /// A hook was entered while this thread was still setting libvgpu_hip up.
    NotReady,
    /// The HIP runtime returned this status; passed on unchanged.
    Runtime(HipError),
}

impl From<HookError> for HipError {
    fn from(error: HookError) -> HipError {
        match error {
            HookError::BudgetExceeded { .. } | HookError::RegionUnavailable => HIP_ERROR_OUT_OF_MEMORY,
            HookError::MissingEntryPoint(_) => HIP_ERROR_NOT_FOUND,
            HookError::NotReady => HIP_ERROR_NOT_INITIALIZED,
            HookError::Runtime(status) => status,
        }
    }
}

impl From<LedgerError> for HookError {
    fn from(error: LedgerError) -> HookError {
        match error {
            LedgerError::BudgetExceeded { device, requested, used, limit } => {
                HookError::BudgetExceeded { device, requested, used, limit }
            }
            LedgerError::RegionUnavailable => HookError::RegionUnavailable,
        }
    }
}

impl HookError {
    /// Logs a refused allocation, rate-limited (see `logging::refused`).
    pub fn log_refusal(self) {
        match self {
            HookError::BudgetExceeded { device, requested, used, limit } => {
                logging::refused("a HIP allocation", device, requested, used, limit)
            }
            HookError::RegionUnavailable => logging::refused_because(format_args!(
                "refused a HIP allocation: the shared region cannot be used (see the error logged before)"
            )),
            _ => {}
        }
    }
}

/// A runtime status as a result.
pub fn check(status: HipError) -> Result<(), HookError> {
    if status == HIP_SUCCESS { Ok(()) } else { Err(HookError::Runtime(status)) }
}
