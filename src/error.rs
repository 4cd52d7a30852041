//! What can go wrong inside a hook, and the one mapping from that to driver status codes.

use crate::driver::sys::*;
use crate::ledger::LedgerError;
use crate::logging;

/// A hook's failure. Shims turn it into the status code the caller expects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HookError {
    /// The allocation would take the device past its budget; the driver was not called.
    BudgetExceeded { device: usize, requested: u64, used: u64, limit: u64 },
    /// The driver does not export an entry point this hook needs.
    MissingEntryPoint(&'static str),
    /// The shared region cannot be used (this process has no lease, or its lock is broken); the
    /// allocation is refused rather than left uncounted.
    RegionUnavailable,
    /// A hook was entered while this thread was still setting up libvgpu.
    NotReady,
    /// The CUDA driver returned this status; passed on unchanged.
    Driver(CUresult),
    /// NVML returned this status; passed on unchanged.
    Nvml(NvmlReturn),
}

impl From<HookError> for CUresult {
    fn from(error: HookError) -> CUresult {
        match error {
            HookError::BudgetExceeded { .. } | HookError::RegionUnavailable => CUDA_ERROR_OUT_OF_MEMORY,
            HookError::MissingEntryPoint(_) => CUDA_ERROR_NOT_FOUND,
            HookError::NotReady => CUDA_ERROR_NOT_INITIALIZED,
            HookError::Driver(status) => status,
            HookError::Nvml(_) => CUDA_ERROR_UNKNOWN,
        }
    }
}

impl HookError {
    /// Logs this failure if it is a refused allocation, at info level and at most once a second
    /// (see `logging::refused`). Called where a hook's error becomes the caller's status.
    pub fn log_refusal(self) {
        match self {
            HookError::BudgetExceeded { device, requested, used, limit } => {
                logging::refused("an allocation", device, requested, used, limit)
            }
            HookError::RegionUnavailable => logging::refused_because(format_args!(
                "refused an allocation: the shared region cannot be used (see the error logged before)"
            )),
            _ => {}
        }
    }

    /// The NVML status for this failure.
    pub fn to_nvml(self) -> NvmlReturn {
        match self {
            HookError::MissingEntryPoint(_) => NVML_ERROR_FUNCTION_NOT_FOUND,
            HookError::NotReady => NVML_ERROR_UNINITIALIZED,
            HookError::Nvml(status) => status,
            HookError::BudgetExceeded { .. } | HookError::RegionUnavailable | HookError::Driver(_) => {
                NVML_ERROR_UNKNOWN
            }
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
