//! The container's pacing clock: GPU work is admitted at the container's share of wall time.
//!
//! The clock is one instant, `due` (`CLOCK_MONOTONIC` nanoseconds, shared by every process of the
//! container through the region): the moment by which the work admitted so far is paid for.
//! Admitting work that will occupy the GPU for `g` nanoseconds at a share of `p` percent moves
//! `due` on by `g · 100 / p`, so over any stretch of time the container's work occupies the GPU
//! for at most `p` percent of it. A launch waits while `due` lies more than [`AHEAD`] in the
//! future. Work is admitted on an estimate of its duration and corrected once its real duration
//! is measured. An idle container banks no credit: `due` never lies in the past when work is
//! admitted.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use crate::Ledger;
use crate::config::CorePolicy;

/// How far ahead of the wall clock admitted work may run: the burst a container may queue
/// without waiting, which also keeps each wait long enough for the OS to honour it precisely.
pub const AHEAD: u64 = 2_000_000;

/// A `due` further ahead than this was not written by a working limiter (a corrupt file, a
/// clock from before a reboot): it is treated as "now".
const HORIZON: u64 = 3_600_000_000_000;

/// The wall time that `gpu_ns` of GPU work costs at `percent`.
pub fn wall_cost(gpu_ns: u64, percent: u64) -> u64 {
    gpu_ns.saturating_mul(100) / percent.max(1)
}

/// Admits work costing `wall` nanoseconds of the clock if the clock allows it at `now`, as one
/// atomic step; otherwise says how long to wait before asking again.
pub fn try_admit(clock: &AtomicU64, now: u64, wall: u64) -> Result<(), Duration> {
    let mut due = clock.load(Ordering::Acquire);
    loop {
        let base = if due > now.saturating_add(HORIZON) { now } else { due.max(now) };
        if base > now + AHEAD {
            return Err(Duration::from_nanos(base - now - AHEAD));
        }
        match clock.compare_exchange_weak(due, base.saturating_add(wall), Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => return Ok(()),
            Err(seen) => due = seen,
        }
    }
}

/// Moves the clock by `wall` nanoseconds (negative: gives time back), once a launch's real
/// duration is known or when a launch the clock admitted did not happen.
pub fn correct(clock: &AtomicU64, wall: i64) {
    let _ =
        clock.fetch_update(Ordering::AcqRel, Ordering::Acquire, |due| Some(due.saturating_add_signed(wall)));
}

/// The longest single sleep while work waits, so that a change of the monitor's switches is
/// noticed promptly.
const LONGEST_NAP: Duration = Duration::from_millis(50);

/// Where GPU work of any API waits for the container's clock: the core policy, then HAMi's
/// monitor (a negative `recent_kernel` holds the work; `utilization_switch` 0 lifts the limit),
/// then the clock itself.
#[derive(Debug)]
pub struct Gate {
    policy: CorePolicy,
    held_reported: AtomicBool,
}

impl Gate {
    pub fn new(policy: CorePolicy) -> Gate {
        Gate { policy, held_reported: AtomicBool::new(false) }
    }

    /// Whether the limit applies now. While the monitor holds the container's work, waits.
    pub fn enforced(&self, ledger: &dyn Ledger) -> bool {
        self.applies(self.hold(ledger))
    }

    /// Whether the limit applies under the monitor's `switches`, read by [`Gate::hold`].
    pub fn applies(&self, switches: crate::MonitorSwitches) -> bool {
        match self.policy {
            CorePolicy::Force => true,
            CorePolicy::Disable => false,
            CorePolicy::Default => switches.utilization_switch != 0,
        }
    }

    /// Waits while HAMi's monitor holds the container's work (a negative `recent_kernel`: a
    /// higher-priority container is running), then returns the switches it read.
    pub fn hold(&self, ledger: &dyn Ledger) -> crate::MonitorSwitches {
        loop {
            let switches = ledger.monitor();
            if switches.recent_kernel >= 0 {
                return switches;
            }
            if !self.held_reported.swap(true, Ordering::Relaxed) {
                tracing::warn!("the monitor holds this container's GPU work (recent_kernel < 0); waiting");
            }
            std::thread::sleep(LONGEST_NAP);
        }
    }

    /// Waits until `clock` admits work costing `wall`, then charges it. False if the limit
    /// stopped applying while waiting (nothing charged).
    pub fn admit(&self, ledger: &dyn Ledger, clock: &AtomicU64, wall: u64) -> bool {
        while let Err(wait) = try_admit(clock, now(), wall) {
            std::thread::sleep(wait.min(LONGEST_NAP));
            if !self.enforced(ledger) {
                return false;
            }
        }
        true
    }
}

/// `CLOCK_MONOTONIC` in nanoseconds: the same clock in every process of the host.
pub fn now() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid out-pointer; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64).saturating_mul(1_000_000_000).saturating_add(ts.tv_nsec as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn work_is_spaced_at_the_share() {
        // 1 ms kernels at 25 %: each moves the clock 4 ms; the first ones run within AHEAD.
        let clock = AtomicU64::new(0);
        let now = 1_000 * MS;
        assert_eq!(try_admit(&clock, now, wall_cost(MS, 25)), Ok(()));
        assert_eq!(clock.load(Ordering::Relaxed), now + 4 * MS);
        // The clock is 4 ms ahead, past AHEAD: the next launch waits 2 ms.
        assert_eq!(try_admit(&clock, now, wall_cost(MS, 25)), Err(Duration::from_millis(2)));
        assert_eq!(try_admit(&clock, now + 2 * MS, wall_cost(MS, 25)), Ok(()));
        assert_eq!(clock.load(Ordering::Relaxed), now + 8 * MS);
    }

    #[test]
    fn an_idle_container_banks_no_credit() {
        let clock = AtomicU64::new(5 * MS);
        let now = 1_000 * MS;
        assert_eq!(try_admit(&clock, now, 10 * MS), Ok(()));
        assert_eq!(clock.load(Ordering::Relaxed), now + 10 * MS);
    }

    #[test]
    fn corrections_move_the_clock_both_ways() {
        let clock = AtomicU64::new(100 * MS);
        correct(&clock, (30 * MS) as i64);
        assert_eq!(clock.load(Ordering::Relaxed), 130 * MS);
        correct(&clock, -((50 * MS) as i64));
        assert_eq!(clock.load(Ordering::Relaxed), 80 * MS);
        correct(&clock, i64::MIN);
        assert_eq!(clock.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_clock_far_in_the_future_is_not_trusted() {
        let clock = AtomicU64::new(u64::MAX);
        let now = 1_000 * MS;
        assert_eq!(try_admit(&clock, now, MS), Ok(()));
        assert_eq!(clock.load(Ordering::Relaxed), now + MS);
    }

    #[test]
    fn wall_cost_scales_with_the_share() {
        assert_eq!(wall_cost(MS, 50), 2 * MS);
        assert_eq!(wall_cost(3 * MS, 75), 4 * MS);
        assert_eq!(wall_cost(MS, 0), 100 * MS);
        assert_eq!(wall_cost(u64::MAX, 1), u64::MAX);
    }
}
