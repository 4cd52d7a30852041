//! Two fake GPUs in one container, the CPU half of `ci/gpu-multi` (issue 25): per-device budgets
//! under `CUDA_VISIBLE_DEVICES=0,1` and `1,0`; the driver API's, NVML's and `vgpu-smi`'s views of
//! each device agreeing, matched by UUID; a killed process's bytes leaving its own device only; and
//! the Vulkan layer giving lavapipe, paired with the *second* fake GPU by UUID, the budget of
//! whichever CUDA ordinal that GPU has.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{Client, GIB, MIB, Run, SHARED_CACHE_VAR, Scratch, timed_alone};
use serde_json::Value;

const READY: Duration = Duration::from_secs(20);
const EXIT: Duration = Duration::from_secs(20);
const ORDERS: [&str; 2] = ["0,1", "1,0"];
/// The fake driver's default UUIDs of physical devices 0 and 1.
const UUIDS: [&str; 2] =
    ["GPU-face0000-0000-4e00-8000-000000000000", "GPU-face0000-0000-4e00-8000-000000000001"];
/// `CUDA_DEVICE_MEMORY_LIMIT_0=1g`, `_1=2g`: the budgets of CUDA ordinals 0 and 1.
const BUDGETS: [u64; 2] = [GIB, 2 * GIB];
/// What each fake context costs its device.
const CONTEXT: u64 = 64 * MIB;
const VK_ERROR_OUT_OF_DEVICE_MEMORY: i64 = -2;

/// The physical device (NVML index) that CUDA ordinal `ordinal` is under `order`.
fn physical(order: &str, ordinal: usize) -> usize {
    order.split(',').nth(ordinal).and_then(|p| p.parse().ok()).expect("an order of two indices")
}

fn text(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

/// `command` in the container of region `cache`: two fake GPUs in `order`, 1g and 2g budgets.
fn container(cache: &Path, order: &str, command: &[&str]) -> Run {
    Run::new("direct", command)
        .env("FAKEGPU_DEVICES", "2")
        .env("FAKEGPU_CONTEXT_MEMORY", "64m")
        .env("CUDA_VISIBLE_DEVICES", order)
        .env("CUDA_DEVICE_MEMORY_LIMIT_0", "1g")
        .env("CUDA_DEVICE_MEMORY_LIMIT_1", "2g")
        .env(SHARED_CACHE_VAR, text(cache))
}

/// `vgpu-smi --json REGION` from outside the container (no libvgpu), with the fake driver's NVML
/// for the physical view: the region's part of the document.
fn smi_region(cache: &Path) -> Value {
    let output = Command::new(common::smi_binary())
        .args(["--json", text(cache)])
        .env_remove("LD_PRELOAD")
        .env_remove(SHARED_CACHE_VAR)
        .env_remove("CUDA_VISIBLE_DEVICES")
        .env("LD_LIBRARY_PATH", &common::artifacts().fake_driver_dir)
        .env("FAKEGPU_DEVICES", "2")
        .output()
        .expect("run vgpu-smi");
    assert!(output.status.success(), "vgpu-smi: {}", String::from_utf8_lossy(&output.stderr));
    let doc: Value = serde_json::from_slice(&output.stdout).expect("vgpu-smi --json prints JSON");
    doc["containers"][0]["region"].clone()
}

fn u64_at(value: &Value, pointer: &str) -> u64 {
    value
        .pointer(pointer)
        .and_then(Value::as_u64)
        .unwrap_or_else(|| panic!("no number at {pointer} in {value:#}"))
}

#[test]
fn each_ordinal_is_held_to_its_own_budget_in_both_orders() {
    let _alone = timed_alone();
    let s = Scratch::new("multi-budgets");
    for order in ORDERS {
        let cache = s.path(&format!("budgets-{}.cache", order.replace(',', "")));
        for (ordinal, budget) in BUDGETS.into_iter().enumerate() {
            let case = format!("CUDA_VISIBLE_DEVICES={order}, ordinal {ordinal}");
            let r =
                container(&cache, order, &["fill", "64"]).env("CLIENT_DEVICE", &ordinal.to_string()).report();
            assert!(r.success, "{case}: {r:?}");
            assert_eq!(r.get("device_total"), budget, "{case}: cuDeviceTotalMem_v2");
            assert_eq!(r.get("info_total"), budget, "{case}: cuMemGetInfo_v2 total");
            assert_eq!(r.get("info_free"), budget - CONTEXT, "{case}: its own context charged");
            assert_eq!(r.get("first_bytes"), budget - CONTEXT, "{case}: 64 MiB chunks up to the budget");
            assert_eq!(r.get("first_status"), 2, "{case}: CUDA_ERROR_OUT_OF_MEMORY past it");
            assert_eq!(r.get("second_bytes"), budget - CONTEXT, "{case}: whole again after the frees");
        }
        // NVML numbers GPUs physically: each budget is found on the GPU its ordinal names.
        let nvml = container(&cache, order, &["nvml"]).report();
        assert!(nvml.success, "{order}: {nvml:?}");
        assert_eq!(nvml.get("nvml_devices"), 2, "{order}");
        for (ordinal, budget) in BUDGETS.into_iter().enumerate() {
            let index = physical(order, ordinal);
            assert_eq!(nvml.get(&format!("nvml{index}_total")), budget, "{order}: NVML index {index}");
            assert_eq!(
                nvml.get(&format!("nvml{index}_v2_total")),
                budget,
                "{order}: NVML index {index}, _v2"
            );
        }
    }
}

/// One process per ordinal holding memory (the `steps` client, whose `info` is its own
/// cuMemGetInfo_v2); returns them with what each saw as free.
fn holders(cache: &Path, order: &str, mib: [u64; 2]) -> Vec<(Client, u64)> {
    (0..2)
        .map(|ordinal| {
            let mut client =
                container(cache, order, &["steps"]).env("CLIENT_DEVICE", &ordinal.to_string()).spawn();
            client.wait_for("ready", READY);
            client.send(&format!("alloc held {}", mib[ordinal]));
            assert_eq!(client.wait_for("held_status", READY), 0, "{order}: ordinal {ordinal} refused");
            client.send("info seen");
            let free = client.wait_for("seen_free", READY);
            assert_eq!(client.get("seen_total"), BUDGETS[ordinal], "{order}: ordinal {ordinal}");
            (client, free)
        })
        .collect()
}

#[test]
fn cuda_nvml_and_vgpu_smi_agree_on_every_device_in_both_orders() {
    let _alone = timed_alone();
    let s = Scratch::new("multi-agree");
    for order in ORDERS {
        let cache = s.path(&format!("agree-{}.cache", order.replace(',', "")));
        let mib = [256, 512];
        let mut held = holders(&cache, order, mib);
        for (ordinal, (_, free)) in held.iter().enumerate() {
            // Its own context and allocation, nothing of the other device's holder.
            assert_eq!(*free, BUDGETS[ordinal] - CONTEXT - mib[ordinal] * MIB, "{order}: ordinal {ordinal}");
        }

        // NVML inside the container (a process with no context of its own) agrees per device.
        let nvml = container(&cache, order, &["nvml"]).report();
        assert!(nvml.success, "{order}: {nvml:?}");
        for (ordinal, (_, free)) in held.iter().enumerate() {
            let index = physical(order, ordinal);
            let case = format!("{order}: ordinal {ordinal} = NVML index {index}");
            assert_eq!(nvml.get(&format!("nvml{index}_total")), BUDGETS[ordinal], "{case}");
            assert_eq!(
                nvml.get(&format!("nvml{index}_free")),
                *free,
                "{case}: NVML free = cuMemGetInfo free"
            );
            assert_eq!(nvml.get(&format!("nvml{index}_used")), BUDGETS[ordinal] - free, "{case}");
        }

        // vgpu-smi from outside: the region's devices are the CUDA ordinals, each matched to its
        // physical GPU by UUID.
        let region = smi_region(&cache);
        for (ordinal, (client, free)) in held.iter().enumerate() {
            let index = physical(order, ordinal);
            let device = &region["devices"][ordinal];
            let case = format!("{order}: region device {ordinal}");
            assert_eq!(device["uuid"], UUIDS[index], "{case}: {region:#}");
            assert_eq!(device["physical_index"], index, "{case}: {region:#}");
            assert_eq!(u64_at(device, "/budget"), BUDGETS[ordinal], "{case}");
            assert_eq!(u64_at(device, "/used"), BUDGETS[ordinal] - free, "{case}");
            assert_eq!(u64_at(device, "/contexts"), CONTEXT, "{case}");
            let process = region["processes"]
                .as_array()
                .and_then(|all| all.iter().find(|p| p["pid"] == client.pid()))
                .unwrap_or_else(|| panic!("{case}: pid {} missing: {region:#}", client.pid()));
            let bytes: Vec<u64> = (0..2)
                .map(|d| {
                    process["devices"]
                        .as_array()
                        .and_then(|all| all.iter().find(|x| x["index"] == d))
                        .and_then(|x| x["bytes"].as_u64())
                        .unwrap_or(0)
                })
                .collect();
            let mut want = vec![0, 0];
            want[ordinal] = CONTEXT + mib[ordinal] * MIB;
            assert_eq!(bytes, want, "{case}: what pid {} holds per device", client.pid());
        }

        // SIGKILL of the holder on ordinal 1: its device is whole again within 2 s, the other
        // device keeps exactly what its holder holds.
        let (mut victim, _) = held.pop().expect("two holders");
        let killed = Instant::now();
        victim.kill();
        let _ = victim.finish(EXIT);
        let used = |region: &Value, d: usize| u64_at(region, &format!("/devices/{d}/used"));
        let mut now = smi_region(&cache);
        while used(&now, 1) != 0 && killed.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(20));
            now = smi_region(&cache);
        }
        let took = killed.elapsed();
        assert_eq!(used(&now, 1), 0, "{order}: ordinal 1 still charged {took:?} after the kill: {now:#}");
        assert!(took < Duration::from_secs(2), "{order}: {took:?}");
        assert_eq!(used(&now, 0), CONTEXT + mib[0] * MIB, "{order}: ordinal 0 untouched");
        let (mut survivor, _) = held.pop().expect("one holder left");
        survivor.close_stdin();
        assert!(survivor.finish(EXIT).success, "{order}");
    }
}

/// The Vulkan client with the layer on lavapipe, which shares the UUID of the *second* fake GPU
/// (physical device 1), budgets of 256 MiB on ordinal 0 and 512 MiB on ordinal 1.
fn vulkan(s: &Scratch, cache: &Path, order: &str, command: &[&str]) -> Run {
    Run::vulkan(command)
        .layer(s)
        .without("FAKEGPU_UUIDS")
        .env("FAKEGPU_UUIDS", &format!("{},{}", UUIDS[0], common::LAVAPIPE_UUID))
        .env("FAKEGPU_DEVICES", "2")
        .env("CUDA_VISIBLE_DEVICES", order)
        .env("CUDA_DEVICE_MEMORY_LIMIT_0", "256m")
        .env("CUDA_DEVICE_MEMORY_LIMIT_1", "512m")
        .env(SHARED_CACHE_VAR, text(cache))
}

#[test]
fn lavapipe_as_the_second_gpu_gets_the_budget_of_its_ordinal_in_both_orders() {
    let _alone = timed_alone();
    let s = Scratch::new("multi-vulkan");
    let lavapipe = common::LAVAPIPE_UUID.replace('-', "");
    for order in ORDERS {
        // Physical device 1 (lavapipe) is ordinal 1 under 0,1 and ordinal 0 under 1,0.
        let ordinal = if order == "0,1" { 1 } else { 0 };
        let budget = [256 * MIB, 512 * MIB][ordinal];
        let cache = s.path(&format!("vk-{}.cache", order.replace(',', "")));
        let r = vulkan(&s, &cache, order, &["devices", "select", &lavapipe, "info", "alloc", "64", "16"])
            .report();
        assert!(r.success && !r.values.contains_key("error"), "{order}:\n{}\n{}", r.stdout, r.stderr);
        assert_eq!(r.values["vk_device0_uuid"], lavapipe, "{order}:\n{}", r.stdout);
        assert_eq!(r.get("vk_device0_heap0_size"), budget, "{order}: the device list:\n{}", r.stdout);
        assert_eq!(r.values["selected"], lavapipe, "{order}");
        assert_eq!(r.get("heap0_size"), budget, "{order}:\n{}", r.stdout);
        assert_eq!(r.get("vk_alloc_ok"), budget / (64 * MIB), "{order}:\n{}\n{}", r.stdout, r.stderr);
        assert_eq!(r.get_i64("vk_alloc_result"), VK_ERROR_OUT_OF_DEVICE_MEMORY, "{order}:\n{}", r.stdout);

        // CUDA siblings of 128 MiB: the one on lavapipe's ordinal takes from its budget, the one
        // on the other ordinal does not.
        for (sibling, shared) in [(ordinal, true), (1 - ordinal, false)] {
            let case = format!("{order}: CUDA sibling on ordinal {sibling}");
            let mut holder = Run::new("direct", &["hold", "128", "128"])
                .env("FAKEGPU_UUIDS", &format!("{},{}", UUIDS[0], common::LAVAPIPE_UUID))
                .env("FAKEGPU_DEVICES", "2")
                .env("CUDA_VISIBLE_DEVICES", order)
                .env("CUDA_DEVICE_MEMORY_LIMIT_0", "256m")
                .env("CUDA_DEVICE_MEMORY_LIMIT_1", "512m")
                .env(SHARED_CACHE_VAR, text(&cache))
                .env("CLIENT_DEVICE", &sibling.to_string())
                .spawn();
            assert_eq!(holder.wait_for("held_bytes", READY), 128 * MIB, "{case}");
            let r = vulkan(&s, &cache, order, &["select", &lavapipe, "alloc", "64", "16"]).report();
            assert!(r.success && !r.values.contains_key("error"), "{case}:\n{}\n{}", r.stdout, r.stderr);
            let left = if shared { budget - 128 * MIB } else { budget };
            assert_eq!(r.get("vk_alloc_ok"), left / (64 * MIB), "{case}:\n{}\n{}", r.stdout, r.stderr);
            holder.close_stdin();
            assert!(holder.finish(EXIT).success, "{case}");
        }
    }
}

/// Permille of the fake's simulated GPU time a share may miss by (`tests/compute_limits.rs`'s).
const SHARE_TOLERANCE: u64 = 30;

#[test]
fn one_process_is_held_to_each_devices_share_and_peer_copies_to_the_issuers() {
    let _alone = timed_alone();
    for order in ORDERS {
        // Kernels, and peer copies that cross: ordinal 0 (30 %) copies into ordinal 1 (70 %) and
        // back, so pacing by the destination's share would show 700/300.
        for entry in ["kernel", "peer"] {
            let case = format!("CUDA_VISIBLE_DEVICES={order}, {entry}");
            let r = Run::compute("direct", &["pair", entry, "2000", "100"])
                .env("FAKEGPU_DEVICES", "2")
                .env("CUDA_VISIBLE_DEVICES", order)
                .env("CUDA_DEVICE_SM_LIMIT_0", "30")
                .env("CUDA_DEVICE_SM_LIMIT_1", "70")
                .report_within(EXIT);
            assert!(r.success, "{case}:\n{}\n{}", r.stdout, r.stderr);
            for (ordinal, percent) in [(0, 30), (1, 70)] {
                assert_eq!(r.get(&format!("dev{ordinal}_status")), 0, "{case}:\n{}", r.stdout);
                assert_eq!(r.get(&format!("dev{ordinal}_launches")), 100, "{case}:\n{}", r.stdout);
                let seen = r.get(&format!("dev{ordinal}_share_permille"));
                // Short by no more than what the machine took from its launching thread (651‰ of
                // 700 was once seen beside other tests' clients).
                let starved = r.starved_permille(&format!("dev{ordinal}_"));
                assert!(
                    seen <= percent * 10 + SHARE_TOLERANCE
                        && seen + SHARE_TOLERANCE + starved >= percent * 10,
                    "{case}: ordinal {ordinal} held {seen}‰ of its GPU, want {}‰ ± {SHARE_TOLERANCE} \
                     (less {starved}‰ starved of CPU)\n{}\n{}",
                    percent * 10,
                    r.stdout,
                    r.stderr
                );
            }
        }
    }
}
