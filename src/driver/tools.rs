//! Developer tools that load into the process beside the driver (profilers, sanitizers, CUPTI),
//! recognised by their libraries and named in one line when libvgpu starts
//! (docs/developer-tools.md): whether the budget is known to hold under each.

use std::ffi::{CStr, c_int, c_void};

/// A tool, the start of its library's file name, and whether the budget was seen to hold under it
/// on a real GPU.
struct Tool {
    name: &'static str,
    library: &'static [u8],
    checked: bool,
}

const TOOLS: &[Tool] = &[
    Tool { name: "Nsight Compute (ncu)", library: b"libcuda-injection.so", checked: true },
    Tool { name: "compute-sanitizer", library: b"libsanitizer-", checked: true },
    Tool { name: "compute-sanitizer", library: b"libTreeLauncherTargetInjection", checked: true },
    Tool { name: "Nsight Systems (nsys)", library: b"libToolsInjection", checked: false },
    Tool { name: "CUPTI (a profiler such as torch.profiler)", library: b"libcupti.so", checked: true },
];

/// Says, once, which tools are loaded into this process: at info level for those under which the
/// budget was seen to hold, as a warning for those never checked (the budget is still enforced on
/// every call that reaches libvgpu; a tool that calls the driver behind it is not held).
pub fn report() {
    let mut found: Vec<&'static Tool> = Vec::new();
    // SAFETY: `visit` matches dl_iterate_phdr's callback type and `found` outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(visit), (&raw mut found).cast()) };
    for tool in found {
        if tool.checked {
            tracing::info!(
                "{} is loaded in this process; the budget holds under it (docs/developer-tools.md)",
                tool.name
            );
        } else {
            tracing::warn!(
                "{} is loaded in this process and has not been checked under libvgpu: calls it makes to \
                 the driver behind libvgpu are not held to the budget (docs/developer-tools.md)",
                tool.name
            );
        }
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
