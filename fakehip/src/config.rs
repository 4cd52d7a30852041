//! The fake runtime's configuration, read from the environment once per process. The device
//! variables are the fake CUDA driver's (`FAKEGPU_*`), so one test environment describes one
//! machine to both fakes.

use std::path::PathBuf;

/// Most physical devices the fake simulates (the fake CUDA driver's limit too).
pub const MAX_DEVICES: usize = 32;

const DEFAULT_MEMORY: u64 = 16 << 30;

/// The runtime version the fake reports by default: HIP 6.2.0, the first with `hipGetProcAddress`.
pub const DEFAULT_VERSION: i32 = 60_200_000;

/// Everything the environment decides.
#[derive(Debug)]
pub struct Config {
    /// Physical devices (`FAKEGPU_DEVICES`, default 1).
    pub device_count: usize,
    /// Bytes per device (`FAKEGPU_MEMORY`, default 16 GiB).
    pub memory: u64,
    /// UUID of each physical device: `FAKEGPU_UUIDS` entries, then the fake CUDA driver's defaults.
    pub uuids: Vec<[u8; 16]>,
    /// The fake CUDA driver's ledger file (`FAKEGPU_SHARED`): both fakes count one card there.
    pub shared_path: Option<PathBuf>,
    /// HIP ordinal → physical device, after `ROCR_VISIBLE_DEVICES` then `HIP_VISIBLE_DEVICES`.
    pub ordinals: Vec<usize>,
    /// What `hipRuntimeGetVersion` reports (`FAKEHIP_VERSION`), which also picks the ABI of
    /// `hipMemAllocationProp` (5.x or 6.x layout).
    pub version: i32,
    /// `FAKEHIP_INTERNAL_PLT=1`: `hipMalloc3D` allocates through the exported `hipMallocPitch`, as
    /// looked up by the dynamic linker (a preloaded library's first), the way the real runtime
    /// reaches some of its own exports through its PLT.
    pub internal_plt: bool,
    /// Simulated nanoseconds a device-side copy or memset takes per MiB
    /// (`FAKEGPU_COPY_NS_PER_MIB`, the fake CUDA driver's variable).
    pub copy_ns_per_mib: u64,
}

/// An environment variable the fake cannot use: reported once on stderr, then every call fails.
#[derive(Debug)]
pub struct BadVar {
    pub var: &'static str,
    pub value: String,
}

impl Config {
    pub fn from_env() -> Result<Config, BadVar> {
        let get = |var: &'static str| std::env::var(var).ok();
        let bad = |var: &'static str, value: &str| BadVar { var, value: value.to_owned() };
        let device_count = match get("FAKEGPU_DEVICES") {
            None => 1,
            Some(text) => match text.trim().parse::<usize>() {
                Ok(n) if n <= MAX_DEVICES => n,
                _ => return Err(bad("FAKEGPU_DEVICES", &text)),
            },
        };
        let memory = match get("FAKEGPU_MEMORY") {
            None => DEFAULT_MEMORY,
            Some(text) => parse_bytes(&text).ok_or_else(|| bad("FAKEGPU_MEMORY", &text))?,
        };
        let listed = match get("FAKEGPU_UUIDS") {
            None => Vec::new(),
            Some(text) if text.trim().is_empty() => Vec::new(),
            Some(text) => text
                .split(',')
                .map(|entry| parse_uuid(entry.trim()))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| bad("FAKEGPU_UUIDS", &text))?,
        };
        let uuids =
            (0..device_count).map(|i| listed.get(i).copied().unwrap_or_else(|| default_uuid(i))).collect();
        let version = match get("FAKEHIP_VERSION") {
            None => DEFAULT_VERSION,
            Some(text) => text.trim().parse().map_err(|_| bad("FAKEHIP_VERSION", &text))?,
        };
        let mut ordinals: Vec<usize> = (0..device_count).collect();
        // ROCr applies its list first, then HIP applies its own to what ROCr left.
        for var in ["ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"] {
            if let Some(list) = get(var) {
                ordinals = select(&ordinals, &list);
            }
        }
        Ok(Config {
            device_count,
            memory,
            uuids,
            shared_path: std::env::var_os("FAKEGPU_SHARED").filter(|p| !p.is_empty()).map(PathBuf::from),
            ordinals,
            version,
            internal_plt: get("FAKEHIP_INTERNAL_PLT").is_some_and(|value| value == "1"),
            copy_ns_per_mib: match get("FAKEGPU_COPY_NS_PER_MIB") {
                None => 1000,
                Some(text) => text.trim().parse().map_err(|_| bad("FAKEGPU_COPY_NS_PER_MIB", &text))?,
            },
        })
    }
}

/// The devices a `*_VISIBLE_DEVICES` list keeps, in its order: indices into `devices`; the list ends
/// at the first entry that is not one, or repeats one.
fn select(devices: &[usize], list: &str) -> Vec<usize> {
    let mut chosen = Vec::new();
    for entry in list.split(',') {
        match entry.trim().parse::<usize>().ok().and_then(|i| devices.get(i)) {
            Some(&device) if !chosen.contains(&device) => chosen.push(device),
            _ => break,
        }
    }
    chosen
}

/// The fake CUDA driver's default UUID of physical device `index`, so that by default device i of
/// both fakes is one card.
pub fn default_uuid(index: usize) -> [u8; 16] {
    let mut bytes = [0xfa, 0xce, 0, 0, 0, 0, 0x4e, 0, 0x80, 0, 0, 0, 0, 0, 0, 0];
    bytes[15] = index as u8;
    bytes
}

/// `123`, `4k`, `512M`, `16g`, `8Gi`, `8GiB`: binary multiples, any case.
pub fn parse_bytes(text: &str) -> Option<u64> {
    let text = text.trim();
    let end = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let number: u64 = text[..end].parse().ok()?;
    let unit = text[end..].trim().to_ascii_lowercase();
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

/// A UUID in 8-4-4-4-12 hex groups, optionally after `GPU-`.
pub fn parse_uuid(text: &str) -> Option<[u8; 16]> {
    let text = match text.get(..4) {
        Some(prefix) if prefix.eq_ignore_ascii_case("GPU-") => &text[4..],
        _ => text,
    };
    if text.len() != 36 {
        return None;
    }
    let hex: Vec<u8> = text.bytes().filter(|&b| b != b'-').collect();
    let groups_ok = text.split('-').map(str::len).eq([8, 4, 4, 4, 12]);
    if hex.len() != 32 || !groups_ok {
        return None;
    }
    let mut uuid = [0u8; 16];
    for (i, pair) in hex.chunks(2).enumerate() {
        uuid[i] = u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()?;
    }
    Some(uuid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn visible_lists_select_and_stop() {
        assert_eq!(select(&[0, 1, 2], "2,0"), vec![2, 0]);
        assert_eq!(select(&[0, 1, 2], "1,7,0"), vec![1]);
        assert_eq!(select(&[2, 0], "1"), vec![0]);
        assert_eq!(select(&[0, 1], ""), Vec::<usize>::new());
    }

    #[test]
    fn uuids_and_sizes_parse() {
        assert_eq!(parse_uuid("GPU-face0000-0000-4e00-8000-000000000003"), Some(default_uuid(3)));
        assert_eq!(parse_uuid("face0000-0000-4e00-8000-00000000000"), None);
        assert_eq!(parse_bytes("1g"), Some(1 << 30));
        assert_eq!(parse_bytes("8GiB"), Some(8 << 30));
        assert_eq!(parse_bytes("x"), None);
    }
}
