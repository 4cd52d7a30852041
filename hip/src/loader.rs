//! Finding the real `dlsym`, the HIP runtime library and entry points in it.
//!
//! We export `dlsym` ourselves, so nothing in this crate may call the plain `dlsym`: it would land
//! in our own override. The real one comes from `vgpu_preload` ([`real_dlsym`]).

use std::ffi::{CStr, c_void};

pub use vgpu_preload::{DlsymFn, REAL_DLSYM, lookup, real_dlsym};

/// The runtime's sonames, newest first: ROCm 6.x, then 5.x, then the development link.
pub const RUNTIME_NAMES: [&CStr; 3] = [c"libamdhip64.so.6", c"libamdhip64.so.5", c"libamdhip64.so"];

/// ROCm SMI's sonames: Debian 12's (ROCm 5.2) is `.so.1`; AMD's ROCm 6.x packages ship `.so.7`
/// (from their documentation), 5.x `.so.5`.
pub const SMI_NAMES: [&CStr; 4] =
    [c"librocm_smi64.so.7", c"librocm_smi64.so.5", c"librocm_smi64.so.1", c"librocm_smi64.so"];

/// The HIP runtime, opened with `dlopen` and never closed (pointers into it are handed out).
#[derive(Clone, Copy, Debug)]
pub struct Library {
    handle: usize,
}

impl Library {
    /// The HIP runtime this process already loaded (whichever soname), else the first that loads.
    pub fn open_runtime() -> Option<Library> {
        Library::open_first(&RUNTIME_NAMES)
    }

    /// The first of `names` this process already loaded, else the first that loads.
    pub fn open_first(names: &[&CStr]) -> Option<Library> {
        let open = |flags: i32| {
            names.iter().find_map(|name| {
                // SAFETY: `name` is NUL-terminated; dlopen has no other precondition.
                let handle = unsafe { libc::dlopen(name.as_ptr(), flags) };
                (!handle.is_null()).then_some(Library { handle: handle as usize })
            })
        };
        open(libc::RTLD_NOW | libc::RTLD_NOLOAD).or_else(|| open(libc::RTLD_NOW | libc::RTLD_GLOBAL))
    }

    /// The address of `name` in the runtime; `None` when it does not export it.
    pub fn symbol(&self, name: &CStr) -> Option<*mut c_void> {
        // SAFETY: `handle` came from a successful dlopen and is never closed.
        let ptr = unsafe { lookup(self.handle as *mut c_void, name) };
        (!ptr.is_null()).then_some(ptr)
    }
}

/// Whether `addr` lies in the HIP runtime, the HSA runtime under it or ROCm SMI: their own lookups
/// must get their own functions back, never our hooks.
pub fn is_runtime_library(addr: usize) -> bool {
    let mut info = std::mem::MaybeUninit::<libc::Dl_info>::zeroed();
    // SAFETY: `info` is a valid out-pointer; dladdr accepts any address.
    if unsafe { libc::dladdr(addr as *const c_void, info.as_mut_ptr()) } == 0 {
        return false;
    }
    // SAFETY: dladdr returned non-zero, so it filled `info`.
    let fname = unsafe { info.assume_init() }.dli_fname;
    if fname.is_null() {
        return false;
    }
    // SAFETY: dli_fname is a NUL-terminated path owned by the dynamic linker.
    let path = unsafe { CStr::from_ptr(fname) }.to_bytes();
    let base = path.rsplit(|&b| b == b'/').next().unwrap_or(path);
    base.starts_with(b"libamdhip64.so")
        || base.starts_with(b"libhsa-runtime64.so")
        || base.starts_with(b"librocm_smi64.so")
}
