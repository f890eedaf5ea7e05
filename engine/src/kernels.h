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
 *   Q4_0, Q5_0, Q4_K, Q5_K, Q6_K, BF16 ("dequantised" types, tensor.h bm_type_dequantised): the
 *              weights are dequantised to floats exactly as bm_dequant_chunk computes them, and the
 *              dot product is then the F32 one with those floats: element i to lane i mod 8, the
 *              same adds and tree. The activations are not quantised.
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
    /* A row of a dequantised type (n a multiple of its block size) times x: bm_dot_f32_scalar of the
     * row's bm_dequant_chunk values and x, bit for bit; and its multi-token form (x as for F32). */
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
 * amax = max |x|, d = amax / 127, id = 1/d (0 when d is 0), q = round-half-away(x * id); the scale
 * kept is d rounded to f16 (xd[b] holds that f16 value as a float). A NaN in a block makes its scale
 * NaN (and its q 0), so a NaN still reaches the output. This is the scalar definition; a path's
 * quantize_q8_0 gives exactly its bytes. */
void bm_quantize_q8_0(const float *x, size_t n, int8_t *xq, float *xd);

/* The scalar path's functions, for the SIMD files' tails and the tests. */
float bm_dot_f32_scalar(const float *a, const float *b, size_t n);
float bm_dot_f16_scalar(const uint8_t *w, const float *x, size_t n);
float bm_dot_q8_0_scalar(const uint8_t *w, const int8_t *xq, const float *xd, size_t n);
void bm_dot_f32_mt_scalar(const float *w, const float *x, size_t n, int nt, float *out);
void bm_dot_f16_mt_scalar(const uint8_t *w, const float *x, size_t n, int nt, float *out);
void bm_dot_q8_0_mt_scalar(const uint8_t *w, const int8_t *xq, const float *xd, size_t n, int nt, float *out);
float bm_dot_dq_scalar(uint32_t type, const uint8_t *w, const float *x, size_t n);
void bm_dot_dq_mt_scalar(uint32_t type, const uint8_t *w, const float *x, size_t n, int nt, float *out);
void bm_silu_mul_scalar(const float *g, const float *u, size_t n, float *out);
void bm_exp_shift_scalar(float *v, size_t n, float mx);

/* Implemented by kernels_avx2.c / kernels_neon.c (NULL-free stubs on other architectures). */
int bm_kernels_avx2(bm_kernels *k);     /* 1 and fills k when AVX2 + F16C are usable here */
int bm_kernels_neon(bm_kernels *k, int dot); /* dot: the sdot variant; 1 and fills k when usable */

#endif
