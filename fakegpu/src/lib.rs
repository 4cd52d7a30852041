//! A fake NVIDIA driver (CUDA driver API and NVML) that simulates devices and keeps its own ledger,
//! so libvgpu can be tested without a GPU. See README.md.

mod config;
mod cuda;
mod devices;
mod ledger;
mod nvml;
mod proc_table;
mod state;
mod stats;
