//! `CUDA_INJECTION64_PATH`: the real driver loads the library it names when CUDA initialises and
//! calls the library's `InitializeInjection`, the way Nsight Systems and CUPTI-based tools enter a
//! program. The fake does the same, once per process, at the first successful `cuInit`.

use std::ffi::CString;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::sync::Once;

/// Loads the injection library, if one is named, and runs its `InitializeInjection`.
pub fn load_once() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let Some(path) = std::env::var_os("CUDA_INJECTION64_PATH").filter(|path| !path.is_empty()) else {
            return;
        };
        let Ok(text) = CString::new(path.as_bytes()) else { return };
        // SAFETY: a NUL-terminated path; dlopen has no other precondition.
        let handle = unsafe { libc::dlopen(text.as_ptr(), libc::RTLD_NOW) };
        if handle.is_null() {
            let _ = writeln!(
                std::io::stderr(),
                "fakegpu: CUDA_INJECTION64_PATH={}: cannot load it",
                path.display()
            );
            return;
        }
        // SAFETY: a live handle and a NUL-terminated name.
        let init = unsafe { libc::dlsym(handle, c"InitializeInjection".as_ptr()) };
        if !init.is_null() {
            // SAFETY: the injection entry point takes nothing and returns an int, per CUPTI's contract.
            let init =
                unsafe { std::mem::transmute::<*mut libc::c_void, extern "C" fn() -> libc::c_int>(init) };
            init();
        }
    });
}
