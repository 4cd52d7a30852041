//! Every process on the card, accounted to its container: NVML's compute and graphics lists (host
//! pids, with bytes) matched to the containers `vgpu-smi` reads, whatever API took the memory.
//!
//! A process is a container's when, in this order:
//! - it holds one of the region's leases (`lease`: the process mapping the region whose innermost
//!   pid is the lease's, see `host_pids`);
//! - its mount namespace has the container's folder, or a folder inside it, mounted (`mount`:
//!   `/proc/PID/mountinfo` names the folder's device and its path within that filesystem), as
//!   HAMi binds the folder into every process of the container, libvgpu loaded or not;
//! - its cgroup (v2) is the cgroup of a process holding one of the container's leases
//!   (`cgroup`), and of no other container's.
//!
//! The `mount` and `cgroup` routes must not disagree: a process they put in two containers is
//! nobody's. A process in none is listed as unmapped, never acted on.
//!
//! Everything under `/proc/PID` of a tenant's process is read as a hostile file: opened without
//! following links or blocking, read to a bound, its start time checked before and after so that
//! a pid reused meanwhile is not taken for the process NVML listed.

use std::collections::HashMap;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use vgpu_ledger::inspect::Snapshot;

use crate::containers::Listing;
use crate::physical::PhysicalView;

/// Most bytes read of one `/proc/PID` file (a mount table of thousands of mounts fits).
const MAX_PROC_FILE: u64 = 1 << 20;

/// How a process was found to be a container's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    Lease,
    Mount,
    Cgroup,
}

impl Route {
    pub fn name(self) -> &'static str {
        match self {
            Route::Lease => "lease",
            Route::Mount => "mount",
            Route::Cgroup => "cgroup",
        }
    }
}

/// One process on one device, as NVML lists it, in a container.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessUse {
    pub host_pid: u32,
    /// Its start time (clock ticks since boot), which tells it from a later process of that pid.
    pub start: u64,
    pub uuid: String,
    /// NVML's figure for it on the device.
    pub nvml: u64,
    /// What its lease holds there, as NVML would count it (managed memory aside); `None` without
    /// a lease.
    pub lease: Option<u64>,
    /// NVML's figure beyond the lease's (all of it without a lease).
    pub unaccounted: u64,
    /// In NVML's graphics list.
    pub graphics: bool,
    pub route: Route,
}

/// One container's use of one physical device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceUse {
    pub uuid: String,
    pub physical_index: Option<u32>,
    /// The region's budget for the device; `None` without a region or a budget.
    pub budget: Option<u64>,
    /// What the ledger counts (the region's `used`); 0 without a region.
    pub known: u64,
    /// The sum of NVML's figures for the container's processes.
    pub nvml: u64,
    /// The sum of their unaccounted bytes.
    pub unaccounted: u64,
}

/// One container: its folder (HAMi's `<pod-uid>_<container>`) or its region file alone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerUse {
    /// The folder's name, or the region's path for a single file.
    pub name: String,
    pub has_region: bool,
    pub devices: Vec<DeviceUse>,
    pub processes: Vec<ProcessUse>,
}

/// A process NVML lists that is in no container `vgpu-smi` knows, or in more than one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unmapped {
    pub host_pid: u32,
    pub uuid: String,
    pub nvml: Option<u64>,
    pub graphics: bool,
    pub why: &'static str,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Accounting {
    pub containers: Vec<ContainerUse>,
    pub unmapped: Vec<Unmapped>,
}

/// What is known of one container before looking at the processes.
struct Known<'a> {
    name: String,
    region: Option<&'a Snapshot>,
    /// (device, path within that filesystem) of its folder.
    folder: Option<(u64, String)>,
    /// Host pid → lease index.
    leases: HashMap<u32, usize>,
}

/// Accounts every process of `physical` to the containers of `listing`.
pub fn account(listing: &Listing, physical: &PhysicalView) -> Accounting {
    let PhysicalView::Devices(devices) = physical else { return Accounting::default() };
    let mounts = own_mounts();
    let root = std::fs::canonicalize(&listing.root).unwrap_or_else(|_| listing.root.clone());
    let mut known: Vec<Known> = Vec::new();
    for container in &listing.containers {
        let region = container.region.as_ref().ok();
        let (name, folder) = match (&container.pod_uid, &container.name, listing.directory) {
            (Some(uid), Some(name), true) => {
                let dir_name = if name.is_empty() { uid.clone() } else { format!("{uid}_{name}") };
                let folder = folder_of(&mounts, &root.join(&dir_name));
                (dir_name, folder)
            }
            _ => (container.path.display().to_string(), None),
        };
        let leases = region.map_or_else(HashMap::new, |region| {
            let pids = crate::host_pids::of(&region.path, region.leases.iter().map(|lease| lease.pid));
            region
                .leases
                .iter()
                .enumerate()
                .filter(|(_, lease)| lease.alive)
                .filter_map(|(k, lease)| Some((u32::try_from(*pids.get(&lease.pid)?).ok()?, k)))
                .collect()
        });
        known.push(Known { name, region, folder, leases });
    }
    for dir_name in &listing.without_region {
        let folder = folder_of(&mounts, &root.join(dir_name));
        known.push(Known { name: dir_name.clone(), region: None, folder, leases: HashMap::new() });
    }
    // The cgroups of the processes holding leases: a cgroup two containers claim is neither's.
    let mut cgroups: HashMap<String, Option<usize>> = HashMap::new();
    for (index, container) in known.iter().enumerate() {
        for &pid in container.leases.keys() {
            if let Some(cgroup) = cgroup_of(pid).filter(|c| c != "/") {
                let owner = cgroups.entry(cgroup).or_insert(Some(index));
                if *owner != Some(index) {
                    *owner = None;
                }
            }
        }
    }

    let mut result = Accounting {
        containers: known
            .iter()
            .map(|k| ContainerUse {
                name: k.name.clone(),
                has_region: k.region.is_some(),
                devices: Vec::new(),
                processes: Vec::new(),
            })
            .collect(),
        unmapped: Vec::new(),
    };
    let mut found: HashMap<u32, Result<(usize, Route, u64), &'static str>> = HashMap::new();
    for device in devices {
        for process in device.processes.iter().filter(|p| p.pid != 0) {
            let pid = process.pid;
            let mapped = *found.entry(pid).or_insert_with(|| map(pid, &known, &cgroups));
            let (index, route, start) = match mapped {
                Ok(mapped) => mapped,
                Err(why) => {
                    result.unmapped.push(Unmapped {
                        host_pid: pid,
                        uuid: device.uuid.clone(),
                        nvml: process.used,
                        graphics: process.graphics,
                        why,
                    });
                    continue;
                }
            };
            let nvml = process.used.unwrap_or(0);
            let lease = known[index].leases.get(&pid).and_then(|&k| {
                let region = known[index].region?;
                let d = region.devices.iter().position(|d| d.uuid.eq_ignore_ascii_case(&device.uuid))?;
                let held = region.leases[k].devices.get(d)?;
                Some(held.bytes.saturating_sub(held.spillable))
            });
            let unaccounted = nvml.saturating_sub(lease.unwrap_or(0));
            result.containers[index].processes.push(ProcessUse {
                host_pid: pid,
                start,
                uuid: device.uuid.clone(),
                nvml,
                lease,
                unaccounted,
                graphics: process.graphics,
                route,
            });
        }
    }
    for (container, k) in result.containers.iter_mut().zip(&known) {
        for device in devices {
            let region_device =
                k.region.and_then(|r| r.devices.iter().find(|d| d.uuid.eq_ignore_ascii_case(&device.uuid)));
            let on_it: Vec<&ProcessUse> =
                container.processes.iter().filter(|p| p.uuid == device.uuid).collect();
            if region_device.is_none() && on_it.is_empty() {
                continue;
            }
            container.devices.push(DeviceUse {
                uuid: device.uuid.clone(),
                physical_index: Some(device.index),
                budget: region_device.and_then(|d| d.budget),
                known: region_device.map_or(0, |d| d.used),
                nvml: on_it.iter().map(|p| p.nvml).sum(),
                unaccounted: on_it.iter().map(|p| p.unaccounted).sum(),
            });
        }
    }
    result
}

/// Which container host pid `pid` is in, how it was found and its start time.
fn map(
    pid: u32,
    known: &[Known],
    cgroups: &HashMap<String, Option<usize>>,
) -> Result<(usize, Route, u64), &'static str> {
    let start = start_time(pid).ok_or("gone, or /proc unreadable")?;
    if let Some(index) = known.iter().position(|k| k.leases.contains_key(&pid)) {
        return Ok((index, Route::Lease, start));
    }
    let by_mount = mounted_container(pid, known)?;
    let by_cgroup = match cgroup_of(pid).and_then(|c| cgroups.get(&c).copied()) {
        Some(None) => return Err("its cgroup holds processes of several containers"),
        Some(Some(index)) => Some(index),
        None => None,
    };
    if start_time(pid) != Some(start) {
        return Err("gone while it was read");
    }
    match (by_mount, by_cgroup) {
        (Some(a), Some(b)) if a != b => Err("its mounts and its cgroup name different containers"),
        (Some(index), _) => Ok((index, Route::Mount, start)),
        (None, Some(index)) => Ok((index, Route::Cgroup, start)),
        (None, None) => Err("in no known container"),
    }
}

/// The container whose folder process `pid` has mounted; an error if several.
fn mounted_container(pid: u32, known: &[Known]) -> Result<Option<usize>, &'static str> {
    let Some(mountinfo) = read_proc(pid, "mountinfo") else { return Ok(None) };
    let mut hit = None;
    for line in mountinfo.lines() {
        let Some(mount) = Mount::parse(line) else { continue };
        for (index, k) in known.iter().enumerate() {
            let Some((dev, path)) = &k.folder else { continue };
            let inside = mount.root == *path
                || mount.root.strip_prefix(path.as_str()).is_some_and(|rest| rest.starts_with('/'));
            if mount.dev == *dev && inside {
                match hit {
                    Some(other) if other != index => {
                        return Err("it has several containers' folders mounted");
                    }
                    _ => hit = Some(index),
                }
            }
        }
    }
    Ok(hit)
}

/// One line of a mount table (`proc(5)`, mountinfo).
struct Mount {
    dev: u64,
    root: String,
    mount_point: String,
}

impl Mount {
    fn parse(line: &str) -> Option<Mount> {
        let mut fields = line.split(' ');
        let (_, _, dev, root, mount_point) =
            (fields.next()?, fields.next()?, fields.next()?, fields.next()?, fields.next()?);
        let (major, minor) = dev.split_once(':')?;
        let dev = libc::makedev(major.parse().ok()?, minor.parse().ok()?);
        Some(Mount { dev, root: unescape(root), mount_point: unescape(mount_point) })
    }
}

/// The kernel writes space, tab, newline and backslash in mount paths as `\ooo`.
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes.get(i + 1..i + 4).filter(|d| d.iter().all(|b| (b'0'..=b'7').contains(b)));
        match (bytes[i], octal) {
            (b'\\', Some(digits)) => {
                out.push(digits.iter().fold(0u8, |n, d| n.wrapping_mul(8).wrapping_add(d - b'0')));
                i += 4;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// This node's own mount table (`vgpu-smi`'s, trusted).
fn own_mounts() -> Vec<Mount> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .map(|text| text.lines().filter_map(Mount::parse).collect())
        .unwrap_or_default()
}

/// A container folder as a mount table names it: its device, and its path within that
/// filesystem (the deepest mount holding it, its root joined with the rest of the path).
fn folder_of(mounts: &[Mount], folder: &Path) -> Option<(u64, String)> {
    let dev = std::fs::symlink_metadata(folder).ok().filter(|m| m.is_dir())?.dev();
    let text = folder.to_str()?;
    let mount = mounts
        .iter()
        .filter(|m| m.dev == dev)
        .filter(|m| {
            m.mount_point == "/"
                || text == m.mount_point
                || text.strip_prefix(m.mount_point.as_str()).is_some_and(|rest| rest.starts_with('/'))
        })
        .max_by_key(|m| m.mount_point.len())?;
    let rest = if mount.mount_point == "/" { text } else { &text[mount.mount_point.len()..] };
    let path = format!("{}{}", mount.root.trim_end_matches('/'), rest);
    Some((dev, if path.is_empty() { "/".to_owned() } else { path }))
}

/// The cgroup v2 path of process `pid` (`0::/…`).
pub fn cgroup_of(pid: u32) -> Option<String> {
    let text = read_proc(pid, "cgroup")?;
    text.lines().find_map(|line| line.strip_prefix("0::")).map(str::to_owned)
}

/// Field 22 of `/proc/PID/stat`: when the process started, in clock ticks since boot.
pub fn start_time(pid: u32) -> Option<u64> {
    let stat = read_proc(pid, "stat")?;
    stat.rsplit_once(')')?.1.split_whitespace().nth(19)?.parse().ok()
}

/// `/proc/PID/NAME` of a tenant's process: no link followed, no blocking, at most
/// [`MAX_PROC_FILE`] bytes.
pub fn read_proc(pid: u32, name: &str) -> Option<String> {
    let path = PathBuf::from(format!("/proc/{pid}/{name}"));
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY)
        .open(path)
        .ok()?;
    let mut bytes = Vec::new();
    file.take(MAX_PROC_FILE).read_to_end(&mut bytes).ok()?;
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_lines_are_parsed_and_unescaped() {
        let line = "36 35 98:0 /mnt/a\\040b /x\\134y rw,noatime master:1 - ext3 /dev/root rw";
        let mount = Mount::parse(line).unwrap();
        assert_eq!(mount.dev, libc::makedev(98, 0));
        assert_eq!(mount.root, "/mnt/a b");
        assert_eq!(mount.mount_point, "/x\\y");
        assert!(Mount::parse("garbage").is_none());
    }

    #[test]
    fn this_process_has_a_start_time_and_a_cgroup() {
        let me = std::process::id();
        assert!(start_time(me).is_some());
        assert!(read_proc(me, "mountinfo").is_some_and(|text| !text.is_empty()));
        assert!(start_time(u32::MAX).is_none());
    }
}
