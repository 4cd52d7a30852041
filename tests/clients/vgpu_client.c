/* A CUDA client for libvgpu's tests, demo and benchmark.
 *
 *   vgpu_client PATH COMMAND [ARG]
 *
 * PATH is how the driver's functions are reached, one of the three ways DESIGN §2 names:
 *   direct        linked against libcuda and called by name (preloaded symbols interpose)
 *   dlsym         dlopen("libcuda.so.1") + dlsym for every entry point
 *   procaddr      cudart 12+ style: dlsym "cuGetProcAddress_v2", then everything through it at 12000
 *   procaddr_v1   cudart 11 style: dlsym "cuGetProcAddress", then everything through it at 11040
 * COMMAND:
 *   fill MiB      allocate MiB-sized chunks until refused, free them all, fill again
 *   nvml          print NVML's memory view of every device
 *   symbols       print which function cuGetProcAddress hands out for old and new ABIs
 *   bench N       time N cuMemAlloc_v2+cuMemFree_v2 pairs and N cuMemGetInfo_v2 calls
 *   driver_stats  print the fake driver's own counters for device 0 (driver_used, driver_peak,
 *                 driver_alloc_calls); with FAKEGPU_SHARED they cover every process naming the file
 *   hold MiB [MAX] allocate MiB-sized chunks until refused or MAX MiB are held, print held_bytes,
 *                 hold_status (the last status) and ready=1, then block until stdin reaches EOF,
 *                 free everything and print released=1 (tests close stdin or SIGKILL it)
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
 * Output is one key=value per line. CLIENT_DEVICE picks the CUDA ordinal (default 0). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
    } else if (strcmp(path, "dlsym") == 0) {
        void *h = libcuda();
        *(void **)&api.init = dlsym(h, "cuInit");
        *(void **)&api.device_get = dlsym(h, "cuDeviceGet");
        *(void **)&api.primary_ctx_retain = dlsym(h, "cuDevicePrimaryCtxRetain");
        *(void **)&api.ctx_set_current = dlsym(h, "cuCtxSetCurrent");
        *(void **)&api.mem_alloc = dlsym(h, "cuMemAlloc_v2");
        *(void **)&api.mem_free = dlsym(h, "cuMemFree_v2");
        *(void **)&api.mem_get_info = dlsym(h, "cuMemGetInfo_v2");
        *(void **)&api.device_total_mem = dlsym(h, "cuDeviceTotalMem_v2");
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
    for (size_t i = 0; i < n; i++) check(api->mem_free(held[i]), "cuMemFree_v2");
    check(api->mem_get_info(&free_bytes, &total_bytes), "cuMemGetInfo_v2");
    printf("freed_free=%zu\n", free_bytes);
    n = fill(api, chunk, held, CAP, "second");
    for (size_t i = 0; i < n; i++) check(api->mem_free(held[i]), "cuMemFree_v2");
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

static _Noreturn void cmd_churn(const struct api *api, size_t chunk_mib) {
    enum { LIVE = 4 };
    CUdeviceptr live[LIVE];
    int n = 0;
    unsigned long long rng = seed(0);
    open_device(api);
    printf("ready=1\n");
    fflush(stdout);
    for (;;) {
        unsigned long long r = xorshift(&rng);
        if (n == 0 || (n < LIVE && (r & 1))) {
            size_t size = (size_t)(1 + (r >> 1) % chunk_mib) << 20;
            CUresult status = api->mem_alloc(&live[n], size);
            if (status == CUDA_SUCCESS)
                n++;
            else if (status != CUDA_ERROR_OUT_OF_MEMORY)
                check(status, "cuMemAlloc_v2");
        } else {
            int i = (int)((r >> 1) % (unsigned long long)n);
            check(api->mem_free(live[i]), "cuMemFree_v2");
            live[i] = live[--n];
        }
    }
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

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 3) {
        fprintf(stderr,
                "usage: %s direct|dlsym|procaddr|procaddr_v1 fill MiB|nvml|symbols|bench N|driver_stats|"
                "hold MiB [MAX]|churn MiB|fork MiB|stress S T MiB\n",
                argv[0]);
        return 2;
    }
    const char *path = argv[1], *command = argv[2];
    if (strcmp(command, "nvml") == 0) return cmd_nvml();
    if (strcmp(command, "symbols") == 0) return cmd_symbols();
    if (strcmp(command, "driver_stats") == 0) return cmd_driver_stats();
    struct api api = load(path);
    if (strcmp(command, "fill") == 0 && argc > 3) return cmd_fill(&api, (size_t)atol(argv[3]) << 20);
    if (strcmp(command, "bench") == 0 && argc > 3) return cmd_bench(&api, atol(argv[3]));
    if (strcmp(command, "hold") == 0 && argc > 3)
        return cmd_hold(&api, (size_t)atol(argv[3]) << 20, argc > 4 ? (size_t)atol(argv[4]) << 20 : SIZE_MAX);
    if (strcmp(command, "churn") == 0 && argc > 3 && atol(argv[3]) > 0) cmd_churn(&api, (size_t)atol(argv[3]));
    if (strcmp(command, "fork") == 0 && argc > 3) return cmd_fork(&api, (size_t)atol(argv[3]) << 20);
    if (strcmp(command, "stress") == 0 && argc > 5)
        return cmd_stress(&api, atof(argv[3]), (unsigned)atoi(argv[4]), (size_t)atol(argv[5]));
    fprintf(stderr, "unknown command %s\n", command);
    return 2;
}
