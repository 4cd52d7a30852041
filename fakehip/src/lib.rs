//! A fake AMD HIP runtime (`libamdhip64.so`) that simulates devices and keeps its own ledger, so
//! libvgpu_hip can be tested without an AMD GPU. See README.md.

mod abi;
mod api;
mod config;
mod counters;
mod pools;
mod state;
mod timeline;
