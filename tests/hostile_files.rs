//! `vgpu-smi` on the node against container directories whose tenants planted hostile files: a
//! FIFO, links to a node file and to another container's region, symlinked directories, a 1 GiB
//! sparse file, a file that changes size while it is read, a file under a lease, odd names, too
//! many entries. Each command (table, `--json`, `metrics`, `reclaim`, a `serve` scrape) finishes
//! within 2 s, the real container is still reported, what was refused is reported, and nothing
//! outside the scanned tree is read or written.

mod common;

use std::fs::{File, FileTimes};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use common::{Client, MIB, Run, SHARED_CACHE_VAR, Scratch};
use serde_json::Value;

const READY: Duration = Duration::from_secs(10);
const EXIT: Duration = Duration::from_secs(10);
/// What each `vgpu-smi` command may take on a tree full of hostile files.
const PROMPT: Duration = Duration::from_secs(2);
const CONTEXT: u64 = 32 * MIB;

fn text(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

struct Smi {
    status: i32,
    stdout: String,
    stderr: String,
    took: Duration,
}

/// `vgpu-smi ARGS`, killed (and the test failed) if it runs past [`PROMPT`].
fn smi(args: &[&str]) -> Smi {
    let binary = common::smi_binary();
    let started = Instant::now();
    let mut child = Command::new(binary)
        .args(args)
        .env_remove(SHARED_CACHE_VAR)
        .env_remove("LD_PRELOAD")
        .env_remove("LD_LIBRARY_PATH")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run vgpu-smi");
    let (mut out, mut err) = (child.stdout.take().expect("stdout"), child.stderr.take().expect("stderr"));
    let out = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = std::io::Read::read_to_string(&mut out, &mut text);
        text
    });
    let err = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = std::io::Read::read_to_string(&mut err, &mut text);
        text
    });
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for vgpu-smi") {
            break status;
        }
        if started.elapsed() > PROMPT {
            let _ = child.kill();
            let _ = child.wait();
            panic!("vgpu-smi {args:?} still ran after {PROMPT:?}");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let took = started.elapsed();
    let (stdout, stderr) = (out.join().expect("stdout"), err.join().expect("stderr"));
    let status = status.code().unwrap_or_else(|| panic!("vgpu-smi {args:?} died: {status:?}\n{stderr}"));
    Smi { status, stdout, stderr, took }
}

/// A client holding `mib` MiB on device 0 of the container whose region is `cache`.
fn holder(cache: &Path, fake: &Path, mib: u64) -> Client {
    let max = mib.to_string();
    let mut client = Run::new("direct", &["hold", "64", &max])
        .env(SHARED_CACHE_VAR, text(cache))
        .env("CUDA_DEVICE_MEMORY_LIMIT_0", "1g")
        .env("FAKEGPU_SHARED", text(fake))
        .env("FAKEGPU_CONTEXT_MEMORY", "32m")
        .spawn();
    client.wait_for("ready", READY);
    assert_eq!(client.get("held_bytes"), mib * MIB, "pid {} was refused", client.pid());
    client
}

/// What a file outside the tree looks like from the outside: content, times, size.
#[derive(Debug, PartialEq, Eq)]
struct Seen {
    bytes: Vec<u8>,
    accessed: SystemTime,
    modified: SystemTime,
}

/// Reads `path`'s content, then sets its times to long ago, access before modification: a
/// filesystem mounted `relatime` (the default) then records the next read.
fn watch(path: &Path) -> Seen {
    let bytes = std::fs::read(path).expect("read a target");
    let accessed = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
    let modified = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_100);
    let file = File::options().write(true).open(path).expect("open a target");
    file.set_times(FileTimes::new().set_accessed(accessed).set_modified(modified)).expect("set times");
    Seen { bytes, accessed, modified }
}

/// The times now, then the content (reading it last: that read moves the access time).
fn look(path: &Path) -> Seen {
    let metadata = std::fs::metadata(path).expect("stat a target");
    let (accessed, modified) = (metadata.accessed().expect("atime"), metadata.modified().expect("mtime"));
    Seen { bytes: std::fs::read(path).expect("read a target"), accessed, modified }
}

/// Keeps `path` changing size (empty, a region's first 100 kB, the region's size, a long sparse
/// tail, just short of a HAMi region) until `stop` is set; writes little, so as not to load the
/// disk.
fn keep_resizing(path: PathBuf, region: Vec<u8>, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let file = File::options().write(true).open(&path).expect("open the resizing file");
        let mut rounds = 0u64;
        while !stop.load(Ordering::Relaxed) {
            let _ = file.set_len(0);
            let _ = file.write_all_at(&region[..100_000], 0);
            let _ = file.set_len(region.len() as u64);
            let _ = file.set_len(64 << 20);
            let _ = file.set_len(2_008_000);
            rounds += 1;
            std::thread::sleep(Duration::from_micros(200));
        }
        rounds
    })
}

/// Takes a write lease on `file` (the owner may): any other open of it then waits for the lease
/// to be broken, up to the kernel's lease-break time (45 s by default), unless it does not block.
fn take_lease(file: &File) -> bool {
    // SAFETY: ignoring SIGIO, which the kernel sends to a lease holder when another process opens
    // the file; this test binary wants no other reaction to it.
    unsafe { libc::signal(libc::SIGIO, libc::SIG_IGN) };
    // SAFETY: a valid descriptor and the F_SETLEASE command with a lease type.
    unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETLEASE, libc::F_WRLCK) == 0 }
}

/// A region written by a real process that has since exited.
fn finished_region(path: &Path) -> Vec<u8> {
    let r = Run::new("direct", &["hold", "64", "64"])
        .env(SHARED_CACHE_VAR, text(path))
        .env("CUDA_DEVICE_MEMORY_LIMIT_0", "1g")
        .report_within(EXIT);
    assert!(r.success, "{r:?}");
    std::fs::read(path).expect("read region")
}

fn reasons(doc: &Value) -> Vec<(String, String)> {
    doc["skipped"]
        .as_array()
        .unwrap_or_else(|| panic!("no skipped list in {doc:#}"))
        .iter()
        .map(|s| (s["path"].as_str().unwrap().to_owned(), s["reason"].as_str().unwrap().to_owned()))
        .collect()
}

fn mkfifo(path: &Path) {
    let name = std::ffi::CString::new(text(path)).expect("a path");
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o666) }, 0, "mkfifo {}", path.display());
}

#[test]
fn hostile_files_are_skipped_promptly_and_nothing_outside_the_tree_is_touched() {
    let scratch = Scratch::new("hostile");
    let fake = scratch.path("fake");
    let tree = scratch.path("containers");
    let outside = scratch.path("node");
    std::fs::create_dir_all(&outside).expect("node dir");

    // Outside the scanned tree: a node file, and another container's region with a dead process
    // in it (what a reclaim through a link would give back).
    let node_file = outside.join("shadow");
    std::fs::write(&node_file, b"root:secret:1:0:99999:7:::\n").expect("node file");
    let victim_dir = outside.join("pod-z_victim");
    std::fs::create_dir_all(&victim_dir).expect("victim dir");
    let victim = victim_dir.join("cudevshr.cache");
    let mut dead = holder(&victim, &fake, 64);
    dead.kill();
    assert!(!dead.finish(EXIT).success);

    // The real container, with a live process.
    let real = tree.join("pod-a_main");
    std::fs::create_dir_all(&real).expect("container dir");
    let mut live = holder(&real.join("cudevshr.cache"), &fake, 128);

    // The hostile ones, each in a container directory of its own as HAMi makes them.
    let dir = |name: &str| {
        let dir = tree.join(name);
        std::fs::create_dir_all(&dir).expect("container dir");
        dir
    };
    mkfifo(&dir("pod-fifo_c").join("x.cache"));
    std::os::unix::fs::symlink(&node_file, dir("pod-node_c").join("x.cache")).expect("link");
    std::os::unix::fs::symlink(&victim, dir("pod-steal_c").join("x.cache")).expect("link");
    std::os::unix::fs::symlink(&victim_dir, dir("pod-subdir_c").join("x.cache")).expect("link");
    std::os::unix::fs::symlink(&victim_dir, tree.join("pod-linkdir_c")).expect("link");
    File::create(dir("pod-sparse_c").join("x.cache")).expect("sparse").set_len(1 << 30).expect("1 GiB");
    let region = finished_region(&scratch.path("sample.cache"));
    let resizing = dir("pod-resize_c").join("x.cache");
    std::fs::write(&resizing, &region).expect("resizing file");
    std::fs::write(dir("pod-odd_c").join("x\x1b]0;owned\x07.cache"), &region).expect("odd name");
    let many = dir("pod-many_c");
    for i in 0..300 {
        File::create(many.join(format!("f{i:03}"))).expect("an entry");
    }
    let leased_path = dir("pod-lease_c").join("x.cache");
    std::fs::write(&leased_path, &region).expect("leased file");
    let leased = File::open(&leased_path).expect("open leased");
    let lease = take_lease(&leased);
    if !lease {
        eprintln!(
            "no write lease could be taken here ({}); that case is left out",
            std::io::Error::last_os_error()
        );
    }
    // Everything in the tree, to show nothing was added.
    let entries_before = listing(&tree);

    let (node_before, victim_before) = (watch(&node_file), watch(&victim));
    let stop = Arc::new(AtomicBool::new(false));
    let resizer = keep_resizing(resizing.clone(), region.clone(), stop.clone());

    let json = smi(&["--json", text(&tree)]);
    let table = smi(&[text(&tree)]);
    let metrics = smi(&["metrics", text(&tree)]);
    let reclaim = smi(&["reclaim", text(&tree)]);
    let reclaim_json = smi(&["reclaim", "--json", text(&tree)]);
    let scraped = scrape_once(&tree);
    // Each hostile file named on its own.
    let mut singles = Vec::new();
    for path in [
        tree.join("pod-fifo_c/x.cache"),
        tree.join("pod-node_c/x.cache"),
        tree.join("pod-steal_c/x.cache"),
        tree.join("pod-subdir_c/x.cache"),
        tree.join("pod-sparse_c/x.cache"),
        resizing.clone(),
        leased_path.clone(),
    ] {
        for args in [&[][..], &["--json"], &["metrics"], &["reclaim"]] {
            let mut args = args.to_vec();
            args.push(text(&path));
            singles.push((path.clone(), args.join(" "), smi(&args)));
        }
    }
    stop.store(true, Ordering::Relaxed);
    let rounds = resizer.join().expect("resizer");
    assert!(rounds > 0, "the file never changed size");

    // Nothing outside the tree was read or written.
    assert_eq!(look(&node_file), node_before, "the node file was touched");
    assert_eq!(look(&victim), victim_before, "the region behind a link was touched");
    let node_after_read = std::fs::metadata(&node_file).expect("stat").accessed().expect("atime");
    if node_after_read == node_before.accessed {
        eprintln!("this filesystem does not record reads (noatime): only content and mtime were checked");
    }
    assert_eq!(listing(&tree), entries_before, "a command added or removed something in the tree");
    // The dead process behind the link still holds its bytes: no reclaim reached it.
    let victim_doc = smi(&["--json", text(&victim)]);
    let processes = &victim_doc_json(&victim_doc)["containers"][0]["region"]["processes"];
    assert_eq!(processes[0]["dead"], true, "{processes:#}");

    // The real container is reported by every command.
    for (what, run) in [("--json", &json), ("table", &table), ("metrics", &metrics), ("reclaim", &reclaim)] {
        assert!(run.took < PROMPT, "{what} took {:?}", run.took);
        assert!(matches!(run.status, 0 | 3 | 4), "{what}: status {}\n{}", run.status, run.stderr);
        assert!(!run.stdout.contains('\x1b'), "{what} printed an escape character:\n{}", run.stdout);
    }
    let doc: Value = serde_json::from_str(&json.stdout).expect("JSON");
    let real_section = doc["containers"]
        .as_array()
        .expect("containers")
        .iter()
        .find(|c| c["pod_uid"] == "pod-a")
        .unwrap_or_else(|| panic!("the real container is missing: {doc:#}"));
    assert_eq!(real_section["region"]["devices"][0]["used"].as_u64(), Some(128 * MIB + CONTEXT));
    assert!(table.stdout.contains("== container main, pod pod-a"), "{}", table.stdout);
    assert!(metrics.stdout.contains("pod_uid=\"pod-a\",container=\"main\"} 1\n"), "{}", metrics.stdout);
    assert!(reclaim.stdout.contains("pod-a_main/cudevshr.cache: no dead process"), "{}", reclaim.stdout);
    assert!(scraped.contains("pod_uid=\"pod-a\",container=\"main\"} 1\n"), "{scraped}");
    let reclaimed: Value = serde_json::from_str(&reclaim_json.stdout).expect("reclaim JSON");
    let regions = reclaimed["regions"].as_array().expect("regions");
    assert!(regions.iter().all(|r| !r["path"].as_str().unwrap_or("").contains("victim")), "{reclaimed:#}");

    // What was refused is said, and why.
    let skipped = reasons(&doc);
    let reason_of = |needle: &str| {
        skipped
            .iter()
            .find(|(path, _)| path.contains(needle))
            .map(|(_, reason)| reason.as_str())
            .unwrap_or_else(|| panic!("{needle} not among the skipped: {skipped:#?}"))
    };
    assert!(reason_of("pod-fifo_c/x.cache").contains("a FIFO"));
    assert!(reason_of("pod-node_c/x.cache").contains("symbolic link"));
    assert!(reason_of("pod-steal_c/x.cache").contains("symbolic link"));
    assert!(reason_of("pod-subdir_c/x.cache").contains("symbolic link"));
    assert!(reason_of("pod-linkdir_c").contains("symbolic link"));
    assert!(reason_of("pod-odd_c/x\\u{1b}]0;owned\\u{7}.cache").contains("control characters"));
    assert!(reason_of("pod-many_c").contains("more than 256 entries"));
    if lease {
        assert!(reason_of("pod-lease_c/x.cache").contains("temporarily unavailable"), "{skipped:#?}");
    }
    assert_eq!(reasons(&reclaimed), skipped, "reclaim refuses the same");
    for run in [&table, &metrics, &reclaim] {
        assert!(run.stderr.contains("vgpu-smi: skipped") || run.stdout.contains("skipped"), "{}", run.stderr);
    }
    assert!(table.stdout.contains("skipped (links are not followed"), "{}", table.stdout);
    assert!(metrics.stdout.contains(&format!("vgpu_scan_skipped_entries{{root=\"{}\"}} ", text(&tree))));
    // The sparse file is a regular file: read (its first 2 MB only) and found not to be a region.
    let sparse = doc["containers"].as_array().unwrap().iter().find(|c| c["pod_uid"] == "pod-sparse").cloned();
    assert_eq!(sparse.expect("the sparse file's container")["error"]["kind"], "not_initialised");

    // Named one by one: refused or read, promptly, never followed.
    for (path, args, run) in &singles {
        assert!(run.took < PROMPT, "vgpu-smi {args} took {:?}", run.took);
        let followed = path.to_str().is_some_and(|p| p.contains("node_c") || p.contains("steal_c"));
        if followed || path.to_str().is_some_and(|p| p.contains("fifo_c") || p.contains("subdir_c")) {
            assert_eq!(run.status, 3, "vgpu-smi {args}: {}{}", run.stdout, run.stderr);
        }
        assert!(!run.stdout.contains("secret"), "vgpu-smi {args} printed the node file");
    }
    drop(leased);
    live.close_stdin();
    assert!(live.finish(EXIT).success);
}

/// One scrape of `vgpu-smi serve` over `tree`, answered within [`PROMPT`]: the body.
fn scrape_once(tree: &Path) -> String {
    use std::io::{BufRead, BufReader, Read, Write};
    let mut server = Command::new(common::smi_binary())
        .args(["serve", "--listen", "127.0.0.1:0", text(tree)])
        .env_remove(SHARED_CACHE_VAR)
        .env_remove("LD_PRELOAD")
        .env_remove("LD_LIBRARY_PATH")
        .stderr(Stdio::piped())
        .spawn()
        .expect("start vgpu-smi serve");
    let mut line = String::new();
    BufReader::new(server.stderr.take().expect("stderr")).read_line(&mut line).expect("where it listens");
    let port: u16 = line
        .split("http://127.0.0.1:")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .and_then(|port| port.parse().ok())
        .unwrap_or_else(|| panic!("no port in {line:?}"));
    let started = Instant::now();
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect to vgpu-smi serve");
    stream.set_read_timeout(Some(PROMPT)).expect("timeout");
    write!(stream, "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").expect("send");
    let mut response = String::new();
    let read = stream.read_to_string(&mut response);
    let took = started.elapsed();
    server.kill().expect("stop vgpu-smi serve");
    let _ = server.wait();
    read.expect("read the scrape");
    assert!(took < PROMPT, "a scrape took {took:?}");
    response.split_once("\r\n\r\n").map(|(_, body)| body.to_owned()).expect("a response")
}

fn victim_doc_json(run: &Smi) -> Value {
    serde_json::from_str(&run.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}{}", run.stdout, run.stderr))
}

/// Every path under `root` with its type and size, not following links.
fn listing(root: &Path) -> Vec<(PathBuf, u32, u64)> {
    let mut found = Vec::new();
    let mut stack = vec![root.to_owned()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("list").flatten() {
            let path = entry.path();
            let metadata = std::fs::symlink_metadata(&path).expect("lstat");
            if metadata.is_dir() {
                stack.push(path.clone());
            }
            // The resizing file's size is its own business.
            let size = if metadata.is_file() && !path.ends_with("pod-resize_c/x.cache") {
                metadata.size()
            } else {
                0
            };
            found.push((path, metadata.mode() & 0o170000, size));
        }
    }
    found.sort();
    found
}

#[test]
fn reclaim_does_not_wait_on_a_lock_a_tenant_holds() {
    let scratch = Scratch::new("hostile-lock");
    let region = finished_region(&scratch.path("sample.cache"));
    let path = scratch.path("held.cache");
    std::fs::write(&path, &region).expect("region");
    let holder = File::open(&path).expect("open");
    // SAFETY: a valid descriptor and a flock operation.
    assert_eq!(unsafe { libc::flock(holder.as_raw_fd(), libc::LOCK_EX) }, 0);
    let before = std::fs::read(&path).expect("read");
    let reclaim = smi(&["reclaim", text(&path)]);
    assert_eq!(reclaim.status, 3, "{}{}", reclaim.stdout, reclaim.stderr);
    assert!(
        reclaim.stderr.contains("cannot lock") && reclaim.stderr.contains("held its lock"),
        "{}",
        reclaim.stderr
    );
    assert_eq!(std::fs::read(&path).expect("read"), before);
    drop(holder);
    let reclaim = smi(&["reclaim", text(&path)]);
    assert_eq!(reclaim.status, 0, "{}", reclaim.stderr);
}
