//! The simulated devices and what lives on them. Device memory is only a ledger: addresses are
//! unique numbers that must never be dereferenced.

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

use crate::abi::*;
use crate::config::Config;
use crate::counters::Counters;
use crate::timeline::Timeline;

/// What one live object costs, and where.
#[derive(Clone, Copy, Debug)]
pub struct Object {
    /// Physical device index.
    pub device: usize,
    pub bytes: u64,
    pub kind: Kind,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `hipMalloc` and every other call freed with `hipFree`/`hipFreeAsync`.
    Linear,
    /// Pinned host memory (`hipHostMalloc`): no device memory.
    Host,
    Array,
}

/// A physical allocation of `hipMemCreate`: freed when its last reference and mapping are gone.
#[derive(Clone, Copy, Debug)]
struct Physical {
    device: usize,
    bytes: u64,
    references: u32,
    mappings: u32,
}

#[derive(Default)]
struct Vmm {
    handles: HashMap<u64, Physical>,
    /// Mapped address → handle.
    mappings: HashMap<u64, u64>,
}

pub struct State {
    pub config: Config,
    counters: Counters,
    objects: Mutex<HashMap<u64, Object>>,
    vmm: Mutex<Vmm>,
    next_address: AtomicU64,
    pub timeline: Timeline,
}

thread_local! {
    /// The calling thread's current HIP ordinal.
    static CURRENT: Cell<usize> = const { Cell::new(0) };
}

/// The fake's state, or the status every call returns when the environment is unusable.
pub fn get() -> Result<&'static State, HipError> {
    static STATE: OnceLock<Result<State, HipError>> = OnceLock::new();
    STATE
        .get_or_init(|| {
            let config = Config::from_env().map_err(|bad| {
                eprintln!("fakehip: {}={:?}: unusable value", bad.var, bad.value);
                HIP_ERROR_UNKNOWN
            })?;
            let counters = match &config.shared_path {
                Some(path) => Counters::shared(path).map_err(|error| {
                    eprintln!("fakehip: FAKEGPU_SHARED={}: {error}", path.display());
                    HIP_ERROR_UNKNOWN
                })?,
                None => Counters::local(),
            };
            Ok(State {
                config,
                counters,
                objects: Mutex::default(),
                vmm: Mutex::default(),
                next_address: AtomicU64::new(0x7e00_0000_0000),
                timeline: Timeline::new(),
            })
        })
        .as_ref()
        .map_err(|&status| status)
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl State {
    pub fn device_count(&self) -> usize {
        self.config.ordinals.len()
    }

    /// The physical device of HIP ordinal `ordinal`.
    pub fn physical(&self, ordinal: i32) -> Result<usize, HipError> {
        usize::try_from(ordinal)
            .ok()
            .and_then(|i| self.config.ordinals.get(i).copied())
            .ok_or(HIP_ERROR_INVALID_DEVICE)
    }

    pub fn current(&self) -> Result<i32, HipError> {
        if self.device_count() == 0 {
            return Err(HIP_ERROR_NO_DEVICE);
        }
        Ok(CURRENT.with(Cell::get) as i32)
    }

    pub fn set_current(&self, ordinal: i32) -> Result<(), HipError> {
        self.physical(ordinal)?;
        CURRENT.with(|current| current.set(ordinal as usize));
        Ok(())
    }

    pub fn current_physical(&self) -> Result<usize, HipError> {
        self.physical(self.current()?)
    }

    pub fn uuid(&self, ordinal: i32) -> Result<[u8; 16], HipError> {
        Ok(self.config.uuids[self.physical(ordinal)?])
    }

    /// (free, total) of a HIP ordinal.
    pub fn memory(&self, ordinal: i32) -> Result<(u64, u64), HipError> {
        let device = self.physical(ordinal)?;
        let total = self.config.memory;
        Ok((total.saturating_sub(self.counters.used(device)), total))
    }

    pub fn current_memory(&self) -> Result<(u64, u64), HipError> {
        self.memory(self.current()?)
    }

    /// A fresh address range of `bytes`, never handed out before in this process.
    fn address(&self, bytes: u64) -> u64 {
        let span = bytes.max(1).div_ceil(4096).saturating_add(1).saturating_mul(4096);
        self.next_address.fetch_add(span, Ordering::Relaxed)
    }

    /// Charges `bytes` on `device` (physical) and returns the new object's address.
    fn create(&self, device: usize, bytes: u64, kind: Kind) -> Result<u64, HipError> {
        if kind != Kind::Host && !self.counters.allocate(device, bytes, self.config.memory) {
            return Err(HIP_ERROR_OUT_OF_MEMORY);
        }
        let address = self.address(bytes);
        lock(&self.objects).insert(address, Object { device, bytes, kind });
        Ok(address)
    }

    /// Device memory on the current device; size 0 gives NULL, as the runtime does.
    pub fn allocate(&self, bytes: u64) -> Result<u64, HipError> {
        let device = self.current_physical()?;
        if bytes == 0 {
            return Ok(0);
        }
        self.create(device, bytes, Kind::Linear)
    }

    pub fn host_allocate(&self, bytes: u64) -> Result<u64, HipError> {
        self.create(0, bytes, Kind::Host)
    }

    pub fn array(&self, bytes: u64) -> Result<u64, HipError> {
        let device = self.current_physical()?;
        self.create(device, bytes.max(1), Kind::Array)
    }

    /// Frees an object of `kind`; NULL is a no-op for linear memory.
    pub fn free(&self, address: u64, kind: Kind) -> Result<(), HipError> {
        if address == 0 && kind == Kind::Linear {
            return Ok(());
        }
        let mut objects = lock(&self.objects);
        match objects.get(&address) {
            Some(object) if object.kind == kind => {
                let object = *object;
                objects.remove(&address);
                drop(objects);
                if kind != Kind::Host {
                    self.counters.free(object.device, object.bytes);
                }
                Ok(())
            }
            _ if kind == Kind::Array => Err(HIP_ERROR_INVALID_HANDLE),
            _ => Err(HIP_ERROR_INVALID_VALUE),
        }
    }

    /// `hipMemCreate` on HIP ordinal `ordinal`.
    pub fn mem_create(&self, ordinal: i32, bytes: u64) -> Result<u64, HipError> {
        let device = self.physical(ordinal)?;
        if bytes == 0 {
            return Err(HIP_ERROR_INVALID_VALUE);
        }
        if !self.counters.allocate(device, bytes, self.config.memory) {
            return Err(HIP_ERROR_OUT_OF_MEMORY);
        }
        let handle = self.address(0);
        lock(&self.vmm).handles.insert(handle, Physical { device, bytes, references: 1, mappings: 0 });
        Ok(handle)
    }

    /// Applies `change` to `handle`'s counts, freeing its memory when nothing keeps it.
    fn vmm_update(
        &self,
        vmm: &mut Vmm,
        handle: u64,
        change: impl FnOnce(&mut Physical),
    ) -> Result<(), HipError> {
        let physical = vmm.handles.get_mut(&handle).ok_or(HIP_ERROR_INVALID_VALUE)?;
        change(physical);
        if physical.references == 0 && physical.mappings == 0 {
            let physical = *physical;
            vmm.handles.remove(&handle);
            self.counters.free(physical.device, physical.bytes);
        }
        Ok(())
    }

    pub fn mem_release(&self, handle: u64) -> Result<(), HipError> {
        let mut vmm = lock(&self.vmm);
        match vmm.handles.get(&handle) {
            Some(physical) if physical.references > 0 => {}
            _ => return Err(HIP_ERROR_INVALID_VALUE),
        }
        self.vmm_update(&mut vmm, handle, |physical| physical.references -= 1)
    }

    pub fn mem_map(&self, address: u64, handle: u64) -> Result<(), HipError> {
        let mut vmm = lock(&self.vmm);
        if address == 0 || vmm.mappings.contains_key(&address) {
            return Err(HIP_ERROR_INVALID_VALUE);
        }
        self.vmm_update(&mut vmm, handle, |physical| physical.mappings += 1)?;
        vmm.mappings.insert(address, handle);
        Ok(())
    }

    pub fn mem_unmap(&self, address: u64) -> Result<(), HipError> {
        let mut vmm = lock(&self.vmm);
        let handle = vmm.mappings.remove(&address).ok_or(HIP_ERROR_INVALID_VALUE)?;
        self.vmm_update(&mut vmm, handle, |physical| physical.mappings -= 1)
    }

    /// The handle mapped at `address`, with one more reference.
    pub fn retain(&self, address: u64) -> Result<u64, HipError> {
        let mut vmm = lock(&self.vmm);
        let handle = *vmm.mappings.get(&address).ok_or(HIP_ERROR_INVALID_VALUE)?;
        self.vmm_update(&mut vmm, handle, |physical| physical.references += 1)?;
        Ok(handle)
    }

    /// `hipDeviceReset`: frees everything on physical device `device` (VMM handles included).
    pub fn reset(&self, device: usize) {
        lock(&self.objects).retain(|_, object| {
            let doomed = object.device == device && object.kind != Kind::Host;
            if doomed {
                self.counters.free(device, object.bytes);
            }
            !doomed
        });
        let mut vmm = lock(&self.vmm);
        let Vmm { handles, mappings } = &mut *vmm;
        handles.retain(|_, physical| {
            let doomed = physical.device == device;
            if doomed {
                self.counters.free(device, physical.bytes);
            }
            !doomed
        });
        mappings.retain(|_, handle| handles.contains_key(handle));
    }

    /// The fake's own counters for physical device `device`: (used, peak, allocation calls).
    pub fn stats(&self, device: usize) -> Option<(u64, u64, u64)> {
        (device < self.config.device_count).then(|| {
            (self.counters.used(device), self.counters.peak(device), self.counters.alloc_calls(device))
        })
    }
}
