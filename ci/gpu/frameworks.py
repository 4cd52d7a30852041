"""Framework checks under libvgpu on a real GPU: prints one `key=value` per line.

    python3 ci/gpu/frameworks.py torch|cupy

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
    del held
    torch.cuda.empty_cache()
    try:
        torch.empty(total + GIB, dtype=torch.uint8, device="cuda")
        print("torch_past_total_refused=0")
    except torch.OutOfMemoryError:
        print("torch_past_total_refused=1")
    x = torch.ones(1 << 20, device="cuda")
    print(f"torch_compute_ok={int(x.sum().item() == (1 << 20))}")


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
    {"torch": torch_check, "cupy": cupy_check}[sys.argv[1]]()
