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
