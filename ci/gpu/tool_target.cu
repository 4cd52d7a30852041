// A CUDA program for the developer-tool checks (issue 38): what it sees of the device, 256 MiB
// chunks until refused, then one kernel, so that a profiler has something to profile.
#include <cstdio>
#include <cuda_runtime.h>

__global__ void touch(int *data) { data[threadIdx.x] += 1; }

int main() {
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    printf("total_mib=%zu free_mib=%zu\n", total_b >> 20, free_b >> 20);
    void *chunks[512];
    int n = 0;
    while (n < 512 && cudaMalloc(&chunks[n], 256u << 20) == cudaSuccess) n++;
    cudaGetLastError();
    printf("chunks_256mib=%d\n", n);
    for (int i = 1; i < n; i++) cudaFree(chunks[i]);
    touch<<<1, 32>>>(static_cast<int *>(chunks[0]));
    cudaError_t status = cudaDeviceSynchronize();
    printf("kernel=%s\n", cudaGetErrorString(status));
    return status == cudaSuccess ? 0 : 1;
}
