//! `vgpu-smi reclaim`: the one command that writes a region. It gives back what dead processes still
//! hold, by the library's own rules (`vgpu_ledger::reclaim_dead`), and says what came back.

use std::fmt::Write;
use std::path::Path;

use serde_json::Value;
use vgpu_ledger::region::RegionError;

use crate::containers::{self, Listing};
use crate::table::size;

/// What the command prints (on stdout, and its errors on stderr) and its exit status.
pub struct Outcome {
    pub text: String,
    pub errors: String,
    pub status: i32,
}

/// Reclaims in the region at `path`, or in every container's under the directory `path`.
pub fn run(path: &Path, json: bool) -> Outcome {
    let listing: Listing = containers::load(path);
    let mut text = String::new();
    let mut errors = String::new();
    let mut documents = Vec::new();
    let mut status = 0;
    if listing.directory && listing.containers.is_empty() {
        let _ = writeln!(text, "{}: no container directory holds a region file", path.display());
    }
    for container in &listing.containers {
        let shown = container.path.display().to_string();
        // Read it first: the same checks, errors and exit statuses as the other commands.
        let snapshot = match &container.region {
            Ok(snapshot) => snapshot,
            Err(error) => {
                status = status.max(containers::exit_status(error));
                let _ = writeln!(errors, "vgpu-smi: {error}");
                documents.push(crate::json::reclaimed(&shown, 0, Err(crate::json::error(error))));
                continue;
            }
        };
        let devices = snapshot.devices.len();
        match vgpu_ledger::reclaim_dead(&container.path) {
            Ok(report) => {
                describe(&mut text, &shown, devices, &report);
                documents.push(crate::json::reclaimed(&shown, devices, Ok(&report)));
            }
            Err(error) => {
                let code = if matches!(error, RegionError::Io { .. }) { 3 } else { 4 };
                status = status.max(code);
                let _ = writeln!(errors, "vgpu-smi: cannot reclaim: {error}");
                let value = serde_json::json!({ "kind": "reclaim_failed", "message": error.to_string() });
                documents.push(crate::json::reclaimed(&shown, 0, Err(value)));
            }
        }
    }
    if json {
        let document =
            serde_json::json!({ "version": env!("CARGO_PKG_VERSION"), "regions": Value::Array(documents) });
        text = format!("{document:#}\n");
    }
    Outcome { text, errors, status }
}

fn describe(out: &mut String, path: &str, devices: usize, report: &vgpu_ledger::ReclaimReport) {
    if report.reclaimed.is_empty() && !report.changed {
        let _ = writeln!(out, "{path}: no dead process; nothing to give back");
        return;
    }
    if report.reclaimed.is_empty() {
        let _ = writeln!(out, "{path}: recounted what processes killed mid-update had left counted");
    } else {
        let _ = writeln!(out, "{path}: gave back what {} dead process(es) held", report.reclaimed.len());
    }
    for gone in &report.reclaimed {
        let held: Vec<String> = (0..devices)
            .filter(|&d| gone.bytes[d] > 0)
            .map(|d| format!("{} on device {d}", size(gone.bytes[d])))
            .collect();
        let held = if held.is_empty() { "nothing".to_owned() } else { held.join(", ") };
        let _ = writeln!(out, "  lease {}, pid {}: {held}", gone.lease, gone.pid);
    }
    for d in (0..devices).filter(|&d| report.used_before[d] != report.used_after[d]) {
        let _ = writeln!(
            out,
            "  device {d}: {} -> {} in use",
            size(report.used_before[d]),
            size(report.used_after[d])
        );
    }
}
