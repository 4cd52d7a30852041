"""The copy and contention sections of ci/gpu-compute: prints the table rows as tab-separated lines
`section item target seen verdict` (the format of ci/gpu-compute's rows.tsv) and writes every run's
output under LOG_DIR.

    python3 ci/gpu/contention.py copies LOG_DIR        copy and memset loops under 25/50/75
    python3 ci/gpu/contention.py contention LOG_DIR    saturating containers side by side

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
"""
import os
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


def run_all(log, name, specs, window, sizes):
    """Runs every (kind, limit, preload) at once over one window; returns their key=value dicts."""
    start = time.time() + 10 if window else None
    procs = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (kind, limit, preload) in enumerate(specs):
            env = {k: v for k, v in os.environ.items() if not k.startswith(("CUDA_DEVICE_", "LD_PRELOAD"))}
            env["CUDA_VISIBLE_DEVICES"] = "0"
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


def main():
    section, log = sys.argv[1], sys.argv[2]
    os.makedirs(log, exist_ok=True)
    {"copies": copies, "contention": contention}[section](log)


if __name__ == "__main__":
    main()
