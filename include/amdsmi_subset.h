/* The few AMD SMI (libamd_smi) declarations libvgpu_hip's fake AMD SMI library and HIP client use,
 * written from AMD's amdsmi.h and its documentation (ROCm 6.x); no AMD SMI package is needed.
 * The enums are ints here, as C lays them out. */
#ifndef VGPU_AMDSMI_SUBSET_H
#define VGPU_AMDSMI_SUBSET_H

#include <stdint.h>

typedef int amdsmi_status_t;
#define AMDSMI_STATUS_SUCCESS 0
#define AMDSMI_STATUS_INVAL 1
#define AMDSMI_STATUS_NOT_SUPPORTED 2
#define AMDSMI_STATUS_NOT_INIT 32

#define AMDSMI_INIT_AMD_GPUS (1 << 1)

typedef void *amdsmi_socket_handle;
typedef void *amdsmi_processor_handle;

typedef int amdsmi_memory_type_t;
#define AMDSMI_MEM_TYPE_VRAM 0
#define AMDSMI_MEM_TYPE_VIS_VRAM 1
#define AMDSMI_MEM_TYPE_GTT 2

/* The smallest buffer amdsmi_get_gpu_device_uuid accepts. */
#define AMDSMI_GPU_UUID_SIZE 38

/* VRAM in MB (bytes / 2^20). */
typedef struct {
    uint32_t vram_total;
    uint32_t vram_used;
    uint32_t reserved[2];
} amdsmi_vram_usage_t;

amdsmi_status_t amdsmi_init(uint64_t init_flags);
amdsmi_status_t amdsmi_shut_down(void);
amdsmi_status_t amdsmi_get_socket_handles(uint32_t *socket_count, amdsmi_socket_handle *socket_handles);
amdsmi_status_t amdsmi_get_processor_handles(amdsmi_socket_handle socket_handle, uint32_t *processor_count,
                                             amdsmi_processor_handle *processor_handles);
amdsmi_status_t amdsmi_get_gpu_device_uuid(amdsmi_processor_handle processor_handle, unsigned int *uuid_length,
                                           char *uuid);
amdsmi_status_t amdsmi_get_gpu_memory_total(amdsmi_processor_handle processor_handle, amdsmi_memory_type_t mem_type,
                                            uint64_t *total);
amdsmi_status_t amdsmi_get_gpu_memory_usage(amdsmi_processor_handle processor_handle, amdsmi_memory_type_t mem_type,
                                            uint64_t *used);
amdsmi_status_t amdsmi_get_gpu_vram_usage(amdsmi_processor_handle processor_handle, amdsmi_vram_usage_t *info);

#endif
