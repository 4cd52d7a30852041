//! Where a process finds its container's budget. The budget belongs to the container, not to
//! each process's environment: a shell opened with `su -`, ssh or `env -i` still loads libvgpu
//! through `/etc/ld.so.preload` but carries none of the pod's variables, and must be held all
//! the same (docs/container-budget.md).
//!
//! The sources, first match wins:
//!
//! 1. **The container's region beside the library.** HAMi mounts `libvgpu.so` into the container's
//!    own `/usr/local/vgpu/`, where the region (`<uuid>.cache`) lives once a process of the pod
//!    made it. When there is one, it is the container's budget, whatever a process's environment
//!    says.
//! 2. **The environment of the container's first process** (`/proc/1/environ`, readable by its
//!    own user and root), when it names a budget, a share or a region file.
//! 3. **The node's file** `/etc/libvgpu.conf` (`NAME=value` lines, the same variables), for bare
//!    metal; only when owned by root and writable by nobody else.
//! 4. **This process's environment**, as HAMi-core reads it.
//!
//! When none says anything: a library that is a mount point of its own was put there by the node
//! for a budgeted container (HAMi mounts it only into those), so every budgeted call fails closed;
//! anywhere else nothing is budgeted and libvgpu stays silent.
//!
//! **KAI-Scheduler's layout** is told from HAMi's by evidence ([`Layout`]): there the library is
//! not a mount point of its own but lies in the node's whole folder, which every budgeted pod
//! shares read-write. A region found there is never the container's, whoever put it there. The
//! container's own folder is `<CONTAINER_VGPU_MOUNT>/containers/<POD_UID>_<CONTAINER_NAME>/` (what
//! HAMi-core PR #219 makes and KAI's monitor reads), named by the webhook's variables from the
//! first process's environment, else this process's; its region is opened there without following
//! a link. A pod whose folder is not known, or that names no budget, fails closed.
//!
//! In a process running in secure-execution mode (setuid, setgid or file capabilities:
//! `AT_SECURE`), source 4 is never read, and nothing else of the environment is either (log
//! level, ledger mode): a user must not steer a privileged program through libvgpu's variables.

use std::ffi::{CStr, c_void};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::config::Config;

/// The node's configuration file for machines without HAMi's container layout.
pub const NODE_FILE: &str = "/etc/libvgpu.conf";
/// How many entries of the library's directory are looked at for a region.
const MAX_DIRECTORY_ENTRIES: usize = 256;

/// The variables KAI-resource-isolator's webhook sets, and HAMi-core (PR #219) reads, to name a
/// container's own folder under the node's.
pub const POD_UID: &str = "POD_UID";
pub const CONTAINER_NAME: &str = "CONTAINER_NAME";
pub const VGPU_MOUNT: &str = "CONTAINER_VGPU_MOUNT";
/// Where the webhook mounts the node's folder unless `CONTAINER_VGPU_MOUNT` says.
pub const DEFAULT_VGPU_MOUNT: &str = "/usr/local/vgpu";
/// The region's name in a container's own folder, the one name KAI's monitor reads.
pub const KAI_REGION: &str = "usage.cache";

/// How the node put the library into the container, told by what the process can see.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Layout {
    /// HAMi's: the library is a mount point of its own in the container's own folder.
    Hami,
    /// KAI-Scheduler's: the library lies in the node's folder, which every budgeted pod shares;
    /// the evidence, in words.
    SharedFolder(String),
    /// Neither: the library lies in a folder of its own (bare metal, `LD_PRELOAD`).
    Plain,
}

impl std::fmt::Display for Layout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Layout::Hami => {
                write!(f, "HAMi's (the library is mounted on its own into the container's own folder)")
            }
            Layout::SharedFolder(evidence) => {
                write!(f, "KAI-Scheduler's (the node's folder, shared by every budgeted pod: {evidence})")
            }
            Layout::Plain => write!(f, "none of a node's (the library lies in a folder of its own)"),
        }
    }
}

/// Tells the layout from what `surroundings` show of `library`; `webhook` says whether the
/// container's sources name `CONTAINER_VGPU_MOUNT`.
pub fn layout(surroundings: &impl Surroundings, library: Option<&Path>, webhook: bool) -> Layout {
    let named =
        || webhook.then(|| format!("{VGPU_MOUNT} is set, as KAI-resource-isolator's webhook sets it"));
    let Some(library) = library else { return named().map_or(Layout::Plain, Layout::SharedFolder) };
    // Only the node can make a mount point in a container: a tenant cannot fake this one.
    if surroundings.is_mount_point(library) {
        return Layout::Hami;
    }
    let Some(dir) = library.parent().filter(|dir| *dir != Path::new("/")) else {
        return named().map_or(Layout::Plain, Layout::SharedFolder);
    };
    // A whole folder mounted with the library in it is the node's (HAMi mounts the library on its
    // own); no pod can undo that mount for another. A `containers/` folder beside the library is
    // no evidence: the node's own folder has one, and a process on the node itself that preloads
    // the node's library is in no pod.
    if surroundings.is_mount_point(dir) {
        return Layout::SharedFolder(format!(
            "{} is mounted into this container with the library in it",
            dir.display()
        ));
    }
    named().map_or(Layout::Plain, Layout::SharedFolder)
}

/// A container's own folder under the node's, from the webhook's variables.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnFolder {
    /// The node's folder as mounted in the container (`CONTAINER_VGPU_MOUNT`).
    pub hook: PathBuf,
    /// `<hook>/containers/<POD_UID>_<CONTAINER_NAME>`.
    pub folder: PathBuf,
}

/// The container's own folder that `vars` name, or why they name none: a value missing, or one
/// that would lead out of the folder or be misread by KAI's monitor (which splits the folder's
/// name at its first `_`).
pub fn own_folder(vars: &[(String, String)]) -> Result<OwnFolder, String> {
    let value = |name: &str| vars.iter().rev().find(|(n, _)| n == name).map(|(_, v)| v.as_str());
    let uid = match value(POD_UID) {
        None | Some("") => return Err(format!("{POD_UID} is not set")),
        Some(uid) if uid.len() <= 128 && uid.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') => uid,
        Some(uid) => return Err(format!("{POD_UID}={uid:?} is not a pod UID (letters, digits and '-')")),
    };
    let name = match value(CONTAINER_NAME) {
        None | Some("") => return Err(format!("{CONTAINER_NAME} is not set")),
        Some(name)
            if name.len() <= 253
                && name != "."
                && name != ".."
                && name.chars().all(|c| c.is_ascii_alphanumeric() || "-._".contains(c)) =>
        {
            name
        }
        Some(name) => {
            return Err(format!(
                "{CONTAINER_NAME}={name:?} is not a container name (letters, digits, '-', '.' and '_'; not . or ..)"
            ));
        }
    };
    let hook = match value(VGPU_MOUNT) {
        None | Some("") => DEFAULT_VGPU_MOUNT,
        Some(hook) if normal_absolute(hook) && !hook.trim_end_matches('/').is_empty() => hook,
        Some(hook) => {
            return Err(format!(
                "{VGPU_MOUNT}={hook:?} is not a folder's absolute path without . or .. (nor /)"
            ));
        }
    };
    let hook = PathBuf::from(hook);
    let folder = hook.join("containers").join(format!("{uid}_{name}"));
    Ok(OwnFolder { hook, folder })
}

/// Whether `path` is absolute with no `.` or `..` component.
fn normal_absolute(path: &str) -> bool {
    path.starts_with('/') && !path.split('/').any(|part| part == "." || part == "..")
}

/// Which source gave the process its budget.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// The container's region file beside the loaded library.
    RegionBesideLibrary(PathBuf),
    /// The container's region in its own folder under the node's (KAI-Scheduler's layout).
    RegionInOwnFolder(PathBuf),
    /// The container's first process's environment.
    InitProcess,
    /// The node's file.
    NodeFile(PathBuf),
    /// This process's own environment.
    Environment,
    /// Nothing anywhere: no budget.
    Nothing,
    /// Nothing anywhere, in a container the node gave a budget: budgeted calls fail closed.
    FailClosed(String),
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::RegionBesideLibrary(path) => write!(f, "the container's region {}", path.display()),
            Source::RegionInOwnFolder(path) => {
                write!(f, "the container's region {} in its own folder", path.display())
            }
            Source::InitProcess => {
                write!(f, "the environment of the container's first process (/proc/1/environ)")
            }
            Source::NodeFile(path) => write!(f, "the node's file {}", path.display()),
            Source::Environment => write!(f, "this process's environment"),
            Source::Nothing => write!(f, "nothing (no budget)"),
            Source::FailClosed(_) => write!(f, "nothing, in a container the node budgets (failing closed)"),
        }
    }
}

/// What the lookup found: the configuration to run with and where it came from.
#[derive(Clone, Debug)]
pub struct Found {
    pub config: Config,
    pub source: Source,
    /// Lines to log once logging is set up (why a candidate was passed over).
    pub notes: Vec<String>,
    /// How the node put the library into the container.
    pub layout: Layout,
}

/// What the lookup reads. [`ThisProcess`] reads the real process; tests give their own.
pub trait Surroundings {
    /// This process's environment.
    fn environment(&self) -> Vec<(String, String)>;
    /// Whether the process runs in secure-execution mode (`getauxval(AT_SECURE)`).
    fn secure(&self) -> bool;
    /// The path of the loaded library that asks.
    fn library(&self) -> Option<PathBuf>;
    /// Region files (regular, named `*.cache`, with HAMi's header) in `dir`, never through a
    /// symlink, sorted.
    fn region_files(&self, dir: &Path) -> Vec<PathBuf>;
    /// `/proc/1/environ`, or `None` when it cannot be read.
    fn init_environment(&self) -> Option<Vec<(String, String)>>;
    /// The node's file: `None` when absent, `Err` when present but not to be trusted.
    fn node_file(&self) -> Option<Result<Vec<(String, String)>, String>>;
    /// Whether `path` is a mount point of its own (a file bind-mounted there).
    fn is_mount_point(&self, path: &Path) -> bool;
    /// The region `region`, in a folder under `hook` that other pods can write, looked at without
    /// following a link: `None` when there is none yet, `Err` when something else is there (a
    /// link, a folder, a file with a second name).
    fn own_region(&self, hook: &Path, region: &Path) -> Option<Result<(), String>>;
}

/// Whether `name` is a variable that decides a budget or where it lives.
fn decides(name: &str) -> bool {
    name == "CUDA_DEVICE_MEMORY_SHARED_CACHE"
        || name == "CUDA_DEVICE_MEMORY_LIMIT"
        || name.starts_with("CUDA_DEVICE_MEMORY_LIMIT_")
        || name == "CUDA_DEVICE_SM_LIMIT"
        || name.starts_with("CUDA_DEVICE_SM_LIMIT_")
}

/// Whether `vars` name a memory budget for some device.
fn names_memory_limit(vars: &[(String, String)]) -> bool {
    vars.iter()
        .any(|(name, _)| name == "CUDA_DEVICE_MEMORY_LIMIT" || name.starts_with("CUDA_DEVICE_MEMORY_LIMIT_"))
}

/// Variables of the container's sources that count: those of libvgpu's contract (a pod's other
/// variables are not reported as misspelt ones of ours).
fn ours(vars: Vec<(String, String)>) -> Vec<(String, String)> {
    const NAMES: [&str; 6] = [
        "CUDA_DEVICE_MEMORY_",
        "CUDA_OVERSUBSCRIBE",
        "CUDA_DEVICE_SM_",
        "CUDA_TASK_PRIORITY",
        "GPU_CORE_UTILIZATION_POLICY",
        "LIBCUDA_",
    ];
    vars.into_iter().filter(|(name, _)| NAMES.iter().any(|prefix| name.starts_with(prefix))).collect()
}

/// Finds the budget of the process `surroundings` describes.
pub fn find(surroundings: &impl Surroundings) -> Found {
    let secure = surroundings.secure();
    let environment = if secure { Vec::new() } else { surroundings.environment() };
    // What the process itself may still choose under a container's budget: how much it logs.
    let own_log_level: Vec<(String, String)> =
        environment.iter().filter(|(name, _)| name == "LIBCUDA_LOG_LEVEL").cloned().collect();
    let mut notes = Vec::new();
    let with_own_logging = |mut vars: Vec<(String, String)>| {
        vars.retain(|(name, _)| name != "LIBCUDA_LOG_LEVEL");
        vars.extend(own_log_level.iter().cloned());
        vars
    };
    let library = surroundings.library();
    let init = surroundings.init_environment();
    let webhook = |vars: &[(String, String)]| vars.iter().any(|(name, _)| name == VGPU_MOUNT);
    let layout = layout(
        surroundings,
        library.as_deref(),
        init.as_deref().is_some_and(webhook) || webhook(&environment),
    );
    if let Layout::SharedFolder(evidence) = &layout {
        let evidence = evidence.clone();
        let mut found = in_shared_folder(surroundings, &evidence, init, &environment, secure);
        found.notes.splice(0..0, notes);
        if found.config.fail_closed.is_some() {
            found.config = fail_closed_config(found.config, with_own_logging(Vec::new()));
        }
        found.layout = layout;
        return found;
    }

    // 1. The container's region beside the library.
    if let Some(dir) = library.as_deref().and_then(Path::parent) {
        let regions = surroundings.region_files(dir);
        match regions.as_slice() {
            [] => {}
            [region] => {
                let named = environment.iter().find(|(name, _)| name == "CUDA_DEVICE_MEMORY_SHARED_CACHE");
                if let Some((_, named)) = named.filter(|(_, named)| Path::new(named) != region) {
                    notes.push(format!(
                        "CUDA_DEVICE_MEMORY_SHARED_CACHE={named} ignored: this container's region is {}",
                        region.display()
                    ));
                }
                // The region holds the budgets: what the environment asks is compared with them
                // when the library attaches (a difference is logged, the region's applies).
                let mut vars: Vec<(String, String)> = environment
                    .iter()
                    .filter(|(name, _)| name != "CUDA_DEVICE_MEMORY_SHARED_CACHE" && name != "LIBVGPU_LEDGER")
                    .cloned()
                    .collect();
                if environment.iter().any(|(name, value)| name == "LIBVGPU_LEDGER" && value.trim() == "local")
                {
                    notes.push(
                        "LIBVGPU_LEDGER=local ignored: this container's region keeps its budget".into(),
                    );
                }
                vars.push(("CUDA_DEVICE_MEMORY_SHARED_CACHE".into(), region.display().to_string()));
                let config = Config::from_vars(vars);
                return Found { config, source: Source::RegionBesideLibrary(region.clone()), notes, layout };
            }
            several => {
                let names: Vec<String> = several.iter().map(|p| p.display().to_string()).collect();
                let why = format!(
                    "{} holds several region files ({}); which one is this container's budget is not \
                     known, so allocations on every device are refused",
                    dir.display(),
                    names.join(", ")
                );
                return fail_closed(why, with_own_logging(Vec::new()), notes, layout);
            }
        }
    }

    // 2. to 4.: the first process's environment, the node's file, this process's environment.
    if let Some((vars, source)) = budget_variables(surroundings, init, &environment, &mut notes) {
        let vars = if source == Source::Environment { vars } else { with_own_logging(vars) };
        return Found { config: Config::from_vars(vars), source, notes, layout };
    }

    // Nothing: fail closed where the node mounted the library for a budgeted container.
    if let Some(library) = library.filter(|library| surroundings.is_mount_point(library)) {
        let why = format!(
            "no budget found for this process, though the node mounted {} into this container for \
             one: its environment names none{}, and no region file is beside the library yet; \
             allocations on every device are refused (start the container's GPU processes with the \
             pod's environment first, or run this one with it)",
            library.display(),
            if secure { " (not read: a setuid or file-capability program)" } else { "" }
        );
        return fail_closed(why, with_own_logging(Vec::new()), notes, layout);
    }
    let vars = if secure { Vec::new() } else { environment };
    Found { config: Config::from_vars(vars), source: Source::Nothing, notes, layout }
}

/// Sources 2 to 4: the variables that name a budget, and where they came from. `environment` is
/// empty for a secure process.
fn budget_variables(
    surroundings: &impl Surroundings,
    init: Option<Vec<(String, String)>>,
    environment: &[(String, String)],
    notes: &mut Vec<String>,
) -> Option<(Vec<(String, String)>, Source)> {
    // 2. The container's first process.
    if let Some(init) = init.map(ours).filter(|init| init.iter().any(|(name, _)| decides(name))) {
        return Some((init, Source::InitProcess));
    }
    // 3. The node's file.
    match surroundings.node_file() {
        Some(Ok(vars)) => return Some((vars, Source::NodeFile(NODE_FILE.into()))),
        Some(Err(why)) => notes.push(why),
        None => {}
    }
    // 4. This process's own environment.
    environment.iter().any(|(name, _)| decides(name)).then(|| (environment.to_vec(), Source::Environment))
}

/// The lookup where the library lies in the node's folder that every budgeted pod shares
/// (KAI-Scheduler's layout, `evidence` saying how that is known): the region is the one in the
/// container's own folder, or one the container names outside the node's folder; nothing found
/// fails closed, because the node gives that folder only to pods it budgets.
fn in_shared_folder(
    surroundings: &impl Surroundings,
    evidence: &str,
    init: Option<Vec<(String, String)>>,
    environment: &[(String, String)],
    secure: bool,
) -> Found {
    let mut notes = Vec::new();
    let refuse = |why: String, notes: Vec<String>| {
        let why = format!("{why}; allocations on every device are refused");
        fail_closed(why, Vec::new(), notes, Layout::SharedFolder(evidence.to_owned()))
    };
    // A region beside the library is never looked at: whoever put it there, it is not this
    // container's. Who this container is: its first process's word, else this process's own.
    let names_folder = |vars: &[(String, String)]| {
        vars.iter().any(|(name, _)| [POD_UID, CONTAINER_NAME, VGPU_MOUNT].contains(&name.as_str()))
    };
    let (identity, whose) = match init.as_deref().filter(|init| names_folder(init)) {
        Some(init) => (init.to_vec(), "its first process's environment"),
        None if names_folder(environment) => (environment.to_vec(), "its environment"),
        None => {
            let unread = if init.is_none() { " (/proc/1/environ cannot be read by this user)" } else { "" };
            let why = format!(
                "libvgpu lies in the node's folder that every pod shares (KAI-Scheduler's layout: \
                 {evidence}), and this process's container is not known: {POD_UID} and {CONTAINER_NAME} \
                 are in neither its environment nor its first process's{unread}; start it with the \
                 pod's environment"
            );
            return refuse(why, notes);
        }
    };
    let own = match own_folder(&identity) {
        Ok(own) => own,
        Err(why) => {
            let why = format!(
                "libvgpu lies in the node's folder that every pod shares (KAI-Scheduler's layout: \
                 {evidence}), and {whose} names no folder of this container's own: {why}"
            );
            return refuse(why, notes);
        }
    };
    let budget = budget_variables(surroundings, init, if secure { &[] } else { environment }, &mut notes);
    let named = budget.as_ref().and_then(|(vars, _)| {
        vars.iter().rev().find(|(name, value)| name == "CUDA_DEVICE_MEMORY_SHARED_CACHE" && !value.is_empty())
    });
    let region = match named.map(|(_, value)| value.as_str()) {
        None => own.folder.join(KAI_REGION),
        Some(named) => match named_region(named, &own) {
            Ok(region) => region,
            Err(why) => return refuse(why, notes),
        },
    };
    let below = region.starts_with(&own.hook).then(|| own.hook.clone());
    // Whether the container's region is already made in its own folder (a region outside the
    // node's folder is the pod's own file, taken as named).
    let made = match below.as_deref().and_then(|hook| surroundings.own_region(hook, &region)) {
        Some(Err(why)) => return refuse(why, notes),
        Some(Ok(())) => true,
        None => false,
    };
    // The node budgets every pod it gives this folder: a memory limit must be named somewhere, or
    // recorded in the region by a process that had one (KAI-Scheduler issue 1967).
    let (mut vars, source) = match budget.filter(|(vars, _)| names_memory_limit(vars) || made) {
        Some((vars, source)) if made && source != Source::Environment => {
            (vars, Source::RegionInOwnFolder(region.clone()))
        }
        Some((vars, source)) => (vars, source),
        None if made => (Vec::new(), Source::RegionInOwnFolder(region.clone())),
        None => {
            let why = format!(
                "KAI-Scheduler's layout ({evidence}) marks this container as one the node budgets, but no \
                 CUDA_DEVICE_MEMORY_LIMIT is set for it and its folder {} holds no region yet",
                own.folder.display()
            );
            return refuse(why, notes);
        }
    };
    vars.retain(|(name, _)| name != "CUDA_DEVICE_MEMORY_SHARED_CACHE" && name != "LIBVGPU_LEDGER");
    if source != Source::Environment && !secure {
        // What the process may still choose under its container's budget: how much it logs.
        vars.retain(|(name, _)| name != "LIBCUDA_LOG_LEVEL");
        vars.extend(environment.iter().filter(|(name, _)| name == "LIBCUDA_LOG_LEVEL").cloned());
    }
    vars.push(("CUDA_DEVICE_MEMORY_SHARED_CACHE".into(), region.display().to_string()));
    let mut config = Config::from_vars(vars);
    config.region_below = below;
    Found { config, source, notes, layout: Layout::SharedFolder(evidence.to_owned()) }
}

/// The region a container names with `CUDA_DEVICE_MEMORY_SHARED_CACHE` under KAI's layout: in its
/// own folder, or outside the node's folder altogether (its own file system, which KAI's monitor
/// does not read); never elsewhere in the node's folder, where every pod can write.
fn named_region(named: &str, own: &OwnFolder) -> Result<PathBuf, String> {
    let path = PathBuf::from(named);
    let var = "CUDA_DEVICE_MEMORY_SHARED_CACHE";
    if !normal_absolute(named) || path.file_name().is_none() {
        return Err(format!("{var}={named:?} is not a file's absolute path without . or .."));
    }
    if path.starts_with(&own.hook) && path.parent() != Some(own.folder.as_path()) {
        return Err(format!(
            "{var}={named} leaves this container's own folder {}: elsewhere in {} every pod can write, so \
             a region there may be another pod's",
            own.folder.display(),
            own.hook.display()
        ));
    }
    Ok(path)
}

fn fail_closed(why: String, vars: Vec<(String, String)>, notes: Vec<String>, layout: Layout) -> Found {
    let mut config = Config::from_vars(vars);
    config.fail_closed = Some(why.clone());
    Found { config, source: Source::FailClosed(why), notes, layout }
}

/// `config` failing closed, with the process's own log level (`vars`) kept.
fn fail_closed_config(config: Config, vars: Vec<(String, String)>) -> Config {
    let mut kept = Config::from_vars(vars);
    kept.fail_closed = config.fail_closed;
    kept
}

/// The budget of this process, for the library whose code holds `anchor`: [`find`] on the real
/// process, then what the region it names holds, when it exists.
pub fn for_this_process(anchor: *const c_void) -> Found {
    let mut found = find(&ThisProcess { anchor });
    if found.config.fail_closed.is_none() {
        found.config.region = match &found.config.region_below {
            Some(below) => {
                let make = crate::region::confined::Make::Nothing;
                crate::region::confined::open(below, &found.config.shared_cache, make)
                    .ok()
                    .and_then(|file| crate::region::peek_file(&file))
            }
            None => crate::region::peek(&found.config.shared_cache),
        };
    }
    found
}

/// The lookup for a process of this one's container that loads `library`: what `vgpu-smi doctor`
/// reports.
pub fn for_library(library: &Path) -> Found {
    /// This process, as if it had loaded the library at `0`.
    struct Loading<'a>(&'a Path, ThisProcess);
    impl Surroundings for Loading<'_> {
        fn environment(&self) -> Vec<(String, String)> {
            self.1.environment()
        }
        fn secure(&self) -> bool {
            self.1.secure()
        }
        fn library(&self) -> Option<PathBuf> {
            Some(self.0.to_owned())
        }
        fn region_files(&self, dir: &Path) -> Vec<PathBuf> {
            self.1.region_files(dir)
        }
        fn init_environment(&self) -> Option<Vec<(String, String)>> {
            self.1.init_environment()
        }
        fn node_file(&self) -> Option<Result<Vec<(String, String)>, String>> {
            self.1.node_file()
        }
        fn is_mount_point(&self, path: &Path) -> bool {
            self.1.is_mount_point(path)
        }
        fn own_region(&self, hook: &Path, region: &Path) -> Option<Result<(), String>> {
            self.1.own_region(hook, region)
        }
    }
    find(&Loading(library, ThisProcess { anchor: std::ptr::null() }))
}

/// The real process: its environment and auxiliary vector, `/proc` and the file system.
pub struct ThisProcess {
    /// An address inside the library asking (any of its functions): `dladdr` names its file.
    pub anchor: *const c_void,
}

impl Surroundings for ThisProcess {
    fn environment(&self) -> Vec<(String, String)> {
        // A value that is not UTF-8 is read with replacement characters, so that it is reported
        // (and a limit fails closed) rather than skipped as if it were unset.
        std::env::vars_os()
            .map(|(k, v)| (k.to_string_lossy().into_owned(), v.to_string_lossy().into_owned()))
            .collect()
    }

    fn secure(&self) -> bool {
        // SAFETY: getauxval has no preconditions; an absent entry reads as 0.
        unsafe { libc::getauxval(libc::AT_SECURE) != 0 }
    }

    fn library(&self) -> Option<PathBuf> {
        let mut info = std::mem::MaybeUninit::<libc::Dl_info>::uninit();
        // SAFETY: `info` is a valid out-pointer; dladdr accepts any address.
        if unsafe { libc::dladdr(self.anchor, info.as_mut_ptr()) } == 0 {
            return None;
        }
        // SAFETY: dladdr returned non-zero, so it filled `info`.
        let info = unsafe { info.assume_init() };
        if info.dli_fname.is_null() {
            return None;
        }
        // SAFETY: dli_fname is a NUL-terminated string owned by the dynamic linker.
        let name = unsafe { CStr::from_ptr(info.dli_fname) };
        let path = PathBuf::from(std::ffi::OsStr::from_bytes(name.to_bytes()));
        path.is_absolute().then_some(path)
    }

    fn region_files(&self, dir: &Path) -> Vec<PathBuf> {
        let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
        let mut found: Vec<PathBuf> = entries
            .take(MAX_DIRECTORY_ENTRIES)
            .filter_map(Result::ok)
            .filter(|entry| entry.file_name().as_bytes().ends_with(b".cache"))
            // `file_type` does not follow a symlink: a link is never taken for a region.
            .filter(|entry| entry.file_type().is_ok_and(|kind| kind.is_file()))
            .map(|entry| entry.path())
            // Another program's cache file is not a region: only files with HAMi's header count.
            .filter(|path| crate::region::peek(path).is_some())
            .collect();
        found.sort();
        found
    }

    fn init_environment(&self) -> Option<Vec<(String, String)>> {
        let bytes = std::fs::read("/proc/1/environ").ok()?;
        Some(
            bytes
                .split(|&b| b == 0)
                .filter_map(|pair| {
                    let text = String::from_utf8_lossy(pair);
                    let (name, value) = text.split_once('=')?;
                    Some((name.to_owned(), value.to_owned()))
                })
                .collect(),
        )
    }

    fn node_file(&self) -> Option<Result<Vec<(String, String)>, String>> {
        let path = Path::new(NODE_FILE);
        let file = open_no_follow(path).ok()?;
        let meta = file.metadata().ok()?;
        if !meta.is_file() || meta.uid() != 0 || meta.mode() & 0o022 != 0 {
            return Some(Err(format!(
                "{NODE_FILE} ignored: it must be a regular file owned by root and writable by root alone"
            )));
        }
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::io::Read::take(&file, 64 * 1024), &mut text).ok()?;
        Some(Ok(parse_node_file(&text)))
    }

    fn own_region(&self, hook: &Path, region: &Path) -> Option<Result<(), String>> {
        use crate::region::confined;
        match confined::open(hook, region, confined::Make::Nothing) {
            Ok(file) => crate::region::peek_file(&file).is_some().then_some(Ok(())),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => None,
            Err(error) => Some(Err(format!("this container's region cannot be used: {error}"))),
        }
    }

    fn is_mount_point(&self, path: &Path) -> bool {
        let Ok(table) = std::fs::read("/proc/self/mountinfo") else { return false };
        let wanted = path.as_os_str().as_bytes();
        // Field 5 of each line is the mount point, with spaces and the like written as \ooo.
        table.split(|&b| b == b'\n').any(|line| {
            line.split(|&b| b == b' ').nth(4).is_some_and(|point| unescape_mountinfo(point) == wanted)
        })
    }
}

/// `NAME=value` lines; blank lines and `#` comments skipped; surrounding spaces trimmed.
pub fn parse_node_file(text: &str) -> Vec<(String, String)> {
    text.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .filter_map(|line| line.split_once('='))
        .map(|(name, value)| (name.trim().to_owned(), value.trim().to_owned()))
        .collect()
}

fn unescape_mountinfo(field: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(field.len());
    let mut i = 0;
    while i < field.len() {
        let octal = field
            .get(i + 1..i + 4)
            .filter(|d| field[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal {
            Some(d) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            None => {
                out.push(field[i]);
                i += 1;
            }
        }
    }
    out
}

/// Opens `path` for reading without following a symlink at its last component and without
/// blocking on a FIFO.
fn open_no_follow(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A process in a made-up container.
    #[derive(Default)]
    struct Fake {
        env: Vec<(&'static str, &'static str)>,
        secure: bool,
        library: Option<&'static str>,
        regions: Vec<&'static str>,
        init: Option<Vec<(&'static str, &'static str)>>,
        node: Option<Result<Vec<(&'static str, &'static str)>, String>>,
        mounted: bool,
        /// Mount points besides the library (KAI's layout), by path.
        mounts: Vec<&'static str>,
        /// What the container's own folder holds: `None` nothing, else the region's state.
        own: Option<Result<(), String>>,
    }

    fn owned(vars: &[(&str, &str)]) -> Vec<(String, String)> {
        vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    impl Surroundings for Fake {
        fn environment(&self) -> Vec<(String, String)> {
            owned(&self.env)
        }
        fn secure(&self) -> bool {
            self.secure
        }
        fn library(&self) -> Option<PathBuf> {
            self.library.map(PathBuf::from)
        }
        fn region_files(&self, _dir: &Path) -> Vec<PathBuf> {
            self.regions.iter().map(PathBuf::from).collect()
        }
        fn init_environment(&self) -> Option<Vec<(String, String)>> {
            self.init.as_deref().map(owned)
        }
        fn node_file(&self) -> Option<Result<Vec<(String, String)>, String>> {
            self.node.clone().map(|node| node.map(|vars| owned(&vars)))
        }
        fn is_mount_point(&self, path: &Path) -> bool {
            if self.library.is_some_and(|library| Path::new(library) == path) {
                return self.mounted;
            }
            self.mounts.iter().any(|mount| Path::new(mount) == path)
        }
        fn own_region(&self, _hook: &Path, _region: &Path) -> Option<Result<(), String>> {
            self.own.clone()
        }
    }

    const POD: [(&str, &str); 2] = [
        ("CUDA_DEVICE_MEMORY_LIMIT_0", "1g"),
        ("CUDA_DEVICE_MEMORY_SHARED_CACHE", "/usr/local/vgpu/a.cache"),
    ];

    use crate::config::DEFAULT_SHARED_CACHE;

    #[test]
    fn the_region_beside_the_library_wins_over_any_environment() {
        let found = find(&Fake {
            env: vec![
                ("CUDA_DEVICE_MEMORY_LIMIT_0", "80g"),
                ("CUDA_DEVICE_MEMORY_SHARED_CACHE", "/tmp/mine.cache"),
            ],
            library: Some("/usr/local/vgpu/libvgpu.so"),
            regions: vec!["/usr/local/vgpu/a.cache"],
            init: Some(POD.to_vec()),
            ..Fake::default()
        });
        assert_eq!(found.source, Source::RegionBesideLibrary("/usr/local/vgpu/a.cache".into()));
        assert_eq!(found.config.shared_cache, Path::new("/usr/local/vgpu/a.cache"));
        assert!(!found.config.local_ledger);
        assert!(found.notes[0].contains("/tmp/mine.cache ignored"), "{:?}", found.notes);
    }

    #[test]
    fn a_stripped_process_takes_the_first_process_environment() {
        let found = find(&Fake {
            env: vec![("HOME", "/root"), ("LIBCUDA_LOG_LEVEL", "4")],
            library: Some("/usr/local/vgpu/libvgpu.so"),
            init: Some(vec![POD[0], POD[1], ("PATH", "/bin"), ("LIBCUDA_LOG_LEVEL", "0")]),
            ..Fake::default()
        });
        assert_eq!(found.source, Source::InitProcess);
        assert_eq!(found.config.memory_limit(0), Some(1 << 30));
        assert_eq!(found.config.shared_cache, Path::new("/usr/local/vgpu/a.cache"));
        assert_eq!(found.config.log_level, tracing::Level::DEBUG, "the process keeps its own log level");
        assert!(found.config.problems.is_empty(), "{:?}", found.config.problems);
    }

    #[test]
    fn oversubscribe_comes_with_the_first_process_environment() {
        let found = find(&Fake {
            env: vec![("HOME", "/root")],
            init: Some(vec![POD[0], POD[1], ("CUDA_OVERSUBSCRIBE", "true")]),
            ..Fake::default()
        });
        assert_eq!(found.source, Source::InitProcess);
        assert!(found.config.overcommit);
        assert!(found.config.problems.is_empty(), "{:?}", found.config.problems);
    }

    #[test]
    fn the_first_process_wins_over_an_edited_environment() {
        let found = find(&Fake {
            env: vec![("CUDA_DEVICE_MEMORY_LIMIT_0", "80g")],
            init: Some(POD.to_vec()),
            ..Fake::default()
        });
        assert_eq!(found.source, Source::InitProcess);
        assert_eq!(found.config.memory_limit(0), Some(1 << 30));
    }

    #[test]
    fn the_node_file_comes_before_the_process_environment() {
        let found = find(&Fake {
            env: vec![("CUDA_DEVICE_MEMORY_LIMIT_0", "80g")],
            init: Some(vec![("PATH", "/bin")]),
            node: Some(Ok(vec![("CUDA_DEVICE_MEMORY_LIMIT", "2g")])),
            ..Fake::default()
        });
        assert_eq!(found.source, Source::NodeFile(NODE_FILE.into()));
        assert_eq!(found.config.memory_limit(3), Some(2 << 30));
    }

    #[test]
    fn an_untrusted_node_file_is_skipped_with_a_note() {
        let found = find(&Fake {
            env: vec![("CUDA_DEVICE_MEMORY_LIMIT_0", "3g")],
            node: Some(Err("not root's".into())),
            ..Fake::default()
        });
        assert_eq!(found.source, Source::Environment);
        assert_eq!(found.config.memory_limit(0), Some(3 << 30));
        assert_eq!(found.notes, ["not root's"]);
    }

    #[test]
    fn the_process_environment_alone_works_as_before() {
        let found = find(&Fake { env: POD.to_vec(), library: Some("/opt/libvgpu.so"), ..Fake::default() });
        assert_eq!(found.source, Source::Environment);
        assert_eq!(found.config.memory_limit(0), Some(1 << 30));
    }

    #[test]
    fn nothing_anywhere_is_silent_unless_the_node_mounted_the_library() {
        let plain = find(&Fake { library: Some("/usr/local/vgpu/libvgpu.so"), ..Fake::default() });
        assert_eq!(plain.source, Source::Nothing);
        assert!(plain.config.fail_closed.is_none() && !plain.config.any_memory_limit());
        let mounted =
            find(&Fake { library: Some("/usr/local/vgpu/libvgpu.so"), mounted: true, ..Fake::default() });
        assert!(matches!(mounted.source, Source::FailClosed(_)), "{:?}", mounted.source);
        assert!(mounted.config.fail_closed.as_deref().is_some_and(|why| why.contains("no budget found")));
    }

    #[test]
    fn several_regions_beside_the_library_fail_closed() {
        let found = find(&Fake {
            env: POD.to_vec(),
            library: Some("/usr/local/vgpu/libvgpu.so"),
            regions: vec!["/usr/local/vgpu/a.cache", "/usr/local/vgpu/b.cache"],
            ..Fake::default()
        });
        assert!(found.config.fail_closed.as_deref().is_some_and(|why| why.contains("several region files")));
    }

    #[test]
    fn a_secure_process_reads_no_variable_of_its_own() {
        let steered = [
            ("CUDA_DEVICE_MEMORY_SHARED_CACHE", "/etc/shadow"),
            ("CUDA_DEVICE_MEMORY_LIMIT_0", "1g"),
            ("LIBCUDA_LOG_LEVEL", "4"),
        ];
        let found = find(&Fake { env: steered.to_vec(), secure: true, ..Fake::default() });
        assert_eq!(found.source, Source::Nothing);
        assert_eq!(found.config.shared_cache, Path::new(DEFAULT_SHARED_CACHE));
        assert_eq!(found.config.log_level, tracing::Level::WARN);
        assert!(!found.config.any_memory_limit());
        // The container's own sources still apply to it.
        let container = find(&Fake {
            env: steered.to_vec(),
            secure: true,
            library: Some("/usr/local/vgpu/libvgpu.so"),
            regions: vec!["/usr/local/vgpu/a.cache"],
            ..Fake::default()
        });
        assert_eq!(container.config.shared_cache, Path::new("/usr/local/vgpu/a.cache"));
        assert_eq!(container.config.log_level, tracing::Level::WARN);
    }

    /// What KAI's webhook and binder give a pod.
    const KAI_POD: [(&str, &str); 4] = [
        ("POD_UID", "6b1e0c3a-aaaa-4bbb-8ccc-000000000001"),
        ("CONTAINER_NAME", "main"),
        ("CONTAINER_VGPU_MOUNT", "/usr/local/vgpu"),
        ("CUDA_DEVICE_MEMORY_LIMIT", "1024m"),
    ];
    const KAI_REGION_PATH: &str =
        "/usr/local/vgpu/containers/6b1e0c3a-aaaa-4bbb-8ccc-000000000001_main/usage.cache";

    /// A process of a pod that KAI's webhook gave the node's whole folder.
    fn kai(env: &[(&'static str, &'static str)]) -> Fake {
        Fake {
            env: env.to_vec(),
            library: Some("/usr/local/vgpu/libvgpu.so"),
            mounts: vec!["/usr/local/vgpu"],
            ..Fake::default()
        }
    }

    fn refused_because(found: &Found, words: &str) {
        let why = found.config.fail_closed.as_deref().unwrap_or_else(|| panic!("not refused: {found:?}"));
        assert!(why.contains(words), "{why}");
        assert!(!why.contains('\n'), "one line: {why}");
    }

    #[test]
    fn the_layout_is_told_by_evidence_a_tenant_cannot_remove() {
        let library = Some(Path::new("/usr/local/vgpu/libvgpu.so"));
        let hami =
            Fake { library: library.map(|_| "/usr/local/vgpu/libvgpu.so"), mounted: true, ..Fake::default() };
        assert_eq!(layout(&hami, library, true), Layout::Hami, "the library's own mount point wins");
        let kai = kai(&[]);
        assert!(matches!(layout(&kai, library, false), Layout::SharedFolder(e) if e.contains("mounted")));
        assert!(
            matches!(layout(&Fake::default(), library, true), Layout::SharedFolder(e) if e.contains("CONTAINER_VGPU_MOUNT"))
        );
        assert_eq!(layout(&Fake::default(), library, false), Layout::Plain);
        // A library at the root of a container's file system is not in a node's folder.
        let root = Fake { mounts: vec!["/"], ..Fake::default() };
        assert_eq!(layout(&root, Some(Path::new("/libvgpu.so")), false), Layout::Plain);
    }

    #[test]
    fn the_own_folder_comes_from_the_webhooks_variables_and_nothing_leads_out_of_it() {
        let vars = |pairs: &[(&str, &str)]| owned(pairs);
        let own = own_folder(&vars(&KAI_POD)).unwrap();
        assert_eq!(own.hook, Path::new("/usr/local/vgpu"));
        assert_eq!(own.folder.join(KAI_REGION), Path::new(KAI_REGION_PATH));
        let own = own_folder(&vars(&[("POD_UID", "u-1"), ("CONTAINER_NAME", "c")])).unwrap();
        assert_eq!(own.folder, Path::new("/usr/local/vgpu/containers/u-1_c"), "the default mount");
        for (pairs, words) in [
            (&[("CONTAINER_NAME", "c")][..], "POD_UID is not set"),
            (&[("POD_UID", ""), ("CONTAINER_NAME", "c")], "POD_UID is not set"),
            (&[("POD_UID", "u")], "CONTAINER_NAME is not set"),
            (&[("POD_UID", ".."), ("CONTAINER_NAME", "c")], "not a pod UID"),
            (&[("POD_UID", "a/b"), ("CONTAINER_NAME", "c")], "not a pod UID"),
            // KAI's monitor splits the folder's name at its first '_'.
            (&[("POD_UID", "a_b"), ("CONTAINER_NAME", "c")], "not a pod UID"),
            (&[("POD_UID", "u"), ("CONTAINER_NAME", "..")], "not a container name"),
            (&[("POD_UID", "u"), ("CONTAINER_NAME", "../../x")], "not a container name"),
            (
                &[("POD_UID", "u"), ("CONTAINER_NAME", "c"), ("CONTAINER_VGPU_MOUNT", "/")],
                "CONTAINER_VGPU_MOUNT",
            ),
            (&[("POD_UID", "u"), ("CONTAINER_NAME", "c"), ("CONTAINER_VGPU_MOUNT", "rel/x")], "absolute"),
            (&[("POD_UID", "u"), ("CONTAINER_NAME", "c"), ("CONTAINER_VGPU_MOUNT", "/a/../b")], "absolute"),
        ] {
            let error = own_folder(&vars(pairs)).unwrap_err();
            assert!(error.contains(words), "{pairs:?}: {error}");
        }
    }

    #[test]
    fn under_kai_the_region_is_in_the_containers_own_folder_never_beside_the_library() {
        let mut fake = kai(&KAI_POD);
        fake.regions = vec!["/usr/local/vgpu/podc.cache"];
        let found = find(&fake);
        assert_eq!(found.source, Source::Environment, "{found:?}");
        assert_eq!(found.config.shared_cache, Path::new(KAI_REGION_PATH));
        assert_eq!(found.config.region_below.as_deref(), Some(Path::new("/usr/local/vgpu")));
        assert_eq!(found.config.memory_limit(0), Some(1 << 30));
        assert!(found.notes.is_empty(), "{:?}", found.notes);
        // Once the container's region exists, it is the source.
        fake.own = Some(Ok(()));
        assert_eq!(find(&fake).source, Source::Environment);
        let stripped = Fake { init: Some(KAI_POD.to_vec()), own: Some(Ok(())), ..kai(&[("HOME", "/")]) };
        assert_eq!(find(&stripped).source, Source::RegionInOwnFolder(KAI_REGION_PATH.into()));
    }

    #[test]
    fn under_kai_a_named_region_may_not_leave_the_containers_own_folder() {
        let named = |path: String| {
            let path: &'static str = Box::leak(path.into_boxed_str());
            let mut env = KAI_POD.to_vec();
            env.push(("CUDA_DEVICE_MEMORY_SHARED_CACHE", path));
            find(&kai(&env))
        };
        let own = KAI_REGION_PATH.trim_end_matches("/usage.cache");
        refused_because(&named("/usr/local/vgpu/podc.cache".into()), "leaves this container's own folder");
        refused_because(&named("/usr/local/vgpu/containers/other_main/usage.cache".into()), "leaves");
        refused_because(&named(format!("{own}/../other_main/usage.cache")), "absolute path without . or ..");
        let inside = named(format!("{own}/mine.cache"));
        assert!(inside.config.fail_closed.is_none(), "{inside:?}");
        assert!(inside.config.region_below.is_some());
        // The pod's own file system is its own: allowed, though KAI's monitor does not read it.
        let private = named("/tmp/mine.cache".into());
        assert_eq!(private.config.shared_cache, Path::new("/tmp/mine.cache"));
        assert_eq!(private.config.region_below, None);
    }

    #[test]
    fn under_kai_a_planted_link_an_unknown_pod_or_no_limit_fails_closed_in_one_line() {
        let mut planted = kai(&KAI_POD);
        planted.own = Some(Err("this container's region cannot be used: … is not a regular file".into()));
        refused_because(&find(&planted), "not a regular file");
        // A stripped process whose first process's environment cannot be read.
        let stripped = kai(&[("HOME", "/"), ("LIBCUDA_LOG_LEVEL", "4")]);
        let found = find(&stripped);
        refused_because(&found, "/proc/1/environ cannot be read");
        assert_eq!(found.config.log_level, tracing::Level::DEBUG, "the process keeps its own log level");
        // The same process reads the pod's identity and budget from its first process.
        let found = find(&Fake { init: Some(KAI_POD.to_vec()), ..stripped });
        assert_eq!(found.source, Source::InitProcess);
        assert_eq!(found.config.shared_cache, Path::new(KAI_REGION_PATH));
        assert_eq!(found.config.memory_limit(3), Some(1 << 30));
        // A pod the binder set no limit for (KAI-Scheduler issue 1967).
        refused_because(&find(&kai(&KAI_POD[..3])), "no CUDA_DEVICE_MEMORY_LIMIT");
        // Nor does a share or a region file of its own stand for a limit.
        let mut unlimited = KAI_POD[..3].to_vec();
        unlimited
            .extend([("CUDA_DEVICE_SM_LIMIT", "50"), ("CUDA_DEVICE_MEMORY_SHARED_CACHE", "/tmp/x.cache")]);
        refused_because(&find(&kai(&unlimited)), "no CUDA_DEVICE_MEMORY_LIMIT");
        refused_because(&find(&kai(&[("POD_UID", ".."), ("CONTAINER_NAME", "main")])), "not a pod UID");
        // The webhook's variable alone marks the pod, wherever the library lies.
        let elsewhere =
            Fake { env: KAI_POD[2..3].to_vec(), library: Some("/opt/libvgpu.so"), ..Fake::default() };
        refused_because(&find(&elsewhere), "POD_UID is not set");
    }

    #[test]
    fn node_file_lines_and_mountinfo_escapes() {
        let vars = parse_node_file(
            "# budgets\n CUDA_DEVICE_MEMORY_LIMIT = 4g \n\nnonsense\nCUDA_DEVICE_SM_LIMIT=30\n",
        );
        assert_eq!(vars, owned(&[("CUDA_DEVICE_MEMORY_LIMIT", "4g"), ("CUDA_DEVICE_SM_LIMIT", "30")]));
        assert_eq!(unescape_mountinfo(br"/a\040b/lib.so"), b"/a b/lib.so");
        assert_eq!(unescape_mountinfo(br"/plain\09"), br"/plain\09");
    }
}
