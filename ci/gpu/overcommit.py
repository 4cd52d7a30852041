"""Memory overcommit on a real GPU (docs/overcommit.md): the pieces ci/gpu-overcommit runs.

    python3 ci/gpu/overcommit.py bandwidth GIB SECONDS [managed]
        allocate GIB 1-GiB CuPy arrays (cudaMalloc through CuPy's pool, or cudaMallocManaged with
        `managed`), touch them all once, then run passes (x += 1 over every array) for SECONDS:
        kind= (the first array's cudaPointerGetAttributes type: 2 device, 3 managed), gbps= (the
        median pass, read plus write), passes=
    python3 ci/gpu/overcommit.py worker GIB [managed]
        like bandwidth, then waits on stdin: `run SECONDS` runs passes for SECONDS and prints one
        `pass=T,GBPS` line per pass (T: seconds since the command arrived, at the pass's end) and
        `done=1`; end of input exits
    python3 ci/gpu/overcommit.py notebooks GIB TURN TURNS NATIVE_GBPS LABEL [managed]
        two workers (their environments as this process's, each with CUDA_DEVICE_MEMORY_SHARED_CACHE
        set to LABEL-a/LABEL-b under a fresh directory when LD_PRELOAD is set) take turns: each
        runs TURN seconds while the other idles, TURNS turns in all. Per turn k: turn_k_first_s
        (the first pass's end), turn_k_reach_s (the end of the first pass at >= 0.9 NATIVE_GBPS,
        empty if none), turn_k_steady_gbps (the median of the passes after that one)
    python3 ci/gpu/overcommit.py host-touch GIB
        fills GIB GiB of host memory twice, freeing it in between: first_gbps=, second_gbps= (a
        freshly booted virtual machine backs its memory on first touch, far slower than later)
    python3 ci/gpu/overcommit.py hold GIB
        PyTorch, device memory: hold GIB GiB, print ready=1, wait for end of input
    python3 ci/gpu/overcommit.py train LAYERS WIDTH STEPS [SMI]
        PyTorch: a LAYERS x Linear(WIDTH, WIDTH) model, Adam, batch 64; one warm-up step then STEPS
        timed ones: params_bytes=, total_gib= (mem_get_info total), step_s= (median), oom=1 if it
        ran out of memory. With SMI (vgpu-smi), its JSON of this process's region afterwards:
        smi_spillable=, smi_used=, smi_overcommit=
Every line is key=value; nothing here decides PASS or FAIL (ci/gpu-overcommit does).
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

GIB = 1 << 30


def arrays(gib, managed):
    import cupy

    if managed:
        cupy.cuda.set_allocator(cupy.cuda.MemoryPool(cupy.cuda.malloc_managed).malloc)
    chunks = [cupy.zeros(GIB // 4, dtype=cupy.float32) for _ in range(gib)]
    cupy.cuda.Device().synchronize()
    kind = cupy.cuda.runtime.pointerGetAttributes(chunks[0].data.ptr).type
    print(f"kind={kind}", flush=True)
    return chunks


def one_pass(chunks):
    import cupy

    start = time.monotonic()
    for x in chunks:
        cupy.add(x, 1, out=x)
    cupy.cuda.Device().synchronize()
    return time.monotonic() - start


def passes(chunks, seconds, report=None):
    rates = []
    begin = time.monotonic()
    while time.monotonic() - begin < seconds:
        took = one_pass(chunks)
        rate = 2 * len(chunks) * GIB / took / 1e9
        rates.append(rate)
        if report:
            report(time.monotonic() - begin, rate)
    return rates


def bandwidth(gib, seconds, managed):
    chunks = arrays(gib, managed)
    one_pass(chunks)
    rates = passes(chunks, seconds)
    print(f"gbps={statistics.median(rates):.1f}\npasses={len(rates)}", flush=True)


def worker(gib, managed):
    import cupy

    chunks = arrays(gib, managed)
    one_pass(chunks)
    print("ready=1", flush=True)
    for line in sys.stdin:
        words = line.split()
        if words[:1] == ["run"]:
            # The first pass after a switch, array by array: where its time goes (a migration
            # queued ahead of the first kernel, or every array slow alike).
            begin = time.monotonic()
            each = []
            for x in chunks:
                start = time.monotonic()
                cupy.add(x, 1, out=x)
                cupy.cuda.Device().synchronize()
                each.append(time.monotonic() - start)
            took = time.monotonic() - begin
            print(f"first_arrays_s={','.join(f'{t:.3f}' for t in each)}", flush=True)
            print(f"pass={took:.3f},{2 * len(chunks) * GIB / took / 1e9:.1f}", flush=True)
            passes(
                chunks,
                max(0.0, float(words[1]) - took),
                lambda t, r: print(f"pass={t + took:.3f},{r:.1f}", flush=True),
            )
            print("done=1", flush=True)


def notebooks(gib, turn, turns, native, label, managed):
    scratch = tempfile.mkdtemp(prefix="vgpu-notebooks-")
    procs = []
    for name in "ab":
        env = dict(os.environ)
        if env.get("LD_PRELOAD"):
            env["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = os.path.join(scratch, f"{label}-{name}.cache")
        args = [sys.executable, __file__, "worker", str(gib)] + (["managed"] if managed else [])
        err = open(os.path.join(os.environ.get("OVERCOMMIT_LOGS", scratch), f"{label}-{name}.err"), "w")
        proc = subprocess.Popen(args, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True)
        procs.append(proc)
        # One at a time: the second starts once the first holds its memory on the card.
        ready = read_until(proc, "ready", 120)
        print(f"{name}_ready={int(ready is not None)}", flush=True)
        if ready is None:
            return
    for k in range(turns):
        proc = procs[k % 2]
        proc.stdin.write(f"run {turn}\n")
        proc.stdin.flush()
        got = []
        while True:
            line = read_line(proc, turn + 120)
            if line is None or line.startswith("done="):
                break
            if line.startswith("first_arrays_s="):
                print(f"turn_{k}_{line}", flush=True)
            if line.startswith("pass="):
                t, rate = (float(v) for v in line[5:].split(","))
                got.append((t, rate))
        first = got[0][0] if got else None
        reach = next((i for i, (_, rate) in enumerate(got) if rate >= 0.9 * native), None)
        steady = [rate for _, rate in got[reach + 1 :]] if reach is not None else []
        print(f"turn_{k}_passes={len(got)}", flush=True)
        print(f"turn_{k}_first_s={'' if first is None else f'{first:.2f}'}", flush=True)
        print(f"turn_{k}_reach_s={'' if reach is None else f'{got[reach][0]:.2f}'}", flush=True)
        print(f"turn_{k}_steady_gbps={f'{statistics.median(steady):.1f}' if steady else ''}", flush=True)
    for proc in procs:
        proc.stdin.close()
    for proc in procs:
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()


def read_line(proc, timeout):
    """One stdout line of `proc`, or None at its end or after `timeout` seconds. A thread per
    process reads its lines into a queue (select on a buffered pipe would miss buffered lines)."""
    import queue
    import threading

    if not hasattr(proc, "lines"):
        proc.lines = queue.Queue()

        def pump():
            for line in proc.stdout:
                proc.lines.put(line.strip())
            proc.lines.put(None)

        threading.Thread(target=pump, daemon=True).start()
    try:
        return proc.lines.get(timeout=timeout)
    except queue.Empty:
        return None


def read_until(proc, key, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = read_line(proc, max(0.1, deadline - time.monotonic()))
        if line is None:
            return None
        if line.startswith(key + "="):
            return line.split("=", 1)[1]
    return None


def host_touch(gib):
    import mmap

    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | mmap.MAP_POPULATE
    for name in ("first", "second"):
        start = time.monotonic()
        # Populated by the kernel at the mapping (zeroed pages, no fault per page): what the
        # driver's own allocations of host pages cost, as near as a process can ask for it.
        blocks = [mmap.mmap(-1, GIB, flags=flags) for _ in range(gib)]
        took = time.monotonic() - start
        for block in blocks:
            block.close()
        print(f"{name}_gbps={gib * GIB / took / 1e9:.2f}", flush=True)


def hold(gib):
    import torch

    x = torch.empty(gib * GIB, dtype=torch.uint8, device="cuda")
    x.fill_(1)
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    print(f"ready=1\nfree_after={free}\ntotal={total}", flush=True)
    sys.stdin.read()
    del x


def train(layers, width, steps, smi):
    import torch

    _, total = torch.cuda.mem_get_info()
    print(f"total_gib={total / GIB:.1f}", flush=True)
    try:
        # Made on the device: initialising 6 GB of parameters on the CPU would take longer than a step.
        model = torch.nn.Sequential(*[torch.nn.Linear(width, width, device="cuda") for _ in range(layers)])
        params = sum(p.numel() * p.element_size() for p in model.parameters())
        print(f"params_bytes={params}", flush=True)
        opt = torch.optim.Adam(model.parameters(), lr=1e-5)
        batch = torch.randn(64, width, device="cuda")
        times = []
        for i in range(steps + 1):
            start = time.monotonic()
            opt.zero_grad(set_to_none=False)
            model(batch).square().mean().backward()
            opt.step()
            torch.cuda.synchronize()
            took = time.monotonic() - start
            print(f"step_{i}_s={took:.2f}", flush=True)
            if i > 0:
                times.append(took)
        print(f"step_s={statistics.median(times):.2f}\noom=0", flush=True)
    except torch.OutOfMemoryError as error:
        print(f"oom=1\nerror={str(error).splitlines()[0]}", flush=True)
        return
    if smi:
        env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
        region = os.environ.get("CUDA_DEVICE_MEMORY_SHARED_CACHE", "/tmp/cudevshr.cache")
        out = subprocess.run([smi, "--json", region], env=env, capture_output=True, text=True, timeout=30)
        try:
            device = json.loads(out.stdout)["containers"][0]["region"]["devices"][0]
            print(f"smi_spillable={device['spillable']}\nsmi_used={device['used']}", flush=True)
            print(f"smi_overcommit={int(device['overcommit'])}", flush=True)
        except (ValueError, KeyError, IndexError, TypeError) as error:
            print(f"smi_error={error}", flush=True)
        table = subprocess.run([smi, region], env=env, capture_output=True, text=True, timeout=30).stdout
        line = next((l for l in table.splitlines() if l.startswith("overcommit 0:")), "")
        resident = line.rsplit("on the card now (NVML): ", 1)[-1].split(";")[0] if line else ""
        print(f"smi_resident={resident}", flush=True)


def main():
    cmd, args = sys.argv[1], sys.argv[2:]
    managed = "managed" in args
    if cmd == "bandwidth":
        bandwidth(int(args[0]), float(args[1]), managed)
    elif cmd == "worker":
        worker(int(args[0]), managed)
    elif cmd == "notebooks":
        notebooks(int(args[0]), float(args[1]), int(args[2]), float(args[3]), args[4], managed)
    elif cmd == "host-touch":
        host_touch(int(args[0]))
    elif cmd == "hold":
        hold(int(args[0]))
    elif cmd == "train":
        train(int(args[0]), int(args[1]), int(args[2]), args[3] if len(args) > 3 else None)
    else:
        sys.exit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
