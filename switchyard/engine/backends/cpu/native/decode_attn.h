/* What both builds of decode attention (decode_attn_avx2.c, decode_attn_avx512.c) share: the
 * limits, the argument checks (a bad block or position must never write outside the cache),
 * the paged cache's addressing and the write of the step's new key and value. The cache is
 * float32 or float16 (`kv_half`): at batch 16 a decode step reads ~60 MB of float32 keys and
 * values at 80 tokens, over half as much as the weights, so float16 halves the step's largest
 * cost after the matmuls.
 *
 * Paged layout: each layer's cache is [num_blocks, kv_heads, block_size, head_dim]; sequence b
 * keeps positions [j * block_size, (j + 1) * block_size) in block tables[b * width + j]. So one
 * (block, KV head) is block_size rows in a row, and a block size that is a multiple of 16 keeps
 * every run of 16 positions that the AVX-512 build scores together inside one block. */
#ifndef SWITCHYARD_DECODE_ATTN_H
#define SWITCHYARD_DECODE_ATTN_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define MAX_GROUP 16
#define MAX_DIM 256

/* 0, or 1 for a head shape or block size the kernels do not take, 2 for a position outside the
 * table or a block outside the cache. */
static inline int decode_attn_check(const int64_t *tables, int64_t width, const int64_t *pos, int64_t B, int64_t H,
                                    int64_t Hkv, int64_t D, int64_t num_blocks, int64_t bs)
{
    if (H % Hkv || H / Hkv > MAX_GROUP || D % 16 || D > MAX_DIM || bs < 16 || bs % 16) return 1;
    for (int64_t b = 0; b < B; b++) {
        if (pos[b] < 0 || pos[b] >= width * bs) return 2;
        for (int64_t j = 0; j <= pos[b] / bs; j++)
            if (tables[b * width + j] < 0 || tables[b * width + j] >= num_blocks) return 2;
    }
    return 0;
}

/* The longest context of the step's sequences. */
static inline int64_t decode_attn_longest(const int64_t *pos, int64_t B)
{
    int64_t longest = 0;
    for (int64_t b = 0; b < B; b++) longest = pos[b] + 1 > longest ? pos[b] + 1 : longest;
    return longest;
}

/* One (sequence b, KV head kh) task: its G query heads, its L cached positions, where its G
 * output heads go, and how to find position l's key and value row. */
struct attn_task {
    int64_t G, L, bs;
    const float *q;
    const char *K, *V;      /* the caches' first bytes */
    const int64_t *table;   /* the sequence's blocks */
    size_t head, block;     /* bytes: the head's rows inside a block; one block of all heads */
    size_t row;             /* bytes of one row */
    float *out;
};

/* Bytes from the cache's start to the first row of block j of the task's sequence and head. */
static inline size_t attn_block(const struct attn_task *a, int64_t j)
{
    return (size_t)a->table[j] * a->block + a->head;
}

/* Writes sequence b's new key and value for KV head kh at its position, as float32 or, when
 * `half`, float16 (rounded to nearest, F16C: every build has it), and returns the task's view.
 * Each sequence's qkv row holds its H query heads, then Hkv keys, then Hkv values, as the
 * projection writes it. */
static inline struct attn_task decode_attn_begin(const float *qkv, void *kc, void *vc, const int64_t *tables,
                                                 int64_t width, const int64_t *pos, int64_t b, int64_t kh, int64_t H,
                                                 int64_t Hkv, int64_t D, int64_t bs, float *out, int half)
{
    const size_t esize = half ? 2 : 4;
    const int64_t G = H / Hkv;
    const struct attn_task a = {G, pos[b] + 1, bs, qkv + b * (H + 2 * Hkv) * D + kh * G * D, (const char *)kc,
                                (const char *)vc, tables + b * width, (size_t)kh * bs * D * esize,
                                (size_t)Hkv * bs * D * esize, (size_t)D * esize, out + (b * H + kh * G) * D};
    const size_t at = attn_block(&a, pos[b] / bs) + (size_t)(pos[b] % bs) * a.row;
    const float *row = qkv + b * (H + 2 * Hkv) * D, *k = row + (H + kh) * D, *v = k + Hkv * D;
    if (!half) {
        memcpy((char *)kc + at, k, sizeof(float) * D);
        memcpy((char *)vc + at, v, sizeof(float) * D);
    } else {
        for (int64_t d = 0; d < D; d += 8) {
            _mm_storeu_si128((__m128i *)((char *)kc + at) + d / 8, _mm256_cvtps_ph(_mm256_loadu_ps(k + d), _MM_FROUND_TO_NEAREST_INT));
            _mm_storeu_si128((__m128i *)((char *)vc + at) + d / 8, _mm256_cvtps_ph(_mm256_loadu_ps(v + d), _MM_FROUND_TO_NEAREST_INT));
        }
    }
    return a;
}

#endif
