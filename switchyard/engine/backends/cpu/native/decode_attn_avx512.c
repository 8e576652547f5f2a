/* One decode step of attention for a batch of sequences, float32, grouped-query heads.
 *
 * For each (sequence, KV head): write the new key and value at the sequence's position in
 * its block, then attend the group's query heads over positions 0..pos. One pass reads
 * each cached key and value row once for the whole group (torch's batched matmul reads
 * them per head, in a strided, cache-cold way that runs at a third of memory bandwidth).
 * Scores come 16 positions at a time (one vector of partial sums each, reduced together), and
 * the weighted sum of values keeps up to 4 heads x 64 dims of output in registers: a batch of
 * 16 sequences makes this the step's largest cost after the matmuls otherwise.
 * Cache layout: paged, [num_blocks, kv_heads, block_size, head_dim] (see decode_attn.h),
 * float32 or float16.
 */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "decode_attn.h"

/* e^x for x <= 0 (softmax after subtracting the max): 2^n * p(r), |error| ~ 1 ulp. */
static inline __m512 exp512(__m512 x)
{
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), r);
    __m512 p = _mm512_set1_ps(1.0f / 5040);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

/* Lane i of the result = the sum of v[i]'s 16 lanes: a transpose and add in 4 levels, ~3
 * instructions a sum instead of a ~10-instruction reduction each. */
static inline __m512 hsum16(const __m512 *v)
{
    __m512 t[8], u[4];
    for (int i = 0; i < 8; i++)  /* 128-bit lane k: [a0+a2, b0+b2, a1+a3, b1+b3] */
        t[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 4; i++) {  /* 128-bit lane k: lane k's sums of v[4i..4i+3], in order */
        const __m512d c = _mm512_castps_pd(t[2 * i]), d = _mm512_castps_pd(t[2 * i + 1]);
        u[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(c, d)), _mm512_castpd_ps(_mm512_unpackhi_pd(c, d)));
    }
    /* Add the four 128-bit lanes of each u[i] into 128-bit lane i of the result. */
    const __m512 w01 = _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], 0x88), _mm512_shuffle_f32x4(u[0], u[1], 0xDD));
    const __m512 w23 = _mm512_add_ps(_mm512_shuffle_f32x4(u[2], u[3], 0x88), _mm512_shuffle_f32x4(u[2], u[3], 0xDD));
    return _mm512_add_ps(_mm512_shuffle_f32x4(w01, w23, 0x88), _mm512_shuffle_f32x4(w01, w23, 0xDD));
}

/* 16 cached values from element i on, as float32. `half` is a constant where this is inlined. */
static inline __m512 ld16(const void *base, int64_t i, const int half)
{
    return half ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)base + i)))
                : _mm512_loadu_ps((const float *)base + i);
}

static inline __attribute__((always_inline)) void task(
    const float *qkv, void *kc, void *vc, const int64_t *tables, int64_t width, const int64_t *pos, int64_t b,
    int64_t kh, int64_t H, int64_t Hkv, int64_t D, int64_t bs, float scale, float *out, float *sc, const int half)
{
    const struct attn_task a = decode_attn_begin(qkv, kc, vc, tables, width, pos, b, kh, H, Hkv, D, bs, out, half);
    const int64_t G = a.G, L = a.L;
    const int64_t Lp = (L + 15) & ~15;
    const float *qg = a.q;
    const int64_t esize = half ? 2 : 4;
    for (int64_t l0 = 0; l0 < L; l0 += 16) {
        const int n = L - l0 >= 16 ? 16 : (int)(L - l0);  /* rows past L may lie past the block */
        /* 16 positions lie in one block (bs is a multiple of 16): one run of rows. */
        const char *K = a.K + attn_block(&a, l0 / bs) + (l0 % bs) * a.row;
        /* Fetch the next run of keys and this run of values while the scores run: each
         * (block, head) is a short stream, too short for the hardware prefetchers. */
        const int64_t ahead = L - (l0 + 16) >= 16 ? 16 : L - (l0 + 16);
        if (ahead > 0) {
            const char *K2 = a.K + attn_block(&a, (l0 + 16) / bs) + ((l0 + 16) % bs) * a.row;
            for (int64_t o = 0; o < ahead * D * esize; o += 64) _mm_prefetch(K2 + o, _MM_HINT_T0);
        }
        const char *V = a.V + attn_block(&a, l0 / bs) + (l0 % bs) * a.row;
        for (int64_t o = 0; o < n * D * esize; o += 64) _mm_prefetch(V + o, _MM_HINT_T1);
        for (int64_t j = 0; j < G; j++) {
            __m512 acc[16];
            for (int l = 0; l < 16; l++) acc[l] = _mm512_setzero_ps();
            for (int64_t d = 0; d < D; d += 16) {
                const __m512 qd = _mm512_loadu_ps(qg + j * D + d);
                for (int l = 0; l < 16; l++)
                    if (l < n) acc[l] = _mm512_fmadd_ps(qd, ld16(K, l * D + d, half), acc[l]);
            }
            _mm512_store_ps(sc + j * Lp + l0, _mm512_mul_ps(hsum16(acc), _mm512_set1_ps(scale)));
        }
    }
    float inv[MAX_GROUP];
    for (int64_t j = 0; j < G; j++) {
        float *s = sc + j * Lp;
        __m512 mx = _mm512_set1_ps(-INFINITY);
        for (int64_t l = 0; l < L; l += 16) {
            __mmask16 m = L - l >= 16 ? 0xFFFF : (__mmask16)((1u << (L - l)) - 1);
            mx = _mm512_mask_max_ps(mx, m, mx, _mm512_maskz_loadu_ps(m, s + l));
        }
        const __m512 mv = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
        __m512 sum = _mm512_setzero_ps();
        for (int64_t l = 0; l < L; l += 16) {
            __mmask16 m = L - l >= 16 ? 0xFFFF : (__mmask16)((1u << (L - l)) - 1);
            __m512 e = _mm512_maskz_mov_ps(m, exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, s + l), mv)));
            _mm512_mask_storeu_ps(s + l, m, e);
            sum = _mm512_add_ps(sum, e);
        }
        inv[j] = 1.0f / _mm512_reduce_add_ps(sum);
    }
    float *og = a.out;
    for (int64_t d0 = 0; d0 < D; d0 += 64) {
        const int nc = D - d0 >= 64 ? 4 : (int)((D - d0) / 16);
        for (int64_t j0 = 0; j0 < G; j0 += 4) {
            const int nj = G - j0 >= 4 ? 4 : (int)(G - j0);
            __m512 o[4][4];
            for (int j = 0; j < 4; j++)
                for (int c = 0; c < 4; c++) o[j][c] = _mm512_setzero_ps();
            for (int64_t l0 = 0; l0 < L; l0 += bs) {  /* one block's rows at a time */
                const char *V = a.V + attn_block(&a, l0 / bs);
                const int64_t n = L - l0 >= bs ? bs : L - l0;
                for (int64_t l = 0; l < n; l++) {
                    __m512 v[4] = {0};
                    for (int c = 0; c < 4; c++)
                        if (c < nc) v[c] = ld16(V, l * D + d0 + 16 * c, half);
                    for (int j = 0; j < 4; j++) {
                        if (j >= nj) break;
                        const __m512 p = _mm512_set1_ps(sc[(j0 + j) * Lp + l0 + l]);
                        for (int c = 0; c < 4; c++)
                            if (c < nc) o[j][c] = _mm512_fmadd_ps(p, v[c], o[j][c]);
                    }
                }
            }
            for (int j = 0; j < nj; j++)
                for (int c = 0; c < nc; c++)
                    _mm512_storeu_ps(og + (j0 + j) * D + d0 + 16 * c, _mm512_mul_ps(o[j][c], _mm512_set1_ps(inv[j0 + j])));
        }
    }
}

int sy_decode_attn(const float *qkv, void *kc, void *vc, const int64_t *tables, int64_t width, const int64_t *pos,
                   int64_t B, int64_t H, int64_t Hkv, int64_t D, int64_t num_blocks, int64_t bs, float scale,
                   float *out, int threads, int kv_half)
{
    const int rc = decode_attn_check(tables, width, pos, B, H, Hkv, D, num_blocks, bs);
    if (rc) return rc;
    int failed = 0;
    const int64_t longest = decode_attn_longest(pos, B);
    const int64_t esize = kv_half ? 2 : 4;
    /* Tasks dealt round-robin, so each thread knows its next one and fetches its first keys
     * ahead (13% faster at batch 16 than taking tasks as they come). */
    #pragma omp parallel num_threads(threads)
    {
    const int nt = omp_get_num_threads();
    /* Scores of one task's heads, allocated once a thread (once a task cost ~11% at batch 16). */
    float *sc = aligned_alloc(64, sizeof(float) * (H / Hkv) * ((longest + 15) & ~15));
    if (!sc) failed = 1;
    for (int64_t t = omp_get_thread_num(); sc && t < B * Hkv; t += nt) {
        const int64_t nx = t + nt;
        if (nx < B * Hkv) {  /* the next task's first rows: in its first block */
            const int64_t nb = nx / Hkv, nk = nx % Hkv;
            const char *K2 = (const char *)kc + ((size_t)tables[nb * width] * Hkv + nk) * bs * D * esize;
            const int64_t rows = pos[nb] + 1 < 32 ? pos[nb] + 1 : 32;
            const int64_t bytes = (rows < bs ? rows : bs) * D * esize;
            for (int64_t o = 0; o < bytes; o += 64) _mm_prefetch(K2 + o, _MM_HINT_T1);
        }
        if (kv_half)
            task(qkv, kc, vc, tables, width, pos, t / Hkv, t % Hkv, H, Hkv, D, bs, scale, out, sc, 1);
        else
            task(qkv, kc, vc, tables, width, pos, t / Hkv, t % Hkv, H, Hkv, D, bs, scale, out, sc, 0);
    }
    free(sc);
    }
    return failed ? 3 : 0;
}
