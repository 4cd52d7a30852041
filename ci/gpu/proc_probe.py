"""Which driver function cuGetProcAddress_v2 answers for the wait and query entry points at each
CUDA version (run on a GPU machine without libvgpu: python3 ci/gpu/proc_probe.py). On driver 580
it showed that CUDA 13.0 resolves cuCtxSynchronize to cuCtxSynchronize_v2, which libvgpu must
therefore hook too (docs/overcommit.md)."""
import ctypes
cu = ctypes.CDLL("libcuda.so.1")
cu.cuInit(0)
def addr(name):
    try:
        return ctypes.cast(getattr(cu, name), ctypes.c_void_p).value
    except AttributeError:
        return None
for version in (12000, 12080, 12090, 13000):
    for name in (b"cuCtxSynchronize", b"cuStreamSynchronize", b"cuEventSynchronize", b"cuStreamQuery", b"cuEventQuery"):
        p = ctypes.c_void_p(); st = ctypes.c_int()
        r = cu.cuGetProcAddress_v2(name, ctypes.byref(p), version, 0, ctypes.byref(st))
        n = name.decode()
        which = {addr(n): n, addr(n + "_v2"): n + "_v2", addr(n + "_ptsz"): n + "_ptsz"}.get(p.value, hex(p.value or 0))
        print(version, n, r, which)
