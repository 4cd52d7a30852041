"""PyTorch workloads of the compute-limit benchmark (ci/gpu-compute): prints `key=value` lines.

    python3 ci/gpu/compute_share.py eager SECONDS          bf16 matmul loop, throughput over SECONDS
    python3 ci/gpu/compute_share.py graph SECONDS          the same matmuls captured in a CUDA graph
    python3 ci/gpu/compute_share.py split READY GO         one of two processes run side by side

eager: N×N @ N×N bf16 matmuls (N = COMPUTE_MATMUL_N, default 8192) in a loop; after a warm-up of
COMPUTE_WARMUP seconds (default 1) it runs for SECONDS of wall time and prints rate= (matmuls/s).
graph: GRAPH_MATMULS (10) of the same matmuls captured once with torch.cuda.CUDAGraph and replayed;
rate= is replays/s. split: the eager loop; after the warm-up the process creates the file READY and
keeps running until the file GO appears, holding "START END" (time.time() seconds); it measures from
START to END, so two processes started together measure over the same window. GO holding "abort"
makes it exit (the other process failed).

The elapsed time always ends after torch.cuda.synchronize(), so every counted matmul has finished.
The CPU is kept at most QUEUE_GROUPS groups of work ahead of the GPU (CUDA events), so the GPU never
idles for want of work, the run ends close to SECONDS, and a limiter that delays launches is seen.
Any failure prints error=... and exits 1.

Next to rate=, every mode prints the GPU time of the steps that rate= counts (a step: one matmul,
or one replay in graph mode), timed with CUDA events (StepTimer): gpu_busy_s= their sum,
gpu_share= gpu_busy_s / elapsed_s, and step_ms_median= the median step in ms. Alone on the GPU,
gpu_share is the share of time the workload's kernels held it, which is what a compute limit
controls; in split mode a step's time also includes the other process's work that ran during it.
"""
import collections
import os
import statistics
import sys
import time
import traceback

N = int(os.environ.get("COMPUTE_MATMUL_N", "8192"))
WARMUP_S = float(os.environ.get("COMPUTE_WARMUP", "1"))
GRAPH_MATMULS = 10
EAGER_GROUP = 10  # matmuls between two queue checks: ~10-20 ms on an H100/H200 at N = 8192
QUEUE_GROUPS = 4
GO_TIMEOUT_S = 180  # how long a split process waits for GO before it gives up


def setup():
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("torch.cuda.is_available() is False")
    torch.manual_seed(0)
    a = torch.randn(N, N, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(N, N, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(N, N, device="cuda", dtype=torch.bfloat16)
    print(f"device={torch.cuda.get_device_name(0)}")
    print(f"torch={torch.__version__}")
    print(f"matmul_n={N}")
    return torch, a, b, c


def run_until(torch, step, per_group, until, finished=None):
    """Runs step() in groups of per_group until until() is true; returns the number of steps queued.

    The caller synchronises afterwards. At most QUEUE_GROUPS groups are outstanding on the GPU.
    finished(n), if given, is called whenever the first n steps are known to have finished."""
    pending = collections.deque()
    steps = 0
    while not until():
        for _ in range(per_group):
            step()
        steps += per_group
        event = torch.cuda.Event()
        event.record()
        pending.append((event, steps))
        if len(pending) > QUEUE_GROUPS:
            event, done = pending.popleft()
            event.synchronize()
            if finished:
                finished(done)
    return steps


class StepTimer:
    """The GPU time of each step, from CUDA events read once they have completed.

    Events start and end on the current stream bracket the step. start alone is not enough: a
    compute limiter makes the launch wait on the CPU, inside the call, after start was queued, so
    start passes as soon as the earlier work ends and would count the wait. A third event,
    launched, is recorded on an idle side stream when the call returns, so it passes when the
    step's work reached the GPU. The work began at the later of start and launched, and its time
    is the shorter of start-to-end and launched-to-end. Read events are reused."""

    def __init__(self, torch):
        self.torch = torch
        self.side = torch.cuda.Stream()
        self.queued = collections.deque()  # (start, launched, end) of the steps not read yet
        self.free = []
        self.ms = []  # the GPU time of every step read, in ms

    def timed(self, step):
        def run():
            events = self.free.pop() if self.free else self.new_events()
            start, launched, end = events
            start.record()
            step()
            launched.record(self.side)
            end.record()
            self.queued.append(events)

        return run

    def new_events(self):
        return [self.torch.cuda.Event(enable_timing=True) for _ in range(3)]

    def read(self, steps):
        """Reads the times of the first `steps` steps, which have finished; a side-stream event
        not yet passed (it is not ordered with the current stream) waits for a later read."""
        while len(self.ms) < steps and self.queued[0][1].query():
            events = self.queued.popleft()
            start, launched, end = events
            self.ms.append(min(start.elapsed_time(end), launched.elapsed_time(end)))
            self.free.append(events)


def measure(torch, step, per_group, end_time):
    """Throughput of step() from now (after draining the queue) until end_time:
    (steps, elapsed_s, the GPU time of each step in ms)."""
    timer = StepTimer(torch)
    torch.cuda.synchronize()
    start = time.time()
    steps = run_until(torch, timer.timed(step), per_group, lambda: time.time() >= end_time, timer.read)
    torch.cuda.synchronize()
    elapsed = time.time() - start
    timer.read(steps)
    return steps, elapsed, timer.ms


def warm_up(torch, step, per_group):
    """cuBLAS handles and kernel selection, GPU clocks up, and a limiter past its first period."""
    end = time.time() + WARMUP_S
    run_until(torch, step, per_group, lambda: time.time() >= end)
    torch.cuda.synchronize()


def report(steps, elapsed, step_ms, matmuls_per_step, unit):
    rate = steps / elapsed
    busy = sum(step_ms) / 1000
    print(f"steps={steps}")
    print(f"elapsed_s={elapsed:.4f}")
    print(f"unit={unit}")
    print(f"tflops={2.0 * N**3 * matmuls_per_step * rate / 1e12:.1f}")
    print(f"rate={rate:.6f}")
    print(f"gpu_busy_s={busy:.4f}")
    print(f"gpu_share={busy / elapsed:.4f}")
    print(f"step_ms_median={statistics.median(step_ms) if step_ms else 0:.4f}")


def eager(seconds):
    torch, a, b, c = setup()

    def step():
        torch.mm(a, b, out=c)

    warm_up(torch, step, EAGER_GROUP)
    steps, elapsed, step_ms = measure(torch, step, EAGER_GROUP, time.time() + seconds)
    report(steps, elapsed, step_ms, 1, "matmuls/s")


def graph(seconds):
    torch, a, b, c = setup()
    # Eager matmuls on a side stream first (cuBLAS handle and workspace), as PyTorch advises before
    # a capture, then one capture of GRAPH_MATMULS matmuls.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            torch.mm(a, b, out=c)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    captured = torch.cuda.CUDAGraph()
    with torch.cuda.graph(captured):
        for _ in range(GRAPH_MATMULS):
            torch.mm(a, b, out=c)
    torch.cuda.synchronize()
    print(f"graph_matmuls={GRAPH_MATMULS}")

    warm_up(torch, captured.replay, 1)
    steps, elapsed, step_ms = measure(torch, captured.replay, 1, time.time() + seconds)
    report(steps, elapsed, step_ms, GRAPH_MATMULS, "replays/s")


def read_go(path):
    """(start, end) from the GO file, None while it is absent; raises if the driver aborted."""
    try:
        with open(path) as f:
            text = f.read().split()
    except FileNotFoundError:
        return None
    if text[:1] == ["abort"]:
        raise RuntimeError("aborted by ci/gpu-compute: the other process of the pair failed")
    if len(text) != 2:
        return None  # written atomically (rename), so this is not expected; look again
    return float(text[0]), float(text[1])


def split(ready_path, go_path):
    torch, a, b, c = setup()

    def step():
        torch.mm(a, b, out=c)

    warm_up(torch, step, EAGER_GROUP)
    with open(ready_path, "w") as f:
        f.write(f"{os.getpid()}\n")
    # Keep the GPU busy while waiting, so that both processes already compete when the window opens.
    window = []
    give_up = time.time() + GO_TIMEOUT_S

    def started():
        if not window:
            go = read_go(go_path)
            if go is None:
                if time.time() > give_up:
                    raise RuntimeError(f"no {go_path} within {GO_TIMEOUT_S} s")
                return False
            window.extend(go)
        return time.time() >= window[0]

    run_until(torch, step, EAGER_GROUP, started)
    start, end = window
    print(f"late_s={time.time() - start:.4f}")  # how long after START this process began measuring
    steps, elapsed, step_ms = measure(torch, step, EAGER_GROUP, end)
    report(steps, elapsed, step_ms, 1, "matmuls/s")


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    try:
        if mode == "eager" and len(sys.argv) == 3:
            eager(float(sys.argv[2]))
        elif mode == "graph" and len(sys.argv) == 3:
            graph(float(sys.argv[2]))
        elif mode == "split" and len(sys.argv) == 4:
            split(sys.argv[2], sys.argv[3])
        else:
            print("error=usage: compute_share.py eager|graph SECONDS | split READY GO")
            return 1
    except Exception as e:  # noqa: BLE001 - any failure is reported as one error line
        traceback.print_exc()
        print(f"error={type(e).__name__}: {' '.join(str(e).split())[:300]}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
