/* y[M,N] = x[M,K] @ W[N,K]^T with W in GGUF Q4_1 groups of 32 along K (W = q * s + m), and x
 * quantized to int8 per row and group of 32 (d = max|x| / 127, xq = round(x / d)): W4A8, the
 * scheme llama.cpp's AVX2 path runs (q4_1 x q8_1). AVX2 + FMA + F16C.
 *
 * Why: at batch 1 the float32 kernel (int4_avx2.c) dequantizes every code to float32 and costs
 * more than reading the weights; here 4 codes meet 4 int8 activations in one maddubs, summed
 * exactly in int32 over a group, and the scale and minimum are applied once per group:
 *   sum_k x_k (q_k s + m) ~= s d sum_k q_k xq_k + m (d sum_k xq_k).
 * The price: x is rounded to 8 bits (max error ~3-4e-3 of max|y| against ~1e-6 for the float32
 * kernel, bench/probes/w4a8_avx2.c), so greedy text may part from the float32 engine's on a
 * near tie; that is why this is a build of its own (SWITCHYARD_NATIVE=avx2-w4a8), not avx2's
 * default. A row's result depends only on that row (its own quantization, the same order of
 * operations whatever M, the tile and the thread count), so rows stay independent of the batch.
 *
 * Same packed layout as int4_avx2.c: one 320-byte record per block of 16 columns and group;
 * per t in 0..7, 32 bytes where bytes 2i and 2i+1 hold column i's codes for k = 4t..4t+3
 * (2i: 4t low nibble, 4t+2 high; 2i+1: 4t+1 low, 4t+3 high); then 16 float16 scales, then 16
 * float16 minimums. `s` and `z` are unused (NULL).
 */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>

#define COLS 16
#define GROUP 32
#define CODES (COLS * GROUP / 2)
#define RECORD (CODES + 4 * COLS)
#define PREFETCH 2 /* groups ahead */

/* Row m's group g: int8 codes, their scale d and d * sum(codes). */
static void quantize_row(const float *x, int64_t K, int8_t *xq, float *d, float *ds)
{
    for (int64_t g = 0; g < K / GROUP; g++) {
        const float *v = x + g * GROUP;
        float amax = 0.f;
        for (int j = 0; j < GROUP; j++) amax = fmaxf(amax, fabsf(v[j]));
        const float scale = amax / 127.f, inv = amax > 0.f ? 127.f / amax : 0.f;
        int sum = 0;
        for (int j = 0; j < GROUP; j++) {
            const int q = (int)lrintf(v[j] * inv);
            xq[g * GROUP + j] = (int8_t)q;
            sum += q;
        }
        d[g] = scale;
        ds[g] = scale * (float)sum;
    }
}

/* Column codes of 8 columns for k = 4t..4t+3 as one byte each in their 32-bit lane (k order). */
static inline __m256i lanes(const uint8_t *pairs)
{
    const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)pairs));
    return _mm256_or_si256(_mm256_and_si256(v, _mm256_set1_epi32(0x0F0F)),
                           _mm256_and_si256(_mm256_slli_epi32(v, 12), _mm256_set1_epi32(0x0F0F0000)));
}

/* One block of 16 columns, one group, all M rows: the group's codes are spread into lanes once
 * (kept in L1), then each row's exact int32 dot products, scaled into y (which holds the sum
 * over the groups before this one). */
static void block_group(const uint8_t *rec, int64_t g, const int8_t *xq, const float *d, const float *ds,
                        int64_t M, int64_t K, float *y, int64_t N)
{
    const __m256i ones = _mm256_set1_epi16(1);
    const int64_t G = K / GROUP;
    __m256i wl[16];
    for (int t = 0; t < 8; t++) {
        wl[2 * t] = lanes(rec + t * 32);
        wl[2 * t + 1] = lanes(rec + t * 32 + 16);
    }
    const __m256 s0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(rec + CODES)));
    const __m256 s1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(rec + CODES + 16)));
    const __m256 m0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(rec + CODES + 2 * COLS)));
    const __m256 m1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(rec + CODES + 2 * COLS + 16)));
    for (int64_t r = 0; r < M; r++) {
        const int8_t *xr = xq + r * K + g * GROUP;
        __m256i dot0 = _mm256_setzero_si256(), dot1 = _mm256_setzero_si256();
        for (int t = 0; t < 8; t++) {
            const __m256i xb = _mm256_set1_epi32(*(const int32_t *)(xr + 4 * t));
            dot0 = _mm256_add_epi32(dot0, _mm256_madd_epi16(_mm256_maddubs_epi16(wl[2 * t], xb), ones));
            dot1 = _mm256_add_epi32(dot1, _mm256_madd_epi16(_mm256_maddubs_epi16(wl[2 * t + 1], xb), ones));
        }
        float *yr = y + r * N;
        const __m256 dv = _mm256_set1_ps(d[r * G + g]), dsv = _mm256_set1_ps(ds[r * G + g]);
        __m256 a0 = g ? _mm256_loadu_ps(yr) : _mm256_setzero_ps();
        __m256 a1 = g ? _mm256_loadu_ps(yr + 8) : _mm256_setzero_ps();
        a0 = _mm256_fmadd_ps(m0, dsv, _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot0), _mm256_mul_ps(s0, dv), a0));
        a1 = _mm256_fmadd_ps(m1, dsv, _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot1), _mm256_mul_ps(s1, dv), a1));
        _mm256_storeu_ps(yr, a0);
        _mm256_storeu_ps(yr + 8, a1);
    }
}

int sy_int4_mm(const float *x, const uint8_t *w, const float *s, const float *z, float *y,
               int64_t M, int64_t N, int64_t K, int threads)
{
    (void)s, (void)z;
    if (N % COLS || K % GROUP) return 1;
    const int64_t G = K / GROUP, NB = N / COLS;
    int8_t *xq = malloc((size_t)(M * K));
    float *d = malloc(sizeof(float) * (size_t)(M * G)), *ds = malloc(sizeof(float) * (size_t)(M * G));
    if (!xq || !d || !ds) {
        free(xq), free(d), free(ds);
        return 2;
    }
    #pragma omp parallel num_threads(threads)
    {
        #pragma omp for schedule(static)
        for (int64_t m = 0; m < M; m++) quantize_row(x + m * K, K, xq + m * K, d + m * G, ds + m * G);
        /* Each thread owns a contiguous range of column blocks (the implicit barrier above has
         * every row quantized). */
        const int64_t T = omp_get_num_threads(), me = omp_get_thread_num();
        const int64_t lo = NB * me / T, hi = NB * (me + 1) / T;
        for (int64_t nb = lo; nb < hi; nb++)
            for (int64_t g = 0; g < G; g++) {
                /* Weights stream from DRAM once a step: fetch a few groups ahead (a hint: past
                 * the end it fetches nothing and never faults). */
                const char *ahead = (const char *)(w + (nb * G + g + PREFETCH) * RECORD);
                for (int l = 0; l < RECORD; l += 64) _mm_prefetch(ahead + l, _MM_HINT_T0);
                block_group(w + (nb * G + g) * RECORD, g, xq, d, ds, M, K, y + nb * COLS, N);
            }
    }
    free(xq), free(d), free(ds);
    return 0;
}
