//! Every symbol libvgpu exports. Each is a thin shim: it converts arguments, calls a hook in safe
//! Rust, and converts the result back. No panic crosses into C: a panic becomes an error code.
//!
//! To hook a new entry point: add its signature to `driver::sys`, its logic under `hooks`, a shim
//! here and a line in [`hooks`].

#![allow(non_snake_case)]

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};

use crate::driver::{self, loader::REAL_DLSYM, sys::*};
use crate::error::HookError;
use crate::hooks::symbols::{self, Hook};
use crate::hooks::{memory, nvml};
use crate::runtime::{self, Runtime};

/// The hooks `dlsym` and `cuGetProcAddress` may hand out, by the driver symbol each replaces.
fn hooks() -> [Hook; 9] {
    macro_rules! hook {
        ($f:ident) => {
            Hook {
                name: {
                    const NAME: &std::ffi::CStr =
                        match std::ffi::CStr::from_bytes_with_nul(concat!(stringify!($f), "\0").as_bytes()) {
                            Ok(name) => name,
                            Err(_) => panic!("symbol name with NUL"),
                        };
                    NAME
                },
                address: $f as *const () as usize,
            }
        };
    }
    [
        hook!(cuInit),
        hook!(cuMemAlloc_v2),
        hook!(cuMemFree_v2),
        hook!(cuMemGetInfo_v2),
        hook!(cuDeviceTotalMem_v2),
        hook!(cuGetProcAddress),
        hook!(cuGetProcAddress_v2),
        hook!(nvmlDeviceGetMemoryInfo),
        hook!(nvmlDeviceGetMemoryInfo_v2),
    ]
}

/// Runs a CUDA hook with the runtime, turning errors and panics into a `CUresult`.
fn cuda_shim(hook: impl FnOnce(&'static Runtime) -> Result<(), HookError>) -> CUresult {
    match catch_unwind(AssertUnwindSafe(|| hook(runtime::get()?))) {
        Ok(Ok(())) => CUDA_SUCCESS,
        Ok(Err(error)) => error.into(),
        Err(_) => CUDA_ERROR_UNKNOWN,
    }
}

/// Runs an NVML hook with the runtime, turning errors and panics into an `nvmlReturn_t`.
fn nvml_shim(hook: impl FnOnce(&'static Runtime) -> Result<(), HookError>) -> NvmlReturn {
    match catch_unwind(AssertUnwindSafe(|| hook(runtime::get()?))) {
        Ok(Ok(())) => NVML_SUCCESS,
        Ok(Err(error)) => error.to_nvml(),
        Err(_) => NVML_ERROR_UNKNOWN,
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn cuInit(flags: c_uint) -> CUresult {
    cuda_shim(|_| driver::cuda().init(flags))
}

/// # Safety
/// Called by C with `cuMemAlloc_v2`'s contract; `dptr` goes to the driver unchecked.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize) -> CUresult {
    // SAFETY: `dptr` is the caller's out-pointer, forwarded as the driver's contract allows.
    cuda_shim(|rt| unsafe { memory::alloc(rt, dptr, bytesize) })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult {
    cuda_shim(|rt| memory::free(rt, dptr))
}

/// # Safety
/// Called by C with `cuMemGetInfo_v2`'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    // SAFETY: the caller's out-pointers, forwarded to the driver first.
    cuda_shim(|rt| unsafe { memory::get_info(rt, free, total) })
}

/// # Safety
/// Called by C with `cuDeviceTotalMem_v2`'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult {
    // SAFETY: the caller's out-pointer, forwarded to the driver first.
    cuda_shim(|rt| unsafe { memory::device_total(rt, bytes, dev) })
}

/// Asks the real driver with identical arguments, then swaps in our hook for the exact variant
/// the driver chose.
///
/// # Safety
/// Called by C with `cuGetProcAddress`'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cudaVersion: c_int,
    flags: u64,
) -> CUresult {
    let Some(real) = driver::cuda().get_proc_address else { return CUDA_ERROR_NOT_FOUND };
    // SAFETY: the caller's arguments, forwarded unchanged to the function we stand in for.
    let status = unsafe { real(symbol, pfn, cudaVersion, flags) };
    // SAFETY: on success the driver wrote a function pointer through the non-null `pfn`.
    unsafe { substitute_proc_address(status, pfn) };
    status
}

/// As [`cuGetProcAddress`], with the CUDA 12 `symbolStatus` out-parameter.
///
/// # Safety
/// Called by C with `cuGetProcAddress_v2`'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cudaVersion: c_int,
    flags: u64,
    symbolStatus: *mut c_int,
) -> CUresult {
    let Some(real) = driver::cuda().get_proc_address_v2 else { return CUDA_ERROR_NOT_FOUND };
    // SAFETY: the caller's arguments, forwarded unchanged to the function we stand in for.
    let status = unsafe { real(symbol, pfn, cudaVersion, flags, symbolStatus) };
    // SAFETY: on success the driver wrote a function pointer through the non-null `pfn`.
    unsafe { substitute_proc_address(status, pfn) };
    status
}

/// # Safety
/// `pfn` is null or points to a pointer the driver wrote when `status` is success.
unsafe fn substitute_proc_address(status: CUresult, pfn: *mut *mut c_void) {
    if status != CUDA_SUCCESS || pfn.is_null() {
        return;
    }
    let _ = catch_unwind(|| {
        // SAFETY: the driver succeeded, so `*pfn` is initialised and writable.
        let real = unsafe { pfn.read() };
        if !real.is_null() {
            // SAFETY: as above.
            unsafe { pfn.write(symbols::proc_address_substitute(&hooks(), real)) };
        }
    });
}

/// # Safety
/// Called by C with `nvmlDeviceGetMemoryInfo`'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(device: NvmlDevice, memory: *mut NvmlMemory) -> NvmlReturn {
    // SAFETY: the caller's out-pointer, forwarded to NVML first.
    nvml_shim(|rt| unsafe { nvml::memory_info(rt, device, memory) })
}

/// # Safety
/// Called by C with `nvmlDeviceGetMemoryInfo_v2`'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: NvmlDevice,
    memory: *mut NvmlMemoryV2,
) -> NvmlReturn {
    // SAFETY: the caller's out-pointer, forwarded to NVML first.
    nvml_shim(|rt| unsafe { nvml::memory_info_v2(rt, device, memory) })
}

/// Decides a `dlsym` call for the trampoline: our hook's address, or null for "ask the real
/// `dlsym`". Never unwinds.
extern "C" fn dlsym_decide(handle: *mut c_void, name: *const c_char, caller: *const c_void) -> *mut c_void {
    // SAFETY: the application's dlsym arguments, forwarded as they came.
    catch_unwind(|| unsafe { symbols::dlsym_substitute(&hooks(), handle, name, caller) })
        .unwrap_or(std::ptr::null_mut())
}

/// `dlsym` override. glibc resolves `RTLD_NEXT` (and namespaces) relative to its caller's return
/// address, so whatever we do not substitute is passed on by a jump, not a call: the real `dlsym`
/// sees the application's return address, as if we were not there.
///
/// # Safety
/// Called by C with `dlsym`'s contract.
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
