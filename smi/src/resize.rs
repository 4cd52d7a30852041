//! `vgpu-smi resize`: changes a running container's budget or compute share in its region
//! (`vgpu_ledger::resize`), and says what it changed and who will not follow.

use std::fmt::Write;
use std::path::Path;

use vgpu_ledger::region::RegionError;
use vgpu_ledger::region::tenant_file::Access;
use vgpu_ledger::resize::{Change, ResizeError, Resized};

use crate::containers;
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
        // Opened as a tenant's file, as `reclaim` opens it: a link at its last component is not
        // followed, and only a regular file is written.
        let mut done = None;
        let listing = containers::visit(path, Access::ReadWrite, false, |container, file, _| {
            done = Some(vgpu_ledger::resize::resize_file(file, &container.path, device, change));
        });
        if listing.directory {
            outcome.status = REFUSED;
            let _ = writeln!(
                outcome.errors,
                "vgpu-smi: resize takes one region file, not a folder: {}",
                path.display()
            );
            return outcome;
        }
        match done {
            Some(Ok(resized)) => describe(&mut outcome.text, path, &resized),
            Some(Err(error)) => return refused(outcome, path, &error),
            None => {
                let error = listing.containers.first().and_then(|c| c.region.as_ref().err());
                outcome.status = error.map_or(3, containers::exit_status);
                let why = error.map_or_else(|| "cannot be read".to_owned(), ToString::to_string);
                let _ = writeln!(outcome.errors, "vgpu-smi: cannot resize: {why}");
                return outcome;
            }
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
