//! Raw C types, status codes and function signatures of the CUDA driver API and NVML that we use.
//!
//! Only the `driver` module and the export shims look at these numbers; everything else goes
//! through [`crate::error::HookError`].

use std::ffi::{c_char, c_int, c_uint, c_void};

/// Status code of every CUDA driver call (`CUresult`).
pub type CUresult = c_int;
pub type CUdevice = c_int;
pub type CUcontext = *mut c_void;
pub type CUdeviceptr = u64;

pub const CUDA_SUCCESS: CUresult = 0;
/// `CU_DEVICE_ATTRIBUTE_MPS_ENABLED` (cuda.h, CUDA 12.3+): 1 when contexts created on the device are
/// shared through an MPS server.
pub const CU_DEVICE_ATTRIBUTE_MPS_ENABLED: c_int = 133;
/// `CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT`: the device's SMs.
pub const CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: c_int = 16;
/// `CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR` and `_MINOR`.
pub const CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: c_int = 75;
pub const CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: c_int = 76;
/// `CU_EXEC_AFFINITY_TYPE_SM_COUNT`: an execution affinity that caps the SMs a context may use.
pub const CU_EXEC_AFFINITY_TYPE_SM_COUNT: c_int = 0;

/// `CUexecAffinityParam`: the affinity's type, then a 4-byte union whose one member is the SM count.
#[derive(Clone, Copy, Debug, Default)]
#[repr(C)]
pub struct CUexecAffinityParam {
    pub kind: c_int,
    pub sm_count: c_uint,
}
pub const CUDA_ERROR_INVALID_VALUE: CUresult = 1;
pub const CUDA_ERROR_OUT_OF_MEMORY: CUresult = 2;
pub const CUDA_ERROR_NOT_INITIALIZED: CUresult = 3;
pub const CUDA_ERROR_NOT_FOUND: CUresult = 500;
pub const CUDA_ERROR_UNKNOWN: CUresult = 999;

/// `CUuuid`: 16 raw bytes.
#[repr(C)]
#[derive(Clone, Copy, Default, PartialEq, Eq, Debug)]
pub struct CUuuid {
    pub bytes: [u8; 16],
}

/// Status code of every NVML call (`nvmlReturn_t`).
pub type NvmlReturn = c_int;
pub type NvmlDevice = *mut c_void;

pub const NVML_SUCCESS: NvmlReturn = 0;
pub const NVML_ERROR_UNINITIALIZED: NvmlReturn = 1;
pub const NVML_ERROR_NOT_FOUND: NvmlReturn = 6;
pub const NVML_ERROR_INSUFFICIENT_SIZE: NvmlReturn = 7;
pub const NVML_ERROR_FUNCTION_NOT_FOUND: NvmlReturn = 13;
pub const NVML_ERROR_UNKNOWN: NvmlReturn = 999;

/// Size of the buffer NVML needs for a UUID string (`NVML_DEVICE_UUID_V2_BUFFER_SIZE`).
pub const NVML_UUID_BUFFER: usize = 96;

/// `nvmlMemory_t`.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct NvmlMemory {
    pub total: u64,
    pub free: u64,
    pub used: u64,
}

/// `nvmlMemory_v2_t`; `version` must be `nvmlMemory_v2` (checked by the driver).
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct NvmlMemoryV2 {
    pub version: c_uint,
    pub total: u64,
    pub reserved: u64,
    pub free: u64,
    pub used: u64,
}

const _: () = {
    assert!(size_of::<CUuuid>() == 16);
    assert!(size_of::<NvmlMemory>() == 24);
    assert!(size_of::<NvmlMemoryV2>() == 40);
    assert!(std::mem::offset_of!(NvmlMemoryV2, total) == 8);
};

// Entry-point signatures, named after the driver symbol they describe.
pub type CuInit = unsafe extern "C" fn(flags: c_uint) -> CUresult;
pub type CuDeviceGetCount = unsafe extern "C" fn(count: *mut c_int) -> CUresult;
pub type CuDeviceGetUuid = unsafe extern "C" fn(uuid: *mut CUuuid, dev: CUdevice) -> CUresult;
pub type CuDeviceGetAttribute =
    unsafe extern "C" fn(value: *mut c_int, attribute: c_int, dev: CUdevice) -> CUresult;
pub type CuDeviceTotalMemV2 = unsafe extern "C" fn(bytes: *mut usize, dev: CUdevice) -> CUresult;
pub type CuCtxGetDevice = unsafe extern "C" fn(device: *mut CUdevice) -> CUresult;
pub type CuMemAllocV2 = unsafe extern "C" fn(dptr: *mut CUdeviceptr, bytes: usize) -> CUresult;
pub type CuMemFreeV2 = unsafe extern "C" fn(dptr: CUdeviceptr) -> CUresult;
pub type CuMemGetInfoV2 = unsafe extern "C" fn(free: *mut usize, total: *mut usize) -> CUresult;
pub type CuGetProcAddress = unsafe extern "C" fn(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
) -> CUresult;
pub type CuGetProcAddressV2 = unsafe extern "C" fn(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
    symbol_status: *mut c_int,
) -> CUresult;

pub type NvmlInitV2 = unsafe extern "C" fn() -> NvmlReturn;
pub type NvmlDeviceGetUuid =
    unsafe extern "C" fn(device: NvmlDevice, uuid: *mut c_char, length: c_uint) -> NvmlReturn;
pub type NvmlDeviceGetMemoryInfo =
    unsafe extern "C" fn(device: NvmlDevice, memory: *mut NvmlMemory) -> NvmlReturn;
pub type NvmlDeviceGetMemoryInfoV2 =
    unsafe extern "C" fn(device: NvmlDevice, memory: *mut NvmlMemoryV2) -> NvmlReturn;
/// `nvmlDeviceGetComputeRunningProcesses` (every version): the process records' layout differs
/// between versions, but a count-only query passes none.
pub type NvmlDeviceGetNumGpuCores =
    unsafe extern "C" fn(device: NvmlDevice, cores: *mut c_uint) -> NvmlReturn;
pub type NvmlDeviceGetComputeRunningProcesses =
    unsafe extern "C" fn(device: NvmlDevice, count: *mut c_uint, infos: *mut c_void) -> NvmlReturn;

/// `nvmlProcessInfo_t` as `nvmlDeviceGetComputeRunningProcesses_v2` and `_v3` write it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct NvmlProcessInfo {
    pub pid: c_uint,
    /// Bytes, or `NVML_VALUE_NOT_AVAILABLE` (all ones).
    pub used_gpu_memory: u64,
    pub gpu_instance_id: c_uint,
    pub compute_instance_id: c_uint,
}

/// What NVML writes for a figure it does not have.
pub const NVML_VALUE_NOT_AVAILABLE: u64 = u64::MAX;

pub type CUstream = *mut c_void;
pub type CUmemoryPool = *mut c_void;
pub type CUarray = *mut c_void;
pub type CUmipmappedArray = *mut c_void;
pub type CUmemGenericAllocationHandle = u64;

/// `CU_MEM_LOCATION_TYPE_DEVICE`.
pub const CU_MEM_LOCATION_TYPE_DEVICE: c_int = 1;

/// `CUmemLocation`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUmemLocation {
    pub kind: c_int,
    pub id: c_int,
}

/// `CUmemAllocationProp`; only `location` is read.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUmemAllocationProp {
    pub kind: c_int,
    pub requested_handle_types: c_int,
    pub location: CUmemLocation,
    pub win32_handle_metadata: *mut c_void,
    pub alloc_flags: [u8; 8],
}

/// `CUDA_ARRAY_DESCRIPTOR` (v2).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ArrayDescriptor {
    pub width: usize,
    pub height: usize,
    pub format: c_int,
    pub num_channels: c_uint,
}

/// `CUDA_ARRAY3D_DESCRIPTOR` (v2).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Array3dDescriptor {
    pub width: usize,
    pub height: usize,
    pub depth: usize,
    pub format: c_int,
    pub num_channels: c_uint,
    pub flags: c_uint,
}

const _: () = {
    assert!(std::mem::offset_of!(CUmemAllocationProp, location) == 8);
    assert!(size_of::<CUmemAllocationProp>() == 32);
    assert!(size_of::<ArrayDescriptor>() == 24);
    assert!(size_of::<Array3dDescriptor>() == 40);
};

pub type CuMemAllocPitchV2 = unsafe extern "C" fn(
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    element_size: c_uint,
) -> CUresult;
pub type CuMemAllocManaged =
    unsafe extern "C" fn(dptr: *mut CUdeviceptr, bytes: usize, flags: c_uint) -> CUresult;
pub type CuMemAllocAsync =
    unsafe extern "C" fn(dptr: *mut CUdeviceptr, bytes: usize, stream: CUstream) -> CUresult;
pub type CuMemAllocFromPoolAsync = unsafe extern "C" fn(
    dptr: *mut CUdeviceptr,
    bytes: usize,
    pool: CUmemoryPool,
    stream: CUstream,
) -> CUresult;
pub type CuMemFreeAsync = unsafe extern "C" fn(dptr: CUdeviceptr, stream: CUstream) -> CUresult;
pub type CuMemCreate = unsafe extern "C" fn(
    handle: *mut CUmemGenericAllocationHandle,
    size: usize,
    prop: *const CUmemAllocationProp,
    flags: u64,
) -> CUresult;
pub type CuMemRelease = unsafe extern "C" fn(handle: CUmemGenericAllocationHandle) -> CUresult;
pub type CuArrayCreateV2 =
    unsafe extern "C" fn(array: *mut CUarray, desc: *const ArrayDescriptor) -> CUresult;
pub type CuArray3dCreateV2 =
    unsafe extern "C" fn(array: *mut CUarray, desc: *const Array3dDescriptor) -> CUresult;
pub type CuArrayDestroy = unsafe extern "C" fn(array: CUarray) -> CUresult;
pub type CuMipmappedArrayCreate = unsafe extern "C" fn(
    array: *mut CUmipmappedArray,
    desc: *const Array3dDescriptor,
    levels: c_uint,
) -> CUresult;
pub type CuMipmappedArrayDestroy = unsafe extern "C" fn(array: CUmipmappedArray) -> CUresult;
pub type CuDevicePrimaryCtxRetain = unsafe extern "C" fn(ctx: *mut CUcontext, dev: CUdevice) -> CUresult;
pub type CuDevicePrimaryCtxReleaseV2 = unsafe extern "C" fn(dev: CUdevice) -> CUresult;
pub type CuCtxCreateV2 = unsafe extern "C" fn(ctx: *mut CUcontext, flags: c_uint, dev: CUdevice) -> CUresult;
pub type CuCtxCreateV3 = unsafe extern "C" fn(
    ctx: *mut CUcontext,
    params: *mut c_void,
    num_params: c_int,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult;
pub type CuCtxCreateV4 =
    unsafe extern "C" fn(ctx: *mut CUcontext, params: *mut c_void, flags: c_uint, dev: CUdevice) -> CUresult;
pub type CuCtxDestroyV2 = unsafe extern "C" fn(ctx: CUcontext) -> CUresult;
/// A green context (CUDA 12.4+): a context on a subset of the device's resources.
pub type CUgreenCtx = *mut c_void;
/// `desc` is a `CUdevResourceDesc`, an opaque handle passed on.
pub type CuGreenCtxCreate =
    unsafe extern "C" fn(ctx: *mut CUgreenCtx, desc: *mut c_void, dev: CUdevice, flags: c_uint) -> CUresult;
pub type CuGreenCtxDestroy = unsafe extern "C" fn(ctx: CUgreenCtx) -> CUresult;
pub type NvmlDeviceGetCountV2 = unsafe extern "C" fn(count: *mut c_uint) -> NvmlReturn;
pub type NvmlDeviceGetHandleByIndexV2 =
    unsafe extern "C" fn(index: c_uint, device: *mut NvmlDevice) -> NvmlReturn;

// Virtual memory mappings.
pub type CuMemMap = unsafe extern "C" fn(
    ptr: CUdeviceptr,
    size: usize,
    offset: usize,
    handle: CUmemGenericAllocationHandle,
    flags: u64,
) -> CUresult;
pub type CuMemUnmap = unsafe extern "C" fn(ptr: CUdeviceptr, size: usize) -> CUresult;
pub type CuMemRetainAllocationHandle =
    unsafe extern "C" fn(handle: *mut CUmemGenericAllocationHandle, addr: *mut c_void) -> CUresult;
/// `desc` is an array of `count` `CUmemAccessDesc`.
pub type CuMemSetAccess =
    unsafe extern "C" fn(ptr: CUdeviceptr, size: usize, desc: *const c_void, count: usize) -> CUresult;
pub type CuMemExportToShareableHandle = unsafe extern "C" fn(
    shareable: *mut c_void,
    handle: CUmemGenericAllocationHandle,
    kind: c_int,
    flags: u64,
) -> CUresult;
pub type CuMemGetAllocationPropertiesFromHandle =
    unsafe extern "C" fn(prop: *mut CUmemAllocationProp, handle: CUmemGenericAllocationHandle) -> CUresult;
/// `CU_MEM_ALLOCATION_TYPE_PINNED`: device memory (the one type `cuMemCreate` makes).
pub const CU_MEM_ALLOCATION_TYPE_PINNED: c_int = 1;

// Stream-ordered pools.
/// `CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`: bytes of device memory the pool holds (`cuuint64_t`).
pub const CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: c_int = 5;
/// `CU_MEMPOOL_ATTR_USED_MEM_CURRENT`: bytes of the pool handed out and not yet freed.
pub const CU_MEMPOOL_ATTR_USED_MEM_CURRENT: c_int = 7;
/// `CU_MEMPOOL_ATTR_RELEASE_THRESHOLD`: bytes a pool keeps before it gives memory back.
pub const CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: c_int = 4;
/// `CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH` and `_USED_MEM_HIGH`: the high-water marks of the two above.
pub const CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: c_int = 6;
pub const CU_MEMPOOL_ATTR_USED_MEM_HIGH: c_int = 8;
pub type CuDeviceGetMemPool = unsafe extern "C" fn(pool: *mut CUmemoryPool, dev: CUdevice) -> CUresult;
pub type CuMemPoolGetAttribute =
    unsafe extern "C" fn(pool: CUmemoryPool, attr: c_int, value: *mut c_void) -> CUresult;

// Graphs with memory nodes.
pub type CUgraph = *mut c_void;
pub type CUgraphNode = *mut c_void;
pub type CUgraphExec = *mut c_void;
/// `CU_GRAPH_NODE_TYPE_MEM_ALLOC`.
pub const CU_GRAPH_NODE_TYPE_MEM_ALLOC: c_int = 10;

/// `CUDA_MEM_ALLOC_NODE_PARAMS`: a `CUmemPoolProps` (88 bytes, `location` at 8), the access
/// descriptors, then the size and the address the driver chose.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MemAllocNodeParams {
    pub alloc_type: c_int,
    pub handle_types: c_int,
    pub location: CUmemLocation,
    pub pool_props_rest: [u64; 9],
    pub access_descs: *const c_void,
    pub access_desc_count: usize,
    pub bytesize: usize,
    pub dptr: CUdeviceptr,
}

const _: () = {
    assert!(std::mem::offset_of!(MemAllocNodeParams, access_descs) == 88);
    assert!(std::mem::offset_of!(MemAllocNodeParams, bytesize) == 104);
    assert!(size_of::<MemAllocNodeParams>() == 120);
};

pub type CuGraphGetNodes =
    unsafe extern "C" fn(graph: CUgraph, nodes: *mut CUgraphNode, count: *mut usize) -> CUresult;
pub type CuGraphNodeGetType = unsafe extern "C" fn(node: CUgraphNode, kind: *mut c_int) -> CUresult;
pub type CuGraphMemAllocNodeGetParams =
    unsafe extern "C" fn(node: CUgraphNode, params: *mut MemAllocNodeParams) -> CUresult;
pub type CuGraphInstantiateWithFlags =
    unsafe extern "C" fn(exec: *mut CUgraphExec, graph: CUgraph, flags: u64) -> CUresult;
/// `cuGraphInstantiate` and `cuGraphInstantiate_v2` (the pre-12.0 ABI).
pub type CuGraphInstantiateV2 = unsafe extern "C" fn(
    exec: *mut CUgraphExec,
    graph: CUgraph,
    error_node: *mut CUgraphNode,
    log: *mut c_char,
    log_size: usize,
) -> CUresult;
pub type CuGraphInstantiateWithParams =
    unsafe extern "C" fn(exec: *mut CUgraphExec, graph: CUgraph, params: *mut c_void) -> CUresult;
pub type CuGraphExecDestroy = unsafe extern "C" fn(exec: CUgraphExec) -> CUresult;

// Kernel launches and the events that time them.
pub type CUfunction = *mut c_void;
pub type CUevent = *mut c_void;
pub const CUDA_ERROR_NOT_READY: CUresult = 600;
/// `CU_STREAM_PER_THREAD`: what a NULL stream means to a `_ptsz` entry point.
pub const CU_STREAM_PER_THREAD: CUstream = 2 as CUstream;
/// `CU_STREAM_CAPTURE_STATUS_NONE`.
pub const CU_STREAM_CAPTURE_STATUS_NONE: c_int = 0;
/// `CU_STREAM_CAPTURE_MODE_RELAXED`.
pub const CU_STREAM_CAPTURE_MODE_RELAXED: c_int = 2;
/// `CU_EVENT_DEFAULT`: an event that records timing.
pub const CU_EVENT_DEFAULT: c_uint = 0;

/// `CUlaunchConfig`; only `h_stream` is read.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUlaunchConfig {
    pub grid_dim: [c_uint; 3],
    pub block_dim: [c_uint; 3],
    pub shared_mem_bytes: c_uint,
    pub h_stream: CUstream,
    pub attrs: *mut c_void,
    pub num_attrs: c_uint,
}

const _: () = {
    assert!(std::mem::offset_of!(CUlaunchConfig, h_stream) == 32);
    assert!(size_of::<CUlaunchConfig>() == 56);
};

pub type CuLaunchKernel = unsafe extern "C" fn(
    f: CUfunction,
    grid_x: c_uint,
    grid_y: c_uint,
    grid_z: c_uint,
    block_x: c_uint,
    block_y: c_uint,
    block_z: c_uint,
    shared_mem_bytes: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult;
pub type CuLaunchCooperativeKernel = unsafe extern "C" fn(
    f: CUfunction,
    grid_x: c_uint,
    grid_y: c_uint,
    grid_z: c_uint,
    block_x: c_uint,
    block_y: c_uint,
    block_z: c_uint,
    shared_mem_bytes: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
) -> CUresult;
pub type CuLaunchKernelEx = unsafe extern "C" fn(
    config: *const CUlaunchConfig,
    f: CUfunction,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult;
pub type CuGraphLaunch = unsafe extern "C" fn(exec: CUgraphExec, stream: CUstream) -> CUresult;
pub type CuCtxGetCurrent = unsafe extern "C" fn(ctx: *mut CUcontext) -> CUresult;
pub type CuCtxGetExecAffinity =
    unsafe extern "C" fn(affinity: *mut CUexecAffinityParam, kind: c_int) -> CUresult;
pub type CuEventCreate = unsafe extern "C" fn(event: *mut CUevent, flags: c_uint) -> CUresult;
pub type CuEventRecord = unsafe extern "C" fn(event: CUevent, stream: CUstream) -> CUresult;
pub type CuEventQuery = unsafe extern "C" fn(event: CUevent) -> CUresult;
pub type CuEventElapsedTime =
    unsafe extern "C" fn(milliseconds: *mut f32, start: CUevent, end: CUevent) -> CUresult;
pub type CuEventDestroyV2 = unsafe extern "C" fn(event: CUevent) -> CUresult;
/// `CUmem_advise` values used for spillable memory.
pub const CU_MEM_ADVISE_SET_PREFERRED_LOCATION: c_int = 3;
/// `CU_MEM_ATTACH_GLOBAL`: managed memory any stream may touch.
pub const CU_MEM_ATTACH_GLOBAL: c_uint = 1;
/// `cuMemAdvise` (the CUDA 8 ABI, a device ordinal) and `cuMemAdvise_v2` (a location).
pub type CuMemAdvise =
    unsafe extern "C" fn(ptr: CUdeviceptr, count: usize, advice: c_int, device: CUdevice) -> CUresult;
pub type CuMemAdviseV2 =
    unsafe extern "C" fn(ptr: CUdeviceptr, count: usize, advice: c_int, location: CUmemLocation) -> CUresult;
/// `cuMemPrefetchAsync` (the CUDA 8 ABI) and `cuMemPrefetchAsync_v2` (a location and flags).
pub type CuMemPrefetchAsync =
    unsafe extern "C" fn(ptr: CUdeviceptr, count: usize, device: CUdevice, stream: CUstream) -> CUresult;
pub type CuMemPrefetchAsyncV2 = unsafe extern "C" fn(
    ptr: CUdeviceptr,
    count: usize,
    location: CUmemLocation,
    flags: c_uint,
    stream: CUstream,
) -> CUresult;
pub type CuStreamIsCapturing = unsafe extern "C" fn(stream: CUstream, status: *mut c_int) -> CUresult;
pub type CuThreadExchangeStreamCaptureMode = unsafe extern "C" fn(mode: *mut c_int) -> CUresult;
pub type CuPointerGetAttribute =
    unsafe extern "C" fn(data: *mut c_void, attribute: c_int, ptr: CUdeviceptr) -> CUresult;
pub type CuPointerGetAttributes = unsafe extern "C" fn(
    count: c_uint,
    attributes: *const c_int,
    data: *const *mut c_void,
    ptr: CUdeviceptr,
) -> CUresult;
pub type CuMemPoolSetAttribute =
    unsafe extern "C" fn(pool: CUmemoryPool, attr: c_int, value: *mut c_void) -> CUresult;
pub type CuMemPoolTrimTo = unsafe extern "C" fn(pool: CUmemoryPool, keep: usize) -> CUresult;
pub type CuMemGetAddressRange =
    unsafe extern "C" fn(base: *mut CUdeviceptr, size: *mut usize, ptr: CUdeviceptr) -> CUresult;
/// `CU_POINTER_ATTRIBUTE_RANGE_START_ADDR` (a `CUdeviceptr`) and `_RANGE_SIZE` (a `size_t`): the
/// allocation an address lies in.
pub const CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: c_int = 11;
pub const CU_POINTER_ATTRIBUTE_RANGE_SIZE: c_int = 12;

/// `CU_POINTER_ATTRIBUTE_MEMORY_TYPE`: the `CUmemorytype` of an address.
pub const CU_POINTER_ATTRIBUTE_MEMORY_TYPE: c_int = 2;

/// `CUmemorytype`: where one side of a copy lives.
pub const CU_MEMORYTYPE_HOST: c_uint = 1;
pub const CU_MEMORYTYPE_DEVICE: c_uint = 2;
pub const CU_MEMORYTYPE_ARRAY: c_uint = 3;
/// An address of unified addressing: host or device, the driver knows which.
pub const CU_MEMORYTYPE_UNIFIED: c_uint = 4;

/// `CUDA_MEMCPY2D` (`_v2` layout, LP64), as far as a copy's size and sides go; the fields we never
/// read are kept for the layout.
#[repr(C)]
pub struct CudaMemcpy2D {
    pub src_x_in_bytes: usize,
    pub src_y: usize,
    pub src_memory_type: c_uint,
    pub src_host: *const c_void,
    pub src_device: CUdeviceptr,
    pub src_array: CUarray,
    pub src_pitch: usize,
    pub dst_x_in_bytes: usize,
    pub dst_y: usize,
    pub dst_memory_type: c_uint,
    pub dst_host: *mut c_void,
    pub dst_device: CUdeviceptr,
    pub dst_array: CUarray,
    pub dst_pitch: usize,
    pub width_in_bytes: usize,
    pub height: usize,
}

const _: () = assert!(std::mem::size_of::<CudaMemcpy2D>() == 128);
const _: () = assert!(std::mem::offset_of!(CudaMemcpy2D, src_memory_type) == 16);
const _: () = assert!(std::mem::offset_of!(CudaMemcpy2D, src_device) == 32);
const _: () = assert!(std::mem::offset_of!(CudaMemcpy2D, dst_memory_type) == 72);
const _: () = assert!(std::mem::offset_of!(CudaMemcpy2D, dst_device) == 88);
const _: () = assert!(std::mem::offset_of!(CudaMemcpy2D, width_in_bytes) == 112);

/// `CUDA_MEMCPY3D` (`_v2` layout, LP64). `CUDA_MEMCPY3D_PEER` is the same with each side's
/// context where the reserved pointers are, so both are read through this.
#[repr(C)]
pub struct CudaMemcpy3D {
    pub src_x_in_bytes: usize,
    pub src_y: usize,
    pub src_z: usize,
    pub src_lod: usize,
    pub src_memory_type: c_uint,
    pub src_host: *const c_void,
    pub src_device: CUdeviceptr,
    pub src_array: CUarray,
    pub src_context: *mut c_void,
    pub src_pitch: usize,
    pub src_height: usize,
    pub dst_x_in_bytes: usize,
    pub dst_y: usize,
    pub dst_z: usize,
    pub dst_lod: usize,
    pub dst_memory_type: c_uint,
    pub dst_host: *mut c_void,
    pub dst_device: CUdeviceptr,
    pub dst_array: CUarray,
    pub dst_context: *mut c_void,
    pub dst_pitch: usize,
    pub dst_height: usize,
    pub width_in_bytes: usize,
    pub height: usize,
    pub depth: usize,
}

const _: () = assert!(std::mem::size_of::<CudaMemcpy3D>() == 200);
const _: () = assert!(std::mem::offset_of!(CudaMemcpy3D, src_memory_type) == 32);
const _: () = assert!(std::mem::offset_of!(CudaMemcpy3D, src_device) == 48);
const _: () = assert!(std::mem::offset_of!(CudaMemcpy3D, dst_memory_type) == 120);
const _: () = assert!(std::mem::offset_of!(CudaMemcpy3D, dst_device) == 136);
const _: () = assert!(std::mem::offset_of!(CudaMemcpy3D, width_in_bytes) == 176);
const _: () = assert!(std::mem::offset_of!(CudaMemcpy3D, depth) == 192);
