"""The two halves of ci/gpu-kai (KAI-Scheduler's layout on a GPU, issue 48).

  kai_layout.py probe OUT GO     in a pod: what the card looks like, then 1 GiB tensors until
                                 OutOfMemoryError; writes OUT (JSON) and holds the tensors until the
                                 file GO exists
  kai_layout.py monitor NODE     KAI's monitor's rules (pkg/monitor/nvidia/cudevshr.go in
                                 KAI-resource-isolator) applied to the node's folder: directories
                                 named <uid>_<name> under containers/, usage.cache only, v0 by its
                                 exact size, v1 by major version 1; prints JSON
"""

import json
import os
import struct
import sys
import time

GIB = 1 << 30
MAGIC = 19920718
V0_SIZE = 1197897
V1_SIZE = 2008952
LIMIT_0 = 1600
SLOTS, SLOT_SIZE, SLOT_TOTAL_0, SLOT_STATUS = 1856, 1960, 40, 1928
PROC_NUM = 2008896


def probe(out, go):
    import torch

    free, total = torch.cuda.mem_get_info()
    held = []
    error = ""
    try:
        while len(held) < 1024:
            held.append(torch.empty(GIB, dtype=torch.uint8, device="cuda"))
    except torch.OutOfMemoryError as e:
        error = str(e).splitlines()[0]
    result = {"total": total, "free": free, "allocated_gib": len(held), "oom": error}
    with open(out + ".tmp", "w") as f:
        json.dump(result, f)
    os.rename(out + ".tmp", out)
    while not os.path.exists(go):
        time.sleep(0.1)


def monitor(node):
    seen = {}
    root = os.path.join(node, "containers")
    for name in sorted(os.listdir(root)):
        folder = os.path.join(root, name)
        # os.DirEntry.is_dir in Go's ReadDir does not follow a link: neither does this.
        if os.path.islink(folder) or not os.path.isdir(folder):
            continue
        uid, _, container = name.partition("_")
        if not uid or not container:
            continue
        path = os.path.join(folder, "usage.cache")
        try:
            size = os.stat(path).st_size
            with open(path, "rb") as f:
                data = f.read()
        except OSError:
            continue
        if size < 12 or struct.unpack_from("<i", data, 0)[0] != MAGIC:
            continue
        major = struct.unpack_from("<i", data, 4)[0]
        if size == V0_SIZE:
            seen[name] = {"version": 0}
        elif major == 1 and size >= V1_SIZE:
            procs = min(struct.unpack_from("<i", data, PROC_NUM)[0], 1024)
            used = 0
            for k in range(max(procs, 0)):
                slot = SLOTS + k * SLOT_SIZE
                if struct.unpack_from("<i", data, slot + SLOT_STATUS)[0] == 1:
                    used += struct.unpack_from("<Q", data, slot + SLOT_TOTAL_0)[0]
            limit = struct.unpack_from("<Q", data, LIMIT_0)[0]
            seen[name] = {"version": 1, "limit": limit, "used": used}
    print(json.dumps(seen, indent=1, sort_keys=True))


if __name__ == "__main__":
    if sys.argv[1:2] == ["probe"]:
        probe(sys.argv[2], sys.argv[3])
    elif sys.argv[1:2] == ["monitor"]:
        monitor(sys.argv[2])
    else:
        sys.exit(__doc__)
