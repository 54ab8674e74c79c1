/* Read bandwidth of this machine: N threads each stream their part of a 1 GiB buffer (on huge
 * pages where the kernel gives them) five times with 512-bit loads, as a decode step streams its
 * weights. The roofline a memory-bound decode cannot pass.
 *
 *   cc -O2 -mavx512f -mavx512bw -pthread scripts/read_bandwidth.c -o /tmp/read_bandwidth
 *   /tmp/read_bandwidth 2
 */
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define BYTES (1UL << 30)
#define PASSES 5

static char *buffer;
static long threads;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void *stream(void *arg) {
    size_t part = BYTES / threads;
    const char *p = buffer + (long)arg * part;
    __m512i a = _mm512_setzero_si512(), b = a, c = a, d = a;
    for (int pass = 0; pass < PASSES; pass++) {
        for (size_t i = 0; i < part; i += 256) {
            a = _mm512_add_epi8(a, _mm512_load_si512(p + i));
            b = _mm512_add_epi8(b, _mm512_load_si512(p + i + 64));
            c = _mm512_add_epi8(c, _mm512_load_si512(p + i + 128));
            d = _mm512_add_epi8(d, _mm512_load_si512(p + i + 192));
        }
    }
    long long lanes[8];
    _mm512_storeu_si512(lanes, _mm512_add_epi8(_mm512_add_epi8(a, b), _mm512_add_epi8(c, d)));
    return (void *)(long)lanes[0];
}

int main(int argc, char **argv) {
    threads = argc > 1 ? atol(argv[1]) : 1;
    if (threads < 1 || threads > 64) {
        fprintf(stderr, "usage: %s THREADS (1 to 64)\n", argv[0]);
        return 2;
    }
    buffer = aligned_alloc(1 << 21, BYTES);
    if (!buffer) {
        perror("aligned_alloc");
        return 1;
    }
    madvise(buffer, BYTES, MADV_HUGEPAGE);
    memset(buffer, 1, BYTES);
    pthread_t ids[64];
    double start = now();
    for (long i = 0; i < threads; i++) pthread_create(&ids[i], NULL, stream, (void *)i);
    for (long i = 0; i < threads; i++) pthread_join(ids[i], NULL);
    printf("%ld threads: %.1f GB/s\n", threads, (double)PASSES * BYTES / (now() - start) / 1e9);
    return 0;
}
