//! libvgpu_hip: an `LD_PRELOAD` library that holds a container's AMD GPU (HIP) device memory to
//! the same budget, in the same shared region, as libvgpu's CUDA and Vulkan libraries.
//!
//! Calls reach us three ways, as on the CUDA side: as preloaded runtime symbols, through our
//! `dlsym` override, and through `hipGetProcAddress` (HIP 6.2+). Each hooked entry point is
//! declared once in [`entry_points`], which generates its exported shim, its `dlsym` and
//! `hipGetProcAddress` entry and the call to the runtime's own function; [`hooks`] holds the
//! logic; [`sys`] the HIP ABI; the budget is `vgpu-ledger`'s.

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
compile_error!("libvgpu_hip's dlsym trampoline exists for x86_64 and aarch64 only");

pub mod compute;
pub mod entry_points;
pub mod error;
#[cfg(not(test))]
mod exports;
pub mod hooks;
pub mod loader;
pub mod runtime;
pub mod sys;
