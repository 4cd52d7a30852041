//! Developer tools under libvgpu (docs/developer-tools.md), with two stand-ins:
//! - a profiler's driver shim preloaded beside libvgpu (`tests/clients/tool_shim.c`, after Nsight
//!   Compute's `libcuda-injection.so`): it exports `dlopen` and answers `dlopen("libcuda.so.1")`
//!   with itself, exports driver entry points that it forwards to the driver it resolved itself,
//!   and hands out whatever the driver's `cuGetProcAddress` answers;
//! - an injection the driver loads through `CUDA_INJECTION64_PATH` (`tests/clients/tool_injection.c`,
//!   after Nsight Systems' ELF interposer): it rewrites every loaded object's global offset table
//!   for `dlsym` and driver entry points, so calls go through it first.
//!
//! Every call path of the client must stay held to the budget, with the shim before and after
//! libvgpu in `LD_PRELOAD`, and with libvgpu in `/etc/ld.so.preload` (a private mount namespace's
//! copy of `/etc`, as root); and so with the shim resolving glibc's `dlsym` by version
//! (`TOOL_SHIM_VERSIONED=1`: `dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34")`), which finds libvgpu's.

mod common;

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

use common::{GIB, Run, Scratch};

const CUDA_ERROR_OUT_OF_MEMORY: u64 = 2;
const PATHS: [&str; 5] = ["direct", "dlsym", "vdlsym", "procaddr", "procaddr_v1"];
/// How the shim finds glibc's `dlsym`: the one it binds to, or by version.
const SHIM_LOOKUPS: [&str; 2] = ["0", "1"];

fn preload(first: &Path, second: &Path) -> String {
    format!("{}:{}", first.display(), second.display())
}

#[test]
fn a_profilers_driver_shim_before_or_after_libvgpu_keeps_the_budget() {
    let shim = common::tool_library("tool_shim");
    let libvgpu = &common::artifacts().libvgpu;
    for (order, preloaded) in
        [("shim first", preload(&shim, libvgpu)), ("libvgpu first", preload(libvgpu, &shim))]
    {
        for (versioned, path) in SHIM_LOOKUPS.iter().flat_map(|v| PATHS.map(|path| (v, path))) {
            let r = Run::new(path, &["fill", "64"])
                .env("CUDA_DEVICE_MEMORY_LIMIT_0", "1g")
                .env("LD_PRELOAD", &preloaded)
                .env("TOOL_SHIM_REPORT", "1")
                .env("TOOL_SHIM_VERSIONED", versioned)
                .report();
            let what = format!("{order}, shim versioned={versioned}, {path}: {r:?}");
            assert!(r.success, "{what}");
            assert_eq!(r.get("info_total"), GIB, "{what}");
            assert_eq!(r.get("device_total"), GIB, "{what}");
            assert_eq!(r.get("first_bytes"), GIB, "{what}");
            assert_eq!(r.get("first_status"), CUDA_ERROR_OUT_OF_MEMORY, "{what}");
            assert_eq!(r.get("second_bytes"), GIB, "{what}");
            if path == "direct" {
                // The tool still sees the calls it intercepts: a program linked to the driver
                // binds to the first of the two libraries that exports each entry point.
                assert!(r.get("tool_forwarded") > 0, "{what}");
            }
        }
    }
}

/// Run as root in a new mount namespace: libvgpu in the copy of `/etc`'s `ld.so.preload`, the
/// shim in `LD_PRELOAD` (as a profiler launches its target), each call path in turn.
const LD_SO_PRELOAD_SCRIPT: &str = r#"
set -euo pipefail
mount --bind "$T_ETC" /etc
for versioned in 0 1; do
    for path in direct dlsym vdlsym procaddr procaddr_v1; do
        TOOL_SHIM_VERSIONED=$versioned LD_PRELOAD="$T_SHIM" "$T_CLIENT" "$path" fill 64 < /dev/null \
            | sed "s/^/${versioned}_${path}_/"
    done
done
CUDA_INJECTION64_PATH="$T_INJECTION" TOOL_INJECTION_REPORT=1 "$T_CLIENT" direct plt_fill 64 < /dev/null \
    | sed "s/^/injected_/"
echo finished=1
"#;

#[test]
fn a_profilers_driver_shim_keeps_the_budget_with_libvgpu_in_ld_so_preload() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "this test bind-mounts a copy of /etc, which needs root");
    let host_preload_before = std::fs::read("/etc/ld.so.preload").ok();
    let artifacts = common::artifacts();
    let scratch = Scratch::new("tool-ld-so-preload");
    let etc = common::etc_preloading(&scratch, &artifacts.libvgpu);
    let output = Command::new("unshare")
        .args(["--mount", "bash", "-c", LD_SO_PRELOAD_SCRIPT])
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("LD_LIBRARY_PATH", &artifacts.fake_driver_dir)
        .env("CUDA_DEVICE_MEMORY_LIMIT_0", "1g")
        .env("CUDA_DEVICE_MEMORY_SHARED_CACHE", scratch.path("region.cache"))
        .env("T_ETC", &etc)
        .env("T_SHIM", common::tool_library("tool_shim"))
        .env("T_INJECTION", common::tool_library("tool_injection"))
        .env("T_CLIENT", &artifacts.client)
        .output()
        .expect("run unshare");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    let values: HashMap<&str, &str> = stdout.lines().filter_map(|line| line.split_once('=')).collect();
    let get = |key: &str| *values.get(key).unwrap_or_else(|| panic!("no {key}=:\n{stdout}"));
    for (versioned, path) in SHIM_LOOKUPS.iter().flat_map(|v| PATHS.map(|path| (v, path))) {
        let key = |name: &str| format!("{versioned}_{path}_{name}");
        assert_eq!(get(&key("info_total")), GIB.to_string(), "{versioned} {path}: {stdout}");
        assert_eq!(get(&key("first_bytes")), GIB.to_string(), "{versioned} {path}: {stdout}");
        assert_eq!(get(&key("first_status")), "2", "{versioned} {path}: {stdout}");
    }
    assert_eq!(get("injected_first_bytes"), GIB.to_string(), "{stdout}");
    assert_eq!(get("injected_first_status"), "2", "{stdout}");
    assert!(get("injected_injection_calls").parse::<u64>().expect("a count") >= 17, "{stdout}");
    assert_eq!(get("finished"), "1");
    assert_eq!(std::fs::read("/etc/ld.so.preload").ok(), host_preload_before, "the host's /etc was written");
}

#[test]
fn an_injection_that_rewrites_the_offset_tables_keeps_the_budget() {
    // The driver loads the injection at cuInit, which libvgpu makes on its first hooked call: by
    // then the client's offset table is rewritten, and each later call goes program -> tool ->
    // libvgpu -> driver.
    let injection = common::tool_library("tool_injection");
    let run = |path: &str, command: &str| {
        Run::new(path, &[command, "64"])
            .env("CUDA_DEVICE_MEMORY_LIMIT_0", "1g")
            .env("CUDA_INJECTION64_PATH", injection.to_str().expect("utf-8 path"))
            .env("TOOL_INJECTION_REPORT", "1")
            .report()
    };
    for path in PATHS {
        let r = run(path, "fill");
        let what = format!("{path}: {r:?}");
        assert!(r.success, "{what}");
        assert_eq!(r.get("info_total"), GIB, "{what}");
        assert_eq!(r.get("first_bytes"), GIB, "{what}");
        assert_eq!(r.get("first_status"), CUDA_ERROR_OUT_OF_MEMORY, "{what}");
        assert!(r.get("injection_patched") > 0, "the injection ran: {what}");
    }
    // Calls made by name after the rewrite: every one of them went through the tool.
    let r = run("direct", "plt_fill");
    assert!(r.success, "{r:?}");
    assert_eq!((r.get("info_total"), r.get("first_bytes")), (GIB, GIB), "{r:?}");
    assert_eq!(r.get("first_status"), CUDA_ERROR_OUT_OF_MEMORY, "{r:?}");
    assert!(r.get("injection_calls") >= 17, "16 allocations, the refused one and the query: {r:?}");
}

#[test]
fn a_tool_in_the_process_is_named_in_one_line() {
    // A library named as a tool's: libvgpu says once (at info level) which tool is loaded and that
    // the budget holds under it, and for Nsight Compute what kernel replay's copy of memory costs;
    // a process without one hears nothing of tools.
    let scratch = Scratch::new("tool-named");
    let libvgpu = &common::artifacts().libvgpu;
    let run = |preloaded: String| {
        Run::new("direct", &["fill", "64"])
            .env("CUDA_DEVICE_MEMORY_LIMIT_0", "1g")
            .env("LIBCUDA_LOG_LEVEL", "3")
            .env("LD_PRELOAD", &preloaded)
            .report()
    };
    for (file, tool, says) in [
        ("libToolsInjection64.so", "Nsight Systems", "the budget holds under it (docs"),
        ("libcuda-injection.so", "Nsight Compute", "kernel replay's saved copy of device memory is charged"),
    ] {
        let library = scratch.path(file);
        let built = Command::new("cc")
            .args(["-shared", "-fPIC", "-x", "c", "/dev/null", "-o"])
            .arg(&library)
            .status()
            .expect("run cc");
        assert!(built.success());
        let with_tool = run(preload(&library, libvgpu));
        assert!(with_tool.success, "{with_tool:?}");
        assert_eq!(
            with_tool.get("first_bytes"),
            GIB,
            "the budget still holds on every call that reaches libvgpu"
        );
        let named: Vec<&str> = with_tool.stderr.lines().filter(|line| line.contains(tool)).collect();
        assert_eq!(named.len(), 1, "{}", with_tool.stderr);
        assert!(named[0].contains(says), "{}", named[0]);
    }
    let without = run(libvgpu.display().to_string());
    assert!(!without.stderr.contains("is loaded in this process"), "{}", without.stderr);
}
