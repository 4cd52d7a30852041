"""GPU loads for the copy and memset rows of ci/gpu-compute and for ci/gpu-copy-engines: prints
`key=value` lines.

    python3 ci/gpu/copy_load.py KIND SECONDS [START]
    python3 ci/gpu/copy_load.py check

KIND is what the loop puts on the GPU:
  matmul   bf16 N×N matmuls (COMPUTE_MATMUL_N, default 8192), torch.mm
  dtod     device-to-device copies of COPY_MIB MiB (default 1024), y.copy_(x): cudaMemcpyAsync
  memset   cudaMemsetAsync of COPY_MIB MiB through CuPy's runtime binding (cuMemsetD8Async);
           falls back to the driver's cuMemsetD8Async through ctypes when CuPy is missing
  htod     pinned host to device copies of COPY_MIB MiB (non_blocking copy_)
  dtoh     device to pinned host copies of COPY_MIB MiB

`check` makes one copy or memset through each path below and checks what arrived, printing
`check_NAME=ok` (or what went wrong) and `checks_ok=K/N`; exit 1 unless all are ok:
  clone         y = x.clone() on the device (cudaMemcpyAsync, device to device)
  memset        CuPy memsetAsync (cuMemsetD8Async), read back by PyTorch
  memcpy_sync   CuPy memcpy, device to device (cudaMemcpy)
  memcpy_2d     CuPy memcpy2DAsync of a column block, device to device
  default_kind  CuPy memcpy with cudaMemcpyDefault from pageable host memory (a unified copy with a
                host side), then back
  htod, dtoh    PyTorch copies from pageable and to pinned host memory
  graph_copy, graph_memset  a copy and a memset captured into a CUDA graph, replayed

After a warm-up of COMPUTE_WARMUP seconds (default 1), the loop runs for SECONDS of wall time, or,
with START (time.time() seconds), from START for SECONDS, so that two processes started together
measure over the same window. The CPU stays at most 4 groups of steps ahead of the GPU (CUDA
events). It prints rate= (steps/s), bytes_per_s= (copies and memsets), elapsed_s=, and the GPU time
of the steps timed with CUDA events as ci/gpu/compute_share.py does (gpu_busy_s=, gpu_share=,
step_ms_median=). Any failure prints error=... and exits 1.
"""
import ctypes
import os
import statistics
import sys
import time
import traceback

import compute_share

N = int(os.environ.get("COMPUTE_MATMUL_N", "8192"))
COPY_BYTES = int(os.environ.get("COPY_MIB", "1024")) << 20
WARMUP_S = float(os.environ.get("COMPUTE_WARMUP", "1"))


def workload(torch, kind):
    """(step, steps per group, bytes per step) for KIND."""
    if kind == "matmul":
        a = torch.randn(N, N, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(N, N, device="cuda", dtype=torch.bfloat16)
        c = torch.empty(N, N, device="cuda", dtype=torch.bfloat16)
        return (lambda: torch.mm(a, b, out=c)), 10, 0
    elements = COPY_BYTES
    if kind == "dtod":
        x = torch.empty(elements, dtype=torch.uint8, device="cuda")
        y = torch.empty_like(x)
        return (lambda: y.copy_(x)), 4, COPY_BYTES
    if kind in ("htod", "dtoh"):
        host = torch.empty(elements, dtype=torch.uint8, pin_memory=True)
        device = torch.empty(elements, dtype=torch.uint8, device="cuda")
        if kind == "htod":
            return (lambda: device.copy_(host, non_blocking=True)), 2, COPY_BYTES
        return (lambda: host.copy_(device, non_blocking=True)), 2, COPY_BYTES
    if kind == "memset":
        x = torch.empty(elements, dtype=torch.uint8, device="cuda")
        stream = torch.cuda.current_stream().cuda_stream
        try:
            import cupy

            print("memset_via=cupy.cuda.runtime.memsetAsync")
            return (lambda: cupy.cuda.runtime.memsetAsync(x.data_ptr(), 7, COPY_BYTES, stream)), 4, COPY_BYTES
        except ImportError:
            cuda = ctypes.CDLL("libcuda.so.1")
            memset = cuda.cuMemsetD8Async
            memset.argtypes = [ctypes.c_uint64, ctypes.c_ubyte, ctypes.c_size_t, ctypes.c_void_p]
            print("memset_via=libcuda cuMemsetD8Async")

            def step():
                status = memset(x.data_ptr(), 7, COPY_BYTES, stream)
                if status != 0:
                    raise RuntimeError(f"cuMemsetD8Async returned {status}")

            return step, 4, COPY_BYTES
    raise ValueError(f"unknown KIND {kind}")


def check():
    """One copy or memset through each path, checked (see the module's docstring)."""
    import cupy
    import numpy
    import torch

    runtime = cupy.cuda.runtime
    stream = torch.cuda.current_stream().cuda_stream
    n = 1 << 20
    x = torch.arange(n, dtype=torch.int32, device="cuda")
    results = {}

    def expect(name, got, want):
        torch.cuda.synchronize()
        results[name] = "ok" if torch.equal(got.cpu(), want.cpu()) else "wrong values"

    expect("clone", x.clone(), x)
    y = torch.empty(4 * n, dtype=torch.uint8, device="cuda")
    runtime.memsetAsync(y.data_ptr(), 0x5A, 4 * n, stream)
    expect("memset", y, torch.full((4 * n,), 0x5A, dtype=torch.uint8))
    z = torch.empty_like(x)
    runtime.memcpy(z.data_ptr(), x.data_ptr(), 4 * n, runtime.memcpyDeviceToDevice)
    expect("memcpy_sync", z, x)
    rows, cols, block = 256, 1024, 100
    a = torch.arange(rows * cols, dtype=torch.int32, device="cuda").reshape(rows, cols)
    b = torch.zeros_like(a)
    runtime.memcpy2DAsync(b.data_ptr(), cols * 4, a.data_ptr(), cols * 4, block * 4, rows,
                          runtime.memcpyDeviceToDevice, stream)
    want = torch.zeros_like(a)
    want[:, :block] = a[:, :block]
    expect("memcpy_2d", b, want)
    host = numpy.arange(n, dtype=numpy.int32)
    d = torch.empty(n, dtype=torch.int32, device="cuda")
    runtime.memcpy(d.data_ptr(), host.ctypes.data, 4 * n, runtime.memcpyDefault)
    back = numpy.zeros(n, dtype=numpy.int32)
    runtime.memcpy(back.ctypes.data, d.data_ptr(), 4 * n, runtime.memcpyDefault)
    expect("default_kind", torch.from_numpy(back), torch.from_numpy(host))
    expect("htod", torch.arange(n, dtype=torch.int32).cuda(), x)
    pinned = torch.empty(n, dtype=torch.int32, pin_memory=True)
    pinned.copy_(x, non_blocking=True)
    expect("dtoh", pinned, x)
    # Captured into a CUDA graph (the copy and the memset are graph nodes, paced when the graph is
    # launched), then replayed twice.
    src = torch.arange(n, dtype=torch.int32, device="cuda")
    dst = torch.zeros_like(src)
    scratch = torch.empty(4 * n, dtype=torch.uint8, device="cuda")
    graph = torch.cuda.CUDAGraph()
    capture = torch.cuda.Stream()
    capture.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(capture):
        with torch.cuda.graph(graph, stream=capture):
            dst.copy_(src)
            runtime.memsetAsync(scratch.data_ptr(), 0x33, 4 * n, capture.cuda_stream)
    torch.cuda.current_stream().wait_stream(capture)
    src.add_(1)
    graph.replay()
    graph.replay()
    expect("graph_copy", dst, torch.arange(1, n + 1, dtype=torch.int32))
    expect("graph_memset", scratch, torch.full((4 * n,), 0x33, dtype=torch.uint8))
    for name, verdict in results.items():
        print(f"check_{name}={verdict}")
    passed = sum(v == "ok" for v in results.values())
    print(f"checks_ok={passed}/{len(results)}")
    if passed != len(results):
        sys.exit(1)


def main():
    if sys.argv[1] == "check":
        check()
        return
    kind, seconds = sys.argv[1], float(sys.argv[2])
    start_at = float(sys.argv[3]) if len(sys.argv) > 3 else None
    import torch

    step, per_group, step_bytes = workload(torch, kind)
    warm_until = time.time() + WARMUP_S
    compute_share.run_until(torch, step, per_group, lambda: time.time() >= warm_until)
    if start_at is not None:
        compute_share.run_until(torch, step, per_group, lambda: time.time() >= start_at)
    torch.cuda.synchronize()
    if start_at is not None:
        print(f"late_s={time.time() - start_at:.4f}")
    print(f"pid={os.getpid()}")
    print(f"measured_from={time.time():.3f}")
    steps, elapsed, step_ms = compute_share.measure(torch, step, per_group, time.time() + seconds)
    busy = sum(step_ms) / 1000
    print(f"kind={kind}")
    print(f"steps={steps}")
    print(f"elapsed_s={elapsed:.4f}")
    print(f"rate={steps / elapsed:.6f}")
    print(f"bytes_per_s={steps * step_bytes / elapsed:.0f}")
    print(f"gpu_busy_s={busy:.4f}")
    print(f"gpu_share={busy / elapsed:.4f}")
    print(f"step_ms_median={statistics.median(step_ms) if step_ms else 0:.4f}")


if __name__ == "__main__":
    try:
        main()
    except Exception as error:  # noqa: BLE001 - the benchmark reads error= and the exit status
        traceback.print_exc()
        print(f"error={type(error).__name__}: {error}")
        sys.exit(1)
