//! `vgpu-smi doctor`: checks an installation against the driver it will run on, so that a driver
//! release adding an allocation entry point is caught before memory leaks past the budgets.
//!
//! It lists, for every entry point `libvgpu.so` hooks, the variant the driver hands out through
//! `cuGetProcAddress` at CUDA 11.3, 12.0 and the driver's own version, and whether that variant is
//! hooked; it lists the driver's exported `cuMem*`, `cuArray*`, `cuMipmapped*`, `cuGraph*`,
//! `cuCtx*` and `cuGreenCtx*` names that are neither hooked nor known to create no device memory;
//! and it checks the environment. Exit code 0 only when everything is known and healthy.

use std::collections::BTreeSet;
use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::path::{Path, PathBuf};

use crate::elf;
use crate::swap_tables::SwapView;

/// Prefixes of the driver's names that can create device memory.
const WATCHED: [&str; 6] = ["cuMem", "cuArray", "cuMipmapped", "cuGraph", "cuCtx", "cuGreenCtx"];

/// Names under [`WATCHED`] that libvgpu does not hook because they create no device memory: they
/// copy, set, query, map or unmap what exists, import what another allocation made (not new
/// memory), allocate host memory, or build and run graphs whose memory is charged when the graph
/// is instantiated (allocation nodes). Checked against the exports of driver 580.159.04 (CUDA 13.0).
const NO_DEVICE_MEMORY: &[&str] = &[
    // Queries, attributes and access.
    "cuArray3DGetDescriptor",
    "cuArrayGetDescriptor",
    "cuArrayGetMemoryRequirements",
    "cuArrayGetPlane",
    "cuArrayGetSparseProperties",
    "cuMipmappedArrayGetLevel",
    "cuMipmappedArrayGetMemoryRequirements",
    "cuMipmappedArrayGetSparseProperties",
    "cuMemGetAccess",
    "cuMemGetAddressRange",
    "cuMemGetAllocationGranularity",
    "cuMemGetAllocationPropertiesFromHandle",
    "cuMemGetAttribute",
    "cuMemGetDefaultMemPool",
    "cuMemGetHandleForAddressRange",
    "cuMemGetInfo",
    "cuMemGetMemPool",
    "cuMemHostGetDevicePointer",
    "cuMemHostGetFlags",
    "cuMemRangeGetAttribute",
    "cuMemRangeGetAttributes",
    "cuMemSetAccess",
    "cuMemSetMemPool",
    "cuMemPoolGetAccess",
    "cuMemPoolGetAttribute",
    "cuMemPoolSetAccess",
    "cuMemPoolSetAttribute",
    "cuMemAdvise",
    // Address space, mappings and handles of memory that exists (VMM creation is hooked).
    "cuMemAddressReserve",
    "cuMemAddressFree",
    "cuMemExportToShareableHandle",
    "cuMemImportFromShareableHandle",
    "cuMemMapArrayAsync",
    "cuMemPoolExportPointer",
    "cuMemPoolExportToShareableHandle",
    "cuMemPoolImportFromShareableHandle",
    "cuMemPoolImportPointer",
    // Pools: created empty, charged as they grow (their allocations are hooked).
    "cuMemPoolCreate",
    "cuMemPoolDestroy",
    "cuMemPoolTrimTo",
    // Host memory.
    "cuMemAllocHost",
    "cuMemFreeHost",
    "cuMemHostAlloc",
    "cuMemHostRegister",
    "cuMemHostUnregister",
    // Moving and setting bytes, prefetching, discarding, decompressing.
    "cuMemPrefetchAsync",
    "cuMemPrefetchBatchAsync",
    "cuMemDiscardBatchAsync",
    "cuMemDiscardAndPrefetchBatchAsync",
    "cuMemBatchDecompressAsync",
    // Contexts: current-context management and queries (creation is hooked).
    "cuCtxAttach",
    "cuCtxDetach",
    "cuCtxDisablePeerAccess",
    "cuCtxEnablePeerAccess",
    "cuCtxFromGreenCtx",
    "cuCtxGetApiVersion",
    "cuCtxGetCacheConfig",
    "cuCtxGetCurrent",
    "cuCtxGetDevice",
    "cuCtxGetDevResource",
    "cuCtxGetExecAffinity",
    "cuCtxGetFlags",
    "cuCtxGetId",
    "cuCtxGetLimit",
    "cuCtxGetSharedMemConfig",
    "cuCtxGetStreamPriorityRange",
    "cuCtxPopCurrent",
    "cuCtxPushCurrent",
    "cuCtxRecordEvent",
    "cuCtxResetPersistingL2Cache",
    "cuCtxSetCacheConfig",
    "cuCtxSetCurrent",
    "cuCtxSetFlags",
    "cuCtxSetLimit",
    "cuCtxSetSharedMemConfig",
    "cuCtxSynchronize",
    "cuCtxWaitEvent",
    "cuGreenCtxDestroy",
    "cuGreenCtxGetDevResource",
    "cuGreenCtxGetId",
    "cuGreenCtxRecordEvent",
    "cuGreenCtxStreamCreate",
    "cuGreenCtxWaitEvent",
    // Graph interop with graphics APIs: maps memory the other API made.
    "cuGraphicsEGLRegisterImage",
    "cuGraphicsGLRegisterBuffer",
    "cuGraphicsGLRegisterImage",
    "cuGraphicsMapResources",
    "cuGraphicsResourceGetMappedEglFrame",
    "cuGraphicsResourceGetMappedMipmappedArray",
    "cuGraphicsResourceGetMappedPointer",
    "cuGraphicsResourceSetMapFlags",
    "cuGraphicsSubResourceGetMappedArray",
    "cuGraphicsUnmapResources",
    "cuGraphicsUnregisterResource",
    "cuGraphicsVDPAURegisterOutputSurface",
    "cuGraphicsVDPAURegisterVideoSurface",
];

/// Families under [`WATCHED`] that create no device memory whatever their suffix: copies, sets
/// and graph construction (a graph's memory is charged when it is instantiated).
const NO_DEVICE_MEMORY_PREFIXES: &[&str] =
    &["cuMemcpy", "cuMemset", "cuGraphAdd", "cuGraphExec", "cuGraphNode"];

/// Graph calls outside those families that build, edit or run graphs without device memory of
/// their own.
const GRAPH_NO_DEVICE_MEMORY: &[&str] = &[
    "cuGraphBatchMemOpNodeGetParams",
    "cuGraphBatchMemOpNodeSetParams",
    "cuGraphChildGraphNodeGetGraph",
    "cuGraphClone",
    "cuGraphConditionalHandleCreate",
    "cuGraphCreate",
    "cuGraphDebugDotPrint",
    "cuGraphDestroy",
    "cuGraphDestroyNode",
    "cuGraphEventRecordNodeGetEvent",
    "cuGraphEventRecordNodeSetEvent",
    "cuGraphEventWaitNodeGetEvent",
    "cuGraphEventWaitNodeSetEvent",
    "cuGraphExternalSemaphoresSignalNodeGetParams",
    "cuGraphExternalSemaphoresSignalNodeSetParams",
    "cuGraphExternalSemaphoresWaitNodeGetParams",
    "cuGraphExternalSemaphoresWaitNodeSetParams",
    "cuGraphGetEdges",
    "cuGraphGetNodes",
    "cuGraphGetRootNodes",
    "cuGraphHostNodeGetParams",
    "cuGraphHostNodeSetParams",
    "cuGraphKernelNodeCopyAttributes",
    "cuGraphKernelNodeGetAttribute",
    "cuGraphKernelNodeGetParams",
    "cuGraphKernelNodeSetAttribute",
    "cuGraphKernelNodeSetParams",
    "cuGraphMemAllocNodeGetParams",
    "cuGraphMemcpyNodeGetParams",
    "cuGraphMemcpyNodeSetParams",
    "cuGraphMemFreeNodeGetParams",
    "cuGraphMemsetNodeGetParams",
    "cuGraphMemsetNodeSetParams",
    "cuGraphReleaseUserObject",
    "cuGraphRemoveDependencies",
    "cuGraphRetainUserObject",
    "cuGraphUpload",
];

/// The 32-bit-size ABIs of CUDA 3.1 and before, which the driver hands out only to a caller asking
/// `cuGetProcAddress` for a version below 3.2: libvgpu passes them through uncharged (no runtime
/// it supports asks for them). Reported, not failed.
const LEGACY_UNHOOKED: &[&str] = &[
    "cuMemAlloc",
    "cuMemAllocPitch",
    "cuMemFree",
    "cuArrayCreate",
    "cuArray3DCreate",
    "cuCtxCreate",
    "cuCtxDestroy",
];

/// How a driver export is classified.
#[derive(Debug, PartialEq, Eq)]
pub enum Class {
    Hooked,
    NoDeviceMemory,
    Legacy,
    Unclassified,
}

/// What no hook in the process holds, said on every run.
pub const OUTSIDE_THE_HOOKS: &str = "not held by libvgpu: OpenGL and EGL, video codecs (NVENC/NVDEC) and programs that \
reach /dev/nvidia* without the driver's libraries take device memory no hook sees (a CUDA process \
charges what its driver holds beyond its allocations, after the fact); only the node agent's policy \
(vgpu-smi serve --policy kill-newest, on the node) holds a container to its budget there, or MIG";

/// Which developer tools run under libvgpu with the budget held, said on every run
/// (docs/developer-tools.md).
pub const DEVELOPER_TOOLS: &str = "developer tools: Nsight Compute (ncu), Nsight Systems (nsys), compute-sanitizer, \
cuda-gdb and CUPTI profilers (torch.profiler) run under libvgpu with the budget held, in LD_PRELOAD and \
/etc/ld.so.preload; ncu's kernel replay copies device memory inside the driver, which is charged to the container \
while it lasts but cannot be refused (--replay-mode application copies none) (docs/developer-tools.md)";

/// The name without its ABI suffixes (`_v2`, `_ptsz`, `_ptds`, `_v2_ptds`).
pub fn base_name(name: &str) -> &str {
    let mut base = name;
    for suffix in ["_ptsz", "_ptds"] {
        base = base.strip_suffix(suffix).unwrap_or(base);
    }
    if let Some(at) = base.rfind("_v")
        && base[at + 2..].chars().all(|c| c.is_ascii_digit())
        && at + 2 < base.len()
    {
        base = &base[..at];
    }
    base
}

/// Classifies the driver export `name`, given the names libvgpu exports (its hooks).
pub fn classify(name: &str, hooked: &BTreeSet<String>) -> Class {
    if hooked.contains(name) {
        return Class::Hooked;
    }
    let base = base_name(name);
    if NO_DEVICE_MEMORY.contains(&base)
        || GRAPH_NO_DEVICE_MEMORY.contains(&base)
        || NO_DEVICE_MEMORY_PREFIXES.iter().any(|prefix| name.starts_with(prefix))
    {
        return Class::NoDeviceMemory;
    }
    // An older ABI of a hooked entry point (the driver's own function serves older callers).
    let newer_is_hooked = hooked.iter().any(|h| base_name(h) == base && h != name);
    if LEGACY_UNHOOKED.contains(&name) || (newer_is_hooked && !name.contains("_v") && name == base) {
        return Class::Legacy;
    }
    Class::Unclassified
}

type CuInit = unsafe extern "C" fn(u32) -> c_int;
type CuDriverGetVersion = unsafe extern "C" fn(*mut c_int) -> c_int;
type CuDeviceGetCount = unsafe extern "C" fn(*mut c_int) -> c_int;
type CuDeviceGetAttribute = unsafe extern "C" fn(*mut c_int, c_int, c_int) -> c_int;
/// `CU_DEVICE_ATTRIBUTE_MPS_ENABLED` (cuda.h, CUDA 12.3+).
const MPS_ENABLED: c_int = 133;
type CuGetProcAddressV2 =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int) -> c_int;
type CuGetProcAddress = unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64) -> c_int;

const PER_THREAD_DEFAULT_STREAM: u64 = 1 << 1;

/// The real CUDA driver, opened by this process (which must not have libvgpu preloaded).
struct Driver {
    handle: *mut c_void,
    path: PathBuf,
    version: c_int,
    proc_v2: Option<CuGetProcAddressV2>,
    proc_v1: Option<CuGetProcAddress>,
}

impl Driver {
    fn open() -> Result<Driver, String> {
        // SAFETY: a NUL-terminated name; RTLD_NOW|RTLD_LOCAL has no other preconditions.
        let handle = unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            return Err("libcuda.so.1 not found: no NVIDIA driver on this machine".into());
        }
        let mut driver = Driver { handle, path: PathBuf::new(), version: 0, proc_v2: None, proc_v1: None };
        let init = driver.symbol(c"cuInit");
        let get_version = driver.symbol(c"cuDriverGetVersion");
        // SAFETY: each address is the driver's function of the type it is cast to (cuda.h).
        unsafe {
            driver.proc_v2 = driver.symbol(c"cuGetProcAddress_v2").map(|f| std::mem::transmute(f));
            driver.proc_v1 = driver.symbol(c"cuGetProcAddress").map(|f| std::mem::transmute(f));
            if let Some(init) = init {
                std::mem::transmute::<*mut c_void, CuInit>(init)(0);
            }
            if let Some(get_version) = get_version {
                std::mem::transmute::<*mut c_void, CuDriverGetVersion>(get_version)(&mut driver.version);
            }
        }
        driver.path = init.and_then(library_of).unwrap_or_else(|| PathBuf::from("libcuda.so.1"));
        Ok(driver)
    }

    fn symbol(&self, name: &CStr) -> Option<*mut c_void> {
        // SAFETY: a live handle and a NUL-terminated name.
        let address = unsafe { libc::dlsym(self.handle, name.as_ptr()) };
        (!address.is_null()).then_some(address)
    }

    /// The address `cuGetProcAddress` gives for `base` at `version`.
    fn proc_address(&self, base: &str, version: c_int, per_thread: bool) -> Option<*mut c_void> {
        let name = CString::new(base).ok()?;
        let flags = if per_thread { PER_THREAD_DEFAULT_STREAM } else { 0 };
        let mut address = std::ptr::null_mut();
        // SAFETY: valid name, out-pointers and flags, per cuGetProcAddress's contract.
        let status = unsafe {
            match (self.proc_v2, self.proc_v1) {
                (Some(f), _) => {
                    let mut found = 0;
                    f(name.as_ptr(), &mut address, version, flags, &mut found)
                }
                (None, Some(f)) => f(name.as_ptr(), &mut address, version, flags),
                (None, None) => return None,
            }
        };
        (status == 0 && !address.is_null()).then_some(address)
    }
}

/// The file the loaded object holding `address` came from.
fn library_of(address: *mut c_void) -> Option<PathBuf> {
    // SAFETY: `info` is a valid out-structure; dladdr only reads `address`.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::dladdr(address, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dladdr gave a NUL-terminated file name.
    let name = unsafe { CStr::from_ptr(info.dli_fname) };
    Some(PathBuf::from(name.to_string_lossy().into_owned()))
}

/// Runs the check. `library` is the installed `libvgpu.so`, `region` the container's region file.
/// Prints the report; returns the exit code: 0 healthy, 1 something unknown or unhealthy, 3 a file
/// it needs is missing.
pub fn run(library: &Path, region: &Path) -> i32 {
    let mut healthy = true;
    // The file is opened as node-side tools open a tenant's (a link there is refused).
    let config = vgpu_ledger::config::Config::from_env();
    if std::fs::metadata(region).is_ok_and(|m| m.is_dir()) {
        let listing = crate::containers::load(region);
        println!(
            "regions: {}: a folder of {} container(s) with a region, {} without",
            region.display(),
            listing.containers.len(),
            listing.without_region.len()
        );
    } else if std::fs::symlink_metadata(region).is_ok() {
        match crate::containers::read_single(region) {
            (Ok(snapshot), swap) => {
                let dead = snapshot.leases.iter().filter(|lease| !lease.alive).count();
                println!(
                    "region: {}: {} device(s), {} live process(es), {dead} dead (vgpu-smi reclaim gives their bytes back)",
                    region.display(),
                    snapshot.devices.len(),
                    snapshot.leases.len() - dead
                );
                if snapshot.devices.iter().any(|d| d.overcommit) || overcommitted(&config) {
                    println!("{}", overcommit_mode(swap.as_ref()));
                }
            }
            (Err(error), _) => {
                println!("region: {error}");
                healthy = false;
            }
        }
    } else {
        println!("region: {} does not exist yet (the first budgeted process creates it)", region.display());
        if overcommitted(&config) {
            println!("{}", overcommit_mode(None));
        }
    }
    shared_cgroup_lines(region);
    println!("libvgpu: {}", library.display());
    layout_lines(library);
    let hooked: BTreeSet<String> = match elf::exported_functions(library) {
        Ok(names) => names.into_iter().filter(|n| n.starts_with("cu") || n.starts_with("nvml")).collect(),
        Err(error) => {
            println!("  cannot read its exports: {error}");
            return 3;
        }
    };
    println!("  {} hooked entry points", hooked.len());
    for problem in &config.problems {
        println!("environment: {problem}");
        healthy = false;
    }
    let driver = match Driver::open() {
        Ok(driver) => driver,
        Err(error) => {
            println!("driver: {error}");
            return 3;
        }
    };
    let version = driver.version;
    println!("driver: {} (CUDA {}.{})", driver.path.display(), version / 1000, version % 1000 / 10);
    if !mps_lines(&driver) {
        healthy = false;
    }

    // Which variant each hooked entry point resolves to, by CUDA version.
    let versions = [(11030, "11.3"), (12000, "12.0"), (version, "driver")];
    println!("\n{:<40} {:>28} {:>28} {:>28}", "hooked entry point", "at 11.3", "at 12.0", "at the driver's");
    let cu_hooks: Vec<&String> = hooked.iter().filter(|n| n.starts_with("cu")).collect();
    let bases: BTreeSet<(&str, bool)> =
        cu_hooks.iter().map(|n| (base_name(n), n.ends_with("_ptsz") || n.ends_with("_ptds"))).collect();
    for (base, per_thread) in bases {
        let mut cells = Vec::new();
        for &(at, _) in &versions {
            let cell = match driver.proc_address(base, at, per_thread) {
                None => "-".to_owned(),
                Some(address) => {
                    let variant = variant_named(&driver, base, address).unwrap_or_else(|| "?".to_owned());
                    let mark = if hooked.contains(&variant) { "hooked" } else { "driver's" };
                    if at == version && !hooked.contains(&variant) {
                        healthy = false; // the driver's own version hands out a variant we miss
                    }
                    format!("{variant} ({mark})")
                }
            };
            cells.push(cell);
        }
        let label = if per_thread { format!("{base} (per-thread)") } else { base.to_owned() };
        println!("{label:<40} {:>28} {:>28} {:>28}", cells[0], cells[1], cells[2]);
    }

    // The driver's names libvgpu has not classified.
    let mut exports = BTreeSet::new();
    for file in [driver.path.clone(), PathBuf::from(library_file_of_handle(&driver))] {
        if let Ok(names) = elf::exported_functions(&file) {
            exports.extend(names);
        }
    }
    let watched: Vec<&String> = exports.iter().filter(|n| WATCHED.iter().any(|p| n.starts_with(p))).collect();
    let mut legacy = Vec::new();
    let mut unknown = Vec::new();
    for name in &watched {
        match classify(name, &hooked) {
            Class::Legacy => legacy.push(name.as_str()),
            Class::Unclassified => unknown.push(name.as_str()),
            Class::Hooked | Class::NoDeviceMemory => {}
        }
    }
    println!(
        "\n{} watched driver exports ({}); legacy ABIs passed through: {}",
        watched.len(),
        WATCHED.join("* "),
        legacy.join(" ")
    );
    if unknown.is_empty() {
        println!("every one is hooked or known to create no device memory");
    } else {
        healthy = false;
        println!("NOT CLASSIFIED (may create device memory libvgpu does not charge): {}", unknown.join(" "));
    }
    println!("\n{OUTSIDE_THE_HOOKS}");
    println!("{DEVELOPER_TOOLS}");
    if let Some(injection) = std::env::var_os("CUDA_INJECTION64_PATH").filter(|path| !path.is_empty()) {
        println!(
            "  CUDA_INJECTION64_PATH={} is set here: the driver loads that tool into every CUDA program",
            injection.to_string_lossy()
        );
    }
    println!("\n{}", if healthy { "healthy" } else { "NOT healthy" });
    if healthy { 0 } else { 1 }
}

/// Says how the node put `library` into this container (HAMi's layout or KAI-Scheduler's), where
/// a process here finds its budget, and, under KAI's, whether this container can replace the
/// library every pod loads.
fn layout_lines(library: &Path) {
    let found = vgpu_ledger::sources::for_library(library);
    println!("  layout: {}", found.layout);
    match &found.config.fail_closed {
        Some(why) => println!("  a process here fails closed: {why}"),
        None => println!("  a process here takes its budget from {}", found.source),
    }
    if matches!(found.layout, vgpu_ledger::sources::Layout::SharedFolder(_)) {
        println!("  its region: {}", found.config.shared_cache.display());
        if writable(library) {
            println!(
                "  {} can be written from here: under this layout any pod can replace the library every \
                 pod on the node loads (mount it read-only; docs/threat-model.md)",
                library.display()
            );
        }
    }
}

/// Whether this process may write `path` (its mount and permissions allow it).
fn writable(path: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(name) = CString::new(path.as_os_str().as_bytes()) else { return false };
    // SAFETY: `name` is NUL-terminated; access reads nothing else.
    unsafe { libc::access(name.as_ptr(), libc::W_OK) == 0 }
}

/// Says which cgroups processes of several budgets share, by the node agent's accounting of the
/// region(s) at `path` (docs/node-agent.md): there a process's cgroup says nothing of whose it is.
fn shared_cgroup_lines(path: &Path) {
    let listing = crate::containers::load(path);
    let accounting = crate::accounting::account(&listing, &crate::physical::Driver::start().view());
    for shared in &accounting.shared_cgroups {
        println!(
            "node agent: budgets share a cgroup: {shared}: the cgroup maps no process there, and the node's \
             policy (vgpu-smi serve --policy) acts there only on lease holders and never freezes it"
        );
    }
}

/// This environment overcommits a budgeted device (`CUDA_OVERSUBSCRIBE` and a budget).
fn overcommitted(config: &vgpu_ledger::config::Config) -> bool {
    config.overcommit && config.any_memory_limit()
}

/// Which overcommit mode is active, from the swap table in the region (`None`: it has none):
/// the node's arbiter swaps idle processes out whole while its heartbeat is fresh; without one,
/// overcommitted memory spills through unified memory.
fn overcommit_mode(swap: Option<&Result<SwapView, String>>) -> String {
    const SPILLS: &str =
        "no swap arbiter: overcommitted memory spills through unified memory (CUDA_OVERSUBSCRIBE)";
    match swap {
        Some(Ok(view)) => match view.since_arbiter() {
            Some(since) if view.arbiter_active() => format!(
                "swap: the node's arbiter (pid {}) last ran {} ms ago: idle processes' memory is swapped out whole",
                view.arbiter_pid,
                since.as_millis()
            ),
            Some(since) => {
                format!("{SPILLS}\n  (the arbiter's last pass was {:.1} s ago)", since.as_secs_f64())
            }
            None => format!("{SPILLS}\n  (no arbiter has run on this container's swap table)"),
        },
        Some(Err(why)) => format!("{SPILLS}\n  (the swap table cannot be read: {why})"),
        None => format!("{SPILLS}\n  (no swap table in the region yet: its processes make it)"),
    }
}

/// Prints whether each device runs its contexts under MPS, and where MPS clients look for the
/// control daemon. False when an MPS thread percentage holds a device under MPS below its compute
/// share (a cap at or above the share is combined with it; docs/compute-limit.md, "MPS nodes").
fn mps_lines(driver: &Driver) -> bool {
    let pipes = std::env::var("CUDA_MPS_PIPE_DIRECTORY").unwrap_or_else(|_| "/tmp/nvidia-mps".to_owned());
    let control = Path::new(&pipes).join("control");
    let daemon =
        if control.exists() { "a control daemon's pipe is there" } else { "no control daemon's pipe there" };
    println!("MPS: pipe directory {pipes} ({daemon})");
    let count = driver.symbol(c"cuDeviceGetCount").map_or(0, |f| {
        let mut count = 0;
        // SAFETY: the driver's cuDeviceGetCount (cuda.h) with a valid out-pointer.
        let status = unsafe { std::mem::transmute::<*mut c_void, CuDeviceGetCount>(f)(&mut count) };
        if status == 0 { count } else { 0 }
    });
    let attribute = driver.symbol(c"cuDeviceGetAttribute");
    let mut active = Vec::new();
    for device in 0..count {
        let value = attribute.and_then(|f| {
            let mut value = 0;
            // SAFETY: the driver's cuDeviceGetAttribute (cuda.h): an `int` out-pointer, an integer
            // attribute and an ordinal below the device count.
            let status = unsafe {
                std::mem::transmute::<*mut c_void, CuDeviceGetAttribute>(f)(&mut value, MPS_ENABLED, device)
            };
            (status == 0).then_some(value)
        });
        let state = match value {
            Some(0) => "not active",
            Some(_) => {
                active.push(device as usize);
                "active (contexts are shared through an MPS server)"
            }
            None => "unknown (the driver does not answer CU_DEVICE_ATTRIBUTE_MPS_ENABLED, CUDA 12.3+)",
        };
        println!("MPS on device {device}: {state}");
    }
    let config = vgpu_ledger::config::Config::from_env();
    if !config.any_compute_limit() {
        return true;
    }
    let Some((threads, cap)) = vgpu_ledger::config::mps_thread_percentage() else {
        if !active.is_empty() {
            println!(
                "hint: a compute share under MPS without CUDA_MPS_ACTIVE_THREAD_PERCENTAGE holds as GPU time; set \
                 it to the share too, and MPS keeps the GPU busier (docs/compute-limit.md, \"MPS nodes\")"
            );
        }
        return true;
    };
    let under: Vec<String> = active
        .iter()
        .filter_map(|&d| {
            config
                .sm_share(d)
                .filter(|&share| cap < share as f64)
                .map(|share| format!("{share} on device {d}"))
        })
        .collect();
    if under.is_empty() {
        println!(
            "environment: CUDA_DEVICE_SM_LIMIT and CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={threads} are both set: \
             combined (kernels are charged the part of the SMs they may use)"
        );
        return true;
    }
    println!(
        "environment: CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={threads} is below the compute share ({}) under MPS: \
         the container gets about {threads} %; set it to at least the share, or unset it",
        under.join(", ")
    );
    false
}

/// The exported name of `base`'s family whose address is `address`.
fn variant_named(driver: &Driver, base: &str, address: *mut c_void) -> Option<String> {
    let mut candidates = vec![base.to_owned()];
    for v in 2..10 {
        candidates.push(format!("{base}_v{v}"));
    }
    let plain = candidates.clone();
    for c in plain {
        candidates.push(format!("{c}_ptsz"));
        candidates.push(format!("{c}_ptds"));
    }
    candidates
        .into_iter()
        .find(|name| CString::new(name.as_str()).ok().and_then(|c| driver.symbol(&c)) == Some(address))
}

/// The file `libcuda.so.1` itself names (a shim may forward to another library: both are read).
fn library_file_of_handle(driver: &Driver) -> String {
    let mut map: *mut libc::c_void = std::ptr::null_mut();
    // SAFETY: RTLD_DI_LINKMAP writes a `struct link_map *` for a live handle.
    if unsafe { libc::dlinfo(driver.handle, libc::RTLD_DI_LINKMAP, (&raw mut map).cast()) } != 0
        || map.is_null()
    {
        return String::new();
    }
    // SAFETY: glibc's `struct link_map` starts with l_addr (a pointer-sized integer) then l_name.
    let name = unsafe { *(map.cast::<*const c_char>().add(1)) };
    if name.is_null() {
        return String::new();
    }
    // SAFETY: l_name is a NUL-terminated path.
    unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suffixes_come_off() {
        assert_eq!(base_name("cuMemAlloc_v2"), "cuMemAlloc");
        assert_eq!(base_name("cuMemcpyDtoD_v2_ptds"), "cuMemcpyDtoD");
        assert_eq!(base_name("cuLaunchKernel_ptsz"), "cuLaunchKernel");
        assert_eq!(base_name("cuMemAlloc_v9"), "cuMemAlloc");
        assert_eq!(base_name("cuMemAdvise"), "cuMemAdvise");
        assert_eq!(base_name("cuGraphAddNode_v2"), "cuGraphAddNode");
    }

    #[test]
    fn a_new_allocation_variant_is_not_classified() {
        let hooked: BTreeSet<String> =
            ["cuMemAlloc_v2", "cuMemFree_v2", "cuCtxCreate_v4"].iter().map(|s| s.to_string()).collect();
        assert_eq!(classify("cuMemAlloc_v2", &hooked), Class::Hooked);
        assert_eq!(classify("cuMemAlloc", &hooked), Class::Legacy);
        assert_eq!(classify("cuMemcpyDtoD_v2_ptds", &hooked), Class::NoDeviceMemory);
        assert_eq!(classify("cuMemHostAlloc", &hooked), Class::NoDeviceMemory);
        assert_eq!(classify("cuMemAlloc_v9", &hooked), Class::Unclassified);
        assert_eq!(
            classify("cuGreenCtxCreate", &hooked),
            Class::Unclassified,
            "a green context costs memory"
        );
        assert_eq!(classify("cuMemSomethingNew", &hooked), Class::Unclassified);
    }
}
