// One long FMA-bound kernel over every SM, launched again and again: the compute-limit benchmark's
// case of a kernel much longer than any throttling period.
//
//     nvcc -O3 -arch=native ci/gpu/long_kernel.cu -o target/gpu-compute/bin/long_kernel
//     long_kernel calibrate TARGET_MS     prints iters=N: the loop count for a launch of about TARGET_MS
//     long_kernel run ITERS SECONDS       one unmeasured launch, then launch+synchronize until SECONDS
//                                         have passed (at least 4 launches); prints rate=launches/s
//
// ci/gpu-compute calibrates once natively and passes the same ITERS to every native and limited run,
// so both sides run the same kernel. Output is `key=value` lines; a failure prints `error=...` and
// exits 1.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

constexpr int kThreads = 256;
constexpr int kChains = 8; // independent FMA chains per thread, enough to keep the FMA pipes full

// Each thread runs kChains independent multiply-add chains `iters` times. The values stay bounded
// (x * 0.9999 + 0.0001 converges to 1), and one store per thread keeps the compiler from dropping
// the loop; memory traffic is nil, so the kernel's time is FMA throughput times SMs in use.
__global__ void fma_loop(long long iters, float *out) {
    float x[kChains];
    for (int c = 0; c < kChains; c++) x[c] = threadIdx.x * 1e-3f + c;
    for (long long i = 0; i < iters; i++) {
#pragma unroll
        for (int c = 0; c < kChains; c++) x[c] = fmaf(x[c], 0.9999f, 0.0001f);
    }
    float sum = 0.0f;
    for (int c = 0; c < kChains; c++) sum += x[c];
    out[blockIdx.x * blockDim.x + threadIdx.x] = sum;
}

static void check(cudaError_t status, const char *what) {
    if (status != cudaSuccess) {
        std::printf("error=%s: %s\n", what, cudaGetErrorString(status));
        std::exit(1);
    }
}

static double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Launcher {
    int blocks = 0;
    float *out = nullptr;

    // As many resident blocks as every SM holds at once: one wave that covers the whole GPU.
    Launcher() {
        check(cudaSetDevice(0), "cudaSetDevice");
        cudaDeviceProp prop{};
        check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
        int per_sm = 0;
        check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fma_loop, kThreads, 0),
              "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
        blocks = prop.multiProcessorCount * std::max(per_sm, 1);
        check(cudaMalloc(&out, sizeof(float) * blocks * kThreads), "cudaMalloc");
        std::printf("device=%s\nsms=%d\nblocks=%d\nthreads_per_block=%d\n", prop.name, prop.multiProcessorCount,
                    blocks, kThreads);
    }

    // One launch followed by a synchronize; returns its wall time in seconds.
    double once(long long iters) {
        double start = now_s();
        fma_loop<<<blocks, kThreads>>>(iters, out);
        check(cudaGetLastError(), "fma_loop launch");
        check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
        return now_s() - start;
    }
};

// Doubles the loop count until one launch takes 20 ms or more, then scales it to the target.
static int calibrate(double target_ms) {
    Launcher launcher;
    launcher.once(1000); // context, module load, clocks up
    long long iters = 1 << 14;
    double seconds = launcher.once(iters);
    while (seconds < 0.02 && iters < (1LL << 40)) {
        iters *= 2;
        seconds = launcher.once(iters);
    }
    long long scaled = static_cast<long long>(iters * (target_ms / 1000.0) / seconds);
    scaled = std::max(scaled, 1LL);
    double check_ms = 1000.0 * launcher.once(scaled);
    std::printf("iters=%lld\nmeasured_ms=%.2f\n", scaled, check_ms);
    return 0;
}

static int run(long long iters, double seconds) {
    Launcher launcher;
    // Unmeasured: context, module load, clocks up, and under a limit the limiter's first charge.
    double warm_ms = 1000.0 * launcher.once(iters);
    long launches = 0;
    double shortest = 1e30, longest = 0.0;
    double start = now_s();
    // Each launch is synchronised, so the elapsed time ends exactly when the last kernel does and the
    // rate has no partial launch in it; a limiter's wait before (or between) launches falls inside.
    while (launches < 4 || now_s() - start < seconds) {
        double t = launcher.once(iters);
        shortest = std::min(shortest, t);
        longest = std::max(longest, t);
        launches++;
    }
    double elapsed = now_s() - start;
    std::printf("warmup_ms=%.2f\nlaunches=%ld\nelapsed_s=%.4f\nlaunch_ms_min=%.2f\nlaunch_ms_max=%.2f\n", warm_ms,
                launches, elapsed, 1000.0 * shortest, 1000.0 * longest);
    std::printf("rate=%.6f\n", launches / elapsed);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && std::strcmp(argv[1], "calibrate") == 0) return calibrate(std::atof(argv[2]));
    if (argc == 4 && std::strcmp(argv[1], "run") == 0) {
        long long iters = std::atoll(argv[2]);
        double seconds = std::atof(argv[3]);
        if (iters > 0 && seconds > 0) return run(iters, seconds);
    }
    std::printf("error=usage: long_kernel calibrate TARGET_MS | long_kernel run ITERS SECONDS\n");
    return 1;
}
