//! The environment contract (`vgpu_ledger::config::Config::from_vars`) on whatever a tenant puts
//! in a container's environment: the input is `NAME=VALUE` lines (any bytes, read as UTF-8 with
//! replacement characters, as `Config::from_env` reads them). Never a panic; every compute share
//! is a percentage; a value that does not parse is reported and fails closed.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vgpu_ledger::config::{Config, Limit, MAX_DEVICES};

fuzz_target!(|input: &[u8]| {
    let text = String::from_utf8_lossy(input);
    let vars: Vec<(String, String)> = text
        .split('\n')
        .filter_map(|line| line.split_once('='))
        .map(|(name, value)| (name.to_owned(), value.to_owned()))
        .collect();
    let config = Config::from_vars(vars.iter().cloned());
    for device in 0..MAX_DEVICES + 2 {
        if let Some(share) = config.sm_share(device) {
            assert!((1..100).contains(&share), "device {device}: share {share}");
        }
        if let Some(limit) = config.memory_limit(device) {
            assert!(device < MAX_DEVICES);
            let _ = limit;
        }
    }
    for (device, limit) in config.memory.iter().enumerate() {
        if let Limit::Bytes(0) = limit {
            // A zero budget comes only from a value that did not parse, which is reported.
            assert!(!config.problems.is_empty(), "device {device} fails closed unreported");
        }
    }
    let _ = config.summary();
    for problem in &config.problems {
        let _ = problem.to_string();
    }
});
