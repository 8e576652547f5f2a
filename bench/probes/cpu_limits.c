/* Probe: this CPU's float32 FMA peak and its read bandwidth from L1 to DRAM, the two limits
 * docs/benchmarks.md ("Engine on CPU") compares a batch-16 and a batch-1 decode step against.
 *
 *   gcc -O2 -mavx2 -mfma -fopenmp -o /tmp/cpu_limits bench/probes/cpu_limits.c && /tmp/cpu_limits
 */
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FMA12(m, d) \
    c0 = _mm256_fmadd_ps(c0, m, d); c1 = _mm256_fmadd_ps(c1, m, d); c2 = _mm256_fmadd_ps(c2, m, d); \
    c3 = _mm256_fmadd_ps(c3, m, d); c4 = _mm256_fmadd_ps(c4, m, d); c5 = _mm256_fmadd_ps(c5, m, d); \
    c6 = _mm256_fmadd_ps(c6, m, d); c7 = _mm256_fmadd_ps(c7, m, d); c8 = _mm256_fmadd_ps(c8, m, d); \
    c9 = _mm256_fmadd_ps(c9, m, d); c10 = _mm256_fmadd_ps(c10, m, d); c11 = _mm256_fmadd_ps(c11, m, d)

int main(void)
{
    const long iters = 100000000;
    for (int th = 1; th <= omp_get_num_procs(); th++) {
        double best = 1e9;
        for (int rep = 0; rep < 3; rep++) {
            double t = omp_get_wtime();
            float sink = 0;
            #pragma omp parallel num_threads(th) reduction(+ : sink)
            {
                /* 12 independent chains: enough to cover FMA latency on two pipes */
                const __m256 m = _mm256_set1_ps(0.999f), d = _mm256_set1_ps(1e-4f);
                __m256 c0 = _mm256_set1_ps(0.1f), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0, c6 = c0, c7 = c0,
                       c8 = c0, c9 = c0, c10 = c0, c11 = c0;
                for (long i = 0; i < iters; i++) { FMA12(m, d); }
                __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(c0, c1), _mm256_add_ps(c2, c3)),
                                         _mm256_add_ps(_mm256_add_ps(c4, c5), _mm256_add_ps(c6, c7)));
                s = _mm256_add_ps(s, _mm256_add_ps(_mm256_add_ps(c8, c9), _mm256_add_ps(c10, c11)));
                float o[8];
                _mm256_storeu_ps(o, s);
                sink += o[0];
            }
            t = omp_get_wtime() - t;
            if (t < best) best = t;
            if (sink == 1234.5f) printf(" ");
        }
        printf("float32 FMA, %d threads: %.1f GMAC/s\n", th, iters * 12.0 * 8 * th / best / 1e9);
    }
    const size_t sizes[] = {256u << 10, 4u << 20, 256u << 20};
    for (int si = 0; si < 3; si++) {
        const size_t bytes = sizes[si], n = bytes / 4;
        float *a = aligned_alloc(64, bytes);
        memset(a, 1, bytes);
        for (int th = 1; th <= omp_get_num_procs(); th++) {
            const int reps = bytes >= (64u << 20) ? 3 : (int)((1u << 30) / bytes);
            double best = 1e9;
            for (int rep = 0; rep < 5; rep++) {
                double t = omp_get_wtime();
                float sink = 0;
                #pragma omp parallel num_threads(th) reduction(+ : sink)
                {
                    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
                    const int me = omp_get_thread_num(), T = omp_get_num_threads();
                    const size_t lo = n * me / T, hi = n * (me + 1) / T;
                    for (int r = 0; r < reps; r++)
                        for (size_t i = lo; i + 32 <= hi; i += 32) {
                            s0 = _mm256_add_ps(s0, _mm256_load_ps(a + i));
                            s1 = _mm256_add_ps(s1, _mm256_load_ps(a + i + 8));
                            s2 = _mm256_add_ps(s2, _mm256_load_ps(a + i + 16));
                            s3 = _mm256_add_ps(s3, _mm256_load_ps(a + i + 24));
                        }
                    float o[8];
                    _mm256_storeu_ps(o, _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
                    sink += o[0];
                }
                t = omp_get_wtime() - t;
                if (t < best) best = t;
                if (sink == 1.5f) printf(" ");
            }
            printf("read %8zu KB, %d threads: %.1f GB/s\n", bytes >> 10, th, (double)bytes * reps / best / 1e9);
        }
        free(a);
    }
    return 0;
}
