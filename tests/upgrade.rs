//! Upgrade in place (docs/shared-ledger.md, "Compatibility between releases"): the previous
//! release, built from its tag, and this one run side by side in one container region against the
//! fake driver, whichever of them created the region. One budget, exact accounting, dead processes
//! reclaimed by the other release, and this release's `vgpu-smi` reports both.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{Client, GIB, MIB, Run, SHARED_CACHE_VAR, Scratch, previous_release};
use serde_json::Value;

const CUDA_ERROR_OUT_OF_MEMORY: u64 = 2;
const READY: Duration = Duration::from_secs(20);
const EXIT: Duration = Duration::from_secs(10);
/// The fake driver's device 0.
const UUID0: &str = "GPU-face0000-0000-4e00-8000-000000000000";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Release {
    Previous,
    This,
}

/// One container: its region, and the fake driver's own count shared by its processes.
struct Container {
    scratch: Scratch,
    cache: PathBuf,
}

impl Container {
    fn new(name: &str) -> Container {
        let scratch = Scratch::new(name);
        let cache = scratch.path("cudevshr.cache");
        Container { scratch, cache }
    }

    /// A process of `release` in this container, with a 1 GiB budget on device 0, running the
    /// client's `steps` command.
    fn process(&self, release: Release) -> Client {
        let mut run = Run::new("direct", &["steps"])
            .env(SHARED_CACHE_VAR, self.cache.to_str().expect("utf-8 path"))
            .env("CUDA_DEVICE_MEMORY_LIMIT_0", "1g")
            .env("FAKEGPU_SHARED", self.scratch.path("fake").to_str().expect("utf-8 path"));
        if release == Release::Previous {
            run = run.library(&previous_release().libvgpu);
        }
        let mut client = run.spawn();
        client.wait_for("ready", READY);
        client
    }
}

/// Sends one step and waits for its answer, `key`.
fn step(client: &mut Client, line: &str, key: &str) -> u64 {
    client.send(line);
    client.wait_for(key, READY)
}

/// This release's `vgpu-smi --json` of the region.
fn smi_json(cache: &Path) -> Value {
    let output = Command::new(common::smi_binary())
        .arg("--json")
        .arg(cache)
        .env_remove(SHARED_CACHE_VAR)
        .env_remove("LD_PRELOAD")
        .output()
        .expect("run vgpu-smi");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "vgpu-smi failed: {stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("not JSON ({e}):\n{stdout}"))
}

/// Bytes per live process in `vgpu-smi --json`, by pid, and whether each follows resizes.
fn processes(json: &Value) -> Vec<(u64, u64, bool)> {
    assert!(json["containers"][0]["error"].is_null(), "vgpu-smi could not read the region: {json:#}");
    let region = &json["containers"][0]["region"];
    assert_eq!(region["devices"][0]["uuid"], UUID0, "{json:#}");
    let mut seen: Vec<(u64, u64, bool)> = region["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .filter(|p| p["alive"] == true)
        .map(|p| {
            let pid = p["pid"].as_u64().expect("pid");
            let bytes = p["bytes"].as_u64().expect("bytes");
            (pid, bytes, p["follows_resize"] == true)
        })
        .collect();
    seen.sort();
    seen
}

/// The whole exchange of the issue, with `creator` making the region and the other release
/// joining it: both hold, both are refused at the budget, a free shows at once, a kill of either is
/// reclaimed by the other.
fn one_budget_across_releases(name: &str, creator: Release) {
    let joiner = if creator == Release::This { Release::Previous } else { Release::This };
    let c = Container::new(name);

    // The creator holds 512 MiB of the 1 GiB budget.
    let mut first = c.process(creator);
    assert_eq!(step(&mut first, "alloc a 512", "a_status"), 0, "{creator:?} was refused its first 512 MiB");

    // The joiner sees it, gets the other 512 MiB, and is refused past the budget.
    let mut second = c.process(joiner);
    assert_eq!(step(&mut second, "info before", "before_total"), GIB);
    assert_eq!(
        second.wait_for("before_free", READY),
        512 * MIB,
        "{joiner:?} does not see {creator:?}'s 512 MiB"
    );
    assert_eq!(step(&mut second, "alloc b 512", "b_status"), 0, "{joiner:?} was refused the other 512 MiB");
    assert_eq!(step(&mut second, "alloc over 64", "over_status"), CUDA_ERROR_OUT_OF_MEMORY, "{joiner:?}");
    assert_eq!(step(&mut first, "alloc over 64", "over_status"), CUDA_ERROR_OUT_OF_MEMORY, "{creator:?}");
    assert_eq!(common::ledger_used0(&c.cache), GIB);

    // This release's vgpu-smi shows both processes and which of them follows resizes.
    let json = smi_json(&c.cache);
    let mut expected = vec![
        (u64::from(first.pid()), 512 * MIB, creator == Release::This),
        (u64::from(second.pid()), 512 * MIB, joiner == Release::This),
    ];
    expected.sort();
    assert_eq!(processes(&json), expected, "{json:#}");
    assert_eq!(json["containers"][0]["region"]["devices"][0]["used"], GIB, "{json:#}");
    let made_by = if creator == Release::This { env!("CARGO_PKG_VERSION") } else { "0.1.0" };
    assert_eq!(json["containers"][0]["region"]["created_by"], made_by, "{json:#}");

    // The creator frees: the joiner has the budget whole.
    assert_eq!(step(&mut first, "free a", "a_freed"), 1);
    assert_eq!(step(&mut second, "free b", "b_freed"), 1);
    assert_eq!(step(&mut second, "info whole", "whole_free"), GIB, "{joiner:?} after both freed");
    assert_eq!(
        step(&mut second, "alloc all 1024", "all_status"),
        0,
        "{joiner:?} could not take the whole budget"
    );
    assert_eq!(step(&mut second, "free all", "all_freed"), 1);

    // A SIGKILL of either release is reclaimed by the other.
    for (victim_release, survivor) in [(joiner, &mut first), (creator, &mut second)] {
        let mut victim = c.process(victim_release);
        assert_eq!(step(&mut victim, "alloc held 768", "held_status"), 0, "{victim_release:?}");
        assert_eq!(step(survivor, "alloc early 512", "early_status"), CUDA_ERROR_OUT_OF_MEMORY);
        let killed_at = Instant::now();
        victim.kill();
        assert!(!victim.finish(EXIT).success);
        let deadline = killed_at + Duration::from_secs(2);
        let mut round = 0;
        loop {
            round += 1;
            let status = step(survivor, &format!("alloc late{round} 1024"), &format!("late{round}_status"));
            if status == 0 {
                step(survivor, &format!("free late{round}"), &format!("late{round}_freed"));
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the killed {victim_release:?} process's 768 MiB were not reclaimed within 2 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    assert_eq!(common::ledger_used0(&c.cache), 0);

    first.close_stdin();
    second.close_stdin();
    assert!(first.finish(EXIT).success);
    assert!(second.finish(EXIT).success);
}

#[test]
fn this_release_joins_a_region_the_previous_one_made() {
    one_budget_across_releases("upgrade-old-made", Release::Previous);
}

#[test]
fn the_previous_release_joins_a_region_this_one_made() {
    one_budget_across_releases("upgrade-new-made", Release::This);
}

#[test]
fn a_region_needing_a_feature_this_release_lacks_fails_closed_with_its_message() {
    let c = Container::new("upgrade-required");
    let mut maker = c.process(Release::This);
    assert_eq!(step(&mut maker, "alloc a 64", "a_status"), 0);
    // What a later release would do for a change older ones must not ignore: a required bit.
    // ledger.required is at 2 008 960 + 24 (ledger/src/region/layout.rs).
    {
        use std::os::unix::fs::FileExt;
        let file = std::fs::OpenOptions::new().write(true).open(&c.cache).expect("open region");
        file.write_all_at(&(1u64 << 40).to_le_bytes(), 2_008_960 + 24).expect("write required bits");
    }
    let refused = Run::new("direct", &["hold", "64", "64"])
        .env(SHARED_CACHE_VAR, c.cache.to_str().expect("utf-8 path"))
        .env("CUDA_DEVICE_MEMORY_LIMIT_0", "1g")
        .report_within(EXIT);
    assert_eq!(refused.get("held_bytes"), 0, "{refused:?}");
    assert_eq!(refused.get("hold_status"), CUDA_ERROR_OUT_OF_MEMORY);
    assert!(
        refused.stderr.contains("needs features 0x10000000000 that libvgpu"),
        "no message naming the unknown feature: {}",
        refused.stderr
    );
    // An unknown compatible bit is ignored: the books stay as they are.
    {
        use std::os::unix::fs::FileExt;
        let file = std::fs::OpenOptions::new().write(true).open(&c.cache).expect("open region");
        file.write_all_at(&0u64.to_le_bytes(), 2_008_960 + 24).expect("clear required bits");
        file.write_all_at(&(1u64 << 40).to_le_bytes(), 2_008_960 + 16).expect("write compatible bits");
    }
    let joined = Run::new("direct", &["hold", "64", "2048"])
        .env(SHARED_CACHE_VAR, c.cache.to_str().expect("utf-8 path"))
        .env("CUDA_DEVICE_MEMORY_LIMIT_0", "1g")
        .report_within(EXIT);
    assert_eq!(joined.get("held_bytes"), GIB - 64 * MIB, "{joined:?}");
    maker.close_stdin();
    assert!(maker.finish(EXIT).success);
}
