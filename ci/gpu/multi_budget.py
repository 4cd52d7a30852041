"""Per-device budgets of one process using two GPUs, three ways at once: PyTorch, the driver API and NVML.

    python3 ci/gpu/multi_budget.py HOLD0_MIB HOLD1_MIB      (run by ci/gpu-multi, under libvgpu)

For CUDA ordinal i (0 and 1) the process holds HOLDi_MIB MiB in one tensor, then prints what every view
says about device i, all read in this process with nothing allocated in between:
  cudaI_uuid                       torch.cuda.get_device_properties(i).uuid (8-4-4-4-12 hex)
  torchI_total, torchI_free        torch.cuda.mem_get_info(i)
  cuI_total, cuI_free              cuMemGetInfo_v2 with device i's primary context current (ctypes on
                                   libcuda.so.1, so through libvgpu's dlsym like any framework)
  cuI_device_total                 cuDeviceTotalMem_v2(i)
  nvmlI_index                      the NVML (nvidia-smi) index whose nvmlDeviceGetUUID is cudaI_uuid
  nvmlI_total, nvmlI_used, nvmlI_free  nvmlDeviceGetMemoryInfo of that device
then ready=1, and waits for a line on stdin (the caller reads the region from outside meanwhile).
Then it fills each device with 256 MiB tensors until PyTorch refuses one: fillI_bytes (everything it
holds on device i, the first tensor included), fillI_refused (1: stopped by an out-of-memory error),
and the views again as fullI_* (fullI_torch_free, fullI_cu_free, fullI_nvml_free, fullI_nvml_used);
then filled=1, and it waits for stdin to close. A failure prints error=... and exits 1.
"""
import ctypes
import sys
import traceback

MIB = 1 << 20
CHUNK = 256 * MIB


class NvmlMemory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


def check(status, what):
    if status != 0:
        raise RuntimeError(f"{what} returned {status}")


class Views:
    """cuMemGetInfo and NVML through ctypes, as an application that loads the libraries itself."""

    def __init__(self, torch):
        self.torch = torch
        self.cuda = ctypes.CDLL("libcuda.so.1")
        self.nvml = ctypes.CDLL("libnvidia-ml.so.1")
        check(self.nvml.nvmlInit_v2(), "nvmlInit_v2")

    def nvml_device(self, uuid):
        """(NVML index, handle) of the GPU whose NVML UUID is GPU-`uuid`: NVML numbers GPUs its own way."""
        count = ctypes.c_uint()
        check(self.nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)), "nvmlDeviceGetCount_v2")
        for index in range(count.value):
            handle, name = ctypes.c_void_p(), ctypes.create_string_buffer(96)
            check(self.nvml.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle)), "nvmlDeviceGetHandleByIndex_v2")
            check(self.nvml.nvmlDeviceGetUUID(handle, name, len(name)), "nvmlDeviceGetUUID")
            if name.value.decode().lower() == f"gpu-{uuid}".lower():
                return index, handle
        raise RuntimeError(f"NVML lists no GPU with UUID GPU-{uuid}")

    def read(self, i, uuid):
        torch = self.torch
        torch.cuda.set_device(i)  # device i's primary context current on this thread
        free, total = torch.cuda.mem_get_info(i)
        cu_free, cu_total, dev_total = ctypes.c_size_t(), ctypes.c_size_t(), ctypes.c_size_t()
        check(self.cuda.cuMemGetInfo_v2(ctypes.byref(cu_free), ctypes.byref(cu_total)), "cuMemGetInfo_v2")
        device = ctypes.c_int()
        check(self.cuda.cuDeviceGet(ctypes.byref(device), i), "cuDeviceGet")
        check(self.cuda.cuDeviceTotalMem_v2(ctypes.byref(dev_total), device), "cuDeviceTotalMem_v2")
        index, handle = self.nvml_device(uuid)
        memory = NvmlMemory()
        check(self.nvml.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(memory)), "nvmlDeviceGetMemoryInfo")
        return {
            "torch_total": total,
            "torch_free": free,
            "cu_total": cu_total.value,
            "cu_free": cu_free.value,
            "cu_device_total": dev_total.value,
            "nvml_index": index,
            "nvml_total": memory.total,
            "nvml_used": memory.used,
            "nvml_free": memory.free,
        }


def main():
    import torch

    holds = [int(sys.argv[1]) * MIB, int(sys.argv[2]) * MIB]
    if torch.cuda.device_count() < 2:
        raise RuntimeError(f"torch sees {torch.cuda.device_count()} CUDA devices, 2 needed")
    uuids = [str(torch.cuda.get_device_properties(i).uuid).lower().removeprefix("gpu-") for i in range(2)]
    held = [[torch.empty(holds[i], dtype=torch.uint8, device=f"cuda:{i}")] for i in range(2)]
    torch.cuda.synchronize(0)
    torch.cuda.synchronize(1)
    views = Views(torch)
    for i in range(2):
        print(f"cuda{i}_uuid={uuids[i]}")
        for key, value in views.read(i, uuids[i]).items():
            print(f"{key.split('_')[0]}{i}_{key.split('_', 1)[1]}={value}")
    print("ready=1", flush=True)
    sys.stdin.readline()

    for i in range(2):
        refused = 0
        for _ in range(4096):
            try:
                held[i].append(torch.empty(CHUNK, dtype=torch.uint8, device=f"cuda:{i}"))
            except torch.OutOfMemoryError:
                refused = 1
                break
        print(f"fill{i}_bytes={sum(t.numel() for t in held[i])}")
        print(f"fill{i}_refused={refused}", flush=True)
    for i in range(2):
        seen = views.read(i, uuids[i])
        for key in ("torch_free", "cu_free", "nvml_free", "nvml_used"):
            print(f"full{i}_{key}={seen[key]}")
    print("filled=1", flush=True)
    sys.stdin.read()


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # noqa: BLE001 - one line for the table, the trace for the log
        traceback.print_exc()
        print(f"error={type(e).__name__}: {e}".replace("\n", " "), flush=True)
        sys.exit(1)
