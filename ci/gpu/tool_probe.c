/* How a profiler's driver shim reaches a program (issue 38): which library answers dlopen of the
 * driver, what the driver's cuGetProcAddress hands out against the driver's exported symbols,
 * and where each pointer lives. Run natively and under a tool (ncu, compute-sanitizer, nsys).
 *   cc -O1 ci/gpu/tool_probe.c -o tool_probe -ldl && ncu -c 1 ./tool_probe */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

typedef int (*get_proc_v2)(const char *, void **, int, uint64_t, int *);
typedef int (*mem_alloc)(uint64_t *, size_t);
typedef int (*mem_get_info)(size_t *, size_t *);
typedef int (*init_fn)(unsigned);
typedef int (*ctx_retain)(void **, int);
typedef int (*ctx_set)(void *);

static const char *where(const void *p) {
    Dl_info info;
    if (p && dladdr(p, &info) && info.dli_fname) return info.dli_fname;
    return "?";
}

static void show(const char *what, const void *p) { printf("%s=%p in %s\n", what, p, where(p)); }

int main(void) {
    printf("LD_PRELOAD=%s\n", getenv("LD_PRELOAD") ? getenv("LD_PRELOAD") : "");
    printf("CUDA_INJECTION64_PATH=%s\n", getenv("CUDA_INJECTION64_PATH") ? getenv("CUDA_INJECTION64_PATH") : "");
    show("dlopen_symbol", dlsym(RTLD_DEFAULT, "dlopen"));
    show("dlsym_symbol", dlsym(RTLD_DEFAULT, "dlsym"));
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW);
    struct link_map *map = NULL;
    if (cuda && dlinfo(cuda, RTLD_DI_LINKMAP, &map) == 0 && map) printf("dlopen_handle_names=%s\n", map->l_name);
    get_proc_v2 gpa = (get_proc_v2)dlsym(cuda, "cuGetProcAddress_v2");
    show("dlsym_cuGetProcAddress_v2", (void *)gpa);
    show("dlsym_cuMemAlloc_v2", dlsym(cuda, "cuMemAlloc_v2"));
    show("default_cuMemAlloc_v2", dlsym(RTLD_DEFAULT, "cuMemAlloc_v2"));
    init_fn init = (init_fn)dlsym(cuda, "cuInit");
    printf("cuInit=%d\n", init ? init(0) : -1);
    const char *names[] = {"cuMemAlloc", "cuMemGetInfo", "cuGetProcAddress", "cuLaunchKernel", "cuDevicePrimaryCtxRetain"};
    for (int i = 0; i < 5; i++) {
        void *p = NULL;
        int status = -1;
        int r = gpa ? gpa(names[i], &p, 13000, 0, &status) : -1;
        char label[96];
        snprintf(label, sizeof label, "proc_%s(r=%d,s=%d)", names[i], r, status);
        show(label, p);
    }
    void *alloc_p = NULL, *info_p = NULL, *retain_p = NULL, *set_p = NULL;
    int s;
    gpa("cuMemAlloc", &alloc_p, 13000, 0, &s);
    gpa("cuMemGetInfo", &info_p, 13000, 0, &s);
    gpa("cuDevicePrimaryCtxRetain", &retain_p, 13000, 0, &s);
    gpa("cuCtxSetCurrent", &set_p, 13000, 0, &s);
    void *ctx = NULL;
    printf("retain=%d\n", ((ctx_retain)retain_p)(&ctx, 0));
    printf("set=%d\n", ((ctx_set)set_p)(ctx));
    size_t free_b = 0, total_b = 0;
    printf("info=%d free_mib=%zu total_mib=%zu\n", ((mem_get_info)info_p)(&free_b, &total_b), free_b >> 20, total_b >> 20);
    int n = 0;
    uint64_t d;
    while (n < 400 && ((mem_alloc)alloc_p)(&d, 256u << 20) == 0) n++;
    printf("chunks_256mib=%d\n", n);
    return 0;
}
