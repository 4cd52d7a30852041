/* A process that takes device memory with no CUDA allocation call, as OpenGL or a video codec
 * does, for tests/node_agent.rs: `graphics_client CUDA_MIB GRAPHICS_MIB HOLD_MS`.
 *   CUDA_MIB > 0      cuInit, the primary context of device 0 made current, cuMemAlloc of that size
 *                     (under LD_PRELOAD=libvgpu.so this is charged to the container's budget)
 *   GRAPHICS_MIB > 0  fakegpu_graphics_alloc(0, size): graphics memory no hook sees
 *   HOLD_MS           then hold everything that long (0: until killed)
 * Prints cuda_status=, graphics_status= and ready=1 (flushed), then pid=. Linked with the fake
 * driver (libcuda.so.1), which exports the test hook. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef unsigned long long CUdeviceptr;
CUresult cuInit(unsigned flags);
CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev);
CUresult cuCtxSetCurrent(CUcontext ctx);
CUresult cuMemAlloc_v2(CUdeviceptr *ptr, size_t bytes);
int fakegpu_graphics_alloc(unsigned physical_index, unsigned long long bytes);

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s CUDA_MIB GRAPHICS_MIB HOLD_MS\n", argv[0]);
        return 2;
    }
    unsigned long long cuda = strtoull(argv[1], NULL, 10) << 20;
    unsigned long long graphics = strtoull(argv[2], NULL, 10) << 20;
    long hold_ms = atol(argv[3]);
    if (cuda > 0) {
        CUcontext ctx = NULL;
        CUdeviceptr ptr = 0;
        CUresult status = cuInit(0);
        if (status == 0) status = cuDevicePrimaryCtxRetain(&ctx, 0);
        if (status == 0) status = cuCtxSetCurrent(ctx);
        if (status == 0) status = cuMemAlloc_v2(&ptr, (size_t)cuda);
        printf("cuda_status=%d\n", status);
    }
    if (graphics > 0) printf("graphics_status=%d\n", fakegpu_graphics_alloc(0, graphics));
    printf("pid=%d\nready=1\n", (int)getpid());
    fflush(stdout);
    if (hold_ms > 0) {
        usleep((useconds_t)hold_ms * 1000);
        return 0;
    }
    for (;;) pause();
}
