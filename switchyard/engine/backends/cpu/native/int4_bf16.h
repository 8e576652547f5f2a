/* What the two bfloat16 builds of the int4 matmul (int4_avx512.c, int4_amx.c) share: the
 * table that turns a 4-bit code q into bfloat16 q - 8, and the rounding of x to bfloat16 with
 * each group's sum of the rounded values (the offset term z * sum(x) must see the x the dot
 * products see). */
#ifndef SWITCHYARD_INT4_BF16_H
#define SWITCHYARD_INT4_BF16_H

#include <immintrin.h>
#include <stdint.h>

#define COLS 16   /* output columns per packed block */
#define GROUP 32  /* k per scale and offset */

/* bfloat16 bit patterns of q - 8 for q = 0..15, for vpermw (which reads the low 5 bits). */
static inline __m512i int4_bf16_lut(void)
{
    uint16_t table[32];
    for (int q = 0; q < 32; q++) {
        union { float f; uint32_t u; } c = {.f = (float)((q & 15) - 8)};
        table[q] = (uint16_t)(c.u >> 16);
    }
    return _mm512_loadu_si512(table);
}

/* bfloat16 bit patterns of q itself for q = 0..15 (the records' scheme: W = q * s + m). */
static inline __m512i int4_bf16_lut_unsigned(void)
{
    uint16_t table[32];
    for (int q = 0; q < 32; q++) {
        union { float f; uint32_t u; } c = {.f = (float)(q & 15)};
        table[q] = (uint16_t)(c.u >> 16);
    }
    return _mm512_loadu_si512(table);
}

/* x[M, K] (float32) into bfloat16 x and xs[M, G], each group's sum of its rounded values.
 * Called inside a parallel region: the rows' groups are shared among its threads. */
static inline void int4_round_x(const float *xf, int64_t M, int64_t K, uint16_t *x, float *xs)
{
    const int64_t G = K / GROUP;
    #pragma omp for schedule(static)
    for (int64_t i = 0; i < M * G; i++) {
        const int64_t at = (i / G) * K + (i % G) * GROUP;
        for (int j = 0; j < GROUP; j += 16)
            _mm256_storeu_si256((__m256i *)(x + at + j), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(xf + at + j)));
        float acc = 0.0f;
        for (int j = 0; j < GROUP; j++) {
            union { uint32_t u; float f; } c = {.u = (uint32_t)x[at + j] << 16};
            acc += c.f;
        }
        xs[i] = acc;
    }
}

#endif
