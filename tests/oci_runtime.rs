//! libvgpu in real OCI containers (runc by default, `VGPU_OCI_RUNTIME=crun` for crun), with the
//! restrictions production pods have and deployed as HAMi deploys it: see `tests/oci/mod.rs` for
//! the spec and docs/container-budget.md ("Under an OCI runtime") for what is run and why.
//!
//! Two pods of two containers each share the fake's card (`FAKEGPU_SHARED`); `vgpu-smi serve`
//! runs in a container of its own with the node's container folder and the host's pids. Every
//! scenario asserts what the container's processes were given and what the node sees. The test
//! skips, with one line, only where this machine cannot make namespaces (not root, or none).

mod common;
mod oci;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{GIB, MIB};
use oci::{Container, Lines, Node, Pod, RUNTIME_PATH, TOOLS};
use serde_json::Value;

const OUT_OF_MEMORY: &str = "2";

fn client() -> String {
    format!("{TOOLS}/vgpu_client")
}

fn node_or_skip(name: &str) -> Option<Node> {
    match oci::runtime() {
        Ok(runtime) => Some(Node::new(name, runtime)),
        Err(why) => {
            eprintln!("SKIPPED tests/oci_runtime.rs: {why}");
            None
        }
    }
}

/// A live process as the node shows it: pid in its container, host pid if found, bytes.
type Row = (i64, Option<i64>, u64);

/// The node's view of one pod container: budget, used, its live processes.
fn container_view(view: &Value, pod: &Pod) -> (u64, u64, Vec<Row>) {
    let shown = view["containers"]
        .as_array()
        .expect("containers")
        .iter()
        .find(|c| c["pod_uid"] == pod.uid.as_str() && c["container"] == pod.container.as_str())
        .unwrap_or_else(|| panic!("{}_{} not shown: {view:#}", pod.uid, pod.container));
    let device = &shown["region"]["devices"][0];
    let mut alive: Vec<Row> = shown["region"]["processes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["alive"] == true)
        .map(|p| {
            (p["pid"].as_i64().expect("pid"), p["host_pid"].as_i64(), p["bytes"].as_u64().expect("bytes"))
        })
        .collect();
    alive.sort();
    (device["budget"].as_u64().expect("budget"), device["used"].as_u64().expect("used"), alive)
}

/// The innermost pid of host process `host` (its pid in its container).
fn inner_pid(host: i64) -> i64 {
    let status = std::fs::read_to_string(format!("/proc/{host}/status")).expect("the host pid lives");
    let nspid = status.lines().find_map(|line| line.strip_prefix("NSpid:")).expect("NSpid");
    nspid.split_whitespace().last().and_then(|p| p.parse().ok()).expect("a pid")
}

/// GET /metrics from the node.
fn scrape(port: u16) -> String {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect to vgpu-smi serve");
    stream.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    write!(stream, "GET /metrics HTTP/1.0\r\nHost: node\r\n\r\n").expect("send");
    let mut text = String::new();
    stream.read_to_string(&mut text).expect("read the answer");
    assert!(text.starts_with("HTTP/1."), "{text}");
    text
}

/// The value of `metric` for the pod container `pod` in a scrape.
fn metric(text: &str, metric: &str, pod: &Pod) -> Option<u64> {
    let (uid, name) = (format!("pod_uid=\"{}\"", pod.uid), format!("container=\"{}\"", pod.container));
    text.lines()
        .filter(|line| {
            line.starts_with(&format!("{metric}{{")) && line.contains(&uid) && line.contains(&name)
        })
        .find_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
}

/// Scrapes until `check` holds, for at most 10 s; the last scrape.
fn scrape_until(port: u16, what: &str, check: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = scrape(port);
        if check(&text) {
            return text;
        }
        assert!(Instant::now() < deadline, "{what} not seen within 10 s:\n{text}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A process of a pod container, started by the runtime with the pod's variables: the
/// container's first process, reading steps.
fn start_pod(node: &mut Node, pod: Pod) -> (Container, oci::Process) {
    let container = Container::pod(pod, &[&client(), "direct", "steps"]);
    let mut first = node.start(&container);
    first.wait_for("ready");
    (container, first)
}

#[test]
fn pods_under_an_oci_runtime_are_held_to_their_budgets_and_seen_from_the_node() {
    let Some(mut node) = node_or_skip("oci") else { return };
    let started = Instant::now();

    // The node agent: vgpu-smi serve with the node's container folder, hostPID, default
    // capabilities and seccomp profile, on the host's network.
    let agent = Container::agent(
        "vgpu-agent",
        &[&format!("{TOOLS}/vgpu-smi"), "serve", "--listen", "127.0.0.1:0", "/usr/local/vgpu/containers"],
    );
    let mut serve = node.start(&agent);
    let line = serve.wait_for_text("serving http://");
    let port: u16 = line
        .split("127.0.0.1:")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no port in {line}"));

    // Two pods of two containers, each container its own folder and budget.
    let budgets = [
        ("pod-a", "main", GIB),
        ("pod-a", "side", 512 * MIB),
        ("pod-b", "main", 768 * MIB),
        ("pod-b", "side", 256 * MIB),
    ];
    let mut pods = Vec::new();
    for (i, (uid, name, budget)) in budgets.iter().enumerate() {
        let pod = Pod::new(uid, name, &format!("{}m", budget / MIB), &format!("{i}e1f9a{i}.cache"));
        let (container, mut first) = start_pod(&mut node, pod);
        let held = if i == 0 { 256 } else { 128 };
        first.send(&format!("alloc a {held}"));
        assert_eq!(first.wait_for("a_status"), "0", "{}: refused below its budget", container.id);
        // One MiB past the budget is refused: the first process cannot escape it either.
        first.send(&format!("alloc over {}", budget / MIB - held + 1));
        assert_eq!(first.wait_for("over_status"), OUT_OF_MEMORY, "{}: the budget was escaped", container.id);
        first.send("info i");
        assert_eq!(first.wait_for("i_total"), budget.to_string(), "{}", container.id);
        pods.push((container, first, held * MIB));
    }

    // The restrictions are in force in the pod's containers: seccomp filter, no capabilities,
    // uid 1000, read-only root, the memory cgroup's limit.
    let probe = node.exec(
        &pods[0].0,
        &[
            "sh",
            "-c",
            "grep -E '^(Seccomp|CapEff|Uid|NoNewPrivs):' /proc/self/status | tr -d '\\t ' | tr : =; \
             touch /usr/x 2>/dev/null || echo root_read_only=1; \
             echo cgroup_limit=$(cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || cat /sys/fs/cgroup/memory.max); \
             for f in /proc/keys /proc/timer_list /proc/sched_debug /proc/kcore; do \
             [ -e $f ] && echo masked_${f#/proc/}=$(wc -c < $f); done; \
             echo proc_sys=$(awk '$5 == \"/proc/sys\" {print $6}' /proc/self/mountinfo)",
        ],
        (1000, 1000),
        vec![RUNTIME_PATH.into()],
    );
    assert_eq!(probe.get("Seccomp"), "2", "{}", probe.all);
    assert_eq!(probe.get("CapEff"), "0000000000000000", "{}", probe.all);
    assert!(probe.get("Uid").starts_with("1000"), "{}", probe.all);
    assert_eq!(probe.get("root_read_only"), "1", "{}", probe.all);
    assert_eq!(probe.get("cgroup_limit"), (512 * MIB).to_string(), "{}", probe.all);
    let masked: Vec<(&String, &String)> =
        probe.values.iter().filter(|(k, _)| k.starts_with("masked_")).collect();
    assert!(!masked.is_empty() && masked.iter().all(|(_, v)| *v == "0"), "not masked: {}", probe.all);
    assert!(probe.get("proc_sys").starts_with("ro"), "{}", probe.all);

    // The node's view: four containers, each its budget, its bytes and its first process with
    // the host pid the runtime gave it.
    let view = node.view();
    for (container, _, held) in &pods {
        let pod = container.pod_info();
        let (budget, used, alive) = container_view(&view, pod);
        assert_eq!((budget, used), (pod_budget(pod), *held), "{}: {view:#}", container.id);
        let host = node.init_pid(&container.id);
        assert_eq!(alive, vec![(1, Some(host), *held)], "{}: {view:#}", container.id);
        assert_eq!(inner_pid(host), 1);
    }
    let text = scrape_until(port, "the four budgets", |text| {
        pods.iter().all(|(c, _, _)| {
            metric(text, "vgpu_memory_limit_bytes", c.pod_info()) == Some(pod_budget(c.pod_info()))
        })
    });
    for (container, _, held) in &pods {
        assert_eq!(metric(&text, "vgpu_memory_used_bytes", container.pod_info()), Some(*held), "{text}");
    }

    // `runtime exec` with the runtime's environment only: no pod variable reaches it, and it is
    // still held to the rest of its container's budget (the region beside the library).
    for (container, _, held) in &pods[..3] {
        let budget = pod_budget(container.pod_info());
        let lines = node.exec(
            container,
            &[&client(), "direct", "hold", "64", "16384"],
            (1000, 1000),
            vec![RUNTIME_PATH.into()],
        );
        assert_eq!(lines.get("held_bytes"), (budget - held).to_string(), "{}: {}", container.id, lines.all);
        assert_eq!(lines.get("hold_status"), OUT_OF_MEMORY, "{}", lines.all);
    }

    // A non-root process runs a setuid-root program with variables naming its own region and
    // budget: the program is held to the container's budget and makes no file of the user's.
    let user_env = vec![
        RUNTIME_PATH.into(),
        "CUDA_DEVICE_MEMORY_SHARED_CACHE=/tmp/mine.cache".into(),
        "CUDA_DEVICE_MEMORY_LIMIT_0=8g".into(),
        "LIBCUDA_LOG_LEVEL=4".into(),
    ];
    let script = format!(
        "{TOOLS}/setuid_client direct hold 64 16384 < /dev/null; echo euid_root=$(stat -c %u {TOOLS}/setuid_client); \
         test -e /tmp/mine.cache && echo made_region=1; true"
    );
    let setuid = node.exec(&pods[0].0, &["sh", "-c", &script], (1000, 1000), user_env);
    assert_eq!(setuid.get("held_bytes"), (GIB - 256 * MIB).to_string(), "{}", setuid.all);
    assert_eq!(setuid.get("euid_root"), "0");
    assert!(
        !setuid.values.contains_key("made_region"),
        "the setuid program made the user's file: {}",
        setuid.all
    );
    assert!(!setuid.all.contains("libvgpu"), "the setuid program logged as the user asked: {}", setuid.all);

    // The agent's own view (vgpu-smi in its container, without CAP_SYS_PTRACE): a root process
    // of a pod is found with its host pid; the uid-1000 processes' /proc/PID/maps are closed to
    // it, so their host pids are unknown (docs/container-budget.md, "what degrades").
    let (pod_b_main, _, b_held) = &pods[2];
    let mut root_process = oci::Process::spawn(node.exec_command(
        pod_b_main,
        &[&client(), "direct", "hold", "64", "64"],
        (0, 0),
        vec![RUNTIME_PATH.into()],
    ));
    assert_eq!(root_process.wait_for("held_bytes"), (64 * MIB).to_string());
    let agent_json = node
        .exec_command(
            &agent,
            &[&format!("{TOOLS}/vgpu-smi"), "--json", "/usr/local/vgpu/containers"],
            (0, 0),
            vec![RUNTIME_PATH.into()],
        )
        .output()
        .expect("run the runtime");
    let agent_view: Value = serde_json::from_slice(&agent_json.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&agent_json.stderr)));
    let (_, used, alive) = container_view(&agent_view, pod_b_main.pod_info());
    assert_eq!(used, b_held + 64 * MIB, "{agent_view:#}");
    let root_row = alive.iter().find(|(pid, _, _)| *pid != 1).expect("the root process's row");
    let host = root_row
        .1
        .unwrap_or_else(|| panic!("the agent found no host pid for a root process: {agent_view:#}"));
    assert_eq!(inner_pid(host), root_row.0, "{agent_view:#}");
    let first_row = alive.iter().find(|(pid, _, _)| *pid == 1).expect("the first process's row");
    assert_eq!(
        first_row.1, None,
        "the agent read a uid-1000 process's maps without CAP_SYS_PTRACE: update the docs"
    );
    // A holder it could not find is said in one line (and only then: a refusal that hides no
    // lease holder, such as the node's own pid 1, is not).
    let said = String::from_utf8_lossy(&agent_json.stderr);
    assert_eq!(said.matches("/proc/PID/maps was refused").count(), 1, "{said}");
    root_process.close_stdin();
    root_process.finish();

    // A container killed with its processes mid-allocation: serve gives its bytes back.
    let (side_b, side_b_first, _) = pods.pop().expect("pod-b side");
    let mut churn = oci::Process::spawn(node.exec_command(
        &side_b,
        &[&client(), "direct", "churn", "16"],
        (1000, 1000),
        vec![RUNTIME_PATH.into()],
    ));
    churn.wait_for("ready");
    std::thread::sleep(Duration::from_millis(200));
    node.kill(&side_b.id, Some(side_b_first));
    drop(churn);
    let text = scrape_until(port, "pod-b side given back", |text| {
        metric(text, "vgpu_memory_used_bytes", side_b.pod_info()) == Some(0)
    });
    assert_eq!(metric(&text, "vgpu_memory_limit_bytes", side_b.pod_info()), Some(256 * MIB), "{text}");
    let (_, used, alive) = container_view(&node.view(), side_b.pod_info());
    assert_eq!((used, alive.len()), (0, 0), "the killed container still holds memory");

    // A container restarted in the same pod folder: the new first process has the whole budget.
    let (side_a, side_a_first, _) = pods.remove(1);
    assert_eq!(side_a.id, "pod-a-side");
    node.kill(&side_a.id, Some(side_a_first));
    // The kubelet starts a container of a new id; HAMi gives it the same folder (pod uid, name).
    let mut restarted =
        Container::pod(Pod::new("pod-a", "side", "512m", "1e1f9a1.cache"), &[&client(), "direct", "steps"]);
    restarted.id.push_str("-restart-1");
    let mut again = node.start(&restarted);
    again.wait_for("ready");
    let side_a = restarted;
    scrape_until(port, "pod-a side given back", |text| {
        metric(text, "vgpu_memory_used_bytes", side_a.pod_info()) == Some(0)
    });
    again.send("alloc whole 512");
    assert_eq!(again.wait_for("whole_status"), "0", "the restarted container was refused below its budget");
    again.send("alloc more 1");
    assert_eq!(again.wait_for("more_status"), OUT_OF_MEMORY, "the restarted container escaped its budget");
    let (_, used, alive) = container_view(&node.view(), side_a.pod_info());
    assert_eq!((used, alive.len()), (512 * MIB, 1));

    // The agent resizes pod-a main to 2 GiB: its first process sees it, 1 GiB more fits.
    let region = format!("/usr/local/vgpu/containers/pod-a_main/{}", pods[0].0.pod_info().region);
    node.exec(
        &agent,
        &[&format!("{TOOLS}/vgpu-smi"), "resize", "--device", "0", "2g", &region],
        (0, 0),
        vec![RUNTIME_PATH.into()],
    );
    let first = &mut pods[0].1;
    first.send("info r");
    assert_eq!(first.wait_for("r_total"), (2 * GIB).to_string());
    first.send("alloc r2 1024");
    assert_eq!(first.wait_for("r2_status"), "0");
    scrape_until(port, "the new budget", |text| {
        metric(text, "vgpu_memory_limit_bytes", pods[0].0.pod_info()) == Some(2 * GIB)
            && metric(text, "vgpu_memory_used_bytes", pods[0].0.pod_info()) == Some(1280 * MIB)
    });

    for (container, first, _) in pods.drain(..) {
        let lines: Lines = first.finish();
        assert!(!lines.all.contains("error"), "{}: {}", container.id, lines.all);
    }
    drop(serve);
    eprintln!("oci_runtime: {} scenarios ran in {:?}", node.runtime, started.elapsed());
}

fn pod_budget(pod: &Pod) -> u64 {
    let number: u64 = pod.limit.trim_end_matches('m').parse().expect("a size in MiB");
    number * MIB
}

#[test]
fn every_syscall_of_libvgpu_and_vgpu_smi_is_allowed_by_the_default_profile() {
    let Some(node) = node_or_skip("oci-syscalls") else { return };
    let artifacts = common::artifacts();
    let dir = node.scratch.path("strace");
    let folder = dir.join("containers/pod-s_main");
    std::fs::create_dir_all(&folder).expect("create folder");
    let region = folder.join("s.cache");
    let trace = |name: &str, command: &mut Command| -> Vec<String> {
        let out_file = dir.join(format!("{name}.strace"));
        let mut strace = Command::new("strace");
        strace
            .args(["-f", "-c", "-U", "name", "-o"])
            .arg(&out_file)
            .arg(command.get_program())
            .args(command.get_args());
        for (key, value) in command.get_envs() {
            match value {
                Some(value) => strace.env(key, value),
                None => strace.env_remove(key),
            };
        }
        let out = strace.output().expect("run strace (Debian: strace; ci/setup test)");
        assert!(out.status.success(), "{name}: {}", String::from_utf8_lossy(&out.stderr));
        let table = std::fs::read_to_string(&out_file).expect("strace's table");
        table
            .lines()
            .map(str::trim)
            // `-U name` prints one syscall name a line. strace may also print a note of its own
            // such as `17238 ???( <detached ...>` for a thread it detached from at exit, which
            // names no syscall: only lines that are a name count.
            .filter(|line| {
                !line.is_empty()
                    && line.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
                    && *line != "syscall"
                    && *line != "total"
            })
            .map(str::to_owned)
            .collect()
    };
    let mut client = Command::new(&artifacts.client);
    client
        .args(["direct", "hold", "64", "512"])
        .env("LD_PRELOAD", &artifacts.libvgpu)
        .env("LD_LIBRARY_PATH", &artifacts.fake_driver_dir)
        .env("CUDA_DEVICE_MEMORY_LIMIT_0", "1g")
        .env("CUDA_DEVICE_MEMORY_SHARED_CACHE", &region)
        .stdin(std::process::Stdio::null());
    let mut library = trace("library", &mut client);
    let smi = common::smi_binary();
    let mut tools = trace("json", Command::new(smi).arg("--json").arg(dir.join("containers")));
    tools.extend(trace("reclaim", Command::new(smi).arg("reclaim").arg(dir.join("containers"))));
    tools.extend(trace("resize", Command::new(smi).args(["resize", "--device", "0", "2g"]).arg(&region)));
    tools.extend(trace("metrics", Command::new(smi).arg("metrics").arg(dir.join("containers"))));
    library.sort();
    library.dedup();
    tools.sort();
    tools.dedup();
    let seccomp = node.seccomp(&oci::DEFAULT_CAPS);
    let refused_library = oci::not_allowed(&seccomp, &library);
    let refused_tools = oci::not_allowed(&seccomp, &tools);
    eprintln!(
        "libvgpu (with the fake driver and the client), {} syscalls: {}",
        library.len(),
        library.join(" ")
    );
    eprintln!("vgpu-smi --json, reclaim, resize, metrics, {} syscalls: {}", tools.len(), tools.join(" "));
    eprintln!("not allowed outright by the default profile: {refused_library:?} {refused_tools:?}");
    assert!(library.iter().any(|s| s == "mmap") && library.iter().any(|s| s == "fcntl"), "{library:?}");
    assert!(refused_library.is_empty(), "the default profile refuses {refused_library:?}");
    assert!(refused_tools.is_empty(), "the default profile refuses {refused_tools:?}");
}
