//! CUDA IPC: `cuIpcGetMemHandle`, `cuIpcOpenMemHandle_v2`, `cuIpcCloseMemHandle`. Opening charges
//! nothing: the memory was paid for where it was allocated.

use std::ffi::{c_char, c_uint};

use super::{CUdeviceptr, CUresult, CuError, answer, current, initialized, non_null, put};
use crate::memory::ipc::HANDLE_BYTES;
use crate::stats;

/// `CUipcMemHandle`: 64 opaque bytes, passed by value to `cuIpcOpenMemHandle`.
#[derive(Clone, Copy)]
#[repr(C)]
pub struct CUipcMemHandle {
    reserved: [c_char; HANDLE_BYTES],
}

/// `CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS`, the one open flag.
const OPEN_FLAGS: c_uint = 1;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuIpcGetMemHandle(handle: *mut CUipcMemHandle, dptr: CUdeviceptr) -> CUresult {
    stats::record_call("cuIpcGetMemHandle");
    answer(|| {
        let fake = initialized()?;
        current(fake)?;
        non_null(handle)?;
        let bytes = fake.ipc_handle(dptr)?;
        let reserved = bytes.map(|byte| byte as c_char);
        // SAFETY: a non-NULL out-pointer per the cuIpcGetMemHandle contract.
        unsafe { put(handle, CUipcMemHandle { reserved }) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuIpcOpenMemHandle_v2(
    dptr: *mut CUdeviceptr,
    handle: CUipcMemHandle,
    flags: c_uint,
) -> CUresult {
    stats::record_call("cuIpcOpenMemHandle_v2");
    answer(|| {
        let fake = initialized()?;
        current(fake)?;
        non_null(dptr)?;
        if flags & !OPEN_FLAGS != 0 {
            return Err(CuError::InvalidValue);
        }
        // `c_char` is `i8` on x86_64 and `u8` on AArch64: reinterpret the byte either way.
        let address = fake.ipc_open(&handle.reserved.map(|byte| u8::from_ne_bytes(byte.to_ne_bytes())))?;
        // SAFETY: a non-NULL out-pointer per the cuIpcOpenMemHandle_v2 contract.
        unsafe { put(dptr, address) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuIpcCloseMemHandle(dptr: CUdeviceptr) -> CUresult {
    stats::record_call("cuIpcCloseMemHandle");
    answer(|| {
        let fake = initialized()?;
        current(fake)?;
        Ok(fake.ipc_close(dptr)?)
    })
}
