//! The NVML entry points the fake exports: thin C shims over `state`, listing every physical device.

#![allow(non_snake_case, non_camel_case_types)]

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::mem::size_of;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::devices::{self, MULTIPROCESSORS};
use crate::processes;
use crate::state::{self, Fake, Handles};
use crate::stats;

pub type nvmlReturn_t = c_int;
pub type nvmlDevice_t = *mut c_void;

#[repr(C)]
pub struct nvmlMemory_t {
    pub total: u64,
    pub free: u64,
    pub used: u64,
}

#[repr(C)]
pub struct nvmlMemory_v2_t {
    pub version: c_uint,
    pub total: u64,
    pub reserved: u64,
    pub free: u64,
    pub used: u64,
}

#[repr(C)]
pub struct nvmlUtilization_t {
    pub gpu: c_uint,
    pub memory: c_uint,
}

/// `nvmlProcessInfo_t` (the `_v2`/`_v3` record).
#[repr(C)]
pub struct nvmlProcessInfo_t {
    pub pid: c_uint,
    pub usedGpuMemory: u64,
    pub gpuInstanceId: c_uint,
    pub computeInstanceId: c_uint,
}

/// `nvmlPciInfo_t` as `nvmlDeviceGetPciInfo_v3` fills it (the older ABIs had a shorter struct).
#[repr(C)]
pub struct nvmlPciInfo_t {
    pub busIdLegacy: [c_char; 16],
    pub domain: c_uint,
    pub bus: c_uint,
    pub device: c_uint,
    pub pciDeviceId: c_uint,
    pub pciSubSystemId: c_uint,
    pub busId: [c_char; 32],
}

const _: () = assert!(size_of::<nvmlPciInfo_t>() == 68);
const _: () = assert!(size_of::<nvmlMemory_v2_t>() == 40);
const _: () = assert!(size_of::<nvmlProcessInfo_t>() == 24);
/// `pciDeviceId`: NVIDIA's vendor id in the low 16 bits and an H100's device id (0x2330) in the high ones,
/// matching the multiprocessor count the CUDA side reports.
const PCI_DEVICE_ID: c_uint = 0x2330_10de;
/// NVML's "not available" for a `u64` field, and for instance ids outside MIG.
const NOT_AVAILABLE: u64 = u64::MAX;
const NO_INSTANCE: c_uint = c_uint::MAX;
const NVML_MEMORY_V2: c_uint = size_of::<nvmlMemory_v2_t>() as c_uint | (2 << 24);
const NVML_SUCCESS: nvmlReturn_t = 0;
/// "GPU-" + 36 characters + NUL.
const UUID_BUFFER: usize = 41;

/// The failures the fake reports, with NVML's numbers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(i32)]
enum NvmlError {
    Uninitialized = 1,
    InvalidArgument = 2,
    InsufficientSize = 7,
    ArgumentVersionMismatch = 25,
    Unknown = 999,
}

static ERROR_STRINGS: &[(nvmlReturn_t, &CStr)] = &[
    (0, c"Success"),
    (1, c"Uninitialized"),
    (2, c"Invalid Argument"),
    (6, c"Not Found"),
    (7, c"Insufficient Size"),
    (25, c"Argument version mismatch"),
    (999, c"Unknown Error"),
];

/// `nvmlDevice_t` handles, by physical index.
static DEVICES: Handles = Handles::new(u32::from_be_bytes(*b"NVML"));
/// Successful `nvmlInit` calls not yet matched by `nvmlShutdown`.
static INIT_COUNT: AtomicU32 = AtomicU32::new(0);

/// Runs a shim's body and converts its result.
fn answer(body: impl FnOnce() -> Result<(), NvmlError>) -> nvmlReturn_t {
    match body() {
        Ok(()) => NVML_SUCCESS,
        Err(error) => error as nvmlReturn_t,
    }
}

fn initialized() -> Result<&'static Fake, NvmlError> {
    if INIT_COUNT.load(Ordering::Acquire) == 0 {
        return Err(NvmlError::Uninitialized);
    }
    state::fake().map_err(|_| NvmlError::Unknown)
}

/// The fake and the physical index behind one of our handles.
fn device(handle: nvmlDevice_t) -> Result<(&'static Fake, usize), NvmlError> {
    let fake = initialized()?;
    let index = DEVICES.index(handle, fake.device_count).ok_or(NvmlError::InvalidArgument)?;
    Ok((fake, index))
}

/// Writes through a caller's out-pointer, refusing NULL.
///
/// # Safety
/// `ptr` must be NULL or valid for writing a `T`.
unsafe fn put<T>(ptr: *mut T, value: T) -> Result<(), NvmlError> {
    if ptr.is_null() {
        return Err(NvmlError::InvalidArgument);
    }
    // SAFETY: not NULL, and valid for writes by this function's contract.
    unsafe { ptr.write(value) };
    Ok(())
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInit_v2() -> nvmlReturn_t {
    stats::record_call("nvmlInit_v2");
    answer(init)
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInit() -> nvmlReturn_t {
    stats::record_call("nvmlInit");
    answer(init)
}

fn init() -> Result<(), NvmlError> {
    state::fake().map_err(|_| NvmlError::Unknown)?;
    INIT_COUNT.fetch_add(1, Ordering::AcqRel);
    Ok(())
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlShutdown() -> nvmlReturn_t {
    stats::record_call("nvmlShutdown");
    answer(|| {
        let dropped =
            INIT_COUNT.fetch_update(Ordering::AcqRel, Ordering::Acquire, |count| count.checked_sub(1));
        dropped.map(drop).map_err(|_| NvmlError::Uninitialized)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> nvmlReturn_t {
    stats::record_call("nvmlDeviceGetCount_v2");
    answer(|| {
        let n = initialized()?.device_count as c_uint;
        // SAFETY: `count` is NULL or a valid out-pointer per the nvmlDeviceGetCount_v2 contract.
        unsafe { put(count, n) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    stats::record_call("nvmlDeviceGetHandleByIndex_v2");
    answer(|| {
        let index = index as usize;
        if index >= initialized()?.device_count {
            return Err(NvmlError::InvalidArgument);
        }
        // SAFETY: `device` is NULL or a valid out-pointer per the nvmlDeviceGetHandleByIndex_v2 contract.
        unsafe { put(device, DEVICES.handle(index)) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    device: nvmlDevice_t,
    uuid: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    stats::record_call("nvmlDeviceGetUUID");
    answer(|| {
        let (fake, index) = self::device(device)?;
        if uuid.is_null() {
            return Err(NvmlError::InvalidArgument);
        }
        if (length as usize) < UUID_BUFFER {
            return Err(NvmlError::InsufficientSize);
        }
        let text = devices::uuid_string(&fake.uuid(index));
        // SAFETY: `uuid` is valid for `length` >= 41 bytes per the nvmlDeviceGetUUID contract; we write
        // the 40 characters and a NUL.
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr().cast::<c_char>(), uuid, text.len());
            uuid.add(text.len()).write(0);
        }
        Ok(())
    })
}

/// The device's CUDA cores: 128 for each of its SMs, as on an H100. NVML is not an MPS client, so
/// this is the whole device whatever a thread percentage leaves a process.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNumGpuCores(device: nvmlDevice_t, cores: *mut c_uint) -> nvmlReturn_t {
    stats::record_call("nvmlDeviceGetNumGpuCores");
    answer(|| {
        self::device(device)?;
        if cores.is_null() {
            return Err(NvmlError::InvalidArgument);
        }
        // SAFETY: a non-NULL out-pointer per the nvmlDeviceGetNumGpuCores contract.
        unsafe { cores.write(MULTIPROCESSORS * 128) };
        Ok(())
    })
}

/// The PCI address of `cuDeviceGetAttribute`'s PCI attributes, in both of NVML's bus id spellings.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(
    device: nvmlDevice_t,
    pci: *mut nvmlPciInfo_t,
) -> nvmlReturn_t {
    stats::record_call("nvmlDeviceGetPciInfo_v3");
    answer(|| {
        let (_, index) = self::device(device)?;
        let (domain, bus, slot) = devices::pci_address(index);
        let info = nvmlPciInfo_t {
            busIdLegacy: c_string(&format!("{domain:04X}:{bus:02X}:{slot:02X}.0")),
            domain,
            bus,
            device: slot,
            pciDeviceId: PCI_DEVICE_ID,
            pciSubSystemId: 0,
            busId: c_string(&format!("{domain:08X}:{bus:02X}:{slot:02X}.0")),
        };
        // SAFETY: `pci` is NULL or a valid out-pointer per the nvmlDeviceGetPciInfo_v3 contract.
        unsafe { put(pci, info) }
    })
}

/// `text` as a NUL-terminated C array, truncated to leave room for the NUL.
fn c_string<const N: usize>(text: &str) -> [c_char; N] {
    let mut array = [0; N];
    for (slot, &byte) in array.iter_mut().take(N.saturating_sub(1)).zip(text.as_bytes()) {
        *slot = byte as c_char;
    }
    array
}

/// (total, used) bytes of physical device `index`.
fn usage(fake: &Fake, index: usize) -> (u64, u64) {
    (fake.memory, fake.ledger.used(index).min(fake.memory))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_t,
) -> nvmlReturn_t {
    stats::record_call("nvmlDeviceGetMemoryInfo");
    answer(|| {
        let (fake, index) = self::device(device)?;
        let (total, used) = usage(fake, index);
        // SAFETY: `memory` is NULL or a valid out-pointer per the nvmlDeviceGetMemoryInfo contract.
        unsafe { put(memory, nvmlMemory_t { total, free: total - used, used }) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_v2_t,
) -> nvmlReturn_t {
    stats::record_call("nvmlDeviceGetMemoryInfo_v2");
    answer(|| {
        let (fake, index) = self::device(device)?;
        if memory.is_null() {
            return Err(NvmlError::InvalidArgument);
        }
        // SAFETY: `memory` is a non-NULL pointer to the caller's struct per the contract.
        let version = unsafe { (*memory).version };
        if version != NVML_MEMORY_V2 {
            return Err(NvmlError::ArgumentVersionMismatch);
        }
        let (total, used) = usage(fake, index);
        // SAFETY: as above, valid for writing every field; the caller's version and padding stay.
        unsafe {
            (&raw mut (*memory).total).write(total);
            (&raw mut (*memory).reserved).write(0);
            (&raw mut (*memory).free).write(total - used);
            (&raw mut (*memory).used).write(used);
        }
        Ok(())
    })
}

/// `gpu`: percent of the time since this process's previous call for the device (or since the fake
/// started in this process) that the simulated device was busy, by every process sharing it; `memory`:
/// 0, as no memory traffic is simulated.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(
    device: nvmlDevice_t,
    utilization: *mut nvmlUtilization_t,
) -> nvmlReturn_t {
    stats::record_call("nvmlDeviceGetUtilizationRates");
    answer(|| {
        let (fake, index) = self::device(device)?;
        if utilization.is_null() {
            return Err(NvmlError::InvalidArgument);
        }
        let gpu = fake.utilization(index);
        // SAFETY: `utilization` is a non-NULL out-pointer per the nvmlDeviceGetUtilizationRates contract.
        unsafe { put(utilization, nvmlUtilization_t { gpu, memory: 0 }) }
    })
}

/// Processes holding a context on the device: `*count` of them on entry, or `InsufficientSize` with
/// `*count` set to how many there are (a count of 0 asks for the number only). Every live process
/// of the process table with a context there (every process sharing `FAKEGPU_SHARED`), with its
/// pid in the caller's pid namespace and every byte it holds on the device (allocations, contexts,
/// modules, graphics memory); this process first. A process the caller cannot see, and one that
/// died holding a context (still counted, as before the table), read pid 0 and memory "not
/// available". Instance ids read "not available".
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    stats::record_call("nvmlDeviceGetComputeRunningProcesses_v3");
    // SAFETY: the caller's pointers, per the NVML contract.
    answer(|| unsafe { list_processes(device, count, infos, Listing::Compute) })
}

/// The processes with an MPS client context on a device: under `FAKEGPU_MPS=1` every process
/// with a context (as `nvmlDeviceGetComputeRunningProcesses_v3` lists them), else none.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMPSComputeRunningProcesses_v3(
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    stats::record_call("nvmlDeviceGetMPSComputeRunningProcesses_v3");
    // SAFETY: the caller's pointers, per the NVML contract.
    answer(|| unsafe { list_processes(device, count, infos, Listing::Mps) })
}

/// The processes holding graphics memory on a device (`fakegpu_graphics_alloc`), as the compute
/// list shows them, whether or not they also hold a context.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGraphicsRunningProcesses_v3(
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    stats::record_call("nvmlDeviceGetGraphicsRunningProcesses_v3");
    // SAFETY: the caller's pointers, per the NVML contract.
    answer(|| unsafe { list_processes(device, count, infos, Listing::Graphics) })
}

/// Which process list.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Listing {
    Compute,
    Mps,
    Graphics,
}

/// Writes the device's process records for `listing`.
///
/// # Safety
/// `count` is NULL or a valid in/out pointer; `infos` is NULL or has room for `*count` records.
unsafe fn list_processes(
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
    listing: Listing,
) -> Result<(), NvmlError> {
    let (fake, index) = self::device(device)?;
    if count.is_null() {
        return Err(NvmlError::InvalidArgument);
    }
    let records = records(fake, index, listing);
    let running = c_uint::try_from(records.len()).unwrap_or(c_uint::MAX);
    // SAFETY: `count` is a non-NULL in/out pointer per this function's contract.
    let room = unsafe { count.read() };
    // SAFETY: as above.
    unsafe { count.write(running) };
    if room < running {
        return Err(NvmlError::InsufficientSize);
    }
    if running > 0 && infos.is_null() {
        return Err(NvmlError::InvalidArgument);
    }
    for (k, info) in records.into_iter().enumerate() {
        // SAFETY: the caller gave room for `room` >= `running` records at `infos`.
        unsafe { infos.add(k).write(info) };
    }
    Ok(())
}

/// The records of `listing` on physical device `index`: this process first.
fn records(fake: &Fake, index: usize, listing: Listing) -> Vec<nvmlProcessInfo_t> {
    let record = |pid: Option<u32>, bytes: u64| nvmlProcessInfo_t {
        pid: pid.unwrap_or(0),
        usedGpuMemory: if pid.is_some() { bytes } else { NOT_AVAILABLE },
        gpuInstanceId: NO_INSTANCE,
        computeInstanceId: NO_INSTANCE,
    };
    if listing == Listing::Mps && !fake.mps {
        return Vec::new();
    }
    let list =
        if listing == Listing::Graphics { processes::List::Graphics } else { processes::List::Compute };
    let mut listed = fake.listed(index, list);
    listed.sort_by_key(|p| !p.own);
    let (running, this) = fake.running_processes(index);
    let shown = fake.nvml_shows_self();
    let mut records: Vec<nvmlProcessInfo_t> = listed
        .iter()
        .map(|p| match (p.own, shown) {
            (true, true) => record(p.pid, fake.own_bytes(index)),
            (true, false) => record(None, 0),
            (false, _) => record(p.pid, p.bytes),
        })
        .collect();
    if listing != Listing::Graphics {
        if this && !listed.iter().any(|p| p.own) {
            // The table was full: this process still knows itself.
            records.insert(0, record(shown.then(std::process::id), fake.own_bytes(index)));
        }
        let counted = usize::try_from(running).unwrap_or(usize::MAX);
        while records.len() < counted {
            records.push(record(None, 0));
        }
    }
    records
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlErrorString(result: nvmlReturn_t) -> *const c_char {
    stats::record_call("nvmlErrorString");
    let text = ERROR_STRINGS.iter().find(|entry| entry.0 == result).map_or(c"Unknown Error", |entry| entry.1);
    text.as_ptr()
}
