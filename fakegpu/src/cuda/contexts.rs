//! Contexts and streams: primary contexts, `cuCtxCreate`/`cuCtxDestroy`, the per-thread context stack
//! (`cuCtxSetCurrent`, `cuCtxPushCurrent`, `cuCtxPopCurrent`), `cuStreamCreate`/`cuStreamDestroy`,
//! `cuStreamIsCapturing` (and `_ptsz`) and the synchronize calls, which wait for the simulated work
//! and complete pending `cuMemFreeAsync`s.

use std::ffi::{c_int, c_uint, c_void};

use super::{
    CUcontext, CUdevice, CUresult, CUstream, CuError, answer, as_handle, as_pointer, current, initialized,
    non_null, physical, put,
};
use crate::contexts::{self, Bound};
use crate::stats;

/// Every `CUctx_flags` bit: the scheduling policy (low 3 bits), MAP_HOST, LMEM_RESIZE_TO_MAX, COREDUMP,
/// USER_COREDUMP, SYNC_MEMOPS.
const CONTEXT_FLAGS: c_uint = 0xff;
/// `CU_STREAM_NON_BLOCKING`, the one `cuStreamCreate` flag.
const STREAM_FLAGS: c_uint = 1;
/// `CUstreamCaptureStatus`: not capturing.
const CU_STREAM_CAPTURE_STATUS_NONE: c_int = 0;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(context: *mut CUcontext, device: CUdevice) -> CUresult {
    stats::record_call("cuDevicePrimaryCtxRetain");
    answer(|| {
        let fake = initialized()?;
        physical(fake, device)?;
        non_null(context)?;
        let ordinal = device as usize;
        fake.retain_primary(ordinal)?;
        // SAFETY: `context` is a non-NULL out-pointer per the cuDevicePrimaryCtxRetain contract.
        unsafe { put(context, Bound::Primary(ordinal).handle()) }
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
    Ok(fake.release_primary(device as usize)?)
}

/// The common part of every `cuCtxCreate` ABI: a new context, pushed on this thread, written out.
///
/// # Safety
/// `context` must be NULL or valid for writing a `CUcontext`.
unsafe fn create_context(
    context: *mut CUcontext,
    flags: c_uint,
    device: CUdevice,
    sm_affinity: Option<u32>,
) -> Result<(), CuError> {
    let fake = initialized()?;
    non_null(context)?;
    if flags & !CONTEXT_FLAGS != 0 || !matches!(flags & 0x7, 0 | 1 | 2 | 4) {
        return Err(CuError::InvalidValue);
    }
    physical(fake, device)?;
    let bound = fake.create_context(device as usize, sm_affinity)?;
    // SAFETY: a non-NULL out-pointer by this function's contract.
    unsafe { put(context, bound.handle()) }
}

/// `CUexecAffinityParam`: the affinity's type, then a 4-byte union whose one member today is the
/// SM count.
#[derive(Clone, Copy)]
#[repr(C)]
struct ExecAffinityParam {
    kind: c_int,
    value: c_uint,
}

/// `CU_EXEC_AFFINITY_TYPE_SM_COUNT`.
const EXEC_AFFINITY_SM_COUNT: c_int = 0;

/// The SM count asked for in an affinity list of `count` entries, if any entry asks for one.
///
/// # Safety
/// `list` is NULL or points to `count` readable entries.
unsafe fn requested_sms(list: *const ExecAffinityParam, count: c_int) -> Option<u32> {
    if list.is_null() {
        return None;
    }
    // SAFETY: `count` entries, per this function's contract.
    let entries = unsafe { std::slice::from_raw_parts(list, usize::try_from(count).unwrap_or(0)) };
    entries.iter().find(|entry| entry.kind == EXEC_AFFINITY_SM_COUNT).map(|entry| entry.value)
}

/// The v1 ABI (`cuCtxCreate`, CUDA 2.0) is not simulated.
#[unsafe(no_mangle)]
pub extern "C" fn cuCtxCreate(_context: *mut CUcontext, _flags: c_uint, _device: CUdevice) -> CUresult {
    stats::record_call("cuCtxCreate");
    CuError::NotSupported as CUresult
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxCreate_v2(
    context: *mut CUcontext,
    flags: c_uint,
    device: CUdevice,
) -> CUresult {
    stats::record_call("cuCtxCreate_v2");
    // SAFETY: `context` is NULL or a valid out-pointer per the cuCtxCreate_v2 contract.
    answer(|| unsafe { create_context(context, flags, device, None) })
}

/// An SM-count entry of `paramsArray` caps the context's kernels under MPS (`FAKEGPU_MPS=1`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxCreate_v3(
    context: *mut CUcontext,
    params: *mut c_void,
    num_params: c_int,
    flags: c_uint,
    device: CUdevice,
) -> CUresult {
    stats::record_call("cuCtxCreate_v3");
    answer(|| {
        if num_params < 0 || (num_params > 0 && params.is_null()) {
            initialized()?;
            return Err(CuError::InvalidValue);
        }
        // SAFETY: `params` holds `num_params` entries per the cuCtxCreate_v3 contract.
        let sms = unsafe { requested_sms(params.cast_const().cast(), num_params) };
        // SAFETY: `context` is NULL or a valid out-pointer per the cuCtxCreate_v3 contract.
        unsafe { create_context(context, flags, device, sms) }
    })
}

/// `CUctxCreateParams`: an execution-affinity list and its length (then a CIG parameter, not read).
#[repr(C)]
struct CtxCreateParams {
    affinity: *const ExecAffinityParam,
    affinity_count: c_int,
}

/// `ctxCreateParams` may be NULL; an SM-count entry of its affinity list caps the context as in
/// `cuCtxCreate_v3`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxCreate_v4(
    context: *mut CUcontext,
    params: *mut c_void,
    flags: c_uint,
    device: CUdevice,
) -> CUresult {
    stats::record_call("cuCtxCreate_v4");
    let params = params.cast_const().cast::<CtxCreateParams>();
    // SAFETY: `params` is NULL or a `CUctxCreateParams` whose list holds its count of entries, per
    // the cuCtxCreate_v4 contract.
    let sms = unsafe { params.as_ref().and_then(|p| requested_sms(p.affinity, p.affinity_count)) };
    // SAFETY: `context` is NULL or a valid out-pointer per the cuCtxCreate_v4 contract.
    answer(|| unsafe { create_context(context, flags, device, sms) })
}

/// `cuCtxGetExecAffinity`: the SMs the current context's kernels may use, the only affinity type.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetExecAffinity(affinity: *mut c_void, kind: c_int) -> CUresult {
    stats::record_call("cuCtxGetExecAffinity");
    answer(|| {
        let fake = initialized()?;
        non_null(affinity)?;
        if kind != EXEC_AFFINITY_SM_COUNT {
            return Err(CuError::InvalidValue);
        }
        let (bound, _) = fake.current_context()?;
        let answer = ExecAffinityParam { kind, value: fake.sm_count(bound) };
        // SAFETY: a non-NULL out-pointer to a `CUexecAffinityParam` per the call's contract.
        unsafe { affinity.cast::<ExecAffinityParam>().write_unaligned(answer) };
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxDestroy_v2(context: CUcontext) -> CUresult {
    stats::record_call("cuCtxDestroy_v2");
    answer(|| {
        let fake = initialized()?;
        non_null(context)?;
        Ok(fake.destroy_context(context)?)
    })
}

/// A green context is simulated as a context of its own that is not made current; `desc` (the
/// SM partition) is not looked at.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGreenCtxCreate(
    context: *mut CUcontext,
    _desc: *mut c_void,
    device: CUdevice,
    _flags: c_uint,
) -> CUresult {
    stats::record_call("cuGreenCtxCreate");
    answer(|| {
        let fake = initialized()?;
        non_null(context)?;
        physical(fake, device)?;
        let bound = fake.create_green_context(device as usize)?;
        // SAFETY: a non-NULL out-pointer per the cuGreenCtxCreate contract.
        unsafe { put(context, bound.handle()) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuGreenCtxDestroy(context: CUcontext) -> CUresult {
    stats::record_call("cuGreenCtxDestroy");
    answer(|| {
        let fake = initialized()?;
        non_null(context)?;
        Ok(fake.destroy_context(context)?)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSetCurrent(context: CUcontext) -> CUresult {
    stats::record_call("cuCtxSetCurrent");
    answer(|| {
        let fake = initialized()?;
        let bound = if context.is_null() { None } else { Some(fake.resolve_context(context)?) };
        contexts::set_top(bound);
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetCurrent(context: *mut CUcontext) -> CUresult {
    stats::record_call("cuCtxGetCurrent");
    answer(|| {
        initialized()?;
        let handle = contexts::top().map_or(std::ptr::null_mut(), Bound::handle);
        // SAFETY: `context` is NULL or a valid out-pointer per the cuCtxGetCurrent contract.
        unsafe { put(context, handle) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxPushCurrent_v2(context: CUcontext) -> CUresult {
    stats::record_call("cuCtxPushCurrent_v2");
    answer(|| {
        let fake = initialized()?;
        non_null(context)?;
        contexts::push(fake.resolve_context(context)?);
        Ok(())
    })
}

/// `context` may be NULL: the popped context is then not reported.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxPopCurrent_v2(context: *mut CUcontext) -> CUresult {
    stats::record_call("cuCtxPopCurrent_v2");
    answer(|| {
        initialized()?;
        let popped = contexts::pop().ok_or(CuError::InvalidContext)?;
        if !context.is_null() {
            // SAFETY: a non-NULL out-pointer per the cuCtxPopCurrent_v2 contract.
            unsafe { put(context, popped.handle()) }?;
        }
        Ok(())
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

/// Waits for every stream of this process on the context's device, then completes pending frees.
#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSynchronize() -> CUresult {
    stats::record_call("cuCtxSynchronize");
    answer(|| {
        let fake = initialized()?;
        let (_, device) = current(fake)?;
        fake.wait_for_device(device);
        fake.synchronize();
        Ok(())
    })
}

/// CUDA 13's form with the context named (NULL: the current one), which cudart 13 resolves for
/// `cudaDeviceSynchronize`: the same wait, on that context's device.
#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSynchronize_v2(context: CUcontext) -> CUresult {
    stats::record_call("cuCtxSynchronize_v2");
    answer(|| {
        let fake = initialized()?;
        let device = if context.is_null() {
            current(fake)?.1
        } else {
            physical(fake, fake.resolve_context(context)?.ordinal() as CUdevice)?
        };
        fake.wait_for_device(device);
        fake.synchronize();
        Ok(())
    })
}

/// Waits for that stream's simulated work; then, like any synchronize, completes every pending free.
#[unsafe(no_mangle)]
pub extern "C" fn cuStreamSynchronize(stream: CUstream) -> CUresult {
    stats::record_call("cuStreamSynchronize");
    answer(|| {
        let fake = initialized()?;
        current(fake)?;
        let stream = fake.resolve_stream(as_handle(stream), false)?;
        fake.wait_for_stream(stream);
        fake.synchronize();
        Ok(())
    })
}

/// `CUDA_SUCCESS` once the stream's queued work is done, else `CUDA_ERROR_NOT_READY`.
#[unsafe(no_mangle)]
pub extern "C" fn cuStreamQuery(stream: CUstream) -> CUresult {
    stats::record_call("cuStreamQuery");
    query_stream(stream, false)
}

/// `cuStreamQuery` with the per-thread default stream for NULL.
#[unsafe(no_mangle)]
pub extern "C" fn cuStreamQuery_ptsz(stream: CUstream) -> CUresult {
    stats::record_call("cuStreamQuery_ptsz");
    query_stream(stream, true)
}

fn query_stream(stream: CUstream, null_is_per_thread: bool) -> CUresult {
    answer(|| {
        let fake = initialized()?;
        current(fake)?;
        let stream = fake.resolve_stream(as_handle(stream), null_is_per_thread)?;
        Ok(fake.query_stream(stream)?)
    })
}

/// The fake has no stream capture: writes `CU_STREAM_CAPTURE_STATUS_NONE` (0) for any valid stream.
///
/// # Safety
/// `status` must be NULL or valid for writing an `int`.
unsafe fn is_capturing(
    stream: CUstream,
    status: *mut c_int,
    null_is_per_thread: bool,
) -> Result<(), CuError> {
    let fake = initialized()?;
    non_null(status)?;
    fake.resolve_stream(as_handle(stream), null_is_per_thread)?;
    // SAFETY: a non-NULL out-pointer by this function's contract.
    unsafe { put(status, CU_STREAM_CAPTURE_STATUS_NONE) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamIsCapturing(stream: CUstream, status: *mut c_int) -> CUresult {
    stats::record_call("cuStreamIsCapturing");
    // SAFETY: `status` is NULL or a valid out-pointer per the cuStreamIsCapturing contract.
    answer(|| unsafe { is_capturing(stream, status, false) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamIsCapturing_ptsz(stream: CUstream, status: *mut c_int) -> CUresult {
    stats::record_call("cuStreamIsCapturing_ptsz");
    // SAFETY: `status` is NULL or a valid out-pointer per the cuStreamIsCapturing contract.
    answer(|| unsafe { is_capturing(stream, status, true) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamCreate(stream: *mut CUstream, flags: c_uint) -> CUresult {
    stats::record_call("cuStreamCreate");
    answer(|| {
        let fake = initialized()?;
        non_null(stream)?;
        if flags & !STREAM_FLAGS != 0 {
            return Err(CuError::InvalidValue);
        }
        let handle = fake.create_stream()?;
        // SAFETY: a non-NULL out-pointer per the cuStreamCreate contract.
        unsafe { put(stream, as_pointer(handle)) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamDestroy_v2(stream: CUstream) -> CUresult {
    stats::record_call("cuStreamDestroy_v2");
    answer(|| Ok(initialized()?.destroy_stream(as_handle(stream))?))
}
