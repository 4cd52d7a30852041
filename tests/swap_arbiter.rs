//! The swap arbiter (`vgpu-smi serve --swap`) against swap tables written as containers'
//! processes write them, with no GPU and no libvgpu: the processes are this test binary run again
//! as lease holders (`lease_holder`), their records written by the test. Within a second of
//! `serve` starting, the idle process is asked to swap out for the waiting one of another
//! container; a busy process is not asked until it goes idle, and a dead lease's record, though
//! the least recently active, never is; with nobody idle, a busy one is forced out once the waiter
//! has waited `--swap-force-ms`, asked for the room the waiter lacks in whole 64 MiB chunks. The
//! table, `--json`, the metrics and `doctor` show the swap figures and the arbiter, a container
//! without a swap table shows nothing new, and one whose table is a link to another container's is
//! refused.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

use common::{GIB, MIB, Scratch};
use serde_json::Value;
use vgpu_ledger::config::Config;
use vgpu_ledger::swap::{Phase, SwapTable, Word, state_word};

/// Where a lease holder finds its region (set only for the child processes).
const HOLD: &str = "VGPU_TEST_SWAP_HOLD_REGION";
/// The lease holder's `CUDA_TASK_PRIORITY`, when set.
const HOLD_PRIORITY: &str = "VGPU_TEST_SWAP_HOLD_PRIORITY";
const UUID: &str = "GPU-face0000-0000-4e00-8000-000000000000";

/// Not a test: the lease holder the tests start as a child process (this binary, with `HOLD`
/// set). It takes a lease in that region as a process of an overcommitted container does, prints
/// `lease=K pid=P`, and keeps the lease until its stdin closes.
/// A process's activity kept fresh (its `active_ns` written every 5 ms), as a process that keeps
/// launching work would, until [`Working::stop`].
struct Working {
    on: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

impl Working {
    fn start(region: &Path, lease: usize) -> Working {
        let on = Arc::new(AtomicBool::new(true));
        let table = SwapTable::open_for_process(region).expect("table");
        let flag = Arc::clone(&on);
        let thread = std::thread::spawn(move || {
            while flag.load(Ordering::Acquire) {
                table.get(lease, 0, Word::ActiveNs).store(vgpu_ledger::pace::now(), Ordering::Release);
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        Working { on, thread }
    }

    fn stop(self) {
        self.on.store(false, Ordering::Release);
        self.thread.join().expect("activity thread");
    }
}

#[test]
fn lease_holder() {
    let Some(region) = std::env::var_os(HOLD) else { return };
    let priority = std::env::var(HOLD_PRIORITY).ok();
    let vars = [
        ("CUDA_DEVICE_MEMORY_LIMIT_0", "4g"),
        ("CUDA_OVERSUBSCRIBE", "true"),
        ("CUDA_DEVICE_MEMORY_SHARED_CACHE", region.to_str().expect("a UTF-8 path")),
    ];
    let priority = priority.iter().map(|p| ("CUDA_TASK_PRIORITY", p.as_str()));
    let config =
        Config::from_vars(vars.into_iter().chain(priority).map(|(k, v)| (k.to_owned(), v.to_owned())));
    let ledger = vgpu_ledger::attach(&config, || vec![UUID.as_bytes().to_vec()]);
    ledger.try_reserve(0, MIB).expect("a charge, and so a lease");
    let place = ledger.swap_place(0).expect("a lease in the shared region");
    println!("lease={} pid={}", place.lease, std::process::id());
    std::io::stdout().flush().expect("stdout");
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
    std::process::exit(0);
}

/// A process of a container holding a lease.
struct Holder {
    child: Child,
    _stdin: ChildStdin,
    lease: usize,
    pid: u32,
}

fn hold(region: &Path) -> Holder {
    hold_with_priority(region, None)
}

/// A lease holder whose container has `CUDA_TASK_PRIORITY` set to `priority`.
fn hold_with_priority(region: &Path, priority: Option<i32>) -> Holder {
    let mut command = Command::new(std::env::current_exe().expect("this test binary"));
    if let Some(priority) = priority {
        command.env(HOLD_PRIORITY, priority.to_string());
    }
    let mut child = command
        .args(["lease_holder", "--exact", "--nocapture", "--test-threads=1"])
        .env(HOLD, region)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start a lease holder");
    let stdin = child.stdin.take().expect("stdin");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    // libtest writes `test lease_holder ... ` before the test's own output, on the same line.
    let line = lines
        .find_map(|line| Some(line.ok()?.split_once("lease=")?.1.to_owned()))
        .map(|rest| format!("lease={rest}"))
        .expect("the holder says its lease");
    let field = |name: &str| -> u64 {
        line.split_whitespace()
            .find_map(|word| word.strip_prefix(name))
            .and_then(|value| value.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {line:?}"))
    };
    Holder { lease: field("lease=") as usize, pid: field("pid=") as u32, child, _stdin: stdin }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Writes a record as its process would: `phase`, waiting for `wanted` bytes (0: not waiting),
/// `resident` and `swapped` bytes, last active at `active_ns`.
fn write(
    table: &SwapTable,
    holder: &Holder,
    phase: Phase,
    wanted: u64,
    resident: u64,
    swapped: u64,
    active_ns: u64,
) {
    let word = |word| table.get(holder.lease, 0, word);
    word(Word::Wanted).store(wanted, Ordering::Release);
    word(Word::Resident).store(resident, Ordering::Release);
    word(Word::Swapped).store(swapped, Ordering::Release);
    word(Word::ActiveNs).store(active_ns, Ordering::Release);
    word(Word::State).store(state_word(phase, wanted > 0, holder.pid), Ordering::Release);
}

fn request(table: &SwapTable, holder: &Holder) -> u64 {
    table.get(holder.lease, 0, Word::Request).load(Ordering::Acquire)
}

fn smi(args: &[&str]) -> (i32, String) {
    let output = Command::new(common::smi_binary())
        .args(args)
        .env_remove("CUDA_DEVICE_MEMORY_SHARED_CACHE")
        .env_remove("CUDA_OVERSUBSCRIBE")
        .env_remove("LD_PRELOAD")
        .output()
        .expect("run vgpu-smi");
    (output.status.code().unwrap_or(-1), String::from_utf8_lossy(&output.stdout).into_owned())
}

fn text(path: &Path) -> &str {
    path.to_str().expect("a UTF-8 path")
}

/// `vgpu-smi serve --swap ARGS` on `dir`: the child, its port and its stderr lines as they come.
fn serve(dir: &Path, args: &[&str]) -> (Child, u16, Receiver<String>) {
    let mut server = Command::new(common::smi_binary())
        .args(["serve", "--listen", "127.0.0.1:0", "--no-reclaim", "--swap"])
        .args(args)
        .arg(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start vgpu-smi serve --swap");
    let mut stderr = BufReader::new(server.stderr.take().expect("stderr"));
    let mut first = String::new();
    stderr.read_line(&mut first).expect("where it listens");
    let port = first
        .split("http://127.0.0.1:")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .and_then(|port| port.parse().ok())
        .unwrap_or_else(|| panic!("no port in {first:?}"));
    let (lines, received) = channel();
    std::thread::spawn(move || {
        for line in stderr.lines().map_while(Result::ok) {
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    (server, port, received)
}

fn scrape(port: u16) -> String {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect to serve");
    stream.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    write!(stream, "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").expect("request");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("response");
    response.split_once("\r\n\r\n").expect("headers end").1.to_owned()
}

/// Polls `done` every millisecond until it holds or `within` passes; how long it took.
fn within(within: Duration, mut done: impl FnMut() -> bool) -> Option<Duration> {
    let started = Instant::now();
    while started.elapsed() < within {
        if done() {
            return Some(started.elapsed());
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    None
}

#[test]
fn the_idle_process_is_asked_for_the_waiting_one_and_the_operator_sees_it() {
    let scratch = Scratch::in_memory("swap-arbiter");
    let region = |container: &str| -> PathBuf {
        let dir = scratch.path(container);
        std::fs::create_dir_all(&dir).expect("container dir");
        dir.join("cudevshr.cache")
    };
    let (region_a, region_b, region_c) = (region("pod-a_main"), region("pod-b_main"), region("pod-c_main"));
    // Container A: an idle process, and a dead one whose record is the least recently active.
    // Container B: a process waiting for room, and a busy one. Container C: no swap table.
    let (idle, dead) = (hold(&region_a), hold(&region_a));
    let (waiter, busy) = (hold(&region_b), hold(&region_b));
    let _other = hold(&region_c);
    // Container D's tenant names container A's region (and table) as its own table, where an
    // earlier build kept it: a link, never followed.
    let region_d = region("pod-d_main");
    let _linker = hold(&region_d);
    std::os::unix::fs::symlink(&region_a, vgpu_ledger::swap::legacy_path_for(&region_d))
        .expect("a link where an earlier build kept D's table");
    let table_a = SwapTable::open_for_process(&region_a).expect("container A's swap table");
    let table_b = SwapTable::open_for_process(&region_b).expect("container B's swap table");
    let now = vgpu_ledger::pace::now();
    write(&table_a, &idle, Phase::Resident, 0, GIB, 0, now.saturating_sub(10_000_000_000));
    write(&table_a, &dead, Phase::Resident, 0, 2 * GIB, 0, 1);
    write(&table_b, &waiter, Phase::Out, GIB, 0, GIB, now.saturating_sub(20_000_000_000));
    table_b.get(waiter.lease, 0, Word::SwapIns).store(2, Ordering::Release);
    table_b.get(waiter.lease, 0, Word::SwapOuts).store(3, Ordering::Release);
    table_b.get(waiter.lease, 0, Word::WaitNs).store(1_500_000_000, Ordering::Release);
    write(&table_b, &busy, Phase::Resident, 0, 512 * MIB, 0, now);
    let mut dead = dead;
    dead.child.kill().expect("kill the dead one");
    dead.child.wait().expect("reap it");
    // The busy process keeps launching work (the arbiter runs with a 500 ms idle threshold, so
    // that a loaded machine's scheduling cannot make it look idle).
    let working = Working::start(&region_b, busy.lease);

    // No arbiter yet: doctor says overcommitted memory spills through unified memory.
    let (_, doctor) = smi(&["doctor", "--library", "/nonexistent/libvgpu.so", text(&region_b)]);
    assert!(
        doctor.contains(
            "no swap arbiter: overcommitted memory spills through unified memory (CUDA_OVERSUBSCRIBE)"
        ),
        "{doctor}"
    );

    let (mut server, port, log) = serve(&scratch.dir, &["--swap-idle-ms", "500"]);
    let asked = within(Duration::from_secs(1), || request(&table_a, &idle) == 1);
    assert!(asked.is_some(), "the idle process was not asked within a second");
    eprintln!("the idle process was asked {:?} after serve listened", asked.unwrap());
    let serve_pid = u64::from(server.id());
    for table in [&table_a, &table_b] {
        assert_eq!(table.arbiter_pid().load(Ordering::Acquire), serve_pid);
        let beat = table.heartbeat().load(Ordering::Acquire);
        assert!(beat > now && vgpu_ledger::pace::now() - beat < 1_000_000_000, "heartbeat {beat}");
    }

    // The idle process swaps out, as the library does, and says it handled the request.
    write(&table_a, &idle, Phase::Out, 0, 0, GIB, now.saturating_sub(10_000_000_000));
    table_a.get(idle.lease, 0, Word::SwapOuts).store(1, Ordering::Release);
    table_a.get(idle.lease, 0, Word::Handled).store(1, Ordering::Release);
    // The waiter still waits: nobody else may be asked, the busy one because it works, the dead
    // one because its lease is dead.
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(request(&table_a, &dead), 0, "a dead lease's record was asked");
    assert_eq!(request(&table_b, &busy), 0, "a busy process was asked");
    assert_eq!(request(&table_b, &waiter), 0, "the waiting process was asked");
    assert_eq!(request(&table_a, &idle), 1, "the process swapped out was asked again");

    let lines: Vec<String> = log.try_iter().collect();
    let expected = format!(
        "vgpu-smi: swap: asked pod-a_main pid {} (lease {}) to swap out 1.0 GiB (1073741824 bytes) of {UUID} \
         (its device 0), idle for",
        idle.pid, idle.lease
    );
    let line = lines.iter().find(|line| line.starts_with(&expected)).unwrap_or_else(|| panic!("{lines:#?}"));
    assert!(
        line.contains(&format!(
            "for pod-b_main pid {} (lease {}) waiting for 1.0 GiB on it; request 1",
            waiter.pid, waiter.lease
        )),
        "{line}"
    );
    assert_eq!(lines.iter().filter(|line| line.contains("swap: asked")).count(), 1, "{lines:#?}");

    // The operator's view: the table, --json, the metrics and doctor.
    let (status, table) = smi(&[text(&scratch.dir)]);
    assert_eq!(status, 0, "{table}");
    let swap_lines: Vec<&str> = table.lines().filter(|line| line.starts_with("swap ")).collect();
    assert_eq!(swap_lines.len(), 2, "one line per container that swaps, none for C:\n{table}");
    assert!(table.contains("swap: cannot read "), "D's link is reported:\n{table}");
    assert!(
        swap_lines[0]
            .starts_with("swap 0: 0 B on the card, 1.0 GiB swapped out; 0 swap-in(s), 1 swap-out(s)"),
        "{table}"
    );
    assert!(swap_lines[0].contains(&format!("pid {} swapped out 1.0 GiB", idle.pid)), "{table}");
    assert!(swap_lines[0].contains(&format!("arbiter pid {serve_pid}, last pass")), "{table}");
    assert!(
        swap_lines[1].starts_with(
            "swap 0: 512.0 MiB on the card, 1.0 GiB swapped out; 2 swap-in(s), 3 swap-out(s), 1.500 s waiting"
        ),
        "{table}"
    );
    assert!(
        swap_lines[1].contains(&format!("pid {} swapped out 1.0 GiB (waiting for 1.0 GiB)", waiter.pid)),
        "{table}"
    );
    assert!(swap_lines[1].contains(&format!("pid {} resident 512.0 MiB", busy.pid)), "{table}");

    let (status, json) = smi(&["--json", text(&scratch.dir)]);
    assert_eq!(status, 0, "{json}");
    let doc: Value = serde_json::from_str(&json).expect("JSON");
    let containers = doc["containers"].as_array().expect("containers");
    let swap_of = |pod: &str| &containers.iter().find(|c| c["pod_uid"] == pod).expect(pod)["swap"];
    assert_eq!(swap_of("pod-c"), &Value::Null, "a container without a swap table shows nothing new");
    let d = swap_of("pod-d");
    assert!(d["error"].as_str().is_some_and(|why| why.contains("symbolic link")), "{d:#}");
    assert_eq!(d["devices"], Value::Array(Vec::new()), "{d:#}");
    let b = swap_of("pod-b");
    assert_eq!(b["error"], Value::Null, "{b:#}");
    assert_eq!(b["arbiter"]["pid"], serve_pid, "{b:#}");
    assert_eq!(b["arbiter"]["active"], true);
    let device = &b["devices"][0];
    assert_eq!((device["index"].as_u64(), device["uuid"].as_str()), (Some(0), Some(UUID)), "{b:#}");
    assert_eq!(device["resident"], 512 * MIB);
    assert_eq!(device["swapped"], GIB);
    assert_eq!(device["swap_ins"], 2);
    assert_eq!(device["swap_outs"], 3);
    assert_eq!(device["wait_seconds"], 1.5);
    assert_eq!(device["waiting"], 1);
    let process = |pid: u32| {
        device["processes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["pid"] == pid)
            .unwrap_or_else(|| panic!("{b:#}"))
    };
    assert_eq!(process(waiter.pid)["phase"], "swapped out");
    assert_eq!(process(waiter.pid)["waiting"], true);
    assert_eq!(process(waiter.pid)["wanted"], GIB);
    assert_eq!(process(busy.pid)["phase"], "resident");
    let a = swap_of("pod-a");
    let processes = a["devices"][0]["processes"].as_array().expect("processes");
    assert_eq!(processes.len(), 1, "the dead lease's record is not shown: {a:#}");
    assert_eq!((processes[0]["requests"].as_u64(), processes[0]["handled"].as_u64()), (Some(1), Some(1)));

    let metrics = scrape(port);
    let labels = |pod: &str| {
        let region = scratch.path(&format!("{pod}_main")).join("cudevshr.cache");
        format!("region=\"{}\",pod_uid=\"{pod}\",container=\"main\"", text(&region))
    };
    let device = format!("vdevice_index=\"0\",device_uuid=\"{UUID}\"");
    let (a, b) = (labels("pod-a"), labels("pod-b"));
    for sample in [
        format!("vgpu_swap_resident_bytes{{{a},{device}}} 0"),
        format!("vgpu_swap_swapped_bytes{{{a},{device}}} {GIB}"),
        format!("vgpu_swap_resident_bytes{{{b},{device}}} {}", 512 * MIB),
        format!("vgpu_swap_swapped_bytes{{{b},{device}}} {GIB}"),
        format!("vgpu_swap_waiting_processes{{{b},{device}}} 1"),
        format!("vgpu_swap_outs_total{{{a},pid=\"{}\",lease=\"{}\",{device}}} 1", idle.pid, idle.lease),
        format!("vgpu_swap_ins_total{{{b},pid=\"{}\",lease=\"{}\",{device}}} 2", waiter.pid, waiter.lease),
        format!(
            "vgpu_swap_wait_seconds_total{{{b},pid=\"{}\",lease=\"{}\",{device}}} 1.5",
            waiter.pid, waiter.lease
        ),
        format!("vgpu_swap_requests_total{{device_uuid=\"{UUID}\",kind=\"idle\"}} 1"),
        format!("vgpu_swap_requests_total{{device_uuid=\"{UUID}\",kind=\"forced\"}} 0"),
        "# TYPE vgpu_swap_requests_total counter".to_owned(),
    ] {
        assert!(metrics.contains(&format!("{sample}\n")), "no {sample:?} in:\n{metrics}");
    }
    assert!(
        !metrics.lines().any(|line| {
            line.starts_with("vgpu_swap")
                && (line.contains("pod_uid=\"pod-c\"") || line.contains("pod_uid=\"pod-d\""))
        }),
        "containers C and D have no swap table that can be read:\n{metrics}"
    );
    common::promtool_check(&metrics);

    let (_, doctor) = smi(&["doctor", "--library", "/nonexistent/libvgpu.so", text(&region_b)]);
    let mode = format!("swap: the node's arbiter (pid {serve_pid}) last ran ");
    assert!(doctor.contains(&mode), "{doctor}");
    assert!(doctor.contains("ms ago: idle processes' memory is swapped out whole"), "{doctor}");

    // A container that starts now is found as soon as its first process makes its table: that
    // process waits 300 ms for an arbiter's heartbeat before spilling through unified memory.
    let region_e = region("pod-e_main");
    let _newcomer = hold(&region_e);
    std::thread::sleep(Duration::from_millis(100));
    let table_e = SwapTable::open_for_process(&region_e).expect("container E's swap table");
    let found = within(Duration::from_secs(2), || table_e.heartbeat().load(Ordering::Acquire) != 0);
    eprintln!("a new container's swap table had the arbiter's heartbeat after {found:?}");
    assert!(found.is_some_and(|after| after < Duration::from_millis(300)), "{found:?}");

    // Once the busy process stops working, it is the next one asked.
    working.stop();
    let asked = within(Duration::from_secs(2), || request(&table_b, &busy) == 1);
    assert!(asked.is_some(), "the process gone idle was not asked");
    assert_eq!(request(&table_a, &dead), 0, "a dead lease's record was asked");

    server.kill().expect("stop serve");
    let _ = server.wait();
}

#[test]
fn with_nobody_idle_a_busy_process_is_forced_out_once_the_waiter_has_waited() {
    let scratch = Scratch::in_memory("swap-arbiter-forced");
    let region = |container: &str| -> PathBuf {
        let dir = scratch.path(container);
        std::fs::create_dir_all(&dir).expect("container dir");
        dir.join("cudevshr.cache")
    };
    let (region_a, region_b) = (region("pod-a_main"), region("pod-b_main"));
    let (busy, waiter) = (hold(&region_a), hold(&region_b));
    let table_a = SwapTable::open_for_process(&region_a).expect("container A's swap table");
    let table_b = SwapTable::open_for_process(&region_b).expect("container B's swap table");
    let now = vgpu_ledger::pace::now();
    // The waiter lacks 300 MiB: the busy process is asked for 320 MiB (five chunks), not its 1 GiB.
    write(&table_a, &busy, Phase::Resident, 0, GIB, 0, now);
    write(&table_b, &waiter, Phase::Out, 300 * MIB, 0, GIB, now.saturating_sub(1_000_000_000));
    let working = Working::start(&region_a, busy.lease);

    let (mut server, port, log) = serve(&scratch.dir, &["--swap-idle-ms", "500", "--swap-force-ms", "400"]);
    let started = Instant::now();
    let asked = within(Duration::from_secs(3), || request(&table_a, &busy) == 1);
    let after = started.elapsed();
    working.stop();
    assert!(asked.is_some(), "the busy process was not forced out");
    eprintln!("the busy process was forced out {after:?} after serve listened");
    assert!(after >= Duration::from_millis(400), "forced before the waiter had waited 400 ms: {after:?}");
    assert_eq!(table_a.get(busy.lease, 0, Word::Forced).load(Ordering::Acquire), 1, "the request is forced");
    let amount = table_a.get(busy.lease, 0, Word::Amount).load(Ordering::Acquire);
    assert_eq!(amount, 320 * MIB, "the waiter's 300 MiB in whole chunks");

    let metrics = scrape(port);
    let sample = format!("vgpu_swap_requests_total{{device_uuid=\"{UUID}\",kind=\"forced\"}} 1\n");
    assert!(metrics.contains(&sample), "no {sample:?} in:\n{metrics}");
    server.kill().expect("stop serve");
    let _ = server.wait();
    let lines: Vec<String> = log.try_iter().collect();
    let line = lines.iter().find(|line| line.contains("swap: asked")).unwrap_or_else(|| panic!("{lines:#?}"));
    assert!(
        line.contains(&format!(
            "asked pod-a_main pid {} (lease {}) to swap out 320.0 MiB (335544320 bytes) of the 1.0 GiB it holds \
             on {UUID} (its device 0)",
            busy.pid, busy.lease
        )) && line.contains("FORCED though busy")
            && line.contains(&format!(
                "for pod-b_main pid {} (lease {}) which has waited",
                waiter.pid, waiter.lease
            ))
            && line.contains("s for 300.0 MiB on it"),
        "{line}"
    );
}

#[test]
fn a_busy_holder_of_lower_priority_gives_way_at_once_and_one_of_equal_priority_waits_for_the_timeout() {
    // Container B (priority 0, a server) waits for 1 GiB; container A holds it and keeps working.
    // The force timeout is a minute: A, of priority 1, is forced at once all the same; of priority
    // 0, it is left alone.
    for low in [true, false] {
        let scratch = Scratch::in_memory(if low { "swap-arbiter-priority" } else { "swap-arbiter-equal" });
        let region = |container: &str| -> PathBuf {
            let dir = scratch.path(container);
            std::fs::create_dir_all(&dir).expect("container dir");
            dir.join("cudevshr.cache")
        };
        let (region_a, region_b) = (region("pod-a_train"), region("pod-b_serve"));
        let busy = hold_with_priority(&region_a, Some(if low { 1 } else { 0 }));
        let waiter = hold_with_priority(&region_b, Some(0));
        let table_a = SwapTable::open_for_process(&region_a).expect("container A's swap table");
        let table_b = SwapTable::open_for_process(&region_b).expect("container B's swap table");
        let now = vgpu_ledger::pace::now();
        write(&table_a, &busy, Phase::Resident, 0, 4 * GIB, 0, now);
        write(&table_b, &waiter, Phase::Out, GIB, 0, GIB, now);
        let working = Working::start(&region_a, busy.lease);

        let (mut server, port, log) = serve(&scratch.dir, &["--swap-force-ms", "60000"]);
        let asked = within(Duration::from_secs(if low { 3 } else { 1 }), || request(&table_a, &busy) == 1);
        working.stop();
        let metrics = scrape(port);
        server.kill().expect("stop serve");
        let _ = server.wait();
        let lines: Vec<String> = log.try_iter().collect();
        if !low {
            assert!(asked.is_none(), "a busy holder of equal priority was asked before the force timeout");
            continue;
        }
        let after = asked.expect("the busy holder of lower priority was not asked");
        eprintln!("the lower-priority holder was forced out {after:?} after serve listened");
        assert_eq!(
            table_a.get(busy.lease, 0, Word::Forced).load(Ordering::Acquire),
            1,
            "the request is forced"
        );
        let amount = table_a.get(busy.lease, 0, Word::Amount).load(Ordering::Acquire);
        assert_eq!(amount, GIB, "the waiter's room, not the holder's 4 GiB");
        let sample = format!("vgpu_swap_priority_requests_total{{device_uuid=\"{UUID}\"}} 1\n");
        assert!(metrics.contains(&sample), "no {sample:?} in:\n{metrics}");
        let line =
            lines.iter().find(|line| line.contains("swap: asked")).unwrap_or_else(|| panic!("{lines:#?}"));
        assert!(
            line.contains("FORCED though busy")
                && line.contains("its priority 1 is lower than that of pod-b_serve")
                && line.contains("priority 0, which waits for 1.0 GiB on it, so it gives way at once"),
            "{line}"
        );
    }
}
