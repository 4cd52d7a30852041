"""What pinning host memory in one thread costs another thread's kernels in the same process
(issue 37: may a busy process pin ahead?). PyTorch for the kernels, ctypes for the driver calls
(ctypes lets go of the GIL while the driver works). Prints key=value lines:
    base_gbps=            passes of t.mul_ over GIB GiB, nothing else running
    <way>_gbps=, <way>_pin_gibps=   the same passes while a thread pins, and how fast it pins
ways: alloc64 (cuMemHostAlloc of 64 MiB), alloc2 (of 2 MiB), register64 (cuMemHostRegister of
64 MiB of touched pageable memory).
    python3 ci/gpu/pin_cost.py GIB SECONDS
"""
import ctypes
import mmap
import statistics
import sys
import threading
import time

import torch

GIB = 1 << 30
cuda = ctypes.CDLL("libcuda.so.1")


def passes(held, seconds):
    rates = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        start = time.monotonic()
        for t in held:
            t.mul_(1.0001)
        torch.cuda.synchronize()
        rates.append(2 * len(held) * GIB / (time.monotonic() - start) / 1e9)
    return statistics.median(rates)


def pinner(way, stop, done, ctx):
    cuda.cuCtxSetCurrent(ctx)
    size = (2 << 20) if way == "alloc2" else (64 << 20)
    pinned = 0
    keep = []
    start = time.monotonic()
    while not stop.is_set() and pinned < 24 * GIB:
        if way.startswith("alloc"):
            p = ctypes.c_void_p()
            if cuda.cuMemHostAlloc(ctypes.byref(p), ctypes.c_size_t(size), 0) != 0:
                break
            keep.append(p)
        else:
            m = mmap.mmap(-1, size)
            m.write(b"\1" * size)
            addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
            if cuda.cuMemHostRegister_v2(ctypes.c_void_p(addr), ctypes.c_size_t(size), 0) != 0:
                break
            keep.append((m, addr))
        pinned += size
    done.append(pinned / GIB / (time.monotonic() - start))
    for k in keep:
        if way.startswith("alloc"):
            cuda.cuMemFreeHost(k)
        else:
            cuda.cuMemHostUnregister(ctypes.c_void_p(k[1]))


def main():
    gib, seconds = int(sys.argv[1]), float(sys.argv[2])
    held = [torch.ones(GIB // 4, device="cuda") for _ in range(gib)]
    passes(held, 1)
    print(f"base_gbps={passes(held, seconds):.1f}", flush=True)
    ctx = ctypes.c_void_p()
    cuda.cuCtxGetCurrent(ctypes.byref(ctx))
    for way in ("alloc64", "alloc2", "register64"):
        stop, done = threading.Event(), []
        th = threading.Thread(target=pinner, args=(way, stop, done, ctx))
        th.start()
        time.sleep(0.2)
        rate = passes(held, seconds)
        stop.set()
        th.join()
        print(f"{way}_gbps={rate:.1f}\n{way}_pin_gibps={done[0] if done else 0:.2f}", flush=True)


main()
