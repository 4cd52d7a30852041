//! Events: `cuEventCreate`, `cuEventRecord` (and `_ptsz`), `cuEventQuery`, `cuEventSynchronize`,
//! `cuEventElapsedTime` (and `_v2`), `cuEventDestroy_v2`. The model is `events`.

use std::ffi::{c_uint, c_void};

use super::{CUresult, CUstream, CuError, answer, as_handle, as_pointer, initialized, non_null, put};
use crate::stats;

pub type CUevent = *mut c_void;

/// `CUevent_flags`: BLOCKING_SYNC, DISABLE_TIMING, INTERPROCESS.
const EVENT_FLAGS: c_uint = 0x7;
const DISABLE_TIMING: c_uint = 2;
const INTERPROCESS: c_uint = 4;

fn record(event: CUevent, stream: CUstream, null_is_per_thread: bool) -> Result<(), CuError> {
    let fake = initialized()?;
    let stream = fake.resolve_stream(as_handle(stream), null_is_per_thread)?;
    Ok(fake.record_event(as_handle(event), stream)?)
}

/// Milliseconds from `start` to `end`.
///
/// # Safety
/// `milliseconds` must be NULL or valid for writing a `float`.
unsafe fn elapsed_time(milliseconds: *mut f32, start: CUevent, end: CUevent) -> Result<(), CuError> {
    let fake = initialized()?;
    non_null(milliseconds)?;
    let elapsed = fake.elapsed_ms(as_handle(start), as_handle(end))?;
    // SAFETY: a non-NULL out-pointer by this function's contract.
    unsafe { put(milliseconds, elapsed) }
}

/// Needs a context; an interprocess event must also disable timing, like the driver asks.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventCreate(event: *mut CUevent, flags: c_uint) -> CUresult {
    stats::record_call("cuEventCreate");
    answer(|| {
        let fake = initialized()?;
        non_null(event)?;
        let interprocess_timed = flags & INTERPROCESS != 0 && flags & DISABLE_TIMING == 0;
        if flags & !EVENT_FLAGS != 0 || interprocess_timed {
            return Err(CuError::InvalidValue);
        }
        fake.current()?;
        let handle = fake.create_event(flags & DISABLE_TIMING == 0);
        // SAFETY: a non-NULL out-pointer per the cuEventCreate contract.
        unsafe { put(event, as_pointer(handle)) }
    })
}

/// The event completes when the work queued so far on the stream does; it takes no GPU time.
#[unsafe(no_mangle)]
pub extern "C" fn cuEventRecord(event: CUevent, stream: CUstream) -> CUresult {
    stats::record_call("cuEventRecord");
    answer(|| record(event, stream, false))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuEventRecord_ptsz(event: CUevent, stream: CUstream) -> CUresult {
    stats::record_call("cuEventRecord_ptsz");
    answer(|| record(event, stream, true))
}

/// Success if never recorded or complete, else `CUDA_ERROR_NOT_READY`.
#[unsafe(no_mangle)]
pub extern "C" fn cuEventQuery(event: CUevent) -> CUresult {
    stats::record_call("cuEventQuery");
    answer(|| Ok(initialized()?.query_event(as_handle(event))?))
}

/// Sleeps until the event completes.
#[unsafe(no_mangle)]
pub extern "C" fn cuEventSynchronize(event: CUevent) -> CUresult {
    stats::record_call("cuEventSynchronize");
    answer(|| Ok(initialized()?.synchronize_event(as_handle(event))?))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventElapsedTime(
    milliseconds: *mut f32,
    start: CUevent,
    end: CUevent,
) -> CUresult {
    stats::record_call("cuEventElapsedTime");
    // SAFETY: `milliseconds` is NULL or a valid out-pointer per the cuEventElapsedTime contract.
    answer(|| unsafe { elapsed_time(milliseconds, start, end) })
}

/// Same ABI and answers as `cuEventElapsedTime`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventElapsedTime_v2(
    milliseconds: *mut f32,
    start: CUevent,
    end: CUevent,
) -> CUresult {
    stats::record_call("cuEventElapsedTime_v2");
    // SAFETY: `milliseconds` is NULL or a valid out-pointer per the cuEventElapsedTime_v2 contract.
    answer(|| unsafe { elapsed_time(milliseconds, start, end) })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuEventDestroy_v2(event: CUevent) -> CUresult {
    stats::record_call("cuEventDestroy_v2");
    answer(|| Ok(initialized()?.destroy_event(as_handle(event))?))
}
