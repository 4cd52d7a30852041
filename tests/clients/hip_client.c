/* A HIP client for libvgpu_hip's tests and benchmark; needs no hipcc (include/hip_subset.h).
 *
 *   hip_client PATH COMMAND [ARG...]
 *
 * PATH is how the runtime's functions are reached:
 *   direct     linked against libamdhip64 and called by name (only in the build made with
 *              -DHIP_CLIENT_DIRECT, hip_client_direct, which is linked to the fake runtime)
 *   dlsym      dlopen(HIP_CLIENT_RUNTIME, default libamdhip64.so.6) + dlsym for every entry point
 *   procaddr   dlsym "hipGetProcAddress", then every entry point through it at HIP_CLIENT_VERSION
 *              (default 60200000, HIP 6.2)
 * COMMAND:
 *   fill MiB       info_total/info_free (hipMemGetInfo), device_total (hipDeviceTotalMem),
 *                  prop_total (hipGetDeviceProperties, the layout the path's symbol has),
 *                  prop_r0600_total; then MiB-sized hipMalloc until refused (first_bytes,
 *                  first_status), full_free; free all (freed_free); fill again (second_bytes);
 *                  free; the fake's counters of physical device 0 (driver_used, driver_peak,
 *                  driver_alloc_calls)
 *   family NAME MiB  objects of about MiB each of family NAME (managed, ext, pitch, allocpitch,
 *                  3d, async, pool, array, array3d, arraycreate, array3dcreate, mipmap, mipmapcreate,
 *                  vmm, host) until
 *                  refused: NAME_size (one object's bytes by this client's model), NAME_bytes,
 *                  NAME_status, full_free; destroy them (freed_free); driver_used at the end.
 *                  host stops after 4 objects (host memory is never refused)
 *   hold MiB [MAX] hipMalloc MiB chunks until refused or MAX MiB are held, print held_bytes and ready=1, block until
 *                  stdin reaches EOF, free everything, print released=1
 *   bench N        time N hipMalloc+hipFree pairs of 1 MiB (alloc_free_ns per pair) and N
 *                  hipMemGetInfo calls (get_info_ns)
 *   nodevice       hipInit(0) (init_status), hipGetDeviceCount (count_status, count), hipMalloc
 *                  (malloc_status), hipMemGetInfo (info_status), whether the runtime has
 *                  hipGetProcAddress (procaddr_present) and what the exported one (the preloaded
 *                  library's, if any) answers (exported_procaddr_status): for a runtime without devices
 *   launch KIND NS SECONDS  launches of KIND (kernel: hipLaunchKernel, spt: hipLaunchKernel_spt,
 *                  cooperative: hipLaunchCooperativeKernel, ext: hipExtLaunchKernel, module:
 *                  hipModuleLaunchKernel, graph: hipGraphLaunch) of a fake kernel taking NS nanoseconds, for SECONDS of
 *                  wall time (synchronizing whenever more than 10 ms of work is queued), then
 *                  hipDeviceSynchronize: launch_status, launches, wall_ns, busy_ns
 *                  (the fake device's busy time), share_pct and starved_ns (the launching
 *                  thread's time runnable without a CPU meanwhile)
 *   copy KIND MiB SECONDS  device-side copies or memsets of MiB (KIND: memcpy, memcpyasync: hipMemcpy(Async)
 *                  device to device; dtod, dtodasync: hipMemcpyDtoD(Async); memset, memsetasync,
 *                  d8, d8async, d16, d32, d32async; host: hipMemcpy host to device; memcpydefault,
 *                  asyncdefault: hipMemcpy(Async) of kind hipMemcpyDefault between device buffers;
 *                  defaulthost: the same from malloc'd host memory; withstream: hipMemcpyWithStream;
 *                  memcpyspt: hipMemcpy_spt; 2d, 2dasync, 2dspt, 2ddefault: hipMemcpy2D(Async,
 *                  _spt) of MiB rows of 1 MiB; 2dtoarray, 2dfromarray: to or from an array (kind
 *                  Default, DeviceToDevice); 3d, 3dasync, 3ddefault: hipMemcpy3D(Async) between
 *                  pitched pointers; param2d: hipMemcpyParam2D device to device; peer: hipMemcpyPeer
 *                  on device 0; memset2d, memset2dasync, memset3d, memset3dasync; drv3d, drv3dasync:
 *                  hipDrvMemcpy3D(Async) device to device, drv3darray: device to an array, drv3dhost:
 *                  host to device, each in the runtime version's HIP_MEMCPY3D; tosymbol,
 *                  tosymbolasync, tosymbolspt, tosymbolasyncspt, fromsymbol, fromsymbolasync,
 *                  fromsymbolspt, fromsymbolasyncspt: hipMemcpyTo/FromSymbol(Async)(_spt) with the
 *                  buffer a as the symbol, of kind device to device (the _spt forms: Default);
 *                  tosymbolhost: host to device, fromsymbolhost: to host memory of kind Default)
 *                  for SECONDS: copy_status,
 *                  copies, wall_ns, busy_ns, share_pct, as for launch; then last_error
 *                  (hipGetLastError), pointer_queries (the fake's hipPointerGetAttributes calls) and
 *                  event_records (its hipEventRecord calls: a paced call records two)
 *   reset MiB      an array, a VMM handle and MiB hipMalloc chunks until refused (held_bytes,
 *                  full_free), then hipDeviceReset (reset_status, reset_free) and a new fill
 *                  (refill_bytes)
 *   pools MiB      stream-ordered pools under a budget of 16 MiB-sized blocks (1 GiB at 64): the
 *                  default pool, told to keep everything (release threshold UINT64_MAX), caches 12
 *                  blocks freed in stream order; then a hipMalloc and another pool's allocation of 8
 *                  blocks (refused: the cache is charged), the pool itself serving 8 blocks from its
 *                  cache, hipMemPoolTrimTo, a created pool caching 4 blocks then destroyed, and one
 *                  destroyed with a block outstanding. Statuses and hipMemGetInfo's free bytes as
 *                  key=value; at each stage it prints STAGE=1 and waits for a line on stdin (a test
 *                  reads the region meanwhile): cached, trimmed, created_cached, destroyed,
 *                  destroyed_outstanding, outstanding_freed
 *   streams MiB    two devices: a stream and a pool made on device 1, then from device 0
 *                  hipMallocAsync on that stream (stream_status), on the null stream (null_status),
 *                  hipMallocFromPoolAsync of 2 × MiB from that pool on the null stream (pool_status);
 *                  free_0/free_1 (hipMemGetInfo on each device), the fake's driver_used_0/1; then
 *                  everything freed and synchronized (freed_0/freed_1)
 *   nulls          NULL and bogus arguments to the hooked calls: each status as key=value, then
 *                  after_free (hipMemGetInfo) and the fake's counters
 *   smi            ROCm SMI's memory view (dlopen HIP_CLIENT_SMI, default librocm_smi64.so.1):
 *                  init_status, smi_count, per device smi_total_N and smi_used_N (VRAM), and
 *                  the file rsmi_dev_memory_total_get lies in (smi_total_in)
 *   amdsmi         AMD SMI's memory view (libamd_smi: linked on the direct path; on dlsym,
 *                  dlopen HIP_CLIENT_AMDSMI, default libamd_smi.so, RTLD_LOCAL as amd-smi's
 *                  Python bindings load it): init_status, amdsmi_count, per GPU amdsmi_uuid_N,
 *                  amdsmi_total_N and amdsmi_used_N (VRAM), amdsmi_vis_total_N (visible VRAM),
 *                  amdsmi_vram_total_mb_N and amdsmi_vram_used_mb_N (amdsmi_get_gpu_vram_usage),
 *                  each call's *_status_N; the files the memory total and vram_usage functions
 *                  lie in (amdsmi_total_in, amdsmi_vram_in); NULL and bogus arguments' statuses;
 *                  on dlsym, the VRAM total of the ROCm SMI built into libamd_smi, by name
 *                  (builtin_rsmi_total_N)
 *   symbols        which function hipGetProcAddress hands out: KEY_ours (same as the preloaded
 *                  library's export of that name) for hipMalloc at 6.2, hipGetDeviceProperties at
 *                  5.2 and at 6.2 (its R0600 variant), hipGetDeviceCount (not hooked: the
 *                  runtime's own, count_runtime), and the status for a name too new for 5.2
 * Output is one key=value per line. CLIENT_DEVICE picks the HIP ordinal (default 0). An entry
 * point a command needs that PATH does not resolve is printed as unresolved=NAME (exit 3). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "amdsmi_subset.h"
#include "hip_subset.h"

#define HIP_FUNCTIONS(X)                                                                                   \
    X(hipInit) X(hipRuntimeGetVersion) X(hipGetDeviceCount) X(hipGetDevice) X(hipSetDevice)                \
    X(hipDeviceGetUuid) X(hipMemGetInfo) X(hipDeviceTotalMem) X(hipGetDeviceProperties)                    \
    X(hipGetDevicePropertiesR0600) X(hipMalloc) X(hipFree) X(hipExtMallocWithFlags) X(hipMallocManaged)    \
    X(hipMallocPitch) X(hipMemAllocPitch) X(hipMalloc3D) X(hipMallocAsync) X(hipMallocFromPoolAsync)       \
    X(hipFreeAsync) X(hipDeviceGetDefaultMemPool) X(hipHostMalloc) X(hipHostFree) X(hipMallocArray)        \
    X(hipMalloc3DArray) X(hipArrayCreate) X(hipArray3DCreate) X(hipFreeArray) X(hipArrayDestroy)           \
    X(hipMemCreate) X(hipMemRelease) X(hipMemAddressReserve) X(hipMemAddressFree) X(hipMemMap)             \
    X(hipMemUnmap) X(hipMemRetainAllocationHandle) X(hipLaunchKernel) X(hipModuleLaunchKernel) X(hipGraphLaunch)  \
    X(hipDeviceSynchronize) X(hipDeviceReset) X(hipLaunchKernel_spt) X(hipLaunchCooperativeKernel) X(hipExtLaunchKernel) \
    X(hipMallocMipmappedArray) X(hipMipmappedArrayCreate) X(hipFreeMipmappedArray) X(hipMipmappedArrayDestroy)    \
    X(hipMemcpy) X(hipMemcpyAsync) X(hipMemcpyDtoD) X(hipMemcpyDtoDAsync) X(hipMemset) X(hipMemsetAsync)         \
    X(hipMemsetD8) X(hipMemsetD8Async) X(hipMemsetD32) X(hipMemsetD32Async) X(hipDeviceGetMemPool)             \
    X(hipDeviceSetMemPool) X(hipMemPoolCreate) X(hipMemPoolDestroy) X(hipMemPoolTrimTo) X(hipMemPoolSetAttribute) \
    X(hipMemPoolGetAttribute) X(hipStreamCreate) X(hipStreamDestroy) X(hipStreamSynchronize) X(hipGetLastError)   \
    X(hipPeekAtLastError) X(hipMemcpyWithStream) X(hipMemcpy_spt) X(hipMemcpy2D) X(hipMemcpy2DAsync)              \
    X(hipMemcpy2D_spt) X(hipMemcpy2DToArray) X(hipMemcpy2DFromArray) X(hipMemcpy3D) X(hipMemcpy3DAsync)           \
    X(hipMemcpyParam2D) X(hipMemcpyPeer) X(hipMemset2D) X(hipMemset2DAsync) X(hipMemset3D) X(hipMemset3DAsync)    \
    X(hipMemsetD16) X(hipDrvMemcpy3D) X(hipDrvMemcpy3DAsync) X(hipMemcpyToSymbol) X(hipMemcpyToSymbolAsync)        \
    X(hipMemcpyToSymbol_spt) X(hipMemcpyToSymbolAsync_spt) X(hipMemcpyFromSymbol) X(hipMemcpyFromSymbolAsync)     \
    X(hipMemcpyFromSymbol_spt) X(hipMemcpyFromSymbolAsync_spt)

static struct {
#define FIELD(name) __typeof__(&name) name;
    HIP_FUNCTIONS(FIELD)
#undef FIELD
} api;

static const char *path;
static void *runtime;
static int version = 60200000;
typedef hipError_t (*GetProcAddress)(const char *, void **, int, uint64_t, hipDriverProcAddressQueryResult *);
static GetProcAddress gpa;

#define MIB (1024ull * 1024ull)
static void unresolved(const char *name) {
    printf("unresolved=%s\n", name);
    exit(3);
}
#define NEED(name) (api.name ? (void)0 : unresolved(#name))

static void *runtime_handle(void) {
    if (!runtime) {
        const char *name = getenv("HIP_CLIENT_RUNTIME");
        runtime = dlopen(name ? name : "libamdhip64.so.6", RTLD_NOW | RTLD_GLOBAL);
        if (!runtime) {
            printf("dlopen_error=%s\n", dlerror());
            exit(4);
        }
    }
    return runtime;
}

static void resolve(void) {
    const char *v = getenv("HIP_CLIENT_VERSION");
    if (v) version = atoi(v);
    if (strcmp(path, "dlsym") == 0) {
        void *h = runtime_handle();
#define BY_DLSYM(name) *(void **)&api.name = dlsym(h, #name);
        HIP_FUNCTIONS(BY_DLSYM)
#undef BY_DLSYM
    } else if (strcmp(path, "procaddr") == 0) {
        gpa = (GetProcAddress)dlsym(runtime_handle(), "hipGetProcAddress");
        if (!gpa) {
            printf("unresolved=hipGetProcAddress\n");
            exit(3);
        }
        hipDriverProcAddressQueryResult status;
#define BY_PROCADDR(name)                                                                                  \
    if (gpa(#name, (void **)&api.name, version, HIP_GET_PROC_ADDRESS_DEFAULT, &status) != hipSuccess)      \
        api.name = NULL;
        HIP_FUNCTIONS(BY_PROCADDR)
#undef BY_PROCADDR
#ifdef HIP_CLIENT_DIRECT
    } else if (strcmp(path, "direct") == 0) {
#define DIRECT(name) api.name = name;
        HIP_FUNCTIONS(DIRECT)
#undef DIRECT
#endif
    } else {
        printf("unknown_path=%s\n", path);
        exit(2);
    }
}

static int device(void) {
    const char *d = getenv("CLIENT_DEVICE");
    return d ? atoi(d) : 0;
}

static void start(void) {
    NEED(hipInit);
    NEED(hipSetDevice);
    api.hipInit(0);
    hipError_t status = api.hipSetDevice(device());
    if (status != hipSuccess) printf("set_device_status=%d\n", status);
}

static size_t info_free(void) {
    size_t free = 0, total = 0;
    NEED(hipMemGetInfo);
    api.hipMemGetInfo(&free, &total);
    return free;
}

static void driver_stats(void) {
    int (*stats)(int, unsigned long long *, unsigned long long *, unsigned long long *) =
        (int (*)(int, unsigned long long *, unsigned long long *, unsigned long long *))dlsym(RTLD_DEFAULT,
                                                                                                  "fakehip_stats");
    unsigned long long used = 0, peak = 0, calls = 0;
    if (stats && stats(0, &used, &peak, &calls) == 0)
        printf("driver_used=%llu\ndriver_peak=%llu\ndriver_alloc_calls=%llu\n", used, peak, calls);
}

/* Which layout this path's hipGetDeviceProperties fills: HIP 6.x's header renames the call to its
 * R0600 form, and hipGetProcAddress at 6.0 or later answers the same way. */
static size_t prop_total_offset(void) {
    return strcmp(path, "procaddr") == 0 && version >= 60000000 ? HIP_PROP_R0600_TOTAL : HIP_PROP_R0000_TOTAL;
}

static unsigned long long prop_total(hipError_t (*get)(void *, int), size_t offset) {
    static unsigned char prop[HIP_PROP_BUFFER];
    memset(prop, 0, sizeof prop);
    if (!get || get(prop, device()) != hipSuccess) return 0;
    size_t total;
    memcpy(&total, prop + offset, sizeof total);
    return total;
}

#define MAX_OBJECTS 4096

static unsigned long long fill_chunks(void **held, int *count, size_t chunk, hipError_t *last,
                                      unsigned long long max) {
    unsigned long long bytes = 0;
    *count = 0;
    *last = hipSuccess;
    while (*count < MAX_OBJECTS && (max == 0 || bytes + chunk <= max)) {
        void *p = NULL;
        hipError_t status = api.hipMalloc(&p, chunk);
        if (status != hipSuccess) {
            *last = status;
            break;
        }
        held[(*count)++] = p;
        bytes += chunk;
    }
    return bytes;
}

static int cmd_fill(size_t mib) {
    start();
    NEED(hipMalloc);
    NEED(hipFree);
    NEED(hipDeviceTotalMem);
    size_t free = 0, total = 0, device_total = 0;
    api.hipMemGetInfo(&free, &total);
    api.hipDeviceTotalMem(&device_total, device());
    printf("info_total=%zu\ninfo_free=%zu\ndevice_total=%zu\n", total, free, device_total);
    printf("prop_total=%llu\n", prop_total(api.hipGetDeviceProperties, prop_total_offset()));
    printf("prop_r0600_total=%llu\n", prop_total(api.hipGetDevicePropertiesR0600, HIP_PROP_R0600_TOTAL));
    static void *held[MAX_OBJECTS];
    int count;
    hipError_t last;
    unsigned long long bytes = fill_chunks(held, &count, mib * MIB, &last, 0);
    printf("first_bytes=%llu\nfirst_status=%d\nfull_free=%zu\n", bytes, last, info_free());
    for (int i = 0; i < count; i++) api.hipFree(held[i]);
    printf("freed_free=%zu\n", info_free());
    bytes = fill_chunks(held, &count, mib * MIB, &last, 0);
    printf("second_bytes=%llu\nsecond_status=%d\n", bytes, last);
    for (int i = 0; i < count; i++) api.hipFree(held[i]);
    driver_stats();
    return 0;
}

/* One object of a family: created with `create`, destroyed with `destroy`. */
struct object {
    void *ptr;
    unsigned long long handle;
};

static hipMemPool_t pool;

/* Creates one object of `family` of about `mib` MiB into `o`; returns the status and sets *size to
 * what the object costs by this client's model. */
static hipError_t create_object(const char *family, size_t mib, struct object *o, unsigned long long *size) {
    size_t bytes = mib * MIB;
    hipChannelFormatDesc float4 = {32, 32, 32, 32, hipChannelFormatKindFloat};
    *size = bytes;
    if (strcmp(family, "managed") == 0) return NEED(hipMallocManaged), api.hipMallocManaged(&o->ptr, bytes, 1);
    if (strcmp(family, "ext") == 0) return NEED(hipExtMallocWithFlags), api.hipExtMallocWithFlags(&o->ptr, bytes, 0);
    if (strcmp(family, "async") == 0) return NEED(hipMallocAsync), api.hipMallocAsync(&o->ptr, bytes, NULL);
    if (strcmp(family, "pool") == 0) {
        NEED(hipMallocFromPoolAsync);
        NEED(hipDeviceGetDefaultMemPool);
        if (!pool) api.hipDeviceGetDefaultMemPool(&pool, device());
        return api.hipMallocFromPoolAsync(&o->ptr, bytes, pool, NULL);
    }
    if (strcmp(family, "host") == 0) return NEED(hipHostMalloc), api.hipHostMalloc(&o->ptr, bytes, 0);
    if (strcmp(family, "pitch") == 0 || strcmp(family, "allocpitch") == 0) {
        /* 1 MiB rows of a width the fake pads to 256 bytes: 1000 bytes → 1024. */
        size_t pitch = 0, width = 1000, height = bytes / 1024;
        *size = 1024ull * height;
        if (strcmp(family, "pitch") == 0) return NEED(hipMallocPitch), api.hipMallocPitch(&o->ptr, &pitch, width, height);
        return NEED(hipMemAllocPitch), api.hipMemAllocPitch(&o->ptr, &pitch, width, height, 4);
    }
    if (strcmp(family, "3d") == 0) {
        NEED(hipMalloc3D);
        hipPitchedPtr p;
        hipExtent extent = {1000, 64, bytes / (1024 * 64)};
        *size = 1024ull * 64 * extent.depth;
        hipError_t status = api.hipMalloc3D(&p, extent);
        o->ptr = p.ptr;
        return status;
    }
    if (strcmp(family, "array") == 0) {
        NEED(hipMallocArray);
        return api.hipMallocArray((hipArray_t *)&o->ptr, &float4, 1024, bytes / (16 * 1024), 0);
    }
    if (strcmp(family, "array3d") == 0) {
        NEED(hipMalloc3DArray);
        hipExtent extent = {256, 64, bytes / (16 * 256 * 64)};
        return api.hipMalloc3DArray((hipArray_t *)&o->ptr, &float4, extent, 0);
    }
    if (strcmp(family, "arraycreate") == 0) {
        NEED(hipArrayCreate);
        HIP_ARRAY_DESCRIPTOR d = {1024, bytes / (16 * 1024), HIP_AD_FORMAT_FLOAT, 4};
        return api.hipArrayCreate((hipArray_t *)&o->ptr, &d);
    }
    if (strcmp(family, "array3dcreate") == 0) {
        NEED(hipArray3DCreate);
        HIP_ARRAY3D_DESCRIPTOR d = {256, 64, bytes / (16 * 256 * 64), HIP_AD_FORMAT_FLOAT, 4, 0};
        return api.hipArray3DCreate((hipArray_t *)&o->ptr, &d);
    }
    if (strcmp(family, "mipmap") == 0 || strcmp(family, "mipmapcreate") == 0) {
        /* Two levels of float4 texels: 1024 x (mib*64), then 512 x (mib*32): 1.25 x mib MiB. */
        hipExtent extent = {1024, mib * 64, 0};
        *size = 16ull * (1024 * mib * 64 + 512 * mib * 32);
        if (strcmp(family, "mipmap") == 0)
            return NEED(hipMallocMipmappedArray), api.hipMallocMipmappedArray(&o->ptr, &float4, extent, 2, 0);
        HIP_ARRAY3D_DESCRIPTOR d = {1024, mib * 64, 0, HIP_AD_FORMAT_FLOAT, 4, 0};
        return NEED(hipMipmappedArrayCreate), api.hipMipmappedArrayCreate(&o->ptr, &d, 2);
    }
    if (strcmp(family, "vmm") == 0) {
        NEED(hipMemCreate);
        NEED(hipRuntimeGetVersion);
        int v = 0;
        api.hipRuntimeGetVersion(&v);
        hipMemAllocationProp prop;
        memset(&prop, 0, sizeof prop);
        int type_at = v >= 60000000 ? 8 : 4, kind = hipMemLocationTypeDevice, id = device();
        int pinned = hipMemAllocationTypePinned;
        memcpy(prop.bytes + type_at, &kind, sizeof kind);
        memcpy(prop.bytes + type_at + 4, &id, sizeof id);
        memcpy(prop.bytes + (v >= 60000000 ? 0 : 16), &pinned, sizeof pinned);
        return api.hipMemCreate(&o->handle, bytes, &prop, 0);
    }
    printf("unknown_family=%s\n", family);
    exit(2);
}

static hipError_t destroy_object(const char *family, struct object *o) {
    if (strcmp(family, "async") == 0 || strcmp(family, "pool") == 0) return api.hipFreeAsync(o->ptr, NULL);
    if (strcmp(family, "host") == 0) return api.hipHostFree(o->ptr);
    if (strcmp(family, "array") == 0 || strcmp(family, "array3d") == 0) return api.hipFreeArray(o->ptr);
    if (strcmp(family, "mipmap") == 0) return api.hipFreeMipmappedArray(o->ptr);
    if (strcmp(family, "mipmapcreate") == 0) return api.hipMipmappedArrayDestroy(o->ptr);
    if (strcmp(family, "arraycreate") == 0 || strcmp(family, "array3dcreate") == 0) return api.hipArrayDestroy(o->ptr);
    if (strcmp(family, "vmm") == 0) {
        /* Mapped, released while mapped (still charged), then unmapped: only now is it freed. */
        return api.hipMemRelease(o->handle);
    }
    return api.hipFree(o->ptr);
}

static int cmd_family(const char *family, size_t mib) {
    start();
    static struct object objects[MAX_OBJECTS];
    int count = 0;
    unsigned long long bytes = 0, size = 0;
    hipError_t last = hipSuccess;
    int limit = strcmp(family, "host") == 0 ? 4 : MAX_OBJECTS;
    size_t before = info_free();
    printf("info_free=%zu\n", before);
    while (count < limit) {
        struct object o = {0};
        last = create_object(family, mib, &o, &size);
        if (last != hipSuccess) break;
        objects[count++] = o;
        bytes += size;
    }
    printf("%s_size=%llu\n%s_bytes=%llu\n%s_status=%d\nfull_free=%zu\n", family, size, family, bytes, family,
           (int)last, info_free());
    if (strcmp(family, "vmm") == 0) {
        /* Map the first handle, release it while mapped: still charged until the unmap. */
        NEED(hipMemAddressReserve);
        void *va = NULL;
        api.hipMemAddressReserve(&va, mib * MIB, 0, NULL, 0);
        printf("map_status=%d\n", api.hipMemMap(va, mib * MIB, 0, objects[0].handle, 0));
        unsigned long long retained = 0;
        printf("retain_status=%d\n", api.hipMemRetainAllocationHandle(&retained, va));
        printf("retained_same=%d\n", retained == objects[0].handle);
        api.hipMemRelease(retained);
        api.hipMemRelease(objects[0].handle);
        printf("released_mapped_free=%zu\n", info_free());
        printf("unmap_status=%d\n", api.hipMemUnmap(va, mib * MIB));
        printf("unmapped_free=%zu\n", info_free());
        api.hipMemAddressFree(va, mib * MIB);
        objects[0].handle = 0;
        for (int i = 1; i < count; i++) destroy_object(family, &objects[i]);
    } else {
        for (int i = 0; i < count; i++) destroy_object(family, &objects[i]);
    }
    /* A pool gives freed memory back to the device at a synchronize, down to its release threshold. */
    if (strcmp(family, "async") == 0 || strcmp(family, "pool") == 0) NEED(hipDeviceSynchronize), api.hipDeviceSynchronize();
    printf("freed_free=%zu\n", info_free());
    driver_stats();
    return 0;
}

/* Prints NAME=1 and waits for a line on stdin, so that a test can look at the region (no wait
 * when stdin is closed). */
static void stage(const char *name) {
    printf("%s=1\n", name);
    fflush(stdout);
    char line[64];
    if (!fgets(line, sizeof line, stdin)) return;
}

/* The fake's counters of physical device `d`, as driver_used_D. */
static void driver_used(int d) {
    int (*stats)(int, unsigned long long *, unsigned long long *, unsigned long long *) =
        (int (*)(int, unsigned long long *, unsigned long long *, unsigned long long *))dlsym(RTLD_DEFAULT,
                                                                                                  "fakehip_stats");
    unsigned long long used = 0, peak = 0, calls = 0;
    if (stats && stats(d, &used, &peak, &calls) == 0) printf("driver_used_%d=%llu\n", d, used);
}

/* A pool of device memory on device `d`. */
static hipError_t make_pool(hipMemPool_t *pool, int d) {
    NEED(hipMemPoolCreate);
    hipMemPoolProps props;
    memset(&props, 0, sizeof props);
    int pinned = hipMemAllocationTypePinned, kind = hipMemLocationTypeDevice;
    memcpy(props.bytes, &pinned, sizeof pinned);
    memcpy(props.bytes + 8, &kind, sizeof kind);
    memcpy(props.bytes + 12, &d, sizeof d);
    return api.hipMemPoolCreate(pool, &props);
}

static int cmd_pools(size_t mib) {
    start();
    NEED(hipMallocAsync);
    NEED(hipFreeAsync);
    NEED(hipMallocFromPoolAsync);
    NEED(hipDeviceGetDefaultMemPool);
    NEED(hipMemPoolSetAttribute);
    NEED(hipMemPoolTrimTo);
    NEED(hipMemPoolDestroy);
    NEED(hipDeviceSynchronize);
    NEED(hipMalloc);
    NEED(hipFree);
    size_t block = mib * MIB;
    uint64_t keep = UINT64_MAX;
    hipMemPool_t pool = NULL, mine = NULL, other = NULL;
    api.hipDeviceGetDefaultMemPool(&pool, device());
    printf("threshold_status=%d\n", api.hipMemPoolSetAttribute(pool, hipMemPoolAttrReleaseThreshold, &keep));
    void *blocks[12] = {0}, *big = NULL, *p = NULL;
    hipError_t status = hipSuccess;
    for (int i = 0; i < 12 && status == hipSuccess; i++) status = api.hipMallocAsync(&blocks[i], block, NULL);
    printf("blocks_status=%d\nin_use_free=%zu\n", status, info_free());
    for (int i = 0; i < 12; i++) api.hipFreeAsync(blocks[i], NULL);
    api.hipDeviceSynchronize();
    stage("cached");
    printf("cached_free=%zu\n", info_free());
    printf("malloc_status=%d\n", api.hipMalloc(&p, 8 * block));
    if (p) api.hipFree(p);
    printf("from_cache_status=%d\n", api.hipMallocAsync(&big, 8 * block, NULL));
    printf("from_cache_free=%zu\n", info_free());
    api.hipFreeAsync(big, NULL);
    api.hipDeviceSynchronize();
    printf("create_status=%d\n", make_pool(&mine, device()));
    api.hipMemPoolSetAttribute(mine, hipMemPoolAttrReleaseThreshold, &keep);
    big = NULL;
    printf("other_pool_status=%d\n", api.hipMallocFromPoolAsync(&big, 8 * block, mine, NULL));
    if (big) api.hipFreeAsync(big, NULL);
    printf("trim_status=%d\n", api.hipMemPoolTrimTo(pool, 0));
    stage("trimmed");
    printf("trimmed_free=%zu\n", info_free());
    for (int i = 0; i < 4; i++) api.hipMallocFromPoolAsync(&blocks[i], block, mine, NULL);
    for (int i = 0; i < 4; i++) api.hipFreeAsync(blocks[i], NULL);
    api.hipDeviceSynchronize();
    stage("created_cached");
    printf("created_cached_free=%zu\n", info_free());
    printf("destroy_status=%d\n", api.hipMemPoolDestroy(mine));
    stage("destroyed");
    printf("destroyed_free=%zu\n", info_free());
    /* Destroyed with a block outstanding: that block stays until freed, the cache goes at once. */
    make_pool(&other, device());
    api.hipMemPoolSetAttribute(other, hipMemPoolAttrReleaseThreshold, &keep);
    api.hipMallocFromPoolAsync(&blocks[0], block, other, NULL);
    api.hipMallocFromPoolAsync(&blocks[1], block, other, NULL);
    api.hipFreeAsync(blocks[1], NULL);
    api.hipDeviceSynchronize();
    printf("destroy_outstanding_status=%d\n", api.hipMemPoolDestroy(other));
    stage("destroyed_outstanding");
    printf("destroyed_outstanding_free=%zu\n", info_free());
    printf("outstanding_free_status=%d\n", api.hipFree(blocks[0]));
    stage("outstanding_freed");
    printf("outstanding_freed_free=%zu\n", info_free());
    driver_stats();
    return 0;
}

static int cmd_streams(size_t mib) {
    start();
    NEED(hipStreamCreate);
    NEED(hipMallocAsync);
    NEED(hipMallocFromPoolAsync);
    NEED(hipFreeAsync);
    NEED(hipDeviceSynchronize);
    hipStream_t stream = NULL;
    hipMemPool_t pool = NULL;
    api.hipSetDevice(1);
    printf("stream_create_status=%d\n", api.hipStreamCreate(&stream));
    printf("pool_create_status=%d\n", make_pool(&pool, 1));
    api.hipSetDevice(0);
    void *a = NULL, *b = NULL, *c = NULL;
    printf("stream_status=%d\n", api.hipMallocAsync(&a, mib * MIB, stream));
    printf("null_status=%d\n", api.hipMallocAsync(&b, mib * MIB, NULL));
    printf("pool_status=%d\n", api.hipMallocFromPoolAsync(&c, 2 * mib * MIB, pool, NULL));
    printf("free_0=%zu\n", info_free());
    api.hipSetDevice(1);
    printf("free_1=%zu\n", info_free());
    driver_used(0);
    driver_used(1);
    api.hipFreeAsync(a, stream);
    api.hipFreeAsync(c, NULL);
    api.hipDeviceSynchronize();
    printf("freed_1=%zu\n", info_free());
    api.hipSetDevice(0);
    api.hipFreeAsync(b, NULL);
    api.hipDeviceSynchronize();
    printf("freed_0=%zu\n", info_free());
    return 0;
}

/* hipMalloc MiB chunks until refused, an array and a VMM handle left live, then hipDeviceReset:
 * the runtime frees everything, so the budget is whole again (reset_free), and fills again. */
static int cmd_reset(size_t mib) {
    start();
    NEED(hipDeviceReset);
    struct object o = {0};
    unsigned long long size;
    printf("array_status=%d\n", create_object("array", mib, &o, &size));
    printf("vmm_status=%d\n", create_object("vmm", mib, &o, &size));
    static void *held[MAX_OBJECTS];
    int count;
    hipError_t last;
    unsigned long long bytes = fill_chunks(held, &count, mib * MIB, &last, 0);
    printf("held_bytes=%llu\nfull_free=%zu\n", bytes, info_free());
    printf("reset_status=%d\n", api.hipDeviceReset());
    start();
    printf("reset_free=%zu\n", info_free());
    bytes = fill_chunks(held, &count, mib * MIB, &last, 0);
    printf("refill_bytes=%llu\n", bytes);
    for (int i = 0; i < count; i++) api.hipFree(held[i]);
    driver_stats();
    return 0;
}

static int cmd_hold(size_t mib, size_t max_mib) {
    start();
    NEED(hipMalloc);
    static void *held[MAX_OBJECTS];
    int count;
    hipError_t last;
    unsigned long long bytes = fill_chunks(held, &count, mib * MIB, &last, max_mib * MIB);
    printf("held_bytes=%llu\nhold_status=%d\nready=1\n", bytes, last);
    fflush(stdout);
    char buffer[64];
    while (read(0, buffer, sizeof buffer) > 0) {
    }
    for (int i = 0; i < count; i++) api.hipFree(held[i]);
    printf("released=1\n");
    return 0;
}

/* Nanoseconds this thread has spent runnable but waiting for a CPU (the kernel's run_delay in
 * /proc/thread-self/schedstat): what a busy machine, not the limiter, took from a share test. */
static long long starved_ns(void) {
    FILE *f = fopen("/proc/thread-self/schedstat", "r");
    long long running = 0, waiting = 0;
    if (!f) return 0;
    if (fscanf(f, "%lld %lld", &running, &waiting) != 2) waiting = 0;
    fclose(f);
    return waiting;
}

static long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000ll + t.tv_nsec;
}

static int cmd_bench(long n) {
    start();
    NEED(hipMalloc);
    NEED(hipFree);
    void *p;
    for (long i = 0; i < 1000; i++) { /* warm up */
        api.hipMalloc(&p, MIB);
        api.hipFree(p);
    }
    long long t0 = now_ns();
    for (long i = 0; i < n; i++) {
        api.hipMalloc(&p, MIB);
        api.hipFree(p);
    }
    long long t1 = now_ns();
    size_t free, total;
    for (long i = 0; i < n; i++) api.hipMemGetInfo(&free, &total);
    long long t2 = now_ns();
    printf("alloc_free_ns=%.2f\nget_info_ns=%.2f\n", (double)(t1 - t0) / n, (double)(t2 - t1) / n);
    return 0;
}

static int cmd_nodevice(void) {
    NEED(hipInit);
    NEED(hipGetDeviceCount);
    NEED(hipMalloc);
    printf("init_status=%d\n", api.hipInit(0));
    int count = -1;
    printf("count_status=%d\n", api.hipGetDeviceCount(&count));
    printf("count=%d\n", count);
    void *p = NULL;
    printf("malloc_status=%d\n", api.hipMalloc(&p, MIB));
    size_t free = 0, total = 0;
    if (api.hipMemGetInfo) printf("info_status=%d\n", api.hipMemGetInfo(&free, &total));
    printf("procaddr_present=%d\n", dlsym(runtime_handle(), "hipGetProcAddress") != NULL);
    /* Preloaded, the library exports hipGetProcAddress even where the runtime has none: calling it
     * must give an error code, not a crash (-1: nothing exports it). */
    GetProcAddress exported = (GetProcAddress)dlsym(RTLD_DEFAULT, "hipGetProcAddress");
    void *fn = NULL;
    hipDriverProcAddressQueryResult status;
    printf("exported_procaddr_status=%d\n", exported ? exported("hipMalloc", &fn, 60200000, 0, &status) : -1);
    return 0;
}

/* Launches of KIND (kernel, module, graph) of `ns` each for `seconds` of wall time, then a
 * synchronize: how much of that time the fake device was busy. */
static int cmd_launch(const char *kind, unsigned long long ns, double seconds) {
    start();
    NEED(hipDeviceSynchronize);
    void *(*make)(unsigned long long) = (void *(*)(unsigned long long))dlsym(RTLD_DEFAULT, "fakehip_kernel");
    unsigned long long (*busy)(int) = (unsigned long long (*)(int))dlsym(RTLD_DEFAULT, "fakehip_busy_ns");
    if (!make || !busy) {
        printf("unresolved=fakehip_kernel\n");
        return 3;
    }
    void *kernel = make(ns);
    dim3 one = {1, 1, 1};
    long long t0 = now_ns(), launches = 0, starved = starved_ns();
    hipError_t status = hipSuccess;
    while (status == hipSuccess && now_ns() - t0 < (long long)(seconds * 1e9)) {
        if (strcmp(kind, "kernel") == 0) status = (NEED(hipLaunchKernel), api.hipLaunchKernel(kernel, one, one, NULL, 0, NULL));
        else if (strcmp(kind, "module") == 0)
            status = (NEED(hipModuleLaunchKernel), api.hipModuleLaunchKernel(kernel, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
        else if (strcmp(kind, "spt") == 0)
            status = (NEED(hipLaunchKernel_spt), api.hipLaunchKernel_spt(kernel, one, one, NULL, 0, NULL));
        else if (strcmp(kind, "cooperative") == 0)
            status = (NEED(hipLaunchCooperativeKernel), api.hipLaunchCooperativeKernel(kernel, one, one, NULL, 0, NULL));
        else if (strcmp(kind, "ext") == 0)
            status = (NEED(hipExtLaunchKernel), api.hipExtLaunchKernel(kernel, one, one, NULL, 0, NULL, NULL, NULL, 0));
        else status = (NEED(hipGraphLaunch), api.hipGraphLaunch(kernel, NULL));
        launches++;
        /* Like a real program, keep little work queued: at most 10 ms ahead of the wall clock. */
        if ((long long)(launches * ns) > now_ns() - t0 + 10000000) api.hipDeviceSynchronize();
    }
    api.hipDeviceSynchronize();
    long long wall = now_ns() - t0;
    unsigned long long busy_ns = busy(0);
    printf("launch_status=%d\nlaunches=%lld\nwall_ns=%lld\nbusy_ns=%llu\nshare_pct=%.1f\nstarved_ns=%lld\n", status,
           launches, wall, busy_ns, 100.0 * busy_ns / wall, starved_ns() - starved);
    return 0;
}

/* One copy or memset of KIND between the device buffers a and b of n bytes (an array of n bytes,
 * and host memory of n bytes, for the kinds that need them). */
static hipError_t copy_once(const char *kind, void *a, void *b, hipArray_t array, void *host, size_t n) {
    size_t row = MIB, rows = n / MIB, cells = 16384;
    hipPitchedPtr pa = {a, row, row, rows}, pb = {b, row, row, rows};
    hipExtent extent = {row, rows, 1};
    if (strcmp(kind, "memcpy") == 0) return NEED(hipMemcpy), api.hipMemcpy(a, b, n, hipMemcpyDeviceToDevice);
    if (strcmp(kind, "memcpyasync") == 0)
        return NEED(hipMemcpyAsync), api.hipMemcpyAsync(a, b, n, hipMemcpyDeviceToDevice, NULL);
    if (strcmp(kind, "dtod") == 0) return NEED(hipMemcpyDtoD), api.hipMemcpyDtoD(a, b, n);
    if (strcmp(kind, "dtodasync") == 0) return NEED(hipMemcpyDtoDAsync), api.hipMemcpyDtoDAsync(a, b, n, NULL);
    if (strcmp(kind, "memset") == 0) return NEED(hipMemset), api.hipMemset(a, 0, n);
    if (strcmp(kind, "memsetasync") == 0) return NEED(hipMemsetAsync), api.hipMemsetAsync(a, 0, n, NULL);
    if (strcmp(kind, "d8") == 0) return NEED(hipMemsetD8), api.hipMemsetD8(a, 0, n);
    if (strcmp(kind, "d8async") == 0) return NEED(hipMemsetD8Async), api.hipMemsetD8Async(a, 0, n, NULL);
    if (strcmp(kind, "d16") == 0) return NEED(hipMemsetD16), api.hipMemsetD16(a, 0, n / 2);
    if (strcmp(kind, "d32") == 0) return NEED(hipMemsetD32), api.hipMemsetD32(a, 0, n / 4);
    if (strcmp(kind, "d32async") == 0) return NEED(hipMemsetD32Async), api.hipMemsetD32Async(a, 0, n / 4, NULL);
    if (strcmp(kind, "memcpydefault") == 0) return NEED(hipMemcpy), api.hipMemcpy(a, b, n, hipMemcpyDefault);
    if (strcmp(kind, "asyncdefault") == 0)
        return NEED(hipMemcpyAsync), api.hipMemcpyAsync(a, b, n, hipMemcpyDefault, NULL);
    if (strcmp(kind, "defaulthost") == 0) return NEED(hipMemcpy), api.hipMemcpy(a, host, n, hipMemcpyDefault);
    if (strcmp(kind, "withstream") == 0)
        return NEED(hipMemcpyWithStream), api.hipMemcpyWithStream(a, b, n, hipMemcpyDeviceToDevice, NULL);
    if (strcmp(kind, "memcpyspt") == 0) return NEED(hipMemcpy_spt), api.hipMemcpy_spt(a, b, n, hipMemcpyDeviceToDevice);
    if (strcmp(kind, "2d") == 0)
        return NEED(hipMemcpy2D), api.hipMemcpy2D(a, row, b, row, row, rows, hipMemcpyDeviceToDevice);
    if (strcmp(kind, "2dasync") == 0)
        return NEED(hipMemcpy2DAsync), api.hipMemcpy2DAsync(a, row, b, row, row, rows, hipMemcpyDeviceToDevice, NULL);
    if (strcmp(kind, "2dspt") == 0)
        return NEED(hipMemcpy2D_spt), api.hipMemcpy2D_spt(a, row, b, row, row, rows, hipMemcpyDeviceToDevice);
    if (strcmp(kind, "2ddefault") == 0)
        return NEED(hipMemcpy2D), api.hipMemcpy2D(a, row, b, row, row, rows, hipMemcpyDefault);
    if (strcmp(kind, "2dtoarray") == 0)
        return NEED(hipMemcpy2DToArray), api.hipMemcpy2DToArray(array, 0, 0, b, cells, cells, n / cells, hipMemcpyDefault);
    if (strcmp(kind, "2dfromarray") == 0)
        return NEED(hipMemcpy2DFromArray),
               api.hipMemcpy2DFromArray(a, cells, array, 0, 0, cells, n / cells, hipMemcpyDeviceToDevice);
    if (strcmp(kind, "3d") == 0 || strcmp(kind, "3dasync") == 0 || strcmp(kind, "3ddefault") == 0) {
        hipMemcpy3DParms p;
        memset(&p, 0, sizeof p);
        p.srcPtr = pb;
        p.dstPtr = pa;
        p.extent = extent;
        p.kind = strcmp(kind, "3ddefault") == 0 ? hipMemcpyDefault : hipMemcpyDeviceToDevice;
        if (strcmp(kind, "3dasync") == 0) return NEED(hipMemcpy3DAsync), api.hipMemcpy3DAsync(&p, NULL);
        return NEED(hipMemcpy3D), api.hipMemcpy3D(&p);
    }
    if (strcmp(kind, "param2d") == 0) {
        NEED(hipMemcpyParam2D);
        NEED(hipRuntimeGetVersion);
        int v = 0;
        api.hipRuntimeGetVersion(&v);
        hip_Memcpy2D p;
        memset(&p, 0, sizeof p);
        p.srcMemoryType = p.dstMemoryType = v >= 60000000 ? 2 : 1; /* hipMemoryTypeDevice */
        p.srcDevice = b;
        p.dstDevice = a;
        p.srcPitch = p.dstPitch = p.WidthInBytes = row;
        p.Height = rows;
        return api.hipMemcpyParam2D(&p);
    }
    if (strncmp(kind, "drv3d", 5) == 0) {
        /* hipMemoryType: host, device, array (5.x: 0, 1, 2; 6.x: 1, 2, 10). */
        NEED(hipRuntimeGetVersion);
        int v = 0;
        api.hipRuntimeGetVersion(&v);
        int host_type = v >= 60000000 ? 1 : 0, device_type = v >= 60000000 ? 2 : 1, array_type = v >= 60000000 ? 10 : 2;
        int host_src = strcmp(kind, "drv3dhost") == 0, to_array = strcmp(kind, "drv3darray") == 0;
        HIP_MEMCPY3D_R5 r5;
        HIP_MEMCPY3D_R6 r6;
        memset(&r5, 0, sizeof r5);
        memset(&r6, 0, sizeof r6);
#define FILL(p, w)                                                                                         \
    do {                                                                                                   \
        p.srcMemoryType = host_src ? host_type : device_type;                                              \
        p.srcHost = host;                                                                                  \
        p.srcDevice = b;                                                                                   \
        p.dstMemoryType = to_array ? array_type : device_type;                                             \
        p.dstDevice = a;                                                                                   \
        p.dstArray = array;                                                                                \
        p.srcPitch = p.dstPitch = p.WidthInBytes = (w)(to_array ? cells : row);                            \
        p.Height = (w)(to_array ? n / cells : rows);                                                       \
        p.Depth = 1;                                                                                       \
    } while (0)
        FILL(r5, unsigned int);
        FILL(r6, size_t);
#undef FILL
        const void *p = v >= 60000000 ? (const void *)&r6 : (const void *)&r5;
        if (strcmp(kind, "drv3dasync") == 0) return NEED(hipDrvMemcpy3DAsync), api.hipDrvMemcpy3DAsync(p, NULL);
        return NEED(hipDrvMemcpy3D), api.hipDrvMemcpy3D(p);
    }
    /* The buffer a is the symbol (the fake takes any device address for one). */
    if (strcmp(kind, "tosymbol") == 0) return NEED(hipMemcpyToSymbol), api.hipMemcpyToSymbol(a, b, n, 0, hipMemcpyDeviceToDevice);
    if (strcmp(kind, "tosymbolasync") == 0)
        return NEED(hipMemcpyToSymbolAsync), api.hipMemcpyToSymbolAsync(a, b, n, 0, hipMemcpyDeviceToDevice, NULL);
    if (strcmp(kind, "tosymbolspt") == 0)
        return NEED(hipMemcpyToSymbol_spt), api.hipMemcpyToSymbol_spt(a, b, n, 0, hipMemcpyDefault);
    if (strcmp(kind, "tosymbolasyncspt") == 0)
        return NEED(hipMemcpyToSymbolAsync_spt), api.hipMemcpyToSymbolAsync_spt(a, b, n, 0, hipMemcpyDefault, NULL);
    if (strcmp(kind, "fromsymbol") == 0)
        return NEED(hipMemcpyFromSymbol), api.hipMemcpyFromSymbol(b, a, n, 0, hipMemcpyDeviceToDevice);
    if (strcmp(kind, "fromsymbolasync") == 0)
        return NEED(hipMemcpyFromSymbolAsync), api.hipMemcpyFromSymbolAsync(b, a, n, 0, hipMemcpyDeviceToDevice, NULL);
    if (strcmp(kind, "fromsymbolspt") == 0)
        return NEED(hipMemcpyFromSymbol_spt), api.hipMemcpyFromSymbol_spt(b, a, n, 0, hipMemcpyDefault);
    if (strcmp(kind, "fromsymbolasyncspt") == 0)
        return NEED(hipMemcpyFromSymbolAsync_spt), api.hipMemcpyFromSymbolAsync_spt(b, a, n, 0, hipMemcpyDefault, NULL);
    if (strcmp(kind, "tosymbolhost") == 0)
        return NEED(hipMemcpyToSymbol), api.hipMemcpyToSymbol(a, host, n, 0, hipMemcpyHostToDevice);
    if (strcmp(kind, "fromsymbolhost") == 0)
        return NEED(hipMemcpyFromSymbol), api.hipMemcpyFromSymbol(host, a, n, 0, hipMemcpyDefault);
    if (strcmp(kind, "peer") == 0) return NEED(hipMemcpyPeer), api.hipMemcpyPeer(a, 0, b, 0, n);
    if (strcmp(kind, "memset2d") == 0) return NEED(hipMemset2D), api.hipMemset2D(a, row, 0, row, rows);
    if (strcmp(kind, "memset2dasync") == 0)
        return NEED(hipMemset2DAsync), api.hipMemset2DAsync(a, row, 0, row, rows, NULL);
    if (strcmp(kind, "memset3d") == 0) return NEED(hipMemset3D), api.hipMemset3D(pa, 0, extent);
    if (strcmp(kind, "memset3dasync") == 0) return NEED(hipMemset3DAsync), api.hipMemset3DAsync(pa, 0, extent, NULL);
    if (strcmp(kind, "host") == 0) return NEED(hipMemcpy), api.hipMemcpy(a, b, n, hipMemcpyHostToDevice);
    printf("unknown_kind=%s\n", kind);
    exit(2);
}

/* Device-side copies or memsets of KIND, MiB each, for `seconds` of wall time, then a synchronize:
 * how much of that time the fake device was busy. */
static int cmd_copy(const char *kind, size_t mib, double seconds) {
    start();
    NEED(hipMalloc);
    NEED(hipMallocArray);
    NEED(hipDeviceSynchronize);
    NEED(hipGetLastError);
    unsigned long long (*busy)(int) = (unsigned long long (*)(int))dlsym(RTLD_DEFAULT, "fakehip_busy_ns");
    unsigned long long (*queries)(void) = (unsigned long long (*)(void))dlsym(RTLD_DEFAULT, "fakehip_pointer_queries");
    unsigned long long (*records)(void) = (unsigned long long (*)(void))dlsym(RTLD_DEFAULT, "fakehip_event_records");
    if (!busy || !queries || !records) {
        printf("unresolved=fakehip_busy_ns\n");
        return 3;
    }
    void *a = NULL, *b = NULL;
    hipArray_t array = NULL;
    size_t n = mib * MIB;
    hipChannelFormatDesc float4 = {32, 32, 32, 32, hipChannelFormatKindFloat};
    api.hipMalloc(&a, n);
    api.hipMalloc(&b, n);
    if (strstr(kind, "array")) api.hipMallocArray(&array, &float4, 1024, n / 16384, 0);
    void *host = calloc(1, n);
    long long t0 = now_ns(), copies = 0, starved = starved_ns();
    hipError_t status = hipSuccess;
    while (status == hipSuccess && now_ns() - t0 < (long long)(seconds * 1e9)) {
        status = copy_once(kind, a, b, array, host, n);
        copies++;
        if ((long long)busy(0) > now_ns() - t0 + 10000000) api.hipDeviceSynchronize();
    }
    api.hipDeviceSynchronize();
    long long wall = now_ns() - t0;
    unsigned long long busy_ns = busy(0);
    printf("copy_status=%d\ncopies=%lld\nwall_ns=%lld\nbusy_ns=%llu\nshare_pct=%.1f\nstarved_ns=%lld\n", status, copies,
           wall, busy_ns, 100.0 * busy_ns / wall, starved_ns() - starved);
    printf("last_error=%d\npointer_queries=%llu\nevent_records=%llu\n", api.hipGetLastError(), queries(), records());
    free(host);
    if (array) api.hipFreeArray(array);
    api.hipFree(a);
    api.hipFree(b);
    return 0;
}

/* NULL and bogus arguments to the hooked calls: each status, then what is left of the budget. */
static int cmd_nulls(void) {
    start();
    NEED(hipMalloc);
    NEED(hipFree);
    NEED(hipMallocPitch);
    NEED(hipMemCreate);
    NEED(hipDeviceTotalMem);
    NEED(hipMallocArray);
    size_t pitch = 0, free = 0;
    hipMemGenericAllocationHandle_t handle = 0;
    hipArray_t array = NULL;
    printf("malloc_null=%d\n", api.hipMalloc(NULL, MIB));
    printf("pitch_null=%d\n", api.hipMallocPitch(NULL, &pitch, 1000, 10));
    printf("pitch_null_pitch=%d\n", api.hipMallocPitch((void **)&array, NULL, 1000, 10));
    printf("info_null=%d\n", api.hipMemGetInfo(NULL, NULL));
    printf("info_null_total=%d\n", api.hipMemGetInfo(&free, NULL));
    printf("total_null=%d\n", api.hipDeviceTotalMem(NULL, device()));
    printf("total_bad_device=%d\n", api.hipDeviceTotalMem(&free, 99));
    printf("props_null=%d\n", api.hipGetDeviceProperties ? api.hipGetDeviceProperties(NULL, device()) : -1);
    printf("free_bogus=%d\n", api.hipFree((void *)0x1234));
    printf("free_null=%d\n", api.hipFree(NULL));
    printf("create_null_prop=%d\n", api.hipMemCreate(&handle, MIB, NULL, 0));
    printf("release_bogus=%d\n", api.hipMemRelease(0x5678));
    printf("array_null_desc=%d\n", api.hipMallocArray(&array, NULL, 16, 16, 0));
    printf("free_array_bogus=%d\n", api.hipFreeArray((hipArray_t)0x9abc));
    printf("after_free=%zu\n", info_free());
    driver_stats();
    return 0;
}

static int cmd_symbols(void) {
    void *h = runtime_handle();
    gpa = (GetProcAddress)dlsym(h, "hipGetProcAddress");
    if (!gpa) {
        printf("unresolved=hipGetProcAddress\n");
        return 3;
    }
    hipDriverProcAddressQueryResult status = -1;
    void *fn = NULL;
    /* What the preloaded library exports under each name: RTLD_DEFAULT finds it first. */
    gpa("hipMalloc", &fn, 60200000, 0, &status);
    printf("malloc_ours=%d\nmalloc_status=%d\n", fn == dlsym(RTLD_DEFAULT, "hipMalloc"), status);
    gpa("hipGetDeviceProperties", &fn, 50200000, 0, &status);
    printf("props_52_ours=%d\n", fn == dlsym(RTLD_DEFAULT, "hipGetDeviceProperties"));
    gpa("hipGetDeviceProperties", &fn, 60200000, 0, &status);
    printf("props_62_ours=%d\n", fn == dlsym(RTLD_DEFAULT, "hipGetDevicePropertiesR0600"));
    /* RTLD_NEXT from the executable: the preloaded library is next, if dlsym kept our identity. */
    printf("next_ours=%d\n", dlsym(RTLD_NEXT, "hipMalloc") == dlsym(RTLD_DEFAULT, "hipMalloc"));
    gpa("hipGetDeviceCount", &fn, 60200000, 0, &status);
    printf("count_runtime=%d\n", fn != NULL && fn == dlsym(h, "hipGetDeviceCount"));
    gpa("hipGetProcAddress", &fn, 60200000, 0, &status);
    printf("procaddr_ours=%d\n", fn == dlsym(RTLD_DEFAULT, "hipGetProcAddress"));
    fn = (void *)1;
    hipError_t result = gpa("hipMemCreate", &fn, 50000000, 0, &status);
    printf("too_new_result=%d\ntoo_new_status=%d\ntoo_new_null=%d\n", result, status, fn == NULL);
    result = gpa("hipNoSuchFunction", &fn, 60200000, 0, &status);
    printf("unknown_result=%d\nunknown_status=%d\n", result, status);
    return 0;
}

/* ROCm SMI's memory view, as rocm-smi reads it (dlopen + dlsym, as its Python bindings do). */
static int cmd_smi(void) {
    const char *name = getenv("HIP_CLIENT_SMI");
    void *h = dlopen(name ? name : "librocm_smi64.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!h) {
        printf("dlopen_error=%s\n", dlerror());
        return 4;
    }
    int (*init)(uint64_t) = (int (*)(uint64_t))dlsym(h, "rsmi_init");
    int (*count)(uint32_t *) = (int (*)(uint32_t *))dlsym(h, "rsmi_num_monitor_devices");
    int (*total)(uint32_t, int, uint64_t *) = (int (*)(uint32_t, int, uint64_t *))dlsym(h, "rsmi_dev_memory_total_get");
    int (*usage)(uint32_t, int, uint64_t *) = (int (*)(uint32_t, int, uint64_t *))dlsym(h, "rsmi_dev_memory_usage_get");
    if (!init || !count || !total || !usage) {
        printf("unresolved=rsmi\n");
        return 3;
    }
    Dl_info info;
    const char *file = dladdr((void *)total, &info) && info.dli_fname ? info.dli_fname : "?";
    printf("smi_total_in=%s\n", strrchr(file, '/') ? strrchr(file, '/') + 1 : file);
    printf("init_status=%d\n", init(0));
    uint32_t n = 0;
    int status = count(&n);
    printf("count_status=%d\nsmi_count=%u\n", status, n);
    for (uint32_t i = 0; i < n; i++) {
        uint64_t t = 0, u = 0;
        printf("total_status_%u=%d\n", i, total(i, 0, &t));
        printf("used_status_%u=%d\n", i, usage(i, 0, &u));
        printf("smi_total_%u=%llu\nsmi_used_%u=%llu\n", i, (unsigned long long)t, i, (unsigned long long)u);
    }
    /* A device past the last, and a NULL out-pointer: ROCm SMI's own answers. */
    uint64_t t = 0;
    printf("past_status=%d\n", total(n + 5, 0, &t));
    printf("null_status=%d\n", total(0, 0, NULL));
    return 0;
}

#define AMDSMI_FUNCTIONS(X)                                                                                \
    X(amdsmi_init) X(amdsmi_shut_down) X(amdsmi_get_socket_handles) X(amdsmi_get_processor_handles)         \
    X(amdsmi_get_gpu_device_uuid) X(amdsmi_get_gpu_memory_total) X(amdsmi_get_gpu_memory_usage)            \
    X(amdsmi_get_gpu_vram_usage)

/* The file `fn` lies in, without its directory. */
static const char *file_of(void *fn) {
    Dl_info info;
    const char *file = dladdr(fn, &info) && info.dli_fname ? info.dli_fname : "?";
    return strrchr(file, '/') ? strrchr(file, '/') + 1 : file;
}

/* AMD SMI's memory view, as amd-smi reads it: `metric --mem-usage` (memory total and usage) and
 * `monitor` (vram_usage), for every GPU of every socket. */
static int cmd_amdsmi(void) {
    struct {
#define FIELD(name) __typeof__(&name) name;
        AMDSMI_FUNCTIONS(FIELD)
#undef FIELD
    } smi;
    void *h = NULL;
    if (strcmp(path, "dlsym") == 0) {
        const char *name = getenv("HIP_CLIENT_AMDSMI");
        h = dlopen(name ? name : "libamd_smi.so", RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            printf("dlopen_error=%s\n", dlerror());
            return 4;
        }
#define BY_DLSYM(name)                                                                                     \
    if (!(*(void **)&smi.name = dlsym(h, #name))) unresolved(#name);
        AMDSMI_FUNCTIONS(BY_DLSYM)
#undef BY_DLSYM
#ifdef HIP_CLIENT_DIRECT
    } else if (strcmp(path, "direct") == 0) {
#define DIRECT(name) smi.name = name;
        AMDSMI_FUNCTIONS(DIRECT)
#undef DIRECT
#endif
    } else {
        printf("unknown_path=%s\n", path);
        return 2;
    }
    printf("amdsmi_total_in=%s\n", file_of((void *)smi.amdsmi_get_gpu_memory_total));
    printf("amdsmi_vram_in=%s\n", file_of((void *)smi.amdsmi_get_gpu_vram_usage));
    printf("init_status=%d\n", smi.amdsmi_init(AMDSMI_INIT_AMD_GPUS));
    amdsmi_socket_handle sockets[4];
    uint32_t socket_count = 4;
    printf("sockets_status=%d\n", smi.amdsmi_get_socket_handles(&socket_count, sockets));
    uint32_t n = 0;
    amdsmi_processor_handle first = NULL;
    for (uint32_t s = 0; s < socket_count && s < 4; s++) {
        amdsmi_processor_handle gpus[16];
        uint32_t count = 16;
        if (smi.amdsmi_get_processor_handles(sockets[s], &count, gpus) != AMDSMI_STATUS_SUCCESS) continue;
        for (uint32_t g = 0; g < count && g < 16; g++, n++) {
            amdsmi_processor_handle gpu = gpus[g];
            if (!first) first = gpu;
            char uuid[64] = "";
            unsigned int length = sizeof uuid;
            printf("uuid_status_%u=%d\namdsmi_uuid_%u=%s\n", n, smi.amdsmi_get_gpu_device_uuid(gpu, &length, uuid), n,
                   uuid);
            uint64_t total = 0, used = 0, visible = 0;
            printf("total_status_%u=%d\n", n, smi.amdsmi_get_gpu_memory_total(gpu, AMDSMI_MEM_TYPE_VRAM, &total));
            printf("used_status_%u=%d\n", n, smi.amdsmi_get_gpu_memory_usage(gpu, AMDSMI_MEM_TYPE_VRAM, &used));
            printf("vis_status_%u=%d\n", n,
                   smi.amdsmi_get_gpu_memory_total(gpu, AMDSMI_MEM_TYPE_VIS_VRAM, &visible));
            printf("amdsmi_total_%u=%llu\namdsmi_used_%u=%llu\namdsmi_vis_total_%u=%llu\n", n,
                   (unsigned long long)total, n, (unsigned long long)used, n, (unsigned long long)visible);
            uint64_t gtt = 0;
            printf("gtt_status_%u=%d\n", n, smi.amdsmi_get_gpu_memory_total(gpu, AMDSMI_MEM_TYPE_GTT, &gtt));
            amdsmi_vram_usage_t vram;
            memset(&vram, 0, sizeof vram);
            printf("vram_status_%u=%d\n", n, smi.amdsmi_get_gpu_vram_usage(gpu, &vram));
            printf("amdsmi_vram_total_mb_%u=%u\namdsmi_vram_used_mb_%u=%u\n", n, vram.vram_total, n, vram.vram_used);
        }
    }
    printf("amdsmi_count=%u\n", n);
    /* The ROCm SMI built into libamd_smi, called by name (dlsym path): what libamd_smi's own calls
     * into it reach outside our AMD SMI hooks (its amdsmi_get_gpu_vram_info does). */
    int (*rsmi_total)(uint32_t, int, uint64_t *) =
        h ? (int (*)(uint32_t, int, uint64_t *))dlsym(h, "rsmi_dev_memory_total_get") : NULL;
    for (uint32_t i = 0; rsmi_total && i < n; i++) {
        uint64_t total = 0;
        int status = rsmi_total(i, AMDSMI_MEM_TYPE_VRAM, &total);
        printf("builtin_rsmi_status_%u=%d\nbuiltin_rsmi_total_%u=%llu\n", i, status, i, (unsigned long long)total);
    }
    /* NULL out-pointers and a handle that is none of libamd_smi's: its own answers. */
    uint64_t t = 0;
    printf("null_total_status=%d\n", smi.amdsmi_get_gpu_memory_total(first, AMDSMI_MEM_TYPE_VRAM, NULL));
    printf("null_used_status=%d\n", smi.amdsmi_get_gpu_memory_usage(first, AMDSMI_MEM_TYPE_VRAM, NULL));
    printf("null_vram_status=%d\n", smi.amdsmi_get_gpu_vram_usage(first, NULL));
    printf("bogus_total_status=%d\n", smi.amdsmi_get_gpu_memory_total((void *)&t, AMDSMI_MEM_TYPE_VRAM, &t));
    printf("shut_down_status=%d\n", smi.amdsmi_shut_down());
    printf("after_shut_down_status=%d\n", smi.amdsmi_get_gpu_memory_total(first, AMDSMI_MEM_TYPE_VRAM, &t));
    return 0;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 3) {
        fprintf(stderr, "usage: hip_client PATH COMMAND [ARG...]\n");
        return 2;
    }
    path = argv[1];
    const char *command = argv[2];
    if (strcmp(command, "symbols") == 0) return cmd_symbols();
    if (strcmp(command, "smi") == 0) return cmd_smi();
    if (strcmp(command, "amdsmi") == 0) return cmd_amdsmi();
    resolve();
    if (strcmp(command, "fill") == 0 && argc > 3) return cmd_fill(strtoull(argv[3], NULL, 10));
    if (strcmp(command, "family") == 0 && argc > 4) return cmd_family(argv[3], strtoull(argv[4], NULL, 10));
    if (strcmp(command, "hold") == 0 && argc > 3) return cmd_hold(strtoull(argv[3], NULL, 10), argc > 4 ? strtoull(argv[4], NULL, 10) : 0);
    if (strcmp(command, "bench") == 0 && argc > 3) return cmd_bench(strtol(argv[3], NULL, 10));
    if (strcmp(command, "nodevice") == 0) return cmd_nodevice();
    if (strcmp(command, "nulls") == 0) return cmd_nulls();
    if (strcmp(command, "pools") == 0 && argc > 3) return cmd_pools(strtoull(argv[3], NULL, 10));
    if (strcmp(command, "streams") == 0 && argc > 3) return cmd_streams(strtoull(argv[3], NULL, 10));
    if (strcmp(command, "copy") == 0 && argc > 5)
        return cmd_copy(argv[3], strtoull(argv[4], NULL, 10), strtod(argv[5], NULL));
    if (strcmp(command, "reset") == 0 && argc > 3) return cmd_reset(strtoull(argv[3], NULL, 10));
    if (strcmp(command, "launch") == 0 && argc > 5)
        return cmd_launch(argv[3], strtoull(argv[4], NULL, 10), strtod(argv[5], NULL));
    fprintf(stderr, "unknown command %s\n", command);
    return 2;
}
