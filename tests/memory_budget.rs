//! The memory budget on every call path, against the fake driver, one client process per case.

mod common;

use common::{GIB, MIB, Run};

/// `vdlsym` is `dlsym` as an interposer resolves glibc's, by version
/// (`dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34")`): it must find libvgpu's.
const PATHS: [&str; 5] = ["direct", "dlsym", "vdlsym", "procaddr", "procaddr_v1"];
const CUDA_ERROR_OUT_OF_MEMORY: u64 = 2;

fn fill(path: &str) -> Run {
    Run::new(path, &["fill", "64"])
}

#[test]
fn every_call_path_gets_exactly_the_budget_then_out_of_memory() {
    for path in PATHS {
        let r = fill(path).env("CUDA_DEVICE_MEMORY_LIMIT_0", "1g").report();
        assert!(r.success, "{path}: {r:?}");
        assert_eq!(r.get("device_total"), GIB, "{path}: cuDeviceTotalMem_v2");
        assert_eq!(r.get("info_total"), GIB, "{path}: cuMemGetInfo_v2 total");
        assert_eq!(r.get("info_free"), GIB, "{path}: cuMemGetInfo_v2 free");
        assert_eq!(r.get("first_bytes"), GIB, "{path}: allocated");
        assert_eq!(r.get("first_status"), CUDA_ERROR_OUT_OF_MEMORY, "{path}");
        assert_eq!(r.get("full_free"), 0, "{path}");
        assert_eq!(r.get("driver_peak"), GIB, "{path}: what reached the driver");
        assert_eq!(r.get("freed_free"), GIB, "{path}: budget whole after freeing");
        assert_eq!(r.get("second_bytes"), GIB, "{path}: second fill");
    }
}

#[test]
fn refused_allocations_never_reach_the_driver() {
    // 16 chunks fit; the 17th is refused by us, so the driver sees exactly 16 allocation calls.
    let r = fill("direct").env("CUDA_DEVICE_MEMORY_LIMIT_0", "1g").report();
    assert_eq!(r.get("driver_alloc_calls"), 16);
}

#[test]
fn without_a_limit_every_answer_is_the_drivers() {
    for path in PATHS {
        let native = fill(path).native().report();
        let preloaded = fill(path).report();
        assert!(native.success && preloaded.success, "{path}: {native:?} {preloaded:?}");
        for key in [
            "device_total",
            "info_total",
            "info_free",
            "first_bytes",
            "first_status",
            "full_free",
            "freed_free",
            "second_bytes",
        ] {
            assert_eq!(native.get(key), preloaded.get(key), "{path}: {key}");
        }
        assert_eq!(preloaded.get("first_bytes"), 16 * GIB, "{path}");
    }
}

#[test]
fn a_limit_larger_than_the_card_reports_the_card() {
    let r = fill("procaddr").env("FAKEGPU_MEMORY", "2g").env("CUDA_DEVICE_MEMORY_LIMIT", "8g").report();
    assert_eq!(r.get("device_total"), 2 * GIB);
    assert_eq!(r.get("info_total"), 2 * GIB);
    assert_eq!(r.get("first_bytes"), 2 * GIB);
    assert_eq!(r.get("first_status"), CUDA_ERROR_OUT_OF_MEMORY);
}

#[test]
fn a_driver_refusal_rolls_the_reservation_back() {
    // Budget 2.5 GiB on a 2 GiB card, 768 MiB chunks: the third chunk passes our check and is
    // refused by the driver. Free memory must then read min(2.5 − 1.5, 0.5) = 0.5 GiB; a leaked
    // reservation would leave only 0.25 GiB.
    let r = Run::new("direct", &["fill", "768"])
        .env("FAKEGPU_MEMORY", "2g")
        .env("CUDA_DEVICE_MEMORY_LIMIT_0", "2560m")
        .report();
    assert_eq!(r.get("first_bytes"), 1536 * MIB);
    assert_eq!(r.get("full_free"), 512 * MIB);
}

#[test]
fn a_bad_limit_fails_closed_with_a_clear_message() {
    let r = fill("dlsym").env("CUDA_DEVICE_MEMORY_LIMIT_0", "lots").report();
    assert_eq!(r.get("first_bytes"), 0);
    assert_eq!(r.get("first_status"), CUDA_ERROR_OUT_OF_MEMORY);
    assert_eq!(r.get("info_total"), 0);
    assert_eq!(
        r.stderr.matches("CUDA_DEVICE_MEMORY_LIMIT_0=\"lots\"").count(),
        1,
        "logged once: {}",
        r.stderr
    );
}

#[test]
fn the_per_device_variable_overrides_the_global_one() {
    let r = fill("direct")
        .env("CUDA_DEVICE_MEMORY_LIMIT", "2g")
        .env("CUDA_DEVICE_MEMORY_LIMIT_0", "512m")
        .report();
    assert_eq!(r.get("first_bytes"), 512 * MIB);
}

#[test]
fn nvml_reports_the_budget() {
    let r = Run::new("direct", &["nvml"]).env("CUDA_DEVICE_MEMORY_LIMIT_0", "1g").report();
    assert!(r.success, "{r:?}");
    assert_eq!(r.get("nvml0_total"), GIB);
    assert_eq!(r.get("nvml0_used"), 0);
    assert_eq!(r.get("nvml0_free"), GIB);
    assert_eq!(r.get("nvml0_v2_total"), GIB);
    let native = Run::new("direct", &["nvml"]).report();
    assert_eq!(native.get("nvml0_total"), 16 * GIB);
}

#[test]
fn nvml_devices_are_matched_to_cuda_ordinals_by_uuid() {
    // CUDA enumerates the two fake devices in reverse, so CUDA ordinal 0 is NVML index 1.
    let r = Run::new("direct", &["nvml"])
        .env("FAKEGPU_DEVICES", "2")
        .env("FAKEGPU_CUDA_ORDER", "reverse")
        .env("CUDA_DEVICE_MEMORY_LIMIT_0", "1g")
        .report();
    assert_eq!(r.get("nvml_devices"), 2);
    assert_eq!(r.get("nvml1_total"), GIB);
    assert_eq!(r.get("nvml0_total"), 16 * GIB);
}

#[test]
fn cuda_visible_devices_selects_the_budgeted_device() {
    // CUDA_VISIBLE_DEVICES=1 makes physical device 1 CUDA ordinal 0; its budget follows it.
    let r = Run::new("direct", &["nvml"])
        .env("FAKEGPU_DEVICES", "2")
        .env("CUDA_VISIBLE_DEVICES", "1")
        .env("CUDA_DEVICE_MEMORY_LIMIT_0", "1g")
        .report();
    assert_eq!(r.get("nvml1_total"), GIB);
    assert_eq!(r.get("nvml0_total"), 16 * GIB);
}

#[test]
fn get_proc_address_returns_the_exact_variant() {
    let r = Run::new("direct", &["symbols"]).env("CUDA_DEVICE_MEMORY_LIMIT_0", "1g").report();
    assert!(r.success, "{r:?}");
    assert_eq!(r.get("old_abi_status"), 0);
    assert_eq!(r.get("old_abi_is_driver_v1"), 1, "a 3000 request gets the driver's 32-bit cuMemAlloc");
    assert_eq!(r.get("new_abi_is_hook"), 1, "a 12000 request gets our cuMemAlloc_v2");
    assert_eq!(r.get("self_is_hook"), 1, "cuGetProcAddress fetched through itself is ours");
    assert_eq!(r.get("missing_status"), 500);
    assert_eq!(r.get("missing_symbol_status"), 1);
    assert_eq!(r.get("missing_is_null"), 1);
    assert_eq!(r.get("cublas_untouched"), 1);
}

#[test]
fn rtld_next_lookups_keep_the_callers_identity() {
    let r = Run::new("direct", &["symbols"]).report();
    assert_eq!(r.get("next_matches_default"), 1);
}

#[test]
fn a_second_copy_of_the_driver_in_its_own_namespace_is_passed_through() {
    // dlmopen(LM_ID_NEWLM) loads the fake driver again; lookups on that handle get that copy's own
    // functions (our hooks would call the first copy with the second copy's objects), and the
    // first copy keeps its budget.
    for path in ["direct", "dlsym"] {
        let r = Run::new(path, &["dlmopen"]).env("CUDA_DEVICE_MEMORY_LIMIT_0", "1g").report();
        assert!(r.success, "{path}: {r:?}");
        assert_eq!(r.get("second_open"), 1, "{path}: {r:?}");
        assert_eq!(
            r.get("second_elsewhere"),
            0,
            "{path}: the copy's lookups were answered by another object"
        );
        assert_eq!(r.get("second_init_status"), 0, "{path}: {r:?}");
        assert_eq!(r.get("second_alloc_status"), 0, "{path}: {r:?}");
        assert_eq!(r.get("first_bytes"), GIB, "{path}: {r:?}");
        assert_eq!(r.get("first_status"), CUDA_ERROR_OUT_OF_MEMORY, "{path}: {r:?}");
    }
}

#[test]
fn exports_are_exactly_the_hooks_and_no_vulkan() {
    let lib = &common::artifacts().libvgpu;
    let out = std::process::Command::new("nm").args(["-D", "--defined-only"]).arg(lib).output().expect("nm");
    let text = String::from_utf8_lossy(&out.stdout);
    // dlsym and dlvsym are also exported under glibc's first version on the architecture
    // (link/glibc_versions.rs), sorted here as nm names them.
    let aarch64 = common::cross().is_some_and(|cross| cross.triple.starts_with("aarch64"))
        || (common::cross().is_none() && cfg!(target_arch = "aarch64"));
    let baseline = if aarch64 { "GLIBC_2.17" } else { "GLIBC_2.2.5" };
    let mut exported: Vec<&str> = text
        .lines()
        .filter_map(|line| {
            let mut parts = line.split_whitespace();
            let (_, kind, name) = (parts.next()?, parts.next()?, parts.next()?);
            (kind == "T").then_some(name)
        })
        .collect();
    exported.sort_unstable();
    assert_eq!(
        exported,
        [
            "cuArray3DCreate_v2",
            "cuArrayCreate_v2",
            "cuArrayDestroy",
            "cuCtxCreate_v2",
            "cuCtxCreate_v3",
            "cuCtxCreate_v4",
            "cuCtxDestroy_v2",
            "cuCtxSynchronize",
            "cuCtxSynchronize_v2",
            "cuDevicePrimaryCtxRelease_v2",
            "cuDevicePrimaryCtxRetain",
            "cuDeviceTotalMem_v2",
            "cuEventQuery",
            "cuEventSynchronize",
            "cuGetProcAddress",
            "cuGetProcAddress_v2",
            "cuGraphExecDestroy",
            "cuGraphInstantiate",
            "cuGraphInstantiateWithFlags",
            "cuGraphInstantiateWithParams",
            "cuGraphInstantiateWithParams_ptsz",
            "cuGraphInstantiate_v2",
            "cuGraphLaunch",
            "cuGraphLaunch_ptsz",
            "cuGreenCtxCreate",
            "cuGreenCtxDestroy",
            "cuInit",
            "cuLaunchCooperativeKernel",
            "cuLaunchCooperativeKernel_ptsz",
            "cuLaunchKernel",
            "cuLaunchKernelEx",
            "cuLaunchKernelEx_ptsz",
            "cuLaunchKernel_ptsz",
            "cuMemAllocAsync",
            "cuMemAllocAsync_ptsz",
            "cuMemAllocFromPoolAsync",
            "cuMemAllocFromPoolAsync_ptsz",
            "cuMemAllocManaged",
            "cuMemAllocPitch_v2",
            "cuMemAlloc_v2",
            "cuMemCreate",
            "cuMemExportToShareableHandle",
            "cuMemFreeAsync",
            "cuMemFreeAsync_ptsz",
            "cuMemFree_v2",
            "cuMemGetAddressRange_v2",
            "cuMemGetAllocationPropertiesFromHandle",
            "cuMemGetInfo_v2",
            "cuMemMap",
            "cuMemPoolGetAttribute",
            "cuMemPoolSetAttribute",
            "cuMemPoolTrimTo",
            "cuMemRelease",
            "cuMemRetainAllocationHandle",
            "cuMemSetAccess",
            "cuMemUnmap",
            "cuMemcpy",
            "cuMemcpy2DAsync_v2",
            "cuMemcpy2DAsync_v2_ptsz",
            "cuMemcpy2DUnaligned_v2",
            "cuMemcpy2DUnaligned_v2_ptds",
            "cuMemcpy2D_v2",
            "cuMemcpy2D_v2_ptds",
            "cuMemcpy3DAsync_v2",
            "cuMemcpy3DAsync_v2_ptsz",
            "cuMemcpy3DPeer",
            "cuMemcpy3DPeerAsync",
            "cuMemcpy3DPeerAsync_ptsz",
            "cuMemcpy3DPeer_ptds",
            "cuMemcpy3D_v2",
            "cuMemcpy3D_v2_ptds",
            "cuMemcpyAsync",
            "cuMemcpyAsync_ptsz",
            "cuMemcpyAtoA_v2",
            "cuMemcpyAtoA_v2_ptds",
            "cuMemcpyAtoD_v2",
            "cuMemcpyAtoD_v2_ptds",
            "cuMemcpyDtoA_v2",
            "cuMemcpyDtoA_v2_ptds",
            "cuMemcpyDtoDAsync_v2",
            "cuMemcpyDtoDAsync_v2_ptsz",
            "cuMemcpyDtoD_v2",
            "cuMemcpyDtoD_v2_ptds",
            "cuMemcpyDtoHAsync_v2",
            "cuMemcpyDtoHAsync_v2_ptsz",
            "cuMemcpyDtoH_v2",
            "cuMemcpyDtoH_v2_ptds",
            "cuMemcpyHtoDAsync_v2",
            "cuMemcpyHtoDAsync_v2_ptsz",
            "cuMemcpyHtoD_v2",
            "cuMemcpyHtoD_v2_ptds",
            "cuMemcpyPeer",
            "cuMemcpyPeerAsync",
            "cuMemcpyPeerAsync_ptsz",
            "cuMemcpyPeer_ptds",
            "cuMemcpy_ptds",
            "cuMemsetD16Async",
            "cuMemsetD16Async_ptsz",
            "cuMemsetD16_v2",
            "cuMemsetD16_v2_ptds",
            "cuMemsetD2D16Async",
            "cuMemsetD2D16Async_ptsz",
            "cuMemsetD2D16_v2",
            "cuMemsetD2D16_v2_ptds",
            "cuMemsetD2D32Async",
            "cuMemsetD2D32Async_ptsz",
            "cuMemsetD2D32_v2",
            "cuMemsetD2D32_v2_ptds",
            "cuMemsetD2D8Async",
            "cuMemsetD2D8Async_ptsz",
            "cuMemsetD2D8_v2",
            "cuMemsetD2D8_v2_ptds",
            "cuMemsetD32Async",
            "cuMemsetD32Async_ptsz",
            "cuMemsetD32_v2",
            "cuMemsetD32_v2_ptds",
            "cuMemsetD8Async",
            "cuMemsetD8Async_ptsz",
            "cuMemsetD8_v2",
            "cuMemsetD8_v2_ptds",
            "cuMipmappedArrayCreate",
            "cuMipmappedArrayDestroy",
            "cuPointerGetAttribute",
            "cuPointerGetAttributes",
            "cuStreamQuery",
            "cuStreamQuery_ptsz",
            "cuStreamSynchronize",
            "cuStreamSynchronize_ptsz",
            "dlsym@@GLIBC_2.34",
            format!("dlsym@{baseline}").as_str(),
            format!("dlvsym@{baseline}").as_str(),
            "dlvsym@GLIBC_2.34",
            "nvmlDeviceGetMemoryInfo",
            "nvmlDeviceGetMemoryInfo_v2",
        ]
    );
    assert!(!text.contains(" vk"), "no Vulkan symbol may be exported");
}
