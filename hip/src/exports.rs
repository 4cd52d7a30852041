//! What the exported shims share, and the `dlsym` override. The HIP entry points themselves are
//! generated from their one declaration each in [`crate::entry_points`].

use std::cell::Cell;
use std::ffi::{c_char, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};

use crate::entry_points::hooks;
use crate::error::HookError;
use crate::hooks::symbols;
use crate::loader::{self, REAL_DLSYM};
use crate::runtime::{self, Runtime, SmiRuntime};
use crate::sys::*;

thread_local! {
    /// Set while this thread runs a hook. The HIP runtime calls some of its own exports through
    /// its PLT (ROCm 5.2's libamdhip64 has jump-slot relocations for its own `hipMallocPitch`,
    /// `hipMemGetInfo`, `hipGetDeviceProperties`, `hipHostMalloc` and `hipModuleLaunchKernel`),
    /// and a preloaded library interposes those: such a nested call is the runtime's own work for
    /// the call we are already accounting, and goes straight to its function.
    static IN_HOOK: Cell<bool> = const { Cell::new(false) };
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

/// Runs a ROCm SMI hook (or, nested, ROCm SMI's own function), turning its error or a panic into
/// an `rsmi_status_t`.
pub fn smi_shim(
    hook: impl FnOnce(&'static SmiRuntime) -> Result<(), HookError>,
    nested: impl FnOnce(&'static SmiRuntime) -> Result<(), HookError>,
) -> i32 {
    let run = || {
        let runtime = runtime::smi();
        match HookScope::enter() {
            Some(_scope) => hook(runtime),
            None => nested(runtime),
        }
    };
    match catch_unwind(AssertUnwindSafe(run)) {
        Ok(Ok(())) => RSMI_STATUS_SUCCESS,
        Ok(Err(HookError::Runtime(status))) => status,
        Ok(Err(HookError::NotReady)) => RSMI_STATUS_INIT_ERROR,
        Ok(Err(_)) => RSMI_STATUS_NOT_SUPPORTED,
        // RSMI_STATUS_UNKNOWN_ERROR, 0xFFFFFFFF.
        Err(_) => -1,
    }
}

/// Decides a `dlsym` call for the trampoline: our hook's address, or null for "ask the real
/// `dlsym`". Never unwinds, and sets nothing up: the hook table is static.
extern "C" fn dlsym_decide(handle: *mut c_void, name: *const c_char, caller: *const c_void) -> *mut c_void {
    // A name that is not HIP's costs a three-byte comparison.
    // SAFETY: `name` is NULL or a NUL-terminated string, per dlsym's contract.
    if loader::real_dlsym().is_none() || !unsafe { symbols::may_be_hip_name(name) } {
        return std::ptr::null_mut();
    }
    // SAFETY: the application's dlsym arguments, forwarded as they came.
    catch_unwind(|| unsafe { symbols::dlsym_substitute(hooks(), handle, name, caller) })
        .unwrap_or(std::ptr::null_mut())
}

/// `dlsym` override. glibc resolves `RTLD_NEXT` (and namespaces) relative to its caller's return
/// address, so whatever we do not substitute is passed on by a jump, not a call: the real `dlsym`
/// sees the application's return address, as if we were not there. The same trampoline as
/// libvgpu.so's (src/exports.rs), one form per architecture.
///
/// # Safety
/// Called by C with `dlsym`'s contract.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    core::arch::naked_asm!(
        // Keep the arguments; three pushes also leave the stack 16-byte aligned for the call.
        "push rdi",
        "push rsi",
        "sub rsp, 8",
        "mov rdx, [rsp + 24]", // our return address, i.e. the caller's code
        "call {decide}",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "test rax, rax",
        "jnz 2f",
        "mov rax, [rip + {real}]", // resolved by `decide` on its first run
        "test rax, rax",
        "jz 2f",
        "jmp rax",
        "2:",
        "ret",
        decide = sym dlsym_decide,
        real = sym REAL_DLSYM,
    )
}

/// `dlsym` override, AArch64 form: the caller's return address is in the link register, which
/// the real `dlsym` must find unchanged, so it is restored before the branch (`br`, not `blr`).
///
/// # Safety
/// Called by C with `dlsym`'s contract.
#[cfg(target_arch = "aarch64")]
#[unsafe(naked)]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    core::arch::naked_asm!(
        "stp x29, x30, [sp, #-32]!",
        "mov x29, sp",
        "stp x0, x1, [sp, #16]",
        "mov x2, x30", // our return address, i.e. the caller's code
        "bl {decide}",
        "mov x9, x0",
        "ldp x0, x1, [sp, #16]",
        "ldp x29, x30, [sp], #32",
        "cbnz x9, 2f",
        "adrp x16, {real}", // resolved by `decide` on its first run
        "ldr x16, [x16, :lo12:{real}]",
        "cbz x16, 3f",
        "br x16",
        "2:",
        "mov x0, x9",
        "ret",
        "3:",
        "mov x0, xzr",
        "ret",
        decide = sym dlsym_decide,
        real = sym REAL_DLSYM,
    )
}
