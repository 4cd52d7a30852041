//! Shared by the build scripts of `libvgpu.so` and `libvgpu_vk.so`: GCC's unwinder is linked into
//! the library instead of loading `libgcc_s.so.1` beside it.
//!
//! Both libraries are loaded into processes that may never use a GPU (HAMi preloads libvgpu into
//! every process of a container; the Vulkan layer is implicit). `libgcc_s.so.1` costs each such
//! process one more library to find and map, and its constructor, which runs `cpuid` several
//! times: on a virtual machine every `cpuid` traps to the hypervisor (docs/benchmarks.md,
//! "Start-up"). Rust's standard library asks the linker for `-lgcc_s`; a linker script of that
//! name, found first, hands it `libgcc_eh.a`, the static unwinder GCC ships for `-static-libgcc`.
//! rustc's version script keeps the unwinder's symbols local, so the application's own unwinder
//! (and any `libgcc_s.so.1` it loads) is untouched, and panics still unwind to the
//! `catch_unwind` at each entry point.

use std::path::PathBuf;

pub fn link_unwinder_statically() {
    if std::env::var("CARGO_CFG_TARGET_ENV").as_deref() != Ok("gnu") {
        return;
    }
    let out_dir = std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR for build scripts");
    let dir = PathBuf::from(out_dir).join("static-unwinder");
    std::fs::create_dir_all(&dir).expect("create the linker script's directory");
    std::fs::write(dir.join("libgcc_s.so"), "INPUT(-lgcc_eh)\n").expect("write the linker script");
    println!("cargo:rustc-link-search=native={}", dir.display());
}
