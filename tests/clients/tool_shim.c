/* A stand-in for a profiler's driver shim (Nsight Compute's libcuda-injection.so, as seen on an
 * H100: docs/developer-tools.md), preloaded beside libvgpu. Like it, this library
 *   - exports dlopen, and answers dlopen("libcuda.so.1") with a handle to itself;
 *   - exports driver entry points (those the test client uses, and cuGetProcAddress), which it
 *     resolves itself in the real driver on first use ("Init cuX") and forwards to;
 *   - hands out, from its cuGetProcAddress, whatever the driver's cuGetProcAddress answers.
 * It counts the calls that went through its own entry points (TOOL_SHIM_REPORT=1 prints them at
 * exit), so a test sees the tool kept its view of the program.
 * With TOOL_SHIM_VERSIONED=1 it resolves glibc's dlsym as many interposers do, by version
 * (dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34"), then the architecture's first version), and makes
 * every lookup of its own (dlopen, the driver's entry points) through what that finds. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_subset.h"

typedef void *(*dlopen_fn)(const char *, int);
typedef void *(*dlsym_fn)(void *, const char *);

static void *real_driver;
static atomic_ulong forwarded;

/* The dlsym this shim looks things up with: the one it binds to, or the one found by version. */
static dlsym_fn lookup(void) {
    static dlsym_fn found;
    if (found) return found;
    const char *versioned = getenv("TOOL_SHIM_VERSIONED");
    if (versioned && strcmp(versioned, "1") == 0) {
        *(void **)&found = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
#if defined(__aarch64__)
        if (!found) *(void **)&found = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.17");
#else
        if (!found) *(void **)&found = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
#endif
    }
    if (!found) found = dlsym;
    return found;
}

static dlopen_fn next_dlopen(void) {
    static dlopen_fn next;
    if (!next) *(void **)&next = lookup()(RTLD_NEXT, "dlopen");
    return next;
}

static int names_the_driver(const char *file) {
    if (!file) return 0;
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    return strcmp(base, "libcuda.so.1") == 0 || strcmp(base, "libcuda.so") == 0;
}

/* This library's own handle. */
static void *self(void) {
    Dl_info info;
    if (!dladdr((void *)self, &info)) return NULL;
    return next_dlopen()(info.dli_fname, RTLD_NOW | RTLD_NOLOAD);
}

void *dlopen(const char *file, int mode) {
    if (!names_the_driver(file)) return next_dlopen()(file, mode);
    if (!real_driver) real_driver = next_dlopen()(file, mode);
    return real_driver ? self() : NULL;
}

/* The real driver's entry point `name`, looked up as such a tool does: with dlsym on the driver. */
static void *driver(const char *name) {
    if (!real_driver) real_driver = next_dlopen()("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    return real_driver ? lookup()(real_driver, name) : NULL;
}

#define FORWARD(ret, name, params, args)                                      \
    ret name params {                                                         \
        static ret(*real) params;                                             \
        if (!real) *(void **)&real = driver(#name);                           \
        atomic_fetch_add(&forwarded, 1);                                      \
        return real ? real args : CUDA_ERROR_NOT_FOUND;                       \
    }

FORWARD(CUresult, cuInit, (unsigned flags), (flags))
FORWARD(CUresult, cuDeviceGet, (CUdevice * device, int ordinal), (device, ordinal))
FORWARD(CUresult, cuDevicePrimaryCtxRetain, (CUcontext * ctx, CUdevice dev), (ctx, dev))
FORWARD(CUresult, cuCtxSetCurrent, (CUcontext ctx), (ctx))
FORWARD(CUresult, cuMemAlloc_v2, (CUdeviceptr * dptr, size_t bytes), (dptr, bytes))
FORWARD(CUresult, cuMemFree_v2, (CUdeviceptr dptr), (dptr))
FORWARD(CUresult, cuMemGetInfo_v2, (size_t * free, size_t *total), (free, total))
FORWARD(CUresult, cuDeviceTotalMem_v2, (size_t * bytes, CUdevice dev), (bytes, dev))
FORWARD(CUresult, cuGetProcAddress, (const char *symbol, void **pfn, int version, unsigned long long flags),
        (symbol, pfn, version, flags))
FORWARD(CUresult, cuGetProcAddress_v2,
        (const char *symbol, void **pfn, int version, unsigned long long flags, int *status),
        (symbol, pfn, version, flags, status))

static void report(void) {
    if (getenv("TOOL_SHIM_REPORT")) printf("tool_forwarded=%lu\n", atomic_load(&forwarded));
}

__attribute__((constructor)) static void start(void) { atexit(report); }
