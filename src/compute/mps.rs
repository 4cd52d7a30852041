//! MPS: whether this process's contexts run under an MPS server, said once at start, and the
//! warning when a container is limited twice, by its libvgpu share and by MPS itself.
//!
//! Under MPS libvgpu's share still governs (docs/compute-limit.md, "MPS nodes"): the share is the
//! operator's, written by the device plugin, while `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` and an
//! execution-affinity context are the tenant's own to set. A tenant must not escape its share by
//! setting them, so libvgpu never steps aside for them; it warns instead, because the two limits
//! multiply (measured: a share of 30 with a thread percentage of 30 gave 8.5 % of the GPU).

use std::ffi::c_int;

use crate::driver::{self, sys::CU_DEVICE_ATTRIBUTE_MPS_ENABLED};
use crate::ledger::Ledger;

/// The variable through which MPS caps the SMs a client's kernels may use.
pub const THREAD_PERCENTAGE: &str = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE";
/// Where an MPS client finds the control daemon's pipes.
pub const PIPE_DIRECTORY: &str = "CUDA_MPS_PIPE_DIRECTORY";
/// The pipe directory when the variable is unset.
pub const DEFAULT_PIPE_DIRECTORY: &str = "/tmp/nvidia-mps";

/// What the driver says of MPS on one device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MpsState {
    /// Contexts created on the device are shared through an MPS server.
    Active,
    /// They are not.
    Inactive,
    /// The driver does not answer (`CU_DEVICE_ATTRIBUTE_MPS_ENABLED` is CUDA 12.3+).
    Unknown,
}

/// The driver's answer for CUDA ordinal `device`.
pub fn state(device: usize) -> MpsState {
    match driver::cuda().device_attribute(device as c_int, CU_DEVICE_ATTRIBUTE_MPS_ENABLED) {
        Ok(0) => MpsState::Inactive,
        Ok(_) => MpsState::Active,
        Err(_) => MpsState::Unknown,
    }
}

/// `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` of this process when it caps anything (below 100), as
/// written.
pub fn thread_percentage() -> Option<String> {
    let value = std::env::var(THREAD_PERCENTAGE).ok()?;
    let percent: f64 = value.trim().parse().ok()?;
    (percent < 100.0).then_some(value)
}

/// Says at debug level whether each device runs under MPS, and warns once if the container's
/// share and an MPS thread percentage both apply. Called once, when the ledger is attached.
pub fn report(ledger: &dyn Ledger) {
    let devices = driver::cuda_device_uuids().len();
    let pipes = std::env::var(PIPE_DIRECTORY).unwrap_or_else(|_| DEFAULT_PIPE_DIRECTORY.to_owned());
    let mut active = Vec::new();
    for device in 0..devices {
        match state(device) {
            MpsState::Active => {
                active.push(device);
                tracing::debug!(
                    "device {device}: contexts run under MPS (CU_DEVICE_ATTRIBUTE_MPS_ENABLED=1, pipes in {pipes})"
                );
            }
            MpsState::Inactive => tracing::debug!("device {device}: not under MPS"),
            MpsState::Unknown => {
                tracing::debug!(
                    "device {device}: MPS unknown (the driver does not answer CU_DEVICE_ATTRIBUTE_MPS_ENABLED)"
                )
            }
        }
    }
    let Some(threads) = thread_percentage() else { return };
    let shares: Vec<String> = (0..devices)
        .filter_map(|d| ledger.share(d).map(|percent| format!("{percent} on device {d}")))
        .collect();
    if shares.is_empty() {
        return;
    }
    let mps = if active.is_empty() {
        "MPS is not active now, so the thread percentage does nothing yet".to_owned()
    } else {
        format!("MPS is active on device(s) {active:?}")
    };
    tracing::warn!(
        "CUDA_DEVICE_SM_LIMIT ({}) and {THREAD_PERCENTAGE}={threads} are both set ({mps}): libvgpu's share governs, \
         and the thread percentage would also slow every kernel, so the container would get about the product \
         of the two (measured: 8.5 % of the GPU for 30 and 30); unset {THREAD_PERCENTAGE}",
        shares.join(", ")
    );
}

/// Warns when a context is created with an SM-count execution affinity (`cuCtxCreate_v3`/`_v4`)
/// on a device that has a share: the two limits multiply, as with the thread percentage.
pub fn warn_affinity(ledger: &dyn Ledger, device: usize, sm_count: u32) {
    if let Some(percent) = ledger.share(device) {
        tracing::warn!(
            "a context on device {device} was created with an execution affinity of {sm_count} SMs while \
             CUDA_DEVICE_SM_LIMIT gives the container {percent} %: libvgpu's share governs, and the affinity \
             would also slow every kernel, so the container would get about the product of the two"
        );
    }
}
