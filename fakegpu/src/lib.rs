//! A fake NVIDIA driver (CUDA driver API and NVML) that simulates devices and keeps its own ledger,
//! so libvgpu can be tested without a GPU. See README.md.

mod clock;
mod config;
mod contexts;
mod cuda;
mod devices;
mod events;
mod handles;
mod injection;
mod ledger;
mod memory;
mod nvml;
mod proc_table;
mod processes;
mod state;
mod stats;
mod timeline;
