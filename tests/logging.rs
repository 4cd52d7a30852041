//! What libvgpu writes to an application's stderr: every line tagged, each refused allocation
//! explained (at most one line a second, the rest counted), the set-up at debug level, and every
//! environment variable it cannot read reported once. Real client processes, as everywhere.

mod common;

use std::process::Command;

use common::{Report, Run};

const OUT_OF_MEMORY: u64 = 2;

/// The lines libvgpu wrote, checking that every line of the client's stderr is one of them.
fn log_lines(report: &Report) -> Vec<&str> {
    let lines: Vec<&str> = report.stderr.lines().collect();
    for line in &lines {
        assert!(line.starts_with("libvgpu["), "an untagged stderr line: {line:?}\n{}", report.stderr);
    }
    lines
}

/// 64 MiB chunks under a 1 GiB budget until refused, then `more` refusals, logging at `level`.
fn refusals(more: u32, level: &str) -> Report {
    let r = Run::new("direct", &["refuse", "64", &more.to_string()])
        .env("CUDA_DEVICE_MEMORY_LIMIT_0", "1g")
        .env("LIBCUDA_LOG_LEVEL", level)
        .report();
    assert!(r.success, "{r:?}");
    assert_eq!(r.get("held_bytes"), 1 << 30);
    assert_eq!(r.get("held_status"), OUT_OF_MEMORY);
    assert_eq!(r.get("refused"), u64::from(more));
    r
}

#[test]
fn a_refusal_names_the_device_the_request_the_budget_and_the_usage() {
    let r = refusals(0, "3");
    let lines = log_lines(&r);
    let refused: Vec<&&str> = lines.iter().filter(|line| line.contains("refused")).collect();
    assert_eq!(refused.len(), 1, "{}", r.stderr);
    let line = refused[0];
    assert!(line.contains("] info: "), "{line}");
    assert!(
        line.ends_with(
            "refused an allocation of 64 MiB (67108864 bytes) on device 0: the container uses 1 GiB \
             (1073741824 bytes) of its 1 GiB (1073741824 bytes) budget"
        ),
        "{line}"
    );
}

#[test]
fn a_thousand_refusals_in_a_second_make_at_most_two_lines_and_a_count() {
    let r = refusals(1000, "3");
    let lines = log_lines(&r);
    let full: Vec<&&str> = lines.iter().filter(|line| line.contains("refused an allocation of")).collect();
    let counted: u64 = lines
        .iter()
        .filter_map(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            let at = words.iter().position(|word| *word == "more")?;
            words.get(at.checked_sub(1)?)?.trim_start_matches(';').parse::<u64>().ok()
        })
        .sum();
    // The fill's own refusal and the thousand after it: each one a line or counted in one.
    assert_eq!(full.len() as u64 + counted, 1001, "{}", r.stderr);
    assert!(!full.is_empty());
    let refusal_lines = lines.iter().filter(|line| line.contains("refused")).count();
    if r.get("refuse_ns") < 1_000_000_000 {
        assert!(refusal_lines <= 2, "{refusal_lines} lines for refusals within a second:\n{}", r.stderr);
    }
}

#[test]
fn refusals_are_not_logged_at_the_default_level() {
    let r = refusals(10, "2");
    assert_eq!(r.stderr, "");
}

#[test]
fn start_up_names_the_version_the_region_file_and_the_limits_at_debug_level() {
    let region = common::scratch_root().join(format!("vgpu-logging-{}.cache", std::process::id()));
    let r = Run::new("direct", &["fill", "512"])
        .env("CUDA_DEVICE_MEMORY_LIMIT_0", "1g")
        .env(common::SHARED_CACHE_VAR, region.to_str().expect("UTF-8 temp path"))
        .env("LIBCUDA_LOG_LEVEL", "4")
        .report();
    let _ = std::fs::remove_file(&region);
    assert!(r.success, "{r:?}");
    let start = format!(
        "debug: CUDA starting (libvgpu {}): region file {}; memory budgets: device 0 1 GiB (1073741824 \
         bytes), none on the others; compute shares: none",
        env!("CARGO_PKG_VERSION"),
        region.display()
    );
    let lines = log_lines(&r);
    assert_eq!(lines.iter().filter(|line| line.contains(&start)).count(), 1, "{}", r.stderr);
}

#[test]
fn a_process_that_never_touches_cuda_logs_nothing() {
    let libvgpu = &common::artifacts().libvgpu;
    let output = Command::new("/bin/sh")
        .args(["-c", "echo hello"])
        .env("LD_PRELOAD", libvgpu)
        .env("LIBCUDA_LOG_LEVEL", "4")
        .env("CUDA_DEVICE_MEMORY_LIMIT_abc", "1g")
        .env("CUDA_DEVICE_MEMORY_LIMIT_0", "lots")
        .output()
        .expect("run sh");
    assert!(output.status.success());
    assert_eq!(String::from_utf8_lossy(&output.stdout), "hello\n");
    assert_eq!(String::from_utf8_lossy(&output.stderr), "");
}

/// Runs a client that touches CUDA with `var=value` set and returns the one error line about
/// `var` (failing unless there is exactly one).
fn reported_once(var: &str, value: &str) -> String {
    let r =
        Run::new("direct", &["fill", "512"]).env(var, value).env("CUDA_DEVICE_MEMORY_LIMIT_0", "1g").report();
    assert!(r.success, "{r:?}");
    let lines = log_lines(&r);
    let about: Vec<&&str> = lines.iter().filter(|line| line.contains(var)).collect();
    assert_eq!(about.len(), 1, "{var}={value} reported {} times:\n{}", about.len(), r.stderr);
    assert!(about[0].contains("] error: "), "{}", about[0]);
    about[0].to_string()
}

#[test]
fn a_per_device_limit_without_a_device_number_is_reported() {
    let line = reported_once("CUDA_DEVICE_MEMORY_LIMIT_abc", "2g");
    assert!(line.contains("CUDA_DEVICE_MEMORY_LIMIT_<N>"), "{line}");
}

#[test]
fn a_misspelt_variable_is_reported() {
    let line = reported_once("CUDA_DEVICE_MEMORY_SHARED_CACH", "/tmp/elsewhere.cache");
    assert!(
        line.contains("not a libvgpu variable") && line.contains("CUDA_DEVICE_MEMORY_SHARED_CACHE"),
        "{line}"
    );
}

#[test]
fn a_bad_log_level_is_reported() {
    let line = reported_once("LIBCUDA_LOG_LEVEL", "loud");
    assert!(line.contains("\"loud\" is not a level"), "{line}");
}

#[test]
fn a_bad_task_priority_is_reported() {
    let line = reported_once("CUDA_TASK_PRIORITY", "high");
    assert!(line.contains("\"high\" is not a whole number"), "{line}");
}

#[test]
fn a_bad_ledger_choice_is_reported() {
    let line = reported_once("LIBVGPU_LEDGER", "locale");
    assert!(line.contains("using the shared ledger"), "{line}");
}

#[test]
fn a_bad_compute_limit_is_reported() {
    let line = reported_once("CUDA_DEVICE_SM_LIMIT", "half");
    assert!(line.contains("failing closed"), "{line}");
}
