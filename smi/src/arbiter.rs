//! The swap arbiter (`vgpu-smi serve --swap`): when a process of an overcommitted container waits
//! for room on a GPU, asks the least recently active idle process on that GPU, of any container,
//! to swap its memory out whole (docs/overcommit.md, "Swapping whole processes").
//!
//! Containers cannot see each other; the node can. Each container's processes keep records in the
//! container's swap table (`vgpu_ledger::swap`); the arbiter keeps every table mapped, and on each
//! pass writes its heartbeat into each, reads the records, and for each physical GPU (a region's
//! device UUID, so that containers with different device orders agree) where a live process waits,
//! asks one victim by counting its `request` word up. The victim swaps out (or declines, if it
//! became busy) and says so in `handled`; while the request is outstanding nobody else on that GPU
//! is asked, and once it is handled and someone still waits, the next pass picks the next victim.
//! When nobody on the GPU is idle and a waiter has waited long enough (`--swap-force-ms`), the
//! least recently active busy process is asked with a forced request, which it cannot decline: two
//! processes that never idle take turns instead of one waiting for ever. A forced request names
//! the room the waiter lacks (its `wanted`, in whole chunks): the busy process moves only that
//! much, pinned memory first, rather than all it holds; an idle process still swaps out whole.
//!
//! Containers' task priorities (`CUDA_TASK_PRIORITY`, HAMi's `nvidia.com/priority`: 0 high, 1 low,
//! as the region stores it) order this. The policy, in a few lines:
//! - the waiter served first is the one of highest priority, then the one waiting longest;
//! - a process of lower priority than that waiter gives way at once: an idle one is asked, else a
//!   busy one is forced, with no `--swap-force-ms` wait and whatever its quantum, and either moves
//!   only the room the waiter lacks;
//! - among the others, today's rule: the least recently active idle process is asked; with none
//!   idle, one of the waiter's own priority is forced once the waiter has waited `--swap-force-ms`;
//!   a process of higher priority than the waiter is never forced;
//! - a process brought back is not asked out again for `--swap-quantum-ms` (default 1 s) by a
//!   waiter of its own or lower priority: two containers that both want the card take turns of at
//!   least a quantum instead of thrashing;
//! - a forced process moves only the room its waiter lacks, and its next call waits for room in
//!   turn, so it takes the card back once the waiter idles.
//!
//! The policy is [`decide`], a pure function of what a pass read. The rest reads and writes the
//! tables. Every word of a table is the tenant's: the arbiter acts on a record only while the
//! region's lease lock says its process lives, and bounds what a record can make it do (below).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::OsString;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use vgpu_ledger::inspect::Snapshot;
use vgpu_ledger::region::tenant_file::Access;
use vgpu_ledger::swap::{CHUNK, Phase, Record, WAITING, Word};

use crate::containers::{self, Container};
use crate::swap_tables::MappedTable;
use crate::table::size;

/// A request the victim has not handled within this no longer holds its GPU's other processes
/// back (the victim may be stopped, frozen or hostile). It is not asked again until it answers.
pub const OUTSTANDING_FOR: Duration = Duration::from_secs(30);
/// A process that answered a request without swapping out (it was busy) is asked again no sooner
/// than this, unless it has done work since.
pub const ASK_AGAIN_AFTER: Duration = Duration::from_secs(1);
/// Pass cadence while some process waits or a swap is under way, and otherwise.
pub const FAST: Duration = Duration::from_millis(2);
pub const SLOW: Duration = Duration::from_millis(50);
/// How often every container and its table are found again (serve's reclaim cadence); between,
/// only what changed ([`LOOK_EVERY`]).
pub const DISCOVER_EVERY: Duration = Duration::from_secs(1);
/// Leases past the highest one the region had at discovery whose records are read too (new
/// processes take the lowest free lease).
const LEASE_SLACK: usize = 32;

/// The operator's settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settings {
    /// A process is idle once it has put no work on the GPU for this long.
    pub idle: Duration,
    /// A process that has waited this long, on a GPU where nobody is idle, has the least recently
    /// active process there swapped out even though it is busy (`None`: never).
    pub force: Option<Duration>,
    /// A process brought back is not asked out again for this long, but by a waiter of higher
    /// priority.
    pub quantum: Duration,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            idle: Duration::from_millis(100),
            force: Some(Duration::from_secs(5)),
            quantum: Duration::from_secs(1),
        }
    }
}

/// Idle: no work since `idle_after` ns ago, and none in flight (a process inside a synchronize
/// made its latest call long ago, yet its kernels run).
fn is_idle(record: &Record, now: u64, idle_after: u64) -> bool {
    !record.in_flight && now.saturating_sub(record.active_ns) >= idle_after
}

/// Whether a record's process holds memory on the card it could move: resident, or out in part
/// (a forced request moved only some of its chunks and it has made no call since).
fn on_card(record: &Record) -> bool {
    matches!(record.phase, Phase::Resident | Phase::Out)
}

/// The settings as the policy takes them, in `CLOCK_MONOTONIC` ns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub idle_after: u64,
    pub force_after: Option<u64>,
    pub quantum: u64,
}

impl From<Settings> for Limits {
    fn from(settings: Settings) -> Limits {
        let ns = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        Limits {
            idle_after: ns(settings.idle),
            force_after: settings.force.map(ns),
            quantum: ns(settings.quantum),
        }
    }
}

/// What the arbiter did, for the metrics.
#[derive(Debug, Default)]
pub struct Stats {
    /// Swap-out requests made, by GPU UUID: of idle processes, and forced ones of busy processes
    /// (every GPU of a watched table, 0 until asked).
    pub requests: BTreeMap<String, Requests>,
}

/// Requests made on one GPU.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Requests {
    pub idle: u64,
    pub forced: u64,
    /// Of those, the ones made of a process of lower priority than its waiter (given way at once).
    pub priority: u64,
}

/// Where a record lives: its table (the swap file's device and inode), lease and device index.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Place {
    pub table: (u64, u64),
    pub lease: usize,
    pub index: usize,
}

/// One record as a pass read it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seen {
    pub place: Place,
    /// The physical GPU: the region's UUID for the record's device index.
    pub gpu: String,
    /// The lease's lock is held (its process lives). A record whose liveness the pass did not ask
    /// is passed as not live, and never acted on.
    pub live: bool,
    pub record: Record,
    /// Its container's task priority (0 high; a larger number is lower).
    pub priority: i32,
    /// `CLOCK_MONOTONIC` ns when the arbiter saw its latest swap-in complete (`None`: not since it
    /// started watching), from which its quantum runs.
    pub back_at: Option<u64>,
}

/// A request the arbiter made, remembered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Asked {
    pub place: Place,
    pub gpu: String,
    /// The request's number (the `request` word after it was counted up).
    pub number: u64,
    /// The record's pid when asked: another pid there is another process.
    pub pid: u32,
    /// `CLOCK_MONOTONIC` ns when asked.
    pub at: u64,
    /// Its lateness was logged.
    pub late_logged: bool,
}

/// One request to make: `seen[victim]` is asked to swap out for `seen[waiter]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub gpu: String,
    pub victim: usize,
    pub waiter: usize,
    /// How long the victim has been idle, in ns.
    pub idle_ns: u64,
    /// How many processes it was chosen among (idle ones; for a forced request, busy ones).
    pub candidates: usize,
    /// The victim is busy: it swaps out even so (the waiter has waited `force_after`).
    pub forced: bool,
    /// Bytes a forced request asks the victim to move: the waiter's `wanted` rounded up to whole
    /// chunks (0: everything, as every request that is not forced).
    pub amount: u64,
    /// How long the waiter has waited, in ns.
    pub waited_ns: u64,
    /// The victim's priority is lower than the waiter's: it gives way at once.
    pub yields: bool,
}

/// Whether `asked` still holds its GPU back: its process lives (the same pid, the record not
/// cleared by a new owner), has not handled it, and was asked less than [`OUTSTANDING_FOR`] ago.
fn outstanding(asked: &Asked, record: Option<&Seen>, now: u64) -> bool {
    unanswered(asked, record) && now.saturating_sub(asked.at) < OUTSTANDING_FOR.as_nanos() as u64
}

/// Whether the process `asked` was made of still lives and has not handled it.
fn unanswered(asked: &Asked, record: Option<&Seen>) -> bool {
    record.is_some_and(|seen| {
        let r = &seen.record;
        seen.live && r.pid == asked.pid && r.request >= asked.number && r.handled < asked.number
    })
}

/// Whether `seen` may be asked, given the last request made of it: not while it has a request it
/// has not answered, and after answering one without swapping out (it was busy) only once it has
/// worked since or [`ASK_AGAIN_AFTER`] has passed.
fn may_ask(seen: &Seen, last: Option<&Asked>, now: u64) -> bool {
    let r = &seen.record;
    if r.handled < r.request {
        return false; // a request it has not answered yet (ours, or an arbiter's before a restart)
    }
    let Some(asked) = last else { return true };
    if r.pid != asked.pid || r.request < asked.number {
        return true; // another process has the lease now
    }
    if r.handled < asked.number {
        return false; // never answered: asking again would not help
    }
    r.active_ns > asked.at || now.saturating_sub(asked.at) >= ASK_AGAIN_AFTER.as_nanos() as u64
}

/// The room a forced request asks for, for a waiter that misses `wanted` bytes: whole chunks (a
/// process moves its memory in chunks), 0 (everything) for a waiter that does not say, or says more
/// than any card holds.
fn room_for(wanted: u64) -> u64 {
    wanted.checked_next_multiple_of(CHUNK).unwrap_or(0)
}

/// Whether `seen` came back less than a quantum ago.
fn in_quantum(seen: &Seen, now: u64, quantum: u64) -> bool {
    seen.back_at.is_some_and(|at| now.saturating_sub(at) < quantum)
}

/// The policy (the module's doc says it in words): for each GPU where a live process waits for
/// room and no request is outstanding, one request for the waiter of highest priority that has
/// waited longest. The candidates are the live processes on that GPU that do not wait, have bytes
/// on the card ([`on_card`]), are not a waiting process's other record there, may be asked again
/// ([`may_ask`]) and are out of their quantum unless their priority is lower than the waiter's.
/// Those of lower priority give way first (the least recently active idle one, else the least
/// recently active busy one, forced); then the least recently active idle one ([`is_idle`]); then,
/// once the waiter has waited `limits.force_after` (by `waiting_since`, the arbiter's memory of
/// when it saw each record start waiting; it starts again after each request made for that
/// waiter), the least recently active busy one of the waiter's priority, forced. A forced request
/// asks for the waiter's `wanted` bytes rounded up to whole chunks ([`Decision::amount`]). Where
/// only waiters hold the card, the one that has waited least and holds some lets go. A record
/// whose lease is not live is ignored entirely.
pub fn decide(
    seen: &[Seen],
    asked: &[Asked],
    waiting_since: &HashMap<Place, u64>,
    now: u64,
    limits: Limits,
) -> Vec<Decision> {
    let by_place: HashMap<Place, usize> = seen.iter().enumerate().map(|(i, s)| (s.place, i)).collect();
    let record_of = |place: &Place| by_place.get(place).map(|&i| &seen[i]);
    let last_asked: HashMap<Place, &Asked> = asked.iter().map(|a| (a.place, a)).collect();
    let waited = |i: usize| now.saturating_sub(waiting_since.get(&seen[i].place).copied().unwrap_or(now));
    let mut waiters: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (i, s) in seen.iter().enumerate() {
        if s.live && s.record.waiting && !s.gpu.is_empty() {
            waiters.entry(s.gpu.as_str()).or_default().push(i);
        }
    }
    let mut decisions = Vec::new();
    for (gpu, waiting) in waiters {
        if asked.iter().any(|a| a.gpu == gpu && outstanding(a, record_of(&a.place), now)) {
            continue;
        }
        let waiting_processes: HashSet<((u64, u64), usize)> =
            waiting.iter().map(|&i| (seen[i].place.table, seen[i].place.lease)).collect();
        // The highest priority (the smallest number) first, then the longest waiting (the first in
        // `seen`'s order among equals).
        let Some(&waiter) = waiting
            .iter()
            .max_by_key(|&&i| (std::cmp::Reverse(seen[i].priority), waited(i), std::cmp::Reverse(i)))
        else {
            continue;
        };
        let priority = seen[waiter].priority;
        let resident: Vec<usize> = (0..seen.len())
            .filter(|&i| {
                let s = &seen[i];
                let r = &s.record;
                s.live
                    && s.gpu == gpu
                    && !r.waiting
                    && on_card(r)
                    && r.resident > 0
                    && !waiting_processes.contains(&(s.place.table, s.place.lease))
                    && may_ask(s, last_asked.get(&s.place).copied(), now)
                    && (s.priority > priority || !in_quantum(s, now, limits.quantum))
            })
            .collect();
        let decision = |victim: usize, candidates: usize, forced: bool| Decision {
            gpu: gpu.to_owned(),
            victim,
            waiter,
            idle_ns: now.saturating_sub(seen[victim].record.active_ns),
            candidates,
            forced,
            // A process giving way to a higher priority, busy or idle, moves only the room the
            // waiter lacks: a training job keeps the rest of the card beside a server.
            amount: if forced || seen[victim].priority > priority {
                room_for(seen[waiter].record.wanted)
            } else {
                0
            },
            waited_ns: waited(waiter),
            yields: seen[victim].priority > priority,
        };
        if resident.is_empty() {
            // Nobody but waiters holds the card: two processes each holding part of it and waiting
            // for the rest would wait forever. The waiter that has waited least and holds some is
            // asked; a waiting process that is asked lets go of what it placed (its host copies
            // still hold the bytes), so the longest waiting one can finish.
            let other = waiting
                .iter()
                .copied()
                .filter(|&i| i != waiter && seen[i].record.resident > 0)
                .filter(|&i| may_ask(&seen[i], last_asked.get(&seen[i].place).copied(), now))
                .min_by_key(|&i| (waited(i), seen[i].place));
            if let Some(victim) = other {
                decisions.push(decision(victim, 0, false));
            }
            continue;
        }
        let idle = |among: &[usize]| -> Vec<usize> {
            among.iter().copied().filter(|&i| is_idle(&seen[i].record, now, limits.idle_after)).collect()
        };
        let lower: Vec<usize> = resident.iter().copied().filter(|&i| seen[i].priority > priority).collect();
        let (among, forced) = if !lower.is_empty() {
            // Lower priority gives way at once, busy or not.
            let idle_lower = idle(&lower);
            if idle_lower.is_empty() { (lower, true) } else { (idle_lower, false) }
        } else {
            let idle_any = idle(&resident);
            if !idle_any.is_empty() {
                (idle_any, false)
            } else {
                // A busy process of the waiter's own priority, once it has waited long enough.
                if limits.force_after.is_none_or(|after| waited(waiter) < after) {
                    continue;
                }
                let equal: Vec<usize> =
                    resident.iter().copied().filter(|&i| seen[i].priority == priority).collect();
                (equal, true)
            }
        };
        let Some(&victim) = among.iter().min_by_key(|&&i| (seen[i].record.active_ns, seen[i].place)) else {
            continue;
        };
        decisions.push(decision(victim, among.len(), forced));
    }
    decisions
}

/// One container's table, kept mapped between passes.
struct Watched {
    /// Which container: its directory's name under the scanned directory, or the region's path.
    key: OsString,
    /// For log lines: `<pod-uid>_<container>`, or the region's path for a single file.
    name: String,
    /// The region, open: its lease locks say which processes live.
    region: File,
    /// GPU UUID per region device index.
    uuids: Vec<String>,
    /// The container's task priority, as its region stores it.
    priority: i32,
    /// Leases whose records are read.
    leases: usize,
    table: MappedTable,
}

/// A directory's modification time (seconds, nanoseconds).
type Stamp = (i64, i64);

/// A swap table refused when it was opened, and whether that was said.
struct Refused {
    why: String,
    since: Instant,
    said: bool,
}

/// The arbiter's state between passes.
pub struct Arbiter {
    path: PathBuf,
    /// `path` is a directory of containers (else one region file).
    directory: bool,
    limits: Limits,
    watched: Vec<Watched>,
    asked: Vec<Asked>,
    /// When each waiting record was first seen waiting (again since the last request made for
    /// it): the policy forces a busy process out for one that has waited long enough.
    waiting_since: HashMap<Place, u64>,
    /// The records the last full pass found saying something (a phase or a wait).
    marked: Vec<Place>,
    /// Per record: its owner's pid, its swap-in count and when the arbiter saw that count go up
    /// (0: not since it watched), from which a quantum runs.
    back: HashMap<Place, (u32, u64, u64)>,
    /// Modification times of the scanned directory and of each container's directory (of the
    /// region's directory, for one file) when they were last read.
    root_stamp: Option<Stamp>,
    stamps: HashMap<OsString, Option<Stamp>>,
    refused: HashMap<PathBuf, Refused>,
    /// Containers whose region held no swap table when read, by key, with the region open: a
    /// process adds the table inside the region, which changes no directory, so their regions'
    /// sizes are watched instead.
    untabled: HashMap<OsString, File>,
    stats: Arc<Mutex<Stats>>,
}

/// Runs the arbiter over the containers under `path`, forever.
pub fn run(path: &Path, settings: Settings, stats: Arc<Mutex<Stats>>) {
    let mut arbiter = Arbiter::new(path, settings, stats);
    let mut discovered: Option<Instant> = None;
    let mut looked = Instant::now();
    let mut full_pass: Option<Instant> = None;
    loop {
        // A full pass after any container was read again (it may have new records), and at least
        // every SLOW.
        let mut found = false;
        if discovered.is_none_or(|at| at.elapsed() >= DISCOVER_EVERY) {
            arbiter.discover();
            discovered = Some(Instant::now());
            found = true;
        } else if looked.elapsed() >= LOOK_EVERY {
            found = arbiter.look_for_changes();
            looked = Instant::now();
        }
        let full = found || full_pass.is_none_or(|at| at.elapsed() >= SLOW);
        if full {
            full_pass = Some(Instant::now());
        }
        let busy = arbiter.pass(vgpu_ledger::pace::now(), full);
        std::thread::sleep(if busy { FAST } else { SLOW });
    }
}

/// How often the directories' modification times are compared, so that a new container, region
/// or swap table is found within this (its first process waits for the arbiter's heartbeat only
/// briefly before spilling through unified memory instead).
pub const LOOK_EVERY: Duration = Duration::from_millis(50);

impl Arbiter {
    pub fn new(path: &Path, settings: Settings, stats: Arc<Mutex<Stats>>) -> Arbiter {
        Arbiter {
            path: path.to_owned(),
            directory: false,
            limits: Limits::from(settings),
            watched: Vec::new(),
            asked: Vec::new(),
            waiting_since: HashMap::new(),
            marked: Vec::new(),
            back: HashMap::new(),
            root_stamp: None,
            stamps: HashMap::new(),
            refused: HashMap::new(),
            untabled: HashMap::new(),
            stats,
        }
    }

    /// Finds every container and its table again: each region read, and its swap table opened as
    /// a tenant's file and mapped.
    pub fn discover(&mut self) {
        self.directory = std::fs::symlink_metadata(&self.path).is_ok_and(|m| m.is_dir());
        // Times first: a change made while the containers are read is a change next time.
        self.stamps.clear();
        if self.directory {
            self.root_stamp = stamp(&self.path);
            for name in self.names() {
                let at = stamp(&self.path.join(&name));
                self.stamps.insert(name, at);
            }
        } else {
            let at = stamp(self.path.parent().unwrap_or(Path::new(".")));
            self.stamps.insert(self.path.clone().into_os_string(), at);
        }
        let mut found = Vec::new();
        let mut untabled = HashMap::new();
        let listing = containers::visit(&self.path, Access::Read, true, |container, region, table| {
            sort(container, region, table, self.directory, &mut found, &mut untabled);
        });
        self.watched = found;
        self.untabled = untabled;
        self.settle(&listing);
    }

    /// Reads again the containers whose directories changed since they were read, and any new
    /// one: a container's first process waits only briefly for an arbiter to find its table.
    /// True if any was read again.
    pub fn look_for_changes(&mut self) -> bool {
        let mut changed: Vec<OsString> = Vec::new();
        if self.directory {
            let at = stamp(&self.path);
            if at != self.root_stamp || at.is_some_and(recent) {
                self.root_stamp = at;
                let names = self.names();
                let gone: Vec<OsString> =
                    self.stamps.keys().filter(|k| !names.contains(k)).cloned().collect();
                for name in gone {
                    self.stamps.remove(&name);
                    self.watched.retain(|w| w.key != name);
                }
                changed.extend(names.into_iter().filter(|name| !self.stamps.contains_key(name)));
            }
            for (name, was) in &self.stamps {
                let at = stamp(&self.path.join(name));
                if at != *was || at.is_some_and(recent) {
                    changed.push(name.clone());
                }
            }
        } else {
            let key = self.path.clone().into_os_string();
            let at = stamp(self.path.parent().unwrap_or(Path::new(".")));
            if self.stamps.get(&key).is_none_or(|was| at != *was || at.is_some_and(recent)) {
                changed.push(key);
            }
        }
        // A region that grew has had its table added.
        for (key, region) in &self.untabled {
            if region.metadata().is_ok_and(|m| m.len() >= vgpu_ledger::swap::REGION_WITH_TABLE as u64) {
                changed.push(key.clone());
            }
        }
        changed.sort();
        changed.dedup();
        let any = !changed.is_empty();
        for key in changed {
            self.rediscover(key);
        }
        any
    }

    /// Reads one container again (`key` as in [`Watched::key`]).
    fn rediscover(&mut self, key: OsString) {
        let directory = self.directory;
        let listing = if directory {
            let at = stamp(&self.path.join(&key));
            self.stamps.insert(key.clone(), at);
            let mut found = Vec::new();
            let mut untabled = HashMap::new();
            let listing = containers::visit_container(
                &self.path,
                &key,
                Access::Read,
                true,
                |container, region, table| {
                    sort(container, region, table, directory, &mut found, &mut untabled)
                },
            );
            self.watched.retain(|w| w.key != key);
            self.watched.extend(found);
            self.untabled.remove(&key);
            self.untabled.extend(untabled);
            listing
        } else {
            let at = stamp(self.path.parent().unwrap_or(Path::new(".")));
            self.stamps.insert(key, at);
            let mut found = Vec::new();
            let mut untabled = HashMap::new();
            let listing = containers::visit(&self.path, Access::Read, true, |container, region, table| {
                sort(container, region, table, directory, &mut found, &mut untabled);
            });
            self.watched = found;
            self.untabled = untabled;
            listing
        };
        self.settle(&listing);
    }

    /// After a discovery: says which tables are refused (once each, and only once a refusal has
    /// lasted a second: a process makes its table in a few steps), forgets requests of tables no
    /// longer watched, and lists every GPU for the metrics.
    fn settle(&mut self, listing: &containers::Listing) {
        for container in &listing.containers {
            let path = container.path.clone();
            match &container.swap {
                Some(Err(why)) => {
                    let refused = self.refused.entry(path.clone()).or_insert_with(|| Refused {
                        why: why.clone(),
                        since: Instant::now(),
                        said: false,
                    });
                    if refused.why != *why {
                        *refused = Refused { why: why.clone(), since: Instant::now(), said: false };
                    }
                    if !refused.said && refused.since.elapsed() >= DISCOVER_EVERY {
                        refused.said = true;
                        eprintln!(
                            "vgpu-smi: swap: not arbitrating the swap table of {}: {why}",
                            containers::printable(&path)
                        );
                    }
                }
                _ => {
                    self.refused.remove(&path);
                }
            }
        }
        let ids: HashSet<(u64, u64)> = self.watched.iter().map(|w| w.table.id).collect();
        self.asked.retain(|a| ids.contains(&a.place.table));
        let mut stats = self.stats.lock().unwrap_or_else(PoisonError::into_inner);
        for uuid in self.watched.iter().flat_map(|w| &w.uuids).filter(|uuid| !uuid.is_empty()) {
            stats.requests.entry(uuid.clone()).or_default();
        }
    }

    /// The scanned directory's entries (at most as many as a scan reads).
    fn names(&self) -> Vec<OsString> {
        vgpu_ledger::region::tenant_file::Dir::open(&self.path)
            .and_then(|dir| dir.names(containers::MAX_CONTAINERS))
            .map(|(names, _)| names)
            .unwrap_or_default()
    }

    /// One pass at `now` (`CLOCK_MONOTONIC` ns): the heartbeat, the records, the requests. A
    /// `full` pass reads every record of the leases in use; the quick ones between read only the
    /// records the last full pass found saying something. True while some live process waits or
    /// a swap is under way (the next pass comes sooner).
    pub fn pass(&mut self, now: u64, full: bool) -> bool {
        let pid = u64::from(std::process::id());
        for w in &self.watched {
            w.table.table().heartbeat().store(now, Ordering::Release);
            w.table.table().arbiter_pid().store(pid, Ordering::Release);
        }
        // A table truncated under us faulted on its heartbeat: gone before anything is read.
        self.drop_cut();
        let (mut seen, owners) = self.read(full);
        // What this pass read says of the requests made before it, and who waits since when.
        self.note_late(&seen, now);
        self.forget(&seen, now);
        let waiting: HashSet<Place> =
            seen.iter().filter(|s| s.live && s.record.waiting).map(|s| s.place).collect();
        self.waiting_since.retain(|place, _| waiting.contains(place));
        for place in waiting {
            self.waiting_since.entry(place).or_insert(now);
        }
        self.note_swap_ins(&mut seen, now);
        if full {
            let marked: HashSet<Place> = self.marked.iter().copied().collect();
            self.back.retain(|place, _| marked.contains(place));
        }
        self.check_candidates(&mut seen, &owners, now);
        let by_place: HashMap<Place, &Seen> = seen.iter().map(|s| (s.place, s)).collect();
        let busy = seen.iter().any(|s| {
            s.live && (s.record.waiting || matches!(s.record.phase, Phase::SwappingOut | Phase::SwappingIn))
        }) || self.asked.iter().any(|a| outstanding(a, by_place.get(&a.place).copied(), now));
        for decision in decide(&seen, &self.asked, &self.waiting_since, now, self.limits) {
            self.ask(&seen, &owners, &decision, now);
        }
        self.drop_cut();
        busy
    }

    /// The records worth a look (a phase, a wait, or a request of ours), with the liveness of the
    /// waiting, the swapping and those asked asked of the region's lease locks; and for each, its
    /// table's index.
    fn read(&mut self, full: bool) -> (Vec<Seen>, Vec<usize>) {
        let asked: HashSet<Place> = self.asked.iter().map(|a| a.place).collect();
        let mut seen = Vec::new();
        let mut owners = Vec::new();
        if full {
            self.marked.clear();
            for (t, w) in self.watched.iter().enumerate() {
                let table = w.table.table();
                for lease in 0..w.leases {
                    for (index, gpu) in w.uuids.iter().enumerate() {
                        let place = Place { table: w.table.id, lease, index };
                        let state = table.get(lease, index, Word::State).load(Ordering::Acquire);
                        if state & (0xff | WAITING) == 0 && !asked.contains(&place) {
                            continue;
                        }
                        self.marked.push(place);
                        let record = table.read(lease, index);
                        let priority = w.priority;
                        seen.push(Seen {
                            place,
                            gpu: gpu.clone(),
                            live: false,
                            record,
                            priority,
                            back_at: None,
                        });
                        owners.push(t);
                    }
                }
            }
        } else {
            // Between full passes, only the records the last one found saying something, and ours.
            let tables: HashMap<(u64, u64), usize> =
                self.watched.iter().enumerate().map(|(t, w)| (w.table.id, t)).collect();
            let mut places: Vec<Place> = self.marked.iter().copied().chain(asked.iter().copied()).collect();
            places.sort();
            places.dedup();
            for place in places {
                let Some(&t) = tables.get(&place.table) else { continue };
                let w = &self.watched[t];
                let Some(gpu) = w.uuids.get(place.index).filter(|_| place.lease < w.leases) else { continue };
                let record = w.table.table().read(place.lease, place.index);
                let priority = w.priority;
                seen.push(Seen { place, gpu: gpu.clone(), live: false, record, priority, back_at: None });
                owners.push(t);
            }
        }
        // Liveness is a system call per lease: asked only of records the policy can act on. Here
        // the waiting, the swapping and those asked before; candidates in `check_candidates`.
        for (s, &t) in seen.iter_mut().zip(&owners) {
            let r = &s.record;
            if r.waiting
                || matches!(r.phase, Phase::SwappingOut | Phase::SwappingIn)
                || asked.contains(&s.place)
            {
                s.live = self.lives(t, s.place.lease);
            }
        }
        (seen, owners)
    }

    /// Notes when each record's swap-in count went up (a swap-in completed), for its quantum, and
    /// hands it to the record.
    fn note_swap_ins(&mut self, seen: &mut [Seen], now: u64) {
        for s in seen.iter_mut() {
            let r = &s.record;
            let entry = self.back.entry(s.place).or_insert((r.pid, r.swap_ins, 0));
            if entry.0 != r.pid {
                *entry = (r.pid, r.swap_ins, 0);
            } else if r.swap_ins > entry.1 {
                *entry = (r.pid, r.swap_ins, now);
            }
            s.back_at = (entry.2 != 0).then_some(entry.2);
        }
    }

    /// Asks the liveness of the resident processes the policy may choose at `now`: on GPUs where a
    /// live process waits and no request is outstanding, the idle ones and those of lower priority
    /// than a waiter, or all of them once a waiter there has waited long enough to force one.
    fn check_candidates(&self, seen: &mut [Seen], owners: &[usize], now: u64) {
        let by_place: HashMap<Place, &Seen> = seen.iter().map(|s| (s.place, s)).collect();
        let blocked: HashSet<&str> = self
            .asked
            .iter()
            .filter(|a| outstanding(a, by_place.get(&a.place).copied(), now))
            .map(|a| a.gpu.as_str())
            .collect();
        // GPU → whether a waiter there may force a busy process out, and the highest priority
        // (smallest number) of its waiters.
        let mut waited_on: HashMap<String, (bool, i32)> = HashMap::new();
        for s in seen.iter().filter(|s| s.live && s.record.waiting && !blocked.contains(s.gpu.as_str())) {
            let since = self.waiting_since.get(&s.place).copied().unwrap_or(now);
            let due = self.limits.force_after.is_some_and(|after| now.saturating_sub(since) >= after);
            let entry = waited_on.entry(s.gpu.clone()).or_insert((false, s.priority));
            entry.0 |= due;
            entry.1 = entry.1.min(s.priority);
        }
        for (s, &t) in seen.iter_mut().zip(owners) {
            let r = &s.record;
            let Some(&(force, priority)) = waited_on.get(&s.gpu) else { continue };
            let idle = is_idle(r, now, self.limits.idle_after);
            let yields = s.priority > priority;
            if on_card(r) && !r.waiting && r.resident > 0 && (idle || force || yields) && !s.live {
                s.live = self.lives(t, s.place.lease);
            }
        }
    }

    /// Whether lease `lease` of watched table `t` is held (its process lives).
    fn lives(&self, t: usize, lease: usize) -> bool {
        vgpu_ledger::region::lease_is_held(self.watched[t].region.as_raw_fd(), lease)
    }

    /// Makes one request, remembers it, counts it and says so.
    fn ask(&mut self, seen: &[Seen], owners: &[usize], decision: &Decision, now: u64) {
        let victim = &seen[decision.victim];
        let waiter = &seen[decision.waiter];
        let w = &self.watched[owners[decision.victim]];
        let table = w.table.table();
        let (lease, index) = (victim.place.lease, victim.place.index);
        let number = if decision.forced {
            table.force_swap_out(lease, index, decision.amount)
        } else {
            table.request_room(lease, index, decision.amount)
        };
        let asked = Asked {
            place: victim.place,
            gpu: decision.gpu.clone(),
            number,
            pid: victim.record.pid,
            at: now,
            late_logged: false,
        };
        self.asked.retain(|a| a.place != victim.place);
        self.asked.push(asked);
        // The waiter's patience starts again: one forced request per wait of `force_after`.
        self.waiting_since.insert(waiter.place, now);
        {
            let mut stats = self.stats.lock().unwrap_or_else(PoisonError::into_inner);
            let requests = stats.requests.entry(decision.gpu.clone()).or_default();
            if decision.forced {
                requests.forced += 1;
            } else {
                requests.idle += 1;
            }
            if decision.yields {
                requests.priority += 1;
            }
        }
        let waiter_name = &self.watched[owners[decision.waiter]].name;
        let seconds = |ns: u64| Duration::from_nanos(ns).as_secs_f64();
        let why = if decision.yields {
            format!(
                "{} (last active {:.3} s ago): its priority {} is lower than that of {} pid {} (lease {}), priority {}, \
                 which waits for {} on it, so it gives way at once",
                if decision.forced { "FORCED though busy" } else { "idle" },
                seconds(decision.idle_ns),
                victim.priority,
                waiter_name,
                waiter.record.pid,
                waiter.place.lease,
                waiter.priority,
                size(waiter.record.wanted),
            )
        } else if decision.forced {
            format!(
                "FORCED though busy (last active {:.3} s ago; none of the {} on the card is idle), for {} pid {} \
                 (lease {}) which has waited {:.3} s for {} on it",
                seconds(decision.idle_ns),
                decision.candidates,
                waiter_name,
                waiter.record.pid,
                waiter.place.lease,
                seconds(decision.waited_ns),
                size(waiter.record.wanted),
            )
        } else if victim.record.waiting {
            format!(
                "it waits for room too, holding part of the card while {} pid {} (lease {}) waits for {} on it: \
                 it lets go of what it placed so that one of them can finish",
                waiter_name,
                waiter.record.pid,
                waiter.place.lease,
                size(waiter.record.wanted),
            )
        } else {
            format!(
                "idle for {:.3} s, the least recently active of {} idle, for {} pid {} (lease {}) waiting for {} on it",
                seconds(decision.idle_ns),
                decision.candidates,
                waiter_name,
                waiter.record.pid,
                waiter.place.lease,
                size(waiter.record.wanted),
            )
        };
        // A forced request for less than the victim holds says so.
        let (held, gpu) = (victim.record.resident, &decision.gpu);
        let what = if decision.amount > 0 && decision.amount < held {
            format!(
                "{} ({} bytes) of the {} it holds on {gpu}",
                size(decision.amount),
                decision.amount,
                size(held)
            )
        } else {
            format!("{} ({held} bytes) of {gpu}", size(held))
        };
        eprintln!(
            "vgpu-smi: swap: asked {} pid {} (lease {lease}) to swap out {what} (its device {index}), {why}; request \
             {number}",
            w.name, victim.record.pid,
        );
    }

    /// Says once of each request that went unanswered past [`OUTSTANDING_FOR`].
    fn note_late(&mut self, seen: &[Seen], now: u64) {
        let by_place: HashMap<Place, &Seen> = seen.iter().map(|s| (s.place, s)).collect();
        for asked in self.asked.iter_mut().filter(|a| !a.late_logged) {
            let record = by_place.get(&asked.place).copied();
            if unanswered(asked, record) && !outstanding(asked, record, now) {
                asked.late_logged = true;
                let name = self
                    .watched
                    .iter()
                    .find(|w| w.table.id == asked.place.table)
                    .map_or("?", |w| w.name.as_str());
                eprintln!(
                    "vgpu-smi: swap: {name} pid {} (lease {}) has not answered request {} on {} in {} s; \
                     others on that GPU are asked now, and it is not asked again until it answers",
                    asked.pid,
                    asked.place.lease,
                    asked.number,
                    asked.gpu,
                    OUTSTANDING_FOR.as_secs()
                );
            }
        }
    }

    /// Forgets requests that no longer say anything: their process is gone or another has the
    /// lease, or they were answered long enough ago.
    fn forget(&mut self, seen: &[Seen], now: u64) {
        let by_place: HashMap<Place, &Seen> = seen.iter().map(|s| (s.place, s)).collect();
        self.asked.retain(|a| {
            let Some(s) = by_place.get(&a.place) else { return false };
            let r = &s.record;
            let same = s.live && r.pid == a.pid && r.request >= a.number;
            let answered_long_ago =
                r.handled >= a.number && now.saturating_sub(a.at) >= ASK_AGAIN_AFTER.as_nanos() as u64;
            same && !answered_long_ago
        });
    }

    /// Drops tables whose files shrank under their mappings (their containers truncated them);
    /// the next discovery opens them again, if they are whole again.
    fn drop_cut(&mut self) {
        self.watched.retain(|w| {
            if w.table.cut() {
                eprintln!(
                    "vgpu-smi: swap: {} shrank while mapped (truncated by its container): no longer arbitrated",
                    containers::printable(w.table.path())
                );
            }
            !w.table.cut()
        });
    }
}

/// Keeps what a discovery found of one container: a container with a table among the watched, one
/// whose region holds none yet among the untabled, with its region open.
fn sort(
    container: &Container,
    region: File,
    table: Option<MappedTable>,
    directory: bool,
    found: &mut Vec<Watched>,
    untabled: &mut HashMap<OsString, File>,
) {
    if container.region.is_err() {
        return;
    }
    match table {
        Some(table) => found.extend(watched(container, region, table, directory)),
        None => {
            untabled.insert(key_of(container, directory), region);
        }
    }
}

/// Which container: its directory's name under the scanned directory, or the region's path.
fn key_of(container: &Container, directory: bool) -> OsString {
    match container.path.parent().and_then(Path::file_name) {
        Some(dir) if directory => dir.to_owned(),
        _ => container.path.clone().into_os_string(),
    }
}

/// What a discovery keeps of one container: its region and its mapped swap table.
fn watched(container: &Container, region: File, table: MappedTable, directory: bool) -> Option<Watched> {
    let Ok(snapshot) = &container.region else { return None };
    let key = key_of(container, directory);
    Some(Watched {
        key,
        name: container_name(container),
        region,
        uuids: snapshot.devices.iter().map(|d| d.uuid.clone()).collect(),
        priority: snapshot.monitor.priority,
        leases: leases_to_read(snapshot),
        table,
    })
}

/// A directory's modification time, not following a link.
fn stamp(path: &Path) -> Option<Stamp> {
    std::fs::symlink_metadata(path).ok().map(|m| (m.mtime(), m.mtime_nsec()))
}

/// Modified within the last [`LOOK_EVERY`]: a file time has the kernel's coarse clock's grain,
/// so a change just after a read may keep the time the read saw; such a directory is read again.
fn recent(stamp: Stamp) -> bool {
    let Ok(now) = SystemTime::now().duration_since(UNIX_EPOCH) else { return true };
    let then = Duration::new(u64::try_from(stamp.0).unwrap_or(0), u32::try_from(stamp.1).unwrap_or(0));
    now.saturating_sub(then) < LOOK_EVERY
}

/// A container as log lines name it.
fn container_name(container: &Container) -> String {
    match (&container.pod_uid, &container.name) {
        (Some(uid), Some(name)) => format!("{uid}_{name}"),
        _ => containers::printable(&container.path),
    }
}

/// Leases whose records a pass reads: up to the highest the region has used (or its monitor's
/// slot count), and [`LEASE_SLACK`] more for processes that start before the next discovery.
fn leases_to_read(snapshot: &Snapshot) -> usize {
    let highest = snapshot.leases.iter().map(|lease| lease.lease + 1).max().unwrap_or(0);
    let slots = usize::try_from(snapshot.monitor.proc_num).unwrap_or(0);
    (highest.max(slots) + LEASE_SLACK).min(vgpu_ledger::region::layout::MAX_PROCESSES)
}

#[cfg(test)]
mod tests {
    use super::*;
    use vgpu_ledger::swap::{IN_FLIGHT, Phase};

    const MS: u64 = 1_000_000;
    const S: u64 = 1_000 * MS;
    const GIB: u64 = 1 << 30;
    const IDLE: u64 = 100 * MS;
    const QUANTUM: u64 = 2 * S;
    const NOW: u64 = 1_000 * S;
    const GPU: &str = "GPU-aaaa";

    fn place(table: u64, lease: usize) -> Place {
        Place { table: (1, table), lease, index: 0 }
    }

    /// A live record of `table`'s lease `lease` on GPU.
    fn record(table: u64, lease: usize, phase: Phase, active_ns: u64) -> Seen {
        Seen {
            place: place(table, lease),
            gpu: GPU.to_owned(),
            live: true,
            record: Record {
                phase,
                pid: 100 + lease as u32,
                active_ns,
                resident: if phase == Phase::Resident { GIB } else { 0 },
                swapped: if phase == Phase::Out { GIB } else { 0 },
                ..Record::default()
            },
            priority: 0,
            back_at: None,
        }
    }

    fn waiter(table: u64, lease: usize) -> Seen {
        let mut seen = record(table, lease, Phase::Out, NOW - 10 * S);
        seen.record.waiting = true;
        seen.record.wanted = GIB;
        seen
    }

    /// The policy without forcing, nobody having waited.
    fn plain(seen: &[Seen], asked: &[Asked], now: u64) -> Vec<Decision> {
        decide(
            seen,
            asked,
            &HashMap::new(),
            now,
            Limits { idle_after: IDLE, force_after: None, quantum: QUANTUM },
        )
    }

    fn victims(seen: &[Seen], asked: &[Asked], now: u64) -> Vec<usize> {
        plain(seen, asked, now).iter().map(|d| d.victim).collect()
    }

    fn asked_of(seen: &Seen, number: u64, at: u64) -> Asked {
        Asked {
            place: seen.place,
            gpu: seen.gpu.clone(),
            number,
            pid: seen.record.pid,
            at,
            late_logged: false,
        }
    }

    fn with_priority(mut seen: Seen, priority: i32) -> Seen {
        seen.priority = priority;
        seen
    }

    #[test]
    fn a_lower_priority_process_gives_way_at_once_busy_or_not() {
        // The waiter is of priority 0; a busy process of priority 1 is forced at once, with no
        // force timeout, though an idle process of priority 0 is there.
        let seen = [
            waiter(1, 0),
            with_priority(record(2, 0, Phase::Resident, NOW), 1),
            record(3, 0, Phase::Resident, NOW - 50 * S),
        ];
        let decisions = plain(&seen, &[], NOW);
        assert_eq!(decisions.len(), 1, "{decisions:?}");
        let d = &decisions[0];
        assert_eq!((d.victim, d.forced, d.yields, d.amount), (1, true, true, GIB));
        // Idle, it is asked as idle, still before the idle process of priority 0, and still for
        // only the room the waiter lacks.
        let mut idle_low = seen.clone();
        idle_low[1].record.active_ns = NOW - S;
        let d = &plain(&idle_low, &[], NOW)[0];
        assert_eq!((d.victim, d.forced, d.yields, d.amount), (1, false, true, GIB));
    }

    #[test]
    fn a_higher_priority_process_is_asked_only_when_idle() {
        // A waiter of priority 1 that has waited past the force timeout: the busy process of
        // priority 0 is never forced for it; once idle it is asked as anyone idle is.
        let waiting = with_priority(waiter(1, 0), 1);
        let busy_high = record(2, 0, Phase::Resident, NOW);
        let since: HashMap<Place, u64> = [(waiting.place, NOW - 60 * S)].into_iter().collect();
        let limits = Limits { idle_after: IDLE, force_after: Some(5 * S), quantum: QUANTUM };
        assert!(decide(&[waiting.clone(), busy_high.clone()], &[], &since, NOW, limits).is_empty());
        let d = &decide(&[waiting.clone(), busy_high.clone()], &[], &since, NOW + S, limits)[0];
        assert_eq!((d.victim, d.forced, d.yields), (1, false, false));
        // A busy process of the waiter's own priority is forced after the timeout, as before.
        let busy_equal = with_priority(record(3, 0, Phase::Resident, NOW), 1);
        let d = &decide(&[waiting, busy_high, busy_equal], &[], &since, NOW, limits)[0];
        assert_eq!((d.victim, d.forced, d.yields), (2, true, false));
    }

    #[test]
    fn the_waiter_of_highest_priority_is_served_first() {
        let long = with_priority(waiter(1, 0), 1);
        let high = waiter(2, 0);
        let since: HashMap<Place, u64> =
            [(long.place, NOW - 30 * S), (high.place, NOW - S)].into_iter().collect();
        let seen = [long, high, record(3, 0, Phase::Resident, NOW - 10 * S)];
        let limits = Limits { idle_after: IDLE, force_after: Some(5 * S), quantum: QUANTUM };
        let decisions = decide(&seen, &[], &since, NOW, limits);
        assert_eq!(decisions.len(), 1, "{decisions:?}");
        assert_eq!((decisions[0].waiter, decisions[0].victim), (1, 2));
    }

    #[test]
    fn a_process_brought_back_keeps_the_card_for_a_quantum_but_from_a_higher_priority() {
        let mut back = record(2, 0, Phase::Resident, NOW - 10 * S);
        back.back_at = Some(NOW - QUANTUM / 2);
        // Within its quantum, a waiter of its own priority does not ask it, idle or not.
        assert!(victims(&[waiter(1, 0), back.clone()], &[], NOW).is_empty());
        // Once the quantum has passed, it is asked.
        assert_eq!(victims(&[waiter(1, 0), back.clone()], &[], NOW + QUANTUM), [1]);
        // A waiter of higher priority asks it even within its quantum.
        let low = with_priority(back, 1);
        let d = &plain(&[waiter(1, 0), low], &[], NOW)[0];
        assert_eq!((d.victim, d.yields), (1, true));
    }

    #[test]
    fn the_least_recently_active_idle_process_is_asked() {
        let seen = [
            waiter(1, 0),
            record(2, 0, Phase::Resident, NOW - 5 * S),
            record(2, 1, Phase::Resident, NOW - 50 * S),
            record(3, 4, Phase::Resident, NOW - 20 * S),
        ];
        let decisions = plain(&seen, &[], NOW);
        assert_eq!(decisions.len(), 1);
        let d = &decisions[0];
        assert_eq!((d.victim, d.waiter, d.idle_ns, d.candidates, d.forced), (2, 0, 50 * S, 3, false));
        assert_eq!(d.gpu, GPU);
        // Nobody waits: nobody is asked.
        assert!(plain(&seen[1..], &[], NOW).is_empty());
    }

    #[test]
    fn busy_dead_waiting_and_empty_records_are_never_asked() {
        let mut dead = record(2, 0, Phase::Resident, 0);
        dead.live = false;
        let busy = record(2, 1, Phase::Resident, NOW - IDLE / 2);
        let mut other_waiter = record(3, 0, Phase::Resident, 0);
        other_waiter.record.waiting = true;
        let mut empty = record(3, 1, Phase::Resident, 0);
        empty.record.resident = 0;
        let out = record(3, 2, Phase::Out, 0);
        let swapping = record(3, 3, Phase::SwappingOut, 0);
        let mut elsewhere = record(4, 0, Phase::Resident, 0);
        elsewhere.gpu = "GPU-bbbb".to_owned();
        // The waiting process's own record on another device index of the same GPU.
        let mut itself = record(1, 0, Phase::Resident, 0);
        itself.place.index = 1;
        let seen = [waiter(1, 0), dead, busy, other_waiter, empty, out, swapping, elsewhere, itself];
        assert!(victims(&seen, &[], NOW).is_empty(), "{:?}", plain(&seen, &[], NOW));
        // Past the threshold the busy one becomes idle and is asked.
        assert_eq!(victims(&seen, &[], NOW + IDLE), [2]);
        // A dead waiter asks for nothing.
        let mut gone = waiter(1, 0);
        gone.live = false;
        assert!(victims(&[gone, record(2, 0, Phase::Resident, 0)], &[], NOW).is_empty());
    }

    #[test]
    fn a_process_waiting_for_its_kernels_is_busy_however_long_ago_it_last_called() {
        // Its latest call was 50 s ago, but that call waits for its kernels: busy, so the process
        // idle for only 20 s is asked, and with nobody else it is forced, not asked as idle.
        let mut waits = record(2, 0, Phase::Resident, NOW - 50 * S);
        waits.record.in_flight = true;
        let seen = [waiter(1, 0), waits.clone(), record(2, 1, Phase::Resident, NOW - 20 * S)];
        assert_eq!(victims(&seen, &[], NOW), [2]);
        let alone = [waiter(1, 0), waits];
        assert!(victims(&alone, &[], NOW).is_empty());
        let since: HashMap<Place, u64> = [(alone[0].place, NOW - 6 * S)].into_iter().collect();
        let limits = Limits { idle_after: IDLE, force_after: Some(5 * S), quantum: QUANTUM };
        let decisions = decide(&alone, &[], &since, NOW, limits);
        assert_eq!(decisions.len(), 1, "{decisions:?}");
        assert_eq!((decisions[0].victim, decisions[0].forced, decisions[0].amount), (1, true, GIB));
    }

    #[test]
    fn a_process_out_in_part_is_asked_for_the_rest() {
        // A forced request moved part of it; it has made no call since (no waiting), so the rest
        // of it is on the card, idle.
        let mut part = record(2, 0, Phase::Out, NOW - 50 * S);
        part.record.resident = GIB / 2;
        let seen = [waiter(1, 0), part, record(2, 1, Phase::Resident, NOW - 20 * S)];
        assert_eq!(victims(&seen, &[], NOW), [1]);
    }

    #[test]
    fn two_waiters_each_holding_part_of_the_card_are_untied() {
        // A waits longest and holds 512 MiB; B holds 256 MiB and waits too; nobody else is there.
        let mut a = waiter(1, 0);
        a.record.resident = GIB / 2;
        let mut b = waiter(2, 0);
        b.record.resident = GIB / 4;
        let since: HashMap<Place, u64> = [(a.place, NOW - 2 * S), (b.place, NOW - S)].into_iter().collect();
        let limits = Limits { idle_after: IDLE, force_after: Some(5 * S), quantum: QUANTUM };
        let decisions = decide(&[a.clone(), b.clone()], &[], &since, NOW, limits);
        assert_eq!(decisions.len(), 1, "{decisions:?}");
        assert_eq!((decisions[0].victim, decisions[0].waiter, decisions[0].forced), (1, 0, false));
        // A waiter holding nothing has nothing to let go of.
        b.record.resident = 0;
        assert!(decide(&[a, b], &[], &since, NOW, limits).is_empty());
    }

    #[test]
    fn one_request_per_gpu_until_it_is_handled_or_too_old() {
        let mut seen = vec![
            waiter(1, 0),
            record(2, 0, Phase::Resident, NOW - 50 * S),
            record(2, 1, Phase::Resident, NOW - 20 * S),
        ];
        seen[1].record.request = 1;
        let asked = [asked_of(&seen[1], 1, NOW)];
        // Outstanding: nobody else on the GPU is asked.
        assert!(victims(&seen, &asked, NOW + MS).is_empty());
        // Another GPU is not held back.
        let mut other = seen.clone();
        for s in other.iter_mut().skip(1) {
            s.gpu = "GPU-bbbb".to_owned();
        }
        other.push(waiter(5, 0));
        other[3].gpu = "GPU-bbbb".to_owned();
        assert_eq!(plain(&other, &asked, NOW + MS).len(), 1);
        // Handled (declined: still resident): the next one is asked, not the one that declined.
        seen[1].record.handled = 1;
        assert_eq!(victims(&seen, &asked, NOW + MS), [2]);
        // ... and the one that declined again only after a second, or once it worked since.
        assert_eq!(victims(&seen, &asked, NOW + ASK_AGAIN_AFTER.as_nanos() as u64), [1]);
        // Never answered: after 30 s the GPU is free again, but that one is not asked again.
        seen[1].record.handled = 0;
        assert!(victims(&seen, &asked, NOW + OUTSTANDING_FOR.as_nanos() as u64 - 1).is_empty());
        assert_eq!(victims(&seen, &asked, NOW + OUTSTANDING_FOR.as_nanos() as u64), [2]);
        // A new process on that lease (another pid, its record cleared) is a new candidate.
        seen[1].record.pid = 999;
        seen[1].record.request = 0;
        assert_eq!(victims(&seen, &asked, NOW + MS), [1]);
        // A request it has not answered, made before this arbiter knew of it (a restart), is not
        // made again.
        let mut pending = record(3, 0, Phase::Resident, NOW - 60 * S);
        pending.record.request = 5;
        pending.record.handled = 4;
        assert_eq!(victims(&[waiter(1, 0), pending.clone(), seen[2].clone()], &[], NOW), [2]);
        pending.record.handled = 5;
        assert_eq!(victims(&[waiter(1, 0), pending, seen[2].clone()], &[], NOW), [1]);
        // A dead victim holds nothing back.
        seen[1].record.pid = asked[0].pid;
        seen[1].record.request = 1;
        seen[1].live = false;
        assert_eq!(victims(&seen, &asked, NOW + MS), [2]);
    }

    #[test]
    fn with_nobody_idle_a_busy_process_is_forced_out_for_a_waiter_that_waited_long_enough() {
        const FORCE: u64 = 5 * S;
        let limits = Limits { idle_after: IDLE, force_after: Some(FORCE), quantum: QUANTUM };
        let seen = [
            waiter(1, 0),
            waiter(1, 1),
            record(2, 0, Phase::Resident, NOW - MS),
            record(2, 1, Phase::Resident, NOW - 2 * MS),
        ];
        let since =
            |first: u64, second: u64| HashMap::from([(seen[0].place, first), (seen[1].place, second)]);
        // Both busy, and nobody has waited 5 s: nobody is asked.
        assert!(decide(&seen, &[], &since(NOW - FORCE + 1, NOW), NOW, limits).is_empty());
        // The second waiter has: the least recently active busy process is forced out for it.
        let decisions = decide(&seen, &[], &since(NOW - S, NOW - FORCE), NOW, limits);
        assert_eq!(decisions.len(), 1, "{decisions:?}");
        let d = &decisions[0];
        assert_eq!((d.victim, d.waiter, d.forced, d.waited_ns, d.candidates), (3, 1, true, FORCE, 2));
        // It asks for the room the waiter lacks, in whole chunks of 64 MiB; 0 (everything) for a
        // waiter that says nothing, or more than a card holds.
        assert_eq!(d.amount, GIB, "{d:?}");
        let wanting = |wanted: u64| {
            let mut seen = seen.clone();
            seen[1].record.wanted = wanted;
            decide(&seen, &[], &since(NOW - S, NOW - FORCE), NOW, limits)[0].amount
        };
        assert_eq!(wanting(14 * GIB + 1), 14 * GIB + CHUNK);
        assert_eq!(wanting(100 << 20), 128 << 20);
        assert_eq!(wanting(128 << 20), 128 << 20);
        assert_eq!(wanting(0), 0);
        assert_eq!(wanting(u64::MAX), 0);
        // Never with forcing off, and never while a request is outstanding.
        let off = Limits { force_after: None, ..limits };
        assert!(decide(&seen, &[], &since(0, 0), NOW, off).is_empty());
        let mut asked_one = seen.clone();
        asked_one[3].record.request = 1;
        let asked = [asked_of(&asked_one[3], 1, NOW - MS)];
        assert!(decide(&asked_one, &asked, &since(0, 0), NOW, limits).is_empty());
        // An idle process is asked (not forced) before any busy one.
        let mut one_idle = seen.clone();
        one_idle[2].record.active_ns = NOW - IDLE;
        let d = &decide(&one_idle, &[], &since(0, 0), NOW, limits)[0];
        assert_eq!((d.victim, d.forced, d.amount), (2, false, 0), "an idle process swaps out whole");
        // A dead or unanswering busy process is not forced.
        let mut dead = seen.clone();
        dead[2].live = false;
        dead[3].record.request = 7;
        assert!(decide(&dead, &[], &since(0, 0), NOW, limits).is_empty());
    }

    #[test]
    fn hostile_records_cannot_make_it_panic_or_act_on_a_dead_lease() {
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let absurd = [0, 1, u64::MAX, u64::MAX - 1, 1 << 63, NOW, NOW + 1];
        for round in 0..2000 {
            let mut pick = || if next() % 2 == 0 { absurd[(next() % 7) as usize] } else { next() };
            let seen: Vec<Seen> = (0..6)
                .map(|k| {
                    let state = pick();
                    Seen {
                        place: place(k % 3, k as usize),
                        gpu: if k == 5 { String::new() } else { GPU.to_owned() },
                        live: k % 2 == 0,
                        record: Record {
                            phase: Phase::from_state(state),
                            waiting: state & WAITING != 0,
                            in_flight: state & IN_FLIGHT != 0,
                            pid: (state >> 32) as u32,
                            request: pick(),
                            handled: pick(),
                            active_ns: pick(),
                            resident: pick(),
                            swapped: pick(),
                            wanted: pick(),
                            swap_outs: pick(),
                            swap_ins: pick(),
                            wait_ns: pick(),
                            out_ns: pick(),
                            in_ns: pick(),
                            pinned: pick(),
                            forced: pick(),
                            amount: pick(),
                            unswappable: pick(),
                        },
                        priority: (pick() % 3) as i32 - 1,
                        back_at: Some(pick()).filter(|_| k % 3 == 0),
                    }
                })
                .collect();
            let asked: Vec<Asked> = seen.iter().take(2).map(|s| asked_of(s, pick(), pick())).collect();
            let now = pick();
            let since: HashMap<Place, u64> = seen.iter().map(|s| (s.place, pick())).collect();
            let limits = Limits {
                idle_after: pick(),
                force_after: Some(pick()).filter(|_| round % 2 == 0),
                quantum: pick(),
            };
            for d in decide(&seen, &asked, &since, now, limits) {
                let (victim, waiter) = (&seen[d.victim], &seen[d.waiter]);
                assert!(victim.live && waiter.live, "round {round}: {d:?}");
                assert!(waiter.record.waiting, "round {round}: {d:?}");
                if victim.record.waiting {
                    // Untying two waiters: another one, holding part of the card.
                    assert!(d.victim != d.waiter && victim.record.resident > 0, "round {round}: {d:?}");
                } else {
                    // On the card: resident, or out in part (a forced request moved some of it).
                    assert!(on_card(&victim.record) && victim.record.resident > 0, "round {round}: {d:?}");
                }
                assert!(!victim.gpu.is_empty() && victim.gpu == waiter.gpu && d.gpu == victim.gpu);
                // Only a forced request, or one of a lower priority, names an amount: whole chunks
                // covering what the waiter wants.
                let wanted = waiter.record.wanted;
                assert!(d.forced || d.yields || d.amount == 0, "round {round}: {d:?}");
                assert_eq!(d.yields, victim.priority > waiter.priority, "round {round}: {d:?}");
                assert!(
                    d.amount == 0
                        || (d.amount.is_multiple_of(CHUNK)
                            && d.amount >= wanted
                            && d.amount - wanted < CHUNK),
                    "round {round}: {d:?}"
                );
            }
        }
        // Phase garbage is no phase: a record whose state byte is 0x7f is not resident.
        let mut garbage = record(2, 0, Phase::Resident, 0);
        garbage.record.phase = Phase::from_state(0x7f);
        assert!(victims(&[waiter(1, 0), garbage], &[], NOW).is_empty());
    }
}
