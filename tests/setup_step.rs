//! `ci/setup`, which `ci/demo`, `ci/test`, `ci/aarch64`, `ci/package` and `.ci/run` call before
//! they build: with `PATH` and the checked files (`LIBVGPU_SETUP_ROOT`) pointed at folders of the
//! test's own, it names every missing package at once and stops with status 2 and the command
//! that installs them, installs with `apt-get` only when it may, and says nothing when all is there.

use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// How long the set-up step may take when nothing needs installing, or when it only reports.
const QUICK: Duration = Duration::from_secs(1);

/// What `ci/setup test aarch64` asks for on an empty machine, in the order it names them.
fn every_package() -> Vec<&'static str> {
    let mut packages = vec![
        "gcc",
        "libc6-dev",
        "binutils",
        "ca-certificates",
        "libvulkan1",
        "libvulkan-dev",
        "mesa-vulkan-drivers",
        "vulkan-validationlayers",
    ];
    if std::env::consts::ARCH == "x86_64" {
        packages.extend(["libamdhip64-5", "librocm-smi64-1"]);
    }
    packages.extend([
        "prometheus",
        "git",
        "python3",
        "runc",
        "golang-github-containers-common",
        "strace",
        "valgrind",
        "gcc-aarch64-linux-gnu",
        "libc6-dev-arm64-cross",
        "qemu-user-static",
    ]);
    packages
}

/// A folder of the test's own under cargo's `<target>/tmp`, removed when the test passes.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("setup-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create the scratch folder");
        Scratch(dir)
    }

    /// An empty folder inside the scratch one.
    fn dir(&self, name: &str) -> PathBuf {
        let dir = self.0.join(name);
        std::fs::create_dir_all(&dir).expect("create a folder");
        dir
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// Writes an executable `sh` script (found by its absolute interpreter, whatever `PATH` says).
fn script(path: &Path, body: &str) {
    std::fs::create_dir_all(path.parent().expect("a folder")).expect("create the script's folder");
    std::fs::write(path, format!("#!/bin/sh\n{body}\n")).expect("write a script");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).expect("make it executable");
}

/// A fake `apt-get` that appends `$DEBIAN_FRONTEND ARGS` to `log` and succeeds.
fn recording_apt_get(bin: &Path, log: &Path) {
    script(&bin.join("apt-get"), &format!("echo \"$DEBIAN_FRONTEND $*\" >> '{}'", log.display()));
}

/// A fake `id` that says the caller is `uid`.
fn fake_id(bin: &Path, uid: u32) {
    script(&bin.join("id"), &format!("echo {uid}"));
}

/// Where `name` is in the test's own `PATH`.
fn which(name: &str) -> PathBuf {
    std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|dir| dir.join(name))
        .find(|path| path.is_file())
        .unwrap_or_else(|| panic!("no {name} on PATH"))
}

struct Outcome {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    took: Duration,
}

/// Runs `script` (`ci/setup` or a command that calls it) with `bash` by its absolute path, so
/// that `PATH` may be empty, and the checked files under `root`.
fn run(script: &str, args: &[&str], path: &Path, root: &Path, envs: &[(&str, &str)]) -> Outcome {
    let mut command = Command::new("/bin/bash");
    command
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join(script))
        .args(args)
        .env("PATH", path)
        .env("LIBVGPU_SETUP_ROOT", root)
        .env_remove("LIBVGPU_NO_INSTALL")
        .env_remove("DEBIAN_FRONTEND")
        .env_remove("CARGO")
        .envs(envs.iter().copied());
    let start = Instant::now();
    let output = command.output().unwrap_or_else(|e| panic!("run {script}: {e}"));
    Outcome {
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        took: start.elapsed(),
    }
}

/// The line `ci/setup` stops with: one line on stderr, nothing on stdout.
fn stop_line(outcome: &Outcome) -> &str {
    assert_eq!(outcome.code, Some(2), "stdout: {}\nstderr: {}", outcome.stdout, outcome.stderr);
    assert_eq!(outcome.stdout, "", "it said more than the line on stderr");
    let line = outcome.stderr.strip_suffix('\n').unwrap_or_else(|| panic!("no line: {:?}", outcome.stderr));
    assert!(!line.contains('\n'), "more than one line:\n{}", outcome.stderr);
    line
}

#[test]
fn on_an_empty_machine_the_opt_out_names_every_missing_package_within_a_second() {
    let s = Scratch::new("empty");
    let empty = s.dir("empty");
    let outcome = run("ci/setup", &["test", "aarch64"], &empty, &empty, &[("LIBVGPU_NO_INSTALL", "1")]);
    let line = stop_line(&outcome);
    assert!(outcome.took < QUICK, "took {:?}", outcome.took);
    for package in every_package() {
        assert!(line.contains(&format!(" {package} (")), "{package} not named: {line}");
    }
    assert!(line.contains("Rust (https://rustup.rs)"), "{line}");
    assert!(line.contains("LIBVGPU_NO_INSTALL is set"), "{line}");
    // No apt-get on this PATH: no apt-get command to offer.
    assert!(!line.contains("apt-get install"), "{line}");
}

#[test]
fn the_opt_out_never_runs_apt_get_and_names_the_command() {
    let s = Scratch::new("opt-out");
    let (bin, log) = (s.dir("bin"), s.0.join("apt-get.log"));
    recording_apt_get(&bin, &log);
    fake_id(&bin, 0);
    let outcome = run("ci/setup", &["test", "aarch64"], &bin, &s.dir("root"), &[("LIBVGPU_NO_INSTALL", "1")]);
    let line = stop_line(&outcome);
    assert!(outcome.took < QUICK, "took {:?}", outcome.took);
    let command = format!(
        "run: apt-get update && apt-get install -y --no-install-recommends {}",
        every_package().join(" ")
    );
    assert!(line.contains(&command), "not {command:?}: {line}");
    assert!(!log.exists(), "apt-get ran: {}", std::fs::read_to_string(&log).unwrap_or_default());
}

#[test]
fn without_root_or_passwordless_sudo_it_stops_with_the_sudo_command_before_installing() {
    let s = Scratch::new("user");
    let (bin, log) = (s.dir("bin"), s.0.join("apt-get.log"));
    recording_apt_get(&bin, &log);
    fake_id(&bin, 1000);
    let root = s.dir("root");
    let command = "run: sudo apt-get update && sudo apt-get install -y --no-install-recommends gcc libc6-dev";
    // First with no sudo at all, then with one that wants a password (`sudo -n` fails).
    for with_sudo in [false, true] {
        if with_sudo {
            script(&bin.join("sudo"), "exit 1");
        }
        let outcome = run("ci/setup", &["cc"], &bin, &root, &[]);
        let line = stop_line(&outcome);
        assert!(line.contains("not root, and no passwordless sudo"), "{line}");
        assert!(line.contains(command), "not {command:?}: {line}");
        assert!(!log.exists(), "apt-get ran: {}", std::fs::read_to_string(&log).unwrap_or_default());
    }
}

#[test]
fn as_root_it_installs_what_is_missing_with_one_line_and_updates_apt_only_when_needed() {
    let s = Scratch::new("root");
    let (bin, root, log) = (s.dir("bin"), s.dir("root"), s.0.join("apt-get.log"));
    std::fs::create_dir_all(root.join("usr/include")).expect("create usr/include");
    fake_id(&bin, 0);
    // An apt-get whose lists are stale until `update`: `install` fails before it, and after it
    // installs gcc's `cc` and libc6-dev's stdio.h.
    script(
        &bin.join("apt-get"),
        &format!(
            "echo \"$DEBIAN_FRONTEND $*\" >> '{log}'\n\
             [ \"$1\" = update ] && {{ : > '{updated}'; exit 0; }}\n\
             [ -e '{updated}' ] || {{ echo 'E: Unable to locate package gcc' >&2; exit 100; }}\n\
             : > '{root}/usr/include/stdio.h'\n\
             printf '#!/bin/sh\\n' > '{bin}/cc' && /bin/chmod +x '{bin}/cc'",
            log = log.display(),
            updated = s.0.join("updated").display(),
            root = root.display(),
            bin = bin.display(),
        ),
    );
    let outcome = run("ci/setup", &["cc"], &bin, &root, &[]);
    assert_eq!(outcome.code, Some(0), "stdout: {}\nstderr: {}", outcome.stdout, outcome.stderr);
    assert_eq!(
        outcome.stdout,
        "ci/setup cc: installing gcc (C compiler), libc6-dev (C headers) with apt-get\n"
    );
    assert_eq!(outcome.stderr, "");
    let install = "noninteractive install -y -qq -o Dpkg::Use-Pty=0 --no-install-recommends gcc libc6-dev";
    assert_eq!(
        std::fs::read_to_string(&log).expect("apt-get ran"),
        format!("{install}\nnoninteractive update -qq\n{install}\n")
    );

    // Now that all is there, nothing more is installed and nothing is said.
    std::fs::remove_file(&log).expect("remove the log");
    let outcome = run("ci/setup", &["cc"], &bin, &root, &[]);
    assert_eq!((outcome.code, outcome.stdout.as_str(), outcome.stderr.as_str()), (Some(0), "", ""));
    assert!(!log.exists(), "apt-get ran again");
}

#[test]
fn with_everything_present_it_prints_nothing_and_is_quick() {
    let s = Scratch::new("present");
    let (bin, root, log) = (s.dir("bin"), s.dir("root"), s.0.join("apt-get.log"));
    recording_apt_get(&bin, &log);
    for tool in [
        "cc",
        "nm",
        "objcopy",
        "readelf",
        "promtool",
        "git",
        "python3",
        "runc",
        "strace",
        "callgrind_annotate",
        "aarch64-linux-gnu-gcc",
        "qemu-aarch64-static",
    ] {
        script(&bin.join(tool), "exit 0");
    }
    // Rust is the real one: ci/check-rust asks rustc for its version, ci/setup for its sysroot.
    let rustc = Command::new("rustc")
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["--print", "sysroot"])
        .output()
        .expect("run rustc");
    let sysroot = String::from_utf8(rustc.stdout).expect("utf-8");
    let multiarch = format!("{}-linux-gnu", std::env::consts::ARCH);
    for file in [
        "usr/include/stdio.h".to_owned(),
        "etc/ssl/certs/ca-certificates.crt".to_owned(),
        format!("usr/lib/{multiarch}/libvulkan.so.1"),
        "usr/include/vulkan/vulkan.h".to_owned(),
        format!("usr/share/vulkan/icd.d/lvp_icd.{}.json", std::env::consts::ARCH),
        "usr/share/vulkan/explicit_layer.d/VkLayer_khronos_validation.json".to_owned(),
        format!("usr/lib/{multiarch}/libamdhip64.so.5"),
        "usr/lib/librocm_smi64.so.1".to_owned(),
        "usr/share/containers/seccomp.json".to_owned(),
        "usr/aarch64-linux-gnu/lib/libc.so.6".to_owned(),
        format!("{}/lib/rustlib/aarch64-unknown-linux-gnu/lib/.keep", sysroot.trim().trim_start_matches('/')),
    ] {
        let path = root.join(file);
        std::fs::create_dir_all(path.parent().expect("a folder")).expect("create a folder");
        std::fs::write(&path, "").expect("write a checked file");
    }
    // ci/check-rust needs a few of the system's tools besides rustc.
    for tool in ["rustc", "cargo", "dirname", "sed", "awk", "sort", "head", "bash"] {
        symlink(which(tool), bin.join(tool)).expect("link a tool");
    }
    let outcome = run("ci/setup", &["test", "aarch64"], &bin, &root, &[("LIBVGPU_NO_INSTALL", "1")]);
    assert_eq!((outcome.code, outcome.stdout.as_str(), outcome.stderr.as_str()), (Some(0), "", ""));
    assert!(outcome.took < QUICK, "took {:?}", outcome.took);
    assert!(!log.exists(), "apt-get ran");
}

/// Each command the README and CI name stops in ci/setup, before cargo builds anything.
#[test]
fn every_command_stops_before_building_when_something_is_missing() {
    let s = Scratch::new("commands");
    let (bin, root, log) = (s.dir("bin"), s.dir("root"), s.0.join("cargo.log"));
    script(&bin.join("cargo"), &format!("echo \"$*\" >> '{}'", log.display()));
    // The commands find their own folder with dirname, and /usr/bin/env finds bash for ci/setup.
    for tool in ["dirname", "bash"] {
        symlink(which(tool), bin.join(tool)).expect("link a tool");
    }
    for (command, groups) in [
        ("ci/demo", "build"),
        ("ci/test", "test"),
        ("ci/aarch64", "aarch64"),
        ("ci/package", if std::env::consts::ARCH == "aarch64" { "build" } else { "cross" }),
        (".ci/run", "test aarch64"),
    ] {
        let outcome = run(command, &[], &bin, &root, &[("LIBVGPU_NO_INSTALL", "1")]);
        let line = stop_line(&outcome);
        assert!(
            line.starts_with(&format!("ci/setup {groups}: missing gcc (C compiler)")),
            "{command}: {line}"
        );
        assert!(!log.exists(), "{command} ran cargo: {}", std::fs::read_to_string(&log).unwrap_or_default());
    }
}
