//! The version table behind `cuGetProcAddress`: which exported variant answers a name at a CUDA version.

use std::ffi::c_void;

use crate::cuda::*;

/// Which default-stream mode a variant serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stream {
    /// The plain entry point, served for every mode unless a per-thread variant exists.
    Any,
    /// A `_ptsz`/`_ptds` entry point, served only for `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`.
    PerThread,
}

/// An exported function's address.
struct Entry(*const c_void);

// SAFETY: the pointer is the address of code in this library; it is never written or dereferenced here.
unsafe impl Sync for Entry {}

struct Variant {
    base: &'static str,
    since: i32,
    stream: Stream,
    entry: Entry,
}

/// `variant!("cuFoo", 12000, cuFoo_v2)`, or `variant!("cuFoo", 7000, per_thread cuFoo_ptsz)`.
macro_rules! variant {
    ($base:literal, $since:literal, $function:ident) => {
        Variant { base: $base, since: $since, stream: Stream::Any, entry: Entry($function as *const c_void) }
    };
    ($base:literal, $since:literal, per_thread $function:ident) => {
        Variant {
            base: $base,
            since: $since,
            stream: Stream::PerThread,
            entry: Entry($function as *const c_void),
        }
    };
}

/// Every name `cuGetProcAddress` knows: one line per exported variant, with the CUDA version that
/// introduced it.
static VARIANTS: &[Variant] = &[
    variant!("cuInit", 2000, cuInit),
    variant!("cuDriverGetVersion", 2020, cuDriverGetVersion),
    variant!("cuDeviceGet", 2000, cuDeviceGet),
    variant!("cuDeviceGetCount", 2000, cuDeviceGetCount),
    variant!("cuDeviceGetName", 2000, cuDeviceGetName),
    variant!("cuDeviceGetUuid", 9020, cuDeviceGetUuid),
    variant!("cuDeviceGetUuid", 11040, cuDeviceGetUuid_v2),
    variant!("cuDeviceTotalMem", 2000, cuDeviceTotalMem),
    variant!("cuDeviceTotalMem", 3020, cuDeviceTotalMem_v2),
    variant!("cuDevicePrimaryCtxRetain", 7000, cuDevicePrimaryCtxRetain),
    variant!("cuDevicePrimaryCtxRelease", 7000, cuDevicePrimaryCtxRelease),
    variant!("cuDevicePrimaryCtxRelease", 11000, cuDevicePrimaryCtxRelease_v2),
    variant!("cuCtxSetCurrent", 4000, cuCtxSetCurrent),
    variant!("cuCtxGetCurrent", 4000, cuCtxGetCurrent),
    variant!("cuCtxGetDevice", 2000, cuCtxGetDevice),
    variant!("cuCtxSynchronize", 2000, cuCtxSynchronize),
    variant!("cuStreamSynchronize", 2000, cuStreamSynchronize),
    variant!("cuMemAlloc", 2000, cuMemAlloc),
    variant!("cuMemAlloc", 3020, cuMemAlloc_v2),
    variant!("cuMemFree", 2000, cuMemFree),
    variant!("cuMemFree", 3020, cuMemFree_v2),
    variant!("cuMemGetInfo", 2000, cuMemGetInfo),
    variant!("cuMemGetInfo", 3020, cuMemGetInfo_v2),
    variant!("cuGetErrorString", 6000, cuGetErrorString),
    variant!("cuGetErrorName", 6000, cuGetErrorName),
    variant!("cuGetProcAddress", 11030, cuGetProcAddress),
    variant!("cuGetProcAddress", 12000, cuGetProcAddress_v2),
];

/// The answer to one query.
#[derive(Debug, PartialEq, Eq)]
pub enum Lookup {
    Found(*const c_void),
    /// Known name, but every variant is newer than the requested version.
    VersionNotSufficient,
    SymbolNotFound,
}

/// Picks the newest variant of `base` introduced at or before `version`, preferring a per-thread
/// variant when `per_thread` is set.
pub fn lookup(base: &[u8], version: i32, per_thread: bool) -> Lookup {
    let rank = |v: &Variant| (v.stream == Stream::PerThread, v.since);
    let mut known = false;
    let mut best: Option<&Variant> = None;
    for variant in VARIANTS.iter().filter(|v| v.base.as_bytes() == base) {
        known = true;
        let serves_mode = per_thread || variant.stream == Stream::Any;
        if variant.since <= version && serves_mode && best.is_none_or(|b| rank(variant) > rank(b)) {
            best = Some(variant);
        }
    }
    match best {
        Some(variant) => Lookup::Found(variant.entry.0),
        None if known => Lookup::VersionNotSufficient,
        None => Lookup::SymbolNotFound,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_newest_variant_not_newer_than_version() {
        assert_eq!(lookup(b"cuMemAlloc", 3020, false), Lookup::Found(cuMemAlloc_v2 as *const c_void));
        assert_eq!(lookup(b"cuMemAlloc", 3010, true), Lookup::Found(cuMemAlloc as *const c_void));
        assert_eq!(
            lookup(b"cuDeviceGetUuid", 11040, false),
            Lookup::Found(cuDeviceGetUuid_v2 as *const c_void)
        );
        assert_eq!(lookup(b"cuGetProcAddress", 11000, false), Lookup::VersionNotSufficient);
        assert_eq!(lookup(b"cuMemAlloc_v2", 13000, false), Lookup::SymbolNotFound);
        assert_eq!(lookup(b"cuNope", 13000, false), Lookup::SymbolNotFound);
    }
}
