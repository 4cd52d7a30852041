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
//!   (`cgroup`), of no other container's, and nothing contradicts it (below).
//!
//! The `mount` and `cgroup` routes must not disagree: a process they put in two containers is
//! nobody's. A process in none is listed as unmapped, never acted on.
//!
//! A cgroup is the runtime's, but one cgroup need not be one budget: jobs on a bare-metal node or
//! in one systemd slice share theirs, and a job whose processes have not started CUDA yet has no
//! lease holder to claim it. So the `cgroup` route asks the process's environment
//! (`/proc/PID/environ`, a tenant's file) whether it is another budget's ([`Expected`]):
//! - `CUDA_DEVICE_MEMORY_SHARED_CACHE` must be one a lease holder of the container has; where no
//!   lease holder's environment has it (unreadable, gone, or the budget came from elsewhere), its
//!   file name must be the region file's. Naming the same region is enough: libvgpu applies the
//!   region's budgets to every process that attaches to it, whatever its own limits say.
//! - Without it, `CUDA_DEVICE_MEMORY_LIMIT` and `CUDA_DEVICE_MEMORY_LIMIT_<N>` must give, for each
//!   of the region's devices, the limits some lease holder's give; where no lease holder has a
//!   limit variable, the region's budgets.
//! - A process with none of those variables, or whose environment cannot be read, is not
//!   contradicted; nor is one with the container's folder mounted (the kernel's word, as for the
//!   `mount` route, outweighs the tenant's).
//!
//! A contradicted process is unmapped, with why. Its cgroup, like one holding lease holders of
//! several containers, is *shared* ([`SharedCgroup`]): the `cgroup` route finds nothing more there,
//! and the policy acts there only on lease holders and never freezes it. Every process the
//! cgroup lists (`cgroup.procs`) is looked at, not only NVML's, so a job that has not touched the
//! card yet already marks the cgroup shared.
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

/// Processes of one cgroup whose environment is looked at, at most, beyond NVML's.
const MAX_CGROUP_MEMBERS: usize = 4096;

const MEMORY_LIMIT: &str = "CUDA_DEVICE_MEMORY_LIMIT";
const SHARED_CACHE: &str = "CUDA_DEVICE_MEMORY_SHARED_CACHE";
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

/// How a process's environment says it is not the container its cgroup names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Contradiction {
    /// `CUDA_DEVICE_MEMORY_SHARED_CACHE` names another region.
    Region,
    /// No region named, and `CUDA_DEVICE_MEMORY_LIMIT*` give other limits.
    Limits,
}

impl Contradiction {
    /// Why the process is unmapped.
    pub fn why(self) -> &'static str {
        match self {
            Contradiction::Region => {
                "its environment names another region than its cgroup's container (CUDA_DEVICE_MEMORY_SHARED_CACHE)"
            }
            Contradiction::Limits => {
                "its environment has other limits than its cgroup's container (CUDA_DEVICE_MEMORY_LIMIT*)"
            }
        }
    }

    fn what(self) -> &'static str {
        match self {
            Contradiction::Region => "names another region",
            Contradiction::Limits => "has other limits",
        }
    }
}

/// A cgroup that processes of several budgets share: the `cgroup` route finds nothing there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SharedCgroup {
    /// Its cgroup v2 path (`0::` of `/proc/PID/cgroup`).
    pub cgroup: String,
    /// The containers whose lease holders are in it.
    pub containers: Vec<String>,
    /// For one container's cgroup, a process in it whose environment contradicts that container
    /// (the first found, host pid), and how.
    pub contradicted: Option<(u32, Contradiction)>,
}

impl std::fmt::Display for SharedCgroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "cgroup {} holds lease holders of {}",
            self.cgroup.escape_debug(),
            self.containers.join(", ")
        )?;
        if let Some((pid, contradiction)) = self.contradicted {
            write!(f, " and host pid {pid}, whose environment {}", contradiction.what())?;
        }
        Ok(())
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
    /// In a cgroup that processes of several budgets share ([`SharedCgroup`]).
    pub shared_cgroup: bool,
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
    /// Cgroups that processes of several budgets share, by path.
    pub shared_cgroups: Vec<SharedCgroup>,
}

impl Accounting {
    /// Whether processes of several budgets share `cgroup`.
    pub fn is_shared(&self, cgroup: &str) -> bool {
        self.shared_cgroups.iter().any(|shared| shared.cgroup == cgroup)
    }
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
    // Who holds a lease, and the cgroups of those processes: a cgroup two containers claim is
    // neither's.
    let mut holders: HashMap<u32, usize> = HashMap::new();
    for (index, container) in known.iter().enumerate() {
        for &pid in container.leases.keys() {
            holders.entry(pid).or_insert(index);
        }
    }
    let mut claims: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    let mut holder_cgroups: HashMap<u32, String> = HashMap::new();
    for (&pid, &index) in &holders {
        let Some(cgroup) = cgroup_of(pid).filter(|c| c != "/") else { continue };
        let owners = claims.entry(cgroup.clone()).or_default();
        if !owners.contains(&index) {
            owners.push(index);
        }
        holder_cgroups.insert(pid, cgroup);
    }
    // NVML's processes without a lease: when each started and its cgroup.
    let mut seen: BTreeMap<u32, Option<Seen>> = BTreeMap::new();
    for process in devices.iter().flat_map(|d| &d.processes) {
        let pid = process.pid;
        if pid != 0 && !holders.contains_key(&pid) {
            seen.entry(pid).or_insert_with(|| {
                Some(Seen { start: start_time(pid)?, cgroup: cgroup_of(pid), contradiction: None })
            });
        }
    }
    let shared_cgroups = shared_cgroups(&known, &claims, &holders, &mut seen);
    let shared: HashSet<&str> = shared_cgroups.iter().map(|s| s.cgroup.as_str()).collect();

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
        shared_cgroups: Vec::new(),
    };
    let mut found: HashMap<u32, Result<(usize, Route, u64), &'static str>> = HashMap::new();
    for device in devices {
        for process in device.processes.iter().filter(|p| p.pid != 0) {
            let pid = process.pid;
            let mapped = *found.entry(pid).or_insert_with(|| {
                map(pid, &holders, seen.get(&pid).and_then(Option::as_ref), &known, &claims, &shared)
            });
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
            let cgroup = holder_cgroups
                .get(&pid)
                .or_else(|| seen.get(&pid)?.as_ref()?.cgroup.as_ref())
                .map(String::as_str);
            result.containers[index].processes.push(ProcessUse {
                host_pid: pid,
                start,
                uuid: device.uuid.clone(),
                nvml,
                lease,
                unaccounted,
                graphics: process.graphics,
                route,
                shared_cgroup: cgroup.is_some_and(|c| shared.contains(c)),
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
    result.shared_cgroups = shared_cgroups;
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
    vars_named(environ, |name| is_limit(name) || name == CUDA_VISIBLE || name == NVIDIA_VISIBLE)
}

/// The variables of an environment whose names `wanted` takes, the first of each name as `getenv`
/// finds it, sorted by name.
fn vars_named(environ: &[u8], wanted: impl Fn(&str) -> bool) -> Vec<(String, String)> {
    let mut vars: BTreeMap<String, String> = BTreeMap::new();
    for entry in environ.split(|&b| b == 0) {
        let entry = String::from_utf8_lossy(entry);
        let Some((name, value)) = entry.split_once('=') else { continue };
        if wanted(name) {
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

/// What was read of one of NVML's processes without a lease, before it is mapped.
struct Seen {
    /// When it started (clock ticks since boot).
    start: u64,
    cgroup: Option<String>,
    /// How its environment contradicts the one container whose lease holders share its cgroup.
    contradiction: Option<Contradiction>,
}

/// Which container host pid `pid` is in, how it was found and its start time. `holders`: lease
/// holders' host pids and their container; `seen`: what was read of it before (none: it was gone);
/// `claims`: lease holders' cgroups and their containers; `shared`: cgroups of several budgets.
fn map(
    pid: u32,
    holders: &HashMap<u32, usize>,
    seen: Option<&Seen>,
    known: &[Known],
    claims: &BTreeMap<String, Vec<usize>>,
    shared: &HashSet<&str>,
) -> Result<(usize, Route, u64), &'static str> {
    const GONE: &str = "gone, or /proc unreadable";
    if let Some(&index) = holders.get(&pid) {
        return Ok((index, Route::Lease, start_time(pid).ok_or(GONE)?));
    }
    let seen = seen.ok_or(GONE)?;
    let by_mount = mounted_container(pid, known)?;
    let cgroup = seen.cgroup.as_deref();
    let by_cgroup = match cgroup.and_then(|c| claims.get(c)).map(Vec::as_slice) {
        Some(&[index]) => Some(index),
        Some(_) => return Err("its cgroup holds processes of several containers"),
        None => None,
    };
    if start_time(pid) != Some(seen.start) {
        return Err("gone while it was read");
    }
    match (by_mount, by_cgroup) {
        (Some(a), Some(b)) if a != b => Err("its mounts and its cgroup name different containers"),
        (Some(index), _) => Ok((index, Route::Mount, seen.start)),
        (None, Some(index)) => match seen.contradiction {
            Some(contradiction) => Err(contradiction.why()),
            None if cgroup.is_some_and(|c| shared.contains(c)) => {
                Err("its cgroup holds processes of other budgets, so the cgroup says nothing of it")
            }
            None => Ok((index, Route::Cgroup, seen.start)),
        },
        (None, None) => Err("in no known container"),
    }
}

/// The cgroups of `claims` (lease holders' cgroups and their containers) that processes of several
/// budgets share: lease holders of several containers, or a process whose environment
/// contradicts the one container there ([`contradiction`]). Each of NVML's processes (`seen`) in
/// such a cgroup is looked at and its contradiction kept; then, until one is found, the cgroup's
/// other processes (`cgroup.procs`, at most [`MAX_CGROUP_MEMBERS`]).
fn shared_cgroups(
    known: &[Known],
    claims: &BTreeMap<String, Vec<usize>>,
    holders: &HashMap<u32, usize>,
    seen: &mut BTreeMap<u32, Option<Seen>>,
) -> Vec<SharedCgroup> {
    let root = cgroup2_root();
    let mut expected: HashMap<usize, Expected> = HashMap::new();
    let mut shared = Vec::new();
    for (cgroup, owners) in claims {
        let &[owner] = owners.as_slice() else {
            let mut containers: Vec<String> = owners.iter().map(|&i| known[i].name.clone()).collect();
            containers.sort();
            shared.push(SharedCgroup { cgroup: cgroup.clone(), containers, contradicted: None });
            continue;
        };
        let mut first = None;
        for (&pid, seen) in seen.iter_mut() {
            let Some(seen) = seen.as_mut().filter(|s| s.cgroup.as_ref() == Some(cgroup)) else { continue };
            seen.contradiction = contradiction(pid, Some(seen.start), owner, known, &mut expected);
            if let Some(found) = seen.contradiction {
                first.get_or_insert((pid, found));
            }
        }
        if first.is_none() {
            first = root
                .as_deref()
                .map(|root| cgroup_members(root, cgroup))
                .unwrap_or_default()
                .into_iter()
                .filter(|pid| !holders.contains_key(pid) && !seen.contains_key(pid))
                .take(MAX_CGROUP_MEMBERS)
                .find_map(|pid| Some((pid, contradiction(pid, None, owner, known, &mut expected)?)));
        }
        if first.is_some() {
            let containers = vec![known[owner].name.clone()];
            shared.push(SharedCgroup { cgroup: cgroup.clone(), containers, contradicted: first });
        }
    }
    shared
}

/// How process `pid`'s environment contradicts container `known[owner]` ([`Expected`], kept in
/// `expected` for the pass). `None` where it does not, where it has none of the variables or cannot
/// be read, where it is not the process that started at `start`, and where it has the container's
/// folder mounted (then it is the container's, whatever it says).
fn contradiction(
    pid: u32,
    start: Option<u64>,
    owner: usize,
    known: &[Known],
    expected: &mut HashMap<usize, Expected>,
) -> Option<Contradiction> {
    let vars = region_vars(pid, start)?;
    if vars.is_empty() {
        return None;
    }
    let container = &known[owner];
    let found = expected.entry(owner).or_insert_with(|| Expected::of(container)).contradicts(&vars)?;
    let excused = container.folder.as_ref().is_some_and(|folder| has_mounted(pid, folder));
    (!excused).then_some(found)
}

/// What a container's processes have in their environment, by its lease holders' (those whose
/// environment has the variables), else by its region.
struct Expected {
    /// `CUDA_DEVICE_MEMORY_SHARED_CACHE` of each lease holder that has it.
    regions: Vec<String>,
    /// The limits, by CUDA ordinal, of each lease holder with a limit variable.
    limits: Vec<Vec<Bound>>,
    /// The region file's name.
    region_name: Option<std::ffi::OsString>,
    /// The region's budget, by device (CUDA ordinal of the process that made it).
    budgets: Vec<Option<u64>>,
}

impl Expected {
    fn of(container: &Known) -> Expected {
        let region = container.region;
        let mut expected = Expected {
            regions: Vec::new(),
            limits: Vec::new(),
            region_name: region.and_then(|r| r.path.file_name()).map(ToOwned::to_owned),
            budgets: region.map(|r| r.devices.iter().map(|d| d.budget).collect()).unwrap_or_default(),
        };
        let mut holders: Vec<u32> = container.leases.keys().copied().collect();
        holders.sort_unstable();
        for vars in holders.into_iter().filter_map(|pid| region_vars(pid, None)) {
            if let Some(named) = value_of(&vars, SHARED_CACHE) {
                expected.regions.push(named.to_owned());
            }
            if vars.iter().any(|(name, _)| is_limit(name)) {
                expected.limits.push(bounds(&vars, expected.ordinals()));
            }
        }
        expected
    }

    /// The CUDA ordinals whose limits are compared: the region's devices.
    fn ordinals(&self) -> usize {
        self.budgets.len().max(1)
    }

    /// How a process with `vars` (its region variables, see [`region_vars`]) is not of this
    /// container; `None` where nothing says so.
    fn contradicts(&self, vars: &[(String, String)]) -> Option<Contradiction> {
        if let Some(named) = value_of(vars, SHARED_CACHE) {
            let same = if self.regions.is_empty() {
                self.region_name.as_deref().is_none_or(|name| Path::new(named).file_name() == Some(name))
            } else {
                self.regions.iter().any(|region| region == named)
            };
            return (!same).then_some(Contradiction::Region);
        }
        if !vars.iter().any(|(name, _)| is_limit(name)) {
            return None;
        }
        let own = bounds(vars, self.ordinals());
        let same = if self.limits.is_empty() {
            own.iter().zip(&self.budgets).all(|(bound, budget)| bound.is(*budget))
        } else {
            self.limits.contains(&own)
        };
        (!same).then_some(Contradiction::Limits)
    }
}

/// One device's limit, as an environment sets it.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Bound {
    /// Unset, or 0 (HAMi's "no limit").
    Unlimited,
    Bytes(u64),
    /// Not a size: libvgpu would refuse the device; equal only to the same text.
    Bad(String),
}

impl Bound {
    /// Whether a region's budget for the device is this limit.
    fn is(&self, budget: Option<u64>) -> bool {
        match (self, budget) {
            (Bound::Unlimited, None) => true,
            (Bound::Bytes(bytes), Some(budget)) => *bytes == budget,
            _ => false,
        }
    }
}

/// The limit of each CUDA ordinal below `ordinals` in `vars`: `CUDA_DEVICE_MEMORY_LIMIT_<N>`, else
/// `CUDA_DEVICE_MEMORY_LIMIT`, read as libvgpu reads them.
fn bounds(vars: &[(String, String)], ordinals: usize) -> Vec<Bound> {
    (0..ordinals)
        .map(|n| {
            let value =
                value_of(vars, &format!("{MEMORY_LIMIT}_{n}")).or_else(|| value_of(vars, MEMORY_LIMIT));
            match value.map(|v| (v, parse_size(v))) {
                None | Some((_, Some(0))) => Bound::Unlimited,
                Some((_, Some(bytes))) => Bound::Bytes(bytes),
                Some((text, None)) => Bound::Bad(text.to_owned()),
            }
        })
        .collect()
}

fn value_of<'a>(vars: &'a [(String, String)], name: &str) -> Option<&'a str> {
    vars.iter().find(|(n, _)| n == name).map(|(_, value)| value.as_str())
}

/// The variables of process `pid`'s environment that name its region and limits
/// (`CUDA_DEVICE_MEMORY_SHARED_CACHE`, `CUDA_DEVICE_MEMORY_LIMIT*`), read as a tenant's file; `None`
/// where it cannot be read, or the process is not the one that started at `start` (without
/// `start`: it changed while read). An environment past the bound loses its last, cut entry.
fn region_vars(pid: u32, start: Option<u64>) -> Option<Vec<(String, String)>> {
    let start = start.or_else(|| start_time(pid))?;
    let (mut environ, complete) = read_proc_bytes(pid, "environ")?;
    if start_time(pid) != Some(start) {
        return None;
    }
    if !complete {
        environ.truncate(environ.iter().rposition(|&b| b == 0).unwrap_or(0));
    }
    Some(vars_named(&environ, |name| name == SHARED_CACHE || is_limit(name)))
}

/// The processes of `cgroup` (its `cgroup.procs` under the cgroup v2 hierarchy at `root`), read to
/// a bound.
fn cgroup_members(root: &Path, cgroup: &str) -> Vec<u32> {
    let Some(dir) = cgroup_dir(root, cgroup) else { return Vec::new() };
    let mut text = String::new();
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY)
        .open(dir.join("cgroup.procs"));
    if opened.and_then(|file| file.take(MAX_PROC_FILE).read_to_string(&mut text)).is_err() {
        return Vec::new();
    }
    text.lines().filter_map(|line| line.trim().parse().ok()).collect()
}

/// The folder of `cgroup` (a path as `/proc/PID/cgroup` writes it) under the hierarchy at `root`;
/// `None` for a path that climbs out of it (a cgroup outside this cgroup namespace reads `/../…`).
pub fn cgroup_dir(root: &Path, cgroup: &str) -> Option<PathBuf> {
    let relative = Path::new(cgroup.trim_start_matches('/'));
    relative.components().all(|c| matches!(c, std::path::Component::Normal(_))).then(|| root.join(relative))
}

/// Where the node's cgroup v2 hierarchy is mounted (in `vgpu-smi`'s own mount table).
pub fn cgroup2_root() -> Option<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").ok()?;
    mounts.lines().find_map(|line| {
        let mut fields = line.split(' ');
        let (_, point, kind) = (fields.next()?, fields.next()?, fields.next()?);
        (kind == "cgroup2").then(|| unescape(point).into())
    })
}

/// The container whose folder process `pid` has mounted; an error if several.
fn mounted_container(pid: u32, known: &[Known]) -> Result<Option<usize>, &'static str> {
    let Some(mountinfo) = read_proc(pid, "mountinfo") else { return Ok(None) };
    let mut hit = None;
    for mount in mountinfo.lines().filter_map(Mount::parse) {
        for (index, k) in known.iter().enumerate() {
            if k.folder.as_ref().is_some_and(|folder| mount.shows(folder)) {
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

/// Whether process `pid` has `folder` (device, path within that filesystem), or a folder inside
/// it, mounted.
fn has_mounted(pid: u32, folder: &(u64, String)) -> bool {
    read_proc(pid, "mountinfo")
        .is_some_and(|text| text.lines().filter_map(Mount::parse).any(|m| m.shows(folder)))
}

/// One line of a mount table (`proc(5)`, mountinfo).
struct Mount {
    dev: u64,
    root: String,
    mount_point: String,
}

impl Mount {
    /// Whether this mount is `folder` (device, path within that filesystem) or a folder inside it.
    fn shows(&self, (dev, path): &(u64, String)) -> bool {
        self.dev == *dev
            && (self.root == *path
                || self.root.strip_prefix(path.as_str()).is_some_and(|rest| rest.starts_with('/')))
    }

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

    fn expected(regions: &[&str], limits: &[&[(&str, &str)]], budgets: &[Option<u64>]) -> Expected {
        let mut expected = Expected {
            regions: regions.iter().map(|r| r.to_string()).collect(),
            limits: Vec::new(),
            region_name: Some("a.cache".into()),
            budgets: budgets.to_vec(),
        };
        for pairs in limits {
            let limits = bounds(&region_pairs(pairs), expected.ordinals());
            expected.limits.push(limits);
        }
        expected
    }

    fn region_pairs(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        let environ: Vec<u8> = pairs.iter().flat_map(|(k, v)| format!("{k}={v}\0").into_bytes()).collect();
        vars_named(&environ, |name| name == SHARED_CACHE || is_limit(name))
    }

    #[test]
    fn a_process_naming_another_region_than_the_lease_holders_is_contradicted() {
        let holders =
            expected(&["/jobs/a/vgpu.cache"], &[&[("CUDA_DEVICE_MEMORY_LIMIT_0", "2g")]], &[Some(2 << 30)]);
        let check = |pairs: &[(&str, &str)]| holders.contradicts(&region_pairs(pairs));
        assert_eq!(check(&[(SHARED_CACHE, "/jobs/a/vgpu.cache")]), None);
        assert_eq!(check(&[(SHARED_CACHE, "/jobs/b/vgpu.cache")]), Some(Contradiction::Region));
        // The same region is the same budget, whatever limits the process asks (libvgpu applies
        // the region's).
        assert_eq!(
            check(&[(SHARED_CACHE, "/jobs/a/vgpu.cache"), ("CUDA_DEVICE_MEMORY_LIMIT_0", "30g")]),
            None
        );
        // No region named: the limits decide, read as libvgpu reads them.
        assert_eq!(check(&[("CUDA_DEVICE_MEMORY_LIMIT_0", "2048m")]), None);
        assert_eq!(check(&[("CUDA_DEVICE_MEMORY_LIMIT", "2g")]), None, "the same limit for ordinal 0");
        assert_eq!(check(&[("CUDA_DEVICE_MEMORY_LIMIT_0", "30g")]), Some(Contradiction::Limits));
        assert_eq!(check(&[("CUDA_DEVICE_MEMORY_LIMIT_0", "0")]), Some(Contradiction::Limits));
        assert_eq!(check(&[("CUDA_DEVICE_MEMORY_LIMIT_0", "2x")]), Some(Contradiction::Limits));
        // None of the variables: nothing says it is another budget's.
        assert_eq!(check(&[]), None);
        assert_eq!(check(&[("CUDA_VISIBLE_DEVICES", "0"), ("PATH", "/bin")]), None);
    }

    #[test]
    fn without_a_lease_holders_environment_the_region_itself_is_compared() {
        // No lease holder's environment has the variables: the region's file name and budgets.
        let region = expected(&[], &[], &[Some(2 << 30), None]);
        let check = |pairs: &[(&str, &str)]| region.contradicts(&region_pairs(pairs));
        assert_eq!(check(&[(SHARED_CACHE, "/usr/local/vgpu/a.cache")]), None, "the name inside a container");
        assert_eq!(check(&[(SHARED_CACHE, "/usr/local/vgpu/b.cache")]), Some(Contradiction::Region));
        assert_eq!(
            check(&[("CUDA_DEVICE_MEMORY_LIMIT_0", "2g")]),
            None,
            "device 1 has no budget, nor a limit here"
        );
        assert_eq!(
            check(&[("CUDA_DEVICE_MEMORY_LIMIT", "2g")]),
            Some(Contradiction::Limits),
            "a limit on device 1, which the region does not budget"
        );
        assert_eq!(check(&[("CUDA_DEVICE_MEMORY_LIMIT_0", "1g")]), Some(Contradiction::Limits));
        // Several lease holders: agreeing with any one of them is enough.
        let two =
            expected(&["/x/a.cache", "/x/b.cache"], &[&[("CUDA_DEVICE_MEMORY_LIMIT_0", "1g")]], &[None]);
        assert_eq!(two.contradicts(&region_pairs(&[(SHARED_CACHE, "/x/b.cache")])), None);
        assert_eq!(two.contradicts(&region_pairs(&[("CUDA_DEVICE_MEMORY_LIMIT_0", "1g")])), None);
        assert_eq!(
            two.contradicts(&region_pairs(&[("CUDA_DEVICE_MEMORY_LIMIT_0", "2g")])),
            Some(Contradiction::Limits),
            "the holders' limits, not the region's (none), decide"
        );
    }

    #[test]
    fn a_shared_cgroup_names_itself_and_a_path_out_of_the_hierarchy_is_refused() {
        let shared = SharedCgroup {
            cgroup: "/jobs.slice\n".into(),
            containers: vec!["pod-1_main".into()],
            contradicted: Some((42, Contradiction::Region)),
        };
        assert_eq!(
            shared.to_string(),
            "cgroup /jobs.slice\\n holds lease holders of pod-1_main and host pid 42, whose environment names another region"
        );
        let root = Path::new("/sys/fs/cgroup");
        assert_eq!(cgroup_dir(root, "/a/b"), Some(PathBuf::from("/sys/fs/cgroup/a/b")));
        assert_eq!(cgroup_dir(root, "/../../etc"), None);
        assert_eq!(cgroup_dir(root, "/a/./b"), Some(PathBuf::from("/sys/fs/cgroup/a/b")));
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
            shared_cgroup: false,
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
