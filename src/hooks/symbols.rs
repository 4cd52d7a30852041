//! Which address a symbol lookup returns: our hook, or the driver's own function.
//!
//! `dlsym` substitutes a hook by name; `cuGetProcAddress` substitutes by the address the driver
//! chose, because only the driver knows which ABI variant (`_v2`, `_v3`, …) a requested CUDA
//! version gets. We hand out our hook only for the exact variant it implements.

use std::ffi::{CStr, c_char, c_void};
use std::sync::OnceLock;

use crate::driver::{self, loader};

/// One exported hook: the driver symbol it replaces and our function's address.
#[derive(Clone, Copy, Debug)]
pub struct Hook {
    pub name: &'static CStr,
    pub address: usize,
}

/// The hook for `name`, if we have one.
fn by_name(hooks: &[Hook], name: &CStr) -> Option<usize> {
    hooks.iter().find(|hook| hook.name == name).map(|hook| hook.address)
}

/// Whether `name` could be a CUDA driver or NVML entry point (`cu…`, `nvml…`): read without
/// `strlen`, so that every other lookup costs a few byte comparisons.
///
/// # Safety
/// `name` is NULL or a NUL-terminated string.
pub unsafe fn may_be_driver_name(name: *const c_char) -> bool {
    if name.is_null() {
        return false;
    }
    // SAFETY: a NUL-terminated string has at least its first byte; each later byte is read only
    // after the ones before it were found non-NUL.
    let byte = |i: usize| unsafe { name.cast::<u8>().add(i).read() };
    match byte(0) {
        b'c' => byte(1) == b'u',
        b'n' => byte(1) == b'v' && byte(2) == b'm' && byte(3) == b'l',
        _ => false,
    }
}

/// What our `dlsym` should return instead of the real lookup, or null to let the real `dlsym`
/// answer (it is then called with the caller's own return address).
///
/// A hook is substituted only when the name is one we hook, the caller is not one of the driver's
/// own libraries, `handle` is in the link-map namespace libvgpu hooks, and the real lookup finds
/// the symbol in `handle` (so a driver without it still says so).
///
/// # Safety
/// `handle` and `name` satisfy `dlsym`'s contract; `caller` is only compared, never read.
pub unsafe fn dlsym_substitute(
    hooks: &[Hook],
    handle: *mut c_void,
    name: *const c_char,
    caller: *const c_void,
) -> *mut c_void {
    // Make sure the trampoline has somewhere to jump, whatever we answer.
    if loader::real_dlsym().is_none() || name.is_null() || handle == libc::RTLD_NEXT {
        return std::ptr::null_mut();
    }
    // SAFETY: dlsym's contract: `name` is a NUL-terminated string.
    let name = unsafe { CStr::from_ptr(name) };
    let bytes = name.to_bytes();
    if !(bytes.starts_with(b"cu") || bytes.starts_with(b"nvml")) {
        return std::ptr::null_mut();
    }
    let Some(hook) = by_name(hooks, name) else { return std::ptr::null_mut() };
    // SAFETY: `handle` is the application's dlsym handle, valid per dlsym's contract.
    if loader::is_driver_library(caller as usize)
        // SAFETY: as above.
        || !unsafe { in_base_namespace(handle) }
        // SAFETY: as above.
        || unsafe { loader::lookup(handle, name) }.is_null()
    {
        return std::ptr::null_mut();
    }
    hook as *mut c_void
}

/// Whether `handle` names an object of the base link-map namespace, where the preloaded libvgpu
/// and the driver it opened live. A second copy of the driver loaded with
/// `dlmopen(LM_ID_NEWLM, …)` is another namespace's: our hooks call the first copy, so its
/// lookups pass through untouched, and its memory is outside the cooperative limit
/// (docs/threat-model.md), where the node agent counts it as unaccounted.
///
/// # Safety
/// `handle` is a handle from `dlopen`/`dlmopen` or a pseudo-handle, as `dlsym` requires.
unsafe fn in_base_namespace(handle: *mut c_void) -> bool {
    if handle == libc::RTLD_DEFAULT || handle == libc::RTLD_NEXT {
        return true;
    }
    let mut namespace: libc::Lmid_t = libc::LM_ID_BASE;
    // SAFETY: `handle` is a real handle (pseudo-handles returned above); `namespace` is the
    // Lmid_t that RTLD_DI_LMID writes.
    let status = unsafe { libc::dlinfo(handle, libc::RTLD_DI_LMID, (&raw mut namespace).cast()) };
    status != 0 || namespace == libc::LM_ID_BASE
}

/// The hook for the function the driver returned from `cuGetProcAddress`, or `real` itself.
pub fn proc_address_substitute(hooks: &[Hook], real: *mut c_void) -> *mut c_void {
    static REAL_TO_HOOK: OnceLock<Vec<(usize, usize)>> = OnceLock::new();
    let table = REAL_TO_HOOK.get_or_init(|| {
        hooks
            .iter()
            .filter(|hook| hook.name.to_bytes().starts_with(b"cu"))
            .filter_map(|hook| Some((driver::cuda_symbol(hook.name)? as usize, hook.address)))
            .collect()
    });
    let real_address = real as usize;
    table.iter().find(|(driver, _)| *driver == real_address).map_or(real, |(_, hook)| *hook as *mut c_void)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_driver_prefixes_pass_the_first_check() {
        // SAFETY: NUL-terminated literals and NULL.
        unsafe {
            assert!(may_be_driver_name(c"cuMemAlloc_v2".as_ptr()));
            assert!(may_be_driver_name(c"nvmlInit_v2".as_ptr()));
            assert!(!may_be_driver_name(c"c".as_ptr()));
            assert!(!may_be_driver_name(c"nvm".as_ptr()));
            assert!(!may_be_driver_name(c"malloc".as_ptr()));
            assert!(!may_be_driver_name(c"".as_ptr()));
            assert!(!may_be_driver_name(std::ptr::null()));
        }
    }

    #[test]
    fn only_hooked_names_are_found() {
        let hooks = [Hook { name: c"cuMemAlloc_v2", address: 0x1000 }];
        assert_eq!(by_name(&hooks, c"cuMemAlloc_v2"), Some(0x1000));
        assert_eq!(by_name(&hooks, c"cuMemAlloc"), None);
        assert_eq!(by_name(&hooks, c"cublasCreate_v2"), None);
    }

    #[test]
    fn non_driver_names_are_left_alone() {
        let hooks = [Hook { name: c"cublasCreate_v2", address: 0x1000 }];
        let null = std::ptr::null();
        // SAFETY: pseudo-handles and NUL-terminated names (or NULL, which is checked first).
        unsafe {
            assert!(dlsym_substitute(&hooks, libc::RTLD_DEFAULT, c"malloc".as_ptr(), null).is_null());
            assert!(dlsym_substitute(&hooks, libc::RTLD_NEXT, c"cublasCreate_v2".as_ptr(), null).is_null());
            assert!(dlsym_substitute(&hooks, libc::RTLD_DEFAULT, std::ptr::null(), null).is_null());
        }
    }
}
