"""The GPU's own view of a contention run: per-process SM utilisation from NVML (`nvidia-smi pmon`),
set beside each process's throughput and the GPU time it measured with its own events.

    python3 ci/gpu/nvml_view.py LOG_DIR

LOG_DIR is what ci/gpu-contention-view wrote: pmon.txt (`nvidia-smi pmon -s u -d 1 -o DT`) and
contention/, the run files of ci/gpu/contention.py (copy_load.py prints pid, measured_from and
elapsed_s). For each process of each group run: its kind and limit, its throughput as a fraction of
its kind's solo native rate, its own measure of GPU time (gpu_share), and the mean of NVML's SM
utilisation samples for its pid inside its measured window; per run, the sum of the NVML figures
(how much of the time some process's kernel was on the GPU).
"""
import glob
import os
import re
import sys
import time


def parse(path):
    values, header = {}, ""
    with open(path) as f:
        for line in f:
            if line.startswith("# ") and not header:
                header = line
            key, sep, value = line.strip().partition("=")
            if sep and not line.startswith("#"):
                values[key] = value
    limit = re.search(r"CUDA_DEVICE_SM_LIMIT=(\d+)", header)
    values["limit"] = limit.group(1) if limit else ("none" if "LD_PRELOAD=" in header else "native")
    return values


def pmon_samples(path):
    """(epoch seconds, pid, sm %) for every sample with a number."""
    samples = []
    with open(path) as f:
        for line in f:
            fields = line.split()
            if line.startswith("#") or len(fields) < 6 or not fields[5].isdigit():
                continue
            stamp = time.mktime(time.strptime(f"{fields[0]} {fields[1]}", "%Y%m%d %H:%M:%S"))
            samples.append((stamp, int(fields[3]), int(fields[5])))
    return samples


def main():
    log = sys.argv[1]
    samples = pmon_samples(os.path.join(log, "pmon.txt"))
    runs = {}
    for path in sorted(glob.glob(os.path.join(log, "contention", "*.txt"))):
        name = os.path.basename(path)[:-4]
        group, _, member = name.rpartition("-")[0].rpartition("-")
        runs.setdefault(group, []).append((name, parse(path)))
    solo = {v.get("kind"): float(v["rate"]) for g, members in runs.items() if g.startswith("solo")
            for _, v in members if v.get("rate")}
    print(f"{'run':<28} {'kind':<7} {'limit':<6} {'of solo':>8} {'own GPU time':>13} {'NVML SM %':>10} {'samples':>8}")
    for group, members in runs.items():
        if group.startswith("solo"):
            continue
        total = 0.0
        for name, v in members:
            if not v.get("pid") or not v.get("measured_from"):
                print(f"{name:<28} no pid or window in the run file")
                continue
            start = float(v["measured_from"])
            end = start + float(v["elapsed_s"])
            # A sample stamped t covers the second before t.
            mine = [sm for t, pid, sm in samples if pid == int(v["pid"]) and start + 1 <= t <= end]
            mean = sum(mine) / len(mine) if mine else float("nan")
            total += mean if mine else 0.0
            share = float(v["rate"]) / solo[v["kind"]] if v.get("kind") in solo else float("nan")
            print(f"{name:<28} {v.get('kind', '?'):<7} {v['limit']:<6} {share:>8.3f} "
                  f"{100 * float(v.get('gpu_share', 'nan')):>12.1f}% {mean:>10.1f} {len(mine):>8}")
        print(f"{group:<28} {'':<7} {'':<6} {'':>8} {'':>13} {total:>10.1f}  (sum)")


if __name__ == "__main__":
    main()
