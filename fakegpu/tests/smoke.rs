//! Loads the built fake driver through `libcuda.so.1` / `libnvidia-ml.so.1` symlinks and checks what it
//! answers. The fake reads its environment once per process, so each test re-runs this binary as a
//! child with its own `FAKEGPU_*` settings and runs its body there.

use std::ffi::{CStr, CString, c_char, c_int, c_uint, c_void};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::ptr::{null, null_mut};

const CHILD: &str = "FAKEGPU_SMOKE_CHILD";
const SUCCESS: c_int = 0;
const INVALID_VALUE: c_int = 1;
const OUT_OF_MEMORY: c_int = 2;
const NOT_INITIALIZED: c_int = 3;
const INVALID_DEVICE: c_int = 101;
const INVALID_CONTEXT: c_int = 201;
const NOT_FOUND: c_int = 500;
const NVML_UNINITIALIZED: c_int = 1;
const NVML_INVALID_ARGUMENT: c_int = 2;
const NVML_INSUFFICIENT_SIZE: c_int = 7;
const NVML_VERSION_MISMATCH: c_int = 25;
const MIB: u64 = 1 << 20;

/// The built fake: target/<profile>/libfakegpu.so next to this test's `deps/` folder, else the other
/// profile's (`cargo test` does not build a cdylib; `cargo build -p fakegpu` does).
fn library_path() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let profile_dir = exe.parent().and_then(Path::parent).expect("target/<profile>/deps/<test>");
    let target_dir = profile_dir.parent().expect("target/<profile>");
    let candidates = [profile_dir.to_path_buf(), target_dir.join("release"), target_dir.join("debug")];
    let found = candidates.iter().map(|dir| dir.join("libfakegpu.so")).find(|path| path.exists());
    found.unwrap_or_else(|| {
        panic!("no libfakegpu.so under {}: run `cargo build --release -p fakegpu`", target_dir.display())
    })
}

fn is_child() -> bool {
    std::env::var_os(CHILD).is_some()
}

/// Re-runs test `name` in a child process whose `LD_LIBRARY_PATH` holds driver symlinks to the fake.
fn spawn_self(name: &str, env: &[(&str, &str)]) {
    let dir = std::env::temp_dir().join(format!("fakegpu-smoke-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let library = library_path();
    for link in ["libcuda.so.1", "libcuda.so", "libnvidia-ml.so.1"] {
        let _ = std::fs::remove_file(dir.join(link));
        std::os::unix::fs::symlink(&library, dir.join(link)).expect("symlink");
    }
    let mut command = Command::new(std::env::current_exe().expect("test binary path"));
    command.args(["--exact", name, "--nocapture", "--test-threads=1"]);
    for var in
        ["FAKEGPU_DEVICES", "FAKEGPU_MEMORY", "FAKEGPU_SHARED", "FAKEGPU_CUDA_ORDER", "CUDA_VISIBLE_DEVICES"]
    {
        command.env_remove(var);
    }
    command.env(CHILD, "1").env("LD_LIBRARY_PATH", &dir).envs(env.iter().copied());
    let output = command.output().expect("spawn child");
    let _ = std::fs::remove_dir_all(&dir);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && stdout.contains("1 passed"),
        "child {name} failed:\n{stdout}\n{stderr}"
    );
}

/// A `dlopen` handle of the fake.
struct Driver(*mut c_void);

impl Driver {
    fn open(soname: &str) -> Driver {
        let name = CString::new(soname).expect("no NUL");
        // SAFETY: `name` is a NUL-terminated string; loading the fake runs no constructors of ours.
        let handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        assert!(!handle.is_null(), "dlopen({soname}) failed");
        Driver(handle)
    }

    fn address(&self, symbol: &str) -> *mut c_void {
        let name = CString::new(symbol).expect("no NUL");
        // SAFETY: `self.0` is a live handle from dlopen and `name` is NUL-terminated.
        let address = unsafe { libc::dlsym(self.0, name.as_ptr()) };
        assert!(!address.is_null(), "{symbol} is not exported");
        address
    }
}

/// `function!(driver, cuInit: fn(c_uint) -> c_int)` — the export, typed as a callable `extern "C" fn`.
macro_rules! function {
    ($driver:expr, $name:ident : fn($($arg:ty),*) -> $ret:ty) => {{
        let address = $driver.address(stringify!($name));
        // SAFETY: the type spells the export's C signature; these tests pass it only valid pointers or
        // deliberate NULLs, which the fake checks before use.
        unsafe { std::mem::transmute::<*mut c_void, extern "C" fn($($arg),*) -> $ret>(address) }
    }};
}

/// Reads a NUL-terminated string the fake returned or wrote.
fn text(ptr: *const c_char) -> String {
    assert!(!ptr.is_null());
    // SAFETY: the fake hands out NUL-terminated strings (static ones, or written into our buffers).
    unsafe { CStr::from_ptr(ptr) }.to_string_lossy().into_owned()
}

/// (used, peak, alloc_calls) of a physical device, read through the test hook.
fn stats(driver: &Driver, index: c_uint) -> Option<(u64, u64, u64)> {
    let hook = function!(driver, fakegpu_device_stats: fn(c_uint, *mut u64, *mut u64, *mut u64) -> c_int);
    let (mut used, mut peak, mut calls) = (0, 0, 0);
    (hook(index, &mut used, &mut peak, &mut calls) == 0).then_some((used, peak, calls))
}

/// cuInit, then retain device `ordinal`'s primary context and make it current.
fn bind_context(driver: &Driver, ordinal: c_int) {
    let init = function!(driver, cuInit: fn(c_uint) -> c_int);
    let retain = function!(driver, cuDevicePrimaryCtxRetain: fn(*mut *mut c_void, c_int) -> c_int);
    let set_current = function!(driver, cuCtxSetCurrent: fn(*mut c_void) -> c_int);
    let mut context = null_mut();
    assert_eq!(init(0), SUCCESS);
    assert_eq!(retain(&mut context, ordinal), SUCCESS);
    assert!(!context.is_null());
    assert_eq!(set_current(context), SUCCESS);
}

#[test]
fn memory_calls() {
    if !is_child() {
        return spawn_self("memory_calls", &[("FAKEGPU_MEMORY", "1m"), ("FAKEGPU_DEVICES", "2")]);
    }
    let cuda = Driver::open("libcuda.so.1");
    let init = function!(cuda, cuInit: fn(c_uint) -> c_int);
    let count = function!(cuda, cuDeviceGetCount: fn(*mut c_int) -> c_int);
    let alloc = function!(cuda, cuMemAlloc_v2: fn(*mut u64, usize) -> c_int);
    let free = function!(cuda, cuMemFree_v2: fn(u64) -> c_int);
    let info = function!(cuda, cuMemGetInfo_v2: fn(*mut usize, *mut usize) -> c_int);
    let alloc32 = function!(cuda, cuMemAlloc: fn(*mut c_uint, c_uint) -> c_int);
    let free32 = function!(cuda, cuMemFree: fn(c_uint) -> c_int);
    let get_info = || {
        let (mut free_bytes, mut total) = (0, 0);
        assert_eq!(info(&mut free_bytes, &mut total), SUCCESS);
        (free_bytes as u64, total as u64)
    };

    let (mut n, mut ptr) = (0, 0);
    assert_eq!(count(&mut n), NOT_INITIALIZED);
    assert_eq!(alloc(&mut ptr, 512), NOT_INITIALIZED);
    assert_eq!(init(1), INVALID_VALUE);
    assert_eq!(init(0), SUCCESS);
    assert_eq!((count(&mut n), n), (SUCCESS, 2));
    assert_eq!(count(null_mut()), INVALID_VALUE);
    assert_eq!(alloc(&mut ptr, 512), INVALID_CONTEXT);

    bind_context(&cuda, 0);
    let (mut a, mut b) = (0, 0);
    assert_eq!(alloc(&mut a, 512 << 10), SUCCESS);
    assert_eq!(alloc(&mut b, 512 << 10), SUCCESS);
    assert!(a != 0 && a != b && a % 512 == 0 && b % 512 == 0);
    assert_eq!(alloc(&mut ptr, 1), OUT_OF_MEMORY);
    assert_eq!(alloc(&mut ptr, 0), INVALID_VALUE);
    assert_eq!(alloc(null_mut(), 1), INVALID_VALUE);
    assert_eq!(get_info(), (0, MIB));
    assert_eq!(free(a), SUCCESS);
    assert_eq!(get_info(), (MIB / 2, MIB));
    assert_eq!(free(a), INVALID_VALUE);
    assert_eq!(free(0), INVALID_VALUE);
    assert_eq!(free(0xdead_0000), INVALID_VALUE);

    let mut small = 0;
    assert_eq!(alloc32(&mut small, 1000), SUCCESS);
    assert!(small != 0 && small % 512 == 0);
    assert_eq!(get_info(), (MIB / 2 - 1000, MIB));
    assert_eq!(free32(small), SUCCESS);

    // 2 + OOM + zero size + NULL + the 32-bit one; the call without a context never reached a device.
    assert_eq!(stats(&cuda, 0), Some((MIB / 2, MIB, 6)));
    assert_eq!(stats(&cuda, 1), Some((0, 0, 0)));
    assert_eq!(stats(&cuda, 2), None);

    bind_context(&cuda, 1);
    assert_eq!(alloc(&mut ptr, MIB as usize), SUCCESS);
    assert_eq!(get_info(), (0, MIB));
    assert_eq!(free(b), SUCCESS, "a free needs a context, not the allocating device's");
    assert_eq!(stats(&cuda, 0), Some((0, MIB, 6)));
    assert_eq!(stats(&cuda, 1), Some((MIB, MIB, 1)));
}

#[test]
fn proc_address_versions() {
    if !is_child() {
        // A second copy of the fake, preloaded, exports every name first; the fake must still hand out
        // its own addresses (it links with -Bsymbolic, like the real libcuda).
        let interposer =
            std::env::temp_dir().join(format!("fakegpu-smoke-{}-preload.so", std::process::id()));
        std::fs::copy(library_path(), &interposer).expect("copy the fake");
        spawn_self("proc_address_versions", &[("LD_PRELOAD", interposer.to_str().expect("UTF-8 path"))]);
        let _ = std::fs::remove_file(&interposer);
        return;
    }
    let cuda = Driver::open("libcuda.so.1");
    // SAFETY: RTLD_DEFAULT with a NUL-terminated name.
    let global = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"cuMemAlloc_v2".as_ptr()) };
    assert!(!global.is_null() && global != cuda.address("cuMemAlloc_v2"), "the preloaded copy comes first");
    let get_v1 = function!(cuda, cuGetProcAddress: fn(*const c_char, *mut *mut c_void, c_int, u64) -> c_int);
    let get_v2 = function!(cuda, cuGetProcAddress_v2: fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int) -> c_int);
    let query = |name: &CStr, version, flags| {
        let (mut pfn, mut status) = (std::ptr::dangling_mut::<c_void>(), -1);
        let result = get_v2(name.as_ptr(), &mut pfn, version, flags, &mut status);
        (result, pfn, status)
    };

    // Works before cuInit.
    assert_eq!(query(c"cuMemAlloc", 3020, 0), (SUCCESS, cuda.address("cuMemAlloc_v2"), 0));
    assert_eq!(query(c"cuMemAlloc", 13000, 2), (SUCCESS, cuda.address("cuMemAlloc_v2"), 0));
    assert_eq!(query(c"cuMemAlloc", 3010, 1), (SUCCESS, cuda.address("cuMemAlloc"), 0));
    assert_eq!(query(c"cuNoSuchFunction", 13000, 0), (NOT_FOUND, null_mut(), 1));
    assert_eq!(query(c"cuMemAlloc_v2", 13000, 0), (NOT_FOUND, null_mut(), 1));
    assert_eq!(query(c"cuGetProcAddress", 11000, 0), (NOT_FOUND, null_mut(), 2));
    assert_eq!(query(c"cuGetProcAddress", 12000, 0), (SUCCESS, cuda.address("cuGetProcAddress_v2"), 0));
    assert_eq!(query(c"cuMemAlloc", 13000, 4).0, INVALID_VALUE);

    let mut pfn = null_mut();
    let name = c"cuDevicePrimaryCtxRelease".as_ptr();
    assert_eq!(get_v1(name, &mut pfn, 10020, 0), SUCCESS);
    assert_eq!(pfn, cuda.address("cuDevicePrimaryCtxRelease"));
    assert_eq!(get_v2(name, &mut pfn, 11000, 0, null_mut()), SUCCESS);
    assert_eq!(pfn, cuda.address("cuDevicePrimaryCtxRelease_v2"));
    assert_ne!(cuda.address("cuDevicePrimaryCtxRelease"), cuda.address("cuDevicePrimaryCtxRelease_v2"));
    assert_ne!(cuda.address("cuDeviceGetUuid"), cuda.address("cuDeviceGetUuid_v2"));
    assert_ne!(cuda.address("nvmlInit"), cuda.address("nvmlInit_v2"));
    // SAFETY: `pfn` is the fake's cuDevicePrimaryCtxRelease_v2, whose C signature this is.
    let release = unsafe { std::mem::transmute::<*mut c_void, extern "C" fn(c_int) -> c_int>(pfn) };
    assert_eq!(release(0), NOT_INITIALIZED);
    let call_count = function!(cuda, fakegpu_call_count: fn(*const c_char) -> u64);
    assert_eq!(call_count(c"cuDevicePrimaryCtxRelease_v2".as_ptr()), 1);
    assert_eq!(call_count(c"cuDevicePrimaryCtxRelease".as_ptr()), 0);
    assert_eq!(call_count(c"cuGetProcAddress_v2".as_ptr()), 9);
    assert_eq!(call_count(c"noSuchExport".as_ptr()), 0);
    assert_eq!(get_v1(null(), &mut pfn, 13000, 0), INVALID_VALUE);
    assert_eq!(get_v1(name, null_mut(), 13000, 0), INVALID_VALUE);

    let version = function!(cuda, cuDriverGetVersion: fn(*mut c_int) -> c_int);
    let error_name = function!(cuda, cuGetErrorName: fn(c_int, *mut *const c_char) -> c_int);
    let error_string = function!(cuda, cuGetErrorString: fn(c_int, *mut *const c_char) -> c_int);
    let mut v = 0;
    assert_eq!((version(&mut v), v), (SUCCESS, 13000));
    let mut message = null();
    assert_eq!(error_name(OUT_OF_MEMORY, &mut message), SUCCESS);
    assert_eq!(text(message), "CUDA_ERROR_OUT_OF_MEMORY");
    assert_eq!(error_string(INVALID_CONTEXT, &mut message), SUCCESS);
    assert_eq!(text(message), "invalid device context");
    assert_eq!((error_string(12345, &mut message), message), (INVALID_VALUE, null()));
}

#[test]
fn nvml_and_cuda_identity() {
    if !is_child() {
        let env = [("FAKEGPU_DEVICES", "3"), ("FAKEGPU_MEMORY", "4g"), ("FAKEGPU_CUDA_ORDER", "reverse")];
        return spawn_self("nvml_and_cuda_identity", &env);
    }
    let nvml = Driver::open("libnvidia-ml.so.1");
    let init = function!(nvml, nvmlInit_v2: fn() -> c_int);
    let shutdown = function!(nvml, nvmlShutdown: fn() -> c_int);
    let count = function!(nvml, nvmlDeviceGetCount_v2: fn(*mut c_uint) -> c_int);
    let by_index = function!(nvml, nvmlDeviceGetHandleByIndex_v2: fn(c_uint, *mut *mut c_void) -> c_int);
    let get_uuid = function!(nvml, nvmlDeviceGetUUID: fn(*mut c_void, *mut c_char, c_uint) -> c_int);
    let memory = function!(nvml, nvmlDeviceGetMemoryInfo: fn(*mut c_void, *mut [u64; 3]) -> c_int);
    let memory_v2 = function!(nvml, nvmlDeviceGetMemoryInfo_v2: fn(*mut c_void, *mut [u64; 5]) -> c_int);
    let error_string = function!(nvml, nvmlErrorString: fn(c_int) -> *const c_char);

    let mut n = 0;
    assert_eq!(count(&mut n), NVML_UNINITIALIZED);
    assert_eq!((init(), init()), (SUCCESS, SUCCESS));
    assert_eq!((count(&mut n), n), (SUCCESS, 3));
    let mut device = null_mut();
    assert_eq!(by_index(3, &mut device), NVML_INVALID_ARGUMENT);
    assert_eq!(by_index(2, &mut device), SUCCESS);
    let mut buffer = [0 as c_char; 64];
    assert_eq!(get_uuid(device, buffer.as_mut_ptr(), 40), NVML_INSUFFICIENT_SIZE);
    assert_eq!(get_uuid(device, buffer.as_mut_ptr(), 41), SUCCESS);
    assert_eq!(text(buffer.as_ptr()), "GPU-face0000-0000-4e00-8000-000000000002");
    let mut not_ours = 0u64;
    let stranger = (&raw mut not_ours).cast();
    assert_eq!(get_uuid(stranger, buffer.as_mut_ptr(), 64), NVML_INVALID_ARGUMENT);
    assert_eq!(text(error_string(NVML_INSUFFICIENT_SIZE)), "Insufficient Size");

    // CUDA ordinal 0 is physical device 2 in reverse order; charge it and watch NVML.
    let cuda = Driver::open("libcuda.so.1");
    assert_eq!(cuda.0, nvml.0, "both sonames load the one fake");
    let cuda_uuid = function!(cuda, cuDeviceGetUuid_v2: fn(*mut [u8; 16], c_int) -> c_int);
    let cuda_name = function!(cuda, cuDeviceGetName: fn(*mut c_char, c_int, c_int) -> c_int);
    let alloc = function!(cuda, cuMemAlloc_v2: fn(*mut u64, usize) -> c_int);
    bind_context(&cuda, 0);
    let mut uuid = [0; 16];
    assert_eq!(cuda_uuid(&mut uuid, 0), SUCCESS);
    assert_eq!(uuid, [0xfa, 0xce, 0, 0, 0, 0, 0x4e, 0, 0x80, 0, 0, 0, 0, 0, 0, 2]);
    assert_eq!(cuda_name(buffer.as_mut_ptr(), 64, 0), SUCCESS);
    assert_eq!(text(buffer.as_ptr()), "Fake GPU 2");
    assert_eq!(cuda_name(buffer.as_mut_ptr(), 5, 2), SUCCESS);
    assert_eq!(text(buffer.as_ptr()), "Fake");
    let mut ptr = 0;
    assert_eq!(alloc(&mut ptr, 1 << 30), SUCCESS);

    let mut info = [0; 3];
    assert_eq!(memory(device, &mut info), SUCCESS);
    assert_eq!(info, [4 << 30, 3 << 30, 1 << 30]);
    let version = 40 | (2 << 24);
    let mut info2 = [version, 0, 9, 0, 0];
    assert_eq!(memory_v2(device, &mut info2), SUCCESS);
    assert_eq!(info2, [version, 4 << 30, 0, 3 << 30, 1 << 30]);
    let mut stale = [40 | (1 << 24), 0, 0, 0, 0];
    assert_eq!(memory_v2(device, &mut stale), NVML_VERSION_MISMATCH);
    assert_eq!(by_index(0, &mut device), SUCCESS);
    assert_eq!(memory(device, &mut info), SUCCESS);
    assert_eq!(info, [4 << 30, 4 << 30, 0]);

    assert_eq!((shutdown(), shutdown(), shutdown()), (SUCCESS, SUCCESS, NVML_UNINITIALIZED));
    assert_eq!(count(&mut n), NVML_UNINITIALIZED);
}

#[test]
fn visible_devices() {
    if !is_child() {
        let list = "3,GPU-face0000-0000-4e00-8000-000000000001,7,0";
        let env = [("FAKEGPU_DEVICES", "4"), ("FAKEGPU_MEMORY", "8g"), ("CUDA_VISIBLE_DEVICES", list)];
        return spawn_self("visible_devices", &env);
    }
    let cuda = Driver::open("libcuda.so.1");
    let count = function!(cuda, cuDeviceGetCount: fn(*mut c_int) -> c_int);
    let get = function!(cuda, cuDeviceGet: fn(*mut c_int, c_int) -> c_int);
    let uuid = function!(cuda, cuDeviceGetUuid: fn(*mut [u8; 16], c_int) -> c_int);
    let total32 = function!(cuda, cuDeviceTotalMem: fn(*mut c_uint, c_int) -> c_int);
    let total = function!(cuda, cuDeviceTotalMem_v2: fn(*mut usize, c_int) -> c_int);
    let context_device = function!(cuda, cuCtxGetDevice: fn(*mut c_int) -> c_int);
    let init = function!(cuda, cuInit: fn(c_uint) -> c_int);

    let (mut n, mut device) = (0, -1);
    assert_eq!(init(0), SUCCESS);
    assert_eq!(context_device(&mut device), INVALID_CONTEXT);
    assert_eq!((count(&mut n), n), (SUCCESS, 2), "the list stops at the invalid entry 7");
    assert_eq!((get(&mut device, 1), device), (SUCCESS, 1));
    assert_eq!(get(&mut device, 2), INVALID_DEVICE);
    let mut bytes = [0; 16];
    assert_eq!((uuid(&mut bytes, 0), bytes[15]), (SUCCESS, 3));
    assert_eq!((uuid(&mut bytes, 1), bytes[15]), (SUCCESS, 1));
    let (mut small, mut large) = (0, 0);
    assert_eq!((total32(&mut small, 1), small), (SUCCESS, u32::MAX));
    assert_eq!((total(&mut large, 1), large), (SUCCESS, 8 << 30));
    bind_context(&cuda, 1);
    assert_eq!((context_device(&mut device), device), (SUCCESS, 1));
}

#[test]
fn shared_ledger() {
    let path = std::env::temp_dir().join(format!("fakegpu-smoke-{}.ledger", std::process::id()));
    if !is_child() {
        let _ = std::fs::remove_file(&path);
        let file = path.to_str().expect("UTF-8 temp path");
        for step in ["hold", "check"] {
            let env = [("FAKEGPU_SHARED", file), ("FAKEGPU_MEMORY", "1m"), ("SMOKE_STEP", step)];
            spawn_self("shared_ledger", &env);
        }
        let metadata = std::fs::metadata(&path).expect("ledger file");
        let _ = std::fs::remove_file(&path);
        assert_eq!(metadata.len(), 512);
        assert_eq!(std::os::unix::fs::PermissionsExt::mode(&metadata.permissions()) & 0o777, 0o666);
        return;
    }
    let cuda = Driver::open("libcuda.so.1");
    let alloc = function!(cuda, cuMemAlloc_v2: fn(*mut u64, usize) -> c_int);
    bind_context(&cuda, 0);
    let mut ptr = 0;
    if std::env::var("SMOKE_STEP").as_deref() == Ok("hold") {
        // Exit without freeing: a dead process's bytes stay counted in the file.
        assert_eq!(alloc(&mut ptr, 768 << 10), SUCCESS);
        return;
    }
    assert_eq!(stats(&cuda, 0), Some((768 << 10, 768 << 10, 1)));
    assert_eq!(alloc(&mut ptr, 512 << 10), OUT_OF_MEMORY);
    assert_eq!(alloc(&mut ptr, 256 << 10), SUCCESS);
    assert_eq!(stats(&cuda, 0), Some((MIB, MIB, 3)));
}
