//! The loader–layer interface structs of `vk_layer.h` that `ash` does not declare.
//!
//! Layouts are those of the Vulkan SDK header (x86_64 and aarch64 alike: every field is a 4-byte
//! enum or an 8-byte pointer); the asserts at the bottom pin them.

use std::ffi::c_void;
use std::mem::{offset_of, size_of};

use ash::vk;

/// The interface version this layer speaks: `vkNegotiateLoaderLayerInterfaceVersion` and the
/// `pfnGet*ProcAddr` pointers handed back through it.
pub const LAYER_INTERFACE_VERSION: u32 = 2;

/// `VkNegotiateLayerStructType::LAYER_NEGOTIATE_INTERFACE_STRUCT`.
pub const LAYER_NEGOTIATE_INTERFACE_STRUCT: u32 = 1;

/// `VkLayerFunction::VK_LAYER_LINK_INFO`: the create-info carries the next layer's entry points.
pub const LAYER_LINK_INFO: u32 = 0;

/// `VkLayerFunction::VK_LOADER_DATA_CALLBACK`: the create-info carries the loader's
/// `vkSet*LoaderData`, which a layer calls on every dispatchable object it creates itself.
pub const LOADER_DATA_CALLBACK: u32 = 1;

/// `PFN_GetPhysicalDeviceProcAddr`: same shape as `vkGetInstanceProcAddr`.
pub type GetPhysicalDeviceProcAddr = vk::PFN_vkGetInstanceProcAddr;

/// `PFN_vkSetDeviceLoaderData`: writes the loader's dispatch pointer into a dispatchable object
/// (a command buffer) the layer made through the layers below it.
pub type SetDeviceLoaderData = unsafe extern "system" fn(vk::Device, *mut c_void) -> vk::Result;

/// `VkNegotiateLayerInterface`.
#[repr(C)]
pub struct NegotiateLayerInterface {
    pub s_type: u32,
    pub p_next: *mut c_void,
    pub loader_layer_interface_version: u32,
    pub pfn_get_instance_proc_addr: Option<vk::PFN_vkGetInstanceProcAddr>,
    pub pfn_get_device_proc_addr: Option<vk::PFN_vkGetDeviceProcAddr>,
    pub pfn_get_physical_device_proc_addr: Option<GetPhysicalDeviceProcAddr>,
}

/// `VkLayerInstanceLink`: one element of the chain of layers below us.
#[repr(C)]
pub struct LayerInstanceLink {
    pub p_next: *mut LayerInstanceLink,
    pub pfn_next_get_instance_proc_addr: Option<vk::PFN_vkGetInstanceProcAddr>,
    pub pfn_next_get_physical_device_proc_addr: Option<GetPhysicalDeviceProcAddr>,
}

/// `VkLayerInstanceCreateInfo` (`sType` `VK_STRUCTURE_TYPE_LOADER_INSTANCE_CREATE_INFO`). The
/// union's largest member is two function pointers; we only read `pLayerInfo`.
#[repr(C)]
pub struct LayerInstanceCreateInfo {
    pub s_type: vk::StructureType,
    pub p_next: *const c_void,
    pub function: u32,
    pub p_layer_info: *mut LayerInstanceLink,
    _rest_of_union: *const c_void,
}

/// `VkLayerDeviceLink`.
#[repr(C)]
pub struct LayerDeviceLink {
    pub p_next: *mut LayerDeviceLink,
    pub pfn_next_get_instance_proc_addr: Option<vk::PFN_vkGetInstanceProcAddr>,
    pub pfn_next_get_device_proc_addr: Option<vk::PFN_vkGetDeviceProcAddr>,
}

/// `VkLayerDeviceCreateInfo` (`sType` `VK_STRUCTURE_TYPE_LOADER_DEVICE_CREATE_INFO`).
#[repr(C)]
pub struct LayerDeviceCreateInfo {
    pub s_type: vk::StructureType,
    pub p_next: *const c_void,
    pub function: u32,
    pub p_layer_info: *mut LayerDeviceLink,
}

/// `VkLayerDeviceCreateInfo` whose `function` is [`LOADER_DATA_CALLBACK`]: the union holds
/// `pfnSetDeviceLoaderData`.
#[repr(C)]
pub struct LayerDeviceLoaderData {
    pub s_type: vk::StructureType,
    pub p_next: *const c_void,
    pub function: u32,
    pub pfn_set_device_loader_data: Option<SetDeviceLoaderData>,
}

// Sizes and offsets as the SDK's vk_layer.h lays them out (checked with offsetof against the
// header of Debian's libvulkan-dev 1.3.239).
const _: () = {
    assert!(size_of::<NegotiateLayerInterface>() == 48);
    assert!(offset_of!(NegotiateLayerInterface, loader_layer_interface_version) == 16);
    assert!(offset_of!(NegotiateLayerInterface, pfn_get_instance_proc_addr) == 24);
    assert!(offset_of!(NegotiateLayerInterface, pfn_get_device_proc_addr) == 32);
    assert!(offset_of!(NegotiateLayerInterface, pfn_get_physical_device_proc_addr) == 40);
    assert!(size_of::<LayerInstanceLink>() == 24);
    assert!(size_of::<LayerInstanceCreateInfo>() == 40);
    assert!(offset_of!(LayerInstanceCreateInfo, function) == 16);
    assert!(offset_of!(LayerInstanceCreateInfo, p_layer_info) == 24);
    assert!(size_of::<LayerDeviceLink>() == 24);
    assert!(size_of::<LayerDeviceCreateInfo>() == 32);
    assert!(offset_of!(LayerDeviceCreateInfo, function) == 16);
    assert!(offset_of!(LayerDeviceCreateInfo, p_layer_info) == 24);
    assert!(size_of::<LayerDeviceLoaderData>() == 32);
    assert!(offset_of!(LayerDeviceLoaderData, function) == 16);
    assert!(offset_of!(LayerDeviceLoaderData, pfn_set_device_loader_data) == 24);
};

/// Finds the loader's link info of type `s_type` in a create-info's `pNext` chain.
///
/// # Safety
/// `p_next` is the head of a valid `pNext` chain (NULL-terminated, each element starting with
/// `sType` and `pNext`), as the loader hands it to `vkCreateInstance`/`vkCreateDevice`.
pub unsafe fn find_link_info(p_next: *const c_void, s_type: vk::StructureType) -> *mut c_void {
    // SAFETY: per the contract.
    unsafe { find_loader_info(p_next, s_type, LAYER_LINK_INFO) }
}

/// The loader's `vkSetDeviceLoaderData` from a `vkCreateDevice` create-info's `pNext` chain, if
/// the loader put one there.
///
/// # Safety
/// As for [`find_link_info`].
pub unsafe fn find_set_device_loader_data(p_next: *const c_void) -> Option<SetDeviceLoaderData> {
    // SAFETY: per the contract.
    let info = unsafe {
        find_loader_info(p_next, vk::StructureType::LOADER_DEVICE_CREATE_INFO, LOADER_DATA_CALLBACK)
    }
    .cast::<LayerDeviceLoaderData>();
    // SAFETY: an element of this sType and function is the loader's `VkLayerDeviceCreateInfo`
    // holding the callback (layout asserted above).
    unsafe { info.as_ref() }.and_then(|info| info.pfn_set_device_loader_data)
}

/// Finds the loader's create-info of type `s_type` whose `function` is `function`.
///
/// # Safety
/// As for [`find_link_info`].
unsafe fn find_loader_info(
    mut p_next: *const c_void,
    s_type: vk::StructureType,
    function: u32,
) -> *mut c_void {
    while !p_next.is_null() {
        let base = p_next.cast::<vk::BaseInStructure>();
        // SAFETY: every element of a valid chain starts with a `VkBaseInStructure` header.
        let header = unsafe { &*base };
        if header.s_type == s_type {
            // SAFETY: both loader create-infos put `function` at offset 16 (asserted above), and an
            // element of this sType is one of them.
            let found = unsafe { p_next.cast::<u8>().add(16).cast::<u32>().read() };
            if found == function {
                return p_next.cast_mut();
            }
        }
        p_next = header.p_next.cast();
    }
    std::ptr::null_mut()
}
