#!/usr/bin/env python3
"""libvgpu under an OCI runtime on a real GPU (run by ci/gpu-oci; docs/container-budget.md,
"Under an OCI runtime"; issue 35).

  oci_budget.py RUNC SECCOMP_JSON LIBVGPU VGPU_SMI LOG_DIR    the node: two containers, the checks
  oci_budget.py torch                                         the workload, inside a container

Each container's spec is the one tests/oci/mod.rs writes for a Kubernetes pod's container, with
the real driver instead of the fake: the node's root read-only under an overlay (as a snapshotter
gives an image), the node's other mounts below it bound read-only, a writable tmpfs /tmp; the
distribution's default seccomp profile (SECCOMP_JSON, containers-common's) in the spec's form;
Docker's and containerd's default capabilities; containerd's masked and read-only paths; uid 1000;
new pid, mount, ipc, uts and cgroup namespaces; a memory cgroup limit. The NVIDIA container
toolkit's part: the GPU's device nodes (created in the container and allowed in its device
cgroup), the driver's libcuda.so.1 and libnvidia-ml.so.1 bound in /usr/lib/x86_64-linux-gnu and
nvidia-smi in /usr/bin. HAMi's part: libvgpu.so bound read-only at /usr/local/vgpu/libvgpu.so, a
file naming it bound at /etc/ld.so.preload, the container's own folder under the node's
containers folder bound read-write at /usr/local/vgpu, and HAMi's variables.

Two containers, CUDA_DEVICE_MEMORY_LIMIT_0=8g and 16g, each run a PyTorch program that prints
torch.cuda.mem_get_info()'s total, takes 1 GiB tensors until OutOfMemoryError and holds them; then
nvidia-smi runs in each (runc exec, the pod's variables), and vgpu-smi on the node reads the
containers folder. Prints key=value lines and a table (check, expected, seen, PASS/FAIL) last;
exits 1 on a FAIL.
"""
import ctypes
import glob
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time

MIB = 1 << 20
GIB = 1 << 30

# Docker's and containerd's default capabilities: neither CAP_SYS_ADMIN nor CAP_SYS_PTRACE.
DEFAULT_CAPS = ["CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD", "CAP_NET_RAW",
                "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE",
                "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE"]
MASKED = ["/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats", "/proc/timer_list",
          "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi", "/sys/firmware", "/sys/devices/virtual/powercap"]
READ_ONLY = ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"]
TOOLS = "/opt/vgpu-gpu"
MULTIARCH = "/usr/lib/x86_64-linux-gnu"


def workload():
    """Inside a container: what it is given, then 1 GiB tensors until refused, held until killed."""
    status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
    print(f"uid={os.getuid()}")
    print(f"seccomp={status['Seccomp'].strip()}")
    print(f"cap_eff={status['CapEff'].strip()}")
    try:
        open("/rootfs-write-probe", "w")
        print("root_read_only=0")
    except OSError as error:
        print(f"root_read_only={int(error.errno == 30)}")
    print(f"ld_so_preload={open('/etc/ld.so.preload').read().strip()}")
    print(f"keys_masked={int(open('/proc/keys').read() == '')}")
    import torch

    free, total = torch.cuda.mem_get_info()
    print(f"total_mib={total // MIB}\nfree_mib={free // MIB}", flush=True)
    held = []
    refused = 0
    while len(held) < 256:
        try:
            held.append(torch.empty(GIB, dtype=torch.uint8, device="cuda"))
        except torch.OutOfMemoryError as error:
            refused = 1
            print(f"refused_with={str(error).splitlines()[0][:160]}")
            break
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    print(f"tensors_1gib={len(held)}\nrefused={refused}\nfree_after_mib={free // MIB}")
    print("held=1", flush=True)
    while True:
        time.sleep(3600)


def oci_seccomp(profile, caps):
    """containers-common's profile in the spec's form for `caps` (as tests/oci/mod.rs does it)."""
    release = open("/proc/sys/kernel/osrelease").read().strip()

    def numbers(text):
        out = []
        for part in text.replace("-", ".").split(".")[:2]:
            digits = "".join(c for c in part if c.isdigit())
            out.append(int(digits or 0))
        return out

    architectures = ["SCMP_ARCH_X86_64"]
    for entry in profile.get("archMap") or []:
        if entry["architecture"] == "SCMP_ARCH_X86_64":
            architectures += entry.get("subArchitectures") or []
    syscalls = []
    for rule in profile["syscalls"]:
        inc, exc = rule.get("includes") or {}, rule.get("excludes") or {}
        if (not all(c in caps for c in inc.get("caps") or [])
                or (inc.get("arches") and "amd64" not in inc["arches"])
                or (inc.get("minKernel") and numbers(release) < numbers(inc["minKernel"]))
                or any(c in caps for c in exc.get("caps") or [])
                or "amd64" in (exc.get("arches") or [])):
            continue
        out = {"names": rule["names"], "action": rule["action"]}
        if rule.get("args"):
            out["args"] = rule["args"]
        if rule.get("errnoRet") is not None:
            out["errnoRet"] = rule["errnoRet"]
        syscalls.append(out)
    seccomp = {"defaultAction": profile["defaultAction"], "architectures": architectures, "syscalls": syscalls}
    if profile.get("defaultErrnoRet") is not None:
        seccomp["defaultErrnoRet"] = profile["defaultErrnoRet"]
    return seccomp


def loaded_path(soname):
    """Where this machine's loader finds `soname` (the driver's own file)."""
    ctypes.CDLL(soname)
    for line in open("/proc/self/maps"):
        path = line.split()[-1]
        if os.path.basename(path).startswith(soname.split(".so")[0] + ".so"):
            return os.path.realpath(path)
    raise SystemExit(f"{soname} loaded but not found in /proc/self/maps")


def node_mounts(skip):
    """Mount points of the node below / that an overlay of / leaves out (bound read-only)."""
    out = []
    for line in open("/proc/self/mountinfo"):
        point = line.split()[4].replace("\\040", " ")
        if point == "/" or any(point == s or point.startswith(s.rstrip("/") + "/") for s in skip):
            continue
        out.append(point)
    return sorted(set(out))


def device_nodes():
    nodes = []
    for path in sorted(glob.glob("/dev/nvidia*")):
        st = os.stat(path)
        if stat.S_ISCHR(st.st_mode):
            nodes.append((path, os.major(st.st_rdev), os.minor(st.st_rdev)))
    return nodes


def run(command, **kw):
    return subprocess.run(command, capture_output=True, text=True, **kw)


def main(runc, seccomp_json, libvgpu, smi, logs):
    rows = []

    def row(check, expected, seen, ok):
        rows.append(f"{check:<58} {str(expected):<14} {str(seen):<22} {'PASS' if ok else 'FAIL'}")

    def show(key, value):
        print(f"{key}={value}", flush=True)

    work = tempfile.mkdtemp(prefix="vgpu-oci-gpu-")
    # In memory, and on a filesystem other than the node's root, for the overlay's upper layer.
    subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=755", "vgpu-oci-gpu", work], check=True)
    state = os.path.join(work, "state")
    containers = os.path.join(work, "node/usr/local/vgpu/containers")
    os.makedirs(containers)
    os.chmod(containers, 0o777)
    lib = os.path.join(work, "node/usr/local/vgpu/libvgpu.so")
    shutil.copy(libvgpu, lib)
    os.chmod(lib, 0o755)
    preload = os.path.join(work, "ld.so.preload")
    open(preload, "w").write("/usr/local/vgpu/libvgpu.so\n")
    os.chmod(preload, 0o644)
    tools = os.path.join(work, "tools")
    os.makedirs(tools)
    shutil.copy(os.path.abspath(__file__), os.path.join(tools, "oci_budget.py"))
    os.chmod(tools, 0o755)
    os.chmod(os.path.join(tools, "oci_budget.py"), 0o644)
    rootfs, upper, ovwork = (os.path.join(work, d) for d in ("rootfs", "upper", "work"))
    for d in (rootfs, upper, ovwork):
        os.makedirs(d)
    mounted = run(["mount", "-t", "overlay", "vgpu-oci-image", "-o",
                   f"lowerdir=/,upperdir={upper},workdir={ovwork}", rootfs])
    if mounted.returncode != 0:
        raise SystemExit(f"overlay of / failed: {mounted.stderr.strip()}")
    profile = json.load(open(seccomp_json))
    seccomp = oci_seccomp(profile, DEFAULT_CAPS)
    # VGPU_OCI_DRIVER, VGPU_OCI_NVML and VGPU_OCI_NVIDIA_SMI name them instead (a dry run without a GPU).
    driver = os.environ.get("VGPU_OCI_DRIVER") or loaded_path("libcuda.so.1")
    nvml = os.environ.get("VGPU_OCI_NVML") or loaded_path("libnvidia-ml.so.1")
    nvidia_smi = os.environ.get("VGPU_OCI_NVIDIA_SMI") or os.path.realpath(shutil.which("nvidia-smi"))
    python = sys.executable
    extra = node_mounts(["/proc", "/sys", "/dev", "/run", "/var/run", "/tmp", work])
    nodes = device_nodes()
    show("driver", driver)
    show("nvml", nvml)
    show("nvidia_smi", nvidia_smi)
    show("python", python)
    show("node_mounts_bound", ",".join(extra))
    show("device_nodes", ",".join(n for n, _, _ in nodes))
    show("seccomp_rules", len(seccomp["syscalls"]))
    image_env = [f"PATH={os.path.dirname(python)}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                 "HOME=/tmp", "PYTHONUNBUFFERED=1", "PYTHONDONTWRITEBYTECODE=1"]
    if os.environ.get("LD_LIBRARY_PATH"):
        # CUDA images set it (the driver's folders, e.g. /usr/local/nvidia/lib64): the image's variable.
        image_env.append(f"LD_LIBRARY_PATH={os.environ['LD_LIBRARY_PATH']}")
    # uid 1000 as a pod runs, if uid 1000 can run this node's PyTorch; else root, said so.
    probe = run(["setpriv", "--reuid", "1000", "--regid", "1000", "--clear-groups", "env", "HOME=/tmp",
                 python, "-c", "import torch"], timeout=120)
    user = (1000, 1000) if probe.returncode == 0 else (0, 0)
    if user == (0, 0):
        show("uid_1000_refused", probe.stderr.strip().splitlines()[-1:] or probe.returncode)
    show("user", user[0])

    def fits(destination):
        """A mount point the runtime can make: in the overlay, or already there in a node mount."""
        inside = [m for m in extra if destination.startswith(m.rstrip("/") + "/")]
        if inside and not os.path.lexists(destination):
            show("skipped_bind", f"{destination} (no such file in the read-only node mount {inside[-1]})")
            return False
        return True

    def bind(source, destination, rw=False):
        return {"destination": destination, "type": "bind", "source": source,
                "options": ["rbind", "rw" if rw else "ro"]}

    def spec(cid, folder, env, memory_limit):
        mounts = [
            {"destination": "/proc", "type": "proc", "source": "proc", "options": ["nosuid", "noexec", "nodev"]},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
             "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
            {"destination": "/dev/pts", "type": "devpts", "source": "devpts",
             "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"]},
            {"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
             "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]},
            {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue", "options": ["nosuid", "noexec", "nodev"]},
            {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]},
            {"destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup",
             "options": ["nosuid", "noexec", "nodev", "relatime", "ro"]},
            {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs",
             "options": ["nosuid", "nodev", "mode=1777", "size=1048576k"]},
        ]
        mounts += [bind(point, point) for point in extra]
        # The NVIDIA container toolkit's places for the driver's libraries and nvidia-smi.
        for source, destination in [(driver, f"{MULTIARCH}/libcuda.so.1"), (nvml, f"{MULTIARCH}/libnvidia-ml.so.1"),
                                    (nvidia_smi, "/usr/bin/nvidia-smi"), (tools, TOOLS)]:
            if fits(destination):
                mounts.append(bind(source, destination))
        # HAMi's device plugin.
        mounts.append(bind(folder, "/usr/local/vgpu", rw=True))
        mounts.append(bind(lib, "/usr/local/vgpu/libvgpu.so"))
        mounts.append(bind(preload, "/etc/ld.so.preload"))
        devices = [{"path": p, "type": "c", "major": ma, "minor": mi, "fileMode": 0o666, "uid": 0, "gid": 0}
                   for p, ma, mi in nodes]
        allowed = [{"allow": False, "access": "rwm"}] + [
            {"allow": True, "type": "c", "major": ma, "minor": mi, "access": "rwm"} for _, ma, mi in nodes]
        return {
            "ociVersion": "1.0.2",
            "process": process([python, f"{TOOLS}/oci_budget.py", "torch"], env),
            "root": {"path": rootfs, "readonly": True},
            "hostname": cid,
            "mounts": mounts,
            "linux": {
                "namespaces": [{"type": t} for t in ("pid", "mount", "ipc", "uts", "cgroup")],
                "cgroupsPath": f"/vgpu-oci-gpu/{os.getpid()}-{cid}",
                "resources": {"memory": {"limit": memory_limit}, "devices": allowed},
                "devices": devices,
                "seccomp": seccomp,
                "maskedPaths": MASKED,
                "readonlyPaths": READ_ONLY,
            },
        }

    def process(args, env):
        return {"terminal": False, "user": {"uid": user[0], "gid": user[1]}, "args": args, "env": env, "cwd": "/",
                "capabilities": {"bounding": DEFAULT_CAPS, "effective": DEFAULT_CAPS, "permitted": DEFAULT_CAPS},
                "noNewPrivileges": False}

    runtime = [runc, "--root", state]
    pods = [("pod-a", "main", "8g", 8), ("pod-b", "main", "16g", 16)]
    started, seen, pivot = [], {}, []
    try:
        for uid, name, limit, _ in pods:
            cid = f"{uid}-{name}"
            folder = os.path.join(containers, f"{uid}_{name}")
            os.makedirs(folder)
            os.chmod(folder, 0o777)
            env = image_env + [f"CUDA_DEVICE_MEMORY_LIMIT_0={limit}", "CUDA_DEVICE_SM_LIMIT=0",
                               f"CUDA_DEVICE_MEMORY_SHARED_CACHE=/usr/local/vgpu/{uid}.cache",
                               "NVIDIA_VISIBLE_DEVICES=all"]
            bundle = os.path.join(work, "bundles", cid)
            os.makedirs(bundle)
            doc = spec(cid, folder, env, 8 * GIB)
            json.dump(doc, open(os.path.join(bundle, "config.json"), "w"), indent=1)
            json.dump(doc, open(os.path.join(logs, f"{cid}.config.json"), "w"), indent=1)
            out = os.path.join(logs, f"{cid}.out")
            with open(out, "w") as f:
                started.append(cid)
                ran = subprocess.run(runtime + ["run", "--detach"] + pivot + ["--bundle", bundle, cid],
                                     stdin=subprocess.DEVNULL, stdout=f, stderr=f, timeout=120)
            if ran.returncode != 0 and not pivot and "pivot_root" in open(out).read():
                # A root runc cannot pivot away from (an initramfs): --no-pivot, said so.
                show("runc_no_pivot", 1)
                pivot = ["--no-pivot"]
                subprocess.run(runtime + ["delete", "--force", cid], capture_output=True)
                with open(out, "w") as f:
                    ran = subprocess.run(runtime + ["run", "--detach"] + pivot + ["--bundle", bundle, cid],
                                         stdin=subprocess.DEVNULL, stdout=f, stderr=f, timeout=120)
            show(f"{cid}_runc_run_status", ran.returncode)
            if ran.returncode != 0:
                raise SystemExit(f"runc run {cid} failed ({ran.returncode}): {open(out).read()[-2000:]}")
        for uid, name, limit, gib in pods:
            cid = f"{uid}-{name}"
            out = os.path.join(logs, f"{cid}.out")
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline:
                text = open(out).read()
                if "held=1" in text:
                    break
                if json.loads(run(runtime + ["state", cid]).stdout or "{}").get("status") == "stopped":
                    break
                time.sleep(0.2)
            values = dict(line.split("=", 1) for line in open(out).read().splitlines() if "=" in line)
            seen[cid] = values
            for key in ("uid", "seccomp", "cap_eff", "root_read_only", "keys_masked", "total_mib", "tensors_1gib",
                        "refused", "free_after_mib"):
                show(f"{cid}_{key}", values.get(key))
        # nvidia-smi in each container: runc exec with the pod's variables (as kubectl exec has them),
        # and with the runtime's PATH alone (a stripped exec: the region beside the library holds it).
        query = ["nvidia-smi", "--query-gpu=memory.total,memory.used,memory.free", "--format=csv,noheader,nounits"]
        for uid, name, limit, gib in pods:
            cid = f"{uid}-{name}"
            pod_env = image_env + [f"CUDA_DEVICE_MEMORY_LIMIT_0={limit}", "CUDA_DEVICE_SM_LIMIT=0",
                                   f"CUDA_DEVICE_MEMORY_SHARED_CACHE=/usr/local/vgpu/{uid}.cache",
                                   "NVIDIA_VISIBLE_DEVICES=all"]
            stripped = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]
            for tag, args, env in [("smi", query, pod_env), ("full", ["nvidia-smi"], pod_env),
                                   ("stripped", query, stripped)]:
                spec_file = os.path.join(work, "bundles", cid, f"exec-{tag}.json")
                json.dump(process(args, env), open(spec_file, "w"))
                ran = run(runtime + ["exec", "--process", spec_file, cid], timeout=60)
                open(os.path.join(logs, f"{cid}.nvidia-smi-{tag}.txt"), "w").write(ran.stdout + ran.stderr)
                if tag != "full":
                    first = (ran.stdout.strip().splitlines() or [""])[0]
                    show(f"{cid}_nvidia_smi_{tag}", first)
                    seen[cid][tag] = [f.strip() for f in first.split(",")]
        # The node's view.
        table = run([smi, containers], timeout=60)
        open(os.path.join(logs, "vgpu-smi.txt"), "w").write(table.stdout + table.stderr)
        print(table.stdout + table.stderr, flush=True)
        listed = run([smi, "--json", containers], timeout=60)
        open(os.path.join(logs, "vgpu-smi-json.err"), "w").write(listed.stderr)
        view = json.loads(listed.stdout)
        # Which processes' maps the node cannot read (vgpu-smi says so in one line when it meets one).
        refused = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    open(f"/proc/{entry}/maps").close()
                except PermissionError:
                    fields = dict(l.split(":", 1) for l in open(f"/proc/{entry}/status") if ":" in l)
                    refused.append(f"{entry}(NSpid {fields.get('NSpid', '').split()} uid {fields.get('Uid', '').split()[:1]} "
                                   f"{fields.get('Name', '').strip()})")
                except OSError:
                    pass
        show("node_cap_eff", dict(l.split(":", 1) for l in open("/proc/self/status"))["CapEff"].strip())
        show("maps_refused_to_node", " ".join(refused) or "none")
        json.dump(view, open(os.path.join(logs, "vgpu-smi.json"), "w"), indent=1)
        apps = run([nvidia_smi, "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"]).stdout
        open(os.path.join(logs, "node-nvidia-smi.txt"), "w").write(apps + run([nvidia_smi]).stdout)
        nvml_mib = {}
        for line in apps.splitlines():
            fields = [f.strip() for f in line.split(",")]
            if len(fields) == 2 and fields[0].isdigit() and fields[1].isdigit():
                nvml_mib[int(fields[0])] = int(fields[1])
        for uid, name, limit, gib in pods:
            cid = f"{uid}-{name}"
            v = seen[cid]
            tensors = int(v.get("tensors_1gib") or -1)
            row(f"{cid}: mem_get_info total (MiB)", gib * 1024, v.get("total_mib"), v.get("total_mib") == str(gib * 1024))
            row(f"{cid}: 1 GiB tensors before OutOfMemoryError", f"{gib - 1}..{gib}", f"{tensors} (refused={v.get('refused')})",
                gib - 1 <= tensors <= gib and v.get("refused") == "1")
            smi_total = (v.get("smi") or ["?"])[0]
            row(f"{cid}: nvidia-smi inside, memory.total (MiB)", gib * 1024, smi_total, smi_total == str(gib * 1024))
            stripped_total = (v.get("stripped") or ["?"])[0]
            row(f"{cid}: nvidia-smi, exec with PATH only, total (MiB)", gib * 1024, stripped_total,
                stripped_total == str(gib * 1024))
            shown = next((c for c in view.get("containers", [])
                          if c.get("pod_uid") == uid and c.get("container") == name), None)
            device = ((shown or {}).get("region") or {}).get("devices", [{}])[0]
            procs = [p for p in ((shown or {}).get("region") or {}).get("processes", []) if p.get("alive")]
            budget, used = device.get("budget"), device.get("used") or 0
            row(f"{cid}: vgpu-smi on the node, budget (MiB)", gib * 1024, None if budget is None else budget // MIB,
                budget == gib * GIB)
            row(f"{cid}: vgpu-smi on the node, used >= tensors (MiB)", f">= {max(tensors, 0) * 1024}", used // MIB,
                tensors > 0 and used >= tensors * GIB and used <= gib * GIB)
            hosts = [p.get("host_pid") for p in procs]
            real = sum(nvml_mib.get(h, 0) for h in hosts if h)
            row(f"{cid}: its live process(es) with host pid, NVML MiB", "1, > 0", f"{len(procs)} {hosts} {real}",
                len(procs) >= 1 and all(hosts) and real > 0)
            row(f"{cid}: restrictions (uid, Seccomp, CapEff, ro root)",
                f"{user[0]},2,{'0' * 16 if user[0] else 'default'},1",
                f"{v.get('uid')},{v.get('seccomp')},{v.get('cap_eff')},{v.get('root_read_only')}",
                v.get("uid") == str(user[0]) and v.get("seccomp") == "2" and v.get("root_read_only") == "1"
                and (user[0] == 0 or v.get("cap_eff") == "0" * 16))
    finally:
        for cid in started:
            run(runtime + ["kill", "--all", cid, "KILL"])
            for _ in range(50):
                run(runtime + ["delete", "--force", cid])
                if run(runtime + ["state", cid]).returncode != 0:
                    break
                time.sleep(0.1)
        run(["umount", "--lazy", rootfs])
        run(["umount", "--lazy", work])
        try:
            os.rmdir(work)
        except OSError:
            pass
        for group in glob.glob("/sys/fs/cgroup/vgpu-oci-gpu") + glob.glob("/sys/fs/cgroup/*/vgpu-oci-gpu"):
            try:
                os.rmdir(group)
            except OSError:
                pass
    print(f"{'check':<58} {'expected':<14} {'seen':<22} verdict")
    print("\n".join(rows))
    return 1 if any(r.endswith("FAIL") for r in rows) or not rows else 0


if __name__ == "__main__":
    if sys.argv[1:] == ["torch"]:
        workload()
    elif len(sys.argv) == 6:
        sys.exit(main(*sys.argv[1:]))
    else:
        sys.exit(__doc__)
