//! Identity of the simulated devices (UUID, name) and how CUDA ordinals map onto them.

use crate::config::{Config, CudaOrder};

/// The SMs of every fake device, as on an H100 (`CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT`).
pub const MULTIPROCESSORS: u32 = 132;

/// The 16-byte UUID physical device `index` has unless `FAKEGPU_UUIDS` names one: fixed bytes with the
/// index in the last byte.
pub fn default_uuid(index: usize) -> [u8; 16] {
    let mut bytes = [0xfa, 0xce, 0, 0, 0, 0, 0x4e, 0, 0x80, 0, 0, 0, 0, 0, 0, 0];
    bytes[15] = index as u8;
    bytes
}

/// The UUID of every physical device, in physical order: `FAKEGPU_UUIDS`' entries, then the defaults.
pub fn uuids(config: &Config) -> Vec<[u8; 16]> {
    (0..config.device_count)
        .map(|i| config.uuids.get(i).copied().unwrap_or_else(|| default_uuid(i)))
        .collect()
}

/// NVML's spelling of a UUID: `GPU-` and lowercase hex in 8-4-4-4-12 groups (40 characters).
pub fn uuid_string(uuid: &[u8; 16]) -> String {
    let mut text = String::from("GPU");
    for (i, byte) in uuid.iter().enumerate() {
        if matches!(i, 0 | 4 | 6 | 8 | 10) {
            text.push('-');
        }
        text.push_str(&format!("{byte:02x}"));
    }
    text
}

/// The PCI address `(domain, bus, device)` of physical device `index`: domain 0, bus `index + 1` (so no
/// device sits on bus 0, the host bridge's on a real machine), device 0: distinct per device and stable,
/// whatever `CUDA_VISIBLE_DEVICES` does to the ordinals.
pub fn pci_address(index: usize) -> (u32, u32, u32) {
    (0, u32::try_from(index).map_or(u32::MAX, |i| i.saturating_add(1)), 0)
}

pub fn name(index: usize) -> String {
    format!("Fake GPU {index}")
}

/// CUDA ordinal → physical index, following `CUDA_VISIBLE_DEVICES` like the real driver: entries are
/// physical indices or (prefixes of) UUID strings, and the list ends at the first entry that names no
/// device, names one ambiguously, or repeats one.
pub fn cuda_ordinals(config: &Config) -> Vec<usize> {
    let count = config.device_count;
    let Some(list) = &config.visible_devices else {
        return match config.cuda_order {
            CudaOrder::Physical => (0..count).collect(),
            CudaOrder::Reverse => (0..count).rev().collect(),
        };
    };
    let names: Vec<String> = uuids(config).iter().map(uuid_string).collect();
    let mut ordinals = Vec::new();
    for entry in list.split(',').map(str::trim) {
        let found = if entry.starts_with(|c: char| c.is_ascii_digit()) {
            entry.parse::<usize>().ok().filter(|&i| i < count)
        } else {
            let matches: Vec<usize> = (names.iter().enumerate())
                .filter(|(_, name)| !entry.is_empty() && starts_with_ignore_case(name, entry))
                .map(|(i, _)| i)
                .collect();
            matches.first().copied().filter(|_| matches.len() == 1)
        };
        match found {
            Some(index) if !ordinals.contains(&index) => ordinals.push(index),
            _ => break,
        }
    }
    ordinals
}

fn starts_with_ignore_case(text: &str, prefix: &str) -> bool {
    text.len() >= prefix.len() && text.as_bytes()[..prefix.len()].eq_ignore_ascii_case(prefix.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ordinals(visible: Option<&str>, order: CudaOrder) -> Vec<usize> {
        ordinals_with(visible, order, Vec::new())
    }

    fn ordinals_with(visible: Option<&str>, order: CudaOrder, uuids: Vec<[u8; 16]>) -> Vec<usize> {
        cuda_ordinals(&Config {
            device_count: 4,
            memory: 1,
            context_memory: 0,
            green_context_memory: 0,
            module_memory: 0,
            context_delay: std::time::Duration::ZERO,
            nvml_hides_self: std::time::Duration::ZERO,
            shared_path: None,
            visible_devices: visible.map(String::from),
            cuda_order: order,
            preempt: false,
            uuids,
            copy_ns_per_mib: 1000,
            launch_host_ns: 0,
            mps: false,
            mps_thread_percent: None,
        })
    }

    #[test]
    fn uuid_format() {
        assert_eq!(uuid_string(&default_uuid(3)), "GPU-face0000-0000-4e00-8000-000000000003");
        assert_eq!(uuid_string(&default_uuid(15)).len(), 40);
        let lavapipe = [0x6d, 0x65, 0x73, 0x61, 0x32, 0x32, 0x2e, 0x33, 0x2e, 0x36, 0, 0, 0, 0, 0, 0];
        assert_eq!(uuid_string(&lavapipe), "GPU-6d657361-3232-2e33-2e36-000000000000");
    }

    #[test]
    fn visible_devices() {
        assert_eq!(ordinals(None, CudaOrder::Physical), [0, 1, 2, 3]);
        assert_eq!(ordinals(None, CudaOrder::Reverse), [3, 2, 1, 0]);
        assert_eq!(ordinals(Some("2,0"), CudaOrder::Reverse), [2, 0]);
        assert_eq!(ordinals(Some("1,7,0"), CudaOrder::Physical), [1]);
        assert_eq!(ordinals(Some("-1"), CudaOrder::Physical), []);
        assert_eq!(ordinals(Some(""), CudaOrder::Physical), []);
        assert_eq!(ordinals(Some("1,1"), CudaOrder::Physical), [1]);
        let full = "GPU-face0000-0000-4e00-8000-000000000002";
        assert_eq!(ordinals(Some(&format!("3, {full}")), CudaOrder::Physical), [3, 2]);
        assert_eq!(ordinals(Some("GPU-FACE0000-0000-4e00-8000-000000000001"), CudaOrder::Physical), [1]);
        assert_eq!(ordinals(Some("GPU-face,0"), CudaOrder::Physical), []);
    }

    #[test]
    fn visible_devices_by_configured_uuid() {
        let lavapipe = [0x6d, 0x65, 0x73, 0x61, 0x32, 0x32, 0x2e, 0x33, 0x2e, 0x36, 0, 0, 0, 0, 0, 0];
        let other = [0xab; 16];
        let uuids = vec![other, lavapipe];
        let visible = |list: &str| ordinals_with(Some(list), CudaOrder::Physical, uuids.clone());
        assert_eq!(visible("GPU-6d657361-3232-2e33-2e36-000000000000"), [1]);
        assert_eq!(visible("GPU-6D657361,GPU-abab,3"), [1, 0, 3]);
        // Devices 2 and 3 keep their defaults; device 1's default is gone.
        assert_eq!(visible("GPU-face0000-0000-4e00-8000-000000000002"), [2]);
        assert_eq!(visible("GPU-face0000-0000-4e00-8000-000000000001"), []);
    }
}
