//! The shims of the calls that wait for queued work or ask after it (`cuCtxSynchronize` and CUDA
//! 13's `cuCtxSynchronize_v2`, `cuStreamSynchronize`, `cuEventSynchronize` and the queries): they
//! exist for swapping alone ([`wait_hooks`], handed out only where overcommit may apply). A process
//! waiting for its own kernels has work in flight: its record says so to the arbiter, which never
//! takes it for idle, it is pinned for only at the wait's pace, and it is active again the moment
//! its wait returns
//! ([`crate::hooks::swap::Swap::waiting`]). A query that finds work still running counts as
//! activity; one that finds it done does not, so a thread polling an idle stream leaves its
//! process idle ([`crate::hooks::swap::Swap::query`]).

use std::ffi::c_void;

use super::Hook;
use super::copies::RealEntry;
use crate::driver::sys::*;
use crate::runtime;

/// Defines one shim per entry and a function listing their hooks.
/// An entry reads `name(args) => how;`, `how` being the [`crate::hooks::swap::Swap`] method that
/// runs the call (`waiting` or `query`).
macro_rules! wait_entries {
    (fn $list:ident; $($name:ident($($arg:ident: $ty:ty),*) => $how:ident;)*) => {
        $(
            #[doc = concat!("Called by C with `", stringify!($name), "`'s contract; every argument goes to the driver unchanged.")]
            #[unsafe(no_mangle)]
            pub unsafe extern "C" fn $name($($arg: $ty),*) -> CUresult {
                type Real = unsafe extern "C" fn($($ty),*) -> CUresult;
                static REAL: RealEntry = RealEntry::new();
                let Some(real) = REAL.get(concat!(stringify!($name), "\0")) else {
                    return CUDA_ERROR_NOT_FOUND;
                };
                // SAFETY: the driver's function of this exact name has this signature (cuda.h).
                let real = unsafe { std::mem::transmute::<usize, Real>(real) };
                // SAFETY: the caller's arguments, passed on unchanged under the same contract.
                let call = || unsafe { real($($arg),*) };
                match runtime::get() {
                    Ok(runtime) => runtime.swap.$how(runtime, call),
                    Err(_) => call(),
                }
            }
        )*

        pub fn $list() -> Vec<Hook> {
            vec![$(hook!($name)),*]
        }
    };
}

wait_entries! {
    fn wait_hooks;
    cuCtxSynchronize() => waiting;
    cuCtxSynchronize_v2(context: CUcontext) => waiting;
    cuStreamSynchronize(stream: CUstream) => waiting;
    cuStreamSynchronize_ptsz(stream: CUstream) => waiting;
    cuEventSynchronize(event: *mut c_void) => waiting;
    cuStreamQuery(stream: CUstream) => query;
    cuStreamQuery_ptsz(stream: CUstream) => query;
    cuEventQuery(event: *mut c_void) => query;
}
