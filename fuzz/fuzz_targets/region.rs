//! The region reader (`vgpu_ledger::inspect::from_bytes`) on region files a tenant may have
//! written: any bytes at any size give a snapshot or an error, never a panic, and a snapshot
//! keeps within the region's bounds (devices, leases, the slots behind them).
//!
//! A region is 2.1 MB, mostly zeros, so an input does not hold the file itself but describes it:
//!
//! ```text
//! u32 LE   size of the file (what fstat said); the reader gets min(size, region size) bytes
//! u64 LE   which leases' owners live: lease k lives when bit k % 64 is set
//! then     patches over an all-zero region: u32 LE offset (modulo the region size), u8 length,
//!          that many bytes
//! ```
//!
//! The seeds (`fuzz/seeds/region/`) are real regions written by libvgpu over the fake driver,
//! encoded so by `fuzz/encode-region`.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use vgpu_ledger::inspect::{InspectError, from_bytes};
use vgpu_ledger::region::layout::{FILE_SIZE, MAX_DEVICES, MAX_PROCESSES};

fuzz_target!(|input: &[u8]| {
    let Some((size, rest)) = input.split_first_chunk::<4>() else { return };
    let Some((alive, mut patches)) = rest.split_first_chunk::<8>() else { return };
    let size = u64::from(u32::from_le_bytes(*size));
    let alive = u64::from_le_bytes(*alive);
    let mut file = vec![0u8; FILE_SIZE];
    while let Some((offset, rest)) = patches.split_first_chunk::<4>() {
        let Some((&len, rest)) = rest.split_first() else { break };
        let len = usize::from(len).min(rest.len());
        let at = u32::from_le_bytes(*offset) as usize % FILE_SIZE;
        let end = (at + len).min(FILE_SIZE);
        file[at..end].copy_from_slice(&rest[..end - at]);
        patches = &rest[len..];
    }
    let read = (size as usize).min(FILE_SIZE);
    match from_bytes(Path::new("/fuzz.cache"), size, &file[..read], |k| alive & (1 << (k % 64)) != 0) {
        Ok(snapshot) => {
            assert!(snapshot.devices.len() <= MAX_DEVICES);
            assert!(snapshot.leases.len() <= MAX_PROCESSES);
            for lease in &snapshot.leases {
                assert!(lease.lease < MAX_PROCESSES);
                assert_eq!(lease.devices.len(), snapshot.devices.len());
                let _ = lease.bytes();
            }
            for device in &snapshot.devices {
                assert!(!device.uuid.chars().any(char::is_control), "{:?}", device.uuid);
            }
            let _ = snapshot.dead_leases().count();
        }
        Err(error) => {
            // Every error names the file and says something.
            let _ = error.kind();
            assert!(error.to_string().starts_with("/fuzz.cache: "));
            if let InspectError::Truncated { size: got, needed, .. } = error {
                assert!(got < needed);
            }
        }
    }
});
