//! Loaded modules and libraries (`cuModuleLoad*`, `cuLibraryLoad*`): each takes
//! `FAKEGPU_MODULE_MEMORY` bytes of its device that no allocation call returns, as kernel code does
//! on a real card, until it is unloaded.

use std::collections::BTreeMap;

use crate::handles::{self, Keys, Kind};
use crate::state::{Fake, Refusal};

struct ModuleRecord {
    device: usize,
    bytes: u64,
    kind: Kind,
}

pub struct Modules {
    modules: BTreeMap<u64, ModuleRecord>,
    keys: Keys,
}

impl Modules {
    pub fn new() -> Modules {
        Modules { modules: BTreeMap::new(), keys: Keys::starting_at(1) }
    }
}

impl Fake {
    /// Loads a module (or library, by `kind`) on physical `device`, charging the device its cost.
    pub fn load_module(&self, device: usize, kind: Kind) -> Result<u64, Refusal> {
        let mut registry = self.lock();
        self.charge(device, self.module_memory)?;
        let key = registry.modules.keys.next();
        registry.modules.modules.insert(key, ModuleRecord { device, bytes: self.module_memory, kind });
        Ok(handles::encode(kind, key))
    }

    /// Unloads the module or library `handle` of `kind`, giving its memory back.
    pub fn unload_module(&self, handle: u64, kind: Kind) -> Result<(), Refusal> {
        let mut registry = self.lock();
        let modules = &mut registry.modules.modules;
        let key = handles::decode(kind, handle)
            .filter(|key| modules.get(key).is_some_and(|module| module.kind == kind))
            .ok_or(Refusal::Unknown)?;
        let Some(module) = modules.remove(&key) else { return Err(Refusal::Unknown) };
        self.credit(module.device, module.bytes);
        Ok(())
    }
}
