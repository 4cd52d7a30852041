//! KAI-Scheduler's layout, rebuilt with real mount and pid namespaces (`unshare`, as root; no
//! Kubernetes): the node's one folder holding `libvgpu.so` and `ld.so.preload` is bound at
//! `/usr/local/vgpu` in every pod, read-write, and its `ld.so.preload` over the pod's
//! `/etc/ld.so.preload` (in a copy of `/etc`), as KAI-resource-isolator's webhook mounts them; each
//! pod's first process has the variables the webhook (`POD_UID`, `CONTAINER_NAME`,
//! `CONTAINER_VGPU_MOUNT`) and KAI's binder (`CUDA_DEVICE_MEMORY_LIMIT`) set. A model of KAI's
//! monitor (`pkg/monitor/nvidia/cudevshr.go` in the isolator) then reads the node's tree. The host's
//! `/etc` and `/usr/local` are never written.

mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

use common::{GIB, MIB, Run, SHARED_CACHE_VAR, Scratch};

const CUDA_ERROR_OUT_OF_MEMORY: &str = "2";
const STEPS: Duration = Duration::from_secs(90);
const HOOK: &str = "/usr/local/vgpu";

/// Builds what the webhook gives a pod, then runs `T_STEPS`: every result is a `key=value` line.
const POD_SCRIPT: &str = r#"
set -euo pipefail
mount -t tmpfs kai-test /usr/local
mkdir -p /usr/local/vgpu
mount --bind "$T_NODE" /usr/local/vgpu
mount --bind "$T_ETC" /etc
mount --bind /usr/local/vgpu/ld.so.preload /etc/ld.so.preload
mount -o remount,bind,ro /etc/ld.so.preload
client="$T_BIN/vgpu_client"
driver="LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
nobody=(setpriv --reuid=65534 --regid=65534 --clear-groups)
# `step NAME COMMAND...`: the command's output, its keys prefixed by NAME; its stderr in NAME.err.
step() {
    local name=$1
    shift
    "$@" < /dev/null 2> "$T_OUT/$name.err" | sed "s/^/${name}_/" || true
}
# `hold NAME`: the pod's process holds what its budget allows until the test says go.
hold() {
    mkfifo "$T_OUT/$1.in"
    "$client" direct hold 64 16384 < "$T_OUT/$1.in" > "$T_OUT/$1.out" 2> "$T_OUT/$1.err" &
    exec 3> "$T_OUT/$1.in"
    until grep -q '^ready=' "$T_OUT/$1.out" 2> /dev/null; do sleep 0.02; done
    sed "s/^/$1_/" "$T_OUT/$1.out"
    echo "holding=1"
    read -r go
    exec 3>&-
    wait
}
eval "$T_STEPS"
echo "finished=1"
"#;

/// The node: its folder as the isolator's DaemonSet installs it, the client and the fake driver.
struct Node {
    scratch: Scratch,
    etc: PathBuf,
}

impl Node {
    fn new(name: &str) -> Node {
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        assert!(
            root,
            "this test rebuilds pods with unshare and bind mounts, which needs root (CI runs as root)"
        );
        let artifacts = common::artifacts();
        let scratch = Scratch::in_memory(name);
        let folder = scratch.path("node");
        std::fs::create_dir_all(&folder).expect("the node's folder");
        copy_executable(&artifacts.libvgpu, &folder.join("libvgpu.so"));
        std::fs::write(folder.join("ld.so.preload"), format!("{HOOK}/libvgpu.so\n")).expect("ld.so.preload");
        let bin = scratch.path("bin");
        std::fs::create_dir_all(bin.join("driver")).expect("bin");
        copy_executable(&artifacts.client, &bin.join("vgpu_client"));
        for name in ["libcuda.so.1", "libnvidia-ml.so.1"] {
            copy_executable(&artifacts.fake_driver_dir.join(name), &bin.join("driver").join(name));
        }
        let etc = common::etc_preloading(&scratch, Path::new("/nonexistent-replaced-by-the-mount"));
        Node { scratch, etc }
    }

    /// The node's folder, as seen from the node.
    fn folder(&self) -> PathBuf {
        self.scratch.path("node")
    }

    /// A container's own folder on the node.
    fn own(&self, pod: &str) -> PathBuf {
        self.folder().join("containers").join(pod)
    }

    /// Starts a pod whose first process has `env` (KAI's variables), running `steps`.
    fn pod(&self, name: &str, env: &[(&str, &str)], steps: &str) -> Pod {
        let out = self.scratch.path(&format!("out-{name}"));
        std::fs::create_dir_all(&out).expect("the pod's output folder");
        let mut command = Command::new("unshare");
        command
            .args(["--mount", "--pid", "--fork", "--mount-proc", "bash", "-c", POD_SCRIPT])
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env("LD_LIBRARY_PATH", self.scratch.path("bin/driver"))
            .env("T_NODE", self.folder())
            .env("T_ETC", &self.etc)
            .env("T_BIN", self.scratch.path("bin"))
            .env("T_SMI", common::smi_binary())
            .env("T_OUT", &out)
            .env("T_STEPS", steps)
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(out.join("pod.stderr")).expect("the pod's stderr"));
        let mut child = command.spawn().expect("run unshare");
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Pod { name: name.to_owned(), child, stdin, lines, values: HashMap::new(), all: String::new(), out }
    }

    /// A pod's steps, run to their end.
    fn run(&self, name: &str, env: &[(&str, &str)], steps: &str) -> Pod {
        let mut pod = self.pod(name, env, steps);
        pod.finish();
        pod
    }
}

fn copy_executable(from: &Path, to: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::copy(from, to).unwrap_or_else(|e| panic!("copy {} to {}: {e}", from.display(), to.display()));
    std::fs::set_permissions(to, std::fs::Permissions::from_mode(0o755)).expect("chmod");
}

/// A running pod and what it printed.
struct Pod {
    name: String,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    values: HashMap<String, String>,
    all: String,
    out: PathBuf,
}

impl Pod {
    fn wait_for(&mut self, key: &str) {
        let deadline = Instant::now() + STEPS;
        while !self.values.contains_key(key) {
            let left = deadline.saturating_duration_since(Instant::now());
            let Ok(line) = self.lines.recv_timeout(left) else {
                panic!("{}: no {key}= within {STEPS:?}:\n{}\n{}", self.name, self.all, self.stderr())
            };
            self.all.push_str(&line);
            self.all.push('\n');
            if let Some((k, v)) = line.split_once('=') {
                self.values.insert(k.to_owned(), v.to_owned());
            }
        }
    }

    fn get(&self, key: &str) -> &str {
        self.values.get(key).unwrap_or_else(|| panic!("{}: no {key}=:\n{}", self.name, self.all))
    }

    /// Lets a holding process go and waits for the pod's end.
    fn finish(&mut self) {
        if let Some(mut stdin) = self.stdin.take() {
            let _ = writeln!(stdin, "go");
        }
        self.wait_for("finished");
        let status = self.child.wait().expect("wait for the pod");
        assert!(status.success(), "{}: {status}\n{}\n{}", self.name, self.all, self.stderr());
    }

    /// What the pod's script wrote to stderr.
    fn stderr(&self) -> String {
        std::fs::read_to_string(self.out.join("pod.stderr")).unwrap_or_default()
    }

    /// What step `name` wrote to stderr: libvgpu's lines.
    fn err(&self, name: &str) -> String {
        std::fs::read_to_string(self.out.join(format!("{name}.err"))).unwrap_or_default()
    }

    /// Asserts step `name` got nothing and said why in exactly one line holding `words`.
    fn refused_in_one_line(&self, name: &str, words: &str) {
        assert_eq!(self.get(&format!("{name}_held_bytes")), "0", "{name}: {}\n{}", self.all, self.err(name));
        assert_eq!(self.get(&format!("{name}_hold_status")), CUDA_ERROR_OUT_OF_MEMORY, "{name}");
        let err = self.err(name);
        let lines: Vec<&str> = err.lines().filter(|line| !line.trim().is_empty()).collect();
        assert_eq!(lines.len(), 1, "{name}: one line, not:\n{err}");
        assert!(lines[0].contains(words), "{name}: {words:?} not in:\n{err}");
    }
}

impl Drop for Pod {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The variables of one pod, as the webhook and the binder set them.
fn kai_env(uid: &'static str, name: &'static str, limit: &'static str) -> Vec<(&'static str, &'static str)> {
    vec![
        ("POD_UID", uid),
        ("CONTAINER_NAME", name),
        ("CONTAINER_VGPU_MOUNT", HOOK),
        ("CUDA_DEVICE_MEMORY_LIMIT", limit),
    ]
}

/// KAI's monitor's rules (`ContainerLister.Update`, `loadCacheFile`), applied to the node's tree.
mod kai_monitor {
    use super::*;

    /// `sizeof(shared_region_t)` of pre-versioned HAMi-core plus the byte its lseek and write add.
    pub const V0_SIZE: u64 = 1_197_897;
    const MAGIC: i32 = 19_920_718;
    /// HAMi-core's v1 region (DESIGN.md §4), the size the monitor's v1 overlay needs.
    pub const V1_SIZE: u64 = 2_008_952;
    const LIMIT_0: u64 = 1600;
    const SLOTS: u64 = 1856;
    const SLOT_SIZE: u64 = 1960;
    const SLOT_TOTAL_0: u64 = 8 + 32;
    const SLOT_STATUS: u64 = 1928;
    const PROC_NUM: u64 = 2_008_896;

    /// What the monitor makes of one container.
    #[derive(Debug, PartialEq, Eq)]
    pub enum Seen {
        /// A v1 region: device 0's limit and the total of its live processes' bytes there.
        V1 { limit: u64, used: u64 },
        /// Cast as v0 by its exact size.
        V0,
    }

    /// Every container the monitor adds: `(pod UID, container name)` → what it read.
    pub fn read(node: &Path) -> HashMap<(String, String), Seen> {
        let mut seen = HashMap::new();
        for entry in std::fs::read_dir(node.join("containers")).expect("the node's containers/") {
            let entry = entry.expect("an entry");
            // Non-directories are skipped (a link to one is not followed: `DirEntry.IsDir`).
            if !entry.file_type().expect("its type").is_dir() {
                continue;
            }
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some((uid, container)) = name.split_once('_').filter(|(u, c)| !u.is_empty() && !c.is_empty())
            else {
                continue;
            };
            // Only usage.cache is read; it is stat'ed and opened by name (a link there is followed).
            let file = entry.path().join("usage.cache");
            let Ok(meta) = std::fs::metadata(&file) else { continue };
            let region = std::fs::File::open(&file).expect("open the region");
            let word = |at: u64| {
                let mut bytes = [0u8; 8];
                region.read_exact_at(&mut bytes, at).expect("read the region");
                u64::from_le_bytes(bytes)
            };
            if meta.len() < 12 || word(0) as u32 as i32 != MAGIC {
                continue;
            }
            let major = (word(0) >> 32) as u32;
            let container_seen = if meta.len() == V0_SIZE {
                Seen::V0
            } else if major == 1 {
                assert!(meta.len() >= V1_SIZE, "{name}: a v1 region too short for the overlay");
                let procs = (word(PROC_NUM) as u32).min(1024) as u64;
                let used = (0..procs)
                    .map(|k| SLOTS + k * SLOT_SIZE)
                    .filter(|slot| word(slot + SLOT_STATUS) as u32 == 1)
                    .map(|slot| word(slot + SLOT_TOTAL_0))
                    .sum();
                Seen::V1 { limit: word(LIMIT_0), used }
            } else {
                continue;
            };
            seen.insert((uid.to_owned(), container.to_owned()), container_seen);
        }
        seen
    }
}

/// A region libvgpu made outside any pod, with an 8 GiB budget: what a third pod's HAMi-core (or a
/// hostile pod) leaves beside the library.
fn plant_region(path: &Path) {
    let r = Run::new("direct", &["hold", "64", "64"])
        .env(SHARED_CACHE_VAR, path.to_str().expect("UTF-8"))
        .env("CUDA_DEVICE_MEMORY_LIMIT", "8g")
        .report();
    assert!(r.success && path.is_file(), "{r:?}");
}

const UID_A: &str = "6b1e0c3a-0000-4000-8000-00000000000a";
const UID_B: &str = "6b1e0c3a-0000-4000-8000-00000000000b";

#[test]
fn each_pod_is_held_to_its_own_budget_where_kais_monitor_reads_it_and_never_adopts_a_planted_region() {
    let host_preload_before = std::fs::read("/etc/ld.so.preload").ok();
    let node = Node::new("kai-layout");
    let planted = node.folder().join("podc.cache");
    plant_region(&planted);

    // A third pod names a region in the node's folder beside the library: refused, in one line.
    let mut env_c = kai_env("6b1e0c3a-0000-4000-8000-00000000000c", "main", "4g");
    env_c.push((SHARED_CACHE_VAR, "/usr/local/vgpu/podc.cache"));
    let c = node.run("c", &env_c, r#"step c "$client" direct hold 64 16384"#);
    c.refused_in_one_line("c", "leaves this container's own folder");

    // Two pods, each holding what its budget allows, while the node looks.
    let doctor =
        r#""$T_SMI" doctor --library /usr/local/vgpu/libvgpu.so > "$T_OUT/doctor.out" 2>&1 || true; hold a"#;
    let mut a = node.pod("a", &kai_env(UID_A, "main", "1024m"), doctor);
    let mut b = node.pod("b", &kai_env(UID_B, "worker", "2g"), "hold b");
    a.wait_for("holding");
    b.wait_for("holding");
    assert_eq!(a.get("a_held_bytes"), GIB.to_string(), "{}", a.err("a"));
    assert_eq!(b.get("b_held_bytes"), (2 * GIB).to_string(), "{}", b.err("b"));

    // Each region is where KAI's monitor reads it, open to every uid of the pod as HAMi-core makes it.
    let region_a = node.own(&format!("{UID_A}_main")).join("usage.cache");
    let region_b = node.own(&format!("{UID_B}_worker")).join("usage.cache");
    for region in [&region_a, &region_b] {
        let file = std::fs::symlink_metadata(region).expect("the pod's region");
        assert!(file.is_file() && file.mode() & 0o777 == 0o666, "{}: {:o}", region.display(), file.mode());
        let folder = std::fs::symlink_metadata(region.parent().unwrap()).expect("its folder");
        assert_eq!(folder.mode() & 0o777, 0o777, "{}", region.display());
    }
    let seen = kai_monitor::read(&node.folder());
    let key = |uid: &str, name: &str| (uid.to_owned(), name.to_owned());
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!(seen[&key(UID_A, "main")], kai_monitor::Seen::V1 { limit: GIB, used: GIB });
    assert_eq!(seen[&key(UID_B, "worker")], kai_monitor::Seen::V1 { limit: 2 * GIB, used: 2 * GIB });
    // The planted region was not adopted by either: nothing charged it.
    assert_eq!(common::ledger_used0(&planted), 0);

    // Planted in a pod's own folder: a link to another pod's region, a link for the folder itself
    // and a second name of another pod's region. Each pod is refused in one line.
    let containers = node.folder().join("containers");
    let linked = containers.join("uid-d_main");
    std::fs::create_dir_all(&linked).expect("a folder");
    std::os::unix::fs::symlink(format!("../{UID_A}_main/usage.cache"), linked.join("usage.cache"))
        .expect("link");
    std::os::unix::fs::symlink(format!("{UID_A}_main"), containers.join("uid-e_main")).expect("link");
    std::fs::create_dir_all(containers.join("uid-f_main")).expect("a folder");
    std::fs::hard_link(&region_a, containers.join("uid-f_main/usage.cache")).expect("a hard link");
    for (uid, words) in [
        ("uid-d", "not a regular file"),
        ("uid-e", "uid-e_main is a symbolic link"),
        ("uid-f", "has 2 names"),
    ] {
        let p = node.run(
            uid,
            &kai_env(uid, "main", "4g"),
            &format!(r#"step {uid} "$client" direct hold 64 16384"#),
        );
        p.refused_in_one_line(uid, words);
    }
    assert_eq!(common::ledger_used0(&region_a), GIB, "a planted link moved a pod onto the other's region");
    std::fs::remove_file(containers.join("uid-f_main/usage.cache")).expect("remove the hard link");

    // The node's view reads the same tree: vgpu-smi and its metrics show both pods.
    let json = Command::new(common::smi_binary()).arg("--json").arg(&containers).output().expect("vgpu-smi");
    let json: serde_json::Value = serde_json::from_slice(&json.stdout).expect("vgpu-smi --json");
    let shown: Vec<(String, u64, u64)> = json["containers"]
        .as_array()
        .expect("containers")
        .iter()
        .filter(|c| c["region"]["devices"].is_array())
        .map(|c| {
            let device = &c["region"]["devices"][0];
            (
                c["pod_uid"].as_str().unwrap_or("").to_owned(),
                device["budget"].as_u64().unwrap_or(0),
                device["used"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    assert!(shown.contains(&(UID_A.to_owned(), GIB, GIB)), "{json:#}");
    assert!(shown.contains(&(UID_B.to_owned(), 2 * GIB, 2 * GIB)), "{json:#}");
    let metrics =
        Command::new(common::smi_binary()).arg("metrics").arg(&containers).output().expect("metrics");
    let metrics = String::from_utf8_lossy(&metrics.stdout);
    assert!(metrics.contains(&format!("pod_uid=\"{UID_A}\"")), "{metrics}");

    a.finish();
    b.finish();
    // doctor in pod A names the layout and the pod's region.
    let doctor = std::fs::read_to_string(a.out.join("doctor.out")).expect("doctor's output");
    assert!(doctor.contains("layout: KAI-Scheduler's"), "{doctor}");
    assert!(doctor.contains(&format!("its region: {HOOK}/containers/{UID_A}_main/usage.cache")), "{doctor}");
    assert!(doctor.contains("can be written from here"), "{doctor}");
    // Reclaim reads the same tree once the pods are gone.
    let reclaim =
        Command::new(common::smi_binary()).arg("reclaim").arg(&containers).output().expect("reclaim");
    assert!(reclaim.status.success(), "{}", String::from_utf8_lossy(&reclaim.stderr));
    assert_eq!(common::ledger_used0(&region_a), 0);

    assert_eq!(std::fs::read("/etc/ld.so.preload").ok(), host_preload_before, "the host's /etc was written");
}

#[test]
fn a_budgeted_pod_without_a_limit_and_a_stripped_process_are_refused_with_one_line() {
    let node = Node::new("kai-fail-closed");
    // KAI-Scheduler issue 1967: the binder set no limit.
    let no_limit = &kai_env("uid-n", "main", "")[..3];
    let n = node.run("n", no_limit, r#"step n "$client" direct hold 64 16384"#);
    n.refused_in_one_line("n", "no CUDA_DEVICE_MEMORY_LIMIT");
    assert!(!node.own("uid-n_main").join("usage.cache").exists());
    // Values that would lead out of the node's folder.
    for (name, env, words) in [
        (
            "uid",
            vec![("POD_UID", ".."), ("CONTAINER_NAME", "main"), ("CUDA_DEVICE_MEMORY_LIMIT", "1g")],
            "not a pod UID",
        ),
        (
            "mount",
            vec![
                ("POD_UID", "u"),
                ("CONTAINER_NAME", "main"),
                ("CONTAINER_VGPU_MOUNT", "/"),
                ("CUDA_DEVICE_MEMORY_LIMIT", "1g"),
            ],
            "CONTAINER_VGPU_MOUNT=\"/\"",
        ),
    ] {
        let p = node.run(name, &env, &format!(r#"step {name} "$client" direct hold 64 16384"#));
        p.refused_in_one_line(name, words);
    }

    // In a 1 GiB pod, before any of its processes ran: a stripped process of another user cannot
    // read pid 1's environment and is refused; a stripped root one reads it and is held.
    let steps = r#"
step nobody "${nobody[@]}" env -i "$driver" "$client" direct hold 64 16384
step root env -i "$driver" "$client" direct hold 64 16384
"#;
    let s = node.run("s", &kai_env("uid-s", "main", "1g"), steps);
    s.refused_in_one_line("nobody", "/proc/1/environ cannot be read");
    assert_eq!(s.get("root_held_bytes"), GIB.to_string(), "{}\n{}", s.all, s.err("root"));
    let seen = kai_monitor::read(&node.folder());
    assert_eq!(seen[&("uid-s".to_owned(), "main".to_owned())], kai_monitor::Seen::V1 { limit: GIB, used: 0 });
}

#[test]
fn a_region_hami_core_made_in_kais_layout_is_read_by_the_monitor_and_not_taken_over() {
    let node = Node::new("kai-hami-core");
    // What HAMi-core (PR #219) leaves in a pod's folder, as far as the fake allows: its v1 region
    // (its own size, no libvgpu ledger) with a 1 GiB limit and one live process holding 256 MiB,
    // and a pre-versioned v0 region beside it in another pod's folder.
    let hami = node.own("uid-h_main").join("usage.cache");
    std::fs::create_dir_all(hami.parent().unwrap()).expect("a folder");
    let mut bytes = vec![0u8; kai_monitor::V1_SIZE as usize];
    bytes[0..4].copy_from_slice(&19_920_718i32.to_le_bytes());
    bytes[4..8].copy_from_slice(&1u32.to_le_bytes());
    bytes[56..64].copy_from_slice(&1u64.to_le_bytes());
    bytes[1600..1608].copy_from_slice(&GIB.to_le_bytes());
    bytes[1856..1860].copy_from_slice(&7i32.to_le_bytes());
    bytes[1856 + 40..1856 + 48].copy_from_slice(&(256 * MIB).to_le_bytes());
    bytes[1856 + 1928..1856 + 1932].copy_from_slice(&1i32.to_le_bytes());
    bytes[2_008_896..2_008_900].copy_from_slice(&1i32.to_le_bytes());
    std::fs::write(&hami, &bytes).expect("HAMi-core's region");
    let v0 = node.own("uid-v_main").join("usage.cache");
    std::fs::create_dir_all(v0.parent().unwrap()).expect("a folder");
    let mut old = vec![0u8; kai_monitor::V0_SIZE as usize];
    old[0..4].copy_from_slice(&19_920_718i32.to_le_bytes());
    std::fs::write(&v0, &old).expect("a v0 region");

    let seen = kai_monitor::read(&node.folder());
    assert_eq!(
        seen[&("uid-h".to_owned(), "main".to_owned())],
        kai_monitor::Seen::V1 { limit: GIB, used: 256 * MIB }
    );
    assert_eq!(seen[&("uid-v".to_owned(), "main".to_owned())], kai_monitor::Seen::V0);

    // libvgpu in that pod finds HAMi-core's region where KAI puts it, says in one line it cannot
    // share it, and leaves it as it was.
    let h = node.run("h", &kai_env("uid-h", "main", "1g"), r#"step h "$client" direct hold 64 16384"#);
    h.refused_in_one_line("h", "usage.cache");
    assert_eq!(std::fs::read(&hami).expect("the region"), bytes, "HAMi-core's region was written");
}
