//! Shared by the build scripts of `libvgpu.so` and `libvgpu_hip.so`: the library defines glibc's
//! version nodes for `dlsym` and `dlvsym`, so that a lookup by version finds it as it finds glibc.
//!
//! A tool's shim commonly resolves the real `dlsym` with `dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34")`
//! (docs/architecture.md, "How a call reaches libvgpu"). glibc's dynamic linker answers a lookup by
//! version only from an object that defines that version, so an unversioned export is skipped and
//! the shim forwards past libvgpu. `vgpu_preload::dlsym_trampoline!` names the exports with
//! `.symver` (`dlsym@@GLIBC_2.34`, `dlsym@<baseline>`, `dlvsym@…`); the version nodes themselves
//! come from the script written here.
//!
//! rustc hands the linker an anonymous version script of its own. GNU ld refuses to combine an
//! anonymous script with named nodes; LLVM's lld accepts it, so the library is linked with the
//! `rust-lld` that rustup ships (x86_64's default since Rust 1.90; named here for every target,
//! aarch64's cross `gcc` included).

use std::path::{Path, PathBuf};

pub fn define_glibc_versions() {
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR for build scripts"));
    // glibc's first version on the architecture, and 2.34, where dlsym and dlvsym moved into libc.
    let baseline = match std::env::var("CARGO_CFG_TARGET_ARCH").as_deref() {
        Ok("aarch64") => "GLIBC_2.17",
        _ => "GLIBC_2.2.5",
    };
    let script = out_dir.join("glibc-versions.map");
    std::fs::write(&script, format!("{baseline} {{ }};\nGLIBC_2.34 {{ }} {baseline};\n"))
        .expect("write the version script");
    let gcc_ld = rust_lld_directory();
    assert!(
        gcc_ld.join("ld.lld").exists(),
        "{} has no ld.lld: libvgpu links with the rust-lld that rustup's toolchains ship",
        gcc_ld.display()
    );
    println!("cargo:rustc-cdylib-link-arg=-fuse-ld=lld");
    println!("cargo:rustc-cdylib-link-arg=-B{}", gcc_ld.display());
    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={}", script.display());
}

/// rustc's `gcc-ld` folder, where `gcc -fuse-ld=lld -B<it>` finds a `ld.lld` that runs rust-lld.
fn rust_lld_directory() -> PathBuf {
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let output = std::process::Command::new(&rustc).args(["--print", "sysroot"]).output().expect("run rustc");
    let sysroot = String::from_utf8(output.stdout).expect("a UTF-8 sysroot");
    let host = std::env::var("HOST").expect("cargo sets HOST for build scripts");
    Path::new(sysroot.trim()).join("lib/rustlib").join(host).join("bin/gcc-ld")
}
