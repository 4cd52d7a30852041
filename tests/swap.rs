//! Swapping whole idle processes (issue 37, docs/overcommit.md "Swapping whole processes") against
//! the fake driver, whose VMM memory holds real bytes: the process side, with this test playing the
//! arbiter (heartbeat and swap-out requests in the container's swap table) so that every phase is
//! reached on purpose. `tests/swap_arbiter.rs` runs the real arbiter (`vgpu-smi serve --swap`).
//!
//! The fake card has 1 GiB, shared by every process of a test (`FAKEGPU_SHARED`); each container
//! has a 768 MiB budget with `CUDA_OVERSUBSCRIBE=true`, so two containers cannot both be on the
//! card.

mod common;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{Client, MIB, Run, Scratch};
use vgpu_ledger::swap::{Phase, Record, SwapTable};

const WAIT: Duration = Duration::from_secs(20);

/// One test's node: a shared fake card, container folders, and the arbiter's heartbeat.
struct Node {
    scratch: Scratch,
    beating: Arc<AtomicBool>,
}

impl Node {
    fn new(name: &str) -> Node {
        Node { scratch: Scratch::in_memory(name), beating: Arc::new(AtomicBool::new(true)) }
    }

    fn region(&self, container: &str) -> PathBuf {
        let folder = self.scratch.path(container);
        std::fs::create_dir_all(&folder).expect("container folder");
        folder.join("cudevshr.cache")
    }

    /// The container's swap table ([`Node::unbeaten_table`]), with a heartbeat kept fresh every
    /// 50 ms while the node lives.
    fn table(&self, container: &str) -> Arc<SwapTable> {
        let table = Arc::new(self.unbeaten_table(container));
        let (beat, beating) = (Arc::clone(&table), Arc::clone(&self.beating));
        std::thread::spawn(move || {
            while beating.load(Ordering::Relaxed) {
                beat.heartbeat().store(vgpu_ledger::pace::now(), Ordering::Release);
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        table
    }

    /// The container's swap table, its region made first by a short-lived process of the
    /// container when it has none yet; no heartbeat.
    fn unbeaten_table(&self, container: &str) -> SwapTable {
        let region = self.region(container);
        if !region.exists() {
            let mut first = self.process(container);
            assert_eq!(step(&mut first, "alloc r 1", "status"), 0, "the container's first process");
            first.close_stdin();
            assert!(first.finish(WAIT).success, "the container's first process");
        }
        SwapTable::open_for_process(&region).expect("swap table")
    }

    /// A `steps` client in `container`, waiting for its commands.
    fn process(&self, container: &str) -> Client {
        self.process_with(container, &[])
    }

    /// The same, with more environment variables.
    fn process_with(&self, container: &str, env: &[(&str, &str)]) -> Client {
        let mut run = Run::new("dlsym", &["steps"]);
        for (name, value) in env {
            run = run.env(name, value);
        }
        let mut client = run
            .env("FAKEGPU_SHARED", self.scratch.path("fake.ledger").to_str().unwrap())
            .env("FAKEGPU_MEMORY", "1g")
            .env("FAKEGPU_CONTEXT_MEMORY", "0")
            .env("CUDA_DEVICE_MEMORY_LIMIT_0", "768m")
            .env("CUDA_OVERSUBSCRIBE", "true")
            .env("CUDA_DEVICE_MEMORY_SHARED_CACHE", self.region(container).to_str().unwrap())
            .env("LIBCUDA_LOG_LEVEL", "3")
            .spawn();
        client.wait_for("ready", WAIT);
        client
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.beating.store(false, Ordering::Relaxed);
    }
}

/// Sends `step TAG …` and waits for `TAG_key`.
fn step(client: &mut Client, line: &str, key: &str) -> u64 {
    client.send(line);
    let tag = line.split_whitespace().nth(1).expect("a tag");
    client.wait_for(&format!("{tag}_{key}"), WAIT)
}

/// The lease whose record names `pid` (as its owner wrote it), waiting for it to appear.
fn lease_of(table: &SwapTable, pid: u32) -> usize {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(lease) = (0..1024).find(|&lease| table.read(lease, 0).pid == pid) {
            return lease;
        }
        assert!(Instant::now() < deadline, "no swap record for pid {pid}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Waits until `check` holds for the record, which it returns.
fn until(table: &SwapTable, lease: usize, what: &str, check: impl Fn(&Record) -> bool) -> Record {
    let deadline = Instant::now() + WAIT;
    loop {
        let record = table.read(lease, 0);
        if check(&record) {
            return record;
        }
        assert!(Instant::now() < deadline, "{what}: record {record:?}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Asks the process holding `lease` to swap out once it has been idle 50 ms, and waits for it to
/// say it is out.
fn swap_out(table: &SwapTable, lease: usize) -> Record {
    until(table, lease, "idle", |r| vgpu_ledger::pace::now().saturating_sub(r.active_ns) > 50_000_000);
    let asked = table.request_swap_out(lease, 0);
    until(table, lease, "request handled", |r| r.handled == asked);
    until(table, lease, "swapped out", |r| r.phase == Phase::Out)
}

fn device_used(client: &mut Client, tag: &str) -> u64 {
    step(client, &format!("driver {tag}"), "used")
}

/// Ends `client` (its input closed) and checks that it exited well having logged each of `lines`.
fn finish_saying(mut client: Client, lines: &[&str]) {
    client.close_stdin();
    let report = client.finish(WAIT);
    assert!(report.success, "{report:?}");
    for line in lines {
        assert!(report.stderr.contains(line), "no {line:?} in:\n{}", report.stderr);
    }
}

#[test]
fn a_process_swaps_out_whole_and_its_data_comes_back_bit_for_bit() {
    let node = Node::new("swap-roundtrip");
    let table = node.table("pod-a_main");
    let mut a = node.process("pod-a_main");
    for (tag, mib) in [("a1", 128), ("a2", 192), ("a3", 64)] {
        assert_eq!(step(&mut a, &format!("alloc {tag} {mib}"), "status"), 0, "{tag}");
    }
    assert_eq!(step(&mut a, "write w 7", "status"), 0);
    assert_eq!(a.wait_for("w_bytes", WAIT), 384 * MIB);
    assert_eq!(step(&mut a, "launch l0", "status"), 0);
    let lease = lease_of(&table, a.pid());
    let resident = table.read(lease, 0);
    assert_eq!((resident.phase, resident.resident, resident.swapped), (Phase::Resident, 384 * MIB, 0));
    let on_card = device_used(&mut a, "d0");
    assert!(on_card >= 384 * MIB, "the fake holds the memory on the card: {on_card}");

    let out = swap_out(&table, lease);
    assert_eq!((out.resident, out.swapped, out.swap_outs), (0, 384 * MIB, 1), "{out:?}");
    assert_eq!(device_used(&mut a, "d1"), on_card - 384 * MIB, "the card has the memory back");

    // A copy brings everything back first, then reads what was written.
    assert_eq!(step(&mut a, "check c1 7", "status"), 0);
    assert_eq!(a.wait_for("c1_mismatches", WAIT), 0, "every byte survives the swap");
    assert_eq!(a.wait_for("c1_bytes", WAIT), 384 * MIB);
    let back = table.read(lease, 0);
    assert_eq!((back.phase, back.resident, back.swapped, back.swap_ins), (Phase::Resident, 384 * MIB, 0, 1));
    assert_eq!(device_used(&mut a, "d2"), on_card);

    // Again, brought back by a launch this time; the fake counts launches made while memory of the
    // process was unmapped: none.
    swap_out(&table, lease);
    assert_eq!(step(&mut a, "launch l1", "status"), 0);
    assert_eq!(step(&mut a, "unmapped u1", "launches"), 0, "no kernel ran while its memory was out");
    assert_eq!(step(&mut a, "check c2 7", "mismatches"), 0);
    let record = table.read(lease, 0);
    assert_eq!((record.swap_outs, record.swap_ins), (2, 2));

    // Freeing memory that is out needs no swap-in: the charge and the host copy go.
    swap_out(&table, lease);
    assert_eq!(step(&mut a, "free f1", "freed"), 1);
    let record = table.read(lease, 0);
    assert_eq!((record.phase, record.swapped, record.swap_ins), (Phase::Out, 320 * MIB, 2), "{record:?}");
    assert_eq!(common::ledger_used0(&node.region("pod-a_main")), 320 * MIB);
    assert_eq!(step(&mut a, "check c3 7", "mismatches"), 0, "the rest comes back intact");
    a.close_stdin();
    assert!(a.finish(WAIT).success);
}

#[test]
fn the_applications_own_vmm_memory_swaps_out_and_comes_back_at_its_addresses_bit_for_bit() {
    let node = Node::new("swap-vmm");
    let table = node.table("pod-a_main");
    let mut a = node.process("pod-a_main");
    // NCCL's way (handles released while mapped), PyTorch's expandable segments' (handles kept,
    // mapped in reverse order, access set piece by piece), and cuMemAlloc beside them.
    assert_eq!(step(&mut a, "vmm r 128 64", "status"), 0);
    assert_eq!(step(&mut a, "vmmkeep k 256 32", "status"), 0);
    assert_eq!(step(&mut a, "alloc a1 64", "status"), 0);
    assert_eq!(step(&mut a, "write w 11", "status"), 0);
    assert_eq!(a.wait_for("w_bytes", WAIT), 448 * MIB);
    let lease = lease_of(&table, a.pid());
    let resident = table.read(lease, 0);
    assert_eq!((resident.resident, resident.swapped), (448 * MIB, 0), "{resident:?}");
    let on_card = device_used(&mut a, "d0");

    let out = swap_out(&table, lease);
    assert_eq!((out.resident, out.swapped), (0, 448 * MIB), "{out:?}");
    assert_eq!(
        device_used(&mut a, "d1"),
        on_card - 448 * MIB,
        "the application's VMM memory left the card too"
    );
    assert_eq!(common::ledger_used0(&node.region("pod-a_main")), 448 * MIB, "still the container's");

    // Its handle, asked for by address, is the one it created, on its device (everything comes
    // back first), and its bytes are where they were.
    assert_eq!(step(&mut a, "vmmretain h1", "status"), 0);
    assert_eq!((a.wait_for("h1_same", WAIT), a.wait_for("h1_device", WAIT)), (1, 0));
    assert_eq!(step(&mut a, "check c1 11", "mismatches"), 0, "every byte survives the swap");
    assert_eq!(device_used(&mut a, "d2"), on_card);
    let back = table.read(lease, 0);
    assert_eq!((back.phase, back.resident, back.swap_ins), (Phase::Resident, 448 * MIB, 1), "{back:?}");

    // Out again; the application unmaps and releases the kept range in its own order (memory
    // brought back first): the card and the budget lose exactly that range, the rest is intact.
    swap_out(&table, lease);
    assert_eq!(step(&mut a, "vmmfree f1", "status"), 0);
    assert_eq!(common::ledger_used0(&node.region("pod-a_main")), 192 * MIB);
    assert_eq!(device_used(&mut a, "d3"), on_card - 256 * MIB);
    assert_eq!(step(&mut a, "check c2 11", "mismatches"), 0);
    assert_eq!(a.wait_for("c2_bytes", WAIT), 192 * MIB);
    assert_eq!(step(&mut a, "unmapped u1", "launches"), 0);
    a.close_stdin();
    assert!(a.finish(WAIT).success);
    assert_eq!(common::ledger_used0(&node.region("pod-a_main")), 0, "nothing left charged");
}

#[test]
fn stream_ordered_memory_from_the_default_pool_swaps_and_what_it_frees_is_reused_or_given_back() {
    let node = Node::new("swap-ordered");
    let region = node.region("pod-a_main");
    let table = node.table("pod-a_main");
    let mut a = node.process("pod-a_main");
    // PyTorch's cudaMallocAsync backend allocates with cuMemAllocAsync, CuPy and XLA from the
    // device's default pool; cuMemAlloc beside them.
    assert_eq!(step(&mut a, "alloc a1 64", "status"), 0);
    assert_eq!(step(&mut a, "ordered o1 128", "status"), 0);
    assert_eq!(step(&mut a, "opool o2 192", "status"), 0);
    let o2 = a.wait_for("o2_address", WAIT);
    assert_eq!(step(&mut a, "write w 3", "status"), 0);
    assert_eq!(a.wait_for("w_bytes", WAIT), 384 * MIB);
    let lease = lease_of(&table, a.pid());
    let resident = table.read(lease, 0);
    assert_eq!((resident.resident, resident.swapped), (384 * MIB, 0), "{resident:?}");
    let on_card = device_used(&mut a, "d0");

    let out = swap_out(&table, lease);
    assert_eq!((out.resident, out.swapped), (0, 384 * MIB), "{out:?}");
    assert_eq!(device_used(&mut a, "d1"), on_card - 384 * MIB, "stream-ordered memory left the card");
    assert_eq!(common::ledger_used0(&region), 384 * MIB, "still the container's");
    assert_eq!(step(&mut a, "check c1 3", "mismatches"), 0, "every byte survives the swap");
    assert_eq!(table.read(lease, 0).resident, 384 * MIB);

    // Under PyTorch's threshold (never release), a free in stream order keeps its block, charged,
    // and the next allocation of its size on that stream takes it.
    assert_eq!(step(&mut a, "othreshold t1 -1", "status"), 0);
    assert_eq!(step(&mut a, "ofree f1", "status"), 0);
    assert_eq!(common::ledger_used0(&region), 384 * MIB, "a kept block stays charged");
    assert_eq!(step(&mut a, "ordered o3 192", "status"), 0);
    assert_eq!(a.wait_for("o3_address", WAIT), o2, "the kept block is reused");
    assert_eq!(device_used(&mut a, "d2"), on_card, "nothing new was made");

    // A swap-out gives kept blocks back instead of copying them.
    assert_eq!(step(&mut a, "ofree f2", "status"), 0);
    let out = swap_out(&table, lease);
    assert_eq!((out.resident, out.swapped), (0, 192 * MIB), "{out:?}");
    assert_eq!(common::ledger_used0(&region), 192 * MIB, "the kept block's charge went with it");
    assert_eq!(device_used(&mut a, "d3"), on_card - 384 * MIB);
    assert_eq!(step(&mut a, "check c2 3", "mismatches"), 0);
    assert_eq!(a.wait_for("c2_bytes", WAIT), 192 * MIB);

    // Under the driver's default threshold (0), a free whose work is done gives its block back.
    assert_eq!(step(&mut a, "othreshold t2 0", "status"), 0);
    assert_eq!(step(&mut a, "ordered o4 128", "status"), 0);
    assert_eq!(common::ledger_used0(&region), 320 * MIB);
    assert_eq!(step(&mut a, "ofree f3", "status"), 0);
    assert_eq!(common::ledger_used0(&region), 192 * MIB, "given back at its free");

    // Kept blocks give way to an allocation the budget (768 MiB) could not hold beside them.
    assert_eq!(step(&mut a, "othreshold t3 -1", "status"), 0);
    assert_eq!(step(&mut a, "ordered o5 256", "status"), 0);
    assert_eq!(step(&mut a, "ofree f4", "status"), 0);
    assert_eq!(common::ledger_used0(&region), 448 * MIB);
    assert_eq!(step(&mut a, "ordered o6 448", "status"), 0, "the kept 256 MiB made room");
    assert_eq!(common::ledger_used0(&region), 640 * MIB);

    // PyTorch's empty_cache trims the default pool: kept blocks go down to what it keeps.
    assert_eq!(step(&mut a, "ofree f5", "status"), 0);
    assert_eq!(common::ledger_used0(&region), 640 * MIB);
    assert_eq!(step(&mut a, "otrim t4 0", "status"), 0);
    assert_eq!(common::ledger_used0(&region), 192 * MIB, "trimmed");
    assert_eq!(step(&mut a, "unmapped u1", "launches"), 0);
    a.close_stdin();
    assert!(a.finish(WAIT).success);
    assert_eq!(common::ledger_used0(&region), 0, "nothing left charged");
}

#[test]
fn the_default_pools_statistics_count_the_swaps_own_pool() {
    let node = Node::new("swap-pool-statistics");
    let _table = node.table("pod-a_main");
    let mut a = node.process("pod-a_main");
    // Reserved, its high-water mark, used, its high-water mark, in MiB, as PyTorch's memory_stats
    // reads them under its cudaMallocAsync backend.
    let stats = |a: &mut Client, tag: &str| -> [u64; 4] {
        assert_eq!(step(a, &format!("ostats {tag}"), "status"), 0, "{tag}");
        ["reserved", "reserved_high", "used", "used_high"]
            .map(|key| a.wait_for(&format!("{tag}_{key}"), WAIT) / MIB)
    };
    assert_eq!(step(&mut a, "othreshold t -1", "status"), 0);
    // 99 MiB takes a block of 100 (2 MiB granules); 64 MiB one of 64.
    assert_eq!(step(&mut a, "ordered o1 99", "status"), 0);
    assert_eq!(step(&mut a, "ordered o2 64", "status"), 0);
    assert_eq!(stats(&mut a, "s1"), [164, 164, 163, 163]);
    // A free keeps its block: still reserved, no longer used.
    assert_eq!(step(&mut a, "ofree f1", "status"), 0);
    assert_eq!(stats(&mut a, "s2"), [164, 164, 99, 163]);
    // The high-water marks reset to the current values, and a trim gives the kept block back.
    assert_eq!(step(&mut a, "oreset r1", "status"), 0);
    assert_eq!(stats(&mut a, "s3"), [164, 164, 99, 99]);
    assert_eq!(step(&mut a, "otrim t1 0", "status"), 0);
    assert_eq!(stats(&mut a, "s4"), [100, 164, 99, 99]);
    a.close_stdin();
    assert!(a.finish(WAIT).success);
}

#[test]
fn memory_a_pool_of_the_applications_own_holds_stays_on_the_card_and_the_record_says_so() {
    let node = Node::new("swap-own-pool");
    let region = node.region("pod-a_main");
    let table = node.table("pod-a_main");
    let mut a = node.process("pod-a_main");
    // A pool the application made may be exportable: its memory stays the driver's, on the card.
    assert_eq!(step(&mut a, "alloc a1 64", "status"), 0);
    assert_eq!(step(&mut a, "upool p1 64", "status"), 0);
    assert_eq!(step(&mut a, "write w 8", "status"), 0);
    let lease = lease_of(&table, a.pid());
    let pooled = common::ledger_used0(&region) - 64 * MIB;
    assert!(pooled >= 64 * MIB, "the pool is charged what it holds: {pooled}");
    until(&table, lease, "the pool counted", |r| r.unswappable == pooled);
    let on_card = device_used(&mut a, "d0");
    let out = swap_out(&table, lease);
    assert_eq!((out.resident, out.swapped, out.unswappable), (0, 64 * MIB, pooled), "{out:?}");
    assert_eq!(device_used(&mut a, "d1"), on_card - 64 * MIB, "the pool's memory stayed");
    assert_eq!(step(&mut a, "check c1 8", "mismatches"), 0);
    a.close_stdin();
    assert!(a.finish(WAIT).success);
}

#[test]
fn the_driver_answers_for_swappable_memory_as_for_the_allocation_the_application_made() {
    let node = Node::new("swap-ranges");
    let table = node.table("pod-a_main");
    let mut a = node.process("pod-a_main");
    // The range, start and size, that cuMemGetAddressRange_v2, cuPointerGetAttribute and
    // cuPointerGetAttributes (beside the memory type) give for an address `offset` MiB into the
    // newest allocation: its own address and `size`, whatever chunk the address lies in.
    let answers = |a: &mut Client, tag: &str, offset: u64, size: u64| {
        assert_eq!(step(a, &format!("range {tag} {offset}"), "status"), 0, "{tag}");
        let seen: Vec<u64> = ["at_start", "size", "attr_status", "attr_at_start", "attr_size"]
            .iter()
            .chain(&["attrs_status", "attrs_type", "attrs_at_start", "attrs_size"])
            .map(|key| a.wait_for(&format!("{tag}_{key}"), WAIT))
            .collect();
        assert_eq!(seen, [1, size, 0, 1, size, 0, 2, 1, size], "{tag}: at_start size, attribute, attributes");
    };
    // 200 MiB are four chunks to the driver; 130 MiB in lies in the third.
    assert_eq!(step(&mut a, "alloc a1 200", "status"), 0);
    answers(&mut a, "r1", 130, 200 * MIB);
    answers(&mut a, "r2", 0, 200 * MIB);
    // Stream-ordered 99 MiB: a block of 100 MiB, an allocation of 99.
    assert_eq!(step(&mut a, "opool o1 99", "status"), 0);
    answers(&mut a, "r3", 70, 99 * MIB);
    // Off the card the driver knows nothing of the memory; the answers stay the allocation's (the
    // memory type's query brings it back).
    let lease = lease_of(&table, a.pid());
    swap_out(&table, lease);
    answers(&mut a, "r4", 98, 99 * MIB);
    assert_eq!(table.read(lease, 0).phase, Phase::Resident);
    a.close_stdin();
    assert!(a.finish(WAIT).success);
}

#[test]
fn an_exported_vmm_handle_stays_on_the_card_while_the_rest_swaps() {
    let node = Node::new("swap-vmm-export");
    let table = node.table("pod-a_main");
    let mut a = node.process("pod-a_main");
    assert_eq!(step(&mut a, "vmmkeep k 128 64", "status"), 0);
    // The range's first handle of two: another process may map it from the file descriptor, so
    // it must stay where it is.
    assert_eq!(step(&mut a, "vmmexport x", "status"), 0);
    assert_eq!(step(&mut a, "alloc a1 64", "status"), 0);
    assert_eq!(step(&mut a, "write w 5", "status"), 0);
    let lease = lease_of(&table, a.pid());
    let on_card = device_used(&mut a, "d0");
    let out = swap_out(&table, lease);
    // What stays is not swappable memory on the card: the record says it apart, as vgpu-smi shows.
    assert_eq!((out.resident, out.swapped, out.unswappable), (0, 128 * MIB, 64 * MIB), "{out:?}");
    assert_eq!(device_used(&mut a, "d1"), on_card - 128 * MIB);
    assert_eq!(step(&mut a, "check c1 5", "mismatches"), 0);
    a.close_stdin();
    assert!(a.finish(WAIT).success);
}

#[test]
fn two_containers_past_the_card_take_turns_and_a_launch_waits_for_room() {
    // B's cuMemAlloc waits for the 256 MiB the card lacks.
    take_turns("swap-turns", "alloc", 256 * MIB);
}

#[test]
fn two_containers_whose_allocators_map_their_own_vmm_take_turns() {
    // The second notebook with expandable segments died of an out-of-memory error at
    // cuMemCreate: now it waits for room (one 32 MiB handle at a time), and the arbiter makes it.
    take_turns("swap-vmm-turns", "vmmkeep", 32 * MIB);
}

#[test]
fn two_containers_whose_allocators_allocate_in_stream_order_take_turns() {
    // The second notebook under PyTorch's cudaMallocAsync backend died as with expandable
    // segments: its default pool's memory could not leave the card.
    take_turns("swap-ordered-turns", "ordered", 256 * MIB);
}

/// Two containers of 640 MiB each on the 1 GiB card, their memory made by `make` (`alloc TAG 640`,
/// `ordered TAG 640` or `vmmkeep TAG 640 32`), taking turns; B first waits for `wanted` bytes.
fn take_turns(name: &str, make: &str, wanted: u64) {
    let made = |tag: &str| match make {
        "vmmkeep" => format!("{make} {tag} 640 32"),
        _ => format!("{make} {tag} 640"),
    };
    let node = Node::new(name);
    let (table_a, table_b) = (node.table("pod-a_main"), node.table("pod-b_main"));
    let mut a = node.process("pod-a_main");
    let mut b = node.process("pod-b_main");
    assert_eq!(step(&mut a, &made("a1"), "status"), 0);
    assert_eq!(step(&mut a, "write w 1", "status"), 0);
    let lease_a = lease_of(&table_a, a.pid());

    // B needs more than the card has left: it waits, and says how much it wants.
    b.send(&made("b1"));
    let lease_b = lease_of(&table_b, b.pid());
    let waiting = until(&table_b, lease_b, "B waits for room", |r| r.waiting);
    assert_eq!(waiting.wanted, wanted, "what the card lacks: {waiting:?}");
    swap_out(&table_a, lease_a);
    assert_eq!(b.wait_for("b1_status", WAIT), 0, "B got the card once A was out");
    assert_eq!(step(&mut b, "write w 2", "status"), 0);

    for turn in 0..3 {
        // A's launch while B holds the card waits for room; the test keeps it waiting a while.
        a.send(&format!("launch la{turn}"));
        until(&table_a, lease_a, "A waits for room", |r| r.waiting);
        std::thread::sleep(Duration::from_millis(200));
        assert!(
            !a.stdout_so_far().contains(&format!("la{turn}_status")),
            "turn {turn}: A's launch returned while its memory was still out"
        );
        swap_out(&table_b, lease_b);
        assert_eq!(a.wait_for(&format!("la{turn}_status"), WAIT), 0);
        assert_eq!(step(&mut a, &format!("check ca{turn} 1"), "mismatches"), 0, "turn {turn}: A's data");

        b.send(&format!("launch lb{turn}"));
        until(&table_b, lease_b, "B waits for room", |r| r.waiting);
        swap_out(&table_a, lease_a);
        assert_eq!(b.wait_for(&format!("lb{turn}_status"), WAIT), 0);
        assert_eq!(step(&mut b, &format!("check cb{turn} 2"), "mismatches"), 0, "turn {turn}: B's data");
    }
    assert_eq!(step(&mut a, "unmapped ua", "launches"), 0);
    assert_eq!(step(&mut b, "unmapped ub", "launches"), 0);
    let (ra, rb) = (table_a.read(lease_a, 0), table_b.read(lease_b, 0));
    assert_eq!((ra.swap_outs, rb.swap_outs), (4, 3), "{ra:?} {rb:?}");
    assert!(ra.wait_ns > 0 && rb.wait_ns > 0, "waiting is counted: {ra:?} {rb:?}");
}

#[test]
fn a_busy_process_declines_a_request_but_not_a_forced_one() {
    let node = Node::new("swap-forced");
    let table = node.table("pod-a_main");
    let mut a = node.process("pod-a_main");
    assert_eq!(step(&mut a, "alloc a1 256", "status"), 0);
    assert_eq!(step(&mut a, "write w 6", "status"), 0);
    let lease = lease_of(&table, a.pid());
    // Asked right after a launch: busy, so it declines (handles the request, stays on the card).
    assert_eq!(step(&mut a, "launch l0", "status"), 0);
    let asked = table.request_swap_out(lease, 0);
    let declined = until(&table, lease, "declined", |r| r.handled == asked);
    assert_eq!((declined.phase, declined.swap_outs), (Phase::Resident, 0), "{declined:?}");
    // Forced right after a launch: out all the same, and back at the next call.
    assert_eq!(step(&mut a, "launch l1", "status"), 0);
    let forced = table.force_swap_out(lease, 0, 0);
    let out = until(&table, lease, "forced out", |r| r.handled == forced && r.phase == Phase::Out);
    assert_eq!(out.swapped, 256 * MIB, "{out:?}");
    assert_eq!(step(&mut a, "check c 6", "mismatches"), 0);
}

#[test]
fn a_forced_request_moves_only_the_room_it_asks_for() {
    let node = Node::new("swap-forced-amount");
    let table = node.table("pod-a_main");
    let mut a = node.process("pod-a_main");
    for (tag, mib) in [("a1", 192), ("a2", 128), ("a3", 128)] {
        assert_eq!(step(&mut a, &format!("alloc {tag} {mib}"), "status"), 0, "{tag}");
    }
    assert_eq!(step(&mut a, "write w 8", "status"), 0);
    assert_eq!(a.wait_for("w_bytes", WAIT), 448 * MIB);
    let lease = lease_of(&table, a.pid());
    // Every chunk pinned (the process idles), so that the chunks a request takes are the first in
    // address order, which is allocation order on the fake.
    until(&table, lease, "pinned once idle", |r| r.pinned == 448 * MIB);
    let on_card = device_used(&mut a, "d0");
    let region = node.region("pod-a_main");

    // Busy, and forced for 128 MiB: two chunks of 64 MiB go out, the rest stays on the card. The
    // gate is closed all the same, and the charge stays.
    assert_eq!(step(&mut a, "launch l0", "status"), 0);
    let forced = table.force_swap_out(lease, 0, 128 * MIB);
    let out = until(&table, lease, "forced out", |r| r.handled == forced && r.phase == Phase::Out);
    assert_eq!((out.swapped, out.resident, out.swap_outs, out.amount), (128 * MIB, 320 * MIB, 1, 128 * MIB));
    assert_eq!(device_used(&mut a, "d1"), on_card - 128 * MIB, "the card has 128 MiB back");
    assert_eq!(common::ledger_used0(&region), 448 * MIB, "memory out is still charged");
    assert_eq!(step(&mut a, "check c1 8", "mismatches"), 0, "every byte survives a partial swap");
    assert_eq!(a.wait_for("c1_bytes", WAIT), 448 * MIB);
    let back = table.read(lease, 0);
    assert_eq!((back.phase, back.resident, back.swapped, back.swap_ins), (Phase::Resident, 448 * MIB, 0, 1));
    assert_eq!(device_used(&mut a, "d2"), on_card);

    // A forced request for 0 bytes (an arbiter of before) still moves everything.
    assert_eq!(step(&mut a, "launch l1", "status"), 0);
    let forced = table.force_swap_out(lease, 0, 0);
    let out = until(&table, lease, "forced out whole", |r| r.handled == forced && r.phase == Phase::Out);
    assert_eq!((out.swapped, out.resident, out.swap_outs, out.amount), (448 * MIB, 0, 2, 0));
    assert_eq!(device_used(&mut a, "d3"), on_card - 448 * MIB);
    assert_eq!(step(&mut a, "check c2 8", "mismatches"), 0);

    // Out but for a3's last chunk: freeing a3, partly out, gives back both its halves and its
    // charge; the rest comes back intact.
    assert_eq!(step(&mut a, "launch l2", "status"), 0);
    let forced = table.force_swap_out(lease, 0, 384 * MIB);
    let out = until(&table, lease, "forced out", |r| r.handled == forced && r.phase == Phase::Out);
    assert_eq!((out.swapped, out.resident), (384 * MIB, 64 * MIB), "{out:?}");
    assert_eq!(step(&mut a, "free f", "freed"), 1);
    let freed = table.read(lease, 0);
    assert_eq!((freed.phase, freed.resident, freed.swapped), (Phase::Out, 0, 320 * MIB), "{freed:?}");
    assert_eq!(common::ledger_used0(&region), 320 * MIB);
    assert_eq!(device_used(&mut a, "d4"), on_card - 448 * MIB);
    assert_eq!(step(&mut a, "check c3 8", "mismatches"), 0);
    assert_eq!(a.wait_for("c3_bytes", WAIT), 320 * MIB);
    let back = table.read(lease, 0);
    assert_eq!((back.phase, back.resident, back.swapped, back.swap_ins), (Phase::Resident, 320 * MIB, 0, 3));
    assert_eq!(step(&mut a, "unmapped u", "launches"), 0, "no kernel ran while memory was out");
    finish_saying(
        a,
        &[
            "swapped out 134217728 bytes in ",
            ", 134217728 of 469762048 bytes (forced; asked for 134217728)",
            ", 469762048 of 469762048 bytes (forced)",
            ", 402653184 of 469762048 bytes (forced; asked for 402653184)",
        ],
    );
}

/// Keeps `client` launching every 20 ms for `busy` (its activity stays younger than the 100 ms
/// after which host memory may be pinned for it).
fn keep_busy(client: &mut Client, busy: Duration, tag: &str) {
    let end = Instant::now() + busy;
    let mut k = 0;
    while Instant::now() < end {
        assert_eq!(step(client, &format!("launch {tag}{k}"), "status"), 0);
        k += 1;
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn pageable_chunks_come_back_through_pinned_buffers_intact() {
    // A process allowed to pin 128 MiB ahead (`LIBVGPU_SWAP_PIN`): two of its eight chunks go out
    // to pinned buffers and six to pageable memory, where the cap keeps them while out. Coming
    // back, the six are carried through the two pinned buffers, whose own bytes are on the card
    // by then: every byte of all eight comes back intact.
    let node = Node::new("swap-staging");
    let table = node.table("pod-a_main");
    let mut a = node.process_with("pod-a_main", &[("LIBVGPU_SWAP_PIN", "128m")]);
    assert_eq!(step(&mut a, "alloc a1 512", "status"), 0);
    assert_eq!(step(&mut a, "write w 5", "status"), 0);
    let lease = lease_of(&table, a.pid());
    until(&table, lease, "pinned up to the cap", |r| r.pinned == 128 * MIB);
    let out = swap_out(&table, lease);
    assert_eq!(out.swapped, 512 * MIB, "{out:?}");
    std::thread::sleep(Duration::from_millis(300));
    // The cap holds while out: the two chunks' buffers, and the pinned ring the six others went
    // out through (made then, and not counted against the cap: 256 MiB).
    assert_eq!(table.read(lease, 0).pinned, (128 + 256) * MIB, "the cap holds while out");
    assert_eq!(step(&mut a, "check c 5", "mismatches"), 0, "every byte back through the staging");
    assert_eq!(table.read(lease, 0).swap_ins, 1);
    // Through the pinned ring as they were placed (the chunks' own pinned buffers only once every
    // chunk is placed, and none was left by then).
    let staged = ", 402653184 of them staged through pinned buffers, 402653184 of them as they were placed";
    finish_saying(a, &[staged]);
}

#[test]
fn with_nothing_pinned_ahead_chunks_go_out_and_come_back_through_the_pinned_ring_intact() {
    // Nothing pinned ahead (`LIBVGPU_SWAP_PIN=0`), as for a process swapped out before it was ever
    // idle: its chunks go out through the pinned ring into pageable memory, several threads copying
    // each on while the next ones' copies run, and come back through the ring the same way.
    let node = Node::new("swap-ring");
    let table = node.table("pod-a_main");
    let mut a = node.process_with("pod-a_main", &[("LIBVGPU_SWAP_PIN", "0")]);
    assert_eq!(step(&mut a, "alloc a1 384", "status"), 0);
    assert_eq!(step(&mut a, "write w 9", "status"), 0);
    let lease = lease_of(&table, a.pid());
    assert_eq!(table.read(lease, 0).pinned, 0, "nothing pinned ahead");
    let out = swap_out(&table, lease);
    assert_eq!((out.swapped, out.pinned), (384 * MIB, 256 * MIB), "the ring is the pinned memory: {out:?}");
    assert_eq!(step(&mut a, "check c 9", "mismatches"), 0, "every byte back through the ring");
    // The pageable buffers are kept (their pages left to the kernel): the next swap-out writes
    // into them, and new bytes come back intact.
    assert_eq!(step(&mut a, "write w2 11", "status"), 0);
    swap_out(&table, lease);
    assert_eq!(step(&mut a, "check c2 11", "mismatches"), 0, "every byte back through kept buffers");
    finish_saying(
        a,
        &[
            ", 402653184 of them through the pinned ring",
            // Each chunk is copied in through the ring as soon as it is placed, not once all are.
            ", 402653184 of them staged through pinned buffers, 402653184 of them as they were placed",
            ", 402653184 of them through the pinned ring, 402653184 of them into pageable buffers made before this swap",
        ],
    );
}

#[test]
fn an_idle_process_gets_host_buffers_made_ahead_and_its_first_swap_out_writes_into_them() {
    // Nothing pinned ahead (`LIBVGPU_SWAP_PIN=0`): while the process is idle each chunk gets a
    // pageable buffer faulted in ahead, so its first swap-out writes into pages that exist instead
    // of faulting fresh ones in.
    let node = Node::new("swap-ahead");
    let table = node.table("pod-a_main");
    let mut a = node.process_with("pod-a_main", &[("LIBVGPU_SWAP_PIN", "0")]);
    assert_eq!(step(&mut a, "alloc a1 256", "status"), 0);
    assert_eq!(step(&mut a, "write w 3", "status"), 0);
    let lease = lease_of(&table, a.pid());
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(table.read(lease, 0).pinned, 0, "nothing pinned ahead");
    swap_out(&table, lease);
    assert_eq!(step(&mut a, "check c 3", "mismatches"), 0, "every byte back");
    let said = ", 268435456 of them through the pinned ring, 268435456 of them into pageable buffers made before this swap";
    finish_saying(a, &[said]);
}

#[test]
fn after_a_wait_for_room_runs_out_the_next_allocations_fall_back_at_once() {
    // A holds most of the card, and the arbiter (this test: heartbeats only) never asks it to
    // make room for B. B's first allocation that does not fit waits its patience
    // (`LIBVGPU_SWAP_PATIENCE_MS`, 400 ms here) and falls back to host memory; the next one, a
    // moment later, falls back at once instead of waiting again.
    let node = Node::new("swap-patience");
    let _tables = (node.table("pod-a_main"), node.table("pod-b_main"));
    let mut a = node.process("pod-a_main");
    assert_eq!(step(&mut a, "alloc a1 700", "status"), 0);
    let mut b = node.process_with("pod-b_main", &[("LIBVGPU_SWAP_PATIENCE_MS", "400")]);
    let timed = |b: &mut Client, line: &str| {
        let started = Instant::now();
        assert_eq!(step(b, line, "status"), 0, "{line}");
        started.elapsed()
    };
    let first = timed(&mut b, "alloc b1 400");
    let second = timed(&mut b, "alloc b2 350");
    assert!(first >= Duration::from_millis(400), "the first allocation waited {first:?}");
    assert!(second < Duration::from_millis(300), "the second allocation waited {second:?}");
    a.close_stdin();
    b.close_stdin();
    assert!(a.finish(WAIT).success && b.finish(WAIT).success);
}

#[test]
fn host_memory_is_pinned_only_while_the_process_is_idle_or_out() {
    let node = Node::new("swap-pinning");
    let table = node.table("pod-a_main");
    let mut a = node.process("pod-a_main");
    assert_eq!(step(&mut a, "alloc a1 256", "status"), 0);
    let lease = lease_of(&table, a.pid());
    // Busy: pinning would hold the driver under its kernels, so none of the four chunks is pinned
    // (one at most, should this test stall for 100 ms between two launches).
    keep_busy(&mut a, Duration::from_millis(600), "b");
    let busy = table.read(lease, 0).pinned;
    assert!(busy <= 64 * MIB, "pinned while the process was busy: {busy}");
    // Idle: all of it is pinned ahead.
    until(&table, lease, "pinned once idle", |r| r.pinned == 256 * MIB);

    // Memory allocated and written while busy has (mostly) no pinned buffer when a forced request
    // comes: it goes out through the pinned ring (made then: 256 MiB) into pageable memory, and is
    // moved into pinned buffers while out.
    assert_eq!(step(&mut a, "alloc a2 192", "status"), 0);
    assert_eq!(step(&mut a, "write w 9", "status"), 0);
    keep_busy(&mut a, Duration::from_millis(300), "c");
    let busy = table.read(lease, 0).pinned;
    assert!(busy <= 320 * MIB, "pinned while the process was busy: {busy}");
    let forced = table.force_swap_out(lease, 0, 0);
    let out = until(&table, lease, "forced out", |r| r.handled == forced && r.phase == Phase::Out);
    assert_eq!(out.swapped, 448 * MIB, "{out:?}");
    let promoted = until(&table, lease, "pinned while out", |r| r.pinned == (448 + 256) * MIB);
    assert_eq!(promoted.phase, Phase::Out, "{promoted:?}");
    assert_eq!(step(&mut a, "check c 9", "mismatches"), 0, "the bytes moved into pinned memory intact");
    assert_eq!(table.read(lease, 0).swap_ins, 1);
    a.close_stdin();
    assert!(a.finish(WAIT).success);
}

#[test]
fn a_process_waiting_for_its_own_kernels_is_busy_and_pinned_for_at_the_waits_pace() {
    let node = Node::new("swap-sync");
    let table = node.table("pod-a_main");
    let mut a = node.process("pod-a_main");
    assert_eq!(step(&mut a, "alloc a1 512", "status"), 0);
    let lease = lease_of(&table, a.pid());
    // A kernel of 800 ms, and cuCtxSynchronize waiting for it: no call starts for 800 ms, yet the
    // process has work in flight.
    a.send("longsync s 800");
    std::thread::sleep(Duration::from_millis(300));
    // Chunks are pinned one at a time, 20 ms into the wait and every 100 ms after: three by now
    // (four allowing for this test's own timing), not all eight at once.
    let during = table.read(lease, 0);
    assert!(during.pinned <= 256 * MIB, "pinned faster than the wait's pace: {during:?}");
    assert!(during.in_flight, "the arbiter must see work in flight: {during:?}");
    let asked = table.request_swap_out(lease, 0);
    let declined = until(&table, lease, "request handled", |r| r.handled == asked);
    assert_eq!((declined.phase, declined.swap_outs), (Phase::Resident, 0), "{declined:?}");
    assert_eq!(a.wait_for("s_status", WAIT), 0);
    // Active again the moment the wait returned, and pinned for during it (idle pinning would
    // start only 100 ms from now).
    let returned = vgpu_ledger::pace::now();
    let after = table.read(lease, 0);
    assert!(
        returned.saturating_sub(after.active_ns) < 100_000_000,
        "activity not noted at the wait's end: {after:?}"
    );
    assert!(after.pinned >= 128 * MIB, "nothing pinned while the process waited: {after:?}");
    assert!(!after.in_flight, "{after:?}");
    // Idle afterwards: asked again, it goes.
    swap_out(&table, lease);
    assert_eq!(step(&mut a, "check c 0", "status"), 0);
    a.close_stdin();
    assert!(a.finish(WAIT).success);
}

#[test]
fn a_wait_through_cuda_13s_synchronize_is_work_in_flight() {
    // cudart 13 waits in cudaDeviceSynchronize through what cuGetProcAddress answers for
    // cuCtxSynchronize at version 13000: cuCtxSynchronize_v2, which names the context. That wait
    // is work in flight as much as the old one: the record says so while it lasts, and an ordinary
    // request that comes during it is declined however long ago the wait began.
    let node = Node::new("swap-sync13");
    let table = node.table("pod-a_main");
    let mut a = node.process("pod-a_main");
    assert_eq!(step(&mut a, "alloc a1 128", "status"), 0);
    let lease = lease_of(&table, a.pid());
    a.send("longsync13 s 800");
    std::thread::sleep(Duration::from_millis(300));
    let during = table.read(lease, 0);
    assert!(during.in_flight, "{during:?}");
    let asked = table.request_swap_out(lease, 0);
    let declined = until(&table, lease, "request handled", |r| r.handled == asked);
    assert_eq!((declined.phase, declined.swap_outs), (Phase::Resident, 0), "{declined:?}");
    assert_eq!(a.wait_for("s_status", WAIT), 0);
    assert!(!table.read(lease, 0).in_flight);
    a.close_stdin();
    assert!(a.finish(WAIT).success);
}

#[test]
fn a_query_that_finds_work_running_is_activity_and_one_that_finds_none_is_not() {
    let node = Node::new("swap-query");
    let table = node.table("pod-a_main");
    let mut a = node.process("pod-a_main");
    assert_eq!(step(&mut a, "alloc a1 128", "status"), 0);
    assert_eq!(step(&mut a, "write w 2", "status"), 0);
    let lease = lease_of(&table, a.pid());
    // A thread polling an idle stream every millisecond: the process is idle all the same.
    a.send("idlepoll p 600");
    std::thread::sleep(Duration::from_millis(200));
    let asked = table.request_swap_out(lease, 0);
    let out = until(&table, lease, "out while polling an idle stream", |r| r.handled == asked);
    assert_eq!((out.phase, out.swap_outs), (Phase::Out, 1), "{out:?}");
    assert_eq!(a.wait_for("p_status", WAIT), 0);
    assert_eq!(step(&mut a, "check c1 2", "mismatches"), 0);
    // Polling a kernel of 800 ms that is still running: busy, so an ordinary request is declined.
    a.send("poll q 800");
    std::thread::sleep(Duration::from_millis(300));
    let asked = table.request_swap_out(lease, 0);
    let declined = until(&table, lease, "request handled", |r| r.handled == asked);
    assert_eq!((declined.phase, declined.swap_outs), (Phase::Resident, 1), "{declined:?}");
    assert_eq!(a.wait_for("q_status", WAIT), 0);
    assert!(a.wait_for("q_polls", WAIT) > 1);
    a.close_stdin();
    assert!(a.finish(WAIT).success);
}

#[test]
fn two_waiting_processes_each_holding_part_of_the_card_are_untied_by_a_request() {
    let node = Node::new("swap-untie");
    let (table_a, table_b) = (node.table("pod-a_main"), node.table("pod-b_main"));
    // Nothing pinned ahead: A's chunks go out through the pinned ring into pageable memory, and
    // come back through the ring as each is placed, so what it lets go of below was copied in
    // already; its pageable buffers must still hold the bytes.
    let mut a = node.process_with("pod-a_main", &[("LIBVGPU_SWAP_PIN", "0")]);
    assert_eq!(step(&mut a, "alloc a1 640", "status"), 0);
    assert_eq!(step(&mut a, "write w 4", "status"), 0);
    let lease_a = lease_of(&table_a, a.pid());
    swap_out(&table_a, lease_a);
    let mut b = node.process("pod-b_main");
    assert_eq!(step(&mut b, "alloc b1 512", "status"), 0);
    let lease_b = lease_of(&table_b, b.pid());
    // A comes back into the 512 MiB left and waits for 128 more; B then wants 256 more.
    a.send("launch l");
    let a_waits = until(&table_a, lease_a, "A waits", |r| r.waiting);
    assert_eq!((a_waits.resident, a_waits.wanted), (512 * MIB, 128 * MIB), "{a_waits:?}");
    b.send("alloc b2 256");
    until(&table_b, lease_b, "B waits", |r| r.waiting);
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        table_a.read(lease_a, 0).waiting && table_b.read(lease_b, 0).waiting,
        "both wait: neither can move"
    );
    // Asked while it waits, A lets go of what it placed; B finishes, then makes room for A.
    let asked = table_a.request_swap_out(lease_a, 0);
    let let_go = until(&table_a, lease_a, "A lets go", |r| r.handled == asked && r.resident == 0);
    assert_eq!(let_go.swapped, 640 * MIB, "{let_go:?}");
    assert_eq!(b.wait_for("b2_status", WAIT), 0, "B got the room A let go of");
    swap_out(&table_b, lease_b);
    assert_eq!(a.wait_for("l_status", WAIT), 0);
    assert_eq!(step(&mut a, "check c 4", "mismatches"), 0, "A's data after letting go");
    assert_eq!(step(&mut a, "unmapped u", "launches"), 0);
    finish_saying(
        a,
        &[", 671088640 of them staged through pinned buffers, 671088640 of them as they were placed"],
    );
}

#[test]
fn a_process_out_in_part_gives_up_the_rest_when_asked_or_when_it_waits_beside_another() {
    let node = Node::new("swap-part");
    let (table_a, table_b) = (node.table("pod-a_main"), node.table("pod-b_main"));
    let mut a = node.process("pod-a_main");
    assert_eq!(step(&mut a, "alloc a1 576", "status"), 0);
    assert_eq!(step(&mut a, "write w 5", "status"), 0);
    let lease_a = lease_of(&table_a, a.pid());
    let force_part = || {
        let forced = table_a.force_swap_out(lease_a, 0, 128 * MIB);
        let out =
            until(&table_a, lease_a, "forced out in part", |r| r.handled == forced && r.phase == Phase::Out);
        assert_eq!((out.resident, out.swapped), (448 * MIB, 128 * MIB), "{out:?}");
    };

    // Out in part, and no call since: an ordinary request takes the rest.
    force_part();
    let asked = table_a.request_swap_out(lease_a, 0);
    let whole = until(&table_a, lease_a, "the rest out", |r| r.handled == asked && r.resident == 0);
    assert_eq!((whole.phase, whole.swapped), (Phase::Out, 576 * MIB), "{whole:?}");
    assert_eq!(step(&mut a, "check c1 5", "mismatches"), 0);

    // Out in part again; B takes what is free and waits for 64 MiB more, A waits for its 128 MiB:
    // asked while it waits, A lets go of everything it holds, not only what it placed meanwhile.
    force_part();
    let mut b = node.process("pod-b_main");
    b.send("alloc b1 640");
    let lease_b = lease_of(&table_b, b.pid());
    until(&table_b, lease_b, "B waits", |r| r.waiting);
    a.send("launch l");
    until(&table_a, lease_a, "A waits", |r| r.waiting);
    let asked = table_a.request_swap_out(lease_a, 0);
    let let_go = until(&table_a, lease_a, "A lets go", |r| r.handled == asked && r.resident == 0);
    assert_eq!(let_go.swapped, 576 * MIB, "{let_go:?}");
    assert_eq!(b.wait_for("b1_status", WAIT), 0, "B got the room A let go of");
    swap_out(&table_b, lease_b);
    assert_eq!(a.wait_for("l_status", WAIT), 0);
    assert_eq!(step(&mut a, "check c2 5", "mismatches"), 0, "A's data after all that");
    assert_eq!(step(&mut a, "unmapped u", "launches"), 0);
}

#[test]
fn a_process_killed_in_any_phase_leaves_the_card_and_the_budget_whole() {
    // A's memory from cuMemAlloc, from its own VMM as expandable segments map theirs, and in
    // stream order from the default pool.
    let kinds = [("alloc", "alloc a1 640"), ("vmm", "vmmkeep a1 640 32"), ("ordered", "ordered a1 640")];
    let phases = ["resident", "swapping out", "out", "swapping in", "waiting"];
    for ((kind, made), phase) in kinds.iter().flat_map(|kind| phases.iter().map(move |phase| (kind, phase))) {
        let phase = *phase;
        let node = Node::new(&format!("swap-kill-{kind}-{phase}"));
        let (table_a, table_b) = (node.table("pod-a_main"), node.table("pod-b_main"));
        let mut a = node.process("pod-a_main");
        assert_eq!(step(&mut a, made, "status"), 0, "{kind}");
        let lease_a = lease_of(&table_a, a.pid());
        let mut b = node.process("pod-b_main");
        assert_eq!(step(&mut b, "alloc b1 256", "status"), 0);
        assert_eq!(step(&mut b, "write w 3", "status"), 0);
        match phase {
            "resident" => {}
            "swapping out" => {
                assert_eq!(step(&mut a, "write w 5", "status"), 0, "bytes to copy");
                until(&table_a, lease_a, "idle", |r| {
                    vgpu_ledger::pace::now().saturating_sub(r.active_ns) > 50_000_000
                });
                table_a.request_swap_out(lease_a, 0);
                until(&table_a, lease_a, "swapping out", |r| r.phase == Phase::SwappingOut);
            }
            "out" => {
                swap_out(&table_a, lease_a);
            }
            "swapping in" => {
                assert_eq!(step(&mut a, "write w 5", "status"), 0, "bytes to copy");
                swap_out(&table_a, lease_a);
                a.send("launch l");
                until(&table_a, lease_a, "swapping in", |r| r.phase == Phase::SwappingIn);
            }
            _ => {
                swap_out(&table_a, lease_a);
                assert_eq!(step(&mut b, "alloc b2 384", "status"), 0, "B takes the room A left");
                assert_eq!(step(&mut b, "write w2 3", "status"), 0);
                a.send("launch l");
                until(&table_a, lease_a, "A waits for room", |r| r.waiting);
            }
        }
        a.kill();
        let _ = a.finish(WAIT);
        if phase.starts_with("swapping") {
            // Killed in the middle: the record was left as the process last wrote it.
            let left = table_a.read(lease_a, 0);
            assert_eq!(left.phase.name(), phase, "{left:?}");
        }
        assert_eq!(step(&mut b, "check c 3", "mismatches"), 0, "{kind}, {phase}: B's data");
        // B carries on: it swaps out and back whole after A's death (the fake does not give a dead
        // process's card memory back, as the real driver does, so B's room is what it had).
        swap_out(&table_b, lease_of(&table_b, b.pid()));
        assert_eq!(step(&mut b, "check c2 3", "mismatches"), 0, "{kind}, {phase}: B's data after a swap");
        // The dead lease is no one's: A's container gives its bytes back once reclaimed.
        let report = std::process::Command::new(common::smi_binary())
            .arg("reclaim")
            .arg(node.region("pod-a_main"))
            .output()
            .expect("vgpu-smi reclaim");
        assert!(report.status.success(), "{kind}, {phase}: {report:?}");
        assert_eq!(common::ledger_used0(&node.region("pod-a_main")), 0, "{kind}, {phase}: A's budget whole");
        b.close_stdin();
        assert!(b.finish(WAIT).success, "{kind}, {phase}");
    }
}

#[test]
fn without_a_live_arbiter_memory_spills_through_unified_memory_as_before() {
    let node = Node::new("swap-none");
    // No table at all, then a table whose arbiter stopped beating 5 s ago.
    for stale in [false, true] {
        let container = if stale { "pod-stale_main" } else { "pod-none_main" };
        if stale {
            let table = node.unbeaten_table(container);
            table.heartbeat().store(vgpu_ledger::pace::now() - 5_000_000_000, Ordering::Release);
        }
        let mut a = node.process(container);
        assert_eq!(step(&mut a, "alloc a1 256", "status"), 0);
        assert_eq!(step(&mut a, "driver d", "managed"), 256 * MIB, "stale={stale}: managed memory");
        a.close_stdin();
        assert!(a.finish(WAIT).success);
    }
}

/// A memory cgroup made for one test (v2's unified hierarchy where it has the memory controller,
/// else v1's memory controller, under this process's own memory cgroup), removed when dropped.
struct MemoryCgroup {
    dir: PathBuf,
    v2: bool,
}

impl MemoryCgroup {
    fn new(name: &str) -> MemoryCgroup {
        let cgroups = std::fs::read_to_string("/proc/self/cgroup").expect("/proc/self/cgroup");
        let unified = std::path::Path::new("/sys/fs/cgroup");
        let v2 = std::fs::read_to_string(unified.join("cgroup.controllers"))
            .is_ok_and(|controllers| controllers.split_whitespace().any(|c| c == "memory"));
        let parent = if v2 {
            let own = cgroups.lines().find_map(|line| line.strip_prefix("0::")).expect("a cgroup v2 path");
            unified.join(own.trim_start_matches('/'))
        } else {
            let own = cgroups
                .lines()
                .find_map(|line| {
                    let mut fields = line.splitn(3, ':');
                    let (_, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
                    controllers.split(',').any(|c| c == "memory").then_some(path)
                })
                .expect("a memory controller (cgroup v1) or cgroup v2 with memory");
            unified.join("memory").join(own.trim_start_matches('/'))
        };
        let dir = parent.join(format!("vgpu-swap-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create a memory cgroup (needs root)");
        MemoryCgroup { dir, v2 }
    }

    fn join(&self, pid: u32) {
        std::fs::write(self.dir.join("cgroup.procs"), pid.to_string()).expect("move into the cgroup");
    }

    fn usage(&self) -> u64 {
        let file = if self.v2 { "memory.current" } else { "memory.usage_in_bytes" };
        std::fs::read_to_string(self.dir.join(file)).expect("its use").trim().parse().expect("a number")
    }

    fn limit(&self, bytes: u64) {
        let file = if self.v2 { "memory.max" } else { "memory.limit_in_bytes" };
        std::fs::write(self.dir.join(file), bytes.to_string()).expect("set its limit");
    }

    /// OOM kills in it so far.
    fn oom_kills(&self) -> u64 {
        let (file, key) =
            if self.v2 { ("memory.events", "oom_kill ") } else { ("memory.oom_control", "oom_kill ") };
        std::fs::read_to_string(self.dir.join(file))
            .ok()
            .and_then(|text| text.lines().find_map(|line| line.strip_prefix(key)?.trim().parse().ok()))
            .unwrap_or(0)
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.dir);
    }
}

#[test]
fn a_swap_out_that_the_memory_cgroup_cannot_hold_is_declined_or_made_partial() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "this test makes a memory cgroup, which needs root");
    let node = Node::new("swap-cgroup");
    let table = node.table("pod-a_main");
    let cgroup = MemoryCgroup::new("cgroup");
    // Nothing pinned ahead: every byte that goes out needs new host memory.
    let mut a = node.process_with("pod-a_main", &[("LIBVGPU_SWAP_PIN", "0")]);
    cgroup.join(a.pid());
    assert_eq!(step(&mut a, "alloc a1 512", "status"), 0);
    assert_eq!(step(&mut a, "write w 9", "status"), 0);
    let lease = lease_of(&table, a.pid());
    let idle = |r: &Record| vgpu_ledger::pace::now().saturating_sub(r.active_ns) > 50_000_000;
    // Room for less than a chunk beside what the cgroup keeps back: declined, nothing moves.
    cgroup.limit(cgroup.usage() + 96 * MIB);
    until(&table, lease, "idle", idle);
    let asked = table.request_swap_out(lease, 0);
    let declined = until(&table, lease, "request handled", |r| r.handled == asked);
    assert_eq!(
        (declined.phase, declined.swap_outs, declined.swapped),
        (Phase::Resident, 0, 0),
        "{declined:?}"
    );
    // Room for four chunks: they go, the rest stays on the card.
    cgroup.limit(cgroup.usage() + 320 * MIB);
    until(&table, lease, "idle", idle);
    let asked = table.request_swap_out(lease, 0);
    let partial = until(&table, lease, "request handled", |r| r.handled == asked);
    assert_eq!((partial.swapped, partial.resident), (256 * MIB, 256 * MIB), "{partial:?}");
    // The data comes back whole; nothing was killed. (The fake's card memory is the process's own,
    // and the client reads the data back into a buffer of its own: room for both first.)
    assert_eq!(cgroup.oom_kills(), 0);
    cgroup.limit(cgroup.usage() + 2048 * MIB);
    assert_eq!(step(&mut a, "check c 9", "mismatches"), 0);
    assert_eq!(cgroup.oom_kills(), 0);
    finish_saying(
        a,
        &[
            "swap-out request 1 declined: it needs 536870912 bytes of host memory",
            "swap-out request 2 made partial",
        ],
    );
}

/// `vgpu-smi serve --swap` over a node's containers, its stderr kept.
struct Arbiter {
    child: std::process::Child,
    log: Arc<std::sync::Mutex<String>>,
}

impl Arbiter {
    /// One that asks a process idle for 50 ms.
    fn start(node: &Node) -> Arbiter {
        Arbiter::start_idle_ms(node, "50")
    }

    /// One that asks a process only once it has been idle `idle_ms`.
    fn start_idle_ms(node: &Node, idle_ms: &str) -> Arbiter {
        use std::io::BufRead;
        let mut child = std::process::Command::new(common::smi_binary())
            .args(["serve", "--listen", "127.0.0.1:0", "--no-reclaim", "--swap", "--swap-idle-ms", idle_ms])
            .arg(&node.scratch.dir)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("start vgpu-smi serve --swap");
        let mut stderr = std::io::BufReader::new(child.stderr.take().expect("stderr"));
        let mut first = String::new();
        stderr.read_line(&mut first).expect("where it listens");
        let log = Arc::new(std::sync::Mutex::new(first));
        let kept = Arc::clone(&log);
        std::thread::spawn(move || {
            for line in stderr.lines().map_while(Result::ok) {
                kept.lock().unwrap().push_str(&(line + "\n"));
            }
        });
        Arbiter { child, log }
    }

    /// Waits until it has beaten in `tables` since now: a process decides at its allocation
    /// whether an arbiter runs.
    fn beating(self, tables: &[&SwapTable]) -> Arbiter {
        let since = vgpu_ledger::pace::now();
        let deadline = Instant::now() + WAIT;
        while tables.iter().any(|table| table.heartbeat().load(Ordering::Acquire) < since) {
            assert!(Instant::now() < deadline, "the arbiter never beat in the tables");
            std::thread::sleep(Duration::from_millis(5));
        }
        self
    }

    /// SIGKILL, at whatever it was doing.
    fn kill(mut self) -> String {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.log.lock().unwrap().clone()
    }
}

#[test]
fn the_arbiter_killed_at_any_step_of_a_turn_and_started_again_loses_nothing() {
    // Two containers past the card take turns under the real arbiter, which is SIGKILLed and
    // started again: while B waits and nobody has been asked, as soon as it has asked (the swap-out
    // under way), and while A's memory goes out for B. Every turn completes, every byte is intact,
    // and both processes carry on to a clean exit. (Each turn also waits out A's quantum.)
    let node = Node::new("swap-restart");
    let (table_a, table_b) = (node.unbeaten_table("pod-a_main"), node.unbeaten_table("pod-b_main"));
    // At first one that asks nobody idle for less than a minute: B starts waiting under it.
    let tables = [&table_a, &table_b];
    let mut arbiter = Arbiter::start_idle_ms(&node, "60000").beating(&tables);
    let mut a = node.process("pod-a_main");
    let mut b = node.process("pod-b_main");
    assert_eq!(step(&mut a, "alloc a1 640", "status"), 0);
    assert_eq!(step(&mut a, "write w 1", "status"), 0);
    let lease_a = lease_of(&table_a, a.pid());
    let mut logs = String::new();

    // Killed while B waits and nobody has been asked: one starts again, and B gets the card.
    b.send("alloc b1 640");
    let lease_b = lease_of(&table_b, b.pid());
    until(&table_b, lease_b, "B waits for room", |r| r.waiting);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(table_a.read(lease_a, 0).request, 0, "A was asked before the arbiter was killed");
    logs += &arbiter.kill();
    arbiter = Arbiter::start(&node).beating(&tables);
    assert_eq!(b.wait_for("b1_status", WAIT), 0, "B got the card from the arbiter started again");
    assert_eq!(step(&mut b, "write w 2", "status"), 0);

    for turn in 0..3 {
        // A's launch waits for room; the arbiter asks B and is killed the moment it has.
        let asked_before = table_b.read(lease_b, 0).request;
        a.send(&format!("launch la{turn}"));
        until(&table_b, lease_b, "the arbiter asks B", |r| r.request > asked_before);
        logs += &arbiter.kill();
        arbiter = Arbiter::start(&node).beating(&tables);
        assert_eq!(a.wait_for(&format!("la{turn}_status"), WAIT), 0, "turn {turn}: A's launch");
        assert_eq!(step(&mut a, &format!("check ca{turn} 1"), "mismatches"), 0, "turn {turn}: A's data");

        // B's launch waits; the arbiter is killed while A's memory goes out and B's comes back.
        b.send(&format!("launch lb{turn}"));
        until(&table_a, lease_a, "A swapping out or out", |r| {
            matches!(r.phase, Phase::SwappingOut | Phase::Out)
        });
        logs += &arbiter.kill();
        arbiter = Arbiter::start(&node).beating(&tables);
        assert_eq!(b.wait_for(&format!("lb{turn}_status"), WAIT), 0, "turn {turn}: B's launch");
        assert_eq!(step(&mut b, &format!("check cb{turn} 2"), "mismatches"), 0, "turn {turn}: B's data");
    }
    logs += &arbiter.kill();
    for (name, mut client) in [("A", a), ("B", b)] {
        client.close_stdin();
        let report = client.finish(WAIT);
        assert!(report.success, "{name}: {report:?}\narbiter:\n{logs}");
    }
}
