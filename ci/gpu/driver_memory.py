"""The driver's own memory charged to the budget, on a real GPU (docs/driver-memory.md).

    python3 ci/gpu/driver_memory.py LIBVGPU_SO VGPU_SMI [CHURN_SECONDS]

1. One PyTorch process allocates 1 GiB, then runs a bf16 matmul, a half-precision convolution and
   scaled-dot-product attention (kernels the driver loads lazily). Two seconds later its ledger bytes
   (vgpu-smi) are compared with NVML's per-process figure (nvidia-smi --query-compute-apps).
2. Four PyTorch workers allocate and free random sizes under one 8g budget; one is SIGKILLed and
   replaced every 2 s. Every 0.25 s the card's memory for the container (NVML's figures of its live
   workers, summed) is sampled against the budget.
3. `vgpu-smi serve` watches the region; all workers are killed; the region must read zero within 2 s.

Prints key=value lines.
"""
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

MIB = 1 << 20

KERNELS = """
import sys, torch
x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
print(f"torch_reserved={torch.cuda.memory_reserved()}", flush=True)
print("allocated", flush=True)
sys.stdin.readline()
a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
(a @ a).sum().item()
conv = torch.nn.Conv2d(64, 64, 3, padding=1).cuda().half()
conv(torch.randn(8, 64, 64, 64, device="cuda", dtype=torch.half)).sum().item()
q = torch.randn(8, 16, 1024, 64, device="cuda", dtype=torch.half)
torch.nn.functional.scaled_dot_product_attention(q, q, q).sum().item()
torch.cuda.synchronize()
print(f"torch_reserved={torch.cuda.memory_reserved()}", flush=True)
print("ran", flush=True)
sys.stdin.readline()
"""

CHURN = """
import os, random, time, torch
random.seed(os.getpid())
held = []
while True:
    if held and (random.random() < 0.4 or len(held) >= 6):
        held.pop(random.randrange(len(held)))
    else:
        try:
            held.append(torch.empty(random.randint(64, 1024) << 20, dtype=torch.uint8, device="cuda"))
        except torch.OutOfMemoryError:
            torch.cuda.empty_cache()
    if random.random() < 0.2:
        a = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
        (a @ a).sum().item()
    time.sleep(0.02)
"""


def nvml_by_pid():
    """NVML's per-process figures in bytes, by pid (nvidia-smi, outside libvgpu)."""
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, timeout=30, env=clean_env()).stdout
    seen = {}
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
            seen[int(parts[0])] = int(parts[1]) * MIB
    return seen


def clean_env():
    return {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD",) and not k.startswith("CUDA_DEVICE_")}


def region(smi, cache):
    out = subprocess.run([smi, "--json", cache], capture_output=True, text=True, timeout=30, env=clean_env())
    doc = json.loads(out.stdout)["containers"][0]["region"]
    used = doc["devices"][0]["used"] if doc and doc["devices"] else None
    per_pid = {p["pid"]: p["bytes"] for p in (doc or {}).get("processes", []) if p.get("alive")}
    return used, per_pid


def under(lib, cache, budget):
    return dict(os.environ, LD_PRELOAD=lib, CUDA_DEVICE_MEMORY_LIMIT_0=budget, CUDA_DEVICE_MEMORY_SHARED_CACHE=cache)


def one_process(lib, smi):
    cache = os.path.join(tempfile.mkdtemp(), "cudevshr.cache")
    worker = subprocess.Popen([sys.executable, "-c", KERNELS], env=under(lib, cache, "16g"), text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    for stage in ("allocated", "ran"):
        while (line := worker.stdout.readline().strip()) != stage:
            if not line:
                break
            print(f"{stage}_{line}")
        time.sleep(2.5)
        nvml = nvml_by_pid().get(worker.pid)
        _, per_pid = region(smi, cache)
        ledger = per_pid.get(worker.pid)
        print(f"{stage}_nvml_mib={nvml // MIB if nvml else 'none'}")
        print(f"{stage}_ledger_mib={ledger // MIB if ledger else 'none'}")
        if nvml and ledger:
            print(f"{stage}_ledger_over_nvml_permille={ledger * 1000 // nvml}")
        worker.stdin.write("\n")
        worker.stdin.flush()
    worker.wait(timeout=60)


def churn(lib, smi, seconds):
    cache = os.path.join(tempfile.mkdtemp(), "cudevshr.cache")
    budget = 8 << 30
    env = under(lib, cache, "8g")
    start = lambda: subprocess.Popen([sys.executable, "-c", CHURN], env=env)
    workers = [start() for _ in range(4)]
    serve = subprocess.Popen([smi, "serve", "--listen", "127.0.0.1:0", cache], env=clean_env(),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    peak_card, peak_ledger, samples, kills = 0, 0, 0, 0
    begin = time.monotonic()
    next_kill = begin + 2
    while time.monotonic() - begin < seconds:
        live = {w.pid for w in workers}
        nvml = nvml_by_pid()
        card = sum(b for pid, b in nvml.items() if pid in live)
        used, _ = region(smi, cache)
        peak_card = max(peak_card, card)
        peak_ledger = max(peak_ledger, used or 0)
        samples += 1
        if time.monotonic() >= next_kill:
            victim = random.randrange(len(workers))
            workers[victim].send_signal(signal.SIGKILL)
            workers[victim].wait()
            workers[victim] = start()
            kills += 1
            next_kill += 2
        time.sleep(0.25)
    print(f"churn_samples={samples}")
    print(f"churn_kills={kills}")
    print(f"churn_peak_card_mib={peak_card // MIB}")
    print(f"churn_peak_ledger_mib={peak_ledger // MIB}")
    print(f"churn_peak_card_over_budget_permille={peak_card * 1000 // budget}")
    for w in workers:
        w.send_signal(signal.SIGKILL)
    for w in workers:
        w.wait()
    killed = time.monotonic()
    used = None
    while time.monotonic() - killed < 10:
        used, _ = region(smi, cache)
        if used == 0:
            break
        time.sleep(0.05)
    print(f"after_last_kill_used={used}")
    print(f"after_last_kill_zero_ms={(time.monotonic() - killed) * 1000:.0f}")
    serve.terminate()
    serve.wait(timeout=10)


def main():
    lib, smi = sys.argv[1], sys.argv[2]
    seconds = float(sys.argv[3]) if len(sys.argv) > 3 else 60
    one_process(lib, smi)
    churn(lib, smi, seconds)


if __name__ == "__main__":
    main()
