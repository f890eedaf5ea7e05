/* bm_exp (tensor.c) four lanes at a time, for the SIMD paths' SiLU and softmax: the same IEEE double
 * operations in the same order, so every lane gets exactly bm_exp's bits, and with it bm_silu's and
 * the softmax's. Written with the compiler's vector extensions, so that one text serves AVX2 (one
 * register) and NEON (two); the includer defines BM_VEXP_FN, the function attribute of its path.
 *
 * Only the common case is vectorised: a group of four whose exponents all lie in [-700, 700] (so the
 * scaling by 2^n is one multiplication and no lane is NaN). Any other group goes element by element
 * through the scalar loops (kernels.c), which are the definition anyway. */
#ifndef BMOE_KERNELS_VEXP_H
#define BMOE_KERNELS_VEXP_H

#include <stdint.h>
#include <string.h>

#include "exp_poly.h"
#include "kernels.h"
#include "tensor.h"

typedef double bm_v4d __attribute__((vector_size(32)));
typedef int64_t bm_v4l __attribute__((vector_size(32)));
typedef float bm_v4f __attribute__((vector_size(16)));
typedef int32_t bm_v4i __attribute__((vector_size(16)));

#define BM_VEXP_LIMIT 700.0

/* 1 when every lane of x is within [-BM_VEXP_LIMIT, BM_VEXP_LIMIT] (NaN is not). */
BM_VEXP_FN static inline int bm_vexp_in_range(bm_v4d x) {
    bm_v4l ok = (x >= -BM_VEXP_LIMIT) & (x <= BM_VEXP_LIMIT);
    return (ok[0] & ok[1] & ok[2] & ok[3]) != 0;
}

/* bm_exp lane by lane, for lanes bm_vexp_in_range accepts. */
BM_VEXP_FN static inline bm_v4d bm_vexp(bm_v4d x) {
    static const double INV_FACT[BM_EXP_DEGREE + 1] = BM_EXP_INV_FACT;
    bm_v4d t = x * BM_EXP_INV_LN2;
    /* (int)(t < 0 ? t - 0.5 : t + 0.5): adding -0.5 is subtracting 0.5, exactly */
    bm_v4l neg = t < 0.0;
    bm_v4d half = (bm_v4d)((bm_v4l)((bm_v4d){0.5, 0.5, 0.5, 0.5}) | (neg & (bm_v4l){INT64_MIN, INT64_MIN, INT64_MIN, INT64_MIN}));
    bm_v4i n = __builtin_convertvector(t + half, bm_v4i); /* truncates toward zero, like the cast */
    bm_v4d nd = __builtin_convertvector(n, bm_v4d);
    bm_v4d r = (x - nd * BM_EXP_LN2_HI) - nd * BM_EXP_LN2_LO;
    bm_v4d p = (bm_v4d){0, 0, 0, 0} + INV_FACT[BM_EXP_DEGREE];
    for (int k = BM_EXP_DEGREE - 1; k >= 0; k--) p = p * r + INV_FACT[k];
    bm_v4l bits = (__builtin_convertvector(n, bm_v4l) + 1023) << 52; /* 2^n, as pow2i builds it */
    return p * (bm_v4d)bits;
}

/* out[i] = bm_silu(g[i]) * u[i] (out may be u). */
BM_VEXP_FN static void bm_vsilu_mul(const float *g, const float *u, size_t n, float *out) {
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        bm_v4f g4, u4;
        memcpy(&g4, g + i, sizeof g4);
        memcpy(&u4, u + i, sizeof u4);
        bm_v4d z = __builtin_convertvector(g4, bm_v4d);
        if (bm_vexp_in_range(z)) {
            bm_v4f s = __builtin_convertvector(z / (1.0 + bm_vexp(-z)), bm_v4f) * u4;
            memcpy(out + i, &s, sizeof s);
        } else {
            bm_silu_mul_scalar(g + i, u + i, 4, out + i);
        }
    }
    bm_silu_mul_scalar(g + i, u + i, n - i, out + i);
}

/* v[i] = (float)bm_exp((double)v[i] - (double)mx), the softmax's exponentials. */
BM_VEXP_FN static void bm_vexp_shift(float *v, size_t n, float mx) {
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        bm_v4f v4;
        memcpy(&v4, v + i, sizeof v4);
        bm_v4d x = __builtin_convertvector(v4, bm_v4d) - (double)mx;
        if (bm_vexp_in_range(x)) {
            bm_v4f e = __builtin_convertvector(bm_vexp(x), bm_v4f);
            memcpy(v + i, &e, sizeof e);
        } else {
            bm_exp_shift_scalar(v + i, 4, mx);
        }
    }
#ifndef BMOE_FAULT_VEXP_TAIL_UNSHIFTED
    bm_exp_shift_scalar(v + i, n - i, mx);
#else
    for (; i < n; i++) v[i] = (float)bm_exp((double)v[i]); /* fault: the tail forgets to subtract the max */
#endif
}

#endif
