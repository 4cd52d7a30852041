//! Kernel and graph launches: paced by the container's clock when the device has a compute share
//! ([`crate::compute`]); otherwise passed straight to the runtime.

// Functions, streams and graphs are opaque runtime handles: passed on, never dereferenced.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

use std::ffi::{c_int, c_uint, c_void};

use crate::compute::{self, per_thread};
use crate::error::HookError;
use crate::runtime::Runtime;
use crate::sys::*;

/// `hipLaunchKernel` (also what a `<<<…>>>` launch compiled by hipcc calls).
///
/// # Safety
/// The application's arguments, per the runtime's contract.
pub unsafe fn launch_kernel(
    runtime: &Runtime,
    function: *const c_void,
    grid: Dim3,
    block: Dim3,
    args: *mut *mut c_void,
    shared: usize,
    stream: Opaque,
) -> Result<(), HookError> {
    // SAFETY: forwarded unchanged.
    compute::launch(runtime, stream, || unsafe {
        runtime.real.hipLaunchKernel(function, grid, block, args, shared, stream)
    })
}

/// `hipLaunchKernel_spt`.
///
/// # Safety
/// The application's arguments, per the runtime's contract.
pub unsafe fn launch_kernel_spt(
    runtime: &Runtime,
    function: *const c_void,
    grid: Dim3,
    block: Dim3,
    args: *mut *mut c_void,
    shared: usize,
    stream: Opaque,
) -> Result<(), HookError> {
    compute::launch(runtime, per_thread(stream), || {
        // SAFETY: forwarded unchanged.
        unsafe { runtime.real.hipLaunchKernel_spt(function, grid, block, args, shared, stream) }
    })
}

/// `hipLaunchCooperativeKernel`.
///
/// # Safety
/// The application's arguments, per the runtime's contract.
pub unsafe fn launch_cooperative_kernel(
    runtime: &Runtime,
    function: *const c_void,
    grid: Dim3,
    block: Dim3,
    args: *mut *mut c_void,
    shared: c_uint,
    stream: Opaque,
) -> Result<(), HookError> {
    compute::launch(runtime, stream, || {
        // SAFETY: forwarded unchanged.
        unsafe { runtime.real.hipLaunchCooperativeKernel(function, grid, block, args, shared, stream) }
    })
}

/// `hipLaunchCooperativeKernel_spt`.
///
/// # Safety
/// The application's arguments, per the runtime's contract.
pub unsafe fn launch_cooperative_kernel_spt(
    runtime: &Runtime,
    function: *const c_void,
    grid: Dim3,
    block: Dim3,
    args: *mut *mut c_void,
    shared: c_uint,
    stream: Opaque,
) -> Result<(), HookError> {
    compute::launch(runtime, per_thread(stream), || {
        // SAFETY: forwarded unchanged.
        unsafe { runtime.real.hipLaunchCooperativeKernel_spt(function, grid, block, args, shared, stream) }
    })
}

/// `hipExtLaunchKernel` (its own optional events are the application's; ours are recorded around
/// the launch as for every other).
///
/// # Safety
/// The application's arguments, per the runtime's contract.
#[allow(clippy::too_many_arguments)]
pub unsafe fn ext_launch_kernel(
    runtime: &Runtime,
    function: *const c_void,
    grid: Dim3,
    block: Dim3,
    args: *mut *mut c_void,
    shared: usize,
    stream: Opaque,
    start: Opaque,
    stop: Opaque,
    flags: c_int,
) -> Result<(), HookError> {
    compute::launch(runtime, stream, || {
        // SAFETY: forwarded unchanged.
        unsafe {
            runtime.real.hipExtLaunchKernel(function, grid, block, args, shared, stream, start, stop, flags)
        }
    })
}

/// `hipModuleLaunchKernel`.
///
/// # Safety
/// The application's arguments, per the runtime's contract.
#[allow(clippy::too_many_arguments)]
pub unsafe fn module_launch_kernel(
    runtime: &Runtime,
    function: Opaque,
    grid_x: c_uint,
    grid_y: c_uint,
    grid_z: c_uint,
    block_x: c_uint,
    block_y: c_uint,
    block_z: c_uint,
    shared: c_uint,
    stream: Opaque,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> Result<(), HookError> {
    compute::launch(runtime, stream, || {
        // SAFETY: forwarded unchanged.
        unsafe {
            runtime.real.hipModuleLaunchKernel(
                function, grid_x, grid_y, grid_z, block_x, block_y, block_z, shared, stream, params, extra,
            )
        }
    })
}

/// `hipGraphLaunch`: a graph is paced as one piece of work.
///
/// # Safety
/// The application's arguments, per the runtime's contract.
pub unsafe fn graph_launch(runtime: &Runtime, graph: Opaque, stream: Opaque) -> Result<(), HookError> {
    // SAFETY: forwarded unchanged.
    compute::launch(runtime, stream, || unsafe { runtime.real.hipGraphLaunch(graph, stream) })
}
