/* A decoder layer's work around its attention, in two calls instead of ~10 torch ops and
 * ctypes calls: at batch 1 the Python and dispatch between the kernels, not the kernels,
 * were about a third of a CPU decode step.
 *
 *   sy_layer_in:  x += delta; h = RMSNorm(x); qkv = h @ Wqkv^T (+ bias); RoPE on q and k
 *   (attention, its own call: it reads and writes the KV cache)
 *   sy_layer_out: x += attn @ Wo^T; h = RMSNorm(x); delta = down(silu(gate) * up)
 *
 * The next layer's sy_layer_in adds delta, as the unfused path fuses the residual add with
 * the next norm. Each step is the kernel the unfused path calls, in the same order, on the
 * same values: results are bit-identical to it, and rows stay independent of the batch.
 * Tensor parallelism needs an all-reduce after Wo and down, so these serve one rank alone.
 */
#include <stdint.h>

int sy_int4_mm(const float *x, const uint8_t *w, const float *s, const float *z, float *y, int64_t M, int64_t N,
               int64_t K, int threads);
int sy_add_rmsnorm(float *x, const float *delta, const float *w, float eps, float *h, int64_t M, int64_t D,
                   int threads);
int sy_silu_mul(const float *gu, float *out, int64_t M, int64_t I, int threads);
int sy_rope(float *qkv, int64_t M, int64_t stride, int64_t heads, int64_t D, const float *cos_t, const float *sin_t,
            const int64_t *pos, int64_t max_len, int threads);

/* One int4 projection's packed codes, scales and offsets (linear.Int4's layout). */
struct int4_weight {
    const uint8_t *w;
    const float *s, *z;
    int64_t n, k;
};

/* Return codes: 0 ok; 1 a shape the kernels do not take; 2 a position outside the RoPE table;
 * 3 out of memory (the int4 kernels' scratch). */
static int mm_code(int rc)
{
    return rc == 2 ? 3 : rc;
}

int sy_layer_in(float *x, const float *delta, const float *ln, float eps, const struct int4_weight *qkv_w,
                const float *bias, float *h, float *qkv, int64_t M, int64_t rope_heads, int64_t head_dim,
                const float *cos_t, const float *sin_t, const int64_t *pos, int64_t max_len, int threads)
{
    const int64_t D = qkv_w->k, N = qkv_w->n;
    int rc = sy_add_rmsnorm(x, delta, ln, eps, h, M, D, threads);
    if (rc) return rc;
    if ((rc = mm_code(sy_int4_mm(h, qkv_w->w, qkv_w->s, qkv_w->z, qkv, M, N, D, threads)))) return rc;
    if (bias)
        for (int64_t m = 0; m < M; m++)
            for (int64_t n = 0; n < N; n++) qkv[m * N + n] += bias[n];
    return sy_rope(qkv, M, N, rope_heads, head_dim, cos_t, sin_t, pos, max_len, threads);
}

int sy_layer_out(const float *attn, float *x, const float *ln, float eps, const struct int4_weight *o_w,
                 const struct int4_weight *gate_up_w, const struct int4_weight *down_w, float *t, float *h,
                 float *gu, float *act, float *delta, int64_t M, int threads)
{
    const int64_t D = o_w->n, I = down_w->k;
    if (gate_up_w->n != 2 * I || gate_up_w->k != D || down_w->n != D) return 1;
    int rc;
    if ((rc = mm_code(sy_int4_mm(attn, o_w->w, o_w->s, o_w->z, t, M, D, o_w->k, threads)))) return rc;
    if ((rc = sy_add_rmsnorm(x, t, ln, eps, h, M, D, threads))) return rc;
    if ((rc = mm_code(sy_int4_mm(h, gate_up_w->w, gate_up_w->s, gate_up_w->z, gu, M, 2 * I, D, threads)))) return rc;
    if ((rc = sy_silu_mul(gu, act, M, I, threads))) return rc;
    return mm_code(sy_int4_mm(act, down_w->w, down_w->s, down_w->z, delta, M, D, I, threads));
}
