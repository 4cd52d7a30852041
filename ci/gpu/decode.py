"""The decode section of ci/gpu-compute (issue 47): what compute shares cost an inference loop that
launches small kernels one by one, and how fast a share change takes effect. Prints the table rows
as tab-separated lines `section item target seen verdict` (ci/gpu-compute's rows.tsv) and writes
every run's output under LOG_DIR.

    python3 ci/gpu/decode.py LOG_DIR

Every process is ci/gpu/decode_load.py (64 kernels a token, a synchronisation per token), each in a
container of its own (its own region file) with an 8g budget when under libvgpu. For each mode,
without and with CUDA graphs, at batch 8:
  - one process alone, native: the reference rate;
  - pairs over one window: native (the driver's time-slicing), libvgpu budgets only, shares 50/50,
    shares 30/70, and MPS with 50 % of the threads each (no libvgpu; its own control daemon).
    A pair's retention is its total tokens/s over the reference.
Goals: 50/50 retention within 3 % of the native pair's (the shares bind neither process); with
graphs, retention as the native pair's.
At a batch where both processes saturate the GPU (DECODE_SATURATING_BATCH, default 512; at 64 an
H200's pair was launch-bound and the 30's part read 39.7, its partner unable to use its 70): the
30/70 pair's split within 3 points, without and with graphs. Each process's tokens/s alone at that
batch is shown beside it, under a budget only, with the two at once natively.
A share change: one batch-64 process at a share of 30; `vgpu-smi resize --share 70` (when
target/release/vgpu-smi is there), then the monitor's `utilization_switch` set to 0 in the region
(as HAMi's monitor does). Each change's latency: from the change to the first token after which
the token intervals stay past the midpoint between the old and the new rate. Goal: 50 ms.
The launch cost: ci/gpu/launch_rate.cu's empty-kernel launches per second, native, under a budget
and under a budget and a share of 90 (which binds nothing), three runs each taking turns; the CPU
time a launch costs under the share over the budget alone. Goal: 0.3 us.

Settings: DECODE_SECONDS (window, default 5), COMPUTE_STEP_TIMEOUT (60), LIBVGPU, VGPU_SMI,
DECODE_BASELINE_LIB (another libvgpu.so whose launch cost under the share is measured beside),
DECODE_MODES (default "eager graph": without and with CUDA graphs) and DECODE_PARTS (default
"pairs saturating change cost": the batch-8 pairs, the saturating split, the share change, the
launch cost) to run part of it.
"""
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from contention import mps_daemon, parse, row  # noqa: E402

LOAD = os.path.join(HERE, "decode_load.py")
ROOT = os.path.join(HERE, "..", "..")
LIB = os.environ.get("LIBVGPU", os.path.join(ROOT, "target", "release", "libvgpu.so"))
SMI = os.environ.get("VGPU_SMI", os.path.join(ROOT, "target", "release", "vgpu-smi"))
SECONDS = float(os.environ.get("DECODE_SECONDS", "5"))
TIMEOUT = float(os.environ.get("COMPUTE_STEP_TIMEOUT", "60"))
UTILIZATION_SWITCH = 2_008_900  # HAMi's v1 region: int32 utilization_switch
RETENTION_TOLERANCE = 0.03  # of the native pair's retention
SPLIT_TOLERANCE = 3.0  # points
SWITCH_GOAL_MS = 50.0
MODES = os.environ.get("DECODE_MODES", "eager graph").split()
PARTS = os.environ.get("DECODE_PARTS", "pairs saturating change cost").split()
SATURATING_BATCH = int(os.environ.get("DECODE_SATURATING_BATCH", "512"))


def clean_env():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CUDA_DEVICE_", "LD_PRELOAD", "CUDA_MPS_"))}
    env["CUDA_VISIBLE_DEVICES"] = "0"
    return env


def start(log, name, i, args, env):
    out = open(os.path.join(log, f"{name}-{i}.txt"), "w")
    settings = " ".join(f"{k}={env[k]}" for k in sorted(env) if k.startswith(("CUDA_", "LD_PRELOAD")))
    out.write(f"# {settings} {' '.join(args)}\n")
    out.flush()
    return subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT), out


def finish(proc, out):
    try:
        code = proc.wait(timeout=TIMEOUT + SECONDS + 20)
    except subprocess.TimeoutExpired:
        proc.kill()
        code = "timeout"
    out.write(f"# exit {code}\n")
    out.close()
    values = parse(out.name)
    values["exit"] = str(code)
    return values


def group(log, name, members, graph, batch, extra=None):
    """Runs every member (None: native; "budget": libvgpu, budget only; an int: that share; or a dict:
    native with that environment) at once over one window; returns their tokens/s (None if one failed)."""
    at = time.time() + 15
    procs = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, member in enumerate(members):
            env = clean_env()
            env.update(extra or {})
            if isinstance(member, dict):
                env.update(member)
            elif member is not None:
                env["LD_PRELOAD"] = LIB
                env["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = os.path.join(tmp, f"{i}.cache")
                env["CUDA_DEVICE_MEMORY_LIMIT"] = "8g"
                if member != "budget":
                    env["CUDA_DEVICE_SM_LIMIT"] = str(member)
            args = [sys.executable, LOAD, str(SECONDS), f"{at:.3f}", "--batch", str(batch)] + (["--graph"] if graph else [])
            procs.append(start(log, name, i, args, env))
        results = [finish(*p) for p in procs]
    if any(r["exit"] != "0" or "tokens_per_s" not in r for r in results):
        return None
    return [float(r["tokens_per_s"]) for r in results]


def decode(log):
    graphs = [graph for graph, name in ((False, "eager"), (True, "graph")) if name in MODES]
    for graph in graphs if "pairs" in PARTS else []:
        mode = "with graphs" if graph else "without graphs"
        tag = "graph" if graph else "eager"
        alone = group(log, f"{tag}-alone", [None], graph, 8)
        if not alone:
            row("decode", f"{mode}: one alone", "runs", "failed", "FAIL")
            continue
        row("decode", f"{mode}: one alone, native", "", f"{alone[0]:.0f} tok/s", "INFO")
        pairs = {
            "native pair": [None, None],
            "libvgpu budgets only": ["budget", "budget"],
            "libvgpu shares 50/50": [50, 50],
            "libvgpu shares 30/70": [30, 70],
        }
        retention = {}
        for label, members in pairs.items():
            rates = group(log, f"{tag}-{label.replace(' ', '_').replace('/', '-')}", members, graph, 8)
            if not rates:
                row("decode", f"{mode}: {label}", "runs", "failed", "FAIL")
                continue
            retention[label] = sum(rates) / alone[0]
            split = " / ".join(f"{r / sum(rates):.3f}" for r in rates)
            row("decode", f"{mode}: {label}, retention (split)", "", f"{retention[label]:.3f} ({split})", "INFO")
        retention["MPS 50 % threads"] = mps_pair(log, tag, graph, alone[0])
        native = retention.get("native pair")
        for label in ("libvgpu budgets only", "libvgpu shares 50/50"):
            if native and retention.get(label):
                ratio = retention[label] / native
                row("decode", f"{mode}: {label}, retention vs the native pair's", f">= {1 - RETENTION_TOLERANCE:.2f}",
                    f"{ratio:.3f}", "PASS" if ratio >= 1 - RETENTION_TOLERANCE else "MISS")
    for graph in graphs if "saturating" in PARTS else []:
        mode = "with graphs" if graph else "without graphs"
        batch = SATURATING_BATCH
        name = f"{'graph' if graph else 'eager'}-saturating"
        # Whether the pair saturates: natively, two at once do no more tokens than one alone.
        alone = group(log, f"{name}-alone", [None], graph, batch)
        both = group(log, f"{name}-native-pair", [None, None], graph, batch)
        if alone and both:
            row("decode", f"{mode}: batch {batch}, a native pair's tokens/s over one alone's (1.0: saturating)",
                "", f"{sum(both) / alone[0]:.2f}", "INFO")
        rates = group(log, f"{name}-30-70", [30, 70], graph, batch)
        if not rates:
            row("decode", f"{mode}: batch {batch}, shares 30/70", "runs", "failed", "FAIL")
            continue
        got = 100 * rates[0] / sum(rates)
        row("decode", f"{mode}: batch {batch}, shares 30/70, the 30's part", "30 ± 3", f"{got:.1f}",
            "PASS" if abs(got - 30) <= SPLIT_TOLERANCE else "MISS")
    if "change" in PARTS:
        share_change(log)
    if "cost" in PARTS:
        launch_cost(log)


def mps_pair(log, tag, graph, alone):
    try:
        code, said, pipes = mps_daemon(log, True)
    except (OSError, subprocess.SubprocessError) as error:
        row("decode", f"{tag}: MPS daemon", "starts", str(error), "FAIL")
        return None
    if code != 0:
        row("decode", f"{tag}: MPS daemon", "starts", f"exit {code}: {said}", "FAIL")
        return None
    try:
        member = {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50"}
        rates = group(log, f"{tag}-mps50", [member, member], graph, 8, {"CUDA_MPS_PIPE_DIRECTORY": pipes})
    finally:
        mps_daemon(log, False)
    if not rates:
        row("decode", f"{tag}: MPS 50 % threads each", "runs", "failed", "FAIL")
        return None
    mode = "with graphs" if graph else "without graphs"
    row("decode", f"{mode}: MPS 50 % threads each (no libvgpu), retention", "", f"{sum(rates) / alone:.3f}", "INFO")
    return sum(rates) / alone


def latency(ends, at, before, after):
    """Milliseconds from `at` to the first token end after which every interval is past the midpoint
    between the intervals `before` and `after` (None when they never are)."""
    mid = (before + after) / 2
    faster = after < before
    intervals = [(ends[i], ends[i + 1] - ends[i]) for i in range(len(ends) - 1) if ends[i] >= at]
    for k, (t, _) in enumerate(intervals):
        rest = [d for _, d in intervals[k:k + 20]]
        if len(rest) >= 5 and all((d < mid) if faster else (d > mid) for d in rest):
            return 1000 * (t - at)
    return None


def share_change(log):
    seconds = 9.0
    with tempfile.TemporaryDirectory() as tmp:
        region = os.path.join(tmp, "switch.cache")
        times = os.path.join(log, "switch-times.txt")
        env = clean_env()
        env.update(LD_PRELOAD=LIB, CUDA_DEVICE_MEMORY_SHARED_CACHE=region, CUDA_DEVICE_MEMORY_LIMIT="8g",
                   CUDA_DEVICE_SM_LIMIT="30")
        at = time.time() + 15
        proc, out = start(log, "switch", 0, [sys.executable, LOAD, str(seconds), f"{at:.3f}", "--batch", "64",
                                             "--times", times], env)
        time.sleep(max(0.0, at - time.time()) + 3)
        changes = []
        if os.path.exists(SMI):
            begin = time.monotonic()
            done = subprocess.run([SMI, "resize", "--device", "0", "--share", "70", region], capture_output=True,
                                  text=True, timeout=30)
            changes.append(("vgpu-smi resize 30 -> 70", time.monotonic(), done.returncode,
                            f"{1000 * (time.monotonic() - begin):.0f} ms command"))
            time.sleep(3)
        with open(region, "r+b") as f:
            f.seek(UTILIZATION_SWITCH)
            f.write((0).to_bytes(4, "little"))
        changes.append(("utilization_switch 1 -> 0 (monitor)", time.monotonic(), 0, "written in place"))
        values = finish(proc, out)
    if values["exit"] != "0" or not os.path.exists(times):
        row("decode", "share change", "runs", "failed", "FAIL")
        return
    with open(times) as f:
        ends = [float(line) for line in f if line.strip()]
    marks = [c[1] for c in changes]
    for n, (label, at, code, note) in enumerate(changes):
        if code != 0:
            row("decode", f"share change: {label}", "runs", f"exit {code}", "FAIL")
            continue
        before = statistics.median(ends[i + 1] - ends[i] for i in range(len(ends) - 1) if at - 2 <= ends[i] < at)
        until = marks[n + 1] if n + 1 < len(marks) else ends[-1]
        after = statistics.median(ends[i + 1] - ends[i] for i in range(len(ends) - 1) if until - 1.5 <= ends[i] < until)
        took = latency(ends, at, before, after)
        seen = "never" if took is None else f"{took:.1f} ms"
        row("decode", f"share change: {label}, token interval {1000 * before:.2f} -> {1000 * after:.2f} ms ({note})",
            f"<= {SWITCH_GOAL_MS:.0f} ms", seen, "PASS" if took is not None and took <= SWITCH_GOAL_MS else "MISS")


def launch_cost(log):
    binary = os.path.join(ROOT, "target", "gpu-compute", "bin", "launch_rate")
    if not os.path.exists(binary):
        row("decode", "launch cost", "runs", "no target/gpu-compute/bin/launch_rate (the overhead section builds it)",
            "FAIL")
        return
    rates = {"native": [], "budget": [], "share 90": []}
    baseline = os.environ.get("DECODE_BASELINE_LIB")
    if baseline:
        rates["share 90, DECODE_BASELINE_LIB"] = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in range(3):
            for label in rates:
                env = clean_env()
                if label != "native":
                    env.update(LD_PRELOAD=baseline if label.endswith("_LIB") else LIB, CUDA_DEVICE_MEMORY_SHARED_CACHE=os.path.join(tmp, f"{label[0]}{n}.cache"),
                               CUDA_DEVICE_MEMORY_LIMIT="8g")
                if label.startswith("share 90"):
                    env["CUDA_DEVICE_SM_LIMIT"] = "90"
                proc, out = start(log, f"launch-{label.split(',')[0].replace(' ', '')}{'-baseline' if ',' in label else ''}",
                                  n, [binary, "200000"], env)
                values = finish(proc, out)
                if values["exit"] != "0" or "launch_per_s" not in values:
                    row("decode", f"launch cost, {label}", "runs", "failed", "FAIL")
                    return
                rates[label].append(float(values["launch_per_s"]))
    per = {label: 1e6 / statistics.median(r) for label, r in rates.items()}
    row("decode", "launch cost: us per cuLaunchKernel " + " / ".join(rates), "",
        " / ".join(f"{per[k]:.3f}" for k in rates), "INFO")
    extra = per["share 90"] - per["budget"]
    row("decode", "launch cost: the share over the budget alone", "<= 0.300 us", f"{extra:.3f} us",
        "PASS" if extra <= 0.3 else "MISS")


if __name__ == "__main__":
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    decode(out_dir)
