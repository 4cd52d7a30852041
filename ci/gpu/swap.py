"""Swapping whole idle processes on a real GPU (docs/overcommit.md, issue 37): the pieces
ci/gpu-swap runs. PyTorch, or CuPy or JAX for the workers; every line printed is key=value.

    python3 ci/gpu/swap.py link GIB
        the host link with a plain pinned copy of GIB GiB (torch, non_blocking on two streams):
        d2h_gbps=, h2d_gbps=, both_gbps= (one each way at once), pin_s= (pinning GIB GiB)
    python3 ci/gpu/swap.py alone GIB SECONDS
        GIB tensors of 1 GiB, passes of t *= 1.0001 over all of them for SECONDS: gbps= (the
        median pass, read plus write). The tensors are SWAP_FRAMEWORK's (below): torch by default
    python3 ci/gpu/swap.py worker GIB
        like alone, then ready=1 and waits on stdin: `run SECONDS` runs passes for SECONDS, printing
        `pass=T,GBPS` per pass (T: seconds since the command came, at the pass's end), then done=1
    python3 ci/gpu/swap.py notebooks N GIB TURN TURNS NATIVE_GBPS ROOT
        N workers, each a container of its own (CUDA_DEVICE_MEMORY_SHARED_CACHE under
        ROOT/pod-X_main/ when LD_PRELOAD is set), each started 2 s after the previous one holds its
        memory, as a user starts them (issue 49): nothing waits for pinning. With SWAP_WAIT_PINNED=1
        (issue 37's runs) it then waits until each swap record shows its memory pinned (pinned_X_s=,
        at most 120 s). Then round robin, TURN seconds each, TURNS turns. Per turn k: turn_k_first_s,
        turn_k_reach_s (the end of the first pass at >= 0.9 NATIVE_GBPS), turn_k_steady_gbps
        (median after it), turn_k_passes
    python3 ci/gpu/swap.py single GIB ROOT
        (under LD_PRELOAD and an arbiter over ROOT) one worker of GIB GiB in ROOT/pod-one_main/,
        alone on the card (with SWAP_WAIT_PINNED=1, once all is pinned), asks it to swap out through its swap table (as the
        arbiter would), then runs a pass, which brings it back: out_s=, in_s= (the worker's own
        log lines give the rates), pinned_gib=
    python3 ci/gpu/swap.py server
        an inference server: a Llama-7B-shaped transformers model from its config (random fp16
        weights, nothing downloaded), weights_gib= and ready=1, then per `ask` line on stdin one
        request of 256 prompt tokens answered with its first token: ttft=SECONDS
    python3 ci/gpu/swap.py trainer GIB
        a training loop (an MLP with AdamW, and a pass over GIB GiB of held tensors each step),
        ready=1, then steps=N,T every second (T: seconds since ready)
    python3 ci/gpu/swap.py inference ROOT REQUESTS EVERY TRAIN_GIB
        the server in ROOT/pod-server_main/, REQUESTS//2 requests EVERY seconds apart alone
        (alone_k_ttft=), then the trainer beside it in ROOT/pod-trainer_main/ and (with
        SWAP_WAIT_PINNED=1, once both are pinned) REQUESTS requests EVERY seconds apart (busy_k_ttft=); the trainer's steps per
        second before the first request (train_alone_sps=) and while they came (train_busy_sps=)
Nothing here decides PASS or FAIL (ci/gpu-swap does).
"""
import mmap
import os
import statistics
import struct
import subprocess
import sys
import threading
import queue
import time

GIB = 1 << 30
# Where the swap table starts in a region file (vgpu_ledger::swap::TABLE_AT: past the ledger, on a
# 64 KiB boundary), and its size.
TABLE_AT = 2_162_688
TABLE_SIZE = 64 + 1024 * 16 * 128


# The framework whose memory the workers hold (SWAP_FRAMEWORK): torch (its allocator as
# PYTORCH_CUDA_ALLOC_CONF sets it), cupy (its default pool), cupy-async (MemoryAsyncPool: stream-
# ordered memory from the default pool) or jax (XLA's default preallocation).
FRAMEWORK = os.environ.get("SWAP_FRAMEWORK", "torch")


def tensors(gib):
    # Tensor i holds i + 1 everywhere, so that a chunk that came back into the wrong place shows.
    if FRAMEWORK.startswith("cupy"):
        import cupy

        if FRAMEWORK == "cupy-async":
            cupy.cuda.set_allocator(cupy.cuda.MemoryAsyncPool().malloc)
        held = [cupy.full(GIB // 4, i + 1, dtype=cupy.float32) for i in range(gib)]
    elif FRAMEWORK == "jax":
        import jax.numpy as jnp

        held = [jnp.full((GIB // 4,), i + 1, dtype=jnp.float32) for i in range(gib)]
    else:
        import torch

        held = [torch.full((GIB // 4,), float(i + 1), dtype=torch.float32, device="cuda") for i in range(gib)]
    synchronize(held)
    return held


def synchronize(held):
    if FRAMEWORK.startswith("cupy"):
        import cupy

        cupy.cuda.Device().synchronize()
    elif FRAMEWORK == "jax":
        for t in held:
            t.block_until_ready()
    else:
        import torch

        torch.cuda.synchronize()


def intact(held):
    """Whether every tensor is still uniform and tensor i still holds (i + 1) times what tensor 0
    holds (every pass multiplies all alike)."""
    base = None
    for i, t in enumerate(held):
        low, high = float(t.min()), float(t.max())
        if low != high:
            return False
        base = base or high
        if abs(high / (i + 1) - base) > 1e-3 * base:
            return False
    return True


def one_pass(held):
    start = time.monotonic()
    if FRAMEWORK == "jax":
        # JAX arrays are immutable: each pass makes new ones in XLA's pool, the old ones go.
        held[:] = [t * 1.0001 for t in held]
    else:
        for t in held:
            t *= 1.0001
    synchronize(held)
    return time.monotonic() - start


def rate(held, took):
    return 2 * len(held) * GIB / took / 1e9


def alone(gib, seconds):
    held = tensors(gib)
    one_pass(held)
    rates = []
    begin = time.monotonic()
    while time.monotonic() - begin < seconds:
        rates.append(rate(held, one_pass(held)))
    print(f"gbps={statistics.median(rates):.1f}", flush=True)


def worker(gib):
    held = tensors(gib)
    one_pass(held)
    print("ready=1", flush=True)
    for line in sys.stdin:
        words = line.split()
        if words[:1] != ["run"]:
            continue
        seconds = float(words[1])
        begin = time.monotonic()
        while True:
            took = one_pass(held)
            now = time.monotonic() - begin
            print(f"pass={now:.3f},{rate(held, took):.1f}", flush=True)
            if now >= seconds:
                break
        print(f"intact={int(intact(held))}", flush=True)
        print("done=1", flush=True)


def link(gib):
    import torch

    start = time.monotonic()
    host = torch.empty(gib * GIB, dtype=torch.uint8, pin_memory=True)
    host2 = torch.empty(gib * GIB, dtype=torch.uint8, pin_memory=True)
    print(f"pin_s={time.monotonic() - start:.2f}", flush=True)
    dev = torch.empty(gib * GIB, dtype=torch.uint8, device="cuda")
    dev2 = torch.empty(gib * GIB, dtype=torch.uint8, device="cuda")
    dev.fill_(1)
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()

    def timed(f):
        torch.cuda.synchronize()
        start = time.monotonic()
        f()
        torch.cuda.synchronize()
        return time.monotonic() - start

    timed(lambda: host.copy_(dev, non_blocking=True))
    d2h = gib * GIB / timed(lambda: host.copy_(dev, non_blocking=True)) / 1e9
    h2d = gib * GIB / timed(lambda: dev.copy_(host, non_blocking=True)) / 1e9

    def both():
        with torch.cuda.stream(s1):
            host.copy_(dev, non_blocking=True)
        with torch.cuda.stream(s2):
            dev2.copy_(host2, non_blocking=True)

    both_gbps = 2 * gib * GIB / timed(both) / 1e9
    print(f"d2h_gbps={d2h:.1f}\nh2d_gbps={h2d:.1f}\nboth_gbps={both_gbps:.1f}", flush=True)


def record_of(region, pid):
    """This pid's swap record for region device index 0, as a dict, or None."""
    try:
        with open(region, "rb") as f:
            data = mmap.mmap(f.fileno(), TABLE_AT + TABLE_SIZE, access=mmap.ACCESS_READ)
    except (OSError, ValueError):
        return None
    names = ["state", "request", "handled", "active_ns", "resident", "swapped", "wanted",
             "swap_outs", "swap_ins", "wait_ns", "out_ns", "in_ns", "pinned"]
    for lease in range(1024):
        at = TABLE_AT + 64 + 128 * (16 * lease)
        state = struct.unpack_from("<Q", data, at)[0]
        if state >> 32 == pid:
            words = struct.unpack_from("<13Q", data, at)
            return dict(zip(names, words))
    return None


class Lines:
    """A process's stdout lines through a queue (a thread reads them)."""

    def __init__(self, proc):
        self.q = queue.Queue()
        threading.Thread(target=self.pump, args=(proc,), daemon=True).start()

    def pump(self, proc):
        for line in proc.stdout:
            self.q.put(line.strip())
        self.q.put(None)

    def get(self, timeout):
        try:
            return self.q.get(timeout=timeout)
        except queue.Empty:
            return None


def notebooks(n, gib, turn, turns, native, root):
    procs, lines, regions = [], [], []
    for i in range(n):
        name = "abcdefgh"[i]
        proc, proc_lines, region = container(root, name, ["worker", str(gib)], log=f"worker-{name}")
        procs.append(proc)
        lines.append(proc_lines)
        regions.append(region)
        start = time.monotonic()
        while True:
            line = lines[i].get(240)
            if line is None or line == "ready=1":
                break
        print(f"{name}_ready={int(line == 'ready=1')}", flush=True)
        print(f"{name}_start_s={time.monotonic() - start:.1f}", flush=True)
        if line != "ready=1":
            return
        time.sleep(2)
    if os.environ.get("LD_PRELOAD") and os.environ.get("SWAP_WAIT_PINNED") == "1":
        start = time.monotonic()
        for i, proc in enumerate(procs):  # all pinned, or as much as the host allows in 120 s
            name = "abcdefgh"[i]
            pinned = wait_pinned(regions[i], proc.pid, max(0, 120 - (time.monotonic() - start)))
            print(f"pinned_{name}_s={time.monotonic() - start:.1f}", flush=True)
            print(f"pinned_{name}_gib={pinned:.1f}", flush=True)
    for k in range(turns):
        i = k % n
        procs[i].stdin.write(f"run {turn}\n")
        procs[i].stdin.flush()
        got = []
        while True:
            line = lines[i].get(turn + 240)
            if line is None or line.startswith("done="):
                break
            if line.startswith("intact="):
                print(f"turn_{k}_intact={line[7:]}", flush=True)
            if line.startswith("pass="):
                t, r = (float(v) for v in line[5:].split(","))
                got.append((t, r))
        first = got[0][0] if got else None
        reach = next((j for j, (_, r) in enumerate(got) if r >= 0.9 * native), None)
        steady = [r for _, r in got[reach + 1:]] if reach is not None else []
        print(f"turn_{k}_passes={len(got)}", flush=True)
        print(f"turn_{k}_first_s={'' if first is None else f'{first:.2f}'}", flush=True)
        print(f"turn_{k}_reach_s={'' if reach is None else f'{got[reach][0]:.2f}'}", flush=True)
        print(f"turn_{k}_steady_gbps={f'{statistics.median(steady):.1f}' if steady else ''}", flush=True)
    for i, proc in enumerate(procs):
        rec = record_of(regions[i], proc.pid) or {}
        name = "abcdefgh"[i]
        print(f"{name}_swap_outs={rec.get('swap_outs', 0)}\n{name}_swap_ins={rec.get('swap_ins', 0)}", flush=True)
    for proc in procs:
        proc.stdin.close()
    for proc in procs:
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()


def server():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                         num_attention_heads=32, num_key_value_heads=32, vocab_size=32000,
                         max_position_embeddings=4096)
    torch.manual_seed(0)
    torch.set_default_dtype(torch.float16)
    with torch.device("cuda"):
        model = LlamaForCausalLM(config)
    model.eval()
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    print(f"weights_gib={weights / GIB:.2f}", flush=True)
    prompt = torch.randint(0, config.vocab_size, (1, 256)).tolist()

    def ask():
        start = time.monotonic()
        with torch.no_grad():
            ids = torch.tensor(prompt, device="cuda")
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=1,
                                 do_sample=False, pad_token_id=0)
            token = out[0, -1].item()
        return time.monotonic() - start, token

    ask()
    print("ready=1", flush=True)
    for line in sys.stdin:
        if line.strip() == "ask":
            took, token = ask()
            print(f"ttft={took:.3f}\ntoken={token}", flush=True)


def trainer(gib):
    import torch

    held = tensors(gib)
    model = torch.nn.Sequential(torch.nn.Linear(8192, 8192), torch.nn.ReLU(), torch.nn.Linear(8192, 8192)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(4096, 8192, device="cuda")

    def step():
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=False)
        for t in held:
            t.mul_(1.0001)

    step()
    torch.cuda.synchronize()
    print("ready=1", flush=True)
    begin = last = time.monotonic()
    steps = 0
    while True:
        step()
        torch.cuda.synchronize()
        steps += 1
        now = time.monotonic()
        if now - last >= 1:
            print(f"steps={steps},{now - begin:.3f}", flush=True)
            last = now


def container(root, name, args, log=None):
    """A process of ours in its own container ROOT/pod-NAME_main/ (under LD_PRELOAD; budget
    BUDGET_NAME, else CUDA_DEVICE_MEMORY_LIMIT_0; in the memory cgroup CGROUP_NAME if set), its
    stderr in SWAP_LOGS/LOG.err (LOG: NAME), its stdout lines read by a thread: (process, lines,
    region)."""
    env = dict(os.environ)
    folder = os.path.join(root, f"pod-{name}_main")
    os.makedirs(folder, exist_ok=True)
    region = os.path.join(folder, "cudevshr.cache")
    if env.get("LD_PRELOAD"):
        env["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = region
        env["CUDA_DEVICE_MEMORY_LIMIT_0"] = env.get(f"BUDGET_{name.upper()}", env.get("CUDA_DEVICE_MEMORY_LIMIT_0", ""))
        if env.get(f"PRIORITY_{name.upper()}"):
            env["CUDA_TASK_PRIORITY"] = env[f"PRIORITY_{name.upper()}"]
    err = open(os.path.join(os.environ.get("SWAP_LOGS", root), f"{log or name}.err"), "w")
    cgroup = env.get(f"CGROUP_{name.upper()}")

    def enter_cgroup():
        # The child moves itself into the memory cgroup CGROUP_NAME before it runs (writing 0
        # moves the writer).
        with open(os.path.join(cgroup, "cgroup.procs"), "w") as procs:
            procs.write("0")

    proc = subprocess.Popen([sys.executable, __file__, *args], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=err, text=True,
                            preexec_fn=enter_cgroup if cgroup else None)
    return proc, Lines(proc), region


def wait_for(lines, prefix, timeout):
    """The first line starting with prefix within timeout seconds, or None (the others are
    dropped)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        line = lines.get(max(0.1, end - time.monotonic()))
        if line is None:
            return None
        if line.startswith(prefix):
            return line
    return None


def ask_server(srv, lines, label, k):
    """One request to the server: prints LABEL_K_ttft= and LABEL_K_token= (its answer)."""
    srv.stdin.write("ask\n")
    srv.stdin.flush()
    line = wait_for(lines, "ttft=", 120)
    token = wait_for(lines, "token=", 5)
    print(f"{label}_{k}_ttft={line[5:] if line else ''}\n{label}_{k}_token={token[6:] if token else ''}",
          flush=True)


def wait_pinned(region, pid, seconds):
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        rec = record_of(region, pid)
        if rec and rec["pinned"] >= rec["resident"] + rec["swapped"] > 0:
            break
        time.sleep(0.5)
    return (record_of(region, pid) or {}).get("pinned", 0) / GIB


def inference(root, requests, every, train_gib):
    srv, srv_lines, srv_region = container(root, "server", ["server"])
    line = wait_for(srv_lines, "weights_gib=", 300)
    print(line or "weights_gib=", flush=True)
    ready = wait_for(srv_lines, "ready=1", 300) is not None
    print(f"server_ready={int(ready)}", flush=True)
    if not ready:
        srv.kill()
        return

    def ask(label, k):
        ask_server(srv, srv_lines, label, k)

    for k in range(max(1, requests // 2)):
        time.sleep(every)
        ask("alone", k)
    trn, trn_lines, trn_region = container(root, "trainer", ["trainer", str(train_gib)])
    ready = wait_for(trn_lines, "ready=1", 300) is not None
    print(f"trainer_ready={int(ready)}", flush=True)
    if not ready:
        srv.kill()
        trn.kill()
        return
    if os.environ.get("LD_PRELOAD") and os.environ.get("SWAP_WAIT_PINNED") == "1":
        print(f"pinned_trainer_gib={wait_pinned(trn_region, trn.pid, 150):.1f}", flush=True)
        print(f"pinned_server_gib={wait_pinned(srv_region, srv.pid, 60):.1f}", flush=True)
    steps = []
    threading.Thread(target=lambda: [steps.append(l) for l in iter(lambda: trn_lines.get(3600), None)],
                     daemon=True).start()

    def count():
        if not steps:
            return 0, time.monotonic()
        n, _ = steps[-1][6:].split(",")
        return int(n), time.monotonic()

    time.sleep(2)
    n0, t0 = count()
    time.sleep(10)
    n1, t1 = count()
    print(f"train_alone_sps={(n1 - n0) / (t1 - t0):.2f}", flush=True)
    for k in range(requests):
        time.sleep(every if k else 0)
        ask("busy", k)
    time.sleep(every)
    n2b, t2b = count()
    print(f"train_busy_sps={(n2b - n1) / (t2b - t1):.2f}", flush=True)
    for name, proc, region in (("server", srv, srv_region), ("trainer", trn, trn_region)):
        rec = record_of(region, proc.pid) or {}
        print(f"{name}_swap_outs={rec.get('swap_outs', 0)}\n{name}_swap_ins={rec.get('swap_ins', 0)}", flush=True)
    for proc in (srv, trn):
        proc.kill()
        proc.wait()


def priority(root, requests, every, train_gib):
    """Issue 46: a server answering a request every EVERY s beside a trainer holding TRAIN_GIB that
    touches all of it every step, under the arbiter's defaults, with no wait for pinning. Prints each
    request's time to first token and token (alone, then beside the trainer), and the trainer's
    steps/s alone (before the requests) and over the requests."""
    srv, srv_lines, _ = container(root, "server", ["server"])
    print(wait_for(srv_lines, "weights_gib=", 300) or "weights_gib=", flush=True)
    if wait_for(srv_lines, "ready=1", 300) is None:
        print("server_ready=0", flush=True)
        srv.kill()
        return
    print("server_ready=1", flush=True)

    def ask(label, k):
        ask_server(srv, srv_lines, label, k)

    for k in range(3):
        time.sleep(every)
        ask("alone", k)
    trn, trn_lines, _ = container(root, "trainer", ["trainer", str(train_gib)])
    ready = wait_for(trn_lines, "ready=1", 300) is not None
    print(f"trainer_ready={int(ready)}", flush=True)
    if not ready:
        srv.kill()
        trn.kill()
        return
    steps = []
    threading.Thread(target=lambda: [steps.append(l) for l in iter(lambda: trn_lines.get(3600), None)],
                     daemon=True).start()

    def count():
        n = int(steps[-1][6:].split(",")[0]) if steps else 0
        return n, time.monotonic()

    time.sleep(3)
    n0, t0 = count()
    time.sleep(10)
    n1, t1 = count()
    print(f"train_alone_sps={(n1 - n0) / (t1 - t0):.2f}", flush=True)
    for k in range(requests):
        time.sleep(every)
        ask("busy", k)
    time.sleep(every)
    n2, t2 = count()
    print(f"train_busy_sps={(n2 - n1) / (t2 - t1):.2f}", flush=True)
    for proc in (srv, trn):
        proc.kill()
        proc.wait()


def single(gib, root):
    proc, lines, region = container(root, "one", ["worker", str(gib)])
    if wait_for(lines, "ready=1", 240) is None:
        proc.kill()
        return
    if os.environ.get("SWAP_WAIT_PINNED") == "1":
        print(f"pinned_gib={wait_pinned(region, proc.pid, 120):.1f}", flush=True)
    with open(region, "r+b") as f:
        data = mmap.mmap(f.fileno(), TABLE_AT + TABLE_SIZE)
    first = TABLE_AT + 64
    lease = next(k for k in range(1024) if struct.unpack_from("<Q", data, first + 128 * 16 * k)[0] >> 32 == proc.pid)
    at = first + 128 * 16 * lease
    time.sleep(0.5)  # idle, as the arbiter would find it
    start = time.monotonic()
    struct.pack_into("<Q", data, at + 8, struct.unpack_from("<Q", data, at + 8)[0] + 1)
    while struct.unpack_from("<Q", data, at)[0] & 0xFF != 3 and time.monotonic() - start < 60:
        time.sleep(0.001)
    print(f"out_s={time.monotonic() - start:.3f}", flush=True)
    proc.stdin.write("run 1\n")
    proc.stdin.flush()
    line = wait_for(lines, "pass=", 120)
    print(f"in_s={line[5:].split(',')[0] if line else ''}", flush=True)
    proc.stdin.close()
    proc.kill()
    proc.wait()


def main():
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "link":
        link(int(args[0]))
    elif cmd == "alone":
        alone(int(args[0]), float(args[1]))
    elif cmd == "worker":
        worker(int(args[0]))
    elif cmd == "notebooks":
        notebooks(int(args[0]), int(args[1]), float(args[2]), int(args[3]), float(args[4]), args[5])
    elif cmd == "single":
        single(int(args[0]), args[1])
    elif cmd == "server":
        server()
    elif cmd == "trainer":
        trainer(int(args[0]))
    elif cmd == "inference":
        inference(args[0], int(args[1]), float(args[2]), int(args[3]))
    elif cmd == "priority":
        priority(args[0], int(args[1]), float(args[2]), int(args[3]))
    else:
        sys.exit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
