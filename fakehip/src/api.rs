//! Every symbol the fake exports, under the HIP runtime's names. Each converts its arguments and
//! calls [`State`]; a panic becomes `hipErrorUnknown`.

#![allow(non_snake_case)]
// Handles and device addresses are numbers here, never dereferenced.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

use std::cell::Cell;
use std::ffi::{CStr, c_char, c_int, c_uint, c_ulonglong, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::Ordering;

use crate::abi::*;
use crate::pools::{self, Value};
use crate::state::{self, Kind, State};
use crate::timeline;

thread_local! {
    /// The last error a call of this thread returned, until `hipGetLastError` reads it.
    static LAST_ERROR: Cell<HipError> = const { Cell::new(HIP_SUCCESS) };
}

/// Runs `f` on the fake's state and turns the outcome into a status. A failure becomes the
/// thread's last error; `hipErrorNotReady` (an event or stream still busy) is an answer, not an
/// error, and does not.
fn call(f: impl FnOnce(&State) -> Result<(), HipError>) -> HipError {
    let status = catch_unwind(AssertUnwindSafe(|| state::get().and_then(f)))
        .map_or(HIP_ERROR_UNKNOWN, |result| result.err().unwrap_or(HIP_SUCCESS));
    if status != HIP_SUCCESS && status != HIP_ERROR_NOT_READY {
        LAST_ERROR.with(|last| last.set(status));
    }
    status
}

#[unsafe(no_mangle)]
pub extern "C" fn hipGetLastError() -> HipError {
    LAST_ERROR.with(|last| last.replace(HIP_SUCCESS))
}

#[unsafe(no_mangle)]
pub extern "C" fn hipPeekAtLastError() -> HipError {
    LAST_ERROR.with(Cell::get)
}

/// Writes `value` through the out-pointer `out`, or fails with `hipErrorInvalidValue` when NULL.
fn put<T>(out: *mut T, value: T) -> Result<(), HipError> {
    if out.is_null() {
        return Err(HIP_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null, and per the HIP contract of every caller a valid out-pointer for a `T`.
    unsafe { out.write(value) };
    Ok(())
}

/// Reads `*p`, or fails with `hipErrorInvalidValue` when NULL.
fn get<T: Copy>(p: *const T) -> Result<T, HipError> {
    if p.is_null() {
        return Err(HIP_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null, and per the HIP contract of every caller a valid pointer to a `T`.
    Ok(unsafe { p.read() })
}

#[unsafe(no_mangle)]
pub extern "C" fn hipInit(flags: c_uint) -> HipError {
    call(|state| match (flags, state.device_count()) {
        (0, 0) => Err(HIP_ERROR_NO_DEVICE),
        (0, _) => Ok(()),
        _ => Err(HIP_ERROR_INVALID_VALUE),
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn hipRuntimeGetVersion(version: *mut c_int) -> HipError {
    call(|state| put(version, state.config.version))
}

#[unsafe(no_mangle)]
pub extern "C" fn hipDriverGetVersion(version: *mut c_int) -> HipError {
    call(|state| put(version, state.config.version))
}

#[unsafe(no_mangle)]
pub extern "C" fn hipGetDeviceCount(count: *mut c_int) -> HipError {
    call(|state| {
        put(count, state.device_count() as c_int)?;
        if state.device_count() == 0 { Err(HIP_ERROR_NO_DEVICE) } else { Ok(()) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn hipGetDevice(device: *mut c_int) -> HipError {
    call(|state| put(device, state.current()?))
}

#[unsafe(no_mangle)]
pub extern "C" fn hipSetDevice(device: c_int) -> HipError {
    call(|state| state.set_current(device))
}

#[unsafe(no_mangle)]
pub extern "C" fn hipDeviceGetUuid(uuid: *mut [u8; 16], device: c_int) -> HipError {
    call(|state| put(uuid, state.uuid(device)?))
}

#[unsafe(no_mangle)]
pub extern "C" fn hipMemGetInfo(free: *mut usize, total: *mut usize) -> HipError {
    call(|state| {
        let (free_bytes, total_bytes) = state.current_memory()?;
        if free.is_null() || total.is_null() {
            return Err(HIP_ERROR_INVALID_VALUE);
        }
        put(free, free_bytes as usize)?;
        put(total, total_bytes as usize)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn hipDeviceTotalMem(bytes: *mut usize, device: c_int) -> HipError {
    call(|state| put(bytes, state.memory(device)?.1 as usize))
}

/// Fills the name, and for the 6.x layout the UUID, and `totalGlobalMem` of a properties struct.
fn properties(state: &State, prop: *mut u8, device: c_int, r0600: bool) -> Result<(), HipError> {
    let (_, total) = state.memory(device)?;
    let uuid = state.uuid(device)?;
    if prop.is_null() {
        return Err(HIP_ERROR_INVALID_VALUE);
    }
    let name = format!("Fake AMD GPU {device}");
    let (size, total_at) =
        if r0600 { (PROP_R0600_TOTAL + 8, PROP_R0600_TOTAL) } else { (PROP_R0000_SIZE, PROP_R0000_TOTAL) };
    // SAFETY: `prop` is the caller's hipDeviceProp_t (5.x layout) or hipDeviceProp_tR0600, at least
    // `size` bytes long per the header of its version; every write stays below `size`.
    unsafe {
        std::ptr::write_bytes(prop, 0, size);
        std::ptr::copy_nonoverlapping(name.as_ptr(), prop, name.len().min(255));
        if r0600 {
            std::ptr::copy_nonoverlapping(uuid.as_ptr(), prop.add(PROP_R0600_UUID), 16);
        }
        prop.add(total_at).cast::<usize>().write_unaligned(total as usize);
    }
    Ok(())
}

#[unsafe(no_mangle)]
pub extern "C" fn hipGetDeviceProperties(prop: *mut u8, device: c_int) -> HipError {
    call(|state| properties(state, prop, device, false))
}

#[unsafe(no_mangle)]
pub extern "C" fn hipGetDevicePropertiesR0600(prop: *mut u8, device: c_int) -> HipError {
    call(|state| properties(state, prop, device, true))
}

#[unsafe(no_mangle)]
pub extern "C" fn hipMalloc(ptr: *mut *mut c_void, size: usize) -> HipError {
    call(|state| {
        if ptr.is_null() {
            return Err(HIP_ERROR_INVALID_VALUE);
        }
        put(ptr, state.allocate(size as u64)? as *mut c_void)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn hipExtMallocWithFlags(ptr: *mut *mut c_void, size: usize, _flags: c_uint) -> HipError {
    hipMalloc(ptr, size)
}

#[unsafe(no_mangle)]
pub extern "C" fn hipMallocManaged(ptr: *mut *mut c_void, size: usize, _flags: c_uint) -> HipError {
    hipMalloc(ptr, size)
}

#[unsafe(no_mangle)]
pub extern "C" fn hipFree(ptr: *mut c_void) -> HipError {
    call(|state| state.free(ptr as u64, Kind::Linear))
}

/// Pitched memory: rows of `width` bytes rounded up to [`PITCH_ALIGNMENT`].
fn pitched(
    state: &State,
    ptr: *mut *mut c_void,
    pitch: *mut usize,
    width: usize,
    rows: u64,
) -> Result<(), HipError> {
    if ptr.is_null() || pitch.is_null() {
        return Err(HIP_ERROR_INVALID_VALUE);
    }
    let row = (width as u64).div_ceil(PITCH_ALIGNMENT) * PITCH_ALIGNMENT;
    let address = state.allocate(row.saturating_mul(rows))?;
    put(ptr, address as *mut c_void)?;
    put(pitch, row as usize)
}

#[unsafe(no_mangle)]
pub extern "C" fn hipMallocPitch(
    ptr: *mut *mut c_void,
    pitch: *mut usize,
    width: usize,
    height: usize,
) -> HipError {
    call(|state| pitched(state, ptr, pitch, width, height as u64))
}

#[unsafe(no_mangle)]
pub extern "C" fn hipMemAllocPitch(
    ptr: *mut *mut c_void,
    pitch: *mut usize,
    width: usize,
    height: usize,
    _element_size: c_uint,
) -> HipError {
    call(|state| pitched(state, ptr, pitch, width, height as u64))
}

#[unsafe(no_mangle)]
pub extern "C" fn hipMalloc3D(pitched_ptr: *mut PitchedPtr, extent: Extent) -> HipError {
    call(|state| {
        if pitched_ptr.is_null() {
            return Err(HIP_ERROR_INVALID_VALUE);
        }
        let (mut ptr, mut pitch) = (std::ptr::null_mut(), 0usize);
        let rows = (extent.height.max(1) as u64).saturating_mul(extent.depth.max(1) as u64);
        if state.config.internal_plt {
            type MallocPitch = extern "C" fn(*mut *mut c_void, *mut usize, usize, usize) -> HipError;
            // SAFETY: a NUL-terminated name; RTLD_DEFAULT is a valid pseudo-handle.
            let found = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"hipMallocPitch".as_ptr()) };
            if found.is_null() {
                return Err(HIP_ERROR_UNKNOWN);
            }
            // SAFETY: whoever exports hipMallocPitch does so with its C signature.
            let malloc_pitch = unsafe { std::mem::transmute::<*mut c_void, MallocPitch>(found) };
            let status = malloc_pitch(&mut ptr, &mut pitch, extent.width, rows as usize);
            if status != HIP_SUCCESS {
                return Err(status);
            }
        } else {
            pitched(state, &mut ptr, &mut pitch, extent.width, rows)?;
        }
        put(pitched_ptr, PitchedPtr { ptr, pitch, xsize: extent.width, ysize: extent.height })
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn hipMallocAsync(ptr: *mut *mut c_void, size: usize, stream: *mut c_void) -> HipError {
    call(|state| {
        let device = state.stream_device(stream as u64)?;
        if ptr.is_null() {
            return Err(HIP_ERROR_INVALID_VALUE);
        }
        put(ptr, state.allocate_from_pool(None, device, size as u64)? as *mut c_void)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn hipMallocFromPoolAsync(
    ptr: *mut *mut c_void,
    size: usize,
    pool: *mut c_void,
    stream: *mut c_void,
) -> HipError {
    call(|state| {
        state.stream_device(stream as u64)?;
        if ptr.is_null() || pool.is_null() {
            return Err(HIP_ERROR_INVALID_VALUE);
        }
        put(ptr, state.allocate_from_pool(Some(pool as u64), 0, size as u64)? as *mut c_void)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn hipFreeAsync(ptr: *mut c_void, stream: *mut c_void) -> HipError {
    call(|state| {
        state.stream_device(stream as u64)?;
        state.free_async(ptr as u64)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn hipDeviceGetDefaultMemPool(pool: *mut *mut c_void, device: c_int) -> HipError {
    call(|state| put(pool, state.default_pool(device)? as *mut c_void))
}

#[unsafe(no_mangle)]
pub extern "C" fn hipDeviceGetMemPool(pool: *mut *mut c_void, device: c_int) -> HipError {
    call(|state| put(pool, state.current_pool(device)? as *mut c_void))
}

#[unsafe(no_mangle)]
pub extern "C" fn hipDeviceSetMemPool(device: c_int, pool: *mut c_void) -> HipError {
    call(|state| state.set_current_pool(device, pool as u64))
}

/// `hipMemPoolCreate`: `hipMemPoolProps` has `allocType`, `handleTypes`, then the location
/// (`type` at 8, `id` at 12); only device locations are simulated.
#[unsafe(no_mangle)]
pub extern "C" fn hipMemPoolCreate(pool: *mut *mut c_void, props: *const u8) -> HipError {
    call(|state| {
        if props.is_null() || pool.is_null() {
            return Err(HIP_ERROR_INVALID_VALUE);
        }
        // SAFETY: `props` is the caller's hipMemPoolProps, over 16 bytes long in every version.
        let (kind, id) = unsafe {
            (props.add(8).cast::<i32>().read_unaligned(), props.add(12).cast::<i32>().read_unaligned())
        };
        if kind != 1 {
            return Err(HIP_ERROR_INVALID_VALUE);
        }
        put(pool, state.create_pool(id)? as *mut c_void)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn hipMemPoolDestroy(pool: *mut c_void) -> HipError {
    call(|state| state.destroy_pool(pool as u64))
}

#[unsafe(no_mangle)]
pub extern "C" fn hipMemPoolTrimTo(pool: *mut c_void, keep: usize) -> HipError {
    call(|state| state.trim_pool(pool as u64, keep as u64))
}

#[unsafe(no_mangle)]
pub extern "C" fn hipMemPoolSetAttribute(
    pool: *mut c_void,
    attribute: c_int,
    value: *mut c_void,
) -> HipError {
    call(|state| {
        let value = if pools::is_flag(attribute) {
            Value::Flag(get(value.cast::<i32>())?)
        } else {
            Value::Bytes(get(value.cast::<u64>())?)
        };
        state.set_pool_attribute(pool as u64, attribute, value)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn hipMemPoolGetAttribute(
    pool: *mut c_void,
    attribute: c_int,
    value: *mut c_void,
) -> HipError {
    call(|state| match state.pool_attribute(pool as u64, attribute)? {
        Value::Flag(flag) => put(value.cast::<i32>(), flag),
        Value::Bytes(bytes) => put(value.cast::<u64>(), bytes),
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn hipStreamCreate(stream: *mut *mut c_void) -> HipError {
    call(|state| {
        if stream.is_null() {
            return Err(HIP_ERROR_INVALID_VALUE);
        }
        put(stream, state.stream_create()? as *mut c_void)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn hipStreamDestroy(stream: *mut c_void) -> HipError {
    call(|state| state.stream_destroy(stream as u64))
}

/// `hipStreamGetDevice`, which ROCm 5.2 lacks: below runtime version 6.0 (`FAKEHIP_VERSION`) the
/// fake answers `hipErrorNotSupported`, as if the runtime had no such call.
#[unsafe(no_mangle)]
pub extern "C" fn hipStreamGetDevice(stream: *mut c_void, device: *mut c_int) -> HipError {
    call(|state| {
        if state.config.version < 60_000_000 {
            return Err(HIP_ERROR_NOT_SUPPORTED);
        }
        put(device, state.stream_device(stream as u64)?)
    })
}

/// `hipGetStreamDeviceId` (ROCm 5.2 has it): the stream's ordinal, or -1.
#[unsafe(no_mangle)]
pub extern "C" fn hipGetStreamDeviceId(stream: *mut c_void) -> c_int {
    let device = state::get().and_then(|state| state.stream_device(stream as u64));
    device.unwrap_or(-1)
}

/// `hipPointerGetAttributes`: device memory (every linear family, managed included, reported as
/// device memory) and `hipHostMalloc` memory; any other address is `hipErrorInvalidValue`. The
/// memory type's value is the runtime version's (`FAKEHIP_VERSION`).
#[unsafe(no_mangle)]
pub extern "C" fn hipPointerGetAttributes(attributes: *mut u8, ptr: *const c_void) -> HipError {
    call(|state| {
        state.pointer_queries.fetch_add(1, Ordering::Relaxed);
        if attributes.is_null() {
            return Err(HIP_ERROR_INVALID_VALUE);
        }
        let object = state.pointer(ptr as u64).ok_or(HIP_ERROR_INVALID_VALUE)?;
        let [host, device, ..] = memory_types(state.config.version);
        let (kind, ordinal) = match object.kind {
            Kind::Linear => (device, state.ordinal_of(object.device).unwrap_or(-1)),
            Kind::Host => (host, -1),
            Kind::Array => return Err(HIP_ERROR_INVALID_VALUE),
        };
        // SAFETY: `attributes` is the caller's hipPointerAttribute_t, POINTER_ATTRIBUTES_SIZE bytes.
        unsafe {
            std::ptr::write_bytes(attributes, 0, POINTER_ATTRIBUTES_SIZE);
            attributes.cast::<i32>().write_unaligned(kind);
            attributes.add(4).cast::<i32>().write_unaligned(ordinal);
            attributes.add(8).cast::<u64>().write_unaligned(ptr as u64);
        }
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn hipHostMalloc(ptr: *mut *mut c_void, size: usize, _flags: c_uint) -> HipError {
    call(|state| put(ptr, state.host_allocate(size as u64)? as *mut c_void))
}

#[unsafe(no_mangle)]
pub extern "C" fn hipHostFree(ptr: *mut c_void) -> HipError {
    call(|state| if ptr.is_null() { Ok(()) } else { state.free(ptr as u64, Kind::Host) })
}

#[unsafe(no_mangle)]
pub extern "C" fn hipMallocArray(
    array: *mut *mut c_void,
    desc: *const ChannelFormatDesc,
    width: usize,
    height: usize,
    _flags: c_uint,
) -> HipError {
    call(|state| {
        let bytes = get(desc)?.element_bytes() * width as u64 * height.max(1) as u64;
        if array.is_null() || width == 0 {
            return Err(HIP_ERROR_INVALID_VALUE);
        }
        put(array, state.array(bytes)? as *mut c_void)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn hipMalloc3DArray(
    array: *mut *mut c_void,
    desc: *const ChannelFormatDesc,
    extent: Extent,
    _flags: c_uint,
) -> HipError {
    call(|state| {
        let cells = extent.width as u64 * extent.height.max(1) as u64 * extent.depth.max(1) as u64;
        let bytes = get(desc)?.element_bytes() * cells;
        if array.is_null() || extent.width == 0 {
            return Err(HIP_ERROR_INVALID_VALUE);
        }
        put(array, state.array(bytes)? as *mut c_void)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn hipArrayCreate(array: *mut *mut c_void, desc: *const ArrayDescriptor) -> HipError {
    call(|state| {
        let d = get(desc)?;
        let bytes = format_bytes(d.format) * d.num_channels as u64 * d.width as u64 * d.height.max(1) as u64;
        if array.is_null() || d.width == 0 {
            return Err(HIP_ERROR_INVALID_VALUE);
        }
        put(array, state.array(bytes)? as *mut c_void)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn hipArray3DCreate(array: *mut *mut c_void, desc: *const Array3dDescriptor) -> HipError {
    call(|state| {
        let d = get(desc)?;
        let cells = d.width as u64 * d.height.max(1) as u64 * d.depth.max(1) as u64;
        let bytes = format_bytes(d.format) * d.num_channels as u64 * cells;
        if array.is_null() || d.width == 0 {
            return Err(HIP_ERROR_INVALID_VALUE);
        }
        put(array, state.array(bytes)? as *mut c_void)
    })
}

/// Bytes of `levels` mip levels (each dimension halved per level, never below 1; 0 stays 0).
fn mip_bytes(element: u64, width: usize, height: usize, depth: usize, levels: c_uint) -> u64 {
    let (mut w, mut h, mut d) = (width.max(1) as u64, height as u64, depth as u64);
    let mut total = 0;
    for _ in 0..levels.max(1) {
        total += element * w * h.max(1) * d.max(1);
        (w, h, d) = (
            (w / 2).max(1),
            if h == 0 { 0 } else { (h / 2).max(1) },
            if d == 0 { 0 } else { (d / 2).max(1) },
        );
    }
    total
}

#[unsafe(no_mangle)]
pub extern "C" fn hipMallocMipmappedArray(
    array: *mut *mut c_void,
    desc: *const ChannelFormatDesc,
    extent: Extent,
    levels: c_uint,
    _flags: c_uint,
) -> HipError {
    call(|state| {
        let bytes = mip_bytes(get(desc)?.element_bytes(), extent.width, extent.height, extent.depth, levels);
        if array.is_null() || extent.width == 0 {
            return Err(HIP_ERROR_INVALID_VALUE);
        }
        put(array, state.array(bytes)? as *mut c_void)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn hipMipmappedArrayCreate(
    array: *mut *mut c_void,
    desc: *const Array3dDescriptor,
    levels: c_uint,
) -> HipError {
    call(|state| {
        let d = get(desc)?;
        let element = format_bytes(d.format) * d.num_channels as u64;
        if array.is_null() || d.width == 0 {
            return Err(HIP_ERROR_INVALID_VALUE);
        }
        put(array, state.array(mip_bytes(element, d.width, d.height, d.depth, levels))? as *mut c_void)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn hipFreeMipmappedArray(array: *mut c_void) -> HipError {
    hipFreeArray(array)
}

#[unsafe(no_mangle)]
pub extern "C" fn hipMipmappedArrayDestroy(array: *mut c_void) -> HipError {
    hipFreeArray(array)
}

#[unsafe(no_mangle)]
pub extern "C" fn hipFreeArray(array: *mut c_void) -> HipError {
    call(|state| state.free(array as u64, Kind::Array))
}

#[unsafe(no_mangle)]
pub extern "C" fn hipArrayDestroy(array: *mut c_void) -> HipError {
    hipFreeArray(array)
}

#[unsafe(no_mangle)]
pub extern "C" fn hipMemCreate(
    handle: *mut u64,
    size: usize,
    prop: *const u8,
    _flags: c_ulonglong,
) -> HipError {
    call(|state| {
        if prop.is_null() || handle.is_null() {
            return Err(HIP_ERROR_INVALID_VALUE);
        }
        let at = if state.config.version >= 60_000_000 { PROP_LOCATION_ID_6 } else { PROP_LOCATION_ID_5 };
        // SAFETY: `prop` is the caller's hipMemAllocationProp (32 bytes in both layouts); `at` + 4
        // lies within it.
        let device = unsafe { prop.add(at).cast::<i32>().read_unaligned() };
        put(handle, state.mem_create(device, size as u64)?)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn hipMemRelease(handle: u64) -> HipError {
    call(|state| state.mem_release(handle))
}

#[unsafe(no_mangle)]
pub extern "C" fn hipMemMap(
    ptr: *mut c_void,
    _size: usize,
    _offset: usize,
    handle: u64,
    _flags: c_ulonglong,
) -> HipError {
    call(|state| state.mem_map(ptr as u64, handle))
}

#[unsafe(no_mangle)]
pub extern "C" fn hipMemUnmap(ptr: *mut c_void, _size: usize) -> HipError {
    call(|state| state.mem_unmap(ptr as u64))
}

#[unsafe(no_mangle)]
pub extern "C" fn hipMemRetainAllocationHandle(handle: *mut u64, ptr: *mut c_void) -> HipError {
    call(|state| put(handle, state.retain(ptr as u64)?))
}

/// Address space only: nothing is charged.
#[unsafe(no_mangle)]
pub extern "C" fn hipMemAddressReserve(
    ptr: *mut *mut c_void,
    size: usize,
    _alignment: usize,
    _addr: *mut c_void,
    _flags: c_ulonglong,
) -> HipError {
    call(|state| put(ptr, state.host_allocate(size as u64)? as *mut c_void))
}

#[unsafe(no_mangle)]
pub extern "C" fn hipMemAddressFree(ptr: *mut c_void, _size: usize) -> HipError {
    call(|state| state.free(ptr as u64, Kind::Host))
}

#[unsafe(no_mangle)]
pub extern "C" fn hipLaunchKernel(
    function: *const c_void,
    _grid: Dim3,
    _block: Dim3,
    _args: *mut *mut c_void,
    _shared: usize,
    _stream: *mut c_void,
) -> HipError {
    call(|state| state.timeline.launch(state.current_physical()?, function as u64))
}

#[unsafe(no_mangle)]
pub extern "C" fn hipLaunchKernel_spt(
    function: *const c_void,
    grid: Dim3,
    block: Dim3,
    args: *mut *mut c_void,
    shared: usize,
    stream: *mut c_void,
) -> HipError {
    hipLaunchKernel(function, grid, block, args, shared, stream)
}

#[unsafe(no_mangle)]
pub extern "C" fn hipLaunchCooperativeKernel(
    function: *const c_void,
    grid: Dim3,
    block: Dim3,
    args: *mut *mut c_void,
    shared: c_uint,
    stream: *mut c_void,
) -> HipError {
    hipLaunchKernel(function, grid, block, args, shared as usize, stream)
}

#[unsafe(no_mangle)]
pub extern "C" fn hipLaunchCooperativeKernel_spt(
    function: *const c_void,
    grid: Dim3,
    block: Dim3,
    args: *mut *mut c_void,
    shared: c_uint,
    stream: *mut c_void,
) -> HipError {
    hipLaunchKernel(function, grid, block, args, shared as usize, stream)
}

/// The optional events are recorded before and after the kernel, as the runtime does.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn hipExtLaunchKernel(
    function: *const c_void,
    grid: Dim3,
    block: Dim3,
    args: *mut *mut c_void,
    shared: usize,
    stream: *mut c_void,
    start: *mut c_void,
    stop: *mut c_void,
    _flags: c_int,
) -> HipError {
    if !start.is_null() && hipEventRecord(start, stream) != HIP_SUCCESS {
        return HIP_ERROR_INVALID_HANDLE;
    }
    let status = hipLaunchKernel(function, grid, block, args, shared, stream);
    if status == HIP_SUCCESS && !stop.is_null() {
        return hipEventRecord(stop, stream);
    }
    status
}

#[unsafe(no_mangle)]
pub extern "C" fn hipModuleLaunchKernel(
    function: *mut c_void,
    _gx: c_uint,
    _gy: c_uint,
    _gz: c_uint,
    _bx: c_uint,
    _by: c_uint,
    _bz: c_uint,
    _shared: c_uint,
    _stream: *mut c_void,
    _params: *mut *mut c_void,
    _extra: *mut *mut c_void,
) -> HipError {
    call(|state| state.timeline.launch(state.current_physical()?, function as u64))
}

/// A graph made by `fakehip_kernel` runs as one kernel of its duration.
#[unsafe(no_mangle)]
pub extern "C" fn hipGraphLaunch(graph: *mut c_void, _stream: *mut c_void) -> HipError {
    call(|state| state.timeline.launch(state.current_physical()?, graph as u64))
}

#[unsafe(no_mangle)]
pub extern "C" fn hipEventCreate(event: *mut *mut c_void) -> HipError {
    call(|state| put(event, state.timeline.event_create() as *mut c_void))
}

#[unsafe(no_mangle)]
pub extern "C" fn hipEventCreateWithFlags(event: *mut *mut c_void, _flags: c_uint) -> HipError {
    hipEventCreate(event)
}

#[unsafe(no_mangle)]
pub extern "C" fn hipEventDestroy(event: *mut c_void) -> HipError {
    call(|state| state.timeline.event_destroy(event as u64))
}

#[unsafe(no_mangle)]
pub extern "C" fn hipEventRecord(event: *mut c_void, _stream: *mut c_void) -> HipError {
    call(|state| {
        state.event_records.fetch_add(1, Ordering::Relaxed);
        state.timeline.record(event as u64, state.current_physical()?)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn hipEventQuery(event: *mut c_void) -> HipError {
    call(|state| state.timeline.query(event as u64))
}

#[unsafe(no_mangle)]
pub extern "C" fn hipEventSynchronize(event: *mut c_void) -> HipError {
    call(|state| state.timeline.event_synchronize(event as u64))
}

#[unsafe(no_mangle)]
pub extern "C" fn hipEventElapsedTime(ms: *mut f32, start: *mut c_void, stop: *mut c_void) -> HipError {
    call(|state| put(ms, state.timeline.elapsed(start as u64, stop as u64)?))
}

/// Waits for the current device's work, then completes pending `hipFreeAsync`s.
#[unsafe(no_mangle)]
pub extern "C" fn hipDeviceSynchronize() -> HipError {
    call(|state| {
        state.timeline.synchronize(state.current_physical()?);
        state.synchronize();
        Ok(())
    })
}

/// Exports entry points that do `base`'s work: `same_as!(base(args): variant, variant + stream)`
/// declares each `variant(args)`, or with `+ stream` `variant(args, stream)`, calling `base(args)`.
/// The fake has one queue a device, so a stream (the given one or the per-thread one) changes
/// nothing.
macro_rules! same_as {
    (@one $base:ident ($($arg:ident: $ty:ty),* $(,)?) $variant:ident $($stream:ident)?) => {
        #[unsafe(no_mangle)]
        #[allow(clippy::too_many_arguments, unused_variables)]
        pub extern "C" fn $variant($($arg: $ty,)* $($stream: *mut c_void)?) -> HipError {
            $base($($arg),*)
        }
    };
    ($base:ident $args:tt: $($variant:ident $(+ $stream:ident)?),+ $(,)?) => {
        $( same_as!(@one $base $args $variant $($stream)?); )+
    };
}

/// Device-side work of `bytes`: queued on the current device at FAKEGPU_COPY_NS_PER_MIB.
fn device_copy(state: &State, bytes: usize) -> Result<(), HipError> {
    let ns = (bytes as u64).saturating_mul(state.config.copy_ns_per_mib) >> 20;
    state.timeline.occupy(state.current_physical()?, ns);
    Ok(())
}

/// Whether one end of a copy is on the device: an array, or an address in device memory.
fn device_side(state: &State, address: u64) -> bool {
    state.pointer(address).is_some_and(|object| object.kind != Kind::Host)
}

/// A copy of `kind` and `bytes` from `src` to `dst`: device time only device to device, or for
/// `hipMemcpyDefault` between two device-side addresses; nothing is really copied.
fn copy(state: &State, kind: c_int, dst: u64, src: u64, bytes: usize) -> Result<(), HipError> {
    let on_device = kind == MEMCPY_DEVICE_TO_DEVICE
        || (kind == MEMCPY_DEFAULT && device_side(state, dst) && device_side(state, src));
    if on_device { device_copy(state, bytes) } else { Ok(()) }
}

#[unsafe(no_mangle)]
pub extern "C" fn hipMemcpy(dst: *mut c_void, src: *const c_void, size: usize, kind: c_int) -> HipError {
    call(|state| copy(state, kind, dst as u64, src as u64, size))
}

same_as!(hipMemcpy(dst: *mut c_void, src: *const c_void, size: usize, kind: c_int):
    hipMemcpyAsync + stream, hipMemcpyWithStream + stream, hipMemcpy_spt, hipMemcpyAsync_spt + stream,
);

#[unsafe(no_mangle)]
pub extern "C" fn hipMemcpy2D(
    dst: *mut c_void,
    _dpitch: usize,
    src: *const c_void,
    _spitch: usize,
    width: usize,
    height: usize,
    kind: c_int,
) -> HipError {
    call(|state| copy(state, kind, dst as u64, src as u64, width.saturating_mul(height)))
}

same_as!(
    hipMemcpy2D(
        dst: *mut c_void, dpitch: usize, src: *const c_void, spitch: usize, width: usize, height: usize,
        kind: c_int
    ):
    hipMemcpy2DAsync + stream, hipMemcpy2D_spt,
);

#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn hipMemcpy2DToArray(
    dst: *mut c_void,
    _w_offset: usize,
    _h_offset: usize,
    src: *const c_void,
    _spitch: usize,
    width: usize,
    height: usize,
    kind: c_int,
) -> HipError {
    call(|state| copy(state, kind, dst as u64, src as u64, width.saturating_mul(height)))
}

same_as!(
    hipMemcpy2DToArray(
        dst: *mut c_void, w_offset: usize, h_offset: usize, src: *const c_void, spitch: usize, width: usize,
        height: usize, kind: c_int
    ):
    hipMemcpy2DToArrayAsync + stream, hipMemcpy2DToArray_spt,
);

#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn hipMemcpy2DFromArray(
    dst: *mut c_void,
    _dpitch: usize,
    src: *mut c_void,
    _w_offset: usize,
    _h_offset: usize,
    width: usize,
    height: usize,
    kind: c_int,
) -> HipError {
    call(|state| copy(state, kind, dst as u64, src as u64, width.saturating_mul(height)))
}

same_as!(
    hipMemcpy2DFromArray(
        dst: *mut c_void, dpitch: usize, src: *mut c_void, w_offset: usize, h_offset: usize, width: usize,
        height: usize, kind: c_int
    ):
    hipMemcpy2DFromArrayAsync + stream, hipMemcpy2DFromArray_spt,
);

/// Reads the `usize` at `offset` of the caller's struct `p`.
///
/// # Safety
/// `p` points to a struct at least `offset + 8` bytes long.
unsafe fn field(p: *const u8, offset: usize) -> u64 {
    // SAFETY: per the caller's contract.
    unsafe { p.add(offset).cast::<u64>().read_unaligned() }
}

/// `hipMemcpy3D`: a `hipMemcpy3DParms`, whose ends are arrays or pitched pointers.
#[unsafe(no_mangle)]
pub extern "C" fn hipMemcpy3D(p: *const u8) -> HipError {
    call(|state| {
        if p.is_null() {
            return Err(HIP_ERROR_INVALID_VALUE);
        }
        // SAFETY: `p` is the caller's hipMemcpy3DParms, whose leading fields (up to `kind`, 156
        // bytes) are the same in every version.
        let (src, dst, width, height, depth, kind) = unsafe {
            let end = |array, ptr| match field(p, array) {
                0 => field(p, ptr),
                array => array,
            };
            (
                end(P3D_SRC_ARRAY, P3D_SRC_PTR),
                end(P3D_DST_ARRAY, P3D_DST_PTR),
                field(p, P3D_EXTENT),
                field(p, P3D_EXTENT + 8),
                field(p, P3D_EXTENT + 16),
                p.add(P3D_KIND).cast::<i32>().read_unaligned(),
            )
        };
        let bytes = width.saturating_mul(height.max(1)).saturating_mul(depth.max(1));
        copy(state, kind, dst, src, bytes as usize)
    })
}

same_as!(hipMemcpy3D(p: *const u8):
    hipMemcpy3DAsync + stream, hipMemcpy3D_spt,
);

/// `hipMemcpyParam2D`: a `hip_Memcpy2D`, whose ends say their memory type (values of the
/// runtime version, `FAKEHIP_VERSION`); device time when both are device memory or arrays.
#[unsafe(no_mangle)]
pub extern "C" fn hipMemcpyParam2D(p: *const u8) -> HipError {
    call(|state| {
        if p.is_null() {
            return Err(HIP_ERROR_INVALID_VALUE);
        }
        // SAFETY: `p` is the caller's hip_Memcpy2D (128 bytes in every version).
        let (src_type, src, dst_type, dst, width, height) = unsafe {
            (
                p.add(P2D_SRC_MEMORY_TYPE).cast::<i32>().read_unaligned(),
                field(p, P2D_SRC_DEVICE),
                p.add(P2D_DST_MEMORY_TYPE).cast::<i32>().read_unaligned(),
                field(p, P2D_DST_DEVICE),
                field(p, P2D_WIDTH),
                field(p, P2D_HEIGHT),
            )
        };
        typed_copy(state, (src_type, src), (dst_type, dst), width.saturating_mul(height))
    })
}

same_as!(hipMemcpyParam2D(p: *const u8):
    hipMemcpyParam2DAsync + stream,
);

/// A copy whose ends say their memory type (values of the runtime version): device time when
/// both are device memory or arrays (unified or managed: when the address is device memory).
fn typed_copy(state: &State, src: (i32, u64), dst: (i32, u64), bytes: u64) -> Result<(), HipError> {
    let [_, device, array, unified, managed] = memory_types(state.config.version);
    let on_device = |(kind, address): (i32, u64)| {
        kind == device
            || kind == array
            || ((kind == unified || kind == managed) && device_side(state, address))
    };
    if on_device(src) && on_device(dst) { device_copy(state, bytes as usize) } else { Ok(()) }
}

/// `hipDrvMemcpy3D`: a `HIP_MEMCPY3D` in the layout of the runtime version (`FAKEHIP_VERSION`:
/// 5.x `unsigned int` sizes, 6.x `size_t`), whose ends say their memory type.
#[unsafe(no_mangle)]
pub extern "C" fn hipDrvMemcpy3D(p: *const u8) -> HipError {
    call(|state| {
        if p.is_null() {
            return Err(HIP_ERROR_INVALID_VALUE);
        }
        let at = drv_3d_layout(state.config.version);
        // SAFETY: `p` is the caller's HIP_MEMCPY3D of the runtime's layout, which holds every
        // offset read (its sizes last, each `size_bytes` wide).
        let (src_type, src, dst_type, dst, [width, height, depth]) = unsafe {
            let size = |i: usize| {
                let q = p.add(at.width + i * at.size_bytes);
                if at.size_bytes == 8 {
                    q.cast::<u64>().read_unaligned()
                } else {
                    q.cast::<u32>().read_unaligned().into()
                }
            };
            (
                p.add(at.src_memory_type).cast::<i32>().read_unaligned(),
                field(p, at.src_device),
                p.add(at.dst_memory_type).cast::<i32>().read_unaligned(),
                field(p, at.dst_device),
                [size(0), size(1), size(2)],
            )
        };
        let bytes = width.saturating_mul(height.max(1)).saturating_mul(depth.max(1));
        typed_copy(state, (src_type, src), (dst_type, dst), bytes)
    })
}

same_as!(hipDrvMemcpy3D(p: *const u8):
    hipDrvMemcpy3DAsync + stream,
);

/// A copy to or from a symbol: the fake loads no code objects, so a symbol is any device memory
/// it handed out (the symbol's address); anything else is `hipErrorInvalidSymbol` (13). The
/// symbol end is on the device; the other end and the kind decide as for `hipMemcpy`.
fn symbol_copy(state: &State, kind: c_int, symbol: u64, other: u64, bytes: usize) -> Result<(), HipError> {
    if !device_side(state, symbol) {
        return Err(HIP_ERROR_INVALID_SYMBOL);
    }
    copy(state, kind, symbol, other, bytes)
}

#[unsafe(no_mangle)]
pub extern "C" fn hipMemcpyToSymbol(
    symbol: *const c_void,
    src: *const c_void,
    size: usize,
    _offset: usize,
    kind: c_int,
) -> HipError {
    call(|state| symbol_copy(state, kind, symbol as u64, src as u64, size))
}

same_as!(hipMemcpyToSymbol(symbol: *const c_void, src: *const c_void, size: usize, offset: usize, kind: c_int):
    hipMemcpyToSymbolAsync + stream, hipMemcpyToSymbol_spt, hipMemcpyToSymbolAsync_spt + stream,
);

#[unsafe(no_mangle)]
pub extern "C" fn hipMemcpyFromSymbol(
    dst: *mut c_void,
    symbol: *const c_void,
    size: usize,
    _offset: usize,
    kind: c_int,
) -> HipError {
    call(|state| symbol_copy(state, kind, symbol as u64, dst as u64, size))
}

same_as!(hipMemcpyFromSymbol(dst: *mut c_void, symbol: *const c_void, size: usize, offset: usize, kind: c_int):
    hipMemcpyFromSymbolAsync + stream, hipMemcpyFromSymbol_spt, hipMemcpyFromSymbolAsync_spt + stream,
);

#[unsafe(no_mangle)]
pub extern "C" fn hipMemcpyPeer(
    _dst: *mut c_void,
    dst_device: c_int,
    _src: *const c_void,
    src_device: c_int,
    size: usize,
) -> HipError {
    call(|state| {
        state.physical(dst_device)?;
        state.physical(src_device)?;
        device_copy(state, size)
    })
}

same_as!(
    hipMemcpyPeer(dst: *mut c_void, dst_device: c_int, src: *const c_void, src_device: c_int, size: usize):
    hipMemcpyPeerAsync + stream,
);

#[unsafe(no_mangle)]
pub extern "C" fn hipMemcpyDtoD(_dst: *mut c_void, _src: *mut c_void, size: usize) -> HipError {
    call(|state| device_copy(state, size))
}

same_as!(hipMemcpyDtoD(dst: *mut c_void, src: *mut c_void, size: usize):
    hipMemcpyDtoDAsync + stream,
);

#[unsafe(no_mangle)]
pub extern "C" fn hipMemset(_dst: *mut c_void, _value: c_int, size: usize) -> HipError {
    call(|state| device_copy(state, size))
}

same_as!(hipMemset(dst: *mut c_void, value: c_int, size: usize):
    hipMemsetAsync + stream, hipMemset_spt,
);

#[unsafe(no_mangle)]
pub extern "C" fn hipMemsetD8(_dst: *mut c_void, _value: u8, count: usize) -> HipError {
    call(|state| device_copy(state, count))
}

same_as!(hipMemsetD8(dst: *mut c_void, value: u8, count: usize):
    hipMemsetD8Async + stream,
);

#[unsafe(no_mangle)]
pub extern "C" fn hipMemsetD32(_dst: *mut c_void, _value: c_int, count: usize) -> HipError {
    call(|state| device_copy(state, count.saturating_mul(4)))
}

same_as!(hipMemsetD32(dst: *mut c_void, value: c_int, count: usize):
    hipMemsetD32Async + stream,
);

#[unsafe(no_mangle)]
pub extern "C" fn hipMemsetD16(_dst: *mut c_void, _value: u16, count: usize) -> HipError {
    call(|state| device_copy(state, count.saturating_mul(2)))
}

same_as!(hipMemsetD16(dst: *mut c_void, value: u16, count: usize):
    hipMemsetD16Async + stream,
);

#[unsafe(no_mangle)]
pub extern "C" fn hipMemset2D(
    _dst: *mut c_void,
    _pitch: usize,
    _value: c_int,
    width: usize,
    height: usize,
) -> HipError {
    call(|state| device_copy(state, width.saturating_mul(height)))
}

same_as!(hipMemset2D(dst: *mut c_void, pitch: usize, value: c_int, width: usize, height: usize):
    hipMemset2DAsync + stream, hipMemset2D_spt,
);

#[unsafe(no_mangle)]
pub extern "C" fn hipMemset3D(_pitched: PitchedPtr, _value: c_int, extent: Extent) -> HipError {
    let bytes = extent.width.saturating_mul(extent.height.max(1)).saturating_mul(extent.depth.max(1));
    call(|state| device_copy(state, bytes))
}

same_as!(hipMemset3D(pitched: PitchedPtr, value: c_int, extent: Extent):
    hipMemset3DAsync + stream, hipMemset3D_spt,
);

/// Frees everything on the current device.
#[unsafe(no_mangle)]
pub extern "C" fn hipDeviceReset() -> HipError {
    call(|state| {
        let device = state.current_physical()?;
        state.timeline.synchronize(device);
        state.reset(device);
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn hipStreamSynchronize(_stream: *mut c_void) -> HipError {
    hipDeviceSynchronize()
}

/// Test hook: a kernel (or graph) handle whose launches occupy the device for `ns` nanoseconds.
#[unsafe(no_mangle)]
pub extern "C" fn fakehip_kernel(ns: u64) -> *mut c_void {
    timeline::kernel(ns) as *mut c_void
}

/// Test hook: nanoseconds of work ever queued on physical device `device` by this process.
#[unsafe(no_mangle)]
pub extern "C" fn fakehip_busy_ns(device: c_int) -> u64 {
    let state = state::get().ok();
    state
        .and_then(|s| {
            usize::try_from(device)
                .ok()
                .filter(|&d| d < s.config.device_count)
                .map(|d| s.timeline.busy_total(d))
        })
        .unwrap_or(0)
}

/// Test hook: how many `hipPointerGetAttributes` calls this process made.
#[unsafe(no_mangle)]
pub extern "C" fn fakehip_pointer_queries() -> u64 {
    state::get().map_or(0, |state| state.pointer_queries.load(Ordering::Relaxed))
}

/// Test hook: how many `hipEventRecord` calls this process made (a paced call records two).
#[unsafe(no_mangle)]
pub extern "C" fn fakehip_event_records() -> u64 {
    state::get().map_or(0, |state| state.event_records.load(Ordering::Relaxed))
}

/// Test hook: the fake's own counters of physical device `device` (0: fine, 1: no such device).
#[unsafe(no_mangle)]
pub extern "C" fn fakehip_stats(
    device: c_int,
    used: *mut u64,
    peak: *mut u64,
    alloc_calls: *mut u64,
) -> c_int {
    let stats = state::get().ok().and_then(|state| state.stats(usize::try_from(device).ok()?));
    let Some((u, p, c)) = stats else { return 1 };
    if put(used, u).and(put(peak, p)).and(put(alloc_calls, c)).is_err() {
        return 1;
    }
    0
}

/// One entry point `hipGetProcAddress` knows: its name, the runtime version that introduced it
/// (the ELF symbol version of ROCm 5.2's libamdhip64 for the 4.x/5.x ones), and its address.
struct Entry {
    name: &'static CStr,
    since: i32,
    address: usize,
}

macro_rules! entry {
    ($f:ident, $since:expr) => {
        Entry {
            name: match CStr::from_bytes_with_nul(concat!(stringify!($f), "\0").as_bytes()) {
                Ok(name) => name,
                Err(_) => panic!("symbol name with NUL"),
            },
            since: $since,
            address: $f as *const () as usize,
        }
    };
}

fn entries() -> Vec<Entry> {
    const V42: i32 = 40_200_000;
    const V43: i32 = 40_300_000;
    const V51: i32 = 50_100_000;
    const V52: i32 = 50_200_000;
    vec![
        entry!(hipInit, V42),
        entry!(hipRuntimeGetVersion, V42),
        entry!(hipDriverGetVersion, V42),
        entry!(hipGetDeviceCount, V42),
        entry!(hipGetDevice, V42),
        entry!(hipSetDevice, V42),
        entry!(hipDeviceGetUuid, V51),
        entry!(hipMemGetInfo, V42),
        entry!(hipDeviceTotalMem, V42),
        entry!(hipGetDeviceProperties, V42),
        entry!(hipGetDevicePropertiesR0600, 60_000_000),
        entry!(hipMalloc, V42),
        entry!(hipExtMallocWithFlags, V42),
        entry!(hipMallocManaged, V42),
        entry!(hipFree, V42),
        entry!(hipMallocPitch, V42),
        entry!(hipMemAllocPitch, V42),
        entry!(hipMalloc3D, V42),
        entry!(hipMallocAsync, V51),
        entry!(hipMallocFromPoolAsync, V51),
        entry!(hipFreeAsync, V51),
        entry!(hipDeviceGetDefaultMemPool, V51),
        entry!(hipHostMalloc, V42),
        entry!(hipHostFree, V42),
        entry!(hipMallocArray, V42),
        entry!(hipMalloc3DArray, V42),
        entry!(hipArrayCreate, V42),
        entry!(hipArray3DCreate, V42),
        entry!(hipFreeArray, V42),
        entry!(hipArrayDestroy, 40_300_000),
        entry!(hipMallocMipmappedArray, V42),
        entry!(hipMipmappedArrayCreate, V42),
        entry!(hipFreeMipmappedArray, V42),
        entry!(hipMipmappedArrayDestroy, V42),
        entry!(hipMemCreate, V51),
        entry!(hipMemRelease, V51),
        entry!(hipMemMap, V51),
        entry!(hipMemUnmap, V51),
        entry!(hipMemRetainAllocationHandle, V51),
        entry!(hipMemAddressReserve, V51),
        entry!(hipMemAddressFree, V51),
        entry!(hipGetProcAddress, 60_200_000),
        entry!(hipLaunchKernel, V42),
        entry!(hipModuleLaunchKernel, V42),
        entry!(hipLaunchKernel_spt, 50_200_000),
        entry!(hipLaunchCooperativeKernel, V42),
        entry!(hipLaunchCooperativeKernel_spt, 50_200_000),
        entry!(hipExtLaunchKernel, V42),
        entry!(hipGraphLaunch, V42),
        entry!(hipEventCreate, V42),
        entry!(hipEventCreateWithFlags, V42),
        entry!(hipEventDestroy, V42),
        entry!(hipEventRecord, V42),
        entry!(hipEventQuery, V42),
        entry!(hipEventSynchronize, V42),
        entry!(hipEventElapsedTime, V42),
        entry!(hipDeviceSynchronize, V42),
        entry!(hipDeviceReset, V42),
        entry!(hipMemcpy, V42),
        entry!(hipMemcpyAsync, V42),
        entry!(hipMemcpyDtoD, V42),
        entry!(hipMemcpyDtoDAsync, V42),
        entry!(hipMemset, V42),
        entry!(hipMemsetAsync, V42),
        entry!(hipMemsetD8, V42),
        entry!(hipMemsetD8Async, V42),
        entry!(hipMemsetD32, V42),
        entry!(hipMemsetD32Async, V42),
        entry!(hipStreamSynchronize, V42),
        entry!(hipGetLastError, V42),
        entry!(hipPeekAtLastError, V42),
        entry!(hipDeviceGetMemPool, V51),
        entry!(hipDeviceSetMemPool, V51),
        entry!(hipMemPoolCreate, V51),
        entry!(hipMemPoolDestroy, V51),
        entry!(hipMemPoolTrimTo, V51),
        entry!(hipMemPoolSetAttribute, V51),
        entry!(hipMemPoolGetAttribute, V51),
        entry!(hipStreamCreate, V42),
        entry!(hipStreamDestroy, V42),
        entry!(hipStreamGetDevice, 60_000_000),
        entry!(hipGetStreamDeviceId, V42),
        entry!(hipPointerGetAttributes, V42),
        entry!(hipMemcpyWithStream, V42),
        entry!(hipMemcpy_spt, V52),
        entry!(hipMemcpyAsync_spt, V52),
        entry!(hipMemcpy2D, V42),
        entry!(hipMemcpy2DAsync, V42),
        entry!(hipMemcpy2D_spt, V52),
        entry!(hipMemcpy2DToArray, V42),
        entry!(hipMemcpy2DToArrayAsync, V43),
        entry!(hipMemcpy2DToArray_spt, V52),
        entry!(hipMemcpy2DFromArray, V42),
        entry!(hipMemcpy2DFromArrayAsync, V42),
        entry!(hipMemcpy2DFromArray_spt, V52),
        entry!(hipMemcpy3D, V42),
        entry!(hipMemcpy3DAsync, V42),
        entry!(hipMemcpy3D_spt, V52),
        entry!(hipMemcpyParam2D, V42),
        entry!(hipMemcpyParam2DAsync, V42),
        entry!(hipMemcpyPeer, V42),
        entry!(hipMemcpyPeerAsync, V42),
        entry!(hipMemset_spt, V52),
        entry!(hipMemsetD16, V42),
        entry!(hipMemsetD16Async, V42),
        entry!(hipMemset2D, V42),
        entry!(hipMemset2DAsync, V42),
        entry!(hipMemset2D_spt, V52),
        entry!(hipMemset3D, V42),
        entry!(hipMemset3DAsync, V42),
        entry!(hipMemset3D_spt, V52),
        entry!(hipDrvMemcpy3D, V42),
        entry!(hipDrvMemcpy3DAsync, V42),
        entry!(hipMemcpyToSymbol, V42),
        entry!(hipMemcpyToSymbolAsync, V42),
        entry!(hipMemcpyToSymbol_spt, V52),
        entry!(hipMemcpyToSymbolAsync_spt, 60_000_000),
        entry!(hipMemcpyFromSymbol, V42),
        entry!(hipMemcpyFromSymbolAsync, V42),
        entry!(hipMemcpyFromSymbol_spt, V52),
        entry!(hipMemcpyFromSymbolAsync_spt, 60_000_000),
    ]
}

/// `hipGetProcAddress` (HIP 6.2): the entry point `symbol` names at runtime version `version`
/// (`major*10000000 + minor*100000 + patch`). Names whose ABI changed resolve by version:
/// `hipGetDeviceProperties` asked at 6.0 or later is `hipGetDevicePropertiesR0600`, as the 6.x
/// header's macro makes it for a program compiled against it.
#[unsafe(no_mangle)]
pub extern "C" fn hipGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    _flags: u64,
    status: *mut c_int,
) -> HipError {
    call(|_| {
        if symbol.is_null() || pfn.is_null() {
            return Err(HIP_ERROR_INVALID_VALUE);
        }
        // SAFETY: `symbol` is a NUL-terminated string per hipGetProcAddress's contract.
        let name = unsafe { CStr::from_ptr(symbol) };
        let name = if name == c"hipGetDeviceProperties" && version >= 60_000_000 {
            c"hipGetDevicePropertiesR0600"
        } else {
            name
        };
        let found = entries().into_iter().find(|entry| entry.name == name);
        let (address, result, outcome) = match found {
            Some(entry) if version >= entry.since => (entry.address, HIP_GET_PROC_ADDRESS_SUCCESS, Ok(())),
            Some(_) => (0, HIP_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT, Err(HIP_ERROR_NOT_FOUND)),
            None => (0, HIP_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND, Err(HIP_ERROR_NOT_FOUND)),
        };
        put(pfn, address as *mut c_void)?;
        if !status.is_null() {
            put(status, result)?;
        }
        outcome
    })
}

// ROCm SMI (librocm_smi64), for the memory view: the tests link librocm_smi64.so.1 to this
// library too. Devices are the physical ones, in physical order, whatever HIP_VISIBLE_DEVICES
// says; statuses are rsmi_status_t's (0 success, 1 invalid arguments, 7 input out of bounds).

/// `rsmi_init`.
#[unsafe(no_mangle)]
pub extern "C" fn rsmi_init(_flags: u64) -> c_int {
    if state::get().is_ok() { 0 } else { 8 }
}

/// `rsmi_shut_down`.
#[unsafe(no_mangle)]
pub extern "C" fn rsmi_shut_down() -> c_int {
    0
}

/// Runs `f` with the state and physical device `device`, as an `rsmi_status_t`.
fn smi(device: u32, f: impl FnOnce(&State, usize) -> Result<(), HipError>) -> c_int {
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        let state = state::get().map_err(|_| 8)?;
        let device = usize::try_from(device).ok().filter(|&d| d < state.config.device_count).ok_or(7)?;
        f(state, device)
    }));
    match outcome {
        Ok(Ok(())) => 0,
        Ok(Err(status)) => status,
        Err(_) => -1,
    }
}

/// `rsmi_num_monitor_devices`.
#[unsafe(no_mangle)]
pub extern "C" fn rsmi_num_monitor_devices(count: *mut u32) -> c_int {
    match state::get() {
        Ok(state) => put(count, state.config.device_count as u32).map_or(1, |()| 0),
        Err(_) => 8,
    }
}

/// `rsmi_dev_unique_id_get`: a device whose UUID's 16 bytes are ASCII hex digits (as ROCm's HIP
/// UUIDs are) has those digits as its id; any other has its UUID's last 8 bytes.
#[unsafe(no_mangle)]
pub extern "C" fn rsmi_dev_unique_id_get(device: u32, id: *mut u64) -> c_int {
    smi(device, |state, device| {
        let uuid = state.config.uuids[device];
        let digits = std::str::from_utf8(&uuid).ok().and_then(|text| u64::from_str_radix(text, 16).ok());
        let fallback = u64::from_be_bytes(uuid[8..].try_into().unwrap_or_default());
        put(id, digits.unwrap_or(fallback)).map_err(|_| 1)
    })
}

/// `rsmi_dev_memory_total_get`: VRAM (type 0) and visible VRAM (1) are the device's memory.
#[unsafe(no_mangle)]
pub extern "C" fn rsmi_dev_memory_total_get(device: u32, kind: c_int, total: *mut u64) -> c_int {
    smi(device, |state, _| match kind {
        0 | 1 => put(total, state.config.memory).map_err(|_| 1),
        _ => Err(2),
    })
}

/// `rsmi_dev_memory_usage_get`: what the fake's ledger holds on the device.
#[unsafe(no_mangle)]
pub extern "C" fn rsmi_dev_memory_usage_get(device: u32, kind: c_int, used: *mut u64) -> c_int {
    smi(device, |state, device| match kind {
        0 | 1 => put(used, state.stats(device).map_or(0, |(used, _, _)| used)).map_err(|_| 1),
        _ => Err(2),
    })
}
