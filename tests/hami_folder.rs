//! HAMi's monitors judge a container by its folder on the node (`<pod-uid>_<container>/`, holding
//! the region and the empty `libvgpu.so` that HAMi's bind mount of the library creates): each
//! monitor's rule, applied to the folder libvgpu leaves, with overcommit off and on, with and
//! without the node's swap arbiter, and after an earlier build left its swap table file there
//! (docs/overcommit.md, "The swap table and HAMi's monitors").

mod common;

use std::io::{BufRead, BufReader};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{GIB, Run, Scratch};

/// HAMi's v1 region as its monitors check it (docs/architecture.md, the region file).
const HAMI_MAGIC: i32 = 19_920_718;
const HAMI_MIN_SIZE: u64 = 2_008_952;
const LIMIT_0: u64 = 1600;

/// The monitors of HAMi's releases, by how they judge a container folder's entries.
#[derive(Clone, Copy, Debug)]
enum Monitor {
    /// release-v2.9's, and volcano-vgpu-device-plugin's: more than two entries is "cache num not
    /// matched", and the folder is dropped.
    EveryEntry,
    /// master's: only `.cache` names and `libvgpu.so` count.
    CacheNames,
}

const MONITORS: [Monitor; 2] = [Monitor::EveryEntry, Monitor::CacheNames];

/// What `monitor` reads in `folder`: the budget of device 0 in the region it opens, or why it
/// drops the folder.
fn monitor_reads(monitor: Monitor, folder: &Path) -> Result<u64, String> {
    let mut names: Vec<String> = std::fs::read_dir(folder)
        .expect("read the container's folder")
        .map(|entry| entry.expect("an entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let counted: Vec<&String> = match monitor {
        Monitor::EveryEntry => names.iter().collect(),
        Monitor::CacheNames => names.iter().filter(|n| n.ends_with(".cache") || *n == "libvgpu.so").collect(),
    };
    if counted.len() > 2 {
        return Err(format!("cache num not matched: {names:?}"));
    }
    // The first `.cache` name in byte order is the region it maps.
    let region =
        names.iter().find(|n| n.ends_with(".cache")).ok_or_else(|| format!("no region in {names:?}"))?;
    let file = std::fs::File::open(folder.join(region)).expect("open the region");
    let size = file.metadata().expect("its size").len();
    let mut word = [0u8; 8];
    file.read_exact_at(&mut word[..4], 0).expect("read the magic");
    let magic = i32::from_le_bytes(word[..4].try_into().expect("4 bytes"));
    file.read_exact_at(&mut word[..4], 4).expect("read the major version");
    let major = u32::from_le_bytes(word[..4].try_into().expect("4 bytes"));
    if size < HAMI_MIN_SIZE || magic != HAMI_MAGIC || major != 1 {
        return Err(format!("{region}: not a v1 region ({size} bytes, magic {magic}, major {major})"));
    }
    file.read_exact_at(&mut word, LIMIT_0).expect("read the limit");
    Ok(u64::from_le_bytes(word))
}

/// A node's folder of containers, each with HAMi's placeholder for the library's mount point.
struct Node {
    scratch: Scratch,
}

impl Node {
    fn new(name: &str) -> Node {
        let scratch = Scratch::in_memory(name);
        std::fs::create_dir_all(scratch.path("containers")).expect("the node's folder");
        Node { scratch }
    }

    fn root(&self) -> PathBuf {
        self.scratch.path("containers")
    }

    /// The container's folder, with the placeholder HAMi's bind mount of `libvgpu.so` creates.
    fn folder(&self, container: &str) -> PathBuf {
        let folder = self.root().join(container);
        std::fs::create_dir_all(&folder).expect("the container's folder");
        std::fs::write(folder.join("libvgpu.so"), b"").expect("the placeholder");
        folder
    }

    fn region(&self, container: &str) -> PathBuf {
        self.folder(container).join("GPU-00000000-0000-0000-0000-000000000000.cache")
    }

    /// A process of `container` allocating 64 MiB chunks to its 2 GiB budget and freeing them.
    fn fill(&self, container: &str, overcommit: bool) {
        let r = Run::new("dlsym", &["fill", "64"])
            .env("CUDA_DEVICE_MEMORY_LIMIT_0", "2g")
            .env("CUDA_OVERSUBSCRIBE", if overcommit { "true" } else { "false" })
            .env("CUDA_DEVICE_MEMORY_SHARED_CACHE", self.region(container).to_str().expect("UTF-8"))
            .report();
        assert!(r.success, "{container}: {r:?}");
        assert_eq!(r.get("first_bytes"), 2 * GIB, "{container}: {r:?}");
    }

    /// `vgpu-smi serve --swap` over the node's folder, once its first pass has run.
    fn serve(&self) -> Server {
        let mut child = Command::new(common::smi_binary())
            .args(["serve", "--listen", "127.0.0.1:0", "--no-reclaim", "--swap"])
            .arg(self.root())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start vgpu-smi serve --swap");
        let mut stderr = BufReader::new(child.stderr.take().expect("stderr"));
        let mut first = String::new();
        stderr.read_line(&mut first).expect("where it listens");
        assert!(first.contains("http://127.0.0.1:"), "{first}");
        std::thread::spawn(move || for _ in stderr.lines().map_while(Result::ok) {});
        Server(child)
    }
}

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Every monitor reads `container`'s folder, and finds its 2 GiB budget.
fn every_monitor_reads(node: &Node, container: &str, when: &str) {
    let folder = node.root().join(container);
    for monitor in MONITORS {
        assert_eq!(monitor_reads(monitor, &folder), Ok(2 * GIB), "{when}: {monitor:?}");
    }
}

/// Waits up to 5 s for `done`.
fn eventually(mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !done() {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    true
}

#[test]
fn every_monitor_reads_a_container_folder_with_overcommit_on_arbiter_or_not() {
    let node = Node::new("hami-folder");
    node.fill("pod-a_plain", false);
    every_monitor_reads(&node, "pod-a_plain", "overcommit off");

    // Overcommitted, with no arbiter: the first allocation of 1 MiB or more opens the swap table,
    // which is in the region (the file grew to hold it), not beside it.
    node.fill("pod-b_overcommit", true);
    every_monitor_reads(&node, "pod-b_overcommit", "overcommit on, no arbiter");
    let region = node.region("pod-b_overcommit");
    let size = std::fs::metadata(&region).expect("the region").len();
    assert_eq!(size, vgpu_ledger::swap::REGION_WITH_TABLE as u64, "the swap table is in the region");

    // And with the node's arbiter running over them.
    let _server = node.serve();
    node.fill("pod-c_arbitrated", true);
    every_monitor_reads(&node, "pod-c_arbitrated", "overcommit on, serve --swap");
    every_monitor_reads(&node, "pod-b_overcommit", "overcommit on, serve --swap");
}

#[test]
fn an_earlier_builds_swap_table_file_is_removed_by_a_process_or_by_the_arbiter() {
    let node = Node::new("hami-folder-legacy");
    // What an earlier build left: its region, and its swap table in a file of its own (the
    // table's layout from the file's start).
    let legacy_file = || {
        let mut table = vec![0u8; vgpu_ledger::swap::TABLE_SIZE];
        table[..8].copy_from_slice(&vgpu_ledger::swap::MAGIC.to_ne_bytes());
        table[8..16].copy_from_slice(&vgpu_ledger::swap::VERSION.to_ne_bytes());
        table
    };
    node.fill("pod-a_main", false);
    let legacy = vgpu_ledger::swap::legacy_path_for(&node.region("pod-a_main"));
    std::fs::write(&legacy, legacy_file()).expect("the earlier build's table");
    let folder = node.root().join("pod-a_main");
    assert!(
        monitor_reads(Monitor::EveryEntry, &folder).is_err(),
        "release-v2.9's monitor drops the folder the earlier build left"
    );
    // A process of this build that opens the table takes it into the region and removes the file.
    node.fill("pod-a_main", true);
    assert!(!legacy.exists(), "the earlier build's table file is still there");
    every_monitor_reads(&node, "pod-a_main", "after a process of this build");

    // A process of the earlier build that still runs makes its file again: the arbiter removes it,
    // the region holding the table.
    std::fs::write(&legacy, legacy_file()).expect("the earlier build's table, again");
    let _server = node.serve();
    assert!(eventually(|| !legacy.exists()), "the arbiter left the earlier build's table file");
    every_monitor_reads(&node, "pod-a_main", "after the arbiter's pass");
}
