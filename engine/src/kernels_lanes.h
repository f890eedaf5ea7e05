/* Helpers shared by the kernel files (kernels.c, kernels_avx2.c, kernels_neon.c): the one lane tree
 * and the little-endian f16 load. Internal to the kernels. */
#ifndef BMOE_KERNELS_LANES_H
#define BMOE_KERNELS_LANES_H

#include <stdint.h>

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

#endif
