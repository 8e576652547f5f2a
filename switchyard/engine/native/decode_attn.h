/* What both builds of decode attention (decode_attn_avx2.c, decode_attn_avx512.c) share: the
 * limits, the argument checks (a bad slot or position must never write outside the cache)
 * and the write of the step's new key and value. The cache is float32 or float16 (`kv_half`):
 * at batch 16 a decode step reads ~60 MB of float32 keys and values at 80 tokens, over half as
 * much as the weights, so float16 halves the step's largest cost after the matmuls. */
#ifndef SWITCHYARD_DECODE_ATTN_H
#define SWITCHYARD_DECODE_ATTN_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define MAX_GROUP 16
#define MAX_DIM 256

/* 0, or 1 for a head shape the kernels do not take, 2 for a slot or position outside the cache. */
static inline int decode_attn_check(const int64_t *slots, const int64_t *pos, int64_t B, int64_t H, int64_t Hkv,
                                    int64_t D, int64_t max_slots, int64_t max_len)
{
    if (H % Hkv || H / Hkv > MAX_GROUP || D % 16 || D > MAX_DIM) return 1;
    for (int64_t b = 0; b < B; b++)
        if (pos[b] < 0 || pos[b] >= max_len || slots[b] < 0 || slots[b] >= max_slots) return 2;
    return 0;
}

/* Offset in elements of (slot, KV head)'s rows in the cache, [slots, kv_heads, max_len, head_dim]. */
static inline size_t decode_attn_rows(int64_t slot, int64_t kh, int64_t Hkv, int64_t D, int64_t max_len)
{
    return ((size_t)slot * Hkv + kh) * max_len * D;
}

/* The longest context of the step's sequences. */
static inline int64_t decode_attn_longest(const int64_t *pos, int64_t B)
{
    int64_t longest = 0;
    for (int64_t b = 0; b < B; b++) longest = pos[b] + 1 > longest ? pos[b] + 1 : longest;
    return longest;
}

/* One (sequence b, KV head kh) task: its G query heads, its L cached rows of keys and values,
 * where its G output heads go. */
struct attn_task {
    int64_t G, L;
    const float *q;
    const char *K, *V;
    float *out;
};

/* Writes sequence b's new key and value for KV head kh at its position, as float32 or, when
 * `half`, float16 (rounded to nearest, F16C: every build has it), and returns the task's view.
 * Each sequence's qkv row holds its H query heads, then Hkv keys, then Hkv values, as the
 * projection writes it. */
static inline struct attn_task decode_attn_begin(const float *qkv, void *kc, void *vc, const int64_t *slots,
                                                 const int64_t *pos, int64_t b, int64_t kh, int64_t H, int64_t Hkv,
                                                 int64_t D, int64_t max_len, float *out, int half)
{
    const size_t base = decode_attn_rows(slots[b], kh, Hkv, D, max_len), at = base + pos[b] * D;
    const size_t esize = half ? 2 : 4;
    const float *row = qkv + b * (H + 2 * Hkv) * D, *k = row + (H + kh) * D, *v = k + Hkv * D;
    if (!half) {
        memcpy((float *)kc + at, k, sizeof(float) * D);
        memcpy((float *)vc + at, v, sizeof(float) * D);
    } else {
        for (int64_t d = 0; d < D; d += 8) {
            _mm_storeu_si128((__m128i *)((uint16_t *)kc + at + d), _mm256_cvtps_ph(_mm256_loadu_ps(k + d), _MM_FROUND_TO_NEAREST_INT));
            _mm_storeu_si128((__m128i *)((uint16_t *)vc + at + d), _mm256_cvtps_ph(_mm256_loadu_ps(v + d), _MM_FROUND_TO_NEAREST_INT));
        }
    }
    const int64_t G = H / Hkv;
    return (struct attn_task){G, pos[b] + 1, row + kh * G * D, (const char *)kc + base * esize,
                              (const char *)vc + base * esize, out + (b * H + kh * G) * D};
}

#endif
