//! Every symbol libvgpu exports. Each is a thin shim: it converts arguments, calls a hook in safe
//! Rust, and converts the result back. No panic crosses into C: a panic becomes an error code.
//!
//! To hook a new entry point: add its signature to `driver::sys`, its logic under `hooks`, a shim
//! here and a line in [`hooks`].

#![allow(non_snake_case)]

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::OnceLock;

use crate::driver::{self, loader, sys::*};
use crate::error::HookError;
use crate::hooks::context::{self, CtxCreate};
use crate::hooks::launch::{self, DefaultStream};
use crate::hooks::symbols::{self, Hook};
use crate::hooks::{arrays, graphs, init, memory, nvml, pools, vmm};
use crate::runtime::{self, Runtime};

/// The hooks `dlsym` and `cuGetProcAddress` may hand out, by the driver symbol each replaces. Built
/// once: `dlsym` consults it on every lookup of a driver name. The launch hooks are in it only when
/// a device has a compute share, or memory overcommit may apply (a launch after an idle spell
/// migrates spillable memory back): otherwise launches reach the driver without passing through us.
fn hooks() -> &'static [Hook] {
    static HOOKS: OnceLock<Vec<Hook>> = OnceLock::new();
    if let Some(hooks) = HOOKS.get() {
        return hooks;
    }
    match runtime::get() {
        Ok(runtime) => HOOKS.get_or_init(|| {
            let mut hooks = memory_hooks().to_vec();
            let may_swap = runtime.config.may_overcommit() && runtime.config.any_memory_limit();
            if runtime.compute.is_none() && may_swap {
                hooks.extend(launch_hooks());
            }
            // Every call that touches device memory passes the swap gate (docs/overcommit.md),
            // and the driver's answers about swappable memory are the allocation's.
            if may_swap {
                hooks.extend(copies::host_hooks());
                hooks.extend(waits::wait_hooks());
                hooks.extend(swap_hooks());
            }
            let shared = runtime.compute.as_ref().is_some_and(|limiter| limiter.any_share());
            if may_swap || shared {
                hooks.extend(copies::device_hooks());
            }
            // A priority alone takes part in the monitor's protocol through launches; copies are
            // paced only under a share (above).
            if runtime.compute.is_some() {
                hooks.extend(launch_hooks());
            }
            hooks
        }),
        // Asked while this thread sets libvgpu up: answer without the launch hooks, decide later.
        Err(_) => {
            static EARLY: OnceLock<[Hook; 44]> = OnceLock::new();
            EARLY.get_or_init(memory_hooks)
        }
    }
}

macro_rules! hook {
    ($f:ident) => {
        Hook {
            name: {
                const NAME: &std::ffi::CStr =
                    match std::ffi::CStr::from_bytes_with_nul(concat!(stringify!($f), "\0").as_bytes()) {
                        Ok(name) => name,
                        Err(_) => panic!("symbol name with NUL"),
                    };
                NAME
            },
            address: $f as *const () as usize,
        }
    };
}

mod copies;
mod waits;

fn launch_hooks() -> [Hook; 8] {
    [
        hook!(cuLaunchKernel),
        hook!(cuLaunchKernel_ptsz),
        hook!(cuLaunchCooperativeKernel),
        hook!(cuLaunchCooperativeKernel_ptsz),
        hook!(cuLaunchKernelEx),
        hook!(cuLaunchKernelEx_ptsz),
        hook!(cuGraphLaunch),
        hook!(cuGraphLaunch_ptsz),
    ]
}

fn memory_hooks() -> [Hook; 44] {
    [
        hook!(cuInit),
        hook!(cuMemAlloc_v2),
        hook!(cuMemFree_v2),
        hook!(cuMemGetInfo_v2),
        hook!(cuDeviceTotalMem_v2),
        hook!(cuGetProcAddress),
        hook!(cuGetProcAddress_v2),
        hook!(cuMemAllocPitch_v2),
        hook!(cuMemAllocManaged),
        hook!(cuMemAllocAsync),
        hook!(cuMemAllocAsync_ptsz),
        hook!(cuMemAllocFromPoolAsync),
        hook!(cuMemAllocFromPoolAsync_ptsz),
        hook!(cuMemFreeAsync),
        hook!(cuMemFreeAsync_ptsz),
        hook!(cuMemCreate),
        hook!(cuMemRelease),
        hook!(cuMemMap),
        hook!(cuMemUnmap),
        hook!(cuMemRetainAllocationHandle),
        hook!(cuMemSetAccess),
        hook!(cuMemExportToShareableHandle),
        hook!(cuMemGetAllocationPropertiesFromHandle),
        hook!(cuGraphInstantiate),
        hook!(cuGraphInstantiate_v2),
        hook!(cuGraphInstantiateWithFlags),
        hook!(cuGraphInstantiateWithParams),
        hook!(cuGraphInstantiateWithParams_ptsz),
        hook!(cuGraphExecDestroy),
        hook!(cuArrayCreate_v2),
        hook!(cuArray3DCreate_v2),
        hook!(cuArrayDestroy),
        hook!(cuMipmappedArrayCreate),
        hook!(cuMipmappedArrayDestroy),
        hook!(cuDevicePrimaryCtxRetain),
        hook!(cuDevicePrimaryCtxRelease_v2),
        hook!(cuCtxCreate_v2),
        hook!(cuCtxCreate_v3),
        hook!(cuCtxCreate_v4),
        hook!(cuCtxDestroy_v2),
        hook!(cuGreenCtxCreate),
        hook!(cuGreenCtxDestroy),
        hook!(nvmlDeviceGetMemoryInfo),
        hook!(nvmlDeviceGetMemoryInfo_v2),
    ]
}

/// Calls that ask about swappable memory or act on the swap's own pool: what the driver says of an
/// address (swappable memory is one allocation to the application), the default pool's trim and
/// statistics.
fn swap_hooks() -> [Hook; 6] {
    [
        hook!(cuMemGetAddressRange_v2),
        hook!(cuPointerGetAttribute),
        hook!(cuPointerGetAttributes),
        hook!(cuMemPoolTrimTo),
        hook!(cuMemPoolGetAttribute),
        hook!(cuMemPoolSetAttribute),
    ]
}

/// Runs a CUDA hook with the runtime, turning errors and panics into a `CUresult`.
fn cuda_shim(hook: impl FnOnce(&'static Runtime) -> Result<(), HookError>) -> CUresult {
    match catch_unwind(AssertUnwindSafe(|| hook(runtime::get()?))) {
        Ok(Ok(())) => CUDA_SUCCESS,
        Ok(Err(error)) => cuda_error(error),
        Err(_) => CUDA_ERROR_UNKNOWN,
    }
}

/// A hook's error as its `CUresult`, a refusal logged; out of line, off every call's success path.
#[cold]
#[inline(never)]
fn cuda_error(error: HookError) -> CUresult {
    error.log_refusal();
    error.into()
}

/// Runs an NVML hook with the runtime, turning errors and panics into an `nvmlReturn_t`.
fn nvml_shim(hook: impl FnOnce(&'static Runtime) -> Result<(), HookError>) -> NvmlReturn {
    match catch_unwind(AssertUnwindSafe(|| hook(runtime::get()?))) {
        Ok(Ok(())) => NVML_SUCCESS,
        Ok(Err(error)) => error.to_nvml(),
        Err(_) => NVML_ERROR_UNKNOWN,
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn cuInit(flags: c_uint) -> CUresult {
    cuda_shim(|runtime| init::init(runtime, flags))
}

/// # Safety
/// Called by C with `cuMemAlloc_v2`'s contract; `dptr` goes to the driver unchecked.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize) -> CUresult {
    // SAFETY: `dptr` is the caller's out-pointer, forwarded as the driver's contract allows.
    cuda_shim(|rt| unsafe { memory::alloc(rt, dptr, bytesize) })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult {
    cuda_shim(|rt| memory::free(rt, dptr))
}

/// # Safety
/// Called by C with `cuMemGetInfo_v2`'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    // SAFETY: the caller's out-pointers, forwarded to the driver first.
    cuda_shim(|rt| unsafe { memory::get_info(rt, free, total) })
}

/// # Safety
/// Called by C with `cuDeviceTotalMem_v2`'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult {
    // SAFETY: the caller's out-pointer, forwarded to the driver first.
    cuda_shim(|rt| unsafe { memory::device_total(rt, bytes, dev) })
}

/// # Safety
/// Called by C with `cuMemAllocPitch_v2`'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocPitch_v2(
    dptr: *mut CUdeviceptr,
    pPitch: *mut usize,
    WidthInBytes: usize,
    Height: usize,
    ElementSizeBytes: c_uint,
) -> CUresult {
    // SAFETY: the caller's arguments, forwarded to the driver.
    cuda_shim(|rt| unsafe { memory::alloc_pitch(rt, dptr, pPitch, WidthInBytes, Height, ElementSizeBytes) })
}

/// # Safety
/// Called by C with `cuMemAllocManaged`'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocManaged(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    flags: c_uint,
) -> CUresult {
    // SAFETY: the caller's arguments, forwarded to the driver.
    cuda_shim(|rt| unsafe { memory::alloc_managed(rt, dptr, bytesize, flags) })
}

/// # Safety
/// Called by C with `cuMemAllocAsync`'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocAsync(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    hStream: CUstream,
) -> CUresult {
    // SAFETY: the caller's arguments, forwarded to the driver.
    cuda_shim(|rt| unsafe { pools::alloc_async(rt, dptr, bytesize, hStream, false) })
}

/// # Safety
/// Called by C with `cuMemAllocAsync_ptsz`'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocAsync_ptsz(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    hStream: CUstream,
) -> CUresult {
    // SAFETY: the caller's arguments, forwarded to the driver.
    cuda_shim(|rt| unsafe { pools::alloc_async(rt, dptr, bytesize, hStream, true) })
}

/// # Safety
/// Called by C with `cuMemAllocFromPoolAsync`'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    pool: CUmemoryPool,
    hStream: CUstream,
) -> CUresult {
    // SAFETY: the caller's arguments, forwarded to the driver.
    cuda_shim(|rt| unsafe { pools::alloc_from_pool_async(rt, dptr, bytesize, pool, hStream, false) })
}

/// # Safety
/// Called by C with `cuMemAllocFromPoolAsync_ptsz`'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync_ptsz(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    pool: CUmemoryPool,
    hStream: CUstream,
) -> CUresult {
    // SAFETY: the caller's arguments, forwarded to the driver.
    cuda_shim(|rt| unsafe { pools::alloc_from_pool_async(rt, dptr, bytesize, pool, hStream, true) })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemFreeAsync(dptr: CUdeviceptr, hStream: CUstream) -> CUresult {
    cuda_shim(|rt| pools::free_async(rt, dptr, hStream, false))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemFreeAsync_ptsz(dptr: CUdeviceptr, hStream: CUstream) -> CUresult {
    cuda_shim(|rt| pools::free_async(rt, dptr, hStream, true))
}

/// # Safety
/// Called by C with `cuMemPoolGetAttribute`'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolGetAttribute(
    pool: CUmemoryPool,
    attr: c_int,
    value: *mut c_void,
) -> CUresult {
    // SAFETY: the caller's arguments, forwarded to the driver.
    cuda_shim(|rt| unsafe { pools::get_attribute(rt, pool, attr, value) })
}

/// # Safety
/// Called by C with `cuMemPoolSetAttribute`'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolSetAttribute(
    pool: CUmemoryPool,
    attr: c_int,
    value: *mut c_void,
) -> CUresult {
    // SAFETY: the caller's arguments, forwarded to the driver.
    cuda_shim(|rt| unsafe { pools::set_attribute(rt, pool, attr, value) })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemPoolTrimTo(pool: CUmemoryPool, minBytesToKeep: usize) -> CUresult {
    cuda_shim(|rt| pools::trim_to(rt, pool, minBytesToKeep))
}

/// # Safety
/// Called by C with `cuMemGetAddressRange_v2`'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetAddressRange_v2(
    pbase: *mut CUdeviceptr,
    psize: *mut usize,
    dptr: CUdeviceptr,
) -> CUresult {
    // SAFETY: the caller's arguments, forwarded to the driver.
    cuda_shim(|rt| unsafe { memory::address_range(rt, pbase, psize, dptr) })
}

/// # Safety
/// Called by C with `cuPointerGetAttribute`'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuPointerGetAttribute(
    data: *mut c_void,
    attribute: c_int,
    ptr: CUdeviceptr,
) -> CUresult {
    // SAFETY: the caller's arguments, forwarded to the driver.
    cuda_shim(|rt| unsafe { memory::pointer_attribute(rt, data, attribute, ptr) })
}

/// # Safety
/// Called by C with `cuPointerGetAttributes`' contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuPointerGetAttributes(
    numAttributes: c_uint,
    attributes: *const c_int,
    data: *const *mut c_void,
    ptr: CUdeviceptr,
) -> CUresult {
    // SAFETY: the caller's arguments, forwarded to the driver.
    cuda_shim(|rt| unsafe { memory::pointer_attributes(rt, numAttributes, attributes, data, ptr) })
}

/// # Safety
/// Called by C with `cuMemCreate`'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemCreate(
    handle: *mut CUmemGenericAllocationHandle,
    size: usize,
    prop: *const CUmemAllocationProp,
    flags: u64,
) -> CUresult {
    // SAFETY: the caller's arguments, forwarded to the driver.
    cuda_shim(|rt| unsafe { vmm::mem_create(rt, handle, size, prop, flags) })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemRelease(handle: CUmemGenericAllocationHandle) -> CUresult {
    cuda_shim(|rt| vmm::mem_release(rt, handle))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemMap(
    ptr: CUdeviceptr,
    size: usize,
    offset: usize,
    handle: CUmemGenericAllocationHandle,
    flags: u64,
) -> CUresult {
    cuda_shim(|rt| vmm::mem_map(rt, ptr, size, offset, handle, flags))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemUnmap(ptr: CUdeviceptr, size: usize) -> CUresult {
    cuda_shim(|rt| vmm::mem_unmap(rt, ptr, size))
}

/// # Safety
/// Called by C with `cuMemRetainAllocationHandle`'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemRetainAllocationHandle(
    handle: *mut CUmemGenericAllocationHandle,
    addr: *mut c_void,
) -> CUresult {
    // SAFETY: the caller's arguments, forwarded to the driver.
    cuda_shim(|rt| unsafe { vmm::retain_allocation_handle(rt, handle, addr) })
}

/// # Safety
/// Called by C with `cuMemSetAccess`'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemSetAccess(
    ptr: CUdeviceptr,
    size: usize,
    desc: *const c_void,
    count: usize,
) -> CUresult {
    // SAFETY: the caller's arguments, forwarded to the driver.
    cuda_shim(|rt| unsafe { vmm::set_access(rt, ptr, size, desc, count) })
}

/// # Safety
/// Called by C with `cuMemExportToShareableHandle`'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemExportToShareableHandle(
    shareable: *mut c_void,
    handle: CUmemGenericAllocationHandle,
    kind: c_int,
    flags: u64,
) -> CUresult {
    // SAFETY: the caller's arguments, forwarded to the driver.
    cuda_shim(|rt| unsafe { vmm::export_to_shareable_handle(rt, shareable, handle, kind, flags) })
}

/// # Safety
/// Called by C with `cuMemGetAllocationPropertiesFromHandle`'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetAllocationPropertiesFromHandle(
    prop: *mut CUmemAllocationProp,
    handle: CUmemGenericAllocationHandle,
) -> CUresult {
    // SAFETY: the caller's arguments, forwarded to the driver.
    cuda_shim(|rt| unsafe { vmm::allocation_properties(rt, prop, handle) })
}

/// # Safety
/// Called by C with `cuGraphInstantiate`'s (pre-12.0) contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphInstantiate(
    phGraphExec: *mut CUgraphExec,
    hGraph: CUgraph,
    phErrorNode: *mut CUgraphNode,
    logBuffer: *mut c_char,
    bufferSize: usize,
) -> CUresult {
    // SAFETY: the caller's arguments, forwarded to the driver.
    cuda_shim(|rt| unsafe {
        graphs::instantiate_with_log(rt, phGraphExec, hGraph, phErrorNode, logBuffer, bufferSize, false)
    })
}

/// # Safety
/// Called by C with `cuGraphInstantiate_v2`'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphInstantiate_v2(
    phGraphExec: *mut CUgraphExec,
    hGraph: CUgraph,
    phErrorNode: *mut CUgraphNode,
    logBuffer: *mut c_char,
    bufferSize: usize,
) -> CUresult {
    // SAFETY: the caller's arguments, forwarded to the driver.
    cuda_shim(|rt| unsafe {
        graphs::instantiate_with_log(rt, phGraphExec, hGraph, phErrorNode, logBuffer, bufferSize, true)
    })
}

/// # Safety
/// Called by C with `cuGraphInstantiateWithFlags`'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphInstantiateWithFlags(
    phGraphExec: *mut CUgraphExec,
    hGraph: CUgraph,
    flags: u64,
) -> CUresult {
    // SAFETY: the caller's arguments, forwarded to the driver.
    cuda_shim(|rt| unsafe { graphs::instantiate_with_flags(rt, phGraphExec, hGraph, flags) })
}

/// # Safety
/// Called by C with `cuGraphInstantiateWithParams`'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphInstantiateWithParams(
    phGraphExec: *mut CUgraphExec,
    hGraph: CUgraph,
    params: *mut c_void,
) -> CUresult {
    // SAFETY: the caller's arguments, forwarded to the driver.
    cuda_shim(|rt| unsafe { graphs::instantiate_with_params(rt, phGraphExec, hGraph, params, false) })
}

/// # Safety
/// Called by C with `cuGraphInstantiateWithParams_ptsz`'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphInstantiateWithParams_ptsz(
    phGraphExec: *mut CUgraphExec,
    hGraph: CUgraph,
    params: *mut c_void,
) -> CUresult {
    // SAFETY: the caller's arguments, forwarded to the driver.
    cuda_shim(|rt| unsafe { graphs::instantiate_with_params(rt, phGraphExec, hGraph, params, true) })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuGraphExecDestroy(hGraphExec: CUgraphExec) -> CUresult {
    cuda_shim(|rt| graphs::exec_destroy(rt, hGraphExec))
}

/// # Safety
/// Called by C with `cuArrayCreate_v2`'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArrayCreate_v2(
    pHandle: *mut CUarray,
    pAllocateArray: *const ArrayDescriptor,
) -> CUresult {
    // SAFETY: the caller's arguments, forwarded to the driver.
    cuda_shim(|rt| unsafe { arrays::create(rt, pHandle, pAllocateArray) })
}

/// # Safety
/// Called by C with `cuArray3DCreate_v2`'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArray3DCreate_v2(
    pHandle: *mut CUarray,
    pAllocateArray: *const Array3dDescriptor,
) -> CUresult {
    // SAFETY: the caller's arguments, forwarded to the driver.
    cuda_shim(|rt| unsafe { arrays::create_3d(rt, pHandle, pAllocateArray) })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuArrayDestroy(hArray: CUarray) -> CUresult {
    cuda_shim(|rt| arrays::destroy(rt, hArray))
}

/// # Safety
/// Called by C with `cuMipmappedArrayCreate`'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMipmappedArrayCreate(
    pHandle: *mut CUmipmappedArray,
    pMipmappedArrayDesc: *const Array3dDescriptor,
    numMipmapLevels: c_uint,
) -> CUresult {
    // SAFETY: the caller's arguments, forwarded to the driver.
    cuda_shim(|rt| unsafe { arrays::create_mipmapped(rt, pHandle, pMipmappedArrayDesc, numMipmapLevels) })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMipmappedArrayDestroy(hMipmappedArray: CUmipmappedArray) -> CUresult {
    cuda_shim(|rt| arrays::destroy_mipmapped(rt, hMipmappedArray))
}

/// # Safety
/// Called by C with `cuDevicePrimaryCtxRetain`'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice) -> CUresult {
    // SAFETY: the caller's arguments, forwarded to the driver.
    cuda_shim(|rt| unsafe { context::primary_retain(rt, pctx, dev) })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> CUresult {
    cuda_shim(|rt| context::primary_release(rt, dev))
}

/// # Safety
/// Called by C with `cuCtxCreate_v2`'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxCreate_v2(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) -> CUresult {
    // SAFETY: the caller's arguments, forwarded to the driver.
    cuda_shim(|rt| unsafe { context::create(rt, pctx, CtxCreate::V2 { flags }, dev) })
}

/// # Safety
/// Called by C with `cuCtxCreate_v3`'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxCreate_v3(
    pctx: *mut CUcontext,
    paramsArray: *mut c_void,
    numParams: c_int,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    let abi = CtxCreate::V3 { params: paramsArray, num_params: numParams, flags };
    // SAFETY: the caller's arguments, forwarded to the driver.
    cuda_shim(|rt| unsafe { context::create(rt, pctx, abi, dev) })
}

/// # Safety
/// Called by C with `cuCtxCreate_v4`'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxCreate_v4(
    pctx: *mut CUcontext,
    ctxCreateParams: *mut c_void,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    let abi = CtxCreate::V4 { params: ctxCreateParams, flags };
    // SAFETY: the caller's arguments, forwarded to the driver.
    cuda_shim(|rt| unsafe { context::create(rt, pctx, abi, dev) })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxDestroy_v2(ctx: CUcontext) -> CUresult {
    cuda_shim(|rt| context::destroy(rt, ctx))
}

/// # Safety
/// Called by C with `cuGreenCtxCreate`'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGreenCtxCreate(
    phCtx: *mut CUgreenCtx,
    desc: *mut c_void,
    dev: CUdevice,
    flags: c_uint,
) -> CUresult {
    // SAFETY: the caller's arguments, forwarded to the driver.
    cuda_shim(|rt| unsafe { context::green_create(rt, phCtx, desc, dev, flags) })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuGreenCtxDestroy(hCtx: CUgreenCtx) -> CUresult {
    cuda_shim(|rt| context::green_destroy(rt, hCtx))
}

/// The grid and block of a kernel launch, as the driver's launch calls take them.
type Dims = [c_uint; 3];

/// `cuLaunchKernel` and its `_ptsz` twin: `entry` is the driver's variant, `default` what a NULL
/// stream means to it.
///
/// # Safety
/// `cuLaunchKernel`'s contract; every argument goes to the driver unchanged.
#[allow(clippy::too_many_arguments)]
unsafe fn launch_kernel(
    entry: Option<CuLaunchKernel>,
    default: DefaultStream,
    f: CUfunction,
    grid: Dims,
    block: Dims,
    shared: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    launch::run(entry, stream, default, launch::kernel_key(f, grid), |real| {
        let ([gx, gy, gz], [bx, by, bz]) = (grid, block);
        // SAFETY: the caller's arguments, forwarded unchanged.
        unsafe { real(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra) }
    })
}

/// # Safety
/// Called by C with `cuLaunchKernel`'s contract; every argument goes to the driver unchanged.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchKernel(
    f: CUfunction,
    gridDimX: c_uint,
    gridDimY: c_uint,
    gridDimZ: c_uint,
    blockDimX: c_uint,
    blockDimY: c_uint,
    blockDimZ: c_uint,
    sharedMemBytes: c_uint,
    hStream: CUstream,
    kernelParams: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    let (grid, block) = ([gridDimX, gridDimY, gridDimZ], [blockDimX, blockDimY, blockDimZ]);
    let entry = driver::cuda().launch_kernel;
    // SAFETY: the caller's arguments, per the contract.
    unsafe {
        launch_kernel(
            entry,
            DefaultStream::Legacy,
            f,
            grid,
            block,
            sharedMemBytes,
            hStream,
            kernelParams,
            extra,
        )
    }
}

/// # Safety
/// Called by C with `cuLaunchKernel_ptsz`'s contract; every argument goes to the driver unchanged.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchKernel_ptsz(
    f: CUfunction,
    gridDimX: c_uint,
    gridDimY: c_uint,
    gridDimZ: c_uint,
    blockDimX: c_uint,
    blockDimY: c_uint,
    blockDimZ: c_uint,
    sharedMemBytes: c_uint,
    hStream: CUstream,
    kernelParams: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    let (grid, block) = ([gridDimX, gridDimY, gridDimZ], [blockDimX, blockDimY, blockDimZ]);
    let entry = driver::cuda().launch_kernel_ptsz;
    // SAFETY: the caller's arguments, per the contract.
    unsafe {
        launch_kernel(
            entry,
            DefaultStream::PerThread,
            f,
            grid,
            block,
            sharedMemBytes,
            hStream,
            kernelParams,
            extra,
        )
    }
}

/// `cuLaunchCooperativeKernel` and its `_ptsz` twin, as [`launch_kernel`].
///
/// # Safety
/// `cuLaunchCooperativeKernel`'s contract; every argument goes to the driver unchanged.
#[allow(clippy::too_many_arguments)]
unsafe fn launch_cooperative(
    entry: Option<CuLaunchCooperativeKernel>,
    default: DefaultStream,
    f: CUfunction,
    grid: Dims,
    block: Dims,
    shared: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
) -> CUresult {
    launch::run(entry, stream, default, launch::kernel_key(f, grid), |real| {
        let ([gx, gy, gz], [bx, by, bz]) = (grid, block);
        // SAFETY: the caller's arguments, forwarded unchanged.
        unsafe { real(f, gx, gy, gz, bx, by, bz, shared, stream, params) }
    })
}

/// # Safety
/// Called by C with `cuLaunchCooperativeKernel`'s contract; every argument goes to the driver
/// unchanged.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchCooperativeKernel(
    f: CUfunction,
    gridDimX: c_uint,
    gridDimY: c_uint,
    gridDimZ: c_uint,
    blockDimX: c_uint,
    blockDimY: c_uint,
    blockDimZ: c_uint,
    sharedMemBytes: c_uint,
    hStream: CUstream,
    kernelParams: *mut *mut c_void,
) -> CUresult {
    let (grid, block) = ([gridDimX, gridDimY, gridDimZ], [blockDimX, blockDimY, blockDimZ]);
    let entry = driver::cuda().launch_cooperative_kernel;
    // SAFETY: the caller's arguments, per the contract.
    unsafe {
        launch_cooperative(
            entry,
            DefaultStream::Legacy,
            f,
            grid,
            block,
            sharedMemBytes,
            hStream,
            kernelParams,
        )
    }
}

/// # Safety
/// Called by C with `cuLaunchCooperativeKernel_ptsz`'s contract; every argument goes to the driver
/// unchanged.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchCooperativeKernel_ptsz(
    f: CUfunction,
    gridDimX: c_uint,
    gridDimY: c_uint,
    gridDimZ: c_uint,
    blockDimX: c_uint,
    blockDimY: c_uint,
    blockDimZ: c_uint,
    sharedMemBytes: c_uint,
    hStream: CUstream,
    kernelParams: *mut *mut c_void,
) -> CUresult {
    let (grid, block) = ([gridDimX, gridDimY, gridDimZ], [blockDimX, blockDimY, blockDimZ]);
    let entry = driver::cuda().launch_cooperative_kernel_ptsz;
    // SAFETY: the caller's arguments, per the contract.
    unsafe {
        launch_cooperative(
            entry,
            DefaultStream::PerThread,
            f,
            grid,
            block,
            sharedMemBytes,
            hStream,
            kernelParams,
        )
    }
}

/// `cuLaunchKernelEx` and its `_ptsz` twin, as [`launch_kernel`]; a NULL config is the driver's to
/// refuse.
///
/// # Safety
/// `cuLaunchKernelEx`'s contract: `config` is NULL or points to a `CUlaunchConfig`.
unsafe fn launch_ex(
    entry: Option<CuLaunchKernelEx>,
    default: DefaultStream,
    config: *const CUlaunchConfig,
    f: CUfunction,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    // SAFETY: checked for NULL; otherwise valid per the caller's contract.
    let (stream, grid) = match unsafe { config.as_ref() } {
        Some(config) => (config.h_stream, config.grid_dim),
        None => (std::ptr::null_mut(), [0; 3]),
    };
    launch::run(entry, stream, default, launch::kernel_key(f, grid), |real| {
        // SAFETY: the caller's arguments, forwarded unchanged.
        unsafe { real(config, f, params, extra) }
    })
}

/// # Safety
/// Called by C with `cuLaunchKernelEx`'s contract; every argument goes to the driver unchanged.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchKernelEx(
    config: *const CUlaunchConfig,
    f: CUfunction,
    kernelParams: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    // SAFETY: the caller's arguments, per the contract.
    unsafe {
        launch_ex(driver::cuda().launch_kernel_ex, DefaultStream::Legacy, config, f, kernelParams, extra)
    }
}

/// # Safety
/// Called by C with `cuLaunchKernelEx_ptsz`'s contract; every argument goes to the driver
/// unchanged.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchKernelEx_ptsz(
    config: *const CUlaunchConfig,
    f: CUfunction,
    kernelParams: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    let entry = driver::cuda().launch_kernel_ex_ptsz;
    // SAFETY: the caller's arguments, per the contract.
    unsafe { launch_ex(entry, DefaultStream::PerThread, config, f, kernelParams, extra) }
}

#[unsafe(no_mangle)]
pub extern "C" fn cuGraphLaunch(hGraphExec: CUgraphExec, hStream: CUstream) -> CUresult {
    launch::run(driver::cuda().graph_launch, hStream, DefaultStream::Legacy, hGraphExec as usize, |real| {
        // SAFETY: handles forwarded unchanged; the driver validates them.
        unsafe { real(hGraphExec, hStream) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuGraphLaunch_ptsz(hGraphExec: CUgraphExec, hStream: CUstream) -> CUresult {
    launch::run(
        driver::cuda().graph_launch_ptsz,
        hStream,
        DefaultStream::PerThread,
        hGraphExec as usize,
        |real| {
            // SAFETY: handles forwarded unchanged; the driver validates them.
            unsafe { real(hGraphExec, hStream) }
        },
    )
}

/// Asks the real driver with identical arguments, then swaps in our hook for the exact variant
/// the driver chose.
///
/// # Safety
/// Called by C with `cuGetProcAddress`'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cudaVersion: c_int,
    flags: u64,
) -> CUresult {
    let Some(real) = driver::cuda().get_proc_address else { return CUDA_ERROR_NOT_FOUND };
    // SAFETY: the caller's arguments, forwarded unchanged to the function we stand in for.
    let status = unsafe { real(symbol, pfn, cudaVersion, flags) };
    // SAFETY: on success the driver wrote a function pointer through the non-null `pfn`.
    unsafe { substitute_proc_address(status, pfn) };
    status
}

/// As [`cuGetProcAddress`], with the CUDA 12 `symbolStatus` out-parameter.
///
/// # Safety
/// Called by C with `cuGetProcAddress_v2`'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cudaVersion: c_int,
    flags: u64,
    symbolStatus: *mut c_int,
) -> CUresult {
    let Some(real) = driver::cuda().get_proc_address_v2 else { return CUDA_ERROR_NOT_FOUND };
    // SAFETY: the caller's arguments, forwarded unchanged to the function we stand in for.
    let status = unsafe { real(symbol, pfn, cudaVersion, flags, symbolStatus) };
    // SAFETY: on success the driver wrote a function pointer through the non-null `pfn`.
    unsafe { substitute_proc_address(status, pfn) };
    status
}

/// # Safety
/// `pfn` is null or points to a pointer the driver wrote when `status` is success.
unsafe fn substitute_proc_address(status: CUresult, pfn: *mut *mut c_void) {
    if status != CUDA_SUCCESS || pfn.is_null() {
        return;
    }
    let _ = catch_unwind(|| {
        // SAFETY: the driver succeeded, so `*pfn` is initialised and writable.
        let real = unsafe { pfn.read() };
        if !real.is_null() {
            // SAFETY: as above.
            unsafe { pfn.write(symbols::proc_address_substitute(hooks(), real)) };
        }
    });
}

/// # Safety
/// Called by C with `nvmlDeviceGetMemoryInfo`'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(device: NvmlDevice, memory: *mut NvmlMemory) -> NvmlReturn {
    // SAFETY: the caller's out-pointer, forwarded to NVML first.
    nvml_shim(|rt| unsafe { nvml::memory_info(rt, device, memory) })
}

/// # Safety
/// Called by C with `nvmlDeviceGetMemoryInfo_v2`'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: NvmlDevice,
    memory: *mut NvmlMemoryV2,
) -> NvmlReturn {
    // SAFETY: the caller's out-pointer, forwarded to NVML first.
    nvml_shim(|rt| unsafe { nvml::memory_info_v2(rt, device, memory) })
}

/// Decides a `dlsym` call for the trampoline: our hook's address, or null for "ask the real
/// `dlsym`". Never unwinds.
extern "C" fn dlsym_decide(handle: *mut c_void, name: *const c_char, caller: *const c_void) -> *mut c_void {
    // A name that is not the driver's costs a prefix comparison: libvgpu is not set up for it.
    // SAFETY: `name` is NULL or a NUL-terminated string, per dlsym's contract.
    if loader::real_dlsym().is_none() || !unsafe { symbols::may_be_driver_name(name) } {
        return std::ptr::null_mut();
    }
    // SAFETY: the application's dlsym arguments, forwarded as they came.
    catch_unwind(|| unsafe { symbols::dlsym_substitute(hooks(), handle, name, caller) })
        .unwrap_or(std::ptr::null_mut())
}

// The exported `dlsym`: what `dlsym_decide` does not substitute goes to glibc's by a jump, so
// that `RTLD_NEXT` still resolves relative to the application (the trampoline's own doc).
vgpu_preload::dlsym_trampoline!(dlsym_decide);
