//! Processes sharing one card (`FAKEGPU_SHARED`) get back what a killed process held, as a real
//! driver frees a process's memory when it ends: the next process refused for lack of room, or
//! reading NVML, finds it dead and gives its bytes back, and never those of a process still alive.
//! The test drives several children of its own binary (`common`), one per process on the card.

#[macro_use]
mod common;

use std::ffi::{c_int, c_uint, c_void};
use std::io::{BufReader, Read, Write};
use std::process::{Child, ChildStdin, Stdio};
use std::ptr::null_mut;
use std::time::{Duration, Instant};

use common::*;

const OUT_OF_MEMORY: c_int = 2;
const MIB: u64 = 1 << 20;
const TEST: &str = "a_killed_process_gives_its_memory_back_and_a_live_one_keeps_it";

/// A child on the shared card, doing `step`, with its stdin and stdout piped.
struct Process {
    child: Child,
    stdin: Option<ChildStdin>,
    said: BufReader<std::process::ChildStdout>,
}

impl Process {
    fn start(card: &str, step: &str, extra: &[(&str, &str)]) -> Process {
        let mut env = vec![("FAKEGPU_SHARED", card), ("FAKEGPU_MEMORY", "1g"), ("SMOKE_STEP", step)];
        env.extend_from_slice(extra);
        let mut child = child_command(TEST, &env)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn a process on the card");
        let stdin = child.stdin.take();
        let said = BufReader::new(child.stdout.take().expect("piped stdout"));
        Process { child, stdin, said }
    }

    fn pid(&self) -> String {
        self.child.id().to_string()
    }

    fn tell(&mut self, word: &str) {
        let stdin = self.stdin.as_mut().expect("stdin still open");
        writeln!(stdin, "{word}").expect("tell the child");
    }

    /// Closes its stdin and checks that it passed.
    fn finish(mut self) {
        drop(self.stdin.take());
        let mut rest = String::new();
        self.said.read_to_string(&mut rest).expect("the child's output");
        let status = self.child.wait().expect("wait for the child");
        assert!(status.success() && rest.contains("1 passed"), "the child failed:\n{rest}");
    }
}

/// Waits until process `pid` has finished (a zombie its parent has not waited for yet).
fn until_finished(pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("a zombie stays in /proc");
        if stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().next()) == Some("Z") {
            return;
        }
        assert!(Instant::now() < deadline, "{pid} never finished: {stat}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_killed_process_gives_its_memory_back_and_a_live_one_keeps_it() {
    let path = TempFile::new("killed.ledger");
    if !is_child() {
        let card = path.to_str().expect("UTF-8 temp path");
        // A holds 600 MiB of the 1 GiB card, B waits beside it.
        let mut holder = Process::start(card, "holder", &[]);
        wait_for_line(&mut holder.said, "held");
        let holder_pid = holder.pid();
        let mut survivor = Process::start(card, "survivor", &[("HOLDER_PID", &holder_pid)]);
        wait_for_line(&mut survivor.said, "ready");

        // A is killed; B goes on while A is still a zombie nobody waited for: a real driver frees
        // a process's memory as it ends, not when its parent reaps it.
        holder.child.kill().expect("SIGKILL the holder");
        until_finished(holder.child.id());
        survivor.tell("go");
        wait_for_line(&mut survivor.said, "holding");
        let status = holder.child.wait().expect("wait for the holder");
        assert!(!status.success(), "killed: {status}");

        // A third process allocates beside B, is refused where only B's memory is in the way, and
        // exits without freeing: what it held goes back as it ends, and B's stays.
        let survivor_pid = survivor.pid();
        run_child(
            TEST,
            &[
                ("FAKEGPU_SHARED", card),
                ("FAKEGPU_MEMORY", "1g"),
                ("SMOKE_STEP", "third"),
                ("SURVIVOR_PID", &survivor_pid),
            ],
        );
        survivor.tell("done");
        survivor.finish();
        run_child(TEST, &[("FAKEGPU_SHARED", card), ("FAKEGPU_MEMORY", "1g"), ("SMOKE_STEP", "after")]);
        return;
    }
    let cuda = Driver::open("libcuda.so.1");
    let alloc = function!(cuda, cuMemAlloc_v2: fn(*mut u64, usize) -> c_int);
    let create = function!(cuda, cuMemCreate: fn(*mut u64, usize, *const MemoryProps, u64) -> c_int);
    let step = std::env::var("SMOKE_STEP").expect("a step");
    if step == "after" {
        // Everyone gone: the card is empty, and its peak says what was held at once.
        assert_eq!(stats(&cuda), (0, 1000 * MIB));
        return;
    }
    bind_context(&cuda, 0);
    let mut ptr = 0;
    match step.as_str() {
        "holder" => {
            assert_eq!(alloc(&mut ptr, (400 * MIB) as usize), SUCCESS);
            let mut handle = 0;
            assert_eq!(create(&mut handle, (200 * MIB) as usize, &pinned_on(0), 0), SUCCESS);
            assert_eq!(stats(&cuda).0, 600 * MIB);
            println!("held");
            let _ = std::io::stdin().read_line(&mut String::new()); // until killed
        }
        "survivor" => {
            let holder: u32 = std::env::var("HOLDER_PID").unwrap().parse().unwrap();
            let me = std::process::id();
            assert_eq!(alloc(&mut ptr, (900 * MIB) as usize), OUT_OF_MEMORY, "A lives: none of it is taken");
            assert_eq!(listed(&cuda), [(me, 0), (holder, 600 * MIB)]);
            println!("ready");
            let mut word = String::new();
            std::io::stdin().read_line(&mut word).expect("a word");
            assert_eq!(word.trim(), "go");
            // A was killed: NVML lists it no more, and its 600 MiB are free for B's 900.
            assert_eq!(listed(&cuda), [(me, 0)]);
            assert_eq!(alloc(&mut ptr, (900 * MIB) as usize), SUCCESS);
            assert_eq!(stats(&cuda).0, 900 * MIB);
            println!("holding");
            word.clear();
            std::io::stdin().read_line(&mut word).expect("a word");
            assert_eq!(word.trim(), "done");
            assert_eq!(stats(&cuda).0, 900 * MIB, "the third process gave back its own bytes only");
            // Exits holding its 900 MiB: given back as it ends.
        }
        "third" => {
            let survivor: u32 = std::env::var("SURVIVOR_PID").unwrap().parse().unwrap();
            assert_eq!(alloc(&mut ptr, (100 * MIB) as usize), SUCCESS);
            assert_eq!(alloc(&mut ptr, (200 * MIB) as usize), OUT_OF_MEMORY, "B lives: its bytes stay");
            assert_eq!(stats(&cuda).0, 1000 * MIB);
            assert_eq!(listed(&cuda), [(std::process::id(), 100 * MIB), (survivor, 900 * MIB)]);
        }
        other => panic!("unknown step {other}"),
    }
}

/// (used, peak) of physical device 0, read through the test hook.
fn stats(driver: &Driver) -> (u64, u64) {
    let hook = function!(driver, fakegpu_device_stats: fn(c_uint, *mut u64, *mut u64, *mut u64) -> c_int);
    let (mut used, mut peak) = (0, 0);
    assert_eq!(hook(0, &mut used, &mut peak, null_mut()), 0);
    (used, peak)
}

/// NVML's compute processes on device 0 as (pid, bytes), this process first, the others by pid.
fn listed(driver: &Driver) -> Vec<(u32, u64)> {
    let init = function!(driver, nvmlInit_v2: fn() -> c_int);
    let by_index = function!(driver, nvmlDeviceGetHandleByIndex_v2: fn(c_uint, *mut *mut c_void) -> c_int);
    let processes = function!(
        driver,
        nvmlDeviceGetComputeRunningProcesses_v3: fn(*mut c_void, *mut c_uint, *mut [u64; 3]) -> c_int
    );
    let mut device = null_mut();
    assert_eq!(init(), SUCCESS);
    assert_eq!(by_index(0, &mut device), SUCCESS);
    let mut records = [[0; 3]; 8];
    let mut count = records.len() as c_uint;
    assert_eq!(processes(device, &mut count, records.as_mut_ptr()), SUCCESS);
    let mut listed: Vec<(u32, u64)> =
        records[..count as usize].iter().map(|record| (record[0] as u32, record[1])).collect();
    listed[1..].sort_unstable();
    listed
}
