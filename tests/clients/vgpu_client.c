/* A CUDA client for libvgpu's tests, demo and benchmark.
 *
 *   vgpu_client PATH COMMAND [ARG]
 *
 * PATH is how the driver's functions are reached, one of the three ways docs/architecture.md names
 * ("How a call reaches libvgpu"):
 *   direct        linked against libcuda and called by name (preloaded symbols interpose)
 *   dlsym         dlopen("libcuda.so.1") + dlsym for every entry point
 *   procaddr      cudart 12+ style: dlsym "cuGetProcAddress_v2", then everything through it at 12000
 *   procaddr_v1   cudart 11 style: dlsym "cuGetProcAddress", then everything through it at 11040
 *   vdlsym        as dlsym, through the dlsym that dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34") finds
 *                 (the architecture's first glibc version where 2.34 is absent), as interposers
 *                 resolve glibc's
 * COMMAND:
 *   fill MiB      allocate MiB-sized chunks until refused, free them all, fill again
 *   refuse MiB N  allocate MiB-sized chunks until refused, then try N more (all refused); print
 *                 held_bytes, refused (how many of the N got CUDA_ERROR_OUT_OF_MEMORY) and
 *                 refuse_ns (the N calls' wall time); free everything
 *   nvml          print NVML's memory view of every device
 *   symbols       print which function cuGetProcAddress hands out for old and new ABIs
 *   bench N       time N cuMemAlloc_v2+cuMemFree_v2 pairs and N cuMemGetInfo_v2 calls
 *   driver_stats  print the fake driver's own counters for device 0 (driver_used, driver_peak,
 *                 driver_alloc_calls); with FAKEGPU_SHARED they cover every process naming the file
 *   hold MiB [MAX] allocate MiB-sized chunks until refused or MAX MiB are held, print held_bytes,
 *                 hold_status (the last status) and ready=1, then block until stdin reaches EOF,
 *                 free everything and print released=1 (tests close stdin or SIGKILL it)
 *   dlmopen       a second copy of the driver, loaded with dlmopen(LM_ID_NEWLM) and its entry
 *                 points looked up with dlsym on that handle: second_open, second_elsewhere (how
 *                 many of the six addresses lie outside that copy), second_init_status,
 *                 second_alloc_status (one 64 MiB cuMemAlloc_v2 through the copy, freed again),
 *                 then first_bytes and first_status (64 MiB chunks through PATH until refused,
 *                 freed again)
 *   green         cuGreenCtxCreate/Destroy through dlsym: one charged while it lives, then as many as fit
 *   churn MiB     print ready=1, then allocate 1..MiB MiB and free again forever, at most 4 live
 *                 allocations, refusals ignored; only a signal ends it
 *   fork MiB      allocate one chunk, print parent_pid, fork; the child allocates two chunks on the
 *                 inherited current context, prints child_pid, child_bytes and child_status; once
 *                 it has, the parent prints ready=1; both block until stdin reaches EOF, free, and
 *                 the parent reaps the child (child_exit, released=1)
 *   stress S T MiB  T threads, each for S seconds: allocate 1..MiB MiB or free, at random, at most
 *                 8 live allocations per thread; print ops (allocation and free calls), allocs,
 *                 refused (status 2), frees, elapsed_ns (wall), and thread_ns and thread_cpu_ns (the
 *                 threads' wall and CPU time in their loops, summed)
 *   family NAME MiB  for allocation family NAME (pitch, managed, async, pool, vmm, array, array3d,
 *                 mipmap), create objects of about MiB each through PATH until refused; print
 *                 info_total and info_free (cuMemGetInfo_v2 before), NAME_size (bytes one object
 *                 costs by this client's model of the family, see create_object), NAME_bytes (the
 *                 sum over the objects made), NAME_status (the refusal), full_free, the fake's
 *                 driver_used and driver_peak on the charged device and driver_create_calls (calls
 *                 that reached the fake's creating entry point); destroy everything with the
 *                 family's own call (stream-ordered frees, then cuStreamSynchronize), print
 *                 freed_free, create again until refused (refill_bytes, refill_status), destroy
 *                 again (refilled_free). vmm first reserves 64 GiB of address space
 *                 (reserve_status), maps every handle into it and unmaps it before cuMemRelease;
 *                 CLIENT_LOCATION names the device its memory is placed on (default CLIENT_DEVICE)
 *   context       for FAKEGPU_CONTEXT_MEMORY: the primary context (primary_total, primary_free,
 *                 then a 64 MiB cuMemAlloc_v2 fill: primary_fill_bytes), a second retain
 *                 (retained_again_free), each of cuCtxCreate_v2/_v3/_v4 alone (ctx_vN_status,
 *                 ctx_vN_free while current, ctx_vN_driver_calls, ctx_vN_destroy_status,
 *                 ctx_vN_destroyed_free), all three at once (all_status, all_free, all_alloc_status
 *                 of one 64 MiB cuMemAlloc_v2, all_destroyed_free), one primary release
 *                 (released_once_free), the last release (released_status) and a cuCtxCreate_v2
 *                 after it (after_release_status, after_release_free)
 *   host MiB      cuMemHostAlloc, cuMemAllocHost_v2 and cuMemHostRegister_v2 of MiB each (their
 *                 *_status), info_free before and host_free after them, a 64 MiB device fill
 *                 (device_bytes, device_status), the host frees (*_free_status), released_free
 *   ipc MiB       cuMemAlloc_v2 one chunk (alloc_free), cuIpcGetMemHandle (ipc_get_status),
 *                 cuIpcOpenMemHandle_v2 of it in this process (ipc_open_status, opened_free), fill
 *                 the rest with chunks (opened_fill_bytes) and free them, cuIpcCloseMemHandle
 *                 (ipc_close_status, closed_free), free the chunk (released_free)
 *   nulls         NULL and bogus arguments to every hooked call, each call's status as key=value
 *                 (see cmd_nulls), then after_free (cuMemGetInfo_v2), driver_used, driver_peak
 *   lifetime WHAT MiB  objects whose memory outlives the call that looks like their end, each with
 *                 cuMemGetInfo_v2 free (KEY_free) and 64 MiB cuMemAlloc_v2 fills (KEY_bytes) between
 *                 steps: vmm (one handle mapped, retained by address, released twice while mapped,
 *                 then unmapped), pool (the default pool's release threshold at its maximum: an
 *                 allocation freed into it stays cached; reused; trimmed), graph (one allocation
 *                 node; instantiated twice, launched once, destroyed)
 *   passthrough   driver functions libvgpu does not hook (cuDeviceGetAttribute: attribute_*,
 *                 cuDriverGetVersion: version_*) fetched with cuGetProcAddress_v2 at 12000:
 *                 KEY_status, KEY_same (the address dlsym gives too), KEY_in_driver and
 *                 KEY_dlsym_in_driver (the address lies in libcuda), KEY_call_status, KEY_value
 * family, context, host, ipc and nulls also take PATH direct_ptsz, dlsym_ptsz or procaddr_ptsz: the
 * stream-ordered calls are then the per-thread default stream's (the `_ptsz` names, or
 * cuGetProcAddress_v2 with CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM). An entry point a command
 * needs that PATH does not resolve is printed as unresolved=NAME (exit 3).
 * Output is one key=value per line. CLIENT_DEVICE picks the CUDA ordinal (default 0). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <link.h>
#include <math.h>
#include <stddef.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cuda_subset.h"

typedef CUresult (*GetProcAddressV1)(const char *, void **, int, unsigned long long);
typedef CUresult (*GetProcAddressV2)(const char *, void **, int, unsigned long long, int *);

struct api {
    CUresult (*init)(unsigned int);
    CUresult (*device_get)(CUdevice *, int);
    CUresult (*primary_ctx_retain)(CUcontext *, CUdevice);
    CUresult (*ctx_set_current)(CUcontext);
    CUresult (*mem_alloc)(CUdeviceptr *, size_t);
    CUresult (*mem_free)(CUdeviceptr);
    CUresult (*mem_get_info)(size_t *, size_t *);
    CUresult (*device_total_mem)(size_t *, CUdevice);
};

static void *libcuda(void) {
    void *handle = dlopen("libcuda.so.1", RTLD_NOW);
    if (!handle) {
        fprintf(stderr, "dlopen libcuda.so.1: %s\n", dlerror());
        exit(3);
    }
    return handle;
}

/* A kernel of DURATION_NS of simulated work on the legacy stream, then a wait for it: through
 * SYNC13 (cuCtxSynchronize_v2's form, called with NULL) where given, else cuCtxSynchronize. */
static CUresult launch_and_sync(unsigned long long duration_ns, CUresult (*sync13)(void *)) {
    CUfunction (*kernel_of)(unsigned long long) =
        (CUfunction(*)(unsigned long long))dlsym(libcuda(), "fakegpu_kernel");
    CUresult (*launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
                       void **, void **) =
        (CUresult(*)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
                     void **, void **))dlsym(libcuda(), "cuLaunchKernel");
    CUresult (*sync)(void) = (CUresult(*)(void))dlsym(libcuda(), "cuCtxSynchronize");
    if (!kernel_of || !launch || !sync) return CUDA_ERROR_NOT_FOUND;
    CUresult status = launch(kernel_of(duration_ns), 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
    if (status != CUDA_SUCCESS) return status;
    return sync13 ? sync13(NULL) : sync();
}

/* Resolves a base name through cuGetProcAddress(_v2) the way cudart does. */
static void *through_proc_address(const char *path, const char *name, int version) {
    static GetProcAddressV1 v1;
    static GetProcAddressV2 v2;
    void *pfn = NULL;
    CUresult status;
    if (strcmp(path, "procaddr_v1") == 0) {
        if (!v1) v1 = (GetProcAddressV1)dlsym(libcuda(), "cuGetProcAddress");
        /* cudart 11 first fetches cuGetProcAddress itself through itself */
        GetProcAddressV1 self = NULL;
        if (!v1 || v1("cuGetProcAddress", (void **)&self, version, 0) != CUDA_SUCCESS || !self) return NULL;
        status = self(name, &pfn, version, 0);
    } else {
        if (!v2) v2 = (GetProcAddressV2)dlsym(libcuda(), "cuGetProcAddress_v2");
        GetProcAddressV2 self = NULL;
        int symbol_status = -1;
        if (!v2 || v2("cuGetProcAddress", (void **)&self, version, 0, &symbol_status) != CUDA_SUCCESS || !self)
            return NULL;
        status = self(name, &pfn, version, 0, &symbol_status);
    }
    return status == CUDA_SUCCESS ? pfn : NULL;
}

/* glibc's dlsym as an interposer finds it: by version, from the objects after this program. */
static void *(*versioned_dlsym(void))(void *, const char *) {
    void *found = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
#if defined(__aarch64__)
    if (!found) found = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.17");
#else
    if (!found) found = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
#endif
    if (!found) {
        fprintf(stderr, "dlvsym found no dlsym\n");
        exit(3);
    }
    return (void *(*)(void *, const char *))found;
}

static struct api load(const char *path) {
    struct api api;
    if (strcmp(path, "direct") == 0) {
        api.init = cuInit;
        api.device_get = cuDeviceGet;
        api.primary_ctx_retain = cuDevicePrimaryCtxRetain;
        api.ctx_set_current = cuCtxSetCurrent;
        api.mem_alloc = cuMemAlloc_v2;
        api.mem_free = cuMemFree_v2;
        api.mem_get_info = cuMemGetInfo_v2;
        api.device_total_mem = cuDeviceTotalMem_v2;
    } else if (strcmp(path, "dlsym") == 0 || strcmp(path, "vdlsym") == 0) {
        void *h = libcuda();
        void *(*lookup)(void *, const char *) = strcmp(path, "dlsym") == 0 ? dlsym : versioned_dlsym();
        *(void **)&api.init = lookup(h, "cuInit");
        *(void **)&api.device_get = lookup(h, "cuDeviceGet");
        *(void **)&api.primary_ctx_retain = lookup(h, "cuDevicePrimaryCtxRetain");
        *(void **)&api.ctx_set_current = lookup(h, "cuCtxSetCurrent");
        *(void **)&api.mem_alloc = lookup(h, "cuMemAlloc_v2");
        *(void **)&api.mem_free = lookup(h, "cuMemFree_v2");
        *(void **)&api.mem_get_info = lookup(h, "cuMemGetInfo_v2");
        *(void **)&api.device_total_mem = lookup(h, "cuDeviceTotalMem_v2");
    } else if (strcmp(path, "procaddr") == 0 || strcmp(path, "procaddr_v1") == 0) {
        int v = strcmp(path, "procaddr") == 0 ? 12000 : 11040;
        *(void **)&api.init = through_proc_address(path, "cuInit", v);
        *(void **)&api.device_get = through_proc_address(path, "cuDeviceGet", v);
        *(void **)&api.primary_ctx_retain = through_proc_address(path, "cuDevicePrimaryCtxRetain", v);
        *(void **)&api.ctx_set_current = through_proc_address(path, "cuCtxSetCurrent", v);
        *(void **)&api.mem_alloc = through_proc_address(path, "cuMemAlloc", v);
        *(void **)&api.mem_free = through_proc_address(path, "cuMemFree", v);
        *(void **)&api.mem_get_info = through_proc_address(path, "cuMemGetInfo", v);
        *(void **)&api.device_total_mem = through_proc_address(path, "cuDeviceTotalMem", v);
    } else {
        fprintf(stderr, "unknown path %s\n", path);
        exit(2);
    }
    void **slots = (void **)&api;
    for (size_t i = 0; i < sizeof api / sizeof(void *); i++) {
        if (!slots[i]) {
            fprintf(stderr, "entry point %zu not resolved through %s\n", i, path);
            exit(3);
        }
    }
    return api;
}

static void check(CUresult status, const char *what) {
    if (status != CUDA_SUCCESS) {
        printf("failed=%s status=%d\n", what, status);
        exit(4);
    }
}

static CUdevice open_device(const struct api *api) {
    const char *env = getenv("CLIENT_DEVICE");
    CUdevice device;
    CUcontext ctx;
    check(api->init(0), "cuInit");
    check(api->device_get(&device, env ? atoi(env) : 0), "cuDeviceGet");
    check(api->primary_ctx_retain(&ctx, device), "cuDevicePrimaryCtxRetain");
    check(api->ctx_set_current(ctx), "cuCtxSetCurrent");
    return device;
}

/* Prints what the driver's own ledger saw, when the driver is the fake one. */
static void print_driver_peak(void) {
    int (*stats)(unsigned, unsigned long long *, unsigned long long *, unsigned long long *) =
        (int (*)(unsigned, unsigned long long *, unsigned long long *, unsigned long long *))dlsym(
            libcuda(), "fakegpu_device_stats");
    unsigned long long used, peak, calls;
    if (stats && stats(0, &used, &peak, &calls) == 0)
        printf("driver_used=%llu\ndriver_peak=%llu\ndriver_alloc_calls=%llu\n", used, peak, calls);
}

/* Allocates `chunk` bytes at a time until refused; returns the count, prints the total. */
static size_t fill(const struct api *api, size_t chunk, CUdeviceptr *held, size_t cap, const char *label) {
    size_t n = 0;
    CUresult status = CUDA_SUCCESS;
    while (n < cap && (status = api->mem_alloc(&held[n], chunk)) == CUDA_SUCCESS) n++;
    printf("%s_bytes=%zu\n%s_status=%d\n", label, n * chunk, label, status);
    return n;
}

/* The fake's count of accepted cuMemAdvise(_v2) calls with advice value `advice` (0 when the
 * driver is not the fake). */
static unsigned long long driver_advice(int advice) {
    unsigned long long (*count)(int) = (unsigned long long (*)(int))dlsym(libcuda(), "fakegpu_advice_count");
    return count ? count(advice) : 0;
}

static int cmd_fill(const struct api *api, size_t chunk) {
    enum { CAP = 1 << 16 };
    static CUdeviceptr held[CAP];
    size_t free_bytes, total_bytes, device_total;
    CUdevice device = open_device(api);
    check(api->device_total_mem(&device_total, device), "cuDeviceTotalMem_v2");
    check(api->mem_get_info(&free_bytes, &total_bytes), "cuMemGetInfo_v2");
    printf("device_total=%zu\ninfo_total=%zu\ninfo_free=%zu\n", device_total, total_bytes, free_bytes);

    size_t n = fill(api, chunk, held, CAP, "first");
    check(api->mem_get_info(&free_bytes, &total_bytes), "cuMemGetInfo_v2");
    printf("full_free=%zu\n", free_bytes);
    print_driver_peak();
    /* CU_MEM_ADVISE_SET_PREFERRED_LOCATION (3) and CU_MEM_ADVISE_SET_ACCESSED_BY (5). */
    printf("advised_preferred=%llu\nadvised_accessed_by=%llu\n", driver_advice(3), driver_advice(5));
    for (size_t i = 0; i < n; i++) check(api->mem_free(held[i]), "cuMemFree_v2");
    check(api->mem_get_info(&free_bytes, &total_bytes), "cuMemGetInfo_v2");
    printf("freed_free=%zu\n", free_bytes);
    n = fill(api, chunk, held, CAP, "second");
    for (size_t i = 0; i < n; i++) check(api->mem_free(held[i]), "cuMemFree_v2");
    return 0;
}

/* Allocates `chunk`s until refused calling the driver's names directly, each call through this
 * program's own procedure linkage (no pointer kept): a tool that rewrites the program's global
 * offset table after it started sees every one of them. */
static int cmd_plt_fill(size_t chunk) {
    enum { CAP = 1 << 16 };
    static CUdeviceptr held[CAP];
    CUdevice device;
    CUcontext ctx;
    check(cuInit(0), "cuInit");
    check(cuDeviceGet(&device, 0), "cuDeviceGet");
    check(cuDevicePrimaryCtxRetain(&ctx, device), "cuDevicePrimaryCtxRetain");
    check(cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
    size_t free_bytes = 0, total_bytes = 0, n = 0;
    check(cuMemGetInfo_v2(&free_bytes, &total_bytes), "cuMemGetInfo_v2");
    CUresult status = CUDA_SUCCESS;
    while (n < CAP && (status = cuMemAlloc_v2(&held[n], chunk)) == CUDA_SUCCESS) n++;
    printf("info_total=%zu\nfirst_bytes=%zu\nfirst_status=%d\n", total_bytes, n * chunk, status);
    for (size_t i = 0; i < n; i++) check(cuMemFree_v2(held[i]), "cuMemFree_v2");
    return 0;
}

static int cmd_nvml(void) {
    void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!h) return 3;
    nvmlReturn_t (*init)(void) = (nvmlReturn_t (*)(void))dlsym(h, "nvmlInit_v2");
    nvmlReturn_t (*count)(unsigned *) = (nvmlReturn_t (*)(unsigned *))dlsym(h, "nvmlDeviceGetCount_v2");
    nvmlReturn_t (*handle)(unsigned, nvmlDevice_t *) =
        (nvmlReturn_t (*)(unsigned, nvmlDevice_t *))dlsym(h, "nvmlDeviceGetHandleByIndex_v2");
    nvmlReturn_t (*info)(nvmlDevice_t, nvmlMemory_t *) =
        (nvmlReturn_t (*)(nvmlDevice_t, nvmlMemory_t *))dlsym(h, "nvmlDeviceGetMemoryInfo");
    nvmlReturn_t (*info2)(nvmlDevice_t, nvmlMemory_v2_t *) =
        (nvmlReturn_t (*)(nvmlDevice_t, nvmlMemory_v2_t *))dlsym(h, "nvmlDeviceGetMemoryInfo_v2");
    unsigned n = 0;
    if (!init || !count || !handle || !info || !info2 || init() || count(&n)) return 3;
    printf("nvml_devices=%u\n", n);
    for (unsigned i = 0; i < n; i++) {
        nvmlDevice_t dev;
        nvmlMemory_t m = {0};
        nvmlMemory_v2_t m2 = {.version = nvmlMemory_v2};
        if (handle(i, &dev) || info(dev, &m) || info2(dev, &m2)) return 3;
        printf("nvml%u_total=%llu\nnvml%u_used=%llu\nnvml%u_free=%llu\n", i, m.total, i, m.used, i, m.free);
        printf("nvml%u_v2_total=%llu\nnvml%u_v2_free=%llu\n", i, m2.total, i, m2.free);
    }
    return 0;
}

/* Which function each ABI request yields: ours (the preloaded symbol) or the driver's own. */
static int cmd_symbols(void) {
    void *h = libcuda();
    GetProcAddressV2 gpa = (GetProcAddressV2)dlsym(h, "cuGetProcAddress_v2");
    void *old_abi = NULL, *new_abi = NULL, *self = NULL;
    int status_old = -1, status_new = -1, status_self = -1;
    CUresult r_old = gpa("cuMemAlloc", &old_abi, 3000, 0, &status_old);
    CUresult r_new = gpa("cuMemAlloc", &new_abi, 12000, 0, &status_new);
    CUresult r_self = gpa("cuGetProcAddress", &self, 12000, 0, &status_self);
    void *missing = (void *)1;
    int status_missing = -1;
    CUresult r_missing = gpa("cuNoSuchFunction", &missing, 12000, 0, &status_missing);
    void *ours = dlsym(RTLD_DEFAULT, "cuMemAlloc_v2");
    void *driver_v1 = dlsym(h, "cuMemAlloc"); /* not hooked: the driver's own v1 */
    printf("old_abi_status=%d\nold_abi_is_driver_v1=%d\n", r_old, old_abi != NULL && old_abi == driver_v1);
    printf("new_abi_status=%d\nnew_abi_is_hook=%d\n", r_new, new_abi != NULL && new_abi == ours);
    printf("self_status=%d\nself_is_hook=%d\n", r_self, self != NULL && self == dlsym(RTLD_DEFAULT, "cuGetProcAddress_v2"));
    printf("missing_status=%d\nmissing_symbol_status=%d\nmissing_is_null=%d\n", r_missing, status_missing,
           missing == NULL);
    printf("cublas_untouched=%d\n", dlsym(h, "cublasCreate_v2") == NULL);
    /* RTLD_NEXT from this executable must search the objects after it, libvgpu first when
     * preloaded; if the override lost our identity the search would start after libvgpu. */
    printf("next_matches_default=%d\n", dlsym(RTLD_NEXT, "cuMemAlloc_v2") == dlsym(RTLD_DEFAULT, "cuMemAlloc_v2"));
    return 0;
}

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static int cmd_bench(const struct api *api, long iterations) {
    open_device(api);
    CUdeviceptr p;
    size_t f, t;
    for (long i = 0; i < iterations / 10; i++) { /* warm up */
        check(api->mem_alloc(&p, 1 << 20), "cuMemAlloc_v2");
        check(api->mem_free(p), "cuMemFree_v2");
    }
    double start = now_ns();
    for (long i = 0; i < iterations; i++) {
        check(api->mem_alloc(&p, 1 << 20), "cuMemAlloc_v2");
        check(api->mem_free(p), "cuMemFree_v2");
    }
    double pair = (now_ns() - start) / iterations;
    start = now_ns();
    for (long i = 0; i < iterations; i++) check(api->mem_get_info(&f, &t), "cuMemGetInfo_v2");
    double info = (now_ns() - start) / iterations;
    printf("alloc_free_ns=%.2f\nget_info_ns=%.2f\n", pair, info);
    return 0;
}

/* Blocks until the test closes our stdin (EOF), or stdin fails. */
static void wait_for_stdin_eof(void) {
    char buf[256];
    for (;;) {
        ssize_t n = read(STDIN_FILENO, buf, sizeof buf);
        if (n == 0 || (n < 0 && errno != EINTR)) return;
    }
}

static unsigned long long xorshift(unsigned long long *state) {
    unsigned long long x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *state = x;
}

static unsigned long long seed(unsigned salt) {
    unsigned long long s = (unsigned long long)now_ns() ^ ((unsigned long long)getpid() << 32) ^ salt;
    return s ? s : 1;
}

static int cmd_refuse(const struct api *api, size_t chunk, long attempts) {
    enum { CAP = 1 << 16 };
    static CUdeviceptr held[CAP];
    open_device(api);
    size_t n = fill(api, chunk, held, CAP, "held");
    long refused = 0;
    double start = now_ns();
    for (long i = 0; i < attempts; i++) {
        CUdeviceptr ptr = 0;
        if (api->mem_alloc(&ptr, chunk) == CUDA_ERROR_OUT_OF_MEMORY) refused++;
        else if (ptr) check(api->mem_free(ptr), "cuMemFree_v2");
    }
    printf("refused=%ld\nrefuse_ns=%.0f\n", refused, now_ns() - start);
    for (size_t i = 0; i < n; i++) check(api->mem_free(held[i]), "cuMemFree_v2");
    return 0;
}

static int cmd_driver_stats(void) {
    print_driver_peak();
    return 0;
}

static int cmd_hold(const struct api *api, size_t chunk, size_t max) {
    enum { CAP = 1 << 16 };
    static CUdeviceptr held[CAP];
    open_device(api);
    size_t n = 0;
    CUresult status = CUDA_SUCCESS;
    while (n < CAP && (n + 1) * chunk <= max && (status = api->mem_alloc(&held[n], chunk)) == CUDA_SUCCESS) n++;
    printf("held_bytes=%zu\nhold_status=%d\nready=1\n", n * chunk, status);
    fflush(stdout);
    wait_for_stdin_eof();
    for (size_t i = 0; i < n; i++) check(api->mem_free(held[i]), "cuMemFree_v2");
    printf("released=1\n");
    return 0;
}

/* Steps read from stdin, one a line, each answered with key=value lines named by its tag, for
 * tests that act on a running process (a resize, a sibling of another release):
 *   info TAG        TAG_total=, TAG_free= (cuMemGetInfo_v2), TAG_device_total= (cuDeviceTotalMem_v2)
 *   alloc TAG MiB   one cuMemAlloc_v2 of MiB, kept: TAG_status=
 *   free TAG        frees the newest allocation kept: TAG_freed=
 *   load TAG        loads a module (cuModuleLoadData; the fake does not read the image): TAG_status=
 *   unload TAG      unloads the newest module loaded: TAG_status=
 *   launch TAG      one 1 µs fake kernel on the legacy stream through dlsym'd cuLaunchKernel, then
 *                   cuCtxSynchronize: TAG_status=, TAG_prefetched= (bytes this process asked
 *                   cuMemPrefetchAsync to migrate, the fake's count)
 *   driver TAG      the fake's device 0: TAG_used= (physical bytes), TAG_managed= (managed bytes)
 *   ipc TAG         cuIpcGetMemHandle of the newest allocation kept (dlsym'd): TAG_status=
 *   async TAG MiB   one cuMemAllocAsync of MiB on the legacy stream (dlsym'd), then
 *                   cuCtxSynchronize, kept: TAG_status=
 *   ordered TAG MiB one cuMemAllocAsync of MiB on the legacy stream (dlsym'd), kept, and covered by
 *                   write and check: TAG_status=, TAG_address=
 *   opool TAG MiB   the same through cuMemAllocFromPoolAsync from the device's default pool
 *   ofree TAG       cuMemFreeAsync of the newest allocation kept, on the legacy stream: TAG_status=
 *   othreshold TAG MiB  the default pool's release threshold set to MiB (-1: never release):
 *                   TAG_status=
 *   upool TAG MiB   the same from a pool of its own (cuMemPoolCreate, made at the first upool),
 *                   left out by write and check (the fake keeps no bytes for its pools' memory)
 *   otrim TAG MiB   cuMemPoolTrimTo of the default pool, keeping MiB: TAG_status=
 *   ostats TAG      the default pool's statistics (cuMemPoolGetAttribute): TAG_status=,
 *                   TAG_reserved=, TAG_reserved_high=, TAG_used=, TAG_used_high= (bytes)
 *   oreset TAG      both of its high-water marks reset (cuMemPoolSetAttribute to 0): TAG_status=
 *   range TAG MiB   what the driver says of the address MiB into the newest allocation kept
 *                   (dlsym'd): cuMemGetAddressRange_v2 (TAG_status=, TAG_at_start= 1 when the base
 *                   is the allocation's address, TAG_size=), cuPointerGetAttribute's range start and
 *                   size (TAG_attr_status=, TAG_attr_at_start=, TAG_attr_size=) and
 *                   cuPointerGetAttributes of the memory type, start and size (TAG_attrs_status=,
 *                   TAG_attrs_type=, TAG_attrs_at_start=, TAG_attrs_size=)
 *   write TAG SEED  fills every cuMemAlloc_v2 allocation kept with bytes drawn from SEED, through
 *                   dlsym'd cuMemcpyHtoD_v2: TAG_status= (the first failure, else 0), TAG_bytes=
 *   check TAG SEED  reads them back through dlsym'd cuMemcpyDtoH_v2 and compares with what `write
 *                   TAG SEED` wrote: TAG_status=, TAG_bytes=, TAG_mismatches= (bytes that differ)
 *   sleep TAG MS    sleeps MS milliseconds: TAG_slept=1
 *   unmapped TAG    the fake's counts for this process: TAG_launches= (kernels launched while
 *                   some of its VMM memory was unmapped), TAG_accesses= (copies refused on it)
 *   vmm TAG MiB PIECE   the application's own VMM, as an expandable segment: MiB of addresses
 *                   reserved, MiB/PIECE handles of PIECE MiB created (exportable as POSIX file
 *                   descriptors), mapped in reverse order, each given read-write access on its own,
 *                   then every handle released while mapped (as NCCL does); write and check cover
 *                   the range: TAG_status=
 *   vmmkeep TAG MiB PIECE   the same, the handles kept (as PyTorch's expandable segments keep them)
 *   vmmretain TAG   cuMemRetainAllocationHandle at the newest range's start, then
 *                   cuMemGetAllocationPropertiesFromHandle of it and cuMemRelease: TAG_status=,
 *                   TAG_same= (1: the handle it created, for a kept range), TAG_device=
 *   vmmexport TAG   cuMemExportToShareableHandle of the newest kept range's first handle: TAG_status=
 *   vmmfree TAG     the newest range unmapped piece by piece in address order, its kept handles
 *                   released, its addresses freed: TAG_status=
 * It ends at end of input, freeing what it still holds. */

/* The VMM entry points the vmm steps use, dlsym'd. */
static struct {
    CUresult (*reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
    CUresult (*address_free)(CUdeviceptr, size_t);
    CUresult (*create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
    CUresult (*release)(CUmemGenericAllocationHandle);
    CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
    CUresult (*unmap)(CUdeviceptr, size_t);
    CUresult (*set_access)(CUdeviceptr, size_t, const void *, size_t);
    CUresult (*retain)(CUmemGenericAllocationHandle *, void *);
    CUresult (*properties)(CUmemAllocationProp *, CUmemGenericAllocationHandle);
    CUresult (*export_handle)(void *, CUmemGenericAllocationHandle, int, unsigned long long);
} vmm;

static int vmm_calls(void) {
    if (!vmm.reserve) {
        void *lib = libcuda();
        vmm.reserve = dlsym(lib, "cuMemAddressReserve");
        vmm.address_free = dlsym(lib, "cuMemAddressFree");
        vmm.create = dlsym(lib, "cuMemCreate");
        vmm.release = dlsym(lib, "cuMemRelease");
        vmm.map = dlsym(lib, "cuMemMap");
        vmm.unmap = dlsym(lib, "cuMemUnmap");
        vmm.set_access = dlsym(lib, "cuMemSetAccess");
        vmm.retain = dlsym(lib, "cuMemRetainAllocationHandle");
        vmm.properties = dlsym(lib, "cuMemGetAllocationPropertiesFromHandle");
        vmm.export_handle = dlsym(lib, "cuMemExportToShareableHandle");
    }
    return vmm.reserve && vmm.address_free && vmm.create && vmm.release && vmm.map && vmm.unmap && vmm.set_access &&
           vmm.retain && vmm.properties && vmm.export_handle;
}

/* `CUmemAccessDesc`. */
struct access_desc {
    CUmemLocation location;
    int flags;
};

enum { VMM_CAP = 16, VMM_PIECES = 64 };
struct vmm_range {
    CUdeviceptr base;
    size_t size, piece;
    int pieces, kept;
    CUmemGenericAllocationHandle handle[VMM_PIECES];
};

static int cmd_steps(const struct api *api) {
    enum { CAP = 4096 };
    static CUdeviceptr held[CAP];
    static size_t held_size[CAP];
    /* 1: the entry is a vmm range (never cuMemFree'd); 2: a vmm range since freed. */
    static int held_vmm[CAP];
    static void *modules[CAP];
    static struct vmm_range vr[VMM_CAP];
    size_t n = 0, n_modules = 0, nv = 0;
    long piece = 0;
    CUdevice device = open_device(api);
    printf("ready=1\n");
    char line[256], tag[64];
    while (fgets(line, sizeof line, stdin)) {
        long mib = 0;
        if (sscanf(line, "info %63s", tag) == 1) {
            size_t free_bytes = 0, total_bytes = 0, device_total = 0;
            check(api->mem_get_info(&free_bytes, &total_bytes), "cuMemGetInfo_v2");
            check(api->device_total_mem(&device_total, device), "cuDeviceTotalMem_v2");
            printf("%s_total=%zu\n%s_free=%zu\n%s_device_total=%zu\n", tag, total_bytes, tag, free_bytes, tag,
                   device_total);
        } else if (sscanf(line, "alloc %63s %ld", tag, &mib) == 2) {
            CUdeviceptr ptr = 0;
            CUresult status = n < CAP ? api->mem_alloc(&ptr, (size_t)mib << 20) : CUDA_ERROR_OUT_OF_MEMORY;
            if (status == CUDA_SUCCESS) {
                held_size[n] = (size_t)mib << 20;
                held_vmm[n] = 0;
                held[n++] = ptr;
            }
            printf("%s_status=%d\n", tag, status);
        } else if (sscanf(line, "write %63s %ld", tag, &mib) == 2 || sscanf(line, "check %63s %ld", tag, &mib) == 2) {
            int writing = line[0] == 'w';
            CUresult (*htod)(CUdeviceptr, const void *, size_t) =
                (CUresult(*)(CUdeviceptr, const void *, size_t))dlsym(libcuda(), "cuMemcpyHtoD_v2");
            CUresult (*dtoh)(void *, CUdeviceptr, size_t) =
                (CUresult(*)(void *, CUdeviceptr, size_t))dlsym(libcuda(), "cuMemcpyDtoH_v2");
            CUresult status = htod && dtoh ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
            unsigned long long bytes = 0, mismatches = 0;
            for (size_t i = 0; i < n && status == CUDA_SUCCESS; i++) {
                if (held_size[i] == 0) continue; /* not a cuMemAlloc_v2 allocation */
                unsigned char *buffer = malloc(held_size[i]);
                if (!buffer) {
                    status = CUDA_ERROR_OUT_OF_MEMORY;
                    break;
                }
                /* The pattern: a 64-bit xorshift seeded by SEED and the allocation's index. */
                unsigned long long x = (unsigned long long)mib * 0x9e3779b97f4a7c15ULL + i + 1;
                if (writing) {
                    /* In 1 MiB pieces, each copied as soon as it is made: the process stays active
                     * (in libvgpu's eyes) all through a long write. */
                    for (size_t at = 0; at < held_size[i] && status == CUDA_SUCCESS; at += 1 << 20) {
                        size_t end = held_size[i] - at < (1 << 20) ? held_size[i] : at + (1 << 20);
                        for (size_t k = at; k < end; k++) {
                            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
                            buffer[k] = (unsigned char)x;
                        }
                        status = htod(held[i] + at, buffer + at, end - at);
                    }
                } else {
                    status = dtoh(buffer, held[i], held_size[i]);
                    for (size_t k = 0; k < held_size[i] && status == CUDA_SUCCESS; k++) {
                        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
                        mismatches += buffer[k] != (unsigned char)x;
                    }
                }
                if (status == CUDA_SUCCESS) bytes += held_size[i];
                free(buffer);
            }
            printf("%s_status=%d\n%s_bytes=%llu\n", tag, status, tag, bytes);
            if (!writing) printf("%s_mismatches=%llu\n", tag, mismatches);
        } else if (sscanf(line, "unmapped %63s", tag) == 1) {
            unsigned long long (*launches)(void) =
                (unsigned long long (*)(void))dlsym(libcuda(), "fakegpu_launch_while_unmapped");
            unsigned long long (*accesses)(void) =
                (unsigned long long (*)(void))dlsym(libcuda(), "fakegpu_unmapped_access");
            printf("%s_launches=%llu\n%s_accesses=%llu\n", tag, launches ? launches() : ~0ULL, tag,
                   accesses ? accesses() : ~0ULL);
        } else if (sscanf(line, "sleep %63s %ld", tag, &mib) == 2) {
            usleep((useconds_t)mib * 1000);
            printf("%s_slept=1\n", tag);
        } else if (sscanf(line, "load %63s", tag) == 1) {
            static const char image[] = "module";
            CUresult (*load)(void **, const void *) = (CUresult(*)(void **, const void *))dlsym(RTLD_DEFAULT, "cuModuleLoadData");
            CUresult status = CUDA_ERROR_NOT_FOUND;
            if (load && n_modules < CAP) status = load(&modules[n_modules], image);
            if (status == CUDA_SUCCESS) n_modules++;
            printf("%s_status=%d\n", tag, status);
        } else if (sscanf(line, "unload %63s", tag) == 1) {
            CUresult (*unload)(void *) = (CUresult(*)(void *))dlsym(RTLD_DEFAULT, "cuModuleUnload");
            CUresult status = CUDA_ERROR_NOT_FOUND;
            if (unload && n_modules > 0) status = unload(modules[--n_modules]);
            printf("%s_status=%d\n", tag, status);
        } else if (sscanf(line, "free %63s", tag) == 1) {
            /* A vmm range is not cuMemFree'd: it only leaves the list (vmmfree unmaps it). */
            if (n > 0 && held_vmm[n - 1]) n--;
            else if (n > 0) check(api->mem_free(held[--n]), "cuMemFree_v2");
            printf("%s_freed=1\n", tag);
        } else if (sscanf(line, "vmm %63s %ld %ld", tag, &mib, &piece) == 3 ||
                   sscanf(line, "vmmkeep %63s %ld %ld", tag, &mib, &piece) == 3) {
            /* An expandable-segments-like range: addresses reserved first, then MIB/PIECE handles
             * of PIECE MiB created and mapped in reverse order, each given read-write access on
             * its own; `vmm` releases every handle while mapped (as NCCL does), `vmmkeep` keeps
             * them (as PyTorch's expandable segments do). It joins what write and check cover. */
            int keep = strncmp(line, "vmmkeep", 7) == 0;
            CUresult status = vmm_calls() && nv < VMM_CAP && n < CAP && piece > 0 && mib % piece == 0 &&
                                      mib / piece <= VMM_PIECES
                                  ? CUDA_SUCCESS
                                  : CUDA_ERROR_INVALID_VALUE;
            struct vmm_range *r = &vr[nv];
            memset(r, 0, sizeof *r);
            r->size = (size_t)mib << 20;
            r->piece = (size_t)piece << 20;
            r->pieces = (int)(mib / (piece > 0 ? piece : 1));
            r->kept = keep;
            if (status == CUDA_SUCCESS) status = vmm.reserve(&r->base, r->size, 0, 0, 0);
            CUmemAllocationProp prop;
            memset(&prop, 0, sizeof prop);
            prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
            prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
            prop.location.id = device;
            prop.requestedHandleTypes = 1; /* CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR */
            for (int k = 0; k < r->pieces && status == CUDA_SUCCESS; k++) status = vmm.create(&r->handle[k], r->piece, &prop, 0);
            for (int k = r->pieces - 1; k >= 0 && status == CUDA_SUCCESS; k--) {
                CUdeviceptr at = r->base + (CUdeviceptr)k * r->piece;
                status = vmm.map(at, r->piece, 0, r->handle[k], 0);
                struct access_desc access = {{CU_MEM_LOCATION_TYPE_DEVICE, device}, 3 /* read-write */};
                if (status == CUDA_SUCCESS) status = vmm.set_access(at, r->piece, &access, 1);
            }
            for (int k = 0; k < r->pieces && status == CUDA_SUCCESS && !keep; k++) status = vmm.release(r->handle[k]);
            if (status == CUDA_SUCCESS) {
                held_size[n] = r->size;
                held_vmm[n] = 1;
                held[n++] = r->base;
                nv++;
            }
            printf("%s_status=%d\n", tag, status);
        } else if (sscanf(line, "vmmexport %63s", tag) == 1) {
            /* The last range's first piece exported as a POSIX file descriptor. */
            int fd = -1;
            CUresult status = vmm_calls() && nv > 0 && vr[nv - 1].kept
                                  ? vmm.export_handle(&fd, vr[nv - 1].handle[0], 1, 0)
                                  : CUDA_ERROR_INVALID_VALUE;
            printf("%s_status=%d\n", tag, status);
        } else if (sscanf(line, "vmmretain %63s", tag) == 1) {
            /* The handle mapped at the last range's start, by address; its properties; released. */
            CUmemGenericAllocationHandle handle = 0;
            CUmemAllocationProp prop;
            memset(&prop, 0, sizeof prop);
            CUresult status = vmm_calls() && nv > 0 ? vmm.retain(&handle, (void *)(uintptr_t)vr[nv - 1].base)
                                                    : CUDA_ERROR_INVALID_VALUE;
            if (status == CUDA_SUCCESS) status = vmm.properties(&prop, handle);
            if (status == CUDA_SUCCESS) status = vmm.release(handle);
            printf("%s_status=%d\n%s_same=%d\n%s_device=%d\n", tag, status, tag,
                   vr[nv > 0 ? nv - 1 : 0].kept && handle == vr[nv > 0 ? nv - 1 : 0].handle[0], tag, prop.location.id);
        } else if (sscanf(line, "vmmfree %63s", tag) == 1) {
            /* The last range unmapped piece by piece in address order, its kept handles released,
             * its addresses freed. */
            CUresult status = vmm_calls() && nv > 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
            struct vmm_range *r = &vr[nv > 0 ? nv - 1 : 0];
            for (int k = 0; k < r->pieces && status == CUDA_SUCCESS; k++)
                status = vmm.unmap(r->base + (CUdeviceptr)k * r->piece, r->piece);
            for (int k = 0; k < r->pieces && status == CUDA_SUCCESS && r->kept; k++) status = vmm.release(r->handle[k]);
            if (status == CUDA_SUCCESS) status = vmm.address_free(r->base, r->size);
            if (status == CUDA_SUCCESS) {
                for (size_t i = 0; i < n; i++)
                    if (held_vmm[i] && held[i] == r->base) held_size[i] = 0, held_vmm[i] = 2; /* gone */
                nv--;
            }
            printf("%s_status=%d\n", tag, status);
        } else if (sscanf(line, "async %63s %ld", tag, &mib) == 2) {
            CUresult (*alloc_async)(CUdeviceptr *, size_t, CUstream) =
                (CUresult(*)(CUdeviceptr *, size_t, CUstream))dlsym(libcuda(), "cuMemAllocAsync");
            CUresult (*sync)(void) = (CUresult(*)(void))dlsym(libcuda(), "cuCtxSynchronize");
            CUdeviceptr ptr = 0;
            CUresult status = alloc_async && sync && n < CAP ? alloc_async(&ptr, (size_t)mib << 20, NULL)
                                                             : CUDA_ERROR_NOT_FOUND;
            if (status == CUDA_SUCCESS) {
                held_size[n] = 0;
                held_vmm[n] = 0;
                held[n++] = ptr;
                status = sync();
            }
            printf("%s_status=%d\n", tag, status);
        } else if (sscanf(line, "ordered %63s %ld", tag, &mib) == 2 || sscanf(line, "opool %63s %ld", tag, &mib) == 2 ||
                   sscanf(line, "upool %63s %ld", tag, &mib) == 2) {
            /* Stream-ordered memory written and checked like cuMemAlloc_v2's, no synchronize. */
            void *lib = libcuda();
            CUresult (*alloc_async)(CUdeviceptr *, size_t, CUstream) =
                (CUresult(*)(CUdeviceptr *, size_t, CUstream))dlsym(lib, "cuMemAllocAsync");
            CUresult (*from_pool)(CUdeviceptr *, size_t, void *, CUstream) =
                (CUresult(*)(CUdeviceptr *, size_t, void *, CUstream))dlsym(lib, "cuMemAllocFromPoolAsync");
            CUresult (*default_pool)(void **, CUdevice) =
                (CUresult(*)(void **, CUdevice))dlsym(lib, "cuDeviceGetDefaultMemPool");
            CUdeviceptr ptr = 0;
            void *pool = NULL;
            size_t bytes = (size_t)mib << 20;
            CUresult status = CUDA_ERROR_NOT_FOUND;
            if (n >= CAP || !alloc_async || !from_pool || !default_pool)
                ;
            else if (line[0] == 'o' && line[1] == 'r')
                status = alloc_async(&ptr, bytes, NULL);
            else if (line[0] == 'u') {
                /* CUmemPoolProps: pinned device memory on this device, no handle type. */
                static void *own_pool;
                struct {
                    int alloc_type, handle_types, location_type, location_id;
                    void *win32;
                    size_t max_size;
                    unsigned short usage;
                    unsigned char reserved[54];
                } props = {1, 0, 1, (int)device, NULL, 0, 0, {0}};
                CUresult (*create)(void **, const void *) =
                    (CUresult(*)(void **, const void *))dlsym(lib, "cuMemPoolCreate");
                status = own_pool ? CUDA_SUCCESS : create ? create(&own_pool, &props) : CUDA_ERROR_NOT_FOUND;
                if (status == CUDA_SUCCESS) status = from_pool(&ptr, bytes, own_pool, NULL);
            } else if ((status = default_pool(&pool, device)) == CUDA_SUCCESS)
                status = from_pool(&ptr, bytes, pool, NULL);
            if (status == CUDA_SUCCESS) {
                /* The fake keeps no bytes for its own pools' memory: write and check leave it out. */
                held_size[n] = line[0] == 'u' ? 0 : bytes;
                held_vmm[n] = 0;
                held[n++] = ptr;
            }
            printf("%s_status=%d\n%s_address=%llu\n", tag, status, tag, (unsigned long long)ptr);
        } else if (sscanf(line, "ofree %63s", tag) == 1) {
            CUresult (*free_async)(CUdeviceptr, CUstream) =
                (CUresult(*)(CUdeviceptr, CUstream))dlsym(libcuda(), "cuMemFreeAsync");
            CUresult status = free_async && n > 0 && !held_vmm[n - 1] ? free_async(held[n - 1], NULL)
                                                                      : CUDA_ERROR_INVALID_VALUE;
            if (status == CUDA_SUCCESS) n--;
            printf("%s_status=%d\n", tag, status);
        } else if (sscanf(line, "othreshold %63s %ld", tag, &mib) == 2) {
            CUresult (*default_pool)(void **, CUdevice) =
                (CUresult(*)(void **, CUdevice))dlsym(libcuda(), "cuDeviceGetDefaultMemPool");
            CUresult (*set_attribute)(void *, int, void *) =
                (CUresult(*)(void *, int, void *))dlsym(libcuda(), "cuMemPoolSetAttribute");
            unsigned long long threshold = mib < 0 ? ~0ULL : (unsigned long long)mib << 20;
            void *pool = NULL;
            CUresult status = default_pool && set_attribute ? default_pool(&pool, device) : CUDA_ERROR_NOT_FOUND;
            /* CU_MEMPOOL_ATTR_RELEASE_THRESHOLD */
            if (status == CUDA_SUCCESS) status = set_attribute(pool, 4, &threshold);
            printf("%s_status=%d\n", tag, status);
        } else if (sscanf(line, "otrim %63s %ld", tag, &mib) == 2) {
            CUresult (*default_pool)(void **, CUdevice) =
                (CUresult(*)(void **, CUdevice))dlsym(libcuda(), "cuDeviceGetDefaultMemPool");
            CUresult (*trim)(void *, size_t) = (CUresult(*)(void *, size_t))dlsym(libcuda(), "cuMemPoolTrimTo");
            void *pool = NULL;
            CUresult status = default_pool && trim ? default_pool(&pool, device) : CUDA_ERROR_NOT_FOUND;
            if (status == CUDA_SUCCESS) status = trim(pool, (size_t)mib << 20);
            printf("%s_status=%d\n", tag, status);
        } else if (sscanf(line, "ostats %63s", tag) == 1 || sscanf(line, "oreset %63s", tag) == 1) {
            void *lib = libcuda();
            CUresult (*default_pool)(void **, CUdevice) =
                (CUresult(*)(void **, CUdevice))dlsym(lib, "cuDeviceGetDefaultMemPool");
            CUresult (*get)(void *, int, void *) = (CUresult(*)(void *, int, void *))dlsym(lib, "cuMemPoolGetAttribute");
            CUresult (*set)(void *, int, void *) = (CUresult(*)(void *, int, void *))dlsym(lib, "cuMemPoolSetAttribute");
            void *pool = NULL;
            CUresult status = default_pool && get && set ? default_pool(&pool, device) : CUDA_ERROR_NOT_FOUND;
            /* CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT (5), _HIGH (6), _USED_MEM_CURRENT (7), _HIGH (8) */
            unsigned long long value[4] = {0, 0, 0, 0}, zero = 0;
            for (int k = 0; k < 4 && status == CUDA_SUCCESS; k++)
                status = line[1] == 's' ? get(pool, 5 + k, &value[k]) : k % 2 ? set(pool, 5 + k, &zero) : CUDA_SUCCESS;
            printf("%s_status=%d\n", tag, status);
            if (line[1] == 's')
                printf("%s_reserved=%llu\n%s_reserved_high=%llu\n%s_used=%llu\n%s_used_high=%llu\n", tag, value[0], tag,
                       value[1], tag, value[2], tag, value[3]);
        } else if (sscanf(line, "range %63s %ld", tag, &mib) == 2) {
            void *lib = libcuda();
            CUresult (*address_range)(CUdeviceptr *, size_t *, CUdeviceptr) =
                (CUresult(*)(CUdeviceptr *, size_t *, CUdeviceptr))dlsym(lib, "cuMemGetAddressRange_v2");
            CUresult (*attribute)(void *, int, CUdeviceptr) =
                (CUresult(*)(void *, int, CUdeviceptr))dlsym(lib, "cuPointerGetAttribute");
            CUresult (*attributes)(unsigned, int *, void **, CUdeviceptr) =
                (CUresult(*)(unsigned, int *, void **, CUdeviceptr))dlsym(lib, "cuPointerGetAttributes");
            CUdeviceptr start = n > 0 ? held[n - 1] : 0, at = start + ((CUdeviceptr)mib << 20);
            CUdeviceptr base = 0, attr_base = 0, attrs_base = 0;
            size_t size = 0, attr_size = 0, attrs_size = 0;
            unsigned memory_type = 0;
            CUresult status = CUDA_ERROR_NOT_FOUND, attr_status = CUDA_ERROR_NOT_FOUND, attrs_status = CUDA_ERROR_NOT_FOUND;
            if (n > 0 && address_range && attribute && attributes) {
                status = address_range(&base, &size, at);
                /* CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, _RANGE_SIZE, _MEMORY_TYPE */
                attr_status = attribute(&attr_base, 11, at);
                if (attr_status == CUDA_SUCCESS) attr_status = attribute(&attr_size, 12, at);
                int which[3] = {2, 11, 12};
                void *into[3] = {&memory_type, &attrs_base, &attrs_size};
                attrs_status = attributes(3, which, into, at);
            }
            printf("%s_status=%d\n%s_at_start=%d\n%s_size=%zu\n", tag, status, tag, base == start, tag, size);
            printf("%s_attr_status=%d\n%s_attr_at_start=%d\n%s_attr_size=%zu\n", tag, attr_status, tag,
                   attr_base == start, tag, attr_size);
            printf("%s_attrs_status=%d\n%s_attrs_type=%u\n%s_attrs_at_start=%d\n%s_attrs_size=%zu\n", tag,
                   attrs_status, tag, memory_type, tag, attrs_base == start, tag, attrs_size);
        } else if (sscanf(line, "longsync %63s %ld", tag, &mib) == 2) {
            /* A kernel of MIB (here: milliseconds) of simulated work, then cuCtxSynchronize. */
            printf("%s_status=%d\n", tag, launch_and_sync((unsigned long long)mib * 1000000ULL, NULL));
        } else if (sscanf(line, "longsync13 %63s %ld", tag, &mib) == 2) {
            /* The same, waiting through what cuGetProcAddress_v2 answers for cuCtxSynchronize at
             * CUDA 13.0, as cudart 13's cudaDeviceSynchronize does (the driver's
             * cuCtxSynchronize_v2, which names the context: NULL, the current one). */
            CUresult (*sync13)(void *) = (CUresult(*)(void *))through_proc_address("procaddr_v2", "cuCtxSynchronize", 13000);
            printf("%s_status=%d\n", tag,
                   sync13 ? launch_and_sync((unsigned long long)mib * 1000000ULL, sync13) : CUDA_ERROR_NOT_FOUND);
        } else if (sscanf(line, "poll %63s %ld", tag, &mib) == 2 || sscanf(line, "idlepoll %63s %ld", tag, &mib) == 2) {
            /* `poll`: a kernel of MIB (here: milliseconds) of simulated work, then cuStreamQuery on
             * the legacy stream every millisecond until it is done. `idlepoll`: cuStreamQuery every
             * millisecond for MIB milliseconds with nothing queued. */
            CUresult (*query)(CUstream) = (CUresult(*)(CUstream))dlsym(libcuda(), "cuStreamQuery");
            CUfunction (*kernel_of)(unsigned long long) =
                (CUfunction(*)(unsigned long long))dlsym(libcuda(), "fakegpu_kernel");
            CUresult (*launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                               CUstream, void **, void **) =
                (CUresult(*)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             CUstream, void **, void **))dlsym(libcuda(), "cuLaunchKernel");
            int busy = line[0] == 'p';
            CUresult status = query && kernel_of && launch ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
            if (status == CUDA_SUCCESS && busy)
                status = launch(kernel_of((unsigned long long)mib * 1000000ULL), 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
            long polls = 0;
            struct timespec start, now;
            clock_gettime(CLOCK_MONOTONIC, &start);
            while (status == CUDA_SUCCESS) {
                CUresult answer = query(NULL);
                polls++;
                if (busy && answer != CUDA_ERROR_NOT_READY) {
                    status = answer;
                    break;
                }
                if (!busy && answer != CUDA_SUCCESS) status = answer;
                clock_gettime(CLOCK_MONOTONIC, &now);
                if (!busy && (now.tv_sec - start.tv_sec) * 1000 + (now.tv_nsec - start.tv_nsec) / 1000000 >= mib) break;
                usleep(1000);
            }
            printf("%s_status=%d\n%s_polls=%ld\n", tag, status, tag, polls);
        } else if (sscanf(line, "launch %63s", tag) == 1) {
            unsigned long long (*prefetched)(void) =
                (unsigned long long (*)(void))dlsym(libcuda(), "fakegpu_prefetched_bytes");
            CUresult status = launch_and_sync(1000, NULL);
            printf("%s_status=%d\n%s_prefetched=%llu\n", tag, status, tag, prefetched ? prefetched() : 0ULL);
        } else if (sscanf(line, "driver %63s", tag) == 1) {
            int (*stats)(unsigned, unsigned long long *, unsigned long long *, unsigned long long *) =
                (int (*)(unsigned, unsigned long long *, unsigned long long *, unsigned long long *))dlsym(
                    libcuda(), "fakegpu_device_stats");
            unsigned long long (*managed)(unsigned) =
                (unsigned long long (*)(unsigned))dlsym(libcuda(), "fakegpu_managed_bytes");
            unsigned long long used = 0;
            if (stats) stats(0, &used, NULL, NULL);
            printf("%s_used=%llu\n%s_managed=%llu\n", tag, used, tag, managed ? managed(0) : 0ULL);
        } else if (sscanf(line, "ipc %63s", tag) == 1) {
            CUresult (*get)(CUipcMemHandle *, CUdeviceptr) =
                (CUresult(*)(CUipcMemHandle *, CUdeviceptr))dlsym(libcuda(), "cuIpcGetMemHandle");
            CUipcMemHandle handle;
            printf("%s_status=%d\n", tag, get && n > 0 ? get(&handle, held[n - 1]) : CUDA_ERROR_NOT_FOUND);
        } else {
            fprintf(stderr, "unknown step: %s", line);
            return 2;
        }
        fflush(stdout);
    }
    while (n > 0) {
        n--;
        if (!held_vmm[n]) check(api->mem_free(held[n]), "cuMemFree_v2");
    }
    return 0;
}

/* One allocation call, timed: wall time, the thread's own CPU time, and whether it slept (a
 * voluntary context switch: it waited for something, e.g. a lock another process holds). */
struct call_timing {
    double max_wall_ns, max_off_cpu_ns;
    unsigned long long calls, slept_calls, over_1ms;
    /* Of the slept calls: how many took a page fault during the call (a store into a region page
     * the kernel had write-protected for writeback), and how many were refusals. */
    unsigned long long slept_faulted, slept_refused;
};

static double thread_cpu_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static long voluntary_switches(void) {
    struct rusage usage;
    getrusage(RUSAGE_THREAD, &usage);
    return usage.ru_nvcsw;
}

static long page_faults(void) {
    struct rusage usage;
    getrusage(RUSAGE_THREAD, &usage);
    return usage.ru_minflt + usage.ru_majflt;
}

static void time_call(struct call_timing *t, double wall0, double cpu0, long switches0, long faults0,
                      int refused) {
    double wall = now_ns() - wall0, off_cpu = wall - (thread_cpu_ns() - cpu0);
    t->calls++;
    if (voluntary_switches() != switches0) {
        t->slept_calls++;
        if (page_faults() != faults0) t->slept_faulted++;
        if (refused) t->slept_refused++;
    }
    if (wall > t->max_wall_ns) t->max_wall_ns = wall;
    if (off_cpu > t->max_off_cpu_ns) t->max_off_cpu_ns = off_cpu;
    if (off_cpu > 1e6) t->over_1ms++;
}

/* Allocates 1..chunk_mib MiB or frees, at random, at most 4 live, for `seconds` (churn: forever),
 * timing every cuMemAlloc_v2 and cuMemFree_v2; prints the slowest. */
static int cmd_timed_churn(const struct api *api, double seconds, size_t chunk_mib) {
    enum { LIVE = 4 };
    CUdeviceptr live[LIVE];
    int n = 0;
    unsigned long long rng = seed(0);
    struct call_timing t = {0};
    open_device(api);
    printf("ready=1\n");
    fflush(stdout);
    double end = now_ns() + seconds * 1e9;
    while (now_ns() < end) {
        unsigned long long r = xorshift(&rng);
        double wall0 = now_ns(), cpu0 = thread_cpu_ns();
        long switches0 = voluntary_switches(), faults0 = page_faults();
        if (n == 0 || (n < LIVE && (r & 1))) {
            size_t size = (size_t)(1 + (r >> 1) % chunk_mib) << 20;
            CUresult status = api->mem_alloc(&live[n], size);
            time_call(&t, wall0, cpu0, switches0, faults0, status == CUDA_ERROR_OUT_OF_MEMORY);
            if (status == CUDA_SUCCESS)
                n++;
            else if (status != CUDA_ERROR_OUT_OF_MEMORY)
                check(status, "cuMemAlloc_v2");
        } else {
            int i = (int)((r >> 1) % (unsigned long long)n);
            check(api->mem_free(live[i]), "cuMemFree_v2");
            time_call(&t, wall0, cpu0, switches0, faults0, 0);
            live[i] = live[--n];
        }
    }
    while (n > 0) check(api->mem_free(live[--n]), "cuMemFree_v2");
    printf("calls=%llu\nslept_calls=%llu\nslept_faulted=%llu\nslept_refused=%llu\nover_1ms_off_cpu=%llu\n"
           "max_wall_ns=%.0f\nmax_off_cpu_ns=%.0f\n",
           t.calls, t.slept_calls, t.slept_faulted, t.slept_refused, t.over_1ms, t.max_wall_ns, t.max_off_cpu_ns);
    return 0;
}

static int cmd_fork(const struct api *api, size_t chunk) {
    CUdeviceptr mine, theirs[2];
    int sync[2];
    open_device(api);
    check(api->mem_alloc(&mine, chunk), "cuMemAlloc_v2");
    printf("parent_pid=%d\n", (int)getpid());
    fflush(stdout); /* nothing buffered may be printed twice */
    if (pipe(sync) != 0) {
        perror("pipe");
        return 3;
    }
    pid_t child = fork();
    if (child < 0) {
        perror("fork");
        return 3;
    }
    if (child == 0) {
        close(sync[0]);
        size_t n = 0;
        CUresult status = CUDA_SUCCESS;
        while (n < 2 && (status = api->mem_alloc(&theirs[n], chunk)) == CUDA_SUCCESS) n++;
        printf("child_pid=%d\nchild_bytes=%zu\nchild_status=%d\n", (int)getpid(), n * chunk, status);
        fflush(stdout);
        close(sync[1]); /* EOF on the pipe tells the parent our lines are out */
        wait_for_stdin_eof();
        for (size_t i = 0; i < n; i++) check(api->mem_free(theirs[i]), "cuMemFree_v2");
        printf("child_released=1\n");
        exit(0); /* a normal exit: libvgpu's exit path runs in the child too */
    }
    close(sync[1]);
    char byte;
    while (read(sync[0], &byte, 1) < 0 && errno == EINTR) {
    }
    close(sync[0]);
    printf("ready=1\n");
    fflush(stdout);
    wait_for_stdin_eof();
    check(api->mem_free(mine), "cuMemFree_v2");
    int wstatus = 0;
    while (waitpid(child, &wstatus, 0) < 0 && errno == EINTR) {
    }
    printf("child_exit=%d\nreleased=1\n", WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : 128 + WTERMSIG(wstatus));
    return 0;
}

/* CPU time of the calling thread: what an operation costs, without the time spent descheduled. */
static double cpu_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

struct stress_thread {
    const struct api *api;
    CUdevice device;
    size_t chunk_mib;
    double seconds;
    pthread_barrier_t *start;
    unsigned index;
    unsigned long long allocs, refused, frees;
    double busy_ns, cpu_ns;
    pthread_t thread;
};

static void *stress_worker(void *arg) {
    enum { LIVE = 8 };
    struct stress_thread *t = arg;
    const struct api *api = t->api;
    CUdeviceptr live[LIVE];
    int n = 0;
    unsigned long long rng = seed(t->index * 0x9e3779b9u);
    CUcontext ctx;
    check(api->primary_ctx_retain(&ctx, t->device), "cuDevicePrimaryCtxRetain");
    check(api->ctx_set_current(ctx), "cuCtxSetCurrent"); /* contexts are current per thread */
    pthread_barrier_wait(t->start);
    double start = now_ns(), deadline = start + t->seconds * 1e9, cpu_start = cpu_ns();
    for (unsigned long long i = 0;; i++) {
        if ((i & 63) == 0 && now_ns() >= deadline) break; /* read the clock every 64 operations */
        unsigned long long r = xorshift(&rng);
        if (n == 0 || (n < LIVE && (r & 1))) {
            size_t size = (size_t)(1 + (r >> 1) % t->chunk_mib) << 20;
            CUresult status = api->mem_alloc(&live[n], size);
            if (status == CUDA_SUCCESS) {
                n++;
                t->allocs++;
            } else if (status == CUDA_ERROR_OUT_OF_MEMORY) {
                t->refused++;
            } else {
                check(status, "cuMemAlloc_v2");
            }
        } else {
            int k = (int)((r >> 1) % (unsigned long long)n);
            check(api->mem_free(live[k]), "cuMemFree_v2");
            live[k] = live[--n];
            t->frees++;
        }
    }
    t->busy_ns = now_ns() - start;
    t->cpu_ns = cpu_ns() - cpu_start;
    while (n > 0) check(api->mem_free(live[--n]), "cuMemFree_v2"); /* outside the timed loop */
    return NULL;
}

static int cmd_stress(const struct api *api, double seconds, unsigned threads, size_t chunk_mib) {
    if (threads == 0 || chunk_mib == 0) {
        fprintf(stderr, "stress needs at least one thread and one MiB\n");
        return 2;
    }
    CUdevice device = open_device(api);
    struct stress_thread *t = calloc(threads, sizeof *t);
    pthread_barrier_t start;
    if (!t || pthread_barrier_init(&start, NULL, threads + 1) != 0) return 3;
    for (unsigned i = 0; i < threads; i++) {
        t[i] = (struct stress_thread){.api = api, .device = device, .chunk_mib = chunk_mib, .seconds = seconds,
                                      .start = &start, .index = i};
        if (pthread_create(&t[i].thread, NULL, stress_worker, &t[i]) != 0) return 3;
    }
    pthread_barrier_wait(&start);
    double begin = now_ns();
    unsigned long long allocs = 0, refused = 0, frees = 0;
    double busy = 0, cpu = 0;
    for (unsigned i = 0; i < threads; i++) {
        pthread_join(t[i].thread, NULL);
        allocs += t[i].allocs;
        refused += t[i].refused;
        frees += t[i].frees;
        busy += t[i].busy_ns;
        cpu += t[i].cpu_ns;
    }
    double elapsed = now_ns() - begin;
    printf("threads=%u\nops=%llu\nallocs=%llu\nrefused=%llu\nfrees=%llu\n", threads, allocs + refused + frees,
           allocs, refused, frees);
    printf("elapsed_ns=%.0f\nthread_ns=%.0f\nthread_cpu_ns=%.0f\n", elapsed, busy, cpu);
    free(t);
    return 0;
}

/* ---- Allocation families, contexts, host memory and IPC (docs/architecture.md, "Accounting") ---- */

/* Entry points the direct path names at link time. Weak, so that the client still links, and its
 * other commands still run, against a driver that lacks some of them: the linker then resolves
 * such a name to NULL (a preloaded library cannot supply it either), and a command needing it
 * reports it unresolved. Against a driver that exports them they bind as usual, to libvgpu's
 * exports first when it is preloaded. */
#pragma weak cuDeviceGetAttribute
#pragma weak cuStreamSynchronize
#pragma weak cuMemAllocPitch_v2
#pragma weak cuMemAllocManaged
#pragma weak cuDeviceGetDefaultMemPool
#pragma weak cuMemAllocAsync
#pragma weak cuMemAllocAsync_ptsz
#pragma weak cuMemAllocFromPoolAsync
#pragma weak cuMemAllocFromPoolAsync_ptsz
#pragma weak cuMemFreeAsync
#pragma weak cuMemFreeAsync_ptsz
#pragma weak cuMemCreate
#pragma weak cuMemRelease
#pragma weak cuMemAddressReserve
#pragma weak cuMemAddressFree
#pragma weak cuMemMap
#pragma weak cuMemUnmap
#pragma weak cuArrayCreate_v2
#pragma weak cuArray3DCreate_v2
#pragma weak cuArrayDestroy
#pragma weak cuMipmappedArrayCreate
#pragma weak cuMipmappedArrayDestroy
#pragma weak cuDevicePrimaryCtxRelease_v2
#pragma weak cuCtxCreate_v2
#pragma weak cuCtxCreate_v3
#pragma weak cuCtxCreate_v4
#pragma weak cuCtxDestroy_v2
#pragma weak cuMemHostAlloc
#pragma weak cuMemAllocHost_v2
#pragma weak cuMemFreeHost
#pragma weak cuMemHostRegister_v2
#pragma weak cuMemHostUnregister
#pragma weak cuIpcGetMemHandle
#pragma weak cuIpcOpenMemHandle_v2
#pragma weak cuIpcCloseMemHandle
#pragma weak cuMemRetainAllocationHandle
#pragma weak cuMemPoolSetAttribute
#pragma weak cuMemPoolTrimTo
#pragma weak cuMemPoolGetAttribute
#pragma weak cuGraphCreate
#pragma weak cuGraphDestroy
#pragma weak cuGraphAddMemAllocNode
#pragma weak cuGraphInstantiateWithFlags
#pragma weak cuGraphLaunch
#pragma weak cuGraphLaunch_ptsz
#pragma weak cuGraphExecDestroy

/* Every entry point the family, context, host, ipc and nulls commands use beyond `struct api`. */
struct families {
    CUresult (*stream_synchronize)(CUstream);
    CUresult (*mem_alloc_pitch)(CUdeviceptr *, size_t *, size_t, size_t, unsigned);
    CUresult (*mem_alloc_managed)(CUdeviceptr *, size_t, unsigned);
    CUresult (*device_get_default_mem_pool)(CUmemoryPool *, CUdevice);
    CUresult (*mem_alloc_async)(CUdeviceptr *, size_t, CUstream);
    CUresult (*mem_alloc_from_pool_async)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
    CUresult (*mem_free_async)(CUdeviceptr, CUstream);
    CUresult (*mem_create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                           unsigned long long);
    CUresult (*mem_release)(CUmemGenericAllocationHandle);
    CUresult (*mem_address_reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
    CUresult (*mem_address_free)(CUdeviceptr, size_t);
    CUresult (*mem_map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
    CUresult (*mem_unmap)(CUdeviceptr, size_t);
    CUresult (*array_create)(CUarray *, const CUDA_ARRAY_DESCRIPTOR *);
    CUresult (*array3d_create)(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *);
    CUresult (*array_destroy)(CUarray);
    CUresult (*mipmapped_array_create)(CUmipmappedArray *, const CUDA_ARRAY3D_DESCRIPTOR *, unsigned);
    CUresult (*mipmapped_array_destroy)(CUmipmappedArray);
    CUresult (*primary_ctx_release)(CUdevice);
    CUresult (*ctx_create_v2)(CUcontext *, unsigned, CUdevice);
    CUresult (*ctx_create_v3)(CUcontext *, void *, int, unsigned, CUdevice);
    CUresult (*ctx_create_v4)(CUcontext *, void *, unsigned, CUdevice);
    CUresult (*ctx_destroy)(CUcontext);
    CUresult (*mem_host_alloc)(void **, size_t, unsigned);
    CUresult (*mem_alloc_host)(void **, size_t);
    CUresult (*mem_free_host)(void *);
    CUresult (*mem_host_register)(void *, size_t, unsigned);
    CUresult (*mem_host_unregister)(void *);
    CUresult (*ipc_get_mem_handle)(CUipcMemHandle *, CUdeviceptr);
    CUresult (*ipc_open_mem_handle)(CUdeviceptr *, CUipcMemHandle, unsigned);
    CUresult (*ipc_close_mem_handle)(CUdeviceptr);
    CUresult (*mem_retain_allocation_handle)(CUmemGenericAllocationHandle *, void *);
    CUresult (*mem_pool_set_attribute)(CUmemoryPool, int, void *);
    CUresult (*mem_pool_trim_to)(CUmemoryPool, size_t);
    CUresult (*mem_pool_get_attribute)(CUmemoryPool, int, void *);
    CUresult (*graph_create)(CUgraph *, unsigned);
    CUresult (*graph_destroy)(CUgraph);
    CUresult (*graph_add_mem_alloc_node)(CUgraphNode *, CUgraph, const CUgraphNode *, size_t,
                                         CUDA_MEM_ALLOC_NODE_PARAMS *);
    CUresult (*graph_instantiate)(CUgraphExec *, CUgraph, unsigned long long);
    CUresult (*graph_launch)(CUgraphExec, CUstream);
    CUresult (*graph_exec_destroy)(CUgraphExec);
};

/* One slot of `struct families` on every path: its link-time address and exported name (the
 * per-thread `_ptsz` twin where the driver has one), and the base name and CUDA version
 * cuGetProcAddress is asked with. */
struct entry {
    size_t slot;
    void *direct, *direct_ptsz;
    const char *name, *name_ptsz;
    const char *base;
    int version;
};

#define ENTRY(field, symbol, base, version) \
    {offsetof(struct families, field), (void *)&symbol, NULL, #symbol, NULL, base, version}
#define ENTRY_PTSZ(field, symbol, base, version)                                                           \
    {offsetof(struct families, field), (void *)&symbol, (void *)&symbol##_ptsz, #symbol, #symbol "_ptsz", \
     base, version}

static const struct entry ENTRIES[] = {
    ENTRY(stream_synchronize, cuStreamSynchronize, "cuStreamSynchronize", 12000),
    ENTRY(mem_alloc_pitch, cuMemAllocPitch_v2, "cuMemAllocPitch", 12000),
    ENTRY(mem_alloc_managed, cuMemAllocManaged, "cuMemAllocManaged", 12000),
    ENTRY(device_get_default_mem_pool, cuDeviceGetDefaultMemPool, "cuDeviceGetDefaultMemPool", 12000),
    ENTRY_PTSZ(mem_alloc_async, cuMemAllocAsync, "cuMemAllocAsync", 12000),
    ENTRY_PTSZ(mem_alloc_from_pool_async, cuMemAllocFromPoolAsync, "cuMemAllocFromPoolAsync", 12000),
    ENTRY_PTSZ(mem_free_async, cuMemFreeAsync, "cuMemFreeAsync", 12000),
    ENTRY(mem_create, cuMemCreate, "cuMemCreate", 12000),
    ENTRY(mem_release, cuMemRelease, "cuMemRelease", 12000),
    ENTRY(mem_address_reserve, cuMemAddressReserve, "cuMemAddressReserve", 12000),
    ENTRY(mem_address_free, cuMemAddressFree, "cuMemAddressFree", 12000),
    ENTRY(mem_map, cuMemMap, "cuMemMap", 12000),
    ENTRY(mem_unmap, cuMemUnmap, "cuMemUnmap", 12000),
    ENTRY(array_create, cuArrayCreate_v2, "cuArrayCreate", 12000),
    ENTRY(array3d_create, cuArray3DCreate_v2, "cuArray3DCreate", 12000),
    ENTRY(array_destroy, cuArrayDestroy, "cuArrayDestroy", 12000),
    ENTRY(mipmapped_array_create, cuMipmappedArrayCreate, "cuMipmappedArrayCreate", 12000),
    ENTRY(mipmapped_array_destroy, cuMipmappedArrayDestroy, "cuMipmappedArrayDestroy", 12000),
    ENTRY(primary_ctx_release, cuDevicePrimaryCtxRelease_v2, "cuDevicePrimaryCtxRelease", 12000),
    /* cuCtxCreate's three ABIs through cuGetProcAddress: _v2 until 11.4, _v3 until 12.5, then _v4 */
    ENTRY(ctx_create_v2, cuCtxCreate_v2, "cuCtxCreate", 11000),
    ENTRY(ctx_create_v3, cuCtxCreate_v3, "cuCtxCreate", 12000),
    ENTRY(ctx_create_v4, cuCtxCreate_v4, "cuCtxCreate", 13000),
    ENTRY(ctx_destroy, cuCtxDestroy_v2, "cuCtxDestroy", 12000),
    ENTRY(mem_host_alloc, cuMemHostAlloc, "cuMemHostAlloc", 12000),
    ENTRY(mem_alloc_host, cuMemAllocHost_v2, "cuMemAllocHost", 12000),
    ENTRY(mem_free_host, cuMemFreeHost, "cuMemFreeHost", 12000),
    ENTRY(mem_host_register, cuMemHostRegister_v2, "cuMemHostRegister", 12000),
    ENTRY(mem_host_unregister, cuMemHostUnregister, "cuMemHostUnregister", 12000),
    ENTRY(ipc_get_mem_handle, cuIpcGetMemHandle, "cuIpcGetMemHandle", 12000),
    ENTRY(ipc_open_mem_handle, cuIpcOpenMemHandle_v2, "cuIpcOpenMemHandle", 12000),
    ENTRY(ipc_close_mem_handle, cuIpcCloseMemHandle, "cuIpcCloseMemHandle", 12000),
    ENTRY(mem_retain_allocation_handle, cuMemRetainAllocationHandle, "cuMemRetainAllocationHandle", 12000),
    ENTRY(mem_pool_set_attribute, cuMemPoolSetAttribute, "cuMemPoolSetAttribute", 12000),
    ENTRY(mem_pool_trim_to, cuMemPoolTrimTo, "cuMemPoolTrimTo", 12000),
    ENTRY(mem_pool_get_attribute, cuMemPoolGetAttribute, "cuMemPoolGetAttribute", 12000),
    ENTRY(graph_create, cuGraphCreate, "cuGraphCreate", 12000),
    ENTRY(graph_destroy, cuGraphDestroy, "cuGraphDestroy", 12000),
    ENTRY(graph_add_mem_alloc_node, cuGraphAddMemAllocNode, "cuGraphAddMemAllocNode", 12000),
    ENTRY(graph_instantiate, cuGraphInstantiateWithFlags, "cuGraphInstantiateWithFlags", 12000),
    ENTRY_PTSZ(graph_launch, cuGraphLaunch, "cuGraphLaunch", 12000),
    ENTRY(graph_exec_destroy, cuGraphExecDestroy, "cuGraphExecDestroy", 12000),
};

/* A PATH argument: one of `load`'s paths, optionally with the per-thread default stream. */
struct call_path {
    char base[32]; /* direct, dlsym, procaddr or procaddr_v1: what `load` takes */
    int per_thread;
};

static struct call_path parse_path(const char *path) {
    struct call_path p = {{0}, 0};
    size_t n = strlen(path);
    if (n > 5 && strcmp(path + n - 5, "_ptsz") == 0) {
        p.per_thread = 1;
        n -= 5;
    }
    if (n >= sizeof p.base) n = sizeof p.base - 1;
    memcpy(p.base, path, n);
    return p;
}

/* cuGetProcAddress(_v2) fetched through itself, asked for `name` with `flags`, as cudart does. */
static void *proc_address_with_flags(const char *path, const char *name, int version, unsigned long long flags) {
    void *h = libcuda(), *pfn = NULL;
    if (strcmp(path, "procaddr_v1") == 0) {
        GetProcAddressV1 v1 = (GetProcAddressV1)dlsym(h, "cuGetProcAddress"), self = NULL;
        if (!v1 || v1("cuGetProcAddress", (void **)&self, version, 0) != CUDA_SUCCESS || !self) return NULL;
        return self(name, &pfn, version, flags) == CUDA_SUCCESS ? pfn : NULL;
    }
    GetProcAddressV2 v2 = (GetProcAddressV2)dlsym(h, "cuGetProcAddress_v2"), self = NULL;
    int symbol_status = -1;
    if (!v2 || v2("cuGetProcAddress", (void **)&self, 12000, 0, &symbol_status) != CUDA_SUCCESS || !self)
        return NULL;
    return self(name, &pfn, version, flags, &symbol_status) == CUDA_SUCCESS ? pfn : NULL;
}

/* Resolves every slot of `struct families` through `path`; unresolved slots stay NULL. */
static struct families load_families(const struct call_path *path) {
    struct families f;
    memset(&f, 0, sizeof f);
    for (size_t i = 0; i < sizeof ENTRIES / sizeof ENTRIES[0]; i++) {
        const struct entry *e = &ENTRIES[i];
        int twin = path->per_thread && e->name_ptsz;
        void *pfn = NULL;
        if (strcmp(path->base, "direct") == 0)
            pfn = twin ? e->direct_ptsz : e->direct;
        else if (strcmp(path->base, "dlsym") == 0)
            pfn = dlsym(libcuda(), twin ? e->name_ptsz : e->name);
        else if (strcmp(path->base, "procaddr") == 0)
            pfn = proc_address_with_flags("procaddr", e->base, e->version,
                                          path->per_thread ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : 0);
        else if (strcmp(path->base, "procaddr_v1") == 0) /* cudart 11 asks at 11.4 for everything */
            pfn = proc_address_with_flags("procaddr_v1", e->base, e->version < 11040 ? e->version : 11040,
                                          path->per_thread ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : 0);
        *(void **)((char *)&f + e->slot) = pfn;
    }
    return f;
}

/* The exported name the driver sees for a slot on this path (what the fake counts calls by). */
static const char *driver_name(const struct call_path *path, size_t slot) {
    for (size_t i = 0; i < sizeof ENTRIES / sizeof ENTRIES[0]; i++)
        if (ENTRIES[i].slot == slot)
            return path->per_thread && ENTRIES[i].name_ptsz ? ENTRIES[i].name_ptsz : ENTRIES[i].name;
    return "?";
}

/* Exits with unresolved=NAME when a needed entry point is missing on this path. */
static void need(const void *pfn, const struct call_path *path, size_t slot) {
    if (!pfn) {
        printf("unresolved=%s\n", driver_name(path, slot));
        exit(3);
    }
}
#define NEED(f, path, field) need((const void *)(f)->field, path, offsetof(struct families, field))

/* The fake's per-export call counter (0 when the driver is not the fake). */
static unsigned long long driver_calls(const char *name) {
    unsigned long long (*count)(const char *) =
        (unsigned long long (*)(const char *))dlsym(libcuda(), "fakegpu_call_count");
    return count ? count(name) : 0;
}

/* The fake's physical index of a CUDA ordinal: the last byte of its UUID (fakegpu/README.md). */
static unsigned physical_index(CUdevice device) {
    CUresult (*uuid_of)(CUuuid *, CUdevice) =
        (CUresult (*)(CUuuid *, CUdevice))dlsym(libcuda(), "cuDeviceGetUuid");
    CUuuid uuid;
    if (!uuid_of || uuid_of(&uuid, device) != CUDA_SUCCESS) return 0;
    return (unsigned char)uuid.bytes[15];
}

static void print_driver_stats_of(unsigned physical) {
    int (*stats)(unsigned, unsigned long long *, unsigned long long *, unsigned long long *) =
        (int (*)(unsigned, unsigned long long *, unsigned long long *, unsigned long long *))dlsym(
            libcuda(), "fakegpu_device_stats");
    unsigned long long used, peak, calls;
    if (stats && stats(physical, &used, &peak, &calls) == 0)
        printf("driver_used=%llu\ndriver_peak=%llu\n", used, peak);
}

static size_t current_free(const struct api *api) {
    size_t free_bytes = 0, total_bytes = 0;
    check(api->mem_get_info(&free_bytes, &total_bytes), "cuMemGetInfo_v2");
    return free_bytes;
}

enum family_kind { PITCH, MANAGED, ASYNC, POOL, VMM, ARRAY, ARRAY3D, MIPMAP, FAMILY_COUNT };
static const char *const FAMILY_NAMES[FAMILY_COUNT] = {"pitch", "managed", "async", "pool",
                                                       "vmm",   "array",   "array3d", "mipmap"};

/* Geometry of one object of about `chunk` bytes. The model of what each costs is the client's own:
 *   pitch    600 bytes wide (the driver pads rows to its pitch), chunk/1024 rows: pitch × rows
 *   array    1024 × chunk/16 KiB float4 texels (16 bytes each)
 *   array3d  1024 × 64 × chunk/1 MiB float4 texels
 *   mipmap   256 × 64 × chunk/256 KiB float4 texels, 9 levels, each dimension halved per level
 *            (never below 1): the sum over the levels */
enum { PITCH_WIDTH = 600, PITCH_ROW = 1024, TEXEL = 16, MIPMAP_LEVELS = 9 };
static const size_t VMM_RESERVE = 64ull << 30;

static size_t halved(size_t extent, unsigned level) {
    size_t e = extent >> level;
    return e ? e : 1;
}

static size_t mipmap_bytes(const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned levels) {
    size_t sum = 0;
    for (unsigned l = 0; l < levels; l++)
        sum += halved(d->Width, l) * halved(d->Height, l) * halved(d->Depth, l);
    return sum * TEXEL;
}

/* One object of a family, and where it lives. */
struct object {
    CUdeviceptr ptr; /* pitch, managed, async, pool: the pointer; vmm: where it is mapped */
    void *handle;    /* array, array3d, mipmap */
    CUmemGenericAllocationHandle vmm;
    size_t bytes; /* what the family's model says it costs */
};

struct family_run {
    enum family_kind kind;
    const struct api *api;
    const struct families *f;
    CUmemoryPool pool;
    CUstream stream;
    int location;   /* vmm: the device its memory is placed on */
    CUdeviceptr va; /* vmm: the reserved address range */
};

static CUresult create_object(const struct family_run *run, struct object *o, size_t chunk, size_t index) {
    const struct families *f = run->f;
    CUresult status;
    memset(o, 0, sizeof *o);
    switch (run->kind) {
    case PITCH: {
        size_t pitch = 0, rows = chunk / PITCH_ROW;
        status = f->mem_alloc_pitch(&o->ptr, &pitch, PITCH_WIDTH, rows, 4);
        o->bytes = pitch * rows;
        return status;
    }
    case MANAGED:
        o->bytes = chunk;
        return f->mem_alloc_managed(&o->ptr, chunk, CU_MEM_ATTACH_GLOBAL);
    case ASYNC:
        o->bytes = chunk;
        return f->mem_alloc_async(&o->ptr, chunk, run->stream);
    case POOL:
        o->bytes = chunk;
        return f->mem_alloc_from_pool_async(&o->ptr, chunk, run->pool, run->stream);
    case VMM: {
        CUmemAllocationProp prop;
        memset(&prop, 0, sizeof prop);
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = run->location;
        o->bytes = chunk;
        status = f->mem_create(&o->vmm, chunk, &prop, 0);
        if (status == CUDA_SUCCESS) {
            o->ptr = run->va + index * chunk;
            check(f->mem_map(o->ptr, chunk, 0, o->vmm, 0), "cuMemMap");
        }
        return status;
    }
    case ARRAY: {
        CUDA_ARRAY_DESCRIPTOR d = {.Width = 1024, .Height = chunk / (1024 * TEXEL), .Format = CU_AD_FORMAT_FLOAT,
                                   .NumChannels = 4};
        o->bytes = d.Width * d.Height * TEXEL;
        return f->array_create((CUarray *)&o->handle, &d);
    }
    case ARRAY3D: {
        CUDA_ARRAY3D_DESCRIPTOR d = {.Width = 1024, .Height = 64, .Depth = chunk / (1024 * 64 * TEXEL),
                                     .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 4};
        o->bytes = d.Width * d.Height * d.Depth * TEXEL;
        return f->array3d_create((CUarray *)&o->handle, &d);
    }
    case MIPMAP: {
        CUDA_ARRAY3D_DESCRIPTOR d = {.Width = 256, .Height = 64, .Depth = chunk / (256 * 64 * TEXEL),
                                     .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 4};
        o->bytes = mipmap_bytes(&d, MIPMAP_LEVELS);
        return f->mipmapped_array_create((CUmipmappedArray *)&o->handle, &d, MIPMAP_LEVELS);
    }
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
}

static void destroy_object(const struct family_run *run, const struct object *o) {
    const struct families *f = run->f;
    switch (run->kind) {
    case PITCH:
    case MANAGED:
        check(run->api->mem_free(o->ptr), "cuMemFree_v2");
        break;
    case ASYNC:
    case POOL:
        check(f->mem_free_async(o->ptr, run->stream), "cuMemFreeAsync");
        break;
    case VMM:
        check(f->mem_unmap(o->ptr, o->bytes), "cuMemUnmap");
        check(f->mem_release(o->vmm), "cuMemRelease");
        break;
    case ARRAY:
    case ARRAY3D:
        check(f->array_destroy(o->handle), "cuArrayDestroy");
        break;
    case MIPMAP:
        check(f->mipmapped_array_destroy(o->handle), "cuMipmappedArrayDestroy");
        break;
    default:
        break;
    }
}

/* The slot of the call that creates a family's objects, whose name the fake counts calls by. */
static size_t creating_slot(enum family_kind kind) {
    static const size_t slots[FAMILY_COUNT] = {
        offsetof(struct families, mem_alloc_pitch),        offsetof(struct families, mem_alloc_managed),
        offsetof(struct families, mem_alloc_async),        offsetof(struct families, mem_alloc_from_pool_async),
        offsetof(struct families, mem_create),             offsetof(struct families, array_create),
        offsetof(struct families, array3d_create),         offsetof(struct families, mipmapped_array_create),
    };
    return slots[kind];
}

/* Creates objects until refused (or `cap`); prints LABEL_bytes and LABEL_status; returns the count. */
static size_t fill_family(const struct family_run *run, struct object *objects, size_t cap, size_t chunk,
                          const char *label) {
    size_t n = 0, bytes = 0;
    CUresult status = CUDA_SUCCESS;
    while (n < cap && (status = create_object(run, &objects[n], chunk, n)) == CUDA_SUCCESS)
        bytes += objects[n++].bytes;
    printf("%s_bytes=%zu\n%s_status=%d\n", label, bytes, label, status);
    return n;
}

static void destroy_all(const struct family_run *run, const struct object *objects, size_t n) {
    for (size_t i = 0; i < n; i++) destroy_object(run, &objects[i]);
    if (run->kind == ASYNC || run->kind == POOL)
        check(run->f->stream_synchronize(run->stream), "cuStreamSynchronize");
}

static int cmd_family(const char *path_arg, const char *name, size_t chunk) {
    enum { CAP = 1 << 16 };
    static struct object objects[CAP];
    struct call_path path = parse_path(path_arg);
    struct family_run run;
    memset(&run, 0, sizeof run);
    run.kind = FAMILY_COUNT;
    for (int k = 0; k < FAMILY_COUNT; k++)
        if (strcmp(name, FAMILY_NAMES[k]) == 0) run.kind = (enum family_kind)k;
    if (run.kind == FAMILY_COUNT || chunk == 0) {
        fprintf(stderr, "unknown family %s (or no size)\n", name);
        return 2;
    }
    struct api api = load(path.base);
    struct families f = load_families(&path);
    run.api = &api;
    run.f = &f;
    CUdevice device = open_device(&api);
    CUdevice charged = device; /* the device whose budget the objects are charged to */
    NEED(&f, &path, stream_synchronize);
    need(*(void **)((char *)&f + creating_slot(run.kind)), &path, creating_slot(run.kind));
    switch (run.kind) {
    case ASYNC:
    case POOL:
        NEED(&f, &path, mem_free_async);
        if (run.kind == POOL) {
            NEED(&f, &path, device_get_default_mem_pool);
            check(f.device_get_default_mem_pool(&run.pool, device), "cuDeviceGetDefaultMemPool");
        }
        break;
    case VMM: {
        const char *location = getenv("CLIENT_LOCATION");
        run.location = location ? atoi(location) : device;
        charged = run.location;
        NEED(&f, &path, mem_release);
        NEED(&f, &path, mem_address_reserve);
        NEED(&f, &path, mem_address_free);
        NEED(&f, &path, mem_map);
        NEED(&f, &path, mem_unmap);
        /* far more address space than the budget, as PyTorch's expandable segments reserve */
        CUresult status = f.mem_address_reserve(&run.va, VMM_RESERVE, 0, 0, 0);
        printf("reserve_status=%d\n", status);
        if (status != CUDA_SUCCESS) return 4;
        break;
    }
    case ARRAY:
    case ARRAY3D:
        NEED(&f, &path, array_destroy);
        break;
    case MIPMAP:
        NEED(&f, &path, mipmapped_array_destroy);
        break;
    default:
        break;
    }
    size_t free_bytes, total_bytes;
    check(api.mem_get_info(&free_bytes, &total_bytes), "cuMemGetInfo_v2");
    printf("info_total=%zu\ninfo_free=%zu\n", total_bytes, free_bytes);

    size_t n = fill_family(&run, objects, CAP, chunk, name);
    if (n > 0) printf("%s_size=%zu\n", name, objects[0].bytes);
    if (run.kind == PITCH && n > 0) {
        printf("pitch=%zu\n", objects[0].bytes / (chunk / PITCH_ROW));
    }
    printf("full_free=%zu\n", current_free(&api));
    print_driver_stats_of(physical_index(charged));
    printf("driver_create_calls=%llu\n", driver_calls(driver_name(&path, creating_slot(run.kind))));
    destroy_all(&run, objects, n);
    printf("freed_free=%zu\n", current_free(&api));
    n = fill_family(&run, objects, CAP, chunk, "refill");
    destroy_all(&run, objects, n);
    printf("refilled_free=%zu\n", current_free(&api));
    if (run.kind == VMM) check(f.mem_address_free(run.va, VMM_RESERVE), "cuMemAddressFree");
    return 0;
}

/* Allocates 64 MiB chunks with cuMemAlloc_v2 until refused, frees them; prints LABEL_bytes/_status. */
static void fill_and_free(const struct api *api, const char *label) {
    enum { CAP = 1 << 12 };
    static CUdeviceptr held[CAP];
    size_t n = fill(api, 64u << 20, held, CAP, label);
    for (size_t i = 0; i < n; i++) check(api->mem_free(held[i]), "cuMemFree_v2");
}

/* VGPU_CLIENT_AFFINITY_SMS=N: _v3 and _v4 contexts ask for an execution affinity of N SMs
 * (CUexecAffinityParam: CU_EXEC_AFFINITY_TYPE_SM_COUNT, then the count; CUctxCreateParams: the
 * list, its length, no CIG parameters). */
static CUresult create_context(const struct families *f, int variant, CUcontext *ctx, CUdevice device) {
    const char *sms_text = getenv("VGPU_CLIENT_AFFINITY_SMS");
    unsigned sms = sms_text ? (unsigned)strtoul(sms_text, NULL, 10) : 0;
    struct { int type; unsigned count; } affinity = {0, sms};
    struct { void *list; int length; void *cig; } params = {&affinity, 1, NULL};
    switch (variant) {
    case 2:
        return f->ctx_create_v2(ctx, 0, device);
    case 3:
        return sms ? f->ctx_create_v3(ctx, &affinity, 1, 0, device) : f->ctx_create_v3(ctx, NULL, 0, 0, device);
    default:
        return f->ctx_create_v4(ctx, sms ? (void *)&params : NULL, 0, device);
    }
}

static int cmd_context(const char *path_arg) {
    struct call_path path = parse_path(path_arg);
    struct api api = load(path.base);
    struct families f = load_families(&path);
    NEED(&f, &path, ctx_create_v2);
    NEED(&f, &path, ctx_create_v3);
    NEED(&f, &path, ctx_create_v4);
    NEED(&f, &path, ctx_destroy);
    NEED(&f, &path, primary_ctx_release);
    CUdevice device = open_device(&api); /* the first primary reference, made current */
    CUcontext primary, again, ctx[3];
    size_t free_bytes, total_bytes;
    check(api.mem_get_info(&free_bytes, &total_bytes), "cuMemGetInfo_v2");
    printf("primary_total=%zu\nprimary_free=%zu\n", total_bytes, free_bytes);
    fill_and_free(&api, "primary_fill");

    check(api.primary_ctx_retain(&again, device), "cuDevicePrimaryCtxRetain"); /* the second reference */
    primary = again;
    printf("retained_again_free=%zu\n", current_free(&api));

    for (int v = 2; v <= 4; v++) { /* each ABI alone: charged while it lives */
        CUresult status = create_context(&f, v, &ctx[0], device);
        printf("ctx_v%d_status=%d\n", v, status);
        if (status != CUDA_SUCCESS) continue;
        check(api.ctx_set_current(ctx[0]), "cuCtxSetCurrent");
        printf("ctx_v%d_free=%zu\n", v, current_free(&api));
        char name[32];
        snprintf(name, sizeof name, "cuCtxCreate_v%d", v);
        printf("ctx_v%d_driver_calls=%llu\n", v, driver_calls(name));
        printf("ctx_v%d_destroy_status=%d\n", v, f.ctx_destroy(ctx[0]));
        check(api.ctx_set_current(primary), "cuCtxSetCurrent");
        printf("ctx_v%d_destroyed_free=%zu\n", v, current_free(&api));
    }

    CUresult all = CUDA_SUCCESS; /* all three at once */
    int made = 0;
    for (int v = 2; v <= 4 && all == CUDA_SUCCESS; v++)
        if ((all = create_context(&f, v, &ctx[made], device)) == CUDA_SUCCESS) made++;
    printf("all_status=%d\n", all);
    check(api.ctx_set_current(primary), "cuCtxSetCurrent");
    printf("all_free=%zu\n", current_free(&api));
    CUdeviceptr p;
    CUresult alloc = api.mem_alloc(&p, 64u << 20);
    printf("all_alloc_status=%d\n", alloc);
    if (alloc == CUDA_SUCCESS) check(api.mem_free(p), "cuMemFree_v2");
    while (made > 0) check(f.ctx_destroy(ctx[--made]), "cuCtxDestroy_v2");
    check(api.ctx_set_current(primary), "cuCtxSetCurrent");
    printf("all_destroyed_free=%zu\n", current_free(&api));

    check(f.primary_ctx_release(device), "cuDevicePrimaryCtxRelease_v2"); /* one reference left */
    printf("released_once_free=%zu\n", current_free(&api));
    printf("released_status=%d\n", f.primary_ctx_release(device)); /* the last one */
    CUresult after = f.ctx_create_v2(&ctx[0], 0, device);
    printf("after_release_status=%d\n", after);
    if (after == CUDA_SUCCESS) {
        check(api.ctx_set_current(ctx[0]), "cuCtxSetCurrent");
        printf("after_release_free=%zu\n", current_free(&api));
        check(f.ctx_destroy(ctx[0]), "cuCtxDestroy_v2");
    }
    return 0;
}

/* Green contexts through dlsym: one created and destroyed (free memory before, while, after), then
 * as many as fit, up to 4 (each status printed). */
static int cmd_dlmopen(const struct api *api) {
    void *h = dlmopen(LM_ID_NEWLM, "libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    printf("second_open=%d\n", h != NULL);
    if (!h) {
        printf("second_error=%s\n", dlerror());
        return 5;
    }
    struct link_map *copy = NULL;
    if (dlinfo(h, RTLD_DI_LINKMAP, &copy) != 0 || !copy) return 5;
    const char *names[] = {"cuInit", "cuDeviceGet", "cuDevicePrimaryCtxRetain", "cuCtxSetCurrent", "cuMemAlloc_v2",
                           "cuMemFree_v2"};
    void *fn[6];
    int elsewhere = 0;
    for (int i = 0; i < 6; i++) {
        Dl_info info;
        fn[i] = dlsym(h, names[i]);
        if (!fn[i] || !dladdr(fn[i], &info) || (uintptr_t)info.dli_fbase != (uintptr_t)copy->l_addr) elsewhere++;
    }
    printf("second_elsewhere=%d\n", elsewhere);
    if (elsewhere == 6) return 5;
    CUdevice device;
    CUcontext ctx;
    CUdeviceptr p;
    CUresult status = ((CUresult(*)(unsigned))fn[0])(0);
    if (status == CUDA_SUCCESS) status = ((CUresult(*)(CUdevice *, int))fn[1])(&device, 0);
    if (status == CUDA_SUCCESS) status = ((CUresult(*)(CUcontext *, CUdevice))fn[2])(&ctx, device);
    if (status == CUDA_SUCCESS) status = ((CUresult(*)(CUcontext))fn[3])(ctx);
    printf("second_init_status=%d\n", status);
    status = ((CUresult(*)(CUdeviceptr *, size_t))fn[4])(&p, 64 << 20);
    printf("second_alloc_status=%d\n", status);
    if (status == CUDA_SUCCESS) ((CUresult(*)(CUdeviceptr))fn[5])(p);
    enum { CAP = 1 << 12 };
    static CUdeviceptr held[CAP];
    open_device(api);
    size_t n = fill(api, 64 << 20, held, CAP, "first");
    for (size_t i = 0; i < n; i++) check(api->mem_free(held[i]), "cuMemFree_v2");
    return 0;
}

static int cmd_green(const struct api *api) {
    typedef CUresult (*green_create_fn)(void **, void *, CUdevice, unsigned);
    typedef CUresult (*green_destroy_fn)(void *);
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW);
    green_create_fn create = cuda ? (green_create_fn)dlsym(cuda, "cuGreenCtxCreate") : NULL;
    green_destroy_fn destroy = cuda ? (green_destroy_fn)dlsym(cuda, "cuGreenCtxDestroy") : NULL;
    if (!create || !destroy) {
        printf("green_unresolved=1\n");
        return 3;
    }
    CUdevice device = open_device(api);
    void *green[4];
    printf("green_before_free=%zu\n", current_free(api));
    printf("green_status=%d\n", create(&green[0], NULL, device, 1));
    printf("green_free=%zu\n", current_free(api));
    printf("green_destroy_status=%d\n", destroy(green[0]));
    printf("green_destroyed_free=%zu\n", current_free(api));
    int made = 0;
    for (int i = 0; i < 4; i++) {
        CUresult status = create(&green[made], NULL, device, 1);
        printf("green_fill_%d=%d\n", i, status);
        if (status == CUDA_SUCCESS) made++;
    }
    while (made > 0) check(destroy(green[--made]), "cuGreenCtxDestroy");
    printf("green_end_free=%zu\n", current_free(api));
    return 0;
}

static int cmd_host(const char *path_arg, size_t bytes) {
    struct call_path path = parse_path(path_arg);
    struct api api = load(path.base);
    struct families f = load_families(&path);
    NEED(&f, &path, mem_host_alloc);
    NEED(&f, &path, mem_alloc_host);
    NEED(&f, &path, mem_free_host);
    NEED(&f, &path, mem_host_register);
    NEED(&f, &path, mem_host_unregister);
    open_device(&api);
    printf("info_free=%zu\n", current_free(&api));
    void *host_alloc = NULL, *alloc_host = NULL, *registered = malloc(bytes);
    if (!registered) return 3;
    CUresult a = f.mem_host_alloc(&host_alloc, bytes, 0);
    CUresult b = f.mem_alloc_host(&alloc_host, bytes);
    CUresult c = f.mem_host_register(registered, bytes, 0);
    printf("host_alloc_status=%d\nalloc_host_status=%d\nhost_register_status=%d\n", a, b, c);
    printf("host_free=%zu\n", current_free(&api));
    fill_and_free(&api, "device");
    if (a == CUDA_SUCCESS) printf("host_alloc_free_status=%d\n", f.mem_free_host(host_alloc));
    if (b == CUDA_SUCCESS) printf("alloc_host_free_status=%d\n", f.mem_free_host(alloc_host));
    if (c == CUDA_SUCCESS) printf("host_register_free_status=%d\n", f.mem_host_unregister(registered));
    free(registered);
    printf("released_free=%zu\n", current_free(&api));
    return 0;
}

static int cmd_ipc(const char *path_arg, size_t chunk) {
    enum { CAP = 1 << 12 };
    static CUdeviceptr held[CAP];
    struct call_path path = parse_path(path_arg);
    struct api api = load(path.base);
    struct families f = load_families(&path);
    NEED(&f, &path, ipc_get_mem_handle);
    NEED(&f, &path, ipc_open_mem_handle);
    NEED(&f, &path, ipc_close_mem_handle);
    open_device(&api);
    CUdeviceptr mine, opened = 0;
    check(api.mem_alloc(&mine, chunk), "cuMemAlloc_v2");
    printf("alloc_free=%zu\n", current_free(&api));
    CUipcMemHandle handle;
    memset(&handle, 0, sizeof handle);
    CUresult got = f.ipc_get_mem_handle(&handle, mine);
    printf("ipc_get_status=%d\n", got);
    CUresult open_status =
        got == CUDA_SUCCESS ? f.ipc_open_mem_handle(&opened, handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) : got;
    printf("ipc_open_status=%d\nopened_free=%zu\n", open_status, current_free(&api));
    size_t n = fill(&api, chunk, held, CAP, "opened_fill");
    for (size_t i = 0; i < n; i++) check(api.mem_free(held[i]), "cuMemFree_v2");
    if (open_status == CUDA_SUCCESS) printf("ipc_close_status=%d\n", f.ipc_close_mem_handle(opened));
    printf("closed_free=%zu\n", current_free(&api));
    check(api.mem_free(mine), "cuMemFree_v2");
    printf("released_free=%zu\n", current_free(&api));
    return 0;
}

/* Prints KEY=status of CALL when PFN resolved on this path (a missing key fails the test). */
#define PROBE(key, pfn, call)                                \
    do {                                                     \
        if (pfn) printf("%s=%d\n", key, (int)(call));       \
        else printf("unresolved_%s=1\n", key);               \
    } while (0)

/* NULL out-pointers and bogus handles: each call's status, which must be the driver's own. */
static int cmd_nulls(const char *path_arg) {
    struct call_path path = parse_path(path_arg);
    struct api api = load(path.base);
    struct families f = load_families(&path);
    CUdevice device = open_device(&api);
    const size_t MIB1 = 1u << 20, GRANULE = 2u << 20;
    const CUdeviceptr BOGUS = 0xdeadbeef000ull;
    CUdeviceptr p;
    size_t pitch;
    CUarray array;
    CUmipmappedArray mipmap;
    CUmemGenericAllocationHandle vmm;
    CUcontext ctx;
    CUmemoryPool pool = NULL;
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device;
    CUDA_ARRAY_DESCRIPTOR desc = {.Width = 1024, .Height = 1024, .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 4};
    CUDA_ARRAY3D_DESCRIPTOR desc3 = {.Width = 64, .Height = 64, .Depth = 64, .Format = CU_AD_FORMAT_FLOAT,
                                     .NumChannels = 4};

    printf("alloc_null=%d\n", api.mem_alloc(NULL, MIB1));
    printf("free_bogus=%d\n", api.mem_free(BOGUS));
    printf("info_null=%d\n", api.mem_get_info(NULL, NULL));
    printf("total_null=%d\n", api.device_total_mem(NULL, device));
    PROBE("pitch_null_pitch", f.mem_alloc_pitch, f.mem_alloc_pitch(&p, NULL, PITCH_WIDTH, 1024, 4));
    PROBE("pitch_null_ptr", f.mem_alloc_pitch, f.mem_alloc_pitch(NULL, &pitch, PITCH_WIDTH, 1024, 4));
    PROBE("managed_null", f.mem_alloc_managed, f.mem_alloc_managed(NULL, MIB1, CU_MEM_ATTACH_GLOBAL));
    PROBE("async_null", f.mem_alloc_async, f.mem_alloc_async(NULL, MIB1, NULL));
    if (f.device_get_default_mem_pool) printf("default_pool=%d\n", f.device_get_default_mem_pool(&pool, device));
    PROBE("pool_null", f.mem_alloc_from_pool_async, f.mem_alloc_from_pool_async(NULL, MIB1, pool, NULL));
    PROBE("free_async_bogus", f.mem_free_async, f.mem_free_async(BOGUS, NULL));
    PROBE("create_null_prop", f.mem_create, f.mem_create(&vmm, GRANULE, NULL, 0));
    PROBE("create_null_handle", f.mem_create, f.mem_create(NULL, GRANULE, &prop, 0));
    /* The real CUDA 13 driver itself crashes on a bogus cuMemRelease handle (seen natively, without
     * libvgpu, on an H200 with driver 580), so real-GPU runs leave this probe out. */
    if (!getenv("CLIENT_SKIP_BOGUS_RELEASE")) PROBE("release_bogus", f.mem_release, f.mem_release(0xdead000ull));
    PROBE("array_null_desc", f.array_create, f.array_create(&array, NULL));
    PROBE("array_null_out", f.array_create, f.array_create(NULL, &desc));
    PROBE("array3d_null_desc", f.array3d_create, f.array3d_create(&array, NULL));
    PROBE("array3d_null_out", f.array3d_create, f.array3d_create(NULL, &desc3));
    PROBE("mipmap_null_desc", f.mipmapped_array_create, f.mipmapped_array_create(&mipmap, NULL, 1));
    PROBE("mipmap_null_out", f.mipmapped_array_create, f.mipmapped_array_create(NULL, &desc3, 1));
    PROBE("array_destroy_null", f.array_destroy, f.array_destroy(NULL));
    PROBE("mipmap_destroy_null", f.mipmapped_array_destroy, f.mipmapped_array_destroy(NULL));
    PROBE("ctx_create_null", f.ctx_create_v2, f.ctx_create_v2(NULL, 0, device));
    PROBE("ctx_destroy_null", f.ctx_destroy, f.ctx_destroy(NULL));
    (void)ctx;
    PROBE("retain_null", f.mem_retain_allocation_handle,
          f.mem_retain_allocation_handle(NULL, (void *)(uintptr_t)BOGUS));
    PROBE("retain_unmapped", f.mem_retain_allocation_handle,
          f.mem_retain_allocation_handle(&vmm, (void *)(uintptr_t)BOGUS));
    PROBE("unmap_bogus", f.mem_unmap, f.mem_unmap(BOGUS, GRANULE));
    if (!getenv("CLIENT_SKIP_BOGUS_RELEASE"))
        PROBE("map_bogus", f.mem_map, f.mem_map(BOGUS, GRANULE, 0, 0xdead000ull, 0));
    PROBE("instantiate_null", f.graph_instantiate, f.graph_instantiate(NULL, NULL, 0));
    PROBE("exec_destroy_null", f.graph_exec_destroy, f.graph_exec_destroy(NULL));

    void *nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    nvmlReturn_t (*init)(void) = nvml ? (nvmlReturn_t (*)(void))dlsym(nvml, "nvmlInit_v2") : NULL;
    nvmlReturn_t (*by_index)(unsigned, nvmlDevice_t *) =
        nvml ? (nvmlReturn_t (*)(unsigned, nvmlDevice_t *))dlsym(nvml, "nvmlDeviceGetHandleByIndex_v2") : NULL;
    nvmlReturn_t (*info)(nvmlDevice_t, void *) =
        nvml ? (nvmlReturn_t (*)(nvmlDevice_t, void *))dlsym(nvml, "nvmlDeviceGetMemoryInfo") : NULL;
    nvmlReturn_t (*info2)(nvmlDevice_t, void *) =
        nvml ? (nvmlReturn_t (*)(nvmlDevice_t, void *))dlsym(nvml, "nvmlDeviceGetMemoryInfo_v2") : NULL;
    nvmlDevice_t handle = NULL;
    if (init && by_index && info && info2 && init() == 0 && by_index(0, &handle) == 0) {
        printf("nvml_info_null=%d\n", info(handle, NULL));
        printf("nvml_info_v2_null=%d\n", info2(handle, NULL));
    }
    printf("after_free=%zu\n", current_free(&api));
    print_driver_stats_of(physical_index(device));
    return 0;
}

/* Whether `pfn` lies in the object that the libcuda.so.1 handle names. */
static int in_driver(void *pfn) {
    struct link_map *map = NULL;
    Dl_info info;
    if (!pfn || dlinfo(libcuda(), RTLD_DI_LINKMAP, &map) != 0 || !map || !dladdr(pfn, &info) || !info.dli_fname)
        return 0;
    return strcmp(info.dli_fname, map->l_name) == 0;
}

static int cmd_passthrough(void) {
    void *h = libcuda();
    GetProcAddressV2 gpa = (GetProcAddressV2)dlsym(h, "cuGetProcAddress_v2");
    if (!gpa) return 3;
    CUresult (*init)(unsigned) = (CUresult (*)(unsigned))dlsym(h, "cuInit");
    if (!init || init(0) != CUDA_SUCCESS) return 3;
    static const struct {
        const char *key, *name;
    } names[] = {{"attribute", "cuDeviceGetAttribute"}, {"version", "cuDriverGetVersion"}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        void *through = NULL, *looked_up = dlsym(h, names[i].name);
        int symbol_status = -1;
        CUresult status = gpa(names[i].name, &through, 12000, 0, &symbol_status);
        const char *key = names[i].key;
        printf("%s_status=%d\n%s_same=%d\n", key, status, key, through != NULL && through == looked_up);
        printf("%s_in_driver=%d\n%s_dlsym_in_driver=%d\n", key, in_driver(through), key, in_driver(looked_up));
        if (!through) continue;
        int value = -1;
        CUresult call = i == 0 ? ((CUresult (*)(int *, int, CUdevice))through)(
                                     &value, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 0)
                               : ((CUresult (*)(int *))through)(&value);
        printf("%s_call_status=%d\n%s_value=%d\n", key, call, key, value);
    }
    return 0;
}

/* lifetime vmm: one handle mapped, retained once, then released twice while still mapped. */
static int lifetime_vmm(const struct call_path *path, const struct api *api, struct families *f,
                        CUdevice device, size_t bytes) {
    NEED(f, path, mem_create);
    NEED(f, path, mem_release);
    NEED(f, path, mem_address_reserve);
    NEED(f, path, mem_address_free);
    NEED(f, path, mem_map);
    NEED(f, path, mem_unmap);
    NEED(f, path, mem_retain_allocation_handle);
    CUdeviceptr va = 0;
    check(f->mem_address_reserve(&va, bytes, 0, 0, 0), "cuMemAddressReserve");
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device;
    CUmemGenericAllocationHandle handle = 0, retained = 0;
    printf("create_status=%d\n", f->mem_create(&handle, bytes, &prop, 0));
    printf("created_free=%zu\n", current_free(api));
    printf("map_status=%d\n", f->mem_map(va, bytes, 0, handle, 0));
    printf("retain_status=%d\n", f->mem_retain_allocation_handle(&retained, (void *)(uintptr_t)va));
    printf("retained_same=%d\n", retained == handle);
    printf("release_status=%d\n", f->mem_release(handle));
    printf("release_again_status=%d\n", f->mem_release(retained));
    printf("released_mapped_free=%zu\n", current_free(api));
    print_driver_stats_of(physical_index(device));
    fill_and_free(api, "mapped");
    printf("unmap_status=%d\n", f->mem_unmap(va, bytes));
    printf("unmapped_free=%zu\n", current_free(api));
    fill_and_free(api, "unmapped");
    check(f->mem_address_free(va, bytes), "cuMemAddressFree");
    return 0;
}

/* lifetime pool: a default pool told never to give memory back keeps what is freed into it. */
static int lifetime_pool(const struct call_path *path, const struct api *api, struct families *f,
                         CUdevice device, size_t bytes) {
    NEED(f, path, device_get_default_mem_pool);
    NEED(f, path, mem_pool_set_attribute);
    NEED(f, path, mem_pool_trim_to);
    NEED(f, path, mem_alloc_async);
    NEED(f, path, mem_free_async);
    NEED(f, path, stream_synchronize);
    CUmemoryPool pool = NULL;
    check(f->device_get_default_mem_pool(&pool, device), "cuDeviceGetDefaultMemPool");
    /* How much the pool grows for a 1 MiB allocation (the driver's growth step). */
    CUdeviceptr small = 0;
    unsigned long long reserved = 0;
    if (f->mem_pool_get_attribute && f->mem_alloc_async(&small, 1u << 20, NULL) == CUDA_SUCCESS) {
        f->mem_pool_get_attribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved);
        printf("small_alloc_reserved=%llu\n", reserved);
        check(f->mem_free_async(small, NULL), "cuMemFreeAsync");
        check(f->stream_synchronize(NULL), "cuStreamSynchronize");
    }
    unsigned long long keep_everything = ~0ull;
    printf("threshold_status=%d\n", f->mem_pool_set_attribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                                                               &keep_everything));
    CUdeviceptr ptr = 0;
    printf("alloc_status=%d\n", f->mem_alloc_async(&ptr, bytes, NULL));
    printf("allocated_free=%zu\n", current_free(api));
    printf("free_status=%d\n", f->mem_free_async(ptr, NULL));
    check(f->stream_synchronize(NULL), "cuStreamSynchronize");
    printf("cached_free=%zu\n", current_free(api));
    print_driver_stats_of(physical_index(device));
    fill_and_free(api, "cached");
    /* served from the cache: the pool does not grow, so nothing more is charged */
    printf("reuse_status=%d\n", f->mem_alloc_async(&ptr, bytes, NULL));
    printf("reused_free=%zu\n", current_free(api));
    check(f->mem_free_async(ptr, NULL), "cuMemFreeAsync");
    check(f->stream_synchronize(NULL), "cuStreamSynchronize");
    printf("trim_status=%d\n", f->mem_pool_trim_to(pool, 0));
    fill_and_free(api, "trimmed");
    printf("trimmed_free=%zu\n", current_free(api));
    return 0;
}

/* lifetime graph: a graph with one allocation node of BYTES, instantiated twice, launched once. */
static int lifetime_graph(const struct call_path *path, const struct api *api, struct families *f,
                          CUdevice device, size_t bytes) {
    NEED(f, path, graph_create);
    NEED(f, path, graph_destroy);
    NEED(f, path, graph_add_mem_alloc_node);
    NEED(f, path, graph_instantiate);
    NEED(f, path, graph_launch);
    NEED(f, path, graph_exec_destroy);
    NEED(f, path, stream_synchronize);
    CUgraph graph = NULL;
    check(f->graph_create(&graph, 0), "cuGraphCreate");
    CUDA_MEM_ALLOC_NODE_PARAMS params;
    memset(&params, 0, sizeof params);
    params.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    params.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    params.poolProps.location.id = device;
    params.bytesize = bytes;
    CUgraphNode node = NULL;
    printf("node_status=%d\n", f->graph_add_mem_alloc_node(&node, graph, NULL, 0, &params));
    printf("node_free=%zu\n", current_free(api));
    CUgraphExec first = NULL, second = NULL;
    printf("first_status=%d\n", f->graph_instantiate(&first, graph, 0));
    printf("first_free=%zu\n", current_free(api));
    printf("second_status=%d\n", f->graph_instantiate(&second, graph, 0));
    printf("launch_status=%d\n", f->graph_launch(first, NULL));
    check(f->stream_synchronize(NULL), "cuStreamSynchronize");
    print_driver_stats_of(physical_index(device));
    fill_and_free(api, "launched");
    if (second) check(f->graph_exec_destroy(second), "cuGraphExecDestroy");
    printf("destroy_status=%d\n", f->graph_exec_destroy(first));
    printf("destroyed_free=%zu\n", current_free(api));
    check(f->graph_destroy(graph), "cuGraphDestroy");
    return 0;
}

static int cmd_lifetime(const char *path_arg, const char *what, size_t bytes) {
    struct call_path path = parse_path(path_arg);
    struct api api = load(path.base);
    struct families f = load_families(&path);
    CUdevice device = open_device(&api);
    printf("start_free=%zu\n", current_free(&api));
    if (strcmp(what, "vmm") == 0) return lifetime_vmm(&path, &api, &f, device, bytes);
    if (strcmp(what, "pool") == 0) return lifetime_pool(&path, &api, &f, device, bytes);
    if (strcmp(what, "graph") == 0) return lifetime_graph(&path, &api, &f, device, bytes);
    fprintf(stderr, "unknown lifetime %s\n", what);
    return 2;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 3) {
        fprintf(stderr,
                "usage: %s direct|dlsym|procaddr|procaddr_v1 fill MiB|nvml|symbols|bench N|driver_stats|"
                "refuse MiB N|hold MiB [MAX]|plt_fill MiB|steps|churn MiB|fork MiB|stress S T MiB|family NAME MiB|context|host MiB|ipc MiB|"
                "nulls|passthrough|lifetime vmm|pool|graph MiB\n",
                argv[0]);
        return 2;
    }
    const char *path = argv[1], *command = argv[2];
    if (strcmp(command, "nvml") == 0) return cmd_nvml();
    if (strcmp(command, "plt_fill") == 0 && argc > 3) return cmd_plt_fill((size_t)atol(argv[3]) << 20);
    if (strcmp(command, "symbols") == 0) return cmd_symbols();
    if (strcmp(command, "driver_stats") == 0) return cmd_driver_stats();
    if (strcmp(command, "passthrough") == 0) return cmd_passthrough();
    if (strcmp(command, "family") == 0 && argc > 4) return cmd_family(path, argv[3], (size_t)atol(argv[4]) << 20);
    if (strcmp(command, "context") == 0) return cmd_context(path);
    if (strcmp(command, "host") == 0 && argc > 3) return cmd_host(path, (size_t)atol(argv[3]) << 20);
    if (strcmp(command, "ipc") == 0 && argc > 3) return cmd_ipc(path, (size_t)atol(argv[3]) << 20);
    if (strcmp(command, "nulls") == 0) return cmd_nulls(path);
    if (strcmp(command, "lifetime") == 0 && argc > 4)
        return cmd_lifetime(path, argv[3], (size_t)atol(argv[4]) << 20);
    struct api api = load(path);
    if (strcmp(command, "fill") == 0 && argc > 3) return cmd_fill(&api, (size_t)atol(argv[3]) << 20);
    if (strcmp(command, "refuse") == 0 && argc > 4)
        return cmd_refuse(&api, (size_t)atol(argv[3]) << 20, atol(argv[4]));
    if (strcmp(command, "bench") == 0 && argc > 3) return cmd_bench(&api, atol(argv[3]));
    if (strcmp(command, "steps") == 0) return cmd_steps(&api);
    if (strcmp(command, "hold") == 0 && argc > 3)
        return cmd_hold(&api, (size_t)atol(argv[3]) << 20, argc > 4 ? (size_t)atol(argv[4]) << 20 : SIZE_MAX);
    if (strcmp(command, "churn") == 0 && argc > 3 && atol(argv[3]) > 0)
        return cmd_timed_churn(&api, INFINITY, (size_t)atol(argv[3]));
    if (strcmp(command, "fork") == 0 && argc > 3) return cmd_fork(&api, (size_t)atol(argv[3]) << 20);
    if (strcmp(command, "green") == 0) return cmd_green(&api);
    if (strcmp(command, "dlmopen") == 0) return cmd_dlmopen(&api);
    if (strcmp(command, "timed-churn") == 0 && argc > 4 && atol(argv[4]) > 0)
        return cmd_timed_churn(&api, atof(argv[3]), (size_t)atol(argv[4]));
    if (strcmp(command, "stress") == 0 && argc > 5)
        return cmd_stress(&api, atof(argv[3]), (unsigned)atoi(argv[4]), (size_t)atol(argv[5]));
    fprintf(stderr, "unknown command %s\n", command);
    return 2;
}
