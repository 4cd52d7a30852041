//! The container-wide ledger in the shared region.
//!
//! Each process holds a *lease*: a record of what it has charged per device, kept alive by an OFD
//! lock the kernel drops when the process dies, however it dies. Every change happens under the
//! region's robust mutex, so check-and-reserve is one step for all processes. A lease's `used`
//! is the truth; the per-device totals and the HAMi slots the monitor reads are derived from the
//! leases and rebuilt from them whenever a process leaves or dies, including a death while
//! holding the mutex.

use std::os::fd::IntoRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, Ordering};
use std::sync::{Once, OnceLock};

use crate::config::{Config, MAX_DEVICES};
use crate::region::layout::{CONTEXT_COST_KNOWN, MAX_PROCESSES, UNLIMITED};
use crate::region::{InitialContents, Region, RegionError, RegionGuard, field, i32_at, u32_at, u64_at};
use crate::{Ledger, LedgerError, MonitorSwitches, Owner};

/// The ledger this library attached, whose lease is given back at exit.
static ATTACHED: OnceLock<&'static SharedLedger> = OnceLock::new();
/// Bumped in the child after every `fork`: the child must take its own lease.
static FORK_GENERATION: AtomicU32 = AtomicU32::new(0);
/// The descriptor holding our lease lock; the fork child closes its inherited copy.
static LEASE_FD: AtomicI32 = AtomicI32::new(-1);

const NO_MEMBERSHIP: u64 = u64::MAX;
/// How long a process waits for a sibling's context measurement before measuring on its own.
const MEASURE_PATIENCE: std::time::Duration = std::time::Duration::from_secs(5);

/// A ledger in the shared region file.
pub struct SharedLedger {
    region: Region,
    /// Region device index of each CUDA ordinal of this process.
    index: [Option<usize>; MAX_DEVICES],
    /// Budget of each CUDA ordinal, as the file says.
    limits: [Option<u64>; MAX_DEVICES],
    /// `generation << 32 | lease` of our live lease, or [`NO_MEMBERSHIP`].
    membership: AtomicU64,
    full_reported: AtomicBool,
}

impl SharedLedger {
    /// Opens (or creates) the region at `path` and maps this process's devices onto it by UUID.
    /// `uuids` are the `GPU-…` strings of the process's CUDA ordinals. The ledger lives as long as
    /// the process; the first one attached gives its lease back at a normal exit.
    pub fn attach(
        config: &Config,
        path: &Path,
        uuids: &[Vec<u8>],
    ) -> Result<&'static SharedLedger, RegionError> {
        let env_limit = |ordinal: usize| config.memory_limit(ordinal).unwrap_or(UNLIMITED);
        let contents = InitialContents {
            uuids: uuids.to_vec(),
            limits: std::array::from_fn(env_limit),
            sm_limits: config.sm_limit,
            priority: config.task_priority,
        };
        let region = Region::open(path, &contents)?;
        let mut index = [None; MAX_DEVICES];
        let mut limits = [None; MAX_DEVICES];
        {
            let _guard = region.lock(|| repair(&region))?;
            let device_num = u64_at(field!(region, device_num)).load(Ordering::Acquire) as usize;
            let mut known: Vec<Vec<u8>> =
                (0..device_num.min(MAX_DEVICES)).map(|i| region.read_uuid(i)).collect();
            for (ordinal, uuid) in uuids.iter().enumerate().take(MAX_DEVICES) {
                let i = match known.iter().position(|k| k.eq_ignore_ascii_case(uuid)) {
                    Some(i) => i,
                    None if known.len() < MAX_DEVICES => {
                        // A device the creator did not see (another CUDA_VISIBLE_DEVICES).
                        let i = known.len();
                        region.write_uuid(i, uuid);
                        u64_at(field!(region, ledger.limit[i])).store(env_limit(ordinal), Ordering::Relaxed);
                        let hami = if env_limit(ordinal) == UNLIMITED { 0 } else { env_limit(ordinal) };
                        u64_at(field!(region, limit[i])).store(hami, Ordering::Relaxed);
                        u64_at(field!(region, device_num)).store(i as u64 + 1, Ordering::Release);
                        known.push(uuid.clone());
                        i
                    }
                    None => continue,
                };
                index[ordinal] = Some(i);
                let file_limit = u64_at(field!(region, ledger.limit[i])).load(Ordering::Acquire);
                if file_limit != env_limit(ordinal) {
                    tracing::warn!(
                        "CUDA_DEVICE_MEMORY_LIMIT for device {ordinal} is {} here but {} in the shared file {}; \
                         the file's budget applies",
                        describe(env_limit(ordinal)),
                        describe(file_limit),
                        path.display()
                    );
                }
                limits[ordinal] = (file_limit != UNLIMITED).then_some(file_limit);
            }
        }
        let ledger: &'static SharedLedger = Box::leak(Box::new(SharedLedger {
            region,
            index,
            limits,
            membership: AtomicU64::new(NO_MEMBERSHIP),
            full_reported: AtomicBool::new(false),
        }));
        let _ = ATTACHED.set(ledger);
        register_process_hooks();
        Ok(ledger)
    }

    fn lock(&self) -> Result<RegionGuard<'_>, LedgerError> {
        self.region.lock(|| repair(&self.region)).map_err(|error| {
            tracing::error!("{error}");
            LedgerError::RegionUnavailable
        })
    }

    /// Our lease and the owner token of charges made under it, taking a lease on first use (and
    /// again after a fork).
    fn membership(&self) -> Result<(usize, Owner), LedgerError> {
        let generation = u64::from(FORK_GENERATION.load(Ordering::Acquire));
        let current = self.membership.load(Ordering::Acquire);
        if current != NO_MEMBERSHIP && current >> 32 == generation {
            return Ok(((current & 0xffff_ffff) as usize, current));
        }
        let _guard = self.lock()?;
        let current = self.membership.load(Ordering::Acquire);
        if current != NO_MEMBERSHIP && current >> 32 == generation {
            return Ok(((current & 0xffff_ffff) as usize, current));
        }
        let lease = self.register().map_err(|error| {
            if !self.full_reported.swap(true, Ordering::Relaxed) {
                tracing::error!("{error}; this process's allocations on budgeted devices are refused");
            }
            LedgerError::RegionUnavailable
        })?;
        let token = generation << 32 | lease as u64;
        self.membership.store(token, Ordering::Release);
        Ok((lease, token))
    }

    /// Takes a free lease and appends its HAMi slot. Called with the mutex held.
    fn register(&self) -> Result<usize, RegionError> {
        let region = &self.region;
        let fd = lease_fd(region)?;
        reap(region);
        let proc_num = i32_at(field!(region, proc_num)).load(Ordering::Acquire).max(0) as usize;
        let free = (0..MAX_PROCESSES).find(|&k| {
            u32_at(field!(region, ledger.leases[k].state)).load(Ordering::Acquire) == 0
                && crate::region::claim_lease(fd, k)
        });
        let (Some(lease), true) = (free, proc_num < MAX_PROCESSES) else {
            return Err(RegionError::Full { path: region.path().to_owned() });
        };
        // SAFETY: getpid has no preconditions.
        let pid = unsafe { libc::getpid() };
        i32_at(field!(region, ledger.leases[lease].pid)).store(pid, Ordering::Relaxed);
        for d in 0..MAX_DEVICES {
            u64_at(field!(region, ledger.leases[lease].used[d])).store(0, Ordering::Relaxed);
        }
        u32_at(field!(region, ledger.leases[lease].slot)).store(proc_num as u32, Ordering::Relaxed);
        write_slot(region, proc_num, lease);
        u32_at(field!(region, ledger.leases[lease].state)).store(1, Ordering::Release);
        i32_at(field!(region, proc_num)).store(proc_num as i32 + 1, Ordering::Release);
        Ok(lease)
    }

    /// Adds `add` and takes away `sub` bytes on region device `index` for lease `lease`: in the
    /// lease, the device total and the lease's HAMi slot. Called with the mutex held.
    fn apply(&self, lease: usize, index: usize, add: u64, sub: u64) {
        let region = &self.region;
        let change = |value: u64| value.saturating_add(add).saturating_sub(sub);
        let total = u64_at(field!(region, ledger.used[index]));
        let mine = u64_at(field!(region, ledger.leases[lease].used[index]));
        // The lease first: it is the truth a repair rebuilds everything else from.
        let new_mine = change(mine.load(Ordering::Relaxed));
        mine.store(new_mine, Ordering::Release);
        total.store(change(total.load(Ordering::Relaxed)), Ordering::Release);
        let slot = u32_at(field!(region, ledger.leases[lease].slot)).load(Ordering::Relaxed) as usize;
        if slot < MAX_PROCESSES {
            u64_at(field!(region, slots[slot].memory[index].data)).store(new_mine, Ordering::Relaxed);
            u64_at(field!(region, slots[slot].memory[index].total)).store(new_mine, Ordering::Relaxed);
        }
    }
}

impl Ledger for SharedLedger {
    fn any_limit(&self) -> bool {
        self.limits.iter().any(Option::is_some)
    }

    fn limit(&self, device: usize) -> Option<u64> {
        self.limits.get(device).copied().flatten()
    }

    fn try_reserve(&self, device: usize, bytes: u64) -> Result<Owner, LedgerError> {
        let Some(index) = self.index.get(device).copied().flatten() else {
            return Err(LedgerError::BudgetExceeded { device, requested: bytes, used: 0, limit: 0 });
        };
        let limit = self.limit(device).unwrap_or(UNLIMITED);
        if bytes == 0 {
            // Nothing to count (e.g. a context that costs nothing): no lease needed.
            return Ok(self.membership.load(Ordering::Acquire));
        }
        let (lease, owner) = self.membership()?;
        let total = u64_at(field!(self.region, ledger.used[index]));
        let fits = |used: u64| used.checked_add(bytes).is_some_and(|after| after <= limit);
        {
            let _guard = self.lock()?;
            if fits(total.load(Ordering::Acquire)) {
                self.apply(lease, index, bytes, 0);
                return Ok(owner);
            }
        }
        // Before refusing, give back what dead processes still hold. Finding them takes a system
        // call per live lease, so that is done without the mutex; only the dead are freed under it.
        let dead = dead_leases(&self.region);
        let _guard = self.lock()?;
        if !dead.is_empty() {
            reap_among(&self.region, &dead);
        }
        let used = total.load(Ordering::Acquire);
        if !fits(used) {
            return Err(LedgerError::BudgetExceeded { device, requested: bytes, used, limit });
        }
        self.apply(lease, index, bytes, 0);
        Ok(owner)
    }

    fn record_committed(&self, device: usize, bytes: u64) -> Result<Owner, LedgerError> {
        let Some(index) = self.index.get(device).copied().flatten() else {
            return Err(LedgerError::BudgetExceeded { device, requested: bytes, used: 0, limit: 0 });
        };
        if bytes == 0 {
            return Ok(self.membership.load(Ordering::Acquire));
        }
        let (lease, owner) = self.membership()?;
        let _guard = self.lock()?;
        self.apply(lease, index, bytes, 0);
        Ok(owner)
    }

    fn context_cost(&self, device: usize, create: &mut dyn FnMut(bool) -> Option<u64>) -> Option<u64> {
        let Some(index) = self.index.get(device).copied().flatten() else { return create(true) };
        let remembered = u64_at(field!(self.region, ledger.context_cost[index]));
        let known = remembered.load(Ordering::Acquire);
        if known & CONTEXT_COST_KNOWN != 0 {
            create(false)?;
            return Some(known & !CONTEXT_COST_KNOWN);
        }
        // The first measurement on this device: one process at a time, so that siblings starting
        // together do not count each other's contexts.
        let fd = self.region.fd();
        let locked = crate::region::lock_measurement(fd, index, MEASURE_PATIENCE);
        let known = remembered.load(Ordering::Acquire);
        let result = if known & CONTEXT_COST_KNOWN != 0 {
            create(false).map(|_| known & !CONTEXT_COST_KNOWN)
        } else {
            create(true).inspect(|&measured| {
                let _ = remembered.compare_exchange(
                    0,
                    measured | CONTEXT_COST_KNOWN,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                );
            })
        };
        if locked {
            crate::region::unlock_measurement(fd, index);
        }
        result
    }

    fn release(&self, device: usize, bytes: u64, owner: Owner) {
        let Some(index) = self.index.get(device).copied().flatten() else { return };
        // A zero-byte charge took no lease, so its owner names none.
        if bytes == 0 || owner == NO_MEMBERSHIP || self.membership.load(Ordering::Acquire) != owner {
            return; // or charged to our parent's lease before a fork, or to a lease already gone
        }
        let Ok(_guard) = self.lock() else { return };
        self.apply((owner & 0xffff_ffff) as usize, index, 0, bytes);
    }

    fn used(&self, device: usize) -> u64 {
        match self.index.get(device).copied().flatten() {
            Some(index) => u64_at(field!(self.region, ledger.used[index])).load(Ordering::Acquire),
            None => 0,
        }
    }

    fn pace_clock(&self, device: usize) -> Option<&AtomicU64> {
        let index = self.index.get(device).copied().flatten()?;
        Some(u64_at(field!(self.region, ledger.pace[index])))
    }

    fn monitor(&self) -> MonitorSwitches {
        MonitorSwitches {
            utilization_switch: i32_at(field!(self.region, utilization_switch)).load(Ordering::Relaxed),
            recent_kernel: i32_at(field!(self.region, recent_kernel)).load(Ordering::Relaxed),
        }
    }

    fn publish_utilisation(&self, device: usize, percent: u64) {
        let Some(index) = self.index.get(device).copied().flatten() else { return };
        let Ok((lease, _)) = self.membership() else { return };
        // Under the mutex: slots move when a sibling leaves.
        let Ok(_guard) = self.lock() else { return };
        let slot = u32_at(field!(self.region, ledger.leases[lease].slot)).load(Ordering::Relaxed) as usize;
        if slot < MAX_PROCESSES {
            u64_at(field!(self.region, slots[slot].util[index].sm_util)).store(percent, Ordering::Relaxed);
        }
    }

    fn touch_last_kernel(&self, unix_seconds: u64) {
        let last = u64_at(field!(self.region, last_kernel_time));
        if last.load(Ordering::Relaxed) != unix_seconds {
            last.store(unix_seconds, Ordering::Relaxed);
        }
    }

    fn on_exit(&self) {
        let current = self.membership.load(Ordering::Acquire);
        if current == NO_MEMBERSHIP || current >> 32 != u64::from(FORK_GENERATION.load(Ordering::Acquire)) {
            return;
        }
        let Ok(_guard) = self.lock() else { return };
        let lease = (current & 0xffff_ffff) as usize;
        free_lease(&self.region, lease);
        rebuild_slots(&self.region);
        self.membership.store(NO_MEMBERSHIP, Ordering::Release);
        let fd = LEASE_FD.load(Ordering::Acquire);
        if fd >= 0 {
            crate::region::release_lease(fd, lease);
        }
    }
}

fn describe(limit: u64) -> String {
    if limit == UNLIMITED { "unlimited".to_owned() } else { format!("{limit} bytes") }
}

/// The descriptor for our lease lock: a description of the file of our own, so that neither the
/// region's descriptor nor a fork parent's lock is mistaken for it.
fn lease_fd(region: &Region) -> Result<i32, RegionError> {
    let fd = LEASE_FD.load(Ordering::Acquire);
    if fd >= 0 {
        return Ok(fd);
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(region.path())
        .map_err(|error| RegionError::Io { path: region.path().to_owned(), what: "open", error })?;
    let fd = file.into_raw_fd();
    LEASE_FD.store(fd, Ordering::Release);
    Ok(fd)
}

/// Frees lease `lease`: its bytes leave the device totals. Mutex held.
fn free_lease(region: &Region, lease: usize) {
    for d in 0..MAX_DEVICES {
        let used = u64_at(field!(region, ledger.leases[lease].used[d]));
        let bytes = used.load(Ordering::Acquire);
        if bytes > 0 {
            let total = u64_at(field!(region, ledger.used[d]));
            total.store(total.load(Ordering::Relaxed).saturating_sub(bytes), Ordering::Release);
            used.store(0, Ordering::Release);
        }
    }
    u32_at(field!(region, ledger.leases[lease].state)).store(0, Ordering::Release);
}

fn is_live(region: &Region, lease: usize) -> bool {
    u32_at(field!(region, ledger.leases[lease].state)).load(Ordering::Acquire) == 1
}

/// A set of lease indexes, kept on the stack.
struct LeaseSet([u64; MAX_PROCESSES / 64]);

impl LeaseSet {
    fn all() -> LeaseSet {
        LeaseSet([u64::MAX; MAX_PROCESSES / 64])
    }

    fn contains(&self, lease: usize) -> bool {
        self.0[lease / 64] & (1 << (lease % 64)) != 0
    }

    fn insert(&mut self, lease: usize) {
        self.0[lease / 64] |= 1 << (lease % 64);
    }

    fn is_empty(&self) -> bool {
        self.0.iter().all(|&bits| bits == 0)
    }
}

/// Whether lease `lease` is live but its owner has died. Uses the region's descriptor, whose
/// description holds no lease lock, so our own lease reads as held too.
fn is_dead(region: &Region, lease: usize) -> bool {
    is_live(region, lease) && !crate::region::lease_is_held(region.fd(), lease)
}

/// Live leases whose owners have died, read without the mutex (a hint, confirmed under it).
fn dead_leases(region: &Region) -> LeaseSet {
    let mut dead = LeaseSet([0; MAX_PROCESSES / 64]);
    for lease in (0..MAX_PROCESSES).filter(|&k| is_dead(region, k)) {
        dead.insert(lease);
    }
    dead
}

/// Frees the leases in `candidates` whose owners are confirmed dead, and rebuilds the HAMi slots
/// if any were. Mutex held.
fn reap_among(region: &Region, candidates: &LeaseSet) {
    let mut reaped = false;
    for lease in (0..MAX_PROCESSES).filter(|&k| candidates.contains(k) && is_dead(region, k)) {
        free_lease(region, lease);
        reaped = true;
    }
    if reaped {
        rebuild_slots(region);
    }
}

/// Frees every live lease whose owner has died. Mutex held.
fn reap(region: &Region) {
    reap_among(region, &LeaseSet::all());
}

/// After a process died holding the mutex: recompute the totals from the leases (the truth),
/// then reap and rebuild the monitor's view.
fn repair(region: &Region) {
    for d in 0..MAX_DEVICES {
        let sum = (0..MAX_PROCESSES)
            .filter(|&k| is_live(region, k))
            .map(|k| u64_at(field!(region, ledger.leases[k].used[d])).load(Ordering::Acquire))
            .fold(0u64, u64::saturating_add);
        u64_at(field!(region, ledger.used[d])).store(sum, Ordering::Release);
    }
    reap(region);
    rebuild_slots(region);
}

/// Writes HAMi slot `slot` from lease `lease`.
fn write_slot(region: &Region, slot: usize, lease: usize) {
    let pid = i32_at(field!(region, ledger.leases[lease].pid)).load(Ordering::Relaxed);
    i32_at(field!(region, slots[slot].pid)).store(pid, Ordering::Relaxed);
    i32_at(field!(region, slots[slot].host_pid)).store(0, Ordering::Relaxed);
    for d in 0..MAX_DEVICES {
        let used = u64_at(field!(region, ledger.leases[lease].used[d])).load(Ordering::Relaxed);
        u64_at(field!(region, slots[slot].memory[d].data)).store(used, Ordering::Relaxed);
        u64_at(field!(region, slots[slot].memory[d].total)).store(used, Ordering::Relaxed);
    }
    i32_at(field!(region, slots[slot].status)).store(1, Ordering::Release);
}

/// Lays the live leases out densely in HAMi slots `[0, proc_num)`. Mutex held.
fn rebuild_slots(region: &Region) {
    let old = i32_at(field!(region, proc_num)).load(Ordering::Acquire).clamp(0, MAX_PROCESSES as i32);
    let mut next = 0;
    for lease in (0..MAX_PROCESSES).filter(|&k| is_live(region, k)) {
        u32_at(field!(region, ledger.leases[lease].slot)).store(next as u32, Ordering::Relaxed);
        write_slot(region, next, lease);
        next += 1;
    }
    for slot in next..old as usize {
        i32_at(field!(region, slots[slot].status)).store(0, Ordering::Relaxed);
        i32_at(field!(region, slots[slot].pid)).store(0, Ordering::Relaxed);
        for d in 0..MAX_DEVICES {
            u64_at(field!(region, slots[slot].memory[d].data)).store(0, Ordering::Relaxed);
            u64_at(field!(region, slots[slot].memory[d].total)).store(0, Ordering::Relaxed);
            u64_at(field!(region, slots[slot].util[d].sm_util)).store(0, Ordering::Relaxed);
        }
    }
    i32_at(field!(region, proc_num)).store(next as i32, Ordering::Release);
}

/// After `fork`, in the child: drop the inherited lease descriptor (closing our copy leaves the
/// parent's lock in place) and make the next charge take a new lease. Async-signal-safe.
extern "C" fn after_fork_in_child() {
    let fd = LEASE_FD.swap(-1, Ordering::AcqRel);
    if fd >= 0 {
        // SAFETY: `fd` is our own descriptor, no longer reachable through LEASE_FD.
        unsafe { libc::close(fd) };
    }
    FORK_GENERATION.fetch_add(1, Ordering::AcqRel);
}

/// At normal exit, give our lease back so the monitor stops showing us at once.
extern "C" fn at_exit() {
    let _ = std::panic::catch_unwind(|| {
        if let Some(ledger) = ATTACHED.get() {
            ledger.on_exit();
        }
    });
}

fn register_process_hooks() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: both handlers are `extern "C"` functions that live as long as the process (the
        // library is never unloaded: linked with -z nodelete).
        unsafe {
            libc::pthread_atfork(None, None, Some(after_fork_in_child));
            libc::atexit(at_exit);
        }
    });
}
