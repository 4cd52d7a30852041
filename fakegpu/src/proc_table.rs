//! The version table behind `cuGetProcAddress`: which exported variant answers a name at a CUDA version.

use std::ffi::c_void;

use crate::cuda::arrays::*;
use crate::cuda::contexts::*;
use crate::cuda::copies::*;
use crate::cuda::events::*;
use crate::cuda::graphs::*;
use crate::cuda::host::*;
use crate::cuda::ipc::*;
use crate::cuda::launches::*;
use crate::cuda::memory::*;
use crate::cuda::modules::*;
use crate::cuda::pools::*;
use crate::cuda::vmm::*;
use crate::cuda::*;

/// Which default-stream mode a variant serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stream {
    /// The plain entry point, served for every mode unless a per-thread variant exists.
    Any,
    /// A `_ptsz`/`_ptds` entry point, served only for `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`.
    PerThread,
}

/// An exported function's address.
struct Entry(*const c_void);

// SAFETY: the pointer is the address of code in this library; it is never written or dereferenced here.
unsafe impl Sync for Entry {}

struct Variant {
    base: &'static str,
    since: i32,
    stream: Stream,
    entry: Entry,
}

/// `variant!("cuFoo", 12000, cuFoo_v2)`, or `variant!("cuFoo", 7000, per_thread cuFoo_ptsz)`.
macro_rules! variant {
    ($base:literal, $since:literal, $function:ident) => {
        Variant { base: $base, since: $since, stream: Stream::Any, entry: Entry($function as *const c_void) }
    };
    ($base:literal, $since:literal, per_thread $function:ident) => {
        Variant {
            base: $base,
            since: $since,
            stream: Stream::PerThread,
            entry: Entry($function as *const c_void),
        }
    };
}

/// Every name `cuGetProcAddress` knows: one line per exported variant, with the CUDA version that
/// introduced it.
static VARIANTS: &[Variant] = &[
    // Initialisation, devices, lookup.
    variant!("cuInit", 2000, cuInit),
    variant!("cuDriverGetVersion", 2020, cuDriverGetVersion),
    variant!("cuDeviceGet", 2000, cuDeviceGet),
    variant!("cuDeviceGetCount", 2000, cuDeviceGetCount),
    variant!("cuDeviceGetName", 2000, cuDeviceGetName),
    variant!("cuDeviceGetAttribute", 2000, cuDeviceGetAttribute),
    variant!("cuDeviceGetUuid", 9020, cuDeviceGetUuid),
    variant!("cuDeviceGetUuid", 11040, cuDeviceGetUuid_v2),
    variant!("cuDeviceTotalMem", 2000, cuDeviceTotalMem),
    variant!("cuDeviceTotalMem", 3020, cuDeviceTotalMem_v2),
    variant!("cuGetErrorString", 6000, cuGetErrorString),
    variant!("cuGetErrorName", 6000, cuGetErrorName),
    variant!("cuGetProcAddress", 11030, cuGetProcAddress),
    variant!("cuGetProcAddress", 12000, cuGetProcAddress_v2),
    // Contexts and streams.
    variant!("cuDevicePrimaryCtxRetain", 7000, cuDevicePrimaryCtxRetain),
    variant!("cuDevicePrimaryCtxRelease", 7000, cuDevicePrimaryCtxRelease),
    variant!("cuDevicePrimaryCtxRelease", 11000, cuDevicePrimaryCtxRelease_v2),
    variant!("cuCtxCreate", 2000, cuCtxCreate),
    variant!("cuCtxCreate", 3020, cuCtxCreate_v2),
    variant!("cuCtxCreate", 11040, cuCtxCreate_v3),
    variant!("cuCtxCreate", 12050, cuCtxCreate_v4),
    variant!("cuCtxDestroy", 4000, cuCtxDestroy_v2),
    variant!("cuGreenCtxCreate", 12040, cuGreenCtxCreate),
    variant!("cuGreenCtxDestroy", 12040, cuGreenCtxDestroy),
    variant!("cuCtxPushCurrent", 4000, cuCtxPushCurrent_v2),
    variant!("cuCtxPopCurrent", 4000, cuCtxPopCurrent_v2),
    variant!("cuCtxSetCurrent", 4000, cuCtxSetCurrent),
    variant!("cuCtxGetCurrent", 4000, cuCtxGetCurrent),
    variant!("cuCtxGetDevice", 2000, cuCtxGetDevice),
    variant!("cuCtxSynchronize", 2000, cuCtxSynchronize),
    variant!("cuCtxSynchronize", 13000, cuCtxSynchronize_v2),
    variant!("cuStreamCreate", 2000, cuStreamCreate),
    variant!("cuStreamDestroy", 4000, cuStreamDestroy_v2),
    variant!("cuStreamSynchronize", 2000, cuStreamSynchronize),
    variant!("cuStreamQuery", 2000, cuStreamQuery),
    variant!("cuStreamQuery", 7000, per_thread cuStreamQuery_ptsz),
    variant!("cuStreamIsCapturing", 10000, cuStreamIsCapturing),
    variant!("cuStreamIsCapturing", 10000, per_thread cuStreamIsCapturing_ptsz),
    // Kernel launches and events. The per-thread default stream came with CUDA 7.0.
    variant!("cuLaunchKernel", 4000, cuLaunchKernel),
    variant!("cuLaunchKernel", 7000, per_thread cuLaunchKernel_ptsz),
    variant!("cuLaunchCooperativeKernel", 9000, cuLaunchCooperativeKernel),
    variant!("cuLaunchCooperativeKernel", 9000, per_thread cuLaunchCooperativeKernel_ptsz),
    variant!("cuLaunchKernelEx", 11060, cuLaunchKernelEx),
    variant!("cuLaunchKernelEx", 11060, per_thread cuLaunchKernelEx_ptsz),
    variant!("cuEventCreate", 2000, cuEventCreate),
    variant!("cuEventRecord", 2000, cuEventRecord),
    variant!("cuEventRecord", 7000, per_thread cuEventRecord_ptsz),
    variant!("cuEventQuery", 2000, cuEventQuery),
    variant!("cuEventSynchronize", 2000, cuEventSynchronize),
    variant!("cuEventElapsedTime", 2000, cuEventElapsedTime),
    variant!("cuEventElapsedTime", 12080, cuEventElapsedTime_v2),
    variant!("cuEventDestroy", 4000, cuEventDestroy_v2),
    // Modules and libraries.
    variant!("cuModuleLoad", 2000, cuModuleLoad),
    variant!("cuModuleLoadData", 2000, cuModuleLoadData),
    variant!("cuModuleLoadDataEx", 2010, cuModuleLoadDataEx),
    variant!("cuModuleUnload", 2000, cuModuleUnload),
    variant!("cuLibraryLoadData", 12000, cuLibraryLoadData),
    variant!("cuLibraryUnload", 12000, cuLibraryUnload),
    // Linear memory.
    variant!("cuMemAlloc", 2000, cuMemAlloc),
    variant!("cuMemAlloc", 3020, cuMemAlloc_v2),
    variant!("cuMemAllocPitch", 2000, cuMemAllocPitch),
    variant!("cuMemAllocPitch", 3020, cuMemAllocPitch_v2),
    variant!("cuMemAllocManaged", 6000, cuMemAllocManaged),
    variant!("cuMemFree", 2000, cuMemFree),
    variant!("cuMemFree", 3020, cuMemFree_v2),
    variant!("cuMemGetInfo", 2000, cuMemGetInfo),
    variant!("cuMemGetInfo", 3020, cuMemGetInfo_v2),
    variant!("cuMemGetAddressRange", 3020, cuMemGetAddressRange_v2),
    // Stream-ordered allocation and pools.
    variant!("cuMemAllocAsync", 11020, cuMemAllocAsync),
    variant!("cuMemAllocAsync", 11020, per_thread cuMemAllocAsync_ptsz),
    variant!("cuMemAllocFromPoolAsync", 11020, cuMemAllocFromPoolAsync),
    variant!("cuMemAllocFromPoolAsync", 11020, per_thread cuMemAllocFromPoolAsync_ptsz),
    variant!("cuMemFreeAsync", 11020, cuMemFreeAsync),
    variant!("cuMemFreeAsync", 11020, per_thread cuMemFreeAsync_ptsz),
    variant!("cuDeviceGetDefaultMemPool", 11020, cuDeviceGetDefaultMemPool),
    variant!("cuDeviceGetMemPool", 11020, cuDeviceGetMemPool),
    variant!("cuMemPoolCreate", 11020, cuMemPoolCreate),
    variant!("cuMemPoolDestroy", 11020, cuMemPoolDestroy),
    variant!("cuMemPoolSetAttribute", 11020, cuMemPoolSetAttribute),
    variant!("cuMemPoolGetAttribute", 11020, cuMemPoolGetAttribute),
    variant!("cuMemPoolTrimTo", 11020, cuMemPoolTrimTo),
    // Virtual memory management.
    variant!("cuMemGetAllocationGranularity", 10020, cuMemGetAllocationGranularity),
    variant!("cuMemCreate", 10020, cuMemCreate),
    variant!("cuMemRelease", 10020, cuMemRelease),
    variant!("cuMemRetainAllocationHandle", 11000, cuMemRetainAllocationHandle),
    variant!("cuMemAddressReserve", 10020, cuMemAddressReserve),
    variant!("cuMemAddressFree", 10020, cuMemAddressFree),
    variant!("cuMemMap", 10020, cuMemMap),
    variant!("cuMemUnmap", 10020, cuMemUnmap),
    variant!("cuMemSetAccess", 10020, cuMemSetAccess),
    // Graphs and graph memory.
    variant!("cuGraphCreate", 10000, cuGraphCreate),
    variant!("cuGraphDestroy", 10000, cuGraphDestroy),
    variant!("cuGraphAddEmptyNode", 10000, cuGraphAddEmptyNode),
    variant!("cuGraphAddKernelNode", 10000, cuGraphAddKernelNode),
    variant!("cuGraphAddKernelNode", 12000, cuGraphAddKernelNode_v2),
    variant!("cuGraphAddMemAllocNode", 11040, cuGraphAddMemAllocNode),
    variant!("cuGraphAddMemFreeNode", 11040, cuGraphAddMemFreeNode),
    variant!("cuGraphGetNodes", 10000, cuGraphGetNodes),
    variant!("cuGraphNodeGetType", 10000, cuGraphNodeGetType),
    variant!("cuGraphMemAllocNodeGetParams", 11040, cuGraphMemAllocNodeGetParams),
    variant!("cuGraphInstantiate", 10000, cuGraphInstantiate),
    variant!("cuGraphInstantiate", 11000, cuGraphInstantiate_v2),
    variant!("cuGraphInstantiateWithFlags", 11040, cuGraphInstantiateWithFlags),
    variant!("cuGraphInstantiateWithParams", 12000, cuGraphInstantiateWithParams),
    variant!("cuGraphInstantiateWithParams", 12000, per_thread cuGraphInstantiateWithParams_ptsz),
    variant!("cuGraphLaunch", 10000, cuGraphLaunch),
    variant!("cuGraphLaunch", 10000, per_thread cuGraphLaunch_ptsz),
    variant!("cuGraphExecDestroy", 10000, cuGraphExecDestroy),
    variant!("cuDeviceGetGraphMemAttribute", 11040, cuDeviceGetGraphMemAttribute),
    variant!("cuDeviceGraphMemTrim", 11040, cuDeviceGraphMemTrim),
    // Arrays.
    variant!("cuArrayCreate", 2000, cuArrayCreate),
    variant!("cuArrayCreate", 3020, cuArrayCreate_v2),
    variant!("cuArray3DCreate", 3020, cuArray3DCreate_v2),
    variant!("cuArrayDestroy", 2000, cuArrayDestroy),
    variant!("cuMipmappedArrayCreate", 5000, cuMipmappedArrayCreate),
    variant!("cuMipmappedArrayDestroy", 5000, cuMipmappedArrayDestroy),
    // Copies and memsets. The per-thread default stream came with CUDA 7.0.
    variant!("cuMemcpy", 4000, cuMemcpy),
    variant!("cuMemcpy", 7000, per_thread cuMemcpy_ptds),
    variant!("cuMemcpyAsync", 4000, cuMemcpyAsync),
    variant!("cuMemcpyAsync", 7000, per_thread cuMemcpyAsync_ptsz),
    variant!("cuMemcpyPeer", 4000, cuMemcpyPeer),
    variant!("cuMemcpyPeer", 7000, per_thread cuMemcpyPeer_ptds),
    variant!("cuMemcpyPeerAsync", 4000, cuMemcpyPeerAsync),
    variant!("cuMemcpyPeerAsync", 7000, per_thread cuMemcpyPeerAsync_ptsz),
    variant!("cuMemcpyDtoD", 3020, cuMemcpyDtoD_v2),
    variant!("cuMemcpyDtoD", 7000, per_thread cuMemcpyDtoD_v2_ptds),
    variant!("cuMemcpyDtoA", 3020, cuMemcpyDtoA_v2),
    variant!("cuMemcpyDtoA", 7000, per_thread cuMemcpyDtoA_v2_ptds),
    variant!("cuMemcpyAtoD", 3020, cuMemcpyAtoD_v2),
    variant!("cuMemcpyAtoD", 7000, per_thread cuMemcpyAtoD_v2_ptds),
    variant!("cuMemcpyAtoA", 3020, cuMemcpyAtoA_v2),
    variant!("cuMemcpyAtoA", 7000, per_thread cuMemcpyAtoA_v2_ptds),
    variant!("cuMemcpyHtoD", 3020, cuMemcpyHtoD_v2),
    variant!("cuMemcpyHtoD", 7000, per_thread cuMemcpyHtoD_v2_ptds),
    variant!("cuMemcpyDtoH", 3020, cuMemcpyDtoH_v2),
    variant!("cuMemcpyDtoH", 7000, per_thread cuMemcpyDtoH_v2_ptds),
    variant!("cuMemcpyHtoA", 3020, cuMemcpyHtoA_v2),
    variant!("cuMemcpyHtoA", 7000, per_thread cuMemcpyHtoA_v2_ptds),
    variant!("cuMemcpyAtoH", 3020, cuMemcpyAtoH_v2),
    variant!("cuMemcpyAtoH", 7000, per_thread cuMemcpyAtoH_v2_ptds),
    variant!("cuMemcpy2D", 3020, cuMemcpy2D_v2),
    variant!("cuMemcpy2D", 7000, per_thread cuMemcpy2D_v2_ptds),
    variant!("cuMemcpy2DUnaligned", 3020, cuMemcpy2DUnaligned_v2),
    variant!("cuMemcpy2DUnaligned", 7000, per_thread cuMemcpy2DUnaligned_v2_ptds),
    variant!("cuMemcpy3D", 3020, cuMemcpy3D_v2),
    variant!("cuMemcpy3D", 7000, per_thread cuMemcpy3D_v2_ptds),
    variant!("cuMemcpyDtoDAsync", 3020, cuMemcpyDtoDAsync_v2),
    variant!("cuMemcpyDtoDAsync", 7000, per_thread cuMemcpyDtoDAsync_v2_ptsz),
    variant!("cuMemcpyHtoDAsync", 3020, cuMemcpyHtoDAsync_v2),
    variant!("cuMemcpyHtoDAsync", 7000, per_thread cuMemcpyHtoDAsync_v2_ptsz),
    variant!("cuMemcpyDtoHAsync", 3020, cuMemcpyDtoHAsync_v2),
    variant!("cuMemcpyDtoHAsync", 7000, per_thread cuMemcpyDtoHAsync_v2_ptsz),
    variant!("cuMemcpyHtoAAsync", 3020, cuMemcpyHtoAAsync_v2),
    variant!("cuMemcpyHtoAAsync", 7000, per_thread cuMemcpyHtoAAsync_v2_ptsz),
    variant!("cuMemcpyAtoHAsync", 3020, cuMemcpyAtoHAsync_v2),
    variant!("cuMemcpyAtoHAsync", 7000, per_thread cuMemcpyAtoHAsync_v2_ptsz),
    variant!("cuMemcpy2DAsync", 3020, cuMemcpy2DAsync_v2),
    variant!("cuMemcpy2DAsync", 7000, per_thread cuMemcpy2DAsync_v2_ptsz),
    variant!("cuMemcpy3DAsync", 3020, cuMemcpy3DAsync_v2),
    variant!("cuMemcpy3DAsync", 7000, per_thread cuMemcpy3DAsync_v2_ptsz),
    variant!("cuMemcpy3DPeer", 4000, cuMemcpy3DPeer),
    variant!("cuMemcpy3DPeer", 7000, per_thread cuMemcpy3DPeer_ptds),
    variant!("cuMemcpy3DPeerAsync", 4000, cuMemcpy3DPeerAsync),
    variant!("cuMemcpy3DPeerAsync", 7000, per_thread cuMemcpy3DPeerAsync_ptsz),
    variant!("cuMemsetD8", 3020, cuMemsetD8_v2),
    variant!("cuMemsetD8", 7000, per_thread cuMemsetD8_v2_ptds),
    variant!("cuMemsetD8Async", 3020, cuMemsetD8Async),
    variant!("cuMemsetD8Async", 7000, per_thread cuMemsetD8Async_ptsz),
    variant!("cuMemsetD16", 3020, cuMemsetD16_v2),
    variant!("cuMemsetD16", 7000, per_thread cuMemsetD16_v2_ptds),
    variant!("cuMemsetD16Async", 3020, cuMemsetD16Async),
    variant!("cuMemsetD16Async", 7000, per_thread cuMemsetD16Async_ptsz),
    variant!("cuMemsetD32", 3020, cuMemsetD32_v2),
    variant!("cuMemsetD32", 7000, per_thread cuMemsetD32_v2_ptds),
    variant!("cuMemsetD32Async", 3020, cuMemsetD32Async),
    variant!("cuMemsetD32Async", 7000, per_thread cuMemsetD32Async_ptsz),
    variant!("cuMemsetD2D8", 3020, cuMemsetD2D8_v2),
    variant!("cuMemsetD2D8", 7000, per_thread cuMemsetD2D8_v2_ptds),
    variant!("cuMemsetD2D8Async", 3020, cuMemsetD2D8Async),
    variant!("cuMemsetD2D8Async", 7000, per_thread cuMemsetD2D8Async_ptsz),
    variant!("cuMemsetD2D16", 3020, cuMemsetD2D16_v2),
    variant!("cuMemsetD2D16", 7000, per_thread cuMemsetD2D16_v2_ptds),
    variant!("cuMemsetD2D16Async", 3020, cuMemsetD2D16Async),
    variant!("cuMemsetD2D16Async", 7000, per_thread cuMemsetD2D16Async_ptsz),
    variant!("cuMemsetD2D32", 3020, cuMemsetD2D32_v2),
    variant!("cuMemsetD2D32", 7000, per_thread cuMemsetD2D32_v2_ptds),
    variant!("cuMemsetD2D32Async", 3020, cuMemsetD2D32Async),
    variant!("cuMemsetD2D32Async", 7000, per_thread cuMemsetD2D32Async_ptsz),
    variant!("cuPointerGetAttribute", 4000, cuPointerGetAttribute),
    variant!("cuPointerGetAttributes", 7000, cuPointerGetAttributes),
    // Host memory.
    variant!("cuMemHostAlloc", 2020, cuMemHostAlloc),
    variant!("cuMemAllocHost", 3020, cuMemAllocHost_v2),
    variant!("cuMemFreeHost", 2000, cuMemFreeHost),
    variant!("cuMemHostRegister", 6050, cuMemHostRegister_v2),
    variant!("cuMemHostUnregister", 4000, cuMemHostUnregister),
    // IPC.
    variant!("cuIpcGetMemHandle", 4010, cuIpcGetMemHandle),
    variant!("cuIpcOpenMemHandle", 11000, cuIpcOpenMemHandle_v2),
    variant!("cuIpcCloseMemHandle", 4010, cuIpcCloseMemHandle),
];

/// The answer to one query.
#[derive(Debug, PartialEq, Eq)]
pub enum Lookup {
    Found(*const c_void),
    /// Known name, but every variant is newer than the requested version.
    VersionNotSufficient,
    SymbolNotFound,
}

/// Picks the newest variant of `base` introduced at or before `version`, preferring a per-thread
/// variant when `per_thread` is set.
pub fn lookup(base: &[u8], version: i32, per_thread: bool) -> Lookup {
    let rank = |v: &Variant| (v.stream == Stream::PerThread, v.since);
    let mut known = false;
    let mut best: Option<&Variant> = None;
    for variant in VARIANTS.iter().filter(|v| v.base.as_bytes() == base) {
        known = true;
        let serves_mode = per_thread || variant.stream == Stream::Any;
        if variant.since <= version && serves_mode && best.is_none_or(|b| rank(variant) > rank(b)) {
            best = Some(variant);
        }
    }
    match best {
        Some(variant) => Lookup::Found(variant.entry.0),
        None if known => Lookup::VersionNotSufficient,
        None => Lookup::SymbolNotFound,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_newest_variant_not_newer_than_version() {
        assert_eq!(lookup(b"cuMemAlloc", 3020, false), Lookup::Found(cuMemAlloc_v2 as *const c_void));
        assert_eq!(lookup(b"cuMemAlloc", 3010, true), Lookup::Found(cuMemAlloc as *const c_void));
        assert_eq!(
            lookup(b"cuDeviceGetUuid", 11040, false),
            Lookup::Found(cuDeviceGetUuid_v2 as *const c_void)
        );
        assert_eq!(lookup(b"cuGetProcAddress", 11000, false), Lookup::VersionNotSufficient);
        assert_eq!(lookup(b"cuMemAlloc_v2", 13000, false), Lookup::SymbolNotFound);
        assert_eq!(lookup(b"cuNope", 13000, false), Lookup::SymbolNotFound);
    }

    #[test]
    fn per_thread_variants_win_only_with_the_flag() {
        let plain = cuMemAllocAsync as *const c_void;
        let per_thread = cuMemAllocAsync_ptsz as *const c_void;
        assert_ne!(plain, per_thread);
        assert_eq!(lookup(b"cuMemAllocAsync", 12000, false), Lookup::Found(plain));
        assert_eq!(lookup(b"cuMemAllocAsync", 12000, true), Lookup::Found(per_thread));
        assert_eq!(lookup(b"cuMemAllocAsync", 11010, true), Lookup::VersionNotSufficient);
        assert_eq!(
            lookup(b"cuMemAllocPitch", 13000, true),
            Lookup::Found(cuMemAllocPitch_v2 as *const c_void)
        );
        assert_eq!(lookup(b"cuCtxCreate", 12000, false), Lookup::Found(cuCtxCreate_v3 as *const c_void));
        assert_eq!(lookup(b"cuGraphLaunch", 10000, true), Lookup::Found(cuGraphLaunch_ptsz as *const c_void));
        assert_eq!(lookup(b"cuLaunchKernel", 6050, true), Lookup::Found(cuLaunchKernel as *const c_void));
        assert_eq!(
            lookup(b"cuLaunchKernel", 7000, true),
            Lookup::Found(cuLaunchKernel_ptsz as *const c_void)
        );
        assert_eq!(
            lookup(b"cuEventElapsedTime", 12080, true),
            Lookup::Found(cuEventElapsedTime_v2 as *const c_void)
        );
        assert_eq!(
            lookup(b"cuGraphInstantiate", 13000, false),
            Lookup::Found(cuGraphInstantiate_v2 as *const c_void),
            "CUDA 12 headers call cuGraphInstantiateWithFlags, a name of its own"
        );
    }

    #[test]
    fn copies_and_memsets_resolve_to_their_exact_variants() {
        assert_eq!(lookup(b"cuMemcpyDtoD", 3020, false), Lookup::Found(cuMemcpyDtoD_v2 as *const c_void));
        assert_eq!(
            lookup(b"cuMemcpyDtoD", 12000, true),
            Lookup::Found(cuMemcpyDtoD_v2_ptds as *const c_void)
        );
        assert_eq!(lookup(b"cuMemcpyDtoD", 3010, false), Lookup::VersionNotSufficient);
        assert_eq!(
            lookup(b"cuMemsetD8Async", 12000, true),
            Lookup::Found(cuMemsetD8Async_ptsz as *const c_void)
        );
        assert_eq!(
            lookup(b"cuMemcpy3DAsync", 12000, false),
            Lookup::Found(cuMemcpy3DAsync_v2 as *const c_void)
        );
        assert_eq!(lookup(b"cuMemcpy", 6050, true), Lookup::Found(cuMemcpy as *const c_void));
    }

    /// Each export appears once, and no two exports share an address (which `cuGetProcAddress` callers
    /// such as libvgpu use to tell variants apart).
    #[test]
    fn every_variant_has_its_own_address() {
        let mut addresses: Vec<usize> = VARIANTS.iter().map(|v| v.entry.0 as usize).collect();
        addresses.sort_unstable();
        let count = addresses.len();
        addresses.dedup();
        assert_eq!(addresses.len(), count);
    }
}
