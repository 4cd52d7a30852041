//! The container-wide ledger in the shared region, with no cross-process lock.
//!
//! Each process holds a *lease*: what it has charged per device, kept alive by an OFD lock the
//! kernel drops when the process dies, however it dies. Charging and crediting never wait for
//! another process, whatever state it is in (running, stopped, throttled, dead):
//!
//! - check-and-reserve is one compare-and-swap on the device's container total, with the budget
//!   check folded in; the lease is updated around it by its owner alone;
//! - a lease word holds the process's bytes and, in its high bits, how many of its updates are in
//!   flight: an update is announced there first, the total moves, then one more add on the lease
//!   word both applies the bytes and withdraws the announcement. The order makes a process killed
//!   half-way leave bytes *counted*, never missing: the budget may run short by what it had in
//!   flight, never over;
//! - a dead lease is reclaimed by whichever process sees it first: one compare-and-swap on its
//!   state elects the reclaimer, which subtracts the lease's bytes from the totals and clears its
//!   HAMi slot. If it died with an update in flight, the device is marked `suspect`, and a
//!   recount returns what it left: the live leases are summed at a moment when none has an
//!   update in flight, and the total is swapped from the word read before (whose version moves
//!   with every change, so any update in between makes the swap fail);
//! - every process with a lease runs a watcher thread, asleep on the region file's close events,
//!   so a death is noticed within moments even in an idle container ([`watch`]).
//!
//! Lease `k` is mirrored in HAMi slot `k`, written by its owner only; the monitor skips slots whose
//! status is 0, and `proc_num` is the highest slot ever used plus one.

use std::os::fd::IntoRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, Ordering};
use std::sync::{Once, OnceLock};
use std::time::Duration;

use parking_lot::Mutex;

use crate::config::{Config, MAX_DEVICES};
use crate::region::layout::{
    BYTE_MASK, COMPATIBLE_CONTEXT_COST_EXACT, COMPATIBLE_OVERCOMMIT, CONTEXT_COST_KNOWN, HIGH_STEP,
    LEASE_FREE, LEASE_LIVE, LEASE_REAPING, MAX_PROCESSES, OWNER_FEATURES, UNLIMITED,
};
use crate::region::{InitialContents, Region, RegionError, field, i32_at, u32_at, u64_at};
use crate::{ContextCost, Ledger, LedgerError, MonitorSwitches, Owner};

/// The ledger this library attached, whose lease is given back at exit.
static ATTACHED: OnceLock<&'static SharedLedger> = OnceLock::new();
/// Bumped in the child after every `fork`: the child must take its own lease.
static FORK_GENERATION: AtomicU32 = AtomicU32::new(0);
/// The descriptor holding our lease lock; the fork child closes its inherited copy.
static LEASE_FD: AtomicI32 = AtomicI32::new(-1);
/// The fork generation whose watcher thread runs (`u32::MAX`: none yet), and its inotify
/// descriptor, which a fork child closes (the thread reading it stays in the parent).
static WATCHING: AtomicU32 = AtomicU32::new(u32::MAX);
static WATCH_FD: AtomicI32 = AtomicI32::new(-1);

const NO_MEMBERSHIP: u64 = u64::MAX;

/// A ledger in the shared region file.
pub struct SharedLedger {
    region: Region,
    /// Region device index of each CUDA ordinal of this process.
    index: [Option<usize>; MAX_DEVICES],
    /// Budget and compute share of each CUDA ordinal as this process last read them from the
    /// file (a change is logged once, when a process first sees it).
    seen_limits: [AtomicU64; MAX_DEVICES],
    seen_shares: [AtomicU64; MAX_DEVICES],
    /// Bit `ordinal` set for each ordinal that had a budget when the process attached (asked on
    /// every hooked call). A resize changes budgets, never whether a device has one: an
    /// unbudgeted device's calls pass straight through and were never counted.
    budgeted: u32,
    /// `generation << 32 | lease` of our live lease, or [`NO_MEMBERSHIP`].
    membership: AtomicU64,
    /// This process's threads take a lease one at a time (never waiting on another process).
    joining: Mutex<()>,
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
        let mut index = [None; MAX_DEVICES];
        let mut limits = [None; MAX_DEVICES];
        let mut shares = [0; MAX_DEVICES];
        // Devices are matched (and added) under the file lock the open holds.
        let region = Region::open_in(path, config.region_below.as_deref(), &contents, |region| {
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
                // A process that names no budget (a stripped environment) takes the file's silently.
                if config.memory_limit(ordinal).is_some() && file_limit != env_limit(ordinal) {
                    tracing::warn!(
                        "CUDA_DEVICE_MEMORY_LIMIT for device {ordinal} is {} here but {} in the shared file {}; \
                         the file's budget applies",
                        describe(env_limit(ordinal)),
                        describe(file_limit),
                        path.display()
                    );
                }
                limits[ordinal] = (file_limit != UNLIMITED).then_some(file_limit);
                if config.overcommit && file_limit != UNLIMITED {
                    // The container's variable, recorded for processes started without it. The
                    // header bytes were zero (reserved) in any region without the feature.
                    u64_at(field!(region, ledger.overcommit)).fetch_or(1 << i, Ordering::AcqRel);
                }
                let file_share = u64_at(field!(region, sm_limit[i])).load(Ordering::Acquire);
                shares[ordinal] = file_share;
                if config.sm_limit[ordinal] != file_share && config.sm_limit[ordinal] != 0 {
                    tracing::warn!(
                        "CUDA_DEVICE_SM_LIMIT for device {ordinal} is {} % here but {file_share} % in the shared \
                         file {}; the file's share applies",
                        config.sm_limit[ordinal],
                        path.display()
                    );
                }
            }
            // Announce the overcommit words and the exact context costs (a region an older
            // release made lacks the bits; they were reserved, zero bytes there).
            u64_at(field!(region, ledger.compatible))
                .fetch_or(COMPATIBLE_OVERCOMMIT | COMPATIBLE_CONTEXT_COST_EXACT, Ordering::Release);
        })?;
        let ledger: &'static SharedLedger = Box::leak(Box::new(SharedLedger {
            region,
            index,
            seen_limits: limits.map(|limit| AtomicU64::new(limit.unwrap_or(UNLIMITED))),
            seen_shares: shares.map(AtomicU64::new),
            budgeted: limits
                .iter()
                .enumerate()
                .filter(|(_, limit)| limit.is_some())
                .fold(0, |mask, (ordinal, _)| mask | 1 << ordinal),
            membership: AtomicU64::new(NO_MEMBERSHIP),
            joining: Mutex::new(()),
            full_reported: AtomicBool::new(false),
        }));
        let _ = ATTACHED.set(ledger);
        register_process_hooks();
        Ok(ledger)
    }

    /// Our lease and the owner token of charges made under it, taking a lease on first use (and
    /// again after a fork).
    #[inline]
    fn membership(&self) -> Result<(usize, Owner), LedgerError> {
        match self.current_membership() {
            Some(current) => Ok(((current & 0xffff_ffff) as usize, current)),
            None => self.join(),
        }
    }

    /// Our live lease's token, if this process (not a fork parent) has one.
    #[inline]
    fn current_membership(&self) -> Option<Owner> {
        let generation = FORK_GENERATION.load(Ordering::Acquire);
        let current = self.membership.load(Ordering::Acquire);
        (current != NO_MEMBERSHIP && current >> 32 == u64::from(generation)).then_some(current)
    }

    /// [`SharedLedger::membership`]'s first call in this process (or since a fork).
    #[cold]
    #[inline(never)]
    fn join(&self) -> Result<(usize, Owner), LedgerError> {
        let generation = FORK_GENERATION.load(Ordering::Acquire);
        let _joining = self.joining.lock();
        let current = self.membership.load(Ordering::Acquire);
        if current != NO_MEMBERSHIP && current >> 32 == u64::from(generation) {
            return Ok(((current & 0xffff_ffff) as usize, current));
        }
        let lease = self.register().map_err(|error| {
            if !self.full_reported.swap(true, Ordering::Relaxed) {
                tracing::error!("{error}; this process's allocations on budgeted devices are refused");
            }
            LedgerError::RegionUnavailable
        })?;
        let token = u64::from(generation) << 32 | lease as u64;
        self.membership.store(token, Ordering::Release);
        tracing::debug!("{}: took lease {lease} (HAMi slot {lease})", self.region.path().display());
        if let Some(ledger) = ATTACHED.get()
            && std::ptr::eq(*ledger, self)
            && WATCHING.swap(generation, Ordering::AcqRel) != generation
        {
            watch(ledger);
        }
        Ok((lease, token))
    }

    /// Takes a free lease: its OFD lock first (so no one can think it dead), then its state.
    fn register(&self) -> Result<usize, RegionError> {
        let region = &self.region;
        let fd = lease_fd(region)?;
        reap(region);
        for k in 0..MAX_PROCESSES {
            let state = u32_at(field!(region, ledger.leases[k].state));
            if state.load(Ordering::Acquire) != LEASE_FREE || !crate::region::claim_lease(fd, k) {
                continue;
            }
            // A lease whose owner died is LIVE or REAPING, not FREE, until it is reclaimed.
            if state.load(Ordering::Acquire) != LEASE_FREE {
                crate::region::release_lease(fd, k);
                continue;
            }
            // SAFETY: getpid has no preconditions.
            let pid = unsafe { libc::getpid() };
            i32_at(field!(region, ledger.leases[k].pid)).store(pid, Ordering::Relaxed);
            for d in 0..MAX_DEVICES {
                u64_at(field!(region, ledger.leases[k].used[d])).store(0, Ordering::Relaxed);
            }
            let slot = k as u32 | OWNER_FEATURES;
            u32_at(field!(region, ledger.leases[k].slot)).store(slot, Ordering::Relaxed);
            state.store(LEASE_LIVE, Ordering::Release);
            open_slot(region, k, pid);
            i32_at(field!(region, proc_num)).fetch_max(k as i32 + 1, Ordering::AcqRel);
            return Ok(k);
        }
        Err(RegionError::Full { path: region.path().to_owned() })
    }

    /// Adds `bytes` on region device `index` for our lease `lease`, if the container total stays
    /// within `limit` (always, for `None`). `Err(total)` when it would not.
    #[inline]
    fn charge(&self, lease: usize, index: usize, bytes: u64, limit: Option<u64>) -> Result<(), u64> {
        let region = &self.region;
        let mine = self.lease_word(lease, index);
        mine.fetch_add(HIGH_STEP, Ordering::SeqCst);
        let cap = limit.unwrap_or(BYTE_MASK).min(BYTE_MASK);
        let grant = |word: u64| {
            let after = (word & BYTE_MASK).checked_add(bytes).filter(|&after| after <= cap);
            let after = if limit.is_none() { Some(after.unwrap_or(BYTE_MASK)) } else { after };
            after.map(|after| next_version(word) | after)
        };
        let total = u64_at(field!(region, ledger.used[index]));
        if let Err(word) = total.fetch_update(Ordering::SeqCst, Ordering::SeqCst, grant) {
            mine.fetch_sub(HIGH_STEP, Ordering::SeqCst);
            return Err(word & BYTE_MASK);
        }
        // Apply the bytes and withdraw the announcement in one add.
        mine.fetch_add(bytes.wrapping_sub(HIGH_STEP), Ordering::SeqCst);
        self.publish(lease, index);
        Ok(())
    }

    /// Lease `lease`'s word for region device `index`.
    #[inline]
    fn lease_word(&self, lease: usize, index: usize) -> &AtomicU64 {
        u64_at(field!(self.region, ledger.leases[lease].used[index]))
    }

    /// Shows lease `lease`'s bytes on region device `index` in its HAMi slot: all of them as the
    /// total, the context's in the context field, the rest as buffers.
    #[inline]
    fn publish(&self, lease: usize, index: usize) {
        let region = &self.region;
        let used = self.lease_word(lease, index).load(Ordering::Acquire) & BYTE_MASK;
        let context = u64_at(field!(region, slots[lease].memory[index].context)).load(Ordering::Relaxed);
        let buffers = used.saturating_sub(context);
        u64_at(field!(region, slots[lease].memory[index].data)).store(buffers, Ordering::Relaxed);
        u64_at(field!(region, slots[lease].memory[index].total)).store(used, Ordering::Relaxed);
    }

    #[inline]
    fn index_of(&self, device: usize) -> Option<usize> {
        self.index.get(device).copied().flatten()
    }

    /// The budget of ordinal `device` (region index `index`) as the region has it now
    /// ([`UNLIMITED`] for none), noting a change since this process last read it.
    #[inline]
    fn read_limit(&self, device: usize, index: usize) -> u64 {
        let limit = u64_at(field!(self.region, ledger.limit[index])).load(Ordering::Acquire);
        if self.seen_limits[device].load(Ordering::Relaxed) != limit {
            self.limit_changed(device, limit);
        }
        limit
    }

    /// Reports a budget this process has not seen before, once (by the thread that first sees it).
    #[cold]
    #[inline(never)]
    fn limit_changed(&self, device: usize, now: u64) {
        self.note_change(&self.seen_limits[device], now, |from, to| {
            tracing::info!(
                "{}: the budget of device {device} changed from {} to {}",
                self.region.path().display(),
                describe(from),
                describe(to)
            )
        });
    }

    /// Remembers `now` as what this process last saw in `seen`, and reports a change once (by the
    /// thread that first sees it). One load when nothing changed.
    fn note_change(&self, seen: &AtomicU64, now: u64, report: impl FnOnce(u64, u64)) {
        let before = seen.load(Ordering::Relaxed);
        if before != now && seen.compare_exchange(before, now, Ordering::Relaxed, Ordering::Relaxed).is_ok() {
            report(before, now);
        }
    }

    /// A charge of `bytes` on ordinal `device` that did not fit under `limit`: gives back what
    /// dead processes still hold and tries once more. The watcher thread does this within
    /// moments of a death, so a refusal looks again only if it has not lately: a full container
    /// refusing in a loop must not scan the leases on every call.
    #[cold]
    #[inline(never)]
    fn charge_after_reclaim(
        &self,
        (lease, owner): (usize, Owner),
        (device, index): (usize, usize),
        bytes: u64,
        limit: u64,
    ) -> Result<Owner, LedgerError> {
        if !reaped_lately() {
            reap(&self.region);
        }
        match self.charge(lease, index, bytes, Some(limit)) {
            Ok(()) => Ok(owner),
            Err(used) => Err(LedgerError::BudgetExceeded { device, requested: bytes, used, limit }),
        }
    }
}

impl Ledger for SharedLedger {
    fn any_limit(&self) -> bool {
        self.budgeted != 0
    }

    fn limit(&self, device: usize) -> Option<u64> {
        let index = self.index_of(device)?;
        let limit = self.read_limit(device, index);
        (limit != UNLIMITED).then_some(limit)
    }

    fn budgeted(&self, device: usize) -> bool {
        device < MAX_DEVICES && self.budgeted & 1 << device != 0
    }

    fn share(&self, device: usize) -> Option<u64> {
        let index = self.index_of(device)?;
        let percent = u64_at(field!(self.region, sm_limit[index])).load(Ordering::Acquire);
        self.note_change(&self.seen_shares[device], percent, |from, to| {
            tracing::info!(
                "{}: the compute share of device {device} changed from {from} % to {to} %",
                self.region.path().display()
            )
        });
        (percent != 0 && percent < 100).then_some(percent)
    }

    fn try_reserve(&self, device: usize, bytes: u64) -> Result<Owner, LedgerError> {
        let Some(index) = self.index_of(device) else {
            return Err(LedgerError::BudgetExceeded { device, requested: bytes, used: 0, limit: 0 });
        };
        // The region's budget now, so that a resize applies from this charge on.
        let limit = self.read_limit(device, index);
        if bytes == 0 {
            // Nothing to count (e.g. a context that costs nothing): no lease needed.
            return Ok(self.membership.load(Ordering::Acquire));
        }
        let (lease, owner) = self.membership()?;
        if self.charge(lease, index, bytes, Some(limit)).is_ok() {
            return Ok(owner);
        }
        // Before refusing, give back what dead processes still hold.
        self.charge_after_reclaim((lease, owner), (device, index), bytes, limit)
    }

    fn record_committed(&self, device: usize, bytes: u64) -> Result<Owner, LedgerError> {
        let Some(index) = self.index_of(device) else {
            return Err(LedgerError::BudgetExceeded { device, requested: bytes, used: 0, limit: 0 });
        };
        if bytes == 0 {
            return Ok(self.membership.load(Ordering::Acquire));
        }
        let (lease, owner) = self.membership()?;
        let _ = self.charge(lease, index, bytes, None);
        Ok(owner)
    }

    fn remembered_context_cost(&self, device: usize) -> Option<ContextCost> {
        let index = self.index_of(device)?;
        // The exact bit is set after the cost it vouches for, and only exact costs overwrite one.
        let exact = u64_at(field!(self.region, ledger.context_cost_exact)).load(Ordering::Acquire)
            & (1 << index)
            != 0;
        let known = u64_at(field!(self.region, ledger.context_cost[index])).load(Ordering::Acquire);
        (known & CONTEXT_COST_KNOWN != 0).then_some(ContextCost { bytes: known & !CONTEXT_COST_KNOWN, exact })
    }

    fn remember_context_cost(&self, device: usize, cost: ContextCost) {
        let Some(index) = self.index_of(device) else { return };
        let remembered = u64_at(field!(self.region, ledger.context_cost[index]));
        if cost.exact {
            remembered.store(cost.bytes | CONTEXT_COST_KNOWN, Ordering::Release);
            u64_at(field!(self.region, ledger.context_cost_exact)).fetch_or(1 << index, Ordering::Release);
        } else {
            // Release 0.1.0 fills the field the same way, and reads it as it is.
            let _ = remembered.compare_exchange(
                0,
                cost.bytes | CONTEXT_COST_KNOWN,
                Ordering::AcqRel,
                Ordering::Acquire,
            );
        }
    }

    fn release(&self, device: usize, bytes: u64, owner: Owner) {
        let Some(index) = self.index_of(device) else { return };
        // A zero-byte charge took no lease, so its owner names none. The fork generation is
        // checked too: a child that has not charged yet still holds its parent's token.
        if bytes == 0 || owner == NO_MEMBERSHIP || self.current_membership() != Some(owner) {
            return; // or charged to our parent's lease before a fork, or to a lease already gone
        }
        let lease = (owner & 0xffff_ffff) as usize;
        let region = &self.region;
        // The lease first (taking the bytes off and announcing the update in one add): a death
        // before the total moves leaves bytes counted, never missing.
        let mine = self.lease_word(lease, index);
        let before = mine.fetch_add(HIGH_STEP.wrapping_sub(bytes), Ordering::SeqCst);
        let held = before & BYTE_MASK;
        if held < bytes {
            // A credit larger than the lease holds (a bookkeeping slip elsewhere): take only what
            // it held, so that no budget is created.
            mine.fetch_add(bytes - held, Ordering::SeqCst);
        }
        let credited = held.min(bytes);
        // The total holds at least every lease's bytes, so this never borrows from the version.
        let total = u64_at(field!(region, ledger.used[index]));
        total.fetch_add(HIGH_STEP.wrapping_sub(credited), Ordering::SeqCst);
        mine.fetch_sub(HIGH_STEP, Ordering::SeqCst);
        self.publish(lease, index);
    }

    fn used(&self, device: usize) -> u64 {
        match self.index_of(device) {
            Some(index) => {
                u64_at(field!(self.region, ledger.used[index])).load(Ordering::Acquire) & BYTE_MASK
            }
            None => 0,
        }
    }

    fn held(&self, device: usize) -> u64 {
        let Some(index) = self.index_of(device) else { return 0 };
        let Some(current) = self.current_membership() else { return 0 };
        let lease = (current & 0xffff_ffff) as usize;
        u64_at(field!(self.region, ledger.leases[lease].used[index])).load(Ordering::Acquire) & BYTE_MASK
    }

    fn pace_clock(&self, device: usize) -> Option<&AtomicU64> {
        let index = self.index_of(device)?;
        Some(u64_at(field!(self.region, ledger.pace[index])))
    }

    fn monitor(&self) -> MonitorSwitches {
        MonitorSwitches {
            utilization_switch: i32_at(field!(self.region, utilization_switch)).load(Ordering::Relaxed),
            recent_kernel: i32_at(field!(self.region, recent_kernel)).load(Ordering::Relaxed),
        }
    }

    fn publish_utilisation(&self, device: usize, percent: u64) {
        let Some(index) = self.index_of(device) else { return };
        let Ok((lease, _)) = self.membership() else { return };
        u64_at(field!(self.region, slots[lease].util[index].sm_util)).store(percent, Ordering::Relaxed);
    }

    fn touch_last_kernel(&self, unix_seconds: u64) {
        let last = u64_at(field!(self.region, last_kernel_time));
        if last.load(Ordering::Relaxed) != unix_seconds {
            last.store(unix_seconds, Ordering::Relaxed);
        }
    }

    fn mark_launch(&self) {
        // HAMi-core marks 2; the monitor counts it down, and sets it negative to hold us.
        let recent = i32_at(field!(self.region, recent_kernel));
        let now = recent.load(Ordering::Relaxed);
        if now >= 0 && now != 2 {
            let _ = recent.compare_exchange(now, 2, Ordering::Relaxed, Ordering::Relaxed);
        }
    }

    fn note_context(&self, device: usize, bytes: i64) {
        let Some(index) = self.index_of(device) else { return };
        let Ok((lease, _)) = self.membership() else { return };
        let context = u64_at(field!(self.region, slots[lease].memory[index].context));
        let _ = context
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |now| Some(now.saturating_add_signed(bytes)));
        self.publish(lease, index);
    }

    fn overcommit(&self, device: usize) -> bool {
        let Some(index) = self.index_of(device) else { return false };
        let mask = u64_at(field!(self.region, ledger.overcommit)).load(Ordering::Relaxed);
        mask & (1 << index) != 0 && self.budgeted(device)
    }

    fn note_spillable(&self, device: usize, bytes: i64) {
        let Some(index) = self.index_of(device) else { return };
        let Ok((lease, _)) = self.membership() else { return };
        let spillable = u64_at(field!(self.region, slots[lease].memory[index].spillable));
        let _ = spillable
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |now| Some(now.saturating_add_signed(bytes)));
        let spilled = u64_at(field!(self.region, ledger.spilled));
        if bytes > 0 && spilled.fetch_or(1 << index, Ordering::AcqRel) & (1 << index) == 0 {
            crate::report_first_spill(device, &self.region.path().display().to_string());
        }
    }

    fn swap_place(&self, device: usize) -> Option<crate::SwapPlace> {
        let index = self.index_of(device)?;
        let (lease, _) = self.membership().ok()?;
        Some(crate::SwapPlace { region: self.region.path().to_owned(), lease, index })
    }

    fn spillable(&self, device: usize) -> u64 {
        let Some(index) = self.index_of(device) else { return 0 };
        let Some(current) = self.current_membership() else { return 0 };
        let lease = (current & 0xffff_ffff) as usize;
        u64_at(field!(self.region, slots[lease].memory[index].spillable)).load(Ordering::Relaxed)
    }

    fn on_exit(&self) {
        let Some(current) = self.current_membership() else { return };
        let lease = (current & 0xffff_ffff) as usize;
        let state = u32_at(field!(self.region, ledger.leases[lease].state));
        if state.compare_exchange(LEASE_LIVE, LEASE_REAPING, Ordering::AcqRel, Ordering::Acquire).is_ok() {
            self.membership.store(NO_MEMBERSHIP, Ordering::Release);
            give_back(&self.region, lease, false);
        }
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

/// Marks HAMi slot `k` as process `pid`'s, holding nothing yet.
fn open_slot(region: &Region, k: usize, pid: i32) {
    clear_slot(region, k);
    i32_at(field!(region, slots[k].pid)).store(pid, Ordering::Relaxed);
    i32_at(field!(region, slots[k].status)).store(1, Ordering::Release);
}

/// Empties HAMi slot `k`: the monitor skips it and sums nothing from it.
fn clear_slot(region: &Region, k: usize) {
    i32_at(field!(region, slots[k].status)).store(0, Ordering::Release);
    i32_at(field!(region, slots[k].pid)).store(0, Ordering::Relaxed);
    i32_at(field!(region, slots[k].host_pid)).store(0, Ordering::Relaxed);
    for d in 0..MAX_DEVICES {
        u64_at(field!(region, slots[k].memory[d].context)).store(0, Ordering::Relaxed);
        u64_at(field!(region, slots[k].memory[d].data)).store(0, Ordering::Relaxed);
        u64_at(field!(region, slots[k].memory[d].total)).store(0, Ordering::Relaxed);
        u64_at(field!(region, slots[k].memory[d].spillable)).store(0, Ordering::Relaxed);
        u64_at(field!(region, slots[k].util[d].sm_util)).store(0, Ordering::Relaxed);
    }
}

/// The version part of a total word, moved on by one (bytes cleared).
fn next_version(word: u64) -> u64 {
    (word & !BYTE_MASK).wrapping_add(HIGH_STEP)
}

/// Gives back everything lease `lease` holds and frees it. The caller won the lease's state
/// (LIVE → REAPING) and holds its lock, so no one else touches it meanwhile. If its owner died with
/// an update in flight, the device is marked suspect for a recount. With `resumed`, an earlier
/// reclaimer died half-way: it may have taken bytes out of the lease and not yet out of the total,
/// so every device with bytes counted is marked suspect.
fn give_back(region: &Region, lease: usize, resumed: bool) {
    for d in 0..MAX_DEVICES {
        let word = u64_at(field!(region, ledger.leases[lease].used[d])).swap(0, Ordering::SeqCst);
        let used = word & BYTE_MASK;
        let total = u64_at(field!(region, ledger.used[d]));
        if used > 0 {
            let _ = total.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |now| {
                Some(next_version(now) | (now & BYTE_MASK).saturating_sub(used))
            });
        }
        let counted = total.load(Ordering::SeqCst) & BYTE_MASK > 0;
        if word >> crate::region::layout::BYTE_BITS != 0 || (resumed && counted) {
            u64_at(field!(region, ledger.suspect[d])).fetch_add(1, Ordering::SeqCst);
        }
    }
    clear_slot(region, lease);
    u32_at(field!(region, ledger.leases[lease].state)).store(LEASE_FREE, Ordering::Release);
}

fn state_of(region: &Region, lease: usize) -> u32 {
    u32_at(field!(region, ledger.leases[lease].state)).load(Ordering::Acquire)
}

/// Reclaims every lease whose owner has died, then settles what killed processes may have left
/// in flight; true if anything came back.
///
/// A reclaimer holds the dead lease's lock while it gives the lease back, through a descriptor of
/// its own ([`reclaimer_fd`]): every other reclaimer (another process, another thread, a fork
/// child sharing our descriptors) sees the lease held and leaves it, and if this one dies half-way
/// the kernel drops the lock, so the next reclaimer finds the lease REAPING and unheld, and
/// finishes it.
fn reap(region: &Region) -> bool {
    let mut reaped = false;
    let mut own: Option<Option<std::os::fd::OwnedFd>> = None;
    for lease in 0..MAX_PROCESSES {
        // The region's descriptor holds no lease lock, so our own lease reads as held too.
        let seen = state_of(region, lease);
        if seen == LEASE_FREE || crate::region::lease_is_held(region.fd(), lease) {
            continue;
        }
        let state = u32_at(field!(region, ledger.leases[lease].state));
        let Some(fd) = own.get_or_insert_with(|| reclaimer_fd(region)) else {
            // No descriptor of our own: LIVE leases only, one reclaimer by the state's swap.
            if seen == LEASE_LIVE
                && state
                    .compare_exchange(LEASE_LIVE, LEASE_REAPING, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            {
                give_back(region, lease, false);
                reaped = true;
            }
            continue;
        };
        let fd = std::os::fd::AsRawFd::as_raw_fd(fd);
        if !crate::region::claim_lease(fd, lease) {
            continue;
        }
        match state.load(Ordering::Acquire) {
            LEASE_LIVE
                if state
                    .compare_exchange(LEASE_LIVE, LEASE_REAPING, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok() =>
            {
                give_back(region, lease, false);
                reaped = true;
            }
            // Its reclaimer (another process, or its owner at exit) died half-way.
            LEASE_REAPING => {
                give_back(region, lease, true);
                reaped = true;
            }
            _ => {}
        }
        crate::region::release_lease(fd, lease);
    }
    for d in 0..MAX_DEVICES {
        if u64_at(field!(region, ledger.suspect[d])).load(Ordering::Acquire) > 0 && recount(region, d) {
            reaped = true;
        }
    }
    reaped
}

/// A new open file description of the region file, for [`reap`]'s lease locks: reopened through
/// `/proc/self/fd`, so that it is the same file whatever happened to its path. `None` where
/// `/proc` is not mounted.
fn reclaimer_fd(region: &Region) -> Option<std::os::fd::OwnedFd> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(format!("/proc/self/fd/{}", region.fd()))
        .ok()
        .map(std::os::fd::OwnedFd::from)
}

/// What [`reclaim_dead`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReclaimReport {
    /// Leases whose owner had died, freed now (by this call, or by a process's watcher at the same
    /// moment), with the bytes they held.
    pub reclaimed: Vec<ReclaimedLease>,
    /// Whether anything came back: a lease freed by this call, or bytes that killed processes left
    /// in flight returned by a recount.
    pub changed: bool,
    /// The container's bytes per device index just before and just after; other processes may
    /// charge or credit in between.
    pub used_before: [u64; MAX_DEVICES],
    pub used_after: [u64; MAX_DEVICES],
}

/// One dead process's lease, given back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReclaimedLease {
    pub lease: usize,
    pub pid: i32,
    /// Bytes it held per device index.
    pub bytes: [u64; MAX_DEVICES],
}

/// Gives back what the dead processes of the region at `path` still hold, by the library's own
/// rules (a lease is dead when no process holds its lock; one reclaimer per lease; a recount for
/// updates a killed process left in flight). The file must exist and be a region of this ledger
/// version: it is never created or initialised.
pub fn reclaim_dead(path: &Path) -> Result<ReclaimReport, RegionError> {
    reclaim_in(Region::open_existing(path)?)
}

/// As [`reclaim_dead`], through `file`, which the caller opened for reading and writing and
/// checked (node-side tools open a tenant's file without following links, see
/// [`crate::region::tenant_file`]); `path` names it in errors. Nothing but `file` is written.
pub fn reclaim_dead_file(file: std::fs::File, path: &Path) -> Result<ReclaimReport, RegionError> {
    reclaim_in(Region::from_checked_file(file, path)?)
}

fn reclaim_in(region: Region) -> Result<ReclaimReport, RegionError> {
    let used = |region: &Region| {
        std::array::from_fn(|d| u64_at(field!(region, ledger.used[d])).load(Ordering::Acquire) & BYTE_MASK)
    };
    let pid_of = |lease: usize| i32_at(field!(region, ledger.leases[lease].pid)).load(Ordering::Acquire);
    // The region's descriptor is our own and holds no lease lock, as in `reap`.
    let dead: Vec<ReclaimedLease> = (0..MAX_PROCESSES)
        .filter(|&k| state_of(&region, k) == LEASE_LIVE && !crate::region::lease_is_held(region.fd(), k))
        .map(|k| ReclaimedLease {
            lease: k,
            pid: pid_of(k),
            bytes: std::array::from_fn(|d| {
                u64_at(field!(region, ledger.leases[k].used[d])).load(Ordering::Acquire) & BYTE_MASK
            }),
        })
        .collect();
    let used_before = used(&region);
    let changed = reap(&region);
    let reclaimed = dead
        .into_iter()
        .filter(|gone| state_of(&region, gone.lease) != LEASE_LIVE || pid_of(gone.lease) != gone.pid)
        .collect();
    Ok(ReclaimReport { reclaimed, changed, used_before, used_after: used(&region) })
}

/// When this process last reclaimed on a refusal (`CLOCK_MONOTONIC` ns).
static LAST_REFUSAL_REAP: AtomicU64 = AtomicU64::new(0);
/// How often a refusal may scan for dead leases.
const REFUSAL_REAP_INTERVAL_NS: u64 = 10_000_000;

/// Whether a refusal-driven reclaim ran less than [`REFUSAL_REAP_INTERVAL_NS`] ago; if not, the
/// caller reclaims now (and the clock restarts).
fn reaped_lately() -> bool {
    let now = crate::pace::now();
    let last = LAST_REFUSAL_REAP.load(Ordering::Relaxed);
    if last != 0 && now.saturating_sub(last) < REFUSAL_REAP_INTERVAL_NS {
        return true;
    }
    LAST_REFUSAL_REAP.store(now, Ordering::Relaxed);
    false
}

/// How many times a recount tries for a quiet moment before leaving it to the next reclaim.
const RECOUNT_TRIES: usize = 200;

/// Returns to device index `d`'s total the bytes killed processes left in it: the total less the
/// sum of the live leases, read at a moment when no lease had an update in flight. The total is
/// swapped from the word read before the sum: any update since moved its version, and then
/// nothing is changed. True if it settled.
fn recount(region: &Region, d: usize) -> bool {
    let total = u64_at(field!(region, ledger.used[d]));
    let suspect = u64_at(field!(region, ledger.suspect[d]));
    for _ in 0..RECOUNT_TRIES {
        let doubt = suspect.load(Ordering::SeqCst);
        let seen = total.load(Ordering::SeqCst);
        let mut sum = 0u64;
        let mut quiet = true;
        for lease in 0..MAX_PROCESSES {
            match state_of(region, lease) {
                LEASE_FREE => continue,
                LEASE_LIVE => {}
                _ => {
                    quiet = false; // being reclaimed: its bytes are on their way out
                    break;
                }
            }
            let word = u64_at(field!(region, ledger.leases[lease].used[d])).load(Ordering::SeqCst);
            if word & !BYTE_MASK != 0 {
                quiet = false;
                break;
            }
            sum = sum.saturating_add(word);
        }
        if !quiet || total.load(Ordering::SeqCst) != seen {
            std::hint::spin_loop();
            continue;
        }
        let counted = seen & BYTE_MASK;
        if counted < sum {
            return false; // cannot happen while every update keeps the total at or above the leases
        }
        if total.compare_exchange(seen, next_version(seen) | sum, Ordering::SeqCst, Ordering::SeqCst).is_ok()
        {
            let _ = suspect
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |now| Some(now.saturating_sub(doubt)));
            if counted > sum {
                tracing::info!(
                    "{}: {} bytes left on device index {d} by killed processes returned",
                    region.path().display(),
                    counted - sum
                );
            }
            return true;
        }
    }
    false
}

/// Starts this process's watcher: a thread asleep on the region file's close events (inotify),
/// which every exiting or killed process produces. On each, it reclaims dead leases, looking
/// again shortly after (the kernel drops a dead process's OFD lock just after the close event).
/// It also restores the file's size if someone truncates it (a modification event). An idle
/// container costs nothing; the thread holds no lock, so `fork` and `exit` never wait
/// for it; a fork child starts its own when it takes its lease.
fn watch(ledger: &'static SharedLedger) {
    let Ok(path) = std::ffi::CString::new(ledger.region.path().as_os_str().as_encoded_bytes()) else {
        return;
    };
    // SAFETY: plain system calls on a NUL-terminated path; the descriptor is ours.
    let fd = unsafe {
        let fd = libc::inotify_init1(libc::IN_CLOEXEC);
        let events = libc::IN_CLOSE_WRITE | libc::IN_CLOSE_NOWRITE | libc::IN_MODIFY;
        if fd >= 0 && libc::inotify_add_watch(fd, path.as_ptr(), events) < 0 {
            libc::close(fd);
            -1
        } else {
            fd
        }
    };
    if fd < 0 {
        tracing::debug!(
            "no inotify watch on the region; dead processes are reclaimed when an allocation needs it"
        );
        return;
    }
    WATCH_FD.store(fd, Ordering::Release);
    let started = std::thread::Builder::new().name("vgpu-reclaim".into()).spawn(move || {
        let mut events = [0u8; 4096];
        loop {
            // SAFETY: `events` is a writable buffer of its length; `fd` stays open for the thread.
            let n = unsafe { libc::read(fd, events.as_mut_ptr().cast(), events.len()) };
            if n <= 0 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
                return;
            }
            // Nothing writes the file (only the mapping changes), so a modification is a
            // truncation: undo it before a process faults on the missing pages.
            ledger.region.restore_size();
            for delay_ms in [0, 20, 200, 1000] {
                std::thread::sleep(Duration::from_millis(delay_ms));
                reap(&ledger.region);
            }
        }
    });
    if started.is_err() && WATCH_FD.swap(-1, Ordering::AcqRel) == fd {
        // SAFETY: our own descriptor, used by no one.
        unsafe { libc::close(fd) };
    }
}

/// After `fork`, in the child: drop the inherited lease descriptor (closing our copy leaves the
/// parent's lock in place) and make the next charge take a new lease. Async-signal-safe.
extern "C" fn after_fork_in_child() {
    for descriptor in [&LEASE_FD, &WATCH_FD] {
        let fd = descriptor.swap(-1, Ordering::AcqRel);
        if fd >= 0 {
            // SAFETY: `fd` is our own descriptor, no longer reachable through its static.
            unsafe { libc::close(fd) };
        }
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
