// Launch throughput of an empty kernel on each launch path libvgpu's compute limit hooks, for the
// cost of the hooks when no limit is set (which must be nil).
//
//     nvcc -O2 -arch=native ci/gpu/launch_rate.cu -o target/gpu-compute/bin/launch_rate
//     launch_rate [N]          (default N = 200000)
//
// Per path: N/10 unmeasured launches, then N launches queued asynchronously and one synchronize;
// prints launches per second:
//   launch_per_s        <<<1,1>>>                    (the runtime calls cuLaunchKernel)
//   launch_ex_per_s     cudaLaunchKernelEx, <<<1,1>>> (cuLaunchKernelEx)
//   graph_launch_per_s  cudaGraphLaunch of a graph of one empty kernel (cuGraphLaunch)
// ci/gpu-compute runs it natively and under libvgpu with no CUDA_DEVICE_SM_LIMIT, alternately.
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

__global__ void empty_kernel() {}

static void check(cudaError_t status, const char *what) {
    if (status != cudaSuccess) {
        std::printf("error=%s: %s\n", what, cudaGetErrorString(status));
        std::exit(1);
    }
}

static double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Launches per second of `launch` over n launches (after n/10 unmeasured ones), the queue drained
// before and after, so the figure is the sustained rate a launch-bound program sees.
template <typename Launch, typename Drain> static double rate(long n, Launch launch, Drain drain) {
    for (long i = 0; i < n / 10; i++) launch();
    drain();
    double start = now_s();
    for (long i = 0; i < n; i++) launch();
    drain();
    return n / (now_s() - start);
}

int main(int argc, char **argv) {
    long n = argc > 1 ? std::atol(argv[1]) : 200000;
    if (n < 10) n = 10;
    check(cudaSetDevice(0), "cudaSetDevice");
    check(cudaFree(nullptr), "cudaFree(0)"); // creates the context outside every measurement
    auto sync = [] { check(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); };

    double plain = rate(n, [] { empty_kernel<<<1, 1>>>(); }, sync);
    check(cudaGetLastError(), "<<<1,1>>> launch");
    std::printf("launch_per_s=%.1f\n", plain);

    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(1);
    config.blockDim = dim3(1);
    config.dynamicSmemBytes = 0;
    config.stream = 0;
    config.attrs = nullptr;
    config.numAttrs = 0;
    double ex = rate(n, [&config] { check(cudaLaunchKernelEx(&config, empty_kernel), "cudaLaunchKernelEx"); }, sync);
    std::printf("launch_ex_per_s=%.1f\n", ex);

    // A graph of one empty kernel, captured on a stream of its own and replayed on it.
    cudaStream_t stream;
    check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
    empty_kernel<<<1, 1, 0, stream>>>();
    check(cudaStreamEndCapture(stream, &graph), "cudaStreamEndCapture");
    check(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
    double graphs = rate(
        n, [&] { check(cudaGraphLaunch(exec, stream), "cudaGraphLaunch"); },
        [&] { check(cudaStreamSynchronize(stream), "cudaStreamSynchronize"); });
    std::printf("graph_launch_per_s=%.1f\n", graphs);

    check(cudaGraphExecDestroy(exec), "cudaGraphExecDestroy");
    check(cudaGraphDestroy(graph), "cudaGraphDestroy");
    check(cudaStreamDestroy(stream), "cudaStreamDestroy");
    return 0;
}
