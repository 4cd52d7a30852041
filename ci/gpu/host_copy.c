// The host side of a swap through pageable memory (issue 49, docs/overcommit.md): how fast N
// threads copy 64 MiB chunks from one buffer (the pinned ring's stand-in) into fresh anonymous
// memory that the copy itself faults in (a swap-out into new pageable buffers), with and without
// transparent huge pages, and into memory already faulted in (a swap-out into buffers kept from
// an earlier one, or a swap-in's copy into the staging ring).
//
//     cc -O2 -pthread ci/gpu/host_copy.c -o host_copy && ./host_copy [GIB]   (default 8)
//
// Prints one line per case: `case threads GB/s`. No GPU is needed.
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
    return 0;
}
