//! Link settings for `libvgpu.so`.

fn main() {
    // Function pointers into us are handed to applications, so we must never be unloaded; name the
    // library as HAMi-core's users expect; bind everything at load so no lazy PLT resolution runs
    // inside a hook.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libvgpu.so");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,now");
    println!("cargo:rerun-if-changed=build.rs");
}
