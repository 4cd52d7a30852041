// The host side of a swap through pageable memory (issue 49, docs/overcommit.md): how fast N
// threads copy 64 MiB chunks from one buffer (the pinned ring's stand-in) into fresh anonymous
// memory that the copy itself faults in (a swap-out into new pageable buffers), with and without
// transparent huge pages, and into memory already faulted in (a swap-out into buffers kept from
// an earlier one, or a swap-in's copy into the staging ring).
//
//     cc -O2 -pthread ci/gpu/host_copy.c -o host_copy && ./host_copy [GIB]   (default 8)
//
// Prints one line per case: `case threads GB/s` (each chunk's threads started and joined for it,
// as the swap did before its copy threads waited between chunks), then what starting and joining
// 15 threads costs against waking 15 waiting ones: `threads start+join|wake 15 MICROSECONDS`.
// No GPU is needed.
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define CHUNK (64UL << 20)

struct part {
    char *to;
    const char *from;
    size_t size;
};

static void *copy_part(void *arg) {
    struct part *p = arg;
    memcpy(p->to, p->from, p->size);
    return NULL;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

// Copies `total` bytes from `source` (one chunk, reused) into `target`, chunk by chunk, each
// chunk split over `threads` threads, as the swap's copy_parallel does.
static double copy_chunks(char *target, const char *source, size_t total, int threads) {
    pthread_t ids[64];
    struct part parts[64];
    double start = now_s();
    for (size_t done = 0; done < total; done += CHUNK) {
        size_t each = CHUNK / threads;
        for (int k = 0; k < threads; k++) {
            parts[k] = (struct part){target + done + k * each, source + k * each, each};
            pthread_create(&ids[k], NULL, copy_part, &parts[k]);
        }
        for (int k = 0; k < threads; k++) pthread_join(ids[k], NULL);
    }
    return total / (now_s() - start) / 1e9;
}

static char *fresh(size_t size, int huge) {
    char *at = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (at == MAP_FAILED) {
        perror("mmap");
        exit(1);
    }
    madvise(at, size, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
    return at;
}

static void *nothing(void *arg) { return arg; }

// Threads waiting for a round number to change, as the swap's copy threads wait for a chunk.
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t posted = PTHREAD_COND_INITIALIZER, finished = PTHREAD_COND_INITIALIZER;
static long round_posted, round_done_by;

static void *waiter(void *arg) {
    long seen = 0;
    pthread_mutex_lock(&lock);
    for (;;) {
        while (round_posted == seen) pthread_cond_wait(&posted, &lock);
        seen = round_posted;
        if (++round_done_by == 15) pthread_cond_signal(&finished);
    }
    return arg;
}

// Microseconds per round of starting and joining 15 threads, and of waking 15 waiting ones and
// hearing back from all of them.
static void thread_costs(void) {
    int rounds = 2000;
    pthread_t ids[15];
    double start = now_s();
    for (int r = 0; r < rounds; r++) {
        for (int k = 0; k < 15; k++) pthread_create(&ids[k], NULL, nothing, NULL);
        for (int k = 0; k < 15; k++) pthread_join(ids[k], NULL);
    }
    printf("threads start+join 15 %.0f\n", (now_s() - start) / rounds * 1e6);
    for (int k = 0; k < 15; k++) pthread_create(&ids[k], NULL, waiter, NULL);
    start = now_s();
    for (int r = 0; r < rounds; r++) {
        pthread_mutex_lock(&lock);
        round_posted++;
        round_done_by = 0;
        pthread_cond_broadcast(&posted);
        while (round_done_by < 15) pthread_cond_wait(&finished, &lock);
        pthread_mutex_unlock(&lock);
    }
    printf("threads wake 15 %.0f\n", (now_s() - start) / rounds * 1e6);
}

int main(int argc, char **argv) {
    size_t total = (argc > 1 ? strtoul(argv[1], NULL, 10) : 8) << 30;
    char *source = fresh(CHUNK, 1);
    memset(source, 7, CHUNK);
    int counts[] = {1, 2, 4, 8, 12, 16};
    for (unsigned i = 0; i < sizeof counts / sizeof *counts; i++) {
        int threads = counts[i];
        for (int huge = 0; huge <= 1; huge++) {
            char *target = fresh(total, huge);
            printf("fault+copy %s %d %.1f\n", huge ? "thp" : "4k", threads,
                   copy_chunks(target, source, total, threads));
            printf("copy-faulted %s %d %.1f\n", huge ? "thp" : "4k", threads,
                   copy_chunks(target, source, total, threads));
            fflush(stdout);
            munmap(target, total);
        }
    }
    thread_costs();
    return 0;
}
