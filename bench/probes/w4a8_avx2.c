/* Probe, not engine code: int8 activations (W4A8) on AVX2 against our float32 int4 kernel,
 * on SmolLM2's gate/up shape (3072 x 576), 2 threads, at 1, 4 and 16 rows; prints time and
 * max error relative to max|y| against a float64 reference.
 *
 *   gcc -O3 -mavx2 -mfma -fopenmp -o /tmp/w4a8 bench/probes/w4a8_avx2.c -lm && /tmp/w4a8
 *
 * Columns sit in the vector lanes: one int32 lane per column, 4 k per maddubs + madd, exact
 * int32 sums over a group of 32, scales applied once per (row, 8 columns, group). Weights are
 * unpacked to one byte per code here (twice the nibbles' bytes): a speed probe, L3-resident. */
#include "../../switchyard/engine/native/int4_avx2.c"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Layout: per (block of 8 columns, group): 8 steps x 32 bytes; step t, lane i (4 bytes) holds
 * column i's codes for k = 4t..4t+3. */
static inline __attribute__((always_inline)) void vtile(const uint8_t *w, const float *s, const float *zp,
    const int8_t *xq, const float *dx, const float *xs, int64_t K, int64_t G, float *y, int64_t N, int64_t nb0,
    int R, int C)
{
    __m256 acc[4][2];
    for (int r = 0; r < R; r++) for (int c = 0; c < C; c++) acc[r][c] = _mm256_setzero_ps();
    const __m256i ones = _mm256_set1_epi16(1);
    for (int64_t g = 0; g < G; g++) {
        __m256i dot[4][2];
        for (int r = 0; r < R; r++) for (int c = 0; c < C; c++) dot[r][c] = _mm256_setzero_si256();
        for (int t = 0; t < 8; t++) {
            __m256i wv[2];
            for (int c = 0; c < C; c++) wv[c] = _mm256_loadu_si256((const __m256i *)(w + (((nb0 + c) * G + g) * 8 + t) * 32));
            for (int r = 0; r < R; r++) {
                const __m256i xb = _mm256_set1_epi32(*(const int32_t *)(xq + r * K + g * 32 + 4 * t));
                for (int c = 0; c < C; c++)
                    dot[r][c] = _mm256_add_epi32(dot[r][c], _mm256_madd_epi16(_mm256_maddubs_epi16(wv[c], xb), ones));
            }
        }
        for (int c = 0; c < C; c++) {
            const __m256 sv = _mm256_loadu_ps(s + g * N + (nb0 + c) * 8), zv = _mm256_loadu_ps(zp + g * N + (nb0 + c) * 8);
            for (int r = 0; r < R; r++) {
                acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[r][c]), _mm256_mul_ps(sv, _mm256_set1_ps(dx[r * G + g])), acc[r][c]);
                acc[r][c] = _mm256_fmadd_ps(zv, _mm256_set1_ps(xs[r * G + g]), acc[r][c]);
            }
        }
    }
    for (int r = 0; r < R; r++) for (int c = 0; c < C; c++) _mm256_storeu_ps(y + r * N + (nb0 + c) * 8, acc[r][c]);
}

void w4a8v_mm(const uint8_t *w, const float *s, const float *zp, const int8_t *xq, const float *dx, const float *xs,
              float *y, int64_t M, int64_t N, int64_t K, int threads)
{
    const int64_t G = K / 32;
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t nb = 0; nb < N / 8; nb += 2)
        for (int64_t m = 0; m < M; m += 4) {
            int R = M - m < 4 ? (int)(M - m) : 4;
            switch (R) {
            case 4: vtile(w, s, zp, xq + m * K, dx + m * G, xs + m * G, K, G, y + m * N, N, nb, 4, 2); break;
            case 3: vtile(w, s, zp, xq + m * K, dx + m * G, xs + m * G, K, G, y + m * N, N, nb, 3, 2); break;
            case 2: vtile(w, s, zp, xq + m * K, dx + m * G, xs + m * G, K, G, y + m * N, N, nb, 2, 2); break;
            default: vtile(w, s, zp, xq + m * K, dx + m * G, xs + m * G, K, G, y + m * N, N, nb, 1, 2); break;
            }
        }
}

static float frand(void) { return (float)rand() / RAND_MAX * 2 - 1; }

int main(void)
{
    const int64_t N = 3072, K = 576, G = K / 32;
    float *W = malloc(sizeof(float) * N * K);
    uint8_t *q = malloc(N * K), *wv = malloc(N * K), *packed = malloc(N * K / 2);
    float *sT = malloc(sizeof(float) * N * G), *zT = malloc(sizeof(float) * N * G), *loT = malloc(sizeof(float) * N * G), *s = malloc(sizeof(float) * N * G), *lo_ = malloc(sizeof(float) * N * G);
    srand(1);
    for (int64_t i = 0; i < N * K; i++) W[i] = frand() * 0.05f;
    for (int64_t n = 0; n < N; n++) for (int64_t g = 0; g < G; g++) {
        float lo = 1e9, hi = -1e9;
        for (int j = 0; j < 32; j++) { float v = W[n * K + g * 32 + j]; lo = fminf(lo, v); hi = fmaxf(hi, v); }
        float sc = (hi - lo) / 15; if (sc < 1e-10f) sc = 1e-10f;
        s[n * G + g] = sc; lo_[n * G + g] = lo;
        sT[g * N + n] = sc; zT[g * N + n] = lo + 8 * sc; loT[g * N + n] = lo;
        for (int j = 0; j < 32; j++) { int v = (int)lrintf((W[n * K + g * 32 + j] - lo) / sc); q[n * K + g * 32 + j] = v < 0 ? 0 : v > 15 ? 15 : v; }
    }
    for (int64_t nb = 0; nb < N / 8; nb++) for (int64_t g = 0; g < G; g++) for (int t = 0; t < 8; t++) for (int i = 0; i < 8; i++) for (int j = 0; j < 4; j++)
        wv[((nb * G + g) * 8 + t) * 32 + 4 * i + j] = q[(nb * 8 + i) * K + g * 32 + 4 * t + j];
    for (int64_t nb = 0; nb < N / 16; nb++) for (int64_t g = 0; g < G; g++) for (int t = 0; t < 8; t++) for (int i = 0; i < 16; i++) for (int e = 0; e < 2; e++) {
        int64_t n = nb * 16 + i, k = g * 32 + 4 * t;
        packed[((nb * G + g) * 8 + t) * 32 + 2 * i + e] = q[n * K + k + e] | (q[n * K + k + 2 + e] << 4);
    }
    for (int M = 1; M <= 16; M *= 4) {
        float *x = malloc(sizeof(float) * M * K), *y1 = malloc(sizeof(float) * M * N), *y2 = malloc(sizeof(float) * M * N);
        int8_t *xq = malloc(M * K); float *dx = malloc(sizeof(float) * M * G), *xs = malloc(sizeof(float) * M * G);
        for (int64_t i = 0; i < M * K; i++) x[i] = frand();
        for (int64_t m = 0; m < M; m++) for (int64_t g = 0; g < G; g++) {
            float amax = 0; for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[m * K + g * 32 + j]));
            float d = amax / 127; if (d == 0) d = 1; int sum = 0;
            for (int j = 0; j < 32; j++) { int v = (int)lrintf(x[m * K + g * 32 + j] / d); xq[m * K + g * 32 + j] = v; sum += v; }
            dx[m * G + g] = d; xs[m * G + g] = d * sum;
        }
        double best1 = 1e9, best2 = 1e9;
        for (int rep = 0; rep < 30; rep++) {
            double t = omp_get_wtime(); sy_int4_mm(x, packed, sT, zT, y1, M, N, K, 2); t = omp_get_wtime() - t; if (t < best1) best1 = t;
            t = omp_get_wtime(); w4a8v_mm(wv, sT, loT, xq, dx, xs, y2, M, N, K, 2); t = omp_get_wtime() - t; if (t < best2) best2 = t;
        }
        double e1 = 0, e2 = 0, mx = 0;
        for (int64_t m = 0; m < M; m++) for (int64_t n = 0; n < N; n++) {
            double ref = 0; for (int64_t k = 0; k < K; k++) ref += (double)x[m * K + k] * (q[n * K + k] * s[n * G + k / 32] + lo_[n * G + k / 32]);
            e1 = fmax(e1, fabs(y1[m * N + n] - ref)); e2 = fmax(e2, fabs(y2[m * N + n] - ref)); mx = fmax(mx, fabs(ref));
        }
        printf("M=%2d: float32 kernel %.3f ms, W4A8 lanes=columns %.3f ms = %.2fx; max err / max|y|: f32 %.1e, w4a8 %.1e\n",
               M, best1 * 1e3, best2 * 1e3, best1 / best2, e1 / mx, e2 / mx);
    }
    return 0;
}
