//! `vgpu-smi resize`: changes a running container's budget or compute share in its region
//! (`vgpu_ledger::resize`), and says what it changed and who will not follow.

use std::fmt::Write;
use std::path::Path;

use vgpu_ledger::region::RegionError;
use vgpu_ledger::resize::{Change, ResizeError, Resized};

use crate::table::size;

/// Exit status of a value or device that cannot be used: as a usage error.
const REFUSED: i32 = 2;

/// What the command prints on stdout and stderr, and its exit status.
pub struct Outcome {
    pub text: String,
    pub errors: String,
    pub status: i32,
}

/// Applies the budget `size` and/or the share `share` to region device `device` of the region at
/// `path`. Both values are checked before either is written.
pub fn run(path: &Path, device: usize, size: Option<&str>, share: Option<&str>) -> Outcome {
    let mut outcome = Outcome { text: String::new(), errors: String::new(), status: 0 };
    let changes: Result<Vec<Change>, ResizeError> =
        size.map(Change::budget).into_iter().chain(share.map(Change::share)).collect();
    let changes = match changes {
        Ok(changes) => changes,
        Err(error) => return refused(outcome, path, &error),
    };
    for change in changes {
        match vgpu_ledger::resize::resize(path, device, change) {
            Ok(resized) => describe(&mut outcome.text, path, &resized),
            Err(error) => return refused(outcome, path, &error),
        }
    }
    outcome
}

fn refused(mut outcome: Outcome, path: &Path, error: &ResizeError) -> Outcome {
    outcome.status = match error {
        ResizeError::Region(RegionError::Io { .. }) => 3,
        ResizeError::Region(_) => 4,
        _ => REFUSED,
    };
    let _ = writeln!(outcome.errors, "vgpu-smi: cannot resize {}: {error}", path.display());
    outcome
}

fn describe(text: &mut String, path: &Path, resized: &Resized) {
    let device = format!("{}: device {} ({})", path.display(), resized.device, resized.uuid);
    match resized.change {
        Change::Budget(bytes) => {
            let _ = writeln!(
                text,
                "{device}: budget {} -> {}; the container holds {}",
                size(resized.before),
                size(bytes),
                size(resized.used)
            );
            if resized.used > bytes {
                let _ = writeln!(
                    text,
                    "  above the new budget: new allocations are refused until usage falls under it; \
                     nothing allocated is touched"
                );
            }
        }
        Change::Share(percent) => {
            let _ = writeln!(text, "{device}: compute share {} % -> {percent} %", resized.before);
        }
    }
    if !resized.not_following.is_empty() {
        let pids: Vec<String> = resized.not_following.iter().map(i32::to_string).collect();
        let _ = writeln!(
            text,
            "  warning: process(es) {} run libvgpu 0.1.0, which keeps the budgets it started with \
             until it exits",
            pids.join(", ")
        );
    }
}
