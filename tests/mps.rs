//! MPS nodes on the fake driver (`FAKEGPU_MPS=1`: `CU_DEVICE_ATTRIBUTE_MPS_ENABLED` reads 1, NVML
//! lists processes as MPS clients, and `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` or an execution
//! affinity caps a context's SMs, so its kernels take as much longer): libvgpu says at debug level
//! whether each device runs under MPS, combines a container's share with such a cap instead of
//! multiplying them, warns when a cap holds a container under its share, `vgpu-smi doctor` prints
//! a line per device, and `vgpu-smi metrics` counts the MPS clients.

mod common;

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use common::{Report, Run, SHARED_CACHE_VAR, Scratch, artifacts, timed_alone};

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
fn a_thread_percentage_under_the_share_is_warned_about_once_and_one_at_or_above_it_is_said_at_info() {
    let s = Scratch::new("mps-twice");
    let under = client(
        &s.path("under.cache"),
        &[("FAKEGPU_MPS", "1"), ("CUDA_DEVICE_SM_LIMIT", "30"), ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "20")],
    );
    let warnings: Vec<&str> =
        under.stderr.lines().filter(|l| l.contains("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=20")).collect();
    assert_eq!(warnings.len(), 1, "{}", under.stderr);
    let line = warnings[0];
    assert!(line.contains("warn"), "{line}");
    for needle in [
        "CUDA_DEVICE_SM_LIMIT (30 on device 0)",
        "MPS is active on device(s) [0]",
        "holds the container under its share on device(s) [0], to about 20 % of the GPU",
    ] {
        assert!(line.contains(needle), "no {needle:?} in {line}");
    }

    // A cap at the share is combined with it: said at info level, not warned about.
    let env =
        [("FAKEGPU_MPS", "1"), ("CUDA_DEVICE_SM_LIMIT", "30"), ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "30")];
    let quiet = client(&s.path("at.cache"), &env);
    assert!(!quiet.stderr.contains("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), "{}", quiet.stderr);
    let info = client(&s.path("at-info.cache"), &[env.as_slice(), &[("LIBCUDA_LOG_LEVEL", "3")]].concat());
    let said: Vec<&str> =
        info.stderr.lines().filter(|l| l.contains("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30")).collect();
    assert_eq!(said.len(), 1, "{}", info.stderr);
    assert!(said[0].contains("info") && said[0].contains("the container gets its share"), "{}", said[0]);

    // A share under MPS without a thread percentage: the hint, at info level.
    let hinted = client(
        &s.path("hint.cache"),
        &[("FAKEGPU_MPS", "1"), ("CUDA_DEVICE_SM_LIMIT", "30"), ("LIBCUDA_LOG_LEVEL", "3")],
    );
    assert!(
        hinted.stderr.lines().any(|l| l.contains("info")
            && l.contains(
                "CUDA_DEVICE_SM_LIMIT (30 on device 0) under MPS without CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
            )),
        "{}",
        hinted.stderr
    );

    // Either one alone, a thread percentage that caps nothing, or one without MPS, is no warning.
    for env in [
        vec![("FAKEGPU_MPS", "1"), ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "20")],
        vec![("FAKEGPU_MPS", "1"), ("CUDA_DEVICE_SM_LIMIT", "30")],
        vec![
            ("FAKEGPU_MPS", "1"),
            ("CUDA_DEVICE_SM_LIMIT", "30"),
            ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "100"),
        ],
        vec![("CUDA_DEVICE_SM_LIMIT", "30"), ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "20")],
    ] {
        let name = format!("one-{}.cache", env.len() + env.iter().map(|e| e.1.len()).sum::<usize>());
        let r = client(&s.path(&name), &env);
        assert!(!r.stderr.contains("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), "{env:?}:\n{}", r.stderr);
    }
}

/// `launches` launches of 2 ms of `entry` work (a kernel, a copy, a memset) on an MPS node, under
/// a share of 30, with `env` added.
fn loop_under_a_share_of_30(entry: &str, launches: &str, env: &[(&str, &str)]) -> Report {
    let mut run = Run::compute("direct", &["loop", entry, "2000", launches])
        .env("FAKEGPU_MPS", "1")
        .env("CUDA_DEVICE_SM_LIMIT", "30");
    for (key, value) in env {
        run = run.env(key, value);
    }
    run.report_within(Duration::from_secs(60))
}

/// Asserts that such a loop did `want` ± 30 thousandths of the work it does alone on the whole
/// GPU: its launches of 2 ms each (their length uncapped) over the time they took.
fn assert_work(r: &Report, want: u64, what: &str) {
    assert!(r.success && r.get("status") == 0, "{what}: {}\n{}", r.stdout, r.stderr);
    let seen = r.get("launches") * 2000 * 1_000_000 / r.get("elapsed_ns");
    assert!(seen.abs_diff(want) <= 30, "{what}: {seen}‰ of the GPU's work, want {want}‰ ± 30\n{}", r.stderr);
}

#[test]
fn a_share_and_an_mps_cap_are_combined_not_multiplied() {
    let _alone = timed_alone();
    // 100 launches of a 2 ms kernel under a share of 30, with MPS capping the client's SMs
    // (the fake gives 30 % of 132 SMs as 39, and slows a kernel by 132/39). Without a cap, the
    // share's 30 % of the time on the whole GPU; capped at or above the share, the share; capped
    // under it, the cap. Multiplied, the first two would be 9 % and 15 %. Copies and memsets do
    // not run on the capped SMs: they keep 30 % of the time.
    let cases = [
        ("kernel", None, 300),
        ("kernel", Some("30"), 295),
        ("kernel", Some("50"), 300),
        ("kernel", Some("20"), 197),
        ("dtod", Some("30"), 300),
        ("memset", Some("30"), 300),
    ];
    let runs: Vec<_> = cases
        .iter()
        .map(|&(entry, threads, _)| {
            let env: Vec<_> =
                threads.map(|percent| ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", percent)).into_iter().collect();
            std::thread::spawn(move || loop_under_a_share_of_30(entry, "100", &env))
        })
        .collect();
    for (run, (entry, threads, want)) in runs.into_iter().zip(cases) {
        let r = run.join().expect("client thread");
        assert_work(&r, want, &format!("{entry}, thread percentage {threads:?}"));
    }
}

#[test]
fn the_part_of_the_sms_is_what_the_driver_applies_not_what_the_environment_says() {
    let _alone = timed_alone();
    // The driver read no cap (FAKEGPU_MPS_THREAD_PERCENTAGE=100), and the program's environment
    // now says 1 %: charged by the environment, the loop would fill the GPU against a share of 30.
    let r = loop_under_a_share_of_30(
        "kernel",
        "100",
        &[("FAKEGPU_MPS_THREAD_PERCENTAGE", "100"), ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "1")],
    );
    assert_work(&r, 300, "no cap applied, 1 % in the environment");
}

#[test]
fn a_capped_context_beside_other_processes_times_one_launch_in_four_and_keeps_its_share() {
    let _alone = timed_alone();
    // A process holding a context on the same simulated GPU makes the loop's GPU shared; the loop
    // itself has the GPU's time to itself. Capped at 30 % of the SMs under a share of 30, all but
    // one launch in four of the same work is charged its estimate untimed; uncapped, or with the
    // GPU to itself, every launch is timed (two event records each).
    let s = Scratch::new("mps-sampled");
    let gpu = s.path("gpu.fake");
    let gpu = gpu.to_str().expect("UTF-8");
    let mut neighbour = Run::new("direct", &["hold", "64", "64"])
        .env(SHARED_CACHE_VAR, s.path("neighbour.cache").to_str().expect("UTF-8"))
        .env("FAKEGPU_SHARED", gpu)
        .env("FAKEGPU_MPS", "1")
        .spawn();
    neighbour.wait_for("ready", Duration::from_secs(10));
    let run = |threads: Option<&str>, shared: bool| {
        let mut env = Vec::new();
        if let Some(percent) = threads {
            env.push(("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", percent));
        }
        if shared {
            env.push(("FAKEGPU_SHARED", gpu));
        }
        loop_under_a_share_of_30("kernel", "400", &env)
    };
    let sampled = run(Some("30"), true);
    let records = sampled.get("event_records");
    assert!((200..=240).contains(&records), "{records} event records for 400 launches\n{}", sampled.stdout);
    assert_work(&sampled, 295, "capped at 30 beside a neighbour");
    for (threads, shared) in [(None, true), (Some("30"), false)] {
        let every = run(threads, shared);
        assert_eq!(every.get("event_records"), 800, "{threads:?}, shared {shared}\n{}", every.stdout);
    }
    neighbour.close_stdin();
    neighbour.finish(Duration::from_secs(10));
}

#[test]
fn a_context_with_an_sm_affinity_is_charged_its_part_of_the_sms() {
    let _alone = timed_alone();
    // The same loop in a context created with an affinity of 40 of 132 SMs (30.3 %), which the
    // fake slows by 132/40: at a share of 30 it gets its share. Multiplied, it would get 9 %.
    let r = loop_under_a_share_of_30("kernel", "100", &[("CLIENT_AFFINITY_SMS", "40")]);
    assert_work(&r, 300, "a context with an affinity of 40 SMs");
}

#[test]
fn a_context_with_an_sm_affinity_under_a_share_is_charged_its_part_and_warned_about_below_it() {
    let _alone = timed_alone();
    let s = Scratch::new("mps-affinity");
    let region = s.path("affinity.cache");
    let run = |env: &[(&str, &str)]| {
        let mut run = Run::new("direct", &["context"])
            .env(SHARED_CACHE_VAR, region.to_str().expect("UTF-8"))
            .env("CUDA_DEVICE_MEMORY_LIMIT_0", "1g")
            .env("FAKEGPU_CONTEXT_MEMORY", "256m")
            .env("LIBCUDA_LOG_LEVEL", "3");
        for (key, value) in env {
            run = run.env(key, value);
        }
        let r = run.report();
        assert!(r.success, "{r:?}");
        let _ = std::fs::remove_file(&region);
        r
    };
    // cuCtxCreate_v3 and _v4, alone and then together: four contexts asking for 32 of 132 SMs,
    // under a share of 30 %.
    let under =
        run(&[("FAKEGPU_MPS", "1"), ("VGPU_CLIENT_AFFINITY_SMS", "32"), ("CUDA_DEVICE_SM_LIMIT", "30")]);
    let warned: Vec<&str> = under
        .stderr
        .lines()
        .filter(|l| {
            l.contains("warn")
                && l.contains("created with an execution affinity of 32 SMs (24.2 % of the GPU)")
        })
        .collect();
    assert_eq!(warned.len(), 4, "{}", under.stderr);
    assert!(warned[0].contains("CUDA_DEVICE_SM_LIMIT gives the container 30 %"), "{}", warned[0]);
    assert!(warned[0].contains("holds that context's kernels under the share"), "{}", warned[0]);
    // 40 SMs are 30.3 %: at the share, said at info level.
    let at = run(&[("FAKEGPU_MPS", "1"), ("VGPU_CLIENT_AFFINITY_SMS", "40"), ("CUDA_DEVICE_SM_LIMIT", "30")]);
    let said: Vec<&str> = at
        .stderr
        .lines()
        .filter(|l| l.contains("created with an execution affinity of 40 SMs (30.3 % of the GPU)"))
        .collect();
    assert_eq!(said.len(), 4, "{}", at.stderr);
    assert!(
        said.iter().all(|l| l.contains("info") && l.contains("charged 30.3 % of their time")),
        "{said:?}"
    );
    // Without MPS an affinity caps nothing; without a share there is nothing to combine.
    for env in [
        vec![("VGPU_CLIENT_AFFINITY_SMS", "32"), ("CUDA_DEVICE_SM_LIMIT", "30")],
        vec![("FAKEGPU_MPS", "1"), ("VGPU_CLIENT_AFFINITY_SMS", "32")],
        vec![("FAKEGPU_MPS", "1"), ("CUDA_DEVICE_SM_LIMIT", "30")],
    ] {
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

    let hinted = doctor(&s.path("none.cache"), &[("FAKEGPU_MPS", "1"), ("CUDA_DEVICE_SM_LIMIT", "30")]);
    let stdout = String::from_utf8_lossy(&hinted.stdout);
    assert_eq!(hinted.status.code(), Some(0), "{stdout}");
    assert!(
        stdout.contains("hint: a compute share under MPS without CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"),
        "{stdout}"
    );

    let combined = doctor(
        &s.path("none.cache"),
        &[("FAKEGPU_MPS", "1"), ("CUDA_DEVICE_SM_LIMIT", "30"), ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "30")],
    );
    let stdout = String::from_utf8_lossy(&combined.stdout);
    assert_eq!(combined.status.code(), Some(0), "{stdout}");
    assert!(
        stdout.contains("environment: CUDA_DEVICE_SM_LIMIT and CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30 are both set: combined"),
        "{stdout}"
    );

    let under = doctor(
        &s.path("none.cache"),
        &[("FAKEGPU_MPS", "1"), ("CUDA_DEVICE_SM_LIMIT", "30"), ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "20")],
    );
    let stdout = String::from_utf8_lossy(&under.stdout);
    assert_eq!(under.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains(
            "environment: CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=20 is below the compute share (30 on device 0) under MPS"
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

    common::promtool_check(&on);
}
