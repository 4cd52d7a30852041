"""Framework checks under libvgpu on a real GPU: prints one `key=value` per line.

    python3 ci/gpu/frameworks.py torch|cupy|jax

Run it with and without LD_PRELOAD=libvgpu.so; ci/gpu-validate compares the answers.
"""
import sys

GIB = 1 << 30


def torch_check():
    import torch

    free, total = torch.cuda.mem_get_info()
    print(f"torch_total={total}")
    print(f"torch_free={free}")
    held, chunk = [], 512 << 20
    try:
        while True:
            held.append(torch.empty(chunk, dtype=torch.uint8, device="cuda"))
    except torch.OutOfMemoryError:
        print("torch_oom=1")
    print(f"torch_held_before_oom={len(held) * chunk}")
    print(f"torch_nvml_process_used={process_used()}")
    del held
    torch.cuda.empty_cache()
    try:
        torch.empty(total + GIB, dtype=torch.uint8, device="cuda")
        print("torch_past_total_refused=0")
    except torch.OutOfMemoryError:
        print("torch_past_total_refused=1")
    x = torch.ones(1 << 20, device="cuda")
    print(f"torch_compute_ok={int(x.sum().item() == (1 << 20))}")


def process_used():
    """Device memory NVML charges to this process (the real figure, not libvgpu's view)."""
    import os
    import pynvml

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
        if proc.pid == os.getpid():
            return proc.usedGpuMemory or 0
    return 0


def jax_check():
    import jax
    import jax.numpy as jnp

    stats = jax.devices()[0].memory_stats() or {}
    print(f"jax_bytes_limit={stats.get('bytes_limit', 0)}")
    try:
        jnp.ones((9 << 30,), dtype=jnp.uint8).block_until_ready()
        print("jax_past_budget_refused=0")
    except Exception:  # XLA reports RESOURCE_EXHAUSTED as a runtime error
        print("jax_past_budget_refused=1")
    y = jnp.ones((1 << 20,), dtype=jnp.float32)
    print(f"jax_compute_ok={int(float(y.sum()) == (1 << 20))}")
    print(f"jax_nvml_process_used={process_used()}")


def cupy_check():
    import cupy

    free, total = cupy.cuda.runtime.memGetInfo()
    print(f"cupy_total={total}")
    print(f"cupy_free={free}")
    try:
        cupy.empty(total + GIB, dtype=cupy.uint8)
        print("cupy_past_total_refused=0")
    except cupy.cuda.memory.OutOfMemoryError:
        print("cupy_past_total_refused=1")


if __name__ == "__main__":
    {"torch": torch_check, "cupy": cupy_check, "jax": jax_check}[sys.argv[1]]()
