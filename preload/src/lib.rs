//! What a preload library of libvgpu needs to stand in for `dlsym`: glibc's real `dlsym`, and the
//! trampoline that exports our own. `libvgpu.so` (CUDA) and `libvgpu_hip.so` (HIP) both link it;
//! each keeps its own copy (the crate is linked in, not shared at run time).
//!
//! We export `dlsym` ourselves, so nothing in a library that links this crate may call the plain
//! `dlsym`: it would land in our own override. The real one is fetched once with `dlvsym` and kept
//! in [`REAL_DLSYM`].

mod elf;

use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::atomic::{AtomicPtr, Ordering};

/// Signature of glibc's `dlsym`.
pub type DlsymFn = unsafe extern "C" fn(handle: *mut c_void, name: *const c_char) -> *mut c_void;

/// glibc's `dlsym`, or null until [`real_dlsym`] has run once. The trampoline
/// ([`dlsym_trampoline!`]) reads it directly so that it can jump there without adding a frame.
pub static REAL_DLSYM: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

/// The symbol version of glibc's first `dlsym` on this architecture (its oldest ABI).
#[cfg(target_arch = "x86_64")]
const BASELINE_GLIBC: &CStr = c"GLIBC_2.2.5";
#[cfg(target_arch = "aarch64")]
const BASELINE_GLIBC: &CStr = c"GLIBC_2.17";

/// Signature of glibc's `dlvsym`.
pub type DlvsymFn =
    unsafe extern "C" fn(handle: *mut c_void, name: *const c_char, version: *const c_char) -> *mut c_void;

/// glibc's `dlvsym`, or null until [`real_dlsym`] has run once; read by the `dlvsym` trampoline.
pub static REAL_DLVSYM: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

/// Returns glibc's `dlsym`, resolving it (and glibc's `dlvsym`) on first use.
pub fn real_dlsym() -> Option<DlsymFn> {
    let mut ptr = REAL_DLSYM.load(Ordering::Acquire);
    if ptr.is_null() {
        let dlvsym = real_dlvsym()?;
        // glibc 2.34 moved dlsym into libc with a new version; older glibc only has the
        // architecture's first one.
        for version in [c"GLIBC_2.34", BASELINE_GLIBC] {
            // SAFETY: both strings are NUL-terminated; RTLD_NEXT is a valid pseudo-handle and,
            // called from here, names the objects loaded after this library (libc among them).
            ptr = unsafe { dlvsym(libc::RTLD_NEXT, c"dlsym".as_ptr(), version.as_ptr()) };
            if !ptr.is_null() {
                break;
            }
        }
        if ptr.is_null() {
            return None;
        }
        REAL_DLSYM.store(ptr, Ordering::Release);
    }
    // SAFETY: `ptr` is glibc's dlsym, whose C signature is exactly `DlsymFn`.
    Some(unsafe { std::mem::transmute::<*mut c_void, DlsymFn>(ptr) })
}

/// Returns glibc's `dlvsym`. This library exports `dlvsym` under glibc's own versions
/// (`link/glibc_versions.rs`), and the dynamic linker binds a versioned reference to the first
/// object that defines that version: our own reference to `dlvsym` lands in our own export. glibc's
/// is read instead from the symbol table of the object that defines glibc's `dladdr`, which this
/// library does not export (libc since 2.34, libdl before: both hold `dlvsym` too).
pub fn real_dlvsym() -> Option<DlvsymFn> {
    let mut ptr = REAL_DLVSYM.load(Ordering::Acquire);
    if ptr.is_null() {
        ptr = elf::function_in_object_of(libc::dladdr as *const () as usize, c"dlvsym")? as *mut c_void;
        REAL_DLVSYM.store(ptr, Ordering::Release);
    }
    // SAFETY: `ptr` is glibc's dlvsym, whose C signature is exactly `DlvsymFn`.
    Some(unsafe { std::mem::transmute::<*mut c_void, DlvsymFn>(ptr) })
}

/// Whether glibc's `dlvsym` finds `name` of `version` in `handle`: what a versioned lookup would
/// answer without us. Never true for `RTLD_NEXT`, which glibc resolves relative to its caller.
///
/// # Safety
/// `handle`, `name` and `version` satisfy `dlvsym`'s contract.
pub unsafe fn found_by_version(handle: *mut c_void, name: *const c_char, version: *const c_char) -> bool {
    match real_dlvsym() {
        // SAFETY: per this function's contract.
        Some(dlvsym) if handle != libc::RTLD_NEXT => !unsafe { dlvsym(handle, name, version) }.is_null(),
        _ => false,
    }
}

/// Signature of glibc's `dlopen`.
pub type DlopenFn = unsafe extern "C" fn(file: *const c_char, mode: c_int) -> *mut c_void;

/// glibc's `dlopen`, or null until [`real_dlopen`] has found it.
static REAL_DLOPEN: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

/// Returns glibc's own `dlopen`, whatever else exports one. A profiler's driver shim exports
/// `dlopen` and answers `dlopen("libcuda.so.1")` with a handle to itself (Nsight Compute's
/// `libcuda-injection.so`, seen on an H100): a preload library that opened the driver through it
/// would take the shim's entry points for the driver's. glibc's `dlopen` lives in the object that
/// defines its `dlsym` (libc since 2.34, libdl before), and is read from that object's own symbol
/// table.
pub fn real_dlopen() -> Option<DlopenFn> {
    let mut ptr = REAL_DLOPEN.load(Ordering::Acquire);
    if ptr.is_null() {
        let dlsym = real_dlsym()? as usize;
        ptr = elf::function_in_object_of(dlsym, c"dlopen")? as *mut c_void;
        REAL_DLOPEN.store(ptr, Ordering::Release);
    }
    // SAFETY: `ptr` is glibc's dlopen, whose C signature is exactly `DlopenFn`.
    Some(unsafe { std::mem::transmute::<*mut c_void, DlopenFn>(ptr) })
}

/// Opens `file` with glibc's own `dlopen` ([`real_dlopen`]), or the one this library binds to
/// when glibc's cannot be found.
///
/// # Safety
/// `file` is NULL or a NUL-terminated path, as `dlopen` requires.
pub unsafe fn open(file: *const c_char, mode: c_int) -> *mut c_void {
    match real_dlopen() {
        // SAFETY: per this function's contract.
        Some(dlopen) => unsafe { dlopen(file, mode) },
        // SAFETY: as above.
        None => unsafe { libc::dlopen(file, mode) },
    }
}

/// Looks `name` up in `handle` with the real `dlsym`; null when absent.
///
/// # Safety
/// `handle` is a handle from `dlopen` or one of the pseudo-handles, as `dlsym` requires.
pub unsafe fn lookup(handle: *mut c_void, name: &CStr) -> *mut c_void {
    match real_dlsym() {
        // SAFETY: `handle` is a handle from dlopen or a pseudo-handle, `name` is NUL-terminated.
        Some(dlsym) => unsafe { dlsym(handle, name.as_ptr()) },
        None => std::ptr::null_mut(),
    }
}

/// Exports `dlsym` and `dlvsym` from the library that invokes it. `$decide` is an
/// `extern "C" fn(handle, name, caller) -> *mut c_void` that returns our hook's address, or null
/// for "ask the real `dlsym`"; it must never unwind and must have run [`real_dlsym`] before it
/// returns null for a name the real `dlsym` should answer.
///
/// glibc resolves `RTLD_NEXT` (and namespaces) relative to its caller's return address, so
/// whatever is not substituted is passed on by a jump, not a call: the real `dlsym` sees the
/// application's return address, as if we were not there. One form per architecture.
///
/// Both are exported under glibc's versions (`link/glibc_versions.rs` defines the nodes):
/// `dlsym@@GLIBC_2.34` is the default, found by plain and by versioned lookups alike, and
/// `dlsym@<baseline>` serves programs linked against an older glibc. `dlvsym` is exported under
/// those versions only, never as a default: this library's own reference to glibc's `dlvsym`
/// must not bind to it at link time. A `dlvsym` lookup of a driver name is answered as `dlsym`
/// answers it, where glibc's `dlvsym` finds the name under that version at all.
#[macro_export]
macro_rules! dlsym_trampoline {
    ($decide:path) => {
        /// `dlvsym`'s decision: `$decide`'s hook, where a lookup by this version finds the name.
        #[cfg_attr(test, allow(dead_code))]
        extern "C" fn __vgpu_dlvsym_decide(
            handle: *mut ::std::ffi::c_void,
            name: *const ::std::ffi::c_char,
            version: *const ::std::ffi::c_char,
            caller: *const ::std::ffi::c_void,
        ) -> *mut ::std::ffi::c_void {
            let hook = $decide(handle, name, caller);
            // SAFETY: the application's dlvsym arguments, forwarded as they came.
            if hook.is_null() || !unsafe { $crate::found_by_version(handle, name, version) } {
                return ::std::ptr::null_mut();
            }
            hook
        }

        /// `dlsym` override ([`vgpu_preload::dlsym_trampoline!`]), x86_64 form.
        ///
        /// # Safety
        /// Called by C with `dlsym`'s contract.
        #[cfg(target_arch = "x86_64")]
        #[unsafe(naked)]
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn dlsym(
            handle: *mut ::std::ffi::c_void,
            name: *const ::std::ffi::c_char,
        ) -> *mut ::std::ffi::c_void {
            ::core::arch::naked_asm!(
                // Keep the arguments; three pushes also leave the stack 16-byte aligned.
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
                decide = sym $decide,
                real = sym $crate::REAL_DLSYM,
            )
        }

        /// `dlvsym` override, x86_64 form: as `dlsym`'s, with the version kept in `rdx`.
        ///
        /// # Safety
        /// Called by C with `dlvsym`'s contract.
        #[cfg(target_arch = "x86_64")]
        #[cfg_attr(test, allow(dead_code))]
        #[unsafe(naked)]
        unsafe extern "C" fn __vgpu_dlvsym(
            handle: *mut ::std::ffi::c_void,
            name: *const ::std::ffi::c_char,
            version: *const ::std::ffi::c_char,
        ) -> *mut ::std::ffi::c_void {
            ::core::arch::naked_asm!(
                // Three pushes leave the stack 16-byte aligned.
                "push rdi",
                "push rsi",
                "push rdx",
                "mov rcx, [rsp + 24]", // our return address, i.e. the caller's code
                "call {decide}",
                "pop rdx",
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
                decide = sym __vgpu_dlvsym_decide,
                real = sym $crate::REAL_DLVSYM,
            )
        }

        // Only where the library is linked (with link/glibc_versions.rs's version nodes), not in
        // its unit tests' executable.
        #[cfg(all(target_arch = "x86_64", not(test)))]
        ::core::arch::global_asm!(
            ".symver dlsym, dlsym@@GLIBC_2.34",
            ".symver dlsym, dlsym@GLIBC_2.2.5",
            ".globl vgpu_dlvsym",
            ".set vgpu_dlvsym, {dlvsym}",
            ".symver vgpu_dlvsym, dlvsym@GLIBC_2.34",
            ".symver vgpu_dlvsym, dlvsym@GLIBC_2.2.5",
            dlvsym = sym __vgpu_dlvsym,
        );

        /// `dlsym` override, AArch64 form: the caller's return address is in the link register,
        /// which the real `dlsym` must find unchanged, so it is restored before the branch (`br`,
        /// not `blr`).
        ///
        /// # Safety
        /// Called by C with `dlsym`'s contract.
        #[cfg(target_arch = "aarch64")]
        #[unsafe(naked)]
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn dlsym(
            handle: *mut ::std::ffi::c_void,
            name: *const ::std::ffi::c_char,
        ) -> *mut ::std::ffi::c_void {
            ::core::arch::naked_asm!(
                // A 32-byte frame (sp stays 16-byte aligned): frame pointer and link register,
                // then the arguments.
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
                decide = sym $decide,
                real = sym $crate::REAL_DLSYM,
            )
        }

        /// `dlvsym` override, AArch64 form: as `dlsym`'s, with the version kept in `x2`.
        ///
        /// # Safety
        /// Called by C with `dlvsym`'s contract.
        #[cfg(target_arch = "aarch64")]
        #[cfg_attr(test, allow(dead_code))]
        #[unsafe(naked)]
        unsafe extern "C" fn __vgpu_dlvsym(
            handle: *mut ::std::ffi::c_void,
            name: *const ::std::ffi::c_char,
            version: *const ::std::ffi::c_char,
        ) -> *mut ::std::ffi::c_void {
            ::core::arch::naked_asm!(
                // A 48-byte frame: frame pointer and link register, then the three arguments.
                "stp x29, x30, [sp, #-48]!",
                "mov x29, sp",
                "stp x0, x1, [sp, #16]",
                "str x2, [sp, #32]",
                "mov x3, x30", // our return address, i.e. the caller's code
                "bl {decide}",
                "mov x9, x0",
                "ldp x0, x1, [sp, #16]",
                "ldr x2, [sp, #32]",
                "ldp x29, x30, [sp], #48",
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
                decide = sym __vgpu_dlvsym_decide,
                real = sym $crate::REAL_DLVSYM,
            )
        }

        #[cfg(all(target_arch = "aarch64", not(test)))]
        ::core::arch::global_asm!(
            ".symver dlsym, dlsym@@GLIBC_2.34",
            ".symver dlsym, dlsym@GLIBC_2.17",
            ".globl vgpu_dlvsym",
            ".set vgpu_dlvsym, {dlvsym}",
            ".symver vgpu_dlvsym, dlvsym@GLIBC_2.34",
            ".symver vgpu_dlvsym, dlvsym@GLIBC_2.17",
            dlvsym = sym __vgpu_dlvsym,
        );
    };
}
