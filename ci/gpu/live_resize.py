"""A running PyTorch process's budget changed from outside with `vgpu-smi resize` on a real GPU.

    python3 ci/gpu/live_resize.py LIBVGPU_SO VGPU_SMI

The process holds 2 GiB under CUDA_DEVICE_MEMORY_LIMIT_0=4g. `vgpu-smi resize` shrinks the budget to
3g: torch.cuda.mem_get_info() must read 3 GiB within a second, and 1.5 GiB more (past 3 GiB with
the 2 held and the context) must fail with a clean OutOfMemoryError. Resized to 8g, its next 3 GiB
allocation must succeed. nvidia-smi run in the same container shows each size. Prints key=value.
"""
import os
import subprocess
import sys
import tempfile
import time

GIB = 1 << 30

WORKER = """
import sys, time, torch
held = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
print(f"start_total={torch.cuda.mem_get_info()[1]}", flush=True)
for line in sys.stdin:
    what = line.split()
    if what[0] == "wait_total":
        want, start = int(what[1]), time.monotonic()
        while torch.cuda.mem_get_info()[1] != want and time.monotonic() - start < 5:
            time.sleep(0.01)
        seen = torch.cuda.mem_get_info()[1]
        print(f"total={seen} ms={(time.monotonic() - start) * 1000:.0f}", flush=True)
    elif what[0] == "alloc":
        try:
            extra = torch.empty(int(float(what[1]) * (1 << 30)), dtype=torch.uint8, device="cuda")
            del extra
            print("alloc=ok", flush=True)
        except torch.OutOfMemoryError:
            print("alloc=oom", flush=True)
"""


def main():
    lib, smi = sys.argv[1], sys.argv[2]
    cache = os.path.join(tempfile.mkdtemp(), "cudevshr.cache")
    env = dict(os.environ, LD_PRELOAD=lib, CUDA_DEVICE_MEMORY_LIMIT_0="4g",
               CUDA_DEVICE_MEMORY_SHARED_CACHE=cache, LIBCUDA_LOG_LEVEL="3")
    worker = subprocess.Popen([sys.executable, "-c", WORKER], env=env, text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def ask(line):
        worker.stdin.write(line + "\n")
        worker.stdin.flush()
        return worker.stdout.readline().strip()

    def nvidia_smi_total_mib():
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits",
                              "-i", "0"], env=env, capture_output=True, text=True, timeout=60)
        return out.stdout.strip()

    start = worker.stdout.readline().strip()
    print(f"start_total={start.split('=')[1]}")
    for size, gib in (("3g", 3), ("8g", 8)):
        resized = subprocess.run([smi, "resize", "--device", "0", size, cache], capture_output=True, text=True)
        print(f"resize_{size}_status={resized.returncode}")
        sys.stderr.write(resized.stdout + resized.stderr)
        seen = dict(part.split("=") for part in ask(f"wait_total {gib * GIB}").split())
        print(f"total_after_{size}={seen['total']}")
        print(f"seen_after_{size}_ms={seen['ms']}")
        print(f"nvidia_smi_after_{size}={nvidia_smi_total_mib()}")
        if size == "3g":
            print(f"alloc_1_5g_after_3g={ask('alloc 1.5').split('=')[1]}")
        else:
            print(f"alloc_3g_after_8g={ask('alloc 3').split('=')[1]}")
    worker.stdin.close()
    worker.wait(timeout=60)
    print(f"worker_status={worker.returncode}")


if __name__ == "__main__":
    main()
