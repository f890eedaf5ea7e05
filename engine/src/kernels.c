/* The scalar kernels (they define the bits, kernels.h), activation quantisation, and the run-time
 * choice of path. */
#include "kernels.h"

#include <math.h> /* NAN only */
#include <string.h>

#include "kernels_lanes.h"
#include "tensor.h"

float bm_dot_f32_scalar(const float *a, const float *b, size_t n) {
    float acc[8] = {0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) acc[l] += a[i + l] * b[i + l];
    for (; i < n; i++) acc[i & 7] += a[i] * b[i];
    return bm_sum8(acc);
}

float bm_dot_f16_scalar(const uint8_t *w, const float *x, size_t n) {
    float acc[8] = {0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) acc[l] += bm_f16_to_f32(bm_rd16(w + 2 * (i + l))) * x[i + l];
    for (; i < n; i++) acc[i & 7] += bm_f16_to_f32(bm_rd16(w + 2 * i)) * x[i];
    return bm_sum8(acc);
}

float bm_dot_q8_0_scalar(const uint8_t *w, const int8_t *xq, const float *xd, size_t n) {
    float acc[8] = {0};
    bm_q8_0_blocks(acc, w, xq, xd, 0, n / BMOE_Q8_0_BLOCK);
    return bm_sum8(acc);
}

/* The scalar path's multi-token functions: the per-token loop (kernels.h). */
void bm_dot_f32_mt_scalar(const float *w, const float *x, size_t n, int nt, float *out) {
    for (int t = 0; t < nt; t++) out[t] = bm_dot_f32_scalar(w, x + (size_t)t * n, n);
}

void bm_dot_f16_mt_scalar(const uint8_t *w, const float *x, size_t n, int nt, float *out) {
    for (int t = 0; t < nt; t++) out[t] = bm_dot_f16_scalar(w, x + (size_t)t * n, n);
}

void bm_dot_q8_0_mt_scalar(const uint8_t *w, const int8_t *xq, const float *xd, size_t n, int nt, float *out) {
    for (int t = 0; t < nt; t++)
        out[t] = bm_dot_q8_0_scalar(w, xq + (size_t)t * n, xd + (size_t)t * (n / BMOE_Q8_0_BLOCK), n);
}

float bm_dot_dq_scalar(uint32_t type, const uint8_t *w, const float *x, size_t n) {
    float acc[8] = {0}, y[BMOE_DQ_CHUNK];
    for (size_t i0 = 0; i0 < n; i0 += BMOE_DQ_CHUNK) {
        size_t cnt = n - i0 < BMOE_DQ_CHUNK ? n - i0 : BMOE_DQ_CHUNK;
        bm_dequant_chunk(type, w, i0, cnt, y);
        for (size_t j = 0; j < cnt; j++) acc[j & 7] += y[j] * x[i0 + j]; /* i0 % 8 == 0: lane (i0 + j) mod 8 */
    }
    return bm_sum8(acc);
}

void bm_dot_dq_mt_scalar(uint32_t type, const uint8_t *w, const float *x, size_t n, int nt, float *out) {
    for (int t = 0; t < nt; t++) out[t] = bm_dot_dq_scalar(type, w, x + (size_t)t * n, n);
}

void bm_silu_mul_scalar(const float *g, const float *u, size_t n, float *out) {
    for (size_t i = 0; i < n; i++) out[i] = bm_silu(g[i]) * u[i];
}

void bm_exp_shift_scalar(float *v, size_t n, float mx) {
    for (size_t i = 0; i < n; i++) v[i] = (float)bm_exp((double)v[i] - (double)mx);
}

static int8_t round_q(float t) { /* round half away from zero, |t| <= 127 */
    int r = (int)t;          /* truncates toward zero */
    float frac = t - (float)r; /* exact */
    if (frac >= 0.5f) r++;
    else if (frac <= -0.5f) r--;
    return (int8_t)r;
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
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        xd[b] = nan ? (float)NAN : bm_f16_to_f32(bm_f32_to_f16(d));
        for (int i = 0; i < BMOE_Q8_0_BLOCK; i++) {
            float t = v[i] * id;
            if (nan || t != t) { q[i] = 0; continue; } /* NaN, or inf * 0 when amax is inf */
            if (t > 127.0f) t = 127.0f;
            if (t < -127.0f) t = -127.0f;
            q[i] = round_q(t);
        }
    }
}

static const char *const KPATH_NAMES[BM_KPATH_COUNT] = {"scalar", "avx2", "neon", "neon-dot"};

const char *bm_kpath_name(bm_kpath p) { return (unsigned)p < BM_KPATH_COUNT ? KPATH_NAMES[p] : "?"; }

int bm_kpath_parse(const char *s, int *out) {
    if (!s) return 2;
    if (strcmp(s, "auto") == 0) { *out = -1; return 0; }
    for (int p = 0; p < BM_KPATH_COUNT; p++)
        if (strcmp(s, KPATH_NAMES[p]) == 0) { *out = p; return 0; }
    return 2;
}

static int fill(bm_kpath p, bm_kernels *k) {
    switch (p) {
    case BM_KPATH_SCALAR:
        k->path = BM_KPATH_SCALAR;
        k->dot_f32 = bm_dot_f32_scalar;
        k->dot_f16 = bm_dot_f16_scalar;
        k->dot_q8_0 = bm_dot_q8_0_scalar;
        k->quantize_q8_0 = bm_quantize_q8_0;
        k->dot_f32_mt = bm_dot_f32_mt_scalar;
        k->dot_f16_mt = bm_dot_f16_mt_scalar;
        k->dot_q8_0_mt = bm_dot_q8_0_mt_scalar;
        k->dot_dq = bm_dot_dq_scalar;
        k->dot_dq_mt = bm_dot_dq_mt_scalar;
        k->silu_mul = bm_silu_mul_scalar;
        k->exp_shift = bm_exp_shift_scalar;
        return 1;
    case BM_KPATH_AVX2: return bm_kernels_avx2(k);
    case BM_KPATH_NEON: return bm_kernels_neon(k, 0);
    case BM_KPATH_NEON_DOT: return bm_kernels_neon(k, 1);
    default: return 0;
    }
}

int bm_kpath_available(bm_kpath p) {
    bm_kernels k;
    return fill(p, &k);
}

bm_kpath bm_kpath_best(void) {
    static const bm_kpath order[] = {BM_KPATH_AVX2, BM_KPATH_NEON_DOT, BM_KPATH_NEON};
    for (size_t i = 0; i < sizeof order / sizeof order[0]; i++)
        if (bm_kpath_available(order[i])) return order[i];
    return BM_KPATH_SCALAR;
}

void bm_kernels_get(bm_kpath p, bm_kernels *k) {
    if (!fill(p, k)) fill(BM_KPATH_SCALAR, k);
}
