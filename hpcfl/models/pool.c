/* 2 x 2 max pooling, and ReLU then 2 x 2 max pooling, bitwise torch's (see pool.py, pool_kernels.py).
 *
 * Plain C99: hpcfl compiles it once per machine with the C compiler it finds (hpcfl/native/cc.py)
 * and calls it through ctypes, which costs milliseconds at start-up where loading the same
 * loops through numba costs most of a second. Every array is a contiguous stack of P planes
 * of H x W (torch's NCHW with P = N * C); an output plane is H/2 x W/2.
 *
 * Where SSE2 is there (every x86-64), four float32 or two float64 windows go through the
 * vector unit at once; the scalar loops do the rest of a row, and all of it elsewhere. gcc
 * compiles the scalar scan to branches, which the data mispredicts: 6-20x slower than the
 * vector loop on LeNet-5's first layer.
 *
 * The loops do no arithmetic that rounds: comparisons, selects, and 0 + g (which turns a
 * -0.0 gradient into +0.0, as torch's scatter into a zeroed tensor does). So any
 * optimisation level gives the same bits, as long as the compiler keeps IEEE semantics
 * (no -ffast-math: `v != v` must stay a NaN test and `0 + g` must stay an addition). The
 * vector compares are IEEE too: `>` and `<=` are false with a NaN, `unord` is the NaN test.
 */
#include <stdint.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

/* 1 if this build has the vector loops, else 0 (hpcfl then prefers numba's compiled loops) */
int hpcfl_pool_simd(void)
{
#ifdef __SSE2__
    return 1;
#else
    return 0;
#endif
}

/* torch's relu: a negative becomes +0.0; -0.0 and NaNs of either sign pass unchanged */
#define RELU(v) ((v) < 0 ? 0 : (v))

/* torch's pooling scan of one window: row-major, a later element wins if greater or NaN,
 * so ties keep the first element and the last NaN wins; at = the winner's place (0 1 / 2 3) */
#define SCAN(v0, v1, v2, v3, best, at)                                                      \
    do {                                                                                    \
        best = v0; at = 0;                                                                  \
        if (v1 > best || v1 != v1) { best = v1; at = 1; }                                   \
        if (v2 > best || v2 != v2) { best = v2; at = 2; }                                   \
        if (v3 > best || v3 != v3) { best = v3; at = 3; }                                   \
    } while (0)

#ifdef __SSE2__
/* ---- float32: four windows a step ---- */
static inline __m128 wins_ps(__m128 v, __m128 best)
{
    return _mm_or_ps(_mm_cmpgt_ps(v, best), _mm_cmpunord_ps(v, v));
}
static inline __m128 sel_ps(__m128 t, __m128 a, __m128 b)
{
    return _mm_or_ps(_mm_and_ps(t, a), _mm_andnot_ps(t, b));
}
static inline __m128i sel_epi(__m128i t, __m128i a, __m128i b)
{
    return _mm_or_si128(_mm_and_si128(t, a), _mm_andnot_si128(t, b));
}
/* the windows at columns 2j .. 2j+7 of rows r0, r1: v[q] holds window element q of each */
static inline void load_ps(const float *r0, const float *r1, int relu, __m128 v[4])
{
    const __m128 a = _mm_loadu_ps(r0), b = _mm_loadu_ps(r0 + 4);
    const __m128 c = _mm_loadu_ps(r1), d = _mm_loadu_ps(r1 + 4);
    v[0] = _mm_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0));
    v[1] = _mm_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1));
    v[2] = _mm_shuffle_ps(c, d, _MM_SHUFFLE(2, 0, 2, 0));
    v[3] = _mm_shuffle_ps(c, d, _MM_SHUFFLE(3, 1, 3, 1));
    if (relu)
        for (int q = 0; q < 4; ++q)   /* negative -> all-zero bits (+0.0) */
            v[q] = _mm_andnot_ps(_mm_cmplt_ps(v[q], _mm_setzero_ps()), v[q]);
}
/* SCAN on four windows: the winners, and their places as int32 lanes */
static inline __m128 scan_ps(const __m128 v[4], __m128i *at)
{
    __m128 t = wins_ps(v[1], v[0]), best = sel_ps(t, v[1], v[0]);
    __m128i a = _mm_and_si128(_mm_castps_si128(t), _mm_set1_epi32(1));
    t = wins_ps(v[2], best);
    best = sel_ps(t, v[2], best);
    a = sel_epi(_mm_castps_si128(t), _mm_set1_epi32(2), a);
    t = wins_ps(v[3], best);
    best = sel_ps(t, v[3], best);
    *at = sel_epi(_mm_castps_si128(t), _mm_set1_epi32(3), a);
    return best;
}

/* ---- float64: two windows a step ---- */
static inline __m128d wins_pd(__m128d v, __m128d best)
{
    return _mm_or_pd(_mm_cmpgt_pd(v, best), _mm_cmpunord_pd(v, v));
}
static inline __m128d sel_pd(__m128d t, __m128d a, __m128d b)
{
    return _mm_or_pd(_mm_and_pd(t, a), _mm_andnot_pd(t, b));
}
static inline void load_pd(const double *r0, const double *r1, int relu, __m128d v[4])
{
    const __m128d a = _mm_loadu_pd(r0), b = _mm_loadu_pd(r0 + 2);
    const __m128d c = _mm_loadu_pd(r1), d = _mm_loadu_pd(r1 + 2);
    v[0] = _mm_unpacklo_pd(a, b);
    v[1] = _mm_unpackhi_pd(a, b);
    v[2] = _mm_unpacklo_pd(c, d);
    v[3] = _mm_unpackhi_pd(c, d);
    if (relu)
        for (int q = 0; q < 4; ++q)
            v[q] = _mm_andnot_pd(_mm_cmplt_pd(v[q], _mm_setzero_pd()), v[q]);
}
/* SCAN on two windows: the winners, and their places in the low 32 bits of each 64-bit lane */
static inline __m128d scan_pd(const __m128d v[4], __m128i *at)
{
    __m128d t = wins_pd(v[1], v[0]), best = sel_pd(t, v[1], v[0]);
    __m128i a = _mm_and_si128(_mm_castpd_si128(t), _mm_set1_epi32(1));
    t = wins_pd(v[2], best);
    best = sel_pd(t, v[2], best);
    a = sel_epi(_mm_castpd_si128(t), _mm_set1_epi32(2), a);
    t = wins_pd(v[3], best);
    best = sel_pd(t, v[3], best);
    *at = sel_epi(_mm_castpd_si128(t), _mm_set1_epi32(3), a);
    return best;
}
#endif

/* the first output column of row i that the scalar loop does: after the vector steps */
#ifdef __SSE2__
#define VEC_F32 4
#define VEC_F64 2
#else
#define VEC_F32 0
#define VEC_F64 0
#endif

/* out[p, i, j] = the max of x[p, 2i:2i+2, 2j:2j+2] (relu'd first when RELU_FIRST); for pooling
 * alone idx[p, i, j] = its flat int64 index in the H x W plane, after relu one byte pos[p, i, j]
 * = its place in the window. One macro for the four forms keeps them one loop. */
#define FORWARD(NAME, T, PLACE_T, RELU_FIRST, STEP, VECTOR_BODY)                            \
void NAME(const T *restrict x, T *restrict out, PLACE_T *restrict place,                    \
          int64_t P, int64_t H, int64_t W)                                                  \
{                                                                                           \
    const int64_t Ho = H / 2, Wo = W / 2;                                                   \
    for (int64_t p = 0; p < P; ++p) {                                                       \
        for (int64_t i = 0; i < Ho; ++i) {                                                  \
            const T *r0 = x + (p * H + 2 * i) * W, *r1 = r0 + W;                            \
            T *op = out + (p * Ho + i) * Wo;                                                \
            PLACE_T *kp = place + (p * Ho + i) * Wo;                                        \
            const int64_t base = 2 * i * W;   /* the window's first flat index, less 2j */  \
            int64_t j = 0;                                                                  \
            (void)base;                                                                     \
            if (STEP)                                                                       \
                for (; j + STEP <= Wo; j += STEP) { VECTOR_BODY }                           \
            for (; j < Wo; ++j) {                                                           \
                T v0 = r0[2 * j], v1 = r0[2 * j + 1], v2 = r1[2 * j], v3 = r1[2 * j + 1];   \
                if (RELU_FIRST) { v0 = RELU(v0); v1 = RELU(v1); v2 = RELU(v2); v3 = RELU(v3); } \
                T best; int at;                                                             \
                SCAN(v0, v1, v2, v3, best, at);                                             \
                op[j] = best;                                                               \
                kp[j] = RELU_FIRST ? (PLACE_T)at : (PLACE_T)(base + 2 * j + (at & 1) + (at >> 1) * W); \
            }                                                                               \
        }                                                                                   \
    }                                                                                       \
}

#ifdef __SSE2__
/* int32 lanes (0..3) -> four bytes */
#define STORE_BYTES_F32                                                                     \
    { const __m128i b16 = _mm_packs_epi32(at, at);                                          \
      const int32_t four = _mm_cvtsi128_si32(_mm_packs_epi16(b16, b16));                    \
      memcpy(kp + j, &four, 4); }
/* int32 lanes (0..3) -> flat int64 indices */
#define STORE_INDEX_F32                                                                     \
    { int32_t a4[4]; _mm_storeu_si128((__m128i *)a4, at);                                   \
      for (int l = 0; l < 4; ++l)                                                           \
          kp[j + l] = base + 2 * (j + l) + (a4[l] & 1) + (a4[l] >> 1) * W; }
#define LANES_F64                                                                           \
    const int32_t a0 = _mm_cvtsi128_si32(at), a1 = _mm_cvtsi128_si32(_mm_srli_si128(at, 8));
#define BODY_F32(RELU_FIRST, STORE)                                                         \
    __m128 v[4]; __m128i at;                                                                \
    load_ps(r0 + 2 * j, r1 + 2 * j, RELU_FIRST, v);                                         \
    _mm_storeu_ps(op + j, scan_ps(v, &at));                                                 \
    STORE
#define BODY_F64(RELU_FIRST, STORE)                                                         \
    __m128d v[4]; __m128i at;                                                               \
    load_pd(r0 + 2 * j, r1 + 2 * j, RELU_FIRST, v);                                         \
    _mm_storeu_pd(op + j, scan_pd(v, &at));                                                 \
    LANES_F64 STORE
#define BYTES_F64 { kp[j] = (int8_t)a0; kp[j + 1] = (int8_t)a1; }
#define INDEX_F64 { kp[j] = base + 2 * j + (a0 & 1) + (a0 >> 1) * W;                        \
                    kp[j + 1] = base + 2 * j + 2 + (a1 & 1) + (a1 >> 1) * W; }
#else
#define BODY_F32(RELU_FIRST, STORE)
#define BODY_F64(RELU_FIRST, STORE)
#endif

FORWARD(pool2x2_f32, float, int64_t, 0, VEC_F32, BODY_F32(0, STORE_INDEX_F32))
FORWARD(pool2x2_f64, double, int64_t, 0, VEC_F64, BODY_F64(0, INDEX_F64))
FORWARD(relu_pool2x2_f32, float, int8_t, 1, VEC_F32, BODY_F32(1, STORE_BYTES_F32))
FORWARD(relu_pool2x2_f64, double, int8_t, 1, VEC_F64, BODY_F64(1, BYTES_F64))

/* dx (P, H, W) of relu_pool2x2 for the output gradient g (P, H/2, W/2), every element
 * written: torch's pooling backward adds g to a zero at the winner (0 + g), relu's backward
 * zeroes it where the output is <= 0 (not where it is NaN); the rest is +0.0, including an
 * odd height's last row and an odd width's last column, which are in no window. */
#define BACKWARD(NAME, T, STEP, VECTOR_BODY)                                                \
void NAME(const T *restrict g, const T *restrict out, const int8_t *restrict pos,           \
          T *restrict dx, int64_t P, int64_t H, int64_t W)                                  \
{                                                                                           \
    const int64_t Ho = H / 2, Wo = W / 2;                                                   \
    for (int64_t p = 0; p < P; ++p) {                                                       \
        T *dp = dx + p * H * W;                                                             \
        for (int64_t i = 0; i < Ho; ++i) {                                                  \
            const T *gp = g + (p * Ho + i) * Wo, *op = out + (p * Ho + i) * Wo;             \
            const int8_t *kp = pos + (p * Ho + i) * Wo;                                     \
            T *r0 = dp + 2 * i * W, *r1 = r0 + W;                                           \
            int64_t j = 0;                                                                  \
            if (STEP)                                                                       \
                for (; j + STEP <= Wo; j += STEP) { VECTOR_BODY }                           \
            for (; j < Wo; ++j) {                                                           \
                T v = (T)0 + gp[j];                                                         \
                v = op[j] <= 0 ? (T)0 : v;                                                  \
                const int8_t k = kp[j];                                                     \
                r0[2 * j] = k == 0 ? v : (T)0;                                              \
                r0[2 * j + 1] = k == 1 ? v : (T)0;                                          \
                r1[2 * j] = k == 2 ? v : (T)0;                                              \
                r1[2 * j + 1] = k == 3 ? v : (T)0;                                          \
            }                                                                               \
            for (j = 2 * Wo; j < W; ++j) { r0[j] = (T)0; r1[j] = (T)0; }                    \
        }                                                                                   \
        for (int64_t j = 2 * Ho * W; j < H * W; ++j) dp[j] = (T)0;                          \
    }                                                                                       \
}

#ifdef __SSE2__
/* masks of where each of four windows' place is q, as float32 lanes */
#define BACK_F32                                                                            \
    __m128 v = _mm_add_ps(_mm_setzero_ps(), _mm_loadu_ps(gp + j));                          \
    v = _mm_andnot_ps(_mm_cmple_ps(_mm_loadu_ps(op + j), _mm_setzero_ps()), v);             \
    int32_t four; memcpy(&four, kp + j, 4);                                                 \
    const __m128i z = _mm_setzero_si128();                                                  \
    const __m128i k = _mm_unpacklo_epi16(_mm_unpacklo_epi8(_mm_cvtsi32_si128(four), z), z); \
    __m128 e[4];                                                                            \
    for (int q = 0; q < 4; ++q)                                                             \
        e[q] = _mm_and_ps(_mm_castsi128_ps(_mm_cmpeq_epi32(k, _mm_set1_epi32(q))), v);      \
    _mm_storeu_ps(r0 + 2 * j, _mm_unpacklo_ps(e[0], e[1]));                                 \
    _mm_storeu_ps(r0 + 2 * j + 4, _mm_unpackhi_ps(e[0], e[1]));                             \
    _mm_storeu_ps(r1 + 2 * j, _mm_unpacklo_ps(e[2], e[3]));                                 \
    _mm_storeu_ps(r1 + 2 * j + 4, _mm_unpackhi_ps(e[2], e[3]));
/* two windows: each place fills both 32-bit halves of its lane, so the 32-bit compare
 * gives whole 64-bit masks (SSE2 has no 64-bit integer compare) */
#define BACK_F64                                                                            \
    __m128d v = _mm_add_pd(_mm_setzero_pd(), _mm_loadu_pd(gp + j));                         \
    v = _mm_andnot_pd(_mm_cmple_pd(_mm_loadu_pd(op + j), _mm_setzero_pd()), v);             \
    const __m128i k = _mm_set_epi32(kp[j + 1], kp[j + 1], kp[j], kp[j]);                    \
    __m128d e[4];                                                                           \
    for (int q = 0; q < 4; ++q)                                                             \
        e[q] = _mm_and_pd(_mm_castsi128_pd(_mm_cmpeq_epi32(k, _mm_set1_epi32(q))), v);      \
    _mm_storeu_pd(r0 + 2 * j, _mm_unpacklo_pd(e[0], e[1]));                                 \
    _mm_storeu_pd(r0 + 2 * j + 2, _mm_unpackhi_pd(e[0], e[1]));                             \
    _mm_storeu_pd(r1 + 2 * j, _mm_unpacklo_pd(e[2], e[3]));                                 \
    _mm_storeu_pd(r1 + 2 * j + 2, _mm_unpackhi_pd(e[2], e[3]));
#else
#define BACK_F32
#define BACK_F64
#endif

BACKWARD(relu_pool2x2_grad_f32, float, VEC_F32, BACK_F32)
BACKWARD(relu_pool2x2_grad_f64, double, VEC_F64, BACK_F64)
