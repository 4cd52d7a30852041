//! libvgpu_hip's lifecycle: set up lazily on the first hooked call, never in an ELF constructor.
//!
//! States: uninitialised → initialising (on one thread) → ready. A hook that re-enters while its
//! own thread is initialising gets [`HookError::NotReady`] instead of deadlocking.

use std::cell::Cell;
use std::ffi::c_int;
use std::sync::OnceLock;

use vgpu_ledger::config::Config;
use vgpu_ledger::{AllocationTable, Ledger, Owner, logging};

use crate::compute::Limiter;
use crate::entry_points::{AmdSmiReal, Real, SmiReal};
use crate::error::HookError;
use crate::hooks::pools::PoolTable;
use crate::hooks::vmm::VmmTable;
use crate::loader::{AMD_SMI_FILE, Library, ROCM_SMI_FILE, SMI_NAMES};
use crate::sys::HipDevice;

/// Process-wide state shared by every hook.
pub struct Runtime {
    pub config: Config,
    /// The HIP runtime's own functions.
    pub real: Real,
    /// `hipRuntimeGetVersion`'s answer (0 when unknown): picks the 5.x or 6.x struct layouts.
    pub version: i32,
    ledger: OnceLock<&'static dyn Ledger>,
    /// Charged device pointers (every family freed with `hipFree`/`hipFreeAsync`).
    pub allocations: AllocationTable,
    /// Charged arrays.
    pub arrays: AllocationTable,
    /// Charged `hipMemCreate` handles, their references and mappings.
    pub vmm: VmmTable,
    /// Stream-ordered pools, charged what they hold.
    pub pools: PoolTable,
    /// Devices the runtime reports, asked once.
    device_count: OnceLock<usize>,
    /// The compute limiter; `None` when no device has a compute share.
    pub compute: Option<Limiter>,
}

impl Runtime {
    /// The ledger, attached on first use: the shared region needs the devices' UUIDs.
    pub fn ledger(&self) -> &dyn Ledger {
        *self.ledger.get_or_init(|| {
            vgpu_ledger::attach(&self.config, || {
                (0..self.device_count())
                    .map(|ordinal| {
                        let mut uuid = [0u8; 16];
                        // SAFETY: `uuid` is a valid 16-byte out-pointer (hipUUID).
                        let known = unsafe { self.real.hipDeviceGetUuid(&mut uuid, ordinal as HipDevice) };
                        if known.is_err() {
                            tracing::warn!("hipDeviceGetUuid failed for HIP device {ordinal}");
                        }
                        vgpu_ledger::region::uuid_name(&uuid).to_vec()
                    })
                    .collect()
            })
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

    /// How many devices the runtime shows this process (0 when it has none or fails).
    pub fn device_count(&self) -> usize {
        *self.device_count.get_or_init(|| {
            let mut count: c_int = 0;
            // SAFETY: `count` is a valid out-pointer.
            match unsafe { self.real.hipGetDeviceCount(&mut count) } {
                Ok(()) => usize::try_from(count).unwrap_or(0),
                Err(_) => 0,
            }
        })
    }

    /// The calling thread's current device.
    pub fn current_device(&self) -> Result<HipDevice, HookError> {
        let mut device: HipDevice = 0;
        // SAFETY: `device` is a valid out-pointer.
        unsafe { self.real.hipGetDevice(&mut device) }?;
        Ok(device)
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
    // The container's budget, wherever it is (docs/container-budget.md): any function of this
    // library tells `dladdr` which file it was loaded from.
    let found = vgpu_ledger::sources::for_this_process(initialise as *const std::ffi::c_void);
    let config = found.config;
    logging::init(config.log_level);
    for problem in &config.problems {
        tracing::error!("{problem}");
    }
    for note in &found.notes {
        tracing::warn!("{note}");
    }
    tracing::debug!("budget from {}", found.source);
    let library = Library::open_runtime();
    if library.is_none() {
        tracing::warn!(
            "no HIP runtime (libamdhip64.so.6/.5) could be loaded; HIP calls return hipErrorNotFound"
        );
    }
    let real = Real::resolve(library);
    let mut version: c_int = 0;
    // SAFETY: `version` is a valid out-pointer.
    let _ = unsafe { real.hipRuntimeGetVersion(&mut version) };
    tracing::debug!(version, limits = ?config.memory, "libvgpu_hip ready");
    Runtime {
        compute: Limiter::from_config(&config),
        config,
        real,
        version,
        ledger: OnceLock::new(),
        allocations: AllocationTable::default(),
        arrays: AllocationTable::default(),
        vmm: VmmTable::default(),
        pools: PoolTable::default(),
        device_count: OnceLock::new(),
    }
}

/// The environment the SMI hooks read, found once for both SMI libraries.
fn smi_config() -> &'static Config {
    static CONFIG: OnceLock<Config> = OnceLock::new();
    CONFIG.get_or_init(|| {
        let config = vgpu_ledger::sources::for_this_process(smi_config as *const std::ffi::c_void).config;
        logging::init(config.log_level);
        config
    })
}

/// What the ROCm SMI hooks need: the environment and ROCm SMI's own functions. Set up apart from
/// the HIP runtime, which `rocm-smi` never loads.
pub struct SmiRuntime {
    pub config: &'static Config,
    pub real: SmiReal,
}

/// The ROCm SMI hooks' state, set up on first use.
///
/// ROCm SMI's functions come from the library that holds them in this process: `librocm_smi64`
/// if it is loaded, else `libamd_smi`, which builds ROCm SMI into itself and calls it through its
/// PLT, where our `rsmi_*` exports interpose (AMD SMI's sources). Loading a second ROCm SMI there
/// would answer from a copy nobody initialised. Only with neither loaded is `librocm_smi64` loaded.
/// (Inside an AMD SMI hook, libamd_smi's calls use [`AmdSmiRuntime::rocm_smi`] instead.)
pub fn smi() -> &'static SmiRuntime {
    static SMI: OnceLock<SmiRuntime> = OnceLock::new();
    SMI.get_or_init(|| {
        let library = Library::already_loaded(&SMI_NAMES)
            .or_else(|| Library::loaded_file(ROCM_SMI_FILE))
            .or_else(|| Library::loaded_file(AMD_SMI_FILE))
            .or_else(|| Library::open_first(&SMI_NAMES));
        SmiRuntime { config: smi_config(), real: SmiReal::resolve(library) }
    })
}

/// What the AMD SMI hooks need: the environment and libamd_smi's own functions.
pub struct AmdSmiRuntime {
    pub config: &'static Config,
    pub real: AmdSmiReal,
    /// The ROCm SMI built into the same libamd_smi: what its own `rsmi_*` calls, made while one
    /// of our AMD SMI hooks runs, are passed to.
    pub rocm_smi: SmiRuntime,
}

/// The AMD SMI hooks' state, set up on the first call once libamd_smi is loaded. Its functions
/// come from the copy this process loaded (never a second one: its processor handles are that
/// copy's). Before it is loaded (a program calling our export without the library) there is
/// nothing to call, and nothing is remembered.
pub fn amdsmi() -> Result<&'static AmdSmiRuntime, HookError> {
    static AMDSMI: OnceLock<AmdSmiRuntime> = OnceLock::new();
    if let Some(runtime) = AMDSMI.get() {
        return Ok(runtime);
    }
    let library = Library::loaded_file(AMD_SMI_FILE).ok_or(HookError::MissingEntryPoint("libamd_smi"))?;
    Ok(AMDSMI.get_or_init(|| AmdSmiRuntime {
        config: smi_config(),
        real: AmdSmiReal::resolve(Some(library)),
        rocm_smi: SmiRuntime { config: smi_config(), real: SmiReal::resolve(Some(library)) },
    }))
}
