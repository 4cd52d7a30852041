//! How much host memory a process may still fill without being OOM-killed: its memory cgroup's
//! room (`memory.max` less `memory.current` on cgroup v2, `memory.limit_in_bytes` less
//! `memory.usage_in_bytes` on v1, the tightest of its cgroup and the ancestors it can see) and the
//! host's `MemAvailable`.
//!
//! A swap-out copies device memory into the container's own processes, so its bytes are charged to
//! the pod's memory cgroup: a pod with a 16 GiB limit whose 44 GiB of GPU memory went to host
//! memory would be OOM-killed. The swap asks [`room`] first (docs/overcommit.md, "Host memory").

use std::path::{Path, PathBuf};

/// Host memory a process may still fill: the least of its memory cgroup's room and the host's
/// available memory, each less what is kept back for the rest of the container and the host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Room {
    /// Bytes that may still be filled.
    pub bytes: u64,
    /// The memory cgroup's limit and use, when it has a limit (`None`: no limit, or none found).
    pub cgroup: Option<(u64, u64)>,
    /// The host's `MemAvailable`, when read.
    pub host_available: Option<u64>,
}

impl std::fmt::Display for Room {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let gib = |bytes: u64| bytes as f64 / (1u64 << 30) as f64;
        match self.cgroup {
            Some((limit, used)) => {
                write!(f, "the memory cgroup uses {:.2} of {:.2} GiB", gib(used), gib(limit))?
            }
            None => write!(f, "no memory cgroup limit")?,
        }
        if let Some(available) = self.host_available {
            write!(f, ", the host has {:.2} GiB available", gib(available))?;
        }
        write!(f, ": {:.2} GiB may be filled", gib(self.bytes))
    }
}

/// What is kept back of a cgroup's limit: a sixteenth, and at least 64 MiB.
fn cgroup_reserve(limit: u64) -> u64 {
    (limit / 16).max(64 << 20)
}

/// What is kept back of the host's memory: a twentieth of it, and at least 1 GiB.
fn host_reserve(total: u64) -> u64 {
    (total / 20).max(1 << 30)
}

/// The room this process has now.
pub fn room() -> Room {
    let cgroup = std::fs::read_to_string("/proc/self/cgroup")
        .ok()
        .and_then(|text| cgroup_limit(&text, Path::new("/sys/fs/cgroup")));
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok();
    let host = meminfo
        .as_deref()
        .and_then(|text| Some((meminfo_field(text, "MemTotal:")?, meminfo_field(text, "MemAvailable:")?)));
    room_of(cgroup, host)
}

/// [`room`] from what was read: the cgroup's (limit, use) and the host's (total, available).
pub fn room_of(cgroup: Option<(u64, u64)>, host: Option<(u64, u64)>) -> Room {
    let from_cgroup =
        cgroup.map(|(limit, used)| limit.saturating_sub(used).saturating_sub(cgroup_reserve(limit)));
    let from_host = host.map(|(total, available)| available.saturating_sub(host_reserve(total)));
    let bytes = [from_cgroup, from_host].into_iter().flatten().min().unwrap_or(u64::MAX);
    Room { bytes, cgroup, host_available: host.map(|(_, available)| available) }
}

/// A `/proc/meminfo` field, in bytes.
fn meminfo_field(text: &str, name: &str) -> Option<u64> {
    let rest = text.lines().find_map(|line| line.strip_prefix(name))?;
    rest.trim().trim_end_matches("kB").trim().parse::<u64>().ok().map(|kib| kib * 1024)
}

/// The tightest (limit, use) of the memory cgroup `/proc/self/cgroup` names and its ancestors,
/// under the hierarchy mounted at `root`: cgroup v2's unified hierarchy (`0::/path`, files
/// `memory.max` and `memory.current`, at `root` or `root/unified`), else v1's memory controller
/// (`N:...memory...:/path`, files `memory.limit_in_bytes` and `memory.usage_in_bytes` at
/// `root/memory`). In a container with its own cgroup namespace the path is `/` and `root` is the
/// container's cgroup. `None` when no limit is set or nothing can be read.
pub fn cgroup_limit(proc_self_cgroup: &str, root: &Path) -> Option<(u64, u64)> {
    let mut v2 = None;
    let mut v1 = None;
    for line in proc_self_cgroup.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (fields.next(), fields.next(), fields.next()) else {
            continue;
        };
        if controllers.is_empty() {
            v2 = Some(path.to_owned());
        } else if controllers.split(',').any(|c| c == "memory") {
            v1 = Some(path.to_owned());
        }
    }
    let tightest = |base: PathBuf, path: &str, limit_file: &str, use_file: &str| -> Option<(u64, u64)> {
        let mut best: Option<(u64, u64)> = None;
        let mut dir = base.join(path.trim_start_matches('/'));
        loop {
            let read = |name: &str| std::fs::read_to_string(dir.join(name)).ok();
            if let (Some(limit), Some(used)) = (read(limit_file), read(use_file)) {
                // "max" (v2) or a page-rounded i64::MAX (v1) is no limit.
                let limit = limit.trim().parse::<u64>().ok().filter(|&l| l < 1 << 62);
                let used = used.trim().parse::<u64>().ok();
                if let (Some(limit), Some(used)) = (limit, used)
                    && best.is_none_or(|(l, u)| limit.saturating_sub(used) < l.saturating_sub(u))
                {
                    best = Some((limit, used));
                }
            }
            if dir == base || !dir.pop() || !dir.starts_with(&base) {
                break;
            }
        }
        best
    };
    if let Some(path) = &v2 {
        for base in [root.to_owned(), root.join("unified")] {
            if base.join("cgroup.controllers").exists()
                && let Some(found) = tightest(base, path, "memory.max", "memory.current")
            {
                return Some(found);
            }
        }
    }
    let path = v1?;
    tightest(root.join("memory"), &path, "memory.limit_in_bytes", "memory.usage_in_bytes")
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;

    #[test]
    fn the_room_is_the_least_of_the_cgroups_and_the_hosts_less_what_is_kept_back() {
        // A 16 GiB pod using 10: 6 GiB less a sixteenth of 16 (1 GiB).
        let room = room_of(Some((16 * GIB, 10 * GIB)), Some((125 * GIB, 100 * GIB)));
        assert_eq!(room.bytes, 5 * GIB);
        // The host is tighter: 8 GiB available less a twentieth of 125 GiB.
        let room = room_of(Some((64 * GIB, 10 * GIB)), Some((125 * GIB, 8 * GIB)));
        assert_eq!(room.bytes, 8 * GIB - 125 * GIB / 20);
        // Over the limit already, or nothing known.
        assert_eq!(room_of(Some((GIB, GIB + MIB)), None).bytes, 0);
        assert_eq!(room_of(None, None).bytes, u64::MAX);
        assert!(room.to_string().contains("uses 10.00 of 64.00 GiB"), "{room}");
    }

    fn tree(name: &str) -> PathBuf {
        let root = std::env::temp_dir().join(format!("vgpu-host-memory-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        root
    }

    fn write(dir: &Path, files: &[(&str, &str)]) {
        std::fs::create_dir_all(dir).unwrap();
        for (name, text) in files {
            std::fs::write(dir.join(name), text).unwrap();
        }
    }

    #[test]
    fn cgroup_v2_takes_the_tightest_of_the_cgroup_and_its_ancestors() {
        let root = tree("v2");
        write(&root, &[("cgroup.controllers", "cpu memory\n")]);
        write(
            &root.join("kubepods/pod1"),
            &[("memory.max", "17179869184\n"), ("memory.current", "1073741824\n")],
        );
        write(
            &root.join("kubepods/pod1/ctr"),
            &[("memory.max", "max\n"), ("memory.current", "1073741824\n")],
        );
        let found = cgroup_limit("0::/kubepods/pod1/ctr\n", &root);
        assert_eq!(found, Some((16 * GIB, GIB)));
        // In a cgroup namespace the path is "/" and the root is the container's cgroup.
        write(&root, &[("memory.max", "2147483648\n"), ("memory.current", "536870912\n")]);
        assert_eq!(cgroup_limit("0::/\n", &root), Some((2 * GIB, 512 * MIB)));
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn cgroup_v1_reads_the_memory_controller_and_no_limit_is_none() {
        let root = tree("v1");
        write(
            &root.join("memory/process_api/job"),
            &[("memory.limit_in_bytes", "1073741824\n"), ("memory.usage_in_bytes", "268435456\n")],
        );
        write(
            &root.join("memory/process_api"),
            &[("memory.limit_in_bytes", "9223372036854771712\n"), ("memory.usage_in_bytes", "268435456\n")],
        );
        let text = "4:memory:/process_api/job\n0::/\n";
        assert_eq!(cgroup_limit(text, &root), Some((GIB, 256 * MIB)));
        assert_eq!(cgroup_limit("4:memory:/process_api\n", &root), None);
        assert_eq!(cgroup_limit("garbage\n", &root), None);
        std::fs::remove_dir_all(&root).unwrap();
    }
}
