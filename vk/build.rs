//! Link settings for `libvgpu_vk.so`.

#[path = "../link/static_unwinder.rs"]
mod static_unwinder;

fn main() {
    static_unwinder::link_unwinder_statically();
    // The loader unloads a layer when the last instance goes, but the ledger leaves exit and fork
    // handlers (and the pacer a thread) pointing into us: stay loaded. Bind everything at load so no
    // lazy PLT resolution runs inside a hook.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libvgpu_vk.so");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,now");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=../link/static_unwinder.rs");
}
