"""NCCL across two GPUs under per-device budgets, then SIGKILL of one rank (run by ci/gpu-multi).

    python3 ci/gpu/multi_nccl.py LIBVGPU_SO VGPU_SMI REGION

Starts two rank processes (torch.distributed, backend nccl, rank r on CUDA device r) with
LD_PRELOAD=LIBVGPU_SO, CUDA_VISIBLE_DEVICES=0,1, CUDA_DEVICE_MEMORY_LIMIT_0=4g, _1=6g and the one region
file REGION (one container). Each rank holds a 256 MiB float32 tensor, reads its free memory
(rankR_free_before), builds the communicator, all-reduces the tensor 20 times (sum), then copies
64 MiB from GPU 0 to GPU 1 with NCCL send/recv (the peer copy), synchronises, and reports:
rankR_total, rankR_free_before, rankR_free_after, rankR_reserved_before/after
(torch.cuda.memory_reserved: what PyTorch's own allocator holds), rankR_result_ok, rankR_peer_ok
(the 64 MiB arrived intact), rankR_done=1. It then waits for stdin to close and leaves with os._exit
(no communicator teardown, which can wait on a dead peer).

While both ranks hold their memory this process (not under libvgpu) reads the region with
`VGPU_SMI --json REGION`: regionD_used, regionD_budget, regionD_buffers, regionD_contexts for region
device D (the CUDA ordinal), and procR_devD_bytes, what rank R's lease holds on device D. Then it
SIGKILLs rank 1 and reads the region every 50 ms until every device's usage equals what the survivor
holds there (what the killed rank held is given back): reclaim_ms (time from the kill to that read,
or none after 10 s) and after_regionD_used. Then it closes the survivor's stdin: survivor_exit.

Every wait is bounded: ranks that have not reported 120 s after the start are killed
(completed= says how many did). Prints key=value lines.
"""
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

ELEMENTS = 64 << 20  # 256 MiB of float32
PEER_ELEMENTS = 16 << 20  # 64 MiB of float32
ROUNDS = 20
LIMITS = ("4g", "6g")
START_TIMEOUT_S = 120
RECLAIM_TIMEOUT_S = 10

RANK = """
import datetime, os, sys, torch, torch.distributed as dist
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
elements, peer_elements, rounds = (int(a) for a in sys.argv[1:4])
device = torch.device("cuda", rank)
torch.cuda.set_device(device)
x = torch.full((elements,), float(rank + 1), dtype=torch.float32, device=device)
torch.cuda.synchronize()
free, total = torch.cuda.mem_get_info()
print(f"rank{rank}_total={total}\\nrank{rank}_free_before={free}", flush=True)
print(f"rank{rank}_reserved_before={torch.cuda.memory_reserved()}", flush=True)
dist.init_process_group("nccl", rank=rank, world_size=world, device_id=device,
                        timeout=datetime.timedelta(seconds=60))
for _ in range(rounds):
    dist.all_reduce(x, op=dist.ReduceOp.SUM)
torch.cuda.synchronize()
expected = world * (world + 1) // 2 * world ** (rounds - 1)
print(f"rank{rank}_result_ok={int(bool((x == expected).all().item()))}", flush=True)
# The peer copy: 64 MiB from GPU 0 to GPU 1 through NCCL's point-to-point path.
y = torch.arange(peer_elements, dtype=torch.float32, device=device) if rank == 0 else \\
    torch.zeros(peer_elements, dtype=torch.float32, device=device)
if rank == 0:
    dist.send(y, dst=1)
else:
    dist.recv(y, src=0)
torch.cuda.synchronize()
want = torch.arange(peer_elements, dtype=torch.float32, device=device)
print(f"rank{rank}_peer_ok={int(bool((y == want).all().item()))}", flush=True)
del want
dist.barrier()
torch.cuda.synchronize()
free, total = torch.cuda.mem_get_info()
print(f"rank{rank}_free_after={free}", flush=True)
print(f"rank{rank}_reserved_after={torch.cuda.memory_reserved()}", flush=True)
print(f"rank{rank}_pid={os.getpid()}", flush=True)
print(f"rank{rank}_done=1", flush=True)
sys.stdin.read()
os._exit(0)
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_env(lib, rank, port, region):
    env = dict(os.environ)
    env.update(
        LD_PRELOAD=lib,
        CUDA_DEVICE_ORDER="PCI_BUS_ID",
        CUDA_VISIBLE_DEVICES="0,1",
        CUDA_DEVICE_MEMORY_LIMIT_0=LIMITS[0],
        CUDA_DEVICE_MEMORY_LIMIT_1=LIMITS[1],
        CUDA_DEVICE_MEMORY_SHARED_CACHE=region,
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE="2",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        # NVLink multicast stays off on shared machines (the device machine's rule).
        NCCL_NVLS_ENABLE="0",
        TORCH_SYMM_MEM_DISABLE_MULTICAST="1",
        NVSHMEM_DISABLE_NVLS="1",
    )
    return env


def collect(child, rank, lines):
    for line in child.stdout:
        lines.append(line.strip())
        if line.strip() == f"rank{rank}_done=1":
            return


def region(smi, path):
    """vgpu-smi's JSON view of the region: (devices by index, processes by pid), or None."""
    try:
        out = subprocess.run([smi, "--json", path], capture_output=True, text=True, timeout=10).stdout
        doc = json.loads(out)
        reg = doc["containers"][0]["region"]
    except (OSError, subprocess.SubprocessError, ValueError, KeyError, IndexError, TypeError):
        return None
    devices = {d["index"]: d for d in reg.get("devices", [])}
    processes = {}
    for p in reg.get("processes", []):
        if p.get("alive"):
            per = processes.setdefault(p["pid"], {})
            for d in p.get("devices", []):
                per[d["index"]] = per.get(d["index"], 0) + (d.get("bytes") or 0)
    return devices, processes


def main():
    lib, smi, path = sys.argv[1:4]
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    port = free_port()
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", RANK, str(ELEMENTS), str(PEER_ELEMENTS), str(ROUNDS)],
            env=rank_env(lib, r, port, path),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for r in range(2)
    ]
    outputs = [[], []]
    readers = [threading.Thread(target=collect, args=(c, r, outputs[r]), daemon=True) for r, c in enumerate(ranks)]
    for reader in readers:
        reader.start()
    deadline = time.monotonic() + START_TIMEOUT_S
    for reader in readers:
        reader.join(timeout=max(0.0, deadline - time.monotonic()))
    values = {}
    for lines in outputs:
        for line in list(lines):
            print(line)
            if "=" in line:
                key, value = line.split("=", 1)
                values[key] = value
    completed = sum(values.get(f"rank{r}_done") == "1" for r in range(2))
    print(f"completed={completed}", flush=True)

    seen = region(smi, path) if completed == 2 else None
    if seen:
        devices, processes = seen
        for index, d in sorted(devices.items()):
            for key in ("used", "budget", "buffers", "contexts"):
                print(f"region{index}_{key}={d.get(key)}")
        for r in range(2):
            pid = int(values.get(f"rank{r}_pid", ranks[r].pid))
            for index in sorted(devices):
                print(f"proc{r}_dev{index}_bytes={processes.get(pid, {}).get(index, 0)}")
        # What the region should say once rank 1's lease is gone: the survivor's own bytes, as the
        # same read shows them (the survivor's charge may move meanwhile: libvgpu charges the
        # driver's own memory as it grows).
        survivor_pid = int(values.get("rank0_pid", ranks[0].pid))
        survivor = processes.get(survivor_pid, {})
        ranks[1].send_signal(signal.SIGKILL)
        killed = time.monotonic()
        reclaim = None
        last = None
        while time.monotonic() - killed < RECLAIM_TIMEOUT_S:
            now = region(smi, path)
            if now:
                last = now[0]
                survivor = now[1].get(survivor_pid, {})
                live = [pid for pid in now[1] if pid != survivor_pid]
                if not live and all((d.get("used") or 0) == survivor.get(i, 0) for i, d in last.items()):
                    reclaim = time.monotonic() - killed
                    break
            time.sleep(0.05)
        print(f"reclaim_ms={round(reclaim * 1000) if reclaim is not None else 'none'}")
        for index, d in sorted((last or {}).items()):
            print(f"after_region{index}_used={d.get('used')}")
            print(f"survivor_dev{index}_bytes={survivor.get(index, 0)}")
    for child in ranks:
        try:
            child.stdin.close()
        except OSError:
            pass
    statuses = []
    for child in ranks:
        try:
            statuses.append(child.wait(timeout=20))
        except subprocess.TimeoutExpired:
            child.kill()
            statuses.append("timeout")
    print(f"survivor_exit={statuses[0]}")
    print(f"killed_exit={statuses[1]}")


if __name__ == "__main__":
    main()
