//! Finding the real `dlsym`, the HIP runtime and SMI libraries, and entry points in them.
//!
//! We export `dlsym` ourselves, so nothing in this crate may call the plain `dlsym`: it would land
//! in our own override. The real one comes from `vgpu_preload` ([`real_dlsym`]).

use std::ffi::{CStr, CString, c_int, c_void};

pub use vgpu_preload::{DlsymFn, REAL_DLSYM, lookup, real_dlsym};

/// The runtime's sonames, newest first: ROCm 6.x, then 5.x, then the development link.
pub const RUNTIME_NAMES: [&CStr; 3] = [c"libamdhip64.so.6", c"libamdhip64.so.5", c"libamdhip64.so"];

/// ROCm SMI's sonames: Debian 12's (ROCm 5.2) is `.so.1`; AMD's ROCm 6.x packages ship `.so.7`
/// (from their documentation), 5.x `.so.5`.
pub const SMI_NAMES: [&CStr; 4] =
    [c"librocm_smi64.so.7", c"librocm_smi64.so.5", c"librocm_smi64.so.1", c"librocm_smi64.so"];

/// How ROCm SMI's file names start, whatever their version.
pub const ROCM_SMI_FILE: &[u8] = b"librocm_smi64.so";

/// How AMD SMI's file names start: `libamd_smi.so.<N>` of the ROCm packages (N follows the
/// library's own version, 24 and later), `libamd_smi.so` in the `amdsmi` Python package.
pub const AMD_SMI_FILE: &[u8] = b"libamd_smi.so";

/// A library (the HIP runtime, ROCm SMI, AMD SMI), opened with `dlopen` and never closed
/// (pointers into it are handed out).
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
        Library::open_with(names, libc::RTLD_NOW | libc::RTLD_NOLOAD)
            .or_else(|| Library::open_with(names, libc::RTLD_NOW | libc::RTLD_GLOBAL))
    }

    /// The first of `names` this process already loaded (by file or soname); loads nothing.
    pub fn already_loaded(names: &[&CStr]) -> Option<Library> {
        Library::open_with(names, libc::RTLD_NOW | libc::RTLD_NOLOAD)
    }

    fn open_with(names: &[&CStr], flags: i32) -> Option<Library> {
        names.iter().find_map(|name| {
            // glibc's own dlopen: a tool's shim that exports one would answer with itself.
            // SAFETY: `name` is NUL-terminated; dlopen has no other precondition.
            let handle = unsafe { vgpu_preload::open(name.as_ptr(), flags) };
            (!handle.is_null()).then_some(Library { handle: handle as usize })
        })
    }

    /// A library this process already loaded whose file name starts with `prefix`, wherever it
    /// lies and whatever its version: `amd-smi`'s Python package loads its own copy of
    /// `libamd_smi.so` by path. Loads nothing.
    pub fn loaded_file(prefix: &[u8]) -> Option<Library> {
        let mut search = Search { prefix, found: None };
        // SAFETY: `find` matches dl_iterate_phdr's callback type and `search` outlives the call.
        unsafe { libc::dl_iterate_phdr(Some(find), (&raw mut search).cast()) };
        // dlopen after the walk: the walk holds the loader's lock.
        let path = search.found?;
        // SAFETY: `path` is NUL-terminated; RTLD_NOLOAD only looks the loaded object up.
        let handle = unsafe { vgpu_preload::open(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
        (!handle.is_null()).then_some(Library { handle: handle as usize })
    }

    /// The address of `name` in the library; `None` when it does not export it.
    pub fn symbol(&self, name: &CStr) -> Option<*mut c_void> {
        // SAFETY: `handle` came from a successful dlopen and is never closed.
        let ptr = unsafe { lookup(self.handle as *mut c_void, name) };
        (!ptr.is_null()).then_some(ptr)
    }
}

/// Whether `addr` lies in the HIP runtime, the HSA runtime under it, ROCm SMI or AMD SMI: their own
/// lookups must get their own functions back, never our hooks.
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
    let base = base_name(unsafe { CStr::from_ptr(fname) }.to_bytes());
    base.starts_with(b"libamdhip64.so")
        || base.starts_with(b"libhsa-runtime64.so")
        || base.starts_with(ROCM_SMI_FILE)
        || base.starts_with(AMD_SMI_FILE)
}

/// The file name of `path`.
fn base_name(path: &[u8]) -> &[u8] {
    path.rsplit(|&b| b == b'/').next().unwrap_or(path)
}

/// What [`Library::loaded_file`] looks for, and what it found.
struct Search<'a> {
    prefix: &'a [u8],
    found: Option<CString>,
}

/// `dl_iterate_phdr`'s callback: stops at the first object whose file name starts with the prefix.
unsafe extern "C" fn find(info: *mut libc::dl_phdr_info, _size: usize, data: *mut c_void) -> c_int {
    // SAFETY: `data` is the `Search` that `loaded_file` passed, alive for the whole walk, and
    // `info` is the loader's description of one object, valid during this call.
    let (search, name) = unsafe { (&mut *data.cast::<Search>(), (*info).dlpi_name) };
    if name.is_null() {
        return 0;
    }
    // SAFETY: `dlpi_name` is a NUL-terminated path owned by the dynamic linker.
    let path = unsafe { CStr::from_ptr(name) };
    if !base_name(path.to_bytes()).starts_with(search.prefix) {
        return 0;
    }
    search.found = Some(path.to_owned());
    1
}
