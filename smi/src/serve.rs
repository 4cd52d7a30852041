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
/// system picked, for port 0). An address that cannot be bound is an error.
pub fn serve(listen: SocketAddr, path: &Path, driver: &Driver) -> Result<(), String> {
    let server = Server::http(listen).map_err(|error| format!("cannot listen on {listen}: {error}"))?;
    let bound = server.server_addr().to_ip().unwrap_or(listen);
    eprintln!("vgpu-smi: serving http://{bound}/metrics for {}", path.display());
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

fn content_type(value: &str) -> Header {
    Header::from_bytes("Content-Type", value).expect("a valid header")
}
