//! `vgpu-smi`: what a libvgpu container uses, per device and process, read from its shared region
//! file (or a directory of them, as HAMi's monitor sees them); as a table, JSON or OpenMetrics.
//!
//! Each subcommand lives in a module of its own; `main` parses the command line, runs one and
//! turns the outcome into the documented exit status (0 ok, 2 usage, 3 a file missing or
//! unreadable, 4 not a region, corrupt or of an unknown version).

mod accounting;
mod arbiter;
mod cli;
mod containers;
mod doctor;
mod elf;
mod host_pids;
mod json;
mod metrics;
mod physical;
mod policy;
mod reclaim;
mod resize;
mod serve;
mod swap_tables;
mod table;

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use cli::Command;
use physical::Driver;

const USAGE_ERROR: u8 = 2;

fn main() -> ExitCode {
    let command = match cli::parse(std::env::args_os().skip(1), cli::default_path()) {
        Ok(command) => command,
        Err(cli::UsageError(message)) => {
            eprintln!("vgpu-smi: {message}\n\n{}", cli::USAGE);
            return ExitCode::from(USAGE_ERROR);
        }
    };
    let status = match command {
        Command::Help => {
            println!("{}", cli::USAGE);
            0
        }
        Command::Doctor { path, library } => doctor::run(&library.unwrap_or_else(default_library), &path),
        Command::Version => {
            println!("vgpu-smi {}", env!("CARGO_PKG_VERSION"));
            0
        }
        Command::Show { path, json, watch: None } => {
            let listing = containers::load_with_swap(&path);
            eprint!("{}", listing.skipped_lines());
            match single_error(&listing) {
                // One file that cannot be shown: say why on stderr (JSON still tells it on stdout).
                Some(error) if !json => eprintln!("vgpu-smi: {error}"),
                _ => {
                    print(&show(&listing, &Driver::start(), json));
                }
            }
            listing.exit_status()
        }
        Command::Show { path, json, watch: Some(every) } => watch(&path, json, every),
        Command::Reclaim { path, json } => {
            let outcome = reclaim::run(&path, json);
            eprint!("{}", outcome.errors);
            print(&outcome.text);
            outcome.status
        }
        Command::Resize { path, device, size, share } => {
            let outcome = resize::run(&path, device, size.as_deref(), share.as_deref());
            eprint!("{}", outcome.errors);
            print(&outcome.text);
            outcome.status
        }
        Command::Metrics { path } => {
            // A region that cannot be read is in the exposition too (`vgpu_region_up 0`).
            let listing = containers::load_with_swap(&path);
            eprint!("{}", listing.skipped_lines());
            if let Some(error) = single_error(&listing) {
                eprintln!("vgpu-smi: {error}");
            }
            print(&metrics::render(&listing, &Driver::start().view(), None, None));
            listing.exit_status()
        }
        Command::Serve { path, listen, reclaim, policy, swap } => {
            match serve::serve(listen, &path, &Driver::start(), reclaim, policy, swap) {
                Ok(()) => 0,
                Err(message) => {
                    eprintln!("vgpu-smi: {message}");
                    USAGE_ERROR.into()
                }
            }
        }
    };
    ExitCode::from(u8::try_from(status).unwrap_or(1))
}

/// Why the one file asked for (not a directory) cannot be shown.
fn single_error(listing: &containers::Listing) -> Option<&vgpu_ledger::inspect::InspectError> {
    match listing.containers.as_slice() {
        [only] if !listing.directory => only.region.as_ref().err(),
        _ => None,
    }
}

/// The table, or the JSON document, for one look.
fn show(listing: &containers::Listing, driver: &Driver, json: bool) -> String {
    let physical = driver.view();
    if json { format!("{:#}\n", json::render(listing, &physical)) } else { table::render(listing, &physical) }
}

/// Redraws every `every` until interrupted: the table on a cleared screen, or one compact JSON
/// document per line.
fn watch(path: &std::path::Path, json: bool, every: Duration) -> i32 {
    let driver = Driver::start();
    loop {
        let listing = containers::load_with_swap(path);
        let text = if json {
            format!("{}\n", json::render(&listing, &driver.view()))
        } else {
            let heading = format!("vgpu-smi: every {:.1} s; Ctrl-C to stop\n\n", every.as_secs_f64());
            // Home the cursor and clear the screen, then draw.
            format!("\x1b[H\x1b[2J{heading}{}", show(&listing, &driver, false))
        };
        if !print(&text) {
            return 0; // the reader went away (a closed pipe)
        }
        std::thread::sleep(every);
    }
}

/// Writes `text` to stdout; false if stdout is gone.
fn print(text: &str) -> bool {
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(text.as_bytes()).and_then(|()| stdout.flush()).is_ok()
}

/// The `libvgpu.so` doctor checks unless told: `$VGPU_LIBRARY`, else the one beside this program
/// (as the release archive lays them out), else where HAMi mounts it.
fn default_library() -> std::path::PathBuf {
    if let Some(path) = std::env::var_os("VGPU_LIBRARY") {
        return path.into();
    }
    let beside = std::env::current_exe().ok().and_then(|exe| Some(exe.parent()?.join("libvgpu.so")));
    match beside {
        Some(path) if path.exists() => path,
        _ => "/usr/local/vgpu/libvgpu.so".into(),
    }
}
