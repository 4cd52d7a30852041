//! What each hooked entry point does, in Rust: charging, crediting and reporting the budget.
//! Every hook takes the runtime and the C arguments as they came, and answers a `Result`.

pub mod amdsmi;
pub mod arrays;
pub mod copies;
pub mod launch;
pub mod memory;
pub mod pools;
pub mod query;
pub mod smi;
pub mod symbols;
pub mod vmm;
