//! Host pids of a region's processes. A lease records the pid its process had in its own pid
//! namespace (the container's); the node sees another number. The process with a lease is the
//! one that maps the region file and whose innermost pid (`NSpid` in `/proc/PID/status`) is the
//! lease's pid: found by scanning the node's `/proc`, which root can read. Another user's
//! `/proc/PID/maps` is refused to a root process with only a container runtime's default
//! capabilities; `CAP_SYS_PTRACE` lets it read them (docs/container-budget.md, "Under an OCI
//! runtime"). Without it such processes show no host pid, and one line on stderr says why.

use std::collections::{HashMap, HashSet};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// Host pid of each of `pids` (pids as the leases record them) found mapping the region `region`.
/// A pid with no such process, or more than one, is left out.
pub fn of(region: &Path, pids: impl IntoIterator<Item = i32>) -> HashMap<i32, i32> {
    let wanted: HashSet<i32> = pids.into_iter().filter(|&pid| pid > 0).collect();
    let mut found: HashMap<i32, Vec<i32>> = HashMap::new();
    let (Ok(meta), false) = (std::fs::symlink_metadata(region), wanted.is_empty()) else {
        return HashMap::new();
    };
    let device = format!("{:02x}:{:02x}", libc::major(meta.dev()), libc::minor(meta.dev()));
    let inode = meta.ino().to_string();
    let Ok(entries) = std::fs::read_dir("/proc") else { return HashMap::new() };
    for entry in entries.flatten() {
        let Some(host) = entry.file_name().to_str().and_then(|name| name.parse::<i32>().ok()) else {
            continue;
        };
        let Some(inner) = innermost_pid(host).filter(|pid| wanted.contains(pid)) else { continue };
        match maps_file(host, &device, &inode) {
            Ok(true) => found.entry(inner).or_default().push(host),
            Ok(false) => {}
            Err(error) if error.kind() == std::io::ErrorKind::PermissionDenied => say_maps_refused(),
            Err(_) => {}
        }
    }
    found
        .into_iter()
        .filter_map(|(inner, hosts)| matches!(hosts[..], [_]).then(|| (inner, hosts[0])))
        .collect()
}

/// The last number of the `NSpid:` line: the process's pid in its own namespace.
fn innermost_pid(host: i32) -> Option<i32> {
    let status = std::fs::read_to_string(format!("/proc/{host}/status")).ok()?;
    let line = status.lines().find_map(|line| line.strip_prefix("NSpid:"))?;
    line.split_whitespace().last()?.parse().ok()
}

/// Whether process `host` maps the file of `device` (`major:minor` in hex) and `inode`.
fn maps_file(host: i32, device: &str, inode: &str) -> std::io::Result<bool> {
    let maps = std::fs::read_to_string(format!("/proc/{host}/maps"))?;
    Ok(maps.lines().any(|line| {
        let mut fields = line.split_whitespace().skip(3);
        fields.next() == Some(device) && fields.next() == Some(inode)
    }))
}

/// Says once that a process's mappings could not be read, and what would let them be.
fn say_maps_refused() {
    static SAID: std::sync::Once = std::sync::Once::new();
    SAID.call_once(|| {
        eprintln!(
            "vgpu-smi: the host pids of other users' processes are unknown: reading their /proc/PID/maps \
             was refused (add the SYS_PTRACE capability to the node agent's container)"
        )
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_found_mapping_a_file_it_maps() {
        let path = std::env::temp_dir().join(format!("vgpu-smi-host-pids-{}", std::process::id()));
        std::fs::write(&path, vec![0u8; 4096]).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        // SAFETY: a read-only shared mapping of 4096 bytes of an open file; unmapped below.
        let map = unsafe {
            use std::os::fd::AsRawFd;
            libc::mmap(std::ptr::null_mut(), 4096, libc::PROT_READ, libc::MAP_SHARED, file.as_raw_fd(), 0)
        };
        assert_ne!(map, libc::MAP_FAILED);
        let me = std::process::id() as i32;
        let inner = innermost_pid(me).unwrap();
        assert_eq!(of(&path, [inner]), HashMap::from([(inner, me)]));
        // SAFETY: the mapping made above, not used afterwards.
        unsafe { libc::munmap(map, 4096) };
        assert!(of(&path, [inner]).is_empty(), "no longer mapped");
        std::fs::remove_file(&path).unwrap();
    }
}
