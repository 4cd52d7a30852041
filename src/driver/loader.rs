//! Finding the real `dlsym`, opening the driver's libraries and resolving entry points in them.
//!
//! We export `dlsym` ourselves, so nothing in this crate may call the plain `dlsym`: it would land
//! in our own override. The real one comes from `vgpu_preload` ([`real_dlsym`]).

use std::ffi::{CStr, c_void};

pub use vgpu_preload::{DlsymFn, REAL_DLSYM, lookup, real_dlsym};

/// A shared library opened with `dlopen`, never closed (function pointers into it are handed out).
#[derive(Clone, Copy, Debug)]
pub struct Library {
    handle: usize,
}

impl Library {
    /// Opens the first of `names` that loads; `None` when none does.
    pub fn open(names: &[&CStr]) -> Option<Library> {
        names.iter().find_map(|name| {
            // glibc's own dlopen: a tool's shim that exports one would answer with itself.
            // SAFETY: `name` is NUL-terminated; dlopen has no other precondition.
            let handle = unsafe { vgpu_preload::open(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
            (!handle.is_null()).then_some(Library { handle: handle as usize })
        })
    }

    /// Resolves the first of `names` the library exports. Callers list only variants that share
    /// one C signature, newest first (`_v2` before the bare name): docs/architecture.md, "How a
    /// call reaches libvgpu".
    pub fn symbol(&self, names: &[&CStr]) -> Option<*mut c_void> {
        names
            .iter()
            // SAFETY: `handle` came from a successful dlopen and is never closed.
            .map(|name| unsafe { lookup(self.handle as *mut c_void, name) })
            .find(|ptr| !ptr.is_null())
    }
}

/// Whether `addr` lies in one of the NVIDIA driver's own libraries. Their internal lookups must
/// get their own functions back, never our hooks (HAMi-core recursed forever there).
pub fn is_driver_library(addr: usize) -> bool {
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
    base.starts_with(b"libcuda.so") || base.starts_with(b"libnvidia-")
}
