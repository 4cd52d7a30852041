//! Developer tools that load into the process beside the driver (profilers, sanitizers, CUPTI),
//! recognised by their libraries and named in one line when libvgpu starts
//! (docs/developer-tools.md): the budget was seen to hold under each on a real GPU.

use std::ffi::{CStr, c_int, c_void};

/// A tool, the start of its library's file name, and what its line adds to "the budget holds
/// under it" (empty, or a clause that starts with "; ").
struct Tool {
    name: &'static str,
    library: &'static [u8],
    note: &'static str,
}

/// Every tool here was run on an H100 under budgets of 2g and 8g, in both deployments, with the
/// budget held and the tool's own result as natively (`ci/gpu-tools`, docs/developer-tools.md).
const TOOLS: &[Tool] = &[
    Tool { name: "Nsight Compute (ncu)", library: b"libcuda-injection.so", note: NCU_REPLAY },
    Tool { name: "compute-sanitizer", library: b"libsanitizer-", note: "" },
    Tool { name: "compute-sanitizer", library: b"libTreeLauncherTargetInjection", note: "" },
    Tool { name: "Nsight Systems (nsys)", library: b"libToolsInjection", note: "" },
    Tool { name: "CUPTI (a profiler such as torch.profiler)", library: b"libcupti.so", note: "" },
];

/// Kernel replay's copy of device memory is taken inside the driver, behind every entry point: it
/// shows in the process's driver memory, so the container is charged for it, but nothing can
/// refuse it (seen on an H100: 1290 MiB over a 2g budget for one replay; docs/developer-tools.md).
const NCU_REPLAY: &str = "; kernel replay's saved copy of device memory is charged to this container while it lasts \
but cannot be refused (--replay-mode application takes none)";

/// Says, once, at info level, which tools are loaded into this process, so that a profile taken
/// under libvgpu says what held its budget.
pub fn report() {
    let mut found: Vec<&'static Tool> = Vec::new();
    // SAFETY: `visit` matches dl_iterate_phdr's callback type and `found` outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(visit), (&raw mut found).cast()) };
    for tool in found {
        tracing::info!(
            "{} is loaded in this process; the budget holds under it{} (docs/developer-tools.md)",
            tool.name,
            tool.note
        );
    }
}

unsafe extern "C" fn visit(info: *mut libc::dl_phdr_info, _size: usize, data: *mut c_void) -> c_int {
    // SAFETY: dl_iterate_phdr hands a valid record and the vector passed to it.
    let (info, found) = unsafe { (&*info, &mut *data.cast::<Vec<&'static Tool>>()) };
    if info.dlpi_name.is_null() {
        return 0;
    }
    // SAFETY: the loader's NUL-terminated path of a loaded object.
    let path = unsafe { CStr::from_ptr(info.dlpi_name) }.to_bytes();
    let base = path.rsplit(|&b| b == b'/').next().unwrap_or(path);
    for tool in TOOLS.iter().filter(|tool| base.starts_with(tool.library)) {
        if !found.iter().any(|seen| seen.name == tool.name) {
            found.push(tool);
        }
    }
    0
}
