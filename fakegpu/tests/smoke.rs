//! Builds the fake driver, loads it through `libcuda.so.1` / `libnvidia-ml.so.1` symlinks and checks
//! what it answers. The fake reads its environment once per process, so each test re-runs this binary
//! as a child with its own `FAKEGPU_*` settings and runs its body there (`common`).

#[macro_use]
mod common;

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, Stdio};
use std::ptr::{null, null_mut};
use std::time::{Duration, Instant};

use common::*;

const INVALID_VALUE: c_int = 1;
const OUT_OF_MEMORY: c_int = 2;
const NOT_INITIALIZED: c_int = 3;
const INVALID_DEVICE: c_int = 101;
const INVALID_CONTEXT: c_int = 201;
const NOT_FOUND: c_int = 500;
const NVML_UNINITIALIZED: c_int = 1;
const NVML_INVALID_ARGUMENT: c_int = 2;
const NVML_INSUFFICIENT_SIZE: c_int = 7;
const NVML_VERSION_MISMATCH: c_int = 25;
const CONTEXT_IS_DESTROYED: c_int = 709;
const HOST_MEMORY_ALREADY_REGISTERED: c_int = 712;
const HOST_MEMORY_NOT_REGISTERED: c_int = 713;
const NOT_SUPPORTED: c_int = 801;
const MIB: u64 = 1 << 20;

/// Every CUDA export of the fake.
const EXPORTS: &[&str] = &[
    "cuInit",
    "cuDriverGetVersion",
    "cuDeviceGet",
    "cuDeviceGetCount",
    "cuDeviceGetName",
    "cuDeviceGetAttribute",
    "cuDeviceGetUuid",
    "cuDeviceGetUuid_v2",
    "cuDeviceTotalMem",
    "cuDeviceTotalMem_v2",
    "cuGetErrorString",
    "cuGetErrorName",
    "cuGetProcAddress",
    "cuGetProcAddress_v2",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxCreate",
    "cuCtxCreate_v2",
    "cuCtxCreate_v3",
    "cuCtxCreate_v4",
    "cuCtxDestroy_v2",
    "cuCtxPushCurrent_v2",
    "cuCtxPopCurrent_v2",
    "cuCtxSetCurrent",
    "cuCtxGetCurrent",
    "cuCtxGetDevice",
    "cuCtxSynchronize",
    "cuStreamCreate",
    "cuStreamDestroy_v2",
    "cuStreamSynchronize",
    "cuStreamIsCapturing",
    "cuStreamIsCapturing_ptsz",
    "cuLaunchKernel",
    "cuLaunchKernel_ptsz",
    "cuLaunchCooperativeKernel",
    "cuLaunchCooperativeKernel_ptsz",
    "cuLaunchKernelEx",
    "cuLaunchKernelEx_ptsz",
    "cuEventCreate",
    "cuEventRecord",
    "cuEventRecord_ptsz",
    "cuEventQuery",
    "cuEventSynchronize",
    "cuEventElapsedTime",
    "cuEventElapsedTime_v2",
    "cuEventDestroy_v2",
    "cuMemAlloc",
    "cuMemAlloc_v2",
    "cuMemAllocPitch",
    "cuMemAllocPitch_v2",
    "cuMemAllocManaged",
    "cuMemFree",
    "cuMemFree_v2",
    "cuMemGetInfo",
    "cuMemGetInfo_v2",
    "cuMemGetAddressRange_v2",
    "cuMemAllocAsync",
    "cuMemAllocAsync_ptsz",
    "cuMemAllocFromPoolAsync",
    "cuMemAllocFromPoolAsync_ptsz",
    "cuMemFreeAsync",
    "cuMemFreeAsync_ptsz",
    "cuDeviceGetDefaultMemPool",
    "cuDeviceGetMemPool",
    "cuMemPoolCreate",
    "cuMemPoolDestroy",
    "cuMemPoolSetAttribute",
    "cuMemPoolGetAttribute",
    "cuMemPoolTrimTo",
    "cuMemGetAllocationGranularity",
    "cuMemCreate",
    "cuMemRelease",
    "cuMemRetainAllocationHandle",
    "cuMemAddressReserve",
    "cuMemAddressFree",
    "cuMemMap",
    "cuMemUnmap",
    "cuMemSetAccess",
    "cuArrayCreate",
    "cuArrayCreate_v2",
    "cuArray3DCreate_v2",
    "cuArrayDestroy",
    "cuMipmappedArrayCreate",
    "cuMipmappedArrayDestroy",
    "cuMemHostAlloc",
    "cuMemAllocHost_v2",
    "cuMemFreeHost",
    "cuMemHostRegister_v2",
    "cuMemHostUnregister",
    "cuIpcGetMemHandle",
    "cuIpcOpenMemHandle_v2",
    "cuIpcCloseMemHandle",
    "cuGraphCreate",
    "cuGraphDestroy",
    "cuGraphAddEmptyNode",
    "cuGraphAddKernelNode",
    "cuGraphAddKernelNode_v2",
    "cuGraphAddMemAllocNode",
    "cuGraphAddMemFreeNode",
    "cuGraphGetNodes",
    "cuGraphNodeGetType",
    "cuGraphMemAllocNodeGetParams",
    "cuGraphInstantiate",
    "cuGraphInstantiate_v2",
    "cuGraphInstantiateWithFlags",
    "cuGraphInstantiateWithParams",
    "cuGraphInstantiateWithParams_ptsz",
    "cuGraphLaunch",
    "cuGraphLaunch_ptsz",
    "cuGraphExecDestroy",
    "cuDeviceGetGraphMemAttribute",
    "cuDeviceGraphMemTrim",
];

/// Reads a NUL-terminated string the fake returned or wrote.
fn text(ptr: *const c_char) -> String {
    assert!(!ptr.is_null());
    // SAFETY: the fake hands out NUL-terminated strings (static ones, or written into our buffers).
    unsafe { CStr::from_ptr(ptr) }.to_string_lossy().into_owned()
}

/// (used, peak, alloc_calls) of a physical device, read through the test hook.
fn stats(driver: &Driver, index: c_uint) -> Option<(u64, u64, u64)> {
    let hook = function!(driver, fakegpu_device_stats: fn(c_uint, *mut u64, *mut u64, *mut u64) -> c_int);
    let (mut used, mut peak, mut calls) = (0, 0, 0);
    (hook(index, &mut used, &mut peak, &mut calls) == 0).then_some((used, peak, calls))
}

#[test]
fn memory_calls() {
    if !is_child() {
        return spawn_self("memory_calls", &[("FAKEGPU_MEMORY", "1m"), ("FAKEGPU_DEVICES", "2")]);
    }
    let cuda = Driver::open("libcuda.so.1");
    let init = function!(cuda, cuInit: fn(c_uint) -> c_int);
    let count = function!(cuda, cuDeviceGetCount: fn(*mut c_int) -> c_int);
    let alloc = function!(cuda, cuMemAlloc_v2: fn(*mut u64, usize) -> c_int);
    let free = function!(cuda, cuMemFree_v2: fn(u64) -> c_int);
    let info = function!(cuda, cuMemGetInfo_v2: fn(*mut usize, *mut usize) -> c_int);
    let alloc32 = function!(cuda, cuMemAlloc: fn(*mut c_uint, c_uint) -> c_int);
    let free32 = function!(cuda, cuMemFree: fn(c_uint) -> c_int);
    let get_info = || {
        let (mut free_bytes, mut total) = (0, 0);
        assert_eq!(info(&mut free_bytes, &mut total), SUCCESS);
        (free_bytes as u64, total as u64)
    };

    let (mut n, mut ptr) = (0, 0);
    assert_eq!(count(&mut n), NOT_INITIALIZED);
    assert_eq!(alloc(&mut ptr, 512), NOT_INITIALIZED);
    assert_eq!(init(1), INVALID_VALUE);
    assert_eq!(init(0), SUCCESS);
    assert_eq!((count(&mut n), n), (SUCCESS, 2));
    assert_eq!(count(null_mut()), INVALID_VALUE);
    assert_eq!(alloc(&mut ptr, 512), INVALID_CONTEXT);

    bind_context(&cuda, 0);
    let (mut a, mut b) = (0, 0);
    assert_eq!(alloc(&mut a, 512 << 10), SUCCESS);
    assert_eq!(alloc(&mut b, 512 << 10), SUCCESS);
    assert!(a != 0 && a != b && a % 512 == 0 && b % 512 == 0);
    assert_eq!(alloc(&mut ptr, 1), OUT_OF_MEMORY);
    assert_eq!(alloc(&mut ptr, 0), INVALID_VALUE);
    assert_eq!(alloc(null_mut(), 1), INVALID_VALUE);
    assert_eq!(get_info(), (0, MIB));
    assert_eq!(free(a), SUCCESS);
    assert_eq!(get_info(), (MIB / 2, MIB));
    assert_eq!(free(a), INVALID_VALUE);
    assert_eq!(free(0), INVALID_VALUE);
    assert_eq!(free(0xdead_0000), INVALID_VALUE);

    let mut small = 0;
    assert_eq!(alloc32(&mut small, 1000), SUCCESS);
    assert!(small != 0 && small % 512 == 0);
    assert_eq!(get_info(), (MIB / 2 - 1000, MIB));
    assert_eq!(free32(small), SUCCESS);

    // 2 + OOM + zero size + NULL + the 32-bit one; the call without a context never reached a device.
    assert_eq!(stats(&cuda, 0), Some((MIB / 2, MIB, 6)));
    assert_eq!(stats(&cuda, 1), Some((0, 0, 0)));
    assert_eq!(stats(&cuda, 2), None);

    bind_context(&cuda, 1);
    assert_eq!(alloc(&mut ptr, MIB as usize), SUCCESS);
    assert_eq!(get_info(), (0, MIB));
    assert_eq!(free(b), SUCCESS, "a free needs a context, not the allocating device's");
    assert_eq!(stats(&cuda, 0), Some((0, MIB, 6)));
    assert_eq!(stats(&cuda, 1), Some((MIB, MIB, 1)));
}

#[test]
fn proc_address_versions() {
    if !is_child() {
        // A second copy of the fake, preloaded, exports every name first; the fake must still hand out
        // its own addresses (it links with -Bsymbolic, like the real libcuda).
        let interposer = TempFile::new("preload.so");
        std::fs::copy(library_path(), &interposer).expect("copy the fake");
        spawn_self("proc_address_versions", &[("LD_PRELOAD", interposer.to_str().expect("UTF-8 path"))]);
        return;
    }
    let cuda = Driver::open("libcuda.so.1");
    // SAFETY: RTLD_DEFAULT with a NUL-terminated name.
    let global = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"cuMemAlloc_v2".as_ptr()) };
    assert!(!global.is_null() && global != cuda.address("cuMemAlloc_v2"), "the preloaded copy comes first");
    let get_v1 = function!(cuda, cuGetProcAddress: fn(*const c_char, *mut *mut c_void, c_int, u64) -> c_int);
    let get_v2 = function!(cuda, cuGetProcAddress_v2: fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int) -> c_int);
    let query = |name: &CStr, version, flags| {
        let (mut pfn, mut status) = (std::ptr::dangling_mut::<c_void>(), -1);
        let result = get_v2(name.as_ptr(), &mut pfn, version, flags, &mut status);
        (result, pfn, status)
    };

    // Works before cuInit.
    assert_eq!(query(c"cuMemAlloc", 3020, 0), (SUCCESS, cuda.address("cuMemAlloc_v2"), 0));
    assert_eq!(query(c"cuMemAlloc", 13000, 2), (SUCCESS, cuda.address("cuMemAlloc_v2"), 0));
    assert_eq!(query(c"cuMemAlloc", 3010, 1), (SUCCESS, cuda.address("cuMemAlloc"), 0));
    assert_eq!(query(c"cuNoSuchFunction", 13000, 0), (NOT_FOUND, null_mut(), 1));
    assert_eq!(query(c"cuMemAlloc_v2", 13000, 0), (NOT_FOUND, null_mut(), 1));
    assert_eq!(query(c"cuGetProcAddress", 11000, 0), (NOT_FOUND, null_mut(), 2));
    assert_eq!(query(c"cuGetProcAddress", 12000, 0), (SUCCESS, cuda.address("cuGetProcAddress_v2"), 0));
    assert_eq!(query(c"cuMemAlloc", 13000, 4).0, INVALID_VALUE);

    let mut pfn = null_mut();
    let name = c"cuDevicePrimaryCtxRelease".as_ptr();
    assert_eq!(get_v1(name, &mut pfn, 10020, 0), SUCCESS);
    assert_eq!(pfn, cuda.address("cuDevicePrimaryCtxRelease"));
    assert_eq!(get_v2(name, &mut pfn, 11000, 0, null_mut()), SUCCESS);
    assert_eq!(pfn, cuda.address("cuDevicePrimaryCtxRelease_v2"));
    assert_ne!(cuda.address("cuDevicePrimaryCtxRelease"), cuda.address("cuDevicePrimaryCtxRelease_v2"));
    assert_ne!(cuda.address("cuDeviceGetUuid"), cuda.address("cuDeviceGetUuid_v2"));
    assert_ne!(cuda.address("nvmlInit"), cuda.address("nvmlInit_v2"));
    // SAFETY: `pfn` is the fake's cuDevicePrimaryCtxRelease_v2, whose C signature this is.
    let release = unsafe { std::mem::transmute::<*mut c_void, extern "C" fn(c_int) -> c_int>(pfn) };
    assert_eq!(release(0), NOT_INITIALIZED);
    let call_count = function!(cuda, fakegpu_call_count: fn(*const c_char) -> u64);
    assert_eq!(call_count(c"cuDevicePrimaryCtxRelease_v2".as_ptr()), 1);
    assert_eq!(call_count(c"cuDevicePrimaryCtxRelease".as_ptr()), 0);
    assert_eq!(call_count(c"cuGetProcAddress_v2".as_ptr()), 9);
    assert_eq!(call_count(c"cuMemAllocAsync_ptsz".as_ptr()), 0);
    assert_eq!(call_count(c"noSuchExport".as_ptr()), 0);
    assert_eq!(get_v1(null(), &mut pfn, 13000, 0), INVALID_VALUE);

    // The families added later: newest variant not newer than the version, `_ptsz` only with flag 2.
    let table = [
        (c"cuMemAllocPitch", 2000, 0, "cuMemAllocPitch"),
        (c"cuMemAllocPitch", 3020, 0, "cuMemAllocPitch_v2"),
        (c"cuMemAllocManaged", 6000, 0, "cuMemAllocManaged"),
        (c"cuMemAllocAsync", 11020, 0, "cuMemAllocAsync"),
        (c"cuMemAllocAsync", 11020, 1, "cuMemAllocAsync"),
        (c"cuMemAllocAsync", 11020, 2, "cuMemAllocAsync_ptsz"),
        (c"cuMemFreeAsync", 12000, 2, "cuMemFreeAsync_ptsz"),
        (c"cuMemAllocFromPoolAsync", 13000, 2, "cuMemAllocFromPoolAsync_ptsz"),
        (c"cuMemAllocFromPoolAsync", 13000, 0, "cuMemAllocFromPoolAsync"),
        (c"cuMemPoolTrimTo", 11020, 0, "cuMemPoolTrimTo"),
        (c"cuStreamDestroy", 4000, 0, "cuStreamDestroy_v2"),
        (c"cuMemCreate", 10020, 0, "cuMemCreate"),
        (c"cuArrayCreate", 2000, 0, "cuArrayCreate"),
        (c"cuArrayCreate", 3020, 0, "cuArrayCreate_v2"),
        (c"cuMipmappedArrayCreate", 5000, 0, "cuMipmappedArrayCreate"),
        (c"cuCtxCreate", 2000, 0, "cuCtxCreate"),
        (c"cuCtxCreate", 3020, 0, "cuCtxCreate_v2"),
        (c"cuCtxCreate", 11040, 0, "cuCtxCreate_v3"),
        (c"cuCtxCreate", 12050, 0, "cuCtxCreate_v4"),
        (c"cuCtxDestroy", 4000, 0, "cuCtxDestroy_v2"),
        (c"cuCtxPopCurrent", 4000, 0, "cuCtxPopCurrent_v2"),
        (c"cuMemAllocHost", 3020, 0, "cuMemAllocHost_v2"),
        (c"cuMemHostRegister", 6050, 0, "cuMemHostRegister_v2"),
        (c"cuIpcOpenMemHandle", 11000, 0, "cuIpcOpenMemHandle_v2"),
        (c"cuMemGetAddressRange", 3020, 0, "cuMemGetAddressRange_v2"),
        (c"cuDeviceGetAttribute", 2000, 0, "cuDeviceGetAttribute"),
        (c"cuMemRetainAllocationHandle", 11000, 0, "cuMemRetainAllocationHandle"),
        (c"cuGraphCreate", 10000, 0, "cuGraphCreate"),
        (c"cuGraphDestroy", 10000, 0, "cuGraphDestroy"),
        (c"cuGraphAddEmptyNode", 10000, 0, "cuGraphAddEmptyNode"),
        (c"cuGraphAddMemAllocNode", 11040, 0, "cuGraphAddMemAllocNode"),
        (c"cuGraphAddMemFreeNode", 11040, 0, "cuGraphAddMemFreeNode"),
        (c"cuGraphGetNodes", 10000, 0, "cuGraphGetNodes"),
        (c"cuGraphNodeGetType", 10000, 0, "cuGraphNodeGetType"),
        (c"cuGraphMemAllocNodeGetParams", 11040, 0, "cuGraphMemAllocNodeGetParams"),
        (c"cuGraphInstantiate", 10000, 0, "cuGraphInstantiate"),
        (c"cuGraphInstantiate", 10020, 2, "cuGraphInstantiate"),
        (c"cuGraphInstantiate", 11000, 0, "cuGraphInstantiate_v2"),
        (c"cuGraphInstantiate", 13000, 0, "cuGraphInstantiate_v2"),
        (c"cuGraphInstantiateWithFlags", 11040, 0, "cuGraphInstantiateWithFlags"),
        (c"cuGraphInstantiateWithParams", 12000, 0, "cuGraphInstantiateWithParams"),
        (c"cuGraphInstantiateWithParams", 12000, 1, "cuGraphInstantiateWithParams"),
        (c"cuGraphInstantiateWithParams", 12000, 2, "cuGraphInstantiateWithParams_ptsz"),
        (c"cuGraphLaunch", 10000, 0, "cuGraphLaunch"),
        (c"cuGraphLaunch", 13000, 2, "cuGraphLaunch_ptsz"),
        (c"cuGraphExecDestroy", 10000, 0, "cuGraphExecDestroy"),
        (c"cuDeviceGetGraphMemAttribute", 11040, 0, "cuDeviceGetGraphMemAttribute"),
        (c"cuDeviceGraphMemTrim", 11040, 0, "cuDeviceGraphMemTrim"),
        (c"cuLaunchKernel", 4000, 0, "cuLaunchKernel"),
        (c"cuLaunchKernel", 6050, 2, "cuLaunchKernel"),
        (c"cuLaunchKernel", 7000, 2, "cuLaunchKernel_ptsz"),
        (c"cuLaunchKernel", 13000, 1, "cuLaunchKernel"),
        (c"cuLaunchCooperativeKernel", 9000, 0, "cuLaunchCooperativeKernel"),
        (c"cuLaunchCooperativeKernel", 9000, 2, "cuLaunchCooperativeKernel_ptsz"),
        (c"cuLaunchKernelEx", 11060, 0, "cuLaunchKernelEx"),
        (c"cuLaunchKernelEx", 12000, 2, "cuLaunchKernelEx_ptsz"),
        (c"cuEventCreate", 2000, 0, "cuEventCreate"),
        (c"cuEventRecord", 2000, 0, "cuEventRecord"),
        (c"cuEventRecord", 12000, 2, "cuEventRecord_ptsz"),
        (c"cuEventQuery", 2000, 2, "cuEventQuery"),
        (c"cuEventSynchronize", 2000, 0, "cuEventSynchronize"),
        (c"cuEventElapsedTime", 2000, 0, "cuEventElapsedTime"),
        (c"cuEventElapsedTime", 12070, 2, "cuEventElapsedTime"),
        (c"cuEventElapsedTime", 12080, 0, "cuEventElapsedTime_v2"),
        (c"cuEventDestroy", 4000, 0, "cuEventDestroy_v2"),
        (c"cuStreamIsCapturing", 10000, 0, "cuStreamIsCapturing"),
        (c"cuStreamIsCapturing", 10000, 2, "cuStreamIsCapturing_ptsz"),
        (c"cuCtxGetCurrent", 4000, 0, "cuCtxGetCurrent"),
        (c"cuCtxGetDevice", 2000, 0, "cuCtxGetDevice"),
        (c"cuGraphAddKernelNode", 10000, 0, "cuGraphAddKernelNode"),
        (c"cuGraphAddKernelNode", 11080, 2, "cuGraphAddKernelNode"),
        (c"cuGraphAddKernelNode", 12000, 0, "cuGraphAddKernelNode_v2"),
    ];
    for (name, version, flags, export) in table {
        assert_eq!(query(name, version, flags), (SUCCESS, cuda.address(export), 0), "{name:?} at {version}");
    }
    for (name, version) in [
        (c"cuMemAllocAsync", 11010),
        (c"cuStreamDestroy", 3020),
        (c"cuCtxCreate", 1000),
        (c"cuIpcOpenMemHandle", 10020),
        (c"cuMemHostRegister", 6000),
        (c"cuMemRetainAllocationHandle", 10020),
        (c"cuGraphCreate", 9020),
        (c"cuGraphAddMemAllocNode", 11030),
        (c"cuGraphInstantiateWithFlags", 11030),
        (c"cuGraphInstantiateWithParams", 11080),
        (c"cuDeviceGetGraphMemAttribute", 11030),
        (c"cuLaunchKernel", 3020),
        (c"cuLaunchCooperativeKernel", 8000),
        (c"cuLaunchKernelEx", 11050),
        (c"cuEventDestroy", 3020),
        (c"cuStreamIsCapturing", 9020),
        (c"cuGraphAddKernelNode", 9020),
    ] {
        assert_eq!(query(name, version, 2), (NOT_FOUND, null_mut(), 2), "{name:?} at {version}");
    }
    assert_eq!(query(c"cuMemAllocAsync_ptsz", 13000, 2), (NOT_FOUND, null_mut(), 1));
    assert_eq!(query(c"cuGraphLaunch_ptsz", 13000, 2), (NOT_FOUND, null_mut(), 1));
    assert_eq!(query(c"cuGraphInstantiate_v2", 13000, 0), (NOT_FOUND, null_mut(), 1));
    assert_eq!(query(c"cuLaunchKernel_ptsz", 13000, 2), (NOT_FOUND, null_mut(), 1));
    assert_eq!(query(c"cuEventDestroy_v2", 13000, 0), (NOT_FOUND, null_mut(), 1));
    let mut addresses: Vec<_> = EXPORTS.iter().map(|name| cuda.address(name)).collect();
    addresses.sort_unstable();
    addresses.dedup();
    assert_eq!(addresses.len(), EXPORTS.len(), "every export has its own address");
    assert_eq!(get_v1(name, null_mut(), 13000, 0), INVALID_VALUE);

    let version = function!(cuda, cuDriverGetVersion: fn(*mut c_int) -> c_int);
    let error_name = function!(cuda, cuGetErrorName: fn(c_int, *mut *const c_char) -> c_int);
    let error_string = function!(cuda, cuGetErrorString: fn(c_int, *mut *const c_char) -> c_int);
    let mut v = 0;
    assert_eq!((version(&mut v), v), (SUCCESS, 13000));
    let mut message = null();
    assert_eq!(error_name(OUT_OF_MEMORY, &mut message), SUCCESS);
    assert_eq!(text(message), "CUDA_ERROR_OUT_OF_MEMORY");
    assert_eq!(error_string(INVALID_CONTEXT, &mut message), SUCCESS);
    assert_eq!(text(message), "invalid device context");
    assert_eq!((error_string(12345, &mut message), message), (INVALID_VALUE, null()));
}

#[test]
fn nvml_and_cuda_identity() {
    if !is_child() {
        let env = [("FAKEGPU_DEVICES", "3"), ("FAKEGPU_MEMORY", "4g"), ("FAKEGPU_CUDA_ORDER", "reverse")];
        return spawn_self("nvml_and_cuda_identity", &env);
    }
    let nvml = Driver::open("libnvidia-ml.so.1");
    let init = function!(nvml, nvmlInit_v2: fn() -> c_int);
    let shutdown = function!(nvml, nvmlShutdown: fn() -> c_int);
    let count = function!(nvml, nvmlDeviceGetCount_v2: fn(*mut c_uint) -> c_int);
    let by_index = function!(nvml, nvmlDeviceGetHandleByIndex_v2: fn(c_uint, *mut *mut c_void) -> c_int);
    let get_uuid = function!(nvml, nvmlDeviceGetUUID: fn(*mut c_void, *mut c_char, c_uint) -> c_int);
    let memory = function!(nvml, nvmlDeviceGetMemoryInfo: fn(*mut c_void, *mut [u64; 3]) -> c_int);
    let memory_v2 = function!(nvml, nvmlDeviceGetMemoryInfo_v2: fn(*mut c_void, *mut [u64; 5]) -> c_int);
    let error_string = function!(nvml, nvmlErrorString: fn(c_int) -> *const c_char);

    let mut n = 0;
    assert_eq!(count(&mut n), NVML_UNINITIALIZED);
    assert_eq!((init(), init()), (SUCCESS, SUCCESS));
    assert_eq!((count(&mut n), n), (SUCCESS, 3));
    let mut device = null_mut();
    assert_eq!(by_index(3, &mut device), NVML_INVALID_ARGUMENT);
    assert_eq!(by_index(2, &mut device), SUCCESS);
    let mut buffer = [0 as c_char; 64];
    assert_eq!(get_uuid(device, buffer.as_mut_ptr(), 40), NVML_INSUFFICIENT_SIZE);
    assert_eq!(get_uuid(device, buffer.as_mut_ptr(), 41), SUCCESS);
    assert_eq!(text(buffer.as_ptr()), "GPU-face0000-0000-4e00-8000-000000000002");
    let mut not_ours = 0u64;
    let stranger = (&raw mut not_ours).cast();
    assert_eq!(get_uuid(stranger, buffer.as_mut_ptr(), 64), NVML_INVALID_ARGUMENT);
    assert_eq!(text(error_string(NVML_INSUFFICIENT_SIZE)), "Insufficient Size");

    // CUDA ordinal 0 is physical device 2 in reverse order; charge it and watch NVML.
    let cuda = Driver::open("libcuda.so.1");
    assert_eq!(cuda.0, nvml.0, "both sonames load the one fake");
    let cuda_uuid = function!(cuda, cuDeviceGetUuid_v2: fn(*mut [u8; 16], c_int) -> c_int);
    let cuda_name = function!(cuda, cuDeviceGetName: fn(*mut c_char, c_int, c_int) -> c_int);
    let alloc = function!(cuda, cuMemAlloc_v2: fn(*mut u64, usize) -> c_int);
    bind_context(&cuda, 0);
    let mut uuid = [0; 16];
    assert_eq!(cuda_uuid(&mut uuid, 0), SUCCESS);
    assert_eq!(uuid, [0xfa, 0xce, 0, 0, 0, 0, 0x4e, 0, 0x80, 0, 0, 0, 0, 0, 0, 2]);
    assert_eq!(cuda_name(buffer.as_mut_ptr(), 64, 0), SUCCESS);
    assert_eq!(text(buffer.as_ptr()), "Fake GPU 2");
    assert_eq!(cuda_name(buffer.as_mut_ptr(), 5, 2), SUCCESS);
    assert_eq!(text(buffer.as_ptr()), "Fake");
    let mut ptr = 0;
    assert_eq!(alloc(&mut ptr, 1 << 30), SUCCESS);

    let mut info = [0; 3];
    assert_eq!(memory(device, &mut info), SUCCESS);
    assert_eq!(info, [4 << 30, 3 << 30, 1 << 30]);
    let version = 40 | (2 << 24);
    let mut info2 = [version, 0, 9, 0, 0];
    assert_eq!(memory_v2(device, &mut info2), SUCCESS);
    assert_eq!(info2, [version, 4 << 30, 0, 3 << 30, 1 << 30]);
    let mut stale = [40 | (1 << 24), 0, 0, 0, 0];
    assert_eq!(memory_v2(device, &mut stale), NVML_VERSION_MISMATCH);
    assert_eq!(by_index(0, &mut device), SUCCESS);
    assert_eq!(memory(device, &mut info), SUCCESS);
    assert_eq!(info, [4 << 30, 4 << 30, 0]);

    assert_eq!((shutdown(), shutdown(), shutdown()), (SUCCESS, SUCCESS, NVML_UNINITIALIZED));
    assert_eq!(count(&mut n), NVML_UNINITIALIZED);
}

#[test]
fn visible_devices() {
    if !is_child() {
        let list = "3,GPU-face0000-0000-4e00-8000-000000000001,7,0";
        let env = [("FAKEGPU_DEVICES", "4"), ("FAKEGPU_MEMORY", "8g"), ("CUDA_VISIBLE_DEVICES", list)];
        return spawn_self("visible_devices", &env);
    }
    let cuda = Driver::open("libcuda.so.1");
    let count = function!(cuda, cuDeviceGetCount: fn(*mut c_int) -> c_int);
    let get = function!(cuda, cuDeviceGet: fn(*mut c_int, c_int) -> c_int);
    let uuid = function!(cuda, cuDeviceGetUuid: fn(*mut [u8; 16], c_int) -> c_int);
    let total32 = function!(cuda, cuDeviceTotalMem: fn(*mut c_uint, c_int) -> c_int);
    let total = function!(cuda, cuDeviceTotalMem_v2: fn(*mut usize, c_int) -> c_int);
    let context_device = function!(cuda, cuCtxGetDevice: fn(*mut c_int) -> c_int);
    let init = function!(cuda, cuInit: fn(c_uint) -> c_int);

    let (mut n, mut device) = (0, -1);
    assert_eq!(init(0), SUCCESS);
    assert_eq!(context_device(&mut device), INVALID_CONTEXT);
    assert_eq!((count(&mut n), n), (SUCCESS, 2), "the list stops at the invalid entry 7");
    assert_eq!((get(&mut device, 1), device), (SUCCESS, 1));
    assert_eq!(get(&mut device, 2), INVALID_DEVICE);
    let mut bytes = [0; 16];
    assert_eq!((uuid(&mut bytes, 0), bytes[15]), (SUCCESS, 3));
    assert_eq!((uuid(&mut bytes, 1), bytes[15]), (SUCCESS, 1));
    let (mut small, mut large) = (0, 0);
    assert_eq!((total32(&mut small, 1), small), (SUCCESS, u32::MAX));
    assert_eq!((total(&mut large, 1), large), (SUCCESS, 8 << 30));
    bind_context(&cuda, 1);
    assert_eq!((context_device(&mut device), device), (SUCCESS, 1));
}

/// Mesa lavapipe's Vulkan `deviceUUID`, which CI pairs a fake device with.
const LAVAPIPE_UUID: [u8; 16] =
    [0x6d, 0x65, 0x73, 0x61, 0x32, 0x32, 0x2e, 0x33, 0x2e, 0x36, 0, 0, 0, 0, 0, 0];

#[test]
fn configured_uuids() {
    if !is_child() {
        // Device 1 gets lavapipe's UUID (spelled in uppercase, without `GPU-`), device 2 keeps its default.
        let env = [
            ("FAKEGPU_DEVICES", "3"),
            (
                "FAKEGPU_UUIDS",
                "GPU-ffffffff-0000-0000-0000-000000000001, 6D657361-3232-2E33-2E36-000000000000",
            ),
            ("CUDA_VISIBLE_DEVICES", "GPU-6d657361-3232-2e33-2e36-000000000000,2"),
        ];
        return spawn_self("configured_uuids", &env);
    }
    let cuda = Driver::open("libcuda.so.1");
    let init = function!(cuda, cuInit: fn(c_uint) -> c_int);
    let count = function!(cuda, cuDeviceGetCount: fn(*mut c_int) -> c_int);
    let uuid = function!(cuda, cuDeviceGetUuid: fn(*mut [u8; 16], c_int) -> c_int);
    let uuid_v2 = function!(cuda, cuDeviceGetUuid_v2: fn(*mut [u8; 16], c_int) -> c_int);
    let name = function!(cuda, cuDeviceGetName: fn(*mut c_char, c_int, c_int) -> c_int);
    let mut n = 0;
    assert_eq!(init(0), SUCCESS);
    assert_eq!((count(&mut n), n), (SUCCESS, 2));
    let mut bytes = [0; 16];
    assert_eq!((uuid(&mut bytes, 0), bytes), (SUCCESS, LAVAPIPE_UUID), "ordinal 0 is found by UUID");
    assert_eq!((uuid_v2(&mut bytes, 0), bytes), (SUCCESS, LAVAPIPE_UUID));
    let mut buffer = [0 as c_char; 64];
    assert_eq!(name(buffer.as_mut_ptr(), 64, 0), SUCCESS);
    assert_eq!(text(buffer.as_ptr()), "Fake GPU 1");
    let default2 = [0xfa, 0xce, 0, 0, 0, 0, 0x4e, 0, 0x80, 0, 0, 0, 0, 0, 0, 2];
    assert_eq!((uuid_v2(&mut bytes, 1), bytes), (SUCCESS, default2));

    let nvml = Driver::open("libnvidia-ml.so.1");
    let nvml_init = function!(nvml, nvmlInit_v2: fn() -> c_int);
    let by_index = function!(nvml, nvmlDeviceGetHandleByIndex_v2: fn(c_uint, *mut *mut c_void) -> c_int);
    let get_uuid = function!(nvml, nvmlDeviceGetUUID: fn(*mut c_void, *mut c_char, c_uint) -> c_int);
    assert_eq!(nvml_init(), SUCCESS);
    let expected = [
        "GPU-ffffffff-0000-0000-0000-000000000001",
        "GPU-6d657361-3232-2e33-2e36-000000000000",
        "GPU-face0000-0000-4e00-8000-000000000002",
    ];
    for (index, expected) in (0..).zip(expected) {
        let mut device = null_mut();
        assert_eq!(by_index(index, &mut device), SUCCESS);
        assert_eq!(get_uuid(device, buffer.as_mut_ptr(), 41), SUCCESS);
        assert_eq!(text(buffer.as_ptr()), expected, "NVML device {index}");
    }
}

#[test]
fn bad_uuids_fail_init() {
    if !is_child() {
        for (value, devices) in [
            ("6d657361-3232-2e33-2e36-00000000000", "1"),
            ("6d657361-3232-2e33-2e36-00000000000g", "1"),
            ("6d657361-3232-2e33-2e36-000000000000,", "1"),
            ("6d657361-3232-2e33-2e36-000000000000,6d657361-3232-2e33-2e36-000000000000", "2"),
        ] {
            let env = [("FAKEGPU_UUIDS", value), ("FAKEGPU_DEVICES", devices)];
            let stderr = run_child("bad_uuids_fail_init", &env);
            let report = format!("fakegpu: FAKEGPU_UUIDS={value:?}: ");
            assert!(stderr.contains(&report), "{value}: {stderr}");
        }
        return;
    }
    const CUDA_UNKNOWN: c_int = 999;
    const NVML_UNKNOWN: c_int = 999;
    let cuda = Driver::open("libcuda.so.1");
    let init = function!(cuda, cuInit: fn(c_uint) -> c_int);
    let nvml_init = function!(cuda, nvmlInit_v2: fn() -> c_int);
    assert_eq!(init(0), CUDA_UNKNOWN);
    assert_eq!(nvml_init(), NVML_UNKNOWN);
}

/// `nvmlPciInfo_t` as `nvmlDeviceGetPciInfo_v3` fills it.
#[repr(C)]
struct PciInfo {
    bus_id_legacy: [c_char; 16],
    domain: c_uint,
    bus: c_uint,
    device: c_uint,
    pci_device_id: c_uint,
    pci_sub_system_id: c_uint,
    bus_id: [c_char; 32],
}

#[test]
fn pci_addresses() {
    if !is_child() {
        let env = [("FAKEGPU_DEVICES", "3"), ("FAKEGPU_CUDA_ORDER", "reverse")];
        return spawn_self("pci_addresses", &env);
    }
    const PCI_BUS_ID: c_int = 33;
    const PCI_DEVICE_ID: c_int = 34;
    const PCI_DOMAIN_ID: c_int = 50;
    const MULTIPROCESSOR_COUNT: c_int = 16;
    let cuda = Driver::open("libcuda.so.1");
    let init = function!(cuda, cuInit: fn(c_uint) -> c_int);
    let attribute = function!(cuda, cuDeviceGetAttribute: fn(*mut c_int, c_int, c_int) -> c_int);
    let get = |attrib, ordinal| {
        let mut value = -1;
        let result = attribute(&mut value, attrib, ordinal);
        (result, value)
    };
    assert_eq!(get(PCI_BUS_ID, 0), (NOT_INITIALIZED, -1));
    assert_eq!(init(0), SUCCESS);
    // Reverse order: ordinal i is physical device 2 − i, on bus 3 − i.
    for ordinal in 0..3 {
        assert_eq!(get(PCI_BUS_ID, ordinal), (SUCCESS, 3 - ordinal), "ordinal {ordinal}");
        assert_eq!(get(PCI_DEVICE_ID, ordinal), (SUCCESS, 0));
        assert_eq!(get(PCI_DOMAIN_ID, ordinal), (SUCCESS, 0));
    }
    assert_eq!(get(MULTIPROCESSOR_COUNT, 0), (SUCCESS, 132));
    assert_eq!(get(1, 0), (SUCCESS, 0), "other attributes stay 0");
    assert_eq!(get(PCI_BUS_ID, 3), (INVALID_DEVICE, -1));
    assert_eq!(attribute(null_mut(), PCI_BUS_ID, 0), INVALID_VALUE);

    let nvml = Driver::open("libnvidia-ml.so.1");
    let nvml_init = function!(nvml, nvmlInit_v2: fn() -> c_int);
    let by_index = function!(nvml, nvmlDeviceGetHandleByIndex_v2: fn(c_uint, *mut *mut c_void) -> c_int);
    let pci_info = function!(nvml, nvmlDeviceGetPciInfo_v3: fn(*mut c_void, *mut PciInfo) -> c_int);
    let mut device = null_mut();
    assert_eq!(nvml_init(), SUCCESS);
    assert_eq!(by_index(1, &mut device), SUCCESS);
    let mut info = PciInfo {
        bus_id_legacy: [1; 16],
        domain: 9,
        bus: 9,
        device: 9,
        pci_device_id: 9,
        pci_sub_system_id: 9,
        bus_id: [1; 32],
    };
    assert_eq!(pci_info(device, &mut info), SUCCESS);
    assert_eq!((info.domain, info.bus, info.device), (0, 2, 0), "physical device 1");
    assert_eq!((info.pci_device_id, info.pci_sub_system_id), (0x2330_10de, 0));
    assert_eq!(text(info.bus_id_legacy.as_ptr()), "0000:02:00.0");
    assert_eq!(text(info.bus_id.as_ptr()), "00000000:02:00.0");
    assert_eq!(pci_info(device, null_mut()), NVML_INVALID_ARGUMENT);
}

#[test]
fn shared_ledger() {
    let path = TempFile::new("ledger");
    if !is_child() {
        let _ = std::fs::remove_file(&path);
        let file = path.to_str().expect("UTF-8 temp path");
        for step in ["hold", "check"] {
            let env = [("FAKEGPU_SHARED", file), ("FAKEGPU_MEMORY", "1m"), ("SMOKE_STEP", step)];
            spawn_self("shared_ledger", &env);
        }
        let metadata = std::fs::metadata(&path).expect("ledger file");
        let _ = std::fs::remove_file(&path);
        assert_eq!(metadata.len(), 93184, "four tables: byte counters, device clocks, turns, processes");
        assert_eq!(std::os::unix::fs::PermissionsExt::mode(&metadata.permissions()) & 0o777, 0o666);
        return;
    }
    let cuda = Driver::open("libcuda.so.1");
    let alloc = function!(cuda, cuMemAlloc_v2: fn(*mut u64, usize) -> c_int);
    bind_context(&cuda, 0);
    let mut ptr = 0;
    if std::env::var("SMOKE_STEP").as_deref() == Ok("hold") {
        // Exit without freeing: a dead process's bytes stay counted in the file.
        assert_eq!(alloc(&mut ptr, 768 << 10), SUCCESS);
        return;
    }
    assert_eq!(stats(&cuda, 0), Some((768 << 10, 768 << 10, 1)));
    assert_eq!(alloc(&mut ptr, 512 << 10), OUT_OF_MEMORY);
    assert_eq!(alloc(&mut ptr, 256 << 10), SUCCESS);
    assert_eq!(stats(&cuda, 0), Some((MIB, MIB, 3)));
}

/// Physical device `index`'s used bytes, read through the test hook.
fn used(driver: &Driver, index: c_uint) -> u64 {
    stats(driver, index).expect("a device").0
}

#[test]
fn pitched_and_managed_memory() {
    if !is_child() {
        return spawn_self("pitched_and_managed_memory", &[("FAKEGPU_MEMORY", "64m")]);
    }
    let cuda = Driver::open("libcuda.so.1");
    let pitch_alloc =
        function!(cuda, cuMemAllocPitch_v2: fn(*mut u64, *mut usize, usize, usize, c_uint) -> c_int);
    let pitch32 =
        function!(cuda, cuMemAllocPitch: fn(*mut c_uint, *mut c_uint, c_uint, c_uint, c_uint) -> c_int);
    let managed = function!(cuda, cuMemAllocManaged: fn(*mut u64, usize, c_uint) -> c_int);
    let free = function!(cuda, cuMemFree_v2: fn(u64) -> c_int);
    let free32 = function!(cuda, cuMemFree: fn(c_uint) -> c_int);
    let range = function!(cuda, cuMemGetAddressRange_v2: fn(*mut u64, *mut usize, u64) -> c_int);
    let attribute = function!(cuda, cuDeviceGetAttribute: fn(*mut c_int, c_int, c_int) -> c_int);
    let init = function!(cuda, cuInit: fn(c_uint) -> c_int);

    let (mut ptr, mut pitch) = (0, 0);
    assert_eq!(pitch_alloc(&mut ptr, &mut pitch, 1000, 10, 4), NOT_INITIALIZED);
    assert_eq!(init(0), SUCCESS);
    assert_eq!(pitch_alloc(&mut ptr, &mut pitch, 1000, 10, 4), INVALID_CONTEXT);
    bind_context(&cuda, 0);
    assert_eq!(pitch_alloc(&mut ptr, &mut pitch, 1000, 10, 3), INVALID_VALUE, "element size 4, 8 or 16");
    assert_eq!(pitch_alloc(&mut ptr, null_mut(), 1000, 10, 4), INVALID_VALUE);
    assert_eq!(pitch_alloc(null_mut(), &mut pitch, 1000, 10, 4), INVALID_VALUE);
    assert_eq!(pitch_alloc(&mut ptr, &mut pitch, 0, 10, 4), INVALID_VALUE);
    assert_eq!(pitch_alloc(&mut ptr, &mut pitch, 1 << 20, 65, 16), OUT_OF_MEMORY);
    assert_eq!(pitch_alloc(&mut ptr, &mut pitch, 1000, 10, 4), SUCCESS);
    assert_eq!((pitch, used(&cuda, 0)), (1024, 10 * 1024), "pitch × height is charged");
    let (mut base, mut size) = (0, 0);
    assert_eq!(range(&mut base, &mut size, ptr + 5000), SUCCESS);
    assert_eq!((base, size), (ptr, 10 * 1024));
    assert_eq!(range(null_mut(), null_mut(), ptr), SUCCESS, "NULL outs are skipped");
    assert_eq!(range(&mut base, &mut size, ptr + 10 * 1024), NOT_FOUND);
    let (mut small, mut small_pitch) = (0, 0);
    assert_eq!(pitch32(&mut small, &mut small_pitch, 100, 3, 8), SUCCESS);
    assert!(small != 0 && small_pitch == 512);
    assert_eq!(used(&cuda, 0), 10 * 1024 + 3 * 512);
    assert_eq!(free32(small), SUCCESS);
    assert_eq!(free(ptr), SUCCESS);

    assert_eq!(managed(&mut ptr, MIB as usize, 0), INVALID_VALUE, "flags must be GLOBAL or HOST");
    assert_eq!(managed(null_mut(), MIB as usize, 1), INVALID_VALUE);
    assert_eq!(managed(&mut ptr, 0, 1), INVALID_VALUE);
    // Managed memory is host-backed: it may exceed the 64 MiB card and is not physical memory.
    let managed_bytes = function!(cuda, fakegpu_managed_bytes: fn(c_uint) -> u64);
    let mut big = 0;
    assert_eq!(managed(&mut big, 65 * MIB as usize, 1), SUCCESS);
    assert_eq!(managed(&mut ptr, MIB as usize, 2), SUCCESS);
    assert_eq!((used(&cuda, 0), managed_bytes(0)), (0, 66 * MIB));
    let mut card = 0;
    assert_eq!(pitch_alloc(&mut card, &mut pitch, 1 << 20, 64, 16), SUCCESS, "the card is still free");
    // Advice and prefetch accept a range inside one live managed block only.
    let advise = function!(cuda, cuMemAdvise: fn(u64, usize, c_int, c_int) -> c_int);
    let prefetch = function!(cuda, cuMemPrefetchAsync: fn(u64, usize, c_int, *mut c_void) -> c_int);
    let prefetched = function!(cuda, fakegpu_prefetched_bytes: fn() -> u64);
    assert_eq!(advise(big, 65 * MIB as usize, 3, 0), SUCCESS, "preferred location: device 0");
    assert_eq!(advise(big, 65 * MIB as usize, 5, -1), SUCCESS, "accessed by the CPU");
    assert_eq!(advise(big, 65 * MIB as usize, 9, 0), INVALID_VALUE, "no such advice");
    assert_eq!(advise(card, MIB as usize, 3, 0), INVALID_VALUE, "device memory takes no advice");
    assert_eq!(advise(big + MIB, 65 * MIB as usize, 3, 0), INVALID_VALUE, "past the block");
    assert_eq!(prefetch(big, 65 * MIB as usize, 0, null_mut()), SUCCESS);
    assert_eq!(prefetch(big, MIB as usize, 7, null_mut()), INVALID_DEVICE);
    assert_eq!(prefetched(), 65 * MIB);
    assert_eq!(free(card), SUCCESS);
    assert_eq!(free(big), SUCCESS);
    assert_eq!(free(ptr), SUCCESS);
    assert_eq!(free(ptr), INVALID_VALUE);
    assert_eq!(managed_bytes(0), 0);
    // With a context: 8 pitched calls (refused ones included) and 5 managed; the peak is the card.
    assert_eq!(stats(&cuda, 0), Some((0, 64 * MIB, 13)));

    let mut value = -1;
    assert_eq!((attribute(&mut value, 16, 0), value), (SUCCESS, 132));
    assert_eq!((attribute(&mut value, 1, 0), value), (SUCCESS, 0));
    assert_eq!(attribute(null_mut(), 16, 0), INVALID_VALUE);
    assert_eq!(attribute(&mut value, 16, 1), INVALID_DEVICE);
}

#[test]
fn stream_ordered_pools() {
    if !is_child() {
        return spawn_self("stream_ordered_pools", &[("FAKEGPU_MEMORY", "64m"), ("FAKEGPU_DEVICES", "2")]);
    }
    let cuda = Driver::open("libcuda.so.1");
    let init = function!(cuda, cuInit: fn(c_uint) -> c_int);
    let alloc_async = function!(cuda, cuMemAllocAsync: fn(*mut u64, usize, *mut c_void) -> c_int);
    let free_async = function!(cuda, cuMemFreeAsync: fn(u64, *mut c_void) -> c_int);
    let from_pool =
        function!(cuda, cuMemAllocFromPoolAsync: fn(*mut u64, usize, *mut c_void, *mut c_void) -> c_int);
    let default_pool = function!(cuda, cuDeviceGetDefaultMemPool: fn(*mut *mut c_void, c_int) -> c_int);
    let current_pool = function!(cuda, cuDeviceGetMemPool: fn(*mut *mut c_void, c_int) -> c_int);
    let pool_create = function!(cuda, cuMemPoolCreate: fn(*mut *mut c_void, *const MemoryProps) -> c_int);
    let pool_destroy = function!(cuda, cuMemPoolDestroy: fn(*mut c_void) -> c_int);
    let set_attribute = function!(cuda, cuMemPoolSetAttribute: fn(*mut c_void, c_int, *mut c_void) -> c_int);
    let get_attribute = function!(cuda, cuMemPoolGetAttribute: fn(*mut c_void, c_int, *mut c_void) -> c_int);
    let trim = function!(cuda, cuMemPoolTrimTo: fn(*mut c_void, usize) -> c_int);
    let stream_create = function!(cuda, cuStreamCreate: fn(*mut *mut c_void, c_uint) -> c_int);
    let stream_destroy = function!(cuda, cuStreamDestroy_v2: fn(*mut c_void) -> c_int);
    let stream_sync = function!(cuda, cuStreamSynchronize: fn(*mut c_void) -> c_int);
    let ctx_sync = function!(cuda, cuCtxSynchronize: fn() -> c_int);
    let free = function!(cuda, cuMemFree_v2: fn(u64) -> c_int);
    let info = function!(cuda, cuMemGetInfo_v2: fn(*mut usize, *mut usize) -> c_int);
    let get_proc = function!(cuda, cuGetProcAddress_v2: fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int) -> c_int);
    let attribute = |pool, attribute| {
        let mut value = u64::MAX;
        assert_eq!(get_attribute(pool, attribute, (&raw mut value).cast()), SUCCESS);
        value
    };
    const RELEASE_THRESHOLD: c_int = 4;
    const RESERVED_MEM_CURRENT: c_int = 5;
    const USED_MEM_CURRENT: c_int = 7;
    let per_thread = std::ptr::without_provenance_mut::<c_void>(2);

    let (mut ptr, mut pool, mut stream) = (0, null_mut(), null_mut());
    assert_eq!(init(0), SUCCESS);
    assert_eq!(alloc_async(&mut ptr, 512, null_mut()), INVALID_CONTEXT, "the NULL stream needs a context");
    assert_eq!(stream_sync(null_mut()), INVALID_CONTEXT);
    assert_eq!(ctx_sync(), INVALID_CONTEXT);
    assert_eq!(default_pool(&mut pool, 0), SUCCESS, "pools need no context");
    assert_eq!(default_pool(null_mut(), 0), INVALID_VALUE);
    assert_eq!(default_pool(&mut pool, 2), INVALID_DEVICE);
    let mut same = null_mut();
    assert_eq!(current_pool(&mut same, 0), SUCCESS);
    assert_eq!(same, pool);
    bind_context(&cuda, 0);
    assert_eq!(stream_create(&mut stream, 0), SUCCESS);
    assert!(!stream.is_null());
    assert_eq!(stream_create(&mut same, 4), INVALID_VALUE);

    // Threshold 0: a freed allocation stays charged until a synchronize, then goes back.
    assert_eq!(alloc_async(&mut ptr, MIB as usize, null_mut()), SUCCESS);
    assert_eq!(used(&cuda, 0), MIB);
    assert_eq!((attribute(pool, USED_MEM_CURRENT), attribute(pool, RESERVED_MEM_CURRENT)), (MIB, MIB));
    assert_eq!(free_async(ptr, stream), SUCCESS);
    assert_eq!(free_async(ptr, stream), INVALID_VALUE, "already freed");
    assert_eq!(used(&cuda, 0), MIB);
    assert_eq!(stream_sync(stream), SUCCESS);
    assert_eq!(used(&cuda, 0), 0);
    assert_eq!(attribute(pool, RESERVED_MEM_CURRENT), 0);

    // A 4 MiB threshold keeps freed memory reserved; the cache serves the next allocation.
    let mut threshold = 4 * MIB;
    assert_eq!(set_attribute(pool, RELEASE_THRESHOLD, (&raw mut threshold).cast()), SUCCESS);
    assert_eq!(attribute(pool, RELEASE_THRESHOLD), 4 * MIB);
    assert_eq!(alloc_async(&mut ptr, 3 * MIB as usize, stream), SUCCESS);
    assert_eq!(free_async(ptr, stream), SUCCESS);
    assert_eq!(trim(pool, 0), SUCCESS);
    assert_eq!(used(&cuda, 0), 3 * MIB, "a pending free is still in use");
    assert_eq!(ctx_sync(), SUCCESS);
    assert_eq!((attribute(pool, USED_MEM_CURRENT), attribute(pool, RESERVED_MEM_CURRENT)), (0, 3 * MIB));
    assert_eq!(used(&cuda, 0), 3 * MIB);
    assert_eq!(alloc_async(&mut ptr, 2 * MIB as usize, per_thread), SUCCESS);
    assert_eq!(used(&cuda, 0), 3 * MIB, "served from the cache");
    let mut a = 0;
    assert_eq!(alloc_async(&mut a, 2 * MIB as usize, stream), SUCCESS);
    assert_eq!(used(&cuda, 0), 4 * MIB, "only what the cache lacks is charged");
    assert_eq!(free(a), SUCCESS, "cuMemFree takes pool memory too");
    assert_eq!(free_async(ptr, null_mut()), SUCCESS);
    assert_eq!(stream_sync(null_mut()), SUCCESS);
    assert_eq!(used(&cuda, 0), 4 * MIB, "at the threshold");
    assert_eq!(trim(pool, MIB as usize), SUCCESS);
    assert_eq!((used(&cuda, 0), attribute(pool, RESERVED_MEM_CURRENT)), (MIB, MIB));
    let (mut free_bytes, mut total) = (0, 0);
    assert_eq!(info(&mut free_bytes, &mut total), SUCCESS);
    assert_eq!(free_bytes as u64, 63 * MIB, "cuMemGetInfo counts reserved pool memory");
    assert_eq!(trim(pool, 0), SUCCESS);
    assert_eq!(used(&cuda, 0), 0);

    // The _ptsz variants, as cuGetProcAddress hands them out for the per-thread default stream.
    let mut pfn = null_mut();
    assert_eq!(get_proc(c"cuMemAllocAsync".as_ptr(), &mut pfn, 12000, 2, null_mut()), SUCCESS);
    assert_eq!(pfn, cuda.address("cuMemAllocAsync_ptsz"));
    // SAFETY: `pfn` is the fake's cuMemAllocAsync_ptsz, whose C signature this is.
    let alloc_ptsz = unsafe {
        std::mem::transmute::<*mut c_void, extern "C" fn(*mut u64, usize, *mut c_void) -> c_int>(pfn)
    };
    assert_eq!(alloc_ptsz(&mut ptr, MIB as usize, null_mut()), SUCCESS);
    let free_ptsz = function!(cuda, cuMemFreeAsync_ptsz: fn(u64, *mut c_void) -> c_int);
    assert_eq!(free_ptsz(ptr, per_thread), SUCCESS);
    assert_eq!(stream_sync(per_thread), SUCCESS);
    let call_count = function!(cuda, fakegpu_call_count: fn(*const c_char) -> u64);
    assert_eq!(call_count(c"cuMemAllocAsync_ptsz".as_ptr()), 1);
    assert_eq!(call_count(c"cuMemFreeAsync_ptsz".as_ptr()), 1);

    // A created pool on device 1, destroyed with an allocation outstanding.
    let mut created = null_mut();
    assert_eq!(pool_create(&mut created, &pinned_on(1)), SUCCESS);
    assert_eq!(pool_create(&mut created, null()), INVALID_VALUE);
    assert_eq!(pool_create(&mut created, &MemoryProps { location_type: 2, ..pinned_on(1) }), INVALID_VALUE);
    assert_eq!(pool_create(&mut created, &pinned_on(2)), INVALID_DEVICE);
    assert_eq!(pool_create(&mut created, &pinned_on(1)), SUCCESS);
    assert_eq!(from_pool(&mut ptr, 2 * MIB as usize, created, stream), SUCCESS);
    assert_eq!(stats(&cuda, 1), Some((2 * MIB, 2 * MIB, 1)));
    assert_eq!(from_pool(&mut a, 512, pool, stream), SUCCESS);
    assert_eq!(from_pool(&mut a, 512, stream, stream), INVALID_VALUE, "not a pool");
    assert_eq!(from_pool(null_mut(), 512, pool, stream), INVALID_VALUE);
    assert_eq!(from_pool(&mut a, 65 * MIB as usize, created, stream), OUT_OF_MEMORY);
    assert_eq!(pool_destroy(pool), INVALID_VALUE, "a default pool cannot be destroyed");
    assert_eq!(pool_destroy(created), SUCCESS);
    assert_eq!(pool_destroy(created), INVALID_VALUE);
    assert_eq!(get_attribute(created, USED_MEM_CURRENT, (&raw mut threshold).cast()), INVALID_VALUE);
    assert_eq!(stats(&cuda, 1).map(|s| s.0), Some(2 * MIB), "outstanding allocations stay charged");
    assert_eq!(free_async(ptr, stream), SUCCESS);
    assert_eq!(stream_sync(stream), SUCCESS);
    assert_eq!(stats(&cuda, 1).map(|s| s.0), Some(0));

    assert_eq!(set_attribute(pool, RESERVED_MEM_CURRENT, (&raw mut threshold).cast()), INVALID_VALUE);
    assert_eq!(set_attribute(pool, 99, (&raw mut threshold).cast()), INVALID_VALUE);
    assert_eq!(get_attribute(pool, USED_MEM_CURRENT, null_mut()), INVALID_VALUE);
    assert_eq!(alloc_async(&mut ptr, 0, stream), INVALID_VALUE);
    assert_eq!(alloc_async(null_mut(), 512, stream), INVALID_VALUE);
    let stranger = std::ptr::without_provenance_mut::<c_void>(0x1234_5678);
    assert_eq!(alloc_async(&mut ptr, 512, stranger), INVALID_VALUE, "not a stream");
    assert_eq!(stream_sync(stranger), INVALID_VALUE);
    assert_eq!(free_async(0xdead_0000, stream), INVALID_VALUE);
    assert_eq!(alloc_async(&mut ptr, 65 * MIB as usize, stream), OUT_OF_MEMORY);
    assert_eq!(stream_destroy(stream), SUCCESS);
    assert_eq!(stream_destroy(stream), INVALID_VALUE);
    assert_eq!(free_async(a, stream), INVALID_VALUE, "a destroyed stream");
}

#[test]
fn vmm_charges_physical_memory_only() {
    if !is_child() {
        return spawn_self(
            "vmm_charges_physical_memory_only",
            &[("FAKEGPU_MEMORY", "64m"), ("FAKEGPU_DEVICES", "2")],
        );
    }
    let cuda = Driver::open("libcuda.so.1");
    let init = function!(cuda, cuInit: fn(c_uint) -> c_int);
    let granularity =
        function!(cuda, cuMemGetAllocationGranularity: fn(*mut usize, *const MemoryProps, c_int) -> c_int);
    let create = function!(cuda, cuMemCreate: fn(*mut u64, usize, *const MemoryProps, u64) -> c_int);
    let release = function!(cuda, cuMemRelease: fn(u64) -> c_int);
    let reserve = function!(cuda, cuMemAddressReserve: fn(*mut u64, usize, usize, u64, u64) -> c_int);
    let address_free = function!(cuda, cuMemAddressFree: fn(u64, usize) -> c_int);
    let map = function!(cuda, cuMemMap: fn(u64, usize, usize, u64, u64) -> c_int);
    let unmap = function!(cuda, cuMemUnmap: fn(u64, usize) -> c_int);
    let set_access = function!(cuda, cuMemSetAccess: fn(u64, usize, *const [c_int; 3], usize) -> c_int);
    let range = function!(cuda, cuMemGetAddressRange_v2: fn(*mut u64, *mut usize, u64) -> c_int);
    let two = 2 * MIB as usize;

    let (mut size, mut handle, mut start) = (0, 0, 0);
    assert_eq!(create(&mut handle, two, &pinned_on(1), 0), NOT_INITIALIZED);
    assert_eq!(init(0), SUCCESS);
    // No context needed for any of these.
    assert_eq!((granularity(&mut size, &pinned_on(1), 0), size), (SUCCESS, two));
    assert_eq!((granularity(&mut size, &pinned_on(1), 1), size), (SUCCESS, two));
    assert_eq!(granularity(null_mut(), &pinned_on(1), 0), INVALID_VALUE);
    assert_eq!(granularity(&mut size, null(), 0), INVALID_VALUE);
    assert_eq!(
        create(&mut handle, 3 * MIB as usize, &pinned_on(1), 0),
        INVALID_VALUE,
        "not a granularity multiple"
    );
    assert_eq!(create(&mut handle, two, &MemoryProps { alloc_type: 2, ..pinned_on(1) }, 0), INVALID_VALUE);
    assert_eq!(create(null_mut(), two, &pinned_on(1), 0), INVALID_VALUE);
    assert_eq!(create(&mut handle, two, &pinned_on(5), 0), INVALID_DEVICE);
    assert_eq!(create(&mut handle, 66 * MIB as usize, &pinned_on(1), 0), OUT_OF_MEMORY);
    assert_eq!(create(&mut handle, 2 * two, &pinned_on(1), 0), SUCCESS);
    assert_eq!((used(&cuda, 0), used(&cuda, 1)), (0, 4 * MIB), "charged to location.id");

    // Reserving (far more than the card) and mapping cost nothing.
    assert_eq!(reserve(&mut start, 1 << 40, 0, 0, 0), SUCCESS);
    assert!(start != 0 && start % two as u64 == 0);
    assert_eq!(reserve(&mut size as *mut usize as *mut u64, 100, 0, 0, 0), INVALID_VALUE);
    assert_eq!(reserve(null_mut(), two, 0, 0, 0), INVALID_VALUE);
    assert_eq!(used(&cuda, 1), 4 * MIB);
    assert_eq!(map(start, 2 * two, 0, handle, 0), SUCCESS);
    assert_eq!(map(start, two, 0, handle, 0), INVALID_VALUE, "already mapped");
    assert_eq!(map(start + 2 * two as u64, 2 * two, two, handle, 0), INVALID_VALUE, "past the allocation");
    assert_eq!(map(start + 2 * two as u64, two, two, handle, 0), SUCCESS, "the second half again");
    assert_eq!(map(start + 4 * two as u64, two, 0, 12345, 0), INVALID_VALUE);
    assert_eq!(used(&cuda, 1), 4 * MIB);
    let desc = [1, 1, 3];
    assert_eq!(set_access(start, 3 * two, &desc, 1), SUCCESS);
    assert_eq!(set_access(start, 4 * two, &desc, 1), INVALID_VALUE, "not all mapped");
    assert_eq!(set_access(start, two, null(), 1), INVALID_VALUE);
    bind_context(&cuda, 0);
    let (mut base, mut bytes) = (0, 0);
    assert_eq!(range(&mut base, &mut bytes, start + two as u64 + 7), SUCCESS);
    assert_eq!((base, bytes), (start, 2 * two));

    // Released while mapped: the memory lives until the last unmap.
    assert_eq!(release(handle), SUCCESS);
    assert_eq!(release(handle), INVALID_VALUE);
    assert_eq!(used(&cuda, 1), 4 * MIB);
    assert_eq!(address_free(start, 1 << 40), INVALID_VALUE, "still mapped");
    assert_eq!(unmap(start + two as u64, two), INVALID_VALUE, "part of a mapping");
    assert_eq!(unmap(start, 2 * two), SUCCESS);
    assert_eq!(used(&cuda, 1), 4 * MIB);
    assert_eq!(unmap(start + 2 * two as u64, two), SUCCESS);
    assert_eq!(used(&cuda, 1), 0);
    assert_eq!(unmap(start, two), INVALID_VALUE);
    assert_eq!(address_free(start, two), INVALID_VALUE, "not the whole reservation");
    assert_eq!(address_free(start, 1 << 40), SUCCESS);

    // Released unmapped: credited at once.
    assert_eq!(create(&mut handle, two, &pinned_on(0), 0), SUCCESS);
    assert_eq!(used(&cuda, 0), 2 * MIB);
    assert_eq!(release(handle), SUCCESS);
    assert_eq!(used(&cuda, 0), 0);
    assert_eq!(stats(&cuda, 1).map(|s| s.2), Some(3), "cuMemCreate calls with a known device");
}

#[test]
fn arrays_charge_their_size() {
    if !is_child() {
        return spawn_self("arrays_charge_their_size", &[("FAKEGPU_MEMORY", "64m")]);
    }
    let cuda = Driver::open("libcuda.so.1");
    let init = function!(cuda, cuInit: fn(c_uint) -> c_int);
    let create_v1 = function!(cuda, cuArrayCreate: fn(*mut *mut c_void, *const c_void) -> c_int);
    let create = function!(cuda, cuArrayCreate_v2: fn(*mut *mut c_void, *const (usize, usize, c_int, c_uint)) -> c_int);
    let create_3d = function!(cuda, cuArray3DCreate_v2: fn(*mut *mut c_void, *const Array3d) -> c_int);
    let destroy = function!(cuda, cuArrayDestroy: fn(*mut c_void) -> c_int);
    let create_mip =
        function!(cuda, cuMipmappedArrayCreate: fn(*mut *mut c_void, *const Array3d, c_uint) -> c_int);
    let destroy_mip = function!(cuda, cuMipmappedArrayDestroy: fn(*mut c_void) -> c_int);
    #[repr(C)]
    struct Array3d {
        width: usize,
        height: usize,
        depth: usize,
        format: c_int,
        channels: c_uint,
        flags: c_uint,
    }
    let cube =
        |width, height, depth, format, channels| Array3d { width, height, depth, format, channels, flags: 0 };
    const FLOAT: c_int = 0x20;

    let (mut array, mut volume, mut line, mut mip) = (null_mut(), null_mut(), null_mut(), null_mut());
    assert_eq!(init(0), SUCCESS);
    assert_eq!(create(&mut array, &(1000, 100, FLOAT, 4)), INVALID_CONTEXT);
    bind_context(&cuda, 0);
    assert_eq!(create_v1(&mut array, null()), NOT_SUPPORTED);
    assert_eq!(create(&mut array, &(1000, 100, FLOAT, 4)), SUCCESS);
    assert_eq!(used(&cuda, 0), 1000 * 100 * 4 * 4);
    assert_eq!(create_3d(&mut volume, &cube(64, 64, 64, 0x01, 1)), SUCCESS);
    assert_eq!(create_3d(&mut line, &cube(100, 0, 0, 0x10, 2)), SUCCESS, "height and depth 0 count as 1");
    assert_eq!(create_mip(&mut mip, &cube(8, 4, 0, FLOAT, 1), 4), SUCCESS);
    assert_eq!(used(&cuda, 0), 1_600_000 + 262_144 + 400 + 4 * (32 + 8 + 2 + 1));
    assert_eq!(create(&mut line, &(100, 1, 0x07, 1)), INVALID_VALUE, "unknown format");
    assert_eq!(create(&mut line, &(100, 1, FLOAT, 3)), INVALID_VALUE, "3 channels");
    assert_eq!(create(&mut line, &(0, 1, FLOAT, 1)), INVALID_VALUE);
    assert_eq!(create(&mut line, null()), INVALID_VALUE);
    assert_eq!(create(null_mut(), &(1, 1, FLOAT, 1)), INVALID_VALUE);
    assert_eq!(create_mip(&mut line, &cube(8, 4, 0, FLOAT, 1), 0), INVALID_VALUE);
    assert_eq!(create_3d(&mut line, &cube(4096, 4096, 2, FLOAT, 1)), OUT_OF_MEMORY);
    assert_eq!(destroy_mip(array), INVALID_VALUE, "an array is not a mipmapped array");
    assert_eq!(destroy(mip), INVALID_VALUE);
    assert_eq!(destroy(array), SUCCESS);
    assert_eq!(destroy(array), INVALID_VALUE);
    assert_eq!(destroy_mip(mip), SUCCESS);
    assert_eq!(destroy(volume), SUCCESS);
    assert_eq!(used(&cuda, 0), 400);
}

#[test]
fn contexts_cost_memory() {
    if !is_child() {
        let env = [("FAKEGPU_MEMORY", "1g"), ("FAKEGPU_CONTEXT_MEMORY", "300m"), ("FAKEGPU_DEVICES", "2")];
        return spawn_self("contexts_cost_memory", &env);
    }
    let cuda = Driver::open("libcuda.so.1");
    let init = function!(cuda, cuInit: fn(c_uint) -> c_int);
    let retain = function!(cuda, cuDevicePrimaryCtxRetain: fn(*mut *mut c_void, c_int) -> c_int);
    let release = function!(cuda, cuDevicePrimaryCtxRelease_v2: fn(c_int) -> c_int);
    let create_v1 = function!(cuda, cuCtxCreate: fn(*mut *mut c_void, c_uint, c_int) -> c_int);
    let create = function!(cuda, cuCtxCreate_v2: fn(*mut *mut c_void, c_uint, c_int) -> c_int);
    let create_v3 =
        function!(cuda, cuCtxCreate_v3: fn(*mut *mut c_void, *mut c_void, c_int, c_uint, c_int) -> c_int);
    let create_v4 =
        function!(cuda, cuCtxCreate_v4: fn(*mut *mut c_void, *mut c_void, c_uint, c_int) -> c_int);
    let destroy = function!(cuda, cuCtxDestroy_v2: fn(*mut c_void) -> c_int);
    let push = function!(cuda, cuCtxPushCurrent_v2: fn(*mut c_void) -> c_int);
    let pop = function!(cuda, cuCtxPopCurrent_v2: fn(*mut *mut c_void) -> c_int);
    let set_current = function!(cuda, cuCtxSetCurrent: fn(*mut c_void) -> c_int);
    let get_current = function!(cuda, cuCtxGetCurrent: fn(*mut *mut c_void) -> c_int);
    let get_device = function!(cuda, cuCtxGetDevice: fn(*mut c_int) -> c_int);
    let sync = function!(cuda, cuCtxSynchronize: fn() -> c_int);
    let info = function!(cuda, cuMemGetInfo_v2: fn(*mut usize, *mut usize) -> c_int);
    let current = || {
        let mut context = std::ptr::dangling_mut();
        assert_eq!(get_current(&mut context), SUCCESS);
        context
    };

    let (mut primary, mut a, mut b, mut c) = (null_mut(), null_mut(), null_mut(), null_mut());
    assert_eq!(init(0), SUCCESS);
    assert_eq!(retain(&mut primary, 0), SUCCESS);
    assert_eq!(used(&cuda, 0), 300 * MIB, "the first retain creates the primary context");
    assert_eq!(retain(&mut primary, 0), SUCCESS);
    assert_eq!(retain(null_mut(), 0), INVALID_VALUE);
    assert_eq!(used(&cuda, 0), 300 * MIB);
    assert_eq!(current(), null_mut());
    assert_eq!(create_v1(&mut a, 0, 0), NOT_SUPPORTED);
    assert_eq!(create(&mut a, 0, 0), SUCCESS);
    assert!(!a.is_null() && a != primary);
    assert_eq!(current(), a, "cuCtxCreate makes the new context current");
    assert_eq!(used(&cuda, 0), 600 * MIB);
    let (mut free_bytes, mut total) = (0, 0);
    assert_eq!(info(&mut free_bytes, &mut total), SUCCESS);
    assert_eq!(free_bytes as u64, 424 * MIB);
    assert_eq!(create_v3(&mut b, null_mut(), 0, 0, 0), SUCCESS);
    assert_eq!(used(&cuda, 0), 900 * MIB);
    assert_eq!(create_v4(&mut c, null_mut(), 0, 0), OUT_OF_MEMORY, "a fourth context does not fit");
    assert_eq!(create_v3(&mut c, null_mut(), 1, 0, 0), INVALID_VALUE);
    assert_eq!(create(&mut c, 0x100, 0), INVALID_VALUE, "unknown flag");
    assert_eq!(create(&mut c, 0, 2), INVALID_DEVICE);
    assert_eq!(create(null_mut(), 0, 0), INVALID_VALUE);
    assert_eq!(create_v4(&mut c, null_mut(), 0, 1), SUCCESS, "device 1 has room");
    assert_eq!((used(&cuda, 0), used(&cuda, 1)), (900 * MIB, 300 * MIB));
    let mut device = -1;
    assert_eq!((get_device(&mut device), device), (SUCCESS, 1));

    // The stack: c (top), b, a.
    assert_eq!(push(primary), SUCCESS);
    assert_eq!(current(), primary);
    assert_eq!(push(null_mut()), INVALID_VALUE);
    let mut popped = null_mut();
    assert_eq!(pop(&mut popped), SUCCESS);
    assert_eq!((popped, current()), (primary, c));
    assert_eq!(destroy(c), SUCCESS, "destroying the current context pops it");
    assert_eq!(current(), b);
    assert_eq!(used(&cuda, 1), 0);
    assert_eq!(destroy(c), INVALID_CONTEXT);
    assert_eq!(set_current(c), INVALID_CONTEXT);
    assert_eq!(destroy(primary), INVALID_CONTEXT, "a primary context is released, not destroyed");
    assert_eq!(destroy(null_mut()), INVALID_VALUE);
    assert_eq!(push(primary), SUCCESS);
    assert_eq!(destroy(b), SUCCESS);
    assert_eq!(pop(null_mut()), SUCCESS);
    assert_eq!(current(), b, "b stays on the stack, destroyed");
    assert_eq!(sync(), CONTEXT_IS_DESTROYED);
    assert_eq!(set_current(a), SUCCESS, "replaces the top");
    assert_eq!(sync(), SUCCESS);
    assert_eq!(pop(null_mut()), SUCCESS);
    assert_eq!(current(), a);
    assert_eq!(set_current(null_mut()), SUCCESS, "NULL pops");
    assert_eq!(current(), null_mut());
    assert_eq!(pop(null_mut()), INVALID_CONTEXT);
    assert_eq!(sync(), INVALID_CONTEXT);
    assert_eq!(destroy(a), SUCCESS);
    assert_eq!(used(&cuda, 0), 300 * MIB);
    assert_eq!((release(0), release(0), release(0)), (SUCCESS, SUCCESS, INVALID_CONTEXT));
    assert_eq!(used(&cuda, 0), 0, "the last release frees the primary context");
    assert_eq!(stats(&cuda, 0).map(|s| s.1), Some(900 * MIB));
}

#[test]
fn host_memory_is_not_device_memory() {
    if !is_child() {
        return spawn_self("host_memory_is_not_device_memory", &[("FAKEGPU_MEMORY", "1m")]);
    }
    let cuda = Driver::open("libcuda.so.1");
    let host_alloc = function!(cuda, cuMemHostAlloc: fn(*mut *mut c_void, usize, c_uint) -> c_int);
    let alloc_host = function!(cuda, cuMemAllocHost_v2: fn(*mut *mut c_void, usize) -> c_int);
    let free_host = function!(cuda, cuMemFreeHost: fn(*mut c_void) -> c_int);
    let register = function!(cuda, cuMemHostRegister_v2: fn(*mut c_void, usize, c_uint) -> c_int);
    let unregister = function!(cuda, cuMemHostUnregister: fn(*mut c_void) -> c_int);
    bind_context(&cuda, 0);

    let (mut pinned, mut other) = (null_mut(), null_mut());
    assert_eq!(host_alloc(&mut pinned, 4 * MIB as usize, 1 | 2), SUCCESS, "bigger than the device");
    assert_eq!(alloc_host(&mut other, 4 * MIB as usize), SUCCESS);
    assert!(!pinned.is_null() && pinned.addr() % 4096 == 0);
    // SAFETY: the fake backs host allocations with real memory of the requested size.
    unsafe {
        std::ptr::write_bytes(pinned.cast::<u8>(), 0xab, 4 * MIB as usize);
        assert_eq!(pinned.cast::<u8>().add(4 * MIB as usize - 1).read(), 0xab);
    }
    assert_eq!(used(&cuda, 0), 0);
    assert_eq!(host_alloc(&mut other, 16, 8), INVALID_VALUE, "unknown flag");
    assert_eq!(host_alloc(null_mut(), 16, 0), INVALID_VALUE);
    assert_eq!(register(pinned, 4096, 0), HOST_MEMORY_ALREADY_REGISTERED);

    let mut buffer = vec![0u8; 1 << 16];
    let start = buffer.as_mut_ptr().cast::<c_void>();
    assert_eq!(register(start, buffer.len(), 0), SUCCESS);
    assert_eq!(register(start.wrapping_add(4096), 4096, 0), HOST_MEMORY_ALREADY_REGISTERED);
    assert_eq!(register(null_mut(), 4096, 0), INVALID_VALUE);
    assert_eq!(used(&cuda, 0), 0);
    assert_eq!(unregister(start.wrapping_add(4096)), HOST_MEMORY_NOT_REGISTERED);
    assert_eq!(unregister(start), SUCCESS);
    assert_eq!(unregister(start), HOST_MEMORY_NOT_REGISTERED);
    assert_eq!(free_host(start), INVALID_VALUE, "not the driver's");
    assert_eq!(free_host(pinned), SUCCESS);
    assert_eq!(free_host(pinned), INVALID_VALUE);
    assert_eq!(free_host(other), SUCCESS);
    assert_eq!(stats(&cuda, 0), Some((0, 0, 0)));
}

#[test]
fn ipc_open_charges_nothing() {
    if !is_child() {
        return spawn_self("ipc_open_charges_nothing", &[("FAKEGPU_MEMORY", "4m")]);
    }
    let cuda = Driver::open("libcuda.so.1");
    let alloc = function!(cuda, cuMemAlloc_v2: fn(*mut u64, usize) -> c_int);
    let managed = function!(cuda, cuMemAllocManaged: fn(*mut u64, usize, c_uint) -> c_int);
    let get_handle = function!(cuda, cuIpcGetMemHandle: fn(*mut [u8; 64], u64) -> c_int);
    let open = function!(cuda, cuIpcOpenMemHandle_v2: fn(*mut u64, [u8; 64], c_uint) -> c_int);
    let close = function!(cuda, cuIpcCloseMemHandle: fn(u64) -> c_int);
    let range = function!(cuda, cuMemGetAddressRange_v2: fn(*mut u64, *mut usize, u64) -> c_int);
    bind_context(&cuda, 0);

    let (mut ptr, mut opened, mut handle) = (0, 0, [0u8; 64]);
    assert_eq!(alloc(&mut ptr, 3 * MIB as usize), SUCCESS);
    assert_eq!(get_handle(null_mut(), ptr), INVALID_VALUE);
    assert_eq!(get_handle(&mut handle, 0xdead_0000), INVALID_VALUE);
    assert_eq!(get_handle(&mut handle, ptr), SUCCESS);
    assert_eq!(open(&mut opened, handle, 1), SUCCESS);
    assert!(opened != 0 && opened != ptr);
    assert_eq!(used(&cuda, 0), 3 * MIB, "opening maps memory already paid for");
    let (mut base, mut size) = (0, 0);
    assert_eq!(range(&mut base, &mut size, opened + 10), SUCCESS);
    assert_eq!((base, size), (opened, 3 * MIB as usize));
    assert_eq!(open(null_mut(), handle, 0), INVALID_VALUE);
    assert_eq!(open(&mut opened, [7; 64], 0), INVALID_VALUE, "not a handle");
    assert_eq!(open(&mut opened, handle, 2), INVALID_VALUE, "unknown flag");
    assert_eq!(close(opened), SUCCESS);
    assert_eq!(close(opened), INVALID_VALUE);
    assert_eq!(managed(&mut ptr, 4096, 1), SUCCESS);
    assert_eq!(get_handle(&mut handle, ptr), INVALID_VALUE, "managed memory cannot be exported");
    assert_eq!(used(&cuda, 0), 3 * MIB, "managed memory is counted apart from the card");
}

#[test]
fn retained_allocation_handles() {
    if !is_child() {
        return spawn_self("retained_allocation_handles", &[("FAKEGPU_MEMORY", "64m")]);
    }
    let cuda = Driver::open("libcuda.so.1");
    let init = function!(cuda, cuInit: fn(c_uint) -> c_int);
    let create = function!(cuda, cuMemCreate: fn(*mut u64, usize, *const MemoryProps, u64) -> c_int);
    let release = function!(cuda, cuMemRelease: fn(u64) -> c_int);
    let retain = function!(cuda, cuMemRetainAllocationHandle: fn(*mut u64, *mut c_void) -> c_int);
    let reserve = function!(cuda, cuMemAddressReserve: fn(*mut u64, usize, usize, u64, u64) -> c_int);
    let map = function!(cuda, cuMemMap: fn(u64, usize, usize, u64, u64) -> c_int);
    let unmap = function!(cuda, cuMemUnmap: fn(u64, usize) -> c_int);
    let four = 4 * MIB as usize;
    let at = |address: u64| std::ptr::without_provenance_mut::<c_void>(address as usize);

    let (mut handle, mut retained, mut start) = (0, 0, 0);
    assert_eq!(retain(&mut retained, at(1 << 40)), NOT_INITIALIZED);
    assert_eq!(init(0), SUCCESS);
    assert_eq!(create(&mut handle, four, &pinned_on(0), 0), SUCCESS);
    assert_eq!(reserve(&mut start, 2 * four, 0, 0, 0), SUCCESS);
    assert_eq!(retain(&mut retained, at(start)), INVALID_VALUE, "nothing mapped yet");
    assert_eq!(map(start, four, 0, handle, 0), SUCCESS);
    assert_eq!(retain(null_mut(), at(start)), INVALID_VALUE);
    assert_eq!(retain(&mut retained, at(start + four as u64)), INVALID_VALUE, "reserved, not mapped");
    assert_eq!(retain(&mut retained, at(0xdead_0000)), INVALID_VALUE);
    assert_eq!(retain(&mut retained, at(start + 3 * MIB)), SUCCESS, "anywhere inside the mapping");
    assert_eq!(retained, handle);
    assert_eq!(used(&cuda, 0), 4 * MIB, "a retain charges nothing");

    // Two references and a mapping: the memory comes back only once all three are gone.
    assert_eq!(release(handle), SUCCESS);
    assert_eq!(used(&cuda, 0), 4 * MIB);
    assert_eq!(unmap(start, four), SUCCESS);
    assert_eq!(used(&cuda, 0), 4 * MIB, "the retained reference keeps it");
    assert_eq!(retain(&mut retained, at(start)), INVALID_VALUE, "unmapped");
    assert_eq!(release(retained), SUCCESS);
    assert_eq!(used(&cuda, 0), 0);
    assert_eq!(release(retained), INVALID_VALUE);

    // Every handle released while mapped: a retain still finds the mapped allocation.
    assert_eq!(create(&mut handle, four, &pinned_on(0), 0), SUCCESS);
    assert_eq!(map(start, four, 0, handle, 0), SUCCESS);
    assert_eq!(retain(&mut retained, at(start + 1)), SUCCESS);
    assert_eq!((release(handle), release(retained)), (SUCCESS, SUCCESS));
    assert_eq!(release(handle), INVALID_VALUE, "no reference left");
    assert_eq!(map(start + four as u64, four, 0, handle, 0), INVALID_VALUE, "the handle is dead");
    assert_eq!(used(&cuda, 0), 4 * MIB, "still mapped");
    assert_eq!(retain(&mut retained, at(start)), SUCCESS);
    assert_eq!(retained, handle);
    assert_eq!(map(start + four as u64, four, 0, retained, 0), SUCCESS, "alive again");
    assert_eq!(release(retained), SUCCESS);
    assert_eq!(unmap(start, four), SUCCESS);
    assert_eq!(used(&cuda, 0), 4 * MIB);
    assert_eq!(unmap(start + four as u64, four), SUCCESS);
    assert_eq!(used(&cuda, 0), 0);
    assert_eq!(stats(&cuda, 0), Some((0, 4 * MIB, 2)), "retains are not allocation calls");
}

/// `CUDA_MEM_ALLOC_NODE_PARAMS`.
#[repr(C)]
struct AllocNodeParams {
    pool_props: MemoryProps,
    access_descs: *const [c_int; 3],
    access_desc_count: usize,
    bytesize: usize,
    dptr: u64,
}

/// Graph memory of `bytesize` bytes on CUDA ordinal `device`, without access descriptors.
fn alloc_node_params(device: c_int, bytesize: usize) -> AllocNodeParams {
    AllocNodeParams {
        pool_props: pinned_on(device),
        access_descs: null(),
        access_desc_count: 0,
        bytesize,
        dptr: 0,
    }
}

/// `CUDA_GRAPH_INSTANTIATE_PARAMS`.
#[repr(C)]
struct InstantiateParams {
    flags: u64,
    upload_stream: *mut c_void,
    err_node_out: *mut c_void,
    result_out: c_int,
}

fn instantiate_params(flags: u64, upload_stream: *mut c_void) -> InstantiateParams {
    InstantiateParams { flags, upload_stream, err_node_out: std::ptr::dangling_mut(), result_out: -1 }
}

#[test]
fn graph_memory_is_charged_at_first_launch() {
    if !is_child() {
        let env = [("FAKEGPU_MEMORY", "64m"), ("FAKEGPU_DEVICES", "2")];
        return spawn_self("graph_memory_is_charged_at_first_launch", &env);
    }
    let cuda = Driver::open("libcuda.so.1");
    let init = function!(cuda, cuInit: fn(c_uint) -> c_int);
    let graph_create = function!(cuda, cuGraphCreate: fn(*mut *mut c_void, c_uint) -> c_int);
    let graph_destroy = function!(cuda, cuGraphDestroy: fn(*mut c_void) -> c_int);
    let add_alloc = function!(cuda, cuGraphAddMemAllocNode: fn(*mut *mut c_void, *mut c_void, *const *mut c_void, usize, *mut AllocNodeParams) -> c_int);
    let add_free = function!(cuda, cuGraphAddMemFreeNode: fn(*mut *mut c_void, *mut c_void, *const *mut c_void, usize, u64) -> c_int);
    let instantiate =
        function!(cuda, cuGraphInstantiateWithFlags: fn(*mut *mut c_void, *mut c_void, u64) -> c_int);
    let launch = function!(cuda, cuGraphLaunch: fn(*mut c_void, *mut c_void) -> c_int);
    let launch_ptsz = function!(cuda, cuGraphLaunch_ptsz: fn(*mut c_void, *mut c_void) -> c_int);
    let exec_destroy = function!(cuda, cuGraphExecDestroy: fn(*mut c_void) -> c_int);
    let get_attribute = function!(cuda, cuDeviceGetGraphMemAttribute: fn(c_int, c_int, *mut c_void) -> c_int);
    let trim = function!(cuda, cuDeviceGraphMemTrim: fn(c_int) -> c_int);
    let stream_create = function!(cuda, cuStreamCreate: fn(*mut *mut c_void, c_uint) -> c_int);
    let info = function!(cuda, cuMemGetInfo_v2: fn(*mut usize, *mut usize) -> c_int);
    let alloc = function!(cuda, cuMemAlloc_v2: fn(*mut u64, usize) -> c_int);
    let free = function!(cuda, cuMemFree_v2: fn(u64) -> c_int);
    let attribute = |device, attribute| {
        let mut value = u64::MAX;
        assert_eq!(get_attribute(device, attribute, (&raw mut value).cast()), SUCCESS);
        value
    };
    const USED_MEM_CURRENT: c_int = 0;
    const USED_MEM_HIGH: c_int = 1;
    const RESERVED_MEM_CURRENT: c_int = 2;
    const RESERVED_MEM_HIGH: c_int = 3;
    let mib = |n: u64| (n * MIB) as usize;

    // No context needed to build and instantiate; nothing is charged yet.
    let (mut graph, mut a, mut b, mut freed, mut exec) =
        (null_mut(), null_mut(), null_mut(), null_mut(), null_mut());
    assert_eq!(init(0), SUCCESS);
    assert_eq!(graph_create(&mut graph, 0), SUCCESS);
    let mut on_0 = alloc_node_params(0, mib(16));
    let mut on_1 = alloc_node_params(1, mib(8));
    assert_eq!(add_alloc(&mut a, graph, null(), 0, &mut on_0), SUCCESS);
    assert_eq!(add_alloc(&mut b, graph, &a, 1, &mut on_1), SUCCESS);
    assert!(on_0.dptr != 0 && on_1.dptr != 0 && on_0.dptr != on_1.dptr);
    assert_eq!(add_free(&mut freed, graph, &b, 1, on_0.dptr), SUCCESS);
    assert_eq!((used(&cuda, 0), used(&cuda, 1)), (0, 0), "an alloc node only reserves addresses");
    assert_eq!(instantiate(&mut exec, graph, 0), SUCCESS);
    assert_eq!((used(&cuda, 0), used(&cuda, 1)), (0, 0), "instantiation charges nothing");
    assert_eq!(graph_destroy(graph), SUCCESS, "the executable graph outlives its graph");

    // The first launch charges each node's device; later launches charge nothing more.
    assert_eq!(launch(exec, null_mut()), INVALID_CONTEXT, "the NULL stream needs a context");
    bind_context(&cuda, 0);
    assert_eq!(launch(exec, null_mut()), SUCCESS);
    assert_eq!((used(&cuda, 0), used(&cuda, 1)), (16 * MIB, 8 * MIB));
    let (mut free_bytes, mut total) = (0, 0);
    assert_eq!(info(&mut free_bytes, &mut total), SUCCESS);
    assert_eq!(free_bytes as u64, 48 * MIB, "cuMemGetInfo counts graph memory");
    let mut stream = null_mut();
    assert_eq!(stream_create(&mut stream, 0), SUCCESS);
    assert_eq!(launch(exec, stream), SUCCESS);
    assert_eq!(launch_ptsz(exec, std::ptr::without_provenance_mut(2)), SUCCESS);
    assert_eq!(launch(exec, std::ptr::without_provenance_mut(0x1234_5678)), INVALID_VALUE, "not a stream");
    assert_eq!((used(&cuda, 0), used(&cuda, 1)), (16 * MIB, 8 * MIB));
    assert_eq!(attribute(0, USED_MEM_CURRENT), 16 * MIB);
    assert_eq!(attribute(0, RESERVED_MEM_CURRENT), 16 * MIB);
    assert_eq!(attribute(1, USED_MEM_CURRENT), 8 * MIB);

    // A launch that does not fit on one of its devices charges none of them.
    let (mut big, mut small, mut refused) = (null_mut(), null_mut(), null_mut());
    assert_eq!(graph_create(&mut big, 0), SUCCESS);
    assert_eq!(add_alloc(&mut small, big, null(), 0, &mut alloc_node_params(0, mib(8))), SUCCESS);
    let mut too_much = alloc_node_params(1, mib(60));
    assert_eq!(
        add_alloc(&mut small, big, null(), 0, &mut too_much),
        SUCCESS,
        "past the card: fine until launch"
    );
    assert_eq!(instantiate(&mut refused, big, 0), SUCCESS);
    assert_eq!(launch(refused, null_mut()), OUT_OF_MEMORY);
    assert_eq!((used(&cuda, 0), used(&cuda, 1)), (16 * MIB, 8 * MIB));
    assert_eq!(stats(&cuda, 0).map(|s| s.1), Some(16 * MIB), "not even a passing charge");

    // Destroying the launched executable graph credits its memory; the refused one can then run.
    assert_eq!(exec_destroy(exec), SUCCESS);
    assert_eq!((used(&cuda, 0), used(&cuda, 1)), (0, 0));
    assert_eq!((attribute(0, USED_MEM_CURRENT), attribute(0, USED_MEM_HIGH)), (0, 16 * MIB));
    assert_eq!(attribute(1, RESERVED_MEM_HIGH), 8 * MIB);
    assert_eq!(exec_destroy(exec), INVALID_VALUE);
    assert_eq!(launch(exec, null_mut()), INVALID_VALUE);
    assert_eq!(launch(refused, null_mut()), SUCCESS);
    assert_eq!((used(&cuda, 0), used(&cuda, 1)), (8 * MIB, 60 * MIB));
    let mut ptr = 0;
    assert_eq!(alloc(&mut ptr, mib(57)), OUT_OF_MEMORY, "graph memory counts against cuMemAlloc");
    assert_eq!(alloc(&mut ptr, mib(56)), SUCCESS);
    assert_eq!(free(ptr), SUCCESS);
    assert_eq!(trim(0), SUCCESS);
    assert_eq!(used(&cuda, 0), 8 * MIB, "trimming frees nothing an executable graph holds");
    assert_eq!(exec_destroy(refused), SUCCESS);
    assert_eq!(graph_destroy(big), SUCCESS);
    assert_eq!((used(&cuda, 0), used(&cuda, 1)), (0, 0));
    assert_eq!(attribute(1, USED_MEM_HIGH), 60 * MIB);

    let mut value = 0u64;
    assert_eq!(get_attribute(0, 4, (&raw mut value).cast()), INVALID_VALUE);
    assert_eq!(get_attribute(0, USED_MEM_CURRENT, null_mut()), INVALID_VALUE);
    assert_eq!(get_attribute(2, USED_MEM_CURRENT, (&raw mut value).cast()), INVALID_DEVICE);
    assert_eq!(trim(2), INVALID_DEVICE);
    // Graph launches are not allocation calls; the two cuMemAlloc calls are.
    assert_eq!(stats(&cuda, 0).map(|s| s.2), Some(2));
}

#[test]
fn graph_nodes_and_instantiation() {
    if !is_child() {
        return spawn_self("graph_nodes_and_instantiation", &[("FAKEGPU_MEMORY", "64m")]);
    }
    let cuda = Driver::open("libcuda.so.1");
    let init = function!(cuda, cuInit: fn(c_uint) -> c_int);
    let graph_create = function!(cuda, cuGraphCreate: fn(*mut *mut c_void, c_uint) -> c_int);
    let graph_destroy = function!(cuda, cuGraphDestroy: fn(*mut c_void) -> c_int);
    let add_empty = function!(cuda, cuGraphAddEmptyNode: fn(*mut *mut c_void, *mut c_void, *const *mut c_void, usize) -> c_int);
    let add_alloc = function!(cuda, cuGraphAddMemAllocNode: fn(*mut *mut c_void, *mut c_void, *const *mut c_void, usize, *mut AllocNodeParams) -> c_int);
    let add_free = function!(cuda, cuGraphAddMemFreeNode: fn(*mut *mut c_void, *mut c_void, *const *mut c_void, usize, u64) -> c_int);
    let get_nodes = function!(cuda, cuGraphGetNodes: fn(*mut c_void, *mut *mut c_void, *mut usize) -> c_int);
    let get_type = function!(cuda, cuGraphNodeGetType: fn(*mut c_void, *mut c_int) -> c_int);
    let get_params =
        function!(cuda, cuGraphMemAllocNodeGetParams: fn(*mut c_void, *mut AllocNodeParams) -> c_int);
    let instantiate_v1 = function!(cuda, cuGraphInstantiate: fn(*mut *mut c_void, *mut c_void, *mut *mut c_void, *mut c_char, usize) -> c_int);
    let instantiate_v2 = function!(cuda, cuGraphInstantiate_v2: fn(*mut *mut c_void, *mut c_void, *mut *mut c_void, *mut c_char, usize) -> c_int);
    let with_flags =
        function!(cuda, cuGraphInstantiateWithFlags: fn(*mut *mut c_void, *mut c_void, u64) -> c_int);
    let with_params = function!(cuda, cuGraphInstantiateWithParams: fn(*mut *mut c_void, *mut c_void, *mut InstantiateParams) -> c_int);
    let with_params_ptsz = function!(cuda, cuGraphInstantiateWithParams_ptsz: fn(*mut *mut c_void, *mut c_void, *mut InstantiateParams) -> c_int);
    let exec_destroy = function!(cuda, cuGraphExecDestroy: fn(*mut c_void) -> c_int);
    let node_type = |node| {
        let mut kind = -1;
        assert_eq!(get_type(node, &mut kind), SUCCESS);
        kind
    };
    let stranger = std::ptr::without_provenance_mut::<c_void>(0x1234_5678);
    let two = 2 * MIB as usize;

    let (mut graph, mut other, mut empty, mut alloc, mut freed, mut node) =
        (null_mut(), null_mut(), null_mut(), null_mut(), null_mut(), null_mut());
    assert_eq!(graph_create(&mut graph, 0), NOT_INITIALIZED);
    assert_eq!(init(0), SUCCESS);
    assert_eq!(graph_create(null_mut(), 0), INVALID_VALUE);
    assert_eq!(graph_create(&mut graph, 1), INVALID_VALUE, "flags must be 0");
    assert_eq!(graph_create(&mut graph, 0), SUCCESS);
    assert_eq!(graph_create(&mut other, 0), SUCCESS);
    assert!(!graph.is_null() && graph != other);

    // Nodes, and the arguments they refuse.
    assert_eq!(add_empty(&mut empty, graph, null(), 0), SUCCESS);
    assert_eq!(add_empty(&mut node, graph, null(), 1), INVALID_VALUE, "NULL dependencies, count 1");
    assert_eq!(add_empty(null_mut(), graph, null(), 0), INVALID_VALUE);
    assert_eq!(add_empty(&mut node, stranger, null(), 0), INVALID_VALUE, "not a graph");
    assert_eq!(add_empty(&mut node, other, &empty, 1), INVALID_VALUE, "a dependency of another graph");
    assert_eq!(add_empty(&mut node, graph, &stranger, 1), INVALID_VALUE, "not a node");
    let access = [[1, 0, 3]];
    let mut params =
        AllocNodeParams { access_descs: access.as_ptr(), access_desc_count: 1, ..alloc_node_params(0, two) };
    assert_eq!(add_alloc(&mut alloc, graph, &empty, 1, &mut params), SUCCESS);
    assert!(params.dptr != 0);
    let mut bad = AllocNodeParams {
        pool_props: MemoryProps { alloc_type: 2, ..pinned_on(0) },
        ..alloc_node_params(0, two)
    };
    assert_eq!(add_alloc(&mut node, graph, null(), 0, &mut bad), INVALID_VALUE, "not pinned");
    bad.pool_props = MemoryProps { location_type: 2, ..pinned_on(0) };
    assert_eq!(add_alloc(&mut node, graph, null(), 0, &mut bad), INVALID_VALUE, "not a device");
    assert_eq!(add_alloc(&mut node, graph, null(), 0, &mut alloc_node_params(1, two)), INVALID_DEVICE);
    assert_eq!(add_alloc(&mut node, graph, null(), 0, &mut alloc_node_params(0, 0)), INVALID_VALUE);
    let mut no_descs = AllocNodeParams { access_desc_count: 1, ..alloc_node_params(0, two) };
    assert_eq!(add_alloc(&mut node, graph, null(), 0, &mut no_descs), INVALID_VALUE, "NULL descriptors");
    assert_eq!(add_alloc(&mut node, graph, null(), 0, null_mut()), INVALID_VALUE);
    assert_eq!(add_alloc(null_mut(), graph, null(), 0, &mut alloc_node_params(0, two)), INVALID_VALUE);
    assert_eq!(
        add_free(&mut node, other, null(), 0, params.dptr),
        INVALID_VALUE,
        "allocated in another graph"
    );
    assert_eq!(
        add_free(&mut node, graph, null(), 0, params.dptr + 1),
        INVALID_VALUE,
        "not an alloc node's address"
    );
    assert_eq!(add_free(&mut freed, graph, &alloc, 1, params.dptr), SUCCESS);
    assert_eq!(add_free(&mut node, graph, &alloc, 1, params.dptr), INVALID_VALUE, "freed twice");
    assert_eq!(add_free(null_mut(), graph, null(), 0, params.dptr), INVALID_VALUE);

    // cuGraphGetNodes, cuGraphNodeGetType, cuGraphMemAllocNodeGetParams.
    let mut count = 0;
    assert_eq!((get_nodes(graph, null_mut(), &mut count), count), (SUCCESS, 3));
    let mut listed = [stranger; 5];
    count = listed.len();
    assert_eq!(get_nodes(graph, listed.as_mut_ptr(), &mut count), SUCCESS);
    assert_eq!((count, listed), (3, [empty, alloc, freed, null_mut(), null_mut()]));
    let mut two_nodes = [stranger; 2];
    count = 2;
    assert_eq!(get_nodes(graph, two_nodes.as_mut_ptr(), &mut count), SUCCESS);
    assert_eq!((count, two_nodes), (2, [empty, alloc]));
    assert_eq!(get_nodes(graph, listed.as_mut_ptr(), null_mut()), INVALID_VALUE);
    assert_eq!(get_nodes(stranger, null_mut(), &mut count), INVALID_VALUE);
    assert_eq!((get_nodes(other, null_mut(), &mut count), count), (SUCCESS, 0));
    assert_eq!((node_type(empty), node_type(alloc), node_type(freed)), (2, 10, 11));
    assert_eq!(get_type(empty, null_mut()), INVALID_VALUE);
    assert_eq!(get_type(stranger, &mut 0), INVALID_VALUE);
    let mut out = alloc_node_params(3, 0);
    assert_eq!(get_params(alloc, &mut out), SUCCESS);
    assert_eq!((out.bytesize, out.dptr, out.access_desc_count), (two, params.dptr, 1));
    let props = &out.pool_props;
    assert_eq!((props.alloc_type, props.location_type, props.location_id), (1, 1, 0));
    assert!(!out.access_descs.is_null() && out.access_descs != access.as_ptr(), "the node's own copy");
    // SAFETY: the fake points at one descriptor that its node owns until the graph is destroyed.
    assert_eq!(unsafe { out.access_descs.read() }, [1, 0, 3]);
    assert_eq!(get_params(empty, &mut out), INVALID_VALUE, "not an alloc node");
    assert_eq!(get_params(alloc, null_mut()), INVALID_VALUE);

    // Every instantiate ABI; none charges anything.
    let mut execs = Vec::new();
    let mut exec = null_mut();
    let mut error_node = stranger;
    let mut log = [0 as c_char; 16];
    assert_eq!(instantiate_v1(&mut exec, graph, null_mut(), null_mut(), 0), SUCCESS);
    execs.push(exec);
    assert_eq!(instantiate_v2(&mut exec, graph, &mut error_node, log.as_mut_ptr(), log.len()), SUCCESS);
    execs.push(exec);
    assert_eq!(instantiate_v2(null_mut(), graph, null_mut(), null_mut(), 0), INVALID_VALUE);
    assert_eq!(instantiate_v1(&mut exec, stranger, null_mut(), null_mut(), 0), INVALID_VALUE);
    assert_eq!(with_flags(&mut exec, graph, 1), SUCCESS, "AUTO_FREE_ON_LAUNCH");
    execs.push(exec);
    assert_eq!(with_flags(&mut exec, graph, 2), INVALID_VALUE, "UPLOAD needs cuGraphInstantiateWithParams");
    assert_eq!(with_flags(&mut exec, graph, 0x10), INVALID_VALUE);
    assert_eq!(with_flags(null_mut(), graph, 0), INVALID_VALUE);
    type WithParams = extern "C" fn(*mut *mut c_void, *mut c_void, *mut InstantiateParams) -> c_int;
    let mut instantiate_with = |call: WithParams, flags, stream| {
        let mut given = instantiate_params(flags, stream);
        let mut exec = null_mut();
        let result = call(&mut exec, graph, &mut given);
        if result == SUCCESS {
            execs.push(exec);
        }
        (result, given.result_out, given.err_node_out)
    };
    assert_eq!(instantiate_with(with_params, 0, null_mut()), (SUCCESS, 0, null_mut()));
    assert_eq!(instantiate_with(with_params_ptsz, 1, null_mut()), (SUCCESS, 0, null_mut()));
    assert_eq!(
        instantiate_with(with_params, 2, null_mut()),
        (INVALID_CONTEXT, 1, null_mut()),
        "upload stream"
    );
    assert_eq!(instantiate_with(with_params, 2, stranger), (INVALID_VALUE, 1, null_mut()));
    assert_eq!(instantiate_with(with_params, 0x10, null_mut()), (INVALID_VALUE, 1, null_mut()));
    bind_context(&cuda, 0);
    assert_eq!(instantiate_with(with_params_ptsz, 2, null_mut()), (SUCCESS, 0, null_mut()));
    assert_eq!(with_params(&mut exec, graph, null_mut()), INVALID_VALUE);
    let mut given = instantiate_params(0, null_mut());
    assert_eq!(with_params(&mut exec, stranger, &mut given), INVALID_VALUE);
    assert_eq!(given.result_out, 1);
    assert_eq!(execs.len(), 6);
    assert_eq!(used(&cuda, 0), 0);
    for exec in execs {
        assert_eq!(exec_destroy(exec), SUCCESS, "never launched: nothing to credit");
    }

    assert_eq!(graph_destroy(graph), SUCCESS);
    assert_eq!(graph_destroy(graph), INVALID_VALUE);
    assert_eq!(get_type(empty, &mut 0), INVALID_VALUE, "nodes die with their graph");
    assert_eq!(get_nodes(graph, null_mut(), &mut count), INVALID_VALUE);
    assert_eq!(graph_destroy(other), SUCCESS);
    assert_eq!(stats(&cuda, 0), Some((0, 0, 0)));
}

const INVALID_HANDLE: c_int = 400;
const NOT_READY: c_int = 600;
const MS: u64 = 1_000_000;

/// `FakegpuLaunch`, which `fakegpu_last_launch` fills.
#[derive(Clone, Copy)]
#[repr(C)]
struct LaunchRecord {
    entry_point: c_int,
    function: *mut c_void,
    grid: [c_uint; 3],
    block: [c_uint; 3],
    shared_mem_bytes: c_uint,
    stream: *mut c_void,
    kernel_params: *mut *mut c_void,
    extra: *mut *mut c_void,
}

/// `FakegpuLaunch.entry_point` numbers.
const LAUNCH_KERNEL: c_int = 1;
const LAUNCH_KERNEL_PTSZ: c_int = 2;
const LAUNCH_COOPERATIVE_KERNEL: c_int = 3;
const LAUNCH_COOPERATIVE_KERNEL_PTSZ: c_int = 4;
const LAUNCH_KERNEL_EX: c_int = 5;
const LAUNCH_KERNEL_EX_PTSZ: c_int = 6;
const GRAPH_LAUNCH: c_int = 7;
const GRAPH_LAUNCH_PTSZ: c_int = 8;

/// `CUlaunchConfig`.
#[derive(Clone, Copy)]
#[repr(C)]
struct LaunchConfig {
    grid: [c_uint; 3],
    block: [c_uint; 3],
    shared_mem_bytes: c_uint,
    stream: *mut c_void,
    attrs: *mut c_void,
    num_attrs: c_uint,
}

/// `CUDA_KERNEL_NODE_PARAMS_v2`; its first 56 bytes are the CUDA 10 `CUDA_KERNEL_NODE_PARAMS`.
#[derive(Clone, Copy)]
#[repr(C)]
struct KernelNodeParams {
    function: *mut c_void,
    grid: [c_uint; 3],
    block: [c_uint; 3],
    shared_mem_bytes: c_uint,
    kernel_params: *mut *mut c_void,
    extra: *mut *mut c_void,
    kernel: *mut c_void,
    context: *mut c_void,
}

fn kernel_node_params(function: *mut c_void) -> KernelNodeParams {
    KernelNodeParams {
        function,
        grid: [1, 1, 1],
        block: [32, 1, 1],
        shared_mem_bytes: 0,
        kernel_params: null_mut(),
        extra: null_mut(),
        kernel: null_mut(),
        context: null_mut(),
    }
}

/// A simulated kernel of `duration_ns`, from the test hook.
fn kernel(driver: &Driver, duration_ns: u64) -> *mut c_void {
    let hook = function!(driver, fakegpu_kernel: fn(u64) -> *mut c_void);
    let function = hook(duration_ns);
    assert!(!function.is_null());
    function
}

fn last_launch(driver: &Driver) -> Option<LaunchRecord> {
    let hook = function!(driver, fakegpu_last_launch: fn(*mut LaunchRecord) -> c_int);
    let mut record = std::mem::MaybeUninit::<LaunchRecord>::zeroed();
    // SAFETY: all-zero bytes are a valid `LaunchRecord` (integers and NULL pointers).
    (hook(record.as_mut_ptr()) == 0).then(|| unsafe { record.assume_init() })
}

/// The driver calls the timing tests share, typed.
struct Timing {
    launch: extern "C" fn(
        *mut c_void,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        *mut c_void,
        *mut *mut c_void,
        *mut *mut c_void,
    ) -> c_int,
    event_create: extern "C" fn(*mut *mut c_void, c_uint) -> c_int,
    record: extern "C" fn(*mut c_void, *mut c_void) -> c_int,
    elapsed: extern "C" fn(*mut f32, *mut c_void, *mut c_void) -> c_int,
    synchronize: extern "C" fn(*mut c_void) -> c_int,
    busy: extern "C" fn(c_int) -> u64,
}

impl Timing {
    fn new(cuda: &Driver) -> Timing {
        Timing {
            launch: function!(cuda, cuLaunchKernel: fn(*mut c_void, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, *mut c_void, *mut *mut c_void, *mut *mut c_void) -> c_int),
            event_create: function!(cuda, cuEventCreate: fn(*mut *mut c_void, c_uint) -> c_int),
            record: function!(cuda, cuEventRecord: fn(*mut c_void, *mut c_void) -> c_int),
            elapsed: function!(cuda, cuEventElapsedTime: fn(*mut f32, *mut c_void, *mut c_void) -> c_int),
            synchronize: function!(cuda, cuEventSynchronize: fn(*mut c_void) -> c_int),
            busy: function!(cuda, fakegpu_busy_ns: fn(c_int) -> u64),
        }
    }

    /// `cuLaunchKernel` of one block of one thread.
    fn run(&self, function: *mut c_void, stream: *mut c_void) -> c_int {
        (self.launch)(function, 1, 1, 1, 1, 1, 1, 0, stream, null_mut(), null_mut())
    }

    fn event(&self, flags: c_uint) -> *mut c_void {
        let mut event = null_mut();
        assert_eq!((self.event_create)(&mut event, flags), SUCCESS);
        event
    }

    fn record(&self, event: *mut c_void, stream: *mut c_void) {
        assert_eq!((self.record)(event, stream), SUCCESS);
    }

    /// (result, milliseconds) of `cuEventElapsedTime`.
    fn millis(&self, start: *mut c_void, end: *mut c_void) -> (c_int, f32) {
        let mut milliseconds = f32::NAN;
        let result = (self.elapsed)(&mut milliseconds, start, end);
        (result, milliseconds)
    }
}

#[test]
fn kernel_launches_take_simulated_time() {
    if !is_child() {
        return spawn_self("kernel_launches_take_simulated_time", &[("FAKEGPU_DEVICES", "2")]);
    }
    let cuda = Driver::open("libcuda.so.1");
    let timing = Timing::new(&cuda);
    let init = function!(cuda, cuInit: fn(c_uint) -> c_int);
    let launch = timing.launch;
    let launch_ptsz = function!(cuda, cuLaunchKernel_ptsz: fn(*mut c_void, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, *mut c_void, *mut *mut c_void, *mut *mut c_void) -> c_int);
    let cooperative = function!(cuda, cuLaunchCooperativeKernel: fn(*mut c_void, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, *mut c_void, *mut *mut c_void) -> c_int);
    let cooperative_ptsz = function!(cuda, cuLaunchCooperativeKernel_ptsz: fn(*mut c_void, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, *mut c_void, *mut *mut c_void) -> c_int);
    let launch_ex = function!(cuda, cuLaunchKernelEx: fn(*const LaunchConfig, *mut c_void, *mut *mut c_void, *mut *mut c_void) -> c_int);
    let launch_ex_ptsz = function!(cuda, cuLaunchKernelEx_ptsz: fn(*const LaunchConfig, *mut c_void, *mut *mut c_void, *mut *mut c_void) -> c_int);
    let event_create = timing.event_create;
    let record = timing.record;
    let record_ptsz = function!(cuda, cuEventRecord_ptsz: fn(*mut c_void, *mut c_void) -> c_int);
    let query = function!(cuda, cuEventQuery: fn(*mut c_void) -> c_int);
    let stream_sync = function!(cuda, cuStreamSynchronize: fn(*mut c_void) -> c_int);
    let elapsed_v2 = function!(cuda, cuEventElapsedTime_v2: fn(*mut f32, *mut c_void, *mut c_void) -> c_int);
    let event_destroy = function!(cuda, cuEventDestroy_v2: fn(*mut c_void) -> c_int);
    let is_capturing = function!(cuda, cuStreamIsCapturing: fn(*mut c_void, *mut c_int) -> c_int);
    let is_capturing_ptsz = function!(cuda, cuStreamIsCapturing_ptsz: fn(*mut c_void, *mut c_int) -> c_int);
    let call_count = function!(cuda, fakegpu_call_count: fn(*const c_char) -> u64);
    let busy = timing.busy;
    let stranger = std::ptr::without_provenance_mut::<c_void>(0x1234_5678);
    let legacy = std::ptr::without_provenance_mut::<c_void>(1);
    let per_thread = std::ptr::without_provenance_mut::<c_void>(2);
    // Never dereferenced: the fake passes kernel arguments through.
    let params = std::ptr::without_provenance_mut::<*mut c_void>(0x7000_0010);
    let extra = std::ptr::without_provenance_mut::<*mut c_void>(0x7000_0020);

    // Kernels come from the hook, before cuInit too; launching needs cuInit and a current context.
    let blocker = kernel(&cuda, 400 * MS);
    let (k20, k30, k40) = (kernel(&cuda, 20 * MS), kernel(&cuda, 30 * MS), kernel(&cuda, 40 * MS));
    assert!(blocker != k20 && k20 != k30);
    assert_eq!(timing.run(k20, null_mut()), NOT_INITIALIZED);
    assert_eq!(init(0), SUCCESS);
    assert_eq!(timing.run(k20, null_mut()), INVALID_CONTEXT);
    let (mut status, mut event) = (-1, null_mut());
    assert_eq!(is_capturing(null_mut(), &mut status), INVALID_CONTEXT);
    assert_eq!(event_create(&mut event, 0), INVALID_CONTEXT);
    bind_context(&cuda, 1);

    // What launches refuse; refused launches take no time.
    assert_eq!(timing.run(stranger, null_mut()), INVALID_HANDLE);
    assert_eq!(timing.run(null_mut(), null_mut()), INVALID_HANDLE);
    assert_eq!(launch(k20, 0, 1, 1, 1, 1, 1, 0, null_mut(), null_mut(), null_mut()), INVALID_VALUE);
    assert_eq!(launch(k20, 1, 1, 1, 1, 1, 0, 0, null_mut(), null_mut(), null_mut()), INVALID_VALUE);
    assert_eq!(timing.run(k20, stranger), INVALID_VALUE, "not a stream");
    assert_eq!(launch_ex(null(), k20, null_mut(), null_mut()), INVALID_VALUE);
    let config = LaunchConfig {
        grid: [4, 2, 1],
        block: [128, 1, 1],
        shared_mem_bytes: 1024,
        stream: legacy,
        attrs: null_mut(),
        num_attrs: 0,
    };
    let no_attrs = LaunchConfig { num_attrs: 1, ..config };
    assert_eq!(launch_ex(&no_attrs, k20, null_mut(), null_mut()), INVALID_VALUE, "NULL attributes");
    assert_eq!(launch_ex(&config, stranger, null_mut(), null_mut()), INVALID_HANDLE);
    assert_eq!(busy(1), 0);
    assert!(last_launch(&cuda).is_none());
    assert_eq!((is_capturing(null_mut(), &mut status), status), (SUCCESS, 0));
    status = -1;
    assert_eq!((is_capturing_ptsz(per_thread, &mut status), status), (SUCCESS, 0));
    assert_eq!(is_capturing(stranger, &mut status), INVALID_VALUE);
    assert_eq!(is_capturing(null_mut(), null_mut()), INVALID_VALUE);

    // Event flags: within 0x7, and INTERPROCESS (4) only with DISABLE_TIMING (2).
    assert_eq!(event_create(null_mut(), 0), INVALID_VALUE);
    assert_eq!(event_create(&mut event, 8), INVALID_VALUE);
    assert_eq!(event_create(&mut event, 4), INVALID_VALUE);
    let untimed = timing.event(6);
    let (start, end, never) = (timing.event(0), timing.event(1), timing.event(2));

    // Back to back behind a long kernel: the events are exactly 20 + 30 ms apart, whatever the host did.
    assert_eq!(timing.run(blocker, null_mut()), SUCCESS);
    timing.record(start, null_mut());
    assert_eq!(timing.run(k20, null_mut()), SUCCESS);
    assert_eq!(launch_ex(&config, k30, params, extra), SUCCESS);
    timing.record(end, legacy);
    assert_eq!(query(end), NOT_READY);
    assert_eq!(timing.millis(start, end).0, NOT_READY);
    assert_eq!(query(never), SUCCESS, "never recorded");
    assert_eq!((timing.synchronize)(end), SUCCESS);
    assert_eq!((query(start), query(end)), (SUCCESS, SUCCESS));
    assert_eq!(timing.millis(start, end), (SUCCESS, 50.0));
    assert_eq!(timing.millis(end, start), (SUCCESS, -50.0));
    let mut milliseconds = 0.0;
    assert_eq!((elapsed_v2(&mut milliseconds, start, end), milliseconds), (SUCCESS, 50.0));
    assert_eq!((timing.elapsed)(null_mut(), start, end), INVALID_VALUE);
    assert_eq!(timing.millis(start, never).0, INVALID_HANDLE, "never recorded");
    timing.record(untimed, null_mut());
    assert_eq!(timing.millis(untimed, end).0, INVALID_HANDLE, "timing disabled");
    assert_eq!(timing.millis(start, stranger).0, INVALID_HANDLE);
    assert_eq!((busy(1), busy(0), busy(2), busy(-1)), (450 * MS, 0, 0, 0));

    // The launch reached the driver as it was passed.
    let last = last_launch(&cuda).expect("a launch");
    assert_eq!((last.entry_point, last.function), (LAUNCH_KERNEL_EX, k30));
    assert_eq!((last.grid, last.block, last.shared_mem_bytes), ([4, 2, 1], [128, 1, 1], 1024));
    assert_eq!((last.stream, last.kernel_params, last.extra), (legacy, params, extra));

    // In the `_ptsz` calls NULL is the per-thread stream. It queues behind the legacy stream's work on
    // the device, and an event on either stream completes only once the device has run everything
    // queued before it; but each stream keeps its own ready time, which cuStreamSynchronize shows.
    let (thread_start, legacy_done) = (timing.event(0), timing.event(0));
    let (thread_done, thread_done_too) = (timing.event(0), timing.event(0));
    assert_eq!(timing.run(k40, null_mut()), SUCCESS);
    assert_eq!(record_ptsz(thread_start, null_mut()), SUCCESS);
    assert_eq!(launch_ptsz(blocker, 1, 1, 1, 1, 1, 1, 0, null_mut(), null_mut(), null_mut()), SUCCESS);
    timing.record(legacy_done, null_mut());
    assert_eq!(record_ptsz(thread_done, null_mut()), SUCCESS);
    timing.record(thread_done_too, per_thread);
    let waiting = Instant::now();
    assert_eq!(stream_sync(legacy), SUCCESS);
    assert!(waiting.elapsed() < Duration::from_millis(300), "the legacy stream's own 40 ms only");
    let pending = (query(thread_start), query(legacy_done), query(thread_done));
    assert_eq!(pending, (SUCCESS, NOT_READY, NOT_READY), "the legacy event waits for the per-thread kernel");
    assert_eq!(stream_sync(per_thread), SUCCESS);
    assert!(waiting.elapsed() >= Duration::from_millis(400));
    assert_eq!((query(legacy_done), query(thread_done)), (SUCCESS, SUCCESS));
    // Exact: the event on the idle per-thread stream completed when the legacy kernel ended, and the
    // event on the then idle legacy stream when the per-thread kernel ended.
    assert_eq!(timing.millis(thread_start, thread_done), (SUCCESS, 400.0));
    assert_eq!(timing.millis(thread_start, legacy_done), (SUCCESS, 400.0));
    assert_eq!(timing.millis(thread_done, thread_done_too), (SUCCESS, 0.0));
    let last = last_launch(&cuda).expect("a launch");
    assert_eq!((last.entry_point, last.function, last.stream), (LAUNCH_KERNEL_PTSZ, blocker, null_mut()));
    assert_eq!((last.grid, last.kernel_params, last.extra), ([1; 3], null_mut(), null_mut()));

    // The other entry points, recorded as given.
    assert_eq!(cooperative(k20, 2, 2, 2, 32, 2, 1, 64, per_thread, params), SUCCESS);
    let last = last_launch(&cuda).expect("a launch");
    assert_eq!(last.entry_point, LAUNCH_COOPERATIVE_KERNEL);
    assert_eq!((last.grid, last.block, last.shared_mem_bytes), ([2, 2, 2], [32, 2, 1], 64));
    assert_eq!((last.stream, last.kernel_params, last.extra), (per_thread, params, null_mut()));
    assert_eq!(cooperative_ptsz(k20, 1, 1, 1, 1, 1, 0, 0, null_mut(), null_mut()), INVALID_VALUE);
    assert_eq!(cooperative_ptsz(k20, 1, 1, 1, 1, 1, 1, 0, null_mut(), null_mut()), SUCCESS);
    assert_eq!(last_launch(&cuda).map(|last| last.entry_point), Some(LAUNCH_COOPERATIVE_KERNEL_PTSZ));
    let mut attribute = [0u64; 9];
    let with_attrs = LaunchConfig { attrs: attribute.as_mut_ptr().cast(), num_attrs: 1, ..config };
    assert_eq!(launch_ex_ptsz(&with_attrs, k20, null_mut(), extra), SUCCESS);
    let last = last_launch(&cuda).expect("a launch");
    assert_eq!((last.entry_point, last.stream, last.extra), (LAUNCH_KERNEL_EX_PTSZ, legacy, extra));
    assert_eq!(timing.run(k20, null_mut()), SUCCESS);
    assert_eq!(last_launch(&cuda).map(|last| last.entry_point), Some(LAUNCH_KERNEL));
    assert_eq!(busy(1), 450 * MS + 440 * MS + 80 * MS);

    // Destroyed events are unknown handles.
    assert_eq!(event_destroy(start), SUCCESS);
    assert_eq!(event_destroy(start), INVALID_HANDLE);
    let dead = (query(start), (timing.synchronize)(start), record(start, null_mut()));
    assert_eq!(dead, (INVALID_HANDLE, INVALID_HANDLE, INVALID_HANDLE));
    assert_eq!(query(stranger), INVALID_HANDLE);
    let counts: Vec<u64> = [
        c"cuLaunchKernel",
        c"cuLaunchKernel_ptsz",
        c"cuLaunchCooperativeKernel",
        c"cuLaunchCooperativeKernel_ptsz",
        c"cuLaunchKernelEx",
        c"cuLaunchKernelEx_ptsz",
        c"cuEventCreate",
        c"cuEventRecord",
        c"cuEventRecord_ptsz",
        c"cuEventElapsedTime_v2",
        c"cuStreamIsCapturing",
    ]
    .iter()
    .map(|name| call_count(name.as_ptr()))
    .collect();
    assert_eq!(counts, [11, 1, 1, 2, 4, 1, 12, 6, 2, 1, 4]);
}

#[test]
fn streams_queue_on_one_device() {
    if !is_child() {
        return spawn_self("streams_queue_on_one_device", &[]);
    }
    let cuda = Driver::open("libcuda.so.1");
    let timing = Timing::new(&cuda);
    let stream_create = function!(cuda, cuStreamCreate: fn(*mut *mut c_void, c_uint) -> c_int);
    let stream_destroy = function!(cuda, cuStreamDestroy_v2: fn(*mut c_void) -> c_int);
    let stream_sync = function!(cuda, cuStreamSynchronize: fn(*mut c_void) -> c_int);
    let ctx_sync = function!(cuda, cuCtxSynchronize: fn() -> c_int);
    let query = function!(cuda, cuEventQuery: fn(*mut c_void) -> c_int);
    bind_context(&cuda, 0);
    let (mut a, mut b) = (null_mut(), null_mut());
    assert_eq!(stream_create(&mut a, 0), SUCCESS);
    assert_eq!(stream_create(&mut b, 1), SUCCESS);
    let (k200, k300) = (kernel(&cuda, 200 * MS), kernel(&cuda, 300 * MS));

    // Two streams, one device: B's kernel waits for A's, first come first served, exactly 200 ms apart.
    // A keeps its own ready time (cuStreamSynchronize waits for A's kernel only), but an event recorded
    // on A after B's launch completes only after B's kernel: the device reaches it in submission order.
    let (after_a, after_b, a_again) = (timing.event(0), timing.event(0), timing.event(0));
    assert_eq!(timing.run(k200, a), SUCCESS);
    timing.record(after_a, a);
    assert_eq!(timing.run(k200, b), SUCCESS);
    timing.record(after_b, b);
    timing.record(a_again, a);
    let before = Instant::now();
    assert_eq!(stream_sync(a), SUCCESS);
    assert!(before.elapsed() < Duration::from_millis(350), "A's kernel only");
    let pending = (query(after_a), query(after_b), query(a_again));
    assert_eq!(pending, (SUCCESS, NOT_READY, NOT_READY), "the event on A waits for B's kernel");
    assert_eq!((timing.synchronize)(a_again), SUCCESS);
    assert!(before.elapsed() >= Duration::from_millis(300));
    assert_eq!(query(after_b), SUCCESS);
    assert_eq!(timing.millis(after_a, after_b), (SUCCESS, 200.0));
    assert_eq!(timing.millis(after_b, a_again), (SUCCESS, 0.0));

    // cuStreamSynchronize waits for its stream only, cuCtxSynchronize for every stream of the device.
    let before = Instant::now();
    assert_eq!(timing.run(k300, a), SUCCESS);
    assert!(before.elapsed() < Duration::from_millis(100), "the host never waits in a launch");
    assert_eq!(stream_sync(b), SUCCESS);
    assert!(before.elapsed() < Duration::from_millis(150), "nothing is queued on B");
    assert_eq!(stream_sync(a), SUCCESS);
    assert!(before.elapsed() >= Duration::from_millis(300));
    let before = Instant::now();
    assert_eq!(timing.run(k200, b), SUCCESS);
    assert_eq!(timing.run(k200, null_mut()), SUCCESS);
    assert_eq!(ctx_sync(), SUCCESS);
    assert!(before.elapsed() >= Duration::from_millis(400));
    assert_eq!((timing.busy)(0), 1100 * MS);

    assert_eq!(stream_sync(std::ptr::without_provenance_mut(0x1234_5678)), INVALID_VALUE);
    assert_eq!(stream_destroy(a), SUCCESS);
    assert_eq!(stream_sync(a), INVALID_VALUE);
    assert_eq!(timing.run(k200, a), INVALID_VALUE);
}

#[test]
fn graph_kernel_nodes_take_their_sum() {
    if !is_child() {
        return spawn_self("graph_kernel_nodes_take_their_sum", &[("FAKEGPU_MEMORY", "64m")]);
    }
    let cuda = Driver::open("libcuda.so.1");
    let timing = Timing::new(&cuda);
    let init = function!(cuda, cuInit: fn(c_uint) -> c_int);
    let graph_create = function!(cuda, cuGraphCreate: fn(*mut *mut c_void, c_uint) -> c_int);
    let add_kernel = function!(cuda, cuGraphAddKernelNode: fn(*mut *mut c_void, *mut c_void, *const *mut c_void, usize, *const KernelNodeParams) -> c_int);
    let add_kernel_v2 = function!(cuda, cuGraphAddKernelNode_v2: fn(*mut *mut c_void, *mut c_void, *const *mut c_void, usize, *const KernelNodeParams) -> c_int);
    let add_empty = function!(cuda, cuGraphAddEmptyNode: fn(*mut *mut c_void, *mut c_void, *const *mut c_void, usize) -> c_int);
    let add_alloc = function!(cuda, cuGraphAddMemAllocNode: fn(*mut *mut c_void, *mut c_void, *const *mut c_void, usize, *mut AllocNodeParams) -> c_int);
    let get_type = function!(cuda, cuGraphNodeGetType: fn(*mut c_void, *mut c_int) -> c_int);
    let instantiate =
        function!(cuda, cuGraphInstantiateWithFlags: fn(*mut *mut c_void, *mut c_void, u64) -> c_int);
    let launch = function!(cuda, cuGraphLaunch: fn(*mut c_void, *mut c_void) -> c_int);
    let launch_ptsz = function!(cuda, cuGraphLaunch_ptsz: fn(*mut c_void, *mut c_void) -> c_int);
    let record_ptsz = function!(cuda, cuEventRecord_ptsz: fn(*mut c_void, *mut c_void) -> c_int);
    let query = function!(cuda, cuEventQuery: fn(*mut c_void) -> c_int);
    let stream_sync = function!(cuda, cuStreamSynchronize: fn(*mut c_void) -> c_int);
    let node_type = |node| {
        let mut kind = -1;
        assert_eq!(get_type(node, &mut kind), SUCCESS);
        kind
    };
    let stranger = std::ptr::without_provenance_mut::<c_void>(0x1234_5678);
    let per_thread = std::ptr::without_provenance_mut::<c_void>(2);

    // Kernel nodes need no context: v1 params, and v2 with the kernel in `func` or (NULL `func`) `kern`.
    let (k10, k20, k30, blocker) =
        (kernel(&cuda, 10 * MS), kernel(&cuda, 20 * MS), kernel(&cuda, 30 * MS), kernel(&cuda, 300 * MS));
    assert_eq!(init(0), SUCCESS);
    let (mut graph, mut empty_graph) = (null_mut(), null_mut());
    assert_eq!(graph_create(&mut graph, 0), SUCCESS);
    assert_eq!(graph_create(&mut empty_graph, 0), SUCCESS);
    let (mut first, mut second, mut third, mut node) = (null_mut(), null_mut(), null_mut(), null_mut());
    assert_eq!(add_kernel(&mut first, graph, null(), 0, &kernel_node_params(k10)), SUCCESS);
    let by_kern = KernelNodeParams { kernel: k20, ..kernel_node_params(null_mut()) };
    assert_eq!(add_kernel_v2(&mut second, graph, &first, 1, &by_kern), SUCCESS);
    assert_eq!(add_kernel_v2(&mut third, graph, &second, 1, &kernel_node_params(k30)), SUCCESS);
    assert_eq!(add_empty(&mut node, graph, &third, 1), SUCCESS);
    assert_eq!(add_alloc(&mut node, graph, null(), 0, &mut alloc_node_params(0, 2 * MIB as usize)), SUCCESS);
    assert_eq!((node_type(first), node_type(second), node_type(third)), (0, 0, 0));
    assert_eq!(add_kernel(&mut node, graph, null(), 0, null()), INVALID_VALUE);
    assert_eq!(add_kernel(&mut node, graph, null(), 0, &kernel_node_params(stranger)), INVALID_HANDLE);
    assert_eq!(add_kernel_v2(&mut node, graph, null(), 0, &kernel_node_params(null_mut())), INVALID_HANDLE);
    let flat = KernelNodeParams { grid: [1, 0, 1], ..kernel_node_params(k10) };
    assert_eq!(add_kernel(&mut node, graph, null(), 0, &flat), INVALID_VALUE);
    assert_eq!(add_kernel(null_mut(), graph, null(), 0, &kernel_node_params(k10)), INVALID_VALUE);
    assert_eq!(add_kernel(&mut node, stranger, null(), 0, &kernel_node_params(k10)), INVALID_VALUE);
    let (mut exec, mut empty_exec) = (null_mut(), null_mut());
    assert_eq!(instantiate(&mut exec, graph, 0), SUCCESS);
    assert_eq!(instantiate(&mut empty_exec, empty_graph, 0), SUCCESS);

    // A launch runs the kernel nodes one after another: exactly 60 ms between events around it.
    bind_context(&cuda, 0);
    let (before, after) = (timing.event(0), timing.event(0));
    assert_eq!(timing.run(blocker, null_mut()), SUCCESS);
    timing.record(before, null_mut());
    assert_eq!(launch(exec, null_mut()), SUCCESS);
    timing.record(after, null_mut());
    assert_eq!((timing.synchronize)(after), SUCCESS);
    assert_eq!(timing.millis(before, after), (SUCCESS, 60.0));
    assert_eq!(used(&cuda, 0), 2 * MIB, "and its first launch charged its memory");
    assert_eq!((timing.busy)(0), 360 * MS);
    let last = last_launch(&cuda).expect("a launch");
    assert_eq!((last.entry_point, last.function, last.stream), (GRAPH_LAUNCH, exec, null_mut()));
    assert_eq!((last.grid, last.shared_mem_bytes, last.kernel_params), ([0; 3], 0, null_mut()));

    // `cuGraphLaunch_ptsz` with NULL runs on the per-thread stream: it queues behind the legacy stream's
    // blocker (an event on the idle per-thread stream completes when the blocker ends), and
    // cuStreamSynchronize of the per-thread stream waits for it but not for the legacy stream's next
    // blocker. A graph without kernels takes no time: an event on the legacy stream right after it
    // completes when that blocker ends.
    let legacy_done = timing.event(0);
    assert_eq!(timing.run(blocker, null_mut()), SUCCESS);
    assert_eq!(record_ptsz(before, null_mut()), SUCCESS);
    assert_eq!(launch_ptsz(exec, null_mut()), SUCCESS);
    assert_eq!(last_launch(&cuda).map(|last| last.entry_point), Some(GRAPH_LAUNCH_PTSZ));
    assert_eq!(record_ptsz(after, null_mut()), SUCCESS);
    assert_eq!(timing.run(blocker, null_mut()), SUCCESS);
    assert_eq!(launch(empty_exec, null_mut()), SUCCESS);
    timing.record(legacy_done, null_mut());
    assert_eq!(stream_sync(per_thread), SUCCESS);
    assert_eq!((query(before), query(after), query(legacy_done)), (SUCCESS, SUCCESS, NOT_READY));
    assert_eq!((timing.synchronize)(legacy_done), SUCCESS);
    assert_eq!(timing.millis(before, after), (SUCCESS, 60.0));
    assert_eq!(timing.millis(after, legacy_done), (SUCCESS, 300.0));
    assert_eq!((timing.busy)(0), 1020 * MS);
}

#[test]
fn shared_device_time_and_utilization() {
    let path = TempFile::new("busy.ledger");
    if !is_child() {
        let _ = std::fs::remove_file(&path);
        let file = path.to_str().expect("UTF-8 temp path");
        for step in ["occupy", "contend"] {
            let env = [("FAKEGPU_SHARED", file), ("SMOKE_STEP", step)];
            spawn_self("shared_device_time_and_utilization", &env);
        }
        let metadata = std::fs::metadata(&path).expect("ledger file");
        let _ = std::fs::remove_file(&path);
        assert_eq!(metadata.len(), 93184);
        return;
    }
    let cuda = Driver::open("libcuda.so.1");
    let timing = Timing::new(&cuda);
    bind_context(&cuda, 0);
    if std::env::var("SMOKE_STEP").as_deref() == Ok("occupy") {
        // Queue 1.5 s of work and exit at once: the device stays busy after this process is gone.
        assert_eq!(timing.run(kernel(&cuda, 1500 * MS), null_mut()), SUCCESS);
        assert_eq!((timing.busy)(0), 1500 * MS);
        return;
    }
    let nvml = Driver::open("libnvidia-ml.so.1");
    let nvml_init = function!(nvml, nvmlInit_v2: fn() -> c_int);
    let by_index = function!(nvml, nvmlDeviceGetHandleByIndex_v2: fn(c_uint, *mut *mut c_void) -> c_int);
    let rates = function!(nvml, nvmlDeviceGetUtilizationRates: fn(*mut c_void, *mut [c_uint; 2]) -> c_int);
    let ctx_sync = function!(cuda, cuCtxSynchronize: fn() -> c_int);
    let query = function!(cuda, cuEventQuery: fn(*mut c_void) -> c_int);
    let mut device = null_mut();
    assert_eq!(rates(device, &mut [0; 2]), NVML_UNINITIALIZED);
    assert_eq!(nvml_init(), SUCCESS);
    assert_eq!(by_index(0, &mut device), SUCCESS);
    assert_eq!(rates(device, null_mut()), NVML_INVALID_ARGUMENT);
    assert_eq!(rates(std::ptr::without_provenance_mut(8), &mut [0; 2]), NVML_INVALID_ARGUMENT);

    // Both processes held a context on the device; the one that exited without releasing it still
    // counts. This process's record comes first; the fake knows no other pid.
    let processes = function!(
        nvml,
        nvmlDeviceGetComputeRunningProcesses_v3: fn(*mut c_void, *mut c_uint, *mut [u64; 3]) -> c_int
    );
    let mut count = 0;
    assert_eq!(processes(device, &mut count, null_mut()), NVML_INSUFFICIENT_SIZE);
    assert_eq!(count, 2);
    let mut records = [[0; 3]; 2];
    assert_eq!(processes(device, &mut count, records.as_mut_ptr()), SUCCESS);
    assert_eq!((records[0][0] as u32, records[1][0] as u32), (std::process::id(), 0));
    // This process's record carries what it holds on the device (nothing: its context costs 0);
    // the other process's memory is not known.
    assert_eq!((records[0][1], records[1][1]), (0, u64::MAX));
    let gpu = || {
        let mut rates_now = [u32::MAX; 2];
        assert_eq!(rates(device, &mut rates_now), SUCCESS);
        assert_eq!(rates_now[1], 0, "no memory traffic is simulated");
        rates_now[0]
    };

    // The device runs work in submission order, whichever process queued it: an event recorded on this
    // process's idle stream completes only when the other process's work ends, and this process's
    // kernel queues behind that work, so the events around it are exactly its 10 ms apart.
    let (before, after) = (timing.event(0), timing.event(0));
    timing.record(before, null_mut());
    assert_eq!(query(before), NOT_READY, "behind the other process's work");
    assert_eq!(timing.run(kernel(&cuda, 10 * MS), null_mut()), SUCCESS);
    timing.record(after, null_mut());
    assert_eq!((timing.busy)(0), 10 * MS, "this process's work only");
    assert_eq!(gpu(), 100, "busy ever since this process started");

    // cuCtxSynchronize waits for this process's work, which ends after the other one's.
    let waiting = Instant::now();
    assert_eq!(ctx_sync(), SUCCESS);
    assert!(waiting.elapsed() > Duration::from_millis(700));
    assert_eq!((query(before), query(after)), (SUCCESS, SUCCESS));
    assert_eq!(timing.millis(before, after), (SUCCESS, 10.0));
    assert!(gpu() >= 98);
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(gpu(), 0, "idle since the previous reading");

    // 100 ms of work in about 400 ms of wall time.
    assert_eq!(timing.run(kernel(&cuda, 100 * MS), null_mut()), SUCCESS);
    std::thread::sleep(Duration::from_millis(400));
    let share = gpu();
    assert!((20..=26).contains(&share), "{share} %");
}

#[test]
fn preemption_lets_work_cut_in() {
    let path = TempFile::new("preempt.ledger");
    if !is_child() {
        let file = path.to_str().expect("UTF-8 temp path");
        // Every table in either case: the third is used only with FAKEGPU_PREEMPT=1.
        for (preempt, size) in [("1", 93184), ("0", 93184)] {
            let _ = std::fs::remove_file(&path);
            let env = [("FAKEGPU_SHARED", file), ("FAKEGPU_PREEMPT", preempt), ("SMOKE_STEP", "long")];
            spawn_self("preemption_lets_work_cut_in", &env);
            let metadata = std::fs::metadata(&path).expect("ledger file");
            assert_eq!(metadata.len(), size, "FAKEGPU_PREEMPT={preempt}");
        }
        let _ = std::fs::remove_file(&path);
        return;
    }
    let preempt = std::env::var("FAKEGPU_PREEMPT").as_deref() == Ok("1");
    if std::env::var("SMOKE_STEP").as_deref() == Ok("short") {
        short_kernel_cuts_in(preempt);
    } else {
        long_kernel_is_cut_into(preempt);
    }
}

/// Process Y: a 40 ms kernel between two events, during which process X (its child, started first and
/// waiting for a word) runs a 10 ms kernel. Time-sliced, X's kernel runs inside Y's pair of events;
/// first come first served, after it.
fn long_kernel_is_cut_into(preempt: bool) {
    let cuda = Driver::open("libcuda.so.1");
    let timing = Timing::new(&cuda);
    let query = function!(cuda, cuEventQuery: fn(*mut c_void) -> c_int);
    bind_context(&cuda, 0);
    let long = kernel(&cuda, 40 * MS);
    let (start, end) = (timing.event(0), timing.event(0));
    let mut short = Command::new(std::env::current_exe().expect("test binary path"))
        .args(["--exact", "preemption_lets_work_cut_in", "--nocapture", "--test-threads=1"])
        .env("SMOKE_STEP", "short")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the short process");
    let mut said = BufReader::new(short.stdout.take().expect("piped stdout"));
    wait_for_line(&mut said, "ready");

    timing.record(start, null_mut());
    assert_eq!(timing.run(long, null_mut()), SUCCESS);
    timing.record(end, null_mut());
    short.stdin.take().expect("piped stdin").write_all(b"go\n").expect("tell the short process");
    wait_for_line(&mut said, "done");
    let pending = if preempt { NOT_READY } else { SUCCESS };
    assert_eq!(query(end), pending, "X's kernel is done: Y's kernel is pushed back by it, or ran first");
    assert_eq!((timing.synchronize)(end), SUCCESS);
    let expected = if preempt { 50.0 } else { 40.0 };
    assert_about(timing.millis(start, end), expected, "Y's kernel, plus X's when it cut in");

    let mut rest = String::new();
    said.read_to_string(&mut rest).expect("the short process's output");
    let status = short.wait().expect("the short process");
    assert!(status.success() && rest.contains("1 passed"), "the short process failed:\n{rest}");
}

/// Process X: once Y's long kernel is queued, a 10 ms kernel between two events of its own.
fn short_kernel_cuts_in(preempt: bool) {
    let cuda = Driver::open("libcuda.so.1");
    let timing = Timing::new(&cuda);
    let query = function!(cuda, cuEventQuery: fn(*mut c_void) -> c_int);
    bind_context(&cuda, 0);
    let short = kernel(&cuda, 10 * MS);
    let (start, end) = (timing.event(0), timing.event(0));
    println!("ready");
    let mut word = String::new();
    std::io::stdin().read_line(&mut word).expect("a word from the long process");

    timing.record(start, null_mut());
    let reached = if preempt { SUCCESS } else { NOT_READY };
    assert_eq!(query(start), reached, "at once when it cuts in, else behind Y's kernel");
    assert_eq!(timing.run(short, null_mut()), SUCCESS);
    timing.record(end, null_mut());
    assert_eq!((timing.synchronize)(end), SUCCESS);
    assert_about(timing.millis(start, end), 10.0, "X's kernel only");
    println!("done");
}

/// A successful `cuEventElapsedTime` within 2 ms of `expected`: the host takes a little time between
/// recording an event on an idle device and launching the kernel after it.
fn assert_about((result, milliseconds): (c_int, f32), expected: f32, what: &str) {
    assert_eq!(result, SUCCESS, "{what}");
    assert!((milliseconds - expected).abs() < 2.0, "{what}: {milliseconds} ms, not {expected}");
}

/// Reads a child's stdout until a line ends with `word` (libtest may have begun the line with
/// `test <name> ... `); panics with what it read if the child ends first.
fn wait_for_line(said: &mut impl BufRead, word: &str) {
    let mut seen = String::new();
    loop {
        let mut line = String::new();
        let read = said.read_line(&mut line).expect("the child's stdout");
        assert!(read > 0, "the child ended before saying {word:?}:\n{seen}");
        if line.trim_end().ends_with(word) {
            return;
        }
        seen.push_str(&line);
    }
}

#[test]
fn copies_and_memsets_take_simulated_time() {
    if !is_child() {
        // 1 ms per MiB.
        return spawn_self(
            "copies_and_memsets_take_simulated_time",
            &[("FAKEGPU_COPY_NS_PER_MIB", "1000000")],
        );
    }
    let cuda = Driver::open("libcuda.so.1");
    let alloc = function!(cuda, cuMemAlloc_v2: fn(*mut u64, usize) -> c_int);
    let alloc_host = function!(cuda, cuMemAllocHost_v2: fn(*mut *mut c_void, usize) -> c_int);
    let dtod_async = function!(cuda, cuMemcpyDtoDAsync_v2: fn(u64, u64, usize, *mut c_void) -> c_int);
    let dtod = function!(cuda, cuMemcpyDtoD_v2: fn(u64, u64, usize) -> c_int);
    let htod_async =
        function!(cuda, cuMemcpyHtoDAsync_v2: fn(u64, *const c_void, usize, *mut c_void) -> c_int);
    let memcpy = function!(cuda, cuMemcpy: fn(u64, u64, usize) -> c_int);
    let memset_async = function!(cuda, cuMemsetD32Async: fn(u64, c_uint, usize, *mut c_void) -> c_int);
    let attribute = function!(cuda, cuPointerGetAttribute: fn(*mut c_void, c_int, u64) -> c_int);
    let busy = function!(cuda, fakegpu_busy_ns: fn(c_int) -> u64);
    let last_copy = function!(cuda, fakegpu_last_copy: fn(*mut c_char, usize, *mut u64, *mut u64, *mut *mut c_void) -> c_int);
    let last = || {
        let (mut name, mut bytes, mut dst, mut stream) = ([0 as c_char; 64], 0, 0, null_mut());
        assert_eq!(last_copy(name.as_mut_ptr(), name.len(), &mut bytes, &mut dst, &mut stream), 0);
        (text(name.as_ptr()), bytes, dst, stream)
    };
    assert_eq!(dtod_async(1, 2, 4, null_mut()), NOT_INITIALIZED);
    bind_context(&cuda, 0);
    let (mut dst, mut src, mut host) = (0u64, 0u64, null_mut());
    assert_eq!(alloc(&mut dst, 1 << 20), SUCCESS);
    assert_eq!(alloc(&mut src, 1 << 20), SUCCESS);
    assert_eq!(alloc_host(&mut host, 1 << 20), SUCCESS);
    let legacy = std::ptr::without_provenance_mut::<c_void>(1);

    // Device-side work takes bytes × ns per MiB and returns at once; sizes are not checked.
    let started = Instant::now();
    assert_eq!(dtod_async(dst, src, (20 * MIB) as usize, legacy), SUCCESS);
    assert_eq!(busy(0), 20 * MS);
    assert_eq!(last(), ("cuMemcpyDtoDAsync_v2".to_string(), 20 * MIB, dst, legacy));
    assert_eq!(memset_async(dst, 7, (5 * MIB / 4) as usize, legacy), SUCCESS);
    assert_eq!(busy(0), 25 * MS);
    assert_eq!(last().1, 5 * MIB, "elements × 4 bytes");
    assert!(started.elapsed() < Duration::from_millis(15), "asynchronous calls do not wait");
    // A host side takes no GPU time, whether explicit or found out through unified addressing.
    assert_eq!(htod_async(dst, host, (50 * MIB) as usize, legacy), SUCCESS);
    assert_eq!(memcpy(dst, host.addr() as u64, (50 * MIB) as usize), SUCCESS);
    assert_eq!(busy(0), 25 * MS);
    // A synchronous copy returns when its stream is done: the work queued before it, then its own.
    assert_eq!(dtod(dst, src, (30 * MIB) as usize), SUCCESS);
    assert!(started.elapsed() >= Duration::from_millis(55), "{:?}", started.elapsed());
    assert_eq!(busy(0), 55 * MS);
    assert_eq!(last(), ("cuMemcpyDtoD_v2".to_string(), 30 * MIB, dst, null_mut()));
    assert_eq!(memcpy(dst, src, MIB as usize), SUCCESS);
    assert_eq!(busy(0), 56 * MS);
    assert_eq!(dtod_async(0, src, 16, legacy), INVALID_VALUE, "no destination");

    // cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_MEMORY_TYPE) tells device from page-locked host memory.
    let memory_type = |address: u64| {
        let mut kind: c_uint = 0;
        (attribute((&raw mut kind).cast(), 2, address), kind)
    };
    assert_eq!(memory_type(dst + 100), (SUCCESS, 2));
    assert_eq!(memory_type(host.addr() as u64 + 100), (SUCCESS, 1));
    let pageable = 0u64;
    assert_eq!(memory_type((&raw const pageable).addr() as u64).0, INVALID_VALUE);
    let mut kind: c_uint = 0;
    assert_eq!(attribute((&raw mut kind).cast(), 1, dst), INVALID_VALUE, "not the context");
    // The range's start and size, inside the allocation.
    let (mut start, mut size) = (0u64, 0usize);
    assert_eq!(attribute((&raw mut start).cast(), 11, dst + 100), SUCCESS);
    assert_eq!(attribute((&raw mut size).cast(), 12, dst + 100), SUCCESS);
    assert_eq!((start, size), (dst, 1 << 20));
}
