/* Helpers shared by the kernel files (kernels.c, kernels_avx2.c, kernels_neon.c): the one lane tree
 * and the little-endian f16 load, the SIMD tails, the one-block-at-a-time Q8_0 loop. Internal to the
 * kernels. */
#ifndef BMOE_KERNELS_LANES_H
#define BMOE_KERNELS_LANES_H

#include <stddef.h>
#include <stdint.h>

#include "gguf.h"
#include "tensor.h"

/* The fixed tree every path ends with (kernels.h). */
static inline float bm_sum8(const float a[8]) {
    return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

/* How a SIMD path (AVX2, NEON) folds its eight lanes at the end: the same fixed tree. It is its own
 * function so that the fault below reaches every SIMD path and never the scalar one. */
static inline float bm_simd_sum8(const float l[8]) {
#ifdef BMOE_FAULT_SIMD_LANE_ORDER
    /* fault: the usual SIMD horizontal sum (high half onto low half first), not the fixed tree */
    return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
#else
    return bm_sum8(l);
#endif
}

/* A SIMD F32 dot product's tail: elements i..n-1 (past the last full group of eight) added to lane
 * i mod 8, as the scalar path adds every element. Shared by the one-token and multi-token kernels of
 * both SIMD files, so the fault below reaches all of them. */
static inline void bm_simd_tail_f32(float l[8], const float *a, const float *b, size_t i, size_t n) {
#ifndef BMOE_FAULT_SIMD_TAIL_LANE
    for (; i < n; i++) l[i & 7] += a[i] * b[i];
#else
    for (; i < n; i++) l[0] += a[i] * b[i]; /* fault: the tail's elements all go to lane 0 */
#endif
}

static inline uint16_t bm_rd16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

/* How far ahead of the bytes being multiplied the SIMD paths ask for the weights (software
 * prefetch). Decode reads every weight once, so it waits on memory; the hardware prefetcher stops
 * at each 4 KiB page and ramps up again on the next, and a matrix row of a small expert is a few
 * hundred bytes, so on its own it leaves a core well short of its bandwidth. Asking 2 KiB ahead keeps
 * the next lines (and the next page's translation) on their way across rows and pages: decode
 * 1.3-1.4x on the bench model (docs/benchmarks.md, software prefetch, where 0.5-8 KiB were tried).
 * A prefetch never faults, so reading past a matrix's last row is harmless, and it changes no value. */
#define BM_PREFETCH_AHEAD 2048

/* Prefetches the `bytes` (at most a few cache lines) that start BM_PREFETCH_AHEAD after p. The
 * address is formed as an integer: it may lie past the end of the weights. */
static inline void bm_prefetch_ahead(const void *p, size_t bytes) {
    uintptr_t a = (uintptr_t)p + BM_PREFETCH_AHEAD;
    for (size_t c = 0; c < bytes; c += 64) __builtin_prefetch((const void *)(a + c), 0, 3);
}

/* Q8_0 blocks b .. nb-1 of row w, one at a time, onto the lanes (block b to lane b mod 8): the scalar
 * path's whole row, and the SIMD paths' last nb mod 8 blocks. */
static inline void bm_q8_0_blocks(float l[8], const uint8_t *w, const int8_t *xq, const float *xd, size_t b,
                                  size_t nb) {
    for (; b < nb; b++) {
        const uint8_t *blk = w + b * BMOE_Q8_0_BYTES;
        const int8_t *q = (const int8_t *)(blk + 2), *p = xq + b * BMOE_Q8_0_BLOCK;
        int32_t s = 0;
        for (int i = 0; i < BMOE_Q8_0_BLOCK; i++) s += (int32_t)q[i] * (int32_t)p[i];
#ifndef BMOE_FAULT_Q8_0_FIRST_SCALE
        float dw = bm_f16_to_f32(bm_rd16(blk));
#else
        float dw = bm_f16_to_f32(bm_rd16(w)); /* fault: every block uses the row's first scale */
#endif
        l[b & 7] += (float)s * (dw * xd[b]);
    }
}

/* ---- Q4_0 / Q5_0 against Q8_0 activation blocks (kernels.h) ---- */

static inline size_t bm_q45_0_bytes(uint32_t type) {
    return type == GGML_TYPE_Q4_0 ? BMOE_Q4_0_BYTES : BMOE_Q5_0_BYTES;
}

/* Block blk's weights as 32 signed levels: Q4_0 nibble - 8, Q5_0 (nibble | fifth bit << 4) - 16; value
 * j < 16 is the low nibble of byte j, value j + 16 its high nibble (tensor.h). */
static inline void bm_q45_0_levels(uint32_t type, const uint8_t *blk, int8_t v[32]) {
    if (type == GGML_TYPE_Q4_0) {
        for (int j = 0; j < 16; j++) {
            v[j] = (int8_t)((blk[2 + j] & 0xF) - 8);
            v[j + 16] = (int8_t)((blk[2 + j] >> 4) - 8);
        }
    } else {
        uint32_t qh = (uint32_t)blk[2] | ((uint32_t)blk[3] << 8) | ((uint32_t)blk[4] << 16) | ((uint32_t)blk[5] << 24);
        for (int j = 0; j < 16; j++) {
            v[j] = (int8_t)(((blk[6 + j] & 0xF) | (((qh >> j) & 1) << 4)) - 16);
            v[j + 16] = (int8_t)(((blk[6 + j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16);
        }
    }
}

/* Q4_0 / Q5_0 blocks b .. nb-1 one at a time onto the lanes, as bm_q8_0_blocks: the scalar path's row
 * and the SIMD paths' last nb mod 8 blocks. */
static inline void bm_q45_0_blocks(float l[8], uint32_t type, const uint8_t *w, const int8_t *xq, const float *xd,
                                   size_t b, size_t nb) {
    const size_t bb = bm_q45_0_bytes(type);
    for (; b < nb; b++) {
        const uint8_t *blk = w + b * bb;
        const int8_t *p = xq + b * BMOE_Q8_0_BLOCK;
        int8_t v[32];
        bm_q45_0_levels(type, blk, v);
        int32_t s = 0;
        for (int i = 0; i < 32; i++) s += (int32_t)v[i] * (int32_t)p[i];
        l[b & 7] += (float)s * (bm_f16_to_f32(bm_rd16(blk)) * xd[b]);
    }
}

/* ---- Q4_1 / Q5_1 against Q8_1 activation blocks (kernels.h) ---- */

static inline size_t bm_q41_bytes(int five) { return five ? BMOE_Q5_1_BYTES : BMOE_Q4_1_BYTES; }

/* Block blk's 32 levels, unsigned (0..15, Q5_1 0..31): value j < 16 the low nibble of qs[j], value
 * j + 16 its high nibble, Q5_1's fifth bit of value i bit i of qh (tensor.h). */
static inline void bm_q41_levels(int five, const uint8_t *blk, uint8_t v[32]) {
    const uint8_t *qs = blk + (five ? 8 : 4);
    uint32_t qh = five ? (uint32_t)blk[4] | ((uint32_t)blk[5] << 8) | ((uint32_t)blk[6] << 16) | ((uint32_t)blk[7] << 24)
                       : 0;
    for (int j = 0; j < 16; j++) {
        v[j] = (uint8_t)((qs[j] & 0xF) | (((qh >> j) & 1) << 4));
        v[j + 16] = (uint8_t)((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4));
    }
}

/* A Q4_1 / Q5_1 block's float contribution from its exact sum s = sum q_w q_x: the levels' part
 * scaled by d_w d_x, plus the block minimum m_w times the activation block's sum s_x (Q8_1's
 * f16(d sum q)), as ggml's vec_dot_q4_1_q8_1 adds them; one function for every path. */
static inline float bm_q1_value(int32_t s, float dw, float dx, float mw, float sx) {
    return (float)s * (dw * dx) + mw * sx;
}

/* Q4_1 / Q5_1 blocks b .. nb-1 one at a time onto the lanes (block b to lane b mod 8): the scalar
 * path's row and the SIMD paths' last nb mod 8 blocks. */
static inline void bm_q41_blocks(float l[8], int five, const uint8_t *w, const int8_t *xq, const float *xd,
                                 const float *xs, size_t b, size_t nb) {
    const size_t bb = bm_q41_bytes(five);
    for (; b < nb; b++) {
        const uint8_t *blk = w + b * bb;
        const int8_t *p = xq + b * BMOE_Q8_0_BLOCK;
        uint8_t v[32];
        bm_q41_levels(five, blk, v);
        int32_t s = 0;
        for (int i = 0; i < 32; i++) s += (int32_t)v[i] * (int32_t)p[i];
        l[b & 7] += bm_q1_value(s, bm_f16_to_f32(bm_rd16(blk)), xd[b], bm_f16_to_f32(bm_rd16(blk + 2)), xs[b]);
    }
}

/* ---- IQ4_NL / MXFP4 against Q8_0 activation blocks (kernels.h): 4-bit indices into a table of 16
 * signed levels, one scale per block of 32 ---- */

static inline size_t bm_nl4_bytes(int mx) { return mx ? BMOE_MXFP4_BYTES : BMOE_IQ4_NL_BYTES; }
static inline const int8_t *bm_nl4_table(int mx) { return mx ? BM_KVALUES_MXFP4 : BM_KVALUES_IQ4NL; }
/* the bytes of indices: after the f16 d (IQ4_NL) or the E8M0 exponent (MXFP4) */
static inline const uint8_t *bm_nl4_qs(int mx, const uint8_t *blk) { return blk + (mx ? 1 : 2); }

/* The block's scale as a float (exact): IQ4_NL's f16 d, MXFP4's 2^(e - 128). */
static inline float bm_nl4_scale(int mx, const uint8_t *blk) {
    return mx ? bm_e8m0_half(blk[0]) : bm_f16_to_f32(bm_rd16(blk));
}

/* IQ4_NL / MXFP4 blocks b .. nb-1 one at a time onto the lanes: the exact sum of level times the
 * input's q, then (float)s_b * (d_w * d_x) as Q8_0 (block b to lane b mod 8): the scalar path's row
 * and the SIMD paths' last nb mod 8 blocks. */
static inline void bm_nl4_blocks(float l[8], int mx, const uint8_t *w, const int8_t *xq, const float *xd, size_t b,
                                 size_t nb) {
    const size_t bb = bm_nl4_bytes(mx);
    const int8_t *kv = bm_nl4_table(mx);
    for (; b < nb; b++) {
        const uint8_t *blk = w + b * bb, *qs = bm_nl4_qs(mx, blk);
        const int8_t *p = xq + b * BMOE_Q8_0_BLOCK;
        int32_t s = 0;
        for (int j = 0; j < 16; j++)
            s += (int32_t)kv[qs[j] & 0xF] * (int32_t)p[j] + (int32_t)kv[qs[j] >> 4] * (int32_t)p[j + 16];
        l[b & 7] += (float)s * (bm_nl4_scale(mx, blk) * xd[b]);
    }
}

/* ---- K-quants against Q8_K super-blocks (kernels.h): the float steps every path shares ---- */

/* Q4_K / Q5_K: sum_j m_j * (the activation's sum over sub-block j of 32). */
static inline int32_t bm_k4_min_sum(const uint8_t m[8], const int16_t bsums[16]) {
    int32_t s = 0;
    for (int j = 0; j < 8; j++) s += (int32_t)m[j] * ((int32_t)bsums[2 * j] + (int32_t)bsums[2 * j + 1]);
    return s;
}

/* A Q4_K / Q5_K super-block's float contribution from its exact sums (kernels.h); d and dmin are the
 * block's f16 scales as floats (exact: every path converts them its own way, to the same value). */
static inline float bm_k4_value(int32_t is, int32_t im, float d, float dmin, float dx) {
    return (float)is * (d * dx) - (float)im * (dmin * dx);
}

/* Q2_K: sum_j min_j * (the activation's sum over sub-block j of 16), the mins the high nibbles. */
static inline int32_t bm_k2_min_sum(const uint8_t *sc, const int16_t bsums[16]) {
    int32_t s = 0;
    for (int j = 0; j < 16; j++) s += (int32_t)(sc[j] >> 4) * (int32_t)bsums[j];
    return s;
}

/* A Q6_K (Q3_K, IQ4_XS) super-block's float contribution from its exact sum (d: the block's f16 scale
 * as a float). */
static inline float bm_k6_value(int32_t is, float d, float dx) { return (float)is * (d * dx); }

#endif
