//! The arbiter's side of a process: its record in the container's swap table (phase, activity,
//! bytes, counters, the waiting and in-flight bits), the requests it reads there, the swap-out that
//! answers one, and the agent thread that waits for them.

use super::*;

impl Swap {
    /// The container's swap table, opened on first use (`None`: no shared region, or the file
    /// could not be made; then nothing is swappable).
    pub(super) fn table(&self, runtime: &Runtime, device: usize) -> Option<&SwapTable> {
        self.table
            .get_or_init(|| {
                let place = runtime.ledger().swap_place(device)?;
                match SwapTable::open_for_process(&place.region) {
                    Ok(table) => {
                        table.clear(place.lease);
                        Some(table)
                    }
                    Err(error) => {
                        tracing::warn!(
                            "{}: cannot open the swap table: {error}; overcommitted memory spills through \
                             unified memory",
                            place.region.display()
                        );
                        None
                    }
                }
            })
            .as_ref()
    }

    /// Runs `f` on this process's record of every device it holds swappable memory on.
    pub(super) fn each_record(&self, runtime: &Runtime, mut f: impl FnMut(&SwapTable, usize, usize)) {
        let devices = self.devices.load(Ordering::Relaxed);
        for device in (0..MAX_DEVICES).filter(|d| devices & (1 << d) != 0) {
            let Some(table) = self.table.get().and_then(Option::as_ref) else { return };
            if let Some(place) = runtime.ledger().swap_place(device) {
                f(table, place.lease, place.index);
            }
        }
    }

    pub(super) fn add(&self, runtime: &Runtime, device: usize, word: Word, bytes: i64) {
        let Some(table) = self.table.get().and_then(Option::as_ref) else { return };
        let Some(place) = runtime.ledger().swap_place(device) else { return };
        let word = table.get(place.lease, place.index, word);
        let _ =
            word.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| Some(v.saturating_add_signed(bytes)));
    }

    /// Sets the record's phase and waiting bit; the in-flight bit stays as the waits left it.
    pub(super) fn set_phase(&self, runtime: &Runtime, phase: Phase, waiting: bool) {
        let pid = std::process::id();
        self.each_record(runtime, |table, lease, index| {
            let _ =
                table.get(lease, index, Word::State).fetch_update(Ordering::AcqRel, Ordering::Acquire, |s| {
                    Some(state_word(phase, waiting, pid) | (s & IN_FLIGHT))
                });
        });
    }

    /// Host memory pinned ahead for this process, as its records count it.
    pub(super) fn pinned(&self, runtime: &Runtime) -> u64 {
        let mut pinned = 0u64;
        self.each_record(runtime, |table, lease, index| {
            pinned = pinned.saturating_add(table.get(lease, index, Word::Pinned).load(Ordering::Relaxed));
        });
        pinned
    }

    /// Tells the arbiter whether a call of this process waits for its kernels ([`IN_FLIGHT`]).
    pub(super) fn mark_in_flight(&self, runtime: &Runtime, in_flight: bool) {
        self.each_record(runtime, |table, lease, index| {
            let state = table.get(lease, index, Word::State);
            if in_flight {
                state.fetch_or(IN_FLIGHT, Ordering::AcqRel);
            } else {
                state.fetch_and(!IN_FLIGHT, Ordering::AcqRel);
            }
        });
    }

    /// Whether `device`'s container has a live swap arbiter, so that its overcommitted memory is
    /// swapped whole rather than left to unified memory.
    pub fn arbiter_alive(&self, runtime: &Runtime, device: usize) -> bool {
        let Some(table) = self.table(runtime, device) else { return false };
        let alive = || {
            let beat = table.heartbeat().load(Ordering::Acquire);
            beat != 0 && now().saturating_sub(beat) < ARBITER_GONE_NS
        };
        if alive() {
            return true;
        }
        // The container's first process made the table just now: an arbiter that scans the
        // node's containers finds it within its next pass, so give it that long, once.
        static GRACE: std::sync::Once = std::sync::Once::new();
        let mut found = false;
        if table.created() {
            GRACE.call_once(|| {
                let until = now().saturating_add(NEW_TABLE_GRACE_NS);
                while !found && now() < until {
                    std::thread::sleep(Duration::from_millis(5));
                    found = alive();
                }
            });
        }
        found
    }

    /// The arbiter's request this process has not acted on yet, if any.
    pub(super) fn pending_request(&self, runtime: &Runtime) -> Option<u64> {
        let mut pending = None;
        self.each_record(runtime, |table, lease, index| {
            let request = table.get(lease, index, Word::Request).load(Ordering::Acquire);
            if request != table.get(lease, index, Word::Handled).load(Ordering::Acquire) {
                pending = Some(request);
            }
        });
        pending
    }

    /// The request the arbiter last made forced.
    pub(super) fn forced(&self, runtime: &Runtime) -> u64 {
        let mut forced = 0;
        self.each_record(runtime, |table, lease, index| {
            forced = forced.max(table.get(lease, index, Word::Forced).load(Ordering::Acquire));
        });
        forced
    }

    /// The bytes the arbiter's latest request asks for (0: everything), the most any record asks.
    pub(super) fn amount(&self, runtime: &Runtime) -> u64 {
        let mut amount = 0;
        self.each_record(runtime, |table, lease, index| {
            amount = amount.max(table.get(lease, index, Word::Amount).load(Ordering::Acquire));
        });
        amount
    }

    pub(super) fn mark_handled(&self, runtime: &Runtime, request: u64) {
        self.each_record(runtime, |table, lease, index| {
            table.get(lease, index, Word::Handled).store(request, Ordering::Release);
        });
    }

    pub(super) fn set_waiting(&self, runtime: &Runtime, device: usize, wanted: u64) {
        let Some(table) = self.table.get().and_then(Option::as_ref) else { return };
        let Some(place) = runtime.ledger().swap_place(device) else { return };
        let state = table.get(place.lease, place.index, Word::State);
        table.get(place.lease, place.index, Word::Wanted).store(wanted, Ordering::Release);
        let _ = state.fetch_update(Ordering::AcqRel, Ordering::Acquire, |s| {
            Some(if wanted > 0 { s | WAITING } else { s & !WAITING })
        });
    }

    /// One step of the agent: handles an outstanding request, else pins one chunk's host memory
    /// ahead.
    pub(super) fn agent_step(&self, runtime: &Runtime) -> Next {
        let mut asked = None;
        self.each_record(runtime, |table, lease, index| {
            let request = table.get(lease, index, Word::Request).load(Ordering::Acquire);
            let handled = table.get(lease, index, Word::Handled).load(Ordering::Acquire);
            if request != handled {
                asked = Some(request);
            }
        });
        if let Some(request) = asked {
            let done = self.swap_out(runtime, request);
            self.each_record(runtime, |table, lease, index| {
                table.get(lease, index, Word::Handled).store(request, Ordering::Release);
            });
            if !done {
                tracing::debug!("declined swap-out request {request}: the process is busy");
            }
            return Next::Now;
        }
        self.pin_one(runtime)
    }

    /// Handles the arbiter's request: closes the gate, lets the calls inside leave and the queued
    /// work finish, and moves every chunk to host memory, or for a forced request that names an
    /// amount, chunks enough for it. Declined (false) when the process was active a moment ago or
    /// waits for its own kernels (and the request is not forced), or a call stays inside.
    pub(super) fn swap_out(&self, runtime: &Runtime, request: u64) -> bool {
        let Some(calls) = calls() else { return false };
        let mut inner = self.inner.lock();
        if inner.blocks.is_empty() {
            return false;
        }
        // A thread that waited for room meanwhile let go for this very request.
        if self.pending_request(runtime) != Some(request) {
            return true;
        }
        let forced = self.forced(runtime) == request;
        let mut held = inner.on_card(|_| true);
        if inner.out {
            // Out already, perhaps in part (a forced request moved only some chunks, and the
            // process has made no call since): its gate is closed and nothing of it runs, so what
            // is still on the card goes now, as below.
            if held == 0 {
                return true;
            }
        } else {
            // Busy: active a moment ago, or waiting for its own kernels (work in flight).
            if !forced
                && (now().saturating_sub(self.last_active.load(Ordering::Relaxed)) < BUSY_NS
                    || self.waits.load(Ordering::SeqCst) > 0)
            {
                return false;
            }
            self.closed.store(true, Ordering::SeqCst);
            let deadline = std::time::Instant::now() + if forced { QUIESCE_FORCED } else { QUIESCE };
            while self.inside.load(Ordering::SeqCst) != 0 {
                if std::time::Instant::now() >= deadline {
                    self.closed.store(false, Ordering::SeqCst);
                    self.opened.notify_all();
                    return false;
                }
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        // Memory the application freed in stream order is given back, never copied.
        self.give_back_all_kept(runtime, calls, &mut inner);
        held = inner.on_card(|_| true);
        // A forced request, or one made for a waiter of higher priority, asks for the room its
        // waiter lacks; an ordinary one, for everything (its amount is 0).
        let amount = self.amount(runtime);
        let Some(amount) = self.fit_to_host(&inner, amount, request) else {
            if !inner.out {
                self.closed.store(false, Ordering::SeqCst);
                self.opened.notify_all();
            }
            return false;
        };
        let started = now();
        self.set_phase(runtime, Phase::SwappingOut, false);
        inner.out = true;
        let Moved { bytes: moved, ringed, kept } =
            runtime.driver_memory.paused(|| self.copy_out(runtime, calls, &mut inner, amount));
        let done = now();
        for device in 0..MAX_DEVICES {
            if self.devices.load(Ordering::Relaxed) & (1 << device) != 0 {
                self.add(runtime, device, Word::SwapOuts, 1);
                self.add(runtime, device, Word::OutNs, done.saturating_sub(started) as i64);
            }
        }
        // ci/gpu-swap reads the rate from the line's start.
        let why = match (forced, amount) {
            (false, 0) => String::new(),
            (false, amount) => format!(", {moved} of {held} bytes (asked for {amount})"),
            (true, 0) => format!(", {moved} of {held} bytes (forced)"),
            (true, amount) => format!(", {moved} of {held} bytes (forced; asked for {amount})"),
        };
        let ringed =
            if ringed > 0 { format!(", {ringed} of them through the pinned ring") } else { String::new() };
        let kept = if kept > 0 {
            format!(", {kept} of them into pageable buffers made before this swap")
        } else {
            String::new()
        };
        tracing::info!(
            "swapped out {moved} bytes in {} ms ({:.1} GB/s){why}{ringed}{kept}",
            done.saturating_sub(started) / 1_000_000,
            moved as f64 / done.saturating_sub(started).max(1) as f64
        );
        self.set_phase(runtime, Phase::Out, false);
        true
    }

    /// What a swap-out of `amount` bytes (0: all it holds on the card) for `request` may move as host memory
    /// allows: what goes out lands in this process, charged to the container's memory cgroup.
    /// Chunks with a pinned buffer already hold theirs, and so do the pages of a kept pageable
    /// buffer that are still there (the cgroup counts them; those the kernel took back must be
    /// faulted in again, [`keep`]); the rest need their size, and only as much as the cgroup and
    /// the host can take goes (docs/overcommit.md, "Host memory"): the amount, possibly made
    /// partial (whole chunks, those with a buffer first), or `None` (declined) when not one chunk
    /// fits. Says so in one line when it is not all.
    pub(super) fn fit_to_host(&self, inner: &Inner, amount: u64, request: u64) -> Option<u64> {
        let held = inner.on_card(|_| true);
        let buffered_on_card = inner.on_card_bytes(|chunk| match chunk.host {
            Host::Pinned(_) => chunk.size as u64,
            Host::Pageable(at) => resident_bytes(at, chunk.size),
            Host::None => 0,
        });
        let wanted = if amount == 0 { held } else { amount.min(held) };
        let needs = wanted.saturating_sub(buffered_on_card);
        let room = vgpu_ledger::host_memory::room();
        if needs <= room.bytes {
            return Some(amount);
        }
        let allowed = buffered_on_card + room.bytes / CHUNK as u64 * CHUNK as u64;
        if allowed == 0 {
            tracing::warn!(
                "swap-out request {request} declined: it needs {needs} bytes of host memory and {room}; \
                 the memory stays on the card"
            );
            return None;
        }
        tracing::warn!(
            "swap-out request {request} made partial: it needs {needs} bytes of host memory and {room}; \
             {allowed} of {wanted} bytes go out, the rest stays on the card"
        );
        Some(allowed)
    }
}

/// Starts this process's agent thread: it handles the arbiter's requests and pins host memory
/// ahead. It sleeps on the request word while there is nothing to do.
pub(super) fn start_agent() {
    let spawned = std::thread::Builder::new().name("libvgpu-swap".into()).spawn(|| {
        let Ok(runtime) = crate::runtime::get() else { return };
        let swap = &runtime.swap;
        loop {
            let next = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| swap.agent_step(runtime)))
                .unwrap_or(Next::Sleep);
            match next {
                Next::Now => continue,
                Next::Soon => {
                    std::thread::sleep(PIN_POLL);
                    continue;
                }
                Next::Sleep => {}
            }
            // Sleep until the arbiter counts a request up (or a while passes).
            let mut slept = false;
            swap.each_record(runtime, |table, lease, index| {
                if !slept {
                    slept = true;
                    let word = table.get(lease, index, Word::Request);
                    let seen = word.load(Ordering::Acquire);
                    if seen == table.get(lease, index, Word::Handled).load(Ordering::Acquire) {
                        futex_wait(word, seen, Duration::from_millis(100));
                    }
                }
            });
            if !slept {
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    });
    if let Err(error) = spawned {
        tracing::warn!("cannot start the swap agent thread: {error}; this process is never swapped out");
    }
}

/// The chunks a swap-out moves, of those on the card (`on_card`: key, bytes and whether it has a
/// pinned host buffer, in address order): all of them (`amount` 0), else chunks in that order,
/// pinned ones first (they copy at the link's speed; the others go through pageable memory), until
/// they make at least `amount` bytes.
pub(super) fn choose<K: Copy + Eq + Hash>(
    on_card: impl Iterator<Item = (K, u64, bool)>,
    amount: u64,
) -> HashSet<K> {
    let (pinned, pageable): (Vec<_>, Vec<_>) = on_card.partition(|&(_, _, pinned)| pinned);
    let mut chosen = HashSet::new();
    let mut bytes = 0u64;
    for (key, size, _) in pinned.into_iter().chain(pageable) {
        if amount != 0 && bytes >= amount {
            break;
        }
        chosen.insert(key);
        bytes = bytes.saturating_add(size);
    }
    chosen
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn chosen(on_card: &[(u32, u64, bool)], amount: u64) -> Vec<u32> {
        let mut keys: Vec<u32> = choose(on_card.iter().copied(), amount).into_iter().collect();
        keys.sort();
        keys
    }

    #[test]
    fn a_swap_out_with_an_amount_moves_pinned_chunks_first_and_no_more_than_it_needs() {
        // Chunks 0-2 unpinned, 3-5 pinned, 6 a short last chunk, pinned.
        let card = [
            (0, 64 * MIB, false),
            (1, 64 * MIB, false),
            (2, 64 * MIB, false),
            (3, 64 * MIB, true),
            (4, 64 * MIB, true),
            (5, 64 * MIB, true),
            (6, 2 * MIB, true),
        ];
        assert_eq!(chosen(&card, 0), [0, 1, 2, 3, 4, 5, 6], "0: everything");
        assert_eq!(chosen(&card, 128 * MIB), [3, 4]);
        assert_eq!(chosen(&card, 100 * MIB), [3, 4], "whole chunks: at least the amount");
        assert_eq!(chosen(&card, 194 * MIB), [3, 4, 5, 6]);
        assert_eq!(chosen(&card, 195 * MIB), [0, 3, 4, 5, 6], "then the unpinned, in address order");
        assert_eq!(chosen(&card, u64::MAX), [0, 1, 2, 3, 4, 5, 6], "more than there is: everything");
        assert!(chosen(&[], 64 * MIB).is_empty());
    }
}
