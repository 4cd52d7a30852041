//! The environment contract (DESIGN §6): memory limits per device and the log level.
//!
//! Read once, when libvgpu initialises. A value we cannot parse is reported and fails closed:
//! the device gets a zero budget, never an unlimited one.

use std::fmt;

/// Devices a container may use (HAMi's region holds 16).
pub const MAX_DEVICES: usize = 16;

const MEMORY_LIMIT: &str = "CUDA_DEVICE_MEMORY_LIMIT";
const SM_LIMIT: &str = "CUDA_DEVICE_SM_LIMIT";
const SHARED_CACHE: &str = "CUDA_DEVICE_MEMORY_SHARED_CACHE";
const TASK_PRIORITY: &str = "CUDA_TASK_PRIORITY";
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

/// A configuration problem, logged once at start-up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConfigError {
    /// A memory limit that is not a size; the device gets a zero budget.
    BadLimit { var: String, value: String },
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
    /// Compute share per device in percent (0 = unlimited), stored in the region for HAMi.
    pub sm_limit: [u64; MAX_DEVICES],
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
            } else if name == SM_LIMIT {
                sm_all = value.trim().parse::<u64>().ok();
            } else if let Some(Ok(index)) =
                name.strip_prefix(SM_LIMIT).and_then(|r| r.strip_prefix('_')).map(str::parse::<usize>)
                && let (true, Ok(percent)) = (index < MAX_DEVICES, value.trim().parse::<u64>())
            {
                sm_per_device.push((index, percent));
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
    fn log_levels() {
        assert_eq!(config(&[("LIBCUDA_LOG_LEVEL", "0")]).log_level, tracing::Level::ERROR);
        assert_eq!(config(&[("LIBCUDA_LOG_LEVEL", "2")]).log_level, tracing::Level::WARN);
        assert_eq!(config(&[("LIBCUDA_LOG_LEVEL", "4")]).log_level, tracing::Level::DEBUG);
        assert_eq!(config(&[]).log_level, tracing::Level::WARN);
    }
}
