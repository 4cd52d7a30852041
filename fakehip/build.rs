//! Links the fake with `-Bsymbolic` so the addresses `hipGetProcAddress` hands out are its own
//! functions even when a preloaded library exports the same names, and names it as the runtime.

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libamdhip64.so.6");
    println!("cargo:rerun-if-changed=build.rs");
}
