/* One decode step of attention for a batch of sequences, float32, grouped-query heads.
 * AVX2 + FMA build of decode_attn_avx512.c: the same interface, checks and one-pass scheme
 * (each cached key and value row is read once for the whole group of query heads).
 * Cache layout: paged, [num_blocks, kv_heads, block_size, head_dim] (see decode_attn.h).
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "decode_attn.h"

/* e^x for x <= 0 (softmax after subtracting the max): 2^n * p(r), |error| ~ 1 ulp. */
static inline __m256 exp256(__m256 x)
{
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606765330187e-06f), r);
    __m256 p = _mm256_set1_ps(1.0f / 5040);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    /* 2^n for n in [-126, 0]: the exponent field built directly. */
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

static inline float hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

static inline float hmax(__m256 v)
{
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
}

/* Lanes below `left` (of 8) on. */
static inline __m256i mask8(int64_t left)
{
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(left < 8 ? left : 8)), idx);
}

/* 8 cached values from element i on, as float32. `half` is a constant where this is inlined. */
static inline __m256 ld8(const void *base, int64_t i, const int half)
{
    return half ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)base + i)))
                : _mm256_loadu_ps((const float *)base + i);
}

static inline __attribute__((always_inline)) void task(
    const float *qkv, void *kc, void *vc, const int64_t *tables, int64_t width, const int64_t *pos, int64_t b,
    int64_t kh, int64_t H, int64_t Hkv, int64_t D, int64_t bs, float scale, float *out, float *sc, const int half)
{
    const struct attn_task a = decode_attn_begin(qkv, kc, vc, tables, width, pos, b, kh, H, Hkv, D, bs, out, half);
    const int64_t G = a.G, L = a.L;
    const int64_t Lp = (L + 7) & ~7;
    const float *qg = a.q;
    for (int64_t l0 = 0; l0 < L; l0 += bs) {  /* one block's rows at a time */
        const char *K = a.K + attn_block(&a, l0 / bs);
        const int64_t n = L - l0 >= bs ? bs : L - l0;
        for (int64_t l = 0; l < n; l++) {
            for (int64_t j = 0; j < G; j++) {
                __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
                for (int64_t d = 0; d < D; d += 16) {
                    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(qg + j * D + d), ld8(K, l * D + d, half), a0);
                    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(qg + j * D + d + 8), ld8(K, l * D + d + 8, half), a1);
                }
                sc[j * Lp + l0 + l] = hsum(_mm256_add_ps(a0, a1)) * scale;
            }
        }
    }
    float inv[MAX_GROUP];
    for (int64_t j = 0; j < G; j++) {
        float *s = sc + j * Lp;
        __m256 mx = _mm256_set1_ps(-INFINITY);
        for (int64_t l = 0; l < L; l += 8) {
            const __m256 m = _mm256_castsi256_ps(mask8(L - l));
            mx = _mm256_max_ps(mx, _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), _mm256_loadu_ps(s + l), m));
        }
        const __m256 mv = _mm256_set1_ps(hmax(mx));
        __m256 sum = _mm256_setzero_ps();
        for (int64_t l = 0; l < L; l += 8) {
            const __m256i m = mask8(L - l);
            /* Past L the padded tail (inside the allocation) is read, then masked out. */
            __m256 e = _mm256_and_ps(exp256(_mm256_sub_ps(_mm256_loadu_ps(s + l), mv)), _mm256_castsi256_ps(m));
            _mm256_maskstore_ps(s + l, m, e);
            sum = _mm256_add_ps(sum, e);
        }
        inv[j] = 1.0f / hsum(sum);
    }
    float o[MAX_GROUP * MAX_DIM];
    memset(o, 0, sizeof(float) * G * D);
    for (int64_t l0 = 0; l0 < L; l0 += bs) {
        const char *V = a.V + attn_block(&a, l0 / bs);
        const int64_t n = L - l0 >= bs ? bs : L - l0;
        for (int64_t l = 0; l < n; l++) {
            for (int64_t j = 0; j < G; j++) {
                const __m256 p = _mm256_set1_ps(sc[j * Lp + l0 + l]);
                for (int64_t d = 0; d < D; d += 8)
                    _mm256_storeu_ps(o + j * D + d, _mm256_fmadd_ps(p, ld8(V, l * D + d, half), _mm256_loadu_ps(o + j * D + d)));
            }
        }
    }
    float *og = a.out;
    for (int64_t j = 0; j < G; j++)
        for (int64_t d = 0; d < D; d++) og[j * D + d] = o[j * D + d] * inv[j];
}

int sy_decode_attn(const float *qkv, void *kc, void *vc, const int64_t *tables, int64_t width, const int64_t *pos,
                   int64_t B, int64_t H, int64_t Hkv, int64_t D, int64_t num_blocks, int64_t bs, float scale,
                   float *out, int threads, int kv_half)
{
    const int rc = decode_attn_check(tables, width, pos, B, H, Hkv, D, num_blocks, bs);
    if (rc) return rc;
    int failed = 0;
    const int64_t longest = decode_attn_longest(pos, B);
    #pragma omp parallel num_threads(threads)
    {
    float *sc = aligned_alloc(32, sizeof(float) * (H / Hkv) * ((longest + 7) & ~7));  /* once a thread */
    if (!sc) failed = 1;
    #pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < B * Hkv; t++) {
        if (!sc) continue;
        if (kv_half)
            task(qkv, kc, vc, tables, width, pos, t / Hkv, t % Hkv, H, Hkv, D, bs, scale, out, sc, 1);
        else
            task(qkv, kc, vc, tables, width, pos, t / Hkv, t % Hkv, H, Hkv, D, bs, scale, out, sc, 0);
    }
    free(sc);
    }
    return failed ? 3 : 0;
}
