#!/usr/bin/env bash
# Run by tests/container_layout.rs as pid 1 of new mount and pid namespaces (unshare), with the
# pod's environment: it builds what HAMi's device plugin gives a GPU container, then runs the
# container's processes. Every result is a key=value line on stdout, its key prefixed by the step.
#
# The container (HAMi's layout, DESIGN.md §9):
#   /usr/local/vgpu            the node's container folder T_CONTAINER, writable (the region lives there)
#   /usr/local/vgpu/libvgpu.so the node's library T_NODE_LIB, bound read-only over its own file
#   /etc                       a copy of the host's /etc (T_ETC) whose ld.so.preload names that library
# Nothing of the host is written: every mount is in this namespace only.
set -euo pipefail
mount -t tmpfs vgpu-test /usr/local
mkdir -p /usr/local/vgpu
mount --bind "$T_CONTAINER" /usr/local/vgpu
touch /usr/local/vgpu/libvgpu.so
mount --bind "$T_NODE_LIB" /usr/local/vgpu/libvgpu.so
mount -o remount,bind,ro /usr/local/vgpu/libvgpu.so
mount --bind "$T_ETC" /etc
grep -qx /usr/local/vgpu/libvgpu.so /etc/ld.so.preload

client="$T_BIN/vgpu_client"
driver="LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
nobody=(setpriv --reuid=65534 --regid=65534 --clear-groups)
# A step's output, its keys prefixed: `step NAME COMMAND...`.
step() {
    local name=$1
    shift
    "$@" < /dev/null 2> "$T_SCRATCH/$name.err" | sed "s/^/${name}_/" || true
    echo "${name}_done=1"
}
until_line() { until grep -q "^$2=" "$1" 2> /dev/null; do sleep 0.02; done; }

# Before any process of the pod made the region: another user, stripped, cannot read pid 1's
# environment and finds no region: the node mounted the library, so it fails closed.
step early_nobody "${nobody[@]}" env -i "$driver" "$client" direct hold 64 16384
[ -e "$T_REGION_INSIDE" ] && echo "early_nobody_made_region=1"
# A stripped root shell reads pid 1's environment: the pod's budget and region path.
step early_root env -i "$driver" "$client" direct hold 64 16384
[ -e "$T_REGION_INSIDE" ] && echo "early_root_made_region=1"

# The pod's own process, with the pod's environment, holds 256 MiB.
mkfifo "$T_SCRATCH/pod.in"
"$client" direct steps < "$T_SCRATCH/pod.in" > "$T_SCRATCH/pod.out" 2> "$T_SCRATCH/pod.err" &
pod=$!
exec 3> "$T_SCRATCH/pod.in"
echo "alloc a 256" >&3
until_line "$T_SCRATCH/pod.out" a_status
sed 's/^/pod_/' "$T_SCRATCH/pod.out"

# Stripped processes now find the region beside the library: another user, root, a forked child,
# and a program exec'd by a shell.
step nobody "${nobody[@]}" env -i "$driver" "$client" direct hold 64 16384
step root env -i "$driver" "$client" direct hold 64 16384
step fork env -i "$driver" "$client" direct fork 384
step exec env -i "$driver" sh -c "exec $client direct hold 64 16384"

# A stripped process of another user keeps 512 MiB while the node looks, and then resizes.
mkfifo "$T_SCRATCH/held.in"
"${nobody[@]}" env -i "$driver" "$client" direct steps < "$T_SCRATCH/held.in" > "$T_SCRATCH/held.out" 2>&1 &
exec 4> "$T_SCRATCH/held.in"
echo "alloc h 512" >&4
until_line "$T_SCRATCH/held.out" h_status
sed 's/^/held_/' "$T_SCRATCH/held.out"
echo "pod_pid=$pod"
echo "node_check=1"
read -r go
echo "info r $go" >&3
until_line "$T_SCRATCH/pod.out" r_total
grep '^r_' "$T_SCRATCH/pod.out" | sed 's/^/pod_/'
echo "alloc r2 1024" >&3
until_line "$T_SCRATCH/pod.out" r2_status
grep '^r2_' "$T_SCRATCH/pod.out" | sed 's/^/pod_/'
exec 3>&- 4>&-
wait
echo "finished=1"
