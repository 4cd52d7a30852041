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
