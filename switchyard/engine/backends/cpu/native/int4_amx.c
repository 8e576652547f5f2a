/* y[M,N] = x[M,K] @ W[N,K]^T with W in 4-bit groups of 32 along K: W = (q - 8) * s + z.
 * AMX-BF16 (Intel Sapphire Rapids and later): the products on tile matrix multiplies.
 *
 * Same numbers as int4_avx512.c's scheme: x is rounded to bfloat16 once; q - 8 is exact in
 * bfloat16, so each product is exact; one tile multiply gives a group's 32-k dot product for up
 * to 16 rows x 16 columns in float32, and its scale and offset are applied in float32:
 * y += s * dot + z * sum(x over the group). Each row's sequence of operations does not depend
 * on how many rows share its tile, so a row computed alone is bit-identical to the same row
 * computed in a batch, whatever M and the thread count are.
 *
 * Why tiles: at 16 rows the AVX512-BF16 kernel spends ~16 dot-product instructions per 32
 * weights; a tile multiply does a group x 16 columns x 16 rows in one, so a batch-16 decode
 * step stops being bound by multiply-adds.
 *
 * Same packed layout as the other builds: per block of 16 output columns, per group, per t in
 * 0..7: 32 bytes; byte 2i+e holds column i's code for k = 4t+e (low nibble) and k = 4t+2+e
 * (high nibble). Widened to 16 bits, the low nibbles of t are the tile row of k-pair 2t in the
 * VNNI order AMX reads (column i's pair in 32-bit lane i) and the high nibbles k-pair 2t+1.
 */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "int4_bf16.h"

#define TILE_ROWS 16
#define PREFETCH 2                 /* groups ahead */
#define ARCH_REQ_XCOMP_PERM 0x1023 /* Linux: ask for the tile state (asm/prctl.h) */
#define XFEATURE_XTILEDATA 18

/* Tiles: two of each (C accumulator, A rows of x, B weights), alternating between groups, so
 * a tile is rewritten only after the instructions two items back are done with it. Macros:
 * the intrinsics paste the number into the register name. */
#define C0 0
#define A0 1
#define B0 2
#define C1 3
#define A1 4
#define B1 5

struct tile_config {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

/* The kernel needs the process to have asked Linux for the AMX tile state once. 0 when usable. */
int sy_amx_init(void)
{
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) ? 1 : 0;
}

static void configure(int rows)
{
    struct tile_config c = {.palette = 1};
    for (int t = 0; t < 6; t++) {
        c.colsb[t] = 64;
        c.rows[t] = (t == B0 || t == B1) ? GROUP / 2 : rows;
    }
    _tile_loadconfig(&c);
}

/* Group g's codes for one block into a tile of bfloat16 q - 8, 16 k-pairs x 16 columns. */
static inline __attribute__((always_inline)) void dequant(const uint8_t *wg, uint16_t *tile, __m512i lut)
{
    const __m512i low = _mm512_set1_epi16(0xF);
    for (int t = 0; t < 8; t++) {
        __m512i wide = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(wg + t * 32)));
        _mm512_store_si512(tile + (2 * t) * 32, _mm512_permutexvar_epi16(_mm512_and_si512(wide, low), lut));
        _mm512_store_si512(tile + (2 * t + 1) * 32, _mm512_permutexvar_epi16(_mm512_srli_epi16(wide, 4), lut));
    }
}

/* Rows m..m+R of column blocks nb_lo..nb_hi, all groups, as one software pipeline over the
 * (block, group) items: item i's weights are dequantized at step i, multiplied on tiles at
 * step i + LAG and its dot products applied at step i + 2 LAG, so a tile load never waits on
 * stores just issued, nor vector loads on a tile store. Measured on a 2-core Xeon (model 207):
 * ~56 ns an item at 16 rows and ~25 ns at 1 row, whatever the lag (1-4) and the stages' order;
 * the tile unit runs its instructions one after another, and the stores of the dequantized
 * weights, the tile store and its read-back take ~2/3 of that. acc stays in registers: R is
 * a constant. */
#define LAG 2
#define RING 4  /* >= 2 LAG: a buffer is rewritten only after its reader ran */
/* Where a stage of the pipeline is: group g of the block whose first column is n0, stepped
 * along with the item number rather than divided out of it (no divisions in the loop). */
struct cursor { int64_t g, n0; };

static inline void step(struct cursor *c, int64_t G)
{
    if (++c->g == G) {
        c->g = 0;
        c->n0 += COLS;
    }
}

static inline __attribute__((always_inline)) void rows(
    const uint16_t *x, int64_t K, const uint8_t *w, const float *s, const float *z, int64_t N,
    const float *xs, int64_t G, float *y, int64_t nb_lo, int64_t nb_hi, const int R, __m512i lut,
    uint16_t (*btile)[GROUP / 2 * 32], float (*ctile)[TILE_ROWS * COLS])
{
    __m512 acc[TILE_ROWS];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    const int64_t lo = nb_lo * G, hi = nb_hi * G;
    const int64_t first_ahead = lo + PREFETCH < hi ? lo + PREFETCH : hi - 1;
    struct cursor ahead = {first_ahead % G, first_ahead / G * COLS}, tile = {0, 0}, apply = {0, nb_lo * COLS};
    for (int64_t i = lo; i < hi + 2 * LAG; i++) {
        if (i < hi) {
            /* Blocks hold their groups in a row, so item i's codes are at i * 256 bytes. */
            const char *next = (const char *)(w + (ahead.n0 / COLS * G + ahead.g) * (COLS * GROUP / 2));
            for (int l = 0; l < COLS * GROUP / 2; l += 64) _mm_prefetch(next + l, _MM_HINT_T0);
            _mm_prefetch((const char *)(s + ahead.g * N + ahead.n0), _MM_HINT_T0);
            _mm_prefetch((const char *)(z + ahead.g * N + ahead.n0), _MM_HINT_T0);
            if (i + PREFETCH < hi) step(&ahead, G);
            dequant(w + i * (COLS * GROUP / 2), btile[i % RING], lut);
        }
        const int64_t j = i - LAG;
        if (j >= lo && j < hi) {
            /* Tile numbers must be constants, hence the two spelled-out halves. */
            const uint16_t *xa = x + tile.g * GROUP;
            if (j & 1) {
                _tile_loadd(A1, xa, K * 2);
                _tile_loadd(B1, btile[j % RING], 64);
                _tile_zero(C1);
                _tile_dpbf16ps(C1, A1, B1);
                _tile_stored(C1, ctile[j % RING], 64);
            } else {
                _tile_loadd(A0, xa, K * 2);
                _tile_loadd(B0, btile[j % RING], 64);
                _tile_zero(C0);
                _tile_dpbf16ps(C0, A0, B0);
                _tile_stored(C0, ctile[j % RING], 64);
            }
            step(&tile, G);
        }
        const int64_t k = i - 2 * LAG;
        if (k >= lo) {
            const int64_t g = apply.g, n0 = apply.n0;
            const __m512 sv = _mm512_loadu_ps(s + g * N + n0), zv = _mm512_loadu_ps(z + g * N + n0);
            const float *c = ctile[k % RING];
            for (int r = 0; r < R; r++) {
                acc[r] = _mm512_fmadd_ps(_mm512_load_ps(c + r * COLS), sv, acc[r]);
                acc[r] = _mm512_fmadd_ps(zv, _mm512_set1_ps(xs[r * G + g]), acc[r]);
            }
            if (g == G - 1) {
                for (int r = 0; r < R; r++) {
                    _mm512_storeu_ps(y + r * N + n0, acc[r]);
                    acc[r] = _mm512_setzero_ps();
                }
            }
            step(&apply, G);
        }
    }
}

#define ROWS_CASE(n) case n: rows(xm, K, w, s, z, N, xsm, G, ym, nb_lo, nb_hi, n, lut, btile, ctile); break;

int sy_int4_mm(const float *xf, const uint8_t *w, const float *s, const float *z, float *y,
               int64_t M, int64_t N, int64_t K, int threads)
{
    if (N % COLS || K % GROUP) return 1;
    const int64_t G = K / GROUP, NB = N / COLS;
    float *xs = malloc(sizeof(float) * (size_t)(M * G));
    uint16_t *x = malloc(sizeof(uint16_t) * (size_t)(M * K));
    if (!xs || !x) { free(xs); free(x); return 2; }
    const __m512i lut = int4_bf16_lut();
    #pragma omp parallel num_threads(threads)
    {
        int4_round_x(xf, M, K, x, xs);
        /* Each thread takes a contiguous run of column blocks and sets its tiles up once per
         * 16 rows (tile shapes are per thread; a decode step has one row block). */
        _Alignas(64) uint16_t btile[RING][GROUP / 2 * 32];
        _Alignas(64) float ctile[RING][TILE_ROWS * COLS];
        const int nt = omp_get_num_threads(), me = omp_get_thread_num();
        const int64_t nb_lo = NB * me / nt, nb_hi = NB * (me + 1) / nt;
        for (int64_t m = 0; m < M && nb_lo < nb_hi; m += TILE_ROWS) {
            const int64_t left = M - m;
            const int R = left >= TILE_ROWS ? TILE_ROWS : (int)left;
            configure(R);
            const uint16_t *xm = x + m * K;
            const float *xsm = xs + m * G;
            float *ym = y + m * N;
            switch (R) {
            ROWS_CASE(16) ROWS_CASE(15) ROWS_CASE(14) ROWS_CASE(13) ROWS_CASE(12) ROWS_CASE(11)
            ROWS_CASE(10) ROWS_CASE(9) ROWS_CASE(8) ROWS_CASE(7) ROWS_CASE(6) ROWS_CASE(5)
            ROWS_CASE(4) ROWS_CASE(3) ROWS_CASE(2) default: rows(xm, K, w, s, z, N, xsm, G, ym, nb_lo, nb_hi, 1, lut, btile, ctile); break;
            }
        }
        _tile_release();
    }
    free(xs);
    free(x);
    return 0;
}
