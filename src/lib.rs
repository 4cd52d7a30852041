//! libvgpu: an `LD_PRELOAD` library that turns one NVIDIA GPU into virtual GPUs, each with a
//! memory budget and a compute share.
//!
//! Calls reach us three ways (DESIGN §2): as preloaded driver symbols, through our `dlsym`
//! override, and through `cuGetProcAddress`. [`exports`] holds every exported symbol as a thin
//! shim; [`hooks`] does the work in safe Rust; [`ledger`] counts bytes against the budgets read
//! by [`config`]; [`compute`] paces kernel launches to the compute shares; [`driver`] is the real
//! NVIDIA driver behind all of it.

pub mod compute;
pub mod config;
pub mod driver;
pub mod error;
#[cfg(not(test))]
mod exports;
pub mod hooks;
pub mod ledger;
mod logging;
pub mod region;
pub mod runtime;
