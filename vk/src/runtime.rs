//! The layer's process-wide state: the environment contract, the container's GPUs and the
//! ledger, each set up on first need.

use std::sync::OnceLock;

use vgpu_ledger::config::Config;
use vgpu_ledger::pace::Gate;
use vgpu_ledger::{Ledger, logging};

use crate::gpus::{self, Gpu};

/// Test-only fault points, a comma-separated list: `zero-uuid` makes every physical device look
/// like an NVIDIA device whose driver reports an all-zero UUID and no PCI location, so CI can walk
/// the fallbacks on a software device; `no-timestamps` makes every queue family look like one
/// without timestamps (`timestampValidBits` 0), so paced submissions are timed on the host;
/// `no-stamp-calibration` skips calibrating the cost of the layer's own timestamps, so GPU-timed
/// spans are charged whole; `two-pacer-fences` lets the pacer meter two submissions at a time
/// instead of 256, as when its waiter thread is starved of CPU, so the rest are charged their
/// estimate.
pub const FAULT_VAR: &str = "LIBVGPU_VK_FAULT";

pub struct Runtime {
    pub config: Config,
    pub gate: Gate,
    pub zero_uuid_fault: bool,
    pub no_timestamps_fault: bool,
    pub no_stamp_calibration_fault: bool,
    pub two_pacer_fences_fault: bool,
    gpus: OnceLock<Vec<Gpu>>,
    ledger: OnceLock<&'static dyn Ledger>,
}

impl Runtime {
    /// Whether anything in this container is budgeted or paced: otherwise the layer asks nothing
    /// of the CUDA driver and touches no file.
    fn involved(&self) -> bool {
        self.config.any_memory_limit() || self.config.any_compute_limit() || self.config.region.is_some()
    }

    /// The container's GPUs by CUDA ordinal.
    pub fn gpus(&self) -> &[Gpu] {
        self.gpus.get_or_init(|| if self.involved() { gpus::cuda_gpus() } else { Vec::new() })
    }

    /// The ledger the CUDA side charges too.
    pub fn ledger(&self) -> &'static dyn Ledger {
        *self.ledger.get_or_init(|| {
            vgpu_ledger::attach(&self.config, || {
                self.gpus().iter().map(|gpu| vgpu_ledger::region::uuid_name(&gpu.uuid).to_vec()).collect()
            })
        })
    }
}

/// The runtime, set up on first use.
pub fn get() -> &'static Runtime {
    static RUNTIME: OnceLock<Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        // Any function of this library tells `dladdr` which file it was loaded from.
        let found = vgpu_ledger::sources::for_this_process(get as *const std::ffi::c_void);
        let config = found.config;
        logging::init(config.log_level);
        for problem in &config.problems {
            tracing::error!("{problem}");
        }
        for note in &found.notes {
            tracing::warn!("{note}");
        }
        tracing::debug!(
            "Vulkan layer starting (libvgpu_vk {}): {}",
            env!("CARGO_PKG_VERSION"),
            config.summary()
        );
        tracing::debug!("budget from {}", found.source);
        let faults = std::env::var(FAULT_VAR).unwrap_or_default();
        let fault = |name: &str| faults.split(',').any(|f| f.trim() == name);
        Runtime {
            gate: Gate::new(config.core_policy),
            zero_uuid_fault: fault("zero-uuid"),
            no_timestamps_fault: fault("no-timestamps"),
            no_stamp_calibration_fault: fault("no-stamp-calibration"),
            two_pacer_fences_fault: fault("two-pacer-fences"),
            config,
            gpus: OnceLock::new(),
            ledger: OnceLock::new(),
        }
    })
}
