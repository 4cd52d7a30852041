//! Kernel launches: `cuLaunchKernel`, `cuLaunchCooperativeKernel` and `cuLaunchKernelEx`, each with its
//! `_ptsz` twin. A launch queues its kernel's simulated duration on the stream's device (`timeline`)
//! and returns at once; the kernel parameters are passed through, never read.

// The driver's signatures, argument for argument.
#![allow(clippy::too_many_arguments)]

use std::ffi::{c_uint, c_void};
use std::mem::{offset_of, size_of};

use super::{CUresult, CUstream, CuError, answer, as_handle, get, initialized};
use crate::devices::MULTIPROCESSORS;
use crate::stats;
use crate::timeline::{DURATION_FROM_ARGUMENT, EntryPoint, Launch};

pub type CUfunction = *mut c_void;

/// `CUlaunchConfig` (x86-64 and AArch64 layout); the attributes are not read.
#[derive(Clone, Copy)]
#[repr(C)]
pub struct LaunchConfig {
    grid: [c_uint; 3],
    block: [c_uint; 3],
    shared_mem_bytes: c_uint,
    stream: CUstream,
    attrs: *mut c_void,
    num_attrs: c_uint,
}

const _: () = assert!(size_of::<LaunchConfig>() == 56);
const _: () = assert!(offset_of!(LaunchConfig, stream) == 32);
const _: () = assert!(offset_of!(LaunchConfig, attrs) == 40);
const _: () = assert!(offset_of!(LaunchConfig, num_attrs) == 48);

/// What a launch call passed, before the fake checks it.
struct Request {
    entry_point: EntryPoint,
    function: CUfunction,
    grid: [c_uint; 3],
    block: [c_uint; 3],
    shared_mem_bytes: c_uint,
    stream: CUstream,
    kernel_params: *mut *mut c_void,
    extra: *mut *mut c_void,
    attrs: *mut c_void,
    num_attrs: c_uint,
}

impl Request {
    /// The arguments of `cuLaunchKernel` and `cuLaunchCooperativeKernel` (whose `extra` is NULL).
    fn plain(
        entry_point: EntryPoint,
        function: CUfunction,
        grid: [c_uint; 3],
        block: [c_uint; 3],
        shared_mem_bytes: c_uint,
        stream: CUstream,
        kernel_params: *mut *mut c_void,
        extra: *mut *mut c_void,
    ) -> Request {
        Request {
            entry_point,
            function,
            grid,
            block,
            shared_mem_bytes,
            stream,
            kernel_params,
            extra,
            attrs: std::ptr::null_mut(),
            num_attrs: 0,
        }
    }
}

/// Grid and block dimensions must all be at least 1.
pub(super) fn check_dimensions(grid: [c_uint; 3], block: [c_uint; 3]) -> Result<(), CuError> {
    if grid.contains(&0) || block.contains(&0) { Err(CuError::InvalidValue) } else { Ok(()) }
}

/// Every launch: a current context, a kernel from `fakegpu_kernel`, non-zero dimensions, a stream
/// (NULL is the per-thread default stream in the `_ptsz` calls); then the kernel is queued. A
/// kernel whose context may use only some of the SMs (an MPS client's thread percentage or
/// execution affinity) takes as much longer, as a kernel that fills the GPU does.
fn launch(request: Request) -> Result<(), CuError> {
    let fake = initialized()?;
    let (context, _) = fake.current_context()?;
    let function = as_handle(request.function);
    let duration = match fake.kernel_duration(function)? {
        // SAFETY: `kernel_params` comes from the launch call, per its contract.
        DURATION_FROM_ARGUMENT => unsafe { first_argument(request.kernel_params) }?,
        duration => duration,
    };
    let sms = fake.sm_count(context);
    let duration = duration.saturating_mul(u64::from(MULTIPROCESSORS)) / u64::from(sms);
    check_dimensions(request.grid, request.block)?;
    if request.num_attrs > 0 && request.attrs.is_null() {
        return Err(CuError::InvalidValue);
    }
    let stream = fake.resolve_stream(as_handle(request.stream), request.entry_point.is_per_thread())?;
    let address = |pointer: *mut *mut c_void| pointer.addr() as u64;
    let record = Launch {
        entry_point: request.entry_point,
        function,
        grid: request.grid,
        block: request.block,
        shared_mem_bytes: request.shared_mem_bytes,
        stream: as_handle(request.stream),
        kernel_params: address(request.kernel_params),
        extra: address(request.extra),
    };
    fake.launch(record, stream, duration);
    Ok(())
}

/// The first kernel argument, an `unsigned long long`: how long a kernel made with
/// `DURATION_FROM_ARGUMENT` takes.
///
/// # Safety
/// `kernel_params` is NULL or an array whose first entry is NULL or points to the first argument.
unsafe fn first_argument(kernel_params: *mut *mut c_void) -> Result<u64, CuError> {
    if kernel_params.is_null() {
        return Err(CuError::InvalidValue);
    }
    // SAFETY: a non-NULL array with at least one entry, by this function's contract.
    let first = unsafe { kernel_params.read() };
    if first.is_null() {
        return Err(CuError::InvalidValue);
    }
    // SAFETY: the first argument is an `unsigned long long` for such a kernel; unaligned to be safe.
    Ok(unsafe { first.cast::<u64>().read_unaligned() })
}

/// `cuLaunchKernelEx`: the launch described by `config`.
///
/// # Safety
/// `config` must be NULL or valid for reading a `CUlaunchConfig`.
unsafe fn launch_ex(
    entry_point: EntryPoint,
    config: *const LaunchConfig,
    function: CUfunction,
    kernel_params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> Result<(), CuError> {
    initialized()?;
    // SAFETY: by this function's contract.
    let config = unsafe { get(config) }?;
    let request = Request {
        entry_point,
        function,
        grid: config.grid,
        block: config.block,
        shared_mem_bytes: config.shared_mem_bytes,
        stream: config.stream,
        kernel_params,
        extra,
        attrs: config.attrs,
        num_attrs: config.num_attrs,
    };
    launch(request)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuLaunchKernel(
    function: CUfunction,
    grid_x: c_uint,
    grid_y: c_uint,
    grid_z: c_uint,
    block_x: c_uint,
    block_y: c_uint,
    block_z: c_uint,
    shared_mem_bytes: c_uint,
    stream: CUstream,
    kernel_params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    stats::record_call("cuLaunchKernel");
    let (grid, block) = ([grid_x, grid_y, grid_z], [block_x, block_y, block_z]);
    let entry_point = EntryPoint::LaunchKernel;
    let request =
        Request::plain(entry_point, function, grid, block, shared_mem_bytes, stream, kernel_params, extra);
    answer(|| launch(request))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuLaunchKernel_ptsz(
    function: CUfunction,
    grid_x: c_uint,
    grid_y: c_uint,
    grid_z: c_uint,
    block_x: c_uint,
    block_y: c_uint,
    block_z: c_uint,
    shared_mem_bytes: c_uint,
    stream: CUstream,
    kernel_params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    stats::record_call("cuLaunchKernel_ptsz");
    let (grid, block) = ([grid_x, grid_y, grid_z], [block_x, block_y, block_z]);
    let entry_point = EntryPoint::LaunchKernelPtsz;
    let request =
        Request::plain(entry_point, function, grid, block, shared_mem_bytes, stream, kernel_params, extra);
    answer(|| launch(request))
}

/// Simulated like any launch: the fake has no limit on co-resident blocks.
#[unsafe(no_mangle)]
pub extern "C" fn cuLaunchCooperativeKernel(
    function: CUfunction,
    grid_x: c_uint,
    grid_y: c_uint,
    grid_z: c_uint,
    block_x: c_uint,
    block_y: c_uint,
    block_z: c_uint,
    shared_mem_bytes: c_uint,
    stream: CUstream,
    kernel_params: *mut *mut c_void,
) -> CUresult {
    stats::record_call("cuLaunchCooperativeKernel");
    let (grid, block) = ([grid_x, grid_y, grid_z], [block_x, block_y, block_z]);
    let entry_point = EntryPoint::LaunchCooperativeKernel;
    let request = Request::plain(
        entry_point,
        function,
        grid,
        block,
        shared_mem_bytes,
        stream,
        kernel_params,
        std::ptr::null_mut(),
    );
    answer(|| launch(request))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuLaunchCooperativeKernel_ptsz(
    function: CUfunction,
    grid_x: c_uint,
    grid_y: c_uint,
    grid_z: c_uint,
    block_x: c_uint,
    block_y: c_uint,
    block_z: c_uint,
    shared_mem_bytes: c_uint,
    stream: CUstream,
    kernel_params: *mut *mut c_void,
) -> CUresult {
    stats::record_call("cuLaunchCooperativeKernel_ptsz");
    let (grid, block) = ([grid_x, grid_y, grid_z], [block_x, block_y, block_z]);
    let entry_point = EntryPoint::LaunchCooperativeKernelPtsz;
    let request = Request::plain(
        entry_point,
        function,
        grid,
        block,
        shared_mem_bytes,
        stream,
        kernel_params,
        std::ptr::null_mut(),
    );
    answer(|| launch(request))
}

/// `config` NULL → INVALID_VALUE; its launch attributes (if any) are not read.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchKernelEx(
    config: *const LaunchConfig,
    function: CUfunction,
    kernel_params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    stats::record_call("cuLaunchKernelEx");
    // SAFETY: `config` is NULL or a valid `CUlaunchConfig` per the cuLaunchKernelEx contract.
    answer(|| unsafe { launch_ex(EntryPoint::LaunchKernelEx, config, function, kernel_params, extra) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchKernelEx_ptsz(
    config: *const LaunchConfig,
    function: CUfunction,
    kernel_params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    stats::record_call("cuLaunchKernelEx_ptsz");
    // SAFETY: `config` is NULL or a valid `CUlaunchConfig` per the cuLaunchKernelEx contract.
    answer(|| unsafe { launch_ex(EntryPoint::LaunchKernelExPtsz, config, function, kernel_params, extra) })
}
