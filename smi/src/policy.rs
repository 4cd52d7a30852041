//! The node's policy for containers whose processes hold more of a card than their budget, by
//! NVML's count (`vgpu-smi serve --policy`): off unless the operator names one.
//!
//! A container is over on a device when the sum of NVML's figures for its processes there
//! exceeds its budget (its region's, or for a container with no region its processes'
//! environment's; see `accounting`) by more than the margin; a container with no budget is never
//! acted on. The first sample that finds it over starts a
//! clock; only a later sample, at least the grace period on, with every sample between finding it
//! over, acts, and the clock starts again after each action: never on a single sample. Actions:
//! - `report`: a line on stderr, a metric and an event (`/events`);
//! - `kill-newest`: and SIGKILL to the most recently started process of that container that holds
//!   unaccounted memory on that device, through a pidfd opened and checked first (the same start
//!   time, still mapped to that container), so a pid reused meanwhile is never signalled. Where no
//!   process holds unaccounted memory, the newest one in NVML's graphics list: a CUDA process's
//!   OpenGL or codec memory is charged to its lease after the fact (the driver-memory
//!   reconciliation), so it is not unaccounted, and charging it cannot give it back;
//! - `freeze`: and the cgroup v2 freezer on that process's cgroup, when every process NVML lists in
//!   that cgroup is that container's.
//!
//! Only processes mapped to the container (see `accounting`) are ever acted on. In a cgroup that
//! processes of several budgets share (`accounting::SharedCgroup`), only its lease holders: the
//! cgroup is no evidence there, and such a cgroup is never frozen. `serve` says which cgroups are
//! shared when it starts and whenever that changes ([`Watch::sharing`]).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::accounting::{Accounting, BudgetSource, ProcessUse, Route};

/// What to do with a container over its budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Report,
    KillNewest,
    Freeze,
}

impl Action {
    pub fn parse(text: &str) -> Option<Action> {
        match text {
            "report" => Some(Action::Report),
            "kill-newest" => Some(Action::KillNewest),
            "freeze" => Some(Action::Freeze),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Action::Report => "report",
            Action::KillNewest => "kill-newest",
            Action::Freeze => "freeze",
        }
    }
}

/// The operator's policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    pub action: Action,
    /// Bytes over the budget tolerated.
    pub margin: u64,
    /// How long a container must stay over before the policy acts.
    pub grace: Duration,
}

impl Policy {
    /// How often `serve` samples under this policy: four samples a grace period, between 100 ms
    /// and 1 s apart.
    pub fn every(&self) -> Duration {
        (self.grace / 4).clamp(Duration::from_millis(100), Duration::from_secs(1))
    }
}

/// What the policy did, and why.
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    /// Unix time, seconds.
    pub at: f64,
    pub container: String,
    pub uuid: String,
    pub action: Action,
    pub nvml: u64,
    pub budget: u64,
    pub budget_source: BudgetSource,
    pub over_for: Duration,
    /// The process acted on (none for `report`, or when none could be).
    pub pid: Option<u32>,
    /// What was done, in words.
    pub outcome: String,
}

impl Event {
    pub fn line(&self) -> String {
        format!(
            "policy {}: container {} on {}: NVML counts {} bytes against a budget of {} (from its {}) for {:.1} s; {}",
            self.action.name(),
            self.container,
            self.uuid,
            self.nvml,
            self.budget,
            self.budget_source.name(),
            self.over_for.as_secs_f64(),
            self.outcome
        )
    }
}

/// The policy's memory between samples.
pub struct Watch {
    pub policy: Policy,
    /// (container, device) → when it was first seen over, in the current run of samples.
    over_since: HashMap<(String, String), Instant>,
    /// Every event, oldest first (the last 256).
    pub events: Vec<Event>,
    /// Actions taken, by action name.
    pub taken: HashMap<&'static str, u64>,
    /// The cgroups that processes of several budgets shared at the last look.
    shared: BTreeSet<String>,
}

impl Watch {
    pub fn new(policy: Policy) -> Watch {
        Watch {
            policy,
            over_since: HashMap::new(),
            events: Vec::new(),
            taken: HashMap::new(),
            shared: BTreeSet::new(),
        }
    }

    /// A line for each cgroup that processes of several budgets share in `accounting` and did not at
    /// the last look, and for each that no longer is; every shared one the first time.
    pub fn sharing(&mut self, accounting: &Accounting) -> Vec<String> {
        let now: BTreeMap<&str, String> =
            accounting.shared_cgroups.iter().map(|s| (s.cgroup.as_str(), s.to_string())).collect();
        let mut lines: Vec<String> = now
            .iter()
            .filter(|(cgroup, _)| !self.shared.contains(**cgroup))
            .map(|(_, shared)| {
                format!("{shared}: there it acts only on lease holders, and never freezes the cgroup")
            })
            .collect();
        for gone in self.shared.iter().filter(|cgroup| !now.contains_key(cgroup.as_str())) {
            lines.push(format!("cgroup {} is no longer shared by budgets", gone.escape_debug()));
        }
        self.shared = now.into_keys().map(str::to_owned).collect();
        lines
    }

    /// Containers and devices over their budget now, with how long.
    pub fn over(&self, now: Instant) -> Vec<(String, String, Duration)> {
        self.over_since.iter().map(|((c, u), since)| (c.clone(), u.clone(), now - *since)).collect()
    }

    /// Looks at one sample taken at `now`; acts where the grace period has passed. Returns the
    /// events of this sample.
    pub fn sample(&mut self, accounting: &Accounting, now: Instant) -> Vec<Event> {
        let mut still_over = HashMap::new();
        let mut events = Vec::new();
        for container in &accounting.containers {
            for device in &container.devices {
                let (Some(budget), Some(budget_source)) = (device.budget, device.budget_source) else {
                    continue;
                };
                if device.nvml <= budget.saturating_add(self.policy.margin) {
                    continue;
                }
                let key = (container.name.clone(), device.uuid.clone());
                let since = self.over_since.get(&key).copied().unwrap_or(now);
                let over_for = now - since;
                if over_for < self.policy.grace || since == now {
                    still_over.insert(key, since);
                    continue;
                }
                // Acted on: the next action needs a new grace period.
                let newest = |holds: &dyn Fn(&ProcessUse) -> bool| {
                    container
                        .processes
                        .iter()
                        .filter(|p| p.uuid == device.uuid && p.nvml > 0 && holds(p))
                        .max_by_key(|p| (p.start, p.host_pid))
                };
                let newest = |holds: &dyn Fn(&ProcessUse) -> bool| {
                    newest(&|p| holds(p) && p.unaccounted > 0).or_else(|| newest(&|p| holds(p) && p.graphics))
                };
                let held_back = newest(&|_| true).is_some();
                let (pid, outcome) = match (self.policy.action, newest(&may_act_on)) {
                    (Action::Report, _) => (None, "reported only (policy report)".to_owned()),
                    (_, None) if held_back => (
                        None,
                        "its processes holding unaccounted or graphics memory there hold no lease and are in a \
                         cgroup that processes of several budgets share; nothing done"
                            .to_owned(),
                    ),
                    (_, None) => (
                        None,
                        "no process of it holds unaccounted memory or graphics memory there; nothing done"
                            .to_owned(),
                    ),
                    (Action::KillNewest, Some(p)) => (Some(p.host_pid), kill(p, &container.name, accounting)),
                    (Action::Freeze, Some(p)) => (Some(p.host_pid), freeze(p, &container.name, accounting)),
                };
                *self.taken.entry(self.policy.action.name()).or_default() += 1;
                events.push(Event {
                    at: SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64()),
                    container: container.name.clone(),
                    uuid: device.uuid.clone(),
                    action: self.policy.action,
                    nvml: device.nvml,
                    budget,
                    budget_source,
                    over_for,
                    pid,
                    outcome,
                });
            }
        }
        self.over_since = still_over;
        self.events.extend(events.iter().cloned());
        let excess = self.events.len().saturating_sub(256);
        self.events.drain(..excess);
        events
    }
}

/// Whether the policy may act on `process`: in a cgroup that processes of several budgets share,
/// only on a lease holder, whose lease says whose it is.
fn may_act_on(process: &ProcessUse) -> bool {
    process.route == Route::Lease || !process.shared_cgroup
}

/// SIGKILL to `process` through a pidfd, once it is checked to be the very process accounted to
/// `container` (same start time, same container by a fresh look).
fn kill(process: &ProcessUse, container: &str, accounting: &Accounting) -> String {
    let pid = process.host_pid;
    let what = format!("host pid {pid} ({})", why(process));
    let Some(pidfd) = PidFd::open(pid) else { return format!("{what} was gone; nothing done") };
    if crate::accounting::start_time(pid) != Some(process.start) || !still_in(pid, container, accounting) {
        return format!("{what} is no longer that process; nothing done");
    }
    match pidfd.kill() {
        Ok(()) => format!("sent SIGKILL to {what}"),
        Err(error) => format!("could not signal {what}: {error}"),
    }
}

/// Why `process` was the one acted on.
fn why(process: &ProcessUse) -> String {
    if process.unaccounted > 0 {
        format!(
            "the newest of its processes with unaccounted memory: {} of its {} bytes, found by {}",
            process.unaccounted,
            process.nvml,
            process.route.name()
        )
    } else {
        format!(
            "none holds unaccounted memory; the newest in NVML's graphics list, {} bytes charged after the \
             fact, found by {}",
            process.nvml,
            process.route.name()
        )
    }
}

/// Whether `pid` is still accounted to `container`: the accounting passed in names it there (it
/// was mapped moments ago; the start time, checked by the caller, proves it is the same process).
fn still_in(pid: u32, container: &str, accounting: &Accounting) -> bool {
    let mut owners = accounting
        .containers
        .iter()
        .filter(|c| c.processes.iter().any(|p| p.host_pid == pid))
        .map(|c| c.name.as_str());
    owners.next() == Some(container) && owners.next().is_none()
}

/// Freezes `process`'s cgroup (v2), if every process NVML lists in it is `container`'s.
fn freeze(process: &ProcessUse, container: &str, accounting: &Accounting) -> String {
    let pid = process.host_pid;
    let Some(cgroup) = crate::accounting::cgroup_of(pid).filter(|c| c != "/") else {
        return format!("host pid {pid} is in no cgroup of its own; nothing frozen");
    };
    if process.shared_cgroup || accounting.is_shared(&cgroup) {
        return format!(
            "cgroup {} of host pid {pid} holds processes of several budgets; nothing frozen",
            cgroup.escape_debug()
        );
    }
    let strangers = accounting
        .containers
        .iter()
        .filter(|c| c.name != container)
        .flat_map(|c| &c.processes)
        .map(|p| p.host_pid)
        .chain(accounting.unmapped.iter().map(|u| u.host_pid))
        .any(|other| crate::accounting::cgroup_of(other).as_deref() == Some(cgroup.as_str()));
    if strangers {
        return format!("cgroup {cgroup} of host pid {pid} holds other processes; nothing frozen");
    }
    let Some(root) = crate::accounting::cgroup2_root() else {
        return "no cgroup v2 hierarchy; nothing frozen".to_owned();
    };
    let Some(dir) = crate::accounting::cgroup_dir(&root, &cgroup) else {
        return format!("cgroup {} is outside this cgroup namespace; nothing frozen", cgroup.escape_debug());
    };
    let file = dir.join("cgroup.freeze");
    match std::fs::write(&file, "1") {
        Ok(()) => format!("froze cgroup {cgroup} (host pid {pid}, {})", why(process)),
        Err(error) => format!("could not freeze cgroup {cgroup}: {error}"),
    }
}

/// A process descriptor: a signal through it reaches that process or none, never a later one
/// with its pid.
struct PidFd(libc::c_int);

impl PidFd {
    fn open(pid: u32) -> Option<PidFd> {
        // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
        (fd >= 0).then(|| PidFd(fd as libc::c_int))
    }

    fn kill(&self) -> std::io::Result<()> {
        // SAFETY: our own pidfd; no siginfo; flags 0.
        let done = unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                self.0,
                libc::SIGKILL,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        };
        if done == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) }
    }
}

impl Drop for PidFd {
    fn drop(&mut self) {
        // SAFETY: our own descriptor, closed once.
        unsafe { libc::close(self.0) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::accounting::{ContainerUse, DeviceUse};

    fn over(nvml: u64) -> Accounting {
        Accounting {
            containers: vec![ContainerUse {
                name: "pod_a".into(),
                has_region: true,
                devices: vec![DeviceUse {
                    uuid: "GPU-1".into(),
                    physical_index: Some(0),
                    budget: Some(100),
                    budget_source: Some(BudgetSource::Region),
                    known: 0,
                    nvml,
                    unaccounted: nvml,
                }],
                processes: Vec::new(),
                environment_refused: None,
            }],
            unmapped: Vec::new(),
            shared_cgroups: Vec::new(),
        }
    }

    #[test]
    fn one_sample_never_acts_and_the_grace_period_must_pass() {
        let policy = Policy { action: Action::Report, margin: 10, grace: Duration::from_secs(2) };
        let mut watch = Watch::new(policy);
        let t0 = Instant::now();
        assert!(watch.sample(&over(111), t0).is_empty(), "first sample");
        assert!(watch.sample(&over(111), t0 + Duration::from_secs(1)).is_empty(), "within the grace period");
        assert!(watch.sample(&over(110), t0 + Duration::from_secs(2)).is_empty(), "within the margin: reset");
        assert!(watch.sample(&over(200), t0 + Duration::from_secs(3)).is_empty(), "a new run starts");
        let events = watch.sample(&over(200), t0 + Duration::from_secs(5));
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].pid, None);
        assert!(events[0].line().contains("reported only"), "{}", events[0].line());
        assert!(watch.sample(&over(200), t0 + Duration::from_secs(6)).is_empty(), "a new grace period");
        assert_eq!(watch.taken.get("report"), Some(&1));
    }

    #[test]
    fn with_only_charged_memory_the_newest_graphics_process_is_chosen() {
        // A CUDA process whose OpenGL textures its lease charged after the fact: no unaccounted
        // bytes, but it is in NVML's graphics list. A child of this test stands in for it.
        let mut child = std::process::Command::new("sleep").arg("30").spawn().expect("sleep");
        let policy = Policy { action: Action::KillNewest, margin: 0, grace: Duration::ZERO };
        let mut watch = Watch::new(policy);
        let mut accounting = over(300);
        accounting.containers[0].processes.push(ProcessUse {
            host_pid: child.id(),
            start: crate::accounting::start_time(child.id()).expect("start time"),
            uuid: "GPU-1".into(),
            nvml: 300,
            lease: Some(300),
            unaccounted: 0,
            graphics: true,
            route: Route::Lease,
            shared_cgroup: false,
        });
        let t0 = Instant::now();
        watch.sample(&accounting, t0);
        let events = watch.sample(&accounting, t0 + Duration::from_millis(1));
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].pid, Some(child.id()));
        assert!(
            events[0].outcome.contains("sent SIGKILL") && events[0].outcome.contains("graphics"),
            "{}",
            events[0].outcome
        );
        let status = child.wait().expect("wait");
        assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(libc::SIGKILL));
    }

    fn sleeper() -> (std::process::Child, ProcessUse) {
        let child = std::process::Command::new("sleep").arg("30").spawn().expect("sleep");
        let process = ProcessUse {
            host_pid: child.id(),
            start: crate::accounting::start_time(child.id()).expect("start time"),
            uuid: "GPU-1".into(),
            nvml: 150,
            lease: None,
            unaccounted: 150,
            graphics: true,
            route: Route::Cgroup,
            shared_cgroup: true,
        };
        (child, process)
    }

    #[test]
    fn in_a_cgroup_several_budgets_share_only_a_lease_holder_is_acted_on() {
        let policy = Policy { action: Action::KillNewest, margin: 0, grace: Duration::ZERO };
        let t0 = Instant::now();
        let (mut holder, mut holder_use) = sleeper();
        holder_use.route = Route::Lease;
        let (mut stranger, stranger_use) = sleeper();
        // Only a process found by its cgroup, in a shared one: nothing is done, and the line says why.
        let mut accounting = over(300);
        accounting.containers[0].processes.push(stranger_use);
        let mut watch = Watch::new(policy);
        watch.sample(&accounting, t0);
        let events = watch.sample(&accounting, t0 + Duration::from_millis(1));
        assert_eq!(events[0].pid, None);
        assert!(events[0].outcome.contains("several budgets share; nothing done"), "{}", events[0].outcome);
        // With a lease holder there too, the lease holder is the one.
        accounting.containers[0].processes.push(holder_use);
        let mut watch = Watch::new(policy);
        watch.sample(&accounting, t0);
        let events = watch.sample(&accounting, t0 + Duration::from_millis(1));
        assert_eq!(events[0].pid, Some(holder.id()), "{}", events[0].outcome);
        let status = holder.wait().expect("wait");
        assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(libc::SIGKILL));
        assert!(stranger.try_wait().expect("try_wait").is_none(), "the cgroup's process was killed");
        let _ = stranger.kill();
        let _ = stranger.wait();
    }

    #[test]
    fn a_cgroup_several_budgets_share_is_never_frozen() {
        let me = std::process::id();
        let cgroup = crate::accounting::cgroup_of(me).expect("a cgroup");
        let mut accounting = over(300);
        accounting.shared_cgroups.push(crate::accounting::SharedCgroup {
            cgroup: cgroup.clone(),
            containers: vec!["pod_a".into()],
            contradicted: None,
        });
        let process = ProcessUse {
            host_pid: me,
            start: crate::accounting::start_time(me).expect("start time"),
            uuid: "GPU-1".into(),
            nvml: 300,
            lease: Some(100),
            unaccounted: 200,
            graphics: false,
            route: Route::Lease,
            shared_cgroup: false,
        };
        let outcome = freeze(&process, "pod_a", &accounting);
        let expected =
            if cgroup == "/" { "no cgroup of its own" } else { "holds processes of several budgets" };
        assert!(outcome.contains(expected) && outcome.ends_with("nothing frozen"), "{outcome}");
    }

    #[test]
    fn serve_says_which_cgroups_are_shared_once_and_when_that_ends() {
        let mut watch = Watch::new(Policy { action: Action::Report, margin: 0, grace: Duration::ZERO });
        let mut accounting = over(0);
        accounting.shared_cgroups.push(crate::accounting::SharedCgroup {
            cgroup: "/jobs.slice".into(),
            containers: vec!["pod_a".into(), "pod_b".into()],
            contradicted: None,
        });
        let lines = watch.sharing(&accounting);
        assert_eq!(lines.len(), 1);
        assert!(
            lines[0].starts_with("cgroup /jobs.slice holds lease holders of pod_a, pod_b: "),
            "{}",
            lines[0]
        );
        assert!(watch.sharing(&accounting).is_empty(), "said once");
        accounting.shared_cgroups.clear();
        assert_eq!(
            watch.sharing(&accounting),
            vec!["cgroup /jobs.slice is no longer shared by budgets".to_owned()]
        );
    }

    #[test]
    fn without_a_process_holding_unaccounted_memory_nothing_is_killed() {
        let policy = Policy { action: Action::KillNewest, margin: 0, grace: Duration::ZERO };
        let mut watch = Watch::new(policy);
        let mut accounting = over(300);
        accounting.containers[0].processes.push(ProcessUse {
            host_pid: std::process::id(),
            start: 0,
            uuid: "GPU-1".into(),
            nvml: 300,
            lease: Some(300),
            unaccounted: 0,
            graphics: false,
            route: Route::Lease,
            shared_cgroup: false,
        });
        let t0 = Instant::now();
        watch.sample(&accounting, t0);
        let events = watch.sample(&accounting, t0 + Duration::from_millis(1));
        assert_eq!(events.len(), 1);
        assert!(events[0].outcome.contains("nothing done"), "{}", events[0].outcome);
    }
}
