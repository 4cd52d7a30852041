//! What the exported shims share, and the `dlsym` override. The HIP entry points themselves are
//! generated from their one declaration each in [`crate::entry_points`].

use std::cell::Cell;
use std::ffi::{c_char, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};

use crate::entry_points::hooks;
use crate::error::HookError;
use crate::hooks::symbols;
use crate::loader;
use crate::runtime::{self, AmdSmiRuntime, Runtime, SmiRuntime};
use crate::sys::*;

thread_local! {
    /// Set while this thread runs a hook. The HIP runtime calls some of its own exports through
    /// its PLT (ROCm 5.2's libamdhip64 has jump-slot relocations for its own `hipMallocPitch`,
    /// `hipMemGetInfo`, `hipGetDeviceProperties`, `hipHostMalloc` and `hipModuleLaunchKernel`),
    /// and a preloaded library interposes those: such a nested call is the runtime's own work for
    /// the call we are already accounting, and goes straight to its function.
    static IN_HOOK: Cell<bool> = const { Cell::new(false) };
}

thread_local! {
    /// Set while this thread runs an AMD SMI hook: libamd_smi's own calls into the ROCm SMI built
    /// into it then reach our `rsmi_*` exports, and go to that copy of ROCm SMI.
    static IN_AMD_SMI: Cell<bool> = const { Cell::new(false) };
}

/// Clears [`IN_HOOK`] when the hook returns or unwinds.
struct HookScope;

impl HookScope {
    /// Enters a hook; `None` if this thread is already inside one.
    fn enter() -> Option<HookScope> {
        (!IN_HOOK.replace(true)).then_some(HookScope)
    }
}

impl Drop for HookScope {
    fn drop(&mut self) {
        IN_HOOK.set(false);
    }
}

/// Runs `hook` with the runtime (or `nested`, the library's own function, inside another hook),
/// turning an error (logged if it is a refusal) or a panic into a `hipError_t`.
pub fn shim(
    hook: impl FnOnce(&'static Runtime) -> Result<(), HookError>,
    nested: impl FnOnce(&'static Runtime) -> Result<(), HookError>,
) -> HipError {
    let run = || {
        let runtime = runtime::get()?;
        match HookScope::enter() {
            Some(_scope) => hook(runtime),
            None => nested(runtime),
        }
    };
    match catch_unwind(AssertUnwindSafe(run)) {
        Ok(Ok(())) => HIP_SUCCESS,
        Ok(Err(error)) => {
            error.log_refusal();
            error.into()
        }
        Err(_) => HIP_ERROR_UNKNOWN,
    }
}

/// The status codes an SMI library answers with, for what is ours to report.
struct SmiStatuses {
    success: i32,
    /// Called while this thread was still setting up.
    not_ready: i32,
    /// Anything else of ours: the library or an entry point missing.
    unsupported: i32,
    /// A panic, caught.
    unknown: i32,
}

/// Runs an SMI hook (or, nested, the library's own function) with the state `runtime` gives,
/// turning its error or a panic into the library's status code.
fn smi_call<R: 'static>(
    runtime: impl FnOnce() -> Result<&'static R, HookError>,
    hook: impl FnOnce(&'static R) -> Result<(), HookError>,
    nested: impl FnOnce(&'static R) -> Result<(), HookError>,
    statuses: SmiStatuses,
) -> i32 {
    let run = || {
        let runtime = runtime()?;
        match HookScope::enter() {
            Some(_scope) => hook(runtime),
            None => nested(runtime),
        }
    };
    match catch_unwind(AssertUnwindSafe(run)) {
        Ok(Ok(())) => statuses.success,
        Ok(Err(HookError::Runtime(status))) => status,
        Ok(Err(HookError::NotReady)) => statuses.not_ready,
        Ok(Err(_)) => statuses.unsupported,
        Err(_) => statuses.unknown,
    }
}

/// Runs a ROCm SMI hook, answering an `rsmi_status_t`.
pub fn smi_shim(
    hook: impl FnOnce(&'static SmiRuntime) -> Result<(), HookError>,
    nested: impl FnOnce(&'static SmiRuntime) -> Result<(), HookError>,
) -> i32 {
    let statuses = SmiStatuses {
        success: RSMI_STATUS_SUCCESS,
        not_ready: RSMI_STATUS_INIT_ERROR,
        unsupported: RSMI_STATUS_NOT_SUPPORTED,
        // RSMI_STATUS_UNKNOWN_ERROR, 0xFFFFFFFF.
        unknown: -1,
    };
    let runtime = || match IN_AMD_SMI.get() {
        true => runtime::amdsmi().map(|amd| &amd.rocm_smi),
        false => Ok(runtime::smi()),
    };
    smi_call(runtime, hook, nested, statuses)
}

/// Runs an AMD SMI hook, answering an `amdsmi_status_t`.
pub fn amdsmi_shim(
    hook: impl FnOnce(&'static AmdSmiRuntime) -> Result<(), HookError>,
    nested: impl FnOnce(&'static AmdSmiRuntime) -> Result<(), HookError>,
) -> i32 {
    let statuses = SmiStatuses {
        success: AMDSMI_STATUS_SUCCESS,
        not_ready: AMDSMI_STATUS_NOT_INIT,
        unsupported: AMDSMI_STATUS_NOT_SUPPORTED,
        unknown: AMDSMI_STATUS_UNKNOWN_ERROR,
    };
    /// Clears [`IN_AMD_SMI`] when the hook returns or unwinds.
    struct AmdSmiScope(bool);
    impl Drop for AmdSmiScope {
        fn drop(&mut self) {
            IN_AMD_SMI.set(self.0);
        }
    }
    let _scope = AmdSmiScope(IN_AMD_SMI.replace(true));
    smi_call(runtime::amdsmi, hook, nested, statuses)
}

/// Decides a `dlsym` call for the trampoline: our hook's address, or null for "ask the real
/// `dlsym`". Never unwinds, and sets nothing up: the hook table is static.
extern "C" fn dlsym_decide(handle: *mut c_void, name: *const c_char, caller: *const c_void) -> *mut c_void {
    // Any other name costs a comparison of its first few bytes.
    // SAFETY: `name` is NULL or a NUL-terminated string, per dlsym's contract.
    if loader::real_dlsym().is_none() || !unsafe { symbols::may_be_hip_name(name) } {
        return std::ptr::null_mut();
    }
    // SAFETY: the application's dlsym arguments, forwarded as they came.
    catch_unwind(|| unsafe { symbols::dlsym_substitute(hooks(), handle, name, caller) })
        .unwrap_or(std::ptr::null_mut())
}

// The exported `dlsym`: what `dlsym_decide` does not substitute goes to glibc's by a jump, so
// that `RTLD_NEXT` still resolves relative to the application (the trampoline's own doc).
vgpu_preload::dlsym_trampoline!(dlsym_decide);
