//! The processes on the simulated card, for NVML's process lists and for giving back what a
//! process held once it is gone: one slot per process that holds memory, a context or graphics
//! memory on any device, in the shared file with `FAKEGPU_SHARED` (so that a node-side NVML caller
//! sees every process, with its bytes, as a real driver lists them), else process-local.
//!
//! ```text
//! slot + 0    pid        the process's pid in its own pid namespace; 0 free, u64::MAX being claimed
//! slot + 8    pid_ns     inode of its pid namespace (/proc/self/ns/pid)
//! slot + 16   start      its start time (field 22 of /proc/self/stat, clock ticks since boot)
//! slot + 24   contexts   bit i: it holds a context on physical device i
//! slot + 32   graphics   bit i: it holds graphics memory on physical device i
//! slot + 40   (spare, 3 words)
//! slot + 64   bytes[32]  what it holds on each physical device (what NVML's per-process figure says)
//! ```
//!
//! A slot is claimed by compare-and-swap of its pid from 0, on the process's first charge. Its
//! bytes and context bits leave it exactly once, each by an atomic read-modify-write: a free or a
//! context's end takes its share, and whoever takes the rest gives it to the devices. That is the
//! process itself at exit, or, for a process that was killed, [`reap`]: any process sharing the
//! file that finds the owner gone (no process at that pid with that start time, or one that has
//! finished) claims the slot by compare-and-swap of its pid to `u64::MAX`, judges it again now
//! that it cannot change hands, gives back what it held and frees it. A slot of another pid
//! namespace is judged through this process's `/proc` (by namespace inode and innermost pid,
//! `NSpid`), as the real driver lists pids in the caller's namespace; one this process cannot
//! judge stays, and NVML lists it with pid 0 and memory "not available".

use std::collections::{HashMap, HashSet};
use std::os::unix::fs::MetadataExt;
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, Ordering};

use crate::config::MAX_DEVICES;

/// Processes one shared file lists at once.
pub const SLOTS: usize = 128;
const CLAIMING: u64 = u64::MAX;
/// The inode of the initial pid namespace (the kernel's `PROC_PID_INIT_INO`): a process there sees
/// every process of the host in its `/proc`.
const INITIAL_PID_NS: u64 = 0xEFFF_FFFC;

#[repr(C)]
pub struct ProcessSlot {
    pid: AtomicU64,
    pid_ns: AtomicU64,
    start: AtomicU64,
    contexts: AtomicU64,
    graphics: AtomicU64,
    _spare: [AtomicU64; 3],
    bytes: [AtomicU64; MAX_DEVICES],
}

#[repr(C)]
pub struct ProcessTable {
    slots: [ProcessSlot; SLOTS],
}

const _: () = assert!(size_of::<ProcessSlot>() == 320);
const _: () = assert!(std::mem::offset_of!(ProcessSlot, bytes) == 64);
const _: () = assert!(size_of::<ProcessTable>() == SLOTS * 320);

impl ProcessTable {
    pub const fn new() -> ProcessTable {
        ProcessTable {
            slots: [const {
                ProcessSlot {
                    pid: AtomicU64::new(0),
                    pid_ns: AtomicU64::new(0),
                    start: AtomicU64::new(0),
                    contexts: AtomicU64::new(0),
                    graphics: AtomicU64::new(0),
                    _spare: [const { AtomicU64::new(0) }; 3],
                    bytes: [const { AtomicU64::new(0) }; MAX_DEVICES],
                }
            }; SLOTS],
        }
    }
}

/// Who a process is, namespace-independently.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Identity {
    pid: u64,
    pid_ns: u64,
    start: u64,
}

impl Identity {
    /// The owner `slot` names now (a slot this caller holds as `CLAIMING`, or one it read `pid` from).
    fn of(slot: &ProcessSlot, pid: u64) -> Identity {
        Identity {
            pid,
            pid_ns: slot.pid_ns.load(Ordering::Relaxed),
            start: slot.start.load(Ordering::Relaxed),
        }
    }
}

fn pid_ns(proc_dir: &str) -> Option<u64> {
    std::fs::metadata(format!("{proc_dir}/ns/pid")).ok().map(|meta| meta.ino())
}

/// What `/proc/<pid>/stat` says of a process.
#[derive(Clone, Copy, Debug)]
struct Stat {
    /// Field 22, clock ticks since boot.
    start: u64,
    /// Whether it has finished: a zombie (or dead) whose threads have all exited, which a real
    /// driver no longer counts even before its parent reaps it. A thread-group leader that
    /// exited while other threads run is a zombie too, but with more than one thread.
    finished: bool,
}

/// After the command name in parentheses: field 3 (state), 20 (threads) and 22 (start time).
fn stat(proc_dir: &str) -> Option<Stat> {
    let text = std::fs::read_to_string(format!("{proc_dir}/stat")).ok()?;
    let mut fields = text.rsplit_once(')')?.1.split_whitespace();
    let state = fields.next()?;
    let threads: u64 = fields.nth(16)?.parse().ok()?;
    let start = fields.nth(1)?.parse().ok()?;
    Some(Stat { start, finished: matches!(state, "Z" | "X" | "x") && threads <= 1 })
}

fn myself() -> Option<Identity> {
    Some(Identity {
        pid: u64::from(std::process::id()),
        pid_ns: pid_ns("/proc/self")?,
        start: stat("/proc/self")?.start,
    })
}

/// Whether no process of this pid namespace has pid `pid` (`kill(pid, 0)` fails with `ESRCH`);
/// false when one has, or this cannot be asked.
fn no_such_pid(pid: u64) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else { return false };
    if pid <= 0 {
        return false;
    }
    // SAFETY: signal 0 sends nothing: it only checks that a process `pid` (> 0, so never a
    // process group) exists.
    let failed = unsafe { libc::kill(pid, 0) } != 0;
    failed && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
}

/// What became of a slot's owner, as this process can tell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fate {
    /// Running, with that pid in this process's namespace.
    Alive(u32),
    /// Gone: nothing it held is held any more.
    Gone,
    /// Not known here; with its pid in this namespace where that is known.
    Unknown(Option<u32>),
}

/// Every running process this one sees in `/proc`, by (pid namespace inode, innermost pid): its pid
/// here and start time; and whether that view is whole.
struct Seen {
    processes: HashMap<(u64, u64), (u32, u64)>,
    /// The pid namespaces of those processes: every process of one of them is visible here (a pid
    /// namespace's processes show in the `/proc` of its own and of every ancestor namespace).
    namespaces: HashSet<u64>,
    /// Whether every process here was read (none hidden by permissions).
    whole: bool,
    /// Whether this `/proc` shows every process of the host: the initial namespace's, and whole.
    everything: bool,
}

impl Seen {
    fn read(me: &Identity) -> Seen {
        let mut seen =
            Seen { processes: HashMap::new(), namespaces: HashSet::new(), whole: true, everything: false };
        let Ok(entries) = std::fs::read_dir("/proc") else {
            seen.whole = false;
            return seen;
        };
        for entry in entries {
            let Ok(entry) = entry else {
                seen.whole = false;
                continue;
            };
            let Some(here) = entry.file_name().to_str().and_then(|name| name.parse::<u32>().ok()) else {
                continue;
            };
            let dir = format!("/proc/{here}");
            match seen_process(&dir) {
                Some(Some((ns, inner, start))) => {
                    seen.processes.insert((ns, inner), (here, start));
                    seen.namespaces.insert(ns);
                }
                Some(None) => {} // finished: it runs nowhere
                // Unreadable: hidden from this process unless it has just gone.
                None => seen.whole &= !std::path::Path::new(&dir).exists(),
            }
        }
        seen.everything = seen.whole && me.pid_ns == INITIAL_PID_NS;
        seen
    }

    /// The fate of `owner`, a process of another pid namespace.
    fn fate(&self, owner: Identity) -> Fate {
        match self.processes.get(&(owner.pid_ns, owner.pid)) {
            Some(&(here, start)) if start == owner.start => Fate::Alive(here),
            Some(_) => Fate::Gone, // another process has that pid in that namespace now
            None if self.whole && (self.everything || self.namespaces.contains(&owner.pid_ns)) => Fate::Gone,
            None => Fate::Unknown(None),
        }
    }
}

/// A running process in `/proc` as (pid namespace inode, innermost pid, start time); `Some(None)`
/// for one that has finished; `None` when it cannot be read.
fn seen_process(dir: &str) -> Option<Option<(u64, u64, u64)>> {
    let stat = stat(dir)?;
    if stat.finished {
        return Some(None);
    }
    let ns = pid_ns(dir)?;
    let status = std::fs::read_to_string(format!("{dir}/status")).ok()?;
    let inner = status
        .lines()
        .find_map(|line| line.strip_prefix("NSpid:"))
        .and_then(|line| line.split_whitespace().last()?.parse::<u64>().ok())?;
    Some(Some((ns, inner, stat.start)))
}

/// What this process can tell of slots' owners: itself, and what its `/proc` shows, read once and
/// only when a slot of another namespace asks for it.
struct Judge {
    me: Identity,
    /// Whether `/proc` is this process's pid namespace's (`/proc/self` is this pid): else what it
    /// shows, or lacks, proves nothing.
    own_proc: bool,
    seen: Option<Seen>,
}

impl Judge {
    fn new() -> Option<Judge> {
        let me = myself()?;
        let own_proc = std::fs::read_link("/proc/self")
            .is_ok_and(|link| link.as_os_str() == me.pid.to_string().as_str());
        Some(Judge { me, own_proc, seen: None })
    }

    fn fate(&mut self, owner: Identity) -> Fate {
        if owner.pid_ns != self.me.pid_ns {
            let me = self.me;
            return if self.own_proc {
                self.seen.get_or_insert_with(|| Seen::read(&me)).fate(owner)
            } else {
                Fate::Unknown(None)
            };
        }
        let Ok(here) = u32::try_from(owner.pid) else { return Fate::Unknown(None) };
        if owner == self.me {
            return Fate::Alive(here);
        }
        if !self.own_proc {
            return if no_such_pid(owner.pid) { Fate::Gone } else { Fate::Unknown(Some(here)) };
        }
        match stat(&format!("/proc/{here}")) {
            Some(stat) if stat.start == owner.start && !stat.finished => Fate::Alive(here),
            Some(_) => Fate::Gone, // finished, or another process has that pid now
            None if no_such_pid(owner.pid) => Fate::Gone,
            None => Fate::Unknown(Some(here)),
        }
    }

    /// Forgets what `/proc` showed, for a judgement of slots claimed since.
    fn look_again(&mut self) {
        self.seen = None;
    }
}

/// What one slot held on one device, given back when the slot is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Given {
    pub device: usize,
    pub bytes: u64,
    /// Whether it held a context there (counted in the device's `processes`).
    pub context: bool,
}

/// What a process holds, to seed a slot it claims late (after a full table) with.
pub struct Holdings {
    pub bytes: [u64; MAX_DEVICES],
    pub contexts: u64,
    pub graphics: u64,
}

/// Empties `slot`, which the caller holds as `CLAIMING`, handing each device's share to `give_back`,
/// and frees it.
fn release(slot: &ProcessSlot, give_back: &mut dyn FnMut(Given)) {
    let contexts = slot.contexts.swap(0, Ordering::AcqRel);
    slot.graphics.store(0, Ordering::Relaxed);
    for (device, held) in slot.bytes.iter().enumerate() {
        let bytes = held.swap(0, Ordering::AcqRel);
        let context = contexts & bit(device) != 0;
        if bytes > 0 || context {
            give_back(Given { device, bytes, context });
        }
    }
    slot.pid.store(0, Ordering::Release);
}

/// Frees the slot of every process of `table` that is gone, handing what each held to `give_back`
/// once (the compare-and-swap of its pid makes one caller its reaper). A slot whose owner is alive,
/// or cannot be judged, stays. Returns how many slots it freed.
pub fn reap(table: &ProcessTable, give_back: &mut dyn FnMut(Given)) -> usize {
    let Some(mut judge) = Judge::new() else { return 0 };
    let mut held = Vec::new();
    for slot in &table.slots {
        let pid = slot.pid.load(Ordering::Acquire);
        if pid == 0 || pid == CLAIMING || judge.fate(Identity::of(slot, pid)) != Fate::Gone {
            continue;
        }
        if slot.pid.compare_exchange(pid, CLAIMING, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
            held.push((slot, pid));
        }
    }
    if held.is_empty() {
        return 0;
    }
    // The slots may have changed hands between the first look and the claim (freed and taken by a
    // new process with the same pid): judge the owners they name now, with a fresh `/proc`.
    judge.look_again();
    let mut freed = 0;
    for (slot, pid) in held {
        if judge.fate(Identity::of(slot, pid)) == Fate::Gone {
            release(slot, give_back);
            freed += 1;
        } else {
            slot.pid.store(pid, Ordering::Release);
        }
    }
    freed
}

/// This process's slot in one table, claimed on first use (again in a fork child).
pub struct OwnSlot {
    slot: AtomicPtr<ProcessSlot>,
    /// The pid that claimed `slot` (a fork child has another and claims its own).
    owner: AtomicU32,
    /// The pid that first asked for a slot: in a fork child, what the fake counted so far is its
    /// parent's, and the child's own slot starts empty.
    first: AtomicU32,
    /// The pid of the thread claiming a slot now (0: none), so that one process claims one slot.
    claiming: AtomicU32,
    /// The pid that gave its slot back at exit: it takes no other.
    exited: AtomicU32,
}

impl OwnSlot {
    pub const fn new() -> OwnSlot {
        OwnSlot {
            slot: AtomicPtr::new(std::ptr::null_mut()),
            owner: AtomicU32::new(0),
            first: AtomicU32::new(0),
            claiming: AtomicU32::new(0),
            exited: AtomicU32::new(0),
        }
    }

    /// This process's slot, if it holds one now.
    fn held(&self, me: u32) -> Option<&'static ProcessSlot> {
        let slot = self.slot.load(Ordering::Acquire);
        if slot.is_null() || self.owner.load(Ordering::Acquire) != me {
            return None;
        }
        // SAFETY: a slot of a 'static table (a mapping never unmapped, or a static), stored by `get`.
        Some(unsafe { &*slot })
    }

    /// This process's slot in `table`, claimed now if it has none; `None` when the table is full (even
    /// after reaping the slots of processes that are gone, through `give_back`), `/proc` cannot tell
    /// who this process is, or it gave its slot back at exit. `holdings` seeds a new slot.
    pub fn get(
        &self,
        table: &'static ProcessTable,
        holdings: impl FnOnce() -> Holdings,
        give_back: &mut dyn FnMut(Given),
    ) -> Option<&'static ProcessSlot> {
        let me = std::process::id();
        if self.exited.load(Ordering::Acquire) == me {
            return None;
        }
        if let Some(slot) = self.held(me) {
            return Some(slot);
        }
        let forked = match self.first.compare_exchange(0, me, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => false,
            Err(first) => first != me,
        };
        let _claiming = self.lock(me);
        if let Some(slot) = self.held(me) {
            return Some(slot); // another thread claimed it meanwhile
        }
        let identity = myself()?;
        let claim = || {
            table.slots.iter().find(|slot| {
                slot.pid.load(Ordering::Relaxed) == 0
                    && slot.pid.compare_exchange(0, CLAIMING, Ordering::AcqRel, Ordering::Relaxed).is_ok()
            })
        };
        let claimed = claim().or_else(|| {
            reap(table, give_back);
            claim()
        })?;
        let held =
            if forked { Holdings { bytes: [0; MAX_DEVICES], contexts: 0, graphics: 0 } } else { holdings() };
        claimed.pid_ns.store(identity.pid_ns, Ordering::Relaxed);
        claimed.start.store(identity.start, Ordering::Relaxed);
        claimed.contexts.store(held.contexts, Ordering::Relaxed);
        claimed.graphics.store(held.graphics, Ordering::Relaxed);
        for (bytes, held) in claimed.bytes.iter().zip(held.bytes) {
            bytes.store(held, Ordering::Relaxed);
        }
        claimed.pid.store(identity.pid, Ordering::Release);
        self.slot.store((claimed as *const ProcessSlot).cast_mut(), Ordering::Release);
        self.owner.store(me, Ordering::Release);
        Some(claimed)
    }

    /// Takes the claim lock for this process: another thread of it holding it is waited for (briefly:
    /// a claim is a scan of the table); a value left by a fork parent is taken over.
    fn lock(&self, me: u32) -> ClaimGuard<'_> {
        let mut held = self.claiming.load(Ordering::Acquire);
        loop {
            if held == me {
                std::thread::yield_now();
                held = self.claiming.load(Ordering::Acquire);
                continue;
            }
            match self.claiming.compare_exchange_weak(held, me, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return ClaimGuard(&self.claiming),
                Err(now) => held = now,
            }
        }
    }

    /// Whether this process gave its slot back at exit (what it held then is given back already).
    pub fn given_back(&self) -> bool {
        self.exited.load(Ordering::Acquire) == std::process::id()
    }

    /// At exit: gives back, through `give_back`, what this process's slot still holds, and frees
    /// it. A fork child that holds no slot of its own leaves its parent's alone.
    pub fn give_back(&self, give_back: &mut dyn FnMut(Given)) {
        let me = std::process::id();
        let Some(slot) = self.held(me) else { return };
        self.exited.store(me, Ordering::Release);
        let pid = u64::from(me);
        // Never fails for a live owner; if a reaper holds it for a second look, it finds this
        // process alive and puts it back, and the slot waits to be reaped once this process is gone.
        if slot.pid.compare_exchange(pid, CLAIMING, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
            release(slot, give_back);
        }
    }
}

/// Holds an [`OwnSlot`]'s claim lock until dropped.
struct ClaimGuard<'a>(&'a AtomicU32);

impl Drop for ClaimGuard<'_> {
    fn drop(&mut self) {
        self.0.store(0, Ordering::Release);
    }
}

fn bit(device: usize) -> u64 {
    1u64.checked_shl(device as u32).unwrap_or(0)
}

impl ProcessSlot {
    pub fn add(&self, device: usize, bytes: u64) {
        if let Some(held) = self.bytes.get(device) {
            held.fetch_add(bytes, Ordering::Relaxed);
        }
    }

    /// Takes up to `bytes` from what the slot holds on `device`, and returns how much it took:
    /// less when the rest was given back already (at exit).
    pub fn take(&self, device: usize, bytes: u64) -> u64 {
        let Some(held) = self.bytes.get(device) else { return 0 };
        let before = held
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |now| Some(now.saturating_sub(bytes)))
            .unwrap_or(0);
        before.min(bytes)
    }

    /// Marks whether the process holds a context on `device`; returns whether that changed (the
    /// process's count on the device moves with it, exactly once).
    pub fn set_context(&self, device: usize, holds: bool) -> bool {
        set_bit(&self.contexts, device, holds)
    }

    pub fn set_graphics(&self, device: usize, holds: bool) {
        set_bit(&self.graphics, device, holds);
    }
}

/// Sets or clears bit `device` of `word`; returns whether it changed.
fn set_bit(word: &AtomicU64, device: usize, on: bool) -> bool {
    let mask = bit(device);
    let before =
        if on { word.fetch_or(mask, Ordering::AcqRel) } else { word.fetch_and(!mask, Ordering::AcqRel) };
    (before & mask != 0) != on
}

/// One process as an NVML list shows it to this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Listed {
    /// Its pid in this process's namespace; `None` when this process cannot see it.
    pub pid: Option<u32>,
    pub bytes: u64,
    /// Whether it is this process.
    pub own: bool,
}

/// Which list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum List {
    /// Processes holding a context on the device.
    Compute,
    /// Processes holding graphics memory on the device.
    Graphics,
}

/// The processes of `table` on `device` in list `list`, as this process sees them: every one but
/// those it finds gone.
pub fn list(table: &ProcessTable, device: usize, list: List) -> Vec<Listed> {
    let Some(mut judge) = Judge::new() else { return Vec::new() };
    let mut listed = Vec::new();
    for slot in &table.slots {
        let pid = slot.pid.load(Ordering::Acquire);
        if pid == 0 || pid == CLAIMING {
            continue;
        }
        let mask = match list {
            List::Compute => slot.contexts.load(Ordering::Relaxed),
            List::Graphics => slot.graphics.load(Ordering::Relaxed),
        };
        if mask & bit(device) == 0 {
            continue;
        }
        let bytes = slot.bytes.get(device).map_or(0, |b| b.load(Ordering::Relaxed));
        let owner = Identity::of(slot, pid);
        let here = match judge.fate(owner) {
            Fate::Alive(here) => Some(here),
            Fate::Unknown(here) => here,
            Fate::Gone => continue,
        };
        listed.push(Listed { pid: here, bytes, own: owner == judge.me });
    }
    listed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaked() -> &'static ProcessTable {
        Box::leak(Box::new(ProcessTable::new()))
    }

    fn holding(device0: u64) -> Holdings {
        let mut bytes = [0; MAX_DEVICES];
        bytes[0] = device0;
        Holdings { bytes, contexts: 0, graphics: 0 }
    }

    /// Gives back into a list.
    fn collect(given: &mut Vec<Given>) -> impl FnMut(Given) + '_ {
        |g| given.push(g)
    }

    /// Writes an owner into slot `k` as a claim would.
    fn occupy(table: &ProcessTable, k: usize, owner: Identity, device0: u64) {
        let slot = &table.slots[k];
        slot.pid_ns.store(owner.pid_ns, Ordering::Relaxed);
        slot.start.store(owner.start, Ordering::Relaxed);
        slot.contexts.store(1, Ordering::Relaxed);
        slot.bytes[0].store(device0, Ordering::Relaxed);
        slot.pid.store(owner.pid, Ordering::Release);
    }

    #[test]
    fn a_process_is_listed_where_it_holds_something_and_gives_it_back_at_exit() {
        let table = leaked();
        let own = OwnSlot::new();
        let mut given = Vec::new();
        let slot = own.get(table, || holding(5), &mut collect(&mut given)).expect("a slot");
        let again = own.get(table, || holding(0), &mut collect(&mut given)).unwrap();
        assert!(std::ptr::eq(slot, again), "claimed once");
        assert!(list(table, 0, List::Compute).is_empty(), "no context yet");
        assert!(slot.set_context(0, true));
        assert!(!slot.set_context(0, true), "no change");
        slot.add(0, 10);
        let me = Listed { pid: Some(std::process::id()), bytes: 15, own: true };
        assert_eq!(list(table, 0, List::Compute), [me]);
        assert!(list(table, 0, List::Graphics).is_empty());
        slot.set_graphics(1, true);
        slot.add(1, 7);
        assert_eq!(list(table, 1, List::Graphics), [Listed { bytes: 7, ..me }]);
        assert_eq!(slot.take(1, 100), 7, "no more than it holds");
        assert_eq!(list(table, 1, List::Graphics)[0].bytes, 0);
        assert!(given.is_empty());
        own.give_back(&mut collect(&mut given));
        assert_eq!(given, [Given { device: 0, bytes: 15, context: true }]);
        assert!(list(table, 0, List::Compute).is_empty());
        assert!(own.given_back());
        assert!(own.get(table, || holding(0), &mut collect(&mut given)).is_none(), "none after exit");
        assert_eq!(slot.take(0, 15), 0, "a free after exit gives nothing back twice");
    }

    #[test]
    fn a_gone_process_is_reaped_once_and_a_live_one_never() {
        let table = leaked();
        let me = myself().unwrap();
        let own = OwnSlot::new();
        let mut given = Vec::new();
        let mine = own.get(table, || holding(40), &mut collect(&mut given)).unwrap();
        // This pid with another start time: a process that died, its pid taken by this one.
        let dead = Identity { start: me.start + 12345, ..me };
        occupy(table, 5, dead, 100);
        table.slots[5].bytes[2].store(7, Ordering::Relaxed);
        assert_eq!(list(table, 0, List::Compute).len(), 0, "neither listed: no context here, one gone");
        assert_eq!(reap(table, &mut collect(&mut given)), 1);
        let freed =
            [Given { device: 0, bytes: 100, context: true }, Given { device: 2, bytes: 7, context: false }];
        assert_eq!(given, freed);
        assert_eq!(table.slots[5].pid.load(Ordering::Relaxed), 0, "free");
        assert_eq!(reap(table, &mut collect(&mut given)), 0, "once");
        assert_eq!(given.len(), 2);
        assert_eq!(mine.bytes[0].load(Ordering::Relaxed), 40, "the live process keeps its bytes");
        assert!(std::ptr::eq(own.get(table, || holding(0), &mut collect(&mut given)).unwrap(), mine));
    }

    #[test]
    fn a_full_table_reaps_before_a_claim() {
        let table = leaked();
        let me = myself().unwrap();
        for k in 0..SLOTS {
            occupy(table, k, Identity { start: me.start + 1 + k as u64, ..me }, 1);
        }
        let own = OwnSlot::new();
        let mut given = Vec::new();
        let slot = own.get(table, || holding(3), &mut collect(&mut given)).expect("a slot once reaped");
        assert_eq!(given.len(), SLOTS, "every dead slot given back");
        assert_eq!(slot.bytes[0].load(Ordering::Relaxed), 3, "seeded");
        assert_eq!(slot.contexts.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_finished_child_is_gone_before_it_is_waited_for() {
        let mut child = std::process::Command::new("true").spawn().expect("spawn true");
        let dir = format!("/proc/{}", child.id());
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !stat(&dir).expect("a zombie stays in /proc").finished {
            assert!(std::time::Instant::now() < deadline, "the child never finished");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let mut judge = Judge::new().unwrap();
        let zombie = Identity { pid: u64::from(child.id()), start: stat(&dir).unwrap().start, ..judge.me };
        assert_eq!(judge.fate(zombie), Fate::Gone);
        assert_eq!(judge.fate(judge.me), Fate::Alive(std::process::id()));
        child.wait().expect("wait");
        assert_eq!(judge.fate(zombie), Fate::Gone);
    }

    #[test]
    fn another_namespace_is_judged_only_where_all_of_it_is_seen() {
        let seen = |whole, everything| Seen {
            processes: HashMap::from([((7, 3), (1003, 50))]),
            namespaces: HashSet::from([7]),
            whole,
            everything,
        };
        let owner = |pid_ns, pid, start| Identity { pid, pid_ns, start };
        let partial = seen(true, false);
        assert_eq!(partial.fate(owner(7, 3, 50)), Fate::Alive(1003));
        assert_eq!(partial.fate(owner(7, 3, 51)), Fate::Gone, "another process has its pid");
        assert_eq!(partial.fate(owner(7, 4, 50)), Fate::Gone, "its namespace is seen whole");
        assert_eq!(partial.fate(owner(8, 4, 50)), Fate::Unknown(None), "a namespace not seen from here");
        assert_eq!(seen(false, false).fate(owner(7, 4, 50)), Fate::Unknown(None), "some processes hidden");
        assert_eq!(seen(true, true).fate(owner(8, 4, 50)), Fate::Gone, "the host's /proc shows all");
    }
}
