//! CUDA events on the simulated timeline: an event marks the moment the device reaches it, after the
//! work queued before it on its stream and on its device (or the moment it was recorded, on an idle
//! device); it takes no GPU time itself.

use std::collections::BTreeMap;

use crate::clock;
use crate::handles::{self, Keys, Kind};
use crate::state::{Fake, Refusal};
use crate::timeline::ResolvedStream;

struct Event {
    /// Created without `CU_EVENT_DISABLE_TIMING`.
    timing: bool,
    /// `CLOCK_MONOTONIC` ns at which it completes; `None` until first recorded.
    time: Option<u64>,
}

pub struct Events {
    events: BTreeMap<u64, Event>,
    keys: Keys,
}

impl Events {
    pub fn new() -> Events {
        Events { events: BTreeMap::new(), keys: Keys::starting_at(1) }
    }

    fn get(&self, handle: u64) -> Result<&Event, Refusal> {
        handles::decode(Kind::Event, handle).and_then(|key| self.events.get(&key)).ok_or(Refusal::BadHandle)
    }
}

impl Fake {
    /// `cuEventCreate`: a new event, not yet recorded.
    pub fn create_event(&self, timing: bool) -> u64 {
        let mut registry = self.lock();
        let key = registry.events.keys.next();
        registry.events.events.insert(key, Event { timing, time: None });
        handles::encode(Kind::Event, key)
    }

    /// `cuEventRecord`: the event now completes when the device reaches it: after the work queued so
    /// far on `stream` and, since the simulated device runs its work in submission order, after
    /// everything queued before it on the device (by any process sharing it), as a real GPU reaches
    /// an event only once it runs the event's context again. Now, if all that is already done.
    pub fn record_event(&self, event: u64, stream: ResolvedStream) -> Result<(), Refusal> {
        let mut registry = self.lock();
        let earliest = clock::now_ns().max(registry.timeline.ready(stream.key));
        let time = self.ledger.occupy(stream.device, earliest, 0).start;
        let key = handles::decode(Kind::Event, event).ok_or(Refusal::BadHandle)?;
        let event = registry.events.events.get_mut(&key).ok_or(Refusal::BadHandle)?;
        event.time = Some(time);
        Ok(())
    }

    /// When the event completes; `None` if it was never recorded.
    fn event_time(&self, event: u64) -> Result<Option<u64>, Refusal> {
        Ok(self.lock().events.get(event)?.time)
    }

    /// `cuEventQuery`: done if never recorded or its time has come, else NotReady.
    pub fn query_event(&self, event: u64) -> Result<(), Refusal> {
        match self.event_time(event)? {
            Some(time) if time > clock::now_ns() => Err(Refusal::NotReady),
            _ => Ok(()),
        }
    }

    /// `cuEventSynchronize`: waits until the event completes.
    pub fn synchronize_event(&self, event: u64) -> Result<(), Refusal> {
        if let Some(time) = self.event_time(event)? {
            clock::sleep_until(time);
        }
        Ok(())
    }

    /// `cuEventElapsedTime`: milliseconds from `start` to `end` (negative if `end` completes first).
    /// An event never recorded or created without timing is a BadHandle; one not complete, NotReady.
    pub fn elapsed_ms(&self, start: u64, end: u64) -> Result<f32, Refusal> {
        let registry = self.lock();
        let (start, end) = (registry.events.get(start)?, registry.events.get(end)?);
        let (Some(start_time), Some(end_time)) = (start.time, end.time) else {
            return Err(Refusal::BadHandle);
        };
        if !start.timing || !end.timing {
            return Err(Refusal::BadHandle);
        }
        if start_time.max(end_time) > clock::now_ns() {
            return Err(Refusal::NotReady);
        }
        let nanoseconds = i128::from(end_time) - i128::from(start_time);
        Ok((nanoseconds as f64 / 1e6) as f32)
    }

    /// `cuEventDestroy`: the handle is dead at once.
    pub fn destroy_event(&self, event: u64) -> Result<(), Refusal> {
        let key = handles::decode(Kind::Event, event).ok_or(Refusal::BadHandle)?;
        self.lock().events.events.remove(&key).map(drop).ok_or(Refusal::BadHandle)
    }
}
