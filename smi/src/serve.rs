//! `vgpu-smi serve`: the OpenMetrics exposition on `GET /metrics`, the region(s) read afresh for
//! every scrape, and with a policy (`--policy`) what it did on `GET /events`. One request at a
//! time; nothing else is served. With `--swap`, the swap arbiter (`crate::arbiter`) runs beside.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tiny_http::{Header, Method, Request, Response, Server};

use crate::arbiter::{self, Stats};
use crate::containers;
use crate::physical::Driver;
use crate::policy::{Policy, Watch};

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// Prometheus's classic text format, for a scraper that does not ask for OpenMetrics; the body
/// is the same (the OpenMetrics-only lines are comments there).
const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Serves until the process is stopped. Prints where it listens on stderr (with the port the
/// system picked, for port 0). An address that cannot be bound is an error. With `reclaim`, what
/// the dead processes of the regions under `path` hold is given back as soon as a process closes
/// a region it wrote (every libvgpu process does when it exits or is killed), and once a second.
/// With `swap`, the swap arbiter runs over the same containers.
pub fn serve(
    listen: SocketAddr,
    path: &Path,
    driver: &Driver,
    reclaim: bool,
    policy: Option<Policy>,
    swap: Option<arbiter::Settings>,
) -> Result<(), String> {
    let server = Server::http(listen).map_err(|error| format!("cannot listen on {listen}: {error}"))?;
    let bound = server.server_addr().to_ip().unwrap_or(listen);
    eprintln!("vgpu-smi: serving http://{bound}/metrics for {}", path.display());
    let watch = policy.map(|policy| {
        // The first line says where the policy cannot tell whose a process is.
        let mut watch = Watch::new(policy);
        let shared = watch.sharing(&crate::accounting::account(&containers::load(path), &driver.view()));
        eprintln!(
            "vgpu-smi: policy {}: a container NVML counts over its budget by more than {} bytes for {:.1} s{}",
            policy.action.name(),
            policy.margin,
            policy.grace.as_secs_f64(),
            if shared.is_empty() { String::new() } else { format!("; {}", shared.join("; ")) }
        );
        let watch = Arc::new(Mutex::new(watch));
        let shared = Arc::clone(&watch);
        let path = path.to_owned();
        std::thread::spawn(move || enforce(&path, &shared));
        watch
    });
    let swap_stats = swap.map(|settings| {
        eprintln!(
            "vgpu-smi: swap arbiter: when a process waits for room on a GPU, the least recently active \
             process idle for {} ms on that GPU is asked to swap out; {}",
            settings.idle.as_millis(),
            settings.force.map_or("a busy one never".to_owned(), |after| format!(
                "after a wait of {} ms with nobody idle, a busy one",
                after.as_millis()
            )),
        );
        let stats = Arc::new(Mutex::new(Stats::default()));
        let shared = Arc::clone(&stats);
        let path = path.to_owned();
        std::thread::spawn(move || arbiter::run(&path, settings, shared));
        stats
    });
    if reclaim {
        let path = path.to_owned();
        std::thread::spawn(move || {
            let closes = CloseEvents::new();
            // After a close, the next looks come sooner: the kernel drops a dead process's lease
            // lock just after its close event, and later still if the dying process loses the CPU
            // in between (seen at 0.5 s on a loaded machine). A new close starts them over.
            let mut after_close: Option<usize> = None;
            loop {
                let regions = reclaim_dead(&path);
                let Some(closes) = &closes else {
                    std::thread::sleep(RECLAIM_EVERY);
                    continue;
                };
                closes.watch(&regions);
                let wait = after_close.map_or(RECLAIM_EVERY, |k| Duration::from_millis(AFTER_CLOSE_MS[k]));
                after_close = if closes.wait(wait) {
                    Some(0)
                } else {
                    after_close.map(|k| k + 1).filter(|&k| k < AFTER_CLOSE_MS.len())
                };
            }
        });
    }
    for request in server.incoming_requests() {
        let _ = answer(request, path, driver, watch.as_deref(), swap_stats.as_deref());
    }
    Ok(())
}

/// Samples every container's use by NVML and applies the policy, forever.
fn enforce(path: &Path, watch: &Mutex<Watch>) {
    let driver = Driver::start();
    let every = watch.lock().unwrap_or_else(PoisonError::into_inner).policy.every();
    loop {
        let listing = containers::load(path);
        let accounting = crate::accounting::account(&listing, &driver.view());
        let mut watch = watch.lock().unwrap_or_else(PoisonError::into_inner);
        for line in watch.sharing(&accounting) {
            eprintln!("vgpu-smi: policy {}: {line}", watch.policy.action.name());
        }
        let events = watch.sample(&accounting, std::time::Instant::now());
        drop(watch);
        for event in events {
            eprintln!("vgpu-smi: {}", event.line());
        }
        std::thread::sleep(every);
    }
}

fn answer(
    request: Request,
    path: &Path,
    driver: &Driver,
    watch: Option<&Mutex<Watch>>,
    swap: Option<&Mutex<Stats>>,
) -> std::io::Result<()> {
    let route = request.url().split('?').next().unwrap_or_default().to_owned();
    if !matches!(request.method(), Method::Get | Method::Head) {
        return request.respond(Response::from_string("only GET\n").with_status_code(405));
    }
    match route.as_str() {
        "/metrics" => {
            let wants_openmetrics = request.headers().iter().any(|h| {
                h.field.equiv("Accept") && h.value.as_str().contains("application/openmetrics-text")
            });
            let listing = containers::load_with_swap(path);
            let watch = watch.map(|watch| watch.lock().unwrap_or_else(PoisonError::into_inner));
            let requests =
                swap.map(|stats| stats.lock().unwrap_or_else(PoisonError::into_inner).requests.clone());
            let body = crate::metrics::render(&listing, &driver.view(), watch.as_deref(), requests.as_ref());
            let kind = if wants_openmetrics { OPENMETRICS } else { PROMETHEUS_TEXT };
            request.respond(Response::from_string(body).with_header(content_type(kind)))
        }
        "/events" => {
            let events = watch.map_or_else(Vec::new, |watch| {
                watch
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .events
                    .iter()
                    .map(crate::json::event)
                    .collect()
            });
            let body = format!("{:#}\n", serde_json::Value::Array(events));
            request.respond(Response::from_string(body).with_header(content_type("application/json")))
        }
        "/" => request.respond(
            Response::from_string("vgpu-smi: metrics at /metrics\n")
                .with_header(content_type("text/plain; charset=utf-8")),
        ),
        _ => request
            .respond(Response::from_string("not found; metrics are at /metrics\n").with_status_code(404)),
    }
}

/// How often `serve` looks for dead processes' leases when no close event woke it. A container
/// whose processes all died has nobody left inside to give their bytes back: its region reads
/// zero within moments of the last close event (measured in tests/busy_node.rs), at worst within
/// this.
const RECLAIM_EVERY: Duration = Duration::from_secs(1);
/// The pauses between the looks that follow a close event, in milliseconds.
const AFTER_CLOSE_MS: [u64; 6] = [5, 15, 30, 100, 250, 500];

/// Gives back what dead processes hold in the regions under `path`, when a read-only look finds
/// any, and returns the regions it looked at. The reclaim runs as `vgpu-smi reclaim PATH`, a
/// process of its own: it maps each region (opened as a tenant's file, see `reclaim`), and a tenant
/// that truncates its file meanwhile stops that process with SIGBUS, not the exporter.
fn reclaim_dead(path: &Path) -> Vec<std::path::PathBuf> {
    let listing = containers::load(path);
    let regions = listing.containers.iter().filter(|c| c.region.is_ok()).map(|c| c.path.clone()).collect();
    let any_dead = listing.containers.iter().filter_map(|c| c.region.as_ref().ok()).any(|region| {
        region.dead_leases().next().is_some() || region.devices.iter().any(|device| device.suspect > 0)
    });
    if !any_dead {
        return regions;
    }
    let Ok(me) = std::env::current_exe() else { return regions };
    let ran = std::process::Command::new(me)
        .args(["reclaim", "--"])
        .arg(path)
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output();
    match ran {
        Ok(output) => {
            for line in
                String::from_utf8_lossy(&output.stdout).lines().filter(|line| line.contains("gave back"))
            {
                eprintln!("vgpu-smi: {line}");
            }
        }
        Err(error) => eprintln!("vgpu-smi: cannot run reclaim: {error}"),
    }
    regions
}

/// Close events of region files opened for writing (inotify): what every libvgpu process makes
/// when it exits or is killed, and what no read-only look (this exporter's, HAMi's monitor's)
/// makes, so reading the regions never wakes the reclaimer.
struct CloseEvents {
    fd: libc::c_int,
}

impl CloseEvents {
    fn new() -> Option<CloseEvents> {
        // SAFETY: a plain system call; the descriptor is ours until drop.
        let fd = unsafe { libc::inotify_init1(libc::IN_CLOEXEC | libc::IN_NONBLOCK) };
        (fd >= 0).then_some(CloseEvents { fd })
    }

    /// Watches each region file (again: a watch on a file already watched is the same watch, and a
    /// replaced file gets its own). Links are not followed: a tenant's name for another file is
    /// not watched.
    fn watch(&self, regions: &[std::path::PathBuf]) {
        for region in regions {
            let Ok(path) = std::ffi::CString::new(region.as_os_str().as_encoded_bytes()) else { continue };
            // SAFETY: `fd` is our inotify descriptor and `path` is NUL-terminated.
            unsafe {
                libc::inotify_add_watch(self.fd, path.as_ptr(), libc::IN_CLOSE_WRITE | libc::IN_DONT_FOLLOW)
            };
        }
    }

    /// Waits up to `timeout` for close events; true if any came (all pending ones are consumed).
    fn wait(&self, timeout: std::time::Duration) -> bool {
        let mut poll = libc::pollfd { fd: self.fd, events: libc::POLLIN, revents: 0 };
        let millis = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
        // SAFETY: one valid pollfd record.
        if unsafe { libc::poll(&mut poll, 1, millis) } <= 0 {
            return false;
        }
        let mut events = [0u8; 4096];
        // SAFETY: `events` is a writable buffer of its length; the descriptor is non-blocking.
        while unsafe { libc::read(self.fd, events.as_mut_ptr().cast(), events.len()) } > 0 {}
        true
    }
}

impl Drop for CloseEvents {
    fn drop(&mut self) {
        // SAFETY: our own descriptor, used by no one else.
        unsafe { libc::close(self.fd) };
    }
}

fn content_type(value: &str) -> Header {
    Header::from_bytes("Content-Type", value).expect("a valid header")
}
