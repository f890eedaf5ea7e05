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
 *   Q4_K, Q5_K, Q6_K  the activation vector is first quantised to Q8_K super-blocks of 256
 *              (bm_quantize_q8_k). Super-block b gives exact integer sums over its sub-blocks:
 *                Q4_K/Q5_K  is = sum_j sc_j * sum_i q_i x_i (j = 0..7, 32 values each, q 0..15 / 0..31),
 *                           im = sum_j m_j * (x's sum over sub-block j, from the bsums)
 *                           c_b = (float)is * (d_w * d_x) - (float)im * (dmin_w * d_x)
 *                Q6_K       is = sum_j sc_j * sum_i (q_i - 32) x_i (j = 0..15, 16 values each)
 *                           c_b = (float)is * (d_w * d_x)
 *              (every |partial| < 2^31: no overflow), c_b goes to lane b mod 8, lanes accumulate in
 *              increasing b, the same tree. The float steps of c_b are one shared function
 *              (kernels_lanes.h), so every path does them identically.
 *   BF16       the weights are converted to floats exactly and the dot product is the F32 one with
 *              them (dot_dq): element i to lane i mod 8, the same adds and tree.
 * Integer sums are exact in any order, so each SIMD path may form s_b as it likes; the float steps
 * are the same operations in the same order on every path.
 *
 * Several tokens at once (prefill): the *_mt functions take one weight row and nt <= BM_MT_MAX
 * activation rows and give out[t] with exactly the bits of the one-token function on token t (each
 * token keeps its own lanes and tree; the weight block, chunk or scale vector is only loaded and
 * converted once for all of them). The scalar path's *_mt is the plain per-token loop. */
#ifndef BMOE_KERNELS_H
#define BMOE_KERNELS_H

#include <stddef.h>
#include <stdint.h>

/* One Q8_K super-block of an activation (bm_quantize_q8_k): d * q[i] approximates value i; bsums[j]
 * is the sum of q[16j .. 16j+15]. */
#define BM_Q8K_BLOCK 256
typedef struct {
    float d;
    int8_t q[BM_Q8K_BLOCK];
    int16_t bsums[BM_Q8K_BLOCK / 16];
} bm_q8k;

/* What a matmul's input becomes for a weight type: floats as they are (F32, F16, BF16), Q8_0 blocks
 * (Q8_0, Q4_0, Q5_0) or Q8_K super-blocks (Q4_K, Q5_K, Q6_K). */
typedef enum { BM_ACT_F32 = 0, BM_ACT_Q8_0, BM_ACT_Q8_K } bm_act_kind;
bm_act_kind bm_act_of(uint32_t type);

typedef enum { BM_KPATH_SCALAR = 0, BM_KPATH_AVX2, BM_KPATH_NEON, BM_KPATH_NEON_DOT, BM_KPATH_COUNT } bm_kpath;

/* Tokens per *_mt call, at most. */
#define BM_MT_MAX 4

typedef struct bm_kernels {
    bm_kpath path;
    float (*dot_f32)(const float *a, const float *b, size_t n);
    float (*dot_f16)(const uint8_t *w, const float *x, size_t n);
    /* w: n/32 Q8_0 blocks; xq: n int8, xd: n/32 scales from bm_quantize_q8_0. n a multiple of 32. */
    float (*dot_q8_0)(const uint8_t *w, const int8_t *xq, const float *xd, size_t n);
    /* bm_quantize_q8_0's result, exactly (the SIMD paths vectorise the per-value steps) */
    void (*quantize_q8_0)(const float *x, size_t n, int8_t *xq, float *xd);
    /* Multi-token: out[t] = dot(w, token t) for t < nt (1 <= nt <= BM_MT_MAX), bit for bit the
     * one-token function's value. Token t's activations are at x + t * n (F32, F16), or xq + t * n
     * and xd + t * (n / 32) (Q8_0): the [T, n] layout of a matmul's input. */
    void (*dot_f32_mt)(const float *w, const float *x, size_t n, int nt, float *out);
    void (*dot_f16_mt)(const uint8_t *w, const float *x, size_t n, int nt, float *out);
    void (*dot_q8_0_mt)(const uint8_t *w, const int8_t *xq, const float *xd, size_t n, int nt, float *out);
    /* Q4_0 / Q5_0 rows (type) against Q8_0 activation blocks, as dot_q8_0 (n a multiple of 32). */
    float (*dot_q45_0)(uint32_t type, const uint8_t *w, const int8_t *xq, const float *xd, size_t n);
    void (*dot_q45_0_mt)(uint32_t type, const uint8_t *w, const int8_t *xq, const float *xd, size_t n, int nt,
                         float *out);
    /* Q4_K / Q5_K / Q6_K rows (type) against Q8_K super-blocks x[0 .. n/256) (n a multiple of 256);
     * multi-token: token t's super-blocks start at x + t * (n / 256). */
    float (*dot_kq)(uint32_t type, const uint8_t *w, const bm_q8k *x, size_t n);
    void (*dot_kq_mt)(uint32_t type, const uint8_t *w, const bm_q8k *x, size_t n, int nt, float *out);
    /* A row of a dequantised type (n a multiple of its block size) times x: bm_dot_f32_scalar of the
     * row's bm_dequant_chunk values and x, bit for bit; and its multi-token form (x as for F32). The
     * matmuls use it for BF16 only. */
    float (*dot_dq)(uint32_t type, const uint8_t *w, const float *x, size_t n);
    void (*dot_dq_mt)(uint32_t type, const uint8_t *w, const float *x, size_t n, int nt, float *out);
    /* The exponentials around the matmuls, vectorised on the SIMD paths with exactly the scalar
     * loop's bits (kernels_vexp.h): out[i] = bm_silu(g[i]) * u[i] (out may be u), and the softmax's
     * v[i] = (float)bm_exp((double)v[i] - (double)mx). */
    void (*silu_mul)(const float *g, const float *u, size_t n, float *out);
    void (*exp_shift)(float *v, size_t n, float mx);
} bm_kernels;

/* "scalar", "avx2", "neon", "neon-dot". */
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

/* Quantises x (n a multiple of 256) to Q8_K super-blocks the way ggml's quantize_row_q8_K does: per
 * super-block, m = the first value of largest magnitude; m == 0 gives d = 0 and q = 0; else
 * s = -127 / m, q = min(127, round-half-even(s * x)), d = 1 / s (kept as a float); bsums from q.
 * A NaN or an infinity in a super-block makes its d NaN and its q 0, so it reaches the output. One
 * function for every path (O(n) against the O(n * rows) dot products). */
void bm_quantize_q8_k(const float *x, size_t n, bm_q8k *y);

/* The scalar path's functions, for the SIMD files' tails and the tests. */
float bm_dot_f32_scalar(const float *a, const float *b, size_t n);
float bm_dot_f16_scalar(const uint8_t *w, const float *x, size_t n);
float bm_dot_q8_0_scalar(const uint8_t *w, const int8_t *xq, const float *xd, size_t n);
void bm_dot_f32_mt_scalar(const float *w, const float *x, size_t n, int nt, float *out);
void bm_dot_f16_mt_scalar(const uint8_t *w, const float *x, size_t n, int nt, float *out);
void bm_dot_q8_0_mt_scalar(const uint8_t *w, const int8_t *xq, const float *xd, size_t n, int nt, float *out);
float bm_dot_q45_0_scalar(uint32_t type, const uint8_t *w, const int8_t *xq, const float *xd, size_t n);
void bm_dot_q45_0_mt_scalar(uint32_t type, const uint8_t *w, const int8_t *xq, const float *xd, size_t n, int nt,
                            float *out);
float bm_dot_kq_scalar(uint32_t type, const uint8_t *w, const bm_q8k *x, size_t n);
void bm_dot_kq_mt_scalar(uint32_t type, const uint8_t *w, const bm_q8k *x, size_t n, int nt, float *out);
float bm_dot_dq_scalar(uint32_t type, const uint8_t *w, const float *x, size_t n);
void bm_dot_dq_mt_scalar(uint32_t type, const uint8_t *w, const float *x, size_t n, int nt, float *out);
void bm_silu_mul_scalar(const float *g, const float *u, size_t n, float *out);
void bm_exp_shift_scalar(float *v, size_t n, float mx);

/* Implemented by kernels_avx2.c / kernels_neon.c (NULL-free stubs on other architectures). */
int bm_kernels_avx2(bm_kernels *k);     /* 1 and fills k when AVX2 + F16C are usable here */
int bm_kernels_neon(bm_kernels *k, int dot); /* dot: the sdot variant; 1 and fills k when usable */

#endif
