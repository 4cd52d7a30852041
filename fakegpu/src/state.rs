//! The fake driver's process-wide state: devices, ledger, live allocations, contexts and init flags.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::ffi::c_void;
use std::fmt;
use std::io::{self, Write};
use std::mem::size_of;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};

use crate::config::{BadVar, Config, MAX_DEVICES};
use crate::devices;
use crate::ledger::Ledger;

/// Device pointers are aligned like the real driver's smallest allocation granularity.
const ALIGN: u64 = 512;
/// Addresses handed out by the 32-bit v1 ABI (`cuMemAlloc`); reused once freed.
const NARROW: Range<u64> = 0x10_0000..0x1_0000_0000;
/// First address handed out by `cuMemAlloc_v2`; never reused.
const WIDE_BASE: u64 = 1 << 40;

/// Which ABI asked for a device pointer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Width {
    Bits32,
    Bits64,
}

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

struct Allocation {
    device: usize,
    size: u64,
    span: u64,
}

struct Allocations {
    live: BTreeMap<u64, Allocation>,
    next_wide: u64,
}

impl Allocations {
    /// Picks an address for `size` bytes: bump allocation for 64-bit, first fit below 4 GiB for 32-bit.
    fn place(&mut self, size: u64, width: Width) -> Option<(u64, u64)> {
        let span = size.checked_next_multiple_of(ALIGN)?;
        match width {
            Width::Bits64 => {
                let address = self.next_wide;
                self.next_wide = address.checked_add(span)?;
                Some((address, span))
            }
            Width::Bits32 => {
                let mut candidate = NARROW.start;
                for (&start, allocation) in self.live.range(NARROW) {
                    if start - candidate >= span {
                        break;
                    }
                    candidate = start + allocation.span;
                }
                (NARROW.end - candidate >= span).then_some((candidate, span))
            }
        }
    }
}

/// The simulated driver.
pub struct Fake {
    pub device_count: usize,
    /// Bytes per device.
    pub memory: u64,
    /// CUDA ordinal → physical index.
    pub ordinals: Vec<usize>,
    pub ledger: Ledger,
    allocations: Mutex<Allocations>,
    /// Primary context reference counts, by CUDA ordinal.
    primary_refs: [AtomicU32; MAX_DEVICES],
}

static FAKE: OnceLock<Result<Fake, SetupError>> = OnceLock::new();
static CUDA_READY: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// The calling thread's current context, as a CUDA ordinal.
    static CURRENT: Cell<Option<usize>> = const { Cell::new(None) };
}

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

pub fn current_ordinal() -> Option<usize> {
    CURRENT.try_with(Cell::get).ok().flatten()
}

pub fn set_current_ordinal(ordinal: Option<usize>) {
    let _ = CURRENT.try_with(|current| current.set(ordinal));
}

impl Fake {
    fn from_env() -> Result<Fake, SetupError> {
        let config = Config::from_env().map_err(SetupError::BadVar)?;
        let ledger = match &config.shared_path {
            None => Ledger::local(),
            Some(path) => {
                Ledger::shared(path).map_err(|error| SetupError::SharedFile { path: path.clone(), error })?
            }
        };
        Ok(Fake {
            device_count: config.device_count,
            memory: config.memory,
            ordinals: devices::cuda_ordinals(&config),
            ledger,
            allocations: Mutex::new(Allocations { live: BTreeMap::new(), next_wide: WIDE_BASE }),
            primary_refs: [const { AtomicU32::new(0) }; MAX_DEVICES],
        })
    }

    /// The physical index behind a CUDA ordinal.
    pub fn physical(&self, ordinal: usize) -> Option<usize> {
        self.ordinals.get(ordinal).copied()
    }

    pub fn retain_primary(&self, ordinal: usize) {
        self.primary_refs[ordinal].fetch_add(1, Ordering::AcqRel);
    }

    /// Drops one reference; false when the primary context was not retained.
    pub fn release_primary(&self, ordinal: usize) -> bool {
        self.primary_refs[ordinal]
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |refs| refs.checked_sub(1))
            .is_ok()
    }

    /// Reserves `size` (> 0) bytes on physical `device` and returns a fresh address, or `None` when
    /// the device (or the address range of that width) is full.
    pub fn allocate(&self, device: usize, size: u64, width: Width) -> Option<u64> {
        if !self.ledger.reserve(device, size, self.memory) {
            return None;
        }
        let mut allocations = self.lock();
        let Some((address, span)) = allocations.place(size, width) else {
            drop(allocations);
            self.ledger.release(device, size);
            return None;
        };
        allocations.live.insert(address, Allocation { device, size, span });
        Some(address)
    }

    /// Releases a live allocation; false for an address we did not hand out.
    pub fn free(&self, address: u64) -> bool {
        let Some(allocation) = self.lock().live.remove(&address) else {
            return false;
        };
        self.ledger.release(allocation.device, allocation.size);
        true
    }

    fn lock(&self) -> MutexGuard<'_, Allocations> {
        self.allocations.lock().unwrap_or_else(PoisonError::into_inner)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn narrow_addresses_fit_and_refill_gaps() {
        let mut allocations = Allocations { live: BTreeMap::new(), next_wide: WIDE_BASE };
        let take = |allocations: &mut Allocations, size| {
            let (address, span) = allocations.place(size, Width::Bits32)?;
            allocations.live.insert(address, Allocation { device: 0, size, span });
            Some(address)
        };
        let a = take(&mut allocations, 1).expect("room");
        let b = take(&mut allocations, 1000).expect("room");
        assert_eq!((a, b), (NARROW.start, NARROW.start + 512));
        allocations.live.remove(&a);
        assert_eq!(take(&mut allocations, 512), Some(a));
        assert_eq!(take(&mut allocations, 513), Some(b + 1024));
        assert!(take(&mut allocations, 1 << 32).is_none());
        assert_eq!(allocations.place(10, Width::Bits64), Some((WIDE_BASE, 512)));
    }
}
