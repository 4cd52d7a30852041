//! `vgpu-smi serve`: the OpenMetrics exposition on `GET /metrics`, the region(s) read afresh for
//! every scrape. One request at a time; nothing else is served.

use std::net::SocketAddr;
use std::path::Path;

use tiny_http::{Header, Method, Request, Response, Server};

use crate::containers;
use crate::physical::Driver;

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// Prometheus's classic text format, for a scraper that does not ask for OpenMetrics; the body
/// is the same (the OpenMetrics-only lines are comments there).
const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Serves until the process is stopped. Prints where it listens on stderr (with the port the
/// system picked, for port 0). An address that cannot be bound is an error. With `reclaim`, what
/// the dead processes of the regions under `path` hold is given back once a second.
pub fn serve(listen: SocketAddr, path: &Path, driver: &Driver, reclaim: bool) -> Result<(), String> {
    let server = Server::http(listen).map_err(|error| format!("cannot listen on {listen}: {error}"))?;
    let bound = server.server_addr().to_ip().unwrap_or(listen);
    eprintln!("vgpu-smi: serving http://{bound}/metrics for {}", path.display());
    if reclaim {
        let path = path.to_owned();
        std::thread::spawn(move || {
            loop {
                std::thread::sleep(RECLAIM_EVERY);
                reclaim_dead(&path);
            }
        });
    }
    for request in server.incoming_requests() {
        let _ = answer(request, path, driver);
    }
    Ok(())
}

fn answer(request: Request, path: &Path, driver: &Driver) -> std::io::Result<()> {
    let route = request.url().split('?').next().unwrap_or_default().to_owned();
    if !matches!(request.method(), Method::Get | Method::Head) {
        return request.respond(Response::from_string("only GET\n").with_status_code(405));
    }
    match route.as_str() {
        "/metrics" => {
            let wants_openmetrics = request.headers().iter().any(|h| {
                h.field.equiv("Accept") && h.value.as_str().contains("application/openmetrics-text")
            });
            let listing = containers::load(path);
            let body = crate::metrics::render(&listing, &driver.view());
            let kind = if wants_openmetrics { OPENMETRICS } else { PROMETHEUS_TEXT };
            request.respond(Response::from_string(body).with_header(content_type(kind)))
        }
        "/" => request.respond(
            Response::from_string("vgpu-smi: metrics at /metrics\n")
                .with_header(content_type("text/plain; charset=utf-8")),
        ),
        _ => request
            .respond(Response::from_string("not found; metrics are at /metrics\n").with_status_code(404)),
    }
}

/// How often `serve` looks for dead processes' leases. A container whose processes all died has
/// nobody left inside to give their bytes back: its region reads zero within this and a moment.
const RECLAIM_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// Gives back what dead processes hold in the regions under `path`, when a read-only look finds
/// any. The reclaim runs as `vgpu-smi reclaim PATH`, a process of its own: it maps each region
/// (opened as a tenant's file, see `reclaim`), and a tenant that truncates its file meanwhile
/// stops that process with SIGBUS, not the exporter.
fn reclaim_dead(path: &Path) {
    let listing = containers::load(path);
    let any_dead = listing.containers.iter().filter_map(|c| c.region.as_ref().ok()).any(|region| {
        region.dead_leases().next().is_some() || region.devices.iter().any(|device| device.suspect > 0)
    });
    if !any_dead {
        return;
    }
    let Ok(me) = std::env::current_exe() else { return };
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
}

fn content_type(value: &str) -> Header {
    Header::from_bytes("Content-Type", value).expect("a valid header")
}
