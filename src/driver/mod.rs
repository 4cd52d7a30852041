//! The real NVIDIA driver: its entry points resolved one by one, and thin `Result` wrappers.
//!
//! A missing library or entry point is not an error at load time: the wrapper returns
//! [`HookError::MissingEntryPoint`] when it is called, which the shims turn into the status code
//! the caller would get from a driver that lacks the function.

pub mod loader;
pub mod sys;
pub mod tools;

use std::ffi::{CStr, c_int, c_uint, c_void};
use std::sync::OnceLock;

use crate::error::HookError;
use loader::Library;
use sys::*;

/// Resolves `$names` (newest variant first) in `$lib` as a function pointer of type `$ty`.
macro_rules! entry {
    ($lib:expr, $ty:ty, [$($name:literal),+]) => {
        $lib.and_then(|lib| lib.symbol(&[$($name),+])).map(|ptr| {
            // SAFETY: the symbol was resolved by one of the names listed here, and every name in
            // the list shares the C signature that `$ty` declares (see `sys`).
            unsafe { std::mem::transmute::<*mut c_void, $ty>(ptr) }
        })
    };
}

/// Entry points of `libcuda.so.1` that the hooks call.
#[derive(Debug, Default)]
pub struct Cuda {
    pub init: Option<CuInit>,
    pub device_get_count: Option<CuDeviceGetCount>,
    pub device_get_uuid: Option<CuDeviceGetUuid>,
    pub device_get_attribute: Option<CuDeviceGetAttribute>,
    pub device_total_mem_v2: Option<CuDeviceTotalMemV2>,
    pub ctx_get_device: Option<CuCtxGetDevice>,
    pub mem_alloc_v2: Option<CuMemAllocV2>,
    pub mem_free_v2: Option<CuMemFreeV2>,
    pub mem_get_info_v2: Option<CuMemGetInfoV2>,
    pub get_proc_address: Option<CuGetProcAddress>,
    pub get_proc_address_v2: Option<CuGetProcAddressV2>,
    pub mem_alloc_pitch_v2: Option<CuMemAllocPitchV2>,
    pub mem_alloc_managed: Option<CuMemAllocManaged>,
    pub mem_alloc_async: Option<CuMemAllocAsync>,
    pub mem_alloc_async_ptsz: Option<CuMemAllocAsync>,
    pub mem_alloc_from_pool_async: Option<CuMemAllocFromPoolAsync>,
    pub mem_alloc_from_pool_async_ptsz: Option<CuMemAllocFromPoolAsync>,
    pub mem_free_async: Option<CuMemFreeAsync>,
    pub mem_free_async_ptsz: Option<CuMemFreeAsync>,
    pub mem_create: Option<CuMemCreate>,
    pub mem_release: Option<CuMemRelease>,
    pub array_create_v2: Option<CuArrayCreateV2>,
    pub array_3d_create_v2: Option<CuArray3dCreateV2>,
    pub array_destroy: Option<CuArrayDestroy>,
    pub mipmapped_array_create: Option<CuMipmappedArrayCreate>,
    pub mipmapped_array_destroy: Option<CuMipmappedArrayDestroy>,
    pub device_primary_ctx_retain: Option<CuDevicePrimaryCtxRetain>,
    pub device_primary_ctx_release_v2: Option<CuDevicePrimaryCtxReleaseV2>,
    pub ctx_create_v2: Option<CuCtxCreateV2>,
    pub ctx_create_v3: Option<CuCtxCreateV3>,
    pub ctx_create_v4: Option<CuCtxCreateV4>,
    pub ctx_destroy_v2: Option<CuCtxDestroyV2>,
    pub green_ctx_create: Option<CuGreenCtxCreate>,
    pub green_ctx_destroy: Option<CuGreenCtxDestroy>,
    pub mem_map: Option<CuMemMap>,
    pub mem_unmap: Option<CuMemUnmap>,
    pub mem_retain_allocation_handle: Option<CuMemRetainAllocationHandle>,
    pub mem_set_access: Option<CuMemSetAccess>,
    pub mem_export_to_shareable_handle: Option<CuMemExportToShareableHandle>,
    pub mem_get_allocation_properties_from_handle: Option<CuMemGetAllocationPropertiesFromHandle>,
    pub device_get_mem_pool: Option<CuDeviceGetMemPool>,
    pub device_get_default_mem_pool: Option<CuDeviceGetMemPool>,
    pub mem_pool_get_attribute: Option<CuMemPoolGetAttribute>,
    pub graph_get_nodes: Option<CuGraphGetNodes>,
    pub graph_node_get_type: Option<CuGraphNodeGetType>,
    pub graph_mem_alloc_node_get_params: Option<CuGraphMemAllocNodeGetParams>,
    pub graph_instantiate: Option<CuGraphInstantiateV2>,
    pub graph_instantiate_v2: Option<CuGraphInstantiateV2>,
    pub graph_instantiate_with_flags: Option<CuGraphInstantiateWithFlags>,
    pub graph_instantiate_with_params: Option<CuGraphInstantiateWithParams>,
    pub graph_instantiate_with_params_ptsz: Option<CuGraphInstantiateWithParams>,
    pub graph_exec_destroy: Option<CuGraphExecDestroy>,
    pub launch_kernel: Option<CuLaunchKernel>,
    pub launch_kernel_ptsz: Option<CuLaunchKernel>,
    pub launch_cooperative_kernel: Option<CuLaunchCooperativeKernel>,
    pub launch_cooperative_kernel_ptsz: Option<CuLaunchCooperativeKernel>,
    pub launch_kernel_ex: Option<CuLaunchKernelEx>,
    pub launch_kernel_ex_ptsz: Option<CuLaunchKernelEx>,
    pub graph_launch: Option<CuGraphLaunch>,
    pub graph_launch_ptsz: Option<CuGraphLaunch>,
    pub ctx_get_current: Option<CuCtxGetCurrent>,
    pub ctx_get_exec_affinity: Option<CuCtxGetExecAffinity>,
    pub event_create: Option<CuEventCreate>,
    pub event_record: Option<CuEventRecord>,
    pub event_query: Option<CuEventQuery>,
    pub event_synchronize: Option<CuEventQuery>,
    pub event_elapsed_time: Option<CuEventElapsedTime>,
    pub event_destroy_v2: Option<CuEventDestroyV2>,
    pub stream_is_capturing: Option<CuStreamIsCapturing>,
    pub mem_advise: Option<CuMemAdvise>,
    pub mem_advise_v2: Option<CuMemAdviseV2>,
    pub mem_prefetch_async: Option<CuMemPrefetchAsync>,
    pub mem_prefetch_async_v2: Option<CuMemPrefetchAsyncV2>,
    pub thread_exchange_stream_capture_mode: Option<CuThreadExchangeStreamCaptureMode>,
    pub pointer_get_attribute: Option<CuPointerGetAttribute>,
    pub pointer_get_attributes: Option<CuPointerGetAttributes>,
    pub mem_get_address_range: Option<CuMemGetAddressRange>,
    pub mem_pool_trim_to: Option<CuMemPoolTrimTo>,
    pub mem_pool_set_attribute: Option<CuMemPoolSetAttribute>,
}

/// Entry points of `libnvidia-ml.so.1` that the hooks call.
#[derive(Debug, Default)]
pub struct Nvml {
    pub init_v2: Option<NvmlInitV2>,
    pub device_get_count_v2: Option<NvmlDeviceGetCountV2>,
    pub device_get_handle_by_index_v2: Option<NvmlDeviceGetHandleByIndexV2>,
    pub device_get_uuid: Option<NvmlDeviceGetUuid>,
    pub device_get_memory_info: Option<NvmlDeviceGetMemoryInfo>,
    pub device_get_memory_info_v2: Option<NvmlDeviceGetMemoryInfoV2>,
    pub device_get_compute_running_processes: Option<NvmlDeviceGetComputeRunningProcesses>,
    /// The `_v3` (else `_v2`) entry point alone: their records share one layout
    /// ([`NvmlProcessInfo`]), the unversioned one's do not.
    pub device_get_compute_running_processes_records: Option<NvmlDeviceGetComputeRunningProcesses>,
    pub device_get_num_gpu_cores: Option<NvmlDeviceGetNumGpuCores>,
}

/// The CUDA driver, loaded on first use.
pub fn cuda() -> &'static Cuda {
    static CUDA: OnceLock<Cuda> = OnceLock::new();
    CUDA.get_or_init(|| {
        let lib = Library::open(&[c"libcuda.so.1", c"libcuda.so"]);
        if lib.is_none() {
            tracing::error!("cannot load libcuda.so.1: every CUDA call will fail");
        }
        Cuda {
            init: entry!(lib, CuInit, [c"cuInit"]),
            device_get_count: entry!(lib, CuDeviceGetCount, [c"cuDeviceGetCount"]),
            device_get_uuid: entry!(lib, CuDeviceGetUuid, [c"cuDeviceGetUuid_v2", c"cuDeviceGetUuid"]),
            device_get_attribute: entry!(lib, CuDeviceGetAttribute, [c"cuDeviceGetAttribute"]),
            device_total_mem_v2: entry!(lib, CuDeviceTotalMemV2, [c"cuDeviceTotalMem_v2"]),
            ctx_get_device: entry!(lib, CuCtxGetDevice, [c"cuCtxGetDevice"]),
            mem_alloc_v2: entry!(lib, CuMemAllocV2, [c"cuMemAlloc_v2"]),
            mem_free_v2: entry!(lib, CuMemFreeV2, [c"cuMemFree_v2"]),
            mem_get_info_v2: entry!(lib, CuMemGetInfoV2, [c"cuMemGetInfo_v2"]),
            get_proc_address: entry!(lib, CuGetProcAddress, [c"cuGetProcAddress"]),
            get_proc_address_v2: entry!(lib, CuGetProcAddressV2, [c"cuGetProcAddress_v2"]),
            mem_alloc_pitch_v2: entry!(lib, CuMemAllocPitchV2, [c"cuMemAllocPitch_v2"]),
            mem_alloc_managed: entry!(lib, CuMemAllocManaged, [c"cuMemAllocManaged"]),
            mem_alloc_async: entry!(lib, CuMemAllocAsync, [c"cuMemAllocAsync"]),
            mem_alloc_async_ptsz: entry!(lib, CuMemAllocAsync, [c"cuMemAllocAsync_ptsz"]),
            mem_alloc_from_pool_async: entry!(lib, CuMemAllocFromPoolAsync, [c"cuMemAllocFromPoolAsync"]),
            mem_alloc_from_pool_async_ptsz: entry!(
                lib,
                CuMemAllocFromPoolAsync,
                [c"cuMemAllocFromPoolAsync_ptsz"]
            ),
            mem_free_async: entry!(lib, CuMemFreeAsync, [c"cuMemFreeAsync"]),
            mem_free_async_ptsz: entry!(lib, CuMemFreeAsync, [c"cuMemFreeAsync_ptsz"]),
            mem_create: entry!(lib, CuMemCreate, [c"cuMemCreate"]),
            mem_release: entry!(lib, CuMemRelease, [c"cuMemRelease"]),
            array_create_v2: entry!(lib, CuArrayCreateV2, [c"cuArrayCreate_v2"]),
            array_3d_create_v2: entry!(lib, CuArray3dCreateV2, [c"cuArray3DCreate_v2"]),
            array_destroy: entry!(lib, CuArrayDestroy, [c"cuArrayDestroy"]),
            mipmapped_array_create: entry!(lib, CuMipmappedArrayCreate, [c"cuMipmappedArrayCreate"]),
            mipmapped_array_destroy: entry!(lib, CuMipmappedArrayDestroy, [c"cuMipmappedArrayDestroy"]),
            device_primary_ctx_retain: entry!(lib, CuDevicePrimaryCtxRetain, [c"cuDevicePrimaryCtxRetain"]),
            device_primary_ctx_release_v2: entry!(
                lib,
                CuDevicePrimaryCtxReleaseV2,
                [c"cuDevicePrimaryCtxRelease_v2", c"cuDevicePrimaryCtxRelease"]
            ),
            ctx_create_v2: entry!(lib, CuCtxCreateV2, [c"cuCtxCreate_v2"]),
            ctx_create_v3: entry!(lib, CuCtxCreateV3, [c"cuCtxCreate_v3"]),
            ctx_create_v4: entry!(lib, CuCtxCreateV4, [c"cuCtxCreate_v4"]),
            ctx_destroy_v2: entry!(lib, CuCtxDestroyV2, [c"cuCtxDestroy_v2"]),
            green_ctx_create: entry!(lib, CuGreenCtxCreate, [c"cuGreenCtxCreate"]),
            green_ctx_destroy: entry!(lib, CuGreenCtxDestroy, [c"cuGreenCtxDestroy"]),
            mem_map: entry!(lib, CuMemMap, [c"cuMemMap"]),
            mem_unmap: entry!(lib, CuMemUnmap, [c"cuMemUnmap"]),
            mem_retain_allocation_handle: entry!(
                lib,
                CuMemRetainAllocationHandle,
                [c"cuMemRetainAllocationHandle"]
            ),
            mem_set_access: entry!(lib, CuMemSetAccess, [c"cuMemSetAccess"]),
            mem_export_to_shareable_handle: entry!(
                lib,
                CuMemExportToShareableHandle,
                [c"cuMemExportToShareableHandle"]
            ),
            mem_get_allocation_properties_from_handle: entry!(
                lib,
                CuMemGetAllocationPropertiesFromHandle,
                [c"cuMemGetAllocationPropertiesFromHandle"]
            ),
            device_get_mem_pool: entry!(lib, CuDeviceGetMemPool, [c"cuDeviceGetMemPool"]),
            device_get_default_mem_pool: entry!(lib, CuDeviceGetMemPool, [c"cuDeviceGetDefaultMemPool"]),
            mem_pool_get_attribute: entry!(lib, CuMemPoolGetAttribute, [c"cuMemPoolGetAttribute"]),
            graph_get_nodes: entry!(lib, CuGraphGetNodes, [c"cuGraphGetNodes"]),
            graph_node_get_type: entry!(lib, CuGraphNodeGetType, [c"cuGraphNodeGetType"]),
            graph_mem_alloc_node_get_params: entry!(
                lib,
                CuGraphMemAllocNodeGetParams,
                [c"cuGraphMemAllocNodeGetParams"]
            ),
            graph_instantiate: entry!(lib, CuGraphInstantiateV2, [c"cuGraphInstantiate"]),
            graph_instantiate_v2: entry!(lib, CuGraphInstantiateV2, [c"cuGraphInstantiate_v2"]),
            graph_instantiate_with_flags: entry!(
                lib,
                CuGraphInstantiateWithFlags,
                [c"cuGraphInstantiateWithFlags"]
            ),
            graph_instantiate_with_params: entry!(
                lib,
                CuGraphInstantiateWithParams,
                [c"cuGraphInstantiateWithParams"]
            ),
            graph_instantiate_with_params_ptsz: entry!(
                lib,
                CuGraphInstantiateWithParams,
                [c"cuGraphInstantiateWithParams_ptsz"]
            ),
            graph_exec_destroy: entry!(lib, CuGraphExecDestroy, [c"cuGraphExecDestroy"]),
            launch_kernel: entry!(lib, CuLaunchKernel, [c"cuLaunchKernel"]),
            launch_kernel_ptsz: entry!(lib, CuLaunchKernel, [c"cuLaunchKernel_ptsz"]),
            launch_cooperative_kernel: entry!(lib, CuLaunchCooperativeKernel, [c"cuLaunchCooperativeKernel"]),
            launch_cooperative_kernel_ptsz: entry!(
                lib,
                CuLaunchCooperativeKernel,
                [c"cuLaunchCooperativeKernel_ptsz"]
            ),
            launch_kernel_ex: entry!(lib, CuLaunchKernelEx, [c"cuLaunchKernelEx"]),
            launch_kernel_ex_ptsz: entry!(lib, CuLaunchKernelEx, [c"cuLaunchKernelEx_ptsz"]),
            graph_launch: entry!(lib, CuGraphLaunch, [c"cuGraphLaunch"]),
            graph_launch_ptsz: entry!(lib, CuGraphLaunch, [c"cuGraphLaunch_ptsz"]),
            ctx_get_current: entry!(lib, CuCtxGetCurrent, [c"cuCtxGetCurrent"]),
            ctx_get_exec_affinity: entry!(lib, CuCtxGetExecAffinity, [c"cuCtxGetExecAffinity"]),
            event_create: entry!(lib, CuEventCreate, [c"cuEventCreate"]),
            event_record: entry!(lib, CuEventRecord, [c"cuEventRecord"]),
            event_query: entry!(lib, CuEventQuery, [c"cuEventQuery"]),
            event_synchronize: entry!(lib, CuEventQuery, [c"cuEventSynchronize"]),
            event_elapsed_time: entry!(
                lib,
                CuEventElapsedTime,
                [c"cuEventElapsedTime_v2", c"cuEventElapsedTime"]
            ),
            event_destroy_v2: entry!(lib, CuEventDestroyV2, [c"cuEventDestroy_v2"]),
            stream_is_capturing: entry!(lib, CuStreamIsCapturing, [c"cuStreamIsCapturing"]),
            mem_advise: entry!(lib, CuMemAdvise, [c"cuMemAdvise"]),
            mem_advise_v2: entry!(lib, CuMemAdviseV2, [c"cuMemAdvise_v2"]),
            mem_prefetch_async: entry!(lib, CuMemPrefetchAsync, [c"cuMemPrefetchAsync"]),
            mem_prefetch_async_v2: entry!(lib, CuMemPrefetchAsyncV2, [c"cuMemPrefetchAsync_v2"]),
            thread_exchange_stream_capture_mode: entry!(
                lib,
                CuThreadExchangeStreamCaptureMode,
                [c"cuThreadExchangeStreamCaptureMode"]
            ),
            pointer_get_attribute: entry!(lib, CuPointerGetAttribute, [c"cuPointerGetAttribute"]),
            pointer_get_attributes: entry!(lib, CuPointerGetAttributes, [c"cuPointerGetAttributes"]),
            mem_get_address_range: entry!(lib, CuMemGetAddressRange, [c"cuMemGetAddressRange_v2"]),
            mem_pool_trim_to: entry!(lib, CuMemPoolTrimTo, [c"cuMemPoolTrimTo"]),
            mem_pool_set_attribute: entry!(lib, CuMemPoolSetAttribute, [c"cuMemPoolSetAttribute"]),
        }
    })
}

/// NVML, loaded on first use.
pub fn nvml() -> &'static Nvml {
    static NVML: OnceLock<Nvml> = OnceLock::new();
    NVML.get_or_init(|| {
        let lib = Library::open(&[c"libnvidia-ml.so.1", c"libnvidia-ml.so"]);
        if lib.is_none() {
            tracing::warn!("cannot load libnvidia-ml.so.1: NVML queries will fail");
        }
        Nvml {
            init_v2: entry!(lib, NvmlInitV2, [c"nvmlInit_v2"]),
            device_get_count_v2: entry!(lib, NvmlDeviceGetCountV2, [c"nvmlDeviceGetCount_v2"]),
            device_get_handle_by_index_v2: entry!(
                lib,
                NvmlDeviceGetHandleByIndexV2,
                [c"nvmlDeviceGetHandleByIndex_v2"]
            ),
            device_get_uuid: entry!(lib, NvmlDeviceGetUuid, [c"nvmlDeviceGetUUID"]),
            device_get_memory_info: entry!(lib, NvmlDeviceGetMemoryInfo, [c"nvmlDeviceGetMemoryInfo"]),
            device_get_memory_info_v2: entry!(
                lib,
                NvmlDeviceGetMemoryInfoV2,
                [c"nvmlDeviceGetMemoryInfo_v2"]
            ),
            device_get_compute_running_processes: entry!(
                lib,
                NvmlDeviceGetComputeRunningProcesses,
                [
                    c"nvmlDeviceGetComputeRunningProcesses_v3",
                    c"nvmlDeviceGetComputeRunningProcesses_v2",
                    c"nvmlDeviceGetComputeRunningProcesses"
                ]
            ),
            device_get_compute_running_processes_records: entry!(
                lib,
                NvmlDeviceGetComputeRunningProcesses,
                [c"nvmlDeviceGetComputeRunningProcesses_v3", c"nvmlDeviceGetComputeRunningProcesses_v2"]
            ),
            device_get_num_gpu_cores: entry!(lib, NvmlDeviceGetNumGpuCores, [c"nvmlDeviceGetNumGpuCores"]),
        }
    })
}

/// `GPU-…` UUIDs of the CUDA ordinals this process sees, in ordinal order (empty if the driver
/// cannot say). Calls `cuInit`, which is idempotent: a process that only uses NVML
/// (`nvidia-smi`) has not called it.
pub fn cuda_device_uuids() -> &'static [UuidText] {
    static UUIDS: OnceLock<Vec<UuidText>> = OnceLock::new();
    UUIDS.get_or_init(|| {
        let cuda = cuda();
        if let Err(error) = cuda.init(0) {
            tracing::warn!(?error, "cuInit failed; devices cannot be matched to budgets");
            return Vec::new();
        }
        let count = cuda.device_count().unwrap_or(0).clamp(0, crate::config::MAX_DEVICES as i32);
        (0..count)
            .map_while(|ordinal| cuda.device_uuid(ordinal).ok())
            .map(|uuid| UuidText::from_cuda(&uuid))
            .collect()
    })
}

/// Resolves one exported name in the CUDA driver exactly, without fallback (used to learn which
/// address the driver gives each variant).
pub fn cuda_symbol(name: &CStr) -> Option<*mut c_void> {
    Library::open(&[c"libcuda.so.1", c"libcuda.so"]).and_then(|lib| lib.symbol(&[name]))
}

fn check(status: CUresult) -> Result<(), HookError> {
    if status == CUDA_SUCCESS { Ok(()) } else { Err(HookError::Driver(status)) }
}

fn check_nvml(status: NvmlReturn) -> Result<(), HookError> {
    if status == NVML_SUCCESS { Ok(()) } else { Err(HookError::Nvml(status)) }
}

fn need<T>(entry: Option<T>, name: &'static str) -> Result<T, HookError> {
    entry.ok_or(HookError::MissingEntryPoint(name))
}

/// Calls the resolved entry point `entry` (named `name` for the error when it is missing) and maps
/// its status to a `Result`.
pub fn invoke<F: Copy>(
    entry: Option<F>,
    name: &'static str,
    call: impl FnOnce(F) -> CUresult,
) -> Result<(), HookError> {
    check(call(need(entry, name)?))
}

impl Cuda {
    pub fn init(&self, flags: u32) -> Result<(), HookError> {
        let f = need(self.init, "cuInit")?;
        // SAFETY: cuInit takes its flags by value.
        check(unsafe { f(flags) })
    }

    pub fn device_count(&self) -> Result<i32, HookError> {
        let f = need(self.device_get_count, "cuDeviceGetCount")?;
        let mut count = 0;
        // SAFETY: `count` is a valid out-pointer.
        check(unsafe { f(&mut count) })?;
        Ok(count)
    }

    /// The integer device attribute `attribute` of `device`.
    pub fn device_attribute(&self, device: CUdevice, attribute: c_int) -> Result<c_int, HookError> {
        let f = need(self.device_get_attribute, "cuDeviceGetAttribute")?;
        let mut value = 0;
        // SAFETY: `value` is a valid out-pointer of the `int` every integer attribute is.
        check(unsafe { f(&mut value, attribute, device) })?;
        Ok(value)
    }

    pub fn device_uuid(&self, device: CUdevice) -> Result<CUuuid, HookError> {
        let f = need(self.device_get_uuid, "cuDeviceGetUuid")?;
        let mut uuid = CUuuid::default();
        // SAFETY: `uuid` is a valid out-pointer of the 16 bytes the driver writes.
        check(unsafe { f(&mut uuid, device) })?;
        Ok(uuid)
    }

    /// The device of the calling thread's current context.
    pub fn current_device(&self) -> Result<CUdevice, HookError> {
        let f = need(self.ctx_get_device, "cuCtxGetDevice")?;
        let mut device = 0;
        // SAFETY: `device` is a valid out-pointer.
        check(unsafe { f(&mut device) })?;
        Ok(device)
    }

    /// # Safety
    /// `bytes` is passed to the driver untouched: any value the application gave.
    pub unsafe fn device_total_mem(&self, bytes: *mut usize, dev: CUdevice) -> Result<(), HookError> {
        let f = need(self.device_total_mem_v2, "cuDeviceTotalMem_v2")?;
        // SAFETY: the driver validates `bytes` itself (NULL → its own error).
        check(unsafe { f(bytes, dev) })
    }

    /// # Safety
    /// `dptr` is passed to the driver untouched: any value the application gave.
    pub unsafe fn mem_alloc(&self, dptr: *mut CUdeviceptr, bytes: usize) -> Result<(), HookError> {
        let f = need(self.mem_alloc_v2, "cuMemAlloc_v2")?;
        // SAFETY: the driver validates `dptr` itself (NULL → its own error).
        check(unsafe { f(dptr, bytes) })
    }

    pub fn mem_free(&self, dptr: CUdeviceptr) -> Result<(), HookError> {
        let f = need(self.mem_free_v2, "cuMemFree_v2")?;
        // SAFETY: a device pointer is passed by value; the driver validates it.
        check(unsafe { f(dptr) })
    }

    /// # Safety
    /// `free` and `total` are passed to the driver untouched: any values the application gave.
    pub unsafe fn mem_get_info(&self, free: *mut usize, total: *mut usize) -> Result<(), HookError> {
        let f = need(self.mem_get_info_v2, "cuMemGetInfo_v2")?;
        // SAFETY: the driver validates both pointers itself.
        check(unsafe { f(free, total) })
    }
}

/// Launch timing: the calls the compute limiter makes around a launch. Every handle passed in is
/// one the driver gave us or the application's own stream, which the driver validates.
// Contexts, streams and events are opaque driver handles: passed on, never dereferenced.
#[allow(clippy::not_unsafe_ptr_arg_deref)]
impl Cuda {
    /// The calling thread's current context (NULL when none).
    pub fn current_context(&self) -> Result<CUcontext, HookError> {
        let f = need(self.ctx_get_current, "cuCtxGetCurrent")?;
        let mut context = std::ptr::null_mut();
        // SAFETY: `context` is a valid out-pointer.
        check(unsafe { f(&mut context) })?;
        Ok(context)
    }

    /// The SMs the current context's kernels may use, by its execution affinity (under MPS, a
    /// client's thread percentage or the affinity its context was created with).
    pub fn current_sm_affinity(&self) -> Result<u32, HookError> {
        let f = need(self.ctx_get_exec_affinity, "cuCtxGetExecAffinity")?;
        let mut affinity = CUexecAffinityParam::default();
        // SAFETY: `affinity` is a valid out-pointer of the struct the driver writes.
        check(unsafe { f(&mut affinity, CU_EXEC_AFFINITY_TYPE_SM_COUNT) })?;
        Ok(affinity.sm_count)
    }

    /// Whether `stream` is being captured into a graph (its work then does not run now).
    pub fn stream_capturing(&self, stream: CUstream) -> Result<bool, HookError> {
        let f = need(self.stream_is_capturing, "cuStreamIsCapturing")?;
        let mut status = CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: `status` is a valid out-pointer; the driver validates `stream`.
        check(unsafe { f(stream, &mut status) })?;
        Ok(status != CU_STREAM_CAPTURE_STATUS_NONE)
    }

    /// Advises the driver about managed memory at `ptr` (`advice` toward `device`): the `_v2`
    /// ABI where the driver has it (CUDA 12.2+), else the CUDA 8 one.
    pub fn mem_advise(
        &self,
        ptr: CUdeviceptr,
        bytes: usize,
        advice: i32,
        device: CUdevice,
    ) -> Result<(), HookError> {
        let location = CUmemLocation { kind: CU_MEM_LOCATION_TYPE_DEVICE, id: device };
        if let Some(f) = self.mem_advise_v2 {
            // SAFETY: plain values; the driver validates the range.
            return check(unsafe { f(ptr, bytes, advice, location) });
        }
        let f = need(self.mem_advise, "cuMemAdvise")?;
        // SAFETY: plain values; the driver validates the range.
        check(unsafe { f(ptr, bytes, advice, device) })
    }

    /// Queues a migration of the managed memory at `ptr` to `device` on `stream`.
    pub fn mem_prefetch(
        &self,
        ptr: CUdeviceptr,
        bytes: usize,
        device: CUdevice,
        stream: CUstream,
    ) -> Result<(), HookError> {
        let location = CUmemLocation { kind: CU_MEM_LOCATION_TYPE_DEVICE, id: device };
        if let Some(f) = self.mem_prefetch_async_v2 {
            // SAFETY: plain values and the caller's stream handle; the driver validates them.
            return check(unsafe { f(ptr, bytes, location, 0, stream) });
        }
        let f = need(self.mem_prefetch_async, "cuMemPrefetchAsync")?;
        // SAFETY: plain values and the caller's stream handle; the driver validates them.
        check(unsafe { f(ptr, bytes, device, stream) })
    }

    /// A new timing event in the current context.
    pub fn event_create(&self) -> Result<CUevent, HookError> {
        let f = need(self.event_create, "cuEventCreate")?;
        let mut event = std::ptr::null_mut();
        // SAFETY: `event` is a valid out-pointer.
        check(unsafe { f(&mut event, CU_EVENT_DEFAULT) })?;
        Ok(event)
    }

    pub fn event_record(&self, event: CUevent, stream: CUstream) -> Result<(), HookError> {
        let f = need(self.event_record, "cuEventRecord")?;
        // SAFETY: handles passed by value; the driver validates them.
        check(unsafe { f(event, stream) })
    }

    /// Whether the work before `event` has finished, without waiting.
    pub fn event_done(&self, event: CUevent) -> Result<bool, HookError> {
        let f = need(self.event_query, "cuEventQuery")?;
        // SAFETY: a handle passed by value; the driver validates it.
        match unsafe { f(event) } {
            CUDA_ERROR_NOT_READY => Ok(false),
            status => check(status).map(|()| true),
        }
    }

    /// Waits until the work before `event` has finished.
    pub fn event_wait(&self, event: CUevent) -> Result<(), HookError> {
        let f = need(self.event_synchronize, "cuEventSynchronize")?;
        // SAFETY: a handle passed by value; the driver validates it.
        check(unsafe { f(event) })
    }

    /// GPU time between two completed events, in nanoseconds (0 if `end` came first).
    pub fn elapsed_ns(&self, start: CUevent, end: CUevent) -> Result<u64, HookError> {
        let f = need(self.event_elapsed_time, "cuEventElapsedTime")?;
        let mut milliseconds = 0f32;
        // SAFETY: `milliseconds` is a valid out-pointer; the driver validates both events.
        check(unsafe { f(&mut milliseconds, start, end) })?;
        Ok((f64::from(milliseconds) * 1e6).max(0.0) as u64)
    }

    pub fn event_destroy(&self, event: CUevent) {
        if let Some(f) = self.event_destroy_v2 {
            // SAFETY: an event we created, destroyed once.
            unsafe { f(event) };
        }
    }

    /// Whether `address` is device memory (or managed) by the driver's account; `false` for host
    /// memory, pinned or pageable (the driver does not know pageable addresses), and on any error.
    pub fn is_device_memory(&self, address: CUdeviceptr) -> bool {
        let Some(f) = self.pointer_get_attribute else { return false };
        let mut memory_type: std::ffi::c_uint = 0;
        // SAFETY: `memory_type` is a valid out-pointer of the attribute's type (`CUmemorytype`).
        let status = unsafe { f((&raw mut memory_type).cast(), CU_POINTER_ATTRIBUTE_MEMORY_TYPE, address) };
        status == CUDA_SUCCESS && memory_type == CU_MEMORYTYPE_DEVICE
    }

    /// Runs `body` with this thread's stream-capture mode relaxed, so that querying our own
    /// events cannot disturb a graph capture another thread runs in the (default) global mode.
    pub fn with_relaxed_capture<T>(&self, body: impl FnOnce() -> T) -> T {
        let Some(exchange) = self.thread_exchange_stream_capture_mode else { return body() };
        let mut mode = CU_STREAM_CAPTURE_MODE_RELAXED;
        // SAFETY: `mode` is a valid in/out-pointer.
        let swapped = unsafe { exchange(&mut mode) } == CUDA_SUCCESS;
        let result = body();
        if swapped {
            // SAFETY: as above; restores the mode the thread had.
            unsafe { exchange(&mut mode) };
        }
        result
    }
}

impl Nvml {
    pub fn init(&self) -> Result<(), HookError> {
        let f = need(self.init_v2, "nvmlInit_v2")?;
        // SAFETY: nvmlInit_v2 takes no arguments.
        check_nvml(unsafe { f() })
    }

    /// The `GPU-…` UUID string of `device`, without the trailing NULs.
    ///
    /// # Safety
    /// `device` is passed to NVML untouched: any handle the application gave.
    pub unsafe fn device_uuid(&self, device: NvmlDevice) -> Result<UuidText, HookError> {
        let f = need(self.device_get_uuid, "nvmlDeviceGetUUID")?;
        let mut text = UuidText::default();
        // SAFETY: the buffer holds NVML_UUID_BUFFER bytes, and we pass that length.
        check_nvml(unsafe { f(device, text.bytes.as_mut_ptr().cast(), NVML_UUID_BUFFER as u32) })?;
        Ok(text)
    }

    /// The NVML device whose `GPU-…` UUID is `uuid` (compared without regard to case), and NVML's
    /// own spelling of it. Devices are found by listing them, which every NVML (and the fake)
    /// supports.
    fn find_by_uuid(&self, uuid: &UuidText) -> Result<(NvmlDevice, UuidText), HookError> {
        // NVML's init is reference-counted; one reference for this process is enough.
        static INIT: OnceLock<Result<(), HookError>> = OnceLock::new();
        (*INIT.get_or_init(|| self.init()))?;
        let count_fn = need(self.device_get_count_v2, "nvmlDeviceGetCount_v2")?;
        let by_index = need(self.device_get_handle_by_index_v2, "nvmlDeviceGetHandleByIndex_v2")?;
        let mut count = 0;
        // SAFETY: `count` is a valid out-pointer.
        check_nvml(unsafe { count_fn(&mut count) })?;
        for index in 0..count {
            let mut device: NvmlDevice = std::ptr::null_mut();
            // SAFETY: `device` is a valid out-pointer.
            check_nvml(unsafe { by_index(index, &mut device) })?;
            // SAFETY: `device` is a handle NVML just gave us.
            let text = unsafe { self.device_uuid(device) }?;
            if text.as_bytes().eq_ignore_ascii_case(uuid.as_bytes()) {
                return Ok((device, text));
            }
        }
        Err(HookError::Nvml(NVML_ERROR_NOT_FOUND))
    }

    /// Device memory in use on the device with this `GPU-…` UUID, as NVML counts it.
    pub fn used_by_uuid(&self, uuid: &UuidText) -> Result<u64, HookError> {
        let (device, _) = self.find_by_uuid(uuid)?;
        let mut memory = NvmlMemory::default();
        // SAFETY: `device` is a handle NVML gave us, and `memory` is a valid out-pointer.
        unsafe { self.memory_info(device, &mut memory) }?;
        Ok(memory.used)
    }

    /// How many processes have a compute context on the device with this `GPU-…` UUID, by NVML's
    /// count (every process on the device, whatever container it is in).
    pub fn compute_processes_by_uuid(&self, uuid: &UuidText) -> Result<u32, HookError> {
        let (device, _) = self.find_by_uuid(uuid)?;
        let f = need(self.device_get_compute_running_processes, "nvmlDeviceGetComputeRunningProcesses")?;
        let mut count = 0;
        // SAFETY: `device` is a handle NVML gave us; a count of 0 asks only for the count, so no
        // records are written and NULL is allowed.
        match unsafe { f(device, &mut count, std::ptr::null_mut()) } {
            NVML_SUCCESS | NVML_ERROR_INSUFFICIENT_SIZE => Ok(count),
            status => Err(HookError::Nvml(status)),
        }
    }

    /// The CUDA cores of the whole device with this `GPU-…` UUID. NVML is not an MPS client, so
    /// no thread percentage narrows this figure (measured on an H100 under MPS: 16896 at 30 %).
    pub fn gpu_cores_by_uuid(&self, uuid: &UuidText) -> Result<u32, HookError> {
        let (device, _) = self.find_by_uuid(uuid)?;
        let f = need(self.device_get_num_gpu_cores, "nvmlDeviceGetNumGpuCores")?;
        let mut cores: c_uint = 0;
        // SAFETY: `device` is a handle NVML gave us; `cores` is a valid out-pointer.
        match unsafe { f(device, &mut cores) } {
            NVML_SUCCESS => Ok(cores),
            status => Err(HookError::Nvml(status)),
        }
    }

    /// The device memory NVML counts for process `pid` on the device with this `GPU-…` UUID:
    /// `Ok(None)` when NVML lists no such process or has no figure for it. A driver that reports
    /// host pids to a process in a pid namespace never lists the process's own pid.
    pub fn process_used_by_uuid(&self, uuid: &UuidText, pid: u32) -> Result<Option<u64>, HookError> {
        let (device, _) = self.find_by_uuid(uuid)?;
        let f = need(
            self.device_get_compute_running_processes_records,
            "nvmlDeviceGetComputeRunningProcesses_v3",
        )?;
        let mut records = vec![NvmlProcessInfo::default(); 64];
        let mut count: c_uint = 0;
        for _ in 0..3 {
            count = records.len() as c_uint;
            // SAFETY: `device` is a handle NVML gave us; `records` has room for `count` records of
            // the layout these versions write.
            match unsafe { f(device, &mut count, records.as_mut_ptr().cast()) } {
                NVML_SUCCESS => break,
                // More processes than room: NVML said how many; ask again with room for them.
                NVML_ERROR_INSUFFICIENT_SIZE => {
                    records.resize(count as usize + 16, NvmlProcessInfo::default())
                }
                status => return Err(HookError::Nvml(status)),
            }
        }
        let found = records.iter().take(count as usize).find(|record| record.pid == pid);
        Ok(found.map(|record| record.used_gpu_memory).filter(|&bytes| bytes != NVML_VALUE_NOT_AVAILABLE))
    }

    /// NVML's spelling of a UUID we formatted from CUDA's bytes, or ours when NVML cannot say.
    pub fn spelling_of(&self, uuid: &UuidText) -> UuidText {
        self.find_by_uuid(uuid).map_or(*uuid, |(_, text)| text)
    }

    /// # Safety
    /// `memory` is passed to NVML untouched: any value the application gave.
    pub unsafe fn memory_info(&self, device: NvmlDevice, memory: *mut NvmlMemory) -> Result<(), HookError> {
        let f = need(self.device_get_memory_info, "nvmlDeviceGetMemoryInfo")?;
        // SAFETY: NVML validates `device` and `memory` itself.
        check_nvml(unsafe { f(device, memory) })
    }

    /// # Safety
    /// `memory` is passed to NVML untouched: any value the application gave.
    pub unsafe fn memory_info_v2(
        &self,
        device: NvmlDevice,
        memory: *mut NvmlMemoryV2,
    ) -> Result<(), HookError> {
        let f = need(self.device_get_memory_info_v2, "nvmlDeviceGetMemoryInfo_v2")?;
        // SAFETY: NVML validates `device`, `memory` and its version field itself.
        check_nvml(unsafe { f(device, memory) })
    }
}

/// A NUL-padded UUID string as NVML writes it (`GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct UuidText {
    pub bytes: [u8; NVML_UUID_BUFFER],
}

impl Default for UuidText {
    fn default() -> Self {
        UuidText { bytes: [0; NVML_UUID_BUFFER] }
    }
}

impl UuidText {
    /// Formats CUDA's 16 raw bytes the way NVML prints them.
    pub fn from_cuda(uuid: &CUuuid) -> UuidText {
        let mut text = UuidText::default();
        let name = crate::region::uuid_name(&uuid.bytes);
        text.bytes[..name.len()].copy_from_slice(&name);
        text
    }

    pub fn as_bytes(&self) -> &[u8] {
        let len = self.bytes.iter().position(|&b| b == 0).unwrap_or(self.bytes.len());
        &self.bytes[..len]
    }
}

impl std::fmt::Debug for UuidText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&String::from_utf8_lossy(self.as_bytes()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_uuid_prints_like_nvml() {
        let uuid = CUuuid { bytes: [0xfa, 0xce, 0, 0, 0, 0, 0x4e, 0, 0x80, 0, 0, 0, 0, 0, 0, 3] };
        let text = UuidText::from_cuda(&uuid);
        assert_eq!(text.as_bytes(), b"GPU-face0000-0000-4e00-8000-000000000003");
    }
}
