//! The clock of simulated GPU time: `CLOCK_MONOTONIC` nanoseconds, which every process on the host
//! reads alike, so processes sharing a ledger file agree on when a simulated device is busy.

use std::time::Duration;

/// Now, in `CLOCK_MONOTONIC` nanoseconds.
pub fn now_ns() -> u64 {
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `now` is a valid, writable `timespec`; CLOCK_MONOTONIC always exists on Linux, so the call
    // cannot fail (were it to, `now` stays zero, which only makes simulated work look older).
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    let seconds = u64::try_from(now.tv_sec).unwrap_or(0);
    let nanoseconds = u64::try_from(now.tv_nsec).unwrap_or(0);
    seconds.saturating_mul(1_000_000_000).saturating_add(nanoseconds)
}

/// How long before a deadline a waiting thread stops sleeping and yields until it is reached.
const SPIN_NS: u64 = 100_000;

/// Blocks the calling thread until `CLOCK_MONOTONIC` reaches `deadline_ns` (at once if it has).
/// It sleeps until shortly before the deadline, then yields: the real driver's default
/// synchronisation spins, and wakes within microseconds of the GPU finishing, while a sleep on a
/// loaded two-core machine overshot by 100-200 µs, which libvgpu's events then saw as GPU time
/// of a synchronous copy (a 2 ms copy measured 2.15 ms).
pub fn sleep_until(deadline_ns: u64) {
    loop {
        let now = now_ns();
        if now >= deadline_ns {
            return;
        }
        if deadline_ns - now > SPIN_NS {
            std::thread::sleep(Duration::from_nanos(deadline_ns - now - SPIN_NS));
        } else {
            std::thread::yield_now();
        }
    }
}
