/* The group kernels of fused.py in C: every local step of G clients in one call, bitwise the
 * numba kernels of fused_kernels.py (logreg_group, quadratic_group, quadratic_general_group).
 *
 * Why C: loading the numba form costs a process `import numba` and LLVM's set-up (0.5-0.8 s
 * of CPU at every run's start-up); this file is compiled once per machine into hpcfl's cache
 * folder (hpcfl/native/cc.py) and mapped through ctypes in about a millisecond.
 *
 * Same bits as numba's form, which is why every loop below is a line-for-line transcription:
 * the same loop order, the same operations in the same order and type (float32 arithmetic for
 * float32 models, as numba types it; the loss sums in double), exp and log from the C math
 * library (numba calls the same expf/exp/logf/log). Compiled without fast-math and with
 * -ffp-contract=off, so nothing is reassociated or fused into FMA (numba's LLVM IR has no
 * contraction flags either); vectorising the element-wise loops changes no bit. A build that
 * does not keep IEEE arithmetic says so (hpcfl_fused_ieee) and fused_c.py also checks a small
 * case against a Python transcription before it uses the library.
 *
 * Arrays are C-contiguous (checked by the caller): w (G, P), x (N, F) or (N, 3, P) rows, y (N,),
 * sched (S, G, B) sample indices (-1 pads a partial batch), steps (G,), alpha (S,), coef (6,)
 * = [weight decay, mu, momentum, 1, 0, 0.5] in the dtype, corr (G, P) when has_corr, x0 (P,),
 * loss (G,) double, zeroed by the caller. Scratch: work (F * B + C * B + P) and u (P, zeroed:
 * momentum's buffer, shared by the group's clients as in numba's form, where step 0 overwrites it).
 */
#include <float.h>
#include <math.h>
#include <stdint.h>

/* 1 where this build keeps IEEE arithmetic in the source's order, else 0 (numba's form is used) */
int hpcfl_fused_ieee(void)
{
#if defined(__FAST_MATH__) || (defined(FLT_EVAL_METHOD) && FLT_EVAL_METHOD != 0)
    return 0;
#else
    return 1;
#endif
}

#define FUSED_KERNELS(T, S, EXP, LOG)                                                              \
/* LocalSolver.step, element by element: wd, prox, correction, momentum, the scaled step */      \
static void solver_##S(T *wg, const T *grad, int64_t k, T a, const T *coef, const T *corr_g,       \
                       const T *x0, T *u, int64_t P)                                               \
{                                                                                                  \
    T wd = coef[0], mu = coef[1], rho = coef[2];                                                   \
    for (int64_t p = 0; p < P; p++) {                                                              \
        T gp = grad[p];                                                                            \
        if (wd != 0) gp = gp + wd * wg[p];                                                         \
        if (mu != 0) gp = gp + mu * (wg[p] - x0[p]);                                               \
        if (corr_g) gp = gp + corr_g[p];                                                           \
        if (rho != 0) {                                                                            \
            gp = k == 0 ? gp : rho * u[p] + gp;                                                    \
            u[p] = gp;                                                                             \
        }                                                                                          \
        wg[p] = wg[p] + a * gp;                                                                    \
    }                                                                                              \
}                                                                                                  \
                                                                                                   \
/* the batch's valid samples n (a prefix) and its weight 1/n in the dtype: torch's valid / count */ \
static int64_t batch_weight_##S(const int64_t *rows, int64_t B, T one, T *wt)                     \
{                                                                                                  \
    int64_t n = 0;                                                                                 \
    for (int64_t b = 0; b < B; b++)                                                                \
        if (rows[b] >= 0) n++;                                                                     \
    T cnt = (T)n;                                                                                  \
    *wt = one / cnt;                                                                               \
    return n;                                                                                      \
}                                                                                                  \
                                                                                                   \
void logreg_group_##S(T *w, const T *x, const int64_t *y, const int64_t *sched, const int64_t *steps, \
                      const T *alpha, const T *coef, const T *corr, int64_t has_corr, const T *x0,  \
                      double *loss, T *work, T *u, int64_t G, int64_t P, int64_t B, int64_t F,     \
                      int64_t C)                                                                   \
{                                                                                                  \
    const int64_t CF = C * F;                                                                      \
    const T one = coef[3], zero = coef[4];                                                         \
    T *xt = work, *z = work + F * B, *grad = work + F * B + C * B;   /* xt (F, B), z (C, B) */      \
    for (int64_t g = 0; g < G; g++) {                                                              \
        T *wg = w + g * P;                                                                         \
        for (int64_t k = 0; k < steps[g]; k++) {                                                   \
            const int64_t *rows = sched + (k * G + g) * B;                                         \
            T wt;                                                                                  \
            const int64_t n = batch_weight_##S(rows, B, one, &wt);                                 \
            for (int64_t b = 0; b < n; b++) {   /* the batch, transposed */                        \
                const T *xi = x + rows[b] * F;                                                     \
                for (int64_t f = 0; f < F; f++) xt[f * B + b] = xi[f];                             \
            }                                                                                      \
            for (int64_t c = 0; c < C; c++) {   /* z[c, b] = sum_f W[c, f] x_b[f] (f order) + b[c] */ \
                T *zc = z + c * B;                                                                 \
                for (int64_t b = 0; b < n; b++) zc[b] = 0;                                         \
                for (int64_t f = 0; f < F; f++) {                                                  \
                    const T wcf = wg[c * F + f];                                                   \
                    for (int64_t b = 0; b < n; b++) zc[b] += wcf * xt[f * B + b];                  \
                }                                                                                  \
                const T bc = wg[CF + c];                                                           \
                for (int64_t b = 0; b < n; b++) zc[b] += bc;                                       \
            }                                                                                      \
            T step_loss = zero;   /* softmax - onehot, weighted 1/n, into z; the step's loss */     \
            for (int64_t b = 0; b < n; b++) {                                                      \
                T m = z[b];                                                                        \
                for (int64_t c = 1; c < C; c++)                                                    \
                    if (z[c * B + b] > m) m = z[c * B + b];                                        \
                const int64_t yb = y[rows[b]];                                                     \
                const T zy = z[yb * B + b] - m;                                                    \
                T s = zero;                                                                        \
                for (int64_t c = 0; c < C; c++) {                                                  \
                    const T e = EXP(z[c * B + b] - m);                                             \
                    z[c * B + b] = e;                                                              \
                    s += e;                                                                        \
                }                                                                                  \
                step_loss += (zy - LOG(s)) * wt;                                                   \
                const T r = wt / s;                                                                \
                for (int64_t c = 0; c < C; c++) z[c * B + b] = z[c * B + b] * r;                   \
                z[yb * B + b] -= wt;                                                               \
            }                                                                                      \
            loss[g] -= (double)step_loss;                                                          \
            for (int64_t c = 0; c < C; c++) {   /* W rows sum the batch in order; the bias sums dz */ \
                T *gc = grad + c * F;                                                              \
                for (int64_t f = 0; f < F; f++) gc[f] = 0;                                         \
                T gb = zero;                                                                       \
                for (int64_t b = 0; b < n; b++) {                                                  \
                    const T d = z[c * B + b];                                                      \
                    gb += d;                                                                       \
                    const T *xi = x + rows[b] * F;                                                 \
                    for (int64_t f = 0; f < F; f++) gc[f] += d * xi[f];                            \
                }                                                                                  \
                grad[CF + c] = gb;                                                                 \
            }                                                                                      \
            solver_##S(wg, grad, k, alpha[k], coef, has_corr ? corr + g * P : 0, x0, u, P);        \
        }                                                                                          \
    }                                                                                              \
}                                                                                                  \
                                                                                                   \
/* l_b = 1/2 ||x - e_b||^2, dl_b/dx = x - e_b; x rows (N, F) with F = P */                          \
void quadratic_group_##S(T *w, const T *x, const int64_t *y, const int64_t *sched, const int64_t *steps, \
                         const T *alpha, const T *coef, const T *corr, int64_t has_corr, const T *x0, \
                         double *loss, T *work, T *u, int64_t G, int64_t P, int64_t B, int64_t F,  \
                         int64_t C)                                                                \
{                                                                                                  \
    const T one = coef[3], zero = coef[4], half = coef[5];                                         \
    T *grad = work;                                                                                \
    (void)y; (void)C;                                                                              \
    for (int64_t g = 0; g < G; g++) {                                                              \
        T *wg = w + g * P;                                                                         \
        for (int64_t k = 0; k < steps[g]; k++) {                                                   \
            const int64_t *rows = sched + (k * G + g) * B;                                         \
            T wt;                                                                                  \
            const int64_t n = batch_weight_##S(rows, B, one, &wt);                                 \
            for (int64_t p = 0; p < P; p++) grad[p] = 0;                                           \
            T step_loss = zero;                                                                    \
            for (int64_t b = 0; b < n; b++) {                                                      \
                const T *e = x + rows[b] * F;                                                      \
                T s = zero;                                                                        \
                for (int64_t p = 0; p < P; p++) {                                                  \
                    const T d = wg[p] - e[p];                                                      \
                    s += d * d;                                                                    \
                    grad[p] += d * wt;                                                             \
                }                                                                                  \
                step_loss += half * s * wt;                                                        \
            }                                                                                      \
            loss[g] += (double)step_loss;                                                          \
            solver_##S(wg, grad, k, alpha[k], coef, has_corr ? corr + g * P : 0, x0, u, P);        \
        }                                                                                          \
    }                                                                                              \
}                                                                                                  \
                                                                                                   \
/* l_b = 1/2 sum_j h_j (x_j - c_j)^2 + n . x, dl_b/dx = h (x - c) + n; rows [c; h; n], F = 3 P */   \
void quadratic_general_group_##S(T *w, const T *x, const int64_t *y, const int64_t *sched,         \
                                 const int64_t *steps, const T *alpha, const T *coef, const T *corr, \
                                 int64_t has_corr, const T *x0, double *loss, T *work, T *u,       \
                                 int64_t G, int64_t P, int64_t B, int64_t F, int64_t C)            \
{                                                                                                  \
    const T one = coef[3], zero = coef[4], half = coef[5];                                         \
    T *grad = work;                                                                                \
    (void)y; (void)C;                                                                              \
    for (int64_t g = 0; g < G; g++) {                                                              \
        T *wg = w + g * P;                                                                         \
        for (int64_t k = 0; k < steps[g]; k++) {                                                   \
            const int64_t *rows = sched + (k * G + g) * B;                                         \
            T wt;                                                                                  \
            const int64_t n = batch_weight_##S(rows, B, one, &wt);                                 \
            for (int64_t p = 0; p < P; p++) grad[p] = 0;                                           \
            T step_loss = zero;                                                                    \
            for (int64_t b = 0; b < n; b++) {                                                      \
                const T *c = x + rows[b] * F, *h = c + P, *nz = c + 2 * P;                         \
                for (int64_t p = 0; p < P; p++) {                                                  \
                    const T d = wg[p] - c[p];                                                      \
                    const T hd = h[p] * d;                                                         \
                    step_loss += (nz[p] * wg[p] + half * hd * d) * wt;                             \
                    grad[p] += (hd + nz[p]) * wt;                                                  \
                }                                                                                  \
            }                                                                                      \
            loss[g] += (double)step_loss;                                                          \
            solver_##S(wg, grad, k, alpha[k], coef, has_corr ? corr + g * P : 0, x0, u, P);        \
        }                                                                                          \
    }                                                                                              \
}

FUSED_KERNELS(float, f32, expf, logf)
FUSED_KERNELS(double, f64, exp, log)
