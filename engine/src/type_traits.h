/* Weight types as data: one row per ggml type id, as ggml's type_traits (ggml.c) and type_traits_cpu
 * (ggml-cpu.c) are. A row says everything the engine needs to know about a type:
 *
 *   name             ggml's name ("q4_K"); every id has one, a supported type also has the rest
 *   blck, bytes      values and bytes per block (ggml-common.h's layouts; tensor.h spells them out)
 *   align            the alignment the data needs (the f32 / f16 words the kernels load as such)
 *   act              the activation format its dot product takes: the float input as is (F32), or the
 *                    input rounded to Q8_0 / Q8_1 blocks of 32 or Q8_K super-blocks of 256, the
 *                    vec_dot_type ggml's CPU backend gives the type
 *   to_f32           dequantisation of whole blocks, ggml's dequantize_row_* in float (tensor.c)
 *   fields           the floats a block carries that must be finite (block_check.c): an f16 scale, an
 *                    E8M0 exponent, or (F32, F16, BF16) the value itself, by byte offset in the block
 *   dot[], dot_mt[]  its dot-product kernels per kernel path (kernels.c, kernels_avx2.c,
 *                    kernels_neon.c), one token and several (kernels.h)
 *
 * The GGUF reader, the tensor code, the kernels' dispatch, the block checker, the expert layout and
 * `bmoe info` read this table; none of them switches on a type. Adding a type is a row in
 * type_table.c plus its kernels (docs/engine.md, "How to add a weight type"). */
#ifndef BMOE_TYPE_TRAITS_H
#define BMOE_TYPE_TRAITS_H

#include <stddef.h>
#include <stdint.h>

/* ggml's type ids (ggml.h). The ones named here are the ones the engine computes with, the activation
 * formats and the count; every other id below GGML_TYPE_COUNT has a name only. */
enum ggml_type {
    GGML_TYPE_F32 = 0, GGML_TYPE_F16 = 1, GGML_TYPE_Q4_0 = 2, GGML_TYPE_Q4_1 = 3, GGML_TYPE_Q5_0 = 6,
    GGML_TYPE_Q5_1 = 7, GGML_TYPE_Q8_0 = 8, GGML_TYPE_Q8_1 = 9, GGML_TYPE_Q2_K = 10, GGML_TYPE_Q3_K = 11,
    GGML_TYPE_Q4_K = 12, GGML_TYPE_Q5_K = 13, GGML_TYPE_Q6_K = 14, GGML_TYPE_Q8_K = 15, GGML_TYPE_IQ4_NL = 20,
    GGML_TYPE_IQ4_XS = 23, GGML_TYPE_BF16 = 30, GGML_TYPE_MXFP4 = 39, GGML_TYPE_COUNT = 42
};

/* The kernel paths (kernels.h): the scalar one defines every bit, the others reproduce it. AVX512 is
 * x86_64 with AVX-512 VNNI: AVX2's kernels for one token, its own row x token tiles for prefill. */
typedef enum {
    BM_KPATH_SCALAR = 0, BM_KPATH_AVX2, BM_KPATH_NEON, BM_KPATH_NEON_DOT, BM_KPATH_AVX512, BM_KPATH_COUNT
} bm_kpath;

/* What a matmul's input becomes for a weight type (docs/model-math.md, activation quantisation). */
typedef enum { BM_ACT_F32 = 0, BM_ACT_Q8_0, BM_ACT_Q8_1, BM_ACT_Q8_K, BM_ACT_COUNT } bm_act_kind;

/* One Q8_K super-block of an activation (bm_quantize_q8_k): d * q[i] approximates value i; bsums[j]
 * is the sum of q[16j .. 16j+15]. */
#define BM_Q8K_BLOCK 256
typedef struct {
    float d;
    int8_t q[BM_Q8K_BLOCK];
    int16_t bsums[BM_Q8K_BLOCK / 16];
} bm_q8k;

/* A matmul's input in the format its weight type takes, for T tokens laid out [T, ...]: token t's
 * floats at x + t n (BM_ACT_F32); its int8 values at q + t n and its block scales at d + t (n / 32)
 * (Q8_0 and Q8_1: the same q and d, bm_quantize_q8_0), Q8_1's block sums f16(d * sum q) at
 * s + t (n / 32); its Q8_K super-blocks at k + t (n / 256). Only the members of the weight's format
 * are read. */
typedef struct bm_act {
    const float *x;
    const int8_t *q;
    const float *d;
    const float *s;
    const bm_q8k *k;
} bm_act;

/* Token t's input of a [T, n] one. */
static inline bm_act bm_act_token(const bm_act *a, size_t n, int t) {
    const size_t u = (size_t)t;
    bm_act o = {a->x ? a->x + u * n : NULL, a->q ? a->q + u * n : NULL, a->d ? a->d + u * (n / 32) : NULL,
                a->s ? a->s + u * (n / 32) : NULL, a->k ? a->k + u * (n / BM_Q8K_BLOCK) : NULL};
    return o;
}

/* One weight row of n values (a whole number of blocks) times one token's input, and times nt
 * (1 .. BM_MT_MAX) tokens' (out[t], bit for bit the one-token value for token t). */
typedef float (*bm_dot_fn)(const uint8_t *w, const bm_act *a, size_t n);
typedef void (*bm_dot_mt_fn)(const uint8_t *w, const bm_act *a, size_t n, int nt, float *out);
/* n values (a whole number of blocks) of `blocks` into y. */
typedef void (*bm_to_f32_fn)(const uint8_t *blocks, float *y, size_t n);

/* A float a block carries, checked for finiteness: its format and byte offset in the block. */
typedef enum { BM_FIELD_F32 = 1, BM_FIELD_F16, BM_FIELD_BF16, BM_FIELD_E8M0 } bm_field_fmt;
typedef struct {
    uint8_t fmt;      /* bm_field_fmt; 0 ends the list */
    uint16_t off;
    const char *name; /* "d", "dmin", "e", or "value" for F32 / F16 / BF16 */
} bm_float_field;

#define BM_TYPE_FIELDS 2

typedef struct bm_type_traits {
    const char *name;
    uint32_t blck;
    uint32_t bytes;
    uint32_t align;
    bm_act_kind act;
    bm_to_f32_fn to_f32;
    bm_float_field fields[BM_TYPE_FIELDS];
    bm_dot_fn dot[BM_KPATH_COUNT];       /* NULL: the path is not compiled into this binary */
    bm_dot_mt_fn dot_mt[BM_KPATH_COUNT];
} bm_type_traits;

/* The row of a type the engine computes with, or NULL (unknown or unsupported id). */
const bm_type_traits *bm_type(uint32_t id);
/* ggml's name of any id ("q2_K", "q4_2 (removed)"); "unknown" past ggml's table. */
const char *bm_type_name(uint32_t id);
/* Bytes of n values of a supported type (n a multiple of its block); 0 otherwise or on overflow. */
uint64_t bm_type_nbytes(uint32_t id, uint64_t n);
/* The supported types' names in id order, comma-separated ("f32, f16, q4_0, ..."), into buf (size
 * bytes, 256 are enough); returns buf. */
const char *bm_types_supported(char *buf, size_t size);
/* "f32", "q8_0", "q8_1", "q8_K". */
const char *bm_act_name(bm_act_kind a);
/* Values per block of an activation format (1, 32, 32, 256). */
uint32_t bm_act_block(bm_act_kind a);

#endif
