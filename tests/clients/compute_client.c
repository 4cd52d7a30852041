/* A launching client for libvgpu's compute-limit tests, against the fake driver.
 *
 *   compute_client PATH COMMAND [ARG...]
 *
 * PATH is how the launch entry points are reached: direct, dlsym, procaddr (cuGetProcAddress_v2 at
 * 12000) or procaddr_v1 (cuGetProcAddress at 11080), each optionally with `_ptsz` (the per-thread
 * default stream variants; launches then go to the NULL stream, which means the per-thread one).
 * Without `_ptsz`, launches go to a stream the client creates.
 * ENTRY is the launch family: kernel (cuLaunchKernel), cooperative (cuLaunchCooperativeKernel),
 * ex (cuLaunchKernelEx) or graph (cuGraphLaunch of a graph holding one kernel node); or a copy or
 * memset whose size makes it take US microseconds of the fake's simulated time
 * (FAKEGPU_COPY_NS_PER_MIB): dtod (cuMemcpyDtoDAsync_v2), dtod_sync (cuMemcpyDtoD_v2), copy
 * (cuMemcpyAsync between two device buffers), copy3d (cuMemcpy3DAsync_v2, device to device),
 * memset (cuMemsetD32Async), memset_sync (cuMemsetD8_v2) or htod (cuMemcpyHtoDAsync_v2). Their
 * per-thread variants are `_ptsz` (asynchronous) and `_ptds` (synchronous).
 * COMMAND:
 *   loop ENTRY US N    launch a kernel of US microseconds of simulated GPU time N times, then
 *                      cuCtxSynchronize; print launches, status (the first failure, else 0),
 *                      elapsed_ns (wall, first launch to the end of the synchronize), busy_ns (the
 *                      fake's GPU time of this process), share_permille (busy per elapsed) and
 *                      event_records (cuEventRecord calls the fake saw meanwhile: libvgpu's timing),
 *                      starved_ns (the launching thread's time runnable without a CPU meanwhile)
 *   timed ENTRY US MS  the same, launching until MS milliseconds have passed
 *   trace ENTRY US N MS like loop, at most N launches within MS milliseconds, printing when each launch
 *                      call returned: trace_start_ns= (CLOCK_MONOTONIC, the first), trace_us= (each
 *                      one's offset from it, comma-separated), launches=, status=
 *   varying ENTRY US1 US2 MS
 *                      like timed, with one kernel (the same function and grid every time) whose
 *                      launches take US1 and US2 microseconds in turn, passed as its argument (not for
 *                      graph)
 *   mixed US N         N rounds of one kernel launch and one dtod copy, each of US microseconds,
 *                      through the same path; prints as loop does
 *   unchanged          one launch through each family with distinctive arguments; print
 *                      ENTRY_status, ENTRY_same (1 when the fake saw exactly those arguments) and
 *                      ENTRY_library (the file the resolved entry point lives in)
 *   copies_unchanged   the same for every copy and memset entry, ENTRY_same also checking that
 *                      the fake was reached through the exact variant the path names
 *   pair ENTRY US N    CUDA ordinals 0 and 1 at once, one thread each, each with its own primary
 *                      context current: N launches of ENTRY (kernel, dtod, or peer: cuMemcpyPeerAsync
 *                      from this ordinal's memory to the other's, on this ordinal's stream) of US
 *                      microseconds, then cuCtxSynchronize; print devD_launches, devD_status,
 *                      devD_elapsed_ns, devD_busy_ns (the fake's GPU time of this process on the
 *                      physical device of ordinal D, known by its default UUID's last byte) and
 *                      devD_share_permille, devD_starved_ns
 * With CLIENT_HOLD=1 the client prints done=1 after its results and waits for stdin to close.
 * With CLIENT_AFFINITY_SMS=N the client works in a context of its own, created by cuCtxCreate_v3
 * with an execution affinity of N SMs, instead of the primary context.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <libgen.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cuda_subset.h"

typedef CUresult (*LaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                 unsigned, CUstream, void **, void **);
typedef CUresult (*LaunchCooperative)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                      unsigned, CUstream, void **);
typedef CUresult (*LaunchEx)(const CUlaunchConfig *, CUfunction, void **, void **);
typedef CUresult (*GraphLaunch)(CUgraphExec, CUstream);
typedef CUresult (*CopyAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
typedef CUresult (*CopySync)(CUdeviceptr, CUdeviceptr, size_t);
typedef CUresult (*HostCopyAsync)(CUdeviceptr, const void *, size_t, CUstream);
typedef CUresult (*Copy3DAsync)(const CUDA_MEMCPY3D *, CUstream);
typedef CUresult (*Memset32Async)(CUdeviceptr, unsigned, size_t, CUstream);
typedef CUresult (*Memset8Sync)(CUdeviceptr, unsigned char, size_t);
typedef CUresult (*GetProcAddressV1)(const char *, void **, int, unsigned long long);
typedef CUresult (*GetProcAddressV2)(const char *, void **, int, unsigned long long, int *);

/* What the fake driver saw of this process's last launch (fakegpu_last_launch). */
struct fake_launch {
    int entry;
    CUfunction function;
    unsigned grid[3], block[3], shared_mem;
    CUstream stream;
    void **params;
    void **extra;
};

struct path {
    char base[32];
    int per_thread;
};

static void *libcuda(void) {
    static void *handle;
    if (!handle) handle = dlopen("libcuda.so.1", RTLD_NOW);
    if (!handle) {
        fprintf(stderr, "dlopen libcuda.so.1: %s\n", dlerror());
        exit(3);
    }
    return handle;
}

static void *fake_hook(const char *name) {
    void *f = dlsym(libcuda(), name);
    if (!f) {
        fprintf(stderr, "the fake driver lacks %s\n", name);
        exit(3);
    }
    return f;
}

static struct path parse_path(const char *text) {
    struct path p = {{0}, 0};
    size_t n = strlen(text);
    if (n > 5 && strcmp(text + n - 5, "_ptsz") == 0) {
        p.per_thread = 1;
        n -= 5;
    }
    if (n >= sizeof p.base) exit(2);
    memcpy(p.base, text, n);
    return p;
}

/* Resolves an entry point through PATH: BASE is the name cuGetProcAddress takes, PLAIN and PER_THREAD
 * the exported names of its two variants (for dlsym), DIRECT and DIRECT_PT their link-time addresses. */
static void *resolve_named(const struct path *p, const char *base, const char *plain, const char *per_thread,
                           void *direct, void *direct_pt) {
    const char *name = p->per_thread ? per_thread : plain;
    unsigned long long flags = p->per_thread ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : 0;
    void *pfn = NULL;
    if (strcmp(p->base, "direct") == 0) {
        pfn = p->per_thread ? direct_pt : direct;
    } else if (strcmp(p->base, "dlsym") == 0) {
        pfn = dlsym(libcuda(), name);
    } else if (strcmp(p->base, "procaddr") == 0) {
        GetProcAddressV2 get = (GetProcAddressV2)dlsym(libcuda(), "cuGetProcAddress_v2");
        int status = -1;
        if (!get || get(base, &pfn, 12000, flags, &status) != CUDA_SUCCESS) pfn = NULL;
    } else if (strcmp(p->base, "procaddr_v1") == 0) {
        GetProcAddressV1 get = (GetProcAddressV1)dlsym(libcuda(), "cuGetProcAddress");
        if (!get || get(base, &pfn, 11080, flags) != CUDA_SUCCESS) pfn = NULL;
    } else {
        fprintf(stderr, "unknown path %s\n", p->base);
        exit(2);
    }
    if (!pfn) {
        printf("unresolved=%s\n", name);
        exit(4);
    }
    return pfn;
}

/* Resolves launch entry point BASE, whose per-thread variant is BASE_ptsz. */
static void *resolve(const struct path *p, const char *base, void *direct, void *direct_ptsz) {
    char per_thread[64];
    snprintf(per_thread, sizeof per_thread, "%s_ptsz", base);
    return resolve_named(p, base, base, per_thread, direct, direct_ptsz);
}

static void check(CUresult status, const char *what) {
    if (status != CUDA_SUCCESS) {
        fprintf(stderr, "%s failed: %d\n", what, status);
        exit(5);
    }
}

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

/* Nanoseconds this thread has spent runnable but waiting for a CPU (the kernel's run_delay, the
 * second field of /proc/thread-self/schedstat): a share test on a busy machine loses at most this
 * much of its device time to the machine, not to the limiter. 0 where the kernel does not say. */
static double starved_ns(void) {
    FILE *f = fopen("/proc/thread-self/schedstat", "r");
    unsigned long long running = 0, waiting = 0;
    if (!f) return 0;
    if (fscanf(f, "%llu %llu", &running, &waiting) != 2) waiting = 0;
    fclose(f);
    return (double)waiting;
}

/* One way of launching a kernel of the fake's, ready to go. */
struct launcher {
    const char *entry;
    CUstream stream;
    CUfunction kernel;
    void *pfn;
    CUgraphExec graph;
    /* Copies and memsets: two device buffers, a host one, and the bytes each call moves. */
    CUdeviceptr dst, src;
    char host[64];
    size_t bytes;
    /* The exact exported name the path reaches (copies only). */
    char name[64];
};

/* One copy or memset family: the name cuGetProcAddress takes and its two exported variants. */
struct copy_family {
    const char *entry, *base, *plain, *per_thread;
    void *direct, *direct_pt;
};

static const struct copy_family COPIES[] = {
    {"dtod", "cuMemcpyDtoDAsync", "cuMemcpyDtoDAsync_v2", "cuMemcpyDtoDAsync_v2_ptsz", (void *)cuMemcpyDtoDAsync_v2,
     (void *)cuMemcpyDtoDAsync_v2_ptsz},
    {"dtod_sync", "cuMemcpyDtoD", "cuMemcpyDtoD_v2", "cuMemcpyDtoD_v2_ptds", (void *)cuMemcpyDtoD_v2,
     (void *)cuMemcpyDtoD_v2_ptds},
    {"copy", "cuMemcpyAsync", "cuMemcpyAsync", "cuMemcpyAsync_ptsz", (void *)cuMemcpyAsync, (void *)cuMemcpyAsync_ptsz},
    {"copy3d", "cuMemcpy3DAsync", "cuMemcpy3DAsync_v2", "cuMemcpy3DAsync_v2_ptsz", (void *)cuMemcpy3DAsync_v2,
     (void *)cuMemcpy3DAsync_v2_ptsz},
    {"memset", "cuMemsetD32Async", "cuMemsetD32Async", "cuMemsetD32Async_ptsz", (void *)cuMemsetD32Async,
     (void *)cuMemsetD32Async_ptsz},
    {"memset_sync", "cuMemsetD8", "cuMemsetD8_v2", "cuMemsetD8_v2_ptds", (void *)cuMemsetD8_v2,
     (void *)cuMemsetD8_v2_ptds},
    {"htod", "cuMemcpyHtoDAsync", "cuMemcpyHtoDAsync_v2", "cuMemcpyHtoDAsync_v2_ptsz", (void *)cuMemcpyHtoDAsync_v2,
     (void *)cuMemcpyHtoDAsync_v2_ptsz},
};

static const struct copy_family *copy_family(const char *entry) {
    for (size_t i = 0; i < sizeof COPIES / sizeof *COPIES; i++)
        if (strcmp(COPIES[i].entry, entry) == 0) return &COPIES[i];
    return NULL;
}

/* Bytes whose copy takes US microseconds of the fake's time (FAKEGPU_COPY_NS_PER_MIB, default 1000). */
static size_t copy_bytes(unsigned us) {
    const char *setting = getenv("FAKEGPU_COPY_NS_PER_MIB");
    double ns_per_mib = setting ? atof(setting) : 1000.0;
    return (size_t)(us * 1000.0 / ns_per_mib * (1 << 20));
}

static struct launcher prepare(const struct path *p, const char *entry, CUfunction kernel) {
    struct launcher l;
    memset(&l, 0, sizeof l);
    l.entry = entry;
    l.kernel = kernel;
    if (!p->per_thread) check(cuStreamCreate(&l.stream, 0), "cuStreamCreate");
    const struct copy_family *copy = copy_family(entry);
    if (copy) {
        l.pfn = resolve_named(p, copy->base, copy->plain, copy->per_thread, copy->direct, copy->direct_pt);
        snprintf(l.name, sizeof l.name, "%s", p->per_thread ? copy->per_thread : copy->plain);
        check(cuMemAlloc_v2(&l.dst, 1 << 20), "cuMemAlloc_v2");
        check(cuMemAlloc_v2(&l.src, 1 << 20), "cuMemAlloc_v2");
    } else if (strcmp(entry, "kernel") == 0) {
        l.pfn = resolve(p, "cuLaunchKernel", (void *)cuLaunchKernel, (void *)cuLaunchKernel_ptsz);
    } else if (strcmp(entry, "cooperative") == 0) {
        l.pfn = resolve(p, "cuLaunchCooperativeKernel", (void *)cuLaunchCooperativeKernel,
                        (void *)cuLaunchCooperativeKernel_ptsz);
    } else if (strcmp(entry, "ex") == 0) {
        l.pfn = resolve(p, "cuLaunchKernelEx", (void *)cuLaunchKernelEx, (void *)cuLaunchKernelEx_ptsz);
    } else if (strcmp(entry, "graph") == 0) {
        l.pfn = resolve(p, "cuGraphLaunch", (void *)cuGraphLaunch, (void *)cuGraphLaunch_ptsz);
        CUgraph graph;
        CUgraphNode node;
        check(cuGraphCreate(&graph, 0), "cuGraphCreate");
        CUDA_KERNEL_NODE_PARAMS_v2 params = {kernel, 4, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL, NULL};
        check(cuGraphAddKernelNode_v2(&node, graph, NULL, 0, &params), "cuGraphAddKernelNode_v2");
        check(cuGraphInstantiateWithFlags(&l.graph, graph, 0), "cuGraphInstantiateWithFlags");
    } else {
        fprintf(stderr, "unknown entry %s\n", entry);
        exit(2);
    }
    return l;
}

/* One copy or memset of l->bytes. */
static CUresult copy_with(const struct launcher *l) {
    const char *e = l->entry;
    if (strcmp(e, "dtod") == 0 || strcmp(e, "copy") == 0)
        return ((CopyAsync)l->pfn)(l->dst, l->src, l->bytes, l->stream);
    if (strcmp(e, "dtod_sync") == 0) return ((CopySync)l->pfn)(l->dst, l->src, l->bytes);
    if (strcmp(e, "htod") == 0) return ((HostCopyAsync)l->pfn)(l->dst, l->host, l->bytes, l->stream);
    if (strcmp(e, "memset") == 0) return ((Memset32Async)l->pfn)(l->dst, 0x5a5a5a5a, l->bytes / 4, l->stream);
    if (strcmp(e, "memset_sync") == 0) return ((Memset8Sync)l->pfn)(l->dst, 0x5a, l->bytes);
    /* copy3d: a block of bytes/1024 rows of 1 KiB, device to device. */
    CUDA_MEMCPY3D c;
    memset(&c, 0, sizeof c);
    c.srcMemoryType = c.dstMemoryType = CU_MEMORYTYPE_DEVICE;
    c.srcDevice = l->src;
    c.dstDevice = l->dst;
    c.srcPitch = c.dstPitch = 1024;
    c.WidthInBytes = 1024;
    c.Height = l->bytes / 1024;
    c.Depth = 1;
    return ((Copy3DAsync)l->pfn)(&c, l->stream);
}

/* One launch with the given grid, block, shared memory and arguments. */
static CUresult launch_with(const struct launcher *l, unsigned grid, unsigned block, unsigned shared,
                            void **params, void **extra) {
    const char *e = l->entry;
    if (copy_family(e)) return copy_with(l);
    if (strcmp(e, "kernel") == 0)
        return ((LaunchKernel)l->pfn)(l->kernel, grid, 2, 1, block, 1, 1, shared, l->stream, params, extra);
    if (strcmp(e, "cooperative") == 0)
        return ((LaunchCooperative)l->pfn)(l->kernel, grid, 2, 1, block, 1, 1, shared, l->stream, params);
    if (strcmp(e, "ex") == 0) {
        CUlaunchConfig config = {grid, 2, 1, block, 1, 1, shared, l->stream, NULL, 0};
        return ((LaunchEx)l->pfn)(&config, l->kernel, params, extra);
    }
    return ((GraphLaunch)l->pfn)(l->graph, l->stream);
}

static void hold_if_asked(void) {
    const char *hold = getenv("CLIENT_HOLD");
    if (!hold || strcmp(hold, "1") != 0) return;
    printf("done=1\n");
    fflush(stdout);
    char buf[64];
    while (read(0, buf, sizeof buf) > 0) {
    }
}

/* Launches US-microsecond kernels COUNT times or for MS milliseconds; with US2 > 0, one kernel whose
 * launches take US and US2 in turn (its duration is its argument). */
static int cmd_loop(const struct path *p, const char *entry, unsigned us, unsigned us2, long count, double ms) {
    CUfunction (*kernel_of)(unsigned long long) = (CUfunction(*)(unsigned long long))fake_hook("fakegpu_kernel");
    unsigned long long (*busy)(int) = (unsigned long long (*)(int))fake_hook("fakegpu_busy_ns");
    unsigned long long by_argument = ~0ull; /* the fake's "duration from the first argument" */
    struct launcher l = prepare(p, entry, kernel_of(us2 > 0 ? by_argument : us * 1000ull));
    l.bytes = copy_bytes(us);
    unsigned long long (*calls)(const char *) = (unsigned long long (*)(const char *))fake_hook("fakegpu_call_count");
    unsigned long long busy_before = busy(0), records_before = calls("cuEventRecord");
    CUresult first_failure = CUDA_SUCCESS;
    long launches = 0;
    double start = now_ns(), starved = starved_ns();
    while (count > 0 ? launches < count : now_ns() - start < ms * 1e6) {
        unsigned long long duration_ns = (launches % 2 && us2 > 0 ? us2 : us) * 1000ull;
        void *args[1] = {&duration_ns};
        CUresult status = launch_with(&l, 4, 32, 0, us2 > 0 ? args : NULL, NULL);
        if (status != CUDA_SUCCESS && first_failure == CUDA_SUCCESS) first_failure = status;
        launches++;
    }
    check(cuCtxSynchronize(), "cuCtxSynchronize");
    double elapsed = now_ns() - start;
    unsigned long long busy_ns = busy(0) - busy_before;
    printf("launches=%ld\nstatus=%d\nelapsed_ns=%.0f\nbusy_ns=%llu\nshare_permille=%.0f\nevent_records=%llu\n"
           "starved_ns=%.0f\n",
           launches, first_failure, elapsed, busy_ns, busy_ns * 1000.0 / elapsed, calls("cuEventRecord") - records_before,
           starved_ns() - starved);
    fflush(stdout);
    hold_if_asked();
    return 0;
}

/* Launches like `loop`, at most COUNT times within MS milliseconds, and prints when each launch
 * call returned (CLOCK_MONOTONIC): trace_start_ns= (the first), trace_us= (each one's offset from
 * it in microseconds, comma-separated), then as loop does. */
static int cmd_trace(const struct path *p, const char *entry, unsigned us, long count, double ms) {
    enum { MAX = 8192 };
    static double at[MAX];
    CUfunction (*kernel_of)(unsigned long long) = (CUfunction(*)(unsigned long long))fake_hook("fakegpu_kernel");
    struct launcher l = prepare(p, entry, kernel_of(us * 1000ull));
    l.bytes = copy_bytes(us);
    CUresult first_failure = CUDA_SUCCESS;
    long launches = 0;
    double start = now_ns();
    while (launches < count && launches < MAX && now_ns() - start < ms * 1e6) {
        CUresult status = launch_with(&l, 4, 32, 0, NULL, NULL);
        if (status != CUDA_SUCCESS && first_failure == CUDA_SUCCESS) first_failure = status;
        at[launches++] = now_ns();
    }
    check(cuCtxSynchronize(), "cuCtxSynchronize");
    printf("launches=%ld\nstatus=%d\ntrace_start_ns=%.0f\ntrace_us=", launches, first_failure, launches ? at[0] : 0.0);
    for (long k = 0; k < launches; k++) printf("%s%.0f", k ? "," : "", (at[k] - at[0]) / 1e3);
    printf("\n");
    fflush(stdout);
    return 0;
}

static int cmd_unchanged(const struct path *p) {
    CUfunction (*kernel_of)(unsigned long long) = (CUfunction(*)(unsigned long long))fake_hook("fakegpu_kernel");
    int (*last)(struct fake_launch *) = (int (*)(struct fake_launch *))fake_hook("fakegpu_last_launch");
    const char *entries[] = {"kernel", "cooperative", "ex", "graph"};
    for (size_t i = 0; i < sizeof entries / sizeof *entries; i++) {
        CUfunction kernel = kernel_of(1000 + i);
        struct launcher l = prepare(p, entries[i], kernel);
        void *arg_storage[2] = {&l, &kernel};
        void **params = strcmp(entries[i], "graph") == 0 ? NULL : arg_storage;
        void **extra = strcmp(entries[i], "kernel") == 0 || strcmp(entries[i], "ex") == 0 ? arg_storage + 1 : NULL;
        unsigned grid = 7 + i, block = 64 + i, shared = 128 + i;
        CUresult status = launch_with(&l, grid, block, shared, params, extra);
        struct fake_launch seen;
        memset(&seen, 0, sizeof seen);
        int same;
        if (last(&seen) != 0) {
            same = 0;
        } else if (strcmp(entries[i], "graph") == 0) {
            same = seen.stream == l.stream; /* a graph launch carries only the stream */
        } else {
            same = seen.function == kernel && seen.grid[0] == grid && seen.grid[1] == 2 && seen.grid[2] == 1 &&
                   seen.block[0] == block && seen.shared_mem == shared && seen.stream == l.stream &&
                   seen.params == params && seen.extra == extra;
        }
        Dl_info info;
        const char *library = dladdr(l.pfn, &info) && info.dli_fname ? basename((char *)info.dli_fname) : "?";
        printf("%s_status=%d\n%s_same=%d\n%s_library=%s\n", entries[i], status, entries[i], same, entries[i],
               library);
    }
    check(cuCtxSynchronize(), "cuCtxSynchronize");
    return 0;
}

/* N rounds of a US-microsecond kernel and a US-microsecond device-to-device copy. */
static int cmd_mixed(const struct path *p, unsigned us, long count) {
    CUfunction (*kernel_of)(unsigned long long) = (CUfunction(*)(unsigned long long))fake_hook("fakegpu_kernel");
    unsigned long long (*busy)(int) = (unsigned long long (*)(int))fake_hook("fakegpu_busy_ns");
    struct launcher kernel = prepare(p, "kernel", kernel_of(us * 1000ull));
    struct launcher copy = prepare(p, "dtod", NULL);
    copy.bytes = copy_bytes(us);
    copy.stream = kernel.stream;
    unsigned long long busy_before = busy(0);
    CUresult first_failure = CUDA_SUCCESS;
    double start = now_ns(), starved = starved_ns();
    for (long i = 0; i < count; i++) {
        CUresult a = launch_with(&kernel, 4, 32, 0, NULL, NULL), b = copy_with(&copy);
        if (first_failure == CUDA_SUCCESS) first_failure = a != CUDA_SUCCESS ? a : b;
    }
    check(cuCtxSynchronize(), "cuCtxSynchronize");
    double elapsed = now_ns() - start;
    unsigned long long busy_ns = busy(0) - busy_before;
    printf("launches=%ld\nstatus=%d\nelapsed_ns=%.0f\nbusy_ns=%llu\nshare_permille=%.0f\nstarved_ns=%.0f\n", 2 * count,
           first_failure, elapsed, busy_ns, busy_ns * 1000.0 / elapsed, starved_ns() - starved);
    return 0;
}

static int cmd_copies_unchanged(const struct path *p) {
    int (*last)(char *, size_t, unsigned long long *, unsigned long long *, void **) =
        (int (*)(char *, size_t, unsigned long long *, unsigned long long *, void **))fake_hook("fakegpu_last_copy");
    for (size_t i = 0; i < sizeof COPIES / sizeof *COPIES; i++) {
        struct launcher l = prepare(p, COPIES[i].entry, NULL);
        l.bytes = 4096 + 1024 * i;
        CUresult status = copy_with(&l);
        char name[64] = {0};
        unsigned long long bytes = 0, dst = 0;
        void *stream = NULL;
        int sync = strstr(l.entry, "_sync") != NULL;
        int same = last(name, sizeof name, &bytes, &dst, &stream) == 0 && strcmp(name, l.name) == 0 &&
                   bytes == l.bytes && dst == l.dst && stream == (sync ? NULL : (void *)l.stream);
        if (!same)
            fprintf(stderr, "%s: the fake saw %s, %llu bytes to %#llx on %p\n", l.entry, name, bytes, dst, stream);
        Dl_info info;
        const char *library = dladdr(l.pfn, &info) && info.dli_fname ? basename((char *)info.dli_fname) : "?";
        printf("%s_status=%d\n%s_same=%d\n%s_library=%s\n", l.entry, status, l.entry, same, l.entry, library);
    }
    check(cuCtxSynchronize(), "cuCtxSynchronize");
    return 0;
}

/* One thread of `pair`: ordinal `ordinal`'s loop. */
struct pair_run {
    const struct path *p;
    const char *entry;
    unsigned us;
    long count;
    int ordinal;
    CUcontext contexts[2];
    long launches;
    CUresult status;
    double elapsed, starved;
    unsigned long long busy;
};

/* The fake's physical index of an ordinal: the last byte of its default UUID. */
static int physical_of(int ordinal) {
    CUresult (*uuid_of)(CUuuid *, CUdevice) = (CUresult (*)(CUuuid *, CUdevice))fake_hook("cuDeviceGetUuid");
    CUuuid uuid;
    check(uuid_of(&uuid, ordinal), "cuDeviceGetUuid");
    return (unsigned char)uuid.bytes[15];
}

static void *pair_thread(void *arg) {
    struct pair_run *r = arg;
    CUfunction (*kernel_of)(unsigned long long) = (CUfunction(*)(unsigned long long))fake_hook("fakegpu_kernel");
    unsigned long long (*busy)(int) = (unsigned long long (*)(int))fake_hook("fakegpu_busy_ns");
    int peer = strcmp(r->entry, "peer") == 0;
    check(cuCtxSetCurrent(r->contexts[r->ordinal]), "cuCtxSetCurrent");
    struct launcher l = prepare(r->p, peer ? "dtod" : r->entry, kernel_of(r->us * 1000ull));
    l.bytes = copy_bytes(r->us);
    CUresult (*peer_copy)(CUdeviceptr, CUcontext, CUdeviceptr, CUcontext, size_t, CUstream) = NULL;
    if (peer) {
        *(void **)&peer_copy = resolve_named(r->p, "cuMemcpyPeerAsync", "cuMemcpyPeerAsync", "cuMemcpyPeerAsync_ptsz",
                                             (void *)cuMemcpyPeerAsync, (void *)cuMemcpyPeerAsync_ptsz);
        /* The destination lives on the other ordinal. */
        check(cuCtxSetCurrent(r->contexts[1 - r->ordinal]), "cuCtxSetCurrent");
        check(cuMemAlloc_v2(&l.dst, 1 << 20), "cuMemAlloc_v2");
        check(cuCtxSetCurrent(r->contexts[r->ordinal]), "cuCtxSetCurrent");
    }
    int physical = physical_of(r->ordinal);
    unsigned long long busy_before = busy(physical);
    r->status = CUDA_SUCCESS;
    double start = now_ns(), starved = starved_ns();
    for (r->launches = 0; r->launches < r->count; r->launches++) {
        CUresult status = peer ? peer_copy(l.dst, r->contexts[1 - r->ordinal], l.src, r->contexts[r->ordinal], l.bytes,
                                           l.stream)
                               : launch_with(&l, 4, 32, 0, NULL, NULL);
        if (status != CUDA_SUCCESS && r->status == CUDA_SUCCESS) r->status = status;
    }
    check(cuCtxSynchronize(), "cuCtxSynchronize");
    r->elapsed = now_ns() - start;
    r->starved = starved_ns() - starved;
    r->busy = busy(physical) - busy_before;
    return NULL;
}

static int cmd_pair(const struct path *p, const char *entry, unsigned us, long count) {
    struct pair_run runs[2];
    pthread_t threads[2];
    for (int d = 0; d < 2; d++) {
        memset(&runs[d], 0, sizeof runs[d]);
        runs[d] = (struct pair_run){.p = p, .entry = entry, .us = us, .count = count, .ordinal = d};
    }
    for (int d = 0; d < 2; d++) {
        CUdevice device;
        check(cuDeviceGet(&device, d), "cuDeviceGet");
        check(cuDevicePrimaryCtxRetain(&runs[0].contexts[d], device), "cuDevicePrimaryCtxRetain");
        runs[1].contexts[d] = runs[0].contexts[d];
    }
    for (int d = 0; d < 2; d++)
        if (pthread_create(&threads[d], NULL, pair_thread, &runs[d]) != 0) return 3;
    for (int d = 0; d < 2; d++) pthread_join(threads[d], NULL);
    for (int d = 0; d < 2; d++) {
        const struct pair_run *r = &runs[d];
        printf("dev%d_launches=%ld\ndev%d_status=%d\ndev%d_elapsed_ns=%.0f\ndev%d_busy_ns=%llu\ndev%d_share_permille=%.0f\n"
               "dev%d_starved_ns=%.0f\n",
               d, r->launches, d, r->status, d, r->elapsed, d, r->busy, d, r->busy * 1000.0 / r->elapsed, d, r->starved);
    }
    fflush(stdout);
    hold_if_asked();
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: compute_client PATH COMMAND [ARG...]\n");
        return 2;
    }
    struct path p = parse_path(argv[1]);
    CUdevice device;
    CUcontext context;
    check(cuInit(0), "cuInit");
    check(cuDeviceGet(&device, 0), "cuDeviceGet");
    const char *affinity_sms = getenv("CLIENT_AFFINITY_SMS");
    if (affinity_sms) {
        /* CUexecAffinityParam: CU_EXEC_AFFINITY_TYPE_SM_COUNT (0), then the count. */
        struct { int type; unsigned count; } affinity = {0, (unsigned)strtoul(affinity_sms, NULL, 10)};
        check(cuCtxCreate_v3(&context, &affinity, 1, 0, device), "cuCtxCreate_v3");
    } else {
        check(cuDevicePrimaryCtxRetain(&context, device), "cuDevicePrimaryCtxRetain");
        check(cuCtxSetCurrent(context), "cuCtxSetCurrent");
    }
    const char *command = argv[2];
    if (strcmp(command, "loop") == 0 && argc == 6)
        return cmd_loop(&p, argv[3], (unsigned)atoi(argv[4]), 0, atol(argv[5]), 0);
    if (strcmp(command, "timed") == 0 && argc == 6)
        return cmd_loop(&p, argv[3], (unsigned)atoi(argv[4]), 0, 0, atof(argv[5]));
    if (strcmp(command, "varying") == 0 && argc == 7)
        return cmd_loop(&p, argv[3], (unsigned)atoi(argv[4]), (unsigned)atoi(argv[5]), 0, atof(argv[6]));
    if (strcmp(command, "trace") == 0 && argc == 7)
        return cmd_trace(&p, argv[3], (unsigned)atoi(argv[4]), atol(argv[5]), atof(argv[6]));
    if (strcmp(command, "unchanged") == 0) return cmd_unchanged(&p);
    if (strcmp(command, "mixed") == 0 && argc == 5) return cmd_mixed(&p, (unsigned)atoi(argv[3]), atol(argv[4]));
    if (strcmp(command, "copies_unchanged") == 0) return cmd_copies_unchanged(&p);
    if (strcmp(command, "pair") == 0 && argc == 6) return cmd_pair(&p, argv[3], (unsigned)atoi(argv[4]), atol(argv[5]));
    fprintf(stderr, "unknown command %s\n", command);
    return 2;
}
