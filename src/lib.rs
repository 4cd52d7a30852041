//! libvgpu: an `LD_PRELOAD` library that turns one NVIDIA GPU into virtual GPUs, each with a
//! memory budget and a compute share.
//!
//! Calls reach us three ways (docs/architecture.md, "How a call reaches libvgpu"): as preloaded
//! driver symbols, through our `dlsym` override, and through `cuGetProcAddress`. [`exports`] holds
//! every exported symbol as a thin shim; [`hooks`] does the work in safe Rust; [`ledger`] counts
//! bytes against the budgets read by [`config`]; [`compute`] paces kernel launches to the compute
//! shares; [`driver`] is the real NVIDIA driver behind all of it.

// The `dlsym` override is a tail-jump trampoline written per architecture (`exports`).
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
compile_error!("libvgpu's dlsym trampoline exists for x86_64 and aarch64 only");

pub mod compute;
pub mod driver;
pub mod error;
#[cfg(not(test))]
mod exports;
pub mod hooks;
pub mod runtime;

// The budget, the region file and the environment contract live in the `vgpu-ledger` crate,
// which the Vulkan layer shares; these names keep the paths the hooks use.
pub use vgpu_ledger as ledger;
pub use vgpu_ledger::{config, logging, region};

#[cfg(test)]
mod tests {
    /// This crate links GCC's unwinder in statically (build.rs, link/static_unwinder.rs), as the
    /// shipped library does: a panic must still unwind to the `catch_unwind` that every entry point
    /// puts around its hook.
    #[test]
    fn panics_unwind_with_the_linked_in_unwinder() {
        let caught = std::panic::catch_unwind(|| panic!("a hook's own bug"));
        assert!(caught.is_err());
    }
}
