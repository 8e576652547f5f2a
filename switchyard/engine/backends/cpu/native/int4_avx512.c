/* y[M,N] = x[M,K] @ W[N,K]^T with W in 4-bit groups of 32 along K: W = q * s + m, the GGUF
 * Q4_1 scheme (a scale and a minimum per group, both float16, as Q4_1 stores them: a Q4_1
 * file's weights are reproduced exactly). x and y are float32; x is rounded to bfloat16 once,
 * on the way in.
 *
 * Per group, sum(q * x) runs on AVX512-BF16 dot products: q is exact in bfloat16, so each
 * product is exact and only the float32 sums round. The group's scale and minimum are applied
 * once per group in float32: y += s * dot + m * sum(x over the group).
 * Every row follows the same sequence of operations whatever M and the thread count are,
 * so a row computed alone is bit-identical to the same row computed in a batch.
 *
 * Packed layout (linear.py packs it): one 320-byte record per block of 16 output columns and
 * group, the block's groups one after another, so a thread reads its columns' weights as one
 * sequential stream (at batch 1 a decode step is bound by reading them from DRAM). A record
 * holds the codes, per t in 0..7 32 bytes (byte 2i+e: column i's code for k = 4t+e in the low
 * nibble, k = 4t+2+e in the high one), then the 16 columns' scales, then their minimums.
 * The `s` and `z` arguments are unused (NULL): the AMX build's layout keeps them apart.
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>

#include "int4_bf16.h"

#define MAX_ROWS 8
#define RECORD (COLS * GROUP / 2 + 4 * COLS)  /* codes, float16 scales, float16 minimums */
#define PREFETCH 4                            /* records ahead */

static inline __attribute__((always_inline)) void block(
    const uint16_t *x, int64_t K, const uint8_t *w, int64_t N, int64_t n0, const float *xs, int64_t G, float *y,
    const int R, __m512i lut)
{
    __m512 acc[MAX_ROWS];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    const __m512i low = _mm512_set1_epi16(0xF);
    for (int64_t g = 0; g < G; g++) {
        const uint8_t *rec = w + g * RECORD;
        if (g + PREFETCH < G)
            for (int l = 0; l < RECORD; l += 64) _mm_prefetch((const char *)(rec + PREFETCH * RECORD + l), _MM_HINT_T0);
        __m512 a0[MAX_ROWS], a1[MAX_ROWS];
        for (int r = 0; r < R; r++) { a0[r] = _mm512_setzero_ps(); a1[r] = _mm512_setzero_ps(); }
        const uint16_t *xg = x + g * GROUP;
        for (int t = 0; t < 8; t++) {
            __m512i wide = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(rec + t * 32)));
            __m512bh w0 = (__m512bh)_mm512_permutexvar_epi16(_mm512_and_si512(wide, low), lut);
            __m512bh w1 = (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(wide, 4), lut);
            for (int r = 0; r < R; r++) {
                const uint16_t *xr = xg + r * K + 4 * t;
                a0[r] = _mm512_dpbf16_ps(a0[r], w0, (__m512bh)_mm512_set1_epi32(*(const int32_t *)xr));
                a1[r] = _mm512_dpbf16_ps(a1[r], w1, (__m512bh)_mm512_set1_epi32(*(const int32_t *)(xr + 2)));
            }
        }
        const __m512 sv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(rec + COLS * GROUP / 2)));
        const __m512 mv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(rec + COLS * GROUP / 2 + 2 * COLS)));
        for (int r = 0; r < R; r++) {
            acc[r] = _mm512_fmadd_ps(_mm512_add_ps(a0[r], a1[r]), sv, acc[r]);
            acc[r] = _mm512_fmadd_ps(mv, _mm512_set1_ps(xs[r * G + g]), acc[r]);
        }
    }
    for (int r = 0; r < R; r++) _mm512_storeu_ps(y + r * N + n0, acc[r]);
}

int sy_int4_mm(const float *xf, const uint8_t *w, const float *s, const float *z, float *y,
               int64_t M, int64_t N, int64_t K, int threads)
{
    (void)s, (void)z;
    if (N % COLS || K % GROUP) return 1;
    const int64_t G = K / GROUP, NB = N / COLS;
    float *xs = malloc(sizeof(float) * (size_t)(M * G));
    uint16_t *x = malloc(sizeof(uint16_t) * (size_t)(M * K));
    if (!xs || !x) { free(xs); free(x); return 2; }
    const __m512i lut = int4_bf16_lut_unsigned();
    #pragma omp parallel num_threads(threads)
    {
        int4_round_x(xf, M, K, x, xs);
        #pragma omp for schedule(static)
        for (int64_t nb = 0; nb < NB; nb++) {
            const uint8_t *wb = w + nb * G * RECORD;
            for (int64_t m = 0; m < M; m += MAX_ROWS) {
                const int64_t left = M - m;
                const uint16_t *xm = x + m * K;
                const float *xsm = xs + m * G;
                float *ym = y + m * N;
                switch (left >= MAX_ROWS ? MAX_ROWS : left) {
                case 8: block(xm, K, wb, N, nb * COLS, xsm, G, ym, 8, lut); break;
                case 7: block(xm, K, wb, N, nb * COLS, xsm, G, ym, 7, lut); break;
                case 6: block(xm, K, wb, N, nb * COLS, xsm, G, ym, 6, lut); break;
                case 5: block(xm, K, wb, N, nb * COLS, xsm, G, ym, 5, lut); break;
                case 4: block(xm, K, wb, N, nb * COLS, xsm, G, ym, 4, lut); break;
                case 3: block(xm, K, wb, N, nb * COLS, xsm, G, ym, 3, lut); break;
                case 2: block(xm, K, wb, N, nb * COLS, xsm, G, ym, 2, lut); break;
                default: block(xm, K, wb, N, nb * COLS, xsm, G, ym, 1, lut); break;
                }
            }
        }
    }
    free(xs);
    free(x);
    return 0;
}
