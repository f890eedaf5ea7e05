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

static inline uint16_t bm_rd16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

#endif
