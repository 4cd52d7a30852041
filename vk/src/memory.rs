//! Device memory: device-local allocations charged to the container's budget, and heaps that
//! report it.
//!
//! Only memory from a `DEVICE_LOCAL` heap of a budgeted device is charged, when it is created
//! (`vkAllocateMemory`) and credited when it goes (`vkFreeMemory`, or `vkDestroyDevice` for what
//! the device still holds). Memory imported from elsewhere (an fd, a host pointer, another API's
//! export) is not new memory and is not charged again. NULL or invalid arguments go to the next
//! layer untouched, and its answer is returned.

use std::ffi::c_void;

use ash::vk;

use crate::dispatch::{Charge, Device, Instance};
use crate::gpus::Binding;
use crate::runtime;
use vgpu_ledger::logging::{self, Size};
use vgpu_ledger::{Allocation, Ledger, LedgerError};

/// Which heap each memory type draws on, and which heaps are device-local.
#[derive(Clone, Debug, Default)]
pub struct HeapLayout {
    heap_of_type: Vec<u32>,
    device_local: [bool; vk::MAX_MEMORY_HEAPS],
}

impl HeapLayout {
    pub fn from_properties(properties: &vk::PhysicalDeviceMemoryProperties) -> HeapLayout {
        let types = properties.memory_type_count.min(vk::MAX_MEMORY_TYPES as u32) as usize;
        let heaps = properties.memory_heap_count.min(vk::MAX_MEMORY_HEAPS as u32) as usize;
        let mut device_local = [false; vk::MAX_MEMORY_HEAPS];
        for (i, heap) in properties.memory_heaps.iter().take(heaps).enumerate() {
            device_local[i] = heap.flags.contains(vk::MemoryHeapFlags::DEVICE_LOCAL);
        }
        HeapLayout {
            heap_of_type: properties.memory_types.iter().take(types).map(|t| t.heap_index).collect(),
            device_local,
        }
    }

    /// Whether memory of type `index` is charged: it draws on a device-local heap, or the type
    /// does not exist (invalid usage; a driver that grants it anyway must not grant it free).
    pub fn is_device_local(&self, index: u32) -> bool {
        self.heap_of_type
            .get(index as usize)
            .is_none_or(|&heap| self.device_local.get(heap as usize).copied().unwrap_or(true))
    }
}

/// What a device's memory is charged to, from its binding and the budgets.
pub fn charge_for(binding: Binding) -> Charge {
    match binding {
        Binding::Unbudgeted => Charge::Nothing,
        Binding::Undecided => Charge::Refuse,
        Binding::Gpu { ordinal, .. } => {
            if runtime::get().ledger().limit(ordinal).is_some() {
                Charge::Budget { ordinal }
            } else {
                Charge::Nothing
            }
        }
    }
}

/// Whether `p_next` imports memory that exists already (so the allocation creates none).
///
/// # Safety
/// `p_next` is the head of a valid `pNext` chain of a `VkMemoryAllocateInfo`.
unsafe fn imports(mut p_next: *const c_void) -> bool {
    while !p_next.is_null() {
        // SAFETY: every element of a valid chain starts with a `VkBaseInStructure` header.
        let header = unsafe { &*p_next.cast::<vk::BaseInStructure>() };
        // An import structure whose handle type is 0 imports nothing (the spec says it is then
        // ignored); the others always import.
        let importing = match header.s_type {
            vk::StructureType::IMPORT_MEMORY_FD_INFO_KHR => {
                // SAFETY: the element is the structure its `sType` names.
                let import = unsafe { &*p_next.cast::<vk::ImportMemoryFdInfoKHR>() };
                !import.handle_type.is_empty()
            }
            vk::StructureType::IMPORT_MEMORY_HOST_POINTER_INFO_EXT => {
                // SAFETY: the element is the structure its `sType` names.
                let import = unsafe { &*p_next.cast::<vk::ImportMemoryHostPointerInfoEXT>() };
                !import.handle_type.is_empty()
            }
            vk::StructureType::IMPORT_MEMORY_WIN32_HANDLE_INFO_KHR => {
                // SAFETY: the element is the structure its `sType` names.
                let import = unsafe { &*p_next.cast::<vk::ImportMemoryWin32HandleInfoKHR>() };
                !import.handle_type.is_empty()
            }
            vk::StructureType::IMPORT_MEMORY_ZIRCON_HANDLE_INFO_FUCHSIA => {
                // SAFETY: the element is the structure its `sType` names.
                let import = unsafe { &*p_next.cast::<vk::ImportMemoryZirconHandleInfoFUCHSIA>() };
                !import.handle_type.is_empty()
            }
            vk::StructureType::IMPORT_MEMORY_WIN32_HANDLE_INFO_NV
            | vk::StructureType::IMPORT_ANDROID_HARDWARE_BUFFER_INFO_ANDROID
            | vk::StructureType::IMPORT_MEMORY_BUFFER_COLLECTION_FUCHSIA
            | vk::StructureType::IMPORT_METAL_BUFFER_INFO_EXT
            | vk::StructureType::IMPORT_SCREEN_BUFFER_INFO_QNX => true,
            _ => false,
        };
        if importing {
            return true;
        }
        p_next = header.p_next.cast();
    }
    false
}

/// `vkAllocateMemory` on a device whose memory is charged.
///
/// # Safety
/// The arguments are the application's, passed on untouched; `device` is `state`'s handle.
pub unsafe fn allocate(
    state: &Device,
    info: *const vk::MemoryAllocateInfo<'_>,
    allocator: *const vk::AllocationCallbacks<'_>,
    memory: *mut vk::DeviceMemory,
) -> vk::Result {
    let Some(next) = state.allocate else { return vk::Result::ERROR_INITIALIZATION_FAILED };
    // SAFETY: the application's arguments, unchanged.
    let call = || unsafe { next(state.handle, info, allocator, memory) };
    if info.is_null() || memory.is_null() {
        return call();
    }
    // SAFETY: non-NULL, and the application promises a valid VkMemoryAllocateInfo.
    let request = unsafe { &*info };
    // SAFETY: the structure's own chain.
    if !state.heaps.is_device_local(request.memory_type_index) || unsafe { imports(request.p_next) } {
        return call();
    }
    let ordinal = match state.charge {
        Charge::Nothing => return call(),
        Charge::Refuse => {
            logging::refused_because(format_args!(
                "refused vkAllocateMemory of {}: this Vulkan device could not be matched to a GPU",
                Size(request.allocation_size)
            ));
            return vk::Result::ERROR_OUT_OF_DEVICE_MEMORY;
        }
        Charge::Budget { ordinal } => ordinal,
    };
    let runtime = runtime::get();
    let ledger = runtime.ledger();
    let bytes = request.allocation_size;
    let owner = match ledger.try_reserve(ordinal, bytes) {
        Ok(owner) => owner,
        Err(LedgerError::BudgetExceeded { device, requested, used, limit }) => {
            logging::refused("vkAllocateMemory", device, requested, used, limit);
            return vk::Result::ERROR_OUT_OF_DEVICE_MEMORY;
        }
        Err(LedgerError::RegionUnavailable) => {
            logging::refused_because(format_args!(
                "refused vkAllocateMemory: the shared region cannot be used (see the error logged before)"
            ));
            return vk::Result::ERROR_OUT_OF_DEVICE_MEMORY;
        }
    };
    let status = call();
    // SAFETY: written by the driver when it succeeded.
    let handle = (status == vk::Result::SUCCESS).then(|| vk::Handle::as_raw(unsafe { memory.read() }));
    match handle {
        // A zero-size request (invalid usage some drivers answer with a NULL handle) holds nothing.
        Some(handle) if handle != 0 && bytes > 0 => {
            state.allocations.insert(handle, Allocation { device: ordinal, bytes, owner })
        }
        _ => ledger.release(ordinal, bytes, owner),
    }
    status
}

/// `vkFreeMemory` on a device whose memory is charged.
///
/// # Safety
/// The arguments are the application's, passed on untouched; `device` is `state`'s handle.
pub unsafe fn free(state: &Device, memory: vk::DeviceMemory, allocator: *const vk::AllocationCallbacks<'_>) {
    if let Some(next) = state.free {
        // SAFETY: the application's arguments, unchanged.
        unsafe { next(state.handle, memory, allocator) };
    }
    if let Some(allocation) = state.allocations.remove(vk::Handle::as_raw(memory)) {
        runtime::get().ledger().release(allocation.device, allocation.bytes, allocation.owner);
    }
}

/// Credits everything a device still held when it was destroyed.
pub fn credit_all(state: &Device) {
    let charged = state.allocations.drain();
    if charged.is_empty() {
        return;
    }
    let ledger = runtime::get().ledger();
    for allocation in charged {
        ledger.release(allocation.device, allocation.bytes, allocation.owner);
    }
}

/// Rewrites the heaps of a budgeted physical device: every device-local heap is at most the
/// budget (0 on a device that could not be matched, whose allocations are refused); with `VK_EXT_memory_budget`, usage is what the container holds (all APIs, all its
/// processes) and the budget leaves exactly what the container has left.
///
/// # Safety
/// `physical` is a physical device of `instance`; `budget`, if not NULL, is the
/// `VkPhysicalDeviceMemoryBudgetPropertiesEXT` the driver just filled for it.
pub unsafe fn report_budget(
    instance: &Instance,
    physical: vk::PhysicalDevice,
    properties: &mut vk::PhysicalDeviceMemoryProperties,
    budget: *mut vk::PhysicalDeviceMemoryBudgetPropertiesEXT<'_>,
) {
    // SAFETY: per the contract.
    let (limit, used) = match unsafe { instance.binding(physical) } {
        Binding::Unbudgeted => return,
        // Nothing can be allocated there: say so.
        Binding::Undecided => (0, 0),
        Binding::Gpu { ordinal, .. } => {
            let ledger: &dyn Ledger = runtime::get().ledger();
            let Some(limit) = ledger.limit(ordinal) else { return };
            (limit, ledger.used(ordinal))
        }
    };
    // SAFETY: per the contract, NULL or the driver's filled structure.
    let mut budget = unsafe { budget.as_mut() };
    let heaps = properties.memory_heap_count.min(vk::MAX_MEMORY_HEAPS as u32) as usize;
    for (i, heap) in properties.memory_heaps.iter_mut().take(heaps).enumerate() {
        if !heap.flags.contains(vk::MemoryHeapFlags::DEVICE_LOCAL) {
            continue;
        }
        heap.size = heap.size.min(limit);
        if let Some(budget) = budget.as_deref_mut() {
            let physical_left = budget.heap_budget[i].saturating_sub(budget.heap_usage[i]);
            let left = limit.saturating_sub(used).min(physical_left);
            budget.heap_usage[i] = used;
            budget.heap_budget[i] = used.saturating_add(left).min(heap.size);
        }
    }
}

/// Finds the memory-budget structure in a `VkPhysicalDeviceMemoryProperties2` chain.
///
/// # Safety
/// `p_next` is the head of a valid, writable `pNext` chain.
pub unsafe fn find_budget(
    mut p_next: *mut c_void,
) -> *mut vk::PhysicalDeviceMemoryBudgetPropertiesEXT<'static> {
    while !p_next.is_null() {
        // SAFETY: every element of a valid chain starts with a `VkBaseOutStructure` header.
        let header = unsafe { &*p_next.cast::<vk::BaseOutStructure>() };
        if header.s_type == vk::StructureType::PHYSICAL_DEVICE_MEMORY_BUDGET_PROPERTIES_EXT {
            return p_next.cast();
        }
        p_next = header.p_next.cast();
    }
    std::ptr::null_mut()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> HeapLayout {
        let mut properties = vk::PhysicalDeviceMemoryProperties {
            memory_type_count: 3,
            memory_heap_count: 2,
            ..Default::default()
        };
        properties.memory_heaps[0].flags = vk::MemoryHeapFlags::DEVICE_LOCAL;
        properties.memory_types[0].heap_index = 0;
        properties.memory_types[1].heap_index = 1;
        properties.memory_types[2].heap_index = 0;
        HeapLayout::from_properties(&properties)
    }

    #[test]
    fn memory_types_follow_their_heap() {
        let layout = layout();
        assert!(layout.is_device_local(0));
        assert!(!layout.is_device_local(1));
        assert!(layout.is_device_local(2));
        assert!(layout.is_device_local(3), "an index past the count is charged if the driver grants it");
        assert!(layout.is_device_local(u32::MAX));
    }

    #[test]
    fn imports_are_recognised_and_exports_are_not() {
        let mut fd =
            vk::ImportMemoryFdInfoKHR::default().handle_type(vk::ExternalMemoryHandleTypeFlags::OPAQUE_FD);
        let mut export = vk::ExportMemoryAllocateInfo::default()
            .handle_types(vk::ExternalMemoryHandleTypeFlags::OPAQUE_FD);
        let info = vk::MemoryAllocateInfo::default().push_next(&mut export);
        // SAFETY: a valid chain built above.
        assert!(!unsafe { imports(info.p_next) });
        let info = vk::MemoryAllocateInfo::default().push_next(&mut export).push_next(&mut fd);
        // SAFETY: a valid chain built above.
        assert!(unsafe { imports(info.p_next) });
        let mut empty = vk::ImportMemoryFdInfoKHR::default();
        let info = vk::MemoryAllocateInfo::default().push_next(&mut empty);
        // SAFETY: a valid chain built above.
        assert!(!unsafe { imports(info.p_next) }, "handle type 0 imports nothing");
        let mut host = vk::ImportMemoryHostPointerInfoEXT::default()
            .handle_type(vk::ExternalMemoryHandleTypeFlags::HOST_ALLOCATION_EXT);
        let info = vk::MemoryAllocateInfo::default().push_next(&mut host);
        // SAFETY: a valid chain built above.
        assert!(unsafe { imports(info.p_next) });
    }
}
