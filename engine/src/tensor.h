/* Numeric helpers: f16 conversion, row dequantisation, and the few transcendental functions the
 * forward pass needs. The matmul dot products are in kernels.h.
 *
 * Determinism: every function here has one fixed evaluation order, uses only IEEE +,-,*,/ and sqrt
 * (the build has -ffp-contract=off, so no fused multiply-add), and nothing depends on the thread
 * count. exp/log/sin/cos are computed here, not by libm, because glibc and musl (and their versions)
 * differ in the last bit; ours give the same bits on x86_64 and aarch64. */
#ifndef BMOE_TENSOR_H
#define BMOE_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#define BMOE_Q8_0_BLOCK 32
#define BMOE_Q8_0_BYTES 34 /* f16 scale + 32 int8 */

/* ggml's block layouts (ggml-common.h), little-endian, read byte by byte (docs/model-math.md has the
 * values each one holds):
 *   Q4_0   18 bytes / 32:  f16 d, qs[16]; y[j] = d * ((qs[j] & 15) - 8), y[j+16] = d * ((qs[j] >> 4) - 8)
 *   Q5_0   22 bytes / 32:  f16 d, qh (u32: bit j is value j's 5th bit), qs[16]; as Q4_0 with 5 bits - 16
 *   Q4_1   20 bytes / 32:  f16 d, f16 m, qs[16]; y[j] = (qs[j] & 15) * d + m, y[j+16] = (qs[j] >> 4) * d + m
 *   Q5_1   24 bytes / 32:  f16 d, f16 m, qh (u32), qs[16]; as Q4_1 with Q5_0's fifth bits
 *   IQ4_NL 18 bytes / 32:  f16 d, qs[16]; y[j] = d * kv[qs[j] & 15], y[j+16] = d * kv[qs[j] >> 4] with
 *                          kv = BM_KVALUES_IQ4NL
 *   MXFP4  17 bytes / 32:  u8 e (E8M0), qs[16]; y[j] = kv[qs[j] & 15] * s, y[j+16] = kv[qs[j] >> 4] * s
 *                          with kv = BM_KVALUES_MXFP4 (twice the FP4 E2M1 values) and s = 2^(e - 128)
 *   Q2_K   84 bytes / 256: scales[16] (low nibble scale, high nibble min), qs[64] (2 bits), f16 d, f16 dmin
 *   Q3_K  110 bytes / 256: hmask[32] (the third bit), qs[64] (2 bits), scales[12] (16 x 6 bits), f16 d
 *   Q4_K  144 bytes / 256: f16 d, f16 dmin, scales[12] (8 x 6-bit scale, 8 x 6-bit min), qs[128]
 *   Q5_K  176 bytes / 256: f16 d, f16 dmin, scales[12], qh[32], qs[128]
 *   Q6_K  210 bytes / 256: ql[128], qh[64], scales[16] (int8), f16 d
 *   IQ4_XS 136 bytes / 256: f16 d, u16 scales_h, scales_l[4] (8 x 6-bit scales), qs[128] (IQ4_NL's
 *                          levels, 8 sub-blocks of 32 laid out as IQ4_NL blocks)
 *   BF16    2 bytes / 1:   the high half of an f32
 * Each value is computed as ggml's dequantize_row_* computes it in float (the bm_to_f32_* below, the
 * type table's to_f32). */
#define BMOE_QK_K 256
#define BMOE_Q4_0_BYTES 18
#define BMOE_Q5_0_BYTES 22
#define BMOE_Q4_1_BYTES 20
#define BMOE_Q5_1_BYTES 24
#define BMOE_IQ4_NL_BYTES 18
#define BMOE_MXFP4_BYTES 17

/* The 16 levels of IQ4_NL (and IQ4_XS) and of MXFP4 (ggml-common.h's kvalues_iq4nl and kvalues_mxfp4:
 * MXFP4's are the FP4 E2M1 values doubled, so they are integers; its scale is halved to match). */
static const int8_t BM_KVALUES_IQ4NL[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
static const int8_t BM_KVALUES_MXFP4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
#define BMOE_Q2_K_BYTES 84
#define BMOE_Q3_K_BYTES 110
#define BMOE_IQ4_XS_BYTES 136
#define BMOE_Q4_K_BYTES 144
#define BMOE_Q5_K_BYTES 176
#define BMOE_Q6_K_BYTES 210

/* Values per chunk of the dequantising kernels (BF16's): a multiple of every block size above. */
#define BMOE_DQ_CHUNK 256

float bm_f16_to_f32(uint16_t h);  /* exact; subnormals, inf and NaN (payload kept) */
uint16_t bm_f32_to_f16(float f);  /* round to nearest even; overflow to inf */

/* Dequantises n elements of `row` (a whole number of the type's blocks) into y: the type table's
 * to_f32 (type_traits.h); zeros for a type the engine does not compute with. */
void row_to_f32(uint32_t type, const void *row, float *y, size_t n);

/* The table's dequantisers: n values (a whole number of blocks) of blocks into y, each value as ggml's
 * dequantize_row_* computes it. The scalar definition of every value. */
void bm_to_f32_f32(const uint8_t *blocks, float *y, size_t n);
void bm_to_f32_f16(const uint8_t *blocks, float *y, size_t n);
void bm_to_f32_bf16(const uint8_t *blocks, float *y, size_t n);
void bm_to_f32_q8_0(const uint8_t *blocks, float *y, size_t n);
void bm_to_f32_q4_0(const uint8_t *blocks, float *y, size_t n);
void bm_to_f32_q5_0(const uint8_t *blocks, float *y, size_t n);
void bm_to_f32_q4_1(const uint8_t *blocks, float *y, size_t n);
void bm_to_f32_q5_1(const uint8_t *blocks, float *y, size_t n);
void bm_to_f32_iq4_nl(const uint8_t *blocks, float *y, size_t n);
void bm_to_f32_mxfp4(const uint8_t *blocks, float *y, size_t n);

/* An MXFP4 block's scale, ggml's GGML_E8M0_TO_FP32_HALF: 2^(e - 128) (subnormal for e < 2), finite for
 * every e (e = 0xFF, NaN in the OCP formats, is refused by the block check before any use). */
float bm_e8m0_half(uint8_t e);
void bm_to_f32_q2_K(const uint8_t *blocks, float *y, size_t n);
void bm_to_f32_q3_K(const uint8_t *blocks, float *y, size_t n);
void bm_to_f32_iq4_xs(const uint8_t *blocks, float *y, size_t n);
void bm_to_f32_q4_K(const uint8_t *blocks, float *y, size_t n);
void bm_to_f32_q5_K(const uint8_t *blocks, float *y, size_t n);
void bm_to_f32_q6_K(const uint8_t *blocks, float *y, size_t n);

/* Q4_K's (and Q5_K's) 6-bit scale and min of sub-block j (0..7), ggml's get_scale_min_k4. */
static inline void bm_scale_min_k4(int j, const uint8_t *q, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
#ifndef BMOE_FAULT_Q4_K_SCALE_UNPACK
        *sc = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
#else
        *sc = (uint8_t)(q[j + 4] & 0xF); /* fault: the scale's two high bits (in q[j - 4]) are dropped */
#endif
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

/* All eight 6-bit scales and mins of a Q4_K / Q5_K super-block at once, as bm_scale_min_k4 gives them
 * one by one: byte j of the little-endian words sc[j / 4] and m[j / 4] is sub-block j's. Every kernel
 * path unpacks them here (four lanes of bytes per operation). */
static inline void bm_scales_mins_k4_words(const uint8_t *q, uint32_t sc[2], uint32_t m[2]) {
    const uint32_t a = (uint32_t)q[0] | (uint32_t)q[1] << 8 | (uint32_t)q[2] << 16 | (uint32_t)q[3] << 24;
    const uint32_t b = (uint32_t)q[4] | (uint32_t)q[5] << 8 | (uint32_t)q[6] << 16 | (uint32_t)q[7] << 24;
    const uint32_t c = (uint32_t)q[8] | (uint32_t)q[9] << 8 | (uint32_t)q[10] << 16 | (uint32_t)q[11] << 24;
    sc[0] = a & 0x3f3f3f3fu;
    m[0] = b & 0x3f3f3f3fu;
#ifndef BMOE_FAULT_Q4_K_SCALE_UNPACK
    sc[1] = (c & 0x0f0f0f0fu) | ((a >> 2) & 0x30303030u); /* the two high bits: bits 6-7 of bytes 0-3 */
#else
    sc[1] = c & 0x0f0f0f0fu; /* fault: as in bm_scale_min_k4 */
#endif
    m[1] = ((c >> 4) & 0x0f0f0f0fu) | ((b >> 2) & 0x30303030u);
}

static inline void bm_scales_mins_k4(const uint8_t *q, uint8_t sc[8], uint8_t m[8]) {
    uint32_t s[2], n[2];
    bm_scales_mins_k4_words(q, s, n);
    for (int j = 0; j < 8; j++) {
        sc[j] = (uint8_t)(s[j / 4] >> (8 * (j % 4)));
        m[j] = (uint8_t)(n[j / 4] >> (8 * (j % 4)));
    }
}

/* Q6_K: value l + 32k (k = 0..3) of each 128 takes its high two bits from qh[l] >> BM_Q6K_SHIFT(k).
 * One definition for the dequantiser and every kernel path. */
#ifndef BMOE_FAULT_Q6_K_HIGH_SHIFT
#define BM_Q6K_SHIFT(k) (2 * (k))
#else
/* fault: the high bits of the second and third quarters are taken from each other's bit pair */
#define BM_Q6K_SHIFT(k) ((k) == 1 ? 4 : (k) == 2 ? 2 : 2 * (k))
#endif

/* Q3_K's 16 six-bit scales (12 packed bytes), unpacked as ggml's dequantize_row_q3_K does, before the
 * - 32: sc[j] is sub-block j's (0..63). */
static inline void bm_q3k_scales(const uint8_t *p, int8_t sc[16]) {
    uint32_t a[4];
    for (int k = 0; k < 3; k++)
        a[k] = (uint32_t)p[4 * k] | (uint32_t)p[4 * k + 1] << 8 | (uint32_t)p[4 * k + 2] << 16 | (uint32_t)p[4 * k + 3] << 24;
    const uint32_t m1 = 0x03030303u, m2 = 0x0f0f0f0fu, tmp = a[2];
    a[2] = ((a[0] >> 4) & m2) | (((tmp >> 4) & m1) << 4);
    a[3] = ((a[1] >> 4) & m2) | (((tmp >> 6) & m1) << 4);
    a[0] = (a[0] & m2) | (((tmp >> 0) & m1) << 4);
    a[1] = (a[1] & m2) | (((tmp >> 2) & m1) << 4);
    for (int j = 0; j < 16; j++) sc[j] = (int8_t)(a[j / 4] >> (8 * (j % 4)));
}

/* IQ4_XS's scale of sub-block ib (0..7), before the - 32 (0..63). */
static inline int bm_iq4xs_scale(const uint8_t *blk, int ib) {
    const uint16_t h = (uint16_t)(blk[2] | blk[3] << 8);
    return ((blk[4 + ib / 2] >> (4 * (ib % 2))) & 0xF) | (((h >> (2 * ib)) & 3) << 4);
}

/* Portable math in double precision (error well below float rounding). */
double bm_exp(double x);
double bm_log(double x);             /* x > 0 */
void bm_sincos(double x, double *s, double *c);
float bm_silu(float z);              /* z / (1 + exp(-z)) */
double bm_tanh(double x);
float bm_gelu_tanh(float z);         /* 0.5 z (1 + tanh(sqrt(2/pi) (z + 0.044715 z^3))) */
/* GELU as ggml's CPU backend computes it (llama.cpp's GELU and GEGLU): a table indexed by z rounded to
 * f16, holding gelu_tanh rounded to f16; z <= -10 gives 0, z >= 10 gives z. */
float bm_gelu_f16(float z);
/* bm_gelu_f16's table itself: tab[h] (BM_GELU_TAB entries) = its value at every z that rounds to the f16
 * h, computed by bm_gelu_f16 once per entry, so bm_gelu_f16_tab(tab, z) == bm_gelu_f16(z) bit for bit
 * for every float z (NaN included) without its double-precision tanh per value. */
#define BM_GELU_TAB 65536
void bm_gelu_f16_table(float *tab);
static inline float bm_gelu_f16_tab(const float *tab, float z) {
    if (z <= -10.0f) return 0.0f;
    if (z >= 10.0f) return z;
    return tab[bm_f32_to_f16(z)];
}

#endif
