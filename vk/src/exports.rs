//! Every entry point the loader reaches: the negotiation export and the functions handed out
//! through `vkGetInstanceProcAddr`/`vkGetDeviceProcAddr`. Each is a thin shim: it finds the
//! instance or device state, calls safe logic, and never lets a panic cross into C.
//!
//! Memory hooks are handed out only for devices whose memory is charged, submission hooks only for
//! devices with a compute share; every other name gets the next layer's own function.

use std::ffi::{CStr, c_char};
use std::panic::{AssertUnwindSafe, catch_unwind};

use ash::vk;

use crate::batches::{self, Batch};
use crate::dispatch::{self, Charge, Device, Instance, key};
use crate::loader_abi::*;
use crate::memory::{self, HeapLayout};
use crate::runtime;
use crate::timestamps::Wrap;

/// One of our entry points in the erased form `vkGet*ProcAddr` returns; the caller casts it back to
/// `$pfn`, the type it was asked for by name.
macro_rules! ours {
    ($pfn:ty, $function:expr) => {{
        let function: $pfn = $function;
        // SAFETY: one function-pointer type to another of the same size; it is only called after
        // being cast back to `$pfn`.
        Some(unsafe { std::mem::transmute::<$pfn, unsafe extern "system" fn()>(function) })
    }};
}

/// Runs `body`; a panic inside it becomes `fallback`.
fn guard<R>(fallback: R, body: impl FnOnce() -> R) -> R {
    catch_unwind(AssertUnwindSafe(body)).unwrap_or(fallback)
}

/// The loader asks which interface version we speak and for our `vkGet*ProcAddr`.
///
/// # Safety
/// `interface` is NULL or the loader's negotiation structure.
#[unsafe(no_mangle)]
pub unsafe extern "system" fn vkNegotiateLoaderLayerInterfaceVersion(
    interface: *mut NegotiateLayerInterface,
) -> vk::Result {
    // SAFETY: NULL or the loader's structure, per the contract.
    let Some(interface) = (unsafe { interface.as_mut() }) else {
        return vk::Result::ERROR_INITIALIZATION_FAILED;
    };
    if interface.s_type != LAYER_NEGOTIATE_INTERFACE_STRUCT
        || interface.loader_layer_interface_version < LAYER_INTERFACE_VERSION
    {
        return vk::Result::ERROR_INITIALIZATION_FAILED;
    }
    interface.loader_layer_interface_version = LAYER_INTERFACE_VERSION;
    interface.pfn_get_instance_proc_addr = Some(get_instance_proc_addr);
    interface.pfn_get_device_proc_addr = Some(get_device_proc_addr);
    interface.pfn_get_physical_device_proc_addr = None;
    vk::Result::SUCCESS
}

unsafe extern "system" fn get_instance_proc_addr(
    instance: vk::Instance,
    name: *const c_char,
) -> vk::PFN_vkVoidFunction {
    guard(None, || {
        if name.is_null() {
            return None;
        }
        // SAFETY: a non-NULL name is a NUL-terminated string, per the Vulkan contract.
        let wanted = unsafe { CStr::from_ptr(name) };
        match wanted.to_bytes() {
            b"vkGetInstanceProcAddr" => return ours!(vk::PFN_vkGetInstanceProcAddr, get_instance_proc_addr),
            b"vkCreateInstance" => return ours!(vk::PFN_vkCreateInstance, create_instance),
            _ => {}
        }
        if instance == vk::Instance::null() {
            return None;
        }
        // SAFETY: a non-NULL instance handle is a live instance, per the contract.
        let state = dispatch::instance(unsafe { key(instance) })?;
        // SAFETY: the next layer's vkGetInstanceProcAddr with the application's arguments.
        let next = unsafe { (state.gipa)(instance, name) };
        next?;
        match wanted.to_bytes() {
            b"vkDestroyInstance" => ours!(vk::PFN_vkDestroyInstance, destroy_instance),
            b"vkCreateDevice" => ours!(vk::PFN_vkCreateDevice, create_device),
            b"vkGetPhysicalDeviceMemoryProperties" => {
                ours!(vk::PFN_vkGetPhysicalDeviceMemoryProperties, memory_properties)
            }
            b"vkGetPhysicalDeviceMemoryProperties2" | b"vkGetPhysicalDeviceMemoryProperties2KHR" => {
                ours!(vk::PFN_vkGetPhysicalDeviceMemoryProperties2, memory_properties2)
            }
            _ => device_hook(wanted, true, runtime::get().config.any_compute_limit()).or(next),
        }
    })
}

/// Our hook for device-level `name`, if we hook it: memory hooks when `memory`, submission hooks
/// when `paced`.
fn device_hook(name: &CStr, memory: bool, paced: bool) -> vk::PFN_vkVoidFunction {
    match name.to_bytes() {
        b"vkGetDeviceProcAddr" => ours!(vk::PFN_vkGetDeviceProcAddr, get_device_proc_addr),
        b"vkDestroyDevice" => ours!(vk::PFN_vkDestroyDevice, destroy_device),
        b"vkAllocateMemory" if memory => ours!(vk::PFN_vkAllocateMemory, allocate_memory),
        b"vkFreeMemory" if memory => ours!(vk::PFN_vkFreeMemory, free_memory),
        b"vkQueueSubmit" if paced => ours!(vk::PFN_vkQueueSubmit, queue_submit),
        b"vkQueueSubmit2" if paced => ours!(vk::PFN_vkQueueSubmit2, queue_submit2),
        b"vkQueueSubmit2KHR" if paced => ours!(vk::PFN_vkQueueSubmit2, queue_submit2_khr),
        b"vkWaitForFences" if paced => ours!(vk::PFN_vkWaitForFences, wait_for_fences),
        b"vkGetFenceStatus" if paced => ours!(vk::PFN_vkGetFenceStatus, get_fence_status),
        b"vkResetFences" if paced => ours!(vk::PFN_vkResetFences, reset_fences),
        b"vkDestroyFence" if paced => ours!(vk::PFN_vkDestroyFence, destroy_fence),
        b"vkQueueWaitIdle" if paced => ours!(vk::PFN_vkQueueWaitIdle, queue_wait_idle),
        b"vkDeviceWaitIdle" if paced => ours!(vk::PFN_vkDeviceWaitIdle, device_wait_idle),
        b"vkGetDeviceQueue" if paced => ours!(vk::PFN_vkGetDeviceQueue, get_device_queue),
        b"vkGetDeviceQueue2" if paced => ours!(vk::PFN_vkGetDeviceQueue2, get_device_queue2),
        _ => None,
    }
}

unsafe extern "system" fn get_device_proc_addr(
    device: vk::Device,
    name: *const c_char,
) -> vk::PFN_vkVoidFunction {
    guard(None, || {
        if name.is_null() || device == vk::Device::null() {
            return None;
        }
        // SAFETY: a live device handle, per the contract.
        let state = dispatch::device(unsafe { key(device) })?;
        // SAFETY: the next layer's vkGetDeviceProcAddr with the application's arguments.
        let next = unsafe { state.next(name) };
        next?;
        // SAFETY: a non-NULL name is a NUL-terminated string.
        let wanted = unsafe { CStr::from_ptr(name) };
        device_hook(wanted, state.charge != Charge::Nothing, state.pacer.is_some()).or(next)
    })
}

unsafe extern "system" fn create_instance(
    info: *const vk::InstanceCreateInfo<'_>,
    allocator: *const vk::AllocationCallbacks<'_>,
    instance: *mut vk::Instance,
) -> vk::Result {
    guard(vk::Result::ERROR_INITIALIZATION_FAILED, || {
        if info.is_null() || instance.is_null() {
            return vk::Result::ERROR_INITIALIZATION_FAILED;
        }
        // SAFETY: the loader's create-info chain.
        let link_info =
            unsafe { find_link_info((*info).p_next, vk::StructureType::LOADER_INSTANCE_CREATE_INFO) }
                .cast::<LayerInstanceCreateInfo>();
        // SAFETY: a link info the loader built: valid, and ours to advance for the next layer.
        let Some(link_info) = (unsafe { link_info.as_mut() }) else {
            return vk::Result::ERROR_INITIALIZATION_FAILED;
        };
        // SAFETY: the loader's link for this layer.
        let Some(link) = (unsafe { link_info.p_layer_info.as_ref() }) else {
            return vk::Result::ERROR_INITIALIZATION_FAILED;
        };
        let Some(gipa) = link.pfn_next_get_instance_proc_addr else {
            return vk::Result::ERROR_INITIALIZATION_FAILED;
        };
        link_info.p_layer_info = link.p_next;
        // SAFETY: asking the next layer for its global vkCreateInstance.
        let create: Option<vk::PFN_vkCreateInstance> =
            unsafe { dispatch::cast(gipa(vk::Instance::null(), c"vkCreateInstance".as_ptr())) };
        let Some(create) = create else { return vk::Result::ERROR_INITIALIZATION_FAILED };
        // SAFETY: the application's arguments, with the chain advanced past us.
        let status = unsafe { create(info, allocator, instance) };
        if status == vk::Result::SUCCESS {
            // SAFETY: the next layer succeeded, so `*instance` is a live instance.
            let handle = unsafe { instance.read() };
            // SAFETY: `gipa` belongs to the layer that created `handle`.
            dispatch::add_instance(unsafe { key(handle) }, unsafe { Instance::new(handle, gipa) });
        }
        status
    })
}

unsafe extern "system" fn destroy_instance(
    instance: vk::Instance,
    allocator: *const vk::AllocationCallbacks<'_>,
) {
    guard((), || {
        if instance == vk::Instance::null() {
            return;
        }
        // SAFETY: a live instance handle, per the contract.
        let Some(state) = dispatch::remove_instance(unsafe { key(instance) }) else { return };
        if let Some(destroy) = state.destroy {
            // SAFETY: the application's arguments.
            unsafe { destroy(instance, allocator) };
        }
    })
}

unsafe extern "system" fn create_device(
    physical: vk::PhysicalDevice,
    info: *const vk::DeviceCreateInfo<'_>,
    allocator: *const vk::AllocationCallbacks<'_>,
    device: *mut vk::Device,
) -> vk::Result {
    guard(vk::Result::ERROR_INITIALIZATION_FAILED, || {
        if info.is_null() || device.is_null() || physical == vk::PhysicalDevice::null() {
            return vk::Result::ERROR_INITIALIZATION_FAILED;
        }
        // SAFETY: a physical device shares its instance's dispatch key.
        let Some(instance) = dispatch::instance(unsafe { key(physical) }) else {
            return vk::Result::ERROR_INITIALIZATION_FAILED;
        };
        // SAFETY: the loader's create-info chain.
        let link_info =
            unsafe { find_link_info((*info).p_next, vk::StructureType::LOADER_DEVICE_CREATE_INFO) }
                .cast::<LayerDeviceCreateInfo>();
        // SAFETY: a link info the loader built, ours to advance.
        let Some(link_info) = (unsafe { link_info.as_mut() }) else {
            return vk::Result::ERROR_INITIALIZATION_FAILED;
        };
        // SAFETY: the loader's link for this layer.
        let Some(link) = (unsafe { link_info.p_layer_info.as_ref() }) else {
            return vk::Result::ERROR_INITIALIZATION_FAILED;
        };
        let (Some(gipa), Some(gdpa)) =
            (link.pfn_next_get_instance_proc_addr, link.pfn_next_get_device_proc_addr)
        else {
            return vk::Result::ERROR_INITIALIZATION_FAILED;
        };
        link_info.p_layer_info = link.p_next;
        // SAFETY: the loader's create-info chain.
        let set_loader_data = unsafe { find_set_device_loader_data((*info).p_next) };
        // SAFETY: the next layer's vkCreateDevice, asked of its vkGetInstanceProcAddr.
        let create: Option<vk::PFN_vkCreateDevice> =
            unsafe { dispatch::cast(gipa(instance.handle, c"vkCreateDevice".as_ptr())) };
        let Some(create) = create else { return vk::Result::ERROR_INITIALIZATION_FAILED };
        // SAFETY: the application's arguments, with the chain advanced past us.
        let status = unsafe { create(physical, info, allocator, device) };
        if status != vk::Result::SUCCESS {
            return status;
        }
        // SAFETY: the next layer succeeded: `*device` is live and `gdpa` is its layer's.
        unsafe { register_device(&instance, physical, device.read(), gdpa, set_loader_data) };
        status
    })
}

/// Records a new device: what its memory is charged to, its heaps, its pacer.
///
/// # Safety
/// `device` was just created on `physical`, an instance's physical device; `gdpa` is the next
/// layer's; `set_loader_data` is the loader's callback from the device's create-info.
unsafe fn register_device(
    instance: &Instance,
    physical: vk::PhysicalDevice,
    device: vk::Device,
    gdpa: vk::PFN_vkGetDeviceProcAddr,
    set_loader_data: Option<SetDeviceLoaderData>,
) {
    // SAFETY: per the contract.
    let binding = unsafe { instance.binding(physical) };
    let charge = memory::charge_for(binding);
    let mut properties = vk::PhysicalDeviceMemoryProperties::default();
    if let Some(get) = instance.memory_properties {
        // SAFETY: a valid out-structure; the next layer's unclamped answer.
        unsafe { get(physical, &mut properties) };
    }
    let share = match binding {
        // A device whose GPU had a share when the layer started is paced; the share itself is
        // read from the container's ledger at each submission.
        crate::gpus::Binding::Gpu { ordinal, .. } if runtime::get().config.any_compute_limit() => {
            runtime::get().ledger().share(ordinal).map(|percent| {
                // SAFETY: `physical` is the instance's.
                (ordinal, percent, unsafe { instance.timestamp_source(physical, set_loader_data) })
            })
        }
        _ => None,
    };
    // SAFETY: per the contract.
    let state = unsafe { Device::new(device, gdpa, charge, HeapLayout::from_properties(&properties), share) };
    // SAFETY: a live device.
    dispatch::add_device(unsafe { key(device) }, state);
}

unsafe extern "system" fn destroy_device(device: vk::Device, allocator: *const vk::AllocationCallbacks<'_>) {
    guard((), || {
        if device == vk::Device::null() {
            return;
        }
        // SAFETY: a live device handle, per the contract.
        let Some(state) = dispatch::remove_device(unsafe { key(device) }) else { return };
        if let Some(pacer) = &state.pacer {
            pacer.stop();
        }
        if let Some(destroy) = state.destroy {
            // SAFETY: the application's arguments.
            unsafe { destroy(device, allocator) };
        }
        memory::credit_all(&state);
    })
}

/// The state of the device `device` belongs to, for a hook we handed out for it.
fn device_of<H: vk::Handle + Copy>(handle: H) -> Option<std::sync::Arc<Device>> {
    if handle.as_raw() == 0 {
        return None;
    }
    // SAFETY: a live dispatchable handle of a device (the device or one of its queues).
    dispatch::device(unsafe { key(handle) })
}

unsafe extern "system" fn allocate_memory(
    device: vk::Device,
    info: *const vk::MemoryAllocateInfo<'_>,
    allocator: *const vk::AllocationCallbacks<'_>,
    memory: *mut vk::DeviceMemory,
) -> vk::Result {
    guard(vk::Result::ERROR_OUT_OF_HOST_MEMORY, || {
        let Some(state) = device_of(device) else { return vk::Result::ERROR_INITIALIZATION_FAILED };
        // SAFETY: the application's arguments, passed on untouched.
        unsafe { memory::allocate(&state, info, allocator, memory) }
    })
}

unsafe extern "system" fn free_memory(
    device: vk::Device,
    memory: vk::DeviceMemory,
    allocator: *const vk::AllocationCallbacks<'_>,
) {
    guard((), || {
        let Some(state) = device_of(device) else { return };
        // SAFETY: the application's arguments, passed on untouched.
        unsafe { memory::free(&state, memory, allocator) }
    })
}

unsafe extern "system" fn memory_properties(
    physical: vk::PhysicalDevice,
    properties: *mut vk::PhysicalDeviceMemoryProperties,
) {
    guard((), || {
        if physical == vk::PhysicalDevice::null() {
            return;
        }
        // SAFETY: a physical device shares its instance's dispatch key.
        let Some(instance) = dispatch::instance(unsafe { key(physical) }) else { return };
        let Some(next) = instance.memory_properties else { return };
        // SAFETY: the application's arguments.
        unsafe { next(physical, properties) };
        // SAFETY: NULL or the structure the driver just filled.
        if let Some(properties) = unsafe { properties.as_mut() } {
            // SAFETY: `physical` belongs to `instance`; no budget structure.
            unsafe { memory::report_budget(&instance, physical, properties, std::ptr::null_mut()) };
        }
    })
}

unsafe extern "system" fn memory_properties2(
    physical: vk::PhysicalDevice,
    properties: *mut vk::PhysicalDeviceMemoryProperties2<'_>,
) {
    guard((), || {
        if physical == vk::PhysicalDevice::null() {
            return;
        }
        // SAFETY: a physical device shares its instance's dispatch key.
        let Some(instance) = dispatch::instance(unsafe { key(physical) }) else { return };
        let Some(next) = instance.memory_properties2 else { return };
        // SAFETY: the application's arguments.
        unsafe { next(physical, properties) };
        // SAFETY: NULL or the structure the driver just filled.
        if let Some(properties) = unsafe { properties.as_mut() } {
            // SAFETY: the chain the application passed and the driver filled.
            let budget = unsafe { memory::find_budget(properties.p_next) };
            // SAFETY: `physical` belongs to `instance`; `budget` is NULL or filled.
            unsafe { memory::report_budget(&instance, physical, &mut properties.memory_properties, budget) };
        }
    })
}

unsafe extern "system" fn queue_submit(
    queue: vk::Queue,
    count: u32,
    submits: *const vk::SubmitInfo<'_>,
    fence: vk::Fence,
) -> vk::Result {
    guard(vk::Result::ERROR_DEVICE_LOST, || {
        let Some(state) = device_of(queue) else { return vk::Result::ERROR_INITIALIZATION_FAILED };
        let Some(next) = state.submit else { return vk::Result::ERROR_INITIALIZATION_FAILED };
        // SAFETY: the application's array of `count` batches, per vkQueueSubmit.
        let batches = unsafe { slice(submits, count) };
        // SAFETY: the application's arguments, with the pacer's fence in place of none and, when
        // given one, the layer's timestamp command buffers around its work.
        let call = |fence, wrapped: Option<*const vk::SubmitInfo<'_>>| unsafe {
            next(queue, count, wrapped.unwrap_or(submits), fence)
        };
        paced(&state, queue, fence, batches, call)
    })
}

unsafe extern "system" fn queue_submit2(
    queue: vk::Queue,
    count: u32,
    submits: *const vk::SubmitInfo2<'_>,
    fence: vk::Fence,
) -> vk::Result {
    // SAFETY: the application's arguments, passed on.
    unsafe { submit2(queue, count, submits, fence, false) }
}

unsafe extern "system" fn queue_submit2_khr(
    queue: vk::Queue,
    count: u32,
    submits: *const vk::SubmitInfo2<'_>,
    fence: vk::Fence,
) -> vk::Result {
    // SAFETY: the application's arguments, passed on.
    unsafe { submit2(queue, count, submits, fence, true) }
}

/// `vkQueueSubmit2` or, when `khr`, its extension name: the next layer's function of the name the
/// application used (the other if the driver only has one).
///
/// # Safety
/// The arguments are the application's, per `vkQueueSubmit2`'s contract.
unsafe fn submit2(
    queue: vk::Queue,
    count: u32,
    submits: *const vk::SubmitInfo2<'_>,
    fence: vk::Fence,
    khr: bool,
) -> vk::Result {
    guard(vk::Result::ERROR_DEVICE_LOST, || {
        let Some(state) = device_of(queue) else { return vk::Result::ERROR_INITIALIZATION_FAILED };
        let next =
            if khr { state.submit2_khr.or(state.submit2) } else { state.submit2.or(state.submit2_khr) };
        let Some(next) = next else { return vk::Result::ERROR_INITIALIZATION_FAILED };
        // SAFETY: the application's array of `count` batches, per vkQueueSubmit2.
        let batches = unsafe { slice(submits, count) };
        // SAFETY: as in `queue_submit`.
        let call = |fence, wrapped: Option<*const vk::SubmitInfo2<'_>>| unsafe {
            next(queue, count, wrapped.unwrap_or(submits), fence)
        };
        paced(&state, queue, fence, batches, call)
    })
}

/// The application's array as a slice (empty for a NULL array or a count of 0).
///
/// # Safety
/// `first` is NULL or points to `count` elements.
unsafe fn slice<'a, T>(first: *const T, count: u32) -> &'a [T] {
    if first.is_null() || count == 0 {
        return &[];
    }
    // SAFETY: per the contract.
    unsafe { std::slice::from_raw_parts(first, count as usize) }
}

unsafe extern "system" fn wait_for_fences(
    device: vk::Device,
    count: u32,
    fences: *const vk::Fence,
    wait_all: vk::Bool32,
    timeout: u64,
) -> vk::Result {
    guard(vk::Result::ERROR_DEVICE_LOST, || {
        let Some(state) = device_of(device) else { return vk::Result::ERROR_INITIALIZATION_FAILED };
        let Some(next) = state.wait_for_fences else { return vk::Result::ERROR_INITIALIZATION_FAILED };
        // SAFETY: the application's arguments.
        let status = unsafe { next(device, count, fences, wait_all, timeout) };
        if let (vk::Result::SUCCESS, Some(pacer)) = (status, &state.pacer) {
            // SAFETY: the application's array of `count` fences, per vkWaitForFences.
            pacer.app_fences_signalled(unsafe { slice(fences, count) }, wait_all == vk::TRUE);
        }
        status
    })
}

unsafe extern "system" fn get_fence_status(device: vk::Device, fence: vk::Fence) -> vk::Result {
    guard(vk::Result::ERROR_DEVICE_LOST, || {
        let Some(state) = device_of(device) else { return vk::Result::ERROR_INITIALIZATION_FAILED };
        let Some(next) = state.get_fence_status else { return vk::Result::ERROR_INITIALIZATION_FAILED };
        // SAFETY: the application's arguments.
        let status = unsafe { next(device, fence) };
        if let (vk::Result::SUCCESS, Some(pacer)) = (status, &state.pacer) {
            pacer.app_fences_signalled(&[fence], true);
        }
        status
    })
}

unsafe extern "system" fn reset_fences(
    device: vk::Device,
    count: u32,
    fences: *const vk::Fence,
) -> vk::Result {
    guard(vk::Result::ERROR_DEVICE_LOST, || {
        let Some(state) = device_of(device) else { return vk::Result::ERROR_INITIALIZATION_FAILED };
        let Some(next) = state.reset_fences else { return vk::Result::ERROR_INITIALIZATION_FAILED };
        if let Some(pacer) = &state.pacer {
            // SAFETY: the application's array of `count` fences, per vkResetFences.
            pacer.app_fences_released(unsafe { slice(fences, count) });
        }
        // SAFETY: the application's arguments.
        unsafe { next(device, count, fences) }
    })
}

unsafe extern "system" fn destroy_fence(
    device: vk::Device,
    fence: vk::Fence,
    allocator: *const vk::AllocationCallbacks<'_>,
) {
    guard((), || {
        let Some(state) = device_of(device) else { return };
        let Some(next) = state.destroy_fence else { return };
        if let (Some(pacer), false) = (&state.pacer, fence == vk::Fence::null()) {
            pacer.app_fences_released(&[fence]);
        }
        // SAFETY: the application's arguments.
        unsafe { next(device, fence, allocator) }
    })
}

unsafe extern "system" fn queue_wait_idle(queue: vk::Queue) -> vk::Result {
    guard(vk::Result::ERROR_DEVICE_LOST, || {
        let Some(state) = device_of(queue) else { return vk::Result::ERROR_INITIALIZATION_FAILED };
        let Some(next) = state.queue_wait_idle else { return vk::Result::ERROR_INITIALIZATION_FAILED };
        // SAFETY: the application's argument.
        let status = unsafe { next(queue) };
        if let (vk::Result::SUCCESS, Some(pacer)) = (status, &state.pacer) {
            pacer.idle(Some(queue));
        }
        status
    })
}

unsafe extern "system" fn device_wait_idle(device: vk::Device) -> vk::Result {
    guard(vk::Result::ERROR_DEVICE_LOST, || {
        let Some(state) = device_of(device) else { return vk::Result::ERROR_INITIALIZATION_FAILED };
        let Some(next) = state.device_wait_idle else { return vk::Result::ERROR_INITIALIZATION_FAILED };
        // SAFETY: the application's argument.
        let status = unsafe { next(device) };
        if let (vk::Result::SUCCESS, Some(pacer)) = (status, &state.pacer) {
            pacer.idle(None);
        }
        status
    })
}

/// Runs a submission of `batches` through the device's pacer, if it has one. `call` submits with
/// the fence it is given (the application's `fence`, or the pacer's when the application has
/// none) and the batches it is given (the application's, or copies with the layer's timestamp
/// command buffers around its work).
fn paced<B: Batch>(
    state: &Device,
    queue: vk::Queue,
    fence: vk::Fence,
    batches: &[B],
    call: impl FnOnce(vk::Fence, Option<*const B>) -> vk::Result,
) -> vk::Result {
    let (Some(pacer), Some(submit)) = (&state.pacer, state.submit) else { return call(fence, None) };
    // SAFETY: an empty submission with our own fence on the application's queue, inside its own
    // (externally synchronised) submission call.
    let marker = |fence| unsafe { submit(queue, 0, std::ptr::null(), fence) };
    // SAFETY: the application's valid submission array.
    let plan = unsafe { batches::plan(batches) };
    let wrapped_call = |fence, wrap: Option<Wrap>| match (plan, wrap) {
        (Some(plan), Some(Wrap { begin, end })) => {
            // SAFETY: the plan was made from these batches.
            let wrapped = unsafe { batches::wrap(batches, plan, begin, end) };
            call(fence, Some(wrapped.as_ptr()))
        }
        _ => call(fence, None),
    };
    // SAFETY: inside the application's submission call on `queue`; `wrapped_call` is that call.
    unsafe { pacer.submit(queue, fence, plan.is_some(), wrapped_call, marker) }
}

unsafe extern "system" fn get_device_queue(
    device: vk::Device,
    family: u32,
    index: u32,
    queue: *mut vk::Queue,
) {
    guard((), || {
        let Some(state) = device_of(device) else { return };
        let Some(next) = state.get_device_queue else { return };
        // SAFETY: the application's arguments.
        unsafe { next(device, family, index, queue) };
        // SAFETY: NULL or the out-pointer the driver just filled.
        if let (Some(pacer), Some(&got)) = (&state.pacer, unsafe { queue.as_ref() })
            && got != vk::Queue::null()
        {
            pacer.queue_created(got, family);
        }
    })
}

unsafe extern "system" fn get_device_queue2(
    device: vk::Device,
    info: *const vk::DeviceQueueInfo2<'_>,
    queue: *mut vk::Queue,
) {
    guard((), || {
        let Some(state) = device_of(device) else { return };
        let Some(next) = state.get_device_queue2 else { return };
        // SAFETY: the application's arguments.
        unsafe { next(device, info, queue) };
        // SAFETY: NULL or the application's structure.
        let family = unsafe { info.as_ref() }.map(|info| info.queue_family_index);
        // SAFETY: NULL or the out-pointer the driver just filled.
        if let (Some(pacer), Some(family), Some(&got)) = (&state.pacer, family, unsafe { queue.as_ref() })
            && got != vk::Queue::null()
        {
            pacer.queue_created(got, family);
        }
    })
}
