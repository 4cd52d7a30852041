//! libvgpu's lifecycle: set up lazily on the first hooked call, never in an ELF constructor.
//!
//! States: uninitialised → initialising (on one thread) → ready. A hook that re-enters while its
//! own thread is initialising gets `None` and answers [`HookError::NotReady`] instead of
//! deadlocking on the `OnceLock`.

use std::cell::Cell;
use std::sync::OnceLock;

use crate::compute::Limiter;
use crate::config::Config;
use crate::driver;
use crate::error::HookError;
use crate::hooks::context::PrimaryTable;
use crate::hooks::driver_memory::DriverMemory;
use crate::hooks::graphs::GraphTable;
use crate::hooks::overcommit::SpillTable;
use crate::hooks::pools::PoolTable;
use crate::hooks::swap::Swap;
use crate::hooks::vmm::VmmTable;
use crate::ledger::{AllocationTable, Ledger, Owner};
use crate::logging;

/// Process-wide state shared by every hook.
pub struct Runtime {
    pub config: Config,
    ledger: OnceLock<&'static dyn Ledger>,
    /// Charged device pointers (linear, pitched, managed, stream-ordered allocations).
    pub allocations: AllocationTable,
    /// Charged `cuMemCreate` handles, their references and mappings.
    pub vmm: VmmTable,
    /// Stream-ordered pools and the pointers they handed out.
    pub pools: PoolTable,
    /// Instantiated graphs whose memory nodes are charged.
    pub graphs: GraphTable,
    /// Spillable (overcommitted) allocations, and when this process last launched work.
    pub spill: SpillTable,
    /// Swappable (VMM) allocations of overcommitted devices under a swap arbiter, and the gate.
    pub swap: Swap,
    /// Charged arrays and mipmapped arrays.
    pub arrays: AllocationTable,
    /// Charged contexts from `cuCtxCreate`.
    pub contexts: AllocationTable,
    /// Primary contexts, by device.
    pub primary: PrimaryTable,
    /// The compute limiter; `None` when no device has a compute share.
    pub compute: Option<Limiter>,
    /// What the driver holds for this process beyond its allocations, charged after the fact.
    pub driver_memory: DriverMemory,
}

impl Runtime {
    /// The ledger, attached on first use: the shared region needs the driver's device UUIDs, so
    /// it waits for the first call that counts memory.
    pub fn ledger(&self) -> &dyn Ledger {
        *self.ledger.get_or_init(|| {
            // The region names devices as NVML spells them: HAMi's monitor looks them up there.
            let ledger = crate::ledger::attach(&self.config, || {
                let nvml = driver::nvml();
                driver::cuda_device_uuids()
                    .iter()
                    .map(|uuid| nvml.spelling_of(uuid).as_bytes().to_vec())
                    .collect()
            });
            crate::compute::mps::report(ledger);
            ledger
        })
    }

    /// Reserves `bytes` on `device`. Before refusing, this process's stream-ordered pools are
    /// re-read once: memory they gave back since their last charge must not cost an allocation.
    #[inline]
    pub fn reserve(&self, device: usize, bytes: u64) -> Result<Owner, HookError> {
        let reclaim = || {
            let pooled = self.pools.in_use();
            if pooled {
                self.pools.refresh(self);
            }
            pooled
        };
        Ok(vgpu_ledger::reserve_or_reclaim(self.ledger(), device, bytes, reclaim)?)
    }
}

static RUNTIME: OnceLock<Runtime> = OnceLock::new();

thread_local! {
    static INITIALISING: Cell<bool> = const { Cell::new(false) };
}

/// The runtime, initialising it on first use.
pub fn get() -> Result<&'static Runtime, HookError> {
    if let Some(runtime) = RUNTIME.get() {
        return Ok(runtime);
    }
    if INITIALISING.with(Cell::get) {
        return Err(HookError::NotReady);
    }
    INITIALISING.with(|flag| flag.set(true));
    let runtime = RUNTIME.get_or_init(initialise);
    INITIALISING.with(|flag| flag.set(false));
    Ok(runtime)
}

fn initialise() -> Runtime {
    // Any function of this library tells `dladdr` which file it was loaded from.
    let found = crate::ledger::sources::for_this_process(initialise as *const std::ffi::c_void);
    let config = found.config;
    logging::init(config.log_level);
    for problem in &config.problems {
        tracing::error!("{problem}");
    }
    for note in &found.notes {
        tracing::warn!("{note}");
    }
    tracing::debug!("budget from {}", found.source);
    crate::driver::tools::report();
    Runtime {
        compute: Limiter::from_config(&config),
        config,
        ledger: OnceLock::new(),
        allocations: AllocationTable::default(),
        vmm: VmmTable::default(),
        pools: PoolTable::default(),
        graphs: GraphTable::default(),
        spill: SpillTable::default(),
        swap: Swap::default(),
        arrays: AllocationTable::default(),
        contexts: AllocationTable::default(),
        primary: Default::default(),
        driver_memory: DriverMemory::default(),
    }
}
