//! The machine view (`--json`): everything the table shows, in exact bytes, one document per
//! look. Field names are documented in docs/vgpu-smi.md.

use serde_json::{Value, json};
use vgpu_ledger::ReclaimReport;
use vgpu_ledger::inspect::{InspectError, LeaseState, SlotUsage, Snapshot};

use crate::accounting::Accounting;
use crate::containers::{Container, Listing};
use crate::host_pids::HostPids;
use crate::physical::PhysicalView;
use crate::policy::Event;
use crate::swap_tables::SwapView;
use crate::table::share;

/// The document for `listing`, with the driver's devices.
pub fn render(listing: &Listing, physical: &PhysicalView) -> Value {
    let host_pids = crate::host_pids::HostPids::of(listing);
    json!({
        "version": env!("CARGO_PKG_VERSION"),
        "path": listing.root.display().to_string(),
        "directory": listing.directory,
        "containers": listing.containers.iter().map(|c| container(c, physical, &host_pids)).collect::<Vec<_>>(),
        "without_region": listing.without_region,
        "skipped": skipped(listing),
        "physical": physical_view(physical),
        "accounting": accounting(&crate::accounting::account(listing, physical)),
    })
}

/// Every process on the card accounted to its container (see `accounting`).
pub fn accounting(accounting: &Accounting) -> Value {
    json!({
        "containers": accounting.containers.iter().map(|c| json!({
            "name": c.name,
            "has_region": c.has_region,
            "environment_refused": c.environment_refused.as_ref().map(|refused| json!({
                "kind": refused.kind(),
                "why": refused.to_string(),
            })),
            "devices": c.devices.iter().map(|d| json!({
                "uuid": d.uuid,
                "physical_index": d.physical_index,
                "budget": d.budget,
                "budget_source": d.budget_source.map(|source| source.name()),
                "known": d.known,
                "nvml": d.nvml,
                "unaccounted": d.unaccounted,
            })).collect::<Vec<_>>(),
            "processes": c.processes.iter().map(|p| json!({
                "host_pid": p.host_pid,
                "uuid": p.uuid,
                "nvml": p.nvml,
                "lease": p.lease,
                "unaccounted": p.unaccounted,
                "graphics": p.graphics,
                "route": p.route.name(),
                "shared_cgroup": p.shared_cgroup,
            })).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "unmapped": accounting.unmapped.iter().map(|u| json!({
            "host_pid": u.host_pid,
            "uuid": u.uuid,
            "nvml": u.nvml,
            "graphics": u.graphics,
            "why": u.why,
        })).collect::<Vec<_>>(),
        "shared_cgroups": accounting.shared_cgroups.iter().map(|s| json!({
            "cgroup": s.cgroup,
            "containers": s.containers,
            "host_pid": s.contradicted.map(|(pid, _)| pid),
            "why": s.contradicted.map(|(_, contradiction)| contradiction.why()),
        })).collect::<Vec<_>>(),
    })
}

/// One thing the node's policy did (`serve`'s `/events`).
pub fn event(event: &Event) -> Value {
    json!({
        "at": event.at,
        "container": event.container,
        "uuid": event.uuid,
        "action": event.action.name(),
        "nvml": event.nvml,
        "budget": event.budget,
        "budget_source": event.budget_source.name(),
        "over_for_seconds": event.over_for.as_secs_f64(),
        "pid": event.pid,
        "outcome": event.outcome,
        "line": event.line(),
    })
}

fn container(container: &Container, physical: &PhysicalView, host_pids: &HostPids) -> Value {
    let (region, error) = match &container.region {
        Ok(snapshot) => (region(snapshot, physical, host_pids), Value::Null),
        Err(e) => (Value::Null, error(e)),
    };
    let swap = match (&container.swap, &container.region) {
        (Some(Ok(view)), Ok(snapshot)) => swap(view, snapshot),
        (Some(Err(why)), _) => json!({
            "path": container.path.display().to_string(),
            "error": why,
            "arbiter": Value::Null,
            "devices": [],
        }),
        _ => Value::Null,
    };
    json!({
        "pod_uid": container.pod_uid,
        "container": container.name,
        "path": container.path.display().to_string(),
        "error": error,
        "region": region,
        "swap": swap,
    })
}

/// The swap table's view: the arbiter's heartbeat, and per device and live process what is on
/// the card, what is out, the counters and the phase.
fn swap(view: &SwapView, region: &Snapshot) -> Value {
    let seconds = |ns: u64| ns as f64 / 1e9;
    let millis = |d: std::time::Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    let devices: Vec<Value> = view
        .devices()
        .iter()
        .map(|d| {
            json!({
                "index": d.index,
                "uuid": region.devices.get(d.index).map(|device| device.uuid.as_str()),
                "resident": d.resident,
                "swapped": d.swapped,
                "swap_ins": d.swap_ins,
                "swap_outs": d.swap_outs,
                "wait_seconds": seconds(d.wait_ns),
                "waiting": d.waiting,
                "processes": d.processes.iter().map(|p| {
                    let r = &p.record;
                    json!({
                        "lease": p.lease,
                        "pid": p.pid,
                        "phase": r.phase.name(),
                        "waiting": r.waiting,
                        "in_flight": r.in_flight,
                        "wanted": r.wanted,
                        "resident": r.resident,
                        "swapped": r.swapped,
                        "pinned": r.pinned,
                        "unswappable": r.unswappable,
                        "swap_ins": r.swap_ins,
                        "swap_outs": r.swap_outs,
                        "wait_seconds": seconds(r.wait_ns),
                        "out_seconds": seconds(r.out_ns),
                        "in_seconds": seconds(r.in_ns),
                        "idle_ms": (r.active_ns != 0 && r.active_ns <= view.read_at)
                            .then(|| (view.read_at - r.active_ns) / 1_000_000),
                        "requests": r.request,
                        "handled": r.handled,
                    })
                }).collect::<Vec<_>>(),
            })
        })
        .collect();
    json!({
        "path": view.path.display().to_string(),
        "error": Value::Null,
        "arbiter": {
            "pid": (view.heartbeat != 0).then_some(view.arbiter_pid),
            "last_pass_ms": view.since_arbiter().map(millis),
            "active": view.arbiter_active(),
        },
        "devices": devices,
    })
}

/// `[{"path": …, "reason": …}]`: what the scan refused to open or read to the end.
pub fn skipped(listing: &Listing) -> Value {
    listing.skipped.iter().map(|s| json!({ "path": s.path, "reason": s.reason })).collect()
}

/// `{"kind": …, "message": …}` for a region that cannot be shown.
pub fn error(error: &InspectError) -> Value {
    json!({ "kind": error.kind(), "message": error.to_string() })
}

fn slot(usage: &SlotUsage) -> Value {
    json!({
        "context": usage.context,
        "module": usage.module,
        "data": usage.data,
        "offset": usage.offset,
        "total": usage.total,
        "sm_util": usage.sm_util,
    })
}

fn region(region: &Snapshot, physical: &PhysicalView, host_pids: &HostPids) -> Value {
    let monitor = &region.monitor;
    let devices: Vec<Value> = region
        .devices
        .iter()
        .map(|d| {
            json!({
                "index": d.index,
                "uuid": d.uuid,
                "budget": d.budget,
                "hami_limit": d.hami_limit,
                "used": d.used,
                "buffers": d.slots.data,
                "contexts": d.slots.context,
                "slots": slot(&d.slots),
                "suspect": d.suspect,
                "context_cost": d.context_cost,
                "context_cost_exact": d.context_cost_exact,
                "sm_limit": d.sm_limit,
                "share": share(d.sm_limit),
                "sm_util": d.slots.sm_util,
                "physical_index": physical.by_uuid(&d.uuid).map(|gpu| gpu.index),
                "overcommit": d.overcommit,
                "spillable": d.spillable,
                "spilled": d.spilled,
            })
        })
        .collect();
    let processes: Vec<Value> = region
        .leases
        .iter()
        .map(|lease| {
            let devices: Vec<Value> = lease
                .devices
                .iter()
                .enumerate()
                .map(|(index, held)| {
                    json!({
                        "index": index,
                        "bytes": held.bytes,
                        "in_flight": held.in_flight,
                        "spillable": held.spillable,
                        "slot": slot(&held.slot),
                    })
                })
                .collect();
            json!({
                "lease": lease.lease,
                "pid": lease.pid,
                "host_pid": host_pids.get(&region.path, lease.pid),
                "state": lease.state.name(),
                "alive": lease.alive,
                "dead": lease.state == LeaseState::Live && !lease.alive,
                "slot_status": lease.slot_status,
                "follows_resize": lease.follows_resize,
                "counts_spillable": lease.counts_spillable,
                "bytes": lease.bytes(),
                "devices": devices,
            })
        })
        .collect();
    json!({
        "size": region.size,
        "hami_version": [region.hami_version.0, region.hami_version.1],
        "ledger_version": region.ledger_version,
        "created_by": region.created_by,
        "features": {
            "compatible": region.compatible_features,
            "required": region.required_features,
        },
        "monitor": {
            "proc_num": monitor.proc_num,
            "utilization_switch": monitor.utilization_switch,
            "recent_kernel": monitor.recent_kernel,
            "priority": monitor.priority,
            "last_kernel_time": monitor.last_kernel_time,
            "holds_launches": monitor.holds_launches(),
            "enforces_shares": monitor.enforces_shares(),
        },
        "devices": devices,
        "processes": processes,
    })
}

fn physical_view(physical: &PhysicalView) -> Value {
    match physical {
        PhysicalView::Unavailable(reason) => json!({ "available": false, "reason": reason, "devices": [] }),
        PhysicalView::Devices(devices) => json!({
            "available": true,
            "reason": Value::Null,
            "devices": devices.iter().map(|d| json!({
                "index": d.index,
                "uuid": d.uuid,
                "name": d.name,
                "total": d.total,
                "used": d.used,
                "processes": d.processes.iter().map(|p| json!({ "pid": p.pid, "used": p.used, "graphics": p.graphics })).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
        }),
    }
}

/// What `reclaim --json` prints for one region: what it gave back, or why it could not.
pub fn reclaimed(path: &str, devices: usize, outcome: Result<&ReclaimReport, Value>) -> Value {
    match outcome {
        Ok(report) => json!({
            "path": path,
            "error": Value::Null,
            "changed": report.changed,
            "reclaimed": report.reclaimed.iter().map(|gone| json!({
                "lease": gone.lease,
                "pid": gone.pid,
                "bytes": &gone.bytes[..devices],
            })).collect::<Vec<_>>(),
            "used_before": &report.used_before[..devices],
            "used_after": &report.used_after[..devices],
        }),
        Err(error) => json!({ "path": path, "error": error, "changed": false, "reclaimed": [] }),
    }
}
