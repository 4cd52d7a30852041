//! Shared test harness: builds libvgpu, the fake driver and the C client once, then runs the
//! client as a separate process under `LD_PRELOAD`, exactly as a container would.

#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;

/// Paths of everything a test process needs.
pub struct Artifacts {
    pub libvgpu: PathBuf,
    /// Directory with libcuda.so.1, libcuda.so and libnvidia-ml.so.1 linking to the fake driver.
    pub fake_driver_dir: PathBuf,
    pub client: PathBuf,
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn run_checked(command: &mut Command) {
    let status = command.status().unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"));
    assert!(status.success(), "{command:?} failed: {status}");
}

/// Builds (once per test binary) the release libraries and the client.
pub fn artifacts() -> &'static Artifacts {
    static ARTIFACTS: OnceLock<Artifacts> = OnceLock::new();
    ARTIFACTS.get_or_init(|| {
        let root = root();
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        run_checked(Command::new(cargo).current_dir(&root).args([
            "build",
            "--release",
            "-p",
            "vgpu",
            "-p",
            "fakegpu",
        ]));
        let release = root.join("target/release");
        let fake_driver_dir = root.join("target/fake-driver");
        std::fs::create_dir_all(&fake_driver_dir).expect("create fake driver dir");
        for name in ["libcuda.so.1", "libcuda.so", "libnvidia-ml.so.1"] {
            let link = fake_driver_dir.join(name);
            let _ = std::fs::remove_file(&link);
            let _ = std::os::unix::fs::symlink(release.join("libfakegpu.so"), &link);
        }
        let client = build_client(&root, &fake_driver_dir);
        Artifacts { libvgpu: release.join("libvgpu.so"), fake_driver_dir, client }
    })
}

/// Compiles the C client against the fake driver (for its direct-link path).
fn build_client(root: &Path, fake_driver_dir: &Path) -> PathBuf {
    let out_dir = root.join("target/clients");
    std::fs::create_dir_all(&out_dir).expect("create client dir");
    let out = out_dir.join("vgpu_client");
    // Build to a private name and rename, so concurrently running test binaries never see a
    // half-written executable.
    let tmp = out_dir.join(format!("vgpu_client.{}", std::process::id()));
    run_checked(
        Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
            .arg("-O2")
            .arg("-Wall")
            .arg("-I")
            .arg(root.join("include"))
            .arg(root.join("tests/clients/vgpu_client.c"))
            .arg("-o")
            .arg(&tmp)
            .arg("-L")
            .arg(fake_driver_dir)
            .args(["-l:libcuda.so.1", "-ldl"]),
    );
    std::fs::rename(&tmp, &out).expect("install client");
    out
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
}

impl Run {
    pub fn new(path: &str, command: &[&str]) -> Run {
        let mut args = vec![path.to_owned()];
        args.extend(command.iter().map(|s| s.to_string()));
        Run { args, env: Vec::new(), preload: true }
    }

    pub fn env(mut self, key: &str, value: &str) -> Run {
        self.env.push((key.to_owned(), value.to_owned()));
        self
    }

    /// Runs against the fake driver alone, without libvgpu.
    pub fn native(mut self) -> Run {
        self.preload = false;
        self
    }

    pub fn command(&self) -> Command {
        let a = artifacts();
        let mut command = Command::new(&a.client);
        command.args(&self.args);
        // Start from a clean slate: nothing from the developer's shell may change the result.
        for (key, _) in std::env::vars() {
            if key.starts_with("CUDA_")
                || key.starts_with("FAKEGPU_")
                || key.starts_with("LIBCUDA_")
                || key == "LD_PRELOAD"
            {
                command.env_remove(key);
            }
        }
        command.env("LD_LIBRARY_PATH", &a.fake_driver_dir);
        if self.preload {
            command.env("LD_PRELOAD", &a.libvgpu);
        }
        command.envs(self.env.iter().map(|(k, v)| (k, v)));
        command
    }

    pub fn report(&self) -> Report {
        parse(self.command().output().expect("run client"))
    }
}
