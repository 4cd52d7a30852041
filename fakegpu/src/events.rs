//! CUDA events on the simulated timeline: an event marks the moment the device reaches it, after the
//! work queued before it on its stream and on its device (or the moment it was recorded, on an idle
//! device); it takes no GPU time itself. With `FAKEGPU_PREEMPT`, work that cuts in later before that
//! moment pushes it back, as it pushes back the work before the event.

use std::collections::BTreeMap;

use crate::clock;
use crate::handles::{self, Keys, Kind};
use crate::ledger::Stamp;
use crate::state::{Fake, Refusal};
use crate::timeline::ResolvedStream;

struct Event {
    /// Created without `CU_EVENT_DISABLE_TIMING`.
    timing: bool,
    /// Where it lies on its device's timeline; `None` until first recorded.
    mark: Option<Mark>,
}

/// A recorded event's moment: a time on a physical device's timeline.
#[derive(Clone, Copy)]
struct Mark {
    device: usize,
    stamp: Stamp,
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
        registry.events.events.insert(key, Event { timing, mark: None });
        handles::encode(Kind::Event, key)
    }

    /// `cuEventRecord`: the event now completes when the device reaches it: after the work queued so
    /// far on `stream` and, since the simulated device runs its work in submission order, after
    /// everything queued before it on the device (by any process sharing it), as a real GPU reaches
    /// an event only once it runs the event's context again. Now, if all that is already done. With
    /// `FAKEGPU_PREEMPT`, while another process's queued work runs, the event cuts in like any work:
    /// it completes once its own stream's work is done.
    pub fn record_event(&self, event: u64, stream: ResolvedStream) -> Result<(), Refusal> {
        let key = handles::decode(Kind::Event, event).ok_or(Refusal::BadHandle)?;
        let mut guard = self.lock();
        let registry = &mut *guard;
        // Checked first: a refused record must leave the device alone, and with FAKEGPU_PREEMPT an
        // occupy numbers the device's work and may take its tail.
        let event = registry.events.events.get_mut(&key).ok_or(Refusal::BadHandle)?;
        let ready = registry.timeline.ready(stream.key);
        let stamp = self.ledger.occupy(stream.device, clock::now_ns(), ready, 0).start_stamp();
        event.mark = Some(Mark { device: stream.device, stamp });
        Ok(())
    }

    /// Where the event lies; `None` if it was never recorded.
    fn event_mark(&self, event: u64) -> Result<Option<Mark>, Refusal> {
        Ok(self.lock().events.get(event)?.mark)
    }

    /// When a recorded event completes, as its device's timeline stands now.
    fn completion(&self, mark: Mark) -> u64 {
        self.ledger.effective(mark.device, mark.stamp)
    }

    /// `cuEventQuery`: done if never recorded or its time has come, else NotReady.
    pub fn query_event(&self, event: u64) -> Result<(), Refusal> {
        match self.event_mark(event)? {
            Some(mark) if self.completion(mark) > clock::now_ns() => Err(Refusal::NotReady),
            _ => Ok(()),
        }
    }

    /// `cuEventSynchronize`: waits until the event completes.
    pub fn synchronize_event(&self, event: u64) -> Result<(), Refusal> {
        if let Some(mark) = self.event_mark(event)? {
            self.wait_until_reached(mark.device, mark.stamp);
        }
        Ok(())
    }

    /// `cuEventElapsedTime`: milliseconds from `start` to `end` (negative if `end` completes first).
    /// An event never recorded or created without timing is a BadHandle; one not complete, NotReady.
    pub fn elapsed_ms(&self, start: u64, end: u64) -> Result<f32, Refusal> {
        let registry = self.lock();
        let (start, end) = (registry.events.get(start)?, registry.events.get(end)?);
        let (Some(start_mark), Some(end_mark)) = (start.mark, end.mark) else {
            return Err(Refusal::BadHandle);
        };
        if !start.timing || !end.timing {
            return Err(Refusal::BadHandle);
        }
        let (start_time, end_time) = (self.completion(start_mark), self.completion(end_mark));
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
