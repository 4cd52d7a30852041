//! The node agent (`vgpu-smi`, `vgpu-smi serve --policy`) accounts every process on the card to
//! its container, whatever took the memory, on the fake driver: containers rebuilt with mount and
//! pid namespaces (`unshare`, as root) and cgroup v2 groups, HAMi's folder bound at
//! `/usr/local/vgpu`. Processes take "graphics" memory no hook sees (`fakegpu_graphics_alloc`), and
//! the fake's NVML lists every process sharing its file with its host pid and bytes.
//!
//! Container A (budget 512 MiB): a CUDA process (256 MiB, leased), two graphics processes (300 and
//! 310 MiB, the second newer). Container B (budget 1 GiB, under it): a CUDA process and a newer
//! graphics one. Container G: one graphics process, no CUDA at all, so no region. A process on the
//! node in no container holds graphics memory too, started last. Under `kill-newest` only A's
//! newest graphics process may die: B's, G's and the node's are newer and hold unaccounted memory,
//! so a policy that looked past A's processes would pick one of them.

mod common;

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{MIB, Scratch};
use serde_json::Value;

const START: Duration = Duration::from_secs(30);

/// `tests/clients/graphics_client.c`, linked with the fake driver; built once per test binary
/// (the tests run in threads of one process, and would share its temporary name).
fn graphics_client() -> PathBuf {
    static CLIENT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    CLIENT.get_or_init(build_graphics_client).clone()
}

fn build_graphics_client() -> PathBuf {
    let artifacts = common::artifacts();
    let out = common::target_dir().join("clients/graphics_client");
    std::fs::create_dir_all(out.parent().expect("a folder")).expect("create clients folder");
    let tmp = out.with_extension(std::process::id().to_string());
    let status = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args(["-O2", "-Wall"])
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients/graphics_client.c"))
        .arg("-o")
        .arg(&tmp)
        .arg("-L")
        .arg(&artifacts.fake_driver_dir)
        .arg("-l:libcuda.so.1")
        .status()
        .expect("run cc");
    assert!(status.success(), "cannot build graphics_client");
    std::fs::rename(&tmp, &out).expect("install graphics_client");
    out
}

/// Where the node's cgroup v2 hierarchy is mounted.
fn cgroup2_root() -> PathBuf {
    let mounts = std::fs::read_to_string("/proc/self/mounts").expect("read mounts");
    let line =
        mounts.lines().find(|line| line.split(' ').nth(2) == Some("cgroup2")).expect("a cgroup2 mount");
    PathBuf::from(line.split(' ').nth(1).expect("a mount point"))
}

/// A cgroup made for the test, removed (with its processes killed) when dropped.
struct Cgroup(PathBuf);

impl Cgroup {
    fn new(name: &str) -> Cgroup {
        let path = cgroup2_root().join(format!("vgpu-node-agent-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&path).expect("create a cgroup (needs root and cgroup v2)");
        Cgroup(path)
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        let _ = std::fs::write(self.0.join("cgroup.kill"), "1");
        for _ in 0..100 {
            if std::fs::remove_dir(&self.0).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Run as pid 1 of a container's new mount and pid namespaces: joins the container's cgroup,
/// binds its folder at /usr/local/vgpu, and starts its processes one after another (`T_PROCS`:
/// `name:cuda_mib:graphics_mib[:VAR=value]` …, the variable set in that process only), each ready
/// before the next starts.
const CONTAINER: &str = r#"
set -euo pipefail
echo $$ > "$T_CGROUP/cgroup.procs"
mount -t tmpfs vgpu-test /usr/local
mkdir -p /usr/local/vgpu
mount --bind "$T_CONTAINER" /usr/local/vgpu
for spec in $T_PROCS; do
    IFS=: read -r name cuda graphics extra <<< "$spec"
    env ${extra:+"$extra"} LD_PRELOAD="$T_LIB" "$T_CLIENT" "$cuda" "$graphics" 0 > "$T_OUT/$name.out" 2> "$T_OUT/$name.err" &
    until grep -q '^ready=' "$T_OUT/$name.out" 2> /dev/null; do sleep 0.02; done
done
echo started
wait
"#;

struct Node {
    /// Names its scratch folder and cgroups, so that tests running at once never share them.
    tag: String,
    scratch: Scratch,
    containers: PathBuf,
    client: PathBuf,
    shared: PathBuf,
    cgroups: Vec<Cgroup>,
    shells: Vec<Child>,
    /// Started outside every container.
    loose: Vec<Child>,
}

impl Node {
    fn new(name: &str) -> Node {
        assert_eq!(
            // SAFETY: geteuid has no preconditions.
            unsafe { libc::geteuid() },
            0,
            "namespaces, bind mounts and cgroups need root (CI runs as root)"
        );
        let scratch = Scratch::in_memory(name);
        let containers = scratch.path("node/containers");
        std::fs::create_dir_all(&containers).expect("create the node's folder");
        Node {
            tag: name.to_owned(),
            client: graphics_client(),
            shared: scratch.path("fake.ledger"),
            containers,
            scratch,
            cgroups: Vec::new(),
            shells: Vec::new(),
            loose: Vec::new(),
        }
    }

    fn fake_env(&self, command: &mut Command) {
        for (key, _) in std::env::vars() {
            if key.starts_with("CUDA_") || key.starts_with("FAKEGPU_") || key.starts_with("LIBCUDA_") {
                command.env_remove(key);
            }
        }
        command
            .env("LD_LIBRARY_PATH", &common::artifacts().fake_driver_dir)
            .env("FAKEGPU_SHARED", &self.shared)
            .env("FAKEGPU_MEMORY", "16g")
            .env_remove("LD_PRELOAD");
    }

    /// Starts container `name` (`<pod>_<container>`) with a budget (or none) and its processes.
    fn container(&mut self, name: &str, budget: Option<&str>, processes: &str) {
        let folder = self.containers.join(name);
        std::fs::create_dir_all(&folder).expect("create the container's folder");
        let out = self.scratch.path(&format!("out-{name}"));
        std::fs::create_dir_all(&out).expect("create output folder");
        let cgroup = Cgroup::new(&format!("{}-{name}", self.tag));
        let mut command = Command::new("unshare");
        command.args(["--mount", "--pid", "--fork", "--mount-proc", "bash", "-c", CONTAINER]);
        self.fake_env(&mut command);
        command
            .env("CUDA_DEVICE_MEMORY_SHARED_CACHE", "/usr/local/vgpu/region.cache")
            .env("T_CGROUP", &cgroup.0)
            .env("T_CONTAINER", &folder)
            .env("T_LIB", &common::artifacts().libvgpu)
            .env("T_CLIENT", &self.client)
            .env("T_OUT", &out)
            .env("T_PROCS", processes)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(budget) = budget {
            command.env("CUDA_DEVICE_MEMORY_LIMIT_0", budget);
        }
        let mut shell = command.spawn().expect("run unshare");
        let mut stdout = shell.stdout.take().expect("stdout");
        let mut first = [0u8; 8];
        let read = stdout.read(&mut first).unwrap_or(0);
        assert_eq!(&first[..read], b"started\n", "container {name} did not start");
        self.cgroups.push(cgroup);
        self.shells.push(shell);
    }

    /// A graphics process on the node, in no container; `cgroup` puts it in that one.
    fn loose_process(&mut self, graphics_mib: u64, cgroup: Option<&Path>) -> u32 {
        self.process_on_node(0, graphics_mib, cgroup, &[])
    }

    /// A process on the node, in no container's namespaces: `cuda_mib` by CUDA (under libvgpu),
    /// `graphics_mib` by no hook, `vars` set in it; `cgroup` puts it in that one.
    fn process_on_node(
        &mut self,
        cuda_mib: u64,
        graphics_mib: u64,
        cgroup: Option<&Path>,
        vars: &[(&str, &str)],
    ) -> u32 {
        let mut command = Command::new(&self.client);
        command
            .args([&cuda_mib.to_string(), &graphics_mib.to_string(), "0"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        self.fake_env(&mut command);
        if cuda_mib > 0 {
            command.env("LD_PRELOAD", &common::artifacts().libvgpu);
        }
        command.envs(vars.iter().copied());
        let mut child = command.spawn().expect("start graphics_client");
        let pid = child.id();
        if let Some(cgroup) = cgroup {
            std::fs::write(cgroup.join("cgroup.procs"), pid.to_string()).expect("move into the cgroup");
        }
        let mut stdout = child.stdout.take().expect("stdout");
        let deadline = Instant::now() + START;
        let mut text = String::new();
        let mut buffer = [0u8; 256];
        while !text.contains("ready=1") && Instant::now() < deadline {
            let n = stdout.read(&mut buffer).unwrap_or(0);
            assert!(n > 0, "graphics_client ended: {text}");
            text.push_str(&String::from_utf8_lossy(&buffer[..n]));
        }
        assert!(cuda_mib == 0 || text.contains("cuda_status=0"), "{text}");
        assert!(graphics_mib == 0 || text.contains("graphics_status=0"), "{text}");
        self.loose.push(child);
        pid
    }

    fn smi(&self, args: &[&str]) -> std::process::Output {
        let mut command = Command::new(common::smi_binary());
        command.args(args).arg(&self.containers);
        self.fake_env(&mut command);
        command.output().expect("run vgpu-smi")
    }

    fn json(&self) -> Value {
        let output = self.smi(&["--json"]);
        serde_json::from_slice(&output.stdout)
            .unwrap_or_else(|e| panic!("vgpu-smi --json: {e}\n{}", String::from_utf8_lossy(&output.stderr)))
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        for child in self.shells.iter_mut().chain(self.loose.iter_mut()) {
            let _ = child.kill();
            let _ = child.wait();
        }
        // The containers' processes go with their cgroups (cgroup.kill).
        self.cgroups.clear();
    }
}

/// Whether host pid `pid` runs (a zombie does not).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| stat.rsplit_once(')').map(|(_, rest)| !rest.trim_start().starts_with('Z')))
        .unwrap_or(false)
}

/// Container `name`'s accounting in vgpu-smi's JSON.
fn container<'a>(json: &'a Value, name: &str) -> &'a Value {
    json["accounting"]["containers"]
        .as_array()
        .expect("accounting")
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no container {name}: {json:#}"))
}

/// Host pid → (NVML bytes, unaccounted bytes, route) of a container's processes.
fn processes_of(json: &Value, name: &str) -> HashMap<u64, (u64, u64, String)> {
    container(json, name)["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .map(|p| {
            let route = p["route"].as_str().expect("route").to_owned();
            let values =
                (p["nvml"].as_u64().expect("nvml"), p["unaccounted"].as_u64().expect("unaccounted"), route);
            (p["host_pid"].as_u64().expect("pid"), values)
        })
        .collect()
}

/// The host pid of `name`'s process holding `nvml` bytes.
fn pid_holding(json: &Value, name: &str, nvml: u64) -> u32 {
    let found: Vec<u64> =
        processes_of(json, name).into_iter().filter(|(_, v)| v.0 == nvml).map(|(pid, _)| pid).collect();
    assert_eq!(found.len(), 1, "{name}: one process of {} MiB: {json:#}", nvml / MIB);
    found[0] as u32
}

fn build_node(tag: &str) -> Node {
    let mut node = Node::new(tag);
    node.container("pod-a_main", Some("512m"), "a1:256:0 a2:0:300 a3:0:310");
    node.container("pod-b_main", Some("1g"), "b1:128:0 b2:0:700");
    node.container("pod-g_gl", None, "g1:0:600");
    node
}

#[test]
fn every_process_on_the_card_is_accounted_to_its_container_and_only_the_offender_is_killed() {
    let mut node = build_node("node-agent-kill");
    let loose = node.loose_process(1000, None);
    let json = node.json();
    let gib_ish = |mib: u64| mib * MIB;

    // A: the leased CUDA process is known; the graphics ones are not, found by their mounts.
    let a = container(&json, "pod-a_main");
    let a_device = &a["devices"][0];
    assert_eq!(a["has_region"], true, "{json:#}");
    assert_eq!(a_device["budget"], 512 * MIB, "{json:#}");
    assert_eq!(a_device["budget_source"], "region", "{json:#}");
    assert_eq!(a_device["known"], 256 * MIB, "{json:#}");
    assert_eq!(a_device["nvml"], gib_ish(256 + 300 + 310), "{json:#}");
    assert_eq!(a_device["unaccounted"], gib_ish(300 + 310), "{json:#}");
    let a_procs = processes_of(&json, "pod-a_main");
    let a1 = pid_holding(&json, "pod-a_main", 256 * MIB);
    let a2 = pid_holding(&json, "pod-a_main", 300 * MIB);
    let a3 = pid_holding(&json, "pod-a_main", 310 * MIB);
    assert_eq!(a_procs[&u64::from(a1)], (256 * MIB, 0, "lease".to_owned()));
    assert_eq!(a_procs[&u64::from(a3)], (310 * MIB, 310 * MIB, "mount".to_owned()));
    // B and G: every byte of G is unaccounted, and G has no region at all.
    let b1 = pid_holding(&json, "pod-b_main", 128 * MIB);
    let b2 = pid_holding(&json, "pod-b_main", 700 * MIB);
    assert_eq!(container(&json, "pod-b_main")["devices"][0]["unaccounted"], 700 * MIB, "{json:#}");
    let g = container(&json, "pod-g_gl");
    assert_eq!(g["has_region"], false, "{json:#}");
    assert_eq!(g["devices"][0]["nvml"], 600 * MIB, "{json:#}");
    assert_eq!(g["devices"][0]["unaccounted"], 600 * MIB, "{json:#}");
    let g1 = pid_holding(&json, "pod-g_gl", 600 * MIB);
    assert_eq!(g["processes"][0]["graphics"], true, "{json:#}");
    // The node's own process is in no container.
    let unmapped = json["accounting"]["unmapped"].as_array().expect("unmapped");
    assert!(
        unmapped.iter().any(|u| u["host_pid"] == loose
            && u["nvml"] == 1000 * MIB
            && u["why"] == "in no known container"),
        "{json:#}"
    );
    // A process in A's cgroup but not its mounts is A's, by the cgroup of A's leased process.
    let a_cgroup = node.cgroups[0].0.clone();
    let joined = node.loose_process(20, Some(&a_cgroup));
    let json = node.json();
    assert_eq!(
        processes_of(&json, "pod-a_main")[&u64::from(joined)],
        (20 * MIB, 20 * MIB, "cgroup".to_owned())
    );
    // The same in the table and the metrics.
    let table = String::from_utf8_lossy(&node.smi(&[]).stdout).into_owned();
    assert!(table.contains("UNACCOUNTED") && table.contains("pod-g_gl"), "{table}");
    assert!(table.contains(&format!("not in a known container: host pid {loose}")), "{table}");
    let metrics = String::from_utf8_lossy(&node.smi(&["metrics"]).stdout).into_owned();
    let g_line = format!(
        "vgpu_container_unaccounted_memory_bytes{{container_dir=\"pod-g_gl\",device_uuid=\"GPU-face0000-0000-4e00-8000-000000000000\"}} {}",
        600 * MIB
    );
    assert!(metrics.contains(&g_line), "{metrics}");
    // That process goes again: it is newer than A's, and the policy below would pick it.
    let loose_child = node.loose.pop().expect("the cgroup process");
    let mut loose_child = loose_child;
    let _ = loose_child.kill();
    let _ = loose_child.wait();

    let everyone = [a1, a2, a3, b1, b2, g1, loose];
    // `report` says so and touches nobody.
    let report = policy(&node, "report", Duration::from_millis(2500));
    assert!(report.contains("policy report: container pod-a_main"), "{report}");
    assert!(report.contains("reported only"), "{report}");
    assert!(!report.contains("pod-b_main") && !report.contains("pod-g_gl"), "{report}");
    for pid in everyone {
        assert!(alive(pid), "report touched host pid {pid}:\n{report}");
    }

    // `kill-newest`: A's newest graphics process, after the grace period, and no one else.
    let grace = Duration::from_secs(1);
    let mut serve = serve(&node, &["--policy", "kill-newest", "--margin", "64m", "--grace", "1"]);
    let started = Instant::now();
    std::thread::sleep(Duration::from_millis(600));
    assert!(alive(a3), "killed before the grace period");
    while alive(a3) && started.elapsed() < grace + Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!alive(a3), "the offender still runs {:?} after serve started", started.elapsed());
    // A is back within budget and margin (866 - 310 = 556 <= 576 MiB): nothing more happens.
    std::thread::sleep(Duration::from_millis(2500));
    let _ = serve.kill();
    let _ = serve.wait();
    let mut stderr = String::new();
    serve.stderr.take().expect("stderr").read_to_string(&mut stderr).expect("serve's stderr");
    for pid in [a1, a2, b1, b2, g1, loose] {
        assert!(alive(pid), "kill-newest touched host pid {pid}, not the offender {a3}:\n{stderr}");
    }
    assert!(stderr.contains(&format!("sent SIGKILL to host pid {a3}")), "{stderr}");
    assert_eq!(stderr.matches("SIGKILL").count(), 1, "{stderr}");
    let json = node.json();
    assert_eq!(container(&json, "pod-a_main")["devices"][0]["nvml"], gib_ish(256 + 300), "{json:#}");
}

#[test]
fn freeze_stops_the_over_budget_containers_cgroup_and_no_other() {
    let node = build_node("node-agent-freeze");
    let json = node.json();
    let a3 = pid_holding(&json, "pod-a_main", 310 * MIB);
    let frozen = |cgroup: &Cgroup| {
        std::fs::read_to_string(cgroup.0.join("cgroup.events"))
            .is_ok_and(|events| events.contains("frozen 1"))
    };
    let mut serve = serve(&node, &["--policy", "freeze", "--margin", "64m", "--grace", "1"]);
    let started = Instant::now();
    while !frozen(&node.cgroups[0]) && started.elapsed() < Duration::from_secs(4) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = serve.kill();
    let _ = serve.wait();
    let mut stderr = String::new();
    serve.stderr.take().expect("stderr").read_to_string(&mut stderr).expect("serve's stderr");
    // A (866 MiB of 512 by NVML) is frozen whole, after the grace period; B and G are not.
    assert!(frozen(&node.cgroups[0]), "A's cgroup is not frozen after {:?}:\n{stderr}", started.elapsed());
    assert!(started.elapsed() >= Duration::from_millis(900), "frozen before the grace period:\n{stderr}");
    assert!(
        !frozen(&node.cgroups[1]) && !frozen(&node.cgroups[2]),
        "another container was frozen:\n{stderr}"
    );
    assert!(stderr.contains("froze cgroup") && stderr.contains(&format!("host pid {a3}")), "{stderr}");
    assert!(alive(a3), "freeze stops a process, never kills it");
    // Thawed, so that the test's cleanup (cgroup.kill) reaps promptly.
    let _ = std::fs::write(node.cgroups[0].0.join("cgroup.freeze"), "0");
}

/// `vgpu-smi serve` on the node's folder with `args`, its stderr piped.
fn serve(node: &Node, args: &[&str]) -> Child {
    let mut command = Command::new(common::smi_binary());
    command.arg("serve").args(["--listen", "127.0.0.1:0", "--no-reclaim"]).args(args).arg(&node.containers);
    node.fake_env(&mut command);
    command.stdout(Stdio::null()).stderr(Stdio::piped()).spawn().expect("start vgpu-smi serve")
}

/// Runs `serve --policy ACTION --grace 0.5` for `run`; its stderr.
fn policy(node: &Node, action: &str, run: Duration) -> String {
    let mut serve = serve(node, &["--policy", action, "--grace", "0.5"]);
    std::thread::sleep(run);
    let _ = serve.kill();
    let _ = serve.wait();
    let mut stderr = String::new();
    serve.stderr.take().expect("stderr").read_to_string(&mut stderr).expect("serve's stderr");
    stderr
}

/// The issue's headline case: an OpenGL-only container never starts libvgpu, so it has no region;
/// its budget is in its processes' environment, as HAMi's device plugin sets it.
#[test]
fn a_container_with_no_region_is_held_to_the_budget_in_its_processes_environment() {
    let mut node = Node::new("node-agent-environment");
    // E: over its 512 MiB by 188 MiB. F: the same, but one process says 1g: no budget. N: no
    // budget variable at all. F's and N's processes are newer and hold unaccounted memory, so a
    // policy that looked past E's processes, or took F's or N's budget, would pick one.
    node.container("pod-e_gl", Some("512m"), "e1:0:300 e2:0:400");
    node.container("pod-f_gl", Some("512m"), "f1:0:300 f2:0:400:CUDA_DEVICE_MEMORY_LIMIT_0=1g");
    node.container("pod-n_gl", None, "n1:0:900");
    let json = node.json();
    let e = container(&json, "pod-e_gl");
    assert_eq!(e["has_region"], false, "{json:#}");
    assert_eq!(e["environment_refused"], Value::Null, "{json:#}");
    assert_eq!(e["devices"][0]["budget"], 512 * MIB, "{json:#}");
    assert_eq!(e["devices"][0]["budget_source"], "environment", "{json:#}");
    assert_eq!(e["devices"][0]["unaccounted"], 700 * MIB, "{json:#}");
    let f = container(&json, "pod-f_gl");
    assert_eq!(f["devices"][0]["budget"], Value::Null, "{json:#}");
    assert_eq!(f["environment_refused"]["kind"], "disagree", "{json:#}");
    let n = container(&json, "pod-n_gl");
    assert_eq!(
        (n["has_region"].clone(), n["devices"][0]["budget"].clone()),
        (false.into(), Value::Null),
        "{json:#}"
    );
    assert_eq!(n["environment_refused"], Value::Null, "{json:#}");
    let e1 = pid_holding(&json, "pod-e_gl", 300 * MIB);
    let e2 = pid_holding(&json, "pod-e_gl", 400 * MIB);
    let f1 = pid_holding(&json, "pod-f_gl", 300 * MIB);
    let f2 = pid_holding(&json, "pod-f_gl", 400 * MIB);
    let n1 = pid_holding(&json, "pod-n_gl", 900 * MIB);
    let table = String::from_utf8_lossy(&node.smi(&[]).stdout).into_owned();
    assert!(table.contains("512.0 MiB (environment)"), "{table}");
    assert!(table.contains(&format!("pod-f_gl: no region, and no budget from its processes' environment (host pids {f1} and {f2} have different")), "{table}");
    let metrics = String::from_utf8_lossy(&node.smi(&["metrics"]).stdout).into_owned();
    let uuid = "GPU-face0000-0000-4e00-8000-000000000000";
    let budget_line = format!(
        "vgpu_container_budget_bytes{{container_dir=\"pod-e_gl\",device_uuid=\"{uuid}\",source=\"environment\"}} {}",
        512 * MIB
    );
    assert!(metrics.contains(&budget_line), "{metrics}");
    assert!(
        metrics.contains(
            "vgpu_container_environment_budget_refused{container_dir=\"pod-f_gl\",reason=\"disagree\"} 1"
        ),
        "{metrics}"
    );
    assert!(!metrics.contains("vgpu_container_budget_bytes{container_dir=\"pod-n_gl\""), "{metrics}");

    let report = policy(&node, "report", Duration::from_millis(2500));
    assert!(report.contains("policy report: container pod-e_gl"), "{report}");
    assert!(
        report.contains(&format!("against a budget of {} (from its environment)", 512 * MIB)),
        "{report}"
    );
    assert!(!report.contains("pod-f_gl") && !report.contains("pod-n_gl"), "{report}");

    let grace = Duration::from_secs(1);
    let mut serve = serve(&node, &["--policy", "kill-newest", "--grace", "1"]);
    let started = Instant::now();
    std::thread::sleep(Duration::from_millis(600));
    assert!(alive(e2), "killed before the grace period");
    while alive(e2) && started.elapsed() < grace + Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!alive(e2), "the offender still runs {:?} after serve started", started.elapsed());
    // E is back within its budget (300 <= 512 MiB): nothing more happens.
    std::thread::sleep(Duration::from_millis(2500));
    let _ = serve.kill();
    let _ = serve.wait();
    let mut stderr = String::new();
    serve.stderr.take().expect("stderr").read_to_string(&mut stderr).expect("serve's stderr");
    for pid in [e1, f1, f2, n1] {
        assert!(alive(pid), "kill-newest touched host pid {pid}, not the offender {e2}:\n{stderr}");
    }
    assert!(stderr.contains(&format!("sent SIGKILL to host pid {e2}")), "{stderr}");
    assert_eq!(stderr.matches("SIGKILL").count(), 1, "{stderr}");
}

/// Issue 45: four budgets whose processes share one cgroup, as jobs on a bare-metal node or in one
/// systemd slice do, and only one of them has a process holding a lease yet. The cgroup is not
/// that container's: a process whose environment names another region or other limits is
/// nobody's, the cgroup is named as shared, and `kill-newest` touches no one. Before, every
/// process of the cgroup was counted against the one container (3.3 GiB against 512 MiB) and the
/// newest of them killed as its.
#[test]
fn processes_of_other_budgets_in_a_lease_holders_cgroup_are_nobodys_and_never_acted_on() {
    let mut node = Node::new("node-agent-shared");
    let jobs = Cgroup::new("node-agent-shared-jobs");
    let jobs_dir = jobs.0.clone();
    let jobs_name = jobs_dir.file_name().expect("a name").to_string_lossy().into_owned();
    node.cgroups.push(jobs);
    let region = |n: u32| {
        let folder = node.containers.join(format!("pod-{n}_main"));
        std::fs::create_dir_all(&folder).expect("create a folder");
        folder.join("region.cache").to_string_lossy().into_owned()
    };
    let regions: Vec<String> = (1..=4).map(region).collect();
    // Budgets 2 to 4 have a region (a process of each charged once and ended), and no lease.
    for region in &regions[1..] {
        let mut command = Command::new(&node.client);
        node.fake_env(&mut command);
        let output = command
            .args(["1", "0", "1"])
            .env("LD_PRELOAD", &common::artifacts().libvgpu)
            .env("CUDA_DEVICE_MEMORY_SHARED_CACHE", region)
            .env("CUDA_DEVICE_MEMORY_LIMIT_0", "512m")
            .output()
            .expect("run graphics_client");
        assert!(String::from_utf8_lossy(&output.stdout).contains("cuda_status=0"), "{output:?}");
    }
    let limit = ("CUDA_DEVICE_MEMORY_LIMIT_0", "512m");
    // Budget 1's lease holder, well under its 512 MiB; an OpenGL process of budget 2; a big one
    // that names no region but another budget's limit; budget 4's job, not on the card yet; and a
    // process that names nothing.
    let holder = node.process_on_node(
        64,
        0,
        Some(&jobs_dir),
        &[("CUDA_DEVICE_MEMORY_SHARED_CACHE", &regions[0]), limit],
    );
    let gl = node.process_on_node(
        0,
        300,
        Some(&jobs_dir),
        &[("CUDA_DEVICE_MEMORY_SHARED_CACHE", &regions[1]), limit],
    );
    let big = node.process_on_node(0, 3000, Some(&jobs_dir), &[("CUDA_DEVICE_MEMORY_LIMIT_0", "8g")]);
    let mut waiting = Command::new("sleep")
        .arg("600")
        .env("CUDA_DEVICE_MEMORY_SHARED_CACHE", &regions[3])
        .spawn()
        .expect("start sleep");
    std::fs::write(jobs_dir.join("cgroup.procs"), waiting.id().to_string()).expect("move into the cgroup");
    let plain = node.loose_process(20, Some(&jobs_dir));

    let json = node.json();
    let one = processes_of(&json, "pod-1_main");
    assert_eq!(one.keys().copied().collect::<Vec<_>>(), vec![u64::from(holder)], "{json:#}");
    assert_eq!(one[&u64::from(holder)].2, "lease", "{json:#}");
    assert_eq!(container(&json, "pod-1_main")["devices"][0]["nvml"], 64 * MIB, "{json:#}");
    let unmapped = json["accounting"]["unmapped"].as_array().expect("unmapped");
    let why = |pid: u32| {
        let found = unmapped
            .iter()
            .find(|u| u["host_pid"] == pid)
            .unwrap_or_else(|| panic!("{pid} mapped: {json:#}"));
        found["why"].as_str().expect("why").to_owned()
    };
    assert!(why(gl).contains("names another region"), "{json:#}");
    assert!(why(big).contains("other limits"), "{json:#}");
    assert!(why(plain).contains("holds processes of other budgets"), "{json:#}");
    let shared = json["accounting"]["shared_cgroups"].as_array().expect("shared_cgroups");
    assert_eq!(shared.len(), 1, "{json:#}");
    assert!(shared[0]["cgroup"].as_str().expect("cgroup").ends_with(&format!("/{jobs_name}")), "{json:#}");
    assert_eq!(shared[0]["containers"], serde_json::json!(["pod-1_main"]), "{json:#}");
    assert!([gl, big].iter().any(|&pid| shared[0]["host_pid"] == pid), "{json:#}");
    let table = String::from_utf8_lossy(&node.smi(&[]).stdout).into_owned();
    assert!(table.contains("shared by several budgets: cgroup /") && table.contains(&jobs_name), "{table}");
    let metrics = String::from_utf8_lossy(&node.smi(&["metrics"]).stdout).into_owned();
    assert!(
        metrics.lines().any(|l| l.starts_with("vgpu_shared_cgroup{") && l.contains(&jobs_name)),
        "{metrics}"
    );
    let mut doctor = Command::new(common::smi_binary());
    doctor.args(["doctor", "--library"]).arg(&common::artifacts().libvgpu).arg(&node.containers);
    node.fake_env(&mut doctor);
    let doctor = String::from_utf8_lossy(&doctor.output().expect("run vgpu-smi doctor").stdout).into_owned();
    let line = doctor
        .lines()
        .find(|l| l.starts_with("node agent: budgets share a cgroup"))
        .unwrap_or_else(|| panic!("{doctor}"));
    assert!(line.contains(&jobs_name) && line.contains("lease holders of pod-1_main"), "{doctor}");

    let mut serve = serve(&node, &["--policy", "kill-newest", "--grace", "0.5"]);
    std::thread::sleep(Duration::from_millis(2500));
    let _ = serve.kill();
    let _ = serve.wait();
    let mut stderr = String::new();
    serve.stderr.take().expect("serve's stderr").read_to_string(&mut stderr).expect("serve's stderr");
    let first =
        stderr.lines().find(|l| l.contains("policy kill-newest:")).unwrap_or_else(|| panic!("{stderr}"));
    assert!(first.contains(&jobs_name) && first.contains("only on lease holders"), "{stderr}");
    assert!(!stderr.contains("SIGKILL"), "{stderr}");
    for pid in [holder, gl, big, plain, waiting.id()] {
        assert!(alive(pid), "kill-newest touched host pid {pid}:\n{stderr}");
    }

    // Without the processes on the card, budget 4's job, which has not touched it, still marks the
    // cgroup shared: every process the cgroup lists is looked at.
    for child in node.loose.iter_mut().filter(|c| [gl, big, plain].contains(&c.id())) {
        let _ = child.kill();
        let _ = child.wait();
    }
    let json = node.json();
    let shared = &json["accounting"]["shared_cgroups"];
    assert_eq!(shared[0]["host_pid"], waiting.id(), "{json:#}");
    assert_eq!(shared[0]["why"].as_str().map(|w| w.contains("names another region")), Some(true), "{json:#}");
    let _ = waiting.kill();
    let _ = waiting.wait();
}

#[test]
fn a_pass_over_100_containers_with_regions_is_timed() {
    // The cost of one pass on a node of 100 containers, each a folder with a region and a live
    // process holding a lease in it, printed for docs/node-agent.md; bounded loosely so a slow
    // machine still passes.
    let mut node = Node::new("node-agent-100");
    let mut children = Vec::new();
    for i in 0..100 {
        let folder = node.containers.join(format!("pod-{i:03}_main"));
        std::fs::create_dir_all(&folder).expect("create a folder");
        let mut command = Command::new(&node.client);
        command.args(["1", "0", "0"]).stdout(Stdio::piped()).stderr(Stdio::null());
        node.fake_env(&mut command);
        command
            .env("LD_PRELOAD", &common::artifacts().libvgpu)
            .env("CUDA_DEVICE_MEMORY_LIMIT_0", "64m")
            .env("CUDA_DEVICE_MEMORY_SHARED_CACHE", folder.join("region.cache"));
        children.push(command.spawn().expect("start graphics_client"));
    }
    for child in &mut children {
        let mut text = String::new();
        let mut stdout = child.stdout.take().expect("stdout");
        let mut buffer = [0u8; 256];
        while !text.contains("ready=1") {
            let n = stdout.read(&mut buffer).unwrap_or(0);
            assert!(n > 0, "graphics_client ended: {text}");
            text.push_str(&String::from_utf8_lossy(&buffer[..n]));
        }
        assert!(text.contains("cuda_status=0"), "{text}");
    }
    node.loose.extend(children);
    let processes = std::fs::read_dir("/proc")
        .expect("read /proc")
        .flatten()
        .filter(|e| e.file_name().to_str().is_some_and(|n| n.parse::<u32>().is_ok()))
        .count();
    let json = node.json();
    for i in 0..100 {
        let name = format!("pod-{i:03}_main");
        let found = processes_of(&json, &name);
        assert_eq!(found.len(), 1, "{name}: {json:#}");
        assert_eq!(found.values().next().expect("one").2, "lease", "{json:#}");
    }
    let once = |args: &[&str], path: &Path| {
        let mut command = Command::new(common::smi_binary());
        command.args(args).arg(path);
        node.fake_env(&mut command);
        let started = Instant::now();
        assert!(command.output().expect("run vgpu-smi").status.success());
        started.elapsed()
    };
    // The fastest of 5 passes each, the two taken in turn: other tests running beside this one
    // load both alike.
    let time = |args: &[&str], all: &Path, single: &Path| {
        (0..5)
            .map(|_| (once(args, all), once(args, single)))
            .fold((Duration::MAX, Duration::MAX), |(a, b), (x, y)| (a.min(x), b.min(y)))
    };
    let one = node.containers.join("pod-000_main/region.cache");
    let mut each = Vec::new();
    for args in [&["metrics"][..], &["--json"][..]] {
        let (all, single) = time(args, &node.containers, &one);
        println!(
            "vgpu-smi {} over 100 container folders, each with a region and a live process ({processes} processes on the machine): {:.1} ms a pass (fastest of 5); {:.1} ms for one of those regions alone ({:.1}x)",
            args[0],
            all.as_secs_f64() * 1000.0,
            single.as_secs_f64() * 1000.0,
            all.as_secs_f64() / single.as_secs_f64()
        );
        each.push((all, single));
    }
    // One /proc scan per pass, not one per region: the accounting's pass over 100 regions (what
    // `metrics` and `serve --policy` run) costs a few times one region's, not a hundred times.
    let (all, single) = each[0];
    assert!(all < single * 10, "metrics over 100 regions {all:?}, over one {single:?}");
}

#[test]
fn the_library_names_graphics_memory_that_takes_the_container_past_its_budget() {
    let scratch = Scratch::new("node-agent-lib");
    let mut command = Command::new(graphics_client());
    for (key, _) in std::env::vars() {
        if key.starts_with("CUDA_") || key.starts_with("FAKEGPU_") || key.starts_with("LIBCUDA_") {
            command.env_remove(key);
        }
    }
    let output = command
        .args(["256", "1024", "1500"])
        .env("LD_LIBRARY_PATH", &common::artifacts().fake_driver_dir)
        .env("LD_PRELOAD", &common::artifacts().libvgpu)
        .env("CUDA_DEVICE_MEMORY_LIMIT_0", "1g")
        .env("CUDA_DEVICE_MEMORY_SHARED_CACHE", scratch.path("region.cache"))
        .output()
        .expect("run graphics_client");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stdout.contains("cuda_status=0") && stdout.contains("graphics_status=0"), "{stdout}");
    let lines: Vec<&str> = stderr.lines().filter(|l| l.contains("no allocation call")).collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(lines[0].contains("likely source: graphics"), "{stderr}");
    assert!(lines[0].contains("vgpu-smi serve --policy"), "{stderr}");
}

#[test]
fn doctor_says_what_only_the_node_agent_holds() {
    let scratch = Scratch::new("node-agent-doctor");
    let output = Command::new(common::smi_binary())
        .args(["doctor", "--library"])
        .arg(&common::artifacts().libvgpu)
        .arg(scratch.path("none.cache"))
        .env("LD_LIBRARY_PATH", &common::artifacts().fake_driver_dir)
        .env_remove("LD_PRELOAD")
        .output()
        .expect("run vgpu-smi doctor");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("OpenGL and EGL, video codecs"), "{stdout}");
    assert!(stdout.contains("only the node agent's policy"), "{stdout}");
}
