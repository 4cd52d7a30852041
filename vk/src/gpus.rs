//! Which budgeted GPU a Vulkan physical device is: matched to the CUDA ordinals of this process, so
//! Vulkan allocations land on the device index the CUDA path charges.
//!
//! The CUDA ordinals come from the driver itself (`libcuda.so.1`), which already applies
//! `CUDA_VISIBLE_DEVICES` and `NVIDIA_VISIBLE_DEVICES`. A physical device is matched by
//! `VkPhysicalDeviceIDProperties::deviceUUID` (the 16 bytes `cuDeviceGetUuid` returns, NVML's UUID
//! without `GPU-`). A driver that reports an all-zero UUID is matched by PCI location
//! (`VK_EXT_pci_bus_info` against CUDA's PCI attributes), then as "the only GPU" when exactly one
//! is visible; if neither decides, the device is [`Binding::Undecided`] and its device-local
//! allocations are refused (fail closed).

use std::ffi::{CStr, c_char, c_int, c_void};

/// One CUDA device of this process, by ordinal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gpu {
    pub uuid: [u8; 16],
    /// PCI domain, bus and device, when the driver says.
    pub pci: Option<PciLocation>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PciLocation {
    pub domain: u32,
    pub bus: u32,
    pub device: u32,
}

/// What the Vulkan driver says about a physical device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VulkanIdentity {
    pub uuid: [u8; 16],
    pub pci: Option<PciLocation>,
    /// Whether the device is NVIDIA's (vendor 0x10de); the fallbacks only ever bind those.
    pub nvidia: bool,
}

/// How a physical device relates to the budgets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Binding {
    /// Not one of the container's GPUs (a software rasteriser, another vendor's card).
    Unbudgeted,
    /// CUDA ordinal `ordinal`, and how it was decided.
    Gpu { ordinal: usize, by: MatchedBy },
    /// An NVIDIA device we cannot place: its device-local memory is refused.
    Undecided,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MatchedBy {
    Uuid,
    Pci,
    OnlyGpu,
}

pub const NVIDIA_VENDOR_ID: u32 = 0x10de;

/// Decides which of `gpus` (by CUDA ordinal) the physical device `vk` is.
pub fn bind(vk: &VulkanIdentity, gpus: &[Gpu]) -> Binding {
    if vk.uuid != [0; 16] {
        return match gpus.iter().position(|gpu| gpu.uuid == vk.uuid) {
            Some(ordinal) => Binding::Gpu { ordinal, by: MatchedBy::Uuid },
            None => Binding::Unbudgeted,
        };
    }
    if !vk.nvidia || gpus.is_empty() {
        return Binding::Unbudgeted;
    }
    if let Some(pci) = vk.pci {
        let mut matching = gpus.iter().enumerate().filter(|(_, gpu)| gpu.pci == Some(pci));
        if let (Some((ordinal, _)), None) = (matching.next(), matching.next()) {
            return Binding::Gpu { ordinal, by: MatchedBy::Pci };
        }
    }
    if gpus.len() == 1 {
        return Binding::Gpu { ordinal: 0, by: MatchedBy::OnlyGpu };
    }
    Binding::Undecided
}

type CuInit = unsafe extern "C" fn(u32) -> c_int;
type CuDeviceGetCount = unsafe extern "C" fn(*mut c_int) -> c_int;
type CuDeviceGet = unsafe extern "C" fn(*mut c_int, c_int) -> c_int;
type CuDeviceGetUuid = unsafe extern "C" fn(*mut [u8; 16], c_int) -> c_int;
type CuDeviceGetAttribute = unsafe extern "C" fn(*mut c_int, c_int, c_int) -> c_int;

const CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: c_int = 33;
const CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID: c_int = 34;
const CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID: c_int = 50;
/// At most this many ordinals, as the region holds.
const MAX_GPUS: c_int = vgpu_ledger::config::MAX_DEVICES as c_int;

/// The CUDA devices of this process, asked of the driver; empty when there is no driver (a
/// machine without NVIDIA's) or it does not start.
pub fn cuda_gpus() -> Vec<Gpu> {
    let Some(library) = open(&[c"libcuda.so.1", c"libcuda.so"]) else {
        tracing::debug!("no libcuda.so.1: no Vulkan device is budgeted");
        return Vec::new();
    };
    // SAFETY: each name is the driver's entry point of exactly the signature it is cast to
    // (cuda.h); `library` stays loaded (never closed).
    let (init, count, get, uuid, attribute) = unsafe {
        (
            symbol::<CuInit>(library, c"cuInit"),
            symbol::<CuDeviceGetCount>(library, c"cuDeviceGetCount"),
            symbol::<CuDeviceGet>(library, c"cuDeviceGet"),
            symbol::<CuDeviceGetUuid>(library, c"cuDeviceGetUuid_v2")
                .or_else(|| symbol::<CuDeviceGetUuid>(library, c"cuDeviceGetUuid")),
            symbol::<CuDeviceGetAttribute>(library, c"cuDeviceGetAttribute"),
        )
    };
    let (Some(init), Some(count), Some(get), Some(uuid)) = (init, count, get, uuid) else {
        tracing::warn!(
            "libcuda.so.1 lacks cuInit/cuDeviceGetCount/cuDeviceGet/cuDeviceGetUuid: no Vulkan device is budgeted"
        );
        return Vec::new();
    };
    // SAFETY: cuInit takes flags 0; the out-pointers below are valid locals.
    let status = unsafe { init(0) };
    if status != 0 {
        tracing::warn!("cuInit failed ({status}): no Vulkan device is budgeted");
        return Vec::new();
    }
    let mut n: c_int = 0;
    // SAFETY: `n` is a valid out-pointer.
    if unsafe { count(&mut n) } != 0 {
        return Vec::new();
    }
    let mut gpus = Vec::new();
    for ordinal in 0..n.clamp(0, MAX_GPUS) {
        let mut device: c_int = 0;
        let mut bytes = [0u8; 16];
        // SAFETY: valid out-pointers; `ordinal` < the count the driver gave.
        if unsafe { get(&mut device, ordinal) } != 0 || unsafe { uuid(&mut bytes, device) } != 0 {
            break;
        }
        let read = |which: c_int| -> Option<u32> {
            let attribute = attribute?;
            let mut value: c_int = 0;
            // SAFETY: valid out-pointer; `device` came from cuDeviceGet.
            (unsafe { attribute(&mut value, which, device) } == 0).then_some(value as u32)
        };
        let pci = match (
            read(CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID),
            read(CU_DEVICE_ATTRIBUTE_PCI_BUS_ID),
            read(CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID),
        ) {
            (Some(domain), Some(bus), Some(device)) => Some(PciLocation { domain, bus, device }),
            _ => None,
        };
        gpus.push(Gpu { uuid: bytes, pci });
    }
    gpus
}

fn open(names: &[&CStr]) -> Option<*mut c_void> {
    names.iter().find_map(|name| {
        // SAFETY: `name` is a NUL-terminated string; RTLD_NOW|RTLD_LOCAL has no other preconditions.
        let handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        (!handle.is_null()).then_some(handle)
    })
}

/// # Safety
/// `T` is the function-pointer type of the symbol `name` in `library`.
unsafe fn symbol<T: Copy>(library: *mut c_void, name: &CStr) -> Option<T> {
    // SAFETY: `library` is a live handle from dlopen; `name` is NUL-terminated.
    let address = unsafe { libc::dlsym(library, name.as_ptr() as *const c_char) };
    // SAFETY: per the caller, a non-NULL address is a function of type `T` (a pointer-sized fn).
    (!address.is_null()).then(|| unsafe { std::mem::transmute_copy::<*mut c_void, T>(&address) })
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: [u8; 16] = [1; 16];
    const B: [u8; 16] = [2; 16];

    fn gpu(uuid: [u8; 16], bus: u32) -> Gpu {
        Gpu { uuid, pci: Some(PciLocation { domain: 0, bus, device: 0 }) }
    }

    fn vk(uuid: [u8; 16], bus: Option<u32>, nvidia: bool) -> VulkanIdentity {
        VulkanIdentity { uuid, pci: bus.map(|bus| PciLocation { domain: 0, bus, device: 0 }), nvidia }
    }

    #[test]
    fn a_uuid_picks_its_ordinal_whatever_the_order() {
        let gpus = [gpu(B, 2), gpu(A, 1)];
        assert_eq!(bind(&vk(A, Some(7), true), &gpus), Binding::Gpu { ordinal: 1, by: MatchedBy::Uuid });
        assert_eq!(bind(&vk(B, None, true), &gpus), Binding::Gpu { ordinal: 0, by: MatchedBy::Uuid });
    }

    #[test]
    fn a_device_no_gpu_has_is_not_budgeted() {
        // lavapipe's UUID, or a second vendor's card: never guessed onto a GPU.
        assert_eq!(bind(&vk([9; 16], None, false), &[gpu(A, 1)]), Binding::Unbudgeted);
        assert_eq!(bind(&vk([0; 16], None, false), &[gpu(A, 1)]), Binding::Unbudgeted);
        assert_eq!(bind(&vk(A, None, true), &[]), Binding::Unbudgeted);
    }

    #[test]
    fn a_zero_uuid_falls_back_to_pci_then_to_the_only_gpu() {
        let two = [gpu(A, 1), gpu(B, 2)];
        assert_eq!(bind(&vk([0; 16], Some(2), true), &two), Binding::Gpu { ordinal: 1, by: MatchedBy::Pci });
        assert_eq!(bind(&vk([0; 16], None, true), &two), Binding::Undecided);
        assert_eq!(bind(&vk([0; 16], Some(5), true), &two), Binding::Undecided);
        assert_eq!(
            bind(&vk([0; 16], None, true), &[gpu(A, 1)]),
            Binding::Gpu { ordinal: 0, by: MatchedBy::OnlyGpu }
        );
        // Two GPUs claiming one PCI location decide nothing.
        assert_eq!(bind(&vk([0; 16], Some(1), true), &[gpu(A, 1), gpu(B, 1)]), Binding::Undecided);
    }
}
