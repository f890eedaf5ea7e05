/* Numeric kernels. See tensor.h for the reduction order every function keeps. */
#include "tensor.h"

#include <math.h> /* HUGE_VAL only: no libm function is called */
#include <string.h>

#include "exp_poly.h"
#include "gguf.h"

/* ---- half precision ---------------------------------------------------------------------- */

float bm_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: man * 2^-24; normalise so the leading bit becomes the implicit one */
            uint32_t s = 0;
            while (!(man & 0x400u)) { man <<= 1; s++; }
            bits = sign | ((113u - s) << 23) | ((man & 0x3ffu) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13); /* inf, or NaN with its payload */
    } else {
        bits = sign | ((exp + 112u) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

uint16_t bm_f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) /* inf stays inf; NaN stays a (quiet) NaN */
        return (uint16_t)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u | ((ax >> 13) & 0x3ffu) : 0u));
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 rounds to inf */
    if (ax < 0x38800000u) {                                  /* below 2^-14: subnormal or zero */
        if (ax <= 0x33000000u) return (uint16_t)sign;          /* <= 2^-25 rounds (to even) to 0 */
        uint32_t e = ax >> 23;
        uint32_t m = (ax & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126u - e; /* 14..24: m * 2^(e-150) in units of 2^-24 */
        uint32_t r = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (r & 1u))) r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = ((ax >> 13) - (112u << 10));
    uint32_t rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) r++; /* a carry into the exponent is right */
    return (uint16_t)(sign | r);
}

static inline uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

void row_to_f32(uint32_t type, const void *row, float *y, size_t n) {
    const uint8_t *w = (const uint8_t *)row;
    switch (type) {
    case GGML_TYPE_F32: memcpy(y, row, n * sizeof(float)); break;
    case GGML_TYPE_F16:
        for (size_t i = 0; i < n; i++) y[i] = bm_f16_to_f32(rd16(w + 2 * i));
        break;
    case GGML_TYPE_Q8_0:
        for (size_t b = 0; b < n / BMOE_Q8_0_BLOCK; b++) {
            const uint8_t *blk = w + b * BMOE_Q8_0_BYTES;
            float d = bm_f16_to_f32(rd16(blk));
            for (int i = 0; i < BMOE_Q8_0_BLOCK; i++) y[b * BMOE_Q8_0_BLOCK + i] = d * (float)(int8_t)blk[2 + i];
        }
        break;
    default:
        for (size_t i = 0; i < n; i++) y[i] = 0.0f;
    }
}

/* ---- portable math ---------------------------------------------------------------------------- */

static double pow2i(int n) { /* 2^n for -1022 <= n <= 1023, built from its bits */
    uint64_t bits = (uint64_t)(n + 1023) << 52;
    double d;
    memcpy(&d, &bits, sizeof d);
    return d;
}

double bm_exp(double x) {
    if (x != x) return x;
    if (x > 709.782712893384) return HUGE_VAL;
    if (x < -745.2) return 0.0;
    /* x = n ln2 + r, |r| <= ln2/2, then the polynomial of exp_poly.h. kernels_vexp.h repeats these
     * steps lane-wise for the SIMD paths: change both together. */
    double t = x * BM_EXP_INV_LN2;
    int n = (int)(t < 0 ? t - 0.5 : t + 0.5);
    double r = (x - n * BM_EXP_LN2_HI) - n * BM_EXP_LN2_LO;
    static const double INV_FACT[BM_EXP_DEGREE + 1] = BM_EXP_INV_FACT;
    double p = INV_FACT[BM_EXP_DEGREE];
    for (int k = BM_EXP_DEGREE - 1; k >= 0; k--) p = p * r + INV_FACT[k];
    /* scale by 2^n in two steps so subnormal results come out right */
    if (n > 1023) return p * pow2i(1023) * pow2i(n - 1023);
    if (n < -1022) return p * pow2i(-1022) * pow2i(n + 1022 < -1022 ? -1022 : n + 1022);
    return p * pow2i(n);
}

double bm_log(double x) {
    if (!(x > 0.0)) return x == 0.0 ? -HUGE_VAL : (double)NAN;
    if (x == HUGE_VAL) return x;
    uint64_t bits;
    int adj = 0;
    if (x < 2.2250738585072014e-308) { x *= 18014398509481984.0; adj = -54; } /* subnormal: 2^54 */
    memcpy(&bits, &x, sizeof bits);
    int e = (int)((bits >> 52) & 0x7ff) - 1023 + adj;
    bits = (bits & 0x000fffffffffffffull) | 0x3ff0000000000000ull; /* mantissa in [1, 2) */
    double m;
    memcpy(&m, &bits, sizeof m);
    if (m > 1.41421356237309504880) { m *= 0.5; e++; }
    /* log m = 2 atanh(z), z = (m-1)/(m+1), |z| <= 0.1716: odd series to z^25 */
    double z = (m - 1.0) / (m + 1.0), z2 = z * z, p = 0.0;
    for (int k = 25; k >= 3; k -= 2) p = (p + 1.0 / k) * z2;
    double logm = 2.0 * z * (1.0 + p);
    const double LN2 = 6.93147180559945286227e-01;
    return e * LN2 + logm;
}

void bm_sincos(double x, double *s, double *c) {
    if (x != x || x == HUGE_VAL || x == -HUGE_VAL) { *s = *c = (double)NAN; return; }
    /* x = k pi/2 + r, |r| <= pi/4, pi/2 in three parts (fdlibm's) so k * part is exact for |k| < 2^20 */
    const double PIO2_1 = 1.57079632673412561417e+00, PIO2_2 = 6.07710050630396597660e-11,
                 PIO2_3 = 2.02226624871116645580e-21, PIO2_3T = 8.47842766036889956997e-32;
    const double TWO_OVER_PI = 6.36619772367581382433e-01;
    double t = x * TWO_OVER_PI;
    long long k = (long long)(t < 0 ? t - 0.5 : t + 0.5);
    double kd = (double)k;
    double r = ((x - kd * PIO2_1) - kd * PIO2_2) - kd * PIO2_3;
    r -= kd * PIO2_3T;
    double r2 = r * r;
    /* sin r = r (1 - r^2/(2*3) (1 - r^2/(4*5) (...))), cos r = 1 - r^2/(1*2) (1 - r^2/(3*4) (...)) */
    double ps = 1.0, pc = 1.0;
    for (int n = 18; n >= 2; n -= 2) ps = 1.0 - ps * r2 / (double)(n * (n + 1));
    for (int n = 19; n >= 1; n -= 2) pc = 1.0 - pc * r2 / (double)(n * (n + 1));
    double sr = r * ps, cr = pc;
    switch ((int)(k & 3)) {
    case 0: *s = sr; *c = cr; break;
    case 1: *s = cr; *c = -sr; break;
    case 2: *s = -sr; *c = -cr; break;
    default: *s = -cr; *c = sr; break;
    }
}

float bm_silu(float z) { return (float)((double)z / (1.0 + bm_exp(-(double)z))); }

double bm_tanh(double u) {
    double a = u < 0 ? -u : u;
    double e = bm_exp(-2.0 * a);             /* tanh|u| = (1 - e) / (1 + e), no overflow */
    double th = (1.0 - e) / (1.0 + e);
    return u < 0 ? -th : th;
}

float bm_gelu_tanh(float z) {
    const double SQRT_2_OVER_PI = 7.97884560802865355880e-01;
    double zd = z;
    double u = SQRT_2_OVER_PI * (zd + 0.044715 * zd * zd * zd);
    return (float)(0.5 * zd * (1.0 + bm_tanh(u)));
}

float bm_gelu_f16(float z) {
    if (z <= -10.0f) return 0.0f;
    if (z >= 10.0f) return z;
    float h = bm_f16_to_f32(bm_f32_to_f16(z)); /* NaN stays NaN */
    return bm_f16_to_f32(bm_f32_to_f16(bm_gelu_tanh(h)));
}
