"""Two PyTorch processes share one budget on a real GPU; SIGKILL of one gives its memory back.

    python3 ci/gpu/shared_budget.py LIBVGPU_SO

Process A holds 5 GiB under CUDA_DEVICE_MEMORY_LIMIT_0=8g. Process B, same container (same shared
file), is refused 4 GiB (5 + 4 and two CUDA contexts > 8) but gets 1 GiB. A is killed with SIGKILL;
B then asks for 5 GiB and must get it within 2 seconds. Prints one key=value per line.
"""
import os
import signal
import subprocess
import sys
import tempfile
import time

HOLDER = """
import sys, time, torch
x = torch.empty(5 << 30, dtype=torch.uint8, device="cuda")
print("ready", flush=True)
time.sleep(600)
"""

SECOND = """
import sys, time, torch
def grab(gib):
    try:
        return torch.empty(gib << 30, dtype=torch.uint8, device="cuda")
    except torch.OutOfMemoryError:
        return None
print(f"b_4g_refused={int(grab(4) is None)}", flush=True)
keep = grab(1)
print(f"b_1g_granted={int(keep is not None)}", flush=True)
sys.stdin.readline()  # A has been killed
start = time.monotonic()
got = None
while got is None and time.monotonic() - start < 5:
    got = grab(5)
    if got is None:
        time.sleep(0.05)
print(f"b_5g_after_kill={int(got is not None)}", flush=True)
print(f"b_5g_after_kill_ms={(time.monotonic() - start) * 1000:.0f}", flush=True)
"""


def main():
    env = dict(os.environ)
    env["LD_PRELOAD"] = sys.argv[1]
    env["CUDA_DEVICE_MEMORY_LIMIT_0"] = "8g"
    env["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = os.path.join(tempfile.mkdtemp(), "cudevshr.cache")
    holder = subprocess.Popen([sys.executable, "-c", HOLDER], env=env, stdout=subprocess.PIPE, text=True)
    print(f"a_ready={int(holder.stdout.readline().strip() == 'ready')}", flush=True)
    second = subprocess.Popen(
        [sys.executable, "-c", SECOND], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    for _ in range(2):
        print(second.stdout.readline().strip(), flush=True)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    second.stdin.write("go\n")
    second.stdin.flush()
    for line in second.stdout:
        print(line.strip(), flush=True)
    second.wait()


if __name__ == "__main__":
    main()
