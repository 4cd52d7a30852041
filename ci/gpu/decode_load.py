"""A decode-like PyTorch loop for the decode section of ci/gpu-compute (ci/gpu/decode.py).

    python3 ci/gpu/decode_load.py SECONDS START [--graph] [--batch B] [--times PATH]

A token is 32 layers of a (B, 4096) fp16 activation times a 4096 x 4096 fp16 weight, each followed
by an in-place ReLU: 64 kernels, then a synchronisation, as a generation loop waits for each token
before it launches the next. With --graph the 64 kernels are captured once into a CUDA graph and
each token is one replay. The loop warms up, waits until the wall clock reaches START (so that the
processes of a group measure the same window), counts the tokens finished in the SECONDS after it
and prints `tokens_per_s=`. With --times it also writes each token's end (CLOCK_MONOTONIC seconds)
to PATH, one a line, for the share-change measurement.
"""
import argparse
import time

import torch

LAYERS = 32
DIM = 4096


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("seconds", type=float)
    parser.add_argument("start", type=float)
    parser.add_argument("--graph", action="store_true")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--times")
    args = parser.parse_args()

    torch.manual_seed(0)
    weights = [torch.randn(DIM, DIM, device="cuda", dtype=torch.float16) / 64 for _ in range(LAYERS)]
    a = torch.randn(args.batch, DIM, device="cuda", dtype=torch.float16)
    b = torch.empty_like(a)

    def token():
        x, y = a, b
        for w in weights:
            torch.mm(x, w, out=y)
            torch.relu_(y)
            x, y = y, x

    step = token
    if args.graph:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            token()  # warm-up on a side stream, as PyTorch asks before a capture
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            token()
        step = graph.replay

    warm_until = time.time() + 1.0
    while time.time() < warm_until:
        step()
        torch.cuda.synchronize()
    while time.time() < args.start:
        step()
        torch.cuda.synchronize()

    ends = []
    tokens = 0
    begin = time.monotonic()
    stop = begin + args.seconds
    while True:
        step()
        torch.cuda.synchronize()
        now = time.monotonic()
        if args.times:
            ends.append(now)
        if now > stop:
            break
        tokens += 1
    elapsed = now - begin
    print(f"tokens={tokens}")
    print(f"tokens_per_s={tokens / elapsed:.3f}")
    if args.times:
        with open(args.times, "w") as f:
            f.write("".join(f"{t:.6f}\n" for t in ends))


if __name__ == "__main__":
    try:
        main()
    except Exception as error:  # noqa: BLE001 - the orchestrator reads the line
        print(f"error={type(error).__name__}: {error}")
        raise
