//! Contexts (each device's primary context and `cuCtxCreate`'s), each thread's context stack, and
//! created streams.
//!
//! A context costs `FAKEGPU_CONTEXT_MEMORY` bytes of its device for as long as it exists: a primary
//! context from its first retain until its reference count drops back to 0, a created context from
//! `cuCtxCreate` to `cuCtxDestroy`. The top of the calling thread's stack is its current context;
//! `cuCtxSetCurrent` replaces the top (NULL pops it), `cuCtxCreate` pushes the new context.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::ffi::c_void;

use crate::config::MAX_DEVICES;
use crate::devices::MULTIPROCESSORS;
use crate::handles::{self, Keys, Kind};
use crate::state::{CONTEXTS, Fake, Refusal};
use crate::timeline::StreamKey;

/// A context as a thread's stack holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bound {
    /// The primary context of this CUDA ordinal.
    Primary(usize),
    /// A context from `cuCtxCreate`, by key, on this CUDA ordinal.
    Created { key: u64, ordinal: usize },
}

impl Bound {
    pub fn handle(self) -> *mut c_void {
        match self {
            Bound::Primary(ordinal) => CONTEXTS.handle(ordinal),
            Bound::Created { key, .. } => {
                std::ptr::without_provenance_mut(handles::encode(Kind::Context, key) as usize)
            }
        }
    }

    pub fn ordinal(self) -> usize {
        match self {
            Bound::Primary(ordinal) | Bound::Created { ordinal, .. } => ordinal,
        }
    }
}

thread_local! {
    /// The calling thread's context stack; the last entry is current.
    static STACK: RefCell<Vec<Bound>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` on the calling thread's stack (an empty one while the thread is being torn down).
fn with_stack<R>(f: impl Fn(&mut Vec<Bound>) -> R) -> R {
    STACK.try_with(|stack| f(&mut stack.borrow_mut())).unwrap_or_else(|_| f(&mut Vec::new()))
}

/// The calling thread's current context, without checking that it still exists.
pub fn top() -> Option<Bound> {
    with_stack(|stack| stack.last().copied())
}

/// `cuCtxSetCurrent`: replaces the top of the stack, or pops it for `None`.
pub fn set_top(bound: Option<Bound>) {
    with_stack(|stack| {
        stack.pop();
        stack.extend(bound);
    })
}

pub fn push(bound: Bound) {
    with_stack(|stack| stack.push(bound))
}

pub fn pop() -> Option<Bound> {
    with_stack(Vec::pop)
}

struct Stream {
    physical: usize,
}

/// A context from `cuCtxCreate` or `cuGreenCtxCreate`.
#[derive(Clone, Copy)]
struct Created {
    ordinal: usize,
    /// What it cost its device.
    bytes: u64,
    /// The SM count of its execution affinity (`cuCtxCreate_v3`/`_v4`), if it was given one.
    sm_affinity: Option<u32>,
}

pub struct Contexts {
    /// Primary context reference counts, by CUDA ordinal.
    primary_refs: [u32; MAX_DEVICES],
    /// Contexts that exist in this process (primary or created), by physical device.
    held: [u32; MAX_DEVICES],
    /// Created contexts, by key.
    created: BTreeMap<u64, Created>,
    context_keys: Keys,
    streams: BTreeMap<u64, Stream>,
    stream_keys: Keys,
}

impl Contexts {
    pub fn new() -> Contexts {
        Contexts {
            primary_refs: [0; MAX_DEVICES],
            held: [0; MAX_DEVICES],
            created: BTreeMap::new(),
            context_keys: Keys::starting_at(1),
            streams: BTreeMap::new(),
            stream_keys: Keys::starting_at(1),
        }
    }
}

/// `CUstream` values that name a default stream rather than a created one: NULL, `CU_STREAM_LEGACY`,
/// `CU_STREAM_PER_THREAD`.
const DEFAULT_STREAMS: [u64; 3] = [0, 1, 2];

impl Fake {
    /// Takes a reference on ordinal `ordinal`'s primary context, which costs its device
    /// `FAKEGPU_CONTEXT_MEMORY` when this makes it exist.
    pub fn retain_primary(&self, ordinal: usize) -> Result<(), Refusal> {
        let physical = self.physical(ordinal).ok_or(Refusal::BadDevice)?;
        let mut registry = self.lock();
        let refs = &mut registry.contexts.primary_refs[ordinal];
        let creates = *refs == 0;
        if creates {
            self.charge(physical, self.context_memory)?;
        }
        *refs += 1;
        if creates {
            self.context_born(&mut registry.contexts, physical);
        }
        drop(registry);
        if creates {
            std::thread::sleep(self.context_delay);
        }
        Ok(())
    }

    /// Drops one reference; the last one gives the context's memory back.
    pub fn release_primary(&self, ordinal: usize) -> Result<(), Refusal> {
        let physical = self.physical(ordinal).ok_or(Refusal::BadDevice)?;
        let mut registry = self.lock();
        let refs = &mut registry.contexts.primary_refs[ordinal];
        *refs = refs.checked_sub(1).ok_or(Refusal::NoContext)?;
        if *refs == 0 {
            self.credit(physical, self.context_memory);
            self.context_gone(&mut registry.contexts, physical);
        }
        Ok(())
    }

    /// The context behind a non-NULL `CUcontext`: any primary handle of a visible device (retained or
    /// not, as the fake has always allowed), or a created context that was not destroyed.
    pub fn resolve_context(&self, handle: *mut c_void) -> Result<Bound, Refusal> {
        if let Some(ordinal) = CONTEXTS.index(handle, self.ordinals.len()) {
            return Ok(Bound::Primary(ordinal));
        }
        let key = handles::decode(Kind::Context, handle.addr() as u64).ok_or(Refusal::NoContext)?;
        let ordinal = self.lock().contexts.created.get(&key).ok_or(Refusal::NoContext)?.ordinal;
        Ok(Bound::Created { key, ordinal })
    }

    /// `cuCtxCreate`: a new context on `ordinal`, charged to its device and pushed on this thread;
    /// `sm_affinity` is the SM count of its execution affinity, if it was given one.
    pub fn create_context(&self, ordinal: usize, sm_affinity: Option<u32>) -> Result<Bound, Refusal> {
        let bound = self.new_context(ordinal, self.context_memory, sm_affinity)?;
        push(bound);
        std::thread::sleep(self.context_delay);
        Ok(bound)
    }

    /// `cuGreenCtxCreate`: a new context on `ordinal`, charged to its device, not made current.
    pub fn create_green_context(&self, ordinal: usize) -> Result<Bound, Refusal> {
        let bound = self.new_context(ordinal, self.green_context_memory, None)?;
        std::thread::sleep(self.context_delay);
        Ok(bound)
    }

    fn new_context(&self, ordinal: usize, bytes: u64, sm_affinity: Option<u32>) -> Result<Bound, Refusal> {
        let physical = self.physical(ordinal).ok_or(Refusal::BadDevice)?;
        let mut registry = self.lock();
        self.charge(physical, bytes)?;
        self.context_born(&mut registry.contexts, physical);
        let key = registry.contexts.context_keys.next();
        registry.contexts.created.insert(key, Created { ordinal, bytes, sm_affinity });
        Ok(Bound::Created { key, ordinal })
    }

    /// `cuCtxDestroy`: only created contexts; pops it if it is this thread's current one.
    pub fn destroy_context(&self, handle: *mut c_void) -> Result<(), Refusal> {
        let bound = self.resolve_context(handle)?;
        let Bound::Created { key, ordinal } = bound else { return Err(Refusal::NoContext) };
        let mut registry = self.lock();
        let bytes = registry.contexts.created.remove(&key).ok_or(Refusal::NoContext)?.bytes;
        if let Some(physical) = self.physical(ordinal) {
            self.credit(physical, bytes);
            self.context_gone(&mut registry.contexts, physical);
        }
        drop(registry);
        with_stack(|stack| {
            if stack.last() == Some(&bound) {
                stack.pop();
            }
        });
        Ok(())
    }

    /// `nvmlDeviceGetComputeRunningProcesses`: how many processes hold a context on physical
    /// `device` (every process sharing it, with `FAKEGPU_SHARED`), and whether this one does.
    pub fn running_processes(&self, device: usize) -> (u64, bool) {
        // Read without the registry's lock, as a real NVML query does not wait on the
        // application's own driver calls of the moment: libvgpu asks it from a thread of its own.
        let this = self.holds_context(device);
        (self.ledger.processes(device).max(u64::from(this)), this)
    }

    /// A context came to exist on `physical`: the process now runs there if it did not already.
    fn context_born(&self, contexts: &mut Contexts, physical: usize) {
        contexts.held[physical] += 1;
        self.note_contexts(physical, contexts.held[physical]);
        if contexts.held[physical] == 1 {
            self.ledger.join(physical);
        }
    }

    fn context_gone(&self, contexts: &mut Contexts, physical: usize) {
        contexts.held[physical] = contexts.held[physical].saturating_sub(1);
        self.note_contexts(physical, contexts.held[physical]);
        if contexts.held[physical] == 0 {
            self.ledger.leave(physical);
        }
    }

    /// (CUDA ordinal, physical index) of the calling thread's current context.
    pub fn current(&self) -> Result<(usize, usize), Refusal> {
        let (bound, physical) = self.current_context()?;
        Ok((bound.ordinal(), physical))
    }

    /// The calling thread's current context, and its physical device.
    pub fn current_context(&self) -> Result<(Bound, usize), Refusal> {
        let bound = top().ok_or(Refusal::NoContext)?;
        if let Bound::Created { key, .. } = bound
            && !self.lock().contexts.created.contains_key(&key)
        {
            return Err(Refusal::ContextDestroyed);
        }
        Ok((bound, self.physical(bound.ordinal()).ok_or(Refusal::NoContext)?))
    }

    /// The SMs this process's contexts may use: all of them, unless the process is an MPS client
    /// with a thread percentage. As on a real MPS client, this is also what the device's SM count
    /// reads (`CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT`).
    pub fn process_sm_count(&self) -> u32 {
        match self.mps_thread_percent {
            Some(percent) if self.mps => (MULTIPROCESSORS * percent / 100).max(1),
            _ => MULTIPROCESSORS,
        }
    }

    /// The SMs `bound`'s kernels may use: the process's, or under MPS the execution affinity a
    /// created context was given.
    pub fn sm_count(&self, bound: Bound) -> u32 {
        let affinity = match bound {
            Bound::Created { key, .. } if self.mps => {
                self.lock().contexts.created.get(&key).and_then(|c| c.sm_affinity)
            }
            _ => None,
        };
        affinity.map_or(self.process_sm_count(), |sms| sms.clamp(1, MULTIPROCESSORS))
    }

    /// `cuStreamCreate`: a stream of the current context.
    pub fn create_stream(&self) -> Result<u64, Refusal> {
        let (_, physical) = self.current()?;
        let mut registry = self.lock();
        let key = registry.contexts.stream_keys.next();
        registry.contexts.streams.insert(key, Stream { physical });
        Ok(handles::encode(Kind::Stream, key))
    }

    /// `cuStreamDestroy`: like the driver, work already queued on the stream still runs.
    pub fn destroy_stream(&self, stream: u64) -> Result<(), Refusal> {
        let key = handles::decode(Kind::Stream, stream).ok_or(Refusal::Unknown)?;
        let mut registry = self.lock();
        registry.contexts.streams.remove(&key).ok_or(Refusal::Unknown)?;
        registry.timeline.forget(StreamKey::Created(stream));
        Ok(())
    }

    /// The physical device a stream works on: a default stream's is the current context's.
    pub fn stream_device(&self, stream: u64) -> Result<usize, Refusal> {
        if DEFAULT_STREAMS.contains(&stream) {
            return Ok(self.current()?.1);
        }
        let key = handles::decode(Kind::Stream, stream).ok_or(Refusal::Unknown)?;
        self.lock().contexts.streams.get(&key).map(|stream| stream.physical).ok_or(Refusal::Unknown)
    }
}
