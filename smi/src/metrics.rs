//! The OpenMetrics text exposition of everything `vgpu-smi` shows: every metric a gauge but the
//! `_total` ones (counters), with its unit and help, ending with `# EOF`. Names, units and labels are documented in docs/metrics.md;
//! where HAMi's monitor exports the same quantity, the value means what HAMi's does.
//!
//! The same text parses as Prometheus's classic text format (`# UNIT` and `# EOF` are comments
//! there), so it is served under either content type.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::time::{SystemTime, UNIX_EPOCH};

use vgpu_ledger::inspect::Snapshot;

use crate::accounting::Accounting;
use crate::arbiter::Requests;
use crate::containers::{Container, Listing};
use crate::physical::PhysicalView;
use crate::policy::{Action, Watch};
use crate::swap_tables::SwapView;

/// One metric family: its samples, each a rendered label set and a rendered value.
struct Family {
    name: &'static str,
    unit: Option<&'static str>,
    help: &'static str,
    samples: Vec<(String, String)>,
}

/// The families in the order they are written; see docs/metrics.md for each.
const FAMILIES: &[(&str, Option<&str>, &str)] = &[
    ("vgpu_smi_info", None, "vgpu-smi's version (value 1)"),
    (
        "vgpu_region_up",
        None,
        "1 if the container's region file was read, 0 if it is missing, unreadable or invalid",
    ),
    ("vgpu_region_error_info", None, "Why a region file could not be read (value 1, kind in a label)"),
    ("vgpu_memory_limit_bytes", Some("bytes"), "Container's memory budget on the device (0: none)"),
    ("vgpu_memory_used_bytes", Some("bytes"), "Container's device memory in use, as the ledger counts it"),
    ("vgpu_memory_context_bytes", Some("bytes"), "Container's contexts' own memory, summed over its slots"),
    (
        "vgpu_memory_buffer_bytes",
        Some("bytes"),
        "Container's memory other than contexts, summed over its slots",
    ),
    (
        "vgpu_context_cost_bytes",
        Some("bytes"),
        "What one context costs on the device, as first measured in the container",
    ),
    (
        "vgpu_memory_suspect_leases",
        None,
        "Leases of processes killed mid-update, not yet settled by a recount",
    ),
    (
        "vgpu_memory_overcommit",
        None,
        "1 if the device is overcommitted (CUDA_OVERSUBSCRIBE): its budget may exceed the card",
    ),
    (
        "vgpu_memory_spillable_bytes",
        Some("bytes"),
        "Of the container's memory in use, the bytes that may spill to host memory (overcommitted)",
    ),
    ("vgpu_compute_limit_percent", Some("percent"), "Container's compute share of the device (0: none)"),
    (
        "vgpu_compute_utilization_percent",
        Some("percent"),
        "Container's measured share of the device's time, summed over its processes",
    ),
    (
        "vgpu_monitor_utilization_switch",
        None,
        "The monitor's utilization_switch (0: compute shares not enforced)",
    ),
    (
        "vgpu_monitor_recent_kernel",
        None,
        "The monitor's recent_kernel (positive: launched lately; negative: launches held)",
    ),
    ("vgpu_launches_held", None, "1 while the monitor holds the container's launches (recent_kernel < 0)"),
    ("vgpu_task_priority", None, "The container's CUDA_TASK_PRIORITY as stored in the region"),
    ("vgpu_last_kernel_elapsed_seconds", Some("seconds"), "Seconds since the container last launched work"),
    ("vgpu_leases", None, "Processes holding a lease, by whether their owner lives"),
    ("vgpu_process_alive", None, "1 if the lease's process lives, 0 if it died and its bytes still count"),
    ("vgpu_process_memory_bytes", Some("bytes"), "Device memory a process holds, as the ledger counts it"),
    (
        "vgpu_process_memory_spillable_bytes",
        Some("bytes"),
        "Of a process's memory, the bytes that may spill to host memory (overcommitted)",
    ),
    ("vgpu_process_utilization_percent", Some("percent"), "A process's measured share of the device's time"),
    (
        "vgpu_scan_skipped_entries",
        None,
        "Entries of the scanned directory not opened (links, non-regular files, odd names, past the caps)",
    ),
    ("vgpu_physical_view_available", None, "1 if the NVIDIA driver answered (NVML), 0 without one"),
    ("vgpu_physical_memory_total_bytes", Some("bytes"), "Physical device's memory, as the driver reports it"),
    (
        "vgpu_physical_memory_used_bytes",
        Some("bytes"),
        "Physical device's memory in use by every process, as the driver reports it",
    ),
    (
        "vgpu_physical_mps_clients",
        None,
        "Processes running on the device as clients of an MPS server, as the driver lists them",
    ),
    (
        "vgpu_physical_process_memory_bytes",
        Some("bytes"),
        "Device memory of a process (host pid), as the driver reports it",
    ),
    (
        "vgpu_container_nvml_memory_bytes",
        Some("bytes"),
        "Device memory of a container's processes by the driver's count (NVML), whatever API took it",
    ),
    (
        "vgpu_container_known_memory_bytes",
        Some("bytes"),
        "Device memory of a container that its ledger knows (0 without a region)",
    ),
    (
        "vgpu_container_unaccounted_memory_bytes",
        Some("bytes"),
        "Device memory of a container's processes that no lease charged (OpenGL, codecs, direct driver use)",
    ),
    (
        "vgpu_container_budget_bytes",
        Some("bytes"),
        "A container's budget on the device, and where it came from (source: region, or its processes' environment for a container with no region)",
    ),
    (
        "vgpu_container_environment_budget_refused",
        None,
        "1 for a container with no region whose processes' budget variables gave no budget, by why (disagree, bad_value, no_device_mapping, too_large)",
    ),
    (
        "vgpu_unmapped_process_memory_bytes",
        Some("bytes"),
        "Device memory of a process (host pid) in no known container, as the driver reports it",
    ),
    (
        "vgpu_shared_cgroup",
        None,
        "1 for a cgroup that processes of several budgets share (lease holders of several containers, or a process whose environment names another budget): the cgroup maps no process there",
    ),
    (
        "vgpu_policy_over_budget",
        None,
        "1 while the node's policy sees a container over its budget on a device",
    ),
    ("vgpu_policy_actions", None, "Times the node's policy acted, by action, since serve started"),
    (
        "vgpu_swap_resident_bytes",
        Some("bytes"),
        "Swappable memory of the container's live processes on the card (swap table)",
    ),
    (
        "vgpu_swap_swapped_bytes",
        Some("bytes"),
        "Swappable memory of the container's live processes swapped out to host memory",
    ),
    ("vgpu_swap_waiting_processes", None, "The container's live processes waiting for room on the device"),
    (
        "vgpu_swap_unswappable_bytes",
        Some("bytes"),
        "A process's own VMM memory under the swap that cannot leave the card (exported, or mapped twice or in part)",
    ),
    // Counters: the family named with `_total`, as Prometheus's text format wants it (promtool);
    // no UNIT line, whose unit OpenMetrics wants at the end of the family's name.
    ("vgpu_swap_ins_total", None, "Times a process brought its memory back onto the card"),
    ("vgpu_swap_outs_total", None, "Times a process swapped its memory out to host memory"),
    (
        "vgpu_swap_wait_seconds_total",
        None,
        "Seconds a process's calls spent waiting for its memory to come back onto the card",
    ),
    (
        "vgpu_swap_requests_total",
        None,
        "Swap-out requests the node's arbiter (serve --swap) made, by GPU and kind (idle, forced), since serve started",
    ),
    (
        "vgpu_swap_priority_requests_total",
        None,
        "Of those, the requests made of a process of lower priority than the process it made room for (it gave way at once)",
    ),
];

struct Exposition {
    families: Vec<Family>,
}

impl Exposition {
    fn new() -> Exposition {
        let families = FAMILIES
            .iter()
            .map(|&(name, unit, help)| Family { name, unit, help, samples: Vec::new() })
            .collect();
        Exposition { families }
    }

    fn add(&mut self, name: &str, labels: &[(&str, &str)], value: impl Into<i128>) {
        self.add_rendered(name, labels, value.into().to_string());
    }

    /// A sample of `nanos` nanoseconds, in seconds, exactly.
    fn add_seconds(&mut self, name: &str, labels: &[(&str, &str)], nanos: u64) {
        self.add_rendered(name, labels, seconds(nanos));
    }

    fn add_rendered(&mut self, name: &str, labels: &[(&str, &str)], value: String) {
        let family = self.families.iter_mut().find(|f| f.name == name).expect("a listed family");
        family.samples.push((render_labels(labels), value));
    }

    fn finish(self) -> String {
        let mut out = String::new();
        for family in self.families.iter().filter(|f| !f.samples.is_empty()) {
            let kind = if family.name.ends_with("_total") { "counter" } else { "gauge" };
            let _ = writeln!(out, "# TYPE {} {kind}", family.name);
            if let Some(unit) = family.unit {
                let _ = writeln!(out, "# UNIT {} {unit}", family.name);
            }
            let _ = writeln!(out, "# HELP {} {}", family.name, family.help);
            for (labels, value) in &family.samples {
                let _ = writeln!(out, "{}{labels} {value}", family.name);
            }
        }
        out.push_str("# EOF\n");
        out
    }
}

/// `{a="x",b="y"}` with values escaped, or nothing for no labels.
fn render_labels(labels: &[(&str, &str)]) -> String {
    if labels.is_empty() {
        return String::new();
    }
    let pairs: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{}\"", escape(v))).collect();
    format!("{{{}}}", pairs.join(","))
}

fn escape(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// `nanos` as decimal seconds, exactly (`1.5`, `0.000000001`, `3`).
fn seconds(nanos: u64) -> String {
    let whole = nanos / 1_000_000_000;
    let fraction = nanos % 1_000_000_000;
    if fraction == 0 {
        return whole.to_string();
    }
    let digits = format!("{fraction:09}");
    format!("{whole}.{}", digits.trim_end_matches('0'))
}

/// The exposition for `listing` and the driver's devices, with the node policy's state under
/// `serve --policy` and the swap arbiter's requests (by GPU) under `serve --swap`.
pub fn render(
    listing: &Listing,
    physical: &PhysicalView,
    policy: Option<&Watch>,
    swap_requests: Option<&BTreeMap<String, Requests>>,
) -> String {
    let mut x = Exposition::new();
    x.add("vgpu_smi_info", &[("version", env!("CARGO_PKG_VERSION"))], 1);
    for container in &listing.containers {
        add_container(&mut x, container);
    }
    if listing.directory {
        let root = listing.root.display().to_string();
        x.add("vgpu_scan_skipped_entries", &[("root", root.as_str())], listing.skipped.len() as u64);
    }
    match physical {
        PhysicalView::Unavailable(_) => x.add("vgpu_physical_view_available", &[], 0),
        PhysicalView::Devices(devices) => {
            x.add("vgpu_physical_view_available", &[], 1);
            for d in devices {
                let index = d.index.to_string();
                let labels = [("device_index", index.as_str()), ("device_uuid", d.uuid.as_str())];
                x.add("vgpu_physical_memory_total_bytes", &labels, d.total);
                x.add("vgpu_physical_memory_used_bytes", &labels, d.used);
                if let Some(clients) = d.mps_clients {
                    x.add("vgpu_physical_mps_clients", &labels, clients);
                }
                for p in &d.processes {
                    if let Some(used) = p.used {
                        let pid = p.pid.to_string();
                        let labels = [labels[0], labels[1], ("pid", pid.as_str())];
                        x.add("vgpu_physical_process_memory_bytes", &labels, used);
                    }
                }
            }
            add_accounting(&mut x, &crate::accounting::account(listing, physical));
        }
    }
    if let Some(watch) = policy {
        for (container, uuid, _) in watch.over(std::time::Instant::now()) {
            x.add("vgpu_policy_over_budget", &[("container", &container), ("device_uuid", &uuid)], 1);
        }
        for action in [Action::Report, Action::KillNewest, Action::Freeze] {
            let taken = watch.taken.get(action.name()).copied().unwrap_or(0);
            x.add("vgpu_policy_actions", &[("action", action.name())], taken);
        }
    }
    for (uuid, requests) in swap_requests.into_iter().flatten() {
        for (kind, count) in [("idle", requests.idle), ("forced", requests.forced)] {
            x.add("vgpu_swap_requests_total", &[("device_uuid", uuid.as_str()), ("kind", kind)], count);
        }
        x.add("vgpu_swap_priority_requests_total", &[("device_uuid", uuid.as_str())], requests.priority);
    }
    x.finish()
}

fn add_accounting(x: &mut Exposition, accounting: &Accounting) {
    for container in &accounting.containers {
        for d in &container.devices {
            let labels = [("container_dir", container.name.as_str()), ("device_uuid", d.uuid.as_str())];
            x.add("vgpu_container_nvml_memory_bytes", &labels, d.nvml);
            x.add("vgpu_container_known_memory_bytes", &labels, d.known);
            x.add("vgpu_container_unaccounted_memory_bytes", &labels, d.unaccounted);
            if let (Some(budget), Some(source)) = (d.budget, d.budget_source) {
                let labels = [labels[0], labels[1], ("source", source.name())];
                x.add("vgpu_container_budget_bytes", &labels, budget);
            }
        }
        if let Some(refused) = &container.environment_refused {
            let labels = [("container_dir", container.name.as_str()), ("reason", refused.kind())];
            x.add("vgpu_container_environment_budget_refused", &labels, 1);
        }
    }
    for u in &accounting.unmapped {
        let pid = u.host_pid.to_string();
        let labels = [("pid", pid.as_str()), ("device_uuid", u.uuid.as_str())];
        x.add("vgpu_unmapped_process_memory_bytes", &labels, u.nvml.unwrap_or(0));
    }
    for shared in &accounting.shared_cgroups {
        x.add("vgpu_shared_cgroup", &[("cgroup", shared.cgroup.as_str())], 1);
    }
}

fn add_container(x: &mut Exposition, container: &Container) {
    let path = container.path.display().to_string();
    let mut base = vec![("region", path.as_str())];
    if let (Some(uid), Some(name)) = (&container.pod_uid, &container.name) {
        base.push(("pod_uid", uid.as_str()));
        base.push(("container", name.as_str()));
    }
    let region = match &container.region {
        Ok(region) => region,
        Err(error) => {
            x.add("vgpu_region_up", &base, 0);
            let mut labels = base.clone();
            labels.push(("kind", error.kind()));
            x.add("vgpu_region_error_info", &labels, 1);
            return;
        }
    };
    x.add("vgpu_region_up", &base, 1);
    add_region(x, &base, region);
    if let Some(Ok(swap)) = &container.swap {
        add_swap(x, &base, region, swap);
    }
}

/// The swap table's figures: per device, what the live processes hold on the card and in host
/// memory and how many wait; per process, its swap counters (a counter of its own: a container's
/// sum would go down when a process exits).
fn add_swap(x: &mut Exposition, base: &[(&str, &str)], region: &Snapshot, swap: &SwapView) {
    for device in swap.devices() {
        let Some(uuid) = region.devices.get(device.index).map(|d| d.uuid.as_str()) else { continue };
        let index = device.index.to_string();
        let mut labels = base.to_vec();
        labels.extend([("vdevice_index", index.as_str()), ("device_uuid", uuid)]);
        x.add("vgpu_swap_resident_bytes", &labels, device.resident);
        x.add("vgpu_swap_swapped_bytes", &labels, device.swapped);
        x.add("vgpu_swap_waiting_processes", &labels, device.waiting as u64);
        for process in &device.processes {
            let (pid, lease) = (process.pid.to_string(), process.lease.to_string());
            let mut labels = base.to_vec();
            labels.extend([
                ("pid", pid.as_str()),
                ("lease", lease.as_str()),
                ("vdevice_index", index.as_str()),
                ("device_uuid", uuid),
            ]);
            x.add("vgpu_swap_ins_total", &labels, process.record.swap_ins);
            x.add("vgpu_swap_outs_total", &labels, process.record.swap_outs);
            x.add_seconds("vgpu_swap_wait_seconds_total", &labels, process.record.wait_ns);
            x.add("vgpu_swap_unswappable_bytes", &labels, process.record.unswappable);
        }
    }
}

fn add_region(x: &mut Exposition, base: &[(&str, &str)], region: &Snapshot) {
    for d in &region.devices {
        let index = d.index.to_string();
        let mut labels = base.to_vec();
        labels.extend([("vdevice_index", index.as_str()), ("device_uuid", d.uuid.as_str())]);
        x.add("vgpu_memory_limit_bytes", &labels, d.budget.unwrap_or(0));
        x.add("vgpu_memory_used_bytes", &labels, d.used);
        x.add("vgpu_memory_context_bytes", &labels, d.slots.context);
        x.add("vgpu_memory_buffer_bytes", &labels, d.slots.data);
        if let Some(cost) = d.context_cost {
            x.add("vgpu_context_cost_bytes", &labels, cost);
        }
        x.add("vgpu_memory_suspect_leases", &labels, d.suspect);
        if d.overcommit {
            x.add("vgpu_memory_overcommit", &labels, 1);
            x.add("vgpu_memory_spillable_bytes", &labels, d.spillable);
        }
        x.add("vgpu_compute_limit_percent", &labels, crate::table::share(d.sm_limit).unwrap_or(0));
        x.add("vgpu_compute_utilization_percent", &labels, d.slots.sm_util);
    }
    let monitor = &region.monitor;
    x.add("vgpu_monitor_utilization_switch", base, monitor.utilization_switch);
    x.add("vgpu_monitor_recent_kernel", base, monitor.recent_kernel);
    x.add("vgpu_launches_held", base, u8::from(monitor.holds_launches()));
    x.add("vgpu_task_priority", base, monitor.priority);
    if monitor.last_kernel_time > 0 {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        x.add("vgpu_last_kernel_elapsed_seconds", base, now.saturating_sub(monitor.last_kernel_time));
    }
    let dead = region.dead_leases().count();
    let alive = region.leases.iter().filter(|l| l.alive).count();
    for (owner, count) in [("alive", alive), ("dead", dead)] {
        let mut labels = base.to_vec();
        labels.push(("owner", owner));
        x.add("vgpu_leases", &labels, count as u64);
    }
    for lease in &region.leases {
        let (pid, index) = (lease.pid.to_string(), lease.lease.to_string());
        let mut labels = base.to_vec();
        labels.extend([("pid", pid.as_str()), ("lease", index.as_str())]);
        x.add("vgpu_process_alive", &labels, u8::from(lease.alive));
        for (d, held) in lease.devices.iter().enumerate() {
            if held.bytes == 0 && held.slot.sm_util == 0 {
                continue;
            }
            let device = &region.devices[d];
            let index = d.to_string();
            let mut labels = labels.clone();
            labels.extend([("vdevice_index", index.as_str()), ("device_uuid", device.uuid.as_str())]);
            x.add("vgpu_process_memory_bytes", &labels, held.bytes);
            if device.overcommit {
                x.add("vgpu_process_memory_spillable_bytes", &labels, held.spillable);
            }
            x.add("vgpu_process_utilization_percent", &labels, held.slot.sm_util);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(render_labels(&[]), "");
        assert_eq!(render_labels(&[("a", "x"), ("b", "q\"\\\n")]), r#"{a="x",b="q\"\\\n"}"#);
    }

    #[test]
    fn only_families_with_samples_are_written_and_the_text_ends_with_eof() {
        let mut x = Exposition::new();
        x.add("vgpu_region_up", &[("region", "/r")], 0);
        x.add("vgpu_memory_used_bytes", &[("region", "/r")], 5u64);
        let text = x.finish();
        assert_eq!(
            text,
            "# TYPE vgpu_region_up gauge\n\
             # HELP vgpu_region_up 1 if the container's region file was read, 0 if it is missing, unreadable or invalid\n\
             vgpu_region_up{region=\"/r\"} 0\n\
             # TYPE vgpu_memory_used_bytes gauge\n\
             # UNIT vgpu_memory_used_bytes bytes\n\
             # HELP vgpu_memory_used_bytes Container's device memory in use, as the ledger counts it\n\
             vgpu_memory_used_bytes{region=\"/r\"} 5\n\
             # EOF\n"
        );
    }

    #[test]
    fn seconds_are_exact() {
        assert_eq!(seconds(0), "0");
        assert_eq!(seconds(1_500_000_000), "1.5");
        assert_eq!(seconds(1), "0.000000001");
        assert_eq!(seconds(u64::MAX), "18446744073.709551615");
    }

    #[test]
    fn counters_are_the_total_families() {
        let mut x = Exposition::new();
        x.add_seconds("vgpu_swap_wait_seconds_total", &[("pid", "1")], 250_000_000);
        assert_eq!(
            x.finish(),
            "# TYPE vgpu_swap_wait_seconds_total counter\n\
             # HELP vgpu_swap_wait_seconds_total Seconds a process's calls spent waiting for its memory to come back onto the card\n\
             vgpu_swap_wait_seconds_total{pid=\"1\"} 0.25\n\
             # EOF\n"
        );
        for (name, unit, _) in FAMILIES {
            assert!(
                !(name.ends_with("_total") && unit.is_some()),
                "{name}: a counter's unit would not end its name"
            );
        }
    }

    #[test]
    fn units_are_name_suffixes() {
        for (name, unit, _) in FAMILIES {
            if let Some(unit) = unit {
                assert!(name.ends_with(&format!("_{unit}")), "{name} has unit {unit}");
            }
        }
    }
}
