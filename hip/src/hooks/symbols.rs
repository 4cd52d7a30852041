//! Which address a symbol lookup returns: our hook, or the runtime's own function.
//!
//! `dlsym` substitutes a hook by name. `hipGetProcAddress` (HIP 6.2) substitutes by the address
//! the runtime chose: only the runtime knows which variant a requested version gets (asked for
//! `hipGetDeviceProperties` at 6.0 or later, it answers with `hipGetDevicePropertiesR0600`), so we
//! hand out our hook for exactly the function it returned, or its own pointer when we hook none.

use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::OnceLock;

use crate::entry_points::{Hook, hip_hooks};
use crate::error::HookError;
use crate::loader;
use crate::runtime::Runtime;

/// Whether `name` could be a HIP runtime, ROCm SMI or AMD SMI entry point (`hip…`, `rsmi…`,
/// `amdsmi…`), read without `strlen`.
///
/// # Safety
/// `name` is NULL or a NUL-terminated string.
pub unsafe fn may_be_hip_name(name: *const c_char) -> bool {
    if name.is_null() {
        return false;
    }
    // SAFETY: a NUL-terminated string has at least its first byte; each later byte is read only
    // after the ones before it were found non-NUL.
    let byte = |i: usize| unsafe { name.cast::<u8>().add(i).read() };
    match byte(0) {
        b'h' => byte(1) == b'i' && byte(2) == b'p',
        b'r' => byte(1) == b's' && byte(2) == b'm' && byte(3) == b'i',
        b'a' => b"mdsmi".iter().enumerate().all(|(i, &expected)| byte(i + 1) == expected),
        _ => false,
    }
}

/// What our `dlsym` returns instead of the real lookup, or null to let the real `dlsym` answer.
/// A hook is substituted only for a name we hook, a caller outside the HIP, HSA and SMI libraries,
/// and a handle in which the real lookup finds the name (so a runtime without it still says so).
///
/// # Safety
/// `handle` and `name` satisfy `dlsym`'s contract; `caller` is only compared, never read.
pub unsafe fn dlsym_substitute<'a>(
    mut hooks: impl Iterator<Item = &'a Hook>,
    handle: *mut c_void,
    name: *const c_char,
    caller: *const c_void,
) -> *mut c_void {
    if loader::real_dlsym().is_none() || name.is_null() || handle == libc::RTLD_NEXT {
        return std::ptr::null_mut();
    }
    // SAFETY: dlsym's contract: `name` is a NUL-terminated string.
    let name = unsafe { CStr::from_ptr(name) };
    let Some(hook) = hooks.find(|hook| hook.name == name) else { return std::ptr::null_mut() };
    // SAFETY: `handle` is the application's dlsym handle, valid per dlsym's contract.
    if loader::is_runtime_library(caller as usize) || unsafe { loader::lookup(handle, name) }.is_null() {
        return std::ptr::null_mut();
    }
    hook.address as *mut c_void
}

/// Our hook for the runtime function at `real`, or `real` itself.
pub fn substitute(runtime: &Runtime, real: *mut c_void) -> *mut c_void {
    static REAL_TO_HOOK: OnceLock<Vec<(usize, usize)>> = OnceLock::new();
    let table = REAL_TO_HOOK.get_or_init(|| {
        let ours = hip_hooks();
        runtime
            .real
            .hooked_addresses()
            .into_iter()
            .filter(|&(address, _)| address != 0)
            .filter_map(|(address, name)| {
                ours.iter().find(|hook| hook.name == name).map(|hook| (address, hook.address as usize))
            })
            .collect()
    });
    let address = real as usize;
    table.iter().find(|(runtime_fn, _)| *runtime_fn == address).map_or(real, |(_, hook)| *hook as *mut c_void)
}

/// `hipGetProcAddress`: asks the runtime with the identical arguments, keeps its status and its
/// NULLs, and swaps the function it chose for our hook of that function.
///
/// # Safety
/// The application's arguments, per `hipGetProcAddress`'s contract.
pub unsafe fn get_proc_address(
    runtime: &Runtime,
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> Result<(), HookError> {
    // SAFETY: forwarded unchanged.
    unsafe { runtime.real.hipGetProcAddress(symbol, pfn, version, flags, status) }?;
    if pfn.is_null() {
        return Ok(());
    }
    // SAFETY: the runtime succeeded, so `*pfn` is initialised and writable.
    unsafe {
        let found = pfn.read();
        if !found.is_null() {
            pfn.write(substitute(runtime, found));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_hip_names_pass_the_first_check() {
        // SAFETY: NUL-terminated literals and NULL.
        unsafe {
            assert!(may_be_hip_name(c"hipMalloc".as_ptr()));
            assert!(!may_be_hip_name(c"hi".as_ptr()));
            assert!(!may_be_hip_name(c"hsa_init".as_ptr()));
            assert!(may_be_hip_name(c"rsmi_init".as_ptr()));
            assert!(!may_be_hip_name(c"rsm".as_ptr()));
            assert!(may_be_hip_name(c"amdsmi_get_gpu_vram_usage".as_ptr()));
            assert!(!may_be_hip_name(c"amdsm".as_ptr()));
            assert!(!may_be_hip_name(c"amd_comgr_get_version".as_ptr()));
            assert!(!may_be_hip_name(c"".as_ptr()));
            assert!(!may_be_hip_name(std::ptr::null()));
        }
    }

    #[test]
    fn unhooked_names_are_left_to_the_real_dlsym() {
        let null = std::ptr::null();
        // SAFETY: pseudo-handles and NUL-terminated names (or NULL, which is checked first).
        unsafe {
            assert!(dlsym_substitute([].iter(), libc::RTLD_DEFAULT, c"hipMalloc".as_ptr(), null).is_null());
            assert!(dlsym_substitute([].iter(), libc::RTLD_DEFAULT, std::ptr::null(), null).is_null());
        }
    }
}
