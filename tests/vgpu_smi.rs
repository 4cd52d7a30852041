//! `vgpu-smi` against region files written by real client processes under `LD_PRELOAD` (fake
//! driver): its table and JSON agree with the fake driver's own count, a killed process shows as
//! dead until `reclaim` gives its bytes back, broken files give the documented errors and exit
//! statuses, and `metrics` passes `promtool check metrics` and is what `serve` answers a scrape with.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{Client, GIB, MIB, Run, SHARED_CACHE_VAR, Scratch};
use serde_json::Value;

const READY: Duration = Duration::from_secs(10);
const EXIT: Duration = Duration::from_secs(10);
/// The fake driver's device 0.
const UUID0: &str = "GPU-face0000-0000-4e00-8000-000000000000";
const CONTEXT: u64 = 32 * MIB;

/// One run of `vgpu-smi`.
struct Smi {
    status: i32,
    stdout: String,
    stderr: String,
}

impl Smi {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| panic!("not JSON ({e}):\n{}", self.stdout))
    }
}

/// `vgpu-smi ARGS` with a clean environment (no driver on the library path, no region variable).
fn smi_command(args: &[&str]) -> Command {
    let mut command = Command::new(common::smi_binary());
    command.args(args).env_remove(SHARED_CACHE_VAR).env_remove("LD_PRELOAD").env_remove("LD_LIBRARY_PATH");
    command
}

fn smi(args: &[&str]) -> Smi {
    let output = smi_command(args).output().expect("run vgpu-smi");
    Smi {
        status: output.status.code().expect("exited"),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

fn text(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

/// A client holding `mib` MiB on device 0 of the container whose region is `cache`, under a 1 GiB
/// budget, each context costing 32 MiB; the fake's own count kept in `fake` across processes.
fn holder(cache: &Path, fake: &Path, mib: u64) -> Client {
    let max = mib.to_string();
    let mut client = Run::new("direct", &["hold", "64", &max])
        .env(SHARED_CACHE_VAR, text(cache))
        .env("CUDA_DEVICE_MEMORY_LIMIT_0", "1g")
        .env("CUDA_DEVICE_SM_LIMIT_0", "30")
        .env("FAKEGPU_DEVICES", "2")
        .env("FAKEGPU_SHARED", text(fake))
        .env("FAKEGPU_CONTEXT_MEMORY", "32m")
        .spawn();
    client.wait_for("ready", READY);
    assert_eq!(client.get("held_bytes"), mib * MIB, "pid {} was refused", client.pid());
    client
}

/// The fake driver's bytes in use on device 0, over every process naming `fake`.
fn driver_used(fake: &Path) -> u64 {
    let r = Run::new("direct", &["driver_stats"])
        .native()
        .env("FAKEGPU_DEVICES", "2")
        .env("FAKEGPU_SHARED", text(fake))
        .report_within(EXIT);
    assert!(r.success, "{r:?}");
    r.get("driver_used")
}

fn u64_at(value: &Value, pointer: &str) -> u64 {
    value
        .pointer(pointer)
        .and_then(Value::as_u64)
        .unwrap_or_else(|| panic!("no number at {pointer} in {value:#}"))
}

/// `vgpu-smi`'s own byte format (smi/src/table.rs).
fn size(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / MIB as f64)
}

#[test]
fn table_and_json_agree_with_the_driver() {
    let scratch = Scratch::new("smi-agree");
    let (cache, fake) = (scratch.path("cudevshr.cache"), scratch.path("fake"));
    let mut clients = vec![holder(&cache, &fake, 256), holder(&cache, &fake, 128), holder(&cache, &fake, 64)];
    let driver = driver_used(&fake);
    assert_eq!(driver, 448 * MIB + 3 * CONTEXT, "the fake counts buffers and contexts");

    let json = smi(&["--json", text(&cache)]);
    assert_eq!(json.status, 0, "{}", json.stderr);
    let doc = json.json();
    let region = &doc["containers"][0]["region"];
    assert_eq!(u64_at(region, "/devices/0/used"), driver, "{region:#}");
    assert_eq!(u64_at(region, "/devices/0/budget"), GIB);
    assert_eq!(u64_at(region, "/devices/0/contexts"), 3 * CONTEXT);
    assert_eq!(u64_at(region, "/devices/0/buffers"), 448 * MIB);
    assert_eq!(u64_at(region, "/devices/0/share"), 30);
    assert_eq!(region["devices"][0]["uuid"], UUID0);
    assert_eq!(region["devices"][1]["budget"], Value::Null, "device 1 has no budget");
    assert_eq!(region["monitor"]["holds_launches"], false);
    let processes = region["processes"].as_array().expect("processes");
    assert_eq!(processes.len(), 3, "{region:#}");
    for (client, mib) in clients.iter().zip([256, 128, 64]) {
        let process = processes
            .iter()
            .find(|p| p["pid"] == client.pid())
            .unwrap_or_else(|| panic!("pid {} missing: {processes:#?}", client.pid()));
        assert_eq!(process["alive"], true);
        assert_eq!(u64_at(process, "/devices/0/bytes"), mib * MIB + CONTEXT);
        assert_eq!(u64_at(process, "/devices/0/slot/context"), CONTEXT);
    }
    let physical = &doc["physical"];
    if physical["available"] == false {
        assert_eq!(physical["reason"], "no NVIDIA driver: physical view unavailable");
    }

    let table = smi(&[text(&cache)]);
    assert_eq!(table.status, 0, "{}", table.stderr);
    let t = &table.stdout;
    for needle in [UUID0, "1.0 GiB", &size(driver), &size(448 * MIB), &size(3 * CONTEXT), "30 %"] {
        assert!(t.contains(needle), "no {needle:?} in:\n{t}");
    }
    for client in &clients {
        let row = t.lines().find(|l| l.starts_with(&format!("{} ", client.pid()))).expect("a row per pid");
        assert!(row.contains("alive"), "{row}");
    }
    assert!(t.contains("as far as the ledger knows"), "{t}");
    if physical["available"] == false {
        assert!(t.contains("no NVIDIA driver: physical view unavailable"), "{t}");
    }

    // The physical view, through the fake's NVML: the device matched by UUID, its usage the driver's.
    let mut command = smi_command(&["--json", text(&cache)]);
    command
        .env("LD_LIBRARY_PATH", &common::artifacts().fake_driver_dir)
        .env("FAKEGPU_DEVICES", "2")
        .env("FAKEGPU_SHARED", &fake);
    let output = command.output().expect("run vgpu-smi");
    let doc: Value = serde_json::from_slice(&output.stdout).expect("JSON");
    assert_eq!(doc["physical"]["available"], true, "{doc:#}");
    assert_eq!(doc["containers"][0]["region"]["devices"][0]["physical_index"], 0);
    assert_eq!(doc["physical"]["devices"][0]["uuid"], UUID0);
    assert_eq!(u64_at(&doc, "/physical/devices/0/used"), driver);
    assert_eq!(u64_at(&doc, "/physical/devices/0/total"), 16 * GIB);

    // --watch redraws until stopped.
    let mut watch =
        smi_command(&["--watch", "0.2", text(&cache)]).stdout(Stdio::piped()).spawn().expect("watch");
    let mut stdout = watch.stdout.take().expect("stdout");
    let reader = std::thread::spawn(move || {
        let (mut screen, mut chunk) = (Vec::new(), [0u8; 4096]);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline
            && String::from_utf8_lossy(&screen).matches("\x1b[H\x1b[2J").count() < 3
        {
            match stdout.read(&mut chunk) {
                Ok(0) | Err(_) => break,
                Ok(n) => screen.extend_from_slice(&chunk[..n]),
            }
        }
        String::from_utf8_lossy(&screen).into_owned()
    });
    let screen = reader.join().expect("read watch");
    watch.kill().expect("stop watch");
    let _ = watch.wait();
    let frames = screen.matches("\x1b[H\x1b[2J").count();
    assert!(frames >= 3, "{frames} frames:\n{screen}");
    assert!(screen.contains(&size(driver)), "{screen}");

    for client in &mut clients {
        client.close_stdin();
    }
    for client in clients {
        assert!(client.finish(EXIT).success);
    }
}

#[test]
fn a_killed_process_shows_as_dead_until_reclaimed() {
    let scratch = Scratch::new("smi-dead");
    let (cache, fake) = (scratch.path("cudevshr.cache"), scratch.path("fake"));
    // Alone in its container: no sibling's watcher reclaims it.
    let mut victim = holder(&cache, &fake, 256);
    let pid = victim.pid();
    victim.kill();
    assert!(!victim.finish(EXIT).success);

    let shown = smi(&["--json", text(&cache)]).json();
    let region = &shown["containers"][0]["region"];
    let process = &region["processes"][0];
    assert_eq!(process["pid"].as_u64(), Some(pid.into()), "{region:#}");
    assert_eq!((&process["alive"], &process["dead"]), (&Value::Bool(false), &Value::Bool(true)));
    assert_eq!(u64_at(region, "/devices/0/used"), 256 * MIB + CONTEXT, "its bytes still count");
    let table = smi(&[text(&cache)]);
    let row =
        table.stdout.lines().find(|l| l.starts_with(&format!("{pid} "))).expect("a row for the dead pid");
    assert!(row.contains("DEAD"), "{}", table.stdout);
    assert!(table.stdout.contains("vgpu-smi reclaim"), "{}", table.stdout);

    let reclaim = smi(&["reclaim", "--json", text(&cache)]);
    assert_eq!(reclaim.status, 0, "{}", reclaim.stderr);
    let report = reclaim.json();
    let gone = &report["regions"][0]["reclaimed"];
    assert_eq!(gone[0]["pid"].as_u64(), Some(pid.into()), "{report:#}");
    assert_eq!(u64_at(&gone[0], "/bytes/0"), 256 * MIB + CONTEXT);
    assert_eq!(u64_at(&report, "/regions/0/used_after/0"), 0);

    let after = smi(&["--json", text(&cache)]).json();
    let region = &after["containers"][0]["region"];
    assert_eq!(region["processes"], Value::Array(vec![]), "{region:#}");
    assert_eq!(u64_at(region, "/devices/0/used"), 0);
    assert_eq!(u64_at(region, "/devices/0/slots/total"), 0, "the monitor's sums drop it too");
    let again = smi(&["reclaim", text(&cache)]);
    assert_eq!(again.status, 0);
    assert!(again.stdout.contains("no dead process"), "{}", again.stdout);
}

/// A region written by a real process that has since exited.
fn finished_region(path: &Path) -> Vec<u8> {
    let r = Run::new("direct", &["hold", "64", "64"])
        .env(SHARED_CACHE_VAR, text(path))
        .env("CUDA_DEVICE_MEMORY_LIMIT_0", "1g")
        .report_within(EXIT);
    assert!(r.success, "{r:?}");
    std::fs::read(path).expect("read region")
}

#[test]
fn broken_files_give_the_documented_errors_and_statuses() {
    let scratch = Scratch::new("smi-broken");
    let good = finished_region(&scratch.path("good.cache"));
    let ledger = 2_008_960;
    let write = |name: &str, bytes: &[u8]| {
        let path = scratch.path(name);
        std::fs::write(&path, bytes).expect("write");
        path
    };
    let mut newer = good.clone();
    newer[ledger + 8..ledger + 12].copy_from_slice(&5u32.to_le_bytes());
    let mut hami_core = good.clone();
    hami_core[ledger..ledger + 8].copy_from_slice(&[0; 8]);
    let cases = [
        (scratch.path("missing.cache"), 3, "missing", "no such file"),
        (write("file", b"").join("region.cache"), 3, "unreadable", "cannot read"),
        (write("empty.cache", b""), 4, "truncated", "empty"),
        (write("cut.cache", &good[..100_000]), 4, "truncated", "truncated"),
        (write("ledger-cut.cache", &good[..good.len() - 4096]), 4, "truncated", "libvgpu's ledger"),
        (write("text.cache", b"not a region at all\n"), 4, "not_a_region", "not a vGPU region"),
        (write("zero.cache", &vec![0; good.len()]), 4, "not_initialised", "not initialised"),
        (write("hami-core.cache", &hami_core), 4, "no_ledger", "HAMi-core"),
        (write("newer.cache", &newer), 4, "unknown_ledger_version", "newer"),
    ];
    for (path, status, kind, message) in &cases {
        let shown = smi(&[text(path)]);
        assert_eq!(shown.status, *status, "{}: {}", path.display(), shown.stderr);
        assert!(shown.stderr.contains(message) && shown.stderr.contains(text(path)), "{}", shown.stderr);
        assert!(shown.stdout.is_empty(), "{}", shown.stdout);

        let json = smi(&["--json", text(path)]);
        assert_eq!(json.status, *status);
        assert_eq!(json.json()["containers"][0]["error"]["kind"], *kind, "{}", json.stdout);

        let metrics = smi(&["metrics", text(path)]);
        assert_eq!(metrics.status, *status);
        let up = format!("vgpu_region_up{{region=\"{}\"}} 0", text(path));
        assert!(metrics.stdout.contains(&up) && metrics.stdout.ends_with("# EOF\n"), "{}", metrics.stdout);

        let before = std::fs::read(path).ok();
        let reclaim = smi(&["reclaim", text(path)]);
        assert_eq!(reclaim.status, *status, "{}", reclaim.stderr);
        assert_eq!(std::fs::read(path).ok(), before, "reclaim changed {}", path.display());
    }
    assert!(!scratch.path("missing.cache").exists(), "a command created the missing file");

    let usage = smi(&["--bogus"]);
    assert_eq!(usage.status, 2);
    assert!(
        usage.stderr.contains("unknown option --bogus") && usage.stderr.contains("Usage:"),
        "{}",
        usage.stderr
    );
    let version = smi(&["--version"]);
    assert_eq!(
        (version.status, version.stdout.trim()),
        (0, format!("vgpu-smi {}", env!("CARGO_PKG_VERSION")).as_str())
    );
}

/// A directory as HAMi's monitor sees it: one container with a live process, one whose only
/// process was killed, one that never started CUDA.
struct Containers {
    scratch: Scratch,
    live: Client,
}

impl Containers {
    fn new(name: &str) -> Containers {
        let scratch = Scratch::new(name);
        let fake = scratch.path("fake");
        let containers = scratch.path("containers");
        for dir in ["pod-a_main", "pod-b_worker", "pod-c_idle"] {
            std::fs::create_dir_all(containers.join(dir)).expect("container dir");
        }
        let live = holder(&containers.join("pod-a_main/cudevshr.cache"), &fake, 128);
        let mut dead = holder(&containers.join("pod-b_worker/cudevshr.cache"), &fake, 64);
        dead.kill();
        assert!(!dead.finish(EXIT).success);
        Containers { scratch, live }
    }

    fn dir(&self) -> PathBuf {
        self.scratch.path("containers")
    }
}

#[test]
fn a_directory_shows_one_section_per_container() {
    let c = Containers::new("smi-dir");
    let dir = c.dir();
    let shown = smi(&["--json", text(&dir)]);
    assert_eq!(shown.status, 0, "{}", shown.stderr);
    let doc = shown.json();
    let sections: Vec<(String, String, u64)> = doc["containers"]
        .as_array()
        .expect("containers")
        .iter()
        .map(|c| {
            (
                c["pod_uid"].as_str().unwrap().into(),
                c["container"].as_str().unwrap().into(),
                u64_at(c, "/region/devices/0/used"),
            )
        })
        .collect();
    assert_eq!(
        sections,
        [
            ("pod-a".into(), "main".into(), 128 * MIB + CONTEXT),
            ("pod-b".into(), "worker".into(), 64 * MIB + CONTEXT)
        ]
    );
    assert_eq!(doc["without_region"], serde_json::json!(["pod-c_idle"]));
    assert_eq!(doc["containers"][0]["region"]["processes"][0]["pid"].as_u64(), Some(c.live.pid().into()));
    assert_eq!(doc["containers"][1]["region"]["processes"][0]["dead"], true);

    let table = smi(&[text(&dir)]).stdout;
    assert!(
        table.contains("== container main, pod pod-a") && table.contains("== container worker, pod pod-b"),
        "{table}"
    );
    assert!(table.contains("no region file yet (no process there has started CUDA): pod-c_idle"), "{table}");

    // A broken container does not hide the others; the status is its error's.
    std::fs::write(dir.join("pod-b_worker/cudevshr.cache"), b"garbage").expect("write");
    let shown = smi(&[text(&dir)]);
    assert_eq!(shown.status, 4);
    assert!(
        shown.stdout.contains("not a vGPU region") && shown.stdout.contains(&size(128 * MIB + CONTEXT)),
        "{}",
        shown.stdout
    );
}

/// What `vgpu-smi serve` answers `GET path` with: the status line, the headers and the body.
fn scrape(port: u16, path: &str, accept: &str) -> (String, String, String) {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect to vgpu-smi serve");
    stream.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    write!(stream, "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: {accept}\r\nConnection: close\r\n\r\n")
        .expect("send request");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("read response");
    let (head, body) = response.split_once("\r\n\r\n").expect("headers end");
    let (status, headers) = head.split_once("\r\n").unwrap_or((head, ""));
    (status.to_owned(), headers.to_owned(), body.to_owned())
}

#[test]
fn metrics_pass_promtool_and_serve_answers_a_scrape_with_the_same_text() {
    let c = Containers::new("smi-metrics");
    let dir = c.dir();
    let metrics = smi(&["metrics", text(&dir)]);
    assert_eq!(metrics.status, 0, "{}", metrics.stderr);
    let m = &metrics.stdout;
    let a = format!(
        "region=\"{}\",pod_uid=\"pod-a\",container=\"main\"",
        text(&dir.join("pod-a_main/cudevshr.cache"))
    );
    let b = format!(
        "region=\"{}\",pod_uid=\"pod-b\",container=\"worker\"",
        text(&dir.join("pod-b_worker/cudevshr.cache"))
    );
    for sample in [
        format!(
            "vgpu_memory_used_bytes{{{a},vdevice_index=\"0\",device_uuid=\"{UUID0}\"}} {}",
            128 * MIB + CONTEXT
        ),
        format!("vgpu_memory_limit_bytes{{{a},vdevice_index=\"0\",device_uuid=\"{UUID0}\"}} {GIB}"),
        format!("vgpu_memory_context_bytes{{{a},vdevice_index=\"0\",device_uuid=\"{UUID0}\"}} {CONTEXT}"),
        format!("vgpu_compute_limit_percent{{{a},vdevice_index=\"0\",device_uuid=\"{UUID0}\"}} 30"),
        format!("vgpu_leases{{{a},owner=\"alive\"}} 1"),
        format!("vgpu_leases{{{b},owner=\"dead\"}} 1"),
        format!("vgpu_process_alive{{{a},pid=\"{}\",lease=\"0\"}} 1", c.live.pid()),
        format!("vgpu_launches_held{{{a}}} 0"),
        "vgpu_physical_view_available 0".to_owned(),
    ] {
        assert!(m.contains(&format!("{sample}\n")), "no {sample:?} in:\n{m}");
    }
    assert!(m.ends_with("# EOF\n"));

    common::promtool_check(m);

    // No reclaim: serve gives the dead worker's lease back at once (tests/busy_node.rs), and the
    // scrape must read what `metrics` read.
    let mut server = smi_command(&["serve", "--listen", "127.0.0.1:0", "--no-reclaim", text(&dir)])
        .stderr(Stdio::piped())
        .spawn()
        .expect("start vgpu-smi serve");
    let mut line = String::new();
    BufReader::new(server.stderr.take().expect("stderr"))
        .read_line(&mut line)
        .expect("read where it listens");
    let port: u16 = line
        .split("http://127.0.0.1:")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .and_then(|port| port.parse().ok())
        .unwrap_or_else(|| panic!("no port in {line:?}"));
    let started = Instant::now();
    let (status, headers, body) =
        scrape(port, "/metrics", "application/openmetrics-text;version=1.0.0,text/plain;q=0.5");
    assert!(status.contains("200"), "{status}");
    assert!(
        headers.to_ascii_lowercase().contains("content-type: application/openmetrics-text; version=1.0.0"),
        "{headers}"
    );
    assert_eq!(body, *m, "a scrape differs from `vgpu-smi metrics`");
    let (_, headers, plain) = scrape(port, "/metrics", "text/plain");
    assert!(headers.to_ascii_lowercase().contains("content-type: text/plain; version=0.0.4"), "{headers}");
    assert_eq!(plain, *m);
    // Read afresh on every scrape: the live container's process exits and leaves.
    let mut live = c.live;
    live.close_stdin();
    assert!(live.finish(EXIT).success);
    let (_, _, after) = scrape(port, "/metrics", "text/plain");
    assert!(after.contains(&format!("vgpu_leases{{{a},owner=\"alive\"}} 0\n")), "{after}");
    let (status, _, _) = scrape(port, "/other", "*/*");
    assert!(status.contains("404"), "{status}");
    assert!(started.elapsed() < Duration::from_secs(10));
    server.kill().expect("stop vgpu-smi serve");
    let _ = server.wait();
}

#[test]
fn overcommitted_memory_is_shown_in_the_table_json_and_metrics() {
    let scratch = Scratch::new("smi-overcommit");
    let (cache, fake) = (scratch.path("cudevshr.cache"), scratch.path("fake"));
    // 3 GiB of spillable memory under a 4 GiB budget on a 2 GiB card.
    let mut client = Run::new("direct", &["hold", "512", "3072"])
        .env(SHARED_CACHE_VAR, text(&cache))
        .env("CUDA_DEVICE_MEMORY_LIMIT_0", "4g")
        .env("CUDA_OVERSUBSCRIBE", "true")
        .env("FAKEGPU_MEMORY", "2g")
        .env("FAKEGPU_SHARED", text(&fake))
        .spawn();
    client.wait_for("ready", READY);
    assert_eq!(client.get("held_bytes"), 3 * GIB);

    let doc = smi(&["--json", text(&cache)]).json();
    let region = &doc["containers"][0]["region"];
    assert_eq!(region["devices"][0]["overcommit"], true, "{region:#}");
    assert_eq!(region["devices"][0]["spilled"], true);
    assert_eq!(u64_at(region, "/devices/0/spillable"), 3 * GIB);
    assert_eq!(u64_at(region, "/devices/0/budget"), 4 * GIB);
    assert_eq!(u64_at(region, "/processes/0/devices/0/spillable"), 3 * GIB);
    assert_eq!(region["processes"][0]["counts_spillable"], true);

    let table = smi(&[text(&cache)]).stdout;
    assert!(
        table.contains("overcommit 0: 3.0 GiB of the 3.0 GiB in use may spill to host memory"),
        "{table}"
    );

    let metrics = smi(&["metrics", text(&cache)]);
    assert_eq!(metrics.status, 0, "{}", metrics.stderr);
    let m = &metrics.stdout;
    let labels = format!("region=\"{}\",vdevice_index=\"0\",device_uuid=\"{UUID0}\"", text(&cache));
    for sample in [
        format!("vgpu_memory_overcommit{{{labels}}} 1"),
        format!("vgpu_memory_spillable_bytes{{{labels}}} {}", 3 * GIB),
    ] {
        assert!(m.contains(&format!("{sample}\n")), "no {sample:?} in:\n{m}");
    }
    assert!(m.contains("vgpu_process_memory_spillable_bytes{"), "{m}");
    if let Ok(mut promtool) = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        promtool.stdin.take().expect("stdin").write_all(m.as_bytes()).expect("feed promtool");
        let out = promtool.wait_with_output().expect("promtool");
        assert!(
            out.status.success(),
            "promtool: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    client.close_stdin();
    assert!(client.finish(EXIT).success);
}

#[test]
fn without_sys_ptrace_the_host_pids_of_other_users_are_unknown_and_one_line_says_why() {
    // A node agent in a container with the runtime's default capabilities (Docker's and
    // containerd's set, without CAP_SYS_PTRACE) cannot read another user's /proc/PID/maps, where
    // the host pid is found; with SYS_PTRACE added it can.
    use std::os::unix::fs::PermissionsExt;
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "this test runs a process as another user, which needs root");
    let artifacts = common::artifacts();
    let s = Scratch::in_memory("smi-no-ptrace");
    std::fs::set_permissions(&s.dir, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let copy = |from: &Path, name: &str| {
        let to = s.path(name);
        std::fs::copy(from, &to).expect("copy");
        std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        to
    };
    let client = copy(&artifacts.client, "client");
    let libvgpu = copy(&artifacts.libvgpu, "libvgpu.so");
    let driver = s.path("driver");
    std::fs::create_dir_all(&driver).expect("mkdir");
    std::fs::set_permissions(&driver, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    for name in ["libcuda.so.1", "libnvidia-ml.so.1"] {
        let to = driver.join(name);
        std::fs::copy(artifacts.fake_driver_dir.join(name), &to).expect("copy the fake driver");
        std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    let region = s.path("region.cache");
    let mut other = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(&client)
        .args(["direct", "hold", "64", "64"])
        .env_clear()
        .env("LD_LIBRARY_PATH", &driver)
        .env("LD_PRELOAD", &libvgpu)
        .env("CUDA_DEVICE_MEMORY_LIMIT_0", "1g")
        .env(SHARED_CACHE_VAR, &region)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("run setpriv");
    let mut lines = BufReader::new(other.stdout.take().expect("stdout")).lines();
    assert!(
        lines.any(|line| line.is_ok_and(|line| line == "ready=1")),
        "the other user's client never got ready"
    );
    let host_pid = |smi: &Smi| smi.json()["containers"][0]["region"]["processes"][0]["host_pid"].clone();

    let with_ptrace = smi(&["--json", text(&region)]);
    assert_eq!(host_pid(&with_ptrace), Value::from(other.id()), "{}", with_ptrace.stdout);
    assert!(!with_ptrace.stderr.contains("/proc/PID/maps"), "{}", with_ptrace.stderr);

    let as_agent = |capabilities: &str| {
        let output = Command::new("setpriv")
            .arg(format!("--bounding-set=-all,{capabilities}"))
            .arg("--")
            .arg(common::smi_binary())
            .args(["--json", text(&region)])
            .env_remove(SHARED_CACHE_VAR)
            .env_remove("LD_PRELOAD")
            .output()
            .expect("run vgpu-smi with a container's capabilities");
        Smi {
            status: output.status.code().expect("exited"),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    };
    const DEFAULT: &str = "+chown,+dac_override,+fsetid,+fowner,+mknod,+net_raw,+setgid,+setuid,+setfcap,\
                           +setpcap,+net_bind_service,+sys_chroot,+kill,+audit_write";
    let with_ptrace = as_agent(&format!("{DEFAULT},+sys_ptrace"));
    assert_eq!(host_pid(&with_ptrace), Value::from(other.id()), "{}", with_ptrace.stdout);
    assert!(!with_ptrace.stderr.contains("/proc/PID/maps"), "{}", with_ptrace.stderr);
    let without = as_agent(DEFAULT);
    assert_eq!(without.status, 0, "{}", without.stderr);
    assert_eq!(host_pid(&without), Value::Null, "{}", without.stdout);
    let said: Vec<&str> = without.stderr.lines().filter(|line| line.contains("/proc/PID/maps")).collect();
    assert_eq!(said.len(), 1, "{}", without.stderr);
    assert!(said[0].contains("host pids are unknown") && said[0].contains("SYS_PTRACE"), "{}", said[0]);
    drop(other.stdin.take());
    assert!(other.wait().expect("wait").success());
}
