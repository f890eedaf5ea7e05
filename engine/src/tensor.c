/* Numeric kernels. See tensor.h for the reduction order every function keeps. */
#include "tensor.h"

#include <math.h> /* HUGE_VAL only: no libm function is called */
#include <string.h>

#include "exp_poly.h"
#include "type_traits.h"

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
    const bm_type_traits *tt = bm_type(type);
    if (tt) tt->to_f32((const uint8_t *)row, y, n);
    else memset(y, 0, n * sizeof *y);
}

void bm_to_f32_f32(const uint8_t *blocks, float *y, size_t n) { memcpy(y, blocks, n * sizeof(float)); }

void bm_to_f32_f16(const uint8_t *blocks, float *y, size_t n) {
    for (size_t i = 0; i < n; i++) y[i] = bm_f16_to_f32(rd16(blocks + 2 * i));
}

void bm_to_f32_bf16(const uint8_t *blocks, float *y, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)rd16(blocks + 2 * i) << 16;
        memcpy(&y[i], &u, sizeof u);
    }
}

void bm_to_f32_q8_0(const uint8_t *blocks, float *y, size_t n) {
    for (size_t b = 0; b < n / BMOE_Q8_0_BLOCK; b++, y += BMOE_Q8_0_BLOCK) {
        const uint8_t *blk = blocks + b * BMOE_Q8_0_BYTES;
        const float d = bm_f16_to_f32(rd16(blk));
        for (int i = 0; i < BMOE_Q8_0_BLOCK; i++) y[i] = d * (float)(int8_t)blk[2 + i];
    }
}

void bm_to_f32_q4_0(const uint8_t *blocks, float *y, size_t n) {
    for (size_t b = 0; b < n / 32; b++, y += 32) {
        const uint8_t *blk = blocks + b * BMOE_Q4_0_BYTES;
        const float d = bm_f16_to_f32(rd16(blk));
        for (int j = 0; j < 16; j++) {
            y[j] = (float)((blk[2 + j] & 0xF) - 8) * d;
            y[j + 16] = (float)((blk[2 + j] >> 4) - 8) * d;
        }
    }
}

void bm_to_f32_q5_0(const uint8_t *blocks, float *y, size_t n) {
    for (size_t b = 0; b < n / 32; b++, y += 32) {
        const uint8_t *blk = blocks + b * BMOE_Q5_0_BYTES;
        const float d = bm_f16_to_f32(rd16(blk));
        uint32_t qh = (uint32_t)blk[2] | ((uint32_t)blk[3] << 8) | ((uint32_t)blk[4] << 16) | ((uint32_t)blk[5] << 24);
        for (int j = 0; j < 16; j++) {
            int h0 = (int)(((qh >> j) << 4) & 0x10), h1 = (int)((qh >> (j + 12)) & 0x10);
            y[j] = (float)(((blk[6 + j] & 0xF) | h0) - 16) * d;
            y[j + 16] = (float)(((blk[6 + j] >> 4) | h1) - 16) * d;
        }
    }
}

/* ggml's dequantize_row_q4_1 / _q5_1: level * d + m (the level with Q5_1's fifth bit, as Q5_0's). */
static void dq_q41(const uint8_t *blocks, float *y, size_t n, int five) {
    const size_t bb = five ? BMOE_Q5_1_BYTES : BMOE_Q4_1_BYTES;
    for (size_t b = 0; b < n / 32; b++, y += 32) {
        const uint8_t *blk = blocks + b * bb, *qs = blk + (five ? 8 : 4);
        const float d = bm_f16_to_f32(rd16(blk)), m = bm_f16_to_f32(rd16(blk + 2));
        uint32_t qh = five ? (uint32_t)blk[4] | ((uint32_t)blk[5] << 8) | ((uint32_t)blk[6] << 16) |
                                 ((uint32_t)blk[7] << 24)
                           : 0;
        for (int j = 0; j < 16; j++) {
            int h0 = (int)(((qh >> j) << 4) & 0x10), h1 = (int)((qh >> (j + 12)) & 0x10);
            y[j] = (float)((qs[j] & 0xF) | h0) * d + m;
            y[j + 16] = (float)((qs[j] >> 4) | h1) * d + m;
        }
    }
}

void bm_to_f32_q4_1(const uint8_t *blocks, float *y, size_t n) { dq_q41(blocks, y, n, 0); }
void bm_to_f32_q5_1(const uint8_t *blocks, float *y, size_t n) { dq_q41(blocks, y, n, 1); }

float bm_e8m0_half(uint8_t e) {
    uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* ggml's dequantize_row_iq4_nl: d * level. */
void bm_to_f32_iq4_nl(const uint8_t *blocks, float *y, size_t n) {
    for (size_t b = 0; b < n / 32; b++, y += 32) {
        const uint8_t *blk = blocks + b * BMOE_IQ4_NL_BYTES, *qs = blk + 2;
        const float d = bm_f16_to_f32(rd16(blk));
        for (int j = 0; j < 16; j++) {
            y[j] = d * (float)BM_KVALUES_IQ4NL[qs[j] & 0xF];
            y[j + 16] = d * (float)BM_KVALUES_IQ4NL[qs[j] >> 4];
        }
    }
}

/* ggml's dequantize_row_mxfp4: level * 2^(e - 128). */
void bm_to_f32_mxfp4(const uint8_t *blocks, float *y, size_t n) {
    for (size_t b = 0; b < n / 32; b++, y += 32) {
        const uint8_t *blk = blocks + b * BMOE_MXFP4_BYTES, *qs = blk + 1;
        const float d = bm_e8m0_half(blk[0]);
        for (int j = 0; j < 16; j++) {
            y[j] = (float)BM_KVALUES_MXFP4[qs[j] & 0xF] * d;
            y[j + 16] = (float)BM_KVALUES_MXFP4[qs[j] >> 4] * d;
        }
    }
}

/* ggml's dequantize_row_q2_K: value 128h + 32j + l (l < 32) is bits 2j of qs[32h + l], its sub-block
 * of 16 (8h + 2j + l / 16) gives d * (scale & 15) and dmin * (scale >> 4). */
void bm_to_f32_q2_K(const uint8_t *blocks, float *y, size_t n) {
    for (size_t b = 0; b < n / BMOE_QK_K; b++) {
        const uint8_t *blk = blocks + b * BMOE_Q2_K_BYTES, *sc = blk, *q = blk + 16;
        const float d = bm_f16_to_f32(rd16(blk + 80)), min = bm_f16_to_f32(rd16(blk + 82));
        int is = 0;
        for (int h = 0; h < 2; h++, q += 32)
            for (int j = 0; j < 4; j++)
                for (int u = 0; u < 2; u++, is++) {
                    const float dl = d * (float)(sc[is] & 0xF), ml = min * (float)(sc[is] >> 4);
                    for (int l = 16 * u; l < 16 * u + 16; l++) *y++ = dl * (float)((q[l] >> (2 * j)) & 3) - ml;
                }
    }
}

/* ggml's dequantize_row_q3_K: the two bits as Q2_K's, minus 4 where the value's bit of hmask (bit
 * 4h + j of hmask[l]) is clear; sub-block scale d * (sc - 32). */
void bm_to_f32_q3_K(const uint8_t *blocks, float *y, size_t n) {
    for (size_t b = 0; b < n / BMOE_QK_K; b++) {
        const uint8_t *blk = blocks + b * BMOE_Q3_K_BYTES, *hm = blk, *q = blk + 32;
        const float d_all = bm_f16_to_f32(rd16(blk + 108));
        int8_t sc[16];
        bm_q3k_scales(blk + 96, sc);
        int is = 0;
        for (int h = 0; h < 2; h++, q += 32)
            for (int j = 0; j < 4; j++) {
                const uint8_t m = (uint8_t)(1u << (4 * h + j));
                for (int u = 0; u < 2; u++, is++) {
                    const float dl = d_all * (float)(sc[is] - 32);
                    for (int l = 16 * u; l < 16 * u + 16; l++)
                        *y++ = dl * (float)(((q[l] >> (2 * j)) & 3) - ((hm[l] & m) ? 0 : 4));
                }
            }
    }
}

/* ggml's dequantize_row_iq4_xs: sub-block ib's 32 values are d * (ls - 32) * level. */
void bm_to_f32_iq4_xs(const uint8_t *blocks, float *y, size_t n) {
    for (size_t b = 0; b < n / BMOE_QK_K; b++) {
        const uint8_t *blk = blocks + b * BMOE_IQ4_XS_BYTES, *qs = blk + 8;
        const float d = bm_f16_to_f32(rd16(blk));
        for (int ib = 0; ib < 8; ib++, y += 32, qs += 16) {
            const float dl = d * (float)(bm_iq4xs_scale(blk, ib) - 32);
            for (int j = 0; j < 16; j++) {
                y[j] = dl * (float)BM_KVALUES_IQ4NL[qs[j] & 0xF];
                y[j + 16] = dl * (float)BM_KVALUES_IQ4NL[qs[j] >> 4];
            }
        }
    }
}

/* ggml's dequantize_row_q4_K / _q5_K for one block (hbit: Q5_K's qh, NULL for Q4_K). */
static void dq_q4_5_K(const uint8_t *blk, const uint8_t *qh, const uint8_t *qs, float *y) {
    const float d = bm_f16_to_f32(rd16(blk)), dmin = bm_f16_to_f32(rd16(blk + 2));
    const uint8_t *scales = blk + 4;
    for (int j = 0; j < 4; j++) { /* 64 values: sub-blocks 2j (low nibbles) and 2j+1 (high nibbles) */
        uint8_t sc, m;
        bm_scale_min_k4(2 * j, scales, &sc, &m);
        const float d1 = d * (float)sc, m1 = dmin * (float)m;
        bm_scale_min_k4(2 * j + 1, scales, &sc, &m);
        const float d2 = d * (float)sc, m2 = dmin * (float)m;
        const uint8_t *q = qs + 32 * j;
        for (int l = 0; l < 32; l++) {
            int lo = q[l] & 0xF, hi = q[l] >> 4;
            if (qh) {
                lo |= ((qh[l] >> (2 * j)) & 1) << 4;
                hi |= ((qh[l] >> (2 * j + 1)) & 1) << 4;
            }
            y[64 * j + l] = d1 * (float)lo - m1;
            y[64 * j + 32 + l] = d2 * (float)hi - m2;
        }
    }
}

void bm_to_f32_q4_K(const uint8_t *blocks, float *y, size_t n) {
    for (size_t b = 0; b < n / BMOE_QK_K; b++, y += BMOE_QK_K) {
        const uint8_t *blk = blocks + b * BMOE_Q4_K_BYTES;
        dq_q4_5_K(blk, NULL, blk + 16, y);
    }
}

void bm_to_f32_q5_K(const uint8_t *blocks, float *y, size_t n) {
    for (size_t b = 0; b < n / BMOE_QK_K; b++, y += BMOE_QK_K) {
        const uint8_t *blk = blocks + b * BMOE_Q5_K_BYTES;
        dq_q4_5_K(blk, blk + 16, blk + 48, y);
    }
}

/* ggml's dequantize_row_q6_K. */
void bm_to_f32_q6_K(const uint8_t *blocks, float *y, size_t n) {
    for (size_t b = 0; b < n / BMOE_QK_K; b++) {
        const uint8_t *blk = blocks + b * BMOE_Q6_K_BYTES;
        const uint8_t *ql = blk, *qh = blk + 128;
        const int8_t *sc = (const int8_t *)(blk + 192);
        const float d = bm_f16_to_f32(rd16(blk + 208));
        for (int h = 0; h < 2; h++, ql += 64, qh += 32, sc += 8, y += 128) {
            for (int l = 0; l < 32; l++) {
                int is = l / 16;
                const int s2 = BM_Q6K_SHIFT(1), s3 = BM_Q6K_SHIFT(2), s4 = BM_Q6K_SHIFT(3);
                int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> s2) & 3) << 4)) - 32;
                int q3 = ((ql[l] >> 4) | (((qh[l] >> s3) & 3) << 4)) - 32;
                int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> s4) & 3) << 4)) - 32;
                y[l] = d * (float)sc[is] * (float)q1;
                y[l + 32] = d * (float)sc[is + 2] * (float)q2;
                y[l + 64] = d * (float)sc[is + 4] * (float)q3;
                y[l + 96] = d * (float)sc[is + 6] * (float)q4;
            }
        }
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

/* Inside (-10, 10) bm_gelu_f16 depends on z only through h = f16(z): entry h is its last line for
 * that h. Entries for values outside (-10, 10) are never read. */
void bm_gelu_f16_table(float *tab) {
    for (uint32_t h = 0; h < BM_GELU_TAB; h++)
        tab[h] = bm_f16_to_f32(bm_f32_to_f16(bm_gelu_tanh(bm_f16_to_f32((uint16_t)h))));
}
