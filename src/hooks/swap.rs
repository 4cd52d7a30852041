//! Swapping whole idle processes (docs/overcommit.md, "Swapping whole processes").
//!
//! On an overcommitted device whose container's swap table shows a live arbiter (`vgpu-smi serve
//! --swap`), `cuMemAlloc` hands out VMM memory: an address range reserved once, backed by physical
//! chunks of [`CHUNK`] bytes. When the arbiter asks (the table's `request` word), this process's
//! agent thread closes the *gate*, waits for its work to finish, copies every chunk to host memory
//! and gives the chunk back to the driver as soon as its copy is done, keeping the addresses. The
//! next call that needs device memory (a launch, a copy, a memset, a graph launch, a new
//! allocation) finds the gate closed and brings everything back first: new physical chunks mapped
//! at the same addresses, copied back, waiting for room (the `waiting` bit) while the card is full.
//! The application's pointers never change and its data is copied bit for bit.
//!
//! Host memory is pinned ahead, in the background, chunk by chunk, while the host has memory to
//! spare ([`pin_ahead_allowed`]): pinning at swap time would cost ~0.84 s per GiB (DESIGN.md §10).
//! It is pinned while the process is idle (pinning holds the driver, and the process's own kernels
//! would wait) and while it is out. A chunk with no pinned buffer is copied out through pageable
//! memory, which the driver stages itself; while the process is out, the agent moves those bytes
//! into pinned buffers, and a pageable buffer still left is given back once its chunk is on the
//! card again.
//!
//! A forced request (a busy process, a waiter that has waited long enough) may name an amount:
//! then only chunks enough for it move, those with a pinned buffer first, and the rest stay on the
//! card; the gate closes all the same, and the next call brings back what went out.
//!
//! The gate costs one relaxed load for a process with no swappable memory, and two atomic adds
//! and a clock read for one that has some.

// Streams, contexts and host buffers are driver handles or our own allocations, kept as integers.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::{c_int, c_uint, c_void};
use std::hash::Hash;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::{Condvar, Mutex};
use vgpu_ledger::pace::now;
use vgpu_ledger::swap::{IN_FLIGHT, Phase, SwapTable, WAITING, Word, futex_wait, state_word};

use crate::config::MAX_DEVICES;
use crate::driver::{self, sys::*};
use crate::error::HookError;
use crate::hooks::memory::reserve_for;
use crate::ledger::Allocation;
use crate::runtime::Runtime;

/// Physical memory is made and given back in pieces of this size, so that an outgoing process
/// frees the card piece by piece while an incoming one fills it.
const CHUNK: usize = vgpu_ledger::swap::CHUNK as usize;
/// Smaller allocations stay ordinary device memory (a VMM range rounds up to 2 MiB).
pub const SMALLEST: usize = 1 << 20;
/// Copy streams per context.
const STREAMS: usize = 4;
/// An arbiter whose heartbeat is older than this is gone.
const ARBITER_GONE_NS: u64 = 3_000_000_000;
/// A request that finds the process active this recently is declined.
const BUSY_NS: u64 = 20_000_000;
/// How long a swap-out waits for the calls inside the gate to leave before declining; a forced one
/// waits longer (a synchronous copy inside it waits for the process's queued kernels).
const QUIESCE: Duration = Duration::from_millis(50);
const QUIESCE_FORCED: Duration = Duration::from_secs(5);
/// How long a new allocation waits for room before falling back to managed memory.
const ALLOCATION_PATIENCE_NS: u64 = 30_000_000_000;
/// How long the process that made its container's swap table waits for an arbiter to find it.
const NEW_TABLE_GRACE_NS: u64 = 300_000_000;
/// Host memory is pinned ahead for a process on the card once it has been idle this long, or ...
const PIN_WHEN_IDLE_NS: u64 = 100_000_000;
/// ... while it waits for its own kernels (a synchronize), one chunk once the wait has lasted this
/// long and one more every [`PIN_IN_WAIT_GAP_NS`] after: the thread that waits launches nothing
/// meanwhile, so the pin holds up at most the launch right after the wait.
const PIN_IN_WAIT_NS: u64 = 20_000_000;
const PIN_IN_WAIT_GAP_NS: u64 = 100_000_000;
/// How soon the agent looks again while chunks wait to be pinned and the process is busy.
const PIN_POLL: Duration = Duration::from_millis(10);
/// The activity word in the table is written at most this often.
const ACTIVITY_GRAIN_NS: u64 = 1_000_000;

// Driver entry points only the swap uses, resolved once from the driver itself.
type AddressReserve = unsafe extern "C" fn(*mut CUdeviceptr, usize, usize, CUdeviceptr, u64) -> CUresult;
type AddressFree = unsafe extern "C" fn(CUdeviceptr, usize) -> CUresult;
type SetAccess = unsafe extern "C" fn(CUdeviceptr, usize, *const AccessDesc, usize) -> CUresult;
type Granularity = unsafe extern "C" fn(*mut usize, *const CUmemAllocationProp, c_int) -> CUresult;
type HostAlloc = unsafe extern "C" fn(*mut *mut c_void, usize, c_uint) -> CUresult;
type FreeHost = unsafe extern "C" fn(*mut c_void) -> CUresult;
type CopyDtoH = unsafe extern "C" fn(*mut c_void, CUdeviceptr, usize, CUstream) -> CUresult;
type CopyHtoD = unsafe extern "C" fn(CUdeviceptr, *const c_void, usize, CUstream) -> CUresult;
type StreamCreate = unsafe extern "C" fn(*mut CUstream, c_uint) -> CUresult;
type StreamSync = unsafe extern "C" fn(CUstream) -> CUresult;
type EventCreate = unsafe extern "C" fn(*mut *mut c_void, c_uint) -> CUresult;
type EventUse = unsafe extern "C" fn(*mut c_void) -> CUresult;
type EventRecord = unsafe extern "C" fn(*mut c_void, CUstream) -> CUresult;
type CtxSync = unsafe extern "C" fn() -> CUresult;
type CtxGet = unsafe extern "C" fn(*mut CUcontext) -> CUresult;
type CtxSet = unsafe extern "C" fn(CUcontext) -> CUresult;

/// `CUmemAccessDesc`.
#[repr(C)]
struct AccessDesc {
    location: CUmemLocation,
    flags: c_int,
}
const ACCESS_READ_WRITE: c_int = 3;
const ALLOCATION_PINNED: c_int = 1;
const STREAM_NON_BLOCKING: c_uint = 1;
const EVENT_DISABLE_TIMING: c_uint = 2;

struct Calls {
    reserve: AddressReserve,
    address_free: AddressFree,
    set_access: SetAccess,
    granularity: Granularity,
    host_alloc: HostAlloc,
    free_host: FreeHost,
    dtoh: CopyDtoH,
    htod: CopyHtoD,
    stream_create: StreamCreate,
    stream_sync: StreamSync,
    event_create: EventCreate,
    event_record: EventRecord,
    event_sync: EventUse,
    event_destroy: EventUse,
    ctx_sync: CtxSync,
    ctx_get: CtxGet,
    ctx_set: CtxSet,
    create: CuMemCreate,
    release: CuMemRelease,
    map: CuMemMap,
    unmap: CuMemUnmap,
}

/// The entry points, or `None` when the driver lacks one (then nothing is swappable).
fn calls() -> Option<&'static Calls> {
    static CALLS: OnceLock<Option<Calls>> = OnceLock::new();
    CALLS
        .get_or_init(|| {
            macro_rules! resolve {
                ($kind:ty, $name:literal) => {{
                    let address = driver::cuda_symbol($name)?;
                    // SAFETY: the driver's function of this exact name has this type (cuda.h).
                    unsafe { std::mem::transmute::<*mut c_void, $kind>(address) }
                }};
            }
            let cuda = driver::cuda();
            Some(Calls {
                reserve: resolve!(AddressReserve, c"cuMemAddressReserve"),
                address_free: resolve!(AddressFree, c"cuMemAddressFree"),
                set_access: resolve!(SetAccess, c"cuMemSetAccess"),
                granularity: resolve!(Granularity, c"cuMemGetAllocationGranularity"),
                host_alloc: resolve!(HostAlloc, c"cuMemHostAlloc"),
                free_host: resolve!(FreeHost, c"cuMemFreeHost"),
                dtoh: resolve!(CopyDtoH, c"cuMemcpyDtoHAsync_v2"),
                htod: resolve!(CopyHtoD, c"cuMemcpyHtoDAsync_v2"),
                stream_create: resolve!(StreamCreate, c"cuStreamCreate"),
                stream_sync: resolve!(StreamSync, c"cuStreamSynchronize"),
                event_create: resolve!(EventCreate, c"cuEventCreate"),
                event_record: resolve!(EventRecord, c"cuEventRecord"),
                event_sync: resolve!(EventUse, c"cuEventSynchronize"),
                event_destroy: resolve!(EventUse, c"cuEventDestroy_v2"),
                ctx_sync: resolve!(CtxSync, c"cuCtxSynchronize"),
                ctx_get: resolve!(CtxGet, c"cuCtxGetCurrent"),
                ctx_set: resolve!(CtxSet, c"cuCtxSetCurrent"),
                create: cuda.mem_create?,
                release: cuda.mem_release?,
                map: cuda.mem_map?,
                unmap: cuda.mem_unmap?,
            })
        })
        .as_ref()
}

/// How long placing chunks may wait for room (`None`: as long as it takes), and how many more bytes
/// the process waits for beyond them (for the record's `wanted`).
#[derive(Clone, Copy)]
struct Wait {
    deadline: Option<u64>,
    beyond: u64,
}

/// Why chunks could not be placed on the card.
enum Unplaced {
    Driver(HookError),
    /// No room came before the deadline.
    Deadline,
    /// The arbiter asked this waiting process (request number) to let go of what it holds.
    Yield(u64),
}

fn check(status: CUresult) -> Result<(), HookError> {
    if status == CUDA_SUCCESS { Ok(()) } else { Err(HookError::Driver(status)) }
}

/// Where a chunk's bytes are kept while it is off the card.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Host {
    None,
    /// Pinned ahead and kept for the chunk's life.
    Pinned(usize),
    /// Pageable, made at swap-out and given back at swap-in.
    Pageable(usize),
}

#[derive(Debug)]
struct Chunk {
    offset: usize,
    size: usize,
    /// The physical allocation mapped there; 0 while the chunk is off the card.
    handle: CUmemGenericAllocationHandle,
    host: Host,
}

#[derive(Debug)]
struct Block {
    allocation: Allocation,
    span: usize,
    context: usize,
    chunks: Vec<Chunk>,
}

impl Block {
    /// The charged bytes that `off_card` bytes of this block's span stand for (the charge is the
    /// allocation's size, the span its rounding up).
    fn charged(&self, off_card: u64) -> u64 {
        (off_card.min(self.span as u64) as u128 * u128::from(self.allocation.bytes)
            / self.span.max(1) as u128) as u64
    }
}

#[derive(Default)]
struct Inner {
    blocks: BTreeMap<CUdeviceptr, Block>,
    /// Some of the blocks' chunks are off the card; the gate stays closed until they are back.
    out: bool,
    /// Copy streams by context.
    streams: HashMap<usize, [usize; STREAMS]>,
    /// The agent thread runs in this pid (0: none yet; a fork child starts its own).
    agent: u32,
}

impl Inner {
    /// Bytes of the chunks on the card that `which` takes.
    fn on_card(&self, which: impl Fn(&Chunk) -> bool) -> u64 {
        self.blocks
            .values()
            .flat_map(|block| &block.chunks)
            .filter(|chunk| chunk.handle != 0 && which(chunk))
            .map(|chunk| chunk.size as u64)
            .sum()
    }
}

/// This process's swappable memory and the gate every call that touches device memory passes.
pub struct Swap {
    /// The process holds swappable memory: the gate matters.
    active: AtomicBool,
    /// Calls inside the gate now.
    inside: AtomicU64,
    /// The gate is closed: memory is leaving or out.
    closed: AtomicBool,
    inner: Mutex<Inner>,
    /// Signalled when the gate opens again.
    opened: Condvar,
    table: OnceLock<Option<SwapTable>>,
    /// Bit `device`: this process has swappable memory there.
    devices: AtomicU32,
    /// Charged bytes of this process off the card, by device (NVML does not count them).
    swapped: [AtomicU64; MAX_DEVICES],
    last_active: AtomicU64,
    /// Host memory may still be pinned ahead.
    pinning: AtomicBool,
    /// Threads waiting for the process's own work now ([`Swap::waiting`]), when the current spell
    /// of waiting began (0: none), and the chunks pinned during it.
    waits: AtomicU64,
    wait_started: AtomicU64,
    wait_pins: AtomicU64,
}

/// What the agent does after a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Next {
    /// Another step at once.
    Now,
    /// Chunks wait to be pinned while the process is busy: a look again soon.
    Soon,
    /// Nothing to do: sleep until a request comes (or a while passes).
    Sleep,
}

impl Default for Swap {
    fn default() -> Swap {
        Swap {
            active: AtomicBool::new(false),
            inside: AtomicU64::new(0),
            closed: AtomicBool::new(false),
            inner: Mutex::new(Inner::default()),
            opened: Condvar::new(),
            table: OnceLock::new(),
            devices: AtomicU32::new(0),
            swapped: std::array::from_fn(|_| AtomicU64::new(0)),
            last_active: AtomicU64::new(0),
            pinning: AtomicBool::new(true),
            waits: AtomicU64::new(0),
            wait_started: AtomicU64::new(0),
            wait_pins: AtomicU64::new(0),
        }
    }
}

/// A call inside the gate: the process's memory stays on the card until it is dropped.
pub struct Inside<'a>(&'a Swap);

impl Drop for Inside<'_> {
    fn drop(&mut self) {
        self.0.inside.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Swap {
    /// Passes the gate before a call that touches device memory: brings the process's memory back
    /// first if it is out. One relaxed load for a process with no swappable memory.
    #[inline]
    pub fn enter(&self, runtime: &Runtime) -> Option<Inside<'_>> {
        if !self.active.load(Ordering::Relaxed) {
            return None;
        }
        self.enter_slow(runtime)
    }

    #[cold]
    fn enter_slow(&self, runtime: &Runtime) -> Option<Inside<'_>> {
        loop {
            self.inside.fetch_add(1, Ordering::SeqCst);
            if !self.closed.load(Ordering::SeqCst) {
                self.note_activity(runtime);
                return Some(Inside(self));
            }
            self.inside.fetch_sub(1, Ordering::SeqCst);
            self.bring_back(runtime);
        }
    }

    /// Runs a call that waits for the process's queued work, or asks whether it is done: the
    /// process counts as inside the gate meanwhile (work in flight: an ordinary request is
    /// declined, and host memory is pinned only at a wait's own pace, [`PIN_IN_WAIT_NS`]), and as
    /// active when the call returns. Memory that is out is not brought back for it: nothing of the
    /// process is queued then.
    pub fn waiting<T>(&self, runtime: &Runtime, call: impl FnOnce() -> T) -> T {
        if !self.active.load(Ordering::Relaxed) {
            return call();
        }
        self.inside.fetch_add(1, Ordering::SeqCst);
        let inside = Inside(self);
        if self.closed.load(Ordering::SeqCst) {
            drop(inside);
            return call();
        }
        self.note_activity(runtime);
        if self.waits.fetch_add(1, Ordering::SeqCst) == 0 {
            self.wait_pins.store(0, Ordering::Relaxed);
            self.wait_started.store(now(), Ordering::SeqCst);
            self.mark_in_flight(runtime, true);
        }
        let result = call();
        if self.waits.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.wait_started.store(0, Ordering::SeqCst);
            self.mark_in_flight(runtime, false);
            // A wait that began meanwhile found the bit set and left it so; it must stay set.
            if self.waits.load(Ordering::SeqCst) > 0 {
                self.mark_in_flight(runtime, true);
            }
        }
        drop(inside);
        self.note_activity(runtime);
        result
    }

    /// Runs a query of the process's queued work (`cuStreamQuery`, `cuEventQuery`): one that finds
    /// work still running counts as activity; one that finds it done does not (a thread polling an
    /// idle stream leaves its process idle). It never waits, so it never holds the gate.
    pub fn query(&self, runtime: &Runtime, call: impl FnOnce() -> CUresult) -> CUresult {
        let status = call();
        if status == CUDA_ERROR_NOT_READY && self.active.load(Ordering::Relaxed) {
            self.note_activity(runtime);
        }
        status
    }

    /// Whether host memory may be pinned now for a process on the card: it has been idle
    /// [`PIN_WHEN_IDLE_NS`], or every call inside is a wait that has lasted long enough for one
    /// more chunk. Returns the wait's start when the pin counts against a wait (else 0).
    fn may_pin_on_card(&self) -> Option<u64> {
        let inside = self.inside.load(Ordering::SeqCst);
        if inside == 0 {
            let idle = now().saturating_sub(self.last_active.load(Ordering::Relaxed)) >= PIN_WHEN_IDLE_NS;
            return idle.then_some(0);
        }
        let started = self.wait_started.load(Ordering::SeqCst);
        if started == 0 || inside != self.waits.load(Ordering::SeqCst) {
            return None;
        }
        let due = PIN_IN_WAIT_NS + self.wait_pins.load(Ordering::Relaxed) * PIN_IN_WAIT_GAP_NS;
        (now().saturating_sub(started) >= due).then_some(started)
    }

    /// Charged bytes of this process on `device` that are off the card now.
    pub fn swapped(&self, device: usize) -> u64 {
        self.swapped.get(device).map_or(0, |bytes| bytes.load(Ordering::Relaxed))
    }

    fn note_activity(&self, runtime: &Runtime) {
        let now = now();
        if now.saturating_sub(self.last_active.load(Ordering::Relaxed)) < ACTIVITY_GRAIN_NS {
            return;
        }
        self.last_active.store(now, Ordering::Relaxed);
        self.each_record(runtime, |table, lease, index| {
            table.get(lease, index, Word::ActiveNs).store(now, Ordering::Relaxed);
        });
    }

    /// The container's swap table, opened on first use (`None`: no shared region, or the file
    /// could not be made; then nothing is swappable).
    fn table(&self, runtime: &Runtime, device: usize) -> Option<&SwapTable> {
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
    fn each_record(&self, runtime: &Runtime, mut f: impl FnMut(&SwapTable, usize, usize)) {
        let devices = self.devices.load(Ordering::Relaxed);
        for device in (0..MAX_DEVICES).filter(|d| devices & (1 << d) != 0) {
            let Some(table) = self.table.get().and_then(Option::as_ref) else { return };
            if let Some(place) = runtime.ledger().swap_place(device) {
                f(table, place.lease, place.index);
            }
        }
    }

    fn add(&self, runtime: &Runtime, device: usize, word: Word, bytes: i64) {
        let Some(table) = self.table.get().and_then(Option::as_ref) else { return };
        let Some(place) = runtime.ledger().swap_place(device) else { return };
        let word = table.get(place.lease, place.index, word);
        let _ =
            word.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| Some(v.saturating_add_signed(bytes)));
    }

    /// Sets the record's phase and waiting bit; the in-flight bit stays as the waits left it.
    fn set_phase(&self, runtime: &Runtime, phase: Phase, waiting: bool) {
        let pid = std::process::id();
        self.each_record(runtime, |table, lease, index| {
            let _ =
                table.get(lease, index, Word::State).fetch_update(Ordering::AcqRel, Ordering::Acquire, |s| {
                    Some(state_word(phase, waiting, pid) | (s & IN_FLIGHT))
                });
        });
    }

    /// Host memory pinned ahead for this process, as its records count it.
    fn pinned(&self, runtime: &Runtime) -> u64 {
        let mut pinned = 0u64;
        self.each_record(runtime, |table, lease, index| {
            pinned = pinned.saturating_add(table.get(lease, index, Word::Pinned).load(Ordering::Relaxed));
        });
        pinned
    }

    /// Tells the arbiter whether a call of this process waits for its kernels ([`IN_FLIGHT`]).
    fn mark_in_flight(&self, runtime: &Runtime, in_flight: bool) {
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

    /// Whether a `cuMemAlloc` of `bytes` on overcommitted `device` should be swappable: an arbiter
    /// runs, the allocation is not tiny, and the budget fits the card (a budget past the card
    /// needs memory that spills, which unified memory gives).
    pub fn wants(&self, runtime: &Runtime, device: usize, bytes: usize) -> bool {
        if bytes < SMALLEST || calls().is_none() {
            return false;
        }
        let Some(limit) = runtime.ledger().limit(device) else { return false };
        let mut total = 0usize;
        // SAFETY: a valid out-pointer.
        if unsafe { driver::cuda().device_total_mem(&mut total, device as CUdevice) }.is_err()
            || limit > total as u64
        {
            return false;
        }
        self.arbiter_alive(runtime, device)
    }

    /// `cuMemAlloc_v2` of swappable memory on `device`: charged, reserved, backed chunk by chunk.
    /// `Ok(false)`: no room came within the patience (nothing was charged); the caller falls back
    /// to managed memory.
    ///
    /// # Safety
    /// `dptr` is the application's non-null out-pointer.
    pub unsafe fn alloc(
        &self,
        runtime: &Runtime,
        device: usize,
        dptr: *mut CUdeviceptr,
        bytes: usize,
    ) -> Result<bool, HookError> {
        let Some(calls) = calls() else { return Ok(false) };
        let mut inner = self.resident_inner(runtime);
        // The record shows the process from its first swappable allocation on, waiting included.
        self.devices.fetch_or(1 << device, Ordering::Relaxed);
        if inner.agent != std::process::id() {
            inner.agent = std::process::id();
            self.set_phase(runtime, Phase::Resident, false);
            start_agent();
        }
        let context = current_context(calls);
        let granularity = granularity(calls, device);
        let span = bytes.div_ceil(granularity) * granularity;
        let mut made = None;
        let mut no_room = false;
        let created = reserve_for(runtime, device, bytes as u64, || {
            let mut address: CUdeviceptr = 0;
            // SAFETY: a valid out-pointer; the driver picks the address.
            check(unsafe { (calls.reserve)(&mut address, span, 0, 0, 0) })?;
            let mut chunks = Vec::with_capacity(span.div_ceil(CHUNK));
            let mut offset = 0;
            while offset < span {
                chunks.push(Chunk { offset, size: CHUNK.min(span - offset), handle: 0, host: Host::None });
                offset += CHUNK;
            }
            let deadline = now().saturating_add(ALLOCATION_PATIENCE_NS);
            loop {
                let error = match self.place(
                    runtime,
                    calls,
                    device,
                    address,
                    &mut chunks,
                    Wait { deadline: Some(deadline), beyond: 0 },
                ) {
                    Ok(()) => break,
                    Err(error) => error,
                };
                for chunk in chunks.iter_mut().filter(|chunk| chunk.handle != 0) {
                    unplace(calls, address, chunk);
                }
                if let Unplaced::Yield(request) = error {
                    // Two processes each holding part of the card and waiting for the rest would
                    // wait forever: the arbiter asked this one to let go of what it had made.
                    self.mark_handled(runtime, request);
                    continue;
                }
                // SAFETY: the range we reserved, with nothing mapped in it any more.
                unsafe { (calls.address_free)(address, span) };
                return Err(match error {
                    Unplaced::Driver(error) => error,
                    _ => {
                        no_room = true;
                        HookError::Driver(CUDA_ERROR_OUT_OF_MEMORY)
                    }
                });
            }
            made = Some(chunks);
            Ok(address)
        });
        let (address, allocation) = match created {
            Ok(created) => created,
            Err(_) if no_room => return Ok(false),
            Err(error) => return Err(error),
        };
        let Some(chunks) = made else { return Ok(false) };
        inner.blocks.insert(address, Block { allocation, span, context, chunks });
        self.add(runtime, device, Word::Resident, span as i64);
        self.active.store(true, Ordering::Relaxed);
        // An allocation is activity: its memory is pinned for once the process is idle.
        self.note_activity(runtime);
        self.pinning.store(true, Ordering::Relaxed);
        // SAFETY: the caller's non-null out-pointer, written once the allocation exists.
        unsafe { dptr.write(address) };
        Ok(true)
    }

    /// `cuMemFree_v2` of `address`: `None` when it is not swappable memory of ours (the caller
    /// frees it as before). Memory off the card is not brought back to be freed.
    pub fn free(&self, runtime: &Runtime, address: CUdeviceptr) -> Option<Result<(), HookError>> {
        if !self.active.load(Ordering::Relaxed) {
            return None;
        }
        let calls = calls()?;
        let mut inner = self.inner.lock();
        let mut block = inner.blocks.remove(&address)?;
        let device = block.allocation.device;
        if block.chunks.iter().any(|chunk| chunk.handle != 0) {
            // As `cuMemFree` does: work still queued on this memory finishes first.
            with_context(calls, block.context, || {
                // SAFETY: no arguments.
                unsafe { (calls.ctx_sync)() }
            });
        }
        let mut resident = 0;
        let mut off_card = 0;
        for chunk in &mut block.chunks {
            if chunk.handle != 0 {
                resident += chunk.size;
                unplace(calls, address, chunk);
            } else {
                off_card += chunk.size;
            }
            if matches!(chunk.host, Host::Pinned(_)) {
                self.add(runtime, device, Word::Pinned, -(chunk.size as i64));
            }
            drop_host(calls, block.context, &mut chunk.host);
        }
        // SAFETY: the range we reserved, with nothing mapped in it any more.
        unsafe { (calls.address_free)(address, block.span) };
        if off_card > 0 {
            // What `copy_out` counted for this block: all of it, or the part a forced request moved.
            let charged = block.charged(off_card as u64);
            self.swapped[device].fetch_sub(charged.min(self.swapped(device)), Ordering::Relaxed);
        }
        self.add(runtime, device, Word::Resident, -(resident as i64));
        self.add(runtime, device, Word::Swapped, -(off_card as i64));
        runtime.ledger().release(device, block.allocation.bytes, block.allocation.owner);
        Some(Ok(()))
    }

    /// The lock over the blocks, with the process's memory on the card (brought back first if it
    /// was out).
    fn resident_inner(&self, runtime: &Runtime) -> parking_lot::MutexGuard<'_, Inner> {
        loop {
            let inner = self.inner.lock();
            if !inner.out {
                return inner;
            }
            drop(inner);
            self.bring_back(runtime);
        }
    }

    /// Backs every chunk of the range at `address` that is off the card with new physical memory,
    /// mapped and made accessible. While the card has no room, says so in the table and waits,
    /// until `deadline` if there is one, or until the arbiter asks this process to let go.
    fn place(
        &self,
        runtime: &Runtime,
        calls: &Calls,
        device: usize,
        address: CUdeviceptr,
        chunks: &mut [Chunk],
        wait: Wait,
    ) -> Result<(), Unplaced> {
        for index in 0..chunks.len() {
            if chunks[index].handle != 0 {
                continue;
            }
            let handle =
                self.create_waiting(runtime, calls, device, chunks[index].size, wait.deadline, || {
                    wait.beyond
                        + chunks[index..]
                            .iter()
                            .filter(|chunk| chunk.handle == 0)
                            .map(|chunk| chunk.size as u64)
                            .sum::<u64>()
                })?;
            let chunk = &mut chunks[index];
            let at = address + chunk.offset as CUdeviceptr;
            let access = AccessDesc {
                location: CUmemLocation { kind: CU_MEM_LOCATION_TYPE_DEVICE, id: device as c_int },
                flags: ACCESS_READ_WRITE,
            };
            // SAFETY: `at..at+size` lies in our reservation and is unmapped; the handle is ours.
            let mapped = check(unsafe { (calls.map)(at, chunk.size, 0, handle, 0) }).and_then(|()| {
                // SAFETY: the range just mapped; one descriptor.
                check(unsafe { (calls.set_access)(at, chunk.size, &access, 1) })
            });
            if let Err(error) = mapped {
                // SAFETY: our own handle (and mapping, if the map succeeded).
                unsafe {
                    (calls.unmap)(at, chunk.size);
                    (calls.release)(handle);
                }
                return Err(Unplaced::Driver(error));
            }
            chunk.handle = handle;
        }
        Ok(())
    }

    /// `cuMemCreate` of `size` bytes on `device`, waiting for room while the card is full: the
    /// record says the process waits, and for how many bytes (`wanted`), so that the arbiter asks
    /// an idle process to make room.
    fn create_waiting(
        &self,
        runtime: &Runtime,
        calls: &Calls,
        device: usize,
        size: usize,
        deadline: Option<u64>,
        wanted: impl Fn() -> u64,
    ) -> Result<CUmemGenericAllocationHandle, Unplaced> {
        let prop = allocation_prop(device);
        let mut waiting = false;
        let mut said = false;
        loop {
            let mut handle = 0;
            // SAFETY: valid out-pointer and properties.
            let status = unsafe { (calls.create)(&mut handle, size, &prop, 0) };
            if status == CUDA_SUCCESS {
                if waiting {
                    self.set_waiting(runtime, device, 0);
                }
                return Ok(handle);
            }
            if status != CUDA_ERROR_OUT_OF_MEMORY {
                if waiting {
                    self.set_waiting(runtime, device, 0);
                }
                return Err(Unplaced::Driver(HookError::Driver(status)));
            }
            let now = now();
            if deadline.is_some_and(|deadline| now >= deadline) {
                self.set_waiting(runtime, device, 0);
                return Err(Unplaced::Deadline);
            }
            if let Some(request) = self.pending_request(runtime) {
                self.set_waiting(runtime, device, 0);
                return Err(Unplaced::Yield(request));
            }
            if !waiting {
                waiting = true;
                self.set_waiting(runtime, device, wanted());
            }
            if !said && !self.arbiter_alive(runtime, device) {
                said = true;
                tracing::warn!(
                    "device {device}: waiting for room on the card to bring this process's memory back, \
                     and no swap arbiter is running (vgpu-smi serve --swap)"
                );
            }
            std::thread::sleep(Duration::from_micros(500));
        }
    }

    /// The arbiter's request this process has not acted on yet, if any.
    fn pending_request(&self, runtime: &Runtime) -> Option<u64> {
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
    fn forced(&self, runtime: &Runtime) -> u64 {
        let mut forced = 0;
        self.each_record(runtime, |table, lease, index| {
            forced = forced.max(table.get(lease, index, Word::Forced).load(Ordering::Acquire));
        });
        forced
    }

    /// The bytes the arbiter's latest request asks for (0: everything), the most any record asks.
    fn amount(&self, runtime: &Runtime) -> u64 {
        let mut amount = 0;
        self.each_record(runtime, |table, lease, index| {
            amount = amount.max(table.get(lease, index, Word::Amount).load(Ordering::Acquire));
        });
        amount
    }

    fn mark_handled(&self, runtime: &Runtime, request: u64) {
        self.each_record(runtime, |table, lease, index| {
            table.get(lease, index, Word::Handled).store(request, Ordering::Release);
        });
    }

    fn set_waiting(&self, runtime: &Runtime, device: usize, wanted: u64) {
        let Some(table) = self.table.get().and_then(Option::as_ref) else { return };
        let Some(place) = runtime.ledger().swap_place(device) else { return };
        let state = table.get(place.lease, place.index, Word::State);
        table.get(place.lease, place.index, Word::Wanted).store(wanted, Ordering::Release);
        let _ = state.fetch_update(Ordering::AcqRel, Ordering::Acquire, |s| {
            Some(if wanted > 0 { s | WAITING } else { s & !WAITING })
        });
    }

    /// Brings every chunk that is off the card back, then opens the gate. Any thread may call it;
    /// one does the work while the others wait for the lock and find it done.
    fn bring_back(&self, runtime: &Runtime) {
        let Some(calls) = calls() else { return };
        let started = now();
        let mut inner = self.inner.lock();
        if !inner.out {
            drop(inner);
            // A swap-out that was declined closed the gate for a moment.
            let mut guard = self.inner.lock();
            if self.closed.load(Ordering::SeqCst) && !guard.out {
                self.opened.wait_for(&mut guard, Duration::from_millis(1));
            }
            return;
        }
        self.set_phase(runtime, Phase::SwappingIn, false);
        let (copied, staged) = runtime.driver_memory.paused(|| self.copy_in(runtime, calls, &mut inner));
        let done = now();
        for device in 0..MAX_DEVICES {
            if self.devices.load(Ordering::Relaxed) & (1 << device) != 0 {
                self.swapped[device].store(0, Ordering::Relaxed);
                self.add(runtime, device, Word::SwapIns, 1);
                self.add(runtime, device, Word::WaitNs, done.saturating_sub(started) as i64);
                self.add(runtime, device, Word::InNs, done.saturating_sub(started) as i64);
            }
        }
        // ci/gpu-swap reads the rate from the line's start.
        let staged = if staged > 0 {
            format!(", {staged} of them staged through pinned buffers")
        } else {
            String::new()
        };
        tracing::info!(
            "swapped in {copied} bytes in {} ms ({:.1} GB/s){staged}",
            done.saturating_sub(started) / 1_000_000,
            copied as f64 / done.saturating_sub(started).max(1) as f64
        );
        inner.out = false;
        self.set_phase(runtime, Phase::Resident, false);
        self.closed.store(false, Ordering::SeqCst);
        self.opened.notify_all();
    }

    /// Maps new physical memory under every chunk that is off the card and copies its bytes back,
    /// on the copy streams of its context. Returns the bytes copied, and those of them staged
    /// through pinned buffers ([`Staging`]).
    fn copy_in(&self, runtime: &Runtime, calls: &Calls, inner: &mut Inner) -> (u64, u64) {
        let mut copied = 0u64;
        let mut contexts: Vec<usize> = Vec::new();
        // The chunks placed in this round, to give back if the arbiter asks this process to let go.
        let mut placed: Vec<(CUdeviceptr, usize)> = Vec::new();
        // Chunks held in pageable memory: placed now, copied once every chunk is placed, through
        // the pinned buffers of chunks already copied (see `Staging`).
        let mut deferred: Vec<(CUdeviceptr, usize)> = Vec::new();
        let mut staging = Staging::default();
        'round: loop {
            let Inner { blocks, streams, .. } = &mut *inner;
            // What is still off the card, for the record's `wanted` while this process waits.
            let mut missing: u64 = blocks
                .values()
                .flat_map(|block| &block.chunks)
                .filter(|chunk| chunk.handle == 0)
                .map(|chunk| chunk.size as u64)
                .sum();
            for (&address, block) in blocks.iter_mut() {
                let device = block.allocation.device;
                let streams = streams_of(calls, streams, block.context);
                if !contexts.contains(&block.context) {
                    contexts.push(block.context);
                }
                for index in 0..block.chunks.len() {
                    if block.chunks[index].handle != 0 {
                        continue;
                    }
                    // Waits as long as it takes: the memory is the application's.
                    missing -= block.chunks[index].size as u64;
                    let chunk = &mut block.chunks[index..=index];
                    match self.place(
                        runtime,
                        calls,
                        device,
                        address,
                        chunk,
                        Wait { deadline: None, beyond: missing },
                    ) {
                        Ok(()) => placed.push((address, index)),
                        Err(Unplaced::Yield(request)) => {
                            // The arbiter asks this waiting process for room (another process
                            // waits too, each holding part of the card; or one of higher priority
                            // waits): give back what this round placed (the host copies still
                            // hold the bytes: no pinned buffer has been used for staging yet).
                            sync_streams(calls, &inner.streams, &contexts);
                            deferred.clear();
                            staging.release(calls);
                            let amount = self.amount(runtime);
                            let mut given = 0u64;
                            for (address, index) in placed.drain(..) {
                                let Some(block) = inner.blocks.get_mut(&address) else { continue };
                                let chunk = &mut block.chunks[index];
                                unplace(calls, address, chunk);
                                copied -= chunk.size as u64;
                                given += chunk.size as u64;
                                self.add(
                                    runtime,
                                    block.allocation.device,
                                    Word::Resident,
                                    -(chunk.size as i64),
                                );
                                self.add(runtime, block.allocation.device, Word::Swapped, chunk.size as i64);
                            }
                            // A process that went out only in part (a forced request) still holds
                            // the rest: what the request asks for goes too (everything, for an
                            // amount of 0), or the other waiter could wait for ever; as much as
                            // host memory takes.
                            if amount == 0 || given < amount {
                                let rest = if amount == 0 { 0 } else { amount - given };
                                if let Some(rest) = self.fit_to_host(inner, rest, request) {
                                    self.copy_out(runtime, calls, inner, rest);
                                }
                            }
                            self.mark_handled(runtime, request);
                            tracing::debug!(
                                "let go of the card for another waiting process (request {request})"
                            );
                            continue 'round;
                        }
                        Err(_) => {
                            tracing::error!("device {device}: cannot map memory back at {address:#x}");
                            continue;
                        }
                    }
                    let chunk = &block.chunks[index];
                    let source = match chunk.host {
                        Host::Pinned(at) => at,
                        Host::Pageable(_) => {
                            deferred.push((address, index));
                            copied += chunk.size as u64;
                            self.add(runtime, device, Word::Resident, chunk.size as i64);
                            self.add(runtime, device, Word::Swapped, -(chunk.size as i64));
                            continue;
                        }
                        Host::None => continue,
                    };
                    let stream = streams[index % STREAMS] as CUstream;
                    with_context(calls, block.context, || {
                        // SAFETY: the chunk is mapped again; the host buffer holds its bytes.
                        unsafe {
                            (calls.htod)(
                                address + chunk.offset as CUdeviceptr,
                                source as *const c_void,
                                chunk.size,
                                stream,
                            )
                        }
                    });
                    staging.offer(calls, block.context, stream, source, chunk.size);
                    copied += chunk.size as u64;
                    self.add(runtime, device, Word::Resident, chunk.size as i64);
                    self.add(runtime, device, Word::Swapped, -(chunk.size as i64));
                }
            }
            break;
        }
        // Every chunk is placed: nothing can be given back unplaced any more, so the pinned
        // buffers of the chunks copied above may carry the pageable ones.
        for (address, index) in deferred {
            let Some(block) = inner.blocks.get(&address) else { continue };
            let chunk = &block.chunks[index];
            let Host::Pageable(source) = chunk.host else { continue };
            let streams = streams_of(calls, &mut inner.streams, block.context);
            let stream = streams[index % STREAMS] as CUstream;
            let target = address + chunk.offset as CUdeviceptr;
            staging.carry(calls, block.context, stream, target, source, chunk.size);
        }
        sync_streams(calls, &inner.streams, &contexts);
        staging.release(calls);
        // Pageable copies are given back: only pinned buffers are kept, and those chunks may be
        // pinned ahead again, as may a chunk a partial swap-out left on the card unpinned (pinning
        // stopped while the process was out: only chunks off the card are pinned then).
        for block in inner.blocks.values_mut() {
            for chunk in &mut block.chunks {
                if matches!(chunk.host, Host::Pageable(_)) {
                    drop_host(calls, block.context, &mut chunk.host);
                }
                if chunk.host == Host::None {
                    self.pinning.store(true, Ordering::Relaxed);
                }
            }
        }
        (copied, staging.staged)
    }

    /// Handles the arbiter's request: closes the gate, lets the calls inside leave and the queued
    /// work finish, and moves every chunk to host memory, or for a forced request that names an
    /// amount, chunks enough for it. Declined (false) when the process was active a moment ago or
    /// waits for its own kernels (and the request is not forced), or a call stays inside.
    fn swap_out(&self, runtime: &Runtime, request: u64) -> bool {
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
        let held = inner.on_card(|_| true);
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
        let moved = runtime.driver_memory.paused(|| self.copy_out(runtime, calls, &mut inner, amount));
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
        tracing::info!(
            "swapped out {moved} bytes in {} ms ({:.1} GB/s){why}",
            done.saturating_sub(started) / 1_000_000,
            moved as f64 / done.saturating_sub(started).max(1) as f64
        );
        self.set_phase(runtime, Phase::Out, false);
        true
    }

    /// What a swap-out of `amount` bytes (0: all it holds on the card) for `request` may move as host memory
    /// allows: what goes out lands in this process, charged to the container's memory cgroup.
    /// Chunks with a pinned buffer already hold theirs; the rest need their size, and only as much
    /// as the cgroup and the host can take goes (docs/overcommit.md, "Host memory"): the amount,
    /// possibly made partial (whole chunks, pinned ones first), or `None` (declined) when not one
    /// chunk fits. Says so in one line when it is not all.
    fn fit_to_host(&self, inner: &Inner, amount: u64, request: u64) -> Option<u64> {
        let held = inner.on_card(|_| true);
        let pinned_on_card = inner.on_card(|chunk| matches!(chunk.host, Host::Pinned(_)));
        let wanted = if amount == 0 { held } else { amount.min(held) };
        let needs = wanted.saturating_sub(pinned_on_card);
        let room = vgpu_ledger::host_memory::room();
        if needs <= room.bytes {
            return Some(amount);
        }
        let allowed = pinned_on_card + room.bytes / CHUNK as u64 * CHUNK as u64;
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

    /// Copies chunks on the card to host memory and gives each one's physical memory back as soon
    /// as its copy is done: every chunk (`amount` 0), or chunks until at least `amount` bytes have
    /// moved, those with a pinned host buffer first (they copy at the link's speed). A chunk whose
    /// copy fails stays on the card, and others are tried in its place. Returns the bytes moved.
    fn copy_out(&self, runtime: &Runtime, calls: &Calls, inner: &mut Inner, amount: u64) -> u64 {
        let Inner { blocks, streams, .. } = inner;
        // Work the application queued finishes first.
        let mut contexts: Vec<usize> = blocks.values().map(|block| block.context).collect();
        contexts.dedup();
        for &context in &contexts {
            with_context(calls, context, || {
                // SAFETY: no arguments.
                unsafe { (calls.ctx_sync)() }
            });
        }
        let mut moved = 0u64;
        // Chunks chosen so far, and bytes moved by block (for the charge).
        let mut tried: HashSet<(CUdeviceptr, usize)> = HashSet::new();
        let mut moved_of: HashMap<CUdeviceptr, u64> = HashMap::new();
        let mut failed = Failed::default();
        loop {
            let on_card = blocks.iter().flat_map(|(&address, block)| {
                block.chunks.iter().enumerate().filter(|(_, chunk)| chunk.handle != 0).map(
                    move |(index, chunk)| {
                        ((address, index), chunk.size as u64, matches!(chunk.host, Host::Pinned(_)))
                    },
                )
            });
            // What is still to move (a pass ends short only where copies failed).
            let left = if amount == 0 { 0 } else { amount - moved };
            let chosen = choose(on_card.filter(|(key, _, _)| !tried.contains(key)), left);
            if chosen.is_empty() {
                break;
            }
            tried.extend(chosen.iter().copied());
            for (&address, block) in blocks.iter_mut() {
                let bytes = self.move_chunks(runtime, calls, streams, address, block, &chosen, &mut failed);
                moved += bytes;
                *moved_of.entry(address).or_default() += bytes;
            }
            if amount == 0 || moved >= amount {
                break;
            }
        }
        if let Some(first) = failed.first {
            tracing::warn!(
                "{} chunks ({} bytes) could not be copied out and stay on the card; the first: {first}",
                failed.chunks,
                failed.bytes
            );
        }
        // NVML stops counting the chunks; the reconciliation must not read that as the driver
        // giving memory back.
        for (address, bytes) in moved_of {
            if let Some(block) = blocks.get(&address) {
                self.swapped[block.allocation.device].fetch_add(block.charged(bytes), Ordering::Relaxed);
            }
        }
        moved
    }

    /// Copies the `chosen` chunks of the block at `address` to host memory on its context's copy
    /// streams and gives each one's physical memory back once its copy is done. Returns the bytes
    /// moved; chunks that could not be copied are counted in `failed`.
    #[allow(clippy::too_many_arguments)]
    fn move_chunks(
        &self,
        runtime: &Runtime,
        calls: &Calls,
        streams: &mut HashMap<usize, [usize; STREAMS]>,
        address: CUdeviceptr,
        block: &mut Block,
        chosen: &HashSet<(CUdeviceptr, usize)>,
        failed: &mut Failed,
    ) -> u64 {
        if !(0..block.chunks.len()).any(|index| chosen.contains(&(address, index))) {
            return 0;
        }
        let device = block.allocation.device;
        let context = block.context;
        let streams = streams_of(calls, streams, context);
        let mut pending: Vec<(usize, usize)> = Vec::new(); // (chunk index, event)
        let mut moved = 0u64;
        for (index, chunk) in block.chunks.iter_mut().enumerate() {
            if chunk.handle == 0 || !chosen.contains(&(address, index)) {
                continue;
            }
            if chunk.host == Host::None {
                chunk.host = pageable(chunk.size).map_or(Host::None, Host::Pageable);
                // While out, the agent moves it into pinned memory.
                self.pinning.store(true, Ordering::Relaxed);
            }
            let (Host::Pinned(to) | Host::Pageable(to)) = chunk.host else {
                tracing::warn!(
                    "device {device}: no host memory for {} bytes; they stay on the card",
                    chunk.size
                );
                continue;
            };
            let stream = streams[index % STREAMS] as CUstream;
            let event = with_context(calls, context, || {
                let mut event: *mut c_void = std::ptr::null_mut();
                // SAFETY: the chunk is mapped; `to` holds `size` bytes; our own stream/event.
                unsafe {
                    let status = (calls.dtoh)(
                        to as *mut c_void,
                        address + chunk.offset as CUdeviceptr,
                        chunk.size,
                        stream,
                    );
                    if status != CUDA_SUCCESS {
                        return Err(("cuMemcpyDtoHAsync", status));
                    }
                    let status = (calls.event_create)(&mut event, EVENT_DISABLE_TIMING);
                    if status != CUDA_SUCCESS {
                        return Err(("cuEventCreate", status));
                    }
                    (calls.event_record)(event, stream);
                }
                Ok(event as usize)
            });
            match event {
                Ok(event) => pending.push((index, event)),
                Err((call, status)) => failed.add(device, chunk, context, call, status),
            }
        }
        for (index, event) in pending {
            let chunk = &mut block.chunks[index];
            let copied = with_context(calls, context, || {
                // SAFETY: our own event.
                unsafe {
                    let status = (calls.event_sync)(event as *mut c_void);
                    (calls.event_destroy)(event as *mut c_void);
                    status
                }
            });
            if copied != CUDA_SUCCESS {
                failed.add(device, chunk, context, "cuEventSynchronize", copied);
                continue;
            }
            unplace(calls, address, chunk);
            moved += chunk.size as u64;
            self.add(runtime, device, Word::Resident, -(chunk.size as i64));
            self.add(runtime, device, Word::Swapped, chunk.size as i64);
        }
        moved
    }

    /// One step of the agent: handles an outstanding request, else pins one chunk's host memory
    /// ahead.
    fn agent_step(&self, runtime: &Runtime) -> Next {
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

    /// Pins host memory for one chunk, outside the lock (pinning is slow), while the host keeps
    /// memory to spare: a chunk on the card with no host buffer, or, while the process is out, a
    /// chunk held in pageable memory (its bytes move into the pinned buffer, so that the next
    /// swap runs at the link's speed). A thread pinning holds the driver: it cut a neighbour
    /// thread's kernels to 1-20 % of their speed on an H100 (docs/overcommit.md, "What pinning
    /// costs"). So a process on the card is pinned for only while it is idle, or at the pace of
    /// its own waits for its kernels ([`Swap::may_pin_on_card`]).
    fn pin_one(&self, runtime: &Runtime) -> Next {
        if !self.pinning.load(Ordering::Relaxed) {
            return Next::Sleep;
        }
        let Some(calls) = calls() else { return Next::Sleep };
        let (wanted, spell) = {
            let inner = self.inner.lock();
            let out = inner.out;
            let wanted = inner.blocks.iter().find_map(|(&address, block)| {
                let chunk = block.chunks.iter().find(|chunk| match chunk.host {
                    Host::None => !out,
                    Host::Pageable(_) => out && chunk.handle == 0,
                    Host::Pinned(_) => false,
                })?;
                Some((address, chunk.offset, chunk.size, block.context))
            });
            let spell = if out || wanted.is_none() { Some(0) } else { self.may_pin_on_card() };
            (wanted, spell)
        };
        let Some((address, offset, size, context)) = wanted else {
            self.pinning.store(false, Ordering::Relaxed);
            return Next::Sleep;
        };
        // Busy: the agent looks again soon.
        let Some(spell) = spell else { return Next::Soon };
        if self.pinned(runtime).saturating_add(size as u64) > pin_cap() {
            self.pinning.store(false, Ordering::Relaxed);
            tracing::debug!("LIBVGPU_SWAP_PIN's cap is reached: later chunks swap through pageable memory");
            return Next::Sleep;
        }
        if !pin_ahead_allowed(size) {
            self.pinning.store(false, Ordering::Relaxed);
            tracing::debug!(
                "host memory is short: no more pinned ahead; later chunks swap through pageable memory"
            );
            return Next::Sleep;
        }
        if spell != 0 {
            self.wait_pins.fetch_add(1, Ordering::Relaxed);
        }
        let pinned = with_context(calls, context, || {
            let mut host: *mut c_void = std::ptr::null_mut();
            // SAFETY: a valid out-pointer.
            let status = unsafe { (calls.host_alloc)(&mut host, size, 0) };
            (status == CUDA_SUCCESS).then_some(host as usize)
        });
        let Some(pinned) = pinned else {
            self.pinning.store(false, Ordering::Relaxed);
            return Next::Sleep;
        };
        let mut inner = self.inner.lock();
        let out = inner.out;
        let chunk = inner
            .blocks
            .get_mut(&address)
            .and_then(|block| block.chunks.iter_mut().find(|chunk| chunk.offset == offset))
            .filter(|chunk| chunk.size == size);
        let taken = match chunk {
            Some(chunk) if chunk.host == Host::None && !out => {
                chunk.host = Host::Pinned(pinned);
                true
            }
            Some(chunk) if out && chunk.handle == 0 => match chunk.host {
                Host::Pageable(from) => {
                    // SAFETY: both buffers hold at least `size` bytes and are ours; the lock keeps
                    // the chunk out (a swap-in takes it first).
                    unsafe { std::ptr::copy_nonoverlapping(from as *const u8, pinned as *mut u8, size) };
                    drop_host(calls, context, &mut chunk.host);
                    chunk.host = Host::Pinned(pinned);
                    true
                }
                _ => false,
            },
            _ => false,
        };
        if taken {
            let device = inner.blocks.get(&address).map_or(0, |block| block.allocation.device);
            drop(inner);
            self.add(runtime, device, Word::Pinned, size as i64);
        } else {
            drop(inner);
            let mut host = Host::Pinned(pinned);
            drop_host(calls, context, &mut host);
        }
        Next::Now
    }
}

/// Starts this process's agent thread: it handles the arbiter's requests and pins host memory
/// ahead. It sleeps on the request word while there is nothing to do.
fn start_agent() {
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
fn choose<K: Copy + Eq + Hash>(on_card: impl Iterator<Item = (K, u64, bool)>, amount: u64) -> HashSet<K> {
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

/// Waits for the copy streams of `contexts`.
fn sync_streams(calls: &Calls, streams: &HashMap<usize, [usize; STREAMS]>, contexts: &[usize]) {
    for &context in contexts {
        let Some(streams) = streams.get(&context) else { continue };
        for &stream in streams {
            with_context(calls, context, || {
                // SAFETY: our own stream.
                unsafe { (calls.stream_sync)(stream as CUstream) }
            });
        }
    }
}

/// A swap-in's staging ring for chunks held in pageable memory. The driver copies pageable memory
/// through small buffers of its own, one copy at a time (2.5-9 GB/s on an H100, against 50 for
/// pinned memory). Here the pinned buffers of chunks already copied in serve instead: once a
/// buffer's copy has landed (its event), its bytes are no longer needed (the card holds them, and
/// the next swap-out writes the buffer again), so a pageable chunk is copied into it by several
/// threads and sent from there, while the other buffers' copies run. With no pinned buffer of the
/// chunk's context, the driver's own path is taken.
#[derive(Default)]
struct Staging {
    /// (context, event recorded after the buffer's latest copy, buffer, bytes), taken in turn.
    buffers: Vec<(usize, usize, usize, usize)>,
    next: usize,
    /// Bytes carried through the buffers.
    staged: u64,
}

impl Staging {
    /// Offers the pinned `buffer` of `size` bytes, whose copy was just queued on `stream`.
    fn offer(&mut self, calls: &Calls, context: usize, stream: CUstream, buffer: usize, size: usize) {
        if self.buffers.len() >= STAGING_BUFFERS {
            return;
        }
        let event = with_context(calls, context, || {
            let mut event: *mut c_void = std::ptr::null_mut();
            // SAFETY: a valid out-pointer; our own stream.
            unsafe {
                if (calls.event_create)(&mut event, EVENT_DISABLE_TIMING) != CUDA_SUCCESS {
                    return None;
                }
                (calls.event_record)(event, stream);
            }
            Some(event as usize)
        });
        if let Some(event) = event {
            self.buffers.push((context, event, buffer, size));
        }
    }

    /// Copies `size` bytes at pageable `source` to the card at `target` on `stream`.
    fn carry(
        &mut self,
        calls: &Calls,
        context: usize,
        stream: CUstream,
        target: CUdeviceptr,
        source: usize,
        size: usize,
    ) {
        let count = self.buffers.len();
        let found = (0..count)
            .map(|k| (self.next + k) % count)
            .find(|&k| self.buffers[k].0 == context && self.buffers[k].3 >= size);
        let Some(k) = found else {
            with_context(calls, context, || {
                // SAFETY: the chunk is mapped; `source` holds `size` bytes.
                unsafe { (calls.htod)(target, source as *const c_void, size, stream) }
            });
            return;
        };
        self.next = k + 1;
        self.staged += size as u64;
        let (_, event, buffer, _) = self.buffers[k];
        with_context(calls, context, || {
            // SAFETY: our own event; the buffer's previous copy is done once it returns, and
            // nothing else uses the buffer; `source` and `buffer` hold `size` bytes.
            unsafe {
                (calls.event_sync)(event as *mut c_void);
                copy_in_parallel(buffer as *mut u8, source as *const u8, size);
                (calls.htod)(target, buffer as *const c_void, size, stream);
                (calls.event_record)(event as *mut c_void, stream);
            }
        });
    }

    /// Destroys the events (the caller has synchronised the streams).
    fn release(&mut self, calls: &Calls) {
        for (context, event, _, _) in self.buffers.drain(..) {
            with_context(calls, context, || {
                // SAFETY: our own event, used no more.
                unsafe { (calls.event_destroy)(event as *mut c_void) }
            });
        }
        self.next = 0;
    }
}

/// Pinned buffers a swap-in's staging ring takes in turn: enough to keep the copy streams busy
/// while threads fill the next ones.
const STAGING_BUFFERS: usize = 8;

/// Threads that copy one pageable chunk into a staging buffer (one thread copies about 10 GB/s).
const STAGING_THREADS: usize = 4;

/// `memcpy` of `size` bytes by [`STAGING_THREADS`] threads (on this thread alone where one cannot
/// be started).
///
/// # Safety
/// `source` and `target` hold `size` bytes each and do not overlap.
unsafe fn copy_in_parallel(target: *mut u8, source: *const u8, size: usize) {
    let part = size.div_ceil(STAGING_THREADS);
    let (target, source) = (target as usize, source as usize);
    std::thread::scope(|scope| {
        for k in 1..STAGING_THREADS {
            let (start, end) = ((k * part).min(size), ((k + 1) * part).min(size));
            let copy = move || {
                // SAFETY: the caller's buffers; each thread copies its own part.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        (source + start) as *const u8,
                        (target + start) as *mut u8,
                        end - start,
                    )
                }
            };
            if std::thread::Builder::new().spawn_scoped(scope, copy).is_err() {
                copy();
            }
        }
        // SAFETY: as above, the first part.
        unsafe { std::ptr::copy_nonoverlapping(source as *const u8, target as *mut u8, part.min(size)) };
    });
}

/// Chunks a swap-out could not copy, said in one line at its end rather than one per chunk.
#[derive(Default)]
struct Failed {
    chunks: usize,
    bytes: u64,
    /// The first failure: the call, its status, the chunk's host memory and its context.
    first: Option<String>,
}

impl Failed {
    fn add(&mut self, device: usize, chunk: &Chunk, context: usize, call: &str, status: CUresult) {
        self.chunks += 1;
        self.bytes += chunk.size as u64;
        if self.first.is_none() {
            let host = match chunk.host {
                Host::Pinned(_) => "pinned",
                Host::Pageable(_) => "pageable",
                Host::None => "no",
            };
            self.first = Some(format!(
                "device {device}: {call} returned {status} copying {} bytes into {host} host memory (context {context:#x})",
                chunk.size
            ));
        }
    }
}

/// The copy streams of `context`, made on first use.
fn streams_of(
    calls: &Calls,
    streams: &mut HashMap<usize, [usize; STREAMS]>,
    context: usize,
) -> [usize; STREAMS] {
    *streams.entry(context).or_insert_with(|| {
        with_context(calls, context, || {
            std::array::from_fn(|_| {
                let mut stream: CUstream = std::ptr::null_mut();
                // SAFETY: a valid out-pointer. A failure leaves the NULL stream, which still works.
                unsafe { (calls.stream_create)(&mut stream, STREAM_NON_BLOCKING) };
                stream as usize
            })
        })
    })
}

/// Runs `f` with `context` current on this thread, then puts the thread's own context back.
fn with_context<T>(calls: &Calls, context: usize, f: impl FnOnce() -> T) -> T {
    let before = current_context(calls);
    if before != context {
        // SAFETY: a context of this process (or NULL).
        unsafe { (calls.ctx_set)(context as CUcontext) };
    }
    let result = f();
    if before != context {
        // SAFETY: as above.
        unsafe { (calls.ctx_set)(before as CUcontext) };
    }
    result
}

fn current_context(calls: &Calls) -> usize {
    let mut context: CUcontext = std::ptr::null_mut();
    // SAFETY: a valid out-pointer.
    unsafe { (calls.ctx_get)(&mut context) };
    context as usize
}

fn allocation_prop(device: usize) -> CUmemAllocationProp {
    CUmemAllocationProp {
        kind: ALLOCATION_PINNED,
        requested_handle_types: 0,
        location: CUmemLocation { kind: CU_MEM_LOCATION_TYPE_DEVICE, id: device as c_int },
        win32_handle_metadata: std::ptr::null_mut(),
        alloc_flags: [0; 8],
    }
}

/// The device's allocation granularity for VMM memory (at least 2 MiB).
fn granularity(calls: &Calls, device: usize) -> usize {
    let prop = allocation_prop(device);
    let mut granularity = 0usize;
    // SAFETY: valid out-pointer and properties; option 0 is the minimum granularity.
    unsafe { (calls.granularity)(&mut granularity, &prop, 0) };
    granularity.max(2 << 20)
}

/// Unmaps a chunk and gives its physical memory back to the driver.
fn unplace(calls: &Calls, address: CUdeviceptr, chunk: &mut Chunk) {
    // SAFETY: the chunk's own mapping and handle.
    unsafe {
        (calls.unmap)(address + chunk.offset as CUdeviceptr, chunk.size);
        (calls.release)(chunk.handle);
    }
    chunk.handle = 0;
}

fn drop_host(calls: &Calls, context: usize, host: &mut Host) {
    match *host {
        Host::Pinned(at) => {
            with_context(calls, context, || {
                // SAFETY: our own pinned allocation.
                unsafe { (calls.free_host)(at as *mut c_void) }
            });
        }
        Host::Pageable(at) => {
            // SAFETY: our own mapping of a chunk's size; see `pageable`.
            unsafe { libc::munmap(at as *mut c_void, CHUNK) };
        }
        Host::None => {}
    }
    *host = Host::None;
}

/// Pageable host memory for one chunk (always a whole [`CHUNK`], so that it can be unmapped
/// without its size).
fn pageable(size: usize) -> Option<usize> {
    debug_assert!(size <= CHUNK);
    // SAFETY: an anonymous private mapping; nothing else is touched.
    let at = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            CHUNK,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if at == libc::MAP_FAILED {
        return None;
    }
    // SAFETY: our own mapping; a hint.
    unsafe { libc::madvise(at, CHUNK, libc::MADV_HUGEPAGE) };
    Some(at as usize)
}

/// Whether `size` more bytes may be pinned ahead: the host keeps a tenth of its memory, and at least
/// 4 GiB, available after it (`MemAvailable` in /proc/meminfo), and the container's memory cgroup
/// a quarter of its limit, so that pinning ahead never starves the host or the container's other
/// processes. (A quarter stopped the second of two 44 GiB
/// notebooks at 21 GiB on a 125 GiB host; swapping out needs that host memory anyway, pinned or
/// not.) `LIBVGPU_SWAP_PIN` caps it further ([`pin_cap`]).
fn pin_ahead_allowed(size: usize) -> bool {
    let Ok(meminfo) = std::fs::read_to_string("/proc/meminfo") else { return false };
    let field = |name: &str| {
        meminfo
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map(|kib| kib * 1024)
    };
    let (Some(total), Some(available)) = (field("MemTotal:"), field("MemAvailable:")) else { return false };
    // A quarter of the container's memory cgroup stays free too: pinned memory cannot be reclaimed,
    // and the application's own host memory must still fit beside it.
    let cgroup = vgpu_ledger::host_memory::room().cgroup;
    available.saturating_sub(size as u64) >= (total / 10).max(4 << 30)
        && cgroup
            .is_none_or(|(limit, used)| limit.saturating_sub(used).saturating_sub(size as u64) >= limit / 4)
}

/// The most host memory this process pins ahead: `LIBVGPU_SWAP_PIN`, a size (`0` turns pinning
/// ahead off; `16g`: at most 16 GiB, so that processes sharing a host that cannot pin all of them
/// each keep a part), else no cap but the host's ([`pin_ahead_allowed`]). A value that is not a
/// size is said once and ignored.
fn pin_cap() -> u64 {
    static CAP: OnceLock<u64> = OnceLock::new();
    *CAP.get_or_init(|| {
        let Ok(value) = std::env::var("LIBVGPU_SWAP_PIN") else { return u64::MAX };
        match vgpu_ledger::config::parse_size(value.trim()) {
            Some(bytes) => bytes,
            None => {
                tracing::warn!(
                    "LIBVGPU_SWAP_PIN={value:?} is not a size (such as 0, 512m or 16g); pinning ahead is not capped"
                );
                u64::MAX
            }
        }
    })
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
