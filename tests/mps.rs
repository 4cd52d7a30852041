//! MPS nodes on the fake driver (`FAKEGPU_MPS=1`: `CU_DEVICE_ATTRIBUTE_MPS_ENABLED` reads 1 and
//! NVML lists processes as MPS clients): libvgpu says at debug level whether each device runs
//! under MPS, warns when a container's share and `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` both apply,
//! or a context is created with an SM-count execution affinity under a share, `vgpu-smi doctor`
//! prints a line per device, and `vgpu-smi metrics` counts the MPS clients.

mod common;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::{Report, Run, SHARED_CACHE_VAR, Scratch, artifacts};

const UUID0: &str = "GPU-face0000-0000-4e00-8000-000000000000";

/// A client that allocates 64 MiB in its own container (region `region`), with `env`.
fn client(region: &Path, env: &[(&str, &str)]) -> Report {
    let mut run = Run::new("direct", &["fill", "64"]).env(SHARED_CACHE_VAR, region.to_str().expect("UTF-8"));
    for (key, value) in env {
        run = run.env(key, value);
    }
    let r = run.report();
    assert!(r.success, "{r:?}");
    r
}

#[test]
fn start_up_says_whether_each_device_runs_under_mps() {
    let s = Scratch::new("mps-debug");
    let on = client(
        &s.path("on.cache"),
        &[("FAKEGPU_MPS", "1"), ("FAKEGPU_DEVICES", "2"), ("LIBCUDA_LOG_LEVEL", "4")],
    );
    for device in 0..2 {
        let line =
            format!("debug: device {device}: contexts run under MPS (CU_DEVICE_ATTRIBUTE_MPS_ENABLED=1");
        assert!(on.stderr.contains(&line), "no {line:?} in:\n{}", on.stderr);
    }
    let off = client(&s.path("off.cache"), &[("LIBCUDA_LOG_LEVEL", "4")]);
    assert!(off.stderr.contains("debug: device 0: not under MPS"), "{}", off.stderr);
    assert!(!off.stderr.contains("contexts run under MPS"), "{}", off.stderr);
    // Not a word of it at the default level.
    let quiet = client(&s.path("quiet.cache"), &[("FAKEGPU_MPS", "1")]);
    assert!(!quiet.stderr.contains("MPS"), "{}", quiet.stderr);
}

#[test]
fn a_share_and_an_mps_thread_percentage_together_are_warned_about_once() {
    let s = Scratch::new("mps-twice");
    let both = client(
        &s.path("both.cache"),
        &[("FAKEGPU_MPS", "1"), ("CUDA_DEVICE_SM_LIMIT", "30"), ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "30")],
    );
    let warnings: Vec<&str> =
        both.stderr.lines().filter(|l| l.contains("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30")).collect();
    assert_eq!(warnings.len(), 1, "{}", both.stderr);
    let line = warnings[0];
    assert!(line.contains("warn"), "{line}");
    for needle in
        ["CUDA_DEVICE_SM_LIMIT (30 on device 0)", "libvgpu's share governs", "MPS is active on device(s) [0]"]
    {
        assert!(line.contains(needle), "no {needle:?} in {line}");
    }
    assert!(line.ends_with("unset CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), "{line}");

    // Either one alone, or a thread percentage that caps nothing, is no warning.
    for env in [
        vec![("FAKEGPU_MPS", "1"), ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "30")],
        vec![("FAKEGPU_MPS", "1"), ("CUDA_DEVICE_SM_LIMIT", "30")],
        vec![
            ("FAKEGPU_MPS", "1"),
            ("CUDA_DEVICE_SM_LIMIT", "30"),
            ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "100"),
        ],
    ] {
        let name = format!("one-{}.cache", env.len() + env.iter().map(|e| e.1.len()).sum::<usize>());
        let r = client(&s.path(&name), &env);
        assert!(!r.stderr.contains("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), "{env:?}:\n{}", r.stderr);
    }
}

#[test]
fn a_context_with_an_sm_affinity_under_a_share_is_warned_about() {
    let s = Scratch::new("mps-affinity");
    let region = s.path("affinity.cache");
    let run = |env: &[(&str, &str)]| {
        let mut run = Run::new("direct", &["context"])
            .env(SHARED_CACHE_VAR, region.to_str().expect("UTF-8"))
            .env("CUDA_DEVICE_MEMORY_LIMIT_0", "1g")
            .env("FAKEGPU_CONTEXT_MEMORY", "256m");
        for (key, value) in env {
            run = run.env(key, value);
        }
        let r = run.report();
        assert!(r.success, "{r:?}");
        let _ = std::fs::remove_file(&region);
        r
    };
    // cuCtxCreate_v3 and _v4, alone and then together: four contexts asking for 32 SMs.
    let both = run(&[("VGPU_CLIENT_AFFINITY_SMS", "32"), ("CUDA_DEVICE_SM_LIMIT", "30")]);
    let warned: Vec<&str> =
        both.stderr.lines().filter(|l| l.contains("created with an execution affinity of 32 SMs")).collect();
    assert_eq!(warned.len(), 4, "{}", both.stderr);
    assert!(warned[0].contains("CUDA_DEVICE_SM_LIMIT gives the container 30 %"), "{}", warned[0]);
    assert!(warned[0].contains("libvgpu's share governs"), "{}", warned[0]);
    for env in [vec![("VGPU_CLIENT_AFFINITY_SMS", "32")], vec![("CUDA_DEVICE_SM_LIMIT", "30")]] {
        let r = run(&env);
        assert!(!r.stderr.contains("execution affinity"), "{env:?}:\n{}", r.stderr);
    }
}

fn doctor(region: &Path, env: &[(&str, &str)]) -> Output {
    let smi = common::smi_binary().to_path_buf();
    let mut command = Command::new(smi);
    command.args(["doctor", "--library"]).arg(&artifacts().libvgpu).arg(region);
    command.env("LD_LIBRARY_PATH", &artifacts().fake_driver_dir);
    for (key, _) in std::env::vars() {
        if key.starts_with("CUDA_")
            || key.starts_with("LIBCUDA_")
            || key.starts_with("FAKEGPU_")
            || key == "LD_PRELOAD"
        {
            command.env_remove(key);
        }
    }
    command.envs(env.iter().copied());
    command.output().expect("run vgpu-smi doctor")
}

#[test]
fn doctor_prints_a_line_per_device_and_flags_a_double_limit() {
    let s = Scratch::new("mps-doctor");
    let pipes = s.path("pipes");
    std::fs::create_dir_all(&pipes).expect("pipe dir");
    let pipes = pipes.to_str().expect("UTF-8");
    let on = doctor(
        &s.path("none.cache"),
        &[("FAKEGPU_MPS", "1"), ("FAKEGPU_DEVICES", "2"), ("CUDA_MPS_PIPE_DIRECTORY", pipes)],
    );
    let stdout = String::from_utf8_lossy(&on.stdout);
    assert_eq!(on.status.code(), Some(0), "{stdout}");
    for device in 0..2 {
        let line = format!("MPS on device {device}: active (contexts are shared through an MPS server)");
        assert!(stdout.lines().any(|l| l == line), "no {line:?} in:\n{stdout}");
    }
    assert!(
        stdout.contains(&format!("MPS: pipe directory {pipes} (no control daemon's pipe there)")),
        "{stdout}"
    );

    let off = doctor(&s.path("none.cache"), &[]);
    let stdout = String::from_utf8_lossy(&off.stdout);
    assert!(stdout.lines().any(|l| l == "MPS on device 0: not active"), "{stdout}");

    let both = doctor(
        &s.path("none.cache"),
        &[("FAKEGPU_MPS", "1"), ("CUDA_DEVICE_SM_LIMIT", "30"), ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "30")],
    );
    let stdout = String::from_utf8_lossy(&both.stdout);
    assert_eq!(both.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains(
            "environment: CUDA_DEVICE_SM_LIMIT and CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30 are both set"
        ),
        "{stdout}"
    );
}

#[test]
fn metrics_count_the_mps_clients_of_each_device() {
    let s = Scratch::new("mps-metrics");
    let (cache, fake) = (s.path("cudevshr.cache"), s.path("fake"));
    let fake_text = fake.to_str().expect("UTF-8");
    let mut holder = Run::new("direct", &["hold", "64", "64"])
        .env(SHARED_CACHE_VAR, cache.to_str().expect("UTF-8"))
        .env("CUDA_DEVICE_MEMORY_LIMIT_0", "1g")
        .env("FAKEGPU_SHARED", fake_text)
        .env("FAKEGPU_MPS", "1")
        .spawn();
    holder.wait_for("ready", Duration::from_secs(10));
    let smi = common::smi_binary().to_path_buf();
    let scrape = |mps: &str| {
        let output = Command::new(&smi)
            .args(["metrics"])
            .arg(&cache)
            .env("LD_LIBRARY_PATH", &artifacts().fake_driver_dir)
            .env("FAKEGPU_SHARED", fake_text)
            .env("FAKEGPU_MPS", mps)
            .env_remove("LD_PRELOAD")
            .output()
            .expect("run vgpu-smi metrics");
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let on = scrape("1");
    let sample = format!("vgpu_physical_mps_clients{{device_index=\"0\",device_uuid=\"{UUID0}\"}} 1\n");
    assert!(on.contains(&sample), "no {sample:?} in:\n{on}");
    assert!(on.contains("# HELP vgpu_physical_mps_clients "), "{on}");
    let off = scrape("0");
    let sample = format!("vgpu_physical_mps_clients{{device_index=\"0\",device_uuid=\"{UUID0}\"}} 0\n");
    assert!(off.contains(&sample), "no {sample:?} in:\n{off}");
    holder.close_stdin();
    assert!(holder.finish(Duration::from_secs(10)).success);

    match Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(mut promtool) => {
            promtool.stdin.take().expect("stdin").write_all(on.as_bytes()).expect("feed promtool");
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
