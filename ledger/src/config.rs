//! The environment contract (docs/architecture.md, "Environment and logging"): memory and compute
//! limits per device, the region file, the log level and HAMi's knobs.
//!
//! Read once, when a library initialises. Every problem is collected in [`Config::problems`] for
//! the caller to log once: a value we cannot parse, and a variable that looks like one of ours but
//! is not (`CUDA_DEVICE_MEMORY_LIMIT_abc`, a misspelt `LIBVGPU_LEDGR`). A limit we cannot parse
//! fails closed: a bad memory limit gives the device a zero budget, a bad compute limit the
//! smallest share ([`MIN_SM_SHARE`]), never an unlimited one.

use std::fmt;

use crate::logging::Size;

/// Devices a container may use (HAMi's region holds 16).
pub const MAX_DEVICES: usize = 16;

const MEMORY_LIMIT: &str = "CUDA_DEVICE_MEMORY_LIMIT";
const SM_LIMIT: &str = "CUDA_DEVICE_SM_LIMIT";
const SHARED_CACHE: &str = "CUDA_DEVICE_MEMORY_SHARED_CACHE";
const TASK_PRIORITY: &str = "CUDA_TASK_PRIORITY";
const CORE_POLICY: &str = "GPU_CORE_UTILIZATION_POLICY";
const LEDGER: &str = "LIBVGPU_LEDGER";
const LOG_LEVEL: &str = "LIBCUDA_LOG_LEVEL";
/// HAMi's device plugin sets it to `true` when it advertises more memory than the card has
/// (`deviceMemoryScaling` above 1): see [`parse_switch`] for the spellings that count.
const OVERSUBSCRIBE: &str = "CUDA_OVERSUBSCRIBE";
/// Read by the Vulkan layer (a test fault point) and by the Vulkan loader (the layer manifest's
/// `disable_environment`), libvgpu's overcommit tuning knob (hooks/overcommit.rs) and the swap's
/// cap on memory pinned ahead and patience for room (hooks/swap/host.rs); listed so that they are
/// not reported as unknown.
const OTHER_KNOWN: [&str; 5] = [
    "LIBVGPU_VK_FAULT",
    "LIBVGPU_VULKAN_DISABLE",
    "LIBVGPU_PREFETCH_IDLE_MS",
    "LIBVGPU_SWAP_PIN",
    "LIBVGPU_SWAP_PATIENCE_MS",
];
/// A variable that starts with one of these and is none of ours is most likely a misspelt one.
const OUR_PREFIXES: [&str; 6] =
    ["CUDA_DEVICE_MEMORY_", "CUDA_DEVICE_SM_", "CUDA_TASK_", "GPU_CORE_", "LIBCUDA_", "LIBVGPU_"];

/// Where the container's shared region lives unless `CUDA_DEVICE_MEMORY_SHARED_CACHE` says.
pub const DEFAULT_SHARED_CACHE: &str = "/tmp/cudevshr.cache";

/// The memory budget of one device, by CUDA ordinal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Limit {
    /// No variable set, or the value 0 (HAMi's "no limit").
    Unlimited,
    /// At most this many bytes.
    Bytes(u64),
}

/// The share a bad `CUDA_DEVICE_SM_LIMIT` value fails closed to, in percent.
pub const MIN_SM_SHARE: u64 = 1;

/// `GPU_CORE_UTILIZATION_POLICY`: when a compute limit is enforced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CorePolicy {
    /// Enforce while the monitor's `utilization_switch` is on (it is on until a monitor says not).
    Default,
    /// Always enforce, whatever the monitor says.
    Force,
    /// Never enforce: launches pass straight through.
    Disable,
}

/// A configuration problem, logged once at start-up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConfigError {
    /// A memory limit that is not a size; the device gets a zero budget.
    BadLimit { var: String, value: String },
    /// A compute limit that is not a whole percentage from 0 to 100; the device gets
    /// [`MIN_SM_SHARE`].
    BadSmLimit { var: String, value: String },
    /// An unknown `GPU_CORE_UTILIZATION_POLICY`; the default policy applies.
    BadCorePolicy { value: String },
    /// A per-device variable for an ordinal we cannot hold; ignored.
    DeviceOutOfRange { var: String },
    /// A `LIBCUDA_LOG_LEVEL` that is not a whole number; the default level applies.
    BadLogLevel { value: String },
    /// A `CUDA_TASK_PRIORITY` that is not a whole number; 0 is stored.
    BadPriority { value: String },
    /// A `LIBVGPU_LEDGER` other than `local` or `shared`; the shared ledger is used.
    BadLedger { value: String },
    /// A variable named like ours that is none of ours; ignored.
    UnknownVariable { var: String },
    /// A `CUDA_OVERSUBSCRIBE` that is neither on nor off; overcommit stays off.
    BadOversubscribe { value: String },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::BadLimit { var, value } => {
                write!(f, "{var}={value:?} {NOT_A_SIZE}; failing closed with a zero budget")
            }
            ConfigError::BadSmLimit { var, value } => write!(
                f,
                "{var}={value:?} {NOT_A_SHARE}; failing closed with a \
                 {MIN_SM_SHARE} % compute share"
            ),
            ConfigError::BadCorePolicy { value } => {
                write!(f, "{CORE_POLICY}={value:?} is not default, force or disable; using default")
            }
            ConfigError::DeviceOutOfRange { var } => {
                write!(f, "{var} names a device past the {MAX_DEVICES} supported; ignored")
            }
            ConfigError::BadLogLevel { value } => write!(
                f,
                "{LOG_LEVEL}={value:?} is not a level (0 errors, 1-2 warnings, 3 info, 4 debug); \
                 logging warnings and errors"
            ),
            ConfigError::BadPriority { value } => {
                write!(f, "{TASK_PRIORITY}={value:?} is not a whole number; using priority 0")
            }
            ConfigError::BadLedger { value } => {
                write!(f, "{LEDGER}={value:?} is not local or shared; using the shared ledger")
            }
            ConfigError::BadOversubscribe { value } => write!(
                f,
                "{OVERSUBSCRIBE}={value:?} is not true or false (true, 1, yes, on / false, 0, no, off); \
                 memory overcommit stays off"
            ),
            ConfigError::UnknownVariable { var } => {
                let per_device = [MEMORY_LIMIT, SM_LIMIT].into_iter().find(|known| var.starts_with(known));
                match per_device {
                    Some(known) => write!(
                        f,
                        "{var} is not a libvgpu variable: a device's own limit is {known}_<N>, N its \
                         CUDA device number (0 to {}); ignored",
                        MAX_DEVICES - 1
                    ),
                    None => write!(
                        f,
                        "{var} is not a libvgpu variable (libvgpu reads {MEMORY_LIMIT}[_<N>], \
                         {SM_LIMIT}[_<N>], {SHARED_CACHE}, {CORE_POLICY}, {TASK_PRIORITY}, \
                         {LOG_LEVEL} and {LEDGER}); ignored"
                    ),
                }
            }
        }
    }
}

/// Everything libvgpu reads from the environment.
#[derive(Clone, Debug)]
pub struct Config {
    pub memory: [Limit; MAX_DEVICES],
    /// Compute share per device in percent as configured (0 or 100 = unlimited), stored in the
    /// region for HAMi.
    pub sm_limit: [u64; MAX_DEVICES],
    pub core_policy: CorePolicy,
    pub shared_cache: std::path::PathBuf,
    /// `LIBVGPU_LEDGER=local`: keep the ledger in this process only (benchmark baseline).
    pub local_ledger: bool,
    pub task_priority: i32,
    /// Whether `CUDA_TASK_PRIORITY` was set: launches then take part in HAMi's priority scheme
    /// (mark activity, wait while the monitor holds the container).
    pub task_priority_set: bool,
    /// `CUDA_OVERSUBSCRIBE` is on: a budgeted device's budget may exceed the card, and its
    /// linear allocations come back as managed memory that can spill to the host
    /// (docs/overcommit.md).
    pub overcommit: bool,
    pub log_level: tracing::Level,
    pub problems: Vec<ConfigError>,
    /// Why every budgeted call must be refused without touching any file (a container the node
    /// budgets, where no source names the budget: see `sources`).
    pub fail_closed: Option<String>,
    /// The folder the node mounted, when the region lies in a folder below it that other pods can
    /// write (KAI-Scheduler's layout): the region is opened from there without following a link
    /// (`region::confined`).
    pub region_below: Option<std::path::PathBuf>,
    /// What the container's region says, when it exists: it overrides the above.
    pub region: Option<RegionBudgets>,
}

/// The budgets a container's region holds, by region device index (not CUDA ordinal: the ledger
/// maps ordinals by UUID). Read before the library attaches, to know whether anything is
/// budgeted or paced at all.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RegionBudgets {
    /// HAMi's limit field: bytes, 0 for none.
    pub limits: [u64; MAX_DEVICES],
    /// Compute share in percent, 0 or 100 for none.
    pub shares: [u64; MAX_DEVICES],
    pub priority: i32,
    /// Some device of the region is overcommitted (`CUDA_OVERSUBSCRIBE` in the container).
    pub overcommit: bool,
}

impl Config {
    /// Reads the process environment.
    pub fn from_env() -> Config {
        // A value that is not UTF-8 is read with replacement characters, so that it is reported
        // (and a limit fails closed) rather than skipped as if it were unset.
        Config::from_vars(
            std::env::vars_os()
                .map(|(k, v)| (k.to_string_lossy().into_owned(), v.to_string_lossy().into_owned())),
        )
    }

    /// Builds the configuration from `(name, value)` pairs.
    pub fn from_vars(vars: impl IntoIterator<Item = (String, String)>) -> Config {
        let mut config = Config {
            memory: [Limit::Unlimited; MAX_DEVICES],
            sm_limit: [0; MAX_DEVICES],
            core_policy: CorePolicy::Default,
            shared_cache: DEFAULT_SHARED_CACHE.into(),
            local_ledger: false,
            task_priority: 0,
            task_priority_set: false,
            overcommit: false,
            log_level: tracing::Level::WARN,
            problems: Vec::new(),
            fail_closed: None,
            region_below: None,
            region: None,
        };
        let mut all_devices = None;
        let mut per_device = Vec::new();
        let mut sm_all = None;
        let mut sm_per_device = Vec::new();
        for (name, value) in vars {
            if name == MEMORY_LIMIT {
                all_devices = Some(config.parse_limit(&name, &value));
            } else if let Some(index) =
                name.strip_prefix(MEMORY_LIMIT).and_then(|rest| rest.strip_prefix('_'))
            {
                match index.parse::<usize>() {
                    Ok(index) if index < MAX_DEVICES => {
                        per_device.push((index, config.parse_limit(&name, &value)))
                    }
                    Ok(_) => config.problems.push(ConfigError::DeviceOutOfRange { var: name }),
                    Err(_) => config.problems.push(ConfigError::UnknownVariable { var: name }),
                }
            } else if name == LOG_LEVEL {
                config.log_level = config.parse_log_level(&value);
            } else if name == SHARED_CACHE {
                if !value.is_empty() {
                    config.shared_cache = value.into();
                }
            } else if name == LEDGER {
                config.local_ledger = config.parse_ledger(&value);
            } else if name == TASK_PRIORITY {
                config.task_priority = config.parse_priority(&value);
                config.task_priority_set = !value.trim().is_empty();
            } else if name == OVERSUBSCRIBE {
                match parse_switch(&value) {
                    Some(on) => config.overcommit = on,
                    None => config.problems.push(ConfigError::BadOversubscribe { value }),
                }
            } else if name == CORE_POLICY {
                config.core_policy = config.parse_policy(&value);
            } else if name == SM_LIMIT {
                sm_all = Some(config.parse_share(&name, &value));
            } else if let Some(index) = name.strip_prefix(SM_LIMIT).and_then(|rest| rest.strip_prefix('_')) {
                match index.parse::<usize>() {
                    Ok(index) if index < MAX_DEVICES => {
                        sm_per_device.push((index, config.parse_share(&name, &value)))
                    }
                    Ok(_) => config.problems.push(ConfigError::DeviceOutOfRange { var: name }),
                    Err(_) => config.problems.push(ConfigError::UnknownVariable { var: name }),
                }
            } else if OUR_PREFIXES.iter().any(|prefix| name.starts_with(prefix))
                && !OTHER_KNOWN.contains(&name.as_str())
            {
                config.problems.push(ConfigError::UnknownVariable { var: name });
            }
        }
        if let Some(percent) = sm_all {
            config.sm_limit = [percent; MAX_DEVICES];
        }
        for (index, percent) in sm_per_device {
            config.sm_limit[index] = percent;
        }
        if let Some(limit) = all_devices {
            config.memory = [limit; MAX_DEVICES];
        }
        for (index, limit) in per_device {
            config.memory[index] = limit;
        }
        config
    }

    fn parse_limit(&mut self, var: &str, value: &str) -> Limit {
        match parse_size(value) {
            Some(0) => Limit::Unlimited,
            Some(bytes) => Limit::Bytes(bytes),
            None => {
                self.problems.push(ConfigError::BadLimit { var: var.to_owned(), value: value.to_owned() });
                Limit::Bytes(0)
            }
        }
    }

    fn parse_share(&mut self, var: &str, value: &str) -> u64 {
        match parse_share(value) {
            Some(percent) => percent,
            None => {
                self.problems.push(ConfigError::BadSmLimit { var: var.to_owned(), value: value.to_owned() });
                MIN_SM_SHARE
            }
        }
    }

    /// `LIBCUDA_LOG_LEVEL`: 0 errors, 1–2 warnings, 3 info, 4 and up debug; empty is the default.
    fn parse_log_level(&mut self, value: &str) -> tracing::Level {
        match value.trim().parse::<u32>() {
            Ok(0) => tracing::Level::ERROR,
            Ok(3) => tracing::Level::INFO,
            Ok(n) if n >= 4 => tracing::Level::DEBUG,
            Ok(_) => tracing::Level::WARN,
            Err(_) if value.trim().is_empty() => tracing::Level::WARN,
            Err(_) => {
                self.problems.push(ConfigError::BadLogLevel { value: value.to_owned() });
                tracing::Level::WARN
            }
        }
    }

    /// `CUDA_TASK_PRIORITY`: a whole number, stored for HAMi's monitor; empty is 0.
    fn parse_priority(&mut self, value: &str) -> i32 {
        match value.trim().parse() {
            Ok(priority) => priority,
            Err(_) if value.trim().is_empty() => 0,
            Err(_) => {
                self.problems.push(ConfigError::BadPriority { value: value.to_owned() });
                0
            }
        }
    }

    /// `LIBVGPU_LEDGER`: whether the ledger is local to this process.
    fn parse_ledger(&mut self, value: &str) -> bool {
        match value.trim() {
            "local" => true,
            "" | "shared" => false,
            _ => {
                self.problems.push(ConfigError::BadLedger { value: value.to_owned() });
                false
            }
        }
    }

    fn parse_policy(&mut self, value: &str) -> CorePolicy {
        match value.trim().to_ascii_lowercase().as_str() {
            "" | "default" => CorePolicy::Default,
            "force" => CorePolicy::Force,
            "disable" => CorePolicy::Disable,
            _ => {
                self.problems.push(ConfigError::BadCorePolicy { value: value.to_owned() });
                CorePolicy::Default
            }
        }
    }

    /// The compute share of CUDA ordinal `device` in percent, or `None` when it is unlimited
    /// (0, 100, or the policy disables compute limits).
    pub fn sm_share(&self, device: usize) -> Option<u64> {
        let percent = *self.sm_limit.get(device)?;
        (self.core_policy != CorePolicy::Disable && percent != 0 && percent < 100).then_some(percent)
    }

    /// Whether any device has a compute share, by this configuration or by the container's
    /// region; when none has, launches are not hooked at all.
    pub fn any_compute_limit(&self) -> bool {
        let in_region = self.region.is_some_and(|region| region.shares.iter().any(|&p| p != 0 && p < 100));
        self.core_policy != CorePolicy::Disable
            && (in_region || (0..MAX_DEVICES).any(|device| self.sm_share(device).is_some()))
    }

    /// Whether launches take part in HAMi's priority scheme: a priority set here, or one the
    /// container's region holds.
    pub fn has_priority(&self) -> bool {
        self.task_priority_set || self.region.is_some_and(|region| region.priority != 0)
    }

    /// The budget of CUDA ordinal `device`, or `None` when it is unlimited.
    pub fn memory_limit(&self, device: usize) -> Option<u64> {
        match self.memory.get(device) {
            Some(Limit::Bytes(bytes)) => Some(*bytes),
            _ => None,
        }
    }

    /// Whether memory overcommit may apply to this process: its container's variable, or a region
    /// that records it for a process started without it.
    pub fn may_overcommit(&self) -> bool {
        self.overcommit || self.region.is_some_and(|region| region.overcommit)
    }

    /// Whether any device has a budget, by this configuration or by the container's region; when
    /// none has, every memory hook is a pass-through.
    pub fn any_memory_limit(&self) -> bool {
        self.fail_closed.is_some()
            || self.region.is_some_and(|region| region.limits.iter().any(|&limit| limit != 0))
            || self.memory.iter().any(|limit| matches!(limit, Limit::Bytes(_)))
    }

    /// What this configuration asks for, in one line for the start-up log.
    pub fn summary(&self) -> String {
        let budgets = per_device(std::array::from_fn(|d| self.memory_limit(d).map(|b| Size(b).to_string())));
        let shares = per_device(std::array::from_fn(|d| self.sm_share(d).map(|p| format!("{p} %"))));
        let ledger = if self.local_ledger { " (not used: LIBVGPU_LEDGER=local)" } else { "" };
        let overcommit = if self.overcommit { "; memory overcommit on (CUDA_OVERSUBSCRIBE)" } else { "" };
        format!(
            "region file {}{ledger}; memory budgets: {budgets}; compute shares: {shares}; core policy {:?}; \
             task priority {}{overcommit}",
            self.shared_cache.display(),
            self.core_policy,
            self.task_priority
        )
    }
}

/// "1 GiB on every device", "device 0 1 GiB, device 2 4 GiB, none on the others" or "none".
fn per_device(values: [Option<String>; MAX_DEVICES]) -> String {
    if values.iter().all(|value| *value == values[0]) {
        return values[0]
            .as_ref()
            .map_or_else(|| "none".to_owned(), |value| format!("{value} on every device"));
    }
    let set: Vec<String> = values
        .iter()
        .enumerate()
        .filter_map(|(device, value)| Some(format!("device {device} {}", value.as_ref()?)))
        .collect();
    let rest = if set.len() < MAX_DEVICES { ", none on the others" } else { "" };
    format!("{}{rest}", set.join(", "))
}

/// How a value that is not a memory size is reported (by the environment and by `vgpu-smi resize`).
pub const NOT_A_SIZE: &str =
    "is not a memory size (bytes, or a number with k/m/g/t, Ki/Mi/Gi/Ti or KiB/MiB/GiB/TiB)";
/// How a value that is not a compute share is reported.
pub const NOT_A_SHARE: &str = "is not a percentage from 0 to 100";

/// A yes/no switch such as `CUDA_OVERSUBSCRIBE`: `true`, `1`, `yes`, `on` (HAMi's device plugin
/// writes `true`) or `false`, `0`, `no`, `off` and empty, any case, spaces around ignored;
/// anything else is `None`.
pub fn parse_switch(text: &str) -> Option<bool> {
    match text.trim().to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Some(true),
        "false" | "0" | "no" | "off" | "" => Some(false),
        _ => None,
    }
}

/// `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`: how much of each device's SMs MPS lets a client use.
pub const MPS_THREAD_PERCENTAGE: &str = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE";

/// This process's `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` when it caps anything (above 0, below 100):
/// as written, and its value. It is the tenant's, not part of libvgpu's contract: libvgpu only
/// says how it goes with a compute share (docs/compute-limit.md, "MPS nodes").
pub fn mps_thread_percentage() -> Option<(String, f64)> {
    let value = std::env::var(MPS_THREAD_PERCENTAGE).ok()?;
    let percent: f64 = value.trim().parse().ok()?;
    (percent > 0.0 && percent < 100.0).then_some((value, percent))
}

/// Parses a compute share: a whole percentage from 0 to 100.
pub fn parse_share(text: &str) -> Option<u64> {
    text.trim().parse::<u64>().ok().filter(|&percent| percent <= 100)
}

/// Parses a memory size: plain bytes, or a whole number with a binary unit
/// (`k`/`m`/`g`/`t`, `Ki`…`Ti`, `KiB`…`TiB`, any case). `None` for anything else or on overflow.
pub fn parse_size(text: &str) -> Option<u64> {
    let text = text.trim();
    let digits = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    if digits == 0 {
        return None;
    }
    let number: u64 = text[..digits].parse().ok()?;
    let unit = text[digits..].to_ascii_lowercase();
    let shift = match unit.as_str() {
        "" => 0,
        "k" | "ki" | "kib" => 10,
        "m" | "mi" | "mib" => 20,
        "g" | "gi" | "gib" => 30,
        "t" | "ti" | "tib" => 40,
        _ => return None,
    };
    number.checked_mul(1u64 << shift)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(vars: &[(&str, &str)]) -> Config {
        Config::from_vars(vars.iter().map(|(k, v)| (k.to_string(), v.to_string())))
    }

    #[test]
    fn sizes_in_every_documented_unit() {
        assert_eq!(parse_size("1048576"), Some(1 << 20));
        assert_eq!(parse_size("4000m"), Some(4000 << 20));
        assert_eq!(parse_size("4g"), Some(4 << 30));
        assert_eq!(parse_size("4G"), Some(4 << 30));
        assert_eq!(parse_size("4Gi"), Some(4 << 30));
        assert_eq!(parse_size("4GiB"), Some(4 << 30));
        assert_eq!(parse_size("4gib"), Some(4 << 30));
        assert_eq!(parse_size("512KiB"), Some(512 << 10));
        assert_eq!(parse_size("2t"), Some(2 << 40));
        assert_eq!(parse_size(" 8g "), Some(8 << 30));
    }

    #[test]
    fn malformed_sizes_are_refused() {
        for bad in ["", "g", "-1g", "1.5g", "4gb", "4 g", "four", "99999999999999999999", "16777216t"] {
            assert_eq!(parse_size(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn per_device_variable_overrides_the_global_one() {
        let c = config(&[("CUDA_DEVICE_MEMORY_LIMIT_1", "2g"), ("CUDA_DEVICE_MEMORY_LIMIT", "1g")]);
        assert_eq!(c.memory_limit(0), Some(1 << 30));
        assert_eq!(c.memory_limit(1), Some(2 << 30));
        assert_eq!(c.memory_limit(15), Some(1 << 30));
        assert!(c.problems.is_empty());
    }

    #[test]
    fn no_variables_means_no_limits() {
        let c = config(&[]);
        assert!(!c.any_memory_limit());
        assert_eq!(c.memory_limit(0), None);
    }

    #[test]
    fn zero_means_unlimited() {
        let c = config(&[("CUDA_DEVICE_MEMORY_LIMIT_0", "0")]);
        assert_eq!(c.memory[0], Limit::Unlimited);
    }

    #[test]
    fn bad_value_fails_closed_and_is_reported() {
        let c = config(&[("CUDA_DEVICE_MEMORY_LIMIT_0", "lots"), ("CUDA_DEVICE_MEMORY_LIMIT_1", "1g")]);
        assert_eq!(c.memory_limit(0), Some(0));
        assert_eq!(c.memory_limit(1), Some(1 << 30));
        assert_eq!(c.memory[2], Limit::Unlimited);
        assert_eq!(
            c.problems,
            vec![ConfigError::BadLimit { var: "CUDA_DEVICE_MEMORY_LIMIT_0".into(), value: "lots".into() }]
        );
    }

    #[test]
    fn device_past_the_table_is_reported() {
        let c = config(&[("CUDA_DEVICE_MEMORY_LIMIT_16", "1g")]);
        assert_eq!(
            c.problems,
            vec![ConfigError::DeviceOutOfRange { var: "CUDA_DEVICE_MEMORY_LIMIT_16".into() }]
        );
    }

    #[test]
    fn compute_shares_follow_the_memory_rules() {
        let c = config(&[("CUDA_DEVICE_SM_LIMIT", "30"), ("CUDA_DEVICE_SM_LIMIT_1", "100")]);
        assert_eq!(c.sm_share(0), Some(30));
        assert_eq!(c.sm_share(1), None);
        assert_eq!(c.sm_share(15), Some(30));
        assert!(c.any_compute_limit());
        assert!(!config(&[("CUDA_DEVICE_SM_LIMIT", "0")]).any_compute_limit());
        assert!(!config(&[]).any_compute_limit());
    }

    #[test]
    fn bad_compute_limit_fails_closed_to_the_smallest_share() {
        for bad in ["lots", "-5", "101", "12.5", ""] {
            let c = config(&[("CUDA_DEVICE_SM_LIMIT_0", bad)]);
            assert_eq!(c.sm_share(0), Some(MIN_SM_SHARE), "{bad:?}");
            assert_eq!(
                c.problems,
                vec![ConfigError::BadSmLimit { var: "CUDA_DEVICE_SM_LIMIT_0".into(), value: bad.into() }]
            );
        }
    }

    #[test]
    fn core_policy() {
        let disabled = config(&[("CUDA_DEVICE_SM_LIMIT", "30"), ("GPU_CORE_UTILIZATION_POLICY", "disable")]);
        assert_eq!(disabled.sm_share(0), None);
        assert!(!disabled.any_compute_limit());
        assert_eq!(config(&[("GPU_CORE_UTILIZATION_POLICY", "FORCE")]).core_policy, CorePolicy::Force);
        let odd = config(&[("GPU_CORE_UTILIZATION_POLICY", "sometimes")]);
        assert_eq!(odd.core_policy, CorePolicy::Default);
        assert_eq!(odd.problems, vec![ConfigError::BadCorePolicy { value: "sometimes".into() }]);
    }

    #[test]
    fn log_levels() {
        assert_eq!(config(&[("LIBCUDA_LOG_LEVEL", "0")]).log_level, tracing::Level::ERROR);
        assert_eq!(config(&[("LIBCUDA_LOG_LEVEL", "2")]).log_level, tracing::Level::WARN);
        assert_eq!(config(&[("LIBCUDA_LOG_LEVEL", "3")]).log_level, tracing::Level::INFO);
        assert_eq!(config(&[("LIBCUDA_LOG_LEVEL", "4")]).log_level, tracing::Level::DEBUG);
        assert_eq!(config(&[]).log_level, tracing::Level::WARN);
        assert!(config(&[("LIBCUDA_LOG_LEVEL", "")]).problems.is_empty());
    }

    #[test]
    fn bad_log_level_is_reported_and_warnings_stay_on() {
        let c = config(&[("LIBCUDA_LOG_LEVEL", "verbose")]);
        assert_eq!(c.log_level, tracing::Level::WARN);
        assert_eq!(c.problems, vec![ConfigError::BadLogLevel { value: "verbose".into() }]);
    }

    #[test]
    fn bad_task_priority_is_reported_and_zero_is_stored() {
        let c = config(&[("CUDA_TASK_PRIORITY", "high")]);
        assert_eq!(c.task_priority, 0);
        assert_eq!(c.problems, vec![ConfigError::BadPriority { value: "high".into() }]);
        assert_eq!(config(&[("CUDA_TASK_PRIORITY", " -1 ")]).task_priority, -1);
    }

    #[test]
    fn bad_ledger_choice_is_reported_and_the_shared_ledger_used() {
        let c = config(&[("LIBVGPU_LEDGER", "locale")]);
        assert!(!c.local_ledger);
        assert_eq!(c.problems, vec![ConfigError::BadLedger { value: "locale".into() }]);
        assert!(config(&[("LIBVGPU_LEDGER", "local")]).local_ledger);
        assert!(config(&[("LIBVGPU_LEDGER", "shared")]).problems.is_empty());
    }

    #[test]
    fn per_device_variable_without_a_device_number_is_reported() {
        for var in ["CUDA_DEVICE_MEMORY_LIMIT_abc", "CUDA_DEVICE_MEMORY_LIMIT_", "CUDA_DEVICE_SM_LIMIT_x1"] {
            let c = config(&[(var, "1g")]);
            assert_eq!(c.problems, vec![ConfigError::UnknownVariable { var: var.into() }], "{var}");
            assert!(!c.any_memory_limit() && !c.any_compute_limit(), "{var}: ignored");
            assert!(c.problems[0].to_string().contains("_<N>"), "{}", c.problems[0]);
        }
    }

    #[test]
    fn misspelt_variables_are_reported() {
        for var in [
            "CUDA_DEVICE_MEMORY_LIMITS",
            "CUDA_DEVICE_MEMORY_SHARED_CACH",
            "CUDA_DEVICE_SM_LIMT",
            "CUDA_TASK_PRIORTY",
            "GPU_CORE_UTILISATION_POLICY",
            "LIBCUDA_LOGLEVEL",
            "LIBVGPU_LEDGR",
        ] {
            let c = config(&[(var, "1")]);
            assert_eq!(c.problems, vec![ConfigError::UnknownVariable { var: var.into() }], "{var}");
        }
    }

    #[test]
    fn summary_names_the_region_and_every_limit() {
        let c = config(&[
            ("CUDA_DEVICE_MEMORY_LIMIT_0", "1g"),
            ("CUDA_DEVICE_MEMORY_LIMIT_2", "512m"),
            ("CUDA_DEVICE_SM_LIMIT", "30"),
            ("CUDA_DEVICE_MEMORY_SHARED_CACHE", "/run/vgpu.cache"),
        ]);
        assert_eq!(
            c.summary(),
            "region file /run/vgpu.cache; memory budgets: device 0 1 GiB (1073741824 bytes), device 2 \
             512 MiB (536870912 bytes), none on the others; compute shares: 30 % on every device; core \
             policy Default; task priority 0"
        );
        assert!(config(&[]).summary().contains("memory budgets: none; compute shares: none"));
    }

    #[test]
    fn oversubscribe_spellings() {
        for on in ["true", "TRUE", " True ", "1", "yes", "on"] {
            let c = config(&[("CUDA_OVERSUBSCRIBE", on)]);
            assert!(c.overcommit, "{on:?}");
            assert!(c.problems.is_empty());
        }
        for off in ["false", "0", "no", "off", ""] {
            assert!(!config(&[("CUDA_OVERSUBSCRIBE", off)]).overcommit, "{off:?}");
        }
        assert!(!config(&[]).overcommit);
        let c = config(&[("CUDA_OVERSUBSCRIBE", "maybe")]);
        assert!(!c.overcommit);
        assert_eq!(c.problems, vec![ConfigError::BadOversubscribe { value: "maybe".into() }]);
        assert!(
            config(&[("CUDA_OVERSUBSCRIBE", "true")])
                .summary()
                .ends_with("overcommit on (CUDA_OVERSUBSCRIBE)")
        );
    }

    #[test]
    fn other_programs_variables_are_not_ours() {
        let c = config(&[
            ("CUDA_VISIBLE_DEVICES", "0"),
            ("CUDA_DEVICE_ORDER", "PCI_BUS_ID"),
            ("CUDA_DEVICE_MAX_CONNECTIONS", "1"),
            ("CUDA_MODULE_LOADING", "LAZY"),
            ("GPU_DEVICE_ORDINAL", "0"),
            ("LIBVGPU_VK_FAULT", "zero-uuid"),
            ("LIBVGPU_VULKAN_DISABLE", "1"),
            ("LIBVGPU_SWAP_PIN", "16g"),
            ("LIBVGPU_SWAP_PATIENCE_MS", "5000"),
            ("CUDA_DEVICE_MEMORY_SHARED_CACHE", "/tmp/x.cache"),
            ("GPU_CORE_UTILIZATION_POLICY", "force"),
        ]);
        assert!(c.problems.is_empty(), "{:?}", c.problems);
    }
}
