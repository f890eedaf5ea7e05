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

/* ---- Q4_0 / Q5_0 against Q8_0 blocks (kernels.h): the Q8_0 kernels with the weights' levels
 * unpacked to signed bytes first. */

/* Block blk's 32 signed levels (bm_q45_0_levels): v0 values 0-15 (low nibbles), v1 16-31 (high). */
static inline void q45_0_levels(uint32_t type, const uint8_t *blk, int8x16_t *v0, int8x16_t *v1) {
    const int five = type == GGML_TYPE_Q5_0;
    const uint8x16_t t = vld1q_u8(blk + (five ? 6 : 2));
    uint8x16_t lo = vandq_u8(t, vdupq_n_u8(0xF)), hi = vshrq_n_u8(t, 4);
    if (five) { /* value i's fifth bit is bit i of qh: byte i / 8 of it, tested against 1 << (i mod 8) */
        static const uint8_t IDX0[16] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1};
        static const uint8_t IDX1[16] = {2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3};
        static const uint8_t BIT[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
        const uint32_t qh = (uint32_t)blk[2] | ((uint32_t)blk[3] << 8) | ((uint32_t)blk[4] << 16) |
                            ((uint32_t)blk[5] << 24);
        const uint8x16_t q4 = vreinterpretq_u8_u32(vdupq_n_u32(qh)); /* bytes 0-3: qh, little-endian */
        const uint8x16_t k16 = vdupq_n_u8(0x10), bit = vld1q_u8(BIT);
        lo = vorrq_u8(lo, vandq_u8(vtstq_u8(vqtbl1q_u8(q4, vld1q_u8(IDX0)), bit), k16));
        hi = vorrq_u8(hi, vandq_u8(vtstq_u8(vqtbl1q_u8(q4, vld1q_u8(IDX1)), bit), k16));
    }
    const int8x16_t off = vdupq_n_s8(five ? 16 : 8);
    *v0 = vsubq_s8(vreinterpretq_s8_u8(lo), off);
    *v1 = vsubq_s8(vreinterpretq_s8_u8(hi), off);
}

/* The eight f16 scales of blocks blk, blk + bb, ... as floats (exact), in two registers. */
static inline void scales8_stride(const uint8_t *blk, size_t bb, float32x4_t *d0, float32x4_t *d1) {
    uint16_t sc[8];
    for (int k = 0; k < 8; k++) sc[k] = bm_rd16(blk + (size_t)k * bb);
    uint16x8_t h = vld1q_u16(sc);
    *d0 = vcvt_f32_f16(vreinterpret_f16_u16(vget_low_u16(h)));
    *d1 = vcvt_f32_f16(vreinterpret_f16_u16(vget_high_u16(h)));
}

#define Q45_0_MT_BODY(PART)                                                                                        \
    const size_t nb = n / BMOE_Q8_0_BLOCK, bb = bm_q45_0_bytes(type);                                              \
    size_t b = 0;                                                                                                  \
    float32x4_t a0[BM_MT_MAX], a1[BM_MT_MAX];                                                                      \
    _Pragma("GCC unroll 4") for (int t = 0; t < NT; t++) a0[t] = a1[t] = vdupq_n_f32(0.0f);                        \
    for (; b + 8 <= nb; b += 8) {                                                                                  \
        const uint8_t *blk = w + b * bb;                                                                           \
        bm_prefetch_ahead(blk, 8 * bb);                                                                            \
        int32x4_t s[2][BM_MT_MAX];                                                                                 \
        for (int g = 0; g < 2; g++) {                                                                              \
            int8x16_t wl[4], wh[4];                                                                                \
            for (int k = 0; k < 4; k++) q45_0_levels(type, blk + (size_t)(4 * g + k) * bb, &wl[k], &wh[k]);       \
            _Pragma("GCC unroll 4") for (int t = 0; t < NT; t++) {                                                 \
                const int8_t *p = xq + (size_t)t * n + (b + 4 * (size_t)g) * BMOE_Q8_0_BLOCK;                      \
                s[g][t] = sums4(PART(wl[0], wh[0], p), PART(wl[1], wh[1], p + 32), PART(wl[2], wh[2], p + 64),     \
                                PART(wl[3], wh[3], p + 96));                                                       \
            }                                                                                                      \
        }                                                                                                          \
        float32x4_t dw0, dw1;                                                                                      \
        scales8_stride(blk, bb, &dw0, &dw1);                                                                       \
        _Pragma("GCC unroll 4") for (int t = 0; t < NT; t++)                                                       \
            acc8(&a0[t], &a1[t], s[0][t], s[1][t], dw0, dw1, xd + (size_t)t * nb + b);                             \
    }                                                                                                              \
    for (int t = 0; t < NT; t++) {                                                                                 \
        float l[8];                                                                                                \
        vst1q_f32(l, a0[t]);                                                                                       \
        vst1q_f32(l + 4, a1[t]);                                                                                   \
        for (size_t bt = b; bt < nb; bt++) { /* the last nb mod 8 blocks: bm_q45_0_blocks, SIMD integer sums */     \
            const uint8_t *blk = w + bt * bb;                                                                      \
            int8x16_t wl, wh;                                                                                      \
            q45_0_levels(type, blk, &wl, &wh);                                                                     \
            int32_t st = vaddvq_s32(PART(wl, wh, xq + (size_t)t * n + bt * BMOE_Q8_0_BLOCK));                      \
            l[bt & 7] += (float)st * (bm_f16_to_f32(bm_rd16(blk)) * xd[(size_t)t * nb + bt]);                      \
        }                                                                                                          \
        out[t] = bm_simd_sum8(l);                                                                                  \
    }

MT_FN void q45_0_mt_mull(uint32_t type, const uint8_t *w, const int8_t *xq, const float *xd, size_t n, const int NT,
                         float *out) {
    Q45_0_MT_BODY(part_mull)
}

DOT_FN MT_FN void q45_0_mt_sdot(uint32_t type, const uint8_t *w, const int8_t *xq, const float *xd, size_t n,
                                const int NT, float *out) {
    Q45_0_MT_BODY(part_sdot)
}

static float dot_q45_0_neon(uint32_t type, const uint8_t *w, const int8_t *xq, const float *xd, size_t n) {
    float o;
    q45_0_mt_mull(type, w, xq, xd, n, 1, &o);
    return o;
}

DOT_FN static float dot_q45_0_neon_dot(uint32_t type, const uint8_t *w, const int8_t *xq, const float *xd, size_t n) {
    float o;
    q45_0_mt_sdot(type, w, xq, xd, n, 1, &o);
    return o;
}

static void dot_q45_0_mt_neon(uint32_t type, const uint8_t *w, const int8_t *xq, const float *xd, size_t n, int nt,
                              float *out) {
    switch (nt) {
    case 4: q45_0_mt_mull(type, w, xq, xd, n, 4, out); break;
    case 3: q45_0_mt_mull(type, w, xq, xd, n, 3, out); break;
    case 2: q45_0_mt_mull(type, w, xq, xd, n, 2, out); break;
    default: q45_0_mt_mull(type, w, xq, xd, n, 1, out);
    }
}

DOT_FN static void dot_q45_0_mt_neon_dot(uint32_t type, const uint8_t *w, const int8_t *xq, const float *xd, size_t n,
                                         int nt, float *out) {
    switch (nt) {
    case 4: q45_0_mt_sdot(type, w, xq, xd, n, 4, out); break;
    case 3: q45_0_mt_sdot(type, w, xq, xd, n, 3, out); break;
    case 2: q45_0_mt_sdot(type, w, xq, xd, n, 2, out); break;
    default: q45_0_mt_sdot(type, w, xq, xd, n, 1, out);
    }
}

/* ---- Q4_1 / Q5_1 against Q8_1 blocks (kernels.h): the levels (0..31) fit signed bytes, so the Q8_0
 * block sums apply as they are; the float steps are bm_q1_value's, four blocks per register. */

/* Block blk's 32 unsigned levels (bm_q41_levels): v0 values 0-15, v1 16-31. */
static inline void q41_levels(int five, const uint8_t *blk, int8x16_t *v0, int8x16_t *v1) {
    const uint8x16_t t = vld1q_u8(blk + (five ? 8 : 4));
    uint8x16_t lo = vandq_u8(t, vdupq_n_u8(0xF)), hi = vshrq_n_u8(t, 4);
    if (five) {
        static const uint8_t IDX0[16] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1};
        static const uint8_t IDX1[16] = {2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3};
        static const uint8_t BIT[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
        const uint32_t qh = (uint32_t)blk[4] | ((uint32_t)blk[5] << 8) | ((uint32_t)blk[6] << 16) |
                            ((uint32_t)blk[7] << 24);
        const uint8x16_t q4 = vreinterpretq_u8_u32(vdupq_n_u32(qh));
        const uint8x16_t k16 = vdupq_n_u8(0x10), bit = vld1q_u8(BIT);
        lo = vorrq_u8(lo, vandq_u8(vtstq_u8(vqtbl1q_u8(q4, vld1q_u8(IDX0)), bit), k16));
        hi = vorrq_u8(hi, vandq_u8(vtstq_u8(vqtbl1q_u8(q4, vld1q_u8(IDX1)), bit), k16));
    }
    *v0 = vreinterpretq_s8_u8(lo);
    *v1 = vreinterpretq_s8_u8(hi);
}

/* One token's eight block sums into its lanes: c = s (d_w d_x) + m_w s_x, then the lanes += c. */
static inline void acc8_q1(float32x4_t *a0, float32x4_t *a1, int32x4_t s0, int32x4_t s1, float32x4_t dw0,
                           float32x4_t dw1, float32x4_t mw0, float32x4_t mw1, const float *xd, const float *xs) {
    float32x4_t d0 = vmulq_f32(dw0, vld1q_f32(xd)), d1 = vmulq_f32(dw1, vld1q_f32(xd + 4));
    float32x4_t c0 = vaddq_f32(vmulq_f32(vcvtq_f32_s32(s0), d0), vmulq_f32(mw0, vld1q_f32(xs)));
    float32x4_t c1 = vaddq_f32(vmulq_f32(vcvtq_f32_s32(s1), d1), vmulq_f32(mw1, vld1q_f32(xs + 4)));
    *a0 = vaddq_f32(*a0, c0);
    *a1 = vaddq_f32(*a1, c1);
}

#define Q41_MT_BODY(PART)                                                                                          \
    const size_t nb = n / BMOE_Q8_0_BLOCK, bb = bm_q41_bytes(five);                                                \
    size_t b = 0;                                                                                                  \
    float32x4_t a0[BM_MT_MAX], a1[BM_MT_MAX];                                                                      \
    _Pragma("GCC unroll 4") for (int t = 0; t < NT; t++) a0[t] = a1[t] = vdupq_n_f32(0.0f);                        \
    for (; b + 8 <= nb; b += 8) {                                                                                  \
        const uint8_t *blk = w + b * bb;                                                                           \
        bm_prefetch_ahead(blk, 8 * bb);                                                                            \
        int32x4_t s[2][BM_MT_MAX];                                                                                 \
        for (int g = 0; g < 2; g++) {                                                                              \
            int8x16_t wl[4], wh[4];                                                                                \
            for (int k = 0; k < 4; k++) q41_levels(five, blk + (size_t)(4 * g + k) * bb, &wl[k], &wh[k]);          \
            _Pragma("GCC unroll 4") for (int t = 0; t < NT; t++) {                                                 \
                const int8_t *p = xq + (size_t)t * n + (b + 4 * (size_t)g) * BMOE_Q8_0_BLOCK;                      \
                s[g][t] = sums4(PART(wl[0], wh[0], p), PART(wl[1], wh[1], p + 32), PART(wl[2], wh[2], p + 64),     \
                                PART(wl[3], wh[3], p + 96));                                                       \
            }                                                                                                      \
        }                                                                                                          \
        float32x4_t dw0, dw1, mw0, mw1;                                                                            \
        scales8_stride(blk, bb, &dw0, &dw1);                                                                       \
        scales8_stride(blk + 2, bb, &mw0, &mw1);                                                                   \
        _Pragma("GCC unroll 4") for (int t = 0; t < NT; t++)                                                       \
            acc8_q1(&a0[t], &a1[t], s[0][t], s[1][t], dw0, dw1, mw0, mw1, xd + (size_t)t * nb + b,                 \
                    xs + (size_t)t * nb + b);                                                                      \
    }                                                                                                              \
    for (int t = 0; t < NT; t++) {                                                                                 \
        float l[8];                                                                                                \
        vst1q_f32(l, a0[t]);                                                                                       \
        vst1q_f32(l + 4, a1[t]);                                                                                   \
        bm_q41_blocks(l, five, w, xq + (size_t)t * n, xd + (size_t)t * nb, xs + (size_t)t * nb, b, nb);            \
        out[t] = bm_simd_sum8(l);                                                                                  \
    }

MT_FN void q41_mt_mull(int five, const uint8_t *w, const int8_t *xq, const float *xd, const float *xs, size_t n,
                       const int NT, float *out) {
    Q41_MT_BODY(part_mull)
}

DOT_FN MT_FN void q41_mt_sdot(int five, const uint8_t *w, const int8_t *xq, const float *xd, const float *xs, size_t n,
                              const int NT, float *out) {
    Q41_MT_BODY(part_sdot)
}

/* The one-token and nt-token entry points of a multi-token body F (NT a constant after inlining). */
#define MT_SWITCH(F, ...)                                                                                          \
    switch (nt) {                                                                                                  \
    case 4: F(__VA_ARGS__, 4, out); break;                                                                         \
    case 3: F(__VA_ARGS__, 3, out); break;                                                                         \
    case 2: F(__VA_ARGS__, 2, out); break;                                                                         \
    default: F(__VA_ARGS__, 1, out);                                                                               \
    }

static void dot_q41_mt_neon(int five, const uint8_t *w, const bm_act *a, size_t n, int nt, float *out) {
    MT_SWITCH(q41_mt_mull, five, w, a->q, a->d, a->s, n)
}
DOT_FN static void dot_q41_mt_neon_dot(int five, const uint8_t *w, const bm_act *a, size_t n, int nt, float *out) {
    MT_SWITCH(q41_mt_sdot, five, w, a->q, a->d, a->s, n)
}
static float dot_q41_neon(int five, const uint8_t *w, const bm_act *a, size_t n) {
    float o;
    q41_mt_mull(five, w, a->q, a->d, a->s, n, 1, &o);
    return o;
}
DOT_FN static float dot_q41_neon_dot(int five, const uint8_t *w, const bm_act *a, size_t n) {
    float o;
    q41_mt_sdot(five, w, a->q, a->d, a->s, n, 1, &o);
    return o;
}

/* ---- IQ4_NL / MXFP4 against Q8_0 blocks (kernels.h): the levels looked up 16 at a time (tbl), then
 * the Q8_0 block sums and float steps. */

/* Block blk's 32 levels: v0 values 0-15 (low nibbles), v1 16-31 (high). */
static inline void nl4_levels(int8x16_t table, int mx, const uint8_t *blk, int8x16_t *v0, int8x16_t *v1) {
    const uint8x16_t t = vld1q_u8(bm_nl4_qs(mx, blk));
    uint8x16_t lo = vandq_u8(t, vdupq_n_u8(0xF)), hi = vshrq_n_u8(t, 4);
#ifdef BMOE_FAULT_NL4_NEON_SIGNED_SHIFT
    /* fault: the high nibbles by an arithmetic shift, so an index of 8 or more becomes negative and the
     * table lookup gives 0 for it */
    hi = vreinterpretq_u8_s8(vshrq_n_s8(vreinterpretq_s8_u8(t), 4));
#endif
    *v0 = vqtbl1q_s8(table, lo);
    *v1 = vqtbl1q_s8(table, hi);
}

static inline void nl4_scales8(int mx, const uint8_t *blk, size_t bb, float32x4_t *d0, float32x4_t *d1) {
    if (!mx) {
        scales8_stride(blk, bb, d0, d1);
        return;
    }
    float s[8];
    for (int k = 0; k < 8; k++) s[k] = bm_e8m0_half(blk[(size_t)k * bb]);
    *d0 = vld1q_f32(s);
    *d1 = vld1q_f32(s + 4);
}

#define NL4_MT_BODY(PART)                                                                                          \
    const size_t nb = n / BMOE_Q8_0_BLOCK, bb = bm_nl4_bytes(mx);                                                  \
    const int8x16_t table = vld1q_s8(bm_nl4_table(mx));                                                            \
    size_t b = 0;                                                                                                  \
    float32x4_t a0[BM_MT_MAX], a1[BM_MT_MAX];                                                                      \
    _Pragma("GCC unroll 4") for (int t = 0; t < NT; t++) a0[t] = a1[t] = vdupq_n_f32(0.0f);                        \
    for (; b + 8 <= nb; b += 8) {                                                                                  \
        const uint8_t *blk = w + b * bb;                                                                           \
        bm_prefetch_ahead(blk, 8 * bb);                                                                            \
        int32x4_t s[2][BM_MT_MAX];                                                                                 \
        for (int g = 0; g < 2; g++) {                                                                              \
            int8x16_t wl[4], wh[4];                                                                                \
            for (int k = 0; k < 4; k++) nl4_levels(table, mx, blk + (size_t)(4 * g + k) * bb, &wl[k], &wh[k]);     \
            _Pragma("GCC unroll 4") for (int t = 0; t < NT; t++) {                                                 \
                const int8_t *p = xq + (size_t)t * n + (b + 4 * (size_t)g) * BMOE_Q8_0_BLOCK;                      \
                s[g][t] = sums4(PART(wl[0], wh[0], p), PART(wl[1], wh[1], p + 32), PART(wl[2], wh[2], p + 64),     \
                                PART(wl[3], wh[3], p + 96));                                                       \
            }                                                                                                      \
        }                                                                                                          \
        float32x4_t dw0, dw1;                                                                                      \
        nl4_scales8(mx, blk, bb, &dw0, &dw1);                                                                      \
        _Pragma("GCC unroll 4") for (int t = 0; t < NT; t++)                                                       \
            acc8(&a0[t], &a1[t], s[0][t], s[1][t], dw0, dw1, xd + (size_t)t * nb + b);                             \
    }                                                                                                              \
    for (int t = 0; t < NT; t++) {                                                                                 \
        float l[8];                                                                                                \
        vst1q_f32(l, a0[t]);                                                                                       \
        vst1q_f32(l + 4, a1[t]);                                                                                   \
        bm_nl4_blocks(l, mx, w, xq + (size_t)t * n, xd + (size_t)t * nb, b, nb);                                   \
        out[t] = bm_simd_sum8(l);                                                                                  \
    }

MT_FN void nl4_mt_mull(int mx, const uint8_t *w, const int8_t *xq, const float *xd, size_t n, const int NT, float *out) {
    NL4_MT_BODY(part_mull)
}

DOT_FN MT_FN void nl4_mt_sdot(int mx, const uint8_t *w, const int8_t *xq, const float *xd, size_t n, const int NT,
                              float *out) {
    NL4_MT_BODY(part_sdot)
}

static void dot_nl4_mt_neon(int mx, const uint8_t *w, const bm_act *a, size_t n, int nt, float *out) {
    MT_SWITCH(nl4_mt_mull, mx, w, a->q, a->d, n)
}
DOT_FN static void dot_nl4_mt_neon_dot(int mx, const uint8_t *w, const bm_act *a, size_t n, int nt, float *out) {
    MT_SWITCH(nl4_mt_sdot, mx, w, a->q, a->d, n)
}
static float dot_nl4_neon(int mx, const uint8_t *w, const bm_act *a, size_t n) {
    float o;
    nl4_mt_mull(mx, w, a->q, a->d, n, 1, &o);
    return o;
}
DOT_FN static float dot_nl4_neon_dot(int mx, const uint8_t *w, const bm_act *a, size_t n) {
    float o;
    nl4_mt_sdot(mx, w, a->q, a->d, n, 1, &o);
    return o;
}

/* ---- K-quants against Q8_K super-blocks (kernels.h): exact int32 sums per sub-block (widening
 * multiplies, or sdot), times the sub-block's scale with an integer multiply-accumulate; the float
 * steps are the shared bm_k4_value / bm_k6_value. A super-block's weights are unpacked once for all
 * NT tokens. */

/* The f16 at p as a float (exact, as bm_f16_to_f32 but one instruction). */
static inline float f16_at(const uint8_t *p) {
    return vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(bm_rd16(p)))), 0);
}

/* The sum of 16 products w[i] x[i] as four int32 partials (|w x| pairs fit int16: |w| <= 63). */
static inline int32x4_t part16_mull(int8x16_t w, const int8_t *p) {
    int8x16_t x = vld1q_s8(p);
    return vpaddlq_s16(vmlal_s8(vmull_s8(vget_low_s8(w), vget_low_s8(x)), vget_high_s8(w), vget_high_s8(x)));
}

DOT_FN static inline int32x4_t part16_sdot(int8x16_t w, const int8_t *p) {
    return vdotq_s32(vdupq_n_s32(0), w, vld1q_s8(p));
}

#define K4_MT_BODY(PART)                                                                                           \
    const size_t nb = n / BM_Q8K_BLOCK, bb = five ? BMOE_Q5_K_BYTES : BMOE_Q4_K_BYTES;                            \
    const uint8x16_t m4 = vdupq_n_u8(0xF), k16 = vdupq_n_u8(0x10);                                                 \
    float l[BM_MT_MAX][8] = {{0}};                                                                                 \
    for (size_t b = 0; b < nb; b++) {                                                                              \
        const uint8_t *blk = w + b * bb, *qs = blk + (five ? 48 : 16);                                             \
        bm_prefetch_ahead(blk, bb);                                                                                \
        uint8_t sc[8], m[8];                                                                                       \
        bm_scales_mins_k4(blk + 4, sc, m);                                                                         \
        const float d = f16_at(blk), dmin = f16_at(blk + 2);                                                       \
        int32x4_t acc[BM_MT_MAX];                                                                                  \
        _Pragma("GCC unroll 4") for (int t = 0; t < NT; t++) acc[t] = vdupq_n_s32(0);                              \
        const uint8x16_t qh0 = five ? vld1q_u8(blk + 16) : vdupq_n_u8(0);                                          \
        const uint8x16_t qh1 = five ? vld1q_u8(blk + 32) : vdupq_n_u8(0);                                          \
        for (int jj = 0; jj < 4; jj++) { /* sub-blocks 2jj (low nibbles) and 2jj + 1 (high) */                    \
            const uint8x16_t q0 = vld1q_u8(qs + 32 * jj), q1 = vld1q_u8(qs + 32 * jj + 16);                        \
            uint8x16_t lo0 = vandq_u8(q0, m4), lo1 = vandq_u8(q1, m4);                                             \
            uint8x16_t hi0 = vshrq_n_u8(q0, 4), hi1 = vshrq_n_u8(q1, 4);                                           \
            if (five) { /* bit 2jj / 2jj + 1 of qh[l] becomes bit 4 */                                             \
                const uint8x16_t bl = vdupq_n_u8((uint8_t)(1u << (2 * jj)));                                       \
                const uint8x16_t bh = vdupq_n_u8((uint8_t)(1u << (2 * jj + 1)));                                   \
                lo0 = vorrq_u8(lo0, vandq_u8(vtstq_u8(qh0, bl), k16));                                             \
                lo1 = vorrq_u8(lo1, vandq_u8(vtstq_u8(qh1, bl), k16));                                             \
                hi0 = vorrq_u8(hi0, vandq_u8(vtstq_u8(qh0, bh), k16));                                             \
                hi1 = vorrq_u8(hi1, vandq_u8(vtstq_u8(qh1, bh), k16));                                             \
            }                                                                                                      \
            const int8x16_t l0 = vreinterpretq_s8_u8(lo0), l1 = vreinterpretq_s8_u8(lo1);                          \
            const int8x16_t h0 = vreinterpretq_s8_u8(hi0), h1 = vreinterpretq_s8_u8(hi1);                          \
            _Pragma("GCC unroll 4") for (int t = 0; t < NT; t++) {                                                 \
                const int8_t *xq = x[(size_t)t * nb + b].q + 64 * jj;                                              \
                acc[t] = vmlaq_n_s32(acc[t], PART(l0, l1, xq), (int32_t)sc[2 * jj]);                               \
                acc[t] = vmlaq_n_s32(acc[t], PART(h0, h1, xq + 32), (int32_t)sc[2 * jj + 1]);                      \
            }                                                                                                      \
        }                                                                                                          \
        for (int t = 0; t < NT; t++) {                                                                             \
            const bm_q8k *xb = x + (size_t)t * nb + b;                                                             \
            l[t][b & 7] += bm_k4_value(vaddvq_s32(acc[t]), bm_k4_min_sum(m, xb->bsums), d, dmin, xb->d);           \
        }                                                                                                          \
    }                                                                                                              \
    for (int t = 0; t < NT; t++) out[t] = bm_simd_sum8(l[t]);

#define K6_MT_BODY(PART16)                                                                                         \
    const size_t nb = n / BM_Q8K_BLOCK;                                                                            \
    const uint8x16_t m4 = vdupq_n_u8(0xF), m3 = vdupq_n_u8(3);                                                     \
    const int8x16_t k32 = vdupq_n_s8(32);                                                                          \
    float l[BM_MT_MAX][8] = {{0}};                                                                                 \
    for (size_t b = 0; b < nb; b++) {                                                                              \
        const uint8_t *blk = w + b * BMOE_Q6_K_BYTES;                                                              \
        const int8_t *sc = (const int8_t *)(blk + 192);                                                            \
        const float d = f16_at(blk + 208);                                                                         \
        bm_prefetch_ahead(blk, BMOE_Q6_K_BYTES);                                                                   \
        int32x4_t acc[BM_MT_MAX];                                                                                  \
        _Pragma("GCC unroll 4") for (int t = 0; t < NT; t++) acc[t] = vdupq_n_s32(0);                              \
        for (int h = 0; h < 2; h++) { /* 128 values each */                                                        \
            const uint8_t *ql = blk + 64 * h, *qhp = blk + 128 + 32 * h;                                           \
            const uint8x16_t qh0 = vld1q_u8(qhp), qh1 = vld1q_u8(qhp + 16);                                        \
            for (int k = 0; k < 4; k++) { /* values 32k .. 32k + 31: sub-blocks 2k and 2k + 1 */                   \
                const uint8x16_t a0 = vld1q_u8(ql + 32 * (k & 1)), a1 = vld1q_u8(ql + 32 * (k & 1) + 16);          \
                const uint8x16_t n0 = (k >> 1) ? vshrq_n_u8(a0, 4) : vandq_u8(a0, m4);                             \
                const uint8x16_t n1 = (k >> 1) ? vshrq_n_u8(a1, 4) : vandq_u8(a1, m4);                             \
                const int8x16_t sh = vdupq_n_s8((int8_t)-BM_Q6K_SHIFT(k));                                         \
                const uint8x16_t b0 = vshlq_n_u8(vandq_u8(vshlq_u8(qh0, sh), m3), 4);                              \
                const uint8x16_t b1 = vshlq_n_u8(vandq_u8(vshlq_u8(qh1, sh), m3), 4);                              \
                const int8x16_t w0 = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(n0, b0)), k32); /* -32..31 */           \
                const int8x16_t w1 = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(n1, b1)), k32);                         \
                const int32_t s0 = sc[8 * h + 2 * k], s1 = sc[8 * h + 2 * k + 1];                                  \
                _Pragma("GCC unroll 4") for (int t = 0; t < NT; t++) {                                             \
                    const int8_t *xq = x[(size_t)t * nb + b].q + 128 * h + 32 * k;                                 \
                    acc[t] = vmlaq_n_s32(acc[t], PART16(w0, xq), s0);                                              \
                    acc[t] = vmlaq_n_s32(acc[t], PART16(w1, xq + 16), s1);                                         \
                }                                                                                                  \
            }                                                                                                      \
        }                                                                                                          \
        for (int t = 0; t < NT; t++) {                                                                             \
            const bm_q8k *xb = x + (size_t)t * nb + b;                                                             \
            l[t][b & 7] += bm_k6_value(vaddvq_s32(acc[t]), d, xb->d);                                              \
        }                                                                                                          \
    }                                                                                                              \
    for (int t = 0; t < NT; t++) out[t] = bm_simd_sum8(l[t]);

/* Q2_K and Q3_K: 16 sub-blocks of 16, signed levels (Q2_K 0..3, Q3_K -4..3) times the activation, an
 * integer multiply-accumulate by the sub-block's scale; Q2_K's mins from the bsums (shared code). */
#define K23_MT_BODY(PART16, THREE)                                                                                 \
    const size_t nb = n / BM_Q8K_BLOCK, bb = THREE ? BMOE_Q3_K_BYTES : BMOE_Q2_K_BYTES;                          \
    const uint8x16_t m3 = vdupq_n_u8(3);                                                                           \
    float l[BM_MT_MAX][8] = {{0}};                                                                                 \
    for (size_t b = 0; b < nb; b++) {                                                                              \
        const uint8_t *blk = w + b * bb, *qs = blk + (THREE ? 32 : 16);                                            \
        bm_prefetch_ahead(blk, bb);                                                                                \
        int32_t sc[16];                                                                                            \
        if (THREE) {                                                                                               \
            int8_t s8[16];                                                                                         \
            bm_q3k_scales(blk + 96, s8);                                                                           \
            for (int j = 0; j < 16; j++) sc[j] = s8[j] - 32;                                                       \
        } else {                                                                                                   \
            for (int j = 0; j < 16; j++) sc[j] = blk[j] & 0xF;                                                     \
        }                                                                                                          \
        int32x4_t acc[BM_MT_MAX];                                                                                  \
        _Pragma("GCC unroll 4") for (int t = 0; t < NT; t++) acc[t] = vdupq_n_s32(0);                              \
        const uint8x16_t hm0 = vld1q_u8(blk), hm1 = vld1q_u8(blk + 16);                                            \
        for (int h = 0; h < 2; h++) {                                                                              \
            const uint8x16_t q0 = vld1q_u8(qs + 32 * h), q1 = vld1q_u8(qs + 32 * h + 16);                          \
            for (int k = 0; k < 4; k++) { /* values 128h + 32k + l: sub-blocks 8h + 2k and + 1 */                  \
                const int8x16_t sh = vdupq_n_s8((int8_t)(-2 * k));                                                 \
                int8x16_t w0 = vreinterpretq_s8_u8(vandq_u8(vshlq_u8(q0, sh), m3));                                \
                int8x16_t w1 = vreinterpretq_s8_u8(vandq_u8(vshlq_u8(q1, sh), m3));                                \
                if (THREE) { /* - 4 where the hmask bit 4h + k is clear */                                         \
                    const uint8x16_t bit = vdupq_n_u8((uint8_t)(1u << (4 * h + k))), four = vdupq_n_u8(4);         \
                    w0 = vsubq_s8(w0, vreinterpretq_s8_u8(vbicq_u8(four, vtstq_u8(hm0, bit))));                    \
                    w1 = vsubq_s8(w1, vreinterpretq_s8_u8(vbicq_u8(four, vtstq_u8(hm1, bit))));                    \
                }                                                                                                  \
                const int32_t s0 = sc[8 * h + 2 * k], s1 = sc[8 * h + 2 * k + 1];                                  \
                _Pragma("GCC unroll 4") for (int t = 0; t < NT; t++) {                                             \
                    const int8_t *xq = x[(size_t)t * nb + b].q + 128 * h + 32 * k;                                 \
                    acc[t] = vmlaq_n_s32(acc[t], PART16(w0, xq), s0);                                              \
                    acc[t] = vmlaq_n_s32(acc[t], PART16(w1, xq + 16), s1);                                         \
                }                                                                                                  \
            }                                                                                                      \
        }                                                                                                          \
        for (int t = 0; t < NT; t++) {                                                                             \
            const bm_q8k *xb = x + (size_t)t * nb + b;                                                             \
            l[t][b & 7] += THREE ? bm_k6_value(vaddvq_s32(acc[t]), f16_at(blk + 108), xb->d)                       \
                                 : bm_k4_value(vaddvq_s32(acc[t]), bm_k2_min_sum(blk, xb->bsums), f16_at(blk + 80), \
                                               f16_at(blk + 82), xb->d);                                           \
        }                                                                                                          \
    }                                                                                                              \
    for (int t = 0; t < NT; t++) out[t] = bm_simd_sum8(l[t]);

/* IQ4_XS: each sub-block of 32 an IQ4_NL block's levels (tbl), its sums times its scale - 32. */
#define XS_MT_BODY(PART)                                                                                           \
    const size_t nb = n / BM_Q8K_BLOCK;                                                                            \
    const int8x16_t table = vld1q_s8(BM_KVALUES_IQ4NL);                                                            \
    float l[BM_MT_MAX][8] = {{0}};                                                                                 \
    for (size_t b = 0; b < nb; b++) {                                                                              \
        const uint8_t *blk = w + b * BMOE_IQ4_XS_BYTES;                                                            \
        bm_prefetch_ahead(blk, BMOE_IQ4_XS_BYTES);                                                                 \
        int32x4_t acc[BM_MT_MAX];                                                                                  \
        _Pragma("GCC unroll 4") for (int t = 0; t < NT; t++) acc[t] = vdupq_n_s32(0);                              \
        for (int ib = 0; ib < 8; ib++) {                                                                           \
            const uint8x16_t q = vld1q_u8(blk + 8 + 16 * ib);                                                      \
            const int8x16_t w0 = vqtbl1q_s8(table, vandq_u8(q, vdupq_n_u8(0xF)));                                  \
            const int8x16_t w1 = vqtbl1q_s8(table, vshrq_n_u8(q, 4));                                              \
            const int32_t s = bm_iq4xs_scale(blk, ib) - 32;                                                        \
            _Pragma("GCC unroll 4") for (int t = 0; t < NT; t++)                                                   \
                acc[t] = vmlaq_n_s32(acc[t], PART(w0, w1, x[(size_t)t * nb + b].q + 32 * ib), s);                  \
        }                                                                                                          \
        const float d = f16_at(blk);                                                                               \
        for (int t = 0; t < NT; t++) l[t][b & 7] += bm_k6_value(vaddvq_s32(acc[t]), d, x[(size_t)t * nb + b].d);  \
    }                                                                                                              \
    for (int t = 0; t < NT; t++) out[t] = bm_simd_sum8(l[t]);

MT_FN void k2_mt_mull(const uint8_t *w, const bm_q8k *x, size_t n, const int NT, float *out) { K23_MT_BODY(part16_mull, 0) }
DOT_FN MT_FN void k2_mt_sdot(const uint8_t *w, const bm_q8k *x, size_t n, const int NT, float *out) {
    K23_MT_BODY(part16_sdot, 0)
}
MT_FN void k3_mt_mull(const uint8_t *w, const bm_q8k *x, size_t n, const int NT, float *out) { K23_MT_BODY(part16_mull, 1) }
DOT_FN MT_FN void k3_mt_sdot(const uint8_t *w, const bm_q8k *x, size_t n, const int NT, float *out) {
    K23_MT_BODY(part16_sdot, 1)
}
MT_FN void xs_mt_mull(const uint8_t *w, const bm_q8k *x, size_t n, const int NT, float *out) { XS_MT_BODY(part_mull) }
DOT_FN MT_FN void xs_mt_sdot(const uint8_t *w, const bm_q8k *x, size_t n, const int NT, float *out) {
    XS_MT_BODY(part_sdot)
}

MT_FN void k4_mt_mull(const uint8_t *w, const int five, const bm_q8k *x, size_t n, const int NT, float *out) {
    K4_MT_BODY(part_mull)
}
DOT_FN MT_FN void k4_mt_sdot(const uint8_t *w, const int five, const bm_q8k *x, size_t n, const int NT, float *out) {
    K4_MT_BODY(part_sdot)
}
MT_FN void k6_mt_mull(const uint8_t *w, const bm_q8k *x, size_t n, const int NT, float *out) { K6_MT_BODY(part16_mull) }
DOT_FN MT_FN void k6_mt_sdot(const uint8_t *w, const bm_q8k *x, size_t n, const int NT, float *out) {
    K6_MT_BODY(part16_sdot)
}

MT_FN void kq_mt_mull(uint32_t type, const uint8_t *w, const bm_q8k *x, size_t n, const int NT, float *out) {
    switch (type) {
    case GGML_TYPE_Q4_K: k4_mt_mull(w, 0, x, n, NT, out); break;
    case GGML_TYPE_Q5_K: k4_mt_mull(w, 1, x, n, NT, out); break;
    case GGML_TYPE_Q2_K: k2_mt_mull(w, x, n, NT, out); break;
    case GGML_TYPE_Q3_K: k3_mt_mull(w, x, n, NT, out); break;
    case GGML_TYPE_IQ4_XS: xs_mt_mull(w, x, n, NT, out); break;
    default: k6_mt_mull(w, x, n, NT, out);
    }
}

DOT_FN MT_FN void kq_mt_sdot(uint32_t type, const uint8_t *w, const bm_q8k *x, size_t n, const int NT, float *out) {
    switch (type) {
    case GGML_TYPE_Q4_K: k4_mt_sdot(w, 0, x, n, NT, out); break;
    case GGML_TYPE_Q5_K: k4_mt_sdot(w, 1, x, n, NT, out); break;
    case GGML_TYPE_Q2_K: k2_mt_sdot(w, x, n, NT, out); break;
    case GGML_TYPE_Q3_K: k3_mt_sdot(w, x, n, NT, out); break;
    case GGML_TYPE_IQ4_XS: xs_mt_sdot(w, x, n, NT, out); break;
    default: k6_mt_sdot(w, x, n, NT, out);
    }
}

static float dot_kq_neon(uint32_t type, const uint8_t *w, const bm_q8k *x, size_t n) {
    float o;
    kq_mt_mull(type, w, x, n, 1, &o);
    return o;
}

DOT_FN static float dot_kq_neon_dot(uint32_t type, const uint8_t *w, const bm_q8k *x, size_t n) {
    float o;
    kq_mt_sdot(type, w, x, n, 1, &o);
    return o;
}

static void dot_kq_mt_neon(uint32_t type, const uint8_t *w, const bm_q8k *x, size_t n, int nt, float *out) {
    switch (nt) {
    case 4: kq_mt_mull(type, w, x, n, 4, out); break;
    case 3: kq_mt_mull(type, w, x, n, 3, out); break;
    case 2: kq_mt_mull(type, w, x, n, 2, out); break;
    default: kq_mt_mull(type, w, x, n, 1, out);
    }
}

DOT_FN static void dot_kq_mt_neon_dot(uint32_t type, const uint8_t *w, const bm_q8k *x, size_t n, int nt, float *out) {
    switch (nt) {
    case 4: kq_mt_sdot(type, w, x, n, 4, out); break;
    case 3: kq_mt_sdot(type, w, x, n, 3, out); break;
    case 2: kq_mt_sdot(type, w, x, n, 2, out); break;
    default: kq_mt_sdot(type, w, x, n, 1, out);
    }
}

/* ---- BF16 (kernels.h): the weights become floats, four at a time, exactly (bm_to_f32_bf16's values),
 * then the F32 dot product's lanes, adds and tree. */

static void dq_bf16_neon(const uint8_t *w, size_t i0, size_t cnt, float *y) {
    size_t i = 0;
    for (; i + 4 <= cnt; i += 4) {
        uint32x4_t h = vshll_n_u16(vreinterpret_u16_u8(vld1_u8(w + 2 * (i0 + i))), 16); /* exact */
        vst1q_f32(y + i, vreinterpretq_f32_u32(h));
    }
    if (i < cnt) bm_to_f32_bf16(w + 2 * (i0 + i), y + i, cnt - i);
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

static float dot_bf16_neon(const uint8_t *w, const float *x, size_t n) {
    float32x4_t a0 = vdupq_n_f32(0.0f), a1 = vdupq_n_f32(0.0f);
    float y[BMOE_DQ_CHUNK];
    for (size_t i0 = 0; i0 < n; i0 += BMOE_DQ_CHUNK) {
        size_t cnt = n - i0 < BMOE_DQ_CHUNK ? n - i0 : BMOE_DQ_CHUNK;
        dq_bf16_neon(w, i0, cnt, y);
        dq_acc(&a0, &a1, y, x + i0, cnt);
    }
    float l[8];
    vst1q_f32(l, a0);
    vst1q_f32(l + 4, a1);
    return bm_simd_sum8(l);
}

static void dot_bf16_mt_neon(const uint8_t *w, const float *x, size_t n, int nt, float *out) {
    float32x4_t a0[BM_MT_MAX], a1[BM_MT_MAX];
    for (int t = 0; t < nt; t++) a0[t] = a1[t] = vdupq_n_f32(0.0f);
    float y[BMOE_DQ_CHUNK];
    for (size_t i0 = 0; i0 < n; i0 += BMOE_DQ_CHUNK) {
        size_t cnt = n - i0 < BMOE_DQ_CHUNK ? n - i0 : BMOE_DQ_CHUNK;
        dq_bf16_neon(w, i0, cnt, y); /* once for every token */
        for (int t = 0; t < nt; t++) dq_acc(&a0[t], &a1[t], y, x + (size_t)t * n + i0, cnt);
    }
    for (int t = 0; t < nt; t++) {
        float l[8];
        vst1q_f32(l, a0[t]);
        vst1q_f32(l + 4, a1[t]);
        out[t] = bm_simd_sum8(l);
    }
}

/* ---- the type table's NEON kernels (type_table.c): one token and several, per type; _neon_dot
 * forms the integer sums with sdot ---- */

#define NEON_ROW(T, P, ATTR, ONE, MT)                                                                     \
    ATTR float bm_dot_##T##_##P(const uint8_t *w, const bm_act *a, size_t n) { return ONE; }             \
    ATTR void bm_dot_mt_##T##_##P(const uint8_t *w, const bm_act *a, size_t n, int nt, float *out) { MT; }
#define NEON_BOTH(T, ONE, MT) NEON_ROW(T, neon, , ONE, MT) NEON_ROW(T, neon_dot, , ONE, MT)

NEON_BOTH(f32, dot_f32_neon((const float *)w, a->x, n), dot_f32_mt_neon((const float *)w, a->x, n, nt, out))
NEON_BOTH(f16, dot_f16_neon(w, a->x, n), dot_f16_mt_neon(w, a->x, n, nt, out))
NEON_BOTH(bf16, dot_bf16_neon(w, a->x, n), dot_bf16_mt_neon(w, a->x, n, nt, out))
NEON_ROW(q8_0, neon, , dot_q8_0_neon(w, a->q, a->d, n), dot_q8_0_mt_neon(w, a->q, a->d, n, nt, out))
NEON_ROW(q8_0, neon_dot, DOT_FN, dot_q8_0_neon_dot(w, a->q, a->d, n), dot_q8_0_mt_neon_dot(w, a->q, a->d, n, nt, out))
#define NEON_Q45(T, TY)                                                                                    \
    NEON_ROW(T, neon, , dot_q45_0_neon(TY, w, a->q, a->d, n), dot_q45_0_mt_neon(TY, w, a->q, a->d, n, nt, out)) \
    NEON_ROW(T, neon_dot, DOT_FN, dot_q45_0_neon_dot(TY, w, a->q, a->d, n),                              \
             dot_q45_0_mt_neon_dot(TY, w, a->q, a->d, n, nt, out))
NEON_Q45(q4_0, GGML_TYPE_Q4_0)
NEON_Q45(q5_0, GGML_TYPE_Q5_0)
#define NEON_Q41(T, FIVE)                                                                                  \
    NEON_ROW(T, neon, , dot_q41_neon(FIVE, w, a, n), dot_q41_mt_neon(FIVE, w, a, n, nt, out))             \
    NEON_ROW(T, neon_dot, DOT_FN, dot_q41_neon_dot(FIVE, w, a, n), dot_q41_mt_neon_dot(FIVE, w, a, n, nt, out))
NEON_Q41(q4_1, 0)
NEON_Q41(q5_1, 1)
#define NEON_NL4(T, MX)                                                                                    \
    NEON_ROW(T, neon, , dot_nl4_neon(MX, w, a, n), dot_nl4_mt_neon(MX, w, a, n, nt, out))                 \
    NEON_ROW(T, neon_dot, DOT_FN, dot_nl4_neon_dot(MX, w, a, n), dot_nl4_mt_neon_dot(MX, w, a, n, nt, out))
NEON_NL4(iq4_nl, 0)
NEON_NL4(mxfp4, 1)
#define NEON_KQ(T, TY)                                                                                     \
    NEON_ROW(T, neon, , dot_kq_neon(TY, w, a->k, n), dot_kq_mt_neon(TY, w, a->k, n, nt, out))             \
    NEON_ROW(T, neon_dot, DOT_FN, dot_kq_neon_dot(TY, w, a->k, n), dot_kq_mt_neon_dot(TY, w, a->k, n, nt, out))
NEON_KQ(q4_K, GGML_TYPE_Q4_K)
NEON_KQ(q5_K, GGML_TYPE_Q5_K)
NEON_KQ(q6_K, GGML_TYPE_Q6_K)
NEON_KQ(q2_K, GGML_TYPE_Q2_K)
NEON_KQ(q3_K, GGML_TYPE_Q3_K)
NEON_KQ(iq4_xs, GGML_TYPE_IQ4_XS)

int bm_kernels_neon(bm_kernels *k, int dot) {
#if defined(__linux__)
    if (dot && !(getauxval(AT_HWCAP) & HWCAP_ASIMDDP)) return 0;
#else
    if (dot) return 0; /* no HWCAP outside Linux: the widening-multiply path */
#endif
    k->dot_f32 = dot_f32_neon;
    k->quantize_q8_0 = bm_quantize_q8_0; /* O(n) against the O(n * rows) dot products */
    k->quantize_q8_1 = bm_quantize_q8_1;
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
