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

/// Which source gave the process its budget.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// The container's region file beside the loaded library.
    RegionBesideLibrary(PathBuf),
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
}

/// Whether `name` is a variable that decides a budget or where it lives.
fn decides(name: &str) -> bool {
    name == "CUDA_DEVICE_MEMORY_SHARED_CACHE"
        || name == "CUDA_DEVICE_MEMORY_LIMIT"
        || name.starts_with("CUDA_DEVICE_MEMORY_LIMIT_")
        || name == "CUDA_DEVICE_SM_LIMIT"
        || name.starts_with("CUDA_DEVICE_SM_LIMIT_")
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
                return Found { config, source: Source::RegionBesideLibrary(region.clone()), notes };
            }
            several => {
                let names: Vec<String> = several.iter().map(|p| p.display().to_string()).collect();
                let why = format!(
                    "{} holds several region files ({}); which one is this container's budget is not \
                     known, so allocations on every device are refused",
                    dir.display(),
                    names.join(", ")
                );
                return fail_closed(why, with_own_logging(Vec::new()), notes);
            }
        }
    }

    // 2. The container's first process.
    if let Some(init) = surroundings.init_environment() {
        let init = ours(init);
        if init.iter().any(|(name, _)| decides(name)) {
            let config = Config::from_vars(with_own_logging(init));
            return Found { config, source: Source::InitProcess, notes };
        }
    }

    // 3. The node's file.
    match surroundings.node_file() {
        Some(Ok(vars)) => {
            let config = Config::from_vars(with_own_logging(vars));
            return Found { config, source: Source::NodeFile(NODE_FILE.into()), notes };
        }
        Some(Err(why)) => notes.push(why),
        None => {}
    }

    // 4. This process's own environment.
    if environment.iter().any(|(name, _)| decides(name)) {
        return Found { config: Config::from_vars(environment), source: Source::Environment, notes };
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
        return fail_closed(why, with_own_logging(Vec::new()), notes);
    }
    let vars = if secure { Vec::new() } else { environment };
    Found { config: Config::from_vars(vars), source: Source::Nothing, notes }
}

fn fail_closed(why: String, vars: Vec<(String, String)>, notes: Vec<String>) -> Found {
    let mut config = Config::from_vars(vars);
    config.fail_closed = Some(why.clone());
    Found { config, source: Source::FailClosed(why), notes }
}

/// The budget of this process, for the library whose code holds `anchor`: [`find`] on the real
/// process, then what the region it names holds, when it exists.
pub fn for_this_process(anchor: *const c_void) -> Found {
    let mut found = find(&ThisProcess { anchor });
    if found.config.fail_closed.is_none() {
        found.config.region = crate::region::peek(&found.config.shared_cache);
    }
    found
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
        fn is_mount_point(&self, _path: &Path) -> bool {
            self.mounted
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
