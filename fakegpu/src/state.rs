//! The fake driver's process-wide state: configuration, the ledger, every object the fake created and
//! the simulated timeline (in one registry behind one lock), and the init flag.

use std::ffi::c_void;
use std::fmt;
use std::io::{self, Write};
use std::mem::size_of;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};

use crate::config::{BadVar, Config, MAX_DEVICES};
use crate::contexts::Contexts;
use crate::devices;
use crate::events::Events;
use crate::ledger::Ledger;
use crate::memory::AddressSpace;
use crate::memory::arrays::Arrays;
use crate::memory::graphs::Graphs;
use crate::memory::host::HostMemory;
use crate::memory::ipc::IpcMappings;
use crate::memory::modules::Modules;
use crate::memory::pools::Pools;
use crate::memory::vmm::Vmm;
use crate::processes::{self, OwnSlot, ProcessSlot};
use crate::timeline::Timeline;

/// Why the fake could not start; printed once to stderr.
#[derive(Debug)]
pub enum SetupError {
    BadVar(BadVar),
    SharedFile { path: PathBuf, error: io::Error },
}

impl fmt::Display for SetupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SetupError::BadVar(bad) => write!(f, "{bad}"),
            SetupError::SharedFile { path, error } => {
                write!(f, "FAKEGPU_SHARED={}: {error}", path.display())
            }
        }
    }
}

/// Why the fake refused a request; the CUDA shims turn each into the driver's code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// A malformed argument: NULL, zero size, unknown flags, misalignment, a range that does not fit.
    BadArgument,
    /// A handle or pointer the fake never handed out, or already took back.
    Unknown,
    /// The device (or an address range) has no room.
    OutOfMemory,
    /// A CUDA ordinal that names no visible device.
    BadDevice,
    /// The calling thread has no current context, or the handle is not a context.
    NoContext,
    /// The calling thread's current context was destroyed (by another thread).
    ContextDestroyed,
    /// Host memory that is already page-locked (registered, or allocated by the driver).
    AlreadyRegistered,
    /// `cuMemHostUnregister` of memory that was never registered.
    NotRegistered,
    /// A kernel or event handle the fake never handed out (or already took back), or an event that
    /// cannot be timed: the driver's INVALID_HANDLE.
    BadHandle,
    /// An event whose work has not finished yet.
    NotReady,
}

/// Every object the fake created, guarded by one lock.
pub struct Registry {
    pub space: AddressSpace,
    pub pools: Pools,
    pub vmm: Vmm,
    pub arrays: Arrays,
    pub modules: Modules,
    pub graphs: Graphs,
    pub host: HostMemory,
    pub ipc: IpcMappings,
    pub contexts: Contexts,
    pub timeline: Timeline,
    pub events: Events,
}

/// The simulated driver.
pub struct Fake {
    pub device_count: usize,
    /// Bytes per device.
    pub memory: u64,
    /// Bytes each context costs its device.
    pub context_memory: u64,
    /// What a green context costs (`FAKEGPU_GREEN_CONTEXT_MEMORY`).
    pub green_context_memory: u64,
    /// What each loaded module or library costs (`FAKEGPU_MODULE_MEMORY`).
    pub module_memory: u64,
    /// Bytes this process holds on each physical device, whatever holds them (what NVML's
    /// per-process figure reports for it).
    own: [AtomicU64; MAX_DEVICES],
    /// Contexts this process holds per physical device, mirrored from the registry.
    contexts_here: [AtomicU32; MAX_DEVICES],
    /// Graphics memory this process holds per physical device (`fakegpu_graphics_alloc`).
    graphics: [AtomicU64; MAX_DEVICES],
    /// This process's slot in the process table NVML lists.
    slot: OwnSlot,
    /// How long creating a context takes, after its memory is charged.
    pub context_delay: std::time::Duration,
    /// NVML's lists name this process from this instant on (`FAKEGPU_NVML_HIDES_SELF_MS`);
    /// `None`: never.
    nvml_shows_self: Option<std::time::Instant>,
    /// Simulated nanoseconds per MiB of a device-side copy or memset.
    pub copy_ns_per_mib: u64,
    /// Host nanoseconds a launch spends before its work is queued (`FAKEGPU_LAUNCH_HOST_NS`).
    pub launch_host_ns: u64,
    /// Whether contexts run under a (simulated) MPS server (`FAKEGPU_MPS`).
    pub mps: bool,
    /// Under MPS, the percentage of each device's SMs this process's contexts may use unless a
    /// context was created with an execution affinity (`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`).
    pub mps_thread_percent: Option<u32>,
    /// CUDA ordinal → physical index.
    pub ordinals: Vec<usize>,
    /// Physical index → UUID (`FAKEGPU_UUIDS`, else the default).
    uuids: Vec<[u8; 16]>,
    pub ledger: Ledger,
    registry: Mutex<Registry>,
}

static FAKE: OnceLock<Result<Fake, SetupError>> = OnceLock::new();
static CUDA_READY: AtomicBool = AtomicBool::new(false);

/// The fake, configured from the environment on first use.
pub fn fake() -> Result<&'static Fake, &'static SetupError> {
    FAKE.get_or_init(|| {
        let fake = Fake::from_env();
        if let Err(error) = &fake {
            let _ = writeln!(io::stderr(), "fakegpu: {error}");
        }
        fake
    })
    .as_ref()
}

pub fn mark_cuda_ready() {
    CUDA_READY.store(true, Ordering::Release);
}

/// The fake, once `cuInit` has succeeded.
pub fn cuda_fake() -> Option<&'static Fake> {
    if CUDA_READY.load(Ordering::Acquire) { fake().ok() } else { None }
}

impl Fake {
    fn from_env() -> Result<Fake, SetupError> {
        let config = Config::from_env().map_err(SetupError::BadVar)?;
        let ledger = match &config.shared_path {
            None => Ledger::local(config.preempt),
            Some(path) => Ledger::shared(path, config.preempt)
                .map_err(|error| SetupError::SharedFile { path: path.clone(), error })?,
        };
        let timeline = Timeline::new(&ledger, config.device_count);
        Ok(Fake {
            device_count: config.device_count,
            memory: config.memory,
            context_memory: config.context_memory,
            green_context_memory: config.green_context_memory,
            module_memory: config.module_memory,
            own: Default::default(),
            contexts_here: Default::default(),
            graphics: Default::default(),
            slot: OwnSlot::new(),
            context_delay: config.context_delay,
            nvml_shows_self: std::time::Instant::now().checked_add(config.nvml_hides_self),
            copy_ns_per_mib: config.copy_ns_per_mib,
            launch_host_ns: config.launch_host_ns,
            mps: config.mps,
            mps_thread_percent: config.mps_thread_percent,
            ordinals: devices::cuda_ordinals(&config),
            uuids: devices::uuids(&config),
            ledger,
            registry: Mutex::new(Registry {
                space: AddressSpace::new(),
                pools: Pools::new(),
                vmm: Vmm::new(),
                arrays: Arrays::new(),
                modules: Modules::new(),
                graphs: Graphs::new(),
                host: HostMemory::new(),
                ipc: IpcMappings::new(),
                contexts: Contexts::new(),
                timeline,
                events: Events::new(),
            }),
        })
    }

    /// Whether NVML's process lists name this process yet.
    pub fn nvml_shows_self(&self) -> bool {
        self.nvml_shows_self.is_some_and(|from| std::time::Instant::now() >= from)
    }

    /// The physical index behind a CUDA ordinal.
    pub fn physical(&self, ordinal: usize) -> Option<usize> {
        self.ordinals.get(ordinal).copied()
    }

    /// The physical index behind a CUDA ordinal passed as a `CUdevice`.
    pub fn device(&self, ordinal: i32) -> Result<usize, Refusal> {
        usize::try_from(ordinal).ok().and_then(|ordinal| self.physical(ordinal)).ok_or(Refusal::BadDevice)
    }

    /// The UUID of physical device `index`.
    pub fn uuid(&self, index: usize) -> [u8; 16] {
        // Callers pass a checked physical index; the fallback only keeps a bug from panicking in C.
        self.uuids.get(index).copied().unwrap_or_else(|| devices::default_uuid(index))
    }

    /// Charges `size` bytes to physical `device`, unless that would take it past its memory.
    pub fn charge(&self, device: usize, size: u64) -> Result<(), Refusal> {
        self.ledger.reserve(device, size, self.memory).then_some(()).ok_or(Refusal::OutOfMemory)?;
        if let Some(own) = self.own.get(device) {
            // The slot first: one claimed now starts from the bytes counted before this charge.
            let slot = self.slot();
            own.fetch_add(size, Ordering::Relaxed);
            if let Some(slot) = slot {
                slot.add(device, size);
            }
        }
        Ok(())
    }

    /// This process's slot in the process table (claimed on first use); `None` if the table is full.
    fn slot(&self) -> Option<&'static ProcessSlot> {
        self.slot.get(self.ledger.processes, &self.own)
    }

    /// The processes on physical `device` in `list`, as this process sees them.
    pub fn listed(&self, device: usize, list: processes::List) -> Vec<processes::Listed> {
        processes::list(self.ledger.processes, device, list)
    }

    /// Takes `size` bytes of physical `device` as graphics memory (what OpenGL or a codec takes:
    /// no allocation call returns it), or gives `size` back with `take` false.
    pub fn graphics(&self, device: usize, size: u64, take: bool) -> Result<(), Refusal> {
        let held = self.graphics.get(device).ok_or(Refusal::BadDevice)?;
        if take {
            self.charge(device, size)?;
            held.fetch_add(size, Ordering::Relaxed);
        } else {
            let before = held.load(Ordering::Relaxed);
            if size > before {
                return Err(Refusal::BadArgument);
            }
            held.fetch_sub(size, Ordering::Relaxed);
            self.credit(device, size);
        }
        if let Some(slot) = self.slot() {
            slot.set_graphics(device, held.load(Ordering::Relaxed) > 0);
        }
        Ok(())
    }

    /// Gives `size` bytes back to physical `device`.
    pub fn credit(&self, device: usize, size: u64) {
        if size > 0 {
            self.ledger.release(device, size);
            if let Some(own) = self.own.get(device) {
                let slot = self.slot();
                let _ = own
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |now| Some(now.saturating_sub(size)));
                if let Some(slot) = slot {
                    slot.take(device, size);
                }
            }
        }
    }

    /// Records how many contexts this process holds on physical `device` (under the registry's
    /// lock), for readers that must not take it.
    pub fn note_contexts(&self, device: usize, count: u32) {
        if let Some(here) = self.contexts_here.get(device) {
            here.store(count, Ordering::Relaxed);
            if let Some(slot) = self.slot() {
                slot.set_context(device, count > 0);
            }
        }
    }

    /// Whether this process holds a context on physical `device`, read without any lock.
    pub fn holds_context(&self, device: usize) -> bool {
        self.contexts_here.get(device).is_some_and(|here| here.load(Ordering::Relaxed) > 0)
    }

    /// Bytes this process holds on physical `device`.
    pub fn own_bytes(&self, device: usize) -> u64 {
        self.own.get(device).map_or(0, |own| own.load(Ordering::Relaxed))
    }

    pub fn lock(&self) -> MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A static per-device record whose address serves as an opaque handle (`CUcontext`, `nvmlDevice_t`).
#[repr(C)]
struct Tag {
    kind: u32,
    index: u32,
}

pub struct Handles([Tag; MAX_DEVICES]);

impl Handles {
    /// `kind` keeps different handle tables from being merged into one address.
    pub const fn new(kind: u32) -> Handles {
        let mut tags = [const { Tag { kind: 0, index: 0 } }; MAX_DEVICES];
        let mut i = 0;
        while i < MAX_DEVICES {
            tags[i] = Tag { kind, index: i as u32 };
            i += 1;
        }
        Handles(tags)
    }

    pub fn handle(&self, index: usize) -> *mut c_void {
        self.0.get(index).map_or(std::ptr::null_mut(), |tag| (tag as *const Tag).cast_mut().cast())
    }

    /// Which of the first `count` handles `handle` is, judged by address alone (never dereferenced).
    pub fn index(&self, handle: *const c_void, count: usize) -> Option<usize> {
        let offset = (handle as usize).wrapping_sub(self.0.as_ptr() as usize);
        let index = offset / size_of::<Tag>();
        (offset.is_multiple_of(size_of::<Tag>()) && index < count.min(MAX_DEVICES)).then_some(index)
    }
}

/// Primary context handles, by CUDA ordinal.
pub static CONTEXTS: Handles = Handles::new(u32::from_be_bytes(*b"CTX0"));
