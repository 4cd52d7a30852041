//! What each hooked call does, in safe Rust over the raw pointers the application passed.

pub mod memory;
pub mod nvml;
pub mod symbols;
