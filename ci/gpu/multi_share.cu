// One process driving two GPUs at once, for ci/gpu-multi's compute rows: the share of GPU time its
// work holds on each device, so that CUDA_DEVICE_SM_LIMIT_0 and _1 can be checked per device.
//
//     nvcc -O2 -arch=native ci/gpu/multi_share.cu -o multi_share
//     multi_share kernel SECONDS    host thread d (d = 0, 1) on CUDA device d launches a busy kernel
//                                   (every SM spinning on the global timer for 2 ms) again and again
//     multi_share copy SECONDS      host thread d copies 256 MiB from device d to device 1-d with
//                                   cudaMemcpyPeerAsync on a stream of device d, again and again
//
// Both threads run at once: one second of warm-up (clocks, a limiter past its first period), then
// SECONDS measured. Each step is bracketed by events as ci/gpu/compute_share.py's StepTimer does:
// start and end on the work's stream, and `launched` on an idle side stream right after the call
// returns, because a limiter makes the call wait on the CPU after start was queued; a step's GPU
// time is min(start->end, launched->end). Prints, per device d: devD_steps, devD_wall_s, devD_busy_s
// and devD_share (busy / wall, in percent), and for copies devD_peer_access (1: direct peer access
// was enabled; 0: the driver stages the copies). Output is key=value lines; a failure prints
// error=... and exits 1.
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <string>
#include <thread>

constexpr long long kSpinNs = 2000000; // one kernel: 2 ms
constexpr size_t kCopyBytes = 256u << 20;
constexpr int kQueued = 4; // steps in flight before the oldest is read

__global__ void spin(long long ns) {
    long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns);
}

static void check(cudaError_t status, const char *what, int device) {
    if (status != cudaSuccess) {
        std::printf("error=device %d: %s: %s\n", device, what, cudaGetErrorString(status));
        std::fflush(stdout);
        std::exit(1);
    }
}

static double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Result {
    long long steps = 0;
    double wall = 0, busy = 0;
    bool peer_access = false;
};

struct Step {
    cudaEvent_t start, launched, end;
};

static void worker(int device, bool copy, double seconds, Result *out) {
    check(cudaSetDevice(device), "cudaSetDevice", device);
    int sms = 0;
    check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute", device);
    cudaStream_t stream, side;
    check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate", device);
    check(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking), "cudaStreamCreate", device);
    void *src = nullptr, *dst = nullptr;
    int peer = 1 - device;
    if (copy) {
        check(cudaMalloc(&src, kCopyBytes), "cudaMalloc", device);
        check(cudaMemset(src, 1, kCopyBytes), "cudaMemset", device);
        // Without peer access (no NVLink or P2P over PCIe) the copy still runs, staged by the driver.
        cudaError_t status = cudaDeviceEnablePeerAccess(peer, 0);
        out->peer_access = status == cudaSuccess || status == cudaErrorPeerAccessAlreadyEnabled;
        cudaGetLastError();
        check(cudaSetDevice(peer), "cudaSetDevice", peer);
        check(cudaMalloc(&dst, kCopyBytes), "cudaMalloc", peer);
        check(cudaSetDevice(device), "cudaSetDevice", device);
    }
    auto issue = [&]() {
        if (copy) {
            check(cudaMemcpyPeerAsync(dst, peer, src, device, kCopyBytes, stream), "cudaMemcpyPeerAsync", device);
        } else {
            spin<<<sms, 64, 0, stream>>>(kSpinNs);
            check(cudaGetLastError(), "launch", device);
        }
    };
    std::deque<Step> queued, spare;
    auto read_oldest = [&](Result *result) {
        Step s = queued.front();
        queued.pop_front();
        check(cudaEventSynchronize(s.end), "cudaEventSynchronize", device);
        check(cudaEventSynchronize(s.launched), "cudaEventSynchronize", device);
        float a = 0, b = 0;
        check(cudaEventElapsedTime(&a, s.start, s.end), "cudaEventElapsedTime", device);
        check(cudaEventElapsedTime(&b, s.launched, s.end), "cudaEventElapsedTime", device);
        if (result) result->busy += (a < b ? a : b) / 1000.0;
        spare.push_back(s);
    };
    auto run = [&](double until, Result *result) {
        long long steps = 0;
        while (now_s() < until) {
            Step s;
            if (spare.empty()) {
                for (cudaEvent_t *e : {&s.start, &s.launched, &s.end}) check(cudaEventCreate(e), "cudaEventCreate", device);
            } else {
                s = spare.front();
                spare.pop_front();
            }
            check(cudaEventRecord(s.start, stream), "cudaEventRecord", device);
            issue();
            check(cudaEventRecord(s.launched, side), "cudaEventRecord", device);
            check(cudaEventRecord(s.end, stream), "cudaEventRecord", device);
            queued.push_back(s);
            steps++;
            if (queued.size() > kQueued) read_oldest(result);
        }
        while (!queued.empty()) read_oldest(result);
        return steps;
    };
    run(now_s() + 1.0, nullptr); // warm-up
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize", device);
    double start = now_s();
    out->steps = run(start + seconds, out);
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize", device);
    out->wall = now_s() - start;
    if (copy) {
        cudaFree(src);
        check(cudaSetDevice(peer), "cudaSetDevice", peer);
        cudaFree(dst);
    }
}

int main(int argc, char **argv) {
    setvbuf(stdout, nullptr, _IOLBF, 0);
    if (argc != 3 || (std::strcmp(argv[1], "kernel") != 0 && std::strcmp(argv[1], "copy") != 0)) {
        std::fprintf(stderr, "usage: %s kernel|copy SECONDS\n", argv[0]);
        return 2;
    }
    bool copy = std::strcmp(argv[1], "copy") == 0;
    double seconds = std::atof(argv[2]);
    int count = 0;
    check(cudaGetDeviceCount(&count), "cudaGetDeviceCount", -1);
    if (count < 2) {
        std::printf("error=%d CUDA devices visible, 2 needed\n", count);
        return 1;
    }
    for (int d = 0; d < 2; d++) {
        cudaDeviceProp prop{};
        check(cudaGetDeviceProperties(&prop, d), "cudaGetDeviceProperties", d);
        std::printf("dev%d_name=%s\ndev%d_sms=%d\n", d, prop.name, d, prop.multiProcessorCount);
    }
    Result results[2];
    std::thread threads[2];
    for (int d = 0; d < 2; d++) threads[d] = std::thread(worker, d, copy, seconds, &results[d]);
    for (auto &t : threads) t.join();
    for (int d = 0; d < 2; d++) {
        const Result &r = results[d];
        std::printf("dev%d_steps=%lld\ndev%d_wall_s=%.4f\ndev%d_busy_s=%.4f\ndev%d_share=%.2f\n", d, r.steps, d, r.wall,
                    d, r.busy, d, r.wall > 0 ? 100.0 * r.busy / r.wall : 0.0);
        if (copy) std::printf("dev%d_peer_access=%d\n", d, r.peer_access ? 1 : 0);
    }
    return 0;
}
