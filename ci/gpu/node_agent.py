#!/usr/bin/env python3
"""The node agent on a real GPU (run by ci/gpu-node-agent; results: docs/node-agent.md, "On a GPU").

  node_agent.py LIBVGPU VGPU_SMI LOG_DIR      the driver: builds the node, runs the checks
  node_agent.py gl MIB_PER_TEXTURE COUNT      a workload: OpenGL only (EGL, headless, moderngl)
  node_agent.py cuda-gl MIB_PER_TEXTURE COUNT a workload: PyTorch touches CUDA first, then OpenGL

A workload prints ready=1 once its textures exist and then sleeps until killed.
Containers: a folder under NODE/containers bound at /usr/local/vgpu in new mount and pid
namespaces (unshare), a cgroup v2 group each, libvgpu preloaded with a 2 GiB budget.
Prints key=value lines and a table (check, expected, seen, PASS/FAIL) last; exits 1 on a FAIL.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

MIB = 1 << 20


def workload(mode, mib, count):
    if mode == "cuda-gl":
        import torch

        keep = torch.ones(64 * MIB // 4, device="cuda")  # CUDA first: libvgpu starts
        torch.cuda.synchronize()
    import moderngl

    ctx = moderngl.create_context(standalone=True, backend="egl")
    side = int((mib * MIB // 4) ** 0.5)
    textures = []
    for _ in range(count):
        texture = ctx.texture((side, side), 4)
        fbo = ctx.framebuffer(color_attachments=[texture])
        fbo.use()
        ctx.clear(0.5, 0.5, 0.5, 1.0)
        textures.append((texture, fbo))
    ctx.finish()
    print("ready=1", flush=True)
    while True:
        time.sleep(3600)


CONTAINER = r"""
set -euo pipefail
echo $$ > "$T_CGROUP/cgroup.procs"
# Python's packages may live under /usr/local: bind over /usr/local/vgpu only (made if absent,
# an empty folder on the machine, as on a HAMi node).
mkdir -p /usr/local/vgpu
mount --bind "$T_CONTAINER" /usr/local/vgpu
LD_PRELOAD="$T_LIB" python3 "$T_SELF" $T_WORK > "$T_OUT" 2> "$T_OUT.err" &
workload=$!
until grep -q '^ready=' "$T_OUT" 2> /dev/null; do
    kill -0 $workload 2> /dev/null || { echo "failed"; exit 1; }
    sleep 0.1
done
echo started
wait
"""


def cgroup2_root():
    for line in open("/proc/self/mounts"):
        fields = line.split()
        if fields[2] == "cgroup2":
            return fields[1]
    raise SystemExit("no cgroup v2 mount")


def smi_json(smi, containers):
    out = subprocess.run([smi, "--json", containers], capture_output=True, text=True, timeout=60)
    return json.loads(out.stdout)


def accounting(doc, name):
    for container in doc["accounting"]["containers"]:
        if container["name"] == name:
            return container
    return None


def nvml_bytes(pids):
    """NVML's per-process figure (bytes) for host pids, from nvidia-smi."""
    out = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
        capture_output=True, text=True).stdout
    gfx = subprocess.run(["nvidia-smi", "-q", "-d", "PIDS"], capture_output=True, text=True).stdout
    seen = {}
    for line in out.splitlines():
        pid, used = [f.strip() for f in line.split(",")]
        seen[int(pid)] = int(used) * MIB
    pid = None
    for line in gfx.splitlines():
        line = line.strip()
        if line.startswith("Process ID"):
            pid = int(line.split(":")[1])
        elif line.startswith("Used GPU Memory") and pid is not None and "MiB" in line:
            seen.setdefault(pid, int(line.split(":")[1].split()[0]) * MIB)
    return sum(seen.get(p, 0) for p in pids)


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def main(libvgpu, smi, logs):
    rows = []

    def row(check, expected, seen, ok):
        rows.append(f"{check:<62} {expected:<16} {str(seen):<16} {'PASS' if ok else 'FAIL'}")

    node = tempfile.mkdtemp(prefix="vgpu-node-agent-")
    containers = os.path.join(node, "containers")
    cgroot = os.path.join(cgroup2_root(), f"vgpu-node-agent-{os.getpid()}")
    shells, groups = [], []

    def start(name, work):
        folder = os.path.join(containers, name)
        os.makedirs(folder)
        group = os.path.join(cgroot, name)
        os.makedirs(group)
        groups.append(group)
        env = dict(os.environ, T_CGROUP=group, T_CONTAINER=folder, T_LIB=libvgpu, T_SELF=os.path.abspath(__file__),
                   T_WORK=work, T_OUT=os.path.join(logs, f"{name}.out"),
                   CUDA_DEVICE_MEMORY_LIMIT_0="2g", CUDA_DEVICE_MEMORY_SHARED_CACHE="/usr/local/vgpu/region.cache")
        shell = subprocess.Popen(["unshare", "--mount", "--pid", "--fork", "--mount-proc", "bash", "-c", CONTAINER],
                                 env=env, stdout=subprocess.PIPE, text=True)
        line = shell.stdout.readline()
        shells.append(shell)
        if line.strip() != "started":
            raise SystemExit(f"container {name} did not start; see {logs}/{name}.out.err")

    try:
        # Natively (no agent): what NVML counts for one OpenGL-only process of 24 x 256 MiB.
        start("pod-gl_main", "gl 256 24")
        start("pod-cudagl_main", "cuda-gl 256 24")
        start("pod-n_main", "gl 64 4")
        time.sleep(2)
        doc = smi_json(smi, containers)
        with open(os.path.join(logs, "view.json"), "w") as f:
            json.dump(doc, f, indent=1)
        for name in ["pod-gl_main", "pod-cudagl_main"]:
            acc = accounting(doc, name)
            pids = [p["host_pid"] for p in (acc or {}).get("processes", [])]
            nvml = nvml_bytes(pids)
            unacc = sum(d["unaccounted"] for d in (acc or {}).get("devices", []))
            known = sum(d["known"] for d in (acc or {}).get("devices", []))
            print(f"{name}_nvml_mib={nvml // MIB}\n{name}_unaccounted_mib={unacc // MIB}\n{name}_known_mib={known // MIB}")
            # GL only: all of it unaccounted; CUDA first: the reconciliation charged it (known).
            want = unacc if name == "pod-gl_main" else unacc + known
            row(f"{name}: unaccounted(+known) vs NVML (MiB)", "within 64", f"{want // MIB}/{nvml // MIB}",
                abs(want - nvml) <= 64 * MIB)
        # report: within 2 s of serve starting, an event names the over-budget container.
        serve = subprocess.Popen([smi, "serve", "--listen", "127.0.0.1:0", "--no-reclaim", "--policy", "report",
                                  "--grace", "0.5", containers], stderr=subprocess.PIPE, text=True)
        time.sleep(2.0)
        serve.kill()
        report = serve.communicate()[1]
        open(os.path.join(logs, "report.err"), "w").write(report)
        row("report: an event for pod-gl_main within 2 s", "yes", "pod-gl_main" in report,
            "policy report: container pod-gl_main" in report)
        # kill-newest: the offenders go within the grace period plus 2 s; the neighbour lives.
        doc = smi_json(smi, containers)
        gl_pids = [p["host_pid"] for p in accounting(doc, "pod-gl_main")["processes"]]
        cudagl_pids = [p["host_pid"] for p in accounting(doc, "pod-cudagl_main")["processes"]]
        n_pids = [p["host_pid"] for p in accounting(doc, "pod-n_main")["processes"]]
        grace = 3.0
        started = time.monotonic()
        serve = subprocess.Popen([smi, "serve", "--listen", "127.0.0.1:0", "--no-reclaim", "--policy", "kill-newest",
                                  "--margin", "64m", "--grace", str(grace), containers],
                                 stderr=subprocess.PIPE, text=True)
        while any(alive(p) for p in gl_pids + cudagl_pids) and time.monotonic() - started < grace + 2:
            time.sleep(0.05)
        gone_after = time.monotonic() - started
        time.sleep(2)
        serve.kill()
        killed = serve.communicate()[1]
        open(os.path.join(logs, "kill-newest.err"), "w").write(killed)
        row("kill-newest: OpenGL-only offender gone", "yes", not any(alive(p) for p in gl_pids),
            not any(alive(p) for p in gl_pids))
        row("kill-newest: OpenGL-after-CUDA offender gone", "yes", not any(alive(p) for p in cudagl_pids),
            not any(alive(p) for p in cudagl_pids))
        row("kill-newest: both gone within (s)", f"<= {grace + 2}", f"{gone_after:.2f}",
            not any(alive(p) for p in gl_pids + cudagl_pids))
        row("kill-newest: neighbour container alive", "yes", all(alive(p) for p in n_pids),
            all(alive(p) for p in n_pids))
    finally:
        for shell in shells:
            shell.kill()
        for group in groups:
            try:
                open(os.path.join(group, "cgroup.kill"), "w").write("1")
            except OSError:
                pass
        time.sleep(0.5)
        for group in groups:
            try:
                os.rmdir(group)
            except OSError:
                pass
        try:
            os.rmdir(cgroot)
        except OSError:
            pass
        shutil.rmtree(node, ignore_errors=True)
    print(f"{'check':<62} {'expected':<16} {'seen':<16} verdict")
    print("\n".join(rows))
    return 1 if any(r.endswith("FAIL") for r in rows) else 0


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] in ("gl", "cuda-gl"):
        workload(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
    elif len(sys.argv) == 4:
        sys.exit(main(*sys.argv[1:]))
    else:
        sys.exit(__doc__)
