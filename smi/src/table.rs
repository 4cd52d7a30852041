//! The terminal view: per container, a line for the monitor's switches, a table of devices and a
//! table of processes, the physical devices behind them, and notes on what needs attention.

use std::fmt::Write;
use std::time::{SystemTime, UNIX_EPOCH};

use vgpu_ledger::inspect::{LeaseState, Snapshot};

use crate::containers::{Container, Listing};
use crate::host_pids::HostPids;
use crate::physical::PhysicalView;
use crate::swap_tables::SwapView;

/// Bytes as people read them: `0 B`, `512 B`, `768.0 MiB`, `1.5 GiB`.
pub fn size(bytes: u64) -> String {
    match [("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)]
        .into_iter()
        .find(|(_, shift)| bytes >> shift > 0)
    {
        Some((unit, shift)) => format!("{:.1} {unit}", bytes as f64 / (1u64 << shift) as f64),
        None => format!("{bytes} B"),
    }
}

/// A compute share as the region holds it: 0 and 100 (or more) mean none.
pub fn share(sm_limit: u64) -> Option<u64> {
    (sm_limit > 0 && sm_limit < 100).then_some(sm_limit)
}

/// The whole view of `listing`, with the driver's devices.
pub fn render(listing: &Listing, physical: &PhysicalView) -> String {
    let mut out = String::new();
    let host_pids = crate::host_pids::HostPids::of(listing);
    if listing.directory && listing.containers.is_empty() {
        let _ = writeln!(out, "{}: no container directory holds a region file", listing.root.display());
    }
    for (i, container) in listing.containers.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        render_container(&mut out, container, physical, &host_pids);
    }
    if !listing.without_region.is_empty() {
        let _ = writeln!(
            out,
            "\nno region file yet (no process there has started CUDA): {}",
            listing.without_region.join(", ")
        );
    }
    if !listing.skipped.is_empty() {
        let _ = writeln!(out, "\nskipped (links are not followed; only regular files are read):");
        for skipped in &listing.skipped {
            let _ = writeln!(out, "  {}: {}", skipped.path, skipped.reason);
        }
    }
    if let PhysicalView::Unavailable(reason) = physical {
        let _ = writeln!(out, "\n{reason}");
    } else {
        render_accounting(&mut out, &crate::accounting::account(listing, physical));
    }
    out
}

/// Every process on the card by container: what the ledgers know and what they do not.
fn render_accounting(out: &mut String, accounting: &crate::accounting::Accounting) {
    let mut rows = vec![row(&[
        "CONTAINER",
        "GPU",
        "BUDGET",
        "KNOWN",
        "NVML",
        "UNACCOUNTED",
        "PROCESSES (host pid: NVML, unaccounted)",
    ])];
    for c in &accounting.containers {
        for d in &c.devices {
            let processes: Vec<String> = c
                .processes
                .iter()
                .filter(|p| p.uuid == d.uuid)
                .map(|p| {
                    let graphics = if p.graphics { ", graphics" } else { "" };
                    format!(
                        "{}: {}, {} ({}{graphics})",
                        p.host_pid,
                        size(p.nvml),
                        size(p.unaccounted),
                        p.route.name()
                    )
                })
                .collect();
            rows.push(vec![
                c.name.clone(),
                d.physical_index.map_or("-".to_owned(), |i| i.to_string()),
                match (d.budget, d.budget_source) {
                    (Some(budget), Some(source)) => format!("{} ({})", size(budget), source.name()),
                    _ => "none".to_owned(),
                },
                size(d.known),
                size(d.nvml),
                size(d.unaccounted),
                if processes.is_empty() { "none".to_owned() } else { processes.join("; ") },
            ]);
        }
    }
    if rows.len() > 1 {
        let _ = writeln!(out, "\nby container, every API (NVML's compute and graphics lists):");
        table(out, &rows);
    }
    for c in &accounting.containers {
        if let Some(refused) = &c.environment_refused {
            let _ = writeln!(
                out,
                "{}: no region, and no budget from its processes' environment ({refused}): never acted on",
                c.name
            );
        }
    }
    for shared in &accounting.shared_cgroups {
        let _ = writeln!(
            out,
            "shared by several budgets: {shared}: the cgroup maps no process there, and the node's \
             policy acts there only on lease holders"
        );
    }
    for u in &accounting.unmapped {
        let _ = writeln!(
            out,
            "not in a known container: host pid {} on {}, {}{}: {}",
            u.host_pid,
            u.uuid,
            u.nvml.map_or("memory not reported".to_owned(), size),
            if u.graphics { " (graphics)" } else { "" },
            u.why
        );
    }
}

fn render_container(out: &mut String, container: &Container, physical: &PhysicalView, host_pids: &HostPids) {
    let path = container.path.display();
    match (&container.pod_uid, &container.name) {
        (Some(uid), Some(name)) => {
            let _ = writeln!(out, "== container {name}, pod {uid} ({path})");
        }
        _ => {
            let _ = writeln!(out, "== {path}");
        }
    }
    match &container.region {
        Ok(snapshot) => render_region(out, snapshot, container.swap.as_ref(), physical, host_pids),
        Err(error) => {
            let _ = writeln!(out, "error: {error}");
        }
    }
}

fn render_region(
    out: &mut String,
    region: &Snapshot,
    swap: Option<&Result<SwapView, String>>,
    physical: &PhysicalView,
    host_pids: &HostPids,
) {
    let monitor = &region.monitor;
    let launches = if monitor.holds_launches() {
        format!("launches HELD by the monitor (recent_kernel {})", monitor.recent_kernel)
    } else {
        format!("launches allowed (recent_kernel {})", monitor.recent_kernel)
    };
    let shares = if monitor.enforces_shares() {
        "compute shares enforced (utilization_switch 1)".to_owned()
    } else {
        "compute shares not enforced (utilization_switch 0)".to_owned()
    };
    let _ = writeln!(
        out,
        "monitor: {launches}; {shares}; priority {}; last kernel {}",
        monitor.priority,
        ago(monitor.last_kernel_time)
    );

    let mut devices = vec![row(&["DEV", "UUID", "BUDGET", "USED", "BUFFERS", "CONTEXTS", "SHARE", "UTIL"])];
    for d in &region.devices {
        devices.push(vec![
            d.index.to_string(),
            d.uuid.clone(),
            d.budget.map_or("none".to_owned(), size),
            size(d.used),
            size(d.slots.data),
            size(d.slots.context),
            share(d.sm_limit).map_or("none".to_owned(), |p| format!("{p} %")),
            format!("{} %", d.slots.sm_util),
        ]);
    }
    out.push('\n');
    table(out, &devices);

    let host_pid =
        |pid: i32| host_pids.get(&region.path, pid).map_or("-".to_owned(), |host| host.to_string());
    let mut processes =
        vec![row(&["PID", "HOST PID", "LEASE", "OWNER", "DEV", "BYTES", "BUFFERS", "CONTEXTS", "UTIL"])];
    for lease in &region.leases {
        let owner = match (lease.state, lease.alive) {
            (LeaseState::Live, true) => "alive",
            (LeaseState::Live, false) => "DEAD",
            (state, _) => state.name(),
        };
        let mut shown = false;
        for (d, held) in lease.devices.iter().enumerate() {
            if held.bytes == 0 && held.slot.total == 0 && held.slot.sm_util == 0 {
                continue;
            }
            shown = true;
            processes.push(vec![
                lease.pid.to_string(),
                host_pid(lease.pid),
                lease.lease.to_string(),
                owner.to_owned(),
                d.to_string(),
                size(held.bytes),
                size(held.slot.data),
                size(held.slot.context),
                format!("{} %", held.slot.sm_util),
            ]);
        }
        if !shown {
            let nothing = [
                &lease.pid.to_string(),
                &host_pid(lease.pid),
                &lease.lease.to_string(),
                owner,
                "-",
                "0 B",
                "0 B",
                "0 B",
                "-",
            ];
            processes.push(nothing.iter().map(|s| s.to_string()).collect());
        }
    }
    out.push('\n');
    if processes.len() > 1 {
        table(out, &processes);
    } else {
        out.push_str("no process holds a lease\n");
    }

    for d in region.devices.iter().filter(|d| d.overcommit) {
        let by_process: Vec<String> = region
            .leases
            .iter()
            .filter(|lease| lease.devices.get(d.index).is_some_and(|held| held.spillable > 0))
            .map(|lease| format!("pid {} {}", lease.pid, size(lease.devices[d.index].spillable)))
            .collect();
        // Where the driver attributes memory to processes (NVML), what the container's processes
        // hold on the card now: managed memory that spilled to the host is not there.
        let resident = physical.by_uuid(&d.uuid).and_then(|gpu| {
            let mut any = false;
            let mut bytes = 0u64;
            for lease in region.leases.iter().filter(|lease| lease.alive) {
                let Some(host) = host_pids.get(&region.path, lease.pid) else { continue };
                if let Some(used) = gpu.processes.iter().find(|p| p.pid as i32 == host).and_then(|p| p.used) {
                    any = true;
                    bytes = bytes.saturating_add(used);
                }
            }
            any.then_some(bytes)
        });
        let _ = writeln!(
            out,
            "\novercommit {}: {} of the {} in use may spill to host memory{}; on the card now (NVML): {}{}",
            d.index,
            size(d.spillable),
            size(d.used),
            if by_process.is_empty() { String::new() } else { format!(" ({})", by_process.join(", ")) },
            resident.map_or("not reported".to_owned(), size),
            if d.spilled { "" } else { "; nothing spillable allocated yet" },
        );
    }
    match swap {
        Some(Ok(swap)) => render_swap(out, swap),
        Some(Err(why)) => {
            let path = crate::containers::printable(&region.path);
            let _ = writeln!(out, "\nswap: cannot read the swap table of {path}: {why}");
        }
        None => {}
    }

    if let PhysicalView::Devices(_) = physical {
        out.push('\n');
        for d in &region.devices {
            match physical.by_uuid(&d.uuid) {
                Some(gpu) => {
                    let processes: Vec<String> = gpu
                        .processes
                        .iter()
                        .map(|p| match p.used {
                            Some(bytes) => format!("{} ({})", p.pid, size(bytes)),
                            None => p.pid.to_string(),
                        })
                        .collect();
                    let _ = writeln!(
                        out,
                        "physical {}: NVML device {}{}, total {}, used {}; processes (host pids): {}",
                        d.index,
                        gpu.index,
                        gpu.name.as_deref().map_or(String::new(), |n| format!(" ({n})")),
                        size(gpu.total),
                        size(gpu.used),
                        if processes.is_empty() { "none".to_owned() } else { processes.join(", ") },
                    );
                }
                None => {
                    let _ = writeln!(out, "physical {}: {} is none of the driver's devices", d.index, d.uuid);
                }
            }
        }
    }

    out.push_str(
        "\nUSED is as far as the ledger knows: CONTEXTS are the contexts' own memory, BUFFERS everything\n\
         else charged (allocations, stream-ordered pools, VMM, arrays, graph memory, Vulkan memory),\n\
         which the ledger does not tell apart. SHARE is the compute share, UTIL the measured one.\n",
    );
    let dead: Vec<_> = region.dead_leases().collect();
    if !dead.is_empty() {
        let bytes = dead.iter().map(|l| l.bytes()).sum::<u64>();
        let _ = writeln!(
            out,
            "{} dead process(es) still hold {}: `vgpu-smi reclaim {}` gives it back\n\
             (a live process of the container does too, within moments).",
            dead.len(),
            size(bytes),
            region.path.display()
        );
    }
    for d in region.devices.iter().filter(|d| d.suspect > 0) {
        let _ = writeln!(
            out,
            "device {}: {} process(es) killed mid-update may have left bytes counted; the next\n\
             reclaim recounts them.",
            d.index, d.suspect
        );
    }
}

/// One line per device where the container's live processes swap: what is on the card and out,
/// the counters, each process's phase, and whether the node's arbiter runs.
fn render_swap(out: &mut String, swap: &SwapView) {
    let arbiter = match swap.since_arbiter() {
        Some(since) if swap.arbiter_active() => {
            format!("arbiter pid {}, last pass {} ms ago", swap.arbiter_pid, since.as_millis())
        }
        Some(since) => {
            format!("no arbiter (last pass {:.1} s ago): spills through unified memory", since.as_secs_f64())
        }
        None => "no arbiter has run: spills through unified memory".to_owned(),
    };
    for d in swap.devices() {
        let processes: Vec<String> = d
            .processes
            .iter()
            .map(|p| {
                let r = &p.record;
                let held = match (r.resident, r.swapped) {
                    (0, 0) => String::new(),
                    (on, 0) => format!(" {}", size(on)),
                    (0, out) => format!(" {}", size(out)),
                    (on, out) => format!(" {} on the card and {} out", size(on), size(out)),
                };
                let waits =
                    if r.waiting { format!(" (waiting for {})", size(r.wanted)) } else { String::new() };
                let stays = match r.unswappable {
                    0 => String::new(),
                    bytes => {
                        format!(", {} that cannot leave the card (exported or mapped twice)", size(bytes))
                    }
                };
                format!("pid {} {}{held}{stays}{waits}", p.pid, r.phase.name())
            })
            .collect();
        let _ = writeln!(
            out,
            "\nswap {}: {} on the card, {} swapped out; {} swap-in(s), {} swap-out(s), {:.3} s waiting to swap in; {}; {arbiter}",
            d.index,
            size(d.resident),
            size(d.swapped),
            d.swap_ins,
            d.swap_outs,
            std::time::Duration::from_nanos(d.wait_ns).as_secs_f64(),
            processes.join(", "),
        );
    }
}

fn row(cells: &[&str]) -> Vec<String> {
    cells.iter().map(|s| s.to_string()).collect()
}

/// Left-aligned columns two spaces apart; the last column is not padded.
fn table(out: &mut String, rows: &[Vec<String>]) {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| rows.iter().filter_map(|r| r.get(c)).map(|s| s.chars().count()).max().unwrap_or(0))
        .collect();
    for r in rows {
        let mut line = String::new();
        for (c, cell) in r.iter().enumerate() {
            if c + 1 == r.len() {
                line.push_str(cell);
            } else {
                let _ = write!(line, "{cell:<width$}  ", width = widths[c]);
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
}

/// `never`, or how long ago a Unix time was.
fn ago(unix_seconds: u64) -> String {
    if unix_seconds == 0 {
        return "never".to_owned();
    }
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    format!("{} s ago", now.saturating_sub(unix_seconds))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_short() {
        assert_eq!(size(0), "0 B");
        assert_eq!(size(1023), "1023 B");
        assert_eq!(size(1536), "1.5 KiB");
        assert_eq!(size(768 << 20), "768.0 MiB");
        assert_eq!(size(1 << 30), "1.0 GiB");
        assert_eq!(size(3 << 40), "3.0 TiB");
    }

    #[test]
    fn shares_of_0_and_100_are_none() {
        assert_eq!(share(0), None);
        assert_eq!(share(100), None);
        assert_eq!(share(30), Some(30));
    }

    #[test]
    fn columns_line_up() {
        let mut out = String::new();
        table(&mut out, &[row(&["A", "BB", "C"]), row(&["long", "x", "y"])]);
        assert_eq!(out, "A     BB  C\nlong  x   y\n");
    }
}
