//! A forked child credits only what it charged itself: until its first charge it still holds its
//! parent's membership token in memory, and a free of memory its parent allocated must not take
//! the bytes off the parent's lease (the parent still holds them: the budget would then overshoot).

use std::path::PathBuf;

use vgpu_ledger::config::Config;

const MIB: u64 = 1 << 20;

#[test]
fn a_forked_child_cannot_credit_its_parents_charge() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("ledger-fork-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let region = dir.join("region.cache");
    let _ = std::fs::remove_file(&region);
    let config = Config::from_vars([
        ("CUDA_DEVICE_MEMORY_LIMIT_0".to_owned(), "1g".to_owned()),
        ("CUDA_DEVICE_MEMORY_SHARED_CACHE".to_owned(), region.to_string_lossy().into_owned()),
    ]);
    let ledger = vgpu_ledger::attach(&config, || vec![b"GPU-face0000-0000-4e00-8000-00000000f0c1".to_vec()]);
    let owner = ledger.try_reserve(0, 64 * MIB).expect("1 GiB holds 64 MiB");
    assert_eq!((ledger.used(0), ledger.held(0)), (64 * MIB, 64 * MIB));

    // SAFETY: the child only calls the ledger's credit (atomics on the mapping) and `_exit`.
    let child = unsafe { libc::fork() };
    assert!(child >= 0, "fork");
    if child == 0 {
        // The parent's allocation, freed in the child before it has charged anything.
        ledger.release(0, 64 * MIB, owner);
        let still = ledger.used(0) == 64 * MIB;
        // SAFETY: ends the child at once, running nothing of the parent's.
        unsafe { libc::_exit(if still { 0 } else { 1 }) };
    }
    let mut status = 0;
    // SAFETY: `child` is our child; `status` is a valid out-pointer.
    assert_eq!(unsafe { libc::waitpid(child, &mut status, 0) }, child);
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "the child credited: {status:#x}");
    assert_eq!((ledger.used(0), ledger.held(0)), (64 * MIB, 64 * MIB), "the parent's charge stands");

    ledger.release(0, 64 * MIB, owner);
    assert_eq!((ledger.used(0), ledger.held(0)), (0, 0));
    let _ = std::fs::remove_dir_all(&dir);
}
