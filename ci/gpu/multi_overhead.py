"""Does libvgpu cost the same on GPU 1 as on GPU 0? Rows for ci/gpu-multi from two runs of ci/gpu-suite's
micro section (ci/gpu/overhead.cu), one with SUITE_DEVICE=0 and one with SUITE_DEVICE=1.

    python3 ci/gpu/multi_overhead.py DIR0 DIR1 ROWS

DIRk is that run's overhead/micro folder (native-K.txt and vgpu-K.txt per run). For every metric of
the micro benchmark, libvgpu's extra cost on device k is extra_k = median(libvgpu) - median(native)
in ns per operation, and its noise the larger interquartile range of the two sides (report.py's
Sample). Device 1 matches device 0 when |extra_1 - extra_0| <= 100 ns + the larger noise of the two
devices: the suite's own absolute rule (report.py's ABSOLUTE_NS), applied to the difference between
the devices instead of between native and libvgpu. A metric missing on either device is a FAIL.
Appends one row per metric to ROWS (section overhead) and prints the figures.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import report  # noqa: E402  (ci/gpu/report.py: the suite's own parsing and statistics)


def extra(folder, key):
    native = report.Sample([run[key][0] for run in report.runs(folder, "native") if key in run])
    vgpu = report.Sample([run[key][0] for run in report.runs(folder, "vgpu") if key in run])
    if native.median is None or vgpu.median is None:
        return None
    return vgpu.median - native.median, max(native.iqr, vgpu.iqr), native.median


def main():
    dir0, dir1, rows = sys.argv[1:4]
    for key in report.EXPECTED["micro"]:
        label = report.TARGETS[key][0]
        item = f"{label}: libvgpu's extra ns, GPU 1 vs GPU 0"
        target = f"|diff| <= {report.ABSOLUTE_NS:g} ns + noise"
        e0, e1 = extra(dir0, key), extra(dir1, key)
        if e0 is None or e1 is None:
            seen = f"no data on GPU {'0' if e0 is None else '1'}"
            print(f"{item}: {seen}")
            report.append_row(rows, "overhead", item, target, seen, "FAIL")
            continue
        diff, noise = e1[0] - e0[0], max(e0[1], e1[1])
        ok = abs(diff) <= report.ABSOLUTE_NS + noise
        seen = (
            f"GPU0 {e0[0]:+.1f} (native {e0[2]:.1f}), GPU1 {e1[0]:+.1f} (native {e1[2]:.1f}): "
            f"diff {diff:+.1f}, noise {noise:.1f}"
        )
        print(f"{item}: {seen}")
        report.append_row(rows, "overhead", item, target, seen, "PASS" if ok else "FAIL")


if __name__ == "__main__":
    main()
