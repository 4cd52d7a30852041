//! HAMi's container layout, rebuilt with real mount and pid namespaces (`unshare`, as root; no
//! Kubernetes): the node's container folder bound at `/usr/local/vgpu` with the node's
//! `libvgpu.so` bound read-only inside it, and a copy of `/etc` whose `ld.so.preload` names it.
//! `tests/container_layout.sh` runs there as the container's pid 1 with the pod's environment and
//! starts its processes: the pod's own, stripped ones (`env -i`), one of another user
//! (`setpriv`), a forked and an exec'd child. From outside, as the node, `vgpu-smi` reads the
//! container's folder and resizes its budget. The host's `/etc` and `/usr/local` are never written.

mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc::channel;
use std::time::{Duration, Instant};

use common::{GIB, MIB, Scratch};
use serde_json::Value;

const CUDA_ERROR_OUT_OF_MEMORY: &str = "2";
/// Where the pod's environment puts the region, inside the container.
const REGION_INSIDE: &str = "/usr/local/vgpu/3e1f9a.cache";
const STEPS: Duration = Duration::from_secs(90);

fn copy_executable(from: &Path, to: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::copy(from, to).unwrap_or_else(|e| panic!("copy {} to {}: {e}", from.display(), to.display()));
    std::fs::set_permissions(to, std::fs::Permissions::from_mode(0o755)).expect("chmod");
}

/// What the script printed, key by key.
struct Lines {
    values: HashMap<String, String>,
    all: String,
}

impl Lines {
    fn get(&self, key: &str) -> &str {
        self.values.get(key).unwrap_or_else(|| panic!("no {key}= from the container:\n{}", self.all))
    }
}

#[test]
fn every_process_of_a_hami_container_is_held_to_its_budget() {
    assert_eq!(
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() },
        0,
        "this test rebuilds a container with unshare and bind mounts, which needs root (CI runs as root)"
    );
    let host_preload_before = std::fs::read("/etc/ld.so.preload").ok();
    let artifacts = common::artifacts();

    // Everything the container's other user runs must be reachable by it: tmpfs, mode 0755.
    let scratch = Scratch::in_memory("layout");
    let node = scratch.path("node/usr/local/vgpu");
    let container = node.join("containers/pod-1234_main");
    std::fs::create_dir_all(&container).expect("create the container's folder");
    let node_lib = node.join("libvgpu.so");
    copy_executable(&artifacts.libvgpu, &node_lib);
    let bin = scratch.path("bin");
    std::fs::create_dir_all(bin.join("driver")).expect("create bin");
    copy_executable(&artifacts.client, &bin.join("vgpu_client"));
    for name in ["libcuda.so.1", "libnvidia-ml.so.1"] {
        copy_executable(&artifacts.fake_driver_dir.join(name), &bin.join("driver").join(name));
    }
    let etc = common::etc_preloading(&scratch, Path::new("/usr/local/vgpu/libvgpu.so"));

    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/container_layout.sh");
    let mut shell = Command::new("unshare")
        .args(["--mount", "--pid", "--fork", "--mount-proc", "bash"])
        .arg(&script)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("LD_LIBRARY_PATH", bin.join("driver"))
        .env("CUDA_DEVICE_MEMORY_LIMIT_0", "1g")
        .env("CUDA_DEVICE_MEMORY_SHARED_CACHE", REGION_INSIDE)
        .env("T_CONTAINER", &container)
        .env("T_NODE_LIB", &node_lib)
        .env("T_ETC", &etc)
        .env("T_BIN", &bin)
        .env("T_SCRATCH", &scratch.dir)
        .env("T_REGION_INSIDE", REGION_INSIDE)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run unshare");
    let mut stdin = shell.stdin.take().expect("stdin");
    let stdout = shell.stdout.take().expect("stdout");
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut lines = Lines { values: HashMap::new(), all: String::new() };
    let deadline = Instant::now() + STEPS;
    let read_until = |lines: &mut Lines, key: &str| {
        while !lines.values.contains_key(key) {
            let left = deadline.saturating_duration_since(Instant::now());
            let Ok(line) = rx.recv_timeout(left) else {
                panic!("no {key}= from the container within {STEPS:?}:\n{}", lines.all)
            };
            lines.all.push_str(&line);
            lines.all.push('\n');
            if let Some((k, v)) = line.split_once('=') {
                lines.values.insert(k.to_owned(), v.to_owned());
            }
        }
    };
    read_until(&mut lines, "node_check");

    // The node's view: the container's folder, its processes with their host pids and bytes.
    let containers = node.join("containers");
    let output =
        Command::new(common::smi_binary()).arg("--json").arg(&containers).output().expect("run vgpu-smi");
    let json: Value = serde_json::from_slice(&output.stdout).expect("vgpu-smi --json");
    let shown = &json["containers"][0];
    assert_eq!(shown["pod_uid"], "pod-1234", "{json:#}");
    assert_eq!(shown["container"], "main", "{json:#}");
    assert_eq!(shown["region"]["devices"][0]["budget"], GIB, "{json:#}");
    assert_eq!(shown["region"]["devices"][0]["used"], 768 * MIB, "{json:#}");
    let pod_pid: i64 = lines.get("pod_pid").parse().expect("a pid");
    let mut alive: Vec<(u64, i64, i64)> = shown["region"]["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .filter(|p| p["alive"] == true)
        .map(|p| {
            let host = p["host_pid"].as_i64().unwrap_or_else(|| panic!("no host pid for {p}"));
            (p["bytes"].as_u64().expect("bytes"), p["pid"].as_i64().expect("pid"), host)
        })
        .collect();
    alive.sort();
    assert_eq!(alive.len(), 2, "the pod's process and the held one: {json:#}");
    assert_eq!((alive[0].0, alive[0].1), (256 * MIB, pod_pid), "{json:#}");
    assert_eq!(alive[1].0, 512 * MIB, "{json:#}");
    for (_, pid, host) in &alive {
        let status = std::fs::read_to_string(format!("/proc/{host}/status")).expect("the host pid lives");
        let nspid = status.lines().find_map(|line| line.strip_prefix("NSpid:")).expect("NSpid");
        let inner: Vec<i64> = nspid.split_whitespace().map(|n| n.parse().expect("a pid")).collect();
        assert_eq!(inner.first(), Some(host), "{nspid}");
        assert_eq!(inner.last(), Some(pid), "host pid {host} is not the container's pid {pid}: {nspid}");
    }

    // A resize from outside is seen inside.
    let region = container.join("3e1f9a.cache");
    let resized = Command::new(common::smi_binary())
        .args(["resize", "--device", "0", "2g"])
        .arg(&region)
        .output()
        .expect("run vgpu-smi resize");
    assert!(resized.status.success(), "{}", String::from_utf8_lossy(&resized.stderr));
    writeln!(stdin, "go").expect("tell the container to go on");
    read_until(&mut lines, "finished");
    drop(stdin);
    let status = shell.wait().expect("wait for the container");
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut shell.stderr.take().expect("stderr"), &mut stderr).expect("stderr");
    assert!(status.success(), "the container's script failed: {status}\n{stderr}\n{}", lines.all);

    let err = |name: &str| std::fs::read_to_string(scratch.path(&format!("{name}.err"))).unwrap_or_default();
    // Before the region: another user finds no budget it can read, and fails closed.
    assert_eq!(lines.get("early_nobody_held_bytes"), "0", "{}", lines.all);
    assert_eq!(lines.get("early_nobody_hold_status"), CUDA_ERROR_OUT_OF_MEMORY);
    assert!(err("early_nobody").contains("no budget found"), "{}", err("early_nobody"));
    assert!(!lines.values.contains_key("early_nobody_made_region"), "{}", lines.all);
    // A stripped root shell reads pid 1's environment and makes the pod's region.
    assert_eq!(lines.get("early_root_held_bytes"), GIB.to_string(), "{}", lines.all);
    assert_eq!(lines.get("early_root_made_region"), "1");
    // With the pod's process holding 256 MiB, each of the others gets the other 768.
    assert_eq!(lines.get("pod_a_status"), "0");
    for step in ["nobody", "root", "exec"] {
        assert_eq!(
            lines.get(&format!("{step}_held_bytes")),
            (768 * MIB).to_string(),
            "{step}:\n{}",
            lines.all
        );
        assert_eq!(lines.get(&format!("{step}_hold_status")), CUDA_ERROR_OUT_OF_MEMORY, "{step}");
    }
    // fork 384: the parent holds 384, its child gets one more 384 and is refused the second.
    assert_eq!(lines.get("fork_child_bytes"), (384 * MIB).to_string(), "{}", lines.all);
    assert_eq!(lines.get("fork_child_status"), CUDA_ERROR_OUT_OF_MEMORY);
    assert_eq!(lines.get("held_h_status"), "0");
    // After the node's resize to 2 GiB: the pod's process sees it, and 1 GiB more fits.
    assert_eq!(lines.get("pod_r_total"), (2 * GIB).to_string(), "{}", lines.all);
    assert_eq!(lines.get("pod_r2_status"), "0", "{}", lines.all);

    assert_eq!(std::fs::read("/etc/ld.so.preload").ok(), host_preload_before, "the host's /etc was written");
    assert!(!Path::new("/usr/local/vgpu").exists() || node_lib.exists(), "the host's /usr/local was written");
}

/// Run by `a_setuid_program_takes_no_setting_from_the_user`, as root in a new mount namespace:
/// the fake driver where a setuid program's loader looks (`/usr/local/lib`, over a tmpfs, and
/// `ldconfig` into the copy of `/etc`), libvgpu in `/etc/ld.so.preload`, then the same client as
/// another user twice: a plain copy (`plain_`) and a setuid-root copy (`setuid_`), both with a
/// user's variables naming a region file and a log level.
const SETUID_SCRIPT: &str = r#"
set -euo pipefail
mount -t tmpfs vgpu-test /usr/local
mkdir -p /usr/local/lib
cp "$T_BIN"/driver/* /usr/local/lib/
mount --bind "$T_ETC" /etc
ldconfig
user=(setpriv --reuid=65534 --regid=65534 --clear-groups env CUDA_DEVICE_MEMORY_SHARED_CACHE="$T_CHOSEN"
    CUDA_DEVICE_MEMORY_LIMIT_0=1g LIBCUDA_LOG_LEVEL=4)
"${user[@]}" "$T_BIN/plain_client" direct hold 64 2048 < /dev/null 2> "$T_SCRATCH/plain.err" | sed 's/^/plain_/'
[ -e "$T_CHOSEN" ] && echo "plain_made_region=1" && rm -f "$T_CHOSEN"
"${user[@]}" "$T_BIN/setuid_client" direct hold 64 2048 < /dev/null 2> "$T_SCRATCH/setuid.err" | sed 's/^/setuid_/'
[ -e "$T_CHOSEN" ] && echo "setuid_made_region=1"
echo finished=1
"#;

#[test]
fn a_setuid_program_takes_no_setting_from_the_user() {
    use std::os::unix::fs::PermissionsExt;
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "this test makes a setuid-root program, which needs root");
    let artifacts = common::artifacts();
    let scratch = Scratch::in_memory("setuid");
    let bin = scratch.path("bin");
    std::fs::create_dir_all(bin.join("driver")).expect("create bin");
    for name in ["libcuda.so.1", "libnvidia-ml.so.1"] {
        copy_executable(&artifacts.fake_driver_dir.join(name), &bin.join("driver").join(name));
    }
    copy_executable(&artifacts.client, &bin.join("plain_client"));
    copy_executable(&artifacts.client, &bin.join("setuid_client"));
    std::fs::set_permissions(bin.join("setuid_client"), std::fs::Permissions::from_mode(0o4755))
        .expect("setuid");
    let library = scratch.path("libvgpu.so");
    copy_executable(&artifacts.libvgpu, &library);
    let etc = common::etc_preloading(&scratch, &library);
    // A folder the user may write, so that only the setuid bit decides whether the file is made.
    let open = scratch.path("open");
    std::fs::create_dir_all(&open).expect("create folder");
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let chosen = open.join("chosen.cache");

    let output = Command::new("unshare")
        .args(["--mount", "bash", "-c", SETUID_SCRIPT])
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("T_BIN", &bin)
        .env("T_ETC", &etc)
        .env("T_CHOSEN", &chosen)
        .env("T_SCRATCH", &scratch.dir)
        .output()
        .expect("run unshare");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    let values: HashMap<&str, &str> = stdout.lines().filter_map(|line| line.split_once('=')).collect();
    let get = |key: &str| *values.get(key).unwrap_or_else(|| panic!("no {key}=:\n{stdout}"));
    let err = |name: &str| std::fs::read_to_string(scratch.path(&format!("{name}.err"))).unwrap_or_default();

    // The plain program takes the user's settings: their region file, budget and log level.
    assert_eq!(get("plain_made_region"), "1", "{stdout}");
    assert_eq!(get("plain_held_bytes"), GIB.to_string(), "{stdout}");
    assert!(err("plain").contains("debug"), "{}", err("plain"));
    // The setuid program takes none of them: no file made, no budget, no debug lines.
    assert!(!values.contains_key("setuid_made_region"), "the setuid program made the user's file:\n{stdout}");
    assert!(!chosen.exists());
    assert_eq!(get("setuid_held_bytes"), (2 * GIB).to_string(), "{stdout}");
    assert!(
        !err("setuid").contains("libvgpu"),
        "the setuid program logged as the user asked:\n{}",
        err("setuid")
    );
    assert_eq!(get("finished"), "1");
}
