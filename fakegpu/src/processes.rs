//! The processes on the simulated card, for NVML's process lists: one slot per process that holds
//! memory, a context or graphics memory on any device, in the shared file with `FAKEGPU_SHARED`
//! (so that a node-side NVML caller sees every process, with its bytes, as a real driver lists
//! them), else process-local.
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
//! A slot is claimed by compare-and-swap of its pid, on the process's first charge; a process
//! gives it back at exit, and one that was killed leaves it, to be taken over by the next process
//! of the same pid namespace that finds its owner gone (another start time at that pid, or none).
//! A reader in another pid namespace finds the slot's process in its own `/proc` by namespace
//! inode and innermost pid (`NSpid`), as the real driver lists pids in the caller's namespace; one
//! it cannot see is listed with pid 0 and memory "not available".

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, Ordering};

use crate::config::MAX_DEVICES;

/// Processes one shared file lists at once.
pub const SLOTS: usize = 128;
const CLAIMING: u64 = u64::MAX;

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

fn pid_ns(proc_dir: &str) -> Option<u64> {
    std::fs::metadata(format!("{proc_dir}/ns/pid")).ok().map(|meta| meta.ino())
}

/// Field 22 of `/proc/<pid>/stat`: after the command name in parentheses, the 20th field.
fn start_time(proc_dir: &str) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("{proc_dir}/stat")).ok()?;
    stat.rsplit_once(')')?.1.split_whitespace().nth(19)?.parse().ok()
}

fn myself() -> Option<Identity> {
    Some(Identity {
        pid: u64::from(std::process::id()),
        pid_ns: pid_ns("/proc/self")?,
        start: start_time("/proc/self")?,
    })
}

/// This process's slot in one table, claimed on first use (again in a fork child).
pub struct OwnSlot {
    slot: AtomicPtr<ProcessSlot>,
    /// The pid that claimed `slot` (a fork child has another and claims its own).
    owner: AtomicU32,
}

/// The table `at_exit` gives this process's slot back in.
static EXITING: AtomicPtr<ProcessSlot> = AtomicPtr::new(std::ptr::null_mut());

extern "C" fn at_exit() {
    let slot = EXITING.load(Ordering::Acquire);
    if !slot.is_null() {
        // SAFETY: `slot` points into a table that lives for 'static (a mapping never unmapped, or
        // a static).
        free(unsafe { &*slot });
    }
}

fn free(slot: &ProcessSlot) {
    for bytes in &slot.bytes {
        bytes.store(0, Ordering::Relaxed);
    }
    slot.contexts.store(0, Ordering::Relaxed);
    slot.graphics.store(0, Ordering::Relaxed);
    slot.pid.store(0, Ordering::Release);
}

impl OwnSlot {
    pub const fn new() -> OwnSlot {
        OwnSlot { slot: AtomicPtr::new(std::ptr::null_mut()), owner: AtomicU32::new(0) }
    }

    /// This process's slot in `table`, claimed now if it has none; `None` when the table is full
    /// or `/proc` cannot tell who this process is. `own` seeds a new slot's bytes.
    pub fn get(&self, table: &'static ProcessTable, own: &[AtomicU64]) -> Option<&'static ProcessSlot> {
        let me = std::process::id();
        let slot = self.slot.load(Ordering::Acquire);
        if !slot.is_null() && self.owner.load(Ordering::Acquire) == me {
            // SAFETY: a slot of a 'static table, stored below.
            return Some(unsafe { &*slot });
        }
        let identity = myself()?;
        let claimed = table.slots.iter().find(|slot| {
            let pid = slot.pid.load(Ordering::Acquire);
            let free = pid == 0 || (pid != CLAIMING && gone(slot, pid, identity.pid_ns));
            free && slot.pid.compare_exchange(pid, CLAIMING, Ordering::AcqRel, Ordering::Relaxed).is_ok()
        })?;
        claimed.pid_ns.store(identity.pid_ns, Ordering::Relaxed);
        claimed.start.store(identity.start, Ordering::Relaxed);
        claimed.contexts.store(0, Ordering::Relaxed);
        claimed.graphics.store(0, Ordering::Relaxed);
        for (bytes, own) in claimed.bytes.iter().zip(own) {
            bytes.store(own.load(Ordering::Relaxed), Ordering::Relaxed);
        }
        claimed.pid.store(identity.pid, Ordering::Release);
        self.slot.store((claimed as *const ProcessSlot).cast_mut(), Ordering::Release);
        self.owner.store(me, Ordering::Release);
        if EXITING.swap((claimed as *const ProcessSlot).cast_mut(), Ordering::AcqRel).is_null() {
            // SAFETY: registers a plain extern "C" function with no arguments.
            unsafe { libc::atexit(at_exit) };
        }
        Some(claimed)
    }
}

/// Whether the process that claimed `slot` (pid `pid` of this namespace) is gone: a slot of
/// another namespace is never judged.
fn gone(slot: &ProcessSlot, pid: u64, my_ns: u64) -> bool {
    if slot.pid_ns.load(Ordering::Relaxed) != my_ns {
        return false;
    }
    start_time(&format!("/proc/{pid}")) != Some(slot.start.load(Ordering::Relaxed))
}

impl ProcessSlot {
    pub fn add(&self, device: usize, bytes: u64) {
        if let Some(held) = self.bytes.get(device) {
            held.fetch_add(bytes, Ordering::Relaxed);
        }
    }

    pub fn take(&self, device: usize, bytes: u64) {
        if let Some(held) = self.bytes.get(device) {
            let _ = held
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |now| Some(now.saturating_sub(bytes)));
        }
    }

    pub fn set_context(&self, device: usize, holds: bool) {
        set_bit(&self.contexts, device, holds);
    }

    pub fn set_graphics(&self, device: usize, holds: bool) {
        set_bit(&self.graphics, device, holds);
    }
}

fn set_bit(word: &AtomicU64, bit: usize, on: bool) {
    let mask = 1u64.checked_shl(bit as u32).unwrap_or(0);
    if on {
        word.fetch_or(mask, Ordering::Relaxed);
    } else {
        word.fetch_and(!mask, Ordering::Relaxed);
    }
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

/// The live processes of `table` on `device` in list `list`, as this process sees them.
pub fn list(table: &ProcessTable, device: usize, list: List) -> Vec<Listed> {
    let Some(me) = myself() else { return Vec::new() };
    let mut foreign: Option<HashMap<(u64, u64), (u32, u64)>> = None;
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
        if mask & 1u64.checked_shl(device as u32).unwrap_or(0) == 0 {
            continue;
        }
        let bytes = slot.bytes.get(device).map_or(0, |b| b.load(Ordering::Relaxed));
        let (ns, start) = (slot.pid_ns.load(Ordering::Relaxed), slot.start.load(Ordering::Relaxed));
        if ns == me.pid_ns {
            if start_time(&format!("/proc/{pid}")) == Some(start) {
                let own = pid == me.pid && start == me.start;
                listed.push(Listed { pid: u32::try_from(pid).ok(), bytes, own });
            }
            continue;
        }
        let seen = foreign.get_or_insert_with(visible_processes);
        match seen.get(&(ns, pid)) {
            Some(&(here, seen_start)) if seen_start == start => {
                listed.push(Listed { pid: Some(here), bytes, own: false });
            }
            Some(_) => {} // gone: another process has that pid now
            None => listed.push(Listed { pid: None, bytes, own: false }),
        }
    }
    listed
}

/// Every process this one can see in `/proc`, by (pid namespace inode, innermost pid): its pid
/// here and its start time.
fn visible_processes() -> HashMap<(u64, u64), (u32, u64)> {
    let mut seen = HashMap::new();
    let Ok(entries) = std::fs::read_dir("/proc") else { return seen };
    for entry in entries.flatten() {
        let Some(here) = entry.file_name().to_str().and_then(|name| name.parse::<u32>().ok()) else {
            continue;
        };
        let dir = format!("/proc/{here}");
        let (Some(ns), Some(start)) = (pid_ns(&dir), start_time(&dir)) else { continue };
        let Ok(status) = std::fs::read_to_string(format!("{dir}/status")) else { continue };
        let inner = status
            .lines()
            .find_map(|line| line.strip_prefix("NSpid:"))
            .and_then(|line| line.split_whitespace().last()?.parse::<u64>().ok());
        if let Some(inner) = inner {
            seen.insert((ns, inner), (here, start));
        }
    }
    seen
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_is_listed_where_it_holds_something_and_goes_at_free() {
        let table: &'static ProcessTable = Box::leak(Box::new(ProcessTable::new()));
        let own = OwnSlot::new();
        let counters: [AtomicU64; 2] = [AtomicU64::new(5), AtomicU64::new(0)];
        let slot = own.get(table, &counters).expect("a slot");
        assert!(std::ptr::eq(slot, own.get(table, &counters).unwrap()), "claimed once");
        assert!(list(table, 0, List::Compute).is_empty(), "no context yet");
        slot.set_context(0, true);
        slot.add(0, 10);
        let me = Listed { pid: Some(std::process::id()), bytes: 15, own: true };
        assert_eq!(list(table, 0, List::Compute), [me]);
        assert!(list(table, 0, List::Graphics).is_empty());
        slot.set_graphics(1, true);
        slot.add(1, 7);
        assert_eq!(list(table, 1, List::Graphics), [Listed { bytes: 7, ..me }]);
        slot.take(1, 100);
        assert_eq!(list(table, 1, List::Graphics)[0].bytes, 0);
        free(slot);
        assert!(list(table, 0, List::Compute).is_empty());
    }

    #[test]
    fn a_slot_whose_process_is_gone_is_not_listed_and_is_taken_over() {
        let table: &'static ProcessTable = Box::leak(Box::new(ProcessTable::new()));
        let me = myself().unwrap();
        // A slot of this namespace whose start time no process at that pid has.
        let stale = &table.slots[0];
        stale.pid_ns.store(me.pid_ns, Ordering::Relaxed);
        stale.start.store(me.start + 12345, Ordering::Relaxed);
        stale.contexts.store(1, Ordering::Relaxed);
        stale.pid.store(me.pid, Ordering::Release);
        assert!(list(table, 0, List::Compute).is_empty());
        let own = OwnSlot::new();
        let slot = own.get(table, &[]).unwrap();
        assert!(std::ptr::eq(slot, stale), "taken over");
        assert_eq!(slot.contexts.load(Ordering::Relaxed), 0);
    }
}
