/* The small row-wise steps between a layer's matmuls, float32, one call each instead of the
 * 5-14 torch ops (each a few microseconds of dispatch) they took: at batch 1 those ops, not
 * the arithmetic, were a third of a CPU decode step. Plain C that the compiler vectorizes,
 * and AVX2 for SwiGLU's exponential and the top-k scan: built into every native build.
 * Rows go to `threads` workers once a call has PARALLEL_WORK values (SwiGLU at batch 16: 10 us
 * instead of 14); smaller calls stay on the caller's thread, where waking the workers costs
 * more than the work (RMSNorm of 16 x 576: 4.5 us instead of 4.2). Each row's result depends
 * on that row alone.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#define LANES 16
#define PARALLEL_WORK 16384

/* x += delta (when delta is given), then h = w * (x / sqrt(mean(x^2) + eps)), per row of D. */
int sy_add_rmsnorm(float *x, const float *delta, const float *w, float eps, float *h, int64_t M, int64_t D,
                   int threads)
{
    if (D % LANES) return 1;
    #pragma omp parallel for if (M * D >= PARALLEL_WORK && threads > 1) num_threads(threads)
    for (int64_t m = 0; m < M; m++) {
        float *xr = x + m * D, *hr = h + m * D;
        if (delta)
            for (int64_t d = 0; d < D; d++) xr[d] += delta[m * D + d];
        float part[LANES] = {0};  /* lane-wise partial sums: vectorizes without reassociation */
        for (int64_t d = 0; d < D; d += LANES)
            for (int j = 0; j < LANES; j++) part[j] += xr[d + j] * xr[d + j];
        float ss = 0.0f;
        for (int j = 0; j < LANES; j++) ss += part[j];
        const float r = 1.0f / sqrtf(ss / (float)D + eps);
        for (int64_t d = 0; d < D; d++) hr[d] = w[d] * (xr[d] * r);
    }
    return 0;
}

/* e^x for 8 lanes, |relative error| ~ 2e-7 (AVX2, which both builds have). */
static inline __m256 exp8(__m256 x)
{
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_sub_ps(x, _mm256_mul_ps(n, _mm256_set1_ps(0.693145751953125f)));
    r = _mm256_sub_ps(r, _mm256_mul_ps(n, _mm256_set1_ps(1.428606765330187e-06f)));
    static const float c[8] = {1.0f / 5040, 1.0f / 720, 1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f};
    __m256 p = _mm256_set1_ps(c[0]);
    for (int i = 1; i < 8; i++) p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(c[i]));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/* out[m] = silu(gu[m, :I]) * gu[m, I:], the SwiGLU between gate/up and down. */
int sy_silu_mul(const float *gu, float *out, int64_t M, int64_t I, int threads)
{
    if (I % 8) return 1;
    const __m256 one = _mm256_set1_ps(1.0f);
    #pragma omp parallel for if (M * I >= PARALLEL_WORK && threads > 1) num_threads(threads)
    for (int64_t m = 0; m < M; m++) {
        const float *g = gu + m * 2 * I, *u = g + I;
        float *o = out + m * I;
        for (int64_t i = 0; i < I; i += 8) {
            const __m256 gv = _mm256_loadu_ps(g + i);
            const __m256 sig = _mm256_div_ps(gv, _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), gv))));
            _mm256_storeu_ps(o + i, _mm256_mul_ps(sig, _mm256_loadu_ps(u + i)));
        }
    }
    return 0;
}

/* Rotary embedding in place on the first `heads` heads (queries, then keys) of each row of
 * qkv, rows `stride` floats apart, at each row's position: x * cos + rotate_half(x) * sin. */
int sy_rope(float *qkv, int64_t M, int64_t stride, int64_t heads, int64_t D, const float *cos_t,
            const float *sin_t, const int64_t *pos, int64_t max_len, int threads)
{
    const int64_t half = D / 2;
    for (int64_t m = 0; m < M; m++)
        if (pos[m] < 0 || pos[m] >= max_len) return 2;
    #pragma omp parallel for if (M * heads * D >= PARALLEL_WORK && threads > 1) num_threads(threads)
    for (int64_t m = 0; m < M; m++) {
        const float *c = cos_t + pos[m] * D, *s = sin_t + pos[m] * D;
        for (int64_t h = 0; h < heads; h++) {
            float *x = qkv + m * stride + h * D;
            for (int64_t d = 0; d < half; d++) {
                const float a = x[d], b = x[d + half];
                x[d] = a * c[d] - b * s[d];
                x[d + half] = b * c[d + half] + a * s[d + half];
            }
        }
    }
    return 0;
}

/* The k largest of each row of x [M, N], as indices in descending order of value, ties to the
 * lower index (torch's argmax for k = 1). For the logits: torch's topk and argmax took
 * 0.7-1.5 ms for 16 rows of 49,152; one pass that compares 8 values at a time with the k-th
 * best so far and rarely inserts takes a few microseconds a row. NaN is never chosen. */
int sy_topk(const float *x, int64_t M, int64_t N, int k, int64_t *idx, int threads)
{
    if (k < 1 || k > 64 || N < k) return 1;
    int short_rows = 0;
    #pragma omp parallel for if (M > 1 && threads > 1) num_threads(threads)
    for (int64_t m = 0; m < M; m++) {
        const float *row = x + m * N;
        int64_t *at = idx + m * k;
        float best[64];
        float thr = -INFINITY;
        int n = 0;
        for (int64_t i = 0; i < N; i++) {
            if (n == k) {  /* skip ahead 8 at a time while no value beats the k-th best */
                const __m256 t = _mm256_set1_ps(thr);
                while (i + 8 <= N && !_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(row + i), t, _CMP_GT_OQ)))
                    i += 8;
                if (i >= N) break;
            }
            const float w = row[i];
            if (w != w || (n == k && !(w > thr))) continue;
            /* Insert after every kept value >= w: earlier indices win ties. */
            int j = n < k ? n++ : k - 1;
            for (; j > 0 && best[j - 1] < w; j--) {
                best[j] = best[j - 1];
                at[j] = at[j - 1];
            }
            best[j] = w;
            at[j] = i;
            if (n == k) thr = best[k - 1];
        }
        if (n < k) short_rows = 1;  /* fewer than k values that are not NaN */
    }
    return short_rows ? 2 : 0;
}

/* out[m, j] = W[idx[m, j]] . h[m] in float32, rows of D: the exact logits of each row's top
 * candidates (the LM head's int4 logits pick them). Gathering the rows into a tensor for a
 * batched matmul copied 1.2 MB at batch 16. */
int sy_gather_dot(const float *W, const float *h, const int64_t *idx, float *out, int64_t M, int64_t k, int64_t D,
                  int64_t rows, int threads)
{
    if (D % LANES) return 1;
    for (int64_t i = 0; i < M * k; i++)
        if (idx[i] < 0 || idx[i] >= rows) return 2;
    #pragma omp parallel for if (M * k * D >= PARALLEL_WORK * 8 && threads > 1) num_threads(threads)
    for (int64_t i = 0; i < M * k; i++) {
        const float *w = W + idx[i] * D, *x = h + (i / k) * D;
        float part[LANES] = {0};
        for (int64_t d = 0; d < D; d += LANES)
            for (int j = 0; j < LANES; j++) part[j] += w[d + j] * x[d + j];
        float acc = 0.0f;
        for (int j = 0; j < LANES; j++) acc += part[j];
        out[i] = acc;
    }
    return 0;
}
