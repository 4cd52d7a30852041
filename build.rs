//! Link settings for `libvgpu.so`.

#[path = "link/glibc_versions.rs"]
mod glibc_versions;
#[path = "link/static_unwinder.rs"]
mod static_unwinder;

fn main() {
    static_unwinder::link_unwinder_statically();
    glibc_versions::define_glibc_versions();
    // Function pointers into us are handed to applications, so we must never be unloaded; name the
    // library as HAMi-core's users expect; bind everything at load so no lazy PLT resolution runs
    // inside a hook. Our own entry points are bound to themselves when linking: the hook tables
    // hold their addresses, which then cost no symbol lookup when the library is loaded (there
    // are over a hundred), in every process it is preloaded into.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libvgpu.so");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,now");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic-functions");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=link/static_unwinder.rs");
    println!("cargo:rerun-if-changed=link/glibc_versions.rs");
}
