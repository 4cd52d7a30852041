//! Shared by the benches of both crates (included with `#[path]`): one CPU for a whole run, so
//! that the rounds compare like with like.

/// Pins this process, and so every client it starts, to the last CPU it may run on.
pub fn pin_to_one_cpu() {
    // SAFETY: `set` is a plain bit mask owned here; the calls only read and write it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return;
        }
        let Some(last) = (0..libc::CPU_SETSIZE as usize).rev().find(|&cpu| libc::CPU_ISSET(cpu, &set)) else {
            return;
        };
        libc::CPU_ZERO(&mut set);
        libc::CPU_SET(last, &mut set);
        libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set);
    }
}
