//! Simulated GPU time: a kernel made by `fakehip_kernel(ns)` occupies its device for `ns`
//! nanoseconds of `CLOCK_MONOTONIC` after the work queued before it, whatever the stream (one
//! queue per device, in this process). Events complete when the work queued before them has.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::abi::*;
use crate::config::MAX_DEVICES;

/// Kernel and graph handles the fake makes: this tag in the top 16 bits, the duration below.
const KERNEL_TAG: u64 = 0xfa4e << 48;

pub struct Timeline {
    /// Per physical device: when its queued work ends.
    busy_until: [AtomicU64; MAX_DEVICES],
    /// Per physical device: nanoseconds of work ever queued.
    busy_total: [AtomicU64; MAX_DEVICES],
    /// Event → (device, when it completes); `None` until recorded.
    events: Mutex<HashMap<u64, Option<(usize, u64)>>>,
    next_event: AtomicU64,
}

pub fn now() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid out-pointer; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64) * 1_000_000_000 + ts.tv_nsec as u64
}

fn sleep_until(at: u64) {
    let now = now();
    if at > now {
        std::thread::sleep(std::time::Duration::from_nanos(at - now));
    }
}

/// The handle of a kernel (or graph) that runs for `ns`.
pub fn kernel(ns: u64) -> u64 {
    KERNEL_TAG | (ns & ((1 << 48) - 1))
}

impl Timeline {
    pub fn new() -> Timeline {
        Timeline {
            busy_until: std::array::from_fn(|_| AtomicU64::new(0)),
            busy_total: std::array::from_fn(|_| AtomicU64::new(0)),
            events: Mutex::default(),
            next_event: AtomicU64::new(0xe000_0000),
        }
    }

    /// Queues the kernel `handle` on `device`.
    pub fn launch(&self, device: usize, handle: u64) -> Result<(), HipError> {
        if handle & (0xffff << 48) != KERNEL_TAG {
            return Err(HIP_ERROR_INVALID_VALUE);
        }
        self.occupy(device, handle & ((1 << 48) - 1));
        Ok(())
    }

    /// Queues `ns` of work (a copy, a memset) on `device`.
    pub fn occupy(&self, device: usize, ns: u64) {
        let now = now();
        let _ = self.busy_until[device]
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |until| Some(until.max(now) + ns));
        self.busy_total[device].fetch_add(ns, Ordering::Relaxed);
    }

    /// When `device`'s queued work ends (now, if it is idle).
    fn done_at(&self, device: usize) -> u64 {
        self.busy_until[device].load(Ordering::Acquire).max(now())
    }

    pub fn synchronize(&self, device: usize) {
        sleep_until(self.busy_until[device].load(Ordering::Acquire));
    }

    pub fn busy_total(&self, device: usize) -> u64 {
        self.busy_total[device].load(Ordering::Relaxed)
    }

    pub fn event_create(&self) -> u64 {
        let event = self.next_event.fetch_add(16, Ordering::Relaxed);
        self.events.lock().unwrap_or_else(|p| p.into_inner()).insert(event, None);
        event
    }

    pub fn event_destroy(&self, event: u64) -> Result<(), HipError> {
        let removed = self.events.lock().unwrap_or_else(|p| p.into_inner()).remove(&event);
        removed.map(drop).ok_or(HIP_ERROR_INVALID_HANDLE)
    }

    pub fn record(&self, event: u64, device: usize) -> Result<(), HipError> {
        let at = self.done_at(device);
        let mut events = self.events.lock().unwrap_or_else(|p| p.into_inner());
        let slot = events.get_mut(&event).ok_or(HIP_ERROR_INVALID_HANDLE)?;
        *slot = Some((device, at));
        Ok(())
    }

    fn completes(&self, event: u64) -> Result<Option<u64>, HipError> {
        let events = self.events.lock().unwrap_or_else(|p| p.into_inner());
        Ok(events.get(&event).ok_or(HIP_ERROR_INVALID_HANDLE)?.map(|(_, at)| at))
    }

    pub fn query(&self, event: u64) -> Result<(), HipError> {
        match self.completes(event)? {
            Some(at) if at > now() => Err(HIP_ERROR_NOT_READY),
            _ => Ok(()),
        }
    }

    pub fn event_synchronize(&self, event: u64) -> Result<(), HipError> {
        if let Some(at) = self.completes(event)? {
            sleep_until(at);
        }
        Ok(())
    }

    /// Milliseconds from `start` to `stop`, both complete.
    pub fn elapsed(&self, start: u64, stop: u64) -> Result<f32, HipError> {
        let (Some(a), Some(b)) = (self.completes(start)?, self.completes(stop)?) else {
            return Err(HIP_ERROR_INVALID_HANDLE);
        };
        if a.max(b) > now() {
            return Err(HIP_ERROR_NOT_READY);
        }
        Ok((b as f64 - a as f64) as f32 / 1e6)
    }
}
