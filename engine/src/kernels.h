/* The matmul kernels: one scalar path that defines every bit, and SIMD paths (x86_64 AVX2, aarch64
 * NEON, aarch64 NEON with sdot) that reproduce exactly those bits, chosen at run time.
 *
 * The fixed order (docs/model-math.md, kernels):
 *   F32, F16   element i goes to lane i mod 8, lanes accumulate in increasing i with separate IEEE
 *              multiply and add (never fused), then ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)).
 *   Q8_0       the activation vector is first quantised to Q8_0 blocks (bm_quantize_q8_0); block b's
 *              dot product is the exact integer sum s_b = sum q_w * q_x, its float contribution is
 *              (float)s_b * (d_w * d_x); block b goes to lane b mod 8, lanes accumulate in increasing b
 *              and are combined with the same tree.
 *   Q4_0, Q5_0 against the same Q8_0 activation blocks: block b's exact integer sum
 *              s_b = sum (q_w - 8) * q_x (Q5_0: q_w - 16, q_w with its fifth bit), then exactly the Q8_0
 *              float steps: (float)s_b * (d_w * d_x) onto lane b mod 8, the same tree.
 *   Q4_1, Q5_1 against Q8_1 activation blocks (bm_quantize_q8_1: Q8_0's q and d, and per block
 *              s_x = f16(d sum q)): block b's exact sum s_b = sum q_w * q_x of the unsigned levels, then
 *              c_b = (float)s_b * (d_w * d_x) + m_w * s_x onto lane b mod 8, the same tree.
 *   IQ4_NL, MXFP4 against Q8_0 activation blocks: block b's exact sum s_b = sum kv[i_w] * q_x of its
 *              table levels (BM_KVALUES_IQ4NL, BM_KVALUES_MXFP4), then (float)s_b * (d_w * d_x) onto lane
 *              b mod 8 as Q8_0, d_w IQ4_NL's f16 d or MXFP4's 2^(e - 128).
 *   Q4_K, Q5_K, Q6_K  the activation vector is first quantised to Q8_K super-blocks of 256
 *              (bm_quantize_q8_k). Super-block b gives exact integer sums over its sub-blocks:
 *                Q4_K/Q5_K  is = sum_j sc_j * sum_i q_i x_i (j = 0..7, 32 values each, q 0..15 / 0..31),
 *                           im = sum_j m_j * (x's sum over sub-block j, from the bsums)
 *                           c_b = (float)is * (d_w * d_x) - (float)im * (dmin_w * d_x)
 *                Q6_K       is = sum_j sc_j * sum_i (q_i - 32) x_i (j = 0..15, 16 values each)
 *                           c_b = (float)is * (d_w * d_x)
 *                Q2_K       is = sum_j (sc_j & 15) * sum_i q_i x_i, im = sum_j (sc_j >> 4) * bsum_j (16 of 16,
 *                           q 0..3): Q4_K's c_b
 *                Q3_K       is = sum_j (sc_j - 32) * sum_i q_i x_i (16 of 16, q -4..3): Q6_K's c_b
 *                IQ4_XS     is = sum_j (ls_j - 32) * sum_i kv_i x_i (8 of 32, IQ4_NL's levels): Q6_K's c_b
 *              (every |partial| < 2^31: no overflow), c_b goes to lane b mod 8, lanes accumulate in
 *              increasing b, the same tree. The float steps of c_b are one shared function
 *              (kernels_lanes.h), so every path does them identically.
 *   BF16       the weights are converted to floats exactly and the dot product is the F32 one with
 *              them (dot_dq): element i to lane i mod 8, the same adds and tree.
 * Integer sums are exact in any order, so each SIMD path may form s_b as it likes; the float steps
 * are the same operations in the same order on every path.
 *
 * Which kernel a weight type uses on each path is the type table's (type_traits.h); forward.c calls
 * k->dot[type] and never switches on a type.
 *
 * Several tokens at once (prefill): the *_mt functions take one weight row and nt <= BM_MT_MAX
 * activation rows and give out[t] with exactly the bits of the one-token function on token t (each
 * token keeps its own lanes and tree; the weight block, chunk or scale vector is only loaded and
 * converted once for all of them). The scalar path's *_mt is the plain per-token loop. */
#ifndef BMOE_KERNELS_H
#define BMOE_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "type_traits.h"

/* Tokens per *_mt call, at most. */
#define BM_MT_MAX 4

/* A tile kernel (bm_kernels.dot_tile): nr (1 .. BM_TILE_R) consecutive weight rows, row_bytes apart,
 * times nt (2 .. BM_TILE_T) tokens' inputs; out[r * BM_TILE_T + t] is bit for bit the one-token
 * kernel's value of row r on token t. */
#define BM_TILE_R 8
#define BM_TILE_T 32
typedef void (*bm_dot_tile_fn)(const uint8_t *w, size_t row_bytes, int nr, const bm_act *a, size_t n, int nt,
                               float *out);

/* A kernel path's functions. dot[type] / dot_mt[type] are the type table's kernels of this path
 * (type_traits.h; the scalar ones where a path has none compiled in), NULL for a type the engine does
 * not compute with; the rest are the functions around the matmuls. */
typedef struct bm_kernels {
    bm_kpath path;
    bm_dot_fn dot[GGML_TYPE_COUNT];
    bm_dot_mt_fn dot_mt[GGML_TYPE_COUNT];
    /* row x token tiles (BM_TILE_R x BM_TILE_T) where the path has them for the type, else NULL (the
     * matmul then runs dot_mt row by row) */
    bm_dot_tile_fn dot_tile[GGML_TYPE_COUNT];
    /* the F32 dot product of two float vectors (attention's q . k) */
    float (*dot_f32)(const float *a, const float *b, size_t n);
    /* Attention (kernels_attn.c): out[j] = dot_f32(q, k + j * ldk, n) for j < nk, each with dot_f32's
     * bits; and out[c] = sum_j p[j] * v[j * ldv + c] for c < n, summed from 0 in increasing j < nj,
     * a separate multiply and add per step. */
    void (*dot_f32_rows)(const float *q, const float *k, size_t ldk, size_t n, int nk, float *out);
    void (*weighted_rows)(const float *p, int nj, const float *v, size_t ldv, size_t n, float *out);
    /* The same for two queries against the same keys and values (two heads of one KV group), each
     * output with the one-query function's bits; NULL on a path without them (then the one-query
     * functions run twice). */
    void (*dot_f32_rows2)(const float *q0, const float *q1, const float *k, size_t ldk, size_t n, int nk, float *out0,
                          float *out1);
    void (*weighted_rows2)(const float *p0, const float *p1, int nj, const float *v, size_t ldv, size_t n, float *out0,
                           float *out1);
    /* bm_quantize_q8_0's / bm_quantize_q8_1's result, exactly (the SIMD paths vectorise the per-value
     * steps) */
    void (*quantize_q8_0)(const float *x, size_t n, int8_t *xq, float *xd);
    void (*quantize_q8_1)(const float *x, size_t n, int8_t *xq, float *xd, float *xs);
    /* The exponentials around the matmuls, vectorised on the SIMD paths with exactly the scalar
     * loop's bits (kernels_vexp.h): out[i] = bm_silu(g[i]) * u[i] (out may be u), and the softmax's
     * v[i] = (float)bm_exp((double)v[i] - (double)mx). */
    void (*silu_mul)(const float *g, const float *u, size_t n, float *out);
    void (*exp_shift)(float *v, size_t n, float mx);
} bm_kernels;

/* "scalar", "avx2", "neon", "neon-dot", "avx512-vnni". */
const char *bm_kpath_name(bm_kpath p);
/* Parses a path name or "auto" (→ *out = -1). 0, or 2 for an unknown name. */
int bm_kpath_parse(const char *s, int *out);
/* 1 when the path is compiled into this binary and the CPU it runs on has the instructions. */
int bm_kpath_available(bm_kpath p);
/* The fastest available path. */
bm_kpath bm_kpath_best(void);
/* Fills k for an available path (scalar when p is not available). */
void bm_kernels_get(bm_kpath p, bm_kernels *k);

/* Quantises x (n a multiple of 32) to Q8_0 blocks the way ggml's quantize_row_q8_0 does: per block
 * amax = max |x|, d = amax / 127, id = 127/amax (0 when amax is 0), q = round-half-even(x * id), as
 * ggml's x86 code does (docs/model-math.md: its scalar and ARM code differ at ties); the scale
 * kept is d rounded to f16 (xd[b] holds that f16 value as a float). A NaN in a block makes its scale
 * NaN (and its q 0), so a NaN still reaches the output. This is the scalar definition; a path's
 * quantize_q8_0 gives exactly its bytes. */
void bm_quantize_q8_0(const float *x, size_t n, int8_t *xq, float *xd);

/* Q8_1 (ggml's quantize_row_q8_1 on x86): the Q8_0 blocks above, and per block
 * xs[b] = f16(d * (float)sum q) with d = amax / 127 before its rounding to f16, as a float (NaN when
 * the block's scale is). */
void bm_quantize_q8_1(const float *x, size_t n, int8_t *xq, float *xd, float *xs);
/* The Q8_1 sums of blocks already quantised to Q8_0 (xq) from x: what bm_quantize_q8_1 adds. */
void bm_q8_1_sums(const float *x, size_t n, const int8_t *xq, const float *xd, float *xs);

/* Quantises x (n a multiple of 256) to Q8_K super-blocks the way ggml's quantize_row_q8_K does: per
 * super-block, m = the first value of largest magnitude; m == 0 gives d = 0 and q = 0; else
 * s = -127 / m, q = min(127, round-half-even(s * x)), d = 1 / s (kept as a float); bsums from q.
 * A NaN or an infinity in a super-block makes its d NaN and its q 0, so it reaches the output. One
 * function for every path (O(n) against the O(n * rows) dot products). */
void bm_quantize_q8_k(const float *x, size_t n, bm_q8k *y);

/* The scalar path's raw F32 / F16 dot products and exponentials, for the SIMD files' tails and the
 * tests. */
float bm_vdot_f32_scalar(const float *a, const float *b, size_t n);
float bm_vdot_f16_scalar(const uint8_t *w, const float *x, size_t n);
void bm_silu_mul_scalar(const float *g, const float *u, size_t n, float *out);
void bm_exp_shift_scalar(float *v, size_t n, float mx);

/* Every type's kernels, one pair per path: bm_dot_<type>_<path> and bm_dot_mt_<type>_<path>
 * (type_table.c puts them in the type's row). A path's functions exist only in a binary built for
 * its architecture. */
#define BM_WEIGHT_TYPES(X)                                                                                 \
    X(f32) X(f16) X(bf16) X(q8_0) X(q4_0) X(q5_0) X(q4_1) X(q5_1) X(iq4_nl) X(mxfp4) X(q2_K) X(q3_K) X(q4_K) X(q5_K) \
        X(q6_K) X(iq4_xs)
#define BM_DOT_DECL(T, P)                                                                                  \
    float bm_dot_##T##_##P(const uint8_t *w, const bm_act *a, size_t n);                                  \
    void bm_dot_mt_##T##_##P(const uint8_t *w, const bm_act *a, size_t n, int nt, float *out);
#define BM_DOT_DECL_PATHS(T) BM_DOT_DECL(T, scalar) BM_DOT_DECL(T, avx2) BM_DOT_DECL(T, neon) BM_DOT_DECL(T, neon_dot)
BM_WEIGHT_TYPES(BM_DOT_DECL_PATHS)

/* Attention's loops per path (kernels_attn.c; the SIMD ones exist only on their architecture). */
void bm_dot_f32_rows_scalar(const float *q, const float *k, size_t ldk, size_t n, int nk, float *out);
void bm_weighted_rows_scalar(const float *p, int nj, const float *v, size_t ldv, size_t n, float *out);
void bm_dot_f32_rows_avx2(const float *q, const float *k, size_t ldk, size_t n, int nk, float *out);
void bm_weighted_rows_avx2(const float *p, int nj, const float *v, size_t ldv, size_t n, float *out);
void bm_dot_f32_rows_avx512(const float *q, const float *k, size_t ldk, size_t n, int nk, float *out);
void bm_weighted_rows_avx512(const float *p, int nj, const float *v, size_t ldv, size_t n, float *out);
void bm_dot_f32_rows2_avx512(const float *q0, const float *q1, const float *k, size_t ldk, size_t n, int nk,
                             float *out0, float *out1);
void bm_weighted_rows2_avx512(const float *p0, const float *p1, int nj, const float *v, size_t ldv, size_t n,
                              float *out0, float *out1);
void bm_dot_f32_rows_neon(const float *q, const float *k, size_t ldk, size_t n, int nk, float *out);
void bm_weighted_rows_neon(const float *p, int nj, const float *v, size_t ldv, size_t n, float *out);

/* Implemented by kernels_avx2.c / kernels_neon.c (stubs returning 0 on other architectures): 1 and
 * k's path-specific functions when the CPU has the path, else 0. */
int bm_kernels_avx2(bm_kernels *k);     /* AVX2 + F16C */
int bm_kernels_avx512(bm_kernels *k);   /* AVX2 + F16C and AVX-512 F, BW, VL, VNNI (kernels_avx512.c) */
int bm_kernels_neon(bm_kernels *k, int dot); /* dot: the sdot variant */

#endif
