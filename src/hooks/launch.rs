//! Kernel and graph launches: handed to the compute limiter when the device has a share, else
//! straight to the driver.
//!
//! Each hook names the stream its work is queued on (a `_ptsz` entry point's NULL stream is the
//! calling thread's per-thread stream) and what identifies the work, so that the limiter can
//! time it and estimate the next launch of the same work.

// Functions, streams and graphs are opaque driver handles: passed on, never dereferenced.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

use std::ffi::c_uint;
use std::panic::{AssertUnwindSafe, catch_unwind};

use crate::compute::{Launch, Limiter};
use crate::driver::sys::*;
use crate::runtime::{self, Runtime};

/// Which default stream a NULL stream means to the entry point that was called.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DefaultStream {
    Legacy,
    PerThread,
}

impl DefaultStream {
    pub fn resolve(self, stream: CUstream) -> CUstream {
        if stream.is_null() && self == DefaultStream::PerThread { CU_STREAM_PER_THREAD } else { stream }
    }
}

/// Identifies a kernel launch's work: the function and the size of its grid.
pub fn kernel_key(f: CUfunction, grid: [c_uint; 3]) -> usize {
    let blocks = grid.iter().fold(1usize, |n, &dim| n.wrapping_mul(dim as usize));
    (f as usize) ^ blocks.rotate_left(32)
}

/// Runs a launch: `call` receives the driver's entry point (`entry`, named `name` for the error
/// when the driver lacks it). With no compute share anywhere this is one check and the call.
pub fn run<F: Copy>(
    entry: Option<F>,
    stream: CUstream,
    default: DefaultStream,
    key: usize,
    call: impl FnOnce(F) -> CUresult,
) -> CUresult {
    let Some(real) = entry else { return CUDA_ERROR_NOT_FOUND };
    let Ok(runtime) = runtime::get() else { return call(real) };
    let stream = default.resolve(stream);
    // The process's memory is on the card while the launch is queued (brought back if it was out).
    let _inside = runtime.swap.enter(runtime);
    // Migrating memory back must never cost the launch itself.
    let _ = catch_unwind(AssertUnwindSafe(|| runtime.spill.before_launch(runtime, stream)));
    let Some(limiter) = &runtime.compute else { return call(real) };
    paced(limiter, runtime, Launch { stream, key, uses_sms: true }, real, call)
}

/// Hands `launch` to the limiter, which runs `call` with `real` once the container's clock admits
/// it. A panic in the limiter never loses the launch: before it, the launch goes through
/// unlimited; after it, the launch's own status stands.
pub fn paced<F: Copy>(
    limiter: &Limiter,
    runtime: &Runtime,
    launch: Launch,
    real: F,
    call: impl FnOnce(F) -> CUresult,
) -> CUresult {
    let mut call = Some(call);
    let mut launched = None;
    let limited = catch_unwind(AssertUnwindSafe(|| {
        limiter.launch(runtime.ledger(), launch, || {
            let status = call.take().map_or(CUDA_ERROR_UNKNOWN, |call| call(real));
            launched = Some(status);
            status
        })
    }));
    match (limited, launched) {
        (Ok(status), _) => status,
        (Err(_), Some(status)) => status,
        (Err(_), None) => call.take().map_or(CUDA_ERROR_UNKNOWN, |call| call(real)),
    }
}
