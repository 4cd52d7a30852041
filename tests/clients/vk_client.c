/* A Vulkan client for libvgpu's Vulkan layer tests (tests/vulkan_layer.rs).
 *
 *   vk_client COMMAND [ARG...] [COMMAND [ARG...]]...
 *
 * Runs its arguments as a sequence of commands in one process; the instance, the logical device
 * and everything allocated carry over from one command to the next. Output is one key=value per
 * line, flushed as it is printed. Any unexpected failure prints error=WHAT and exits 1.
 *   info          instance (API 1.1) and physical device 0, or the first whose name contains
 *                 $VK_CLIENT_DEVICE: heap_count, heap<i>_size and heap<i>_device_local (0/1) from
 *                 vkGetPhysicalDeviceMemoryProperties; heap<i>_size2 from
 *                 vkGetPhysicalDeviceMemoryProperties2; memory_budget_ext (0/1) and, where the
 *                 device has VK_EXT_memory_budget, budget<i> and usage<i>; device_local_type (the
 *                 memory type alloc uses); uuid (deviceUUID, 32 hex digits); layer_listed (0/1:
 *                 VK_LAYER_LIBVGPU_budget in vkEnumerateInstanceLayerProperties)
 *   alloc MiB N   create the logical device (once; later commands reuse it) and allocate N blocks of
 *                 MiB each from the first memory type whose heap is DEVICE_LOCAL, stopping at the
 *                 first failure: vk_alloc_ok (successes in this command), vk_alloc_result (the
 *                 failure's VkResult, or 0), vk_held (bytes held in all)
 *   free          vkFreeMemory everything held: vk_held=0
 *   destroy       vkDestroyDevice without freeing what it holds first: destroyed=1 (0 if there was
 *                 no device), vk_held=0; a later command creates a new device
 *   cuda-alloc MiB N  through dlopen("libcuda.so.1") + dlsym: cuInit, device 0's primary context
 *                 made current (once), then N cuMemAlloc_v2 of MiB each, stopping at the first
 *                 failure: cuda_alloc_ok, cuda_alloc_result (its CUresult, or 0), cuda_held
 *   cuda-info     cuMemGetInfo_v2: cuda_free, cuda_total
 *   cuda-free     cuMemFree_v2 everything cuda-alloc holds: cuda_held=0
 *   hold          holding=1, then block until stdin reaches EOF (tests close it or SIGKILL)
 *   devices       every physical device the instance enumerates: vk_device_count, and for each i
 *                 vk_device<i>_uuid (deviceUUID, 32 hex digits) and vk_device<i>_heap<h>_size of
 *                 every DEVICE_LOCAL heap h (vkGetPhysicalDeviceMemoryProperties)
 *   select UUID   work on the physical device whose deviceUUID is UUID (32 hex digits; dashes and a
 *                 GPU- prefix are ignored, any case) from here on: what is held is freed and the
 *                 logical device destroyed first (a later command creates one on the new device);
 *                 selected=UUID (32 hex digits), or error=no_device_with_uuid. For several GPUs of
 *                 one name, where $VK_CLIENT_DEVICE cannot tell them apart
 *   invalid       calls with invalid or odd arguments whose results a layer must not change:
 *                 invalid_type_result (memoryTypeIndex = memoryTypeCount + 5), zero_size_result and
 *                 zero_size_null_handle (allocationSize 0), null_free=1 (vkFreeMemory of
 *                 VK_NULL_HANDLE returned), unknown_pnext_result (an unknown structure 0x7fff0001,
 *                 header only, in pNext), import_type0_result and import_type0_null_handle (a
 *                 VkImportMemoryFdInfoKHR with handleType 0, fd -1, in pNext: ignored, per the spec),
 *                 unknown_out_untouched (0/1: an unknown output structure 0x7fff0002 in the pNext of
 *                 vkGetPhysicalDeviceMemoryProperties2, ahead of the budget structure where the
 *                 device has VK_EXT_memory_budget, came back as it went in), unknown_out_same_answer
 *                 (0/1: heaps, types and budget as without it), unknown_proc_null (0/1:
 *                 vkGetDeviceProcAddr of a name no device has is NULL); whatever succeeds is freed
 *                 again
 *   symbols       create the logical device (with VK_KHR_synchronization2 enabled where
 *                 VK_CLIENT_SYNC2=1, as for every command that creates it) and print, for vkAllocateMemory, vkFreeMemory,
 *                 vkQueueSubmit, vkQueueSubmit2 and vkQueueSubmit2KHR, fn_<name>=the file name
 *                 (dladdr's dli_fname without its directory) of the library vkGetDeviceProcAddr's
 *                 pointer lies in, or none where it is NULL
 *   work fill|shader|empty SECONDS SIZE  a GPU work loop on one queue: one command buffer, recorded
 *                 once, either vkCmdFillBuffer over a SIZE MiB buffer or a dispatch of WORK_GROUPS groups
 *                 of 64 invocations, each spinning an FMA loop of SIZE thousand iterations, or (empty)
 *                 no command buffer at all, batches with nothing but the fence; submitted,
 *                 its fence waited on and reset, again until SECONDS of wall time have passed (at
 *                 least once): submits, wall_ns, busy_ns (sum of vkQueueSubmit return -> fence wait
 *                 return), ns_per_submit_min (the shortest of those), submit_call_ns (the time
 *                 spent inside the submission calls, pacing waits included); work_submit2 (0/1) says
 *                 whether it submitted with vkQueueSubmit2KHR instead (VK_CLIENT_SYNC2=1).
 *                 VK_CLIENT_IN_FLIGHT=N (1-8): N submissions (own command buffers, a fence on the
 *                 last only), then a wait; busy_ns and ns_per_submit_min only for N=1;
 *                 VK_CLIENT_WAIT=idle: no fence at all, vkQueueWaitIdle instead. Where the
 *                 queue has timestamps (not for empty), gpu_ns: the GPU time of the work by
 *                 timestamps written before and after it in each command buffer (overlaps counted
 *                 once), and stamps_ordered (0/1: every end stamp at or after its begin).
 *                 submits_untouched (0/1): the submission arrays (VkSubmitInfo, VkSubmitInfo2KHR,
 *                 VkCommandBufferSubmitInfoKHR, command buffers) read the same after every group as
 *                 before the first; for fill where the buffer's memory is host-visible, the buffer is
 *                 zeroed first and fill_result_ok (0/1) says the fill's value is there at the end
 * At exit everything still held is freed and the device and instance destroyed. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>
#include <vulkan/vulkan.h>

#include "cuda_subset.h"

#define LAYER_NAME "VK_LAYER_LIBVGPU_budget"
#define WORK_GROUPS 16
#define WORK_GROUP_SIZE 64
/* How long one submission may take before the client gives up on it. */
#define FENCE_TIMEOUT_NS (120ull * 1000 * 1000 * 1000)

/* The `work shader` kernel, compiled for Vulkan 1.0 (SPIR-V 1.0). Source:
 *
 *   #version 450
 *   layout(local_size_x = 64) in;
 *   layout(push_constant) uniform Params { uint iterations; } params;
 *   layout(std430, set = 0, binding = 0) buffer Out { float values[]; } result;
 *   void main() {
 *       uint i = gl_GlobalInvocationID.x;
 *       float a = float(i) * 0.000001;
 *       for (uint k = 0u; k < params.iterations; ++k)
 *           a = fma(a, 0.999999, 0.000001);
 *       result.values[i] = a;
 *   }
 *
 * Regenerate (Debian: glslang-tools) with the source above in spin.comp:
 *   glslangValidator -V --target-env vulkan1.0 -x -o spin.inc spin.comp
 * and paste spin.inc's numbers here (glslang 12.0.0 made these). */
static const uint32_t spin_spv[] = {
    0x07230203, 0x00010000, 0x0008000b, 0x00000039, 0x00000000, 0x00020011, 0x00000001, 0x0006000b,
    0x00000001, 0x4c534c47, 0x6474732e, 0x3035342e, 0x00000000, 0x0003000e, 0x00000000, 0x00000001,
    0x0006000f, 0x00000005, 0x00000004, 0x6e69616d, 0x00000000, 0x0000000b, 0x00060010, 0x00000004,
    0x00000011, 0x00000040, 0x00000001, 0x00000001, 0x00030003, 0x00000002, 0x000001c2, 0x00040005,
    0x00000004, 0x6e69616d, 0x00000000, 0x00030005, 0x00000008, 0x00000069, 0x00080005, 0x0000000b,
    0x475f6c67, 0x61626f6c, 0x766e496c, 0x7461636f, 0x496e6f69, 0x00000044, 0x00030005, 0x00000012,
    0x00000061, 0x00030005, 0x00000017, 0x0000006b, 0x00040005, 0x0000001e, 0x61726150, 0x0000736d,
    0x00060006, 0x0000001e, 0x00000000, 0x72657469, 0x6f697461, 0x0000736e, 0x00040005, 0x00000020,
    0x61726170, 0x0000736d, 0x00030005, 0x0000002f, 0x0074754f, 0x00050006, 0x0000002f, 0x00000000,
    0x756c6176, 0x00007365, 0x00040005, 0x00000031, 0x75736572, 0x0000746c, 0x00040047, 0x0000000b,
    0x0000000b, 0x0000001c, 0x00050048, 0x0000001e, 0x00000000, 0x00000023, 0x00000000, 0x00030047,
    0x0000001e, 0x00000002, 0x00040047, 0x0000002e, 0x00000006, 0x00000004, 0x00050048, 0x0000002f,
    0x00000000, 0x00000023, 0x00000000, 0x00030047, 0x0000002f, 0x00000003, 0x00040047, 0x00000031,
    0x00000022, 0x00000000, 0x00040047, 0x00000031, 0x00000021, 0x00000000, 0x00040047, 0x00000038,
    0x0000000b, 0x00000019, 0x00020013, 0x00000002, 0x00030021, 0x00000003, 0x00000002, 0x00040015,
    0x00000006, 0x00000020, 0x00000000, 0x00040020, 0x00000007, 0x00000007, 0x00000006, 0x00040017,
    0x00000009, 0x00000006, 0x00000003, 0x00040020, 0x0000000a, 0x00000001, 0x00000009, 0x0004003b,
    0x0000000a, 0x0000000b, 0x00000001, 0x0004002b, 0x00000006, 0x0000000c, 0x00000000, 0x00040020,
    0x0000000d, 0x00000001, 0x00000006, 0x00030016, 0x00000010, 0x00000020, 0x00040020, 0x00000011,
    0x00000007, 0x00000010, 0x0004002b, 0x00000010, 0x00000015, 0x358637bd, 0x0003001e, 0x0000001e,
    0x00000006, 0x00040020, 0x0000001f, 0x00000009, 0x0000001e, 0x0004003b, 0x0000001f, 0x00000020,
    0x00000009, 0x00040015, 0x00000021, 0x00000020, 0x00000001, 0x0004002b, 0x00000021, 0x00000022,
    0x00000000, 0x00040020, 0x00000023, 0x00000009, 0x00000006, 0x00020014, 0x00000026, 0x0004002b,
    0x00000010, 0x00000029, 0x3f7fffef, 0x0004002b, 0x00000021, 0x0000002c, 0x00000001, 0x0003001d,
    0x0000002e, 0x00000010, 0x0003001e, 0x0000002f, 0x0000002e, 0x00040020, 0x00000030, 0x00000002,
    0x0000002f, 0x0004003b, 0x00000030, 0x00000031, 0x00000002, 0x00040020, 0x00000034, 0x00000002,
    0x00000010, 0x0004002b, 0x00000006, 0x00000036, 0x00000040, 0x0004002b, 0x00000006, 0x00000037,
    0x00000001, 0x0006002c, 0x00000009, 0x00000038, 0x00000036, 0x00000037, 0x00000037, 0x00050036,
    0x00000002, 0x00000004, 0x00000000, 0x00000003, 0x000200f8, 0x00000005, 0x0004003b, 0x00000007,
    0x00000008, 0x00000007, 0x0004003b, 0x00000011, 0x00000012, 0x00000007, 0x0004003b, 0x00000007,
    0x00000017, 0x00000007, 0x00050041, 0x0000000d, 0x0000000e, 0x0000000b, 0x0000000c, 0x0004003d,
    0x00000006, 0x0000000f, 0x0000000e, 0x0003003e, 0x00000008, 0x0000000f, 0x0004003d, 0x00000006,
    0x00000013, 0x00000008, 0x00040070, 0x00000010, 0x00000014, 0x00000013, 0x00050085, 0x00000010,
    0x00000016, 0x00000014, 0x00000015, 0x0003003e, 0x00000012, 0x00000016, 0x0003003e, 0x00000017,
    0x0000000c, 0x000200f9, 0x00000018, 0x000200f8, 0x00000018, 0x000400f6, 0x0000001a, 0x0000001b,
    0x00000000, 0x000200f9, 0x0000001c, 0x000200f8, 0x0000001c, 0x0004003d, 0x00000006, 0x0000001d,
    0x00000017, 0x00050041, 0x00000023, 0x00000024, 0x00000020, 0x00000022, 0x0004003d, 0x00000006,
    0x00000025, 0x00000024, 0x000500b0, 0x00000026, 0x00000027, 0x0000001d, 0x00000025, 0x000400fa,
    0x00000027, 0x00000019, 0x0000001a, 0x000200f8, 0x00000019, 0x0004003d, 0x00000010, 0x00000028,
    0x00000012, 0x0008000c, 0x00000010, 0x0000002a, 0x00000001, 0x00000032, 0x00000028, 0x00000029,
    0x00000015, 0x0003003e, 0x00000012, 0x0000002a, 0x000200f9, 0x0000001b, 0x000200f8, 0x0000001b,
    0x0004003d, 0x00000006, 0x0000002b, 0x00000017, 0x00050080, 0x00000006, 0x0000002d, 0x0000002b,
    0x0000002c, 0x0003003e, 0x00000017, 0x0000002d, 0x000200f9, 0x00000018, 0x000200f8, 0x0000001a,
    0x0004003d, 0x00000006, 0x00000032, 0x00000008, 0x0004003d, 0x00000010, 0x00000033, 0x00000012,
    0x00060041, 0x00000034, 0x00000035, 0x00000031, 0x00000022, 0x00000032, 0x0003003e, 0x00000035,
    0x00000033, 0x000100fd, 0x00010038,
};

static void print_u64(const char *key, unsigned long long value) {
    printf("%s=%llu\n", key, value);
    fflush(stdout);
}

static void print_i64(const char *key, long long value) {
    printf("%s=%lld\n", key, value);
    fflush(stdout);
}

static _Noreturn void fail(const char *what) {
    printf("error=%s\n", what);
    fflush(stdout);
    exit(1);
}

static _Noreturn void fail_status(const char *what, long long status) {
    printf("error=%s:%lld\n", what, status);
    fflush(stdout);
    exit(1);
}

static void check(VkResult result, const char *what) {
    if (result != VK_SUCCESS) fail_status(what, result);
}

static unsigned long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec;
}

static void *grow(void *array, size_t *capacity, size_t used, size_t element) {
    if (used < *capacity) return array;
    size_t next = *capacity ? *capacity * 2 : 64;
    void *bigger = realloc(array, next * element);
    if (!bigger) fail("out_of_host_memory");
    *capacity = next;
    return bigger;
}

static unsigned long long parse_number(const char *text, const char *what) {
    char *end;
    errno = 0;
    unsigned long long value = strtoull(text, &end, 10);
    if (errno || end == text || *end || text[0] == '-') fail_status(what, -1);
    return value;
}

/* ---- Vulkan state ---------------------------------------------------------------------------- */

static VkInstance instance;
static VkPhysicalDevice physical;
static VkPhysicalDeviceMemoryProperties memory;
static VkDevice device;
static VkQueue queue;
static uint32_t queue_family;

/* Whether the device was created with VK_KHR_synchronization2 (VK_CLIENT_SYNC2=1). */
static int sync2_enabled;

static VkDeviceMemory *held;
static size_t held_count, held_capacity;
static unsigned long long held_bytes;

static void open_instance(void) {
    if (instance) return;
    VkApplicationInfo app = {
        .sType = VK_STRUCTURE_TYPE_APPLICATION_INFO,
        .pApplicationName = "vk_client",
        .apiVersion = VK_API_VERSION_1_1,
    };
    VkInstanceCreateInfo info = {.sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO, .pApplicationInfo = &app};
    check(vkCreateInstance(&info, NULL, &instance), "vkCreateInstance");

    uint32_t count = 0;
    check(vkEnumeratePhysicalDevices(instance, &count, NULL), "vkEnumeratePhysicalDevices");
    if (count == 0) fail("no_physical_device");
    VkPhysicalDevice *devices = calloc(count, sizeof *devices);
    if (!devices) fail("out_of_host_memory");
    VkResult result = vkEnumeratePhysicalDevices(instance, &count, devices);
    if (result != VK_SUCCESS && result != VK_INCOMPLETE) fail_status("vkEnumeratePhysicalDevices", result);
    const char *wanted = getenv("VK_CLIENT_DEVICE");
    for (uint32_t i = 0; i < count && !physical; i++) {
        VkPhysicalDeviceProperties props;
        vkGetPhysicalDeviceProperties(devices[i], &props);
        if (!wanted || !*wanted || strstr(props.deviceName, wanted)) {
            if (props.apiVersion < VK_API_VERSION_1_1) fail("device_below_vulkan_1_1");
            physical = devices[i];
        }
    }
    free(devices);
    if (!physical) fail("no_device_matches_VK_CLIENT_DEVICE");
    vkGetPhysicalDeviceMemoryProperties(physical, &memory);
}

/* deviceUUID of `dev` as 32 lowercase hex digits into `out` (33 bytes). */
static void device_uuid_hex(VkPhysicalDevice dev, char *out) {
    VkPhysicalDeviceIDProperties id = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_ID_PROPERTIES};
    VkPhysicalDeviceProperties2 properties2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, .pNext = &id};
    vkGetPhysicalDeviceProperties2(dev, &properties2);
    for (unsigned i = 0; i < VK_UUID_SIZE; i++) snprintf(out + 2 * i, 3, "%02x", id.deviceUUID[i]);
}

/* Every physical device of the instance; the caller frees the array. */
static VkPhysicalDevice *physical_devices(uint32_t *count) {
    *count = 0;
    check(vkEnumeratePhysicalDevices(instance, count, NULL), "vkEnumeratePhysicalDevices");
    VkPhysicalDevice *devices = calloc(*count ? *count : 1, sizeof *devices);
    if (!devices) fail("out_of_host_memory");
    VkResult result = vkEnumeratePhysicalDevices(instance, count, devices);
    if (result != VK_SUCCESS && result != VK_INCOMPLETE) fail_status("vkEnumeratePhysicalDevices", result);
    return devices;
}

static int heap_is_device_local(uint32_t heap) {
    return (memory.memoryHeaps[heap].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) != 0;
}

/* The first memory type among `allowed` whose heap is DEVICE_LOCAL. */
static uint32_t device_local_type(uint32_t allowed) {
    for (uint32_t i = 0; i < memory.memoryTypeCount; i++)
        if ((allowed & (1u << i)) && heap_is_device_local(memory.memoryTypes[i].heapIndex)) return i;
    fail("no_device_local_memory_type");
}

static int has_device_extension(const char *name);

static void open_device(void) {
    open_instance();
    if (device) return;
    uint32_t count = 0;
    vkGetPhysicalDeviceQueueFamilyProperties(physical, &count, NULL);
    VkQueueFamilyProperties *families = calloc(count ? count : 1, sizeof *families);
    if (!families) fail("out_of_host_memory");
    vkGetPhysicalDeviceQueueFamilyProperties(physical, &count, families);
    uint32_t family = UINT32_MAX;
    for (uint32_t i = 0; i < count && family == UINT32_MAX; i++)
        if (families[i].queueFlags & VK_QUEUE_COMPUTE_BIT) family = i;
    free(families);
    if (family == UINT32_MAX) fail("no_compute_queue");
    float priority = 1.0f;
    VkDeviceQueueCreateInfo queue_info = {
        .sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO,
        .queueFamilyIndex = family,
        .queueCount = 1,
        .pQueuePriorities = &priority,
    };
    VkDeviceCreateInfo info = {
        .sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO,
        .queueCreateInfoCount = 1,
        .pQueueCreateInfos = &queue_info,
    };
    /* VK_CLIENT_SYNC2=1: the device also enables VK_KHR_synchronization2 (vkQueueSubmit2KHR). */
    const char *sync2_name = VK_KHR_SYNCHRONIZATION_2_EXTENSION_NAME;
    VkPhysicalDeviceSynchronization2FeaturesKHR sync2 = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SYNCHRONIZATION_2_FEATURES_KHR,
        .synchronization2 = VK_TRUE,
    };
    const char *want_sync2 = getenv("VK_CLIENT_SYNC2");
    if (want_sync2 && strcmp(want_sync2, "1") == 0) {
        if (!has_device_extension(sync2_name)) fail("no_synchronization2");
        info.pNext = &sync2;
        info.enabledExtensionCount = 1;
        info.ppEnabledExtensionNames = &sync2_name;
    }
    check(vkCreateDevice(physical, &info, NULL, &device), "vkCreateDevice");
    sync2_enabled = info.enabledExtensionCount == 1;
    queue_family = family;
    vkGetDeviceQueue(device, family, 0, &queue);
}

static int has_device_extension(const char *name) {
    uint32_t count = 0;
    check(vkEnumerateDeviceExtensionProperties(physical, NULL, &count, NULL), "vkEnumerateDeviceExtensionProperties");
    VkExtensionProperties *extensions = calloc(count ? count : 1, sizeof *extensions);
    if (!extensions) fail("out_of_host_memory");
    VkResult result = vkEnumerateDeviceExtensionProperties(physical, NULL, &count, extensions);
    if (result != VK_SUCCESS && result != VK_INCOMPLETE)
        fail_status("vkEnumerateDeviceExtensionProperties", result);
    int found = 0;
    for (uint32_t i = 0; i < count; i++)
        if (strcmp(extensions[i].extensionName, name) == 0) found = 1;
    free(extensions);
    return found;
}

static int layer_listed(void) {
    uint32_t count = 0;
    check(vkEnumerateInstanceLayerProperties(&count, NULL), "vkEnumerateInstanceLayerProperties");
    VkLayerProperties *layers = calloc(count ? count : 1, sizeof *layers);
    if (!layers) fail("out_of_host_memory");
    VkResult result = vkEnumerateInstanceLayerProperties(&count, layers);
    if (result != VK_SUCCESS && result != VK_INCOMPLETE) fail_status("vkEnumerateInstanceLayerProperties", result);
    int found = 0;
    for (uint32_t i = 0; i < count; i++)
        if (strcmp(layers[i].layerName, LAYER_NAME) == 0) found = 1;
    free(layers);
    return found;
}

static void cmd_info(void) {
    char key[64];
    open_instance();
    VkPhysicalDeviceMemoryProperties props;
    vkGetPhysicalDeviceMemoryProperties(physical, &props);
    print_u64("heap_count", props.memoryHeapCount);
    for (uint32_t i = 0; i < props.memoryHeapCount; i++) {
        snprintf(key, sizeof key, "heap%u_size", i);
        print_u64(key, props.memoryHeaps[i].size);
        snprintf(key, sizeof key, "heap%u_device_local", i);
        print_u64(key, (props.memoryHeaps[i].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) != 0);
    }

    int budget_ext = has_device_extension(VK_EXT_MEMORY_BUDGET_EXTENSION_NAME);
    print_u64("memory_budget_ext", budget_ext);
    VkPhysicalDeviceMemoryBudgetPropertiesEXT budget = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_BUDGET_PROPERTIES_EXT,
    };
    VkPhysicalDeviceMemoryProperties2 props2 = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_PROPERTIES_2,
        .pNext = budget_ext ? &budget : NULL,
    };
    vkGetPhysicalDeviceMemoryProperties2(physical, &props2);
    for (uint32_t i = 0; i < props2.memoryProperties.memoryHeapCount; i++) {
        snprintf(key, sizeof key, "heap%u_size2", i);
        print_u64(key, props2.memoryProperties.memoryHeaps[i].size);
        if (budget_ext) {
            snprintf(key, sizeof key, "budget%u", i);
            print_u64(key, budget.heapBudget[i]);
            snprintf(key, sizeof key, "usage%u", i);
            print_u64(key, budget.heapUsage[i]);
        }
    }
    print_u64("device_local_type", device_local_type(UINT32_MAX));

    VkPhysicalDeviceIDProperties id = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_ID_PROPERTIES};
    VkPhysicalDeviceProperties2 properties2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, .pNext = &id};
    vkGetPhysicalDeviceProperties2(physical, &properties2);
    printf("device_name=%s\nuuid=", properties2.properties.deviceName);
    for (unsigned i = 0; i < VK_UUID_SIZE; i++) printf("%02x", id.deviceUUID[i]);
    printf("\n");
    fflush(stdout);
    print_u64("layer_listed", layer_listed());
}

static void cmd_alloc(unsigned long long mib, unsigned long long count) {
    open_device();
    uint32_t type = device_local_type(UINT32_MAX);
    unsigned long long ok = 0;
    VkResult failure = VK_SUCCESS;
    for (unsigned long long i = 0; i < count; i++) {
        VkMemoryAllocateInfo info = {
            .sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO,
            .allocationSize = (VkDeviceSize)mib << 20,
            .memoryTypeIndex = type,
        };
        VkDeviceMemory block = VK_NULL_HANDLE;
        VkResult result = vkAllocateMemory(device, &info, NULL, &block);
        if (result != VK_SUCCESS) {
            failure = result;
            break;
        }
        held = grow(held, &held_capacity, held_count, sizeof *held);
        held[held_count++] = block;
        held_bytes += mib << 20;
        ok++;
    }
    print_u64("vk_alloc_ok", ok);
    print_i64("vk_alloc_result", failure);
    print_u64("vk_held", held_bytes);
}

/* Allocates and frees one block of `mib` MiB `count` times: the hot path of the layer's memory hooks. */
static void cmd_churn(unsigned long long mib, unsigned long long count) {
    open_device();
    uint32_t type = device_local_type(UINT32_MAX);
    VkMemoryAllocateInfo info = {
        .sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO,
        .allocationSize = (VkDeviceSize)mib << 20,
        .memoryTypeIndex = type,
    };
    unsigned long long start = now_ns();
    for (unsigned long long i = 0; i < count; i++) {
        VkDeviceMemory block = VK_NULL_HANDLE;
        VkResult result = vkAllocateMemory(device, &info, NULL, &block);
        if (result != VK_SUCCESS) fail_status("churn_alloc", result);
        vkFreeMemory(device, block, NULL);
    }
    print_u64("churn_ns", now_ns() - start);
}

static void free_held(void) {
    for (size_t i = 0; i < held_count; i++) vkFreeMemory(device, held[i], NULL);
    held_count = 0;
    held_bytes = 0;
}

static void cmd_free(void) {
    free_held();
    print_u64("vk_held", 0);
}

static void cmd_destroy(void) {
    int had = device != VK_NULL_HANDLE;
    if (had) {
        check(vkDeviceWaitIdle(device), "vkDeviceWaitIdle");
        vkDestroyDevice(device, NULL);
    }
    device = VK_NULL_HANDLE;
    queue = VK_NULL_HANDLE;
    held_count = 0;
    held_bytes = 0;
    print_u64("destroyed", had);
    print_u64("vk_held", 0);
}

static void cmd_devices(void) {
    char key[64], uuid[2 * VK_UUID_SIZE + 1];
    open_instance();
    uint32_t count;
    VkPhysicalDevice *devices = physical_devices(&count);
    print_u64("vk_device_count", count);
    for (uint32_t i = 0; i < count; i++) {
        device_uuid_hex(devices[i], uuid);
        printf("vk_device%u_uuid=%s\n", i, uuid);
        VkPhysicalDeviceMemoryProperties props;
        vkGetPhysicalDeviceMemoryProperties(devices[i], &props);
        for (uint32_t h = 0; h < props.memoryHeapCount; h++) {
            if (!(props.memoryHeaps[h].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT)) continue;
            snprintf(key, sizeof key, "vk_device%u_heap%u_size", i, h);
            print_u64(key, props.memoryHeaps[h].size);
        }
    }
    free(devices);
}

static void cmd_select(const char *wanted) {
    char want[2 * VK_UUID_SIZE + 1], uuid[2 * VK_UUID_SIZE + 1];
    size_t n = 0;
    if (strncasecmp(wanted, "GPU-", 4) == 0) wanted += 4;
    for (const char *c = wanted; *c; c++) {
        if (*c == '-') continue;
        if (n == 2 * VK_UUID_SIZE || !strchr("0123456789abcdefABCDEF", *c)) fail("select_uuid");
        want[n++] = (char)(*c | 0x20); /* lowercase: digits keep their code */
    }
    if (n != 2 * VK_UUID_SIZE) fail("select_uuid");
    want[n] = 0;
    open_instance();
    if (device) {
        check(vkDeviceWaitIdle(device), "vkDeviceWaitIdle");
        free_held();
        vkDestroyDevice(device, NULL);
        device = VK_NULL_HANDLE;
        queue = VK_NULL_HANDLE;
    }
    uint32_t count;
    VkPhysicalDevice *devices = physical_devices(&count), chosen = VK_NULL_HANDLE;
    for (uint32_t i = 0; i < count && !chosen; i++) {
        device_uuid_hex(devices[i], uuid);
        if (strcmp(uuid, want) == 0) chosen = devices[i];
    }
    free(devices);
    if (!chosen) fail("no_device_with_uuid");
    physical = chosen;
    vkGetPhysicalDeviceMemoryProperties(physical, &memory);
    printf("selected=%s\n", want);
    fflush(stdout);
}

static void cmd_invalid(void) {
    open_device();
    uint32_t type = device_local_type(UINT32_MAX);
    VkDeviceMemory block;
    VkResult result;

    VkMemoryAllocateInfo bad_type = {
        .sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO,
        .allocationSize = 1 << 20,
        .memoryTypeIndex = memory.memoryTypeCount + 5,
    };
    block = VK_NULL_HANDLE;
    result = vkAllocateMemory(device, &bad_type, NULL, &block);
    print_i64("invalid_type_result", result);
    if (result == VK_SUCCESS) vkFreeMemory(device, block, NULL);

    VkMemoryAllocateInfo zero = {
        .sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO,
        .allocationSize = 0,
        .memoryTypeIndex = type,
    };
    block = VK_NULL_HANDLE;
    result = vkAllocateMemory(device, &zero, NULL, &block);
    print_i64("zero_size_result", result);
    print_u64("zero_size_null_handle", block == VK_NULL_HANDLE);
    if (result == VK_SUCCESS) vkFreeMemory(device, block, NULL);

    vkFreeMemory(device, VK_NULL_HANDLE, NULL);
    print_u64("null_free", 1);

    VkBaseInStructure unknown = {.sType = (VkStructureType)0x7fff0001, .pNext = NULL};
    VkMemoryAllocateInfo odd_chain = {
        .sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO,
        .pNext = &unknown,
        .allocationSize = 1 << 20,
        .memoryTypeIndex = type,
    };
    block = VK_NULL_HANDLE;
    result = vkAllocateMemory(device, &odd_chain, NULL, &block);
    print_i64("unknown_pnext_result", result);
    if (result == VK_SUCCESS) vkFreeMemory(device, block, NULL);

    /* An fd import whose handleType is 0: the spec says the structure is then ignored. */
    VkImportMemoryFdInfoKHR no_import = {
        .sType = VK_STRUCTURE_TYPE_IMPORT_MEMORY_FD_INFO_KHR,
        .handleType = 0,
        .fd = -1,
    };
    VkMemoryAllocateInfo ignored_import = {
        .sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO,
        .pNext = &no_import,
        .allocationSize = 1 << 20,
        .memoryTypeIndex = type,
    };
    block = VK_NULL_HANDLE;
    result = vkAllocateMemory(device, &ignored_import, NULL, &block);
    print_i64("import_type0_result", result);
    print_u64("import_type0_null_handle", block == VK_NULL_HANDLE);
    if (result == VK_SUCCESS) vkFreeMemory(device, block, NULL);

    /* vkGetPhysicalDeviceMemoryProperties2 with an unknown output structure in pNext (ahead of the
     * budget structure, where the device has one): the unknown one comes back as it went in, and
     * the answer is the one given without it. */
    int budget_ext = has_device_extension(VK_EXT_MEMORY_BUDGET_EXTENSION_NAME);
    VkPhysicalDeviceMemoryBudgetPropertiesEXT plain_budget = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_BUDGET_PROPERTIES_EXT,
    };
    VkPhysicalDeviceMemoryProperties2 plain = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_PROPERTIES_2,
        .pNext = budget_ext ? &plain_budget : NULL,
    };
    vkGetPhysicalDeviceMemoryProperties2(physical, &plain);
    VkPhysicalDeviceMemoryBudgetPropertiesEXT chained_budget = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_BUDGET_PROPERTIES_EXT,
    };
    struct {
        VkBaseOutStructure header;
        unsigned char payload[64];
    } unknown_out = {.header = {.sType = (VkStructureType)0x7fff0002, .pNext = NULL}};
    memset(unknown_out.payload, 0xa5, sizeof unknown_out.payload);
    unknown_out.header.pNext = budget_ext ? (VkBaseOutStructure *)&chained_budget : NULL;
    VkPhysicalDeviceMemoryProperties2 odd = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_PROPERTIES_2,
        .pNext = &unknown_out,
    };
    vkGetPhysicalDeviceMemoryProperties2(physical, &odd);
    int untouched = unknown_out.header.sType == (VkStructureType)0x7fff0002 &&
                    unknown_out.header.pNext == (budget_ext ? (VkBaseOutStructure *)&chained_budget : NULL);
    for (size_t i = 0; i < sizeof unknown_out.payload; i++)
        if (unknown_out.payload[i] != 0xa5) untouched = 0;
    print_u64("unknown_out_untouched", untouched);
    int same = odd.memoryProperties.memoryHeapCount == plain.memoryProperties.memoryHeapCount &&
               odd.memoryProperties.memoryTypeCount == plain.memoryProperties.memoryTypeCount;
    for (uint32_t i = 0; same && i < plain.memoryProperties.memoryHeapCount; i++) {
        same = odd.memoryProperties.memoryHeaps[i].size == plain.memoryProperties.memoryHeaps[i].size &&
               odd.memoryProperties.memoryHeaps[i].flags == plain.memoryProperties.memoryHeaps[i].flags;
        if (budget_ext)
            same = same && chained_budget.heapBudget[i] == plain_budget.heapBudget[i] &&
                   chained_budget.heapUsage[i] == plain_budget.heapUsage[i];
    }
    print_u64("unknown_out_same_answer", same);

    /* A name no device has. */
    print_u64("unknown_proc_null", vkGetDeviceProcAddr(device, "vkNoSuchFunctionLIBVGPU") == NULL);
}

/* Where vkGetDeviceProcAddr's answer for `name` lives: fn_<name>=the basename of the library
 * holding it (dladdr), or none for NULL, or unknown when dladdr cannot say. */
static void print_symbol(const char *name) {
    PFN_vkVoidFunction function = vkGetDeviceProcAddr(device, name);
    const char *where = "none";
    Dl_info info;
    if (function) {
        where = "unknown";
        if (dladdr((void *)function, &info) && info.dli_fname) {
            const char *slash = strrchr(info.dli_fname, '/');
            where = slash ? slash + 1 : info.dli_fname;
        }
    }
    printf("fn_%s=%s\n", name, where);
    fflush(stdout);
}

static void cmd_symbols(void) {
    open_device();
    print_symbol("vkAllocateMemory");
    print_symbol("vkFreeMemory");
    print_symbol("vkQueueSubmit");
    print_symbol("vkQueueSubmit2");
    print_symbol("vkQueueSubmit2KHR");
}

/* ---- work ------------------------------------------------------------------------------------ */

/* A buffer of `size` bytes bound to fresh DEVICE_LOCAL memory of its own. */
static VkBuffer make_buffer(VkDeviceSize size, VkBufferUsageFlags usage, VkDeviceMemory *backing) {
    VkBufferCreateInfo info = {
        .sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO,
        .size = size,
        .usage = usage,
        .sharingMode = VK_SHARING_MODE_EXCLUSIVE,
    };
    VkBuffer buffer;
    check(vkCreateBuffer(device, &info, NULL, &buffer), "vkCreateBuffer");
    VkMemoryRequirements needs;
    vkGetBufferMemoryRequirements(device, buffer, &needs);
    VkMemoryAllocateInfo alloc = {
        .sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO,
        .allocationSize = needs.size,
        .memoryTypeIndex = device_local_type(needs.memoryTypeBits),
    };
    check(vkAllocateMemory(device, &alloc, NULL, backing), "vkAllocateMemory(work)");
    check(vkBindBufferMemory(device, buffer, *backing, 0), "vkBindBufferMemory");
    return buffer;
}

static void cmd_work(const char *kind, double seconds, unsigned long long size) {
    int shader = strcmp(kind, "shader") == 0, empty = strcmp(kind, "empty") == 0;
    if (!shader && !empty && strcmp(kind, "fill") != 0) fail("work_kind_not_fill_shader_or_empty");
    if (!shader && !empty && size == 0) fail("work_fill_size_0");
    if (shader && size > UINT32_MAX / 1000) fail("work_shader_size_too_large");
    open_device();

    VkDeviceMemory backing = VK_NULL_HANDLE;
    VkBuffer buffer = VK_NULL_HANDLE;
    if (shader)
        buffer = make_buffer(WORK_GROUPS * WORK_GROUP_SIZE * sizeof(float), VK_BUFFER_USAGE_STORAGE_BUFFER_BIT,
                             &backing);
    else if (!empty)
        buffer = make_buffer((VkDeviceSize)size << 20, VK_BUFFER_USAGE_TRANSFER_DST_BIT, &backing);
    /* Where the fill's memory is host-visible (lavapipe), it is zeroed first and checked after. */
    uint32_t *filled = NULL;
    VkMemoryPropertyFlags fill_flags = 0;
    if (!shader && !empty) {
        VkMemoryRequirements needs;
        vkGetBufferMemoryRequirements(device, buffer, &needs);
        fill_flags = memory.memoryTypes[device_local_type(needs.memoryTypeBits)].propertyFlags;
        if (fill_flags & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT) {
            void *mapped;
            check(vkMapMemory(device, backing, 0, VK_WHOLE_SIZE, 0, &mapped), "vkMapMemory");
            filled = mapped;
            memset(filled, 0, (size_t)size << 20);
            if (!(fill_flags & VK_MEMORY_PROPERTY_HOST_COHERENT_BIT)) {
                VkMappedMemoryRange range = {
                    .sType = VK_STRUCTURE_TYPE_MAPPED_MEMORY_RANGE, .memory = backing, .size = VK_WHOLE_SIZE};
                check(vkFlushMappedMemoryRanges(device, 1, &range), "vkFlushMappedMemoryRanges");
            }
        }
    }

    VkShaderModule module = VK_NULL_HANDLE;
    VkDescriptorSetLayout set_layout = VK_NULL_HANDLE;
    VkPipelineLayout pipeline_layout = VK_NULL_HANDLE;
    VkPipeline pipeline = VK_NULL_HANDLE;
    VkDescriptorPool descriptor_pool = VK_NULL_HANDLE;
    VkDescriptorSet set = VK_NULL_HANDLE;
    if (shader) {
        VkShaderModuleCreateInfo module_info = {
            .sType = VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO,
            .codeSize = sizeof spin_spv,
            .pCode = spin_spv,
        };
        check(vkCreateShaderModule(device, &module_info, NULL, &module), "vkCreateShaderModule");
        VkDescriptorSetLayoutBinding binding = {
            .binding = 0,
            .descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
            .descriptorCount = 1,
            .stageFlags = VK_SHADER_STAGE_COMPUTE_BIT,
        };
        VkDescriptorSetLayoutCreateInfo set_info = {
            .sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO,
            .bindingCount = 1,
            .pBindings = &binding,
        };
        check(vkCreateDescriptorSetLayout(device, &set_info, NULL, &set_layout), "vkCreateDescriptorSetLayout");
        VkPushConstantRange range = {.stageFlags = VK_SHADER_STAGE_COMPUTE_BIT, .size = sizeof(uint32_t)};
        VkPipelineLayoutCreateInfo layout_info = {
            .sType = VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO,
            .setLayoutCount = 1,
            .pSetLayouts = &set_layout,
            .pushConstantRangeCount = 1,
            .pPushConstantRanges = &range,
        };
        check(vkCreatePipelineLayout(device, &layout_info, NULL, &pipeline_layout), "vkCreatePipelineLayout");
        VkComputePipelineCreateInfo pipeline_info = {
            .sType = VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO,
            .stage =
                {
                    .sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO,
                    .stage = VK_SHADER_STAGE_COMPUTE_BIT,
                    .module = module,
                    .pName = "main",
                },
            .layout = pipeline_layout,
        };
        check(vkCreateComputePipelines(device, VK_NULL_HANDLE, 1, &pipeline_info, NULL, &pipeline),
              "vkCreateComputePipelines");
        VkDescriptorPoolSize pool_size = {.type = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, .descriptorCount = 1};
        VkDescriptorPoolCreateInfo pool_info = {
            .sType = VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO,
            .maxSets = 1,
            .poolSizeCount = 1,
            .pPoolSizes = &pool_size,
        };
        check(vkCreateDescriptorPool(device, &pool_info, NULL, &descriptor_pool), "vkCreateDescriptorPool");
        VkDescriptorSetAllocateInfo set_alloc = {
            .sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO,
            .descriptorPool = descriptor_pool,
            .descriptorSetCount = 1,
            .pSetLayouts = &set_layout,
        };
        check(vkAllocateDescriptorSets(device, &set_alloc, &set), "vkAllocateDescriptorSets");
        VkDescriptorBufferInfo buffer_info = {.buffer = buffer, .offset = 0, .range = VK_WHOLE_SIZE};
        VkWriteDescriptorSet write = {
            .sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET,
            .dstSet = set,
            .dstBinding = 0,
            .descriptorCount = 1,
            .descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
            .pBufferInfo = &buffer_info,
        };
        vkUpdateDescriptorSets(device, 1, &write, 0, NULL);
    }

    VkCommandPoolCreateInfo pool_info = {
        .sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO,
        .queueFamilyIndex = queue_family,
    };
    VkCommandPool command_pool;
    check(vkCreateCommandPool(device, &pool_info, NULL, &command_pool), "vkCreateCommandPool");
    /* VK_CLIENT_IN_FLIGHT=N (1 to 8): N submissions, then a wait for the last (the others carry no
     * fence), as a renderer or a wgpu loop submits; each has its own command buffer. */
    const char *in_flight_text = getenv("VK_CLIENT_IN_FLIGHT");
    uint32_t in_flight = in_flight_text ? (uint32_t)strtoul(in_flight_text, NULL, 10) : 1;
    if (in_flight < 1 || in_flight > 8) fail("VK_CLIENT_IN_FLIGHT_not_1_to_8");
    /* Each command buffer writes a timestamp before and after its work where the queue has them:
     * the work's own time on the GPU, whatever the host's wake-ups. */
    uint32_t family_count = 0;
    vkGetPhysicalDeviceQueueFamilyProperties(physical, &family_count, NULL);
    VkQueueFamilyProperties families[16];
    if (family_count > 16) family_count = 16;
    vkGetPhysicalDeviceQueueFamilyProperties(physical, &family_count, families);
    VkPhysicalDeviceProperties properties;
    vkGetPhysicalDeviceProperties(physical, &properties);
    int timed = !empty && queue_family < family_count && families[queue_family].timestampValidBits > 0;
    VkQueryPool timestamps = VK_NULL_HANDLE;
    if (timed) {
        VkQueryPoolCreateInfo query_info = {
            .sType = VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO,
            .queryType = VK_QUERY_TYPE_TIMESTAMP,
            .queryCount = 2 * in_flight,
        };
        check(vkCreateQueryPool(device, &query_info, NULL, &timestamps), "vkCreateQueryPool");
    }
    VkCommandBufferAllocateInfo cb_info = {
        .sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO,
        .commandPool = command_pool,
        .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY,
        .commandBufferCount = in_flight,
    };
    VkCommandBuffer cbs[8] = {0};
    if (!empty) check(vkAllocateCommandBuffers(device, &cb_info, cbs), "vkAllocateCommandBuffers");
    for (uint32_t i = 0; i < in_flight && !empty; i++) {
        VkCommandBuffer cb = cbs[i];
        VkCommandBufferBeginInfo begin = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
        check(vkBeginCommandBuffer(cb, &begin), "vkBeginCommandBuffer");
        if (timed) {
            vkCmdResetQueryPool(cb, timestamps, 2 * i, 2);
            vkCmdWriteTimestamp(cb, VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, timestamps, 2 * i);
        }
        if (shader) {
            uint32_t iterations = (uint32_t)(size * 1000);
            vkCmdBindPipeline(cb, VK_PIPELINE_BIND_POINT_COMPUTE, pipeline);
            vkCmdBindDescriptorSets(cb, VK_PIPELINE_BIND_POINT_COMPUTE, pipeline_layout, 0, 1, &set, 0, NULL);
            vkCmdPushConstants(cb, pipeline_layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, sizeof iterations, &iterations);
            vkCmdDispatch(cb, WORK_GROUPS, 1, 1);
        } else {
            vkCmdFillBuffer(cb, buffer, 0, VK_WHOLE_SIZE, 0x5a5a5a5a);
        }
        if (timed) vkCmdWriteTimestamp(cb, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, timestamps, 2 * i + 1);
        check(vkEndCommandBuffer(cb), "vkEndCommandBuffer");
    }

    VkFenceCreateInfo fence_info = {.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
    VkFence fence;
    check(vkCreateFence(device, &fence_info, NULL, &fence), "vkCreateFence");
    VkSubmitInfo submits_1[8];
    VkCommandBufferSubmitInfoKHR cb_submits[8];
    VkSubmitInfo2KHR submits_2[8];
    for (uint32_t i = 0; i < in_flight; i++) {
        submits_1[i] = (VkSubmitInfo){
            .sType = VK_STRUCTURE_TYPE_SUBMIT_INFO,
            .commandBufferCount = empty ? 0 : 1,
            .pCommandBuffers = empty ? NULL : &cbs[i],
        };
        cb_submits[i] = (VkCommandBufferSubmitInfoKHR){
            .sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_SUBMIT_INFO_KHR,
            .commandBuffer = cbs[i],
        };
        submits_2[i] = (VkSubmitInfo2KHR){
            .sType = VK_STRUCTURE_TYPE_SUBMIT_INFO_2_KHR,
            .commandBufferInfoCount = empty ? 0 : 1,
            .pCommandBufferInfos = empty ? NULL : &cb_submits[i],
        };
    }
    /* What the submissions pass, as it was before any: the layer must read these arrays only. */
    VkSubmitInfo saved_1[8];
    VkCommandBufferSubmitInfoKHR saved_cb_submits[8];
    VkSubmitInfo2KHR saved_2[8];
    VkCommandBuffer saved_cbs[8];
    memcpy(saved_1, submits_1, sizeof saved_1);
    memcpy(saved_cb_submits, cb_submits, sizeof saved_cb_submits);
    memcpy(saved_2, submits_2, sizeof saved_2);
    memcpy(saved_cbs, cbs, sizeof saved_cbs);
    int untouched = 1, stamps_ordered = 1;

    /* VK_CLIENT_GAP_US: idle time after each submission, to see how the GPU behaves when work is spaced
     * out the way a compute share spaces it. */
    const char *gap_text = getenv("VK_CLIENT_GAP_US");
    useconds_t gap_us = gap_text ? (useconds_t)strtoul(gap_text, NULL, 10) : 0;
    /* With VK_KHR_synchronization2 enabled (VK_CLIENT_SYNC2=1), vkQueueSubmit2KHR instead. */
    PFN_vkQueueSubmit2KHR submit2 = sync2_enabled
                                        ? (PFN_vkQueueSubmit2KHR)vkGetDeviceProcAddr(device, "vkQueueSubmit2KHR")
                                        : NULL;
    if (sync2_enabled && !submit2) fail("no_vkQueueSubmit2KHR");
    print_u64("work_submit2", submit2 != NULL);
    print_u64("in_flight", in_flight);
    /* VK_CLIENT_WAIT=idle: no fence at all, vkQueueWaitIdle after each group (as simple programs and
     * wgpu's timeline-semaphore path give the driver no fence). */
    const char *wait_text = getenv("VK_CLIENT_WAIT");
    int wait_idle = wait_text && strcmp(wait_text, "idle") == 0;
    print_u64("wait_idle", wait_idle);

    unsigned long long submits = 0, busy = 0, shortest = UINT64_MAX, in_submit = 0;
    double gpu_ns = 0;
    unsigned long long start = now_ns(), limit = (unsigned long long)(seconds * 1e9), end;
    do {
        unsigned long long calling = now_ns(), submitted = calling;
        for (uint32_t i = 0; i < in_flight; i++) {
            VkFence signal = i + 1 == in_flight && !wait_idle ? fence : VK_NULL_HANDLE;
            if (submit2)
                check(submit2(queue, 1, &submits_2[i], signal), "vkQueueSubmit2KHR");
            else
                check(vkQueueSubmit(queue, 1, &submits_1[i], signal), "vkQueueSubmit");
            if (i == 0) submitted = now_ns();
        }
        in_submit += now_ns() - calling;
        if (wait_idle) {
            check(vkQueueWaitIdle(queue), "vkQueueWaitIdle");
        } else {
            VkResult waited = vkWaitForFences(device, 1, &fence, VK_TRUE, FENCE_TIMEOUT_NS);
            if (waited == VK_TIMEOUT) fail("fence_timeout");
            check(waited, "vkWaitForFences");
            check(vkResetFences(device, 1, &fence), "vkResetFences");
        }
        unsigned long long signalled = now_ns();
        if (timed) {
            uint64_t stamps[16];
            check(vkGetQueryPoolResults(device, timestamps, 0, 2 * in_flight, sizeof stamps, stamps,
                                        sizeof(uint64_t), VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT),
                  "vkGetQueryPoolResults");
            for (uint32_t i = 0; i < in_flight; i++)
                if (stamps[2 * i + 1] < stamps[2 * i]) stamps_ordered = 0;
            /* The union of the work's intervals: a later buffer's start may be stamped while an
             * earlier one still runs. */
            uint64_t covered = 0;
            for (uint32_t i = 0; i < in_flight; i++) {
                uint64_t from = stamps[2 * i], to = stamps[2 * i + 1];
                if (i > 0 && from < stamps[2 * i - 1]) from = stamps[2 * i - 1];
                if (to > from) covered += to - from;
            }
            gpu_ns += (double)covered * properties.limits.timestampPeriod;
        }
        if (memcmp(saved_1, submits_1, sizeof saved_1) || memcmp(saved_cb_submits, cb_submits, sizeof saved_cb_submits) ||
            memcmp(saved_2, submits_2, sizeof saved_2) || memcmp(saved_cbs, cbs, sizeof saved_cbs))
            untouched = 0;
        if (gap_us) usleep(gap_us);
        submits += in_flight;
        if (in_flight == 1) {
            busy += signalled - submitted;
            if (signalled - submitted < shortest) shortest = signalled - submitted;
        }
        end = now_ns();
    } while (end - start < limit);
    print_u64("submits", submits);
    print_u64("wall_ns", end - start);
    if (in_flight == 1) {
        print_u64("busy_ns", busy);
        print_u64("ns_per_submit_min", shortest);
    }
    if (timed) {
        print_u64("gpu_ns", (unsigned long long)gpu_ns);
        print_u64("stamps_ordered", stamps_ordered);
    }
    print_u64("submit_call_ns", in_submit);
    print_u64("submits_untouched", untouched);
    if (filled) {
        if (!(fill_flags & VK_MEMORY_PROPERTY_HOST_COHERENT_BIT)) {
            VkMappedMemoryRange range = {
                .sType = VK_STRUCTURE_TYPE_MAPPED_MEMORY_RANGE, .memory = backing, .size = VK_WHOLE_SIZE};
            check(vkInvalidateMappedMemoryRanges(device, 1, &range), "vkInvalidateMappedMemoryRanges");
        }
        size_t words = ((size_t)size << 20) / sizeof *filled;
        print_u64("fill_result_ok", filled[0] == 0x5a5a5a5a && filled[words / 2] == 0x5a5a5a5a &&
                                        filled[words - 1] == 0x5a5a5a5a);
        vkUnmapMemory(device, backing);
    }

    if (timestamps != VK_NULL_HANDLE) vkDestroyQueryPool(device, timestamps, NULL);
    vkDestroyFence(device, fence, NULL);
    vkDestroyCommandPool(device, command_pool, NULL);
    if (shader) {
        vkDestroyDescriptorPool(device, descriptor_pool, NULL);
        vkDestroyPipeline(device, pipeline, NULL);
        vkDestroyPipelineLayout(device, pipeline_layout, NULL);
        vkDestroyDescriptorSetLayout(device, set_layout, NULL);
        vkDestroyShaderModule(device, module, NULL);
    }
    if (buffer != VK_NULL_HANDLE) vkDestroyBuffer(device, buffer, NULL);
    if (backing != VK_NULL_HANDLE) vkFreeMemory(device, backing, NULL);
}

/* ---- CUDA through dlopen ----------------------------------------------------------------------- */

static struct {
    CUresult (*init)(unsigned int);
    CUresult (*device_get)(CUdevice *, int);
    CUresult (*primary_ctx_retain)(CUcontext *, CUdevice);
    CUresult (*ctx_set_current)(CUcontext);
    CUresult (*mem_alloc)(CUdeviceptr *, size_t);
    CUresult (*mem_free)(CUdeviceptr);
    CUresult (*mem_get_info)(size_t *, size_t *);
} cuda;
static int cuda_open;
static CUdeviceptr *cuda_held;
static size_t cuda_held_count, cuda_held_capacity;
static unsigned long long cuda_held_bytes;

static void *resolve(void *library, const char *name) {
    void *symbol = dlsym(library, name);
    if (!symbol) {
        printf("error=unresolved:%s\n", name);
        fflush(stdout);
        exit(1);
    }
    return symbol;
}

static void cuda_check(CUresult status, const char *what) {
    if (status != CUDA_SUCCESS) fail_status(what, status);
}

static void open_cuda(void) {
    if (cuda_open) return;
    void *library = dlopen("libcuda.so.1", RTLD_NOW);
    if (!library) {
        fprintf(stderr, "dlopen libcuda.so.1: %s\n", dlerror());
        fail("dlopen_libcuda");
    }
    cuda.init = (CUresult(*)(unsigned int))resolve(library, "cuInit");
    cuda.device_get = (CUresult(*)(CUdevice *, int))resolve(library, "cuDeviceGet");
    cuda.primary_ctx_retain = (CUresult(*)(CUcontext *, CUdevice))resolve(library, "cuDevicePrimaryCtxRetain");
    cuda.ctx_set_current = (CUresult(*)(CUcontext))resolve(library, "cuCtxSetCurrent");
    cuda.mem_alloc = (CUresult(*)(CUdeviceptr *, size_t))resolve(library, "cuMemAlloc_v2");
    cuda.mem_free = (CUresult(*)(CUdeviceptr))resolve(library, "cuMemFree_v2");
    cuda.mem_get_info = (CUresult(*)(size_t *, size_t *))resolve(library, "cuMemGetInfo_v2");
    CUdevice dev;
    CUcontext ctx;
    cuda_check(cuda.init(0), "cuInit");
    cuda_check(cuda.device_get(&dev, 0), "cuDeviceGet");
    cuda_check(cuda.primary_ctx_retain(&ctx, dev), "cuDevicePrimaryCtxRetain");
    cuda_check(cuda.ctx_set_current(ctx), "cuCtxSetCurrent");
    cuda_open = 1;
}

static void cmd_cuda_alloc(unsigned long long mib, unsigned long long count) {
    open_cuda();
    unsigned long long ok = 0;
    CUresult failure = CUDA_SUCCESS;
    for (unsigned long long i = 0; i < count; i++) {
        CUdeviceptr ptr = 0;
        CUresult status = cuda.mem_alloc(&ptr, (size_t)mib << 20);
        if (status != CUDA_SUCCESS) {
            failure = status;
            break;
        }
        cuda_held = grow(cuda_held, &cuda_held_capacity, cuda_held_count, sizeof *cuda_held);
        cuda_held[cuda_held_count++] = ptr;
        cuda_held_bytes += mib << 20;
        ok++;
    }
    print_u64("cuda_alloc_ok", ok);
    print_i64("cuda_alloc_result", failure);
    print_u64("cuda_held", cuda_held_bytes);
}

static void cmd_cuda_info(void) {
    open_cuda();
    size_t free_bytes = 0, total = 0;
    cuda_check(cuda.mem_get_info(&free_bytes, &total), "cuMemGetInfo_v2");
    print_u64("cuda_free", free_bytes);
    print_u64("cuda_total", total);
}

static void cuda_free_held(void) {
    for (size_t i = 0; i < cuda_held_count; i++) cuda_check(cuda.mem_free(cuda_held[i]), "cuMemFree_v2");
    cuda_held_count = 0;
    cuda_held_bytes = 0;
}

static void cmd_cuda_free(void) {
    if (cuda_open) cuda_free_held();
    print_u64("cuda_held", 0);
}

static void cmd_hold(void) {
    print_u64("holding", 1);
    char buffer[256];
    for (;;) {
        ssize_t n = read(STDIN_FILENO, buffer, sizeof buffer);
        if (n == 0) break;
        if (n < 0 && errno != EINTR) break;
    }
}

/* ---- main ------------------------------------------------------------------------------------ */

static const char *arg(int argc, char **argv, int i) {
    if (i >= argc) {
        fprintf(stderr, "%s: %s needs more arguments\n", argv[0], argv[i - 1]);
        fail("usage");
    }
    return argv[i];
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 2) {
        fprintf(stderr,
                "usage: %s COMMAND... where COMMAND is info | alloc MiB N | free | destroy | "
                "churn MiB N | cuda-alloc MiB N | cuda-info | cuda-free | hold | devices | select UUID | invalid | symbols | "
                "work fill|shader|empty SECONDS SIZE\n",
                argv[0]);
        fail("usage");
    }
    for (int i = 1; i < argc; i++) {
        const char *command = argv[i];
        if (strcmp(command, "info") == 0) {
            cmd_info();
        } else if (strcmp(command, "alloc") == 0) {
            unsigned long long mib = parse_number(arg(argc, argv, i + 1), "alloc_mib");
            unsigned long long count = parse_number(arg(argc, argv, i + 2), "alloc_count");
            i += 2;
            cmd_alloc(mib, count);
        } else if (strcmp(command, "churn") == 0) {
            unsigned long long mib = parse_number(arg(argc, argv, i + 1), "churn_mib");
            unsigned long long count = parse_number(arg(argc, argv, i + 2), "churn_count");
            i += 2;
            cmd_churn(mib, count);
        } else if (strcmp(command, "free") == 0) {
            cmd_free();
        } else if (strcmp(command, "destroy") == 0) {
            cmd_destroy();
        } else if (strcmp(command, "cuda-alloc") == 0) {
            unsigned long long mib = parse_number(arg(argc, argv, i + 1), "cuda_alloc_mib");
            unsigned long long count = parse_number(arg(argc, argv, i + 2), "cuda_alloc_count");
            i += 2;
            cmd_cuda_alloc(mib, count);
        } else if (strcmp(command, "cuda-info") == 0) {
            cmd_cuda_info();
        } else if (strcmp(command, "cuda-free") == 0) {
            cmd_cuda_free();
        } else if (strcmp(command, "hold") == 0) {
            cmd_hold();
        } else if (strcmp(command, "devices") == 0) {
            cmd_devices();
        } else if (strcmp(command, "select") == 0) {
            cmd_select(arg(argc, argv, i + 1));
            i += 1;
        } else if (strcmp(command, "invalid") == 0) {
            cmd_invalid();
        } else if (strcmp(command, "symbols") == 0) {
            cmd_symbols();
        } else if (strcmp(command, "work") == 0) {
            const char *kind = arg(argc, argv, i + 1);
            char *end;
            const char *seconds_text = arg(argc, argv, i + 2);
            double seconds = strtod(seconds_text, &end);
            if (end == seconds_text || *end || !(seconds >= 0) || seconds > 1e6) fail("work_seconds");
            unsigned long long size = parse_number(arg(argc, argv, i + 3), "work_size");
            i += 3;
            cmd_work(kind, seconds, size);
        } else {
            fprintf(stderr, "%s: unknown command %s\n", argv[0], command);
            fail("unknown_command");
        }
    }
    if (device) {
        vkDeviceWaitIdle(device);
        free_held();
        vkDestroyDevice(device, NULL);
    }
    if (instance) vkDestroyInstance(instance, NULL);
    if (cuda_open) cuda_free_held();
    return 0;
}
