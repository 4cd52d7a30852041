/* A fake AMD SMI library (libamd_smi.so) for libvgpu_hip's tests: the part of it amd-smi's memory
 * view uses, written from AMD's amdsmi.h documentation (include/amdsmi_subset.h). No Debian package
 * has libamd_smi. Built by the tests as a shared library, not a client.
 *
 * Like the real library, it builds ROCm SMI in: it exports the rsmi_* functions it answers from
 * and, compiled -fPIC with semantic interposition and linked without -Bsymbolic, reaches them
 * through its PLT, where a preloaded library's definitions come first.
 *
 *   FAKEAMDSMI_IDS       comma-separated 64-bit unique ids in hex (what the kernel's unique_id file
 *                        holds), one GPU each (at most 16); default 0123456789abcdef,fedcba9876543210
 *   FAKEAMDSMI_VIA_RSMI  1: amdsmi_get_gpu_memory_total/_usage answer through the built-in
 *                        rsmi_dev_memory_total_get/_usage, as AMD SMI's sources do; otherwise
 *                        directly, as a library whose ROCm SMI is bound inside it would
 *
 * Every GPU has 32 GiB of VRAM, 3 GiB of it in use (by whoever else shares the machine), and PCI
 * device id 0x740f; one socket holds them all. amdsmi_get_gpu_device_uuid writes the UUID AMD
 * SMI's sources build from the unique id (amdsmi_uuid_gen): XXffDDDD-0000-1000-80YY-ZZZZZZZZZZZZ,
 * XX the id's top byte, YY the next, ZZ... its low 48 bits, DDDD the device id; it leaves
 * *uuid_length as it was, as the Linux implementation does. Statuses: AMDSMI_STATUS_NOT_INIT
 * before amdsmi_init; AMDSMI_STATUS_INVAL for NULL pointers, a short UUID buffer or a handle that
 * is not one of ours; AMDSMI_STATUS_NOT_SUPPORTED for GTT. The rsmi_* functions return
 * RSMI_STATUS_INIT_ERROR (8) before amdsmi_init (the ROCm SMI inside is initialised by it),
 * RSMI_STATUS_INPUT_OUT_OF_BOUNDS (7) past the last GPU, RSMI_STATUS_INVALID_ARGS (1) for NULL. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "amdsmi_subset.h"

#define MAX_GPUS 16
#define GIB (1024ull * 1024ull * 1024ull)
#define VRAM (32 * GIB)
#define VRAM_USED (3 * GIB)
#define DEVICE_ID 0x740f

#define RSMI_STATUS_SUCCESS 0
#define RSMI_STATUS_INVALID_ARGS 1
#define RSMI_STATUS_NOT_SUPPORTED 2
#define RSMI_STATUS_INPUT_OUT_OF_BOUNDS 7
#define RSMI_STATUS_INIT_ERROR 8

static struct gpu {
    uint64_t unique_id;
} gpus[MAX_GPUS];
static uint32_t gpu_count;
static int socket_token;
static int initialised;
static int via_rsmi;

amdsmi_status_t amdsmi_init(uint64_t init_flags) {
    (void)init_flags;
    const char *ids = getenv("FAKEAMDSMI_IDS");
    if (!ids) ids = "0123456789abcdef,fedcba9876543210";
    gpu_count = 0;
    for (const char *at = ids; *at && gpu_count < MAX_GPUS;) {
        char *end;
        gpus[gpu_count++].unique_id = strtoull(at, &end, 16);
        at = *end == ',' ? end + 1 : end + strlen(end);
    }
    const char *via = getenv("FAKEAMDSMI_VIA_RSMI");
    via_rsmi = via && strcmp(via, "1") == 0;
    initialised = 1;
    return AMDSMI_STATUS_SUCCESS;
}

amdsmi_status_t amdsmi_shut_down(void) {
    initialised = 0;
    return AMDSMI_STATUS_SUCCESS;
}

/* Writes up to *count of the n handles, then the number there are. */
static amdsmi_status_t list(uint32_t *count, void **handles, uint32_t n, void *(*handle)(uint32_t)) {
    if (!initialised) return AMDSMI_STATUS_NOT_INIT;
    if (!count) return AMDSMI_STATUS_INVAL;
    if (handles)
        for (uint32_t i = 0; i < n && i < *count; i++) handles[i] = handle(i);
    *count = n;
    return AMDSMI_STATUS_SUCCESS;
}

static void *socket_handle(uint32_t i) {
    (void)i;
    return &socket_token;
}

static void *gpu_handle(uint32_t i) {
    return &gpus[i];
}

amdsmi_status_t amdsmi_get_socket_handles(uint32_t *socket_count, amdsmi_socket_handle *socket_handles) {
    return list(socket_count, socket_handles, 1, socket_handle);
}

amdsmi_status_t amdsmi_get_processor_handles(amdsmi_socket_handle socket_handle, uint32_t *processor_count,
                                             amdsmi_processor_handle *processor_handles) {
    if (initialised && socket_handle != &socket_token) return AMDSMI_STATUS_INVAL;
    return list(processor_count, processor_handles, gpu_count, gpu_handle);
}

/* The GPU behind a processor handle, or -1. */
static int gpu_of(amdsmi_processor_handle handle) {
    for (uint32_t i = 0; i < gpu_count; i++)
        if (handle == &gpus[i]) return (int)i;
    return -1;
}

amdsmi_status_t amdsmi_get_gpu_device_uuid(amdsmi_processor_handle processor_handle, unsigned int *uuid_length,
                                           char *uuid) {
    if (!initialised) return AMDSMI_STATUS_NOT_INIT;
    int gpu = gpu_of(processor_handle);
    if (!uuid_length || !uuid || *uuid_length < AMDSMI_GPU_UUID_SIZE || gpu < 0) return AMDSMI_STATUS_INVAL;
    uint64_t id = gpus[gpu].unique_id;
    snprintf(uuid, AMDSMI_GPU_UUID_SIZE, "%02xff%04x-0000-1000-80%02x-%04x%08x", (unsigned)(id >> 56),
             (unsigned)DEVICE_ID, (unsigned)(id >> 48) & 0xff, (unsigned)(id >> 32) & 0xffff,
             (unsigned)(id & 0xffffffff));
    return AMDSMI_STATUS_SUCCESS;
}

/* The built-in ROCm SMI: GPU i of AMD SMI is its device i. */
int rsmi_dev_unique_id_get(uint32_t dv_ind, uint64_t *id) {
    if (!initialised) return RSMI_STATUS_INIT_ERROR;
    if (dv_ind >= gpu_count) return RSMI_STATUS_INPUT_OUT_OF_BOUNDS;
    if (!id) return RSMI_STATUS_INVALID_ARGS;
    *id = gpus[dv_ind].unique_id;
    return RSMI_STATUS_SUCCESS;
}

static int rsmi_memory(uint32_t dv_ind, int mem_type, uint64_t *out, uint64_t value) {
    if (!initialised) return RSMI_STATUS_INIT_ERROR;
    if (dv_ind >= gpu_count) return RSMI_STATUS_INPUT_OUT_OF_BOUNDS;
    if (!out) return RSMI_STATUS_INVALID_ARGS;
    if (mem_type != AMDSMI_MEM_TYPE_VRAM && mem_type != AMDSMI_MEM_TYPE_VIS_VRAM) return RSMI_STATUS_NOT_SUPPORTED;
    *out = value;
    return RSMI_STATUS_SUCCESS;
}

int rsmi_dev_memory_total_get(uint32_t dv_ind, int mem_type, uint64_t *total) {
    return rsmi_memory(dv_ind, mem_type, total, VRAM);
}

int rsmi_dev_memory_usage_get(uint32_t dv_ind, int mem_type, uint64_t *used) {
    return rsmi_memory(dv_ind, mem_type, used, VRAM_USED);
}

/* rsmi_status_t to amdsmi_status_t, for the statuses the built-in ROCm SMI gives. */
static amdsmi_status_t from_rsmi(int status) {
    switch (status) {
    case RSMI_STATUS_SUCCESS: return AMDSMI_STATUS_SUCCESS;
    case RSMI_STATUS_NOT_SUPPORTED: return AMDSMI_STATUS_NOT_SUPPORTED;
    case RSMI_STATUS_INIT_ERROR: return AMDSMI_STATUS_NOT_INIT;
    default: return AMDSMI_STATUS_INVAL;
    }
}

/* One memory query on a processor handle: through the built-in ROCm SMI's export, or directly. */
static amdsmi_status_t memory(amdsmi_processor_handle processor_handle, amdsmi_memory_type_t mem_type,
                              uint64_t *out, int (*rsmi)(uint32_t, int, uint64_t *), uint64_t value) {
    if (!initialised) return AMDSMI_STATUS_NOT_INIT;
    int gpu = gpu_of(processor_handle);
    if (gpu < 0) return AMDSMI_STATUS_INVAL;
    if (via_rsmi) return from_rsmi(rsmi((uint32_t)gpu, mem_type, out));
    return from_rsmi(rsmi_memory((uint32_t)gpu, mem_type, out, value));
}

amdsmi_status_t amdsmi_get_gpu_memory_total(amdsmi_processor_handle processor_handle, amdsmi_memory_type_t mem_type,
                                            uint64_t *total) {
    return memory(processor_handle, mem_type, total, rsmi_dev_memory_total_get, VRAM);
}

amdsmi_status_t amdsmi_get_gpu_memory_usage(amdsmi_processor_handle processor_handle, amdsmi_memory_type_t mem_type,
                                            uint64_t *used) {
    return memory(processor_handle, mem_type, used, rsmi_dev_memory_usage_get, VRAM_USED);
}

/* Read from the kernel's counters in the real library, never through ROCm SMI. */
amdsmi_status_t amdsmi_get_gpu_vram_usage(amdsmi_processor_handle processor_handle, amdsmi_vram_usage_t *info) {
    if (!initialised) return AMDSMI_STATUS_NOT_INIT;
    if (!info || gpu_of(processor_handle) < 0) return AMDSMI_STATUS_INVAL;
    memset(info, 0, sizeof *info);
    info->vram_total = (uint32_t)(VRAM >> 20);
    info->vram_used = (uint32_t)(VRAM_USED >> 20);
    return AMDSMI_STATUS_SUCCESS;
}
