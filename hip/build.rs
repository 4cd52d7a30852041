//! Link settings for `libvgpu_hip.so`.

#[path = "../link/glibc_versions.rs"]
mod glibc_versions;
#[path = "../link/static_unwinder.rs"]
mod static_unwinder;

fn main() {
    static_unwinder::link_unwinder_statically();
    glibc_versions::define_glibc_versions();
    // As libvgpu.so: function pointers into us are handed to applications, so we are never
    // unloaded; everything is bound at load so no lazy PLT resolution runs inside a hook; our own
    // entry points bind to themselves, so the hook table costs no symbol lookup at load.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libvgpu_hip.so");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,now");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic-functions");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=../link/static_unwinder.rs");
    println!("cargo:rerun-if-changed=../link/glibc_versions.rs");
}
