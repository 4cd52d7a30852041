//! Real OCI containers for the tests: a node laid out as HAMi lays it out, and specs written the
//! way containerd writes them for a Kubernetes pod, run by runc (or crun: `VGPU_OCI_RUNTIME`).
//!
//! The image is the node's own root filesystem, read-only under an overlay whose upper layer is in
//! the test's scratch folder (as containerd's overlay snapshotter gives a container its image); the
//! runtime makes its mount points there. The seccomp profile is the distribution's default
//! (`/usr/share/containers/seccomp.json`), turned into the runtime spec's form here for the
//! capabilities the container has. Nothing of the host's `/etc` or `/usr` is written.
//!
//! For a real GPU (by hand): `VGPU_OCI_DRIVER` and `VGPU_OCI_NVML` name the driver's
//! `libcuda.so.1` and `libnvidia-ml.so.1` to bind instead of the fake, and `VGPU_OCI_DEVICES` the
//! device nodes to give every container (`/dev/nvidiactl:/dev/nvidia-uvm:/dev/nvidia0`).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::{self, Scratch};

/// Docker's and containerd's default capabilities: neither CAP_SYS_ADMIN nor CAP_SYS_PTRACE.
pub const DEFAULT_CAPS: [&str; 14] = [
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FSETID",
    "CAP_FOWNER",
    "CAP_MKNOD",
    "CAP_NET_RAW",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETFCAP",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_KILL",
    "CAP_AUDIT_WRITE",
];

/// containerd's masked paths.
const MASKED: [&str; 11] = [
    "/proc/acpi",
    "/proc/asound",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
];

/// containerd's read-only paths.
const READ_ONLY: [&str; 5] = ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"];

/// The environment a runtime gives a process it starts without the pod's: `runc exec` of a
/// process spec that names nothing else.
pub const RUNTIME_PATH: &str = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Where the container sees the test's programs (the client, its setuid copy, vgpu-smi).
pub const TOOLS: &str = "/opt/vgpu-test";
/// Where every container sees the folder of the fake's shared card (`FAKEGPU_SHARED`).
const CARD: &str = "/run/fakegpu";

/// The runtime's name, or why these tests cannot run here.
pub fn runtime() -> Result<String, String> {
    let name = std::env::var("VGPU_OCI_RUNTIME").unwrap_or_else(|_| "runc".into());
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err("not root: an OCI runtime needs root to make namespaces and cgroups".into());
    }
    let probe =
        Command::new("unshare").args(["--mount", "--pid", "--ipc", "--uts", "--fork", "true"]).output();
    match probe {
        Ok(out) if out.status.success() => {}
        Ok(out) => {
            return Err(format!(
                "cannot create namespaces here: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Err(e) => return Err(format!("cannot run unshare: {e}")),
    }
    Ok(name)
}

/// The node: HAMi's folders, the image, the runtime's state, and the containers started.
pub struct Node {
    pub scratch: Scratch,
    pub runtime: String,
    rootfs: PathBuf,
    state: PathBuf,
    /// The node's `/usr/local/vgpu/containers`, which the monitor scans.
    pub containers: PathBuf,
    lib: PathBuf,
    preload: PathBuf,
    driver: PathBuf,
    nvml: PathBuf,
    devices: Vec<PathBuf>,
    tools: PathBuf,
    card: PathBuf,
    profile: Value,
    started: Vec<String>,
}

fn copy_executable(from: &Path, to: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::copy(from, to).unwrap_or_else(|e| panic!("copy {} to {}: {e}", from.display(), to.display()));
    std::fs::set_permissions(to, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

fn open_folder(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(path).expect("create folder");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o777)).expect("chmod");
}

fn run_ok(command: &mut Command) -> String {
    let out = command.output().unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"));
    assert!(
        out.status.success(),
        "{command:?}: {}\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

impl Node {
    pub fn new(name: &str, runtime: String) -> Node {
        let artifacts = common::artifacts();
        let scratch = Scratch::in_memory(name);
        let root = scratch.path("node/usr/local/vgpu");
        let containers = root.join("containers");
        open_folder(&containers);
        let lib = root.join("libvgpu.so");
        copy_executable(&artifacts.libvgpu, &lib, 0o755);
        let preload = scratch.path("ld.so.preload");
        std::fs::write(&preload, "/usr/local/vgpu/libvgpu.so\n").expect("write the preload file");
        let tools = scratch.path("tools");
        std::fs::create_dir_all(&tools).expect("create tools");
        copy_executable(&artifacts.client, &tools.join("vgpu_client"), 0o755);
        copy_executable(&artifacts.client, &tools.join("setuid_client"), 0o4755);
        copy_executable(common::smi_binary(), &tools.join("vgpu-smi"), 0o755);
        let fake = scratch.path("libfakegpu.so");
        copy_executable(&artifacts.fake_driver_dir.join("libcuda.so.1"), &fake, 0o755);
        let driver = std::env::var_os("VGPU_OCI_DRIVER").map_or(fake.clone(), PathBuf::from);
        let nvml = std::env::var_os("VGPU_OCI_NVML").map_or(fake, PathBuf::from);
        let devices = std::env::var("VGPU_OCI_DEVICES")
            .map(|list| list.split(':').filter(|d| !d.is_empty()).map(PathBuf::from).collect())
            .unwrap_or_default();
        let card = scratch.path("card");
        open_folder(&card);

        // The image: the node's root, read-only, under an overlay the runtime may add mount points to.
        let rootfs = scratch.path("rootfs");
        for dir in ["rootfs", "upper", "work"] {
            std::fs::create_dir_all(scratch.path(dir)).expect("create overlay folder");
        }
        let options = format!(
            "lowerdir=/,upperdir={},workdir={}",
            scratch.path("upper").display(),
            scratch.path("work").display()
        );
        run_ok(Command::new("mount").args(["-t", "overlay", "vgpu-oci-image", "-o", &options]).arg(&rootfs));

        let text = std::fs::read_to_string("/usr/share/containers/seccomp.json")
            .expect("read /usr/share/containers/seccomp.json (Debian: golang-github-containers-common; ci/setup test)");
        let profile: Value = serde_json::from_str(&text).expect("the default seccomp profile is JSON");
        let state = scratch.path("state");
        std::fs::create_dir_all(&state).expect("create the runtime's state folder");
        Node {
            scratch,
            runtime,
            rootfs,
            state,
            containers,
            lib,
            preload,
            driver,
            nvml,
            devices,
            tools,
            card,
            profile,
            started: Vec::new(),
        }
    }

    /// The runtime, with its state in the scratch folder.
    pub fn runtime(&self) -> Command {
        let mut command = Command::new(&self.runtime);
        command.arg("--root").arg(&self.state);
        command
    }

    /// The pod container's folder on the node (`<pod-uid>_<container>`), made on first use.
    pub fn folder(&self, pod: &Pod) -> PathBuf {
        let dir = self.containers.join(format!("{}_{}", pod.uid, pod.container));
        open_folder(&dir);
        dir
    }

    /// The default seccomp profile in the runtime spec's form, for a container with `caps`.
    pub fn seccomp(&self, caps: &[&str]) -> Value {
        oci_seccomp(&self.profile, caps)
    }

    /// The spec of one container, as containerd writes it for a pod's container.
    pub fn spec(&self, c: &Container) -> Value {
        let mut mounts = vec![
            json!({"destination": "/proc", "type": "proc", "source": "proc", "options": ["nosuid", "noexec", "nodev"]}),
            json!({"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
                   "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]}),
            json!({"destination": "/dev/pts", "type": "devpts", "source": "devpts",
                   "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"]}),
            json!({"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
                   "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]}),
            json!({"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue",
                   "options": ["nosuid", "noexec", "nodev"]}),
            json!({"destination": "/sys", "type": "sysfs", "source": "sysfs",
                   "options": ["nosuid", "noexec", "nodev", "ro"]}),
            json!({"destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup",
                   "options": ["nosuid", "noexec", "nodev", "relatime", "ro"]}),
            json!({"destination": "/tmp", "type": "tmpfs", "source": "tmpfs",
                   "options": ["nosuid", "nodev", "mode=1777", "size=65536k"]}),
        ];
        let bind = |source: &Path, destination: &str, rw: bool| {
            json!({"destination": destination, "type": "bind", "source": source,
                   "options": ["rbind", if rw { "rw" } else { "ro" }]})
        };
        // The NVIDIA container toolkit's places for the driver's libraries.
        let multiarch = format!("/usr/lib/{}-linux-gnu", std::env::consts::ARCH);
        mounts.push(bind(&self.driver, &format!("{multiarch}/libcuda.so.1"), false));
        mounts.push(bind(&self.nvml, &format!("{multiarch}/libnvidia-ml.so.1"), false));
        mounts.push(bind(&self.card, CARD, true));
        mounts.push(bind(&self.tools, TOOLS, false));
        match &c.role {
            Role::Pod(pod) => {
                // HAMi's device plugin: the container's folder, the node's library read-only in
                // it, and /etc/ld.so.preload naming it.
                mounts.push(bind(&self.folder(pod), "/usr/local/vgpu", true));
                mounts.push(bind(&self.lib, "/usr/local/vgpu/libvgpu.so", false));
                mounts.push(bind(&self.preload, "/etc/ld.so.preload", false));
            }
            Role::Agent => mounts.push(bind(&self.containers, "/usr/local/vgpu/containers", true)),
        }
        let mut namespaces = vec![json!({"type": "mount"}), json!({"type": "ipc"}), json!({"type": "uts"})];
        namespaces.push(json!({"type": "cgroup"}));
        if c.pid_namespace {
            namespaces.push(json!({"type": "pid"}));
        }
        let mut devices = Vec::new();
        let mut allowed = vec![json!({"allow": false, "access": "rwm"})];
        for node in &self.devices {
            use std::os::unix::fs::{FileTypeExt, MetadataExt};
            let meta = std::fs::metadata(node).unwrap_or_else(|e| panic!("{}: {e}", node.display()));
            assert!(meta.file_type().is_char_device(), "{} is not a character device", node.display());
            let (major, minor) = (libc::major(meta.rdev()) as i64, libc::minor(meta.rdev()) as i64);
            devices
                .push(json!({"path": node, "type": "c", "major": major, "minor": minor, "fileMode": 0o666,
                                "uid": 0, "gid": 0}));
            allowed
                .push(json!({"allow": true, "type": "c", "major": major, "minor": minor, "access": "rwm"}));
        }
        let caps = c.caps.clone();
        json!({
            "ociVersion": "1.0.2",
            "process": c.process(&c.args, c.user, c.env.clone()),
            "root": {"path": self.rootfs, "readonly": true},
            "hostname": c.id,
            "mounts": mounts,
            "linux": {
                "namespaces": namespaces,
                "cgroupsPath": format!("/vgpu-oci-test/{}-{}", std::process::id(), c.id),
                "resources": {"memory": {"limit": c.memory_limit}, "devices": allowed},
                "devices": devices,
                "seccomp": self.seccomp(&caps.iter().map(String::as_str).collect::<Vec<_>>()),
                "maskedPaths": MASKED,
                "readonlyPaths": READ_ONLY,
            },
        })
    }

    fn bundle(&mut self, c: &Container) -> PathBuf {
        let bundle = self.scratch.path(&format!("bundles/{}", c.id));
        std::fs::create_dir_all(&bundle).expect("create bundle");
        let spec = serde_json::to_string_pretty(&self.spec(c)).expect("spec");
        std::fs::write(bundle.join("config.json"), spec).expect("write config.json");
        if !self.started.contains(&c.id) {
            self.started.push(c.id.clone());
        }
        bundle
    }

    /// Starts the container; its first process's stdin and stdout are the test's.
    pub fn start(&mut self, c: &Container) -> Process {
        let bundle = self.bundle(c);
        let mut command = self.runtime();
        command.arg("run").arg("--bundle").arg(&bundle).arg(&c.id);
        Process::spawn(command)
    }

    /// A process started in the running container `c` with `runtime exec`, its own process spec.
    pub fn exec_command(&self, c: &Container, args: &[&str], user: (u32, u32), env: Vec<String>) -> Command {
        let file = self.scratch.path(&format!("bundles/{}/exec-{}.json", c.id, unique()));
        std::fs::write(&file, c.process(args, user, env).to_string()).expect("write the process spec");
        let mut command = self.runtime();
        command.arg("exec").arg("--process").arg(&file).arg(&c.id);
        command
    }

    /// `exec_command`, run to its end: its key=value lines.
    pub fn exec(&self, c: &Container, args: &[&str], user: (u32, u32), env: Vec<String>) -> Lines {
        let out =
            self.exec_command(c, args, user, env).stdin(Stdio::null()).output().expect("run the runtime");
        let lines =
            Lines::parse(&String::from_utf8_lossy(&out.stdout), &String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "exec {args:?} in {}: {}\n{}", c.id, out.status, lines.all);
        lines
    }

    /// The host pid of the container's first process.
    pub fn init_pid(&self, id: &str) -> i64 {
        let state: Value = serde_json::from_str(&run_ok(self.runtime().args(["state", id]))).expect("state");
        state["pid"].as_i64().expect("a pid")
    }

    /// Kills every process of the container with SIGKILL (`kill --all`, as the kubelet's runtime
    /// does for a pod's container) and removes it, once the runtime that started it (`first`) has
    /// seen its first process end.
    pub fn kill(&self, id: &str, first: Option<Process>) {
        let _ = self.runtime().args(["kill", "--all", id, "KILL"]).output();
        if let Some(first) = first {
            first.finish();
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let out = self.runtime().args(["delete", "--force", id]).output().expect("run the runtime");
            let gone = self.runtime().args(["state", id]).output().is_ok_and(|state| !state.status.success());
            if gone {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{id} still there after `delete --force`: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `vgpu-smi --json` of the node's container folder, run on the node.
    pub fn view(&self) -> Value {
        let out = Command::new(common::smi_binary())
            .arg("--json")
            .arg(&self.containers)
            .output()
            .expect("vgpu-smi");
        serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("vgpu-smi --json: {e}: {}", String::from_utf8_lossy(&out.stderr)))
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        for id in self.started.clone() {
            let _ = self.runtime().args(["kill", "--all", &id, "KILL"]).output();
            let _ = self.runtime().args(["delete", "--force", &id]).output();
        }
        let _ = Command::new("umount").arg("--lazy").arg(&self.rootfs).status();
        // The runtime removes each container's cgroup, not the parent they shared.
        for controller in std::fs::read_dir("/sys/fs/cgroup").into_iter().flatten().flatten() {
            let _ = std::fs::remove_dir(controller.path().join("vgpu-oci-test"));
        }
    }
}

fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// A Kubernetes pod's container as HAMi's device plugin sees it.
pub struct Pod {
    pub uid: String,
    pub container: String,
    /// `CUDA_DEVICE_MEMORY_LIMIT_0`, as the device plugin writes it (`1024m`).
    pub limit: String,
    /// The region's name in the container's folder.
    pub region: String,
}

impl Pod {
    pub fn new(uid: &str, container: &str, limit: &str, region: &str) -> Pod {
        Pod { uid: uid.into(), container: container.into(), limit: limit.into(), region: region.into() }
    }

    /// The variables HAMi's device plugin sets.
    pub fn env(&self) -> Vec<String> {
        vec![
            RUNTIME_PATH.into(),
            format!("CUDA_DEVICE_MEMORY_LIMIT_0={}", self.limit),
            "CUDA_DEVICE_SM_LIMIT=0".into(),
            format!("CUDA_DEVICE_MEMORY_SHARED_CACHE=/usr/local/vgpu/{}", self.region),
            "NVIDIA_VISIBLE_DEVICES=all".into(),
            format!("FAKEGPU_SHARED={CARD}/card"),
        ]
    }
}

pub enum Role {
    Pod(Pod),
    /// The node agent (`vgpu-smi serve`): the node's container folder read-write, the host's pids.
    Agent,
}

pub struct Container {
    pub id: String,
    pub role: Role,
    pub args: Vec<String>,
    pub user: (u32, u32),
    pub env: Vec<String>,
    pub caps: Vec<String>,
    pub pid_namespace: bool,
    pub memory_limit: u64,
}

impl Container {
    /// A pod's container running `args` as uid 1000 with the pod's variables.
    pub fn pod(pod: Pod, args: &[&str]) -> Container {
        Container {
            id: format!("{}-{}", pod.uid, pod.container),
            env: pod.env(),
            role: Role::Pod(pod),
            args: args.iter().map(|a| a.to_string()).collect(),
            user: (1000, 1000),
            caps: DEFAULT_CAPS.iter().map(|c| c.to_string()).collect(),
            pid_namespace: true,
            memory_limit: 512 << 20,
        }
    }

    /// The node agent's container, as the README's DaemonSet snippet has it.
    pub fn agent(id: &str, args: &[&str]) -> Container {
        Container {
            id: id.into(),
            role: Role::Agent,
            args: args.iter().map(|a| a.to_string()).collect(),
            user: (0, 0),
            env: vec![RUNTIME_PATH.into(), format!("FAKEGPU_SHARED={CARD}/card")],
            caps: DEFAULT_CAPS.iter().map(|c| c.to_string()).collect(),
            pid_namespace: false,
            memory_limit: 256 << 20,
        }
    }

    pub fn pod_info(&self) -> &Pod {
        match &self.role {
            Role::Pod(pod) => pod,
            Role::Agent => panic!("{} is not a pod's container", self.id),
        }
    }

    fn process(&self, args: &[impl AsRef<str>], (uid, gid): (u32, u32), env: Vec<String>) -> Value {
        let args: Vec<&str> = args.iter().map(AsRef::as_ref).collect();
        json!({
            "terminal": false,
            "user": {"uid": uid, "gid": gid},
            "args": args,
            "env": env,
            "cwd": "/",
            "capabilities": {
                "bounding": self.caps, "effective": self.caps, "permitted": self.caps,
            },
            "noNewPrivileges": false,
        })
    }
}

/// A process whose stdin the test writes and whose key=value lines it reads as they come.
pub struct Process {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    pub seen: Lines,
}

impl Process {
    pub fn spawn(mut command: Command) -> Process {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"));
        let (tx, rx) = channel();
        for stream in [
            Box::new(child.stdout.take().expect("stdout")) as Box<dyn std::io::Read + Send>,
            Box::new(child.stderr.take().expect("stderr")),
        ] {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            });
        }
        Process { stdin: child.stdin.take(), child, lines: rx, seen: Lines::default() }
    }

    pub fn send(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        writeln!(stdin, "{line}").and_then(|()| stdin.flush()).expect("write to the process");
    }

    /// Waits for a line `key=…` and returns its value.
    pub fn wait_for(&mut self, key: &str) -> String {
        self.wait_until(key, |seen| seen.values.get(key).cloned())
    }

    /// Waits for a line containing `text` and returns it.
    pub fn wait_for_text(&mut self, text: &str) -> String {
        self.wait_until(text, |seen| seen.all.lines().find(|line| line.contains(text)).map(str::to_owned))
    }

    fn wait_until(&mut self, what: &str, found: impl Fn(&Lines) -> Option<String>) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(value) = found(&self.seen) {
                return value;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => self.seen.add(&line),
                Err(_) => panic!("no {what} within 30 s:\n{}", self.seen.all),
            }
        }
    }

    pub fn close_stdin(&mut self) {
        self.stdin = None;
    }

    /// Waits for the process to end; what it printed.
    pub fn finish(mut self) -> Lines {
        self.stdin = None;
        let deadline = Instant::now() + Duration::from_secs(30);
        // The runtime passes its own stdin on: closing it is the process's end of input.
        while self.child.try_wait().expect("wait").is_none() {
            assert!(Instant::now() < deadline, "still running after 30 s:\n{}", self.seen.all);
            std::thread::sleep(Duration::from_millis(20));
        }
        while let Ok(line) = self.lines.recv_timeout(Duration::from_millis(200)) {
            self.seen.add(&line);
        }
        std::mem::take(&mut self.seen)
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Key=value lines, and all the text.
#[derive(Default)]
pub struct Lines {
    pub values: BTreeMap<String, String>,
    pub all: String,
}

impl Lines {
    pub fn parse(stdout: &str, stderr: &str) -> Lines {
        let mut lines = Lines::default();
        stdout.lines().chain(stderr.lines()).for_each(|line| lines.add(line));
        lines
    }

    fn add(&mut self, line: &str) {
        self.all.push_str(line);
        self.all.push('\n');
        if let Some((k, v)) = line.split_once('=') {
            self.values.insert(k.to_owned(), v.to_owned());
        }
    }

    pub fn get(&self, key: &str) -> &str {
        self.values.get(key).unwrap_or_else(|| panic!("no {key}=:\n{}", self.all))
    }
}

/// The Go name of this machine's architecture in the profile's `includes.arches`, and its
/// libseccomp name.
fn arch() -> (&'static str, &'static str) {
    match std::env::consts::ARCH {
        "x86_64" => ("amd64", "SCMP_ARCH_X86_64"),
        "aarch64" => ("arm64", "SCMP_ARCH_AARCH64"),
        other => panic!("no seccomp architecture known for {other}"),
    }
}

fn kernel_at_least(wanted: &str) -> bool {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let numbers = |text: &str| -> Vec<u32> {
        text.split(|c: char| !c.is_ascii_digit()).take(2).map(|n| n.parse().unwrap_or(0)).collect()
    };
    numbers(release.trim()) >= numbers(wanted)
}

/// A profile in the containers' (Docker's) form turned into the runtime spec's `linux.seccomp`
/// for a container with `caps`: rules are kept when their `includes` hold (every capability named,
/// this architecture, the kernel's version) and their `excludes` do not.
pub fn oci_seccomp(profile: &Value, caps: &[&str]) -> Value {
    let (go_arch, scmp_arch) = arch();
    let mut architectures = vec![Value::from(scmp_arch)];
    for entry in profile["archMap"].as_array().into_iter().flatten() {
        if entry["architecture"] == scmp_arch {
            architectures.extend(entry["subArchitectures"].as_array().into_iter().flatten().cloned());
        }
    }
    let list = |v: &Value, key: &str| -> Vec<String> {
        v[key].as_array().into_iter().flatten().filter_map(|x| x.as_str().map(str::to_owned)).collect()
    };
    let mut syscalls = Vec::new();
    for rule in profile["syscalls"].as_array().expect("syscalls") {
        let (inc, exc) = (&rule["includes"], &rule["excludes"]);
        let inc_caps = list(inc, "caps");
        let inc_arches = list(inc, "arches");
        if !inc_caps.iter().all(|c| caps.contains(&c.as_str()))
            || (!inc_arches.is_empty() && !inc_arches.iter().any(|a| a == go_arch))
            || inc["minKernel"].as_str().is_some_and(|k| !kernel_at_least(k))
            || list(exc, "caps").iter().any(|c| caps.contains(&c.as_str()))
            || list(exc, "arches").iter().any(|a| a == go_arch)
        {
            continue;
        }
        let mut out = json!({"names": rule["names"], "action": rule["action"]});
        if let Some(args) = rule["args"].as_array().filter(|a| !a.is_empty()) {
            out["args"] = Value::from(args.clone());
        }
        if let Some(errno) = rule.get("errnoRet").filter(|e| !e.is_null()) {
            out["errnoRet"] = errno.clone();
        }
        syscalls.push(out);
    }
    let mut seccomp = json!({
        "defaultAction": profile["defaultAction"],
        "architectures": architectures,
        "syscalls": syscalls,
    });
    if let Some(errno) = profile.get("defaultErrnoRet").filter(|e| !e.is_null()) {
        seccomp["defaultErrnoRet"] = errno.clone();
    }
    seccomp
}

/// Of `names`, those the profile (in the runtime spec's form) does not allow outright: each with
/// `conditional` (allowed for some arguments) or `refused`.
pub fn not_allowed(seccomp: &Value, names: &[String]) -> BTreeMap<String, &'static str> {
    let mut verdict = BTreeMap::new();
    for name in names {
        let mut plain = false;
        let mut conditional = false;
        for rule in seccomp["syscalls"].as_array().expect("syscalls") {
            if rule["action"] != "SCMP_ACT_ALLOW"
                || !rule["names"].as_array().expect("names").iter().any(|n| n == name)
            {
                continue;
            }
            if rule.get("args").is_some() { conditional = true } else { plain = true }
        }
        if !plain {
            verdict.insert(name.clone(), if conditional { "conditional" } else { "refused" });
        }
    }
    verdict
}
