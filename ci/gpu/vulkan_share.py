"""The vulkan section of ci/gpu-compute: Vulkan compute submissions under libvgpu's layer at
shares 25/50/75, against the same client without the layer. Prints the table rows as
tab-separated lines `section item target seen verdict` and writes every run's output under
LOG_DIR.

    python3 ci/gpu/vulkan_share.py LOG_DIR

The client is tests/clients/vk_client (built at target/clients/vk_client by `cargo test --release
--test vulkan_layer --no-run`): `work shader SECONDS SIZE` submits a dispatch of an FMA loop of SIZE
thousand iterations, VK_CLIENT_IN_FLIGHT of them before each wait (a fence on the last only), and
prints submits=, wall_ns= and gpu_ns= (the work's own GPU time, by timestamps written before and
after it in each command buffer). SIZE is calibrated once per case so that one submission takes
the case's milliseconds natively.

A limited run is one container: LD_PRELOAD=libvgpu.so, the layer enabled as HAMi's webhook enables
it (its manifest in XDG_DATA_DIRS, HAMI_VULKAN_ENABLE=1), its own region file,
CUDA_DEVICE_SM_LIMIT and LIBCUDA_LOG_LEVEL=4 (the layer's pacing lines, once a second, go to the
run's log). Rows per case: the native rate; per share, the share of wall time the work held the
GPU (gpu_ns / wall_ns; the contract) within 3 points of the share, and the throughput against
native within 3 points of the share divided by the part of the time the native client keeps the
GPU busy (a client bound by its own submission rate gets more than its share of throughput for
its share of time).

Settings: VULKAN_CASES (`MS:IN_FLIGHT[:idle] ...`, default `3.4:4 3.4:4:idle 0.1:8 10:1 10:1:idle`;
`idle`: the client passes no fence at all and waits with vkQueueWaitIdle, else the last submission
of each group carries the client's fence, which the layer must follow with a marker submission), VULKAN_SECONDS (4),
COMPUTE_LIMITS (25 50 75), COMPUTE_STEP_TIMEOUT (60), VK_CLIENT (the client's path).
"""
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
LIB = os.environ.get("LIBVGPU", os.path.join(ROOT, "target", "release", "libvgpu.so"))
LAYER = os.path.join(ROOT, "target", "release", "libvgpu_vk.so")
CLIENT = os.environ.get("VK_CLIENT", os.path.join(ROOT, "target", "clients", "vk_client"))
CASES = [(c.split(":") + [""])[:3] for c in os.environ.get("VULKAN_CASES", "3.4:4 3.4:4:idle 0.1:8 10:1 10:1:idle").split()]
SECONDS = float(os.environ.get("VULKAN_SECONDS", "4"))
LIMITS = [int(v) for v in os.environ.get("COMPUTE_LIMITS", "25 50 75").split()]
TIMEOUT = float(os.environ.get("COMPUTE_STEP_TIMEOUT", "60"))
TOLERANCE = 3.0  # points


def row(item, target, seen, verdict):
    print(f"vulkan\t{item}\t{target}\t{seen}\t{verdict}", flush=True)


def parse(path):
    values = {}
    with open(path, errors="replace") as f:
        for line in f:
            key, sep, value = line.strip().partition("=")
            if sep:
                values[key] = value
    return values


def run(log, name, seconds, size, in_flight, layer=None, limit=None, wait=""):
    """One run of the client; its key=value output, with `exit`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CUDA_DEVICE_", "LD_PRELOAD", "HAMI_"))}
    env.update(CUDA_VISIBLE_DEVICES="0", VK_CLIENT_IN_FLIGHT=str(in_flight), VK_CLIENT_WAIT=wait or "fence")
    if layer:
        env.update(layer)
        if limit:
            env["CUDA_DEVICE_SM_LIMIT"] = str(limit)
    args = [CLIENT, "work", "shader", f"{seconds:g}", str(size)]
    path = os.path.join(log, f"{name}.txt")
    with open(path, "w") as out:
        settings = " ".join(f"{k}={env[k]}" for k in sorted(env)
                            if k.startswith(("CUDA_", "LD_PRELOAD", "HAMI_", "VK_CLIENT", "LIBCUDA", "XDG_DATA")))
        out.write(f"# {settings} {' '.join(args)}\n")
        out.flush()
        try:
            code = subprocess.run(args, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=TIMEOUT).returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
        out.write(f"# exit {code}\n")
    values = parse(path)
    values["exit"] = str(code)
    return values


def good(r):
    return r.get("exit") == "0" and "error" not in r and int(r.get("submits", "0")) > 0 and int(r.get("gpu_ns", "0")) > 0


CALIBRATED = {}


def calibrate(log, ms, in_flight):
    """The SIZE whose submission takes about MS ms natively, or None (and the failed run)."""
    if ms in CALIBRATED:
        return CALIBRATED[ms], None
    size = 1000
    for attempt in range(3):
        r = run(log, f"calibrate-{ms}ms-{attempt}", 1, size, 1)
        if not good(r):
            return None, r
        per = int(r["gpu_ns"]) / int(r["submits"]) / 1e6
        size = max(1, round(size * float(ms) / per))
        if abs(per - float(ms)) <= 0.05 * float(ms):
            break
    CALIBRATED[ms] = size
    return size, None


def main():
    log = sys.argv[1]
    os.makedirs(log, exist_ok=True)
    for path, what in ((CLIENT, "the Vulkan client"), (LAYER, "libvgpu_vk.so"), (LIB, "libvgpu.so")):
        if not os.path.exists(path):
            row("setup", "present", f"{what} missing: {path}", "FAIL")
            return
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "data")
        manifest = subprocess.run([os.path.join(ROOT, "vk", "install-manifest"), data, os.path.abspath(LAYER)],
                                  capture_output=True, text=True)
        if manifest.returncode != 0:
            row("setup", "layer manifest installed", manifest.stderr.strip()[:160], "FAIL")
            return
        for ms, in_flight, wait in CASES:
            in_flight = int(in_flight)
            case = f"{ms} ms submissions, {in_flight} in flight, " + ("no fence" if wait == "idle" else "fence on the last")
            tag = f"{ms}ms-x{in_flight}{'-idle' if wait == 'idle' else ''}"
            size, failure = calibrate(log, ms, in_flight)
            if size is None:
                row(case, "native runs", f"failed: {failure.get('error', 'exit ' + failure.get('exit', '?'))}", "FAIL")
                continue
            native = run(log, f"{tag}-native", SECONDS, size, in_flight, wait=wait)
            if not good(native):
                row(case, "native runs", f"failed: {native.get('error', 'exit ' + native.get('exit', '?'))}", "FAIL")
                continue
            rate = int(native["submits"]) / (int(native["wall_ns"]) / 1e9)
            per = int(native["gpu_ns"]) / int(native["submits"]) / 1e6
            busy = 100 * int(native["gpu_ns"]) / int(native["wall_ns"])
            row(f"{case}: native", "", f"{rate:.1f} submissions/s, {per:.2f} ms each (SIZE {size}), GPU time {busy:.1f} %",
                "INFO")
            for limit in LIMITS:
                layer = {
                    "LD_PRELOAD": os.path.abspath(LIB),
                    "HAMI_VULKAN_ENABLE": "1",
                    "XDG_DATA_DIRS": f"{data}:/usr/local/share:/usr/share",
                    "CUDA_DEVICE_MEMORY_SHARED_CACHE": os.path.join(tmp, f"{tag}-{limit}.cache"),
                    "LIBCUDA_LOG_LEVEL": "4",
                }
                r = run(log, f"{tag}-limit{limit}", SECONDS, size, in_flight, layer, limit, wait)
                if not good(r):
                    row(f"{case}: limit {limit}", f"{limit} ± 3", f"failed: {r.get('error', 'exit ' + r.get('exit', '?'))}",
                        "FAIL")
                    continue
                share = 100 * int(r["gpu_ns"]) / int(r["wall_ns"])
                thr = 100 * int(r["submits"]) / (int(r["wall_ns"]) / 1e9) / rate
                row(f"{case}: limit {limit}, share of GPU time", f"{limit} ± 3", f"{share:.1f} %",
                    "PASS" if abs(share - limit) <= TOLERANCE else "MISS")
                # A time share s gives s of native throughput only where the native client keeps
                # the GPU busy; a client bound by its own submission rate gets s / (its busy part).
                want = min(100.0, 100 * limit / busy)
                row(f"{case}: limit {limit}, throughput vs native", f"{want:.1f} ± 3 ({limit} / GPU {busy:.1f} %)",
                    f"{thr:.1f} % ({int(r['gpu_ns']) / int(r['submits']) / 1e6:.2f} ms each)",
                    "PASS" if abs(thr - want) <= TOLERANCE else "MISS")


if __name__ == "__main__":
    main()
