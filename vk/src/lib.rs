//! `libvgpu_vk.so`: a Vulkan implicit layer that draws a container's Vulkan device memory and
//! queue time from the same budget as its CUDA work.
//!
//! The loader finds the layer through its manifest (`VK_LAYER_LIBVGPU_budget.json`, enabled by
//! `HAMI_VULKAN_ENABLE=1`) and negotiates interface version 2 ([`exports`]). Each instance and
//! device records the next layer's entry points ([`dispatch`]). A physical device is matched to
//! the container's CUDA ordinal by UUID ([`gpus`]); on a budgeted device, device-local allocations
//! are charged to the shared ledger and heaps report the budget ([`memory`]), and with a compute
//! share queue submissions are paced by the container's clock ([`pacing`]), their GPU time read from
//! timestamps the layer writes around them ([`timestamps`], [`batches`]). This library exports
//! no `vk*` symbol but the negotiation entry point, and is never preloaded.

pub mod batches;
pub mod dispatch;
#[cfg(not(test))]
mod exports;
pub mod gpus;
pub mod loader_abi;
pub mod memory;
pub mod pacing;
pub mod runtime;
pub mod timestamps;
