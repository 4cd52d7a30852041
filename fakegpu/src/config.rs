//! Reads the fake driver's configuration from the environment, once per process.

use std::ffi::OsString;
use std::fmt;
use std::path::PathBuf;

use crate::devices;

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

/// A copy of 1 GiB takes 1 ms: about an H100's device memory bandwidth.
const DEFAULT_COPY_NS_PER_MIB: u64 = 1000;

/// Everything the environment decides.
#[derive(Debug)]
pub struct Config {
    pub device_count: usize,
    pub memory: u64,
    /// Bytes each context costs on its device (`FAKEGPU_CONTEXT_MEMORY`).
    pub context_memory: u64,
    /// Device memory each loaded module or library takes that no allocation call returns
    /// (`FAKEGPU_MODULE_MEMORY`): the driver's own, as kernel code is on a real card.
    pub module_memory: u64,
    /// Bytes each green context costs (`FAKEGPU_GREEN_CONTEXT_MEMORY`; default: a context's).
    pub green_context_memory: u64,
    /// How long creating a context takes (a real one takes a few hundred milliseconds).
    pub context_delay: std::time::Duration,
    /// How long after the fake starts NVML's process lists name this process (before that, its
    /// record reads pid 0, as a driver that lists host pids shows it inside a container);
    /// `FAKEGPU_NVML_HIDES_SELF_MS`, `never` for ever.
    pub nvml_hides_self: std::time::Duration,
    pub shared_path: Option<PathBuf>,
    /// `CUDA_VISIBLE_DEVICES` verbatim; `None` when unset.
    pub visible_devices: Option<String>,
    pub cuda_order: CudaOrder,
    /// Processes time-slice each device, so work cuts in ahead of another process's queue
    /// (`FAKEGPU_PREEMPT=1`); else first come first served.
    pub preempt: bool,
    /// UUIDs given to the first physical devices, in physical order (`FAKEGPU_UUIDS`), so a test can
    /// pair a fake device with another API's device (a Vulkan ICD's `deviceUUID`); entries past
    /// `device_count` are ignored and devices past the list keep their default UUID.
    pub uuids: Vec<[u8; 16]>,
    /// Simulated nanoseconds a device-side copy or memset takes per MiB (`FAKEGPU_COPY_NS_PER_MIB`).
    pub copy_ns_per_mib: u64,
    /// Host nanoseconds a kernel or graph launch spends before its work is queued
    /// (`FAKEGPU_LAUNCH_HOST_NS`): a real driver's launch costs a few microseconds of CPU.
    pub launch_host_ns: u64,
    /// Contexts are shared through an MPS server (`FAKEGPU_MPS=1`): `CU_DEVICE_ATTRIBUTE_MPS_ENABLED`
    /// reads 1 and NVML lists the processes with contexts as MPS clients.
    pub mps: bool,
    /// Under MPS, the share of a device's SMs this process's contexts may use
    /// (`FAKEGPU_MPS_THREAD_PERCENTAGE`, else `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` as a real MPS
    /// client reads it); `None` when unset.
    pub mps_thread_percent: Option<u32>,
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
        let module_memory = match text("FAKEGPU_MODULE_MEMORY")? {
            None => 0,
            Some(value) => parse_bytes(&value)
                .ok_or_else(|| bad("FAKEGPU_MODULE_MEMORY", &value, "expected bytes, e.g. 0, 4096, 100m"))?,
        };
        let green_context_memory = match text("FAKEGPU_GREEN_CONTEXT_MEMORY")? {
            None => context_memory,
            Some(value) => parse_bytes(&value).ok_or_else(|| {
                bad("FAKEGPU_GREEN_CONTEXT_MEMORY", &value, "expected bytes, e.g. 0, 4096, 6m")
            })?,
        };
        let context_delay = match text("FAKEGPU_CONTEXT_DELAY_MS")? {
            None => 0,
            Some(value) => value.trim().parse::<u64>().map_err(|_| {
                bad("FAKEGPU_CONTEXT_DELAY_MS", &value, "expected milliseconds, e.g. 0 or 200")
            })?,
        };
        let nvml_hides_self = match text("FAKEGPU_NVML_HIDES_SELF_MS")?.as_deref().map(str::trim) {
            None => std::time::Duration::ZERO,
            Some("never") => std::time::Duration::MAX,
            Some(value) => std::time::Duration::from_millis(value.parse::<u64>().map_err(|_| {
                bad("FAKEGPU_NVML_HIDES_SELF_MS", value, "expected milliseconds or `never`, e.g. 500")
            })?),
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
        let mps = match text("FAKEGPU_MPS")?.as_deref() {
            None | Some("" | "0") => false,
            Some("1") => true,
            Some(other) => return Err(bad("FAKEGPU_MPS", other, "expected `1` or `0`")),
        };
        // FAKEGPU_MPS_THREAD_PERCENTAGE stands for a percentage the driver read before the program
        // changed its environment: it wins over the environment's.
        let mut mps_thread_percent = None;
        for var in ["FAKEGPU_MPS_THREAD_PERCENTAGE", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] {
            let Some(value) = text(var)? else { continue };
            match value.trim().parse::<u32>() {
                Ok(percent @ 1..=100) => mps_thread_percent = Some(percent),
                _ => return Err(bad(var, &value, "expected a whole percentage from 1 to 100")),
            }
            break;
        }
        let copy_ns_per_mib = match text("FAKEGPU_COPY_NS_PER_MIB")? {
            None => DEFAULT_COPY_NS_PER_MIB,
            Some(value) => value.trim().parse::<u64>().map_err(|_| {
                bad("FAKEGPU_COPY_NS_PER_MIB", &value, "expected nanoseconds per MiB, e.g. 1000")
            })?,
        };
        let launch_host_ns = match text("FAKEGPU_LAUNCH_HOST_NS")? {
            None => 0,
            Some(value) => value.trim().parse::<u64>().map_err(|_| {
                bad("FAKEGPU_LAUNCH_HOST_NS", &value, "expected nanoseconds, e.g. 0 or 15000")
            })?,
        };
        let uuids = match text("FAKEGPU_UUIDS")? {
            None => Vec::new(),
            Some(value) => {
                let uuids = parse_uuid_list(&value).ok_or_else(|| {
                    bad(
                        "FAKEGPU_UUIDS",
                        &value,
                        "expected comma-separated UUIDs of 8-4-4-4-12 hex digits, each optionally \
                         prefixed with GPU-, e.g. 6d657361-3232-2e33-2e36-000000000000",
                    )
                })?;
                // Two devices with one UUID would make CUDA_VISIBLE_DEVICES entries ambiguous and
                // UUID-based pairing meaningless, so a repeat (also of a default UUID still in use) is
                // refused.
                let effective: Vec<[u8; 16]> = (0..device_count.max(uuids.len()))
                    .map(|i| uuids.get(i).copied().unwrap_or_else(|| devices::default_uuid(i)))
                    .collect();
                if effective.iter().enumerate().any(|(i, uuid)| effective[..i].contains(uuid)) {
                    return Err(bad("FAKEGPU_UUIDS", &value, "two devices would have the same UUID"));
                }
                uuids
            }
        };
        Ok(Config {
            device_count,
            memory,
            context_memory,
            green_context_memory,
            module_memory,
            context_delay: std::time::Duration::from_millis(context_delay),
            nvml_hides_self,
            shared_path: get("FAKEGPU_SHARED").filter(|p| !p.is_empty()).map(PathBuf::from),
            visible_devices: text("CUDA_VISIBLE_DEVICES")?,
            cuda_order,
            preempt,
            uuids,
            copy_ns_per_mib,
            launch_host_ns,
            mps,
            mps_thread_percent,
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

/// Parses `FAKEGPU_UUIDS`: comma-separated UUIDs (see [`parse_uuid`]); empty or blank means none.
fn parse_uuid_list(text: &str) -> Option<Vec<[u8; 16]>> {
    if text.trim().is_empty() {
        return Some(Vec::new());
    }
    text.split(',').map(|entry| parse_uuid(entry.trim())).collect()
}

/// Parses one canonical UUID: 36 characters, hex digits (either case) in 8-4-4-4-12 groups, optionally
/// after `GPU-` (NVML's and `CUDA_VISIBLE_DEVICES`'s spelling, in any case).
pub fn parse_uuid(text: &str) -> Option<[u8; 16]> {
    let text = match text.get(..4) {
        Some(prefix) if prefix.eq_ignore_ascii_case("GPU-") => &text[4..],
        _ => text,
    };
    let chars = text.as_bytes();
    if chars.len() != 36 {
        return None;
    }
    let mut bytes = [0; 16];
    let mut nibble = 0;
    for (i, &c) in chars.iter().enumerate() {
        if matches!(i, 8 | 13 | 18 | 23) {
            if c != b'-' {
                return None;
            }
            continue;
        }
        let digit = char::from(c).to_digit(16)? as u8;
        // 36 characters less 4 dashes leave exactly 32 digits: `nibble` stays below 32.
        bytes[nibble / 2] |= digit << if nibble % 2 == 0 { 4 } else { 0 };
        nibble += 1;
    }
    Some(bytes)
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
        assert_eq!(config.copy_ns_per_mib, 1000);
        let copies = Config::from_lookup(|v| (v == "FAKEGPU_COPY_NS_PER_MIB").then(|| "250".into()));
        assert_eq!(copies.map(|c| c.copy_ns_per_mib).ok(), Some(250));
        assert!(Config::from_lookup(|v| (v == "FAKEGPU_COPY_NS_PER_MIB").then(|| "fast".into())).is_err());
        let hides = |value: &str| {
            Config::from_lookup(|v| (v == "FAKEGPU_NVML_HIDES_SELF_MS").then(|| value.into()))
                .map(|c| c.nvml_hides_self)
        };
        assert_eq!(config.nvml_hides_self, std::time::Duration::ZERO);
        assert_eq!(hides("1500").ok(), Some(std::time::Duration::from_millis(1500)));
        assert_eq!(hides("never").ok(), Some(std::time::Duration::MAX));
        assert!(hides("soon").is_err());
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

    #[test]
    fn uuids() {
        const LAVAPIPE: [u8; 16] =
            [0x6d, 0x65, 0x73, 0x61, 0x32, 0x32, 0x2e, 0x33, 0x2e, 0x36, 0, 0, 0, 0, 0, 0];
        assert_eq!(parse_uuid("6d657361-3232-2e33-2e36-000000000000"), Some(LAVAPIPE));
        assert_eq!(parse_uuid("GPU-6D657361-3232-2E33-2E36-000000000000"), Some(LAVAPIPE));
        assert_eq!(parse_uuid("gpu-6d657361-3232-2e33-2e36-000000000000"), Some(LAVAPIPE));
        let max = parse_uuid("ffffffff-ffff-ffff-ffff-ffffffffffff");
        assert_eq!(max, Some([0xff; 16]));
        for bad in [
            "",
            "GPU-",
            "6d657361-3232-2e33-2e36-00000000000",
            "6d657361-3232-2e33-2e36-0000000000000",
            "6d65736132322e332e36000000000000",
            "6d657361-3232-2e33-2e3600-0000000000",
            "6d657361-3232-2e33-2e36-00000000000g",
            "+d657361-3232-2e33-2e36-000000000000",
            "GPU6d657361-3232-2e33-2e36-000000000000",
            "MIG-6d657361-3232-2e33-2e36-000000000000",
            "6d657361-3232-2e33-2e36-00000000000é",
        ] {
            assert_eq!(parse_uuid(bad), None, "{bad:?}");
        }

        let uuids = |value: &str, devices: &str| {
            Config::from_lookup(|v| match v {
                "FAKEGPU_UUIDS" => Some(value.into()),
                "FAKEGPU_DEVICES" => Some(devices.into()),
                _ => None,
            })
            .map(|c| c.uuids)
        };
        let lavapipe = "6d657361-3232-2e33-2e36-000000000000";
        assert_eq!(Config::from_lookup(|_| None).map(|c| c.uuids).ok(), Some(vec![]));
        assert_eq!(uuids("", "2").ok(), Some(vec![]));
        assert_eq!(uuids(lavapipe, "2").ok(), Some(vec![LAVAPIPE]));
        let two = format!("GPU-{lavapipe}, ffffffff-ffff-ffff-ffff-ffffffffffff");
        assert_eq!(uuids(&two, "1").ok(), Some(vec![LAVAPIPE, [0xff; 16]]), "more entries than devices");
        let trailing = format!("{lavapipe},");
        let err = uuids(&trailing, "2").expect_err("an empty entry");
        assert_eq!(err.to_string().split(':').next(), Some(&*format!("FAKEGPU_UUIDS={trailing:?}")));
        assert!(uuids("6d657361", "1").is_err());
        assert!(uuids(&format!("{lavapipe},{lavapipe}"), "1").is_err(), "a repeated entry");
        // Device 1 keeps its default UUID, which entry 0 may not take.
        let default1 = "GPU-face0000-0000-4e00-8000-000000000001";
        assert!(uuids(default1, "2").is_err());
        assert!(uuids(default1, "1").is_ok());
        assert!(uuids("face0000-0000-4e00-8000-000000000000", "2").is_ok(), "its own default");
    }
}
