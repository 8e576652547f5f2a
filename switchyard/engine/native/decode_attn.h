/* What both builds of decode attention (decode_attn_avx2.c, decode_attn_avx512.c) share: the
 * limits, the argument checks (a bad slot or position must never write outside the cache)
 * and the write of the step's new key and value. */
#ifndef SWITCHYARD_DECODE_ATTN_H
#define SWITCHYARD_DECODE_ATTN_H

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

/* Writes sequence b's new key and value for KV head kh at its position; returns the offset of
 * that (slot, head)'s rows in the cache, [slots, kv_heads, max_len, head_dim]. */
static inline size_t decode_attn_write_kv(const float *k_new, const float *v_new, float *kc, float *vc,
                                          const int64_t *slots, const int64_t *pos, int64_t b, int64_t kh,
                                          int64_t Hkv, int64_t D, int64_t max_len)
{
    const size_t base = ((size_t)slots[b] * Hkv + kh) * max_len * D;
    memcpy(kc + base + pos[b] * D, k_new + (b * Hkv + kh) * D, sizeof(float) * D);
    memcpy(vc + base + pos[b] * D, v_new + (b * Hkv + kh) * D, sizeof(float) * D);
    return base;
}

#endif
