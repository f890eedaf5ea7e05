/* aarch64 NEON kernels: the scalar path's bits (kernels.h), eight float lanes in two registers.
 *
 * NEON is part of every aarch64 CPU. The Q8_0 block sum uses `sdot` (the dotprod extension) where
 * the CPU reports it (HWCAP_ASIMDDP, Linux), widening multiplies otherwise; both are exact integer sums.
 * Multiply and add are separate instructions (vmulq + vaddq; the build has -ffp-contract=off). */
#include "kernels.h"

#if defined(__aarch64__)
#include <arm_neon.h>
#if defined(__linux__)
#include <sys/auxv.h>
#endif

#include "gguf.h"
#include "kernels_lanes.h"

#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1UL << 20)
#endif

#define DOT_FN __attribute__((target("arch=armv8.2-a+dotprod")))
#define BM_VEXP_FN /* NEON is the baseline: no attribute */
#include "kernels_vexp.h"

static float dot_f32_neon(const float *a, const float *b, size_t n) {
    float32x4_t a0 = vdupq_n_f32(0.0f), a1 = vdupq_n_f32(0.0f);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        a0 = vaddq_f32(a0, vmulq_f32(vld1q_f32(a + i), vld1q_f32(b + i)));
        a1 = vaddq_f32(a1, vmulq_f32(vld1q_f32(a + i + 4), vld1q_f32(b + i + 4)));
    }
    float l[8];
    vst1q_f32(l, a0);
    vst1q_f32(l + 4, a1);
    bm_simd_tail_f32(l, a, b, i, n);
    return bm_simd_sum8(l);
}

static float dot_f16_neon(const uint8_t *w, const float *x, size_t n) {
    float32x4_t a0 = vdupq_n_f32(0.0f), a1 = vdupq_n_f32(0.0f);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint16x8_t h = vreinterpretq_u16_u8(vld1q_u8(w + 2 * i)); /* little-endian halves */
        float32x4_t w0 = vcvt_f32_f16(vreinterpret_f16_u16(vget_low_u16(h)));  /* exact */
        float32x4_t w1 = vcvt_f32_f16(vreinterpret_f16_u16(vget_high_u16(h)));
        a0 = vaddq_f32(a0, vmulq_f32(w0, vld1q_f32(x + i)));
        a1 = vaddq_f32(a1, vmulq_f32(w1, vld1q_f32(x + i + 4)));
    }
    float l[8];
    vst1q_f32(l, a0);
    vst1q_f32(l + 4, a1);
    for (; i < n; i++) l[i & 7] += bm_f16_to_f32(bm_rd16(w + 2 * i)) * x[i];
    return bm_simd_sum8(l);
}

static inline int32_t block_dot_mull(const uint8_t *blk, const int8_t *p) {
    const int8_t *q = (const int8_t *)(blk + 2);
    int8x16_t w0 = vld1q_s8(q), w1 = vld1q_s8(q + 16), x0 = vld1q_s8(p), x1 = vld1q_s8(p + 16);
    /* |w * x| <= 128 * 127, two of them fit an int16 */
    int16x8_t p0 = vmlal_s8(vmull_s8(vget_low_s8(w0), vget_low_s8(x0)), vget_high_s8(w0), vget_high_s8(x0));
    int16x8_t p1 = vmlal_s8(vmull_s8(vget_low_s8(w1), vget_low_s8(x1)), vget_high_s8(w1), vget_high_s8(x1));
    return vaddvq_s32(vpadalq_s16(vpaddlq_s16(p0), p1));
}

DOT_FN static inline int32_t block_dot_sdot(const uint8_t *blk, const int8_t *p) {
    const int8_t *q = (const int8_t *)(blk + 2);
    int32x4_t s = vdotq_s32(vdupq_n_s32(0), vld1q_s8(q), vld1q_s8(p));
    s = vdotq_s32(s, vld1q_s8(q + 16), vld1q_s8(p + 16));
    return vaddvq_s32(s);
}

/* Eight blocks' exact sums s[0..7] into the two lane registers, as the scalar path adds them. */
static inline void add8(float32x4_t *a0, float32x4_t *a1, const int32_t s[8], const uint8_t *w, const uint8_t *blk,
                        const float *xd) {
    uint16_t sc[8];
    for (int k = 0; k < 8; k++) {
#ifndef BMOE_FAULT_Q8_0_FIRST_SCALE
        sc[k] = bm_rd16(blk + (size_t)k * BMOE_Q8_0_BYTES);
#else
        sc[k] = bm_rd16(w); /* fault: every block uses the row's first scale */
#endif
    }
    (void)w;
    uint16x8_t h = vld1q_u16(sc);
    float32x4_t d0 = vmulq_f32(vcvt_f32_f16(vreinterpret_f16_u16(vget_low_u16(h))), vld1q_f32(xd));
    float32x4_t d1 = vmulq_f32(vcvt_f32_f16(vreinterpret_f16_u16(vget_high_u16(h))), vld1q_f32(xd + 4));
    *a0 = vaddq_f32(*a0, vmulq_f32(vcvtq_f32_s32(vld1q_s32(s)), d0));
    *a1 = vaddq_f32(*a1, vmulq_f32(vcvtq_f32_s32(vld1q_s32(s + 4)), d1));
}

static float tail_q8_0(float l[8], const uint8_t *w, const int8_t *xq, const float *xd, size_t b, size_t nb) {
    bm_q8_0_blocks(l, w, xq, xd, b, nb);
    return bm_simd_sum8(l);
}

static float dot_q8_0_neon(const uint8_t *w, const int8_t *xq, const float *xd, size_t n) {
    size_t nb = n / BMOE_Q8_0_BLOCK, b = 0;
    float32x4_t a0 = vdupq_n_f32(0.0f), a1 = vdupq_n_f32(0.0f);
    for (; b + 8 <= nb; b += 8) {
        const uint8_t *blk = w + b * BMOE_Q8_0_BYTES;
        bm_prefetch_ahead(blk, 8 * BMOE_Q8_0_BYTES);
        int32_t s[8];
        for (int k = 0; k < 8; k++)
            s[k] = block_dot_mull(blk + (size_t)k * BMOE_Q8_0_BYTES, xq + (b + (size_t)k) * BMOE_Q8_0_BLOCK);
        add8(&a0, &a1, s, w, blk, xd + b);
    }
    float l[8];
    vst1q_f32(l, a0);
    vst1q_f32(l + 4, a1);
    return tail_q8_0(l, w, xq, xd, b, nb);
}

DOT_FN static float dot_q8_0_neon_dot(const uint8_t *w, const int8_t *xq, const float *xd, size_t n) {
    size_t nb = n / BMOE_Q8_0_BLOCK, b = 0;
    float32x4_t a0 = vdupq_n_f32(0.0f), a1 = vdupq_n_f32(0.0f);
    for (; b + 8 <= nb; b += 8) {
        const uint8_t *blk = w + b * BMOE_Q8_0_BYTES;
        bm_prefetch_ahead(blk, 8 * BMOE_Q8_0_BYTES);
        int32_t s[8];
        for (int k = 0; k < 8; k++)
            s[k] = block_dot_sdot(blk + (size_t)k * BMOE_Q8_0_BYTES, xq + (b + (size_t)k) * BMOE_Q8_0_BLOCK);
        add8(&a0, &a1, s, w, blk, xd + b);
    }
    float l[8];
    vst1q_f32(l, a0);
    vst1q_f32(l + 4, a1);
    return tail_q8_0(l, w, xq, xd, b, nb);
}

/* ---- several tokens per call (kernels.h, *_mt): each token's lanes, adds and tree are the one-token
 * function's; what is shared is loading (and converting) the weights. NT is a constant after
 * inlining, so the per-token accumulators live in registers. */

#define MT_FN __attribute__((always_inline)) static inline

MT_FN void f32_mt(const float *w, const float *x, size_t n, const int NT, float *out) {
    float32x4_t a0[BM_MT_MAX], a1[BM_MT_MAX];
#pragma GCC unroll 4
    for (int t = 0; t < NT; t++) a0[t] = a1[t] = vdupq_n_f32(0.0f);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        float32x4_t w0 = vld1q_f32(w + i), w1 = vld1q_f32(w + i + 4);
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++) {
            const float *xt = x + (size_t)t * n + i;
            a0[t] = vaddq_f32(a0[t], vmulq_f32(w0, vld1q_f32(xt)));
            a1[t] = vaddq_f32(a1[t], vmulq_f32(w1, vld1q_f32(xt + 4)));
        }
    }
    for (int t = 0; t < NT; t++) {
        const float *xt = x + (size_t)t * n;
        float l[8];
        vst1q_f32(l, a0[t]);
        vst1q_f32(l + 4, a1[t]);
        bm_simd_tail_f32(l, w, xt, i, n);
        out[t] = bm_simd_sum8(l);
    }
}

MT_FN void f16_mt(const uint8_t *w, const float *x, size_t n, const int NT, float *out) {
    float32x4_t a0[BM_MT_MAX], a1[BM_MT_MAX];
#pragma GCC unroll 4
    for (int t = 0; t < NT; t++) a0[t] = a1[t] = vdupq_n_f32(0.0f);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint16x8_t h = vreinterpretq_u16_u8(vld1q_u8(w + 2 * i)); /* little-endian halves */
        float32x4_t w0 = vcvt_f32_f16(vreinterpret_f16_u16(vget_low_u16(h)));  /* exact */
        float32x4_t w1 = vcvt_f32_f16(vreinterpret_f16_u16(vget_high_u16(h)));
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++) {
            const float *xt = x + (size_t)t * n + i;
            a0[t] = vaddq_f32(a0[t], vmulq_f32(w0, vld1q_f32(xt)));
            a1[t] = vaddq_f32(a1[t], vmulq_f32(w1, vld1q_f32(xt + 4)));
        }
    }
    for (int t = 0; t < NT; t++) {
        const float *xt = x + (size_t)t * n;
        float l[8];
        vst1q_f32(l, a0[t]);
        vst1q_f32(l + 4, a1[t]);
        for (size_t j = i; j < n; j++) l[j & 7] += bm_f16_to_f32(bm_rd16(w + 2 * j)) * xt[j];
        out[t] = bm_simd_sum8(l);
    }
}

/* The eight scales of blocks blk .. blk + 7 as floats (exact), in two registers. */
static inline void scales8(const uint8_t *w, const uint8_t *blk, float32x4_t *d0, float32x4_t *d1) {
    uint16_t sc[8];
    for (int k = 0; k < 8; k++) {
#ifndef BMOE_FAULT_Q8_0_FIRST_SCALE
        sc[k] = bm_rd16(blk + (size_t)k * BMOE_Q8_0_BYTES);
#else
        sc[k] = bm_rd16(w); /* fault: every block uses the row's first scale */
#endif
    }
    (void)w;
    uint16x8_t h = vld1q_u16(sc);
    *d0 = vcvt_f32_f16(vreinterpret_f16_u16(vget_low_u16(h)));
    *d1 = vcvt_f32_f16(vreinterpret_f16_u16(vget_high_u16(h)));
}

/* Block k's int32 partial sums p[k] (any split of its exact sum) to lane k of the result, for four
 * blocks: pairwise adds, exact. */
static inline int32x4_t sums4(int32x4_t p0, int32x4_t p1, int32x4_t p2, int32x4_t p3) {
    return vpaddq_s32(vpaddq_s32(p0, p1), vpaddq_s32(p2, p3));
}

/* One token's eight block sums (lanes of s0, s1) into its lane registers, as add8 does it. */
static inline void acc8(float32x4_t *a0, float32x4_t *a1, int32x4_t s0, int32x4_t s1, float32x4_t dw0,
                        float32x4_t dw1, const float *xd) {
    float32x4_t d0 = vmulq_f32(dw0, vld1q_f32(xd)), d1 = vmulq_f32(dw1, vld1q_f32(xd + 4));
    *a0 = vaddq_f32(*a0, vmulq_f32(vcvtq_f32_s32(s0), d0));
    *a1 = vaddq_f32(*a1, vmulq_f32(vcvtq_f32_s32(s1), d1));
}

static inline int32x4_t part_mull(int8x16_t w0, int8x16_t w1, const int8_t *p) {
    int8x16_t x0 = vld1q_s8(p), x1 = vld1q_s8(p + 16);
    int16x8_t p0 = vmlal_s8(vmull_s8(vget_low_s8(w0), vget_low_s8(x0)), vget_high_s8(w0), vget_high_s8(x0));
    int16x8_t p1 = vmlal_s8(vmull_s8(vget_low_s8(w1), vget_low_s8(x1)), vget_high_s8(w1), vget_high_s8(x1));
    return vpadalq_s16(vpaddlq_s16(p0), p1);
}

DOT_FN static inline int32x4_t part_sdot(int8x16_t w0, int8x16_t w1, const int8_t *p) {
    return vdotq_s32(vdotq_s32(vdupq_n_s32(0), w0, vld1q_s8(p)), w1, vld1q_s8(p + 16));
}

/* The Q8_0 multi-token body, once per block-sum flavour (DOT: sdot, else widening multiplies). */
#define Q8_0_MT_BODY(PART)                                                                                         \
    size_t nb = n / BMOE_Q8_0_BLOCK, b = 0;                                                                        \
    float32x4_t a0[BM_MT_MAX], a1[BM_MT_MAX];                                                                      \
    _Pragma("GCC unroll 4") for (int t = 0; t < NT; t++) a0[t] = a1[t] = vdupq_n_f32(0.0f);                        \
    for (; b + 8 <= nb; b += 8) {                                                                                  \
        const uint8_t *blk = w + b * BMOE_Q8_0_BYTES;                                                              \
        bm_prefetch_ahead(blk, 8 * BMOE_Q8_0_BYTES);                                                               \
        int32x4_t s[2][BM_MT_MAX];                                                                                 \
        for (int g = 0; g < 2; g++) {                                                                              \
            int8x16_t wl[4], wh[4];                                                                                \
            for (int k = 0; k < 4; k++) {                                                                          \
                const int8_t *q = (const int8_t *)(blk + (size_t)(4 * g + k) * BMOE_Q8_0_BYTES + 2);               \
                wl[k] = vld1q_s8(q);                                                                               \
                wh[k] = vld1q_s8(q + 16);                                                                          \
            }                                                                                                      \
            _Pragma("GCC unroll 4") for (int t = 0; t < NT; t++) {                                                 \
                const int8_t *p = xq + (size_t)t * n + (b + 4 * (size_t)g) * BMOE_Q8_0_BLOCK;                      \
                s[g][t] = sums4(PART(wl[0], wh[0], p), PART(wl[1], wh[1], p + 32), PART(wl[2], wh[2], p + 64),     \
                                PART(wl[3], wh[3], p + 96));                                                       \
            }                                                                                                      \
        }                                                                                                          \
        float32x4_t dw0, dw1;                                                                                      \
        scales8(w, blk, &dw0, &dw1);                                                                               \
        _Pragma("GCC unroll 4") for (int t = 0; t < NT; t++)                                                       \
            acc8(&a0[t], &a1[t], s[0][t], s[1][t], dw0, dw1, xd + (size_t)t * nb + b);                             \
    }                                                                                                              \
    for (int t = 0; t < NT; t++) {                                                                                 \
        float l[8];                                                                                                \
        vst1q_f32(l, a0[t]);                                                                                       \
        vst1q_f32(l + 4, a1[t]);                                                                                   \
        out[t] = tail_q8_0(l, w, xq + (size_t)t * n, xd + (size_t)t * nb, b, nb);                                  \
    }

MT_FN void q8_0_mt_mull(const uint8_t *w, const int8_t *xq, const float *xd, size_t n, const int NT, float *out) {
    Q8_0_MT_BODY(part_mull)
}

DOT_FN MT_FN void q8_0_mt_sdot(const uint8_t *w, const int8_t *xq, const float *xd, size_t n, const int NT, float *out) {
    Q8_0_MT_BODY(part_sdot)
}

static void dot_f32_mt_neon(const float *w, const float *x, size_t n, int nt, float *out) {
    switch (nt) {
    case 4: f32_mt(w, x, n, 4, out); break;
    case 3: f32_mt(w, x, n, 3, out); break;
    case 2: f32_mt(w, x, n, 2, out); break;
    default: out[0] = dot_f32_neon(w, x, n);
    }
}

static void dot_f16_mt_neon(const uint8_t *w, const float *x, size_t n, int nt, float *out) {
    switch (nt) {
    case 4: f16_mt(w, x, n, 4, out); break;
    case 3: f16_mt(w, x, n, 3, out); break;
    case 2: f16_mt(w, x, n, 2, out); break;
    default: out[0] = dot_f16_neon(w, x, n);
    }
}

static void dot_q8_0_mt_neon(const uint8_t *w, const int8_t *xq, const float *xd, size_t n, int nt, float *out) {
    switch (nt) {
    case 4: q8_0_mt_mull(w, xq, xd, n, 4, out); break;
    case 3: q8_0_mt_mull(w, xq, xd, n, 3, out); break;
    case 2: q8_0_mt_mull(w, xq, xd, n, 2, out); break;
    default: out[0] = dot_q8_0_neon(w, xq, xd, n);
    }
}

DOT_FN static void dot_q8_0_mt_neon_dot(const uint8_t *w, const int8_t *xq, const float *xd, size_t n, int nt,
                                        float *out) {
    switch (nt) {
    case 4: q8_0_mt_sdot(w, xq, xd, n, 4, out); break;
    case 3: q8_0_mt_sdot(w, xq, xd, n, 3, out); break;
    case 2: q8_0_mt_sdot(w, xq, xd, n, 2, out); break;
    default: out[0] = dot_q8_0_neon_dot(w, xq, xd, n);
    }
}

/* ---- dequantised types (kernels.h): the weights become the floats bm_dequant_chunk gives (four or
 * eight at a time here, with the same IEEE operations per value: the integer levels convert exactly),
 * then the F32 dot product's lanes, adds and tree. */

/* Eight bytes as two int32x4 (values 0..255). */
static inline void u8x8(const uint8_t *p, int32x4_t *a, int32x4_t *b) {
    uint16x8_t h = vmovl_u8(vld1_u8(p));
    *a = vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(h)));
    *b = vreinterpretq_s32_u32(vmovl_u16(vget_high_u16(h)));
}

static void dq_q4_K_neon(const uint8_t *blk, float *y) {
    const float d = bm_f16_to_f32(bm_rd16(blk)), dmin = bm_f16_to_f32(bm_rd16(blk + 2));
    const int32x4_t m4 = vdupq_n_s32(0xF);
    for (int j = 0; j < 4; j++) {
        uint8_t sc, m;
        bm_scale_min_k4(2 * j, blk + 4, &sc, &m);
        const float32x4_t d1 = vdupq_n_f32(d * (float)sc), m1 = vdupq_n_f32(dmin * (float)m);
        bm_scale_min_k4(2 * j + 1, blk + 4, &sc, &m);
        const float32x4_t d2 = vdupq_n_f32(d * (float)sc), m2 = vdupq_n_f32(dmin * (float)m);
        const uint8_t *q = blk + 16 + 32 * j;
        for (int l = 0; l < 32; l += 8) {
            int32x4_t v[2];
            u8x8(q + l, &v[0], &v[1]);
            for (int h = 0; h < 2; h++) {
                float32x4_t lo = vcvtq_f32_s32(vandq_s32(v[h], m4)), hi = vcvtq_f32_s32(vshrq_n_s32(v[h], 4));
                vst1q_f32(y + 64 * j + l + 4 * h, vsubq_f32(vmulq_f32(d1, lo), m1));
                vst1q_f32(y + 64 * j + 32 + l + 4 * h, vsubq_f32(vmulq_f32(d2, hi), m2));
            }
        }
    }
}

static void dq_q6_K_neon(const uint8_t *blk, float *y) {
    const uint8_t *ql = blk, *qh = blk + 128;
    const int8_t *sc = (const int8_t *)(blk + 192);
    const float d = bm_f16_to_f32(bm_rd16(blk + 208));
    const int32x4_t m4 = vdupq_n_s32(0xF), m3 = vdupq_n_s32(3), k32 = vdupq_n_s32(32);
#ifndef BMOE_FAULT_Q6_K_HIGH_SHIFT
    const int32x4_t s2 = vdupq_n_s32(-2), s3 = vdupq_n_s32(-4);
#else
    const int32x4_t s2 = vdupq_n_s32(-4), s3 = vdupq_n_s32(-2); /* fault: as in tensor.c */
#endif
    for (int n = 0; n < 2; n++, ql += 64, qh += 32, sc += 8, y += 128) {
        for (int l = 0; l < 32; l += 8) {
            int is = l / 16;
            const float32x4_t f1 = vdupq_n_f32(d * (float)sc[is]), f2 = vdupq_n_f32(d * (float)sc[is + 2]);
            const float32x4_t f3 = vdupq_n_f32(d * (float)sc[is + 4]), f4 = vdupq_n_f32(d * (float)sc[is + 6]);
            int32x4_t a[2], b[2], h[2];
            u8x8(ql + l, &a[0], &a[1]);
            u8x8(ql + l + 32, &b[0], &b[1]);
            u8x8(qh + l, &h[0], &h[1]);
            for (int u = 0; u < 2; u++) {
                int32x4_t q1 = vsubq_s32(vorrq_s32(vandq_s32(a[u], m4), vshlq_n_s32(vandq_s32(h[u], m3), 4)), k32);
                int32x4_t q2 = vsubq_s32(vorrq_s32(vandq_s32(b[u], m4), vshlq_n_s32(vandq_s32(vshlq_s32(h[u], s2), m3), 4)), k32);
                int32x4_t q3 = vsubq_s32(vorrq_s32(vshrq_n_s32(a[u], 4), vshlq_n_s32(vandq_s32(vshlq_s32(h[u], s3), m3), 4)), k32);
                int32x4_t q4 = vsubq_s32(vorrq_s32(vshrq_n_s32(b[u], 4), vshlq_n_s32(vshrq_n_s32(h[u], 6), 4)), k32);
                vst1q_f32(y + l + 4 * u, vmulq_f32(f1, vcvtq_f32_s32(q1)));
                vst1q_f32(y + l + 32 + 4 * u, vmulq_f32(f2, vcvtq_f32_s32(q2)));
                vst1q_f32(y + l + 64 + 4 * u, vmulq_f32(f3, vcvtq_f32_s32(q3)));
                vst1q_f32(y + l + 96 + 4 * u, vmulq_f32(f4, vcvtq_f32_s32(q4)));
            }
        }
    }
}

static void dq_q5_K_neon(const uint8_t *blk, float *y) {
    const float d = bm_f16_to_f32(bm_rd16(blk)), dmin = bm_f16_to_f32(bm_rd16(blk + 2));
    const int32x4_t m4 = vdupq_n_s32(0xF), one = vdupq_n_s32(1);
    const uint8_t *qh = blk + 16;
    for (int j = 0; j < 4; j++) {
        uint8_t sc, m;
        bm_scale_min_k4(2 * j, blk + 4, &sc, &m);
        const float32x4_t d1 = vdupq_n_f32(d * (float)sc), m1 = vdupq_n_f32(dmin * (float)m);
        bm_scale_min_k4(2 * j + 1, blk + 4, &sc, &m);
        const float32x4_t d2 = vdupq_n_f32(d * (float)sc), m2 = vdupq_n_f32(dmin * (float)m);
        const int32x4_t s1 = vdupq_n_s32(-2 * j), s2 = vdupq_n_s32(-2 * j - 1);
        const uint8_t *q = blk + 48 + 32 * j;
        for (int l = 0; l < 32; l += 8) {
            int32x4_t v[2], h[2];
            u8x8(q + l, &v[0], &v[1]);
            u8x8(qh + l, &h[0], &h[1]);
            for (int u = 0; u < 2; u++) {
                int32x4_t lo = vorrq_s32(vandq_s32(v[u], m4), vshlq_n_s32(vandq_s32(vshlq_s32(h[u], s1), one), 4));
                int32x4_t hi = vorrq_s32(vshrq_n_s32(v[u], 4), vshlq_n_s32(vandq_s32(vshlq_s32(h[u], s2), one), 4));
                vst1q_f32(y + 64 * j + l + 4 * u, vsubq_f32(vmulq_f32(d1, vcvtq_f32_s32(lo)), m1));
                vst1q_f32(y + 64 * j + 32 + l + 4 * u, vsubq_f32(vmulq_f32(d2, vcvtq_f32_s32(hi)), m2));
            }
        }
    }
}

/* Q4_0 / Q5_0 blocks b0 .. b0 + nb - 1: (float)(q - 8) * d, (float)(q - 16) * d, as tensor.c. */
static void dq_q4_5_0_neon(int five, const uint8_t *w, size_t b0, size_t nb, float *y) {
    static const int32_t jv[4] = {0, 1, 2, 3};
    const int32x4_t m4 = vdupq_n_s32(0xF), one = vdupq_n_s32(1), off = vdupq_n_s32(five ? 16 : 8);
    const int32x4_t j4 = vld1q_s32(jv);
    const size_t bb = five ? BMOE_Q5_0_BYTES : BMOE_Q4_0_BYTES;
    for (size_t b = 0; b < nb; b++, y += 32) {
        const uint8_t *blk = w + (b0 + b) * bb, *qs = blk + (five ? 6 : 2);
        const float32x4_t d = vdupq_n_f32(bm_f16_to_f32(bm_rd16(blk)));
        uint32_t qh32 = five ? ((uint32_t)blk[2] | ((uint32_t)blk[3] << 8) | ((uint32_t)blk[4] << 16) |
                                ((uint32_t)blk[5] << 24))
                             : 0u;
        const uint32x4_t qh = vdupq_n_u32(qh32);
        for (int g = 0; g < 4; g++) { /* values 4g .. 4g+3 (low nibbles) and 16+4g .. (high) */
            int32x4_t v[2];
            u8x8(qs + 8 * (g / 2), &v[0], &v[1]);
            int32x4_t x = v[g & 1];
            int32x4_t lo = vandq_s32(x, m4), hi = vshrq_n_s32(x, 4);
            if (five) {
                int32x4_t jl = vaddq_s32(j4, vdupq_n_s32(4 * g));
                int32x4_t bl = vreinterpretq_s32_u32(vshlq_u32(qh, vnegq_s32(jl)));
                int32x4_t bh = vreinterpretq_s32_u32(vshlq_u32(qh, vnegq_s32(vaddq_s32(jl, vdupq_n_s32(16)))));
                lo = vorrq_s32(lo, vshlq_n_s32(vandq_s32(bl, one), 4));
                hi = vorrq_s32(hi, vshlq_n_s32(vandq_s32(bh, one), 4));
            }
            vst1q_f32(y + 4 * g, vmulq_f32(vcvtq_f32_s32(vsubq_s32(lo, off)), d));
            vst1q_f32(y + 16 + 4 * g, vmulq_f32(vcvtq_f32_s32(vsubq_s32(hi, off)), d));
        }
    }
}

static void dq_bf16_neon(const uint8_t *w, size_t i0, size_t cnt, float *y) {
    size_t i = 0;
    for (; i + 4 <= cnt; i += 4) {
        uint32x4_t h = vshll_n_u16(vreinterpret_u16_u8(vld1_u8(w + 2 * (i0 + i))), 16); /* exact */
        vst1q_f32(y + i, vreinterpretq_f32_u32(h));
    }
    if (i < cnt) bm_dequant_chunk(GGML_TYPE_BF16, w, i0 + i, cnt - i, y + i);
}

static inline void dq_chunk_neon(uint32_t type, const uint8_t *w, size_t i0, size_t cnt, float *y) {
    switch (type) {
    case GGML_TYPE_Q4_K: dq_q4_K_neon(w + i0 / BMOE_QK_K * BMOE_Q4_K_BYTES, y); break;
    case GGML_TYPE_Q5_K: dq_q5_K_neon(w + i0 / BMOE_QK_K * BMOE_Q5_K_BYTES, y); break;
    case GGML_TYPE_Q6_K: dq_q6_K_neon(w + i0 / BMOE_QK_K * BMOE_Q6_K_BYTES, y); break;
    case GGML_TYPE_Q4_0: dq_q4_5_0_neon(0, w, i0 / 32, cnt / 32, y); break;
    case GGML_TYPE_Q5_0: dq_q4_5_0_neon(1, w, i0 / 32, cnt / 32, y); break;
    case GGML_TYPE_BF16: dq_bf16_neon(w, i0, cnt, y); break;
    default: bm_dequant_chunk(type, w, i0, cnt, y);
    }
}

/* One chunk's floats y[0..cnt) times x[0..cnt) onto the lanes (a0: 0-3, a1: 4-7); a tail past the
 * last eight (only in a row's last chunk) as the F32 kernel adds it. */
static inline void dq_acc(float32x4_t *a0, float32x4_t *a1, const float *y, const float *x, size_t cnt) {
    size_t j = 0;
    for (; j + 8 <= cnt; j += 8) {
        *a0 = vaddq_f32(*a0, vmulq_f32(vld1q_f32(y + j), vld1q_f32(x + j)));
        *a1 = vaddq_f32(*a1, vmulq_f32(vld1q_f32(y + j + 4), vld1q_f32(x + j + 4)));
    }
    if (j < cnt) {
        float l[8];
        vst1q_f32(l, *a0);
        vst1q_f32(l + 4, *a1);
        bm_simd_tail_f32(l, y, x, j, cnt);
        *a0 = vld1q_f32(l);
        *a1 = vld1q_f32(l + 4);
    }
}

static float dot_dq_neon(uint32_t type, const uint8_t *w, const float *x, size_t n) {
    float32x4_t a0 = vdupq_n_f32(0.0f), a1 = vdupq_n_f32(0.0f);
    float y[BMOE_DQ_CHUNK];
    for (size_t i0 = 0; i0 < n; i0 += BMOE_DQ_CHUNK) {
        size_t cnt = n - i0 < BMOE_DQ_CHUNK ? n - i0 : BMOE_DQ_CHUNK;
        dq_chunk_neon(type, w, i0, cnt, y);
        dq_acc(&a0, &a1, y, x + i0, cnt);
    }
    float l[8];
    vst1q_f32(l, a0);
    vst1q_f32(l + 4, a1);
    return bm_simd_sum8(l);
}

static void dot_dq_mt_neon(uint32_t type, const uint8_t *w, const float *x, size_t n, int nt, float *out) {
    float32x4_t a0[BM_MT_MAX], a1[BM_MT_MAX];
    for (int t = 0; t < nt; t++) a0[t] = a1[t] = vdupq_n_f32(0.0f);
    float y[BMOE_DQ_CHUNK];
    for (size_t i0 = 0; i0 < n; i0 += BMOE_DQ_CHUNK) {
        size_t cnt = n - i0 < BMOE_DQ_CHUNK ? n - i0 : BMOE_DQ_CHUNK;
        dq_chunk_neon(type, w, i0, cnt, y); /* once for every token */
        for (int t = 0; t < nt; t++) dq_acc(&a0[t], &a1[t], y, x + (size_t)t * n + i0, cnt);
    }
    for (int t = 0; t < nt; t++) {
        float l[8];
        vst1q_f32(l, a0[t]);
        vst1q_f32(l + 4, a1[t]);
        out[t] = bm_simd_sum8(l);
    }
}

int bm_kernels_neon(bm_kernels *k, int dot) {
#if defined(__linux__)
    if (dot && !(getauxval(AT_HWCAP) & HWCAP_ASIMDDP)) return 0;
#else
    if (dot) return 0; /* no HWCAP outside Linux: the widening-multiply path */
#endif
    k->path = dot ? BM_KPATH_NEON_DOT : BM_KPATH_NEON;
    k->dot_f32 = dot_f32_neon;
    k->dot_f16 = dot_f16_neon;
    k->dot_q8_0 = dot ? dot_q8_0_neon_dot : dot_q8_0_neon;
    k->quantize_q8_0 = bm_quantize_q8_0; /* O(n) against the O(n * rows) dot products */
    k->dot_f32_mt = dot_f32_mt_neon;
    k->dot_f16_mt = dot_f16_mt_neon;
    k->dot_q8_0_mt = dot ? dot_q8_0_mt_neon_dot : dot_q8_0_mt_neon;
    k->dot_dq = dot_dq_neon;
    k->dot_dq_mt = dot_dq_mt_neon;
    k->silu_mul = bm_vsilu_mul;
    k->exp_shift = bm_vexp_shift;
    return 1;
}

#else

int bm_kernels_neon(bm_kernels *k, int dot) {
    (void)k;
    (void)dot;
    return 0;
}

#endif
