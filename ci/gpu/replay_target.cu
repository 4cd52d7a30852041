// How Nsight Compute's kernel replay is charged (issue 38): holds MIB MiB in 256 MiB chunks, writes
// every byte with one kernel (so a replay must save and restore all of it), then allocates 256 MiB
// chunks until refused. Prints key=value lines; sleeps a second before and after the kernel so a
// sampler outside sees each state.
//   replay_target MIB
#include <cstdio>
#include <cstdlib>
#include <unistd.h>
#include <cuda_runtime.h>

__global__ void bump(unsigned *data, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        data[i] = data[i] * 3u + 1u;
}

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? strtoull(argv[1], nullptr, 10) : 1024;
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    printf("total_mib=%zu\n", total_b >> 20);
    unsigned *held[64];
    int n = 0;
    for (size_t got = 0; got < mib && n < 64; got += 256) {
        if (cudaMalloc(&held[n], 256u << 20) != cudaSuccess) break;
        cudaMemset(held[n], 1, 256u << 20);
        n++;
    }
    cudaDeviceSynchronize();
    printf("held_mib=%d\n", n * 256);
    fflush(stdout);
    sleep(1);
    for (int i = 0; i < n; i++) bump<<<1024, 256>>>(held[i], (256u << 20) / 4);
    cudaError_t status = cudaDeviceSynchronize();
    printf("kernel=%s\n", cudaGetErrorString(status));
    unsigned probe = 0;
    cudaMemcpy(&probe, held[0], 4, cudaMemcpyDeviceToHost);
    printf("first_word=%u\n", probe);  // 0x01010101 * 3 + 1, once per bump: replays restore it
    fflush(stdout);
    sleep(1);
    int more = 0;
    void *extra[64];
    while (more < 64 && cudaMalloc(&extra[more], 256u << 20) == cudaSuccess) more++;
    cudaGetLastError();
    printf("more_256mib=%d\n", more);
    return status == cudaSuccess ? 0 : 1;
}
