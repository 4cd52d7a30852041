//! The CUDA driver API entry points the fake exports: thin C shims over the model (`state`, `memory`,
//! `contexts`, `timeline`, `events`). This module holds the shared shim layer and the device and lookup
//! entry points; each other family of entry points has its own submodule.

#![allow(non_snake_case)]

pub mod arrays;
pub mod contexts;
pub mod copies;
pub mod events;
pub mod graphs;
pub mod host;
pub mod ipc;
pub mod launches;
pub mod memory;
pub mod modules;
pub mod pools;
pub mod vmm;

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};

use crate::devices;
use crate::proc_table::{self, Lookup};
use crate::state::{self, Fake, Refusal};
use crate::stats;

pub type CUresult = c_int;
pub type CUdevice = c_int;
pub type CUcontext = *mut c_void;
pub type CUdeviceptr = u64;
pub type CUstream = *mut c_void;

#[repr(C)]
pub struct CUuuid {
    pub bytes: [u8; 16],
}

/// `CUmemLocation`.
#[derive(Clone, Copy)]
#[repr(C)]
pub struct CUmemLocation {
    pub kind: c_int,
    pub id: c_int,
}

/// The leading fields of both `CUmemPoolProps` and `CUmemAllocationProp`: all the fake reads of them.
#[derive(Clone, Copy)]
#[repr(C)]
pub struct MemoryPropsHead {
    pub alloc_type: c_int,
    pub handle_types: c_int,
    pub location: CUmemLocation,
}

const CU_MEM_ALLOCATION_TYPE_PINNED: c_int = 1;
const CU_MEM_LOCATION_TYPE_DEVICE: c_int = 1;

const CUDA_SUCCESS: CUresult = 0;
const DRIVER_VERSION: c_int = 13000;
/// `CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT`: 132 as on an H100, or under MPS what a thread percentage
/// leaves the process.
const MULTIPROCESSOR_COUNT: c_int = 16;
/// `CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR` and `_MINOR`: 9.0, as on an H100.
const COMPUTE_CAPABILITY_MAJOR: c_int = 75;
const COMPUTE_CAPABILITY_MINOR: c_int = 76;
/// `CU_DEVICE_ATTRIBUTE_PCI_BUS_ID`, `_PCI_DEVICE_ID` and `_PCI_DOMAIN_ID`: a device's PCI address, which
/// clients use to pair a CUDA device with the same card seen through another API.
const PCI_BUS_ID: c_int = 33;
const PCI_DEVICE_ID: c_int = 34;
const PCI_DOMAIN_ID: c_int = 50;
/// `CU_DEVICE_ATTRIBUTE_MPS_ENABLED`: 1 when contexts created on the device are shared through MPS.
const MPS_ENABLED: c_int = 133;

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
    InvalidHandle = 400,
    NotFound = 500,
    NotReady = 600,
    ContextIsDestroyed = 709,
    HostMemoryAlreadyRegistered = 712,
    HostMemoryNotRegistered = 713,
    NotSupported = 801,
    Unknown = 999,
}

impl From<Refusal> for CuError {
    fn from(refusal: Refusal) -> CuError {
        match refusal {
            Refusal::BadArgument | Refusal::Unknown => CuError::InvalidValue,
            Refusal::OutOfMemory => CuError::OutOfMemory,
            Refusal::BadDevice => CuError::InvalidDevice,
            Refusal::NoContext => CuError::InvalidContext,
            Refusal::ContextDestroyed => CuError::ContextIsDestroyed,
            Refusal::AlreadyRegistered => CuError::HostMemoryAlreadyRegistered,
            Refusal::NotRegistered => CuError::HostMemoryNotRegistered,
            Refusal::BadHandle => CuError::InvalidHandle,
            Refusal::NotReady => CuError::NotReady,
        }
    }
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
    (400, c"CUDA_ERROR_INVALID_HANDLE", c"invalid resource handle"),
    (500, c"CUDA_ERROR_NOT_FOUND", c"named symbol not found"),
    (600, c"CUDA_ERROR_NOT_READY", c"device not ready"),
    (709, c"CUDA_ERROR_CONTEXT_IS_DESTROYED", c"context is destroyed"),
    (
        712,
        c"CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
        c"part or all of the requested memory range is already mapped",
    ),
    (
        713,
        c"CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED",
        c"pointer does not correspond to a registered memory region",
    ),
    (801, c"CUDA_ERROR_NOT_SUPPORTED", c"operation not supported"),
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

/// Reads a caller's argument struct, refusing NULL.
///
/// # Safety
/// `ptr` must be NULL or valid for reading a `T` (which may be a prefix of the caller's struct).
unsafe fn get<T>(ptr: *const T) -> Result<T, CuError> {
    if ptr.is_null() {
        return Err(CuError::InvalidValue);
    }
    // SAFETY: not NULL, and valid for reads by this function's contract; an unaligned read asks for no
    // more alignment than the caller's struct has, whichever struct `T` is a prefix of.
    Ok(unsafe { ptr.read_unaligned() })
}

/// Refuses a NULL pointer argument.
fn non_null<T>(ptr: *const T) -> Result<(), CuError> {
    if ptr.is_null() { Err(CuError::InvalidValue) } else { Ok(()) }
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
    Ok(fake.device(device)?)
}

/// (CUDA ordinal, physical index) of the calling thread's current context.
fn current(fake: &Fake) -> Result<(usize, usize), CuError> {
    Ok(fake.current()?)
}

fn clamp32(bytes: u64) -> c_uint {
    c_uint::try_from(bytes).unwrap_or(c_uint::MAX)
}

/// The physical device that pool or VMM properties place memory on: pinned memory on a visible device.
///
/// # Safety
/// `props` must be NULL or point to a `CUmemPoolProps` or `CUmemAllocationProp`.
unsafe fn props_device(fake: &Fake, props: *const MemoryPropsHead) -> Result<usize, CuError> {
    // SAFETY: both structs begin with these fields, per this function's contract.
    let head = unsafe { get(props) }?;
    if head.alloc_type != CU_MEM_ALLOCATION_TYPE_PINNED || head.location.kind != CU_MEM_LOCATION_TYPE_DEVICE {
        return Err(CuError::InvalidValue);
    }
    physical(fake, head.location.id)
}

/// An opaque handle as the pointer type the API passes (`CUstream`, `CUmemoryPool`, `CUarray`…).
fn as_pointer(handle: u64) -> *mut c_void {
    std::ptr::without_provenance_mut(handle as usize)
}

/// The number an opaque pointer-typed handle carries.
fn as_handle(pointer: *mut c_void) -> u64 {
    pointer.addr() as u64
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
        crate::injection::load_once();
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
    let fake = initialized()?;
    let bytes = fake.uuid(physical(fake, device)?);
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
pub unsafe extern "C" fn cuDeviceGetAttribute(
    value: *mut c_int,
    attribute: c_int,
    device: CUdevice,
) -> CUresult {
    stats::record_call("cuDeviceGetAttribute");
    answer(|| {
        let fake = initialized()?;
        let index = physical(fake, device)?;
        let (domain, bus, slot) = devices::pci_address(index);
        let answer = match attribute {
            MULTIPROCESSOR_COUNT => fake.process_sm_count() as c_int,
            COMPUTE_CAPABILITY_MAJOR => 9,
            COMPUTE_CAPABILITY_MINOR => 0,
            PCI_BUS_ID => bus as c_int,
            PCI_DEVICE_ID => slot as c_int,
            PCI_DOMAIN_ID => domain as c_int,
            MPS_ENABLED => c_int::from(fake.mps),
            _ => 0,
        };
        // SAFETY: `value` is NULL or a valid out-pointer per the cuDeviceGetAttribute contract.
        unsafe { put(value, answer) }
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
