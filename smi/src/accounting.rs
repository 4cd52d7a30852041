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
//!
//! A container's budget is its region's; a container with no region (none of its processes
//! started CUDA under libvgpu: an OpenGL-only container) takes it from its processes'
//! environment (`CUDA_DEVICE_MEMORY_LIMIT`, `CUDA_DEVICE_MEMORY_LIMIT_<N>`, as HAMi's device plugin
//! sets them), when every process that has those variables has the same ones and the CUDA
//! ordinal `N` names one device of the node (see [`environment_budget`]); else it has none.
//!
//! A pass scans `/proc` once for the lease holders of every region ([`lease_holders`]), never once
//! per region, and keeps nothing for the next pass.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{BufRead, Read};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use vgpu_ledger::config::{MAX_DEVICES, parse_size};
use vgpu_ledger::inspect::Snapshot;

use crate::containers::Listing;
use crate::physical::PhysicalView;

/// Most bytes read of one `/proc/PID` file (a mount table of thousands of mounts fits).
const MAX_PROC_FILE: u64 = 1 << 20;
/// Most bytes of `/proc/PID/maps` looked through, line by line (the kernel's default of 65530
/// mappings a process writes about 6 MiB).
const MAX_MAPS: u64 = 64 << 20;

const MEMORY_LIMIT: &str = "CUDA_DEVICE_MEMORY_LIMIT";
const CUDA_VISIBLE: &str = "CUDA_VISIBLE_DEVICES";
const NVIDIA_VISIBLE: &str = "NVIDIA_VISIBLE_DEVICES";

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

/// Where a container's budget on a device came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BudgetSource {
    /// Its region (what libvgpu enforces).
    Region,
    /// Its processes' environment, for a container with no region.
    Environment,
}

impl BudgetSource {
    pub fn name(self) -> &'static str {
        match self {
            BudgetSource::Region => "region",
            BudgetSource::Environment => "environment",
        }
    }
}

/// Why a container with no region took no budget from its processes' environment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EnvironmentRefused {
    /// Two of its processes have different budget variables.
    Disagree { first: u32, other: u32 },
    /// A budget variable that is not a size, or names no CUDA ordinal.
    BadValue { host_pid: u32, var: String, value: String },
    /// `CUDA_DEVICE_MEMORY_LIMIT_<N>` with no way to tell which device ordinal `N` is.
    NoMapping { host_pid: u32, why: &'static str },
    /// Its environment is larger than what is read.
    TooLarge { host_pid: u32 },
}

impl EnvironmentRefused {
    /// A short name, for a metric's label.
    pub fn kind(&self) -> &'static str {
        match self {
            EnvironmentRefused::Disagree { .. } => "disagree",
            EnvironmentRefused::BadValue { .. } => "bad_value",
            EnvironmentRefused::NoMapping { .. } => "no_device_mapping",
            EnvironmentRefused::TooLarge { .. } => "too_large",
        }
    }
}

impl std::fmt::Display for EnvironmentRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EnvironmentRefused::Disagree { first, other } => write!(
                f,
                "host pids {first} and {other} have different {MEMORY_LIMIT}*, {CUDA_VISIBLE} or {NVIDIA_VISIBLE}"
            ),
            EnvironmentRefused::BadValue { host_pid, var, value } => {
                write!(
                    f,
                    "host pid {host_pid} has {var}={value}, not a size for a CUDA ordinal below {MAX_DEVICES}"
                )
            }
            EnvironmentRefused::NoMapping { host_pid, why } => {
                write!(f, "host pid {host_pid}: no telling which device {MEMORY_LIMIT}_<N> names: {why}")
            }
            EnvironmentRefused::TooLarge { host_pid } => {
                write!(f, "host pid {host_pid}'s environment is larger than {MAX_PROC_FILE} bytes")
            }
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
    /// The container's budget for the device: its region's, or for a container with no region,
    /// its processes' environment's; `None` without either.
    pub budget: Option<u64>,
    /// Where `budget` came from.
    pub budget_source: Option<BudgetSource>,
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
    /// For a container with no region whose processes' environment has budget variables, why
    /// they gave no budget.
    pub environment_refused: Option<EnvironmentRefused>,
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
    let regions: Vec<Option<&Snapshot>> = listing.containers.iter().map(|c| c.region.as_ref().ok()).collect();
    let wanted: Vec<(&Path, Vec<i32>)> = regions
        .iter()
        .flatten()
        .map(|region| (region.path.as_path(), region.leases.iter().map(|lease| lease.pid).collect()))
        .collect();
    let mut holders = lease_holders(&wanted).into_iter();
    let mut known: Vec<Known> = Vec::new();
    for (container, region) in listing.containers.iter().zip(regions) {
        let (name, folder) = match (&container.pod_uid, &container.name, listing.directory) {
            (Some(uid), Some(name), true) => {
                let dir_name = if name.is_empty() { uid.clone() } else { format!("{uid}_{name}") };
                let folder = folder_of(&mounts, &root.join(&dir_name));
                (dir_name, folder)
            }
            _ => (container.path.display().to_string(), None),
        };
        let leases = region.map_or_else(HashMap::new, |region| {
            let pids = holders.next().unwrap_or_default();
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
                environment_refused: None,
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
        let from_environment = match k.region {
            Some(_) => Ok(HashMap::new()),
            None => environment_budget(&container.processes, devices),
        };
        let from_environment = from_environment.unwrap_or_else(|refused| {
            container.environment_refused = Some(refused);
            HashMap::new()
        });
        for device in devices {
            let region_device =
                k.region.and_then(|r| r.devices.iter().find(|d| d.uuid.eq_ignore_ascii_case(&device.uuid)));
            let on_it: Vec<&ProcessUse> =
                container.processes.iter().filter(|p| p.uuid == device.uuid).collect();
            if region_device.is_none() && on_it.is_empty() {
                continue;
            }
            let (budget, budget_source) = match (region_device.and_then(|d| d.budget), k.region) {
                (Some(budget), _) => (Some(budget), Some(BudgetSource::Region)),
                (None, Some(_)) => (None, None),
                (None, None) => match from_environment.get(&device.uuid) {
                    Some(&budget) => (Some(budget), Some(BudgetSource::Environment)),
                    None => (None, None),
                },
            };
            container.devices.push(DeviceUse {
                uuid: device.uuid.clone(),
                physical_index: Some(device.index),
                budget,
                budget_source,
                known: region_device.map_or(0, |d| d.used),
                nvml: on_it.iter().map(|p| p.nvml).sum(),
                unaccounted: on_it.iter().map(|p| p.unaccounted).sum(),
            });
        }
    }
    result
}

/// Every region's lease holders (innermost pid → host pid, the host pids `crate::host_pids` shows),
/// found by one scan of the node's `/proc` for all of them: each process's `status` is read
/// once, and the `maps` of a process whose innermost pid some region's lease has, once. Nothing is
/// kept for the next pass: a process that maps a region later is found by the next one.
pub(crate) fn lease_holders(regions: &[(&Path, Vec<i32>)]) -> Vec<HashMap<i32, i32>> {
    #[cfg(test)]
    tests::SCANS.with(|scans| scans.set(scans.get() + 1));
    // (device as maps writes it, inode) → the regions of that file.
    let mut files: HashMap<(String, u64), Vec<usize>> = HashMap::new();
    let mut wanted: HashSet<i32> = HashSet::new();
    for (index, (path, pids)) in regions.iter().enumerate() {
        let Ok(meta) = std::fs::symlink_metadata(path) else { continue };
        if pids.iter().any(|&pid| pid > 0) {
            wanted.extend(pids.iter().filter(|&&pid| pid > 0));
            let device = format!("{:02x}:{:02x}", libc::major(meta.dev()), libc::minor(meta.dev()));
            files.entry((device, meta.ino())).or_default().push(index);
        }
    }
    let mut found: Vec<HashMap<i32, Vec<i32>>> = vec![HashMap::new(); regions.len()];
    let entries = if wanted.is_empty() { None } else { std::fs::read_dir("/proc").ok() };
    let mut refused = false;
    for entry in entries.into_iter().flatten().flatten() {
        let Some(host) = entry.file_name().to_str().and_then(|name| name.parse::<u32>().ok()) else {
            continue;
        };
        let Some(inner) = innermost_pid(host).filter(|pid| wanted.contains(pid)) else { continue };
        let Some(mapped) = mapped_regions(host, &files) else {
            refused = true;
            continue;
        };
        for index in mapped {
            if regions[index].1.contains(&inner) {
                found[index].entry(inner).or_default().push(host as i32);
            }
        }
    }
    let holders: Vec<HashMap<i32, i32>> = found
        .into_iter()
        .map(|by_inner| {
            by_inner
                .into_iter()
                .filter_map(|(inner, hosts)| matches!(hosts[..], [_]).then(|| (inner, hosts[0])))
                .collect()
        })
        .collect();
    // A refused `maps` matters only where a lease holder stayed unknown: the node's own pid 1 (which
    // even root cannot read in some sandboxes) shares its innermost pid with every container's first
    // process, and refusing it hides nothing once those are found.
    let unknown = regions
        .iter()
        .zip(&holders)
        .any(|((_, pids), by)| pids.iter().any(|p| *p > 0 && !by.contains_key(p)));
    if refused && unknown {
        say_refused("maps");
    }
    holders
}

/// The last number of the `NSpid:` line: the process's pid in its own (innermost) namespace.
fn innermost_pid(host: u32) -> Option<i32> {
    let status = read_proc(host, "status")?;
    let line = status.lines().find_map(|line| line.strip_prefix("NSpid:"))?;
    line.split_whitespace().last()?.parse().ok()
}

/// The regions of `files` that process `host` maps, its `maps` read line by line to a bound;
/// `None` when reading its `maps` was refused.
fn mapped_regions(host: u32, files: &HashMap<(String, u64), Vec<usize>>) -> Option<Vec<usize>> {
    let file = match open_proc_file(host, "maps") {
        Ok(file) => file,
        Err(error) => return (error.kind() != std::io::ErrorKind::PermissionDenied).then(Vec::new),
    };
    let mut reader = std::io::BufReader::new(file.take(MAX_MAPS));
    let mut line = Vec::new();
    let mut hits: Vec<usize> = Vec::new();
    while reader.read_until(b'\n', &mut line).is_ok_and(|n| n > 0) {
        let text = String::from_utf8_lossy(&line);
        let mut fields = text.split_whitespace().skip(3);
        if let (Some(device), Some(inode)) = (fields.next(), fields.next().and_then(|i| i.parse().ok())) {
            for &region in files.get(&(device.to_owned(), inode)).into_iter().flatten() {
                if !hits.contains(&region) {
                    hits.push(region);
                }
            }
        }
        line.clear();
    }
    Some(hits)
}

/// The budget of a container with no region, by device UUID, from its processes' environment
/// (`/proc/PID/environ`, read as a tenant's file): the budget variables (`CUDA_DEVICE_MEMORY_LIMIT`,
/// `CUDA_DEVICE_MEMORY_LIMIT_<N>`) and the device lists that say which device a CUDA ordinal is
/// (`CUDA_VISIBLE_DEVICES`, `NVIDIA_VISIBLE_DEVICES`). Processes without a budget variable do not
/// count; every other one must have the same variables with the same values, or there is no
/// budget. A value reads as libvgpu reads it (`vgpu_ledger::config::parse_size`; 0: no limit).
fn environment_budget(
    processes: &[ProcessUse],
    devices: &[crate::physical::PhysicalDevice],
) -> Result<HashMap<String, u64>, EnvironmentRefused> {
    let mut agreed: Option<(u32, Vec<(String, String)>)> = None;
    let mut seen = HashSet::new();
    for process in processes.iter().filter(|p| seen.insert(p.host_pid)) {
        let pid = process.host_pid;
        let Some((environ, complete)) = read_proc_bytes(pid, "environ") else { continue };
        if start_time(pid) != Some(process.start) {
            continue;
        }
        let vars = budget_vars(&environ);
        if !vars.iter().any(|(name, _)| is_limit(name)) {
            continue;
        }
        if !complete {
            return Err(EnvironmentRefused::TooLarge { host_pid: pid });
        }
        match &agreed {
            None => agreed = Some((pid, vars)),
            Some((first, first_vars)) if *first_vars != vars => {
                return Err(EnvironmentRefused::Disagree { first: *first, other: pid });
            }
            Some(_) => {}
        }
    }
    let Some((pid, vars)) = agreed else { return Ok(HashMap::new()) };
    let node: Vec<(u32, &str)> = devices.iter().map(|d| (d.index, d.uuid.as_str())).collect();
    let used: Vec<&str> = devices
        .iter()
        .filter(|d| processes.iter().any(|p| p.uuid == d.uuid))
        .map(|d| d.uuid.as_str())
        .collect();
    budget_from_vars(pid, &vars, &node, &used)
}

/// The budget variables and device lists of an environment (`NUL`-separated `NAME=VALUE`), the
/// first of each name as `getenv` finds it, sorted by name.
fn budget_vars(environ: &[u8]) -> Vec<(String, String)> {
    let mut vars: BTreeMap<String, String> = BTreeMap::new();
    for entry in environ.split(|&b| b == 0) {
        let entry = String::from_utf8_lossy(entry);
        let Some((name, value)) = entry.split_once('=') else { continue };
        if is_limit(name) || name == CUDA_VISIBLE || name == NVIDIA_VISIBLE {
            vars.entry(name.to_owned()).or_insert_with(|| value.to_owned());
        }
    }
    vars.into_iter().collect()
}

fn is_limit(name: &str) -> bool {
    name == MEMORY_LIMIT || name.strip_prefix(MEMORY_LIMIT).is_some_and(|rest| rest.starts_with('_'))
}

/// The budget by device UUID that `vars` (one process's, host pid `pid`) give on a node with
/// devices `node` (NVML index, UUID), for the devices `used` that the container's processes are on.
/// `CUDA_DEVICE_MEMORY_LIMIT` alone applies to every device the container uses, whatever its
/// ordinal; with any `CUDA_DEVICE_MEMORY_LIMIT_<N>`, every ordinal must be known ([`cuda_devices`]).
fn budget_from_vars(
    pid: u32,
    vars: &[(String, String)],
    node: &[(u32, &str)],
    used: &[&str],
) -> Result<HashMap<String, u64>, EnvironmentRefused> {
    let bad = |var: &str, value: &str| EnvironmentRefused::BadValue {
        host_pid: pid,
        var: var.escape_debug().to_string(),
        value: value.chars().take(64).collect::<String>().escape_debug().to_string(),
    };
    // A limit of 0 is HAMi's "no limit".
    let limit = |var: &str, value: &str| {
        parse_size(value).map(|bytes| (bytes > 0).then_some(bytes)).ok_or_else(|| bad(var, value))
    };
    let mut all = None;
    let mut by_ordinal: BTreeMap<usize, Option<u64>> = BTreeMap::new();
    for (name, value) in vars.iter().filter(|(name, _)| is_limit(name)) {
        match name.strip_prefix(MEMORY_LIMIT).and_then(|rest| rest.strip_prefix('_')) {
            None => all = limit(name, value)?,
            Some(ordinal) => match ordinal.parse::<usize>() {
                Ok(ordinal) if ordinal < MAX_DEVICES => {
                    by_ordinal.insert(ordinal, limit(name, value)?);
                }
                _ => return Err(bad(name, value)),
            },
        }
    }
    if by_ordinal.is_empty() {
        return Ok(
            all.map_or_else(HashMap::new, |bytes| used.iter().map(|u| (u.to_string(), bytes)).collect())
        );
    }
    let get = |name: &str| vars.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str());
    let ordinals = cuda_devices(get(CUDA_VISIBLE), get(NVIDIA_VISIBLE), node)
        .map_err(|why| EnvironmentRefused::NoMapping { host_pid: pid, why })?;
    let mut budget = HashMap::new();
    for (ordinal, uuid) in ordinals.iter().enumerate() {
        if let Some(bytes) = by_ordinal.get(&ordinal).copied().unwrap_or(all) {
            budget.insert(uuid.clone(), bytes);
        }
    }
    Ok(budget)
}

/// The UUIDs of the devices a process sees, by CUDA ordinal, from its `CUDA_VISIBLE_DEVICES` and
/// `NVIDIA_VISIBLE_DEVICES` on a node with devices `node` (NVML index, UUID); an error where the
/// order cannot be known for certain:
/// - `NVIDIA_VISIBLE_DEVICES` (the devices the runtime gives the container): unset or `all`,
///   every device of the node; `none`, `void` or empty, none; else NVML indices or full UUIDs;
/// - `CUDA_VISIBLE_DEVICES` of full UUIDs gives the order itself, each one of those devices;
///   unset, or of indices, only a container of exactly one device has a known order (CUDA orders
///   several devices fastest first, which the node cannot see). MIG devices and UUID prefixes
///   are not supported.
fn cuda_devices(
    cuda_visible: Option<&str>,
    nvidia_visible: Option<&str>,
    node: &[(u32, &str)],
) -> Result<Vec<String>, &'static str> {
    let find = |entry: &str| -> Option<String> {
        let entry = entry.trim();
        node.iter()
            .find(|(index, uuid)| {
                uuid.eq_ignore_ascii_case(entry) || entry.parse::<u32>().ok() == Some(*index)
            })
            .map(|(_, uuid)| uuid.to_string())
    };
    let container: Vec<String> = match nvidia_visible.map(str::trim) {
        None | Some("all") => node.iter().map(|(_, uuid)| uuid.to_string()).collect(),
        Some("none" | "void" | "") => Vec::new(),
        Some(list) => list
            .split(',')
            .map(find)
            .collect::<Option<_>>()
            .ok_or("NVIDIA_VISIBLE_DEVICES names a device this node does not have")?,
    };
    let Some(list) = cuda_visible.map(str::trim) else {
        return match container.len() {
            0 | 1 => Ok(container),
            _ => Err("the container sees several GPUs and no CUDA_VISIBLE_DEVICES names them by UUID"),
        };
    };
    if list.is_empty() {
        return Ok(Vec::new());
    }
    let entries: Vec<&str> = list.split(',').map(str::trim).collect();
    if entries.iter().all(|e| e.to_ascii_uppercase().starts_with("GPU-")) {
        return entries
            .iter()
            .map(|entry| container.iter().find(|uuid| uuid.eq_ignore_ascii_case(entry)).cloned())
            .collect::<Option<_>>()
            .ok_or("CUDA_VISIBLE_DEVICES names a UUID the container does not have");
    }
    match (&container[..], &entries[..]) {
        ([only], ["0"]) => Ok(vec![only.clone()]),
        ([_], _) => Err("CUDA_VISIBLE_DEVICES is not 0 in a container of one GPU"),
        _ => Err("CUDA_VISIBLE_DEVICES names indices, whose order the node cannot see"),
    }
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

/// `/proc/PID/NAME` of a tenant's process, opened without following a link or blocking.
fn open_proc_file(pid: u32, name: &str) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY)
        .open(PathBuf::from(format!("/proc/{pid}/{name}")))
}

fn open_proc(pid: u32, name: &str) -> Option<std::fs::File> {
    let file = open_proc_file(pid, name);
    if name == "environ" && file.as_ref().is_err_and(|e| e.kind() == std::io::ErrorKind::PermissionDenied) {
        say_refused("environ");
    }
    file.ok()
}

/// Says once that other users' `/proc/PID/NAME` could not be read, and what would let it be (as
/// `host_pids` does for the region views).
fn say_refused(name: &'static str) {
    static SAID: std::sync::Mutex<Vec<&str>> = std::sync::Mutex::new(Vec::new());
    let mut said = SAID.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if !said.contains(&name) {
        said.push(name);
        eprintln!(
            "vgpu-smi: reading other users' /proc/PID/{name} was refused, so their host pids are unknown \
             and the node agent cannot account their processes fully (add the SYS_PTRACE capability to \
             its container)"
        );
    }
}

/// `/proc/PID/NAME` of a tenant's process: no link followed, no blocking, at most
/// [`MAX_PROC_FILE`] bytes, and whether that was all of it.
fn read_proc_bytes(pid: u32, name: &str) -> Option<(Vec<u8>, bool)> {
    let mut bytes = Vec::new();
    open_proc(pid, name)?.take(MAX_PROC_FILE + 1).read_to_end(&mut bytes).ok()?;
    let complete = bytes.len() as u64 <= MAX_PROC_FILE;
    bytes.truncate(MAX_PROC_FILE as usize);
    Some((bytes, complete))
}

/// `/proc/PID/NAME` of a tenant's process, as text: no link followed, no blocking, at most
/// [`MAX_PROC_FILE`] bytes.
pub fn read_proc(pid: u32, name: &str) -> Option<String> {
    read_proc_bytes(pid, name).map(|(bytes, _)| String::from_utf8_lossy(&bytes).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    thread_local! {
        /// Scans of `/proc` for lease holders made by this thread.
        pub static SCANS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    }

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

    const U0: &str = "GPU-00000000-0000-0000-0000-000000000000";
    const U1: &str = "GPU-11111111-1111-1111-1111-111111111111";

    fn vars(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        let environ: Vec<u8> = pairs.iter().flat_map(|(k, v)| format!("{k}={v}\0").into_bytes()).collect();
        budget_vars(&environ)
    }

    fn budget(
        pairs: &[(&str, &str)],
        node: &[(u32, &str)],
        used: &[&str],
    ) -> Result<HashMap<String, u64>, String> {
        budget_from_vars(7, &vars(pairs), node, used)
            .map_err(|refused| format!("{}: {refused}", refused.kind()))
    }

    #[test]
    fn budget_variables_are_read_as_getenv_finds_them() {
        let environ = b"PATH=/bin\0CUDA_DEVICE_MEMORY_LIMIT_0=2g\0CUDA_DEVICE_MEMORY_LIMIT_0=9g\0NVIDIA_VISIBLE_DEVICES=all\0CUDA_DEVICE_MEMORY_SHARED_CACHE=/x\0junk\0";
        assert_eq!(
            budget_vars(environ),
            vec![
                ("CUDA_DEVICE_MEMORY_LIMIT_0".to_owned(), "2g".to_owned()),
                ("NVIDIA_VISIBLE_DEVICES".to_owned(), "all".to_owned())
            ]
        );
    }

    #[test]
    fn values_are_read_as_libvgpu_reads_them_and_a_bad_one_gives_no_budget() {
        let one = [(0, U0)];
        for (value, bytes) in [("2g", 2u64 << 30), ("4000m", 4000 << 20), ("1048576", 1 << 20)] {
            let got = budget(&[("CUDA_DEVICE_MEMORY_LIMIT_0", value)], &one, &[U0]);
            assert_eq!(got, Ok(HashMap::from([(U0.to_owned(), bytes)])), "{value}");
        }
        assert_eq!(
            budget(&[("CUDA_DEVICE_MEMORY_LIMIT_0", "0")], &one, &[U0]),
            Ok(HashMap::new()),
            "0: no limit"
        );
        for (var, value) in [
            ("CUDA_DEVICE_MEMORY_LIMIT_0", "2x"),
            ("CUDA_DEVICE_MEMORY_LIMIT", "\u{1b}[2J"),
            ("CUDA_DEVICE_MEMORY_LIMIT_16", "1g"),
            ("CUDA_DEVICE_MEMORY_LIMIT_abc", "1g"),
        ] {
            let got = budget(&[(var, value)], &one, &[U0]).unwrap_err();
            assert!(got.starts_with("bad_value: host pid 7 has"), "{got}");
            assert!(!got.contains('\u{1b}'), "escaped: {got}");
        }
    }

    #[test]
    fn an_ordinal_names_a_device_only_where_the_order_is_known() {
        let one = [(0, U0)];
        let two = [(0, U0), (1, U1)];
        let limit1 = ("CUDA_DEVICE_MEMORY_LIMIT_1", "1g");
        let limit0 = ("CUDA_DEVICE_MEMORY_LIMIT_0", "2g");
        // One GPU on the node, or the runtime's list names one: ordinal 0 is it.
        assert_eq!(budget(&[limit0], &one, &[U0]), Ok(HashMap::from([(U0.to_owned(), 2 << 30)])));
        assert_eq!(
            budget(&[limit0, ("NVIDIA_VISIBLE_DEVICES", "1")], &two, &[U1]),
            Ok(HashMap::from([(U1.to_owned(), 2 << 30)]))
        );
        assert_eq!(
            budget(&[limit0, ("NVIDIA_VISIBLE_DEVICES", &U1.to_lowercase())], &two, &[U1]),
            Ok(HashMap::from([(U1.to_owned(), 2 << 30)]))
        );
        // CUDA_VISIBLE_DEVICES by UUID gives the order itself.
        let order = format!("{U1},{U0}");
        assert_eq!(
            budget(&[limit0, limit1, ("CUDA_VISIBLE_DEVICES", &order)], &two, &[U0, U1]),
            Ok(HashMap::from([(U1.to_owned(), 2 << 30), (U0.to_owned(), 1 << 30)]))
        );
        // Several GPUs in an unknown order, an index into them, or a device not there: none.
        for (extra, why) in [
            (None, "several GPUs"),
            (Some(("CUDA_VISIBLE_DEVICES", "1,0")), "indices"),
            (Some(("NVIDIA_VISIBLE_DEVICES", "GPU-nope")), "does not have"),
            (Some(("NVIDIA_VISIBLE_DEVICES", "2")), "does not have"),
        ] {
            let pairs: Vec<(&str, &str)> = [limit0].into_iter().chain(extra).collect();
            let got = budget(&pairs, &two, &[U0]).unwrap_err();
            assert!(got.starts_with("no_device_mapping") && got.contains(why), "{extra:?}: {got}");
        }
        let cuda_u1 = [limit0, ("CUDA_VISIBLE_DEVICES", U1), ("NVIDIA_VISIBLE_DEVICES", U0)];
        assert!(budget(&cuda_u1, &two, &[U0]).unwrap_err().contains("does not have"));
        assert!(budget(&[limit0, ("CUDA_VISIBLE_DEVICES", "1")], &one, &[U0]).unwrap_err().contains("not 0"));
        // The variable for every device needs no order: it is every device the container uses.
        assert_eq!(
            budget(&[("CUDA_DEVICE_MEMORY_LIMIT", "3g")], &two, &[U1]),
            Ok(HashMap::from([(U1.to_owned(), 3 << 30)]))
        );
    }

    #[test]
    fn one_scan_finds_every_regions_lease_holders_and_nothing_is_kept_for_the_next_pass() {
        let me = std::process::id() as i32;
        let inner = innermost_pid(me as u32).unwrap();
        let dir = std::env::temp_dir();
        let paths: Vec<PathBuf> = (0..3).map(|i| dir.join(format!("vgpu-smi-holders-{me}-{i}"))).collect();
        let mut maps = Vec::new();
        for path in &paths[..2] {
            std::fs::write(path, vec![0u8; 4096]).unwrap();
            let file = std::fs::File::open(path).unwrap();
            // SAFETY: a read-only shared mapping of 4096 bytes of an open file; unmapped below.
            let map = unsafe {
                use std::os::fd::AsRawFd;
                libc::mmap(std::ptr::null_mut(), 4096, libc::PROT_READ, libc::MAP_SHARED, file.as_raw_fd(), 0)
            };
            assert_ne!(map, libc::MAP_FAILED);
            maps.push(map);
        }
        std::fs::write(&paths[2], b"not mapped").unwrap();
        let regions: Vec<(&Path, Vec<i32>)> = paths.iter().map(|p| (p.as_path(), vec![inner, 0])).collect();
        let scans = SCANS.with(std::cell::Cell::get);
        let found = lease_holders(&regions);
        assert_eq!(SCANS.with(std::cell::Cell::get) - scans, 1, "one scan for three regions");
        let me_only = HashMap::from([(inner, me)]);
        assert_eq!(found, vec![me_only.clone(), me_only.clone(), HashMap::new()]);
        // SAFETY: the first mapping made above, not used afterwards.
        unsafe { libc::munmap(maps[0], 4096) };
        assert_eq!(
            lease_holders(&regions),
            vec![HashMap::new(), me_only, HashMap::new()],
            "a new pass looks again"
        );
        // SAFETY: the second mapping made above, not used afterwards.
        unsafe { libc::munmap(maps[1], 4096) };
        for path in &paths {
            std::fs::remove_file(path).unwrap();
        }
    }

    #[test]
    fn a_process_environment_counts_only_for_the_process_that_was_mapped() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .env("CUDA_DEVICE_MEMORY_LIMIT_0", "2g")
            .spawn()
            .unwrap();
        let pid = child.id();
        // Until it has run exec, the child's environment is this process's.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !read_proc(pid, "environ").is_some_and(|e| e.contains("CUDA_DEVICE_MEMORY_LIMIT_0=2g")) {
            assert!(std::time::Instant::now() < deadline, "sleep never started");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let start = start_time(pid).unwrap();
        let process = |start| ProcessUse {
            host_pid: pid,
            start,
            uuid: U0.into(),
            nvml: 1,
            lease: None,
            unaccounted: 1,
            graphics: true,
            route: Route::Mount,
        };
        let devices = [crate::physical::PhysicalDevice {
            index: 0,
            uuid: U0.into(),
            name: None,
            total: 1 << 40,
            used: 1,
            processes: Vec::new(),
            mps_clients: None,
        }];
        let got = environment_budget(&[process(start)], &devices);
        assert_eq!(got, Ok(HashMap::from([(U0.to_owned(), 2 << 30)])));
        // A later process with that pid (another start time) is not the one NVML listed.
        assert_eq!(environment_budget(&[process(start + 1)], &devices), Ok(HashMap::new()));
        let _ = child.kill();
        let _ = child.wait();
    }
}
