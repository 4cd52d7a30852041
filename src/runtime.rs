//! libvgpu's lifecycle: set up lazily on the first hooked call, never in an ELF constructor.
//!
//! States: uninitialised → initialising (on one thread) → ready. A hook that re-enters while its
//! own thread is initialising gets `None` and answers [`HookError::NotReady`] instead of
//! deadlocking on the `OnceLock`.

use std::cell::Cell;
use std::sync::OnceLock;

use crate::config::Config;
use crate::error::HookError;
use crate::ledger::{AllocationTable, Ledger, LocalLedger};
use crate::logging;

/// Process-wide state shared by every hook.
pub struct Runtime {
    pub config: Config,
    pub ledger: Box<dyn Ledger>,
    pub allocations: AllocationTable,
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
    let config = Config::from_env();
    logging::init(config.log_level);
    for problem in &config.problems {
        tracing::error!("{problem}");
    }
    tracing::info!(limits = ?config.memory, "libvgpu ready");
    Runtime { config, ledger: Box::new(LocalLedger::default()), allocations: AllocationTable::default() }
}
