//! `cuInit`: the driver starts in this process, and libvgpu says (at debug level) which version
//! it is and how it is set up.

use std::ffi::c_uint;
use std::sync::Once;

use crate::driver;
use crate::error::HookError;
use crate::runtime::Runtime;

/// `cuInit`, passed to the driver; the first call logs libvgpu's version, the region file and the
/// limits.
pub fn init(runtime: &Runtime, flags: c_uint) -> Result<(), HookError> {
    static LOGGED: Once = Once::new();
    LOGGED.call_once(|| {
        tracing::debug!("CUDA starting (libvgpu {}): {}", env!("CARGO_PKG_VERSION"), runtime.config.summary())
    });
    driver::cuda().init(flags)
}
