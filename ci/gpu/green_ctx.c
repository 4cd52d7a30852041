/* A green context on a real GPU under libvgpu: cuMemGetInfo before, while it lives, after.
 *   nvcc -o green_ctx ci/gpu/green_ctx.c -lcuda && LD_PRELOAD=libvgpu.so CUDA_DEVICE_MEMORY_LIMIT_0=8g ./green_ctx
 * Prints key=value lines: free_before, green_status, free_with_green, free_after. */
#include <cuda.h>
#include <stdio.h>

#define CHECK(call)                                                            \
    do {                                                                       \
        CUresult s_ = (call);                                                  \
        if (s_ != CUDA_SUCCESS) {                                              \
            printf("error=%s:%d\n", #call, (int)s_);                           \
            return 1;                                                          \
        }                                                                      \
    } while (0)

int main(void) {
    CUdevice dev;
    CUcontext primary;
    size_t free_bytes, total;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&primary, dev));
    CHECK(cuCtxSetCurrent(primary));
    CHECK(cuMemGetInfo(&free_bytes, &total));
    printf("total=%zu\nfree_before=%zu\n", total, free_bytes);
    CUdevResource sm, part, rest;
    unsigned int groups = 1;
    CHECK(cuDeviceGetDevResource(dev, &sm, CU_DEV_RESOURCE_TYPE_SM));
    CHECK(cuDevSmResourceSplitByCount(&part, &groups, &sm, &rest, 0, 32));
    CUdevResourceDesc desc;
    CHECK(cuDevResourceGenerateDesc(&desc, &part, 1));
    CUgreenCtx green;
    CUresult status = cuGreenCtxCreate(&green, desc, dev, CU_GREEN_CTX_DEFAULT_STREAM);
    printf("green_status=%d\n", (int)status);
    CHECK(cuMemGetInfo(&free_bytes, &total));
    printf("free_with_green=%zu\n", free_bytes);
    if (status == CUDA_SUCCESS) CHECK(cuGreenCtxDestroy(green));
    CHECK(cuMemGetInfo(&free_bytes, &total));
    printf("free_after=%zu\n", free_bytes);
    return 0;
}
