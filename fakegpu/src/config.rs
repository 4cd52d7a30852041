//! Reads the fake driver's configuration from the environment, once per process.

use std::ffi::OsString;
use std::fmt;
use std::path::PathBuf;

/// Most physical devices the fake simulates (and the slots in the shared ledger file).
pub const MAX_DEVICES: usize = 32;

const DEFAULT_MEMORY: u64 = 16 << 30;

/// How CUDA ordinals enumerate physical devices when `CUDA_VISIBLE_DEVICES` is unset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CudaOrder {
    /// Ordinal i is physical device i (NVML's order).
    Physical,
    /// Ordinal i is physical device n-1-i, like CUDA's FASTEST_FIRST order disagreeing with PCI order.
    Reverse,
}

/// Everything the environment decides.
#[derive(Debug)]
pub struct Config {
    pub device_count: usize,
    pub memory: u64,
    /// Bytes each context costs on its device (`FAKEGPU_CONTEXT_MEMORY`).
    pub context_memory: u64,
    /// How long creating a context takes (a real one takes a few hundred milliseconds).
    pub context_delay: std::time::Duration,
    pub shared_path: Option<PathBuf>,
    /// `CUDA_VISIBLE_DEVICES` verbatim; `None` when unset.
    pub visible_devices: Option<String>,
    pub cuda_order: CudaOrder,
    /// Processes time-slice each device, so work cuts in ahead of another process's queue
    /// (`FAKEGPU_PREEMPT=1`); else first come first served.
    pub preempt: bool,
}

/// An environment variable whose value we cannot use.
#[derive(Debug)]
pub struct BadVar {
    pub var: &'static str,
    pub value: String,
    pub reason: &'static str,
}

impl fmt::Display for BadVar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={:?}: {}", self.var, self.value, self.reason)
    }
}

impl Config {
    pub fn from_env() -> Result<Config, BadVar> {
        Config::from_lookup(|name| std::env::var_os(name))
    }

    fn from_lookup(get: impl Fn(&str) -> Option<OsString>) -> Result<Config, BadVar> {
        let text = |var: &'static str| -> Result<Option<String>, BadVar> {
            get(var)
                .map(|value| {
                    value.into_string().map_err(|value| BadVar {
                        var,
                        value: value.to_string_lossy().into_owned(),
                        reason: "not UTF-8",
                    })
                })
                .transpose()
        };
        let bad = |var, value: &str, reason| BadVar { var, value: value.to_owned(), reason };

        let device_count = match text("FAKEGPU_DEVICES")? {
            None => 1,
            Some(value) => match value.trim().parse::<usize>() {
                Ok(n) if n <= MAX_DEVICES => n,
                _ => {
                    return Err(bad("FAKEGPU_DEVICES", &value, "expected a number from 0 to 32"));
                }
            },
        };
        let memory = match text("FAKEGPU_MEMORY")? {
            None => DEFAULT_MEMORY,
            Some(value) => parse_bytes(&value)
                .ok_or_else(|| bad("FAKEGPU_MEMORY", &value, "expected bytes, e.g. 4096, 512m, 16GiB"))?,
        };
        let context_memory = match text("FAKEGPU_CONTEXT_MEMORY")? {
            None => 0,
            Some(value) => parse_bytes(&value)
                .ok_or_else(|| bad("FAKEGPU_CONTEXT_MEMORY", &value, "expected bytes, e.g. 0, 4096, 300m"))?,
        };
        let context_delay = match text("FAKEGPU_CONTEXT_DELAY_MS")? {
            None => 0,
            Some(value) => value.trim().parse::<u64>().map_err(|_| {
                bad("FAKEGPU_CONTEXT_DELAY_MS", &value, "expected milliseconds, e.g. 0 or 200")
            })?,
        };
        let cuda_order = match text("FAKEGPU_CUDA_ORDER")?.as_deref() {
            None | Some("" | "pci") => CudaOrder::Physical,
            Some("reverse") => CudaOrder::Reverse,
            Some(other) => {
                return Err(bad("FAKEGPU_CUDA_ORDER", other, "expected `reverse` or `pci`"));
            }
        };
        let preempt = match text("FAKEGPU_PREEMPT")?.as_deref() {
            None | Some("" | "0") => false,
            Some("1") => true,
            Some(other) => return Err(bad("FAKEGPU_PREEMPT", other, "expected `1` or `0`")),
        };
        Ok(Config {
            device_count,
            memory,
            context_memory,
            context_delay: std::time::Duration::from_millis(context_delay),
            shared_path: get("FAKEGPU_SHARED").filter(|p| !p.is_empty()).map(PathBuf::from),
            visible_devices: text("CUDA_VISIBLE_DEVICES")?,
            cuda_order,
            preempt,
        })
    }
}

/// Parses `123`, `4k`, `512M`, `16g`, `1t`, `8Gi`, `8GiB` (binary multiples, case-insensitive).
pub fn parse_bytes(text: &str) -> Option<u64> {
    let text = text.trim();
    let digits_end = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (digits, unit) = text.split_at(digits_end);
    let number: u64 = digits.parse().ok()?;
    let unit = unit.trim().to_ascii_lowercase();
    let unit = unit.strip_suffix('b').unwrap_or(&unit);
    let unit = unit.strip_suffix('i').unwrap_or(unit);
    let shift = match unit {
        "" => 0,
        "k" => 10,
        "m" => 20,
        "g" => 30,
        "t" => 40,
        _ => return None,
    };
    number.checked_mul(1 << shift)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_sizes() {
        assert_eq!(parse_bytes("4096"), Some(4096));
        assert_eq!(parse_bytes("16g"), Some(16 << 30));
        assert_eq!(parse_bytes("512M"), Some(512 << 20));
        assert_eq!(parse_bytes("8Gi"), Some(8 << 30));
        assert_eq!(parse_bytes("8GiB"), Some(8 << 30));
        assert_eq!(parse_bytes("2 KiB"), Some(2048));
        assert_eq!(parse_bytes("1t"), Some(1 << 40));
        assert_eq!(parse_bytes("1x"), None);
        assert_eq!(parse_bytes("g"), None);
        assert_eq!(parse_bytes("-1"), None);
        assert_eq!(parse_bytes("1bi"), None);
        assert_eq!(parse_bytes("3mb"), Some(3 << 20));
        assert_eq!(parse_bytes("99999999999t"), None);
    }

    #[test]
    fn defaults_and_errors() {
        let config = Config::from_lookup(|_| None).expect("defaults are valid");
        assert_eq!((config.device_count, config.memory, config.context_memory), (1, 16 << 30, 0));
        assert_eq!(config.cuda_order, CudaOrder::Physical);
        let err = Config::from_lookup(|v| (v == "FAKEGPU_DEVICES").then(|| "33".into()));
        assert!(err.is_err());
        let reverse = Config::from_lookup(|v| (v == "FAKEGPU_CUDA_ORDER").then(|| "reverse".into()));
        assert_eq!(reverse.map(|c| c.cuda_order).ok(), Some(CudaOrder::Reverse));
        let context = Config::from_lookup(|v| (v == "FAKEGPU_CONTEXT_MEMORY").then(|| "300m".into()));
        assert_eq!(context.map(|c| c.context_memory).ok(), Some(300 << 20));
        assert!(Config::from_lookup(|v| (v == "FAKEGPU_CONTEXT_MEMORY").then(|| "lots".into())).is_err());
    }

    #[test]
    fn preemption_is_opt_in() {
        let preempt = |value: Option<&str>| {
            Config::from_lookup(|v| value.filter(|_| v == "FAKEGPU_PREEMPT").map(OsString::from))
                .map(|c| c.preempt)
        };
        assert_eq!(preempt(None).ok(), Some(false));
        assert_eq!(preempt(Some("")).ok(), Some(false));
        assert_eq!(preempt(Some("0")).ok(), Some(false));
        assert_eq!(preempt(Some("1")).ok(), Some(true));
        assert!(preempt(Some("yes")).is_err());
    }
}
