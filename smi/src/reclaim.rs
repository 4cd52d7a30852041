//! `vgpu-smi reclaim`: the one command that writes a region. It gives back what dead processes still
//! hold, by the library's own rules (`vgpu_ledger::reclaim_dead`), and says what came back.

use std::collections::HashMap;
use std::fmt::Write;
use std::path::{Path, PathBuf};

use serde_json::Value;
use vgpu_ledger::region::RegionError;
use vgpu_ledger::region::tenant_file::Access;

use crate::containers::{self, Listing};
use crate::table::size;

/// What the command prints (on stdout, and its errors on stderr) and its exit status.
pub struct Outcome {
    pub text: String,
    pub errors: String,
    pub status: i32,
}

/// Reclaims in the region at `path`, or in every container's under the directory `path`. Each
/// region is written only through the descriptor it was checked and read through.
pub fn run(path: &Path, json: bool) -> Outcome {
    exit_on_sigbus();
    let mut reclaimed: HashMap<PathBuf, Result<vgpu_ledger::ReclaimReport, RegionError>> = HashMap::new();
    let listing: Listing = containers::visit(path, Access::ReadWrite, false, |container, file, _| {
        reclaimed.insert(container.path.clone(), vgpu_ledger::reclaim_dead_file(file, &container.path));
    });
    let mut text = String::new();
    let mut errors = listing.skipped_lines();
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
        match reclaimed.remove(&container.path) {
            Some(Ok(report)) => {
                describe(&mut text, &shown, devices, &report);
                documents.push(crate::json::reclaimed(&shown, devices, Ok(&report)));
            }
            Some(Err(error)) => {
                let code = if matches!(error, RegionError::Io { .. }) { 3 } else { 4 };
                status = status.max(code);
                let _ = writeln!(errors, "vgpu-smi: cannot reclaim: {error}");
                let value = serde_json::json!({ "kind": "reclaim_failed", "message": error.to_string() });
                documents.push(crate::json::reclaimed(&shown, 0, Err(value)));
            }
            // Read but not handed over for writing: cannot happen (`visit` hands over every region
            // it read); say so rather than claim success.
            None => {
                status = status.max(3);
                let _ = writeln!(errors, "vgpu-smi: cannot reclaim: {shown}: not opened for writing");
                let value =
                    serde_json::json!({ "kind": "reclaim_failed", "message": "not opened for writing" });
                documents.push(crate::json::reclaimed(&shown, 0, Err(value)));
            }
        }
    }
    if json {
        let document = serde_json::json!({
            "version": env!("CARGO_PKG_VERSION"),
            "regions": Value::Array(documents),
            "skipped": crate::json::skipped(&listing),
        });
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

/// A tenant can truncate its region while reclaim has it mapped, and touching a page past the new
/// end raises SIGBUS. Turn that into a line saying why and exit status 4, not a core dump. (The
/// other commands never map a region.)
fn exit_on_sigbus() {
    extern "C" fn on_sigbus(_: libc::c_int) {
        const LINE: &[u8] = b"vgpu-smi: a region file shrank while reclaim had it mapped (truncated by \
its container); stopped\n";
        // SAFETY: write(2) and _exit(2) are async-signal-safe; LINE is a static buffer.
        unsafe {
            libc::write(2, LINE.as_ptr().cast(), LINE.len());
            libc::_exit(4);
        }
    }
    // SAFETY: the handler calls only async-signal-safe functions; `sigaction` is plain data.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_sigbus as extern "C" fn(libc::c_int) as libc::sighandler_t;
        libc::sigemptyset(&mut action.sa_mask);
        libc::sigaction(libc::SIGBUS, &action, std::ptr::null_mut());
    }
}
