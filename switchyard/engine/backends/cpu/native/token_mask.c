/* Grammar-constrained decoding: a step's token bitmask applied to the logits of the rows that
   have a grammar. Bit j of word w of a row's mask allows token 32 * w + j; every other token's
   logit becomes -inf, as do the tokens past the mask's end (a model vocabulary padded beyond
   the tokenizer's). A word of all ones, the common case in free text, is skipped whole. */

#include <math.h>
#include <stdint.h>

int sy_token_mask(float *logits, int64_t V, const int32_t *bitmask, int64_t W, const int64_t *rows,
                  int64_t n_rows)
{
    if (V <= 0 || W <= 0) return 1;
    for (int64_t r = 0; r < n_rows; r++) {
        float *x = logits + rows[r] * V;
        const uint32_t *m = (const uint32_t *)bitmask + rows[r] * W;
        const int64_t words = (V + 31) / 32 < W ? (V + 31) / 32 : W;
        for (int64_t w = 0; w < words; w++) {
            const uint32_t bits = m[w];
            if (bits == 0xffffffffu) continue;
            const int64_t base = w * 32;
            const int64_t n = V - base < 32 ? V - base : 32;
            for (int64_t j = 0; j < n; j++)
                if (!((bits >> j) & 1u)) x[base + j] = -INFINITY;
        }
        for (int64_t v = words * 32; v < V; v++) x[v] = -INFINITY;
    }
    return 0;
}
