//! The CUDA driver API entry points the fake exports: thin C shims over `state`.

#![allow(non_snake_case)]

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};

use crate::devices;
use crate::proc_table::{self, Lookup};
use crate::state::{self, CONTEXTS, Fake, Width};
use crate::stats;

pub type CUresult = c_int;
pub type CUdevice = c_int;
pub type CUcontext = *mut c_void;
pub type CUdeviceptr = u64;

#[repr(C)]
pub struct CUuuid {
    pub bytes: [u8; 16],
}

const CUDA_SUCCESS: CUresult = 0;
const DRIVER_VERSION: c_int = 13000;

/// The failures the fake reports, with the driver's numbers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(i32)]
enum CuError {
    InvalidValue = 1,
    OutOfMemory = 2,
    NotInitialized = 3,
    NoDevice = 100,
    InvalidDevice = 101,
    InvalidContext = 201,
    NotFound = 500,
    Unknown = 999,
}

type ErrorText = (CUresult, &'static CStr, &'static CStr);

/// (code, name, description) for every code the fake can return.
static ERRORS: &[ErrorText] = &[
    (0, c"CUDA_SUCCESS", c"no error"),
    (1, c"CUDA_ERROR_INVALID_VALUE", c"invalid argument"),
    (2, c"CUDA_ERROR_OUT_OF_MEMORY", c"out of memory"),
    (3, c"CUDA_ERROR_NOT_INITIALIZED", c"initialization error"),
    (100, c"CUDA_ERROR_NO_DEVICE", c"no CUDA-capable device is detected"),
    (101, c"CUDA_ERROR_INVALID_DEVICE", c"invalid device ordinal"),
    (201, c"CUDA_ERROR_INVALID_CONTEXT", c"invalid device context"),
    (500, c"CUDA_ERROR_NOT_FOUND", c"named symbol not found"),
    (999, c"CUDA_ERROR_UNKNOWN", c"unknown error"),
];

const CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM: u64 = 2;
const KNOWN_PROC_FLAGS: u64 = 0b11;
const CU_GET_PROC_ADDRESS_SUCCESS: c_int = 0;
const CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND: c_int = 1;
const CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT: c_int = 2;

/// Writes through a caller's out-pointer, refusing NULL.
///
/// # Safety
/// `ptr` must be NULL or valid for writing a `T`.
unsafe fn put<T>(ptr: *mut T, value: T) -> Result<(), CuError> {
    if ptr.is_null() {
        return Err(CuError::InvalidValue);
    }
    // SAFETY: not NULL, and valid for writes by this function's contract.
    unsafe { ptr.write(value) };
    Ok(())
}

/// Runs a shim's body and converts its result.
fn answer(body: impl FnOnce() -> Result<(), CuError>) -> CUresult {
    match body() {
        Ok(()) => CUDA_SUCCESS,
        Err(error) => error as CUresult,
    }
}

fn initialized() -> Result<&'static Fake, CuError> {
    state::cuda_fake().ok_or(CuError::NotInitialized)
}

/// The physical index of a `CUdevice` (which is a CUDA ordinal).
fn physical(fake: &Fake, device: CUdevice) -> Result<usize, CuError> {
    usize::try_from(device).ok().and_then(|ordinal| fake.physical(ordinal)).ok_or(CuError::InvalidDevice)
}

/// (CUDA ordinal, physical index) of the calling thread's current context.
fn current(fake: &Fake) -> Result<(usize, usize), CuError> {
    let ordinal = state::current_ordinal().ok_or(CuError::InvalidContext)?;
    Ok((ordinal, fake.physical(ordinal).ok_or(CuError::InvalidContext)?))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuInit(flags: c_uint) -> CUresult {
    stats::record_call("cuInit");
    answer(|| {
        if flags != 0 {
            return Err(CuError::InvalidValue);
        }
        let fake = state::fake().map_err(|_| CuError::Unknown)?;
        if fake.ordinals.is_empty() {
            return Err(CuError::NoDevice);
        }
        state::mark_cuda_ready();
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDriverGetVersion(version: *mut c_int) -> CUresult {
    stats::record_call("cuDriverGetVersion");
    // SAFETY: `version` is NULL or a valid out-pointer per the cuDriverGetVersion contract.
    answer(|| unsafe { put(version, DRIVER_VERSION) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetCount(count: *mut c_int) -> CUresult {
    stats::record_call("cuDeviceGetCount");
    answer(|| {
        let n = initialized()?.ordinals.len() as c_int;
        // SAFETY: `count` is NULL or a valid out-pointer per the cuDeviceGetCount contract.
        unsafe { put(count, n) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGet(device: *mut CUdevice, ordinal: c_int) -> CUresult {
    stats::record_call("cuDeviceGet");
    answer(|| {
        physical(initialized()?, ordinal)?;
        // SAFETY: `device` is NULL or a valid out-pointer per the cuDeviceGet contract.
        unsafe { put(device, ordinal) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetName(name: *mut c_char, len: c_int, device: CUdevice) -> CUresult {
    stats::record_call("cuDeviceGetName");
    answer(|| {
        let fake = initialized()?;
        let capacity = usize::try_from(len).ok().filter(|&n| n > 0 && !name.is_null());
        let capacity = capacity.ok_or(CuError::InvalidValue)?;
        let text = devices::name(physical(fake, device)?);
        let copied = text.len().min(capacity - 1);
        // SAFETY: `name` is valid for `len` bytes per the cuDeviceGetName contract; we write `copied` + 1
        // <= `len` bytes, truncating like the real driver.
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr().cast::<c_char>(), name, copied);
            name.add(copied).write(0);
        }
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetUuid(uuid: *mut CUuuid, device: CUdevice) -> CUresult {
    stats::record_call("cuDeviceGetUuid");
    // SAFETY: `uuid` is NULL or a valid out-pointer per the cuDeviceGetUuid contract.
    answer(|| unsafe { device_uuid(uuid, device) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetUuid_v2(uuid: *mut CUuuid, device: CUdevice) -> CUresult {
    stats::record_call("cuDeviceGetUuid_v2");
    // SAFETY: `uuid` is NULL or a valid out-pointer per the cuDeviceGetUuid_v2 contract.
    answer(|| unsafe { device_uuid(uuid, device) })
}

/// Both UUID ABIs (they differ only for MIG instances, which the fake does not simulate).
///
/// # Safety
/// `uuid` must be NULL or valid for writing a `CUuuid`.
unsafe fn device_uuid(uuid: *mut CUuuid, device: CUdevice) -> Result<(), CuError> {
    let bytes = devices::uuid(physical(initialized()?, device)?);
    // SAFETY: by this function's contract.
    unsafe { put(uuid, CUuuid { bytes }) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceTotalMem(bytes: *mut c_uint, device: CUdevice) -> CUresult {
    stats::record_call("cuDeviceTotalMem");
    answer(|| {
        let fake = initialized()?;
        physical(fake, device)?;
        // SAFETY: `bytes` is NULL or a valid out-pointer per the cuDeviceTotalMem contract.
        unsafe { put(bytes, clamp32(fake.memory)) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, device: CUdevice) -> CUresult {
    stats::record_call("cuDeviceTotalMem_v2");
    answer(|| {
        let fake = initialized()?;
        physical(fake, device)?;
        // SAFETY: `bytes` is NULL or a valid out-pointer per the cuDeviceTotalMem_v2 contract.
        unsafe { put(bytes, fake.memory as usize) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(context: *mut CUcontext, device: CUdevice) -> CUresult {
    stats::record_call("cuDevicePrimaryCtxRetain");
    answer(|| {
        let fake = initialized()?;
        physical(fake, device)?;
        let ordinal = device as usize;
        // SAFETY: `context` is NULL or a valid out-pointer per the cuDevicePrimaryCtxRetain contract.
        unsafe { put(context, CONTEXTS.handle(ordinal)) }?;
        fake.retain_primary(ordinal);
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuDevicePrimaryCtxRelease_v2(device: CUdevice) -> CUresult {
    stats::record_call("cuDevicePrimaryCtxRelease_v2");
    answer(|| release_primary(device))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuDevicePrimaryCtxRelease(device: CUdevice) -> CUresult {
    stats::record_call("cuDevicePrimaryCtxRelease");
    answer(|| release_primary(device))
}

fn release_primary(device: CUdevice) -> Result<(), CuError> {
    let fake = initialized()?;
    physical(fake, device)?;
    fake.release_primary(device as usize).then_some(()).ok_or(CuError::InvalidContext)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSetCurrent(context: CUcontext) -> CUresult {
    stats::record_call("cuCtxSetCurrent");
    answer(|| {
        let fake = initialized()?;
        let ordinal = if context.is_null() {
            None
        } else {
            Some(CONTEXTS.index(context, fake.ordinals.len()).ok_or(CuError::InvalidContext)?)
        };
        state::set_current_ordinal(ordinal);
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetCurrent(context: *mut CUcontext) -> CUresult {
    stats::record_call("cuCtxGetCurrent");
    answer(|| {
        initialized()?;
        let handle = state::current_ordinal().map_or(std::ptr::null_mut(), |o| CONTEXTS.handle(o));
        // SAFETY: `context` is NULL or a valid out-pointer per the cuCtxGetCurrent contract.
        unsafe { put(context, handle) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetDevice(device: *mut CUdevice) -> CUresult {
    stats::record_call("cuCtxGetDevice");
    answer(|| {
        let fake = initialized()?;
        if device.is_null() {
            return Err(CuError::InvalidValue);
        }
        let (ordinal, _) = current(fake)?;
        // SAFETY: `device` is a non-NULL out-pointer per the cuCtxGetDevice contract.
        unsafe { put(device, ordinal as CUdevice) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSynchronize() -> CUresult {
    stats::record_call("cuCtxSynchronize");
    answer(|| initialized().map(drop))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamSynchronize(_stream: *mut c_void) -> CUresult {
    stats::record_call("cuStreamSynchronize");
    answer(|| initialized().map(drop))
}

/// The common part of both allocation ABIs; counts every call that has a device to charge.
fn allocate(size: u64, width: Width, out_is_null: bool) -> Result<u64, CuError> {
    let fake = initialized()?;
    let (_, device) = current(fake)?;
    fake.ledger.count_call(device);
    if out_is_null || size == 0 {
        return Err(CuError::InvalidValue);
    }
    fake.allocate(device, size, width).ok_or(CuError::OutOfMemory)
}

fn free(address: u64) -> Result<(), CuError> {
    let fake = initialized()?;
    current(fake)?;
    fake.free(address).then_some(()).ok_or(CuError::InvalidValue)
}

/// (free, total) bytes of the current context's device.
fn memory_info(out_is_null: bool) -> Result<(u64, u64), CuError> {
    let fake = initialized()?;
    if out_is_null {
        return Err(CuError::InvalidValue);
    }
    let (_, device) = current(fake)?;
    Ok((fake.memory.saturating_sub(fake.ledger.used(device)), fake.memory))
}

fn clamp32(bytes: u64) -> c_uint {
    c_uint::try_from(bytes).unwrap_or(c_uint::MAX)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize) -> CUresult {
    stats::record_call("cuMemAlloc_v2");
    answer(|| {
        let address = allocate(bytesize as u64, Width::Bits64, dptr.is_null())?;
        // SAFETY: `allocate` refused NULL; `dptr` is a valid out-pointer per the cuMemAlloc_v2 contract.
        unsafe { put(dptr, address) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAlloc(dptr: *mut c_uint, bytesize: c_uint) -> CUresult {
    stats::record_call("cuMemAlloc");
    answer(|| {
        // 32-bit addresses come from a range that ends at 4 GiB, so the cast keeps every bit.
        let address = allocate(u64::from(bytesize), Width::Bits32, dptr.is_null())? as c_uint;
        // SAFETY: `allocate` refused NULL; `dptr` is a valid out-pointer per the cuMemAlloc contract.
        unsafe { put(dptr, address) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult {
    stats::record_call("cuMemFree_v2");
    answer(|| free(dptr))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemFree(dptr: c_uint) -> CUresult {
    stats::record_call("cuMemFree");
    answer(|| free(u64::from(dptr)))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    stats::record_call("cuMemGetInfo_v2");
    answer(|| {
        let (free_bytes, total_bytes) = memory_info(free.is_null() || total.is_null())?;
        // SAFETY: `memory_info` refused NULLs; both are valid out-pointers per the cuMemGetInfo_v2 contract.
        unsafe { put(free, free_bytes as usize).and(put(total, total_bytes as usize)) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetInfo(free: *mut c_uint, total: *mut c_uint) -> CUresult {
    stats::record_call("cuMemGetInfo");
    answer(|| {
        let (free_bytes, total_bytes) = memory_info(free.is_null() || total.is_null())?;
        // SAFETY: `memory_info` refused NULLs; both are valid out-pointers per the cuMemGetInfo contract.
        unsafe { put(free, clamp32(free_bytes)).and(put(total, clamp32(total_bytes))) }
    })
}

/// Looks up an error's text; an unknown code gets INVALID_VALUE and a NULL string, like the real driver.
///
/// # Safety
/// `out` must be NULL or valid for writing a pointer.
unsafe fn describe(
    error: CUresult,
    out: *mut *const c_char,
    pick: fn(&ErrorText) -> &'static CStr,
) -> Result<(), CuError> {
    let text = ERRORS.iter().find(|entry| entry.0 == error).map(|entry| pick(entry).as_ptr());
    // SAFETY: `out` is NULL or a valid out-pointer by this function's contract.
    unsafe { put(out, text.unwrap_or(std::ptr::null())) }?;
    text.map(drop).ok_or(CuError::InvalidValue)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetErrorString(error: CUresult, text: *mut *const c_char) -> CUresult {
    stats::record_call("cuGetErrorString");
    // SAFETY: `text` is NULL or a valid out-pointer per the cuGetErrorString contract.
    answer(|| unsafe { describe(error, text, |entry| entry.2) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetErrorName(error: CUresult, text: *mut *const c_char) -> CUresult {
    stats::record_call("cuGetErrorName");
    // SAFETY: `text` is NULL or a valid out-pointer per the cuGetErrorName contract.
    answer(|| unsafe { describe(error, text, |entry| entry.1) })
}

/// Both `cuGetProcAddress` ABIs; `status` may be NULL.
///
/// # Safety
/// `symbol` is NULL or a NUL-terminated string; `pfn` and `status` are NULL or valid for writes.
unsafe fn get_proc_address(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> Result<(), CuError> {
    if symbol.is_null() || pfn.is_null() {
        return Err(CuError::InvalidValue);
    }
    if flags & !KNOWN_PROC_FLAGS != 0 {
        // SAFETY: `pfn` is a non-NULL out-pointer per the cuGetProcAddress contract.
        unsafe { pfn.write(std::ptr::null_mut()) };
        return Err(CuError::InvalidValue);
    }
    // SAFETY: `symbol` is a non-NULL NUL-terminated string per the cuGetProcAddress contract.
    let name = unsafe { CStr::from_ptr(symbol) };
    let per_thread = flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM != 0;
    let (found, query) = match proc_table::lookup(name.to_bytes(), version, per_thread) {
        Lookup::Found(entry) => (entry, CU_GET_PROC_ADDRESS_SUCCESS),
        Lookup::VersionNotSufficient => (std::ptr::null(), CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT),
        Lookup::SymbolNotFound => (std::ptr::null(), CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND),
    };
    // SAFETY: `pfn` is non-NULL and `status` NULL or valid, per the cuGetProcAddress contract.
    unsafe {
        pfn.write(found.cast_mut());
        if !status.is_null() {
            status.write(query);
        }
    }
    if found.is_null() { Err(CuError::NotFound) } else { Ok(()) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
) -> CUresult {
    stats::record_call("cuGetProcAddress");
    // SAFETY: the caller's cuGetProcAddress contract is this function's contract, minus `status`.
    answer(|| unsafe { get_proc_address(symbol, pfn, cuda_version, flags, std::ptr::null_mut()) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
    symbol_status: *mut c_int,
) -> CUresult {
    stats::record_call("cuGetProcAddress_v2");
    // SAFETY: the caller's cuGetProcAddress_v2 contract is exactly this function's contract.
    answer(|| unsafe { get_proc_address(symbol, pfn, cuda_version, flags, symbol_status) })
}
