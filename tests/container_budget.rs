//! The budget belongs to the container (docs/container-budget.md): a process whose environment
//! names nothing is held by its container's region, found beside the library it loaded; the region
//! is the authority over any process's environment; and `vgpu-smi resize` changes a running
//! container's budget and compute share. Real processes under `LD_PRELOAD` against the fake
//! driver; HAMi's container layout with real namespaces is in `tests/container_layout.rs`.

mod common;

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{Client, GIB, MIB, Run, SHARED_CACHE_VAR, Scratch};

const CUDA_ERROR_OUT_OF_MEMORY: u64 = 2;
const READY: Duration = Duration::from_secs(20);
const EXIT: Duration = Duration::from_secs(10);
/// HAMi's limit and share fields of device 0 (DESIGN.md §4), which the monitor reads.
const HAMI_LIMIT0: u64 = 1600;
const HAMI_SM_LIMIT0: u64 = 1728;

/// `vgpu-smi ARGS` as the node's root runs it: status, stdout, stderr.
fn smi(args: &[&str]) -> (i32, String, String) {
    let output = Command::new(common::smi_binary())
        .args(args)
        .env_remove(SHARED_CACHE_VAR)
        .env_remove("LD_PRELOAD")
        .output()
        .expect("run vgpu-smi");
    (
        output.status.code().expect("exited"),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

fn u64_in(path: &Path, at: u64) -> u64 {
    let mut bytes = [0u8; 8];
    std::fs::File::open(path).and_then(|f| f.read_exact_at(&mut bytes, at)).expect("read the region");
    u64::from_le_bytes(bytes)
}

fn text(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

/// A container laid out as HAMi lays it out: its own folder holding the library (a copy of this
/// build's) and, once a process of the pod made it, the region.
struct Container {
    scratch: Scratch,
    library: PathBuf,
    region: PathBuf,
}

impl Container {
    fn new(name: &str) -> Container {
        let scratch = Scratch::new(name);
        let dir = scratch.path("vgpu");
        std::fs::create_dir_all(&dir).expect("create the container's folder");
        let library = dir.join("libvgpu.so");
        std::fs::copy(&common::artifacts().libvgpu, &library).expect("copy libvgpu.so");
        let region = dir.join("0f3c2a.cache");
        Container { scratch, library, region }
    }

    /// A process with the pod's environment: a 1 GiB budget on device 0 and the region beside the
    /// library, with the given compute share if any.
    fn pod(&self, command: &[&str]) -> Run {
        Run::new("direct", command)
            .library(&self.library)
            .env(SHARED_CACHE_VAR, text(&self.region))
            .env("CUDA_DEVICE_MEMORY_LIMIT_0", "1g")
            .env("FAKEGPU_SHARED", text(&self.scratch.path("fake")))
    }

    /// A process of the same container with none of the pod's variables.
    fn stripped(&self, command: &[&str]) -> Run {
        Run::new("direct", command)
            .library(&self.library)
            .stripped()
            .env("FAKEGPU_SHARED", text(&self.scratch.path("fake")))
    }
}

fn step(client: &mut Client, line: &str, key: &str) -> u64 {
    client.send(line);
    client.wait_for(key, READY)
}

#[test]
fn a_stripped_process_is_held_by_the_region_beside_its_library() {
    let c = Container::new("stripped");
    let mut pod = c.pod(&["steps"]).spawn();
    pod.wait_for("ready", READY);
    assert_eq!(step(&mut pod, "alloc a 256", "a_status"), 0);

    // Another program's cache file beside the library is not a second region.
    std::fs::write(c.library.with_file_name("fonts.cache"), b"not a region").expect("write a cache file");
    // The card has 16 GiB; the stripped process sees the container's 1 GiB, less what the pod holds.
    let mut stripped = c.stripped(&["steps"]).env("LIBCUDA_LOG_LEVEL", "4").spawn();
    stripped.wait_for("ready", READY);
    assert_eq!(step(&mut stripped, "info s", "s_total"), GIB);
    assert_eq!(stripped.wait_for("s_device_total", READY), GIB);
    assert_eq!(stripped.wait_for("s_free", READY), 768 * MIB);
    assert_eq!(step(&mut stripped, "alloc b 768", "b_status"), 0);
    assert_eq!(step(&mut stripped, "alloc c 64", "c_status"), CUDA_ERROR_OUT_OF_MEMORY);
    // One region: the monitor's file holds both.
    assert_eq!(common::ledger_used0(&c.region), GIB);
    stripped.close_stdin();
    let report = stripped.finish(EXIT);
    assert!(report.success, "{report:?}");
    assert!(
        report.stderr.contains(&format!("budget from the container's region {}", c.region.display())),
        "the debug line does not say where the budget came from:\n{}",
        report.stderr
    );
    pod.close_stdin();
    assert!(pod.finish(EXIT).success);
}

#[test]
fn an_edited_environment_cannot_leave_the_container_region() {
    let c = Container::new("edited");
    let mut pod = c.pod(&["steps"]).spawn();
    pod.wait_for("ready", READY);
    assert_eq!(step(&mut pod, "alloc a 512", "a_status"), 0);
    // A process that names its own region file and a larger budget is still held by the container's.
    let own = c.scratch.path("mine.cache");
    let edited = c
        .stripped(&["hold", "64", "16384"])
        .env(SHARED_CACHE_VAR, text(&own))
        .env("CUDA_DEVICE_MEMORY_LIMIT_0", "80g")
        .env("LIBVGPU_LEDGER", "local")
        .report_within(EXIT);
    assert_eq!(edited.get("held_bytes"), 512 * MIB, "{edited:?}");
    assert!(!own.exists(), "the process made a region of its own at {}", own.display());
    assert!(edited.stderr.contains("ignored: this container's region is"), "{}", edited.stderr);
    pod.close_stdin();
    assert!(pod.finish(EXIT).success);
}

#[test]
fn a_process_with_no_budget_anywhere_stays_silent_and_unbudgeted() {
    // A library in a folder with no region, no variables, not mounted by a node: nothing is budgeted.
    let c = Container::new("nothing");
    let run = c.stripped(&["hold", "1024", "4096"]).report_within(EXIT);
    assert_eq!(run.get("held_bytes"), 4 * GIB, "{run:?}");
    assert!(run.stderr.is_empty(), "a process without any budget wrote: {}", run.stderr);
    assert!(!c.region.exists());
}

#[test]
fn a_resize_reaches_a_running_process_at_its_next_call() {
    let c = Container::new("resize");
    let mut pod = c.pod(&["steps"]).env("LIBCUDA_LOG_LEVEL", "3").spawn();
    pod.wait_for("ready", READY);
    assert_eq!(step(&mut pod, "alloc a 768", "a_status"), 0);
    let region = text(&c.region);

    // Grow to 2 GiB: the next query and allocation see it.
    let (status, out, err) = smi(&["resize", "--device", "0", "2g", region]);
    assert_eq!(status, 0, "{out}{err}");
    assert!(out.contains("budget 1.0 GiB -> 2.0 GiB; the container holds 768.0 MiB"), "{out}");
    assert_eq!(step(&mut pod, "info grown", "grown_total"), 2 * GIB);
    assert_eq!(pod.wait_for("grown_device_total", READY), 2 * GIB);
    assert_eq!(pod.wait_for("grown_free", READY), 2 * GIB - 768 * MIB);
    assert_eq!(step(&mut pod, "alloc b 1024", "b_status"), 0, "growing must let allocations through at once");
    assert_eq!(u64_in(&c.region, HAMI_LIMIT0), 2 * GIB, "HAMi's monitor must see the new limit");

    // A new process of the container sees it too, in NVML as well.
    let nvml = c.stripped(&["nvml"]).report_within(EXIT);
    assert_eq!(nvml.get("nvml0_total"), 2 * GIB, "{nvml:?}");
    assert_eq!(nvml.get("nvml0_used"), 1792 * MIB, "{nvml:?}");

    // Shrink below what is held: nothing is touched, new allocations wait for usage to fall under it.
    let (status, out, err) = smi(&["resize", "--device", "0", "1g", region]);
    assert_eq!(status, 0, "{out}{err}");
    assert!(out.contains("new allocations are refused until usage falls under it"), "{out}");
    assert_eq!(step(&mut pod, "info shrunk", "shrunk_total"), GIB);
    assert_eq!(pod.wait_for("shrunk_free", READY), 0);
    assert_eq!(step(&mut pod, "alloc c 64", "c_status"), CUDA_ERROR_OUT_OF_MEMORY);
    assert_eq!(common::ledger_used0(&c.region), 1792 * MIB, "a shrink must not touch what is allocated");
    assert_eq!(step(&mut pod, "free b", "b_freed"), 1);
    assert_eq!(step(&mut pod, "alloc d 256", "d_status"), 0, "under the budget again: allocations pass");
    assert_eq!(step(&mut pod, "alloc e 64", "e_status"), CUDA_ERROR_OUT_OF_MEMORY);

    pod.close_stdin();
    let report = pod.finish(EXIT);
    assert!(report.success, "{report:?}");
    for line in [
        "the budget of device 0 changed from 1073741824 bytes to 2147483648 bytes",
        "the budget of device 0 changed from 2147483648 bytes to 1073741824 bytes",
    ] {
        assert!(report.stderr.contains(line), "no info line '{line}':\n{}", report.stderr);
    }
}

#[test]
fn a_resize_to_a_bad_value_is_refused_with_the_environment_messages() {
    let c = Container::new("resize-bad");
    let mut pod = c.pod(&["steps"]).spawn();
    pod.wait_for("ready", READY);
    assert_eq!(step(&mut pod, "alloc a 64", "a_status"), 0);
    let region = text(&c.region);
    let (status, _, err) = smi(&["resize", "--device", "0", "lots", region]);
    assert_eq!(status, 2);
    assert!(
        err.contains(
            "\"lots\" is not a memory size (bytes, or a number with k/m/g/t, Ki/Mi/Gi/Ti or KiB/MiB/GiB/TiB)"
        ),
        "{err}"
    );
    // The same words the environment gets.
    let env = Run::new("direct", &["hold", "64", "64"])
        .env("CUDA_DEVICE_MEMORY_LIMIT_0", "lots")
        .report_within(EXIT);
    assert!(
        env.stderr.contains("\"lots\" is not a memory size (bytes, or a number with k/m/g/t,"),
        "{}",
        env.stderr
    );
    for (args, phrase) in [
        (&["resize", "--device", "0", "0", region][..], "a budget of 0 would lift the limit"),
        (&["resize", "--device", "3", "2g", region], "the region has no device 3"),
        (&["resize", "--device", "0", "--share", "50", region], "device 0 has no compute share"),
        (&["resize", "--device", "0", "--share", "150", region], "\"150\" is not a percentage from 0 to 100"),
    ] {
        let (status, _, err) = smi(args);
        assert_eq!(status, 2, "{args:?}: {err}");
        assert!(err.contains(phrase), "{args:?}: {err}");
    }
    assert_eq!(u64_in(&c.region, HAMI_LIMIT0), GIB, "a refused resize changed the region");
    pod.close_stdin();
    assert!(pod.finish(EXIT).success);
}

#[test]
fn the_region_share_wins_and_a_share_resize_reaches_a_running_process() {
    let c = Container::new("share");
    let fake = c.scratch.path("fake");
    let compute = |share: &str, millis: &str| {
        Run::compute("direct", &["timed", "kernel", "2000", millis])
            .library(&c.library)
            .env(SHARED_CACHE_VAR, text(&c.region))
            .env("CUDA_DEVICE_MEMORY_LIMIT_0", "1g")
            .env("CUDA_DEVICE_SM_LIMIT", share)
            .env("FAKEGPU_SHARED", text(&fake))
            .env("LIBCUDA_LOG_LEVEL", "3")
    };
    // The first process makes the region with a 20 % share.
    let first = compute("20", "1500").report_within(Duration::from_secs(30));
    assert!(first.success, "{first:?}");
    let share = first.get("share_permille");
    assert!((150..=260).contains(&share), "first process at 20 %: {share} permille");
    assert_eq!(u64_in(&c.region, HAMI_SM_LIMIT0), 20);

    // A later process whose environment asks for 80 % gets the region's 20 %, and says so.
    let edited = compute("80", "1500").report_within(Duration::from_secs(30));
    let share = edited.get("share_permille");
    assert!((150..=260).contains(&share), "an environment asking 80 % got {share} permille");
    assert!(edited.stderr.contains("the file's share applies"), "{}", edited.stderr);

    // A resize to 60 % while a process runs: it reads the new share at its next launch.
    let mut running = compute("20", "3000").spawn();
    std::thread::sleep(Duration::from_millis(500));
    let (status, out, err) = smi(&["resize", "--device", "0", "--share", "60", text(&c.region)]);
    assert_eq!(status, 0, "{out}{err}");
    assert!(out.contains("compute share 20 % -> 60 %"), "{out}");
    assert_eq!(u64_in(&c.region, HAMI_SM_LIMIT0), 60, "HAMi's monitor must see the new share");
    running.close_stdin();
    let report = running.finish(Duration::from_secs(30));
    assert!(report.success, "{report:?}");
    assert!(
        report.stderr.contains("the compute share of device 0 changed from 20 % to 60 %"),
        "{}",
        report.stderr
    );
    let share = report.get("share_permille");
    assert!(share > 300, "after the resize to 60 % the run averaged only {share} permille");
}
