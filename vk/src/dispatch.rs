//! Per-instance and per-device dispatch: the next layer's entry points, found by the dispatch key
//! of a handle (the loader's table pointer every dispatchable handle starts with).
//!
//! A physical device shares its instance's key, and a queue its device's.

use std::collections::HashMap;
use std::ffi::{CStr, c_char};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use ash::vk;
use ash::vk::Handle;

use crate::gpus::{self, Binding, MatchedBy, PciLocation, VulkanIdentity};
use crate::memory::HeapLayout;
use crate::pacing::Pacer;
use crate::runtime;
use crate::timestamps;
use vgpu_ledger::AllocationTable;

pub type Key = usize;

/// The dispatch key of a dispatchable handle.
///
/// # Safety
/// `handle` is a live dispatchable handle (instance, physical device, device, queue, command
/// buffer) the loader made: its first word is the loader's dispatch table pointer.
pub unsafe fn key<H: Handle>(handle: H) -> Key {
    // SAFETY: per the contract, the handle points at an object whose first word is readable.
    unsafe { *(handle.as_raw() as *const usize) }
}

/// Casts the address the next layer returned to the entry point's own type.
///
/// # Safety
/// `F` is the function-pointer type of the entry point `function` was returned for.
pub unsafe fn cast<F: Copy>(function: vk::PFN_vkVoidFunction) -> Option<F> {
    // SAFETY: per the contract; both are pointer-sized function pointers.
    function.map(|f| unsafe { std::mem::transmute_copy::<unsafe extern "system" fn(), F>(&f) })
}

/// An instance this layer sits in.
pub struct Instance {
    pub handle: vk::Instance,
    pub gipa: vk::PFN_vkGetInstanceProcAddr,
    pub destroy: Option<vk::PFN_vkDestroyInstance>,
    pub create_device: Option<vk::PFN_vkCreateDevice>,
    pub memory_properties: Option<vk::PFN_vkGetPhysicalDeviceMemoryProperties>,
    pub memory_properties2: Option<vk::PFN_vkGetPhysicalDeviceMemoryProperties2>,
    pub properties: Option<vk::PFN_vkGetPhysicalDeviceProperties>,
    pub properties2: Option<vk::PFN_vkGetPhysicalDeviceProperties2>,
    pub queue_families: Option<vk::PFN_vkGetPhysicalDeviceQueueFamilyProperties>,
    pub device_extensions: Option<vk::PFN_vkEnumerateDeviceExtensionProperties>,
    bindings: Mutex<HashMap<u64, Binding>>,
}

impl Instance {
    /// Resolves the next layer's instance-level entry points.
    ///
    /// # Safety
    /// `gipa` is the next layer's `vkGetInstanceProcAddr` and `handle` the instance it created.
    pub unsafe fn new(handle: vk::Instance, gipa: vk::PFN_vkGetInstanceProcAddr) -> Instance {
        // SAFETY: per the contract; each name is cast to its own PFN type.
        let next = |name: &CStr| unsafe { gipa(handle, name.as_ptr()) };
        // SAFETY: each cast names the type of the entry point it was asked for.
        unsafe {
            Instance {
                handle,
                gipa,
                destroy: cast(next(c"vkDestroyInstance")),
                create_device: cast(next(c"vkCreateDevice")),
                memory_properties: cast(next(c"vkGetPhysicalDeviceMemoryProperties")),
                memory_properties2: cast(
                    next(c"vkGetPhysicalDeviceMemoryProperties2")
                        .or_else(|| next(c"vkGetPhysicalDeviceMemoryProperties2KHR")),
                ),
                properties: cast(next(c"vkGetPhysicalDeviceProperties")),
                properties2: cast(
                    next(c"vkGetPhysicalDeviceProperties2")
                        .or_else(|| next(c"vkGetPhysicalDeviceProperties2KHR")),
                ),
                queue_families: cast(next(c"vkGetPhysicalDeviceQueueFamilyProperties")),
                device_extensions: cast(next(c"vkEnumerateDeviceExtensionProperties")),
                bindings: Mutex::new(HashMap::new()),
            }
        }
    }

    /// Which GPU `physical` is, decided once per physical device.
    ///
    /// # Safety
    /// `physical` is a physical device of this instance.
    pub unsafe fn binding(&self, physical: vk::PhysicalDevice) -> Binding {
        let raw = physical.as_raw();
        if let Some(&binding) = self.bindings.lock().unwrap_or_else(PoisonError::into_inner).get(&raw) {
            return binding;
        }
        let runtime = runtime::get();
        let gpus = runtime.gpus();
        let binding = if gpus.is_empty() {
            Binding::Unbudgeted
        } else {
            // SAFETY: per the contract.
            let identity = unsafe { self.identity(physical) };
            let binding = gpus::bind(&identity, gpus);
            report(physical, &identity, binding);
            binding
        };
        self.bindings.lock().unwrap_or_else(PoisonError::into_inner).insert(raw, binding);
        binding
    }

    /// The device's UUID, vendor and (with `VK_EXT_pci_bus_info`) PCI location.
    ///
    /// # Safety
    /// `physical` is a physical device of this instance.
    unsafe fn identity(&self, physical: vk::PhysicalDevice) -> VulkanIdentity {
        let mut id = vk::PhysicalDeviceIDProperties::default();
        let mut pci = vk::PhysicalDevicePCIBusInfoPropertiesEXT::default();
        // SAFETY: per the contract.
        let has_pci = unsafe { self.supports(physical, c"VK_EXT_pci_bus_info") };
        let mut properties = vk::PhysicalDeviceProperties2::default().push_next(&mut id);
        if has_pci {
            properties = properties.push_next(&mut pci);
        }
        let Some(get) = self.properties2 else {
            return VulkanIdentity { uuid: [0; 16], pci: None, nvidia: false };
        };
        // SAFETY: `properties` is a valid chain of structures the device knows (PCI info only
        // when it offers the extension).
        unsafe { get(physical, &mut properties) };
        let vendor = properties.properties.vendor_id;
        let pci = has_pci.then_some(PciLocation {
            domain: pci.pci_domain,
            bus: pci.pci_bus,
            device: pci.pci_device,
        });
        if runtime::get().zero_uuid_fault {
            return VulkanIdentity { uuid: [0; 16], pci: None, nvidia: true };
        }
        VulkanIdentity { uuid: id.device_uuid, pci, nvidia: vendor == gpus::NVIDIA_VENDOR_ID }
    }

    /// What the GPU timestamps of a device on `physical` need from it: its queue families and
    /// timestamp period (as if none had timestamps under the `no-timestamps` fault point), and
    /// whether to calibrate the stamps' own cost (not under `no-stamp-calibration`).
    ///
    /// # Safety
    /// `physical` is a physical device of this instance.
    pub unsafe fn timestamp_source(
        &self,
        physical: vk::PhysicalDevice,
        set_loader_data: Option<crate::loader_abi::SetDeviceLoaderData>,
    ) -> timestamps::Source {
        let mut families = Vec::new();
        if let Some(get) = self.queue_families {
            let mut count = 0;
            // SAFETY: the count query with a NULL array.
            unsafe { get(physical, &mut count, std::ptr::null_mut()) };
            families = vec![vk::QueueFamilyProperties::default(); count as usize];
            // SAFETY: `families` holds `count` elements.
            unsafe { get(physical, &mut count, families.as_mut_ptr()) };
            families.truncate(count as usize);
        }
        if runtime::get().no_timestamps_fault {
            families.iter_mut().for_each(|family| family.timestamp_valid_bits = 0);
        }
        let mut properties = vk::PhysicalDeviceProperties::default();
        if let Some(get) = self.properties {
            // SAFETY: a valid out-structure.
            unsafe { get(physical, &mut properties) };
        }
        timestamps::Source {
            families,
            period_ns: properties.limits.timestamp_period,
            set_loader_data,
            calibrate: !runtime::get().no_stamp_calibration_fault,
        }
    }

    /// Whether `physical` offers the device extension `name`.
    ///
    /// # Safety
    /// `physical` is a physical device of this instance.
    pub unsafe fn supports(&self, physical: vk::PhysicalDevice, name: &CStr) -> bool {
        let Some(enumerate) = self.device_extensions else { return false };
        let mut count = 0;
        // SAFETY: the count query with a NULL array, as the spec allows.
        if unsafe { enumerate(physical, std::ptr::null(), &mut count, std::ptr::null_mut()) }
            != vk::Result::SUCCESS
        {
            return false;
        }
        let mut extensions = vec![vk::ExtensionProperties::default(); count as usize];
        // SAFETY: `extensions` holds `count` elements.
        let status = unsafe { enumerate(physical, std::ptr::null(), &mut count, extensions.as_mut_ptr()) };
        if status != vk::Result::SUCCESS && status != vk::Result::INCOMPLETE {
            return false;
        }
        extensions.iter().take(count as usize).any(|e| e.extension_name_as_c_str().is_ok_and(|n| n == name))
    }
}

fn report(physical: vk::PhysicalDevice, identity: &VulkanIdentity, binding: Binding) {
    let raw = physical.as_raw();
    match binding {
        Binding::Gpu { ordinal, by: MatchedBy::Uuid } => {
            tracing::debug!("Vulkan device {raw:#x} is CUDA device {ordinal} (same UUID)");
        }
        Binding::Gpu { ordinal, by: MatchedBy::Pci } => tracing::warn!(
            "Vulkan device {raw:#x} reports an all-zero UUID; matched to CUDA device {ordinal} by PCI location {:?}",
            identity.pci
        ),
        Binding::Gpu { ordinal, by: MatchedBy::OnlyGpu } => tracing::warn!(
            "Vulkan device {raw:#x} reports an all-zero UUID and no PCI location CUDA shares; taken to be \
             CUDA device {ordinal}, the only GPU visible"
        ),
        Binding::Undecided => tracing::error!(
            "Vulkan device {raw:#x} is an NVIDIA device with an all-zero UUID, and neither its PCI location nor \
             a single visible GPU says which CUDA device it is; its device-local allocations are refused"
        ),
        Binding::Unbudgeted => tracing::debug!("Vulkan device {raw:#x} is none of the container's GPUs"),
    }
}

/// A device this layer sits in.
pub struct Device {
    pub handle: vk::Device,
    pub gdpa: vk::PFN_vkGetDeviceProcAddr,
    pub destroy: Option<vk::PFN_vkDestroyDevice>,
    pub allocate: Option<vk::PFN_vkAllocateMemory>,
    pub free: Option<vk::PFN_vkFreeMemory>,
    pub submit: Option<vk::PFN_vkQueueSubmit>,
    pub submit2: Option<vk::PFN_vkQueueSubmit2>,
    pub submit2_khr: Option<vk::PFN_vkQueueSubmit2>,
    /// The application's waits, which tell a paced device's pacer when work is done.
    pub wait_for_fences: Option<vk::PFN_vkWaitForFences>,
    pub get_fence_status: Option<vk::PFN_vkGetFenceStatus>,
    pub reset_fences: Option<vk::PFN_vkResetFences>,
    pub destroy_fence: Option<vk::PFN_vkDestroyFence>,
    pub queue_wait_idle: Option<vk::PFN_vkQueueWaitIdle>,
    pub device_wait_idle: Option<vk::PFN_vkDeviceWaitIdle>,
    /// Where the application gets its queues, which tells a paced device's pacer their families.
    pub get_device_queue: Option<vk::PFN_vkGetDeviceQueue>,
    pub get_device_queue2: Option<vk::PFN_vkGetDeviceQueue2>,
    /// What this device's memory is charged to.
    pub charge: Charge,
    pub heaps: HeapLayout,
    /// Charged allocations, by `VkDeviceMemory`.
    pub allocations: AllocationTable,
    /// Present when the device's GPU has a compute share.
    pub pacer: Option<Pacer>,
}

/// Where a device's device-local allocations go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Charge {
    /// Not budgeted: allocations are not intercepted.
    Nothing,
    /// CUDA ordinal `ordinal`'s budget.
    Budget { ordinal: usize },
    /// Refused: the device could not be placed.
    Refuse,
}

impl Device {
    /// Resolves the next layer's device-level entry points. With `share` (the GPU's CUDA
    /// ordinal, its share, and what GPU timestamps need), the device is paced.
    ///
    /// # Safety
    /// `gdpa` is the next layer's `vkGetDeviceProcAddr` and `handle` the device it created.
    pub unsafe fn new(
        handle: vk::Device,
        gdpa: vk::PFN_vkGetDeviceProcAddr,
        charge: Charge,
        heaps: HeapLayout,
        share: Option<(usize, u64, timestamps::Source)>,
    ) -> Device {
        // SAFETY: per the contract.
        let next = |name: &CStr| unsafe { gdpa(handle, name.as_ptr()) };
        // SAFETY: each cast names the type of the entry point it was asked for.
        unsafe {
            Device {
                handle,
                gdpa,
                destroy: cast(next(c"vkDestroyDevice")),
                allocate: cast(next(c"vkAllocateMemory")),
                free: cast(next(c"vkFreeMemory")),
                submit: cast(next(c"vkQueueSubmit")),
                submit2: cast(next(c"vkQueueSubmit2")),
                submit2_khr: cast(next(c"vkQueueSubmit2KHR")),
                wait_for_fences: cast(next(c"vkWaitForFences")),
                get_fence_status: cast(next(c"vkGetFenceStatus")),
                reset_fences: cast(next(c"vkResetFences")),
                destroy_fence: cast(next(c"vkDestroyFence")),
                queue_wait_idle: cast(next(c"vkQueueWaitIdle")),
                device_wait_idle: cast(next(c"vkDeviceWaitIdle")),
                get_device_queue: cast(next(c"vkGetDeviceQueue")),
                get_device_queue2: cast(next(c"vkGetDeviceQueue2")),
                charge,
                heaps,
                allocations: AllocationTable::default(),
                pacer: share.and_then(|(ordinal, percent, timing)| {
                    Pacer::new(handle, gdpa, ordinal, percent, timing)
                }),
            }
        }
    }

    /// The next layer's entry point `name`.
    ///
    /// # Safety
    /// `name` is NUL-terminated.
    pub unsafe fn next(&self, name: *const c_char) -> vk::PFN_vkVoidFunction {
        // SAFETY: `handle` is the device `gdpa` belongs to.
        unsafe { (self.gdpa)(self.handle, name) }
    }
}

static INSTANCES: RwLock<Option<HashMap<Key, Arc<Instance>>>> = RwLock::new(None);
static DEVICES: RwLock<Option<HashMap<Key, Arc<Device>>>> = RwLock::new(None);

pub fn instance(key: Key) -> Option<Arc<Instance>> {
    INSTANCES.read().unwrap_or_else(PoisonError::into_inner).as_ref()?.get(&key).cloned()
}

pub fn add_instance(key: Key, instance: Instance) {
    INSTANCES
        .write()
        .unwrap_or_else(PoisonError::into_inner)
        .get_or_insert_default()
        .insert(key, Arc::new(instance));
}

pub fn remove_instance(key: Key) -> Option<Arc<Instance>> {
    INSTANCES.write().unwrap_or_else(PoisonError::into_inner).as_mut()?.remove(&key)
}

pub fn device(key: Key) -> Option<Arc<Device>> {
    DEVICES.read().unwrap_or_else(PoisonError::into_inner).as_ref()?.get(&key).cloned()
}

pub fn add_device(key: Key, device: Device) {
    DEVICES
        .write()
        .unwrap_or_else(PoisonError::into_inner)
        .get_or_insert_default()
        .insert(key, Arc::new(device));
}

pub fn remove_device(key: Key) -> Option<Arc<Device>> {
    DEVICES.write().unwrap_or_else(PoisonError::into_inner).as_mut()?.remove(&key)
}
