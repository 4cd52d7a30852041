"""The copy and contention sections of ci/gpu-compute: prints the table rows as tab-separated lines
`section item target seen verdict` (the format of ci/gpu-compute's rows.tsv) and writes every run's
output under LOG_DIR.

    python3 ci/gpu/contention.py copies LOG_DIR        copy and memset loops under 25/50/75
    python3 ci/gpu/contention.py contention LOG_DIR    saturating containers side by side
    python3 ci/gpu/contention.py mps LOG_DIR           the same under an MPS server of its own

Every workload is ci/gpu/copy_load.py (matmul, dtod, memset). A limited run has LD_PRELOAD=LIB
(default target/release/libvgpu.so), its own region file (one container each) and
CUDA_DEVICE_SM_LIMIT; a native run has neither. Settings: COMPUTE_SECONDS (measured seconds of a
run, default 5), COMPUTE_LIMITS (25 50 75), CONTENTION_GROUPS (the groups below, by name),
COMPUTE_STEP_TIMEOUT (60),
COPY_MIB and COMPUTE_MATMUL_N (SIZES below gives each section's defaults).

copies: for dtod and memset, a native run, a run under libvgpu with no limit, and one per limit,
each alone. Rows: share of GPU time (the workload's own step times, as compute_share.py takes them)
within 3 points of the limit; throughput vs native (INFO); no limit vs native, within 2 %.

contention: each group runs its processes at once over one window, three ways: all native, all
under libvgpu unlimited, and all under their limits. A process's figure is its throughput as a
fraction of its kind's native solo rate (measured first). The native group's total T is what the
driver's time-slicing gives unlimited processes; the limited group must reach 0.95 T together,
and each process's part of what the group got must be its limit within 3 points (an unlimited
process: what the limits leave).

mps: starts its own MPS control daemon (`nvidia-cuda-mps-control -d`, pipes and logs under
LOG_DIR/mps-daemon, stopped with `quit` at the end, whatever happened), and runs every client with
that CUDA_MPS_PIPE_DIRECTORY. Groups of 4096² matmul loops over one window each: one process alone
under MPS (the reference), the native pair, the pair at libvgpu shares 30/70 and the trio at
20/30/50 (time shares alone, then each with the MPS thread percentage set to its share: the two
combined), the pair and the trio at MPS thread percentages alone (no libvgpu), a process with a
share of 30 and a thread percentage of 30 beside an unlimited one (it must get its 30 % of one
process alone, not the product of the two), and one with a share of 30 and a thread percentage of
20 (held under its share, INFO). Rows: each process's part of its group's total within 3 points of
its share, the group's total >= 0.95 of one process alone under MPS; that libvgpu sees MPS (its
debug line), takes each capped context's part of the SMs, says the combination at info level and
warns of a cap under the share; a PyTorch process under an 8g budget under MPS: refused at the
budget, `mem_get_info` total 8 GiB; and, with target/release/vgpu-smi present, `vgpu-smi doctor`
saying MPS is active on GPU 0 and `vgpu_physical_mps_clients` at least 1 while a client holds a
context.
"""
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
LOAD = os.path.join(HERE, "copy_load.py")
LIB = os.environ.get("LIBVGPU", os.path.join(HERE, "..", "..", "target", "release", "libvgpu.so"))
SECONDS = float(os.environ.get("COMPUTE_SECONDS", "5"))
LIMITS = [int(v) for v in os.environ.get("COMPUTE_LIMITS", "25 50 75").split()]
TIMEOUT = float(os.environ.get("COMPUTE_STEP_TIMEOUT", "60"))
SHARE_TOLERANCE = 3.0  # points
# Workload sizes per section unless the caller set them. copies: 4 GiB copies (a step's GPU time as
# the workload measures it is off by some 30 µs, 1 % of such a step). contention: 1 GiB copies and
# 4096² matmuls, between which the driver switches contexts often, as in the run that showed the
# lost throughput. docs/compute-limit.md has what 4 GiB copies do there.
SIZES = {
    "copies": {"COPY_MIB": "4096"},
    "contention": {"COPY_MIB": "1024", "COMPUTE_MATMUL_N": "4096"},
}
PAIR_TOTAL = 0.95
# name: [(kind, limit)...]; None = no limit (the process still runs under libvgpu in the limited group)
GROUPS = {
    "mm30+mm70": [("matmul", 30), ("matmul", 70)],
    "dtod30+mm70": [("dtod", 30), ("matmul", 70)],
    "mm20+mm30+mm50": [("matmul", 20), ("matmul", 30), ("matmul", 50)],
    "free+mm30": [("matmul", None), ("matmul", 30)],
}


def parse(path):
    values = {}
    with open(path) as f:
        for line in f:
            key, sep, value = line.strip().partition("=")
            if sep:
                values[key] = value
    return values


def run_all(log, name, specs, window, sizes, extra=None):
    """Runs every (kind, limit, preload[, env]) at once over one window; returns their key=value
    dicts. `extra` is added to every process's environment, a spec's own env to its process's."""
    start = time.time() + 10 if window else None
    procs = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (kind, limit, preload, *own) in enumerate(specs):
            env = {k: v for k, v in os.environ.items() if not k.startswith(("CUDA_DEVICE_", "LD_PRELOAD", "CUDA_MPS_"))}
            env["CUDA_VISIBLE_DEVICES"] = "0"
            env.update(extra or {})
            for more in own:
                env.update(more)
            env.update({k: os.environ.get(k, v) for k, v in sizes.items()})
            if preload:
                env["LD_PRELOAD"] = LIB
                env["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = os.path.join(tmp, f"{i}.cache")
                if limit:
                    env["CUDA_DEVICE_SM_LIMIT"] = str(limit)
            args = [sys.executable, LOAD, kind, str(SECONDS)] + ([f"{start:.3f}"] if start else [])
            out = open(os.path.join(log, f"{name.replace('+', '_')}-{i}-{kind}.txt"), "w")
            settings = " ".join(f"{k}={env[k]}" for k in sorted(env) if k.startswith(("CUDA_", "LD_PRELOAD", "LIBVGPU")))
            out.write(f"# {settings} {' '.join(args)}\n")
            out.flush()
            procs.append((subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT), out))
        results = []
        for proc, out in procs:
            try:
                code = proc.wait(timeout=TIMEOUT + SECONDS + 15)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = "timeout"
            out.write(f"# exit {code}\n")
            out.close()
            values = parse(out.name)
            values["exit"] = str(code)
            results.append(values)
    return results


def row(section, item, target, seen, verdict):
    print(f"{section}\t{item}\t{target}\t{seen}\t{verdict}", flush=True)


def failed(results):
    return [r for r in results if r.get("exit") != "0" or "error" in r or not r.get("rate")]


def copies(log):
    for kind in ("dtod", "memset"):
        native = run_all(log, f"{kind}-native", [(kind, None, False)], False, SIZES["copies"])
        free = run_all(log, f"{kind}-nolimit", [(kind, None, True)], False, SIZES["copies"])
        limited = {lim: run_all(log, f"{kind}-limit{lim}", [(kind, lim, True)], False, SIZES["copies"]) for lim in LIMITS}
        everything = native + free + [r for rs in limited.values() for r in rs]
        if failed(everything):
            row("copies", f"{kind} loop", "runs", f"a run failed: {failed(everything)[0]}", "FAIL")
            continue
        base = float(native[0]["rate"])
        ratio = float(free[0]["rate"]) / base
        row("copies", f"{kind} loop, native", "", f"{float(native[0]['bytes_per_s']) / 1e9:.1f} GB/s, "
            f"GPU time {100 * float(native[0]['gpu_share']):.1f} %", "INFO")
        row("copies", f"{kind} loop, libvgpu without a limit, rate vs native", ">= 98 %", f"{100 * ratio:.1f} %",
            "PASS" if ratio >= 0.98 else "MISS")
        for lim, (r,) in limited.items():
            share = 100 * float(r["gpu_share"])
            row("copies", f"{kind} loop, limit {lim}, share of GPU time", f"{lim} ± 3", f"{share:.1f} %",
                "PASS" if abs(share - lim) <= SHARE_TOLERANCE else "MISS")
            row("copies", f"{kind} loop, limit {lim}, throughput vs native", "", f"{100 * float(r['rate']) / base:.1f} %",
                "INFO")


def contention(log):
    wanted = os.environ.get("CONTENTION_GROUPS", " ".join(GROUPS)).split()
    kinds = sorted({kind for name in wanted for kind, _ in GROUPS[name]})
    solo = {}
    for kind in kinds:
        (r,) = run_all(log, f"solo-{kind}", [(kind, None, False)], True, SIZES["contention"])
        if failed([r]):
            row("contention", f"{kind} solo", "runs", "failed", "FAIL")
            return
        solo[kind] = float(r["rate"])
        row("contention", f"{kind} alone, native", "", f"{solo[kind]:.2f} steps/s", "INFO")
    for name in wanted:
        members = GROUPS[name]
        ways = {
            "native": [(k, None, False) for k, _ in members],
            "libvgpu, no limits": [(k, None, True) for k, _ in members],
            "libvgpu, limits": [(k, lim, True) for k, lim in members],
        }
        fractions = {}
        for way, specs in ways.items():
            results = run_all(log, f"{name}-{way.split(',')[-1].strip().replace(' ', '')}", specs, True, SIZES["contention"])
            if failed(results):
                row("contention", f"{name}, {way}", "runs", "a run failed", "FAIL")
                break
            fractions[way] = [float(r["rate"]) / solo[k] for r, (k, _) in zip(results, members)]
        if len(fractions) < 3:
            continue
        total = sum(fractions["native"])
        free = sum(fractions["libvgpu, no limits"])
        limited = fractions["libvgpu, limits"]
        row("contention", f"{name}: native, each of its solo rate", "",
            " + ".join(f"{f:.3f}" for f in fractions["native"]) + f" = {total:.3f}", "INFO")
        row("contention", f"{name}: libvgpu without limits, total vs native", "", f"{free / total:.3f}", "INFO")
        ratio = sum(limited) / total
        row("contention", f"{name}: under limits, total vs native", f">= {PAIR_TOTAL}",
            " + ".join(f"{f:.3f}" for f in limited) + f" = {sum(limited):.3f}; {ratio:.3f} of native",
            "PASS" if ratio >= PAIR_TOTAL else "MISS")
        fixed = sum(lim for _, lim in members if lim)
        for (kind, lim), f in zip(members, limited):
            want = lim if lim else 100 - fixed  # an unlimited process gets what the others leave
            got = 100 * f / sum(limited)
            row("contention", f"{name}: {kind} {'limit ' + str(lim) if lim else 'unlimited'}, % of the group's total",
                f"{want} ± 3", f"{got:.1f}", "PASS" if abs(got - want) <= SHARE_TOLERANCE else "MISS")


MPS_SIZES = {"COMPUTE_MATMUL_N": "4096"}
MPS_TOLERANCE = 3.0  # points of the group's total
MPS_TOTAL = 0.95  # of one process alone under MPS
# name: [(limit, thread percentage)...]; None = not set
MPS_GROUPS = {
    "native pair": [(None, None), (None, None)],
    "libvgpu 30/70": [(30, None), (70, None)],
    "libvgpu 20/30/50": [(20, None), (30, None), (50, None)],
    "libvgpu 30/70 + threads 30/70": [(30, 30), (70, 70)],
    "libvgpu 20/30/50 + threads 20/30/50": [(20, 20), (30, 30), (50, 50)],
    "MPS threads 30/70": [(None, 30), (None, 70)],
    "MPS threads 20/30/50": [(None, 20), (None, 30), (None, 50)],
    "libvgpu 30 + threads 30, beside an unlimited one": [(30, 30), (None, None)],
    "libvgpu 30 + threads 20, beside an unlimited one": [(30, 20), (None, None)],
}
MEMORY_PROBE = """
import torch
free, total = torch.cuda.mem_get_info()
print(f"mem_total={total}", flush=True)
held, chunk = [], 256 << 20
try:
    while len(held) < 4096:
        held.append(torch.empty(chunk, dtype=torch.uint8, device="cuda"))
except RuntimeError as error:
    print("refused=1")
print(f"held_bytes={len(held) * chunk}")
"""


def mps_daemon(log, start):
    """Starts (or, with start False, stops) the control daemon of LOG's own pipe directory."""
    pipes, logs = os.path.join(log, "mps-daemon", "pipe"), os.path.join(log, "mps-daemon", "log")
    os.makedirs(pipes, exist_ok=True)
    os.makedirs(logs, exist_ok=True)
    env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=pipes, CUDA_MPS_LOG_DIRECTORY=logs, CUDA_VISIBLE_DEVICES="0")
    if start:
        done = subprocess.run(["nvidia-cuda-mps-control", "-d"], env=env, capture_output=True, text=True, timeout=30)
        time.sleep(1)
        return done.returncode, (done.stdout + done.stderr).strip(), pipes
    done = subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", env=env, capture_output=True, text=True,
                          timeout=30)
    return done.returncode, (done.stdout + done.stderr).strip(), pipes


def mps(log):
    try:
        code, said, pipes = mps_daemon(log, True)
    except (OSError, subprocess.SubprocessError) as error:
        row("mps", "MPS control daemon", "starts", f"cannot run nvidia-cuda-mps-control: {error}", "FAIL")
        return
    if code != 0:
        row("mps", "MPS control daemon", "starts", f"exit {code}: {said}", "FAIL")
        return
    try:
        mps_groups(log, {"CUDA_MPS_PIPE_DIRECTORY": pipes})
    finally:
        code, said, _ = mps_daemon(log, False)
        if code != 0:
            row("mps", "MPS control daemon", "stops", f"exit {code}: {said}", "FAIL")


def mps_groups(log, mps_env):
    (alone,) = run_all(log, "mps-solo", [("matmul", None, False)], True, MPS_SIZES, mps_env)
    if failed([alone]):
        row("mps", "one process alone under MPS", "runs", f"failed: {alone}", "FAIL")
        return
    solo = float(alone["rate"])
    row("mps", "4096² bf16 matmul loop, one process alone under MPS", "", f"{solo:.1f} steps/s", "INFO")
    for name, members in MPS_GROUPS.items():
        specs = []
        for limit, threads in members:
            own = {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(threads)} if threads else {}
            if limit:
                own["LIBCUDA_LOG_LEVEL"] = "4"
            specs.append(("matmul", limit, limit is not None, own))
        tag = name.split(",")[0].replace(" ", "_").replace("/", "-").replace("+", "and")
        results = run_all(log, f"mps-{tag}", specs, True, MPS_SIZES, mps_env)
        if failed(results):
            row("mps", name, "runs", "a run failed", "FAIL")
            continue
        fractions = [float(r["rate"]) / solo for r in results]
        total = sum(fractions)
        parts = " + ".join(f"{f:.3f}" for f in fractions)
        if "beside an unlimited one" in name:
            # The limited process against one process alone: its share when the cap is at least
            # the share, the cap when it is under it (INFO).
            (limit, threads), f = members[0], fractions[0]
            want = min(limit, threads)
            verdict = "INFO" if threads < limit else ("PASS" if abs(100 * f - want) <= MPS_TOLERANCE else "MISS")
            row("mps", f"{name}: the limited one, % of one alone", "" if verdict == "INFO" else f"{want} ± 3",
                f"{100 * f:.1f} (together {parts} = {total:.3f})", verdict)
            continue
        verdict = "INFO" if name == "native pair" else ("PASS" if total >= MPS_TOTAL else "MISS")
        row("mps", f"{name}: each of one alone, total", "" if verdict == "INFO" else f">= {MPS_TOTAL}",
            f"{parts} = {total:.3f}", verdict)
        if name == "native pair":
            continue
        for (limit, threads), f in zip(members, fractions):
            want = limit or threads
            got = 100 * f / total
            row("mps", f"{name}: {want} % process, % of the group's total", f"{want} ± 3",
                f"{got:.1f} ({100 * f:.1f} % of one alone)", "PASS" if abs(got - want) <= MPS_TOLERANCE else "MISS")
    # What libvgpu said: MPS seen at start, each capped context's SMs, the combination, the warning.
    logs = [os.path.join(log, f) for f in os.listdir(log) if f.startswith("mps-") and f.endswith(".txt")]
    text = ""
    for path in logs:
        with open(path, errors="replace") as f:
            text += f.read()
    row("mps", "libvgpu's debug line: contexts run under MPS", "present",
        "present" if "contexts run under MPS (CU_DEVICE_ATTRIBUTE_MPS_ENABLED=1" in text else "absent",
        "PASS" if "contexts run under MPS" in text else "FAIL")
    caps = sorted({float(m.group(1)) for m in re.finditer(r"may use ([0-9.]+) % of the SMs", text)})
    ok = all(any(abs(cap - want) <= 3 for cap in caps) for want in (20, 30, 50, 70))
    row("mps", "libvgpu's part of the SMs for each capped context (thread % 20/30/50/70)", "each within 3 points",
        ", ".join(f"{cap:.1f} %" for cap in caps) or "absent", "PASS" if ok else "FAIL")
    combined = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30 are both set" in text and "the container gets its share" in text
    row("mps", "share and thread percentage at the share: the combination said", "present",
        "present" if combined else "absent", "PASS" if combined else "FAIL")
    warned = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=20 are both set" in text and "holds the container under its share" in text
    row("mps", "thread percentage under the share: warning naming both", "present",
        "present" if warned else "absent", "PASS" if warned else "FAIL")
    # Budgets held under MPS.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CUDA_DEVICE_", "LD_PRELOAD", "CUDA_MPS_"))}
    with tempfile.TemporaryDirectory() as tmp:
        env.update(mps_env, CUDA_VISIBLE_DEVICES="0", LD_PRELOAD=LIB, CUDA_DEVICE_MEMORY_LIMIT="8g",
                   CUDA_DEVICE_MEMORY_SHARED_CACHE=os.path.join(tmp, "memory.cache"))
        path = os.path.join(log, "mps-memory.txt")
        with open(path, "w") as out:
            out.write("# CUDA_DEVICE_MEMORY_LIMIT=8g under MPS, 256 MiB tensors until refused\n")
            out.flush()
            try:
                code = subprocess.run([sys.executable, "-c", MEMORY_PROBE], env=env, stdout=out,
                                      stderr=subprocess.STDOUT, timeout=TIMEOUT).returncode
            except subprocess.TimeoutExpired:
                code = "timeout"
            out.write(f"# exit {code}\n")
    r = parse(path)
    held, total = int(r.get("held_bytes", "0")), int(r.get("mem_total", "0"))
    mps_views(log, mps_env)
    ok = code == 0 and r.get("refused") == "1" and 0 < held <= 8 << 30 and total == 8 << 30
    row("mps", "8g budget under MPS: held when refused, mem_get_info total", "<= 8192 MiB, 8192 MiB",
        f"{held >> 20} MiB, {total >> 20} MiB", "PASS" if ok else "FAIL")


SMI = os.path.join(HERE, "..", "..", "target", "release", "vgpu-smi")
SLEEPER = """
import time, torch
torch.zeros(1, device="cuda")
print("ready", flush=True)
time.sleep(20)
"""


def mps_views(log, mps_env):
    """vgpu-smi under MPS, while one client holds a context: doctor's line, the metric."""
    if not os.path.exists(SMI):
        row("mps", "vgpu-smi doctor and metrics under MPS", "run", f"{SMI} missing: not run", "INFO")
        return
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CUDA_DEVICE_", "LD_PRELOAD", "CUDA_MPS_"))}
    env.update(mps_env, CUDA_VISIBLE_DEVICES="0")
    sleeper = subprocess.Popen([sys.executable, "-c", SLEEPER], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    try:
        ready = sleeper.stdout.readline().strip() == "ready"
        outputs = {}
        for name, args in (("doctor", ["doctor", "--library", os.path.abspath(LIB), os.path.join(log, "none.cache")]),
                           ("metrics", ["metrics", os.path.join(log, "none.cache")])):
            try:
                done = subprocess.run([SMI] + args, env=env, capture_output=True, text=True, timeout=60)
                outputs[name] = done.stdout + done.stderr
            except (OSError, subprocess.SubprocessError) as error:
                outputs[name] = f"error={error}"
            with open(os.path.join(log, f"mps-vgpu-smi-{name}.txt"), "w") as out:
                out.write(outputs[name])
    finally:
        sleeper.kill()
        sleeper.wait()
    line = next((l for l in outputs["doctor"].splitlines() if l.startswith("MPS on device 0:")), "no MPS line")
    row("mps", "vgpu-smi doctor under MPS", "MPS on device 0: active", line,
        "PASS" if line.startswith("MPS on device 0: active") else "FAIL")
    sample = next((l for l in outputs["metrics"].splitlines() if l.startswith("vgpu_physical_mps_clients{")), "")
    clients = sample.rsplit(" ", 1)[-1] if sample else "absent"
    row("mps", "vgpu_physical_mps_clients of GPU 0 with one client holding a context", ">= 1",
        f"{clients}{'' if ready else ' (the client did not start)'}",
        "PASS" if clients.isdigit() and int(clients) >= 1 else "FAIL")


def main():
    section, log = sys.argv[1], sys.argv[2]
    os.makedirs(log, exist_ok=True)
    {"copies": copies, "contention": contention, "mps": mps}[section](log)


if __name__ == "__main__":
    main()
