//! Links the fake with `-Bsymbolic` so its own references (the addresses `cuGetProcAddress` hands out)
//! bind to its own symbols even when a preloaded library exports the same names, as real libcuda does.

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic");
}
