//! MPS: whether this process's contexts run under an MPS server, said once at start, and what
//! happens when a container is limited both by its libvgpu share and by MPS itself.
//!
//! Under MPS libvgpu's share still governs (docs/compute-limit.md, "MPS nodes"): the share is the
//! operator's, written by the device plugin, while `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` and an
//! execution-affinity context are the tenant's own to set, so libvgpu never steps aside for them.
//! The two are combined instead of multiplied: a kernel held to part of the SMs is charged that
//! part of its time (`meter`), so a container whose cap is at least its share gets its share
//! (without this, a share of 30 with a thread percentage of 30 gave 8.5 % of the GPU). A cap below
//! the share holds the container under it, and that is warned about.

use std::ffi::c_int;

use crate::driver::{
    self,
    sys::{
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
        CU_DEVICE_ATTRIBUTE_MPS_ENABLED,
    },
};
use crate::ledger::Ledger;
use vgpu_ledger::config::MPS_THREAD_PERCENTAGE as THREAD_PERCENTAGE;

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

/// The part of CUDA device `device`'s SMs a context that may use `context_sms` of them has, in
/// thousandths: 1000 unless the device runs under MPS. The whole device's SM count cannot come from
/// the driver there: a capped client's driver answers the capped figure for the device too
/// (measured on an H100: 38 SMs for a thread percentage of 30, 92 for 70, 132 without). It comes
/// from NVML, which is not an MPS client: the device's CUDA cores over the cores per SM of its
/// compute capability. The environment's thread percentage is not used, as a program can change its
/// environment after the driver read it. What cannot be told counts as uncapped: charging a whole
/// duration never lets the container exceed its share.
pub fn sm_part(device: usize, context_sms: u32) -> u64 {
    if state(device) != MpsState::Active {
        return 1000;
    }
    part_of_whole_device(device, context_sms)
}

/// `sms` as thousandths of the whole of CUDA device `device` (1000 when that cannot be told).
fn part_of_whole_device(device: usize, sms: u32) -> u64 {
    let Some(whole) = whole_device_sms(device) else { return 1000 };
    (u64::from(sms.min(whole)) * 1000 / u64::from(whole)).max(1)
}

/// The SMs of the whole CUDA device `device`, from NVML's core count.
fn whole_device_sms(device: usize) -> Option<u32> {
    let cuda = driver::cuda();
    let uuid = driver::cuda_device_uuids().get(device)?;
    let cores = driver::nvml().gpu_cores_by_uuid(uuid).ok()?;
    let major = cuda.device_attribute(device as c_int, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR).ok()?;
    let minor = cuda.device_attribute(device as c_int, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR).ok()?;
    let sms = cores / cores_per_sm(major, minor)?;
    (sms > 0).then_some(sms)
}

/// CUDA cores per SM by compute capability, from Volta (the first GPUs on which MPS caps SMs) on;
/// `None` for one not listed.
fn cores_per_sm(major: c_int, minor: c_int) -> Option<u32> {
    match (major, minor) {
        (7, _) | (8, 0) => Some(64),
        (8, 6..=9) | (9, 0) | (10..=12, _) => Some(128),
        _ => None,
    }
}

/// Says at debug level whether each device runs under MPS; with a share there, says at info level
/// how the share and MPS's thread percentage go together, and warns once if the thread percentage
/// holds the container under its share. Called once, when the ledger is attached.
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
    let Some((threads, cap)) = vgpu_ledger::config::mps_thread_percentage() else {
        let shared: Vec<String> = active
            .iter()
            .filter_map(|&d| ledger.share(d).map(|percent| format!("{percent} on device {d}")))
            .collect();
        if !shared.is_empty() {
            tracing::info!(
                "CUDA_DEVICE_SM_LIMIT ({}) under MPS without {THREAD_PERCENTAGE}: the share holds as GPU time; set \
                 {THREAD_PERCENTAGE} to the share too, and MPS keeps the GPU busier (docs/compute-limit.md, \
                 \"MPS nodes\")",
                shared.join(", ")
            );
        }
        return;
    };
    let shares: Vec<(usize, u64)> =
        (0..devices).filter_map(|d| ledger.share(d).map(|percent| (d, percent))).collect();
    if shares.is_empty() {
        return;
    }
    let listed =
        shares.iter().map(|(d, percent)| format!("{percent} on device {d}")).collect::<Vec<_>>().join(", ");
    let mps = if active.is_empty() {
        "MPS is not active now, so the thread percentage caps nothing".to_owned()
    } else {
        format!("MPS is active on device(s) {active:?}")
    };
    let held_under: Vec<usize> = shares
        .iter()
        .filter(|(d, percent)| active.contains(d) && cap < *percent as f64)
        .map(|(d, _)| *d)
        .collect();
    if held_under.is_empty() {
        tracing::info!(
            "CUDA_DEVICE_SM_LIMIT ({listed}) and {THREAD_PERCENTAGE}={threads} are both set ({mps}): kernels held to \
             part of the SMs are charged that part of their time, so the container gets its share, not the \
             product of the two"
        );
    } else {
        tracing::warn!(
            "CUDA_DEVICE_SM_LIMIT ({listed}) and {THREAD_PERCENTAGE}={threads} are both set ({mps}): the thread \
             percentage holds the container under its share on device(s) {held_under:?}, to about {threads} % of the \
             GPU; set {THREAD_PERCENTAGE} to at least the share, or unset it"
        );
    }
}

/// Says what a context created with an SM-count execution affinity (`cuCtxCreate_v3`/`_v4`) gets
/// on a device that has a share: its kernels are charged the part of the SMs they may use, and an
/// affinity below the share holds the container under it (warned about).
pub fn note_affinity(ledger: &dyn Ledger, device: usize, sm_count: u32) {
    let Some(percent) = ledger.share(device) else { return };
    if state(device) != MpsState::Active {
        return;
    }
    let part = part_of_whole_device(device, sm_count);
    let shown = format!("{}.{} %", part / 10, part % 10);
    if part < percent * 10 {
        tracing::warn!(
            "a context on device {device} was created with an execution affinity of {sm_count} SMs ({shown} of \
             the GPU) while CUDA_DEVICE_SM_LIMIT gives the container {percent} %: the affinity holds that \
             context's kernels under the share"
        );
    } else {
        tracing::info!(
            "a context on device {device} was created with an execution affinity of {sm_count} SMs ({shown} of \
             the GPU) under a share of {percent} %: its kernels are charged {shown} of their time"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cores_per_sm_follow_the_architecture_and_unknown_ones_are_not_guessed() {
        // V100, A100, A10/L4/L40, H100/H200, B200: the whole device's SMs from NVML's core count.
        for ((major, minor), per_sm) in
            [((7, 0), 64), ((8, 0), 64), ((8, 6), 128), ((8, 9), 128), ((9, 0), 128), ((10, 0), 128)]
        {
            assert_eq!(cores_per_sm(major, minor), Some(per_sm), "{major}.{minor}");
        }
        assert_eq!(16896 / cores_per_sm(9, 0).unwrap(), 132, "an H100 SXM");
        // Before Volta MPS caps no SMs; a capability from the future is not guessed.
        assert_eq!(cores_per_sm(6, 1), None);
        assert_eq!(cores_per_sm(13, 0), None);
    }
}
