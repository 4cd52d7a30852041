//! The harness every test of the fake shares: builds the fake driver (release profile, into the target
//! directory cargo chose), loads it through `libcuda.so.1` / `libnvidia-ml.so.1` symlinks, and re-runs
//! a test as a child process with its own `FAKEGPU_*` settings (the fake reads its environment once
//! per process).

// Each test binary uses part of it.
#![allow(dead_code)]

use std::ffi::{CString, c_int, c_uint, c_void};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::ptr::null_mut;
use std::sync::OnceLock;

pub const CHILD: &str = "FAKEGPU_SMOKE_CHILD";
pub const SUCCESS: c_int = 0;

/// The target directory cargo chose for this build (`CARGO_TARGET_DIR`, `build.target-dir` or
/// `<workspace>/target`): cargo hands integration tests its `tmp/` folder.
pub fn target_dir() -> &'static Path {
    Path::new(env!("CARGO_TARGET_TMPDIR")).parent().expect("CARGO_TARGET_TMPDIR is <target>/tmp")
}

/// The fake, built once per test run with the release profile into this build's target directory
/// (`cargo test` builds no `cdylib`), and a folder of `libcuda.so.1`, `libcuda.so` and
/// `libnvidia-ml.so.1` links to it for the children's `LD_LIBRARY_PATH`.
pub fn fake() -> &'static (PathBuf, PathBuf) {
    static FAKE: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    FAKE.get_or_init(|| {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut build = Command::new(cargo);
        build.current_dir(env!("CARGO_MANIFEST_DIR"));
        build.args(["build", "--release", "-p", "fakegpu", "--target-dir"]).arg(target_dir());
        let status = build.status().expect("run cargo build");
        assert!(status.success(), "{build:?} failed: {status}");
        let library = target_dir().join("release/libfakegpu.so");
        let links = target_dir().join("fakegpu-smoke");
        std::fs::create_dir_all(&links).expect("create the driver link folder");
        for name in ["libcuda.so.1", "libcuda.so", "libnvidia-ml.so.1"] {
            // Linked under a private name, then renamed over the old link in one step.
            let tmp = links.join(format!(".{name}.{}", std::process::id()));
            let _ = std::fs::remove_file(&tmp);
            std::os::unix::fs::symlink(&library, &tmp).expect("symlink");
            std::fs::rename(&tmp, links.join(name)).expect("install symlink");
        }
        (library, links)
    })
}

pub fn library_path() -> &'static Path {
    &fake().0
}

/// A file of this test run under the target directory's `tmp/`, removed when dropped, pass or fail.
pub struct TempFile(PathBuf);

impl TempFile {
    pub fn new(name: &str) -> TempFile {
        let path = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("fakegpu-smoke-{}-{name}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        TempFile(path)
    }
}

impl std::ops::Deref for TempFile {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for TempFile {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

pub fn is_child() -> bool {
    std::env::var_os(CHILD).is_some()
}

/// Re-runs test `name` in a child process whose `LD_LIBRARY_PATH` holds driver symlinks to the fake, and
/// checks that it passed.
pub fn spawn_self(name: &str, env: &[(&str, &str)]) {
    run_child(name, env);
}

/// Runs test `name` in a child like `spawn_self` does, checks that it passed, and returns its stderr.
pub fn run_child(name: &str, env: &[(&str, &str)]) -> String {
    let dir = &fake().1;
    let mut command = Command::new(std::env::current_exe().expect("test binary path"));
    command.args(["--exact", name, "--nocapture", "--test-threads=1"]);
    for var in [
        "FAKEGPU_DEVICES",
        "FAKEGPU_MEMORY",
        "FAKEGPU_SHARED",
        "FAKEGPU_CUDA_ORDER",
        "FAKEGPU_PREEMPT",
        "FAKEGPU_UUIDS",
        "CUDA_VISIBLE_DEVICES",
    ] {
        command.env_remove(var);
    }
    command.env(CHILD, "1").env("LD_LIBRARY_PATH", dir).envs(env.iter().copied());
    let output = command.output().expect("spawn child");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && stdout.contains("1 passed"),
        "child {name} failed:\n{stdout}\n{stderr}"
    );
    stderr.into_owned()
}

/// A `dlopen` handle of the fake.
pub struct Driver(pub *mut c_void);

impl Driver {
    pub fn open(soname: &str) -> Driver {
        let name = CString::new(soname).expect("no NUL");
        // SAFETY: `name` is a NUL-terminated string; loading the fake runs no constructors of ours.
        let handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        assert!(!handle.is_null(), "dlopen({soname}) failed");
        Driver(handle)
    }

    pub fn address(&self, symbol: &str) -> *mut c_void {
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

/// cuInit, then retain device `ordinal`'s primary context and make it current.
pub fn bind_context(driver: &Driver, ordinal: c_int) {
    let init = function!(driver, cuInit: fn(c_uint) -> c_int);
    let retain = function!(driver, cuDevicePrimaryCtxRetain: fn(*mut *mut c_void, c_int) -> c_int);
    let set_current = function!(driver, cuCtxSetCurrent: fn(*mut c_void) -> c_int);
    let mut context = null_mut();
    assert_eq!(init(0), SUCCESS);
    assert_eq!(retain(&mut context, ordinal), SUCCESS);
    assert!(!context.is_null());
    assert_eq!(set_current(context), SUCCESS);
}

/// `CUmemAllocationProp` (32 bytes) and `CUmemPoolProps` (88 bytes) share these leading fields.
#[repr(C)]
pub struct MemoryProps {
    pub alloc_type: c_int,
    pub handle_types: c_int,
    pub location_type: c_int,
    pub location_id: c_int,
    pub win32: *mut c_void,
    pub tail: [u8; 64],
}

/// Pinned memory on CUDA ordinal `device`.
pub fn pinned_on(device: c_int) -> MemoryProps {
    MemoryProps {
        alloc_type: 1,
        handle_types: 0,
        location_type: 1,
        location_id: device,
        win32: null_mut(),
        tail: [0; 64],
    }
}
