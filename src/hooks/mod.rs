//! What each hooked call does, in safe Rust over the raw pointers the application passed.

pub mod arrays;
pub mod context;
pub mod copies;
pub mod driver_memory;
pub mod graphs;
pub mod init;
pub mod launch;
pub mod memory;
pub mod nvml;
pub mod overcommit;
pub mod pools;
pub mod swap;
pub mod symbols;
pub mod vmm;
