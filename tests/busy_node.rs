//! Exact on a busy node: a container is charged for its own memory only, whatever processes of
//! other containers do at the same instant (docs/architecture.md, "Beside neighbours"). Real
//! client processes under `LD_PRELOAD` share one fake card (`FAKEGPU_SHARED`) with neighbours that
//! allocate and free while their contexts come into being; each context takes 300 ms to appear
//! (`FAKEGPU_CONTEXT_DELAY_MS`), charged at its start, so the test can act inside that window.

mod common;

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{Client, GIB, MIB, Run, SHARED_CACHE_VAR, Scratch, XorShift};

/// Bound on a client's start-up and on its exit once told to.
const READY: Duration = Duration::from_secs(10);
/// What each context costs on the fake card.
const CONTEXT: u64 = 256 * MIB;

/// A fake card that several containers share, and the containers' region files.
struct Node {
    scratch: Scratch,
    card: PathBuf,
}

impl Node {
    fn new(name: &str) -> Node {
        let scratch = Scratch::new(name);
        let card = scratch.path("card");
        Node { scratch, card }
    }

    fn on_card(&self, run: Run) -> Run {
        run.env("FAKEGPU_SHARED", self.card.to_str().expect("utf-8 path"))
            .env("FAKEGPU_MEMORY", "64g")
            .env("FAKEGPU_CONTEXT_MEMORY", "256m")
            .env("FAKEGPU_CONTEXT_DELAY_MS", "300")
    }

    /// The region file of container `name`.
    fn region(&self, name: &str) -> PathBuf {
        self.scratch.path(&format!("{name}.cache"))
    }

    /// A process of container `name`, budgeted `limit` on device 0.
    fn process(&self, name: &str, command: &[&str], limit: &str) -> Run {
        self.on_card(Run::new("procaddr", command))
            .env(SHARED_CACHE_VAR, self.region(name).to_str().expect("utf-8 path"))
            .env("CUDA_DEVICE_MEMORY_LIMIT_0", limit)
    }

    /// A process of another container that has no libvgpu: it allocates and frees when told.
    fn neighbour(&self) -> Client {
        let mut neighbour = self.on_card(Run::new("direct", &["steps"]).native()).spawn();
        neighbour.wait_for("ready", READY);
        neighbour
    }

    /// Bytes the fake card holds now, by every process.
    fn card_used(&self) -> u64 {
        let mut bytes = [0u8; 8];
        let _ = std::fs::File::open(&self.card).and_then(|f| f.read_exact_at(&mut bytes, 0));
        u64::from_le_bytes(bytes)
    }

    /// Waits until the card holds at least `bytes`: a context being created is charged at once.
    fn wait_for_card(&self, bytes: u64) {
        let deadline = Instant::now() + READY;
        while self.card_used() < bytes {
            assert!(Instant::now() < deadline, "the card never reached {bytes} bytes: {}", self.card_used());
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// What the region at `path` charges process `pid` on device 0 (its HAMi slot's total), as HAMi's
/// monitor reads it.
fn charged(path: &Path, pid: u32) -> Option<u64> {
    const SLOTS: u64 = 1856;
    const SLOT_LEN: u64 = 1960;
    const TOTAL0: u64 = 8 + 32;
    const STATUS: u64 = 1928;
    let file = std::fs::File::open(path).ok()?;
    let word = |offset: u64| {
        let mut bytes = [0u8; 8];
        file.read_exact_at(&mut bytes, offset).ok().map(|()| u64::from_le_bytes(bytes))
    };
    (0..1024).map(|k| SLOTS + SLOT_LEN * k).find_map(|slot| {
        let pid_and_status = (word(slot)? as u32, word(slot + STATUS)? as u32);
        (pid_and_status == (pid, 1)).then(|| word(slot + TOTAL0)).flatten()
    })
}

/// The container's remembered context cost on device 0 and whether it is marked exact
/// (ledger/src/region/layout.rs: the ledger at 2 008 960, `context_cost_exact` at +48,
/// `context_cost` after the leases and suspects).
fn remembered(path: &Path) -> (Option<u64>, bool) {
    const LEDGER: u64 = 2_008_960;
    const CONTEXT_COST: u64 = LEDGER + 336 + 144 * 1024 + 8 * 16;
    const KNOWN: u64 = 1 << 63;
    let file = std::fs::File::open(path).expect("region");
    let word = |offset: u64| {
        let mut bytes = [0u8; 8];
        file.read_exact_at(&mut bytes, offset).expect("read region");
        u64::from_le_bytes(bytes)
    };
    let cost = word(CONTEXT_COST);
    ((cost & KNOWN != 0).then_some(cost & !KNOWN), word(LEDGER + 48) & 1 != 0)
}

/// When the neighbour acts, against the container process's context creation.
#[derive(Clone, Copy, Debug)]
enum Timing {
    /// Takes 1 GiB before the process starts, and keeps it.
    AllocatesBefore,
    /// Takes 1 GiB while the context comes into being.
    AllocatesDuring,
    /// Holds 1 GiB from before and frees it while the context comes into being.
    FreesDuring,
    /// Takes 1 GiB once the process is ready.
    AllocatesAfter,
}

/// Starts `process` (of a container in `node`) while `neighbour` acts at `timing`, and returns it
/// once ready.
fn start_beside(node: &Node, process: Run, neighbour: &mut Client, timing: Timing, step: usize) -> Client {
    let tag = format!("n{step}");
    if matches!(timing, Timing::AllocatesBefore | Timing::FreesDuring) {
        neighbour.send(&format!("alloc {tag} 1024"));
        assert_eq!(neighbour.wait_for(&format!("{tag}_status"), READY), 0);
    }
    let before = node.card_used();
    let mut process = process.spawn();
    match timing {
        Timing::AllocatesDuring | Timing::FreesDuring => {
            node.wait_for_card(before + CONTEXT);
            let step = if matches!(timing, Timing::FreesDuring) { "free" } else { "alloc" };
            neighbour.send(&format!("{step} {tag}d 1024"));
            neighbour.wait_for(&format!("{tag}d_{}", if step == "free" { "freed" } else { "status" }), READY);
            assert!(!process.has_exited());
        }
        Timing::AllocatesBefore | Timing::AllocatesAfter => {}
    }
    process.wait_for("ready", READY);
    if matches!(timing, Timing::AllocatesAfter) {
        neighbour.send(&format!("alloc {tag}a 1024"));
        assert_eq!(neighbour.wait_for(&format!("{tag}a_status"), READY), 0);
    }
    process
}

#[test]
fn a_context_is_charged_its_own_cost_whatever_a_neighbour_does() {
    let timings =
        [Timing::AllocatesBefore, Timing::AllocatesDuring, Timing::FreesDuring, Timing::AllocatesAfter];
    for (step, timing) in timings.into_iter().enumerate() {
        let node = Node::new("neighbour-timing");
        let mut neighbour = node.neighbour();
        // The container's first process meets the neighbour; a later one starts on a quiet card.
        let first = node.process("pod", &["steps"], "8g");
        let mut first = start_beside(&node, first, &mut neighbour, timing, step);
        let region = node.region("pod");
        assert_eq!(charged(&region, first.pid()), Some(CONTEXT), "{timing:?}: the first process");
        first.send("info first");
        let free = first.wait_for("first_free", READY);
        assert_eq!(free, 8 * GIB - CONTEXT, "{timing:?}: the first process's free memory");
        assert_eq!(remembered(&region), (Some(CONTEXT), true), "{timing:?}: the remembered cost");
        let mut later = node.process("pod", &["steps"], "8g").spawn();
        later.wait_for("ready", READY);
        assert_eq!(charged(&region, later.pid()), Some(CONTEXT), "{timing:?}: a later process");
        later.send("info later");
        assert_eq!(later.wait_for("later_free", READY), 8 * GIB - 2 * CONTEXT, "{timing:?}: both contexts");
        for mut client in [first, later, neighbour] {
            client.close_stdin();
            assert!(client.finish(READY).success, "{timing:?}");
        }
    }
}

#[test]
fn a_start_storm_beside_a_churning_container_charges_every_container_its_own() {
    // 16 processes of 4 containers start at once, each holding its context and a few 64 MiB
    // blocks, while a fifth container under libvgpu allocates and frees 512 MiB blocks.
    let node = Node::new("start-storm");
    let mut churner = node.process("churner", &["churn", "512"], "8g").spawn();
    std::thread::sleep(Duration::from_millis(100));
    let mut random = XorShift::from_clock();
    let mut blocks = [[0u64; 4]; 4];
    let mut clients: Vec<(usize, Client)> = Vec::new();
    for (container, blocks) in blocks.iter_mut().enumerate() {
        for held in blocks.iter_mut() {
            *held = 1 + random.below(4);
            let mib = (64 * *held).to_string();
            let run = node.process(&format!("pod{container}"), &["hold", "64", &mib], "4g");
            clients.push((container, run.spawn()));
        }
    }
    for (_, client) in &mut clients {
        client.wait_for("ready", READY);
    }
    for (container, blocks) in blocks.iter().enumerate() {
        let truth: u64 = blocks.iter().map(|&n| CONTEXT + 64 * MIB * n).sum();
        let region = node.region(&format!("pod{container}"));
        assert_eq!(common::ledger_used0(&region), truth, "container {container}: {blocks:?}");
        let pids = clients.iter().filter(|(c, _)| *c == container).map(|(_, client)| client.pid());
        for (pid, n) in pids.zip(blocks) {
            assert_eq!(
                charged(&region, pid),
                Some(CONTEXT + 64 * MIB * n),
                "container {container}, pid {pid}"
            );
        }
    }
    assert!(!churner.has_exited(), "the churning container stopped");
    churner.kill();
    for (_, mut client) in clients {
        client.close_stdin();
        let report = client.finish(READY);
        assert!(report.success && report.get("released") == 1, "{report:?}");
    }
}

#[test]
fn a_context_nvml_does_not_list_yet_is_charged_a_bound_then_settled() {
    // NVML names the process only 1.5 s after its fake driver starts, so at creation the context
    // is charged a device-wide difference, which a neighbour allocating 1 GiB meanwhile inflates:
    // more than the truth, never less. Once NVML lists the process, the charge settles.
    let node = Node::new("bound");
    let mut neighbour = node.neighbour();
    let before = node.card_used();
    let mut process = node.process("pod", &["steps"], "8g").env("FAKEGPU_NVML_HIDES_SELF_MS", "1500").spawn();
    node.wait_for_card(before + CONTEXT);
    neighbour.send("alloc during 1024");
    assert_eq!(neighbour.wait_for("during_status", READY), 0);
    process.wait_for("ready", READY);
    let region = node.region("pod");
    assert_eq!(charged(&region, process.pid()), Some(CONTEXT + GIB), "the bound: the device-wide difference");
    assert_eq!(remembered(&region), (Some(CONTEXT + GIB), false), "an estimate, not marked exact");
    let deadline = Instant::now() + Duration::from_secs(5);
    while charged(&region, process.pid()) != Some(CONTEXT) {
        assert!(Instant::now() < deadline, "never settled: {:?}", charged(&region, process.pid()));
        std::thread::sleep(Duration::from_millis(20));
    }
    process.send("info settled");
    assert_eq!(process.wait_for("settled_free", READY), 8 * GIB - CONTEXT);
    // Settled, the process frees and allocates as ever; its exit gives everything back.
    process.send("alloc a 512");
    assert_eq!(process.wait_for("a_status", READY), 0);
    assert_eq!(charged(&region, process.pid()), Some(CONTEXT + 512 * MIB));
    process.close_stdin();
    assert!(process.finish(READY).success);
    assert_eq!(common::ledger_used0(&region), 0);
    neighbour.close_stdin();
    assert!(neighbour.finish(READY).success);
}

#[test]
fn a_process_nvml_never_lists_is_charged_the_containers_exact_cost_or_more() {
    // A driver that lists host pids never shows a process in a pid namespace its own pid. Such a
    // process is charged the larger of the container's remembered exact cost and its own
    // device-wide difference: a neighbour freeing meanwhile cannot shrink it below the truth.
    let node = Node::new("never-listed");
    let region = node.region("pod");
    let mut measured = node.process("pod", &["steps"], "8g").spawn();
    measured.wait_for("ready", READY);
    assert_eq!(remembered(&region), (Some(CONTEXT), true));
    let mut neighbour = node.neighbour();
    let mut hidden = start_beside_hidden(&node, &mut neighbour, |node, neighbour, before| {
        node.wait_for_card(before + CONTEXT);
        neighbour.send("free f");
        neighbour.wait_for("f_freed", READY);
    });
    assert_eq!(charged(&region, hidden.pid()), Some(CONTEXT), "the remembered exact cost");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(charged(&region, hidden.pid()), Some(CONTEXT), "nothing to settle against");
    assert_eq!(remembered(&region), (Some(CONTEXT), true), "an estimate never replaces the exact cost");
    for client in [&mut hidden, &mut measured, &mut neighbour] {
        client.close_stdin();
    }
    for client in [hidden, measured, neighbour] {
        assert!(client.finish(READY).success);
    }
}

/// Starts a process of container "pod" whose NVML never lists it, after the neighbour took
/// 1 GiB, running `during` while its context comes into being.
fn start_beside_hidden(
    node: &Node,
    neighbour: &mut Client,
    during: impl FnOnce(&Node, &mut Client, u64),
) -> Client {
    neighbour.send("alloc f 1024");
    assert_eq!(neighbour.wait_for("f_status", READY), 0);
    let before = node.card_used();
    let mut process =
        node.process("pod", &["steps"], "8g").env("FAKEGPU_NVML_HIDES_SELF_MS", "never").spawn();
    during(node, neighbour, before);
    process.wait_for("ready", READY);
    process
}

#[test]
fn a_skewed_cost_the_previous_release_remembered_heals_at_the_next_process() {
    // The previous release measures a context device-wide and the container remembers it: with a
    // neighbour taking 1 GiB meanwhile, every later process of that release is charged 1 GiB too
    // much. A process of this release measures its own, is charged that, and puts it in the region,
    // where the previous release's later processes read it.
    let previous = common::previous_release();
    let node = Node::new("heal");
    let region = node.region("pod");
    let mut neighbour = node.neighbour();
    let old = || node.process("pod", &["steps"], "8g").library(&previous.libvgpu);
    let mut skewed = start_beside(&node, old(), &mut neighbour, Timing::AllocatesDuring, 0);
    assert_eq!(remembered(&region), (Some(CONTEXT + GIB), false), "the previous release's skewed cost");
    assert_eq!(charged(&region, skewed.pid()), Some(CONTEXT + GIB));
    let mut also_skewed = old().spawn();
    also_skewed.wait_for("ready", READY);
    assert_eq!(
        charged(&region, also_skewed.pid()),
        Some(CONTEXT + GIB),
        "remembered by the previous release"
    );

    let mut ours = start_beside(
        &node,
        node.process("pod", &["steps"], "8g"),
        &mut neighbour,
        Timing::AllocatesDuring,
        1,
    );
    assert_eq!(charged(&region, ours.pid()), Some(CONTEXT), "this release measures its own");
    assert_eq!(remembered(&region), (Some(CONTEXT), true), "and heals the region");
    let mut healed = old().spawn();
    healed.wait_for("ready", READY);
    assert_eq!(charged(&region, healed.pid()), Some(CONTEXT), "the previous release reads the healed cost");
    for client in [&mut skewed, &mut also_skewed, &mut ours, &mut healed, &mut neighbour] {
        client.close_stdin();
    }
    for client in [skewed, also_skewed, ours, healed, neighbour] {
        assert!(client.finish(READY).success);
    }
}

#[test]
fn serve_gives_back_a_container_whose_last_process_was_killed_within_moments() {
    // Nobody inside a container is left to reclaim its last process: the node agent does, woken
    // by the close of the region that every killed process makes, not by its once-a-second look.
    let node = Node::new("serve-close");
    let region = node.region("pod");
    let mut serve = std::process::Command::new(common::smi_binary())
        .args(["serve", "--listen", "127.0.0.1:0"])
        .arg(&region)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start vgpu-smi serve");
    let mut give_backs = Vec::new();
    for round in 0..8 {
        let mut process = node.process("pod", &["hold", "64", "256"], "4g").spawn();
        process.wait_for("ready", READY);
        assert_eq!(common::ledger_used0(&region), CONTEXT + 256 * MIB, "round {round}");
        // Let serve's once-a-second look fall anywhere against the kill.
        std::thread::sleep(Duration::from_millis(137 * round));
        process.kill();
        let killed = Instant::now();
        assert!(!process.finish(READY).success);
        while common::ledger_used0(&region) != 0 {
            assert!(killed.elapsed() < READY, "round {round}: never given back");
            std::thread::sleep(Duration::from_millis(2));
        }
        give_backs.push(killed.elapsed());
    }
    let _ = serve.kill();
    let _ = serve.wait();
    give_backs.sort();
    eprintln!("give-backs after a kill: {give_backs:?}");
    // The once-a-second look alone gives a median near 500 ms; a loaded machine can delay a
    // dying process between its close and its lock's release, so the median is what is held.
    assert!(give_backs[give_backs.len() / 2] < Duration::from_millis(200), "{give_backs:?}");
}

#[test]
fn a_context_is_charged_while_the_driver_makes_it() {
    // NVML counts a context's memory while the driver is still making it; the container is
    // charged what a context cost it before, ahead of the driver call, so that its ledger never
    // reads less than the card holds for it.
    let node = Node::new("ahead");
    let region = node.region("pod");
    let mut first = node.process("pod", &["steps"], "8g").spawn();
    first.wait_for("ready", READY);
    assert_eq!(common::ledger_used0(&region), CONTEXT);
    let before = node.card_used();
    let mut later = node.process("pod", &["steps"], "8g").spawn();
    node.wait_for_card(before + CONTEXT);
    assert_eq!(common::ledger_used0(&region), 2 * CONTEXT, "the later context, while it is made");
    later.wait_for("ready", READY);
    assert_eq!(common::ledger_used0(&region), 2 * CONTEXT, "and once it is");
    // A context that cannot fit is refused before the driver makes it.
    let mut full = node.process("pod", &["steps"], "8g").spawn();
    full.wait_for("ready", READY);
    full.send("alloc big 7300");
    assert_eq!(full.wait_for("big_status", READY), 0);
    let before = node.card_used();
    let refused = node.process("pod", &["steps"], "8g").report_within(READY);
    assert!(!refused.success, "{refused:?}");
    assert!(refused.stdout.contains("status=2"), "{refused:?}");
    assert_eq!(node.card_used(), before, "the refused context was never made");
    for mut client in [first, later, full] {
        client.close_stdin();
        assert!(client.finish(READY).success);
    }
}
