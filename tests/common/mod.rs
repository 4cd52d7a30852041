//! Shared test harness: builds libvgpu, the fake driver and the C clients once per test binary
//! (the libraries with the release profile, everything into the target directory cargo chose),
//! then runs a client as a separate process under `LD_PRELOAD`, exactly as a container would.
//!
//! With `VGPU_TEST_TARGET` set to another architecture's Rust target triple
//! (`aarch64-unknown-linux-gnu`), what the tests load is built for that one instead and every
//! client runs under an emulator: see [`Cross`] and `ci/aarch64`.

#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Output, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;

/// Paths of everything a test process needs.
pub struct Artifacts {
    pub libvgpu: PathBuf,
    /// Directory with libcuda.so.1, libcuda.so and libnvidia-ml.so.1 linking to the fake driver.
    pub fake_driver_dir: PathBuf,
    pub client: PathBuf,
    /// The launching client of the compute-limit tests.
    pub compute_client: PathBuf,
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Where tests keep their files: `<target>/tmp`, which cargo makes for integration tests and
/// benches. Nothing a test writes goes to the system's `/tmp`.
pub fn scratch_root() -> &'static Path {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
}

/// The target directory cargo chose for this build (`CARGO_TARGET_DIR`, `build.target-dir` or
/// `<workspace>/target`): cargo hands integration tests and benches its `tmp/` folder.
pub fn target_dir() -> PathBuf {
    scratch_root().parent().expect("CARGO_TARGET_TMPDIR is <target>/tmp").to_path_buf()
}

/// The architecture under test when it is not the host's: libvgpu, the fake driver and the clients
/// are built for `triple` and every client runs as `runner CLIENT ARGS` (qemu-user), with
/// `QEMU_LD_PREFIX` at the target's sysroot unless the environment names one. Read from
/// `VGPU_TEST_TARGET` (the triple), `VGPU_TEST_RUNNER` (default `qemu-<arch>-static`) and
/// `VGPU_TEST_CC` (default `<arch>-linux-gnu-gcc`, Debian's cross compiler).
pub struct Cross {
    pub triple: String,
    pub runner: String,
    pub cc: String,
    /// `/usr/<arch>-linux-gnu`, Debian's sysroot for the target: its dynamic linker and libc.
    pub sysroot: PathBuf,
}

/// The cross target, or `None` when the tests run the host's own build.
pub fn cross() -> Option<&'static Cross> {
    static CROSS: OnceLock<Option<Cross>> = OnceLock::new();
    CROSS
        .get_or_init(|| {
            let triple = std::env::var("VGPU_TEST_TARGET").ok().filter(|triple| !triple.is_empty())?;
            let arch = triple.split('-').next().expect("a target triple").to_owned();
            Some(Cross {
                runner: std::env::var("VGPU_TEST_RUNNER").unwrap_or_else(|_| format!("qemu-{arch}-static")),
                cc: std::env::var("VGPU_TEST_CC").unwrap_or_else(|_| format!("{arch}-linux-gnu-gcc")),
                sysroot: PathBuf::from(format!("/usr/{arch}-linux-gnu")),
                triple,
            })
        })
        .as_ref()
}

/// Where the libraries' and clients' build lands: the target directory, or its `<triple>/` folder
/// for a cross target (cargo's own place for that target's `release/`).
fn artifact_dir() -> PathBuf {
    match cross() {
        Some(cross) => target_dir().join(&cross.triple),
        None => target_dir(),
    }
}

/// A command that runs `program`, a client built for the architecture under test: directly, or
/// through the emulator for a cross target.
pub fn client_command(program: &Path) -> Command {
    let Some(cross) = cross() else { return Command::new(program) };
    let mut command = Command::new(&cross.runner);
    command.arg(program);
    if std::env::var_os("QEMU_LD_PREFIX").is_none() {
        command.env("QEMU_LD_PREFIX", &cross.sysroot);
    }
    command
}

/// The C compiler for the clients: `CC` or `cc`, or the cross target's.
fn c_compiler() -> String {
    match cross() {
        Some(cross) => cross.cc.clone(),
        None => std::env::var("CC").unwrap_or_else(|_| "cc".into()),
    }
}

fn run_checked(command: &mut Command) {
    let status = command.status().unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"));
    assert!(status.success(), "{command:?} failed: {status}");
}

/// Builds `packages` with the release profile into this build's target directory and returns
/// `<target>/release` (`<target>/<triple>/release` for a cross target). Whatever profile the tests
/// themselves run under, the libraries they load are always release builds: that is what ships,
/// and the compute-share tests measure timing.
pub fn cargo_build_release(packages: &[&str]) -> PathBuf {
    let target = target_dir();
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Command::new(cargo);
    command.current_dir(root()).args(["build", "--release", "--target-dir"]).arg(&target);
    if let Some(cross) = cross() {
        command.args(["--target", &cross.triple]);
    }
    for package in packages {
        command.args(["-p", package]);
    }
    run_checked(&mut command);
    artifact_dir().join("release")
}

/// `vgpu-smi`, built once per test binary with the release profile for the machine the tests run
/// on, even when the libraries are built for another architecture: it is a node-side tool, run
/// directly, never under the emulator.
pub fn smi_binary() -> &'static Path {
    static SMI: OnceLock<PathBuf> = OnceLock::new();
    SMI.get_or_init(|| {
        let target = target_dir();
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut command = Command::new(cargo);
        command
            .current_dir(root())
            .args(["build", "--release", "-p", "vgpu-smi", "--target-dir"])
            .arg(&target);
        run_checked(&mut command);
        target.join("release/vgpu-smi")
    })
}

/// Makes `link` a symlink to `to`, replacing what is there in one step (a concurrently running
/// test binary never sees the link missing).
fn replace_symlink(to: &Path, link: &Path) {
    let name = link.file_name().expect("a file name").to_string_lossy();
    let tmp = link.with_file_name(format!(".{name}.{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(to, &tmp).expect("create symlink");
    std::fs::rename(&tmp, link).expect("install symlink");
}

/// Builds (once per test binary) the release libraries and the clients.
pub fn artifacts() -> &'static Artifacts {
    static ARTIFACTS: OnceLock<Artifacts> = OnceLock::new();
    ARTIFACTS.get_or_init(|| {
        let root = root();
        let release = cargo_build_release(&["vgpu", "fakegpu"]);
        let fake_driver_dir = artifact_dir().join("fake-driver");
        std::fs::create_dir_all(&fake_driver_dir).expect("create fake driver dir");
        for name in ["libcuda.so.1", "libcuda.so", "libnvidia-ml.so.1"] {
            replace_symlink(&release.join("libfakegpu.so"), &fake_driver_dir.join(name));
        }
        let driver = [OsString::from("-L"), fake_driver_dir.clone().into(), "-l:libcuda.so.1".into()];
        let client = build_client(&root, "vgpu_client", &driver);
        let compute_client = build_client(&root, "compute_client", &driver);
        Artifacts { libvgpu: release.join("libvgpu.so"), fake_driver_dir, client, compute_client }
    })
}

/// The previous release named in `ci/previous-release` (tag and commit).
pub struct PreviousRelease {
    pub tag: String,
    pub commit: String,
    /// Its `libvgpu.so`, built from its own source with the release profile.
    pub libvgpu: PathBuf,
}

/// Builds (once per test binary) the previous release's libvgpu.so: its source is taken from git
/// (`git archive` of the tag, else of the commit) into `<target>/previous-release/<commit>/src`
/// and built into a target directory of its own beside it, which later runs reuse, so cargo
/// rebuilds nothing once it is there. Without the repository's history this fails and says so.
pub fn previous_release() -> &'static PreviousRelease {
    static PREVIOUS: OnceLock<PreviousRelease> = OnceLock::new();
    PREVIOUS.get_or_init(|| {
        let root = root();
        let named = std::fs::read_to_string(root.join("ci/previous-release")).expect("read ci/previous-release");
        let line = named.lines().find(|line| !line.trim().is_empty() && !line.starts_with('#'));
        let (tag, commit) = line
            .and_then(|line| line.split_once(' '))
            .map(|(tag, commit)| (tag.trim().to_owned(), commit.trim().to_owned()))
            .expect("ci/previous-release names a tag and a commit");
        let home = target_dir().join("previous-release").join(&commit);
        let source = home.join("src");
        if !source.join(".complete").is_file() {
            let _ = std::fs::remove_dir_all(&source);
            std::fs::create_dir_all(&source).expect("create the previous release's source folder");
            let exists = |rev: &str| {
                Command::new("git")
                    .current_dir(&root)
                    .args(["rev-parse", "--verify", "--quiet", &format!("{rev}^{{commit}}")])
                    .output()
                    .is_ok_and(|out| out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == commit)
            };
            let rev = [tag.as_str(), commit.as_str()].into_iter().find(|rev| exists(rev)).unwrap_or_else(|| {
                panic!(
                    "neither tag {tag} nor commit {commit} is in this repository: the upgrade tests build the \
                     previous release from git history (clone without --depth, with tags)"
                )
            });
            let archive = Command::new("git")
                .current_dir(&root)
                .args(["archive", "--format=tar", rev])
                .output()
                .expect("run git archive");
            assert!(archive.status.success(), "git archive {rev} failed");
            let mut untar = Command::new("tar")
                .arg("-x")
                .arg("-C")
                .arg(&source)
                .stdin(Stdio::piped())
                .spawn()
                .expect("run tar");
            std::io::Write::write_all(&mut untar.stdin.take().expect("tar's stdin"), &archive.stdout)
                .expect("feed tar");
            assert!(untar.wait().expect("wait for tar").success(), "tar failed");
            std::fs::write(source.join(".complete"), &commit).expect("mark the source complete");
        }
        let target = home.join("target");
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut build = Command::new(cargo);
        build.current_dir(&source).args(["build", "--release", "--lib", "-p", "vgpu", "--target-dir"]).arg(&target);
        // The previous release's own toolchain file and lock file apply, not this build's settings.
        build.env_remove("CARGO_TARGET_DIR").env_remove("RUSTUP_TOOLCHAIN");
        let mut out = target.clone();
        if let Some(cross) = cross() {
            build.args(["--target", &cross.triple]);
            out.push(&cross.triple);
        }
        run_checked(&mut build);
        let libvgpu = out.join("release/libvgpu.so");
        assert!(libvgpu.is_file(), "{} missing after building {tag}", libvgpu.display());
        PreviousRelease { tag, commit, libvgpu }
    })
}

/// `<target>/clients` (`<target>/<triple>/clients`), where the C clients are built.
fn clients_dir() -> PathBuf {
    let dir = artifact_dir().join("clients");
    std::fs::create_dir_all(&dir).expect("create client dir");
    dir
}

/// Compiles the C client `tests/clients/<name>.c`, linked with `libs` (the fake driver for the
/// direct-link path, or the Vulkan loader).
fn build_client(root: &Path, name: &str, libs: &[OsString]) -> PathBuf {
    build_client_as(root, name, name, libs)
}

/// Compiles `tests/clients/<source>.c` into the client `name`, with `args` (defines, libraries).
fn build_client_as(root: &Path, source: &str, name: &str, args: &[OsString]) -> PathBuf {
    let out_dir = clients_dir();
    let out = out_dir.join(name);
    // Build to a private name and rename, so concurrently running test binaries never see a
    // half-written executable.
    let tmp = out_dir.join(format!("{name}.{}", std::process::id()));
    run_checked(
        Command::new(c_compiler())
            .arg("-O2")
            .arg("-Wall")
            .arg("-I")
            .arg(root.join("include"))
            .arg(root.join(format!("tests/clients/{source}.c")))
            .arg("-o")
            .arg(&tmp)
            .args(args)
            .args(["-ldl", "-pthread"]),
    );
    std::fs::rename(&tmp, &out).expect("install client");
    out
}

/// Compiles `tests/clients/<source>.c` into the shared library `out` (a fake of a vendor library).
/// Compiled for position-independent code with semantic interposition and linked without
/// `-Bsymbolic`, as such libraries are: its calls to its own exports go through its PLT.
fn build_library(root: &Path, source: &str, out: &Path) {
    let name = out.file_name().expect("a file name").to_string_lossy();
    let tmp = out.with_file_name(format!(".{name}.{}", std::process::id()));
    run_checked(
        Command::new(c_compiler())
            .args(["-O2", "-Wall", "-shared", "-fPIC", "-fsemantic-interposition", "-I"])
            .arg(root.join("include"))
            .arg(root.join(format!("tests/clients/{source}.c")))
            .arg("-o")
            .arg(&tmp),
    );
    std::fs::rename(&tmp, out).expect("install library");
}

/// One client run's key=value output.
#[derive(Debug)]
pub struct Report {
    pub values: HashMap<String, String>,
    pub stdout: String,
    pub stderr: String,
    pub success: bool,
}

impl Report {
    pub fn get(&self, key: &str) -> u64 {
        let value = self
            .values
            .get(key)
            .unwrap_or_else(|| panic!("no {key} in output:\n{}\n{}", self.stdout, self.stderr));
        value.parse().unwrap_or_else(|_| panic!("{key}={value} is not a number"))
    }

    /// Per mille of the span `<prefix>elapsed_ns` (or `wall_ns`) that the client's launching thread
    /// spent runnable but waiting for a CPU (its `<prefix>starved_ns`, the kernel's run_delay):
    /// device time a busy machine took from a share test, which no limiter can give back. A
    /// share may fall short of its limit by this much more than the tolerance, never exceed it.
    pub fn starved_permille(&self, prefix: &str) -> u64 {
        let span = ["elapsed_ns", "wall_ns"]
            .iter()
            .find_map(|key| self.values.get(&format!("{prefix}{key}")))
            .and_then(|value| value.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("no {prefix}elapsed_ns or wall_ns in output:\n{}", self.stdout));
        self.get(&format!("{prefix}starved_ns")) * 1000 / span.max(1)
    }

    /// Every key=value the client printed, sorted by key, leaving out the keys in `except`.
    pub fn values_except(&self, except: &[&str]) -> BTreeMap<&str, &str> {
        self.values
            .iter()
            .filter(|(key, _)| !except.contains(&key.as_str()))
            .map(|(key, value)| (key.as_str(), value.as_str()))
            .collect()
    }

    /// A value that may be negative (a `VkResult`).
    pub fn get_i64(&self, key: &str) -> i64 {
        let value = self
            .values
            .get(key)
            .unwrap_or_else(|| panic!("no {key} in output:\n{}\n{}", self.stdout, self.stderr));
        value.parse().unwrap_or_else(|_| panic!("{key}={value} is not a number"))
    }

    /// Every value printed for `key`, in order, for a key a run prints more than once (the
    /// `values` map keeps the last).
    pub fn all(&self, key: &str) -> Vec<u64> {
        self.stdout
            .lines()
            .filter_map(|line| line.split_once('='))
            .filter(|(k, _)| *k == key)
            .map(|(_, value)| value.parse().unwrap_or_else(|_| panic!("{key}={value} is not a number")))
            .collect()
    }
}

fn parse(output: Output) -> Report {
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    let values = stdout
        .lines()
        .filter_map(|line| line.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    Report { values, stdout, stderr, success: output.status.success() }
}

/// A client invocation: which call path, what to do, and the environment of the "container".
pub struct Run {
    args: Vec<String>,
    env: Vec<(String, String)>,
    preload: bool,
    compute: bool,
    /// A run of the Vulkan client (`tests/clients/vk_client.c`), see [`Run::vulkan`].
    vulkan: bool,
    /// Preload this library instead of the libvgpu.so of this build (another release's).
    library: Option<PathBuf>,
    /// Set none of libvgpu's variables, not even a region file of its own (a stripped
    /// environment: `su -`, ssh, `env -i`).
    stripped: bool,
    /// A run of the HIP client (`tests/clients/hip_client.c`), see [`Run::hip`].
    hip: bool,
}

impl Run {
    pub fn new(path: &str, command: &[&str]) -> Run {
        let mut args = vec![path.to_owned()];
        args.extend(command.iter().map(|s| s.to_string()));
        Run {
            args,
            env: Vec::new(),
            preload: true,
            compute: false,
            vulkan: false,
            hip: false,
            library: None,
            stripped: false,
        }
    }

    /// A run of the launching client (`tests/clients/compute_client.c`) instead.
    pub fn compute(path: &str, command: &[&str]) -> Run {
        Run { compute: true, ..Run::new(path, command) }
    }

    pub fn env(mut self, key: &str, value: &str) -> Run {
        self.env.push((key.to_owned(), value.to_owned()));
        self
    }

    /// Preloads `library` (another release's libvgpu.so) instead of this build's.
    pub fn library(mut self, library: &Path) -> Run {
        self.library = Some(library.to_owned());
        self
    }

    /// Runs with none of libvgpu's variables set, not even a region file of its own.
    pub fn stripped(mut self) -> Run {
        self.stripped = true;
        self
    }

    /// Runs against the fake driver alone, without libvgpu.
    pub fn native(mut self) -> Run {
        self.preload = false;
        self
    }

    pub fn command(&self) -> Command {
        if self.hip {
            return self.hip_command();
        }
        let a = artifacts();
        let mut command = client_command(if self.vulkan {
            &vk_artifacts().client
        } else if self.compute {
            &a.compute_client
        } else {
            &a.client
        });
        command.args(&self.args);
        // Start from a clean slate: nothing from the developer's shell may change the result.
        for (key, _) in std::env::vars() {
            if key.starts_with("CUDA_")
                || key.starts_with("GPU_")
                || key.starts_with("FAKEGPU_")
                || key.starts_with("LIBCUDA_")
                || key.starts_with("LIBVGPU_")
                || key == "LD_PRELOAD"
            {
                command.env_remove(key);
            }
        }
        if self.vulkan {
            // Nor may the developer's Vulkan settings: which layers and drivers load is the test's.
            for (key, _) in std::env::vars() {
                if key.starts_with("VK_")
                    || key.starts_with("HAMI_")
                    || key.starts_with("XDG_")
                    || key.starts_with("MESA_")
                    || key.starts_with("LP_")
                    || key.starts_with("ENABLE_")
                    || key.starts_with("DISABLE_")
                {
                    command.env_remove(key);
                }
            }
        }
        command.env("LD_LIBRARY_PATH", &a.fake_driver_dir);
        if self.preload {
            command.env("LD_PRELOAD", self.library.as_deref().unwrap_or(&a.libvgpu));
        }
        command.envs(self.env.iter().map(|(k, v)| (k, v)));
        command
    }

    /// The command with a shared-region file of its own, unless the test named one: runs that do
    /// not share a budget must not meet in the default `/tmp/cudevshr.cache`. The caller removes
    /// the returned file once the client is gone.
    fn isolated_command(&self) -> (Command, Option<PathBuf>) {
        let mut command = self.command();
        if self.stripped || self.env.iter().any(|(key, _)| key == SHARED_CACHE_VAR) {
            return (command, None);
        }
        static RUNS: AtomicU64 = AtomicU64::new(0);
        let n = RUNS.fetch_add(1, Ordering::Relaxed);
        let file = scratch_root().join(format!("vgpu-run-{}-{n}.cache", std::process::id()));
        let _ = std::fs::remove_file(&file);
        command.env(SHARED_CACHE_VAR, &file);
        (command, Some(file))
    }

    pub fn report(&self) -> Report {
        let (mut command, private_cache) = self.isolated_command();
        let output = command.output().expect("run client");
        remove_private_cache(private_cache);
        parse(output)
    }

    /// Runs the client to its end with stdin closed; a client still running after `timeout` is
    /// killed and fails the test.
    pub fn report_within(&self, timeout: Duration) -> Report {
        let mut client = self.spawn();
        client.close_stdin();
        client.finish(timeout)
    }

    /// Starts the client with a pipe on stdin (closing it releases `hold`, `fork`) and its stdout
    /// read line by line, for tests that act while it runs.
    pub fn spawn(&self) -> Client {
        let (mut command, private_cache) = self.isolated_command();
        command.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = command.spawn().expect("start client");
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().expect("piped stdout");
        let mut stderr = child.stderr.take().expect("piped stderr");
        let (line_tx, lines) = channel();
        let stdout_reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if line_tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stderr_reader = std::thread::spawn(move || {
            let mut text = Vec::new();
            let _ = stderr.read_to_end(&mut text);
            String::from_utf8_lossy(&text).into_owned()
        });
        Client {
            child,
            stdin,
            lines,
            readers: Some((stdout_reader, stderr_reader)),
            stdout: String::new(),
            values: HashMap::new(),
            exited: false,
            private_cache,
        }
    }
}

/// Lavapipe's deviceUUID (Mesa 22.3.6), the Vulkan device of the Vulkan tests; the fake driver's GPU 0
/// gets it too ([`Run::vulkan`]), so the two are one device.
pub const LAVAPIPE_UUID: &str = "6d657361-3232-2e33-2e36-000000000000";

/// The Vulkan layer and its client, for `tests/vulkan_layer.rs`.
pub struct VkArtifacts {
    /// `<target>/release/libvgpu_vk.so`.
    pub layer: PathBuf,
    pub client: PathBuf,
}

/// Builds (once per test binary) libvgpu, the fake driver, the Vulkan layer and the Vulkan client.
pub fn vk_artifacts() -> &'static VkArtifacts {
    static VK_ARTIFACTS: OnceLock<VkArtifacts> = OnceLock::new();
    VK_ARTIFACTS.get_or_init(|| {
        assert!(cross().is_none(), "the Vulkan layer is tested on the host's architecture only (lavapipe)");
        artifacts();
        let layer = cargo_build_release(&["vgpu-vk"]).join("libvgpu_vk.so");
        assert!(layer.is_file(), "{} missing after the build", layer.display());
        // The Vulkan client reaches libcuda through dlopen only.
        VkArtifacts { layer, client: build_client(&root(), "vk_client", &["-lvulkan".into()]) }
    })
}

/// Installs the layer's implicit-layer manifest, naming the freshly built libvgpu_vk.so, under
/// `<scratch>/data` (once per scratch directory) and returns that data directory.
pub fn install_layer_manifest(scratch: &Scratch) -> PathBuf {
    let data = scratch.path("data");
    if !data.join("vulkan/implicit_layer.d/VK_LAYER_LIBVGPU_budget.json").is_file() {
        let layer = &vk_artifacts().layer;
        let output = Command::new(root().join("vk/install-manifest"))
            .arg(&data)
            .arg(layer)
            .output()
            .expect("run vk/install-manifest");
        assert!(
            output.status.success(),
            "vk/install-manifest failed: {}\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    data
}

impl Run {
    /// A run of the Vulkan client with `command` (its argv): the fake driver's GPU 0 has lavapipe's
    /// UUID (`FAKEGPU_UUIDS`), the client picks lavapipe (`VK_CLIENT_DEVICE=llvmpipe`), libvgpu is
    /// preloaded (unless [`Run::native`]); no Vulkan layer until [`Run::layer`].
    pub fn vulkan(command: &[&str]) -> Run {
        Run {
            args: command.iter().map(|s| s.to_string()).collect(),
            env: Vec::new(),
            preload: true,
            compute: false,
            vulkan: true,
            library: None,
            stripped: false,
            hip: false,
        }
        .env("FAKEGPU_UUIDS", LAVAPIPE_UUID)
        .env("VK_CLIENT_DEVICE", "llvmpipe")
    }

    /// Enables the libvgpu Vulkan layer the way a container does: its manifest in a data directory
    /// the loader searches (`XDG_DATA_DIRS`, system directories after it) and `HAMI_VULKAN_ENABLE=1`.
    pub fn layer(self, scratch: &Scratch) -> Run {
        let data = install_layer_manifest(scratch);
        let dirs = format!("{}:/usr/local/share:/usr/share", data.to_str().expect("utf-8 path"));
        self.env("XDG_DATA_DIRS", &dirs).env("HAMI_VULKAN_ENABLE", "1")
    }

    /// Drops `key` from the environment this run sets (a default of [`Run::vulkan`] or
    /// [`Run::layer`]); the variable is then unset in the client.
    pub fn without(mut self, key: &str) -> Run {
        self.env.retain(|(k, _)| k != key);
        self
    }
}

/// The environment variable naming the shared-region file (docs/architecture.md, "The region
/// file").
pub const SHARED_CACHE_VAR: &str = "CUDA_DEVICE_MEMORY_SHARED_CACHE";

fn remove_private_cache(file: Option<PathBuf>) {
    if let Some(file) = file {
        let _ = std::fs::remove_file(file);
    }
}

/// A client process that is still running: the test reads its stdout as it comes, feeds or
/// closes its stdin, kills it. Dropping it kills and reaps the process.
pub struct Client {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    readers: Option<(JoinHandle<()>, JoinHandle<String>)>,
    stdout: String,
    values: HashMap<String, String>,
    exited: bool,
    private_cache: Option<PathBuf>,
}

impl Client {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether the process has ended (without waiting).
    pub fn has_exited(&mut self) -> bool {
        self.wait_until(Instant::now()).is_some()
    }

    /// Reads stdout until a line `key=…` arrives and returns its value as a number; end of output
    /// or `timeout` first fails the test.
    pub fn wait_for(&mut self, key: &str, timeout: Duration) -> u64 {
        let deadline = Instant::now() + timeout;
        while !self.values.contains_key(key) {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => self.record(line),
                Err(RecvTimeoutError::Timeout) => {
                    panic!(
                        "pid {}: no {key}= within {timeout:?}; stdout so far:\n{}",
                        self.pid(),
                        self.stdout
                    )
                }
                Err(RecvTimeoutError::Disconnected) => {
                    panic!("pid {}: output ended without {key}=; stdout:\n{}", self.pid(), self.stdout)
                }
            }
        }
        self.get(key)
    }

    /// Everything read from stdout so far, after taking in what has arrived.
    pub fn stdout_so_far(&mut self) -> &str {
        while let Ok(line) = self.lines.try_recv() {
            self.record(line);
        }
        &self.stdout
    }

    /// A value already read by [`Client::wait_for`].
    pub fn get(&self, key: &str) -> u64 {
        let value =
            self.values.get(key).unwrap_or_else(|| panic!("no {key} in output so far:\n{}", self.stdout));
        value.parse().unwrap_or_else(|_| panic!("{key}={value} is not a number"))
    }

    fn record(&mut self, line: String) {
        if let Some((key, value)) = line.split_once('=') {
            self.values.insert(key.to_owned(), value.to_owned());
        }
        self.stdout.push_str(&line);
        self.stdout.push('\n');
    }

    /// Closes the client's stdin: `hold` and `fork` then free everything and exit.
    /// Writes `line` and a newline to the client's stdin (the `steps` command reads them).
    pub fn send(&mut self, line: &str) {
        use std::io::Write;
        let stdin = self.stdin.as_mut().expect("the client's stdin is open");
        writeln!(stdin, "{line}").and_then(|()| stdin.flush()).expect("write to the client");
    }

    pub fn close_stdin(&mut self) {
        self.stdin = None;
    }

    /// SIGKILL.
    pub fn kill(&mut self) {
        if !self.exited {
            let _ = self.child.kill();
        }
    }

    /// Waits up to `timeout` for the process to exit (else kills it and fails the test), then
    /// returns everything it printed.
    pub fn finish(mut self, timeout: Duration) -> Report {
        let deadline = Instant::now() + timeout;
        let status = self.wait_until(deadline).unwrap_or_else(|| {
            let _ = self.child.kill();
            panic!("pid {} still running after {timeout:?}; stdout so far:\n{}", self.pid(), self.stdout)
        });
        // Output ends once every process holding the pipes (a forked child too) is gone.
        let (stdout_reader, stderr_reader) = self.readers.take().expect("readers");
        loop {
            let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_secs(1));
            match self.lines.recv_timeout(left) {
                Ok(line) => self.record(line),
                Err(RecvTimeoutError::Disconnected) => break,
                Err(RecvTimeoutError::Timeout) => panic!("pid {}: stdout still open after exit", self.pid()),
            }
        }
        let _ = stdout_reader.join();
        let stderr = stderr_reader.join().unwrap_or_default();
        Report {
            values: std::mem::take(&mut self.values),
            stdout: std::mem::take(&mut self.stdout),
            stderr,
            success: status.success(),
        }
    }

    fn wait_until(&mut self, deadline: Instant) -> Option<std::process::ExitStatus> {
        loop {
            if let Some(status) = self.child.try_wait().expect("wait for client") {
                self.exited = true;
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        self.stdin = None;
        if !self.exited {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        remove_private_cache(self.private_cache.take());
    }
}

/// A fresh directory for one test's shared files under [`scratch_root`], removed afterwards unless
/// the test failed (then it is left there for inspection).
pub struct Scratch {
    pub dir: PathBuf,
}

impl Scratch {
    pub fn new(name: &str) -> Scratch {
        let dir = scratch_root().join(format!("vgpu-test-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create scratch dir");
        Scratch { dir }
    }

    /// Like [`Scratch::new`], but on `/dev/shm` (tmpfs) when there is one: for tests that time the
    /// ledger's own calls. On a disk filesystem the kernel write-protects a shared mapping's pages
    /// while it writes them back, and the next store into the region faults and may sleep on the
    /// filesystem (seen in CI while cargo built beside the test): a wait on the kernel, not on
    /// another process, which `docs/shared-ledger.md` describes. tmpfs never writes pages back.
    pub fn in_memory(name: &str) -> Scratch {
        let shm = Path::new("/dev/shm");
        if !shm.is_dir() {
            return Scratch::new(name);
        }
        let dir = shm.join(format!("vgpu-test-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        match std::fs::create_dir_all(&dir) {
            Ok(()) => Scratch { dir },
            Err(_) => Scratch::new(name),
        }
    }

    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// `ledger.used[0]` in ledger/src/region/layout.rs: the container's bytes on device index 0 in the
/// low 48 bits, a version above.
const LEDGER_USED0: u64 = 2_008_960 + 208;

/// The container's bytes on device index 0, as the region file at `path` says now.
pub fn ledger_used0(path: &Path) -> u64 {
    use std::os::unix::fs::FileExt;
    let mut bytes = [0u8; 8];
    let _ = std::fs::File::open(path).and_then(|f| f.read_exact_at(&mut bytes, LEDGER_USED0));
    u64::from_le_bytes(bytes) & ((1 << 48) - 1)
}

/// What [`stop_and_kill`] saw of the container's usage.
pub struct Storm {
    pub peak: u64,
    pub samples: u64,
}

/// Keeps `victims` processes made by `victim` running while stopping one at random `stops` times
/// (SIGSTOP, up to 20 ms, SIGCONT) and killing one `kills` times (each replaced at once), sampling
/// the usage in the region file `cache` every 0.5 ms meanwhile. All victims are killed at the end.
pub fn stop_and_kill(
    cache: &Path,
    victim: impl Fn() -> Client,
    victims: usize,
    stops: usize,
    kills: usize,
) -> Storm {
    let sampling = std::sync::atomic::AtomicBool::new(true);
    let peak = AtomicU64::new(0);
    let samples = AtomicU64::new(0);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            while sampling.load(Ordering::Relaxed) {
                peak.fetch_max(ledger_used0(cache), Ordering::Relaxed);
                samples.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_micros(500));
            }
        });
        let mut rng = 0x2545_f491_4f6c_dd1d_u64;
        let mut below = |n: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % n
        };
        let signal = |client: &Client, signal: i32| {
            // SAFETY: kill(2) on a child we started; one that already exited is harmless to signal.
            unsafe { libc::kill(client.pid() as i32, signal) };
        };
        let mut pool: Vec<Client> = (0..victims).map(|_| victim()).collect();
        let (mut stopped, mut killed) = (0, 0);
        while stopped < stops || killed < kills {
            let i = below(victims as u64) as usize;
            if stopped < stops {
                signal(&pool[i], libc::SIGSTOP);
                std::thread::sleep(Duration::from_micros(below(20_000)));
                signal(&pool[i], libc::SIGCONT);
                stopped += 1;
            }
            if killed < kills && below(2) == 0 {
                pool[i].kill();
                let _ = std::mem::replace(&mut pool[i], victim()).finish(Duration::from_secs(20));
                killed += 1;
            }
        }
        for mut v in pool {
            v.kill();
            let _ = v.finish(Duration::from_secs(20));
        }
        sampling.store(false, Ordering::Relaxed);
    });
    Storm { peak: peak.load(Ordering::Relaxed), samples: samples.load(Ordering::Relaxed) }
}

/// The HIP library, the fake HIP runtime and the HIP clients, for `tests/hip_budget.rs`.
pub struct HipArtifacts {
    /// `<target>/release/libvgpu_hip.so`.
    pub library: PathBuf,
    /// Directory with libamdhip64.so.6, libamdhip64.so and librocm_smi64.so.1 linking to the fake
    /// runtime (not libamdhip64.so.5: that name is left to Debian's real ROCm 5.2 runtime), and
    /// the fake AMD SMI library, libamd_smi.so (`tests/clients/fake_amd_smi.c`).
    pub fake_runtime_dir: PathBuf,
    /// Reaches the runtime through dlsym and hipGetProcAddress.
    pub client: PathBuf,
    /// The same client linked against the fake runtime, for the direct path.
    pub direct_client: PathBuf,
}

/// Builds (once per test binary) libvgpu_hip, the fake HIP runtime and the HIP clients.
pub fn hip_artifacts() -> &'static HipArtifacts {
    static HIP_ARTIFACTS: OnceLock<HipArtifacts> = OnceLock::new();
    HIP_ARTIFACTS.get_or_init(|| {
        let root = root();
        let release = cargo_build_release(&["vgpu-hip", "fakehip"]);
        let fake_runtime_dir = artifact_dir().join("fake-hip");
        std::fs::create_dir_all(&fake_runtime_dir).expect("create fake HIP runtime dir");
        // The fake is ROCm SMI's library too (rsmi_* memory queries).
        for name in ["libamdhip64.so.6", "libamdhip64.so", "librocm_smi64.so.1"] {
            replace_symlink(&release.join("libfakehip.so"), &fake_runtime_dir.join(name));
        }
        build_library(&root, "fake_amd_smi", &fake_runtime_dir.join("libamd_smi.so"));
        let client = build_client(&root, "hip_client", &[]);
        // libamd_smi first: the HIP fake exports ROCm SMI's names too (no real HIP runtime does),
        // and must not come before the fake AMD SMI's own in the global scope.
        let direct = [
            OsString::from("-DHIP_CLIENT_DIRECT"),
            "-L".into(),
            fake_runtime_dir.clone().into(),
            "-l:libamd_smi.so".into(),
            "-l:libamdhip64.so.6".into(),
        ];
        let direct_client = build_client_as(&root, "hip_client", "hip_client_direct", &direct);
        HipArtifacts { library: release.join("libvgpu_hip.so"), fake_runtime_dir, client, direct_client }
    })
}

impl Run {
    /// A run of the HIP client on `path` (`direct`, `dlsym` or `procaddr`) with `command`, against
    /// the fake HIP runtime, with libvgpu_hip preloaded (unless [`Run::native`]).
    pub fn hip(path: &str, command: &[&str]) -> Run {
        Run { hip: true, ..Run::new(path, command) }
    }

    fn hip_command(&self) -> Command {
        let a = hip_artifacts();
        let direct = self.args.first().is_some_and(|path| path == "direct");
        let mut command = client_command(if direct { &a.direct_client } else { &a.client });
        command.args(&self.args);
        for (key, _) in std::env::vars() {
            if key.starts_with("CUDA_")
                || key.starts_with("GPU_")
                || key.starts_with("FAKEGPU_")
                || key.starts_with("FAKEHIP_")
                || key.starts_with("FAKEAMDSMI_")
                || key.starts_with("HIP_")
                || key.starts_with("ROCR_")
                || key.starts_with("LIBCUDA_")
                || key.starts_with("LIBVGPU_")
                || key == "LD_PRELOAD"
            {
                command.env_remove(key);
            }
        }
        command.env("LD_LIBRARY_PATH", &a.fake_runtime_dir);
        if self.preload {
            command.env("LD_PRELOAD", &a.library);
        }
        command.envs(self.env.iter().map(|(k, v)| (k, v)));
        command
    }
}

/// Held by a test that measures wall time (a compute share): the test binary's other tests that
/// hold it wait, so the measured processes have the runner's cores to themselves. Two-core runners
/// starved share tests that ran beside their binary's other tests (457‰ and 459‰ of 500 ± 30).
pub fn timed_alone() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `tests/clients/<source>.c` built as `<target>/clients/lib<source>.so`, once per test binary:
/// the stand-ins for developer tools (`tool_shim`, a profiler's preloaded driver shim;
/// `tool_injection`, a library the driver loads through `CUDA_INJECTION64_PATH`), used by
/// tests/developer_tools.rs.
pub fn tool_library(source: &'static str) -> PathBuf {
    static BUILT: Mutex<Vec<(&str, PathBuf)>> = Mutex::new(Vec::new());
    let mut built = BUILT.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some((_, path)) = built.iter().find(|(name, _)| *name == source) {
        return path.clone();
    }
    let out = clients_dir().join(format!("lib{source}.so"));
    build_library(&root(), source, &out);
    built.push((source, out.clone()));
    out
}

/// A tiny xorshift generator; the seed comes from the clock and is printed, so a failing run can
/// be repeated.
pub struct XorShift(u64);

impl XorShift {
    pub fn from_clock() -> XorShift {
        let nanos =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_nanos();
        let seed = (nanos as u64) | 1;
        eprintln!("xorshift seed {seed}");
        XorShift(seed)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// A copy of the host's `/etc` in `scratch` whose `ld.so.preload` names `library`, for a test to
/// bind over `/etc` in a mount namespace of its own: the host's `/etc` is never written.
pub fn etc_preloading(scratch: &Scratch, library: &Path) -> PathBuf {
    let etc = scratch.path("etc");
    let copied = Command::new("cp").arg("-a").arg("/etc").arg(&etc).status().expect("run cp");
    assert!(copied.success(), "cannot copy /etc");
    std::fs::write(etc.join("ld.so.preload"), format!("{}\n", library.display()))
        .expect("write ld.so.preload");
    etc
}

/// Feeds `metrics` to `promtool check metrics` and fails the test if it objects. Without promtool
/// (a developer's machine) it says so and passes; in CI (`CI` set) a missing promtool fails, since
/// `.ci/run` installs it (Debian's prometheus package).
pub fn promtool_check(metrics: &str) {
    use std::io::Write;
    use std::process::Stdio;
    match Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(mut promtool) => {
            promtool.stdin.take().expect("stdin").write_all(metrics.as_bytes()).expect("feed promtool");
            let out = promtool.wait_with_output().expect("promtool");
            assert!(
                out.status.success(),
                "promtool check metrics: {}\n{}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Err(error) if std::env::var_os("CI").is_none() => {
            eprintln!("promtool not run ({error}); .ci/run installs it (Debian's prometheus package)");
        }
        Err(error) => panic!("promtool: {error}; .ci/run installs Debian's prometheus package"),
    }
}
