//! The environment contract (DESIGN §6): memory and compute limits per device, and the log level.
//!
//! Read once, when libvgpu initialises. A value we cannot parse is reported and fails closed:
//! a bad memory limit gives the device a zero budget, a bad compute limit the smallest share
//! ([`MIN_SM_SHARE`]), never an unlimited one.

use std::fmt;

/// Devices a container may use (HAMi's region holds 16).
pub const MAX_DEVICES: usize = 16;

const MEMORY_LIMIT: &str = "CUDA_DEVICE_MEMORY_LIMIT";
const SM_LIMIT: &str = "CUDA_DEVICE_SM_LIMIT";
const SHARED_CACHE: &str = "CUDA_DEVICE_MEMORY_SHARED_CACHE";
const TASK_PRIORITY: &str = "CUDA_TASK_PRIORITY";
const CORE_POLICY: &str = "GPU_CORE_UTILIZATION_POLICY";
const LEDGER: &str = "LIBVGPU_LEDGER";
const LOG_LEVEL: &str = "LIBCUDA_LOG_LEVEL";

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
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::BadLimit { var, value } => write!(
                f,
                "{var}={value:?} is not a memory size (bytes, or a number with k/m/g/t, \
                 Ki/Mi/Gi/Ti or KiB/MiB/GiB/TiB); failing closed with a zero budget"
            ),
            ConfigError::BadSmLimit { var, value } => write!(
                f,
                "{var}={value:?} is not a percentage from 0 to 100; failing closed with a \
                 {MIN_SM_SHARE} % compute share"
            ),
            ConfigError::BadCorePolicy { value } => {
                write!(f, "{CORE_POLICY}={value:?} is not default, force or disable; using default")
            }
            ConfigError::DeviceOutOfRange { var } => {
                write!(f, "{var} names a device past the {MAX_DEVICES} supported; ignored")
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
    pub log_level: tracing::Level,
    pub problems: Vec<ConfigError>,
}

impl Config {
    /// Reads the process environment.
    pub fn from_env() -> Config {
        Config::from_vars(
            std::env::vars_os().filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?))),
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
            log_level: tracing::Level::WARN,
            problems: Vec::new(),
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
                    Err(_) => {}
                }
            } else if name == LOG_LEVEL {
                config.log_level = log_level(&value);
            } else if name == SHARED_CACHE && !value.is_empty() {
                config.shared_cache = value.into();
            } else if name == LEDGER {
                config.local_ledger = value == "local";
            } else if name == TASK_PRIORITY {
                config.task_priority = value.trim().parse().unwrap_or(0);
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
                    Err(_) => {}
                }
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
        match value.trim().parse::<u64>() {
            Ok(percent) if percent <= 100 => percent,
            _ => {
                self.problems.push(ConfigError::BadSmLimit { var: var.to_owned(), value: value.to_owned() });
                MIN_SM_SHARE
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

    /// Whether any device has a compute share; when none has, launches are not hooked at all.
    pub fn any_compute_limit(&self) -> bool {
        (0..MAX_DEVICES).any(|device| self.sm_share(device).is_some())
    }

    /// The budget of CUDA ordinal `device`, or `None` when it is unlimited.
    pub fn memory_limit(&self, device: usize) -> Option<u64> {
        match self.memory.get(device) {
            Some(Limit::Bytes(bytes)) => Some(*bytes),
            _ => None,
        }
    }

    /// Whether any device has a budget; when none has, every memory hook is a pass-through.
    pub fn any_memory_limit(&self) -> bool {
        self.memory.iter().any(|limit| matches!(limit, Limit::Bytes(_)))
    }
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

/// `LIBCUDA_LOG_LEVEL`: 0 errors, 1–2 warnings (default), 3 info, 4 and up debug.
fn log_level(value: &str) -> tracing::Level {
    match value.trim().parse::<u32>() {
        Ok(0) => tracing::Level::ERROR,
        Ok(3) => tracing::Level::INFO,
        Ok(n) if n >= 4 => tracing::Level::DEBUG,
        _ => tracing::Level::WARN,
    }
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
        assert_eq!(config(&[("LIBCUDA_LOG_LEVEL", "4")]).log_level, tracing::Level::DEBUG);
        assert_eq!(config(&[]).log_level, tracing::Level::WARN);
    }
}
