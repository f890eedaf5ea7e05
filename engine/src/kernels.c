/* The scalar kernels (they define the bits, kernels.h), activation quantisation, and the run-time
 * choice of path. */
#include "kernels.h"

#include <math.h> /* NAN only */
#include <string.h>

#include "gguf.h"
#include "kernels_lanes.h"
#include "tensor.h"

float bm_vdot_f32_scalar(const float *a, const float *b, size_t n) {
    float acc[8] = {0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) acc[l] += a[i + l] * b[i + l];
    for (; i < n; i++) acc[i & 7] += a[i] * b[i];
    return bm_sum8(acc);
}

float bm_vdot_f16_scalar(const uint8_t *w, const float *x, size_t n) {
    float acc[8] = {0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) acc[l] += bm_f16_to_f32(bm_rd16(w + 2 * (i + l))) * x[i + l];
    for (; i < n; i++) acc[i & 7] += bm_f16_to_f32(bm_rd16(w + 2 * i)) * x[i];
    return bm_sum8(acc);
}

/* A Q4_K (qh NULL) or Q5_K super-block's exact sum is = sum_j sc_j * sum_i q_i x_i (kernels.h). Sub-block
 * j's 32 levels are nibble j mod 2 of qs[32 (j / 2) + l], with bit j of qh[l] on top for Q5_K. */
static int32_t k4_scaled_sum(const uint8_t *qs, const uint8_t *qh, const uint8_t sc[8], const int8_t *x) {
    int32_t is = 0;
    for (int j = 0; j < 8; j++) {
        const uint8_t *q = qs + 32 * (j / 2);
        const int shift = 4 * (j & 1);
        int32_t s = 0;
        for (int l = 0; l < 32; l++) {
            int v = (q[l] >> shift) & 0xF;
            if (qh) v |= ((qh[l] >> j) & 1) << 4;
            s += v * (int32_t)x[32 * j + l];
        }
        is += (int32_t)sc[j] * s;
    }
    return is;
}

/* A Q6_K super-block's exact sum is = sum_j sc_j * sum_i (q_i - 32) x_i over its 16 sub-blocks of 16.
 * In each half of 128, value 32k + l (k = 0..3, l < 32) has its low four bits in nibble k / 2 of
 * ql[32 (k mod 2) + l] and its high two in qh[l] >> BM_Q6K_SHIFT(k); its scale is sc[2k + l / 16]. */
static int32_t k6_scaled_sum(const uint8_t *blk, const int8_t *x) {
    const int8_t *sc = (const int8_t *)(blk + 192);
    int32_t is = 0;
    for (int h = 0; h < 2; h++) {
        const uint8_t *ql = blk + 64 * h, *qh = blk + 128 + 32 * h;
        for (int k = 0; k < 4; k++) {
            const uint8_t *lq = ql + 32 * (k & 1);
            const int nib = 4 * (k >> 1), hs = BM_Q6K_SHIFT(k);
            for (int g = 0; g < 2; g++) {
                int32_t s = 0;
                for (int l = 16 * g; l < 16 * g + 16; l++) {
                    int q = ((lq[l] >> nib) & 0xF) | (((qh[l] >> hs) & 3) << 4);
                    s += (q - 32) * (int32_t)x[128 * h + 32 * k + l];
                }
                is += (int32_t)sc[8 * h + 2 * k + g] * s;
            }
        }
    }
    return is;
}

/* Super-block b of a Q4_K / Q5_K (five) row against x's, as c_b (kernels.h). */
static float k4_block(const uint8_t *w, int five, const bm_q8k *xb, size_t b) {
    const uint8_t *blk = w + b * (five ? BMOE_Q5_K_BYTES : BMOE_Q4_K_BYTES);
    uint8_t sc[8], m[8];
    bm_scales_mins_k4(blk + 4, sc, m);
    int32_t is = k4_scaled_sum(blk + (five ? 48 : 16), five ? blk + 16 : NULL, sc, xb->q);
    return bm_k4_value(is, bm_k4_min_sum(m, xb->bsums), bm_f16_to_f32(bm_rd16(blk)), bm_f16_to_f32(bm_rd16(blk + 2)),
                       xb->d);
}

/* ---- the type table's scalar kernels (type_table.c): one token, and the per-token loop for
 * several (kernels.h) ---- */

#define SCALAR_MT(T)                                                                                       \
    void bm_dot_mt_##T##_scalar(const uint8_t *w, const bm_act *a, size_t n, int nt, float *out) {        \
        for (int t = 0; t < nt; t++) {                                                                     \
            const bm_act at = bm_act_token(a, n, t);                                                       \
            out[t] = bm_dot_##T##_scalar(w, &at, n);                                                       \
        }                                                                                                  \
    }

float bm_dot_f32_scalar(const uint8_t *w, const bm_act *a, size_t n) { return bm_vdot_f32_scalar((const float *)w, a->x, n); }
float bm_dot_f16_scalar(const uint8_t *w, const bm_act *a, size_t n) { return bm_vdot_f16_scalar(w, a->x, n); }

/* BF16: each chunk of the row converted exactly (bm_to_f32_bf16), then the F32 lanes. */
float bm_dot_bf16_scalar(const uint8_t *w, const bm_act *a, size_t n) {
    float acc[8] = {0}, y[BMOE_DQ_CHUNK];
    for (size_t i0 = 0; i0 < n; i0 += BMOE_DQ_CHUNK) {
        size_t cnt = n - i0 < BMOE_DQ_CHUNK ? n - i0 : BMOE_DQ_CHUNK;
        bm_to_f32_bf16(w + 2 * i0, y, cnt);
        for (size_t j = 0; j < cnt; j++) acc[j & 7] += y[j] * a->x[i0 + j]; /* i0 % 8 == 0: lane (i0 + j) mod 8 */
    }
    return bm_sum8(acc);
}

float bm_dot_q8_0_scalar(const uint8_t *w, const bm_act *a, size_t n) {
    float acc[8] = {0};
    bm_q8_0_blocks(acc, w, a->q, a->d, 0, n / BMOE_Q8_0_BLOCK);
    return bm_sum8(acc);
}

float bm_dot_q4_0_scalar(const uint8_t *w, const bm_act *a, size_t n) {
    float acc[8] = {0};
    bm_q45_0_blocks(acc, GGML_TYPE_Q4_0, w, a->q, a->d, 0, n / BMOE_Q8_0_BLOCK);
    return bm_sum8(acc);
}

float bm_dot_q5_0_scalar(const uint8_t *w, const bm_act *a, size_t n) {
    float acc[8] = {0};
    bm_q45_0_blocks(acc, GGML_TYPE_Q5_0, w, a->q, a->d, 0, n / BMOE_Q8_0_BLOCK);
    return bm_sum8(acc);
}

float bm_dot_q4_1_scalar(const uint8_t *w, const bm_act *a, size_t n) {
    float acc[8] = {0};
    bm_q41_blocks(acc, 0, w, a->q, a->d, a->s, 0, n / BMOE_Q8_0_BLOCK);
    return bm_sum8(acc);
}

float bm_dot_q5_1_scalar(const uint8_t *w, const bm_act *a, size_t n) {
    float acc[8] = {0};
    bm_q41_blocks(acc, 1, w, a->q, a->d, a->s, 0, n / BMOE_Q8_0_BLOCK);
    return bm_sum8(acc);
}

float bm_dot_iq4_nl_scalar(const uint8_t *w, const bm_act *a, size_t n) {
    float acc[8] = {0};
    bm_nl4_blocks(acc, 0, w, a->q, a->d, 0, n / BMOE_Q8_0_BLOCK);
    return bm_sum8(acc);
}

float bm_dot_mxfp4_scalar(const uint8_t *w, const bm_act *a, size_t n) {
    float acc[8] = {0};
    bm_nl4_blocks(acc, 1, w, a->q, a->d, 0, n / BMOE_Q8_0_BLOCK);
    return bm_sum8(acc);
}

/* Q2_K's exact sum is = sum_j (sc_j & 15) * sum_i q_i x_i over its 16 sub-blocks of 16 (tensor.c's
 * layout: value 128h + 32k + l has bits 2k of qs[32h + l], sub-block 8h + 2k + l / 16). */
static int32_t k2_scaled_sum(const uint8_t *blk, const int8_t *x) {
    int32_t is = 0;
    for (int h = 0; h < 2; h++)
        for (int k = 0; k < 4; k++)
            for (int g = 0; g < 2; g++) {
                int32_t s = 0;
                for (int l = 16 * g; l < 16 * g + 16; l++)
                    s += (int32_t)((blk[16 + 32 * h + l] >> (2 * k)) & 3) * (int32_t)x[128 * h + 32 * k + l];
                is += (int32_t)(blk[8 * h + 2 * k + g] & 0xF) * s;
            }
    return is;
}

/* Q3_K's exact sum is = sum_j (sc_j - 32) * sum_i q_i x_i, q = the two bits - 4 where the hmask bit is
 * clear (-4..3). */
static int32_t k3_scaled_sum(const uint8_t *blk, const int8_t *x) {
    int8_t sc[16];
    bm_q3k_scales(blk + 96, sc);
    int32_t is = 0;
    for (int h = 0; h < 2; h++)
        for (int k = 0; k < 4; k++)
            for (int g = 0; g < 2; g++) {
                int32_t s = 0;
                for (int l = 16 * g; l < 16 * g + 16; l++) {
                    int q = ((blk[32 + 32 * h + l] >> (2 * k)) & 3) - ((blk[l] >> (4 * h + k)) & 1 ? 0 : 4);
                    s += q * (int32_t)x[128 * h + 32 * k + l];
                }
                is += (int32_t)(sc[8 * h + 2 * k + g] - 32) * s;
            }
    return is;
}

/* IQ4_XS's exact sum is = sum_ib (ls_ib - 32) * sum_i kv[i] x_i over its 8 sub-blocks of 32. */
static int32_t xs_scaled_sum(const uint8_t *blk, const int8_t *x) {
    int32_t is = 0;
    for (int ib = 0; ib < 8; ib++) {
        const uint8_t *qs = blk + 8 + 16 * ib;
        int32_t s = 0;
        for (int j = 0; j < 16; j++)
            s += (int32_t)BM_KVALUES_IQ4NL[qs[j] & 0xF] * x[32 * ib + j] +
                 (int32_t)BM_KVALUES_IQ4NL[qs[j] >> 4] * x[32 * ib + 16 + j];
        is += (int32_t)(bm_iq4xs_scale(blk, ib) - 32) * s;
    }
    return is;
}

float bm_dot_q2_K_scalar(const uint8_t *w, const bm_act *a, size_t n) {
    float acc[8] = {0};
    for (size_t b = 0; b < n / BM_Q8K_BLOCK; b++) {
        const uint8_t *blk = w + b * BMOE_Q2_K_BYTES;
        acc[b & 7] += bm_k4_value(k2_scaled_sum(blk, a->k[b].q), bm_k2_min_sum(blk, a->k[b].bsums),
                                  bm_f16_to_f32(bm_rd16(blk + 80)), bm_f16_to_f32(bm_rd16(blk + 82)), a->k[b].d);
    }
    return bm_sum8(acc);
}

float bm_dot_q3_K_scalar(const uint8_t *w, const bm_act *a, size_t n) {
    float acc[8] = {0};
    for (size_t b = 0; b < n / BM_Q8K_BLOCK; b++) {
        const uint8_t *blk = w + b * BMOE_Q3_K_BYTES;
        acc[b & 7] += bm_k6_value(k3_scaled_sum(blk, a->k[b].q), bm_f16_to_f32(bm_rd16(blk + 108)), a->k[b].d);
    }
    return bm_sum8(acc);
}

float bm_dot_iq4_xs_scalar(const uint8_t *w, const bm_act *a, size_t n) {
    float acc[8] = {0};
    for (size_t b = 0; b < n / BM_Q8K_BLOCK; b++) {
        const uint8_t *blk = w + b * BMOE_IQ4_XS_BYTES;
        acc[b & 7] += bm_k6_value(xs_scaled_sum(blk, a->k[b].q), bm_f16_to_f32(bm_rd16(blk)), a->k[b].d);
    }
    return bm_sum8(acc);
}

float bm_dot_q4_K_scalar(const uint8_t *w, const bm_act *a, size_t n) {
    float acc[8] = {0};
    for (size_t b = 0; b < n / BM_Q8K_BLOCK; b++) acc[b & 7] += k4_block(w, 0, a->k + b, b);
    return bm_sum8(acc);
}

float bm_dot_q5_K_scalar(const uint8_t *w, const bm_act *a, size_t n) {
    float acc[8] = {0};
    for (size_t b = 0; b < n / BM_Q8K_BLOCK; b++) acc[b & 7] += k4_block(w, 1, a->k + b, b);
    return bm_sum8(acc);
}

float bm_dot_q6_K_scalar(const uint8_t *w, const bm_act *a, size_t n) {
    float acc[8] = {0};
    for (size_t b = 0; b < n / BM_Q8K_BLOCK; b++) {
        const uint8_t *blk = w + b * BMOE_Q6_K_BYTES;
        acc[b & 7] += bm_k6_value(k6_scaled_sum(blk, a->k[b].q), bm_f16_to_f32(bm_rd16(blk + 208)), a->k[b].d);
    }
    return bm_sum8(acc);
}

BM_WEIGHT_TYPES(SCALAR_MT)

void bm_silu_mul_scalar(const float *g, const float *u, size_t n, float *out) {
    for (size_t i = 0; i < n; i++) out[i] = bm_silu(g[i]) * u[i];
}

void bm_exp_shift_scalar(float *v, size_t n, float mx) {
    for (size_t i = 0; i < n; i++) v[i] = (float)bm_exp((double)v[i] - (double)mx);
}

/* Round half to even for |t| < 2^22: adding 1.5 * 2^23 leaves the integer in the low mantissa bits
 * (the default rounding mode; no library call, so every libc gives the same). */
static int round_even(float t) {
    float v = t + 12582912.0f;
    int32_t i;
    memcpy(&i, &v, sizeof i);
    return (i & 0x007fffff) - 0x00400000;
}

void bm_quantize_q8_0(const float *x, size_t n, int8_t *xq, float *xd) {
    for (size_t b = 0; b < n / BMOE_Q8_0_BLOCK; b++) {
        const float *v = x + b * BMOE_Q8_0_BLOCK;
        int8_t *q = xq + b * BMOE_Q8_0_BLOCK;
        float amax = 0.0f;
        int nan = 0;
        for (int i = 0; i < BMOE_Q8_0_BLOCK; i++) {
            float a = v[i] < 0.0f ? -v[i] : v[i];
            if (a != a) nan = 1;
            else if (a > amax) amax = a;
        }
        float d = amax / 127.0f;
        /* 127 / amax, not 1 / d: ggml's x86 (AVX) quantize_row_q8_0, which llama.cpp runs on the
         * machines we compare against; the two differ by an ulp for some amax, which moves values that
         * sit at a rounding boundary (docs/model-math.md) */
        float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        xd[b] = nan ? (float)NAN : bm_f16_to_f32(bm_f32_to_f16(d));
        for (int i = 0; i < BMOE_Q8_0_BLOCK; i++) {
            float t = v[i] * id;
            /* NaN: a NaN input, inf * 0 when amax is inf, or 0 * inf when 127 / amax overflows */
            if (nan || t != t) { q[i] = 0; continue; }
            if (t > 127.0f) t = 127.0f;
            if (t < -127.0f) t = -127.0f;
            q[i] = (int8_t)round_even(t); /* ties to even, as that code's rounding instruction */
        }
    }
}

void bm_q8_1_sums(const float *x, size_t n, const int8_t *xq, const float *xd, float *xs) {
    for (size_t b = 0; b < n / BMOE_Q8_0_BLOCK; b++) {
        const float *v = x + b * BMOE_Q8_0_BLOCK;
        const int8_t *q = xq + b * BMOE_Q8_0_BLOCK;
        float amax = 0.0f;
        int32_t sum = 0;
        for (int i = 0; i < BMOE_Q8_0_BLOCK; i++) {
            float a = v[i] < 0.0f ? -v[i] : v[i];
            if (a > amax) amax = a; /* a NaN is skipped: its block's scale is NaN already */
            sum += q[i];
        }
        /* ggml's x86 quantize_row_q8_1: d before its f16 rounding times the sum, then to f16 */
        xs[b] = xd[b] != xd[b] ? xd[b] : bm_f16_to_f32(bm_f32_to_f16((amax / 127.0f) * (float)sum));
    }
}

void bm_quantize_q8_1(const float *x, size_t n, int8_t *xq, float *xd, float *xs) {
    bm_quantize_q8_0(x, n, xq, xd);
    bm_q8_1_sums(x, n, xq, xd, xs);
}

void bm_quantize_q8_k(const float *x, size_t n, bm_q8k *y) {
    for (size_t b = 0; b < n / BM_Q8K_BLOCK; b++, x += BM_Q8K_BLOCK) {
        bm_q8k *o = y + b;
        float amax = 0.0f, mx = 0.0f;
        int bad = 0;
        for (int i = 0; i < BM_Q8K_BLOCK; i++) {
            float a = x[i] < 0.0f ? -x[i] : x[i];
            if (!(a <= 3.40282347e+38f)) bad = 1; /* NaN or infinity */
            else if (a > amax) { amax = a; mx = x[i]; }
        }
        memset(o->q, 0, sizeof o->q);
        memset(o->bsums, 0, sizeof o->bsums);
        if (bad) { o->d = (float)NAN; continue; }
        if (amax == 0.0f) { o->d = 0.0f; continue; }
        const float s = -127.0f / mx;
        for (int i = 0; i < BM_Q8K_BLOCK; i++) {
            int v = round_even(s * x[i]);
            o->q[i] = (int8_t)(v > 127 ? 127 : v);
        }
        for (int j = 0; j < BM_Q8K_BLOCK / 16; j++) {
            int sum = 0;
            for (int i = 0; i < 16; i++) sum += o->q[16 * j + i];
            o->bsums[j] = (int16_t)sum;
        }
        o->d = 1.0f / s;
    }
}

static const char *const KPATH_NAMES[BM_KPATH_COUNT] = {"scalar", "avx2", "neon", "neon-dot", "avx512-vnni"};

const char *bm_kpath_name(bm_kpath p) { return (unsigned)p < BM_KPATH_COUNT ? KPATH_NAMES[p] : "?"; }

int bm_kpath_parse(const char *s, int *out) {
    if (!s) return 2;
    if (strcmp(s, "auto") == 0) { *out = -1; return 0; }
    for (int p = 0; p < BM_KPATH_COUNT; p++)
        if (strcmp(s, KPATH_NAMES[p]) == 0) { *out = p; return 0; }
    return 2;
}

/* The quantiser of the scalar path's Q8_1 (the SIMD paths' is their Q8_0 one and bm_q8_1_sums). */
static int fill_path(bm_kpath p, bm_kernels *k) {
    switch (p) {
    case BM_KPATH_SCALAR:
        k->dot_f32 = bm_vdot_f32_scalar;
        k->quantize_q8_0 = bm_quantize_q8_0;
        k->quantize_q8_1 = bm_quantize_q8_1;
        k->silu_mul = bm_silu_mul_scalar;
        k->exp_shift = bm_exp_shift_scalar;
        return 1;
    case BM_KPATH_AVX2: return bm_kernels_avx2(k);
    case BM_KPATH_NEON: return bm_kernels_neon(k, 0);
    case BM_KPATH_NEON_DOT: return bm_kernels_neon(k, 1);
    case BM_KPATH_AVX512: return bm_kernels_avx512(k);
    default: return 0;
    }
}

/* A path's functions, and its column of the type table (the scalar kernel where a row has none for
 * the path: tests/test_kquants.c checks that no supported type lacks one on a compiled path). */
static int fill(bm_kpath p, bm_kernels *k) {
    memset(k, 0, sizeof *k);
    if (!fill_path(p, k)) return 0; /* also the path's dot_tile entries (NULL where it has none) */
    k->path = p;
    k->dot_f32_rows = bm_dot_f32_rows_scalar; /* attention (kernels_attn.c) */
    k->weighted_rows = bm_weighted_rows_scalar;
#if defined(__x86_64__)
    if (p == BM_KPATH_AVX2) k->dot_f32_rows = bm_dot_f32_rows_avx2, k->weighted_rows = bm_weighted_rows_avx2;
    if (p == BM_KPATH_AVX512) {
        k->dot_f32_rows = bm_dot_f32_rows_avx512, k->weighted_rows = bm_weighted_rows_avx512;
        k->dot_f32_rows2 = bm_dot_f32_rows2_avx512, k->weighted_rows2 = bm_weighted_rows2_avx512;
    }
#endif
#if defined(__aarch64__)
    if (p == BM_KPATH_NEON || p == BM_KPATH_NEON_DOT)
        k->dot_f32_rows = bm_dot_f32_rows_neon, k->weighted_rows = bm_weighted_rows_neon;
#endif
    for (uint32_t id = 0; id < GGML_TYPE_COUNT; id++) {
        const bm_type_traits *tt = bm_type(id);
        if (!tt) continue;
        k->dot[id] = tt->dot[p] ? tt->dot[p] : tt->dot[BM_KPATH_SCALAR];
        k->dot_mt[id] = tt->dot_mt[p] ? tt->dot_mt[p] : tt->dot_mt[BM_KPATH_SCALAR];
    }
    return 1;
}

int bm_kpath_available(bm_kpath p) {
    bm_kernels k;
    return fill(p, &k);
}

bm_kpath bm_kpath_best(void) {
    static const bm_kpath order[] = {BM_KPATH_AVX512, BM_KPATH_AVX2, BM_KPATH_NEON_DOT, BM_KPATH_NEON};
    for (size_t i = 0; i < sizeof order / sizeof order[0]; i++)
        if (bm_kpath_available(order[i])) return order[i];
    return BM_KPATH_SCALAR;
}

void bm_kernels_get(bm_kpath p, bm_kernels *k) {
    if (!fill(p, k)) fill(BM_KPATH_SCALAR, k);
}
