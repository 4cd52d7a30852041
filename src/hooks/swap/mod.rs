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
//!
//! This file holds what the swap keeps (blocks of chunks, the gate's counters, the process's
//! record); each of the others one job: [`gate`] (the calls that pass it), [`requests`] (the
//! arbiter's requests, the record, the swap-out that answers, the agent thread), [`chunks`]
//! (making, placing, freeing and copying the chunks), [`host`] (host buffers, pinned ahead or
//! pageable), [`ring`] (the pinned ring pageable chunks move through), [`staging`] (the swap-in's
//! side of it), [`copier`] (the threads that copy a chunk between pageable and pinned memory),
//! [`vmm`] (the application's own VMM memory), [`ordered`] (stream-ordered allocation from the
//! default pool) and [`ranges`] (the driver's answers about an address).

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

mod chunks;
mod copier;
mod gate;
mod host;
mod ordered;
mod ranges;
mod requests;
mod ring;
mod staging;
mod vmm;

use chunks::*;
use copier::*;
use host::*;
use requests::*;
use staging::*;

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
/// How long a new allocation waits for room before falling back to managed memory, unless
/// `LIBVGPU_SWAP_PATIENCE_MS` says otherwise ([`patience_ns`]).
const ALLOCATION_PATIENCE_NS: u64 = 30_000_000_000;
/// After a new allocation's wait for room ran out, how long this process's later allocations on
/// that device fall back at once instead of waiting again: nobody could make room a moment ago
/// (every process on the card busy, or its container's host memory full: on an H200 a notebook
/// beside one that could only decline started after 95 s, about three times the patience).
const NO_ROOM_MEMORY_NS: u64 = 10_000_000_000;
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
#[derive(Clone, Copy, Debug)]
pub struct AccessDesc {
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
    event_query: EventUse,
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
                event_query: resolve!(EventUse, c"cuEventQuery"),
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
    /// Pageable, made ahead while the process is idle or at the chunk's first swap-out, and kept,
    /// its pages left for the kernel to take back while the chunk is on the card
    /// ([`host::keep`]), until it is pinned ahead or freed.
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
    origin: Origin,
}

/// Copy streams, and the pinned ring's buffers ([`ring`]), by context.
type Streams = HashMap<usize, [usize; STREAMS]>;
type Rings = HashMap<usize, Vec<usize>>;

/// What a swap-out moved: bytes, and of them those that went through the pinned ring ([`ring`]).
#[derive(Clone, Copy, Debug, Default)]
struct Moved {
    bytes: u64,
    ringed: u64,
    /// Of them, bytes that went into pageable buffers made before this swap: kept from an earlier
    /// one ([`host::keep`]) or faulted in ahead.
    kept: u64,
}

/// Whose address range and physical memory a block is.
#[derive(Debug)]
enum Origin {
    /// `cuMemAlloc`'s, or with `ordered` a stream-ordered allocation's ([`ordered`]): our
    /// reservation, chunks of [`CHUNK`] bytes, read-write for its device; `size` is what the
    /// application asked for (the allocation's size to the driver's range queries, [`ranges`]).
    Ours { size: usize, ordered: bool },
    /// The application's own VMM ([`vmm`]): its reservation, one chunk that is the whole of its
    /// handle `handle`, made again with its properties and given the access it last set. One that
    /// `stays` is mapped elsewhere too, or exported: it never leaves the card.
    Application { handle: CUmemGenericAllocationHandle, props: Props, access: Vec<AccessDesc>, stays: bool },
}

/// What a `cuMemCreate` asked for (`CUmemAllocationProp` without its Windows-only pointer), to make
/// the memory again.
#[derive(Clone, Copy, Debug)]
struct Props {
    kind: c_int,
    requested_handle_types: c_int,
    location: CUmemLocation,
    alloc_flags: [u8; 8],
}

impl Props {
    fn of(prop: &CUmemAllocationProp) -> Props {
        Props {
            kind: prop.kind,
            requested_handle_types: prop.requested_handle_types,
            location: prop.location,
            alloc_flags: prop.alloc_flags,
        }
    }

    fn prop(&self) -> CUmemAllocationProp {
        CUmemAllocationProp {
            kind: self.kind,
            requested_handle_types: self.requested_handle_types,
            location: self.location,
            win32_handle_metadata: std::ptr::null_mut(),
            alloc_flags: self.alloc_flags,
        }
    }
}

/// One of the application's `cuMemCreate` handles, as the swap gave it ([`vmm`]).
#[derive(Debug)]
struct ApplicationHandle {
    device: usize,
    size: usize,
    props: Props,
    /// What its creation was charged.
    allocation: Allocation,
    /// The driver's handle while no block holds it (0 while a block does: its chunk has it).
    real: CUmemGenericAllocationHandle,
    /// Where it is mapped whole, as a block.
    block: Option<CUdeviceptr>,
    /// Its other mappings (in part, or a second one), and whether it was exported: either keeps it
    /// on the card.
    other_mappings: u32,
    exported: bool,
}

impl Block {
    /// Whether a swap-out may move it.
    fn swappable(&self) -> bool {
        !matches!(self.origin, Origin::Application { stays: true, .. })
    }

    /// It stays on the card from now on; true if it did not before.
    fn stay(&mut self) -> bool {
        match &mut self.origin {
            Origin::Application { stays, .. } if !*stays => {
                *stays = true;
                true
            }
            _ => false,
        }
    }

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
    /// The pinned ring's buffers by context ([`ring`]).
    rings: Rings,
    /// The application's VMM handles ([`vmm`]), and the number of the last one given.
    handles: HashMap<CUmemGenericAllocationHandle, ApplicationHandle>,
    last_handle: u64,
    /// Blocks freed in stream order and kept for reuse, oldest first, and events to record such
    /// frees with, by context ([`ordered`]).
    kept: Vec<ordered::Kept>,
    spare_events: Vec<(usize, usize)>,
    /// The high-water marks of the swap's own pool by device, as the default pool's statistics
    /// show them ([`ordered`]).
    own_pool_high: [ordered::High; MAX_DEVICES],
}

impl Inner {
    /// Bytes of the application's handles on `device` that cannot leave the card: a block that
    /// stays, or a handle mapped only in part.
    fn unswappable(&self, device: usize) -> u64 {
        let stays = |record: &ApplicationHandle| match record.block {
            Some(at) => self.blocks.get(&at).is_some_and(|block| !block.swappable()),
            None => record.other_mappings > 0,
        };
        self.handles
            .values()
            .filter(|record| record.device == device && stays(record))
            .map(|r| r.size as u64)
            .sum()
    }

    /// The driver's handle behind the application's `handle` (0 while it is off the card).
    fn real_of(&self, handle: CUmemGenericAllocationHandle) -> Option<CUmemGenericAllocationHandle> {
        let record = self.handles.get(&handle)?;
        match record.block {
            Some(at) => self.blocks.get(&at).and_then(|block| block.chunks.first()).map(|chunk| chunk.handle),
            None => Some(record.real),
        }
    }

    /// Bytes of the swappable chunks on the card that `which` takes.
    fn on_card(&self, which: impl Fn(&Chunk) -> bool) -> u64 {
        self.on_card_bytes(|chunk| if which(chunk) { chunk.size as u64 } else { 0 })
    }

    /// The chunk at `offset` of the block at `address`, if it is still there with `size` bytes
    /// (looked up again after the lock was let go).
    fn chunk_mut(&mut self, address: CUdeviceptr, offset: usize, size: usize) -> Option<&mut Chunk> {
        self.blocks
            .get_mut(&address)
            .and_then(|block| block.chunks.iter_mut().find(|chunk| chunk.offset == offset))
            .filter(|chunk| chunk.size == size)
    }

    /// The sum of `bytes` over the swappable chunks on the card.
    fn on_card_bytes(&self, bytes: impl Fn(&Chunk) -> u64) -> u64 {
        self.blocks
            .values()
            .filter(|block| block.swappable())
            .flat_map(|block| &block.chunks)
            .filter(|chunk| chunk.handle != 0)
            .map(bytes)
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
    /// Bytes this process's stream-ordered pools of the driver hold, by device (`hooks/pools.rs`):
    /// memory the swap cannot move ([`ordered`] serves what it can from its own pool instead).
    pooled: [AtomicU64; MAX_DEVICES],
    last_active: AtomicU64,
    /// Host memory may still be pinned ahead.
    pinning: AtomicBool,
    /// Threads waiting for the process's own work now ([`Swap::waiting`]), when the current spell
    /// of waiting began (0: none), and the chunks pinned during it.
    waits: AtomicU64,
    wait_started: AtomicU64,
    wait_pins: AtomicU64,
    /// When a new allocation's wait for room last ran out, by device (0: never, or room came since).
    no_room_at: [AtomicU64; MAX_DEVICES],
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
            pooled: std::array::from_fn(|_| AtomicU64::new(0)),
            last_active: AtomicU64::new(0),
            pinning: AtomicBool::new(true),
            waits: AtomicU64::new(0),
            wait_started: AtomicU64::new(0),
            wait_pins: AtomicU64::new(0),
            no_room_at: std::array::from_fn(|_| AtomicU64::new(0)),
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
