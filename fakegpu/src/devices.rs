//! Identity of the simulated devices (UUID, name) and how CUDA ordinals map onto them.

use crate::config::{Config, CudaOrder};

/// The 16-byte UUID of physical device `index`: fixed bytes with the index in the last byte.
pub fn uuid(index: usize) -> [u8; 16] {
    let mut bytes = [0xfa, 0xce, 0, 0, 0, 0, 0x4e, 0, 0x80, 0, 0, 0, 0, 0, 0, 0];
    bytes[15] = index as u8;
    bytes
}

/// NVML's spelling of the UUID: `GPU-` and lowercase hex in 8-4-4-4-12 groups (40 characters).
pub fn uuid_string(index: usize) -> String {
    let mut text = String::from("GPU");
    for (i, byte) in uuid(index).iter().enumerate() {
        if matches!(i, 0 | 4 | 6 | 8 | 10) {
            text.push('-');
        }
        text.push_str(&format!("{byte:02x}"));
    }
    text
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
    let mut ordinals = Vec::new();
    for entry in list.split(',').map(str::trim) {
        let found = if entry.starts_with(|c: char| c.is_ascii_digit()) {
            entry.parse::<usize>().ok().filter(|&i| i < count)
        } else {
            let matches: Vec<usize> = (0..count)
                .filter(|&i| !entry.is_empty() && starts_with_ignore_case(&uuid_string(i), entry))
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
        cuda_ordinals(&Config {
            device_count: 4,
            memory: 1,
            context_memory: 0,
            context_delay: std::time::Duration::ZERO,
            shared_path: None,
            visible_devices: visible.map(String::from),
            cuda_order: order,
            preempt: false,
        })
    }

    #[test]
    fn uuid_format() {
        assert_eq!(uuid_string(3), "GPU-face0000-0000-4e00-8000-000000000003");
        assert_eq!(uuid_string(15).len(), 40);
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
}
