//! The test hooks: what really reached the fake driver (bytes, calls, launches, simulated GPU time),
//! and the simulated kernels that tests launch.

use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_int, c_uint, c_ulonglong, c_void};
use std::hash::{BuildHasherDefault, Hasher};
use std::mem::{offset_of, size_of};
use std::sync::{Mutex, PoisonError};

use crate::state;

/// Calls per exported entry point in this process. Recording the name also keeps entry points with
/// identical bodies (`_v2` twins, `_ptsz` variants, the NOT_SUPPORTED stubs) from being merged into one address.
/// Keyed by the name's address, so that counting costs a few instructions, not string
/// comparisons: libvgpu's benchmarks measure what it adds on top of these calls.
type Calls = HashMap<usize, (&'static str, u64), BuildHasherDefault<AddressHasher>>;
static CALLS: Mutex<Option<Calls>> = Mutex::new(None);

/// Counts one call of the export `name`; every CUDA and NVML export calls this first.
pub fn record_call(name: &'static str) {
    let mut calls = CALLS.lock().unwrap_or_else(PoisonError::into_inner);
    calls.get_or_insert_default().entry(name.as_ptr() as usize).or_insert((name, 0)).1 += 1;
}

/// One multiply spreads an address well enough for a table of a hundred names.
#[derive(Default)]
struct AddressHasher(u64);

impl Hasher for AddressHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 = (self.0 ^ u64::from(byte)).wrapping_mul(0x100_0000_01b3);
        }
    }

    fn write_usize(&mut self, value: usize) {
        self.0 = (value as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

/// Writes physical device `physical_index`'s used bytes, peak used bytes and allocation calls (shared
/// across processes with `FAKEGPU_SHARED`); NULL out-pointers are skipped. Returns 0, or 1 for an index
/// that names no device (or a fake that could not start).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fakegpu_device_stats(
    physical_index: c_uint,
    used: *mut c_ulonglong,
    peak: *mut c_ulonglong,
    alloc_calls: *mut c_ulonglong,
) -> c_int {
    let Ok(fake) = state::fake() else { return 1 };
    let index = physical_index as usize;
    if index >= fake.device_count {
        return 1;
    }
    let stats = fake.ledger.stats(index);
    for (out, value) in [(used, stats.used), (peak, stats.peak), (alloc_calls, stats.alloc_calls)] {
        if !out.is_null() {
            // SAFETY: a non-NULL out-pointer is valid for writes per this hook's contract.
            unsafe { out.write(value) };
        }
    }
    0
}

/// Physical device `physical_index`'s managed bytes allocated now (shared across processes with
/// `FAKEGPU_SHARED`), counted apart from its used bytes; 0 for an index that names no device.
#[unsafe(no_mangle)]
pub extern "C" fn fakegpu_managed_bytes(physical_index: c_uint) -> c_ulonglong {
    let Ok(fake) = state::fake() else { return 0 };
    let index = physical_index as usize;
    if index >= fake.device_count {
        return 0;
    }
    fake.ledger.stats(index).managed
}

/// Bytes this process asked `cuMemPrefetchAsync(_v2)` to migrate.
#[unsafe(no_mangle)]
pub extern "C" fn fakegpu_prefetched_bytes() -> c_ulonglong {
    crate::cuda::memory::PREFETCHED.load(std::sync::atomic::Ordering::Relaxed)
}

/// How many `cuMemAdvise(_v2)` calls of this process with advice value `advice` the fake accepted
/// (0 for a value that names no advice).
#[unsafe(no_mangle)]
pub extern "C" fn fakegpu_advice_count(advice: c_int) -> c_ulonglong {
    let Ok(index) = usize::try_from(advice) else { return 0 };
    crate::cuda::memory::ADVISED
        .get(index)
        .map_or(0, |count| count.load(std::sync::atomic::Ordering::Relaxed))
}

/// How many times this process called the export named `symbol` (0 for NULL or unknown names).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fakegpu_call_count(symbol: *const c_char) -> c_ulonglong {
    if symbol.is_null() {
        return 0;
    }
    // SAFETY: a non-NULL `symbol` is a NUL-terminated string per this hook's contract.
    let name = unsafe { CStr::from_ptr(symbol) };
    let calls = CALLS.lock().unwrap_or_else(PoisonError::into_inner);
    let Ok(name) = name.to_str() else { return 0 };
    calls
        .iter()
        .flat_map(|calls| calls.values())
        .filter(|(known, _)| *known == name)
        .map(|(_, count)| count)
        .sum()
}

/// A kernel whose launches take `duration_ns` of simulated GPU time: a `CUfunction` for the launch
/// calls and kernel nodes. Needs no `cuInit`; NULL only when the fake could not start.
#[unsafe(no_mangle)]
pub extern "C" fn fakegpu_kernel(duration_ns: c_ulonglong) -> *mut c_void {
    match state::fake() {
        Ok(fake) => std::ptr::without_provenance_mut(fake.create_kernel(duration_ns) as usize),
        Err(_) => std::ptr::null_mut(),
    }
}

/// Nanoseconds of simulated work this process queued on physical device `physical_device` (kernel
/// launches and graph kernel nodes, finished or not); 0 for an index that names no device.
#[unsafe(no_mangle)]
pub extern "C" fn fakegpu_busy_ns(physical_device: c_int) -> c_ulonglong {
    let Ok(fake) = state::fake() else { return 0 };
    match usize::try_from(physical_device) {
        Ok(index) if index < fake.device_count => fake.busy_ns(index),
        _ => 0,
    }
}

/// Copies and memsets of this process refused (INVALID_VALUE) because their device range touched VMM
/// address space that is reserved but not mapped, as memory that was swapped out is.
#[unsafe(no_mangle)]
pub extern "C" fn fakegpu_unmapped_access() -> c_ulonglong {
    state::fake().map_or(0, |fake| fake.lock().vmm.unmapped_access())
}

/// Kernel and graph launches this process made while one of its reservations had a range that was
/// mapped before and is unmapped now: launches while its memory was out.
#[unsafe(no_mangle)]
pub extern "C" fn fakegpu_launch_while_unmapped() -> c_ulonglong {
    state::fake().map_or(0, |fake| fake.lock().vmm.launch_while_unmapped())
}

/// `FakegpuLaunch`: the last launch this process made, as its caller passed it.
#[repr(C)]
pub struct FakegpuLaunch {
    /// Which entry point: 1 `cuLaunchKernel`, 2 `cuLaunchKernel_ptsz`, 3 `cuLaunchCooperativeKernel`,
    /// 4 `cuLaunchCooperativeKernel_ptsz`, 5 `cuLaunchKernelEx`, 6 `cuLaunchKernelEx_ptsz`,
    /// 7 `cuGraphLaunch`, 8 `cuGraphLaunch_ptsz`.
    entry_point: c_int,
    /// The `CUfunction`; the `CUgraphExec` of a graph launch.
    function: *mut c_void,
    /// Zero for a graph launch, like `block` and `shared_mem_bytes`.
    grid: [c_uint; 3],
    block: [c_uint; 3],
    shared_mem_bytes: c_uint,
    /// The `CUstream` as passed (NULL stays NULL; `cuLaunchKernelEx`: `config->hStream`).
    stream: *mut c_void,
    kernel_params: *mut *mut c_void,
    /// NULL for `cuLaunchCooperativeKernel` (which has none) and graph launches.
    extra: *mut *mut c_void,
}

const _: () = assert!(size_of::<FakegpuLaunch>() == 72);
const _: () = assert!(offset_of!(FakegpuLaunch, function) == 8);
const _: () = assert!(offset_of!(FakegpuLaunch, grid) == 16);
const _: () = assert!(offset_of!(FakegpuLaunch, block) == 28);
const _: () = assert!(offset_of!(FakegpuLaunch, shared_mem_bytes) == 40);
const _: () = assert!(offset_of!(FakegpuLaunch, stream) == 48);
const _: () = assert!(offset_of!(FakegpuLaunch, kernel_params) == 56);
const _: () = assert!(offset_of!(FakegpuLaunch, extra) == 64);

/// Writes the last launch (kernel or graph) this process made; refused launches are not kept. Returns
/// 0, or 1 when there was none yet, `out` is NULL, or the fake could not start.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fakegpu_last_launch(out: *mut FakegpuLaunch) -> c_int {
    let Ok(fake) = state::fake() else { return 1 };
    let Some(launch) = fake.last_launch().filter(|_| !out.is_null()) else { return 1 };
    let pointer = |address: u64| std::ptr::without_provenance_mut::<c_void>(address as usize);
    let filled = FakegpuLaunch {
        entry_point: launch.entry_point as c_int,
        function: pointer(launch.function),
        grid: launch.grid,
        block: launch.block,
        shared_mem_bytes: launch.shared_mem_bytes,
        stream: pointer(launch.stream),
        kernel_params: pointer(launch.kernel_params).cast(),
        extra: pointer(launch.extra).cast(),
    };
    // SAFETY: a non-NULL `out` is valid for writing a `FakegpuLaunch` per this hook's contract.
    unsafe { out.write(filled) };
    0
}

/// Writes the last copy or memset this process made (refused ones are not kept): the exported name
/// that was called (NUL-terminated, cut to fit `name_len`), its bytes, its destination (an address,
/// or a `CUarray`) and its `CUstream` as passed. Returns 0, or 1 when there was none yet, an
/// out-pointer is NULL, or the fake could not start.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fakegpu_last_copy(
    name: *mut c_char,
    name_len: usize,
    bytes: *mut c_ulonglong,
    dst: *mut c_ulonglong,
    stream: *mut *mut c_void,
) -> c_int {
    let Ok(fake) = state::fake() else { return 1 };
    if name.is_null() || name_len == 0 || bytes.is_null() || dst.is_null() || stream.is_null() {
        return 1;
    }
    let Some(copy) = fake.last_copy() else { return 1 };
    let kept = copy.name.len().min(name_len - 1);
    // SAFETY: the out-pointers are valid per this hook's contract, `name` for `name_len` bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(copy.name.as_ptr().cast::<c_char>(), name, kept);
        name.add(kept).write(0);
        bytes.write(copy.bytes);
        dst.write(copy.dst);
        stream.write(std::ptr::without_provenance_mut(copy.stream as usize));
    }
    0
}

/// Makes this process hold `bytes` of physical device `physical_index` as graphics memory, as
/// OpenGL, Vulkan drivers' own allocations or a video codec do: no CUDA allocation call returns
/// it, no context is needed, NVML's per-process figure counts it and the process appears in
/// `nvmlDeviceGetGraphicsRunningProcesses_v3`. Returns 0, 1 for an index that names no device (or
/// a fake that could not start), 2 when the device has no room (nothing taken).
#[unsafe(no_mangle)]
pub extern "C" fn fakegpu_graphics_alloc(physical_index: c_uint, bytes: c_ulonglong) -> c_int {
    graphics(physical_index, bytes, true)
}

/// Gives back `bytes` of this process's graphics memory on physical device `physical_index`;
/// once none is left the process leaves the graphics list. Returns 0, or 1 for an index that names
/// no device or more bytes than the process holds there.
#[unsafe(no_mangle)]
pub extern "C" fn fakegpu_graphics_free(physical_index: c_uint, bytes: c_ulonglong) -> c_int {
    graphics(physical_index, bytes, false)
}

fn graphics(physical_index: c_uint, bytes: c_ulonglong, take: bool) -> c_int {
    let Ok(fake) = state::fake() else { return 1 };
    let index = physical_index as usize;
    if index >= fake.device_count {
        return 1;
    }
    match fake.graphics(index, bytes, take) {
        Ok(()) => 0,
        Err(state::Refusal::OutOfMemory) => 2,
        Err(_) => 1,
    }
}

#[cfg(test)]
mod tests {
    /// Every export's first statement records its own name.
    #[test]
    fn every_export_records_its_own_name() {
        let sources = [
            include_str!("cuda.rs"),
            include_str!("cuda/arrays.rs"),
            include_str!("cuda/contexts.rs"),
            include_str!("cuda/events.rs"),
            include_str!("cuda/graphs.rs"),
            include_str!("cuda/host.rs"),
            include_str!("cuda/ipc.rs"),
            include_str!("cuda/launches.rs"),
            include_str!("cuda/memory.rs"),
            include_str!("cuda/pools.rs"),
            include_str!("cuda/vmm.rs"),
            include_str!("nvml.rs"),
        ];
        for source in sources {
            let mut exports = source.split("extern \"C\" fn ").skip(1).peekable();
            assert!(exports.peek().is_some());
            for export in exports {
                let name = &export[..export.find('(').expect("a parameter list")];
                let body = &export[export.find("{\n").expect("a body")..];
                let expected = format!("{{\n    stats::record_call(\"{name}\");\n");
                assert!(body.starts_with(&expected), "{name} does not start by recording its call");
            }
        }
    }
}
