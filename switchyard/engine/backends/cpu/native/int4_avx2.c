/* y[M,N] = x[M,K] @ W[N,K]^T with W in 4-bit groups of 32 along K: W = q * s + m, the GGUF
 * Q4_1 scheme (scale and minimum per group in float16, as Q4_1 stores them).
 * AVX2 + FMA + F16C (x86 since Haswell / Zen 1): x, y and all arithmetic in float32.
 *
 * A panel of up to 64 columns is dequantized one group (32 k) at a time into a small float32
 * buffer that stays in L1, w = q * s + m in one FMA, once for all M rows; a register
 * micro-kernel (up to 6 rows x 16 columns, like an sgemm's) then accumulates w * x into y.
 * For every (row, column) the operations and their order are the same whatever M, the tile
 * shape and the thread count are, so a row computed alone is bit-identical to the same row
 * computed in a batch.
 *
 * Same packed layout as int4_avx512.c (one packing serves both): one 320-byte record per block
 * of 16 output columns and group, a block's groups one after another: the codes, per t in
 * 0..7 32 bytes (byte 2i+e: column i's code for k = 4t+e in the low nibble, k = 4t+2+e in the
 * high one), then the 16 scales, then the 16 minimums. `s` and `z` are unused (NULL).
 */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>

#define COLS 16
#define GROUP 32
#define PANEL 4                     /* blocks of 16 columns dequantized together */
#define WB_STRIDE (PANEL * COLS)    /* floats per k in the buffer */
#define PREFETCH 2                  /* groups ahead */
#define CODES (COLS * GROUP / 2)
#define RECORD (CODES + 4 * COLS)   /* codes, float16 scales, float16 minimums */

/* One group of nblk blocks into wb[k][column], float32. */
static void dequant(const uint8_t *w, int64_t G, int64_t nb0, int nblk, int64_t g, float *wb)
{
    /* For e = 0, 1: 32-bit lane i takes byte 2i+e of the 16 bytes (broadcast to both halves). */
    const __m256i pick0 = _mm256_setr_epi8(0, -1, -1, -1, 2, -1, -1, -1, 4, -1, -1, -1, 6, -1, -1, -1,
                                           8, -1, -1, -1, 10, -1, -1, -1, 12, -1, -1, -1, 14, -1, -1, -1);
    const __m256i pick1 = _mm256_add_epi8(pick0, _mm256_set1_epi32(1));
    const __m256i low = _mm256_set1_epi32(0xF);
    /* Weights stream from DRAM once a step, one record stream per block: fetch a few groups
     * ahead, or the hardware prefetchers leave a cold matrix at a third of the bandwidth. */
    const int64_t ahead = g + PREFETCH < G ? g + PREFETCH : G - 1;
    for (int b = 0; b < nblk; b++) {
        const char *rec = (const char *)(w + ((nb0 + b) * G + ahead) * RECORD);
        for (int l = 0; l < RECORD; l += 64) _mm_prefetch(rec + l, _MM_HINT_T0);
    }
    for (int b = 0; b < nblk; b++) {
        const uint8_t *rec = w + ((nb0 + b) * G + g) * RECORD;
        for (int h = 0; h < 2; h++) {
            const __m256 sv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(rec + CODES + h * 16)));
            const __m256 mv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(rec + CODES + 2 * COLS + h * 16)));
            const uint8_t *src = rec + h * 16;
            float *dst = wb + b * COLS + h * 8;
            for (int t = 0; t < 8; t++) {
                const __m256i bytes = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(src + t * 32)));
                const __m256i b0 = _mm256_shuffle_epi8(bytes, pick0), b1 = _mm256_shuffle_epi8(bytes, pick1);
                float *d = dst + 4 * t * WB_STRIDE;
                _mm256_store_ps(d, _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(b0, low)), sv, mv));
                _mm256_store_ps(d + WB_STRIDE, _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(b1, low)), sv, mv));
                _mm256_store_ps(d + 2 * WB_STRIDE, _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(b0, 4)), sv, mv));
                _mm256_store_ps(d + 3 * WB_STRIDE, _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(b1, 4)), sv, mv));
            }
        }
    }
}

/* y[r][c] (+)= sum over the group's 32 k of wb[k][c] * x[r][k], for R rows and C vectors of 8
 * columns, accumulators in registers: R*C + C + 1 <= 16 (R=1 reads w from memory instead). */
static inline __attribute__((always_inline)) void micro(const float *wb, const float *x, int64_t K, float *y,
                                                         int64_t N, int first, const int R, const int C)
{
    __m256 acc[12];
    _Pragma("GCC unroll 12")
    for (int i = 0; i < R * C; i++)
        acc[i] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(y + (i / C) * N + 8 * (i % C));
    _Pragma("GCC unroll 2")
    for (int k = 0; k < GROUP; k++) {
        const float *wk = wb + k * WB_STRIDE;
        if (R == 1) {
            const __m256 xv = _mm256_broadcast_ss(x + k);
            _Pragma("GCC unroll 8")
            for (int c = 0; c < C; c++) acc[c] = _mm256_fmadd_ps(_mm256_load_ps(wk + 8 * c), xv, acc[c]);
        } else {
            __m256 wv[4];
            _Pragma("GCC unroll 4")
            for (int c = 0; c < C; c++) wv[c] = _mm256_load_ps(wk + 8 * c);
            _Pragma("GCC unroll 6")
            for (int r = 0; r < R; r++) {
                const __m256 xv = _mm256_broadcast_ss(x + r * K + k);
                _Pragma("GCC unroll 4")
                for (int c = 0; c < C; c++) acc[r * C + c] = _mm256_fmadd_ps(wv[c], xv, acc[r * C + c]);
            }
        }
    }
    _Pragma("GCC unroll 12")
    for (int i = 0; i < R * C; i++) _mm256_storeu_ps(y + (i / C) * N + 8 * (i % C), acc[i]);
}

/* R rows (1..6) over the panel's nvec vectors of 8 columns, in micro-kernel tiles. */
static void rows(const float *wb, int nvec, const float *x, int64_t K, float *y, int64_t N, int first, int R)
{
    for (int c = 0; c < nvec;) {
        const int left = nvec - c;
        const float *w = wb + 8 * c;
        float *yc = y + 8 * c;
        switch (R) {
        case 1:
            if (left >= 8) { micro(w, x, K, yc, N, first, 1, 8); c += 8; }
            else { micro(w, x, K, yc, N, first, 1, 2); c += 2; }
            break;
        case 2:
            if (left >= 4) { micro(w, x, K, yc, N, first, 2, 4); c += 4; }
            else { micro(w, x, K, yc, N, first, 2, 2); c += 2; }
            break;
        case 3: micro(w, x, K, yc, N, first, 3, 2); c += 2; break;
        case 4: micro(w, x, K, yc, N, first, 4, 2); c += 2; break;
        case 5: micro(w, x, K, yc, N, first, 5, 2); c += 2; break;
        default: micro(w, x, K, yc, N, first, 6, 2); c += 2; break;
        }
    }
}

int sy_int4_mm(const float *x, const uint8_t *w, const float *s, const float *z, float *y,
               int64_t M, int64_t N, int64_t K, int threads)
{
    (void)s, (void)z;
    if (N % COLS || K % GROUP) return 1;
    const int64_t G = K / GROUP, NB = N / COLS;
    /* Each thread owns a contiguous range of column blocks, a panel of 4 blocks at a time. */
    #pragma omp parallel num_threads(threads)
    {
        float wb[GROUP * WB_STRIDE] __attribute__((aligned(32)));
        const int64_t T = omp_get_num_threads(), me = omp_get_thread_num();
        const int64_t lo = NB * me / T, hi = NB * (me + 1) / T;
        for (int64_t nb = lo; nb < hi; nb += PANEL) {
            const int nblk = (int)(hi - nb < PANEL ? hi - nb : PANEL);
            for (int64_t g = 0; g < G; g++) {
                dequant(w, G, nb, nblk, g, wb);
                for (int64_t m = 0; m < M; m += 6)
                    rows(wb, 2 * nblk, x + m * K + g * GROUP, K, y + m * N + nb * COLS, N, g == 0,
                         (int)(M - m < 6 ? M - m : 6));
            }
        }
    }
    return 0;
}
