//! Modules and libraries: `cuModuleLoad`, `cuModuleLoadData`, `cuModuleLoadDataEx`,
//! `cuModuleUnload`, `cuLibraryLoadData`, `cuLibraryUnload`. The image is not read: a load places
//! `FAKEGPU_MODULE_MEMORY` bytes on the current context's device (the driver's own memory, which no
//! allocation call returns) until the module is unloaded.

use std::ffi::{c_char, c_uint, c_void};

use super::memory::charged_device;
use super::{CUresult, CuError, answer, as_handle, as_pointer, current, initialized, non_null, put};
use crate::handles::Kind;
use crate::stats;

/// Loads a module or library of `kind` into `out`; a NULL `image` is INVALID_VALUE.
///
/// # Safety
/// `out` must be NULL or valid for writing a pointer.
unsafe fn load(out: *mut *mut c_void, image: *const c_void, kind: Kind) -> Result<(), CuError> {
    let (fake, device) = charged_device()?;
    non_null(out)?;
    if image.is_null() {
        return Err(CuError::InvalidValue);
    }
    let handle = fake.load_module(device, kind)?;
    // SAFETY: a non-NULL out-pointer by this function's contract.
    unsafe { put(out, as_pointer(handle)) }
}

fn unload(handle: *mut c_void, kind: Kind) -> Result<(), CuError> {
    let fake = initialized()?;
    current(fake)?;
    Ok(fake.unload_module(as_handle(handle), kind)?)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleLoad(module: *mut *mut c_void, fname: *const c_char) -> CUresult {
    stats::record_call("cuModuleLoad");
    // SAFETY: `module` is NULL or a valid out-pointer per the cuModuleLoad contract; the file name
    // is not read.
    answer(|| unsafe { load(module, fname.cast(), Kind::Module) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleLoadData(module: *mut *mut c_void, image: *const c_void) -> CUresult {
    stats::record_call("cuModuleLoadData");
    // SAFETY: `module` is NULL or a valid out-pointer per the cuModuleLoadData contract.
    answer(|| unsafe { load(module, image, Kind::Module) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleLoadDataEx(
    module: *mut *mut c_void,
    image: *const c_void,
    _options: c_uint,
    _option_names: *mut c_void,
    _option_values: *mut *mut c_void,
) -> CUresult {
    stats::record_call("cuModuleLoadDataEx");
    // SAFETY: `module` is NULL or a valid out-pointer per the cuModuleLoadDataEx contract; the
    // JIT options are not read.
    answer(|| unsafe { load(module, image, Kind::Module) })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuModuleUnload(module: *mut c_void) -> CUresult {
    stats::record_call("cuModuleUnload");
    answer(|| unload(module, Kind::Module))
}

#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cuLibraryLoadData(
    library: *mut *mut c_void,
    code: *const c_void,
    _jit_options: *mut c_void,
    _jit_values: *mut *mut c_void,
    _jit_count: c_uint,
    _library_options: *mut c_void,
    _library_values: *mut *mut c_void,
    _library_count: c_uint,
) -> CUresult {
    stats::record_call("cuLibraryLoadData");
    // SAFETY: `library` is NULL or a valid out-pointer per the cuLibraryLoadData contract; the
    // options are not read.
    answer(|| unsafe { load(library, code, Kind::Library) })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuLibraryUnload(library: *mut c_void) -> CUresult {
    stats::record_call("cuLibraryUnload");
    answer(|| unload(library, Kind::Library))
}
