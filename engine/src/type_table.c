/* The weight-type table (type_traits.h). One row per type the engine computes with; every other ggml
 * id has its name only.
 *
 * The table binds each type to its dequantiser (tensor.c) and kernels (kernels*.c), which themselves
 * look types up through type_traits.h: so type_traits.h (what a type is, how to look one up) includes
 * nothing of theirs, and the table that points at them lives here, in a file no other includes. */
#include "type_traits.h"

#include <string.h>

#include "kernels.h"
#include "tensor.h"

/* Each path's kernels exist only in a binary built for its architecture; elsewhere the row holds NULL
 * (and bm_kpath_available says the path is absent). */
#if defined(__x86_64__)
#define AVX2_DOT(T) bm_dot_##T##_avx2
#define AVX2_MT(T) bm_dot_mt_##T##_avx2
/* the AVX-512 VNNI path multiplies one token with AVX2's kernels (its tiles are kernels.h's dot_tile) */
#define AVX512_DOT(T) bm_dot_##T##_avx2
#define AVX512_MT(T) bm_dot_mt_##T##_avx2
#else
#define AVX512_DOT(T) NULL
#define AVX512_MT(T) NULL
#define AVX2_DOT(T) NULL
#define AVX2_MT(T) NULL
#endif
#if defined(__aarch64__)
#define NEON_DOT(T) bm_dot_##T##_neon
#define NEON_MT(T) bm_dot_mt_##T##_neon
#define SDOT_DOT(T) bm_dot_##T##_neon_dot
#define SDOT_MT(T) bm_dot_mt_##T##_neon_dot
#else
#define NEON_DOT(T) NULL
#define NEON_MT(T) NULL
#define SDOT_DOT(T) NULL
#define SDOT_MT(T) NULL
#endif

/* A type's kernels on every path, by the names kernels.h gives them. */
#define KERNELS(T)                                                                                         \
    .dot = {bm_dot_##T##_scalar, AVX2_DOT(T), NEON_DOT(T), SDOT_DOT(T), AVX512_DOT(T)},                    \
    .dot_mt = {bm_dot_mt_##T##_scalar, AVX2_MT(T), NEON_MT(T), SDOT_MT(T), AVX512_MT(T)}

#define F16(off, name) {BM_FIELD_F16, off, name}

static const bm_type_traits TYPES[GGML_TYPE_COUNT] = {
    [GGML_TYPE_F32] = {"f32", 1, 4, 4, BM_ACT_F32, bm_to_f32_f32, {{BM_FIELD_F32, 0, "value"}}, KERNELS(f32)},
    [GGML_TYPE_F16] = {"f16", 1, 2, 2, BM_ACT_F32, bm_to_f32_f16, {F16(0, "value")}, KERNELS(f16)},
    [GGML_TYPE_BF16] = {"bf16", 1, 2, 2, BM_ACT_F32, bm_to_f32_bf16, {{BM_FIELD_BF16, 0, "value"}}, KERNELS(bf16)},
    [GGML_TYPE_Q8_0] = {"q8_0", 32, 34, 1, BM_ACT_Q8_0, bm_to_f32_q8_0, {F16(0, "d")}, KERNELS(q8_0)},
    [GGML_TYPE_Q4_0] = {"q4_0", 32, 18, 1, BM_ACT_Q8_0, bm_to_f32_q4_0, {F16(0, "d")}, KERNELS(q4_0)},
    [GGML_TYPE_Q5_0] = {"q5_0", 32, 22, 1, BM_ACT_Q8_0, bm_to_f32_q5_0, {F16(0, "d")}, KERNELS(q5_0)},
    [GGML_TYPE_Q4_1] = {"q4_1", 32, 20, 1, BM_ACT_Q8_1, bm_to_f32_q4_1, {F16(0, "d"), F16(2, "m")}, KERNELS(q4_1)},
    [GGML_TYPE_Q5_1] = {"q5_1", 32, 24, 1, BM_ACT_Q8_1, bm_to_f32_q5_1, {F16(0, "d"), F16(2, "m")}, KERNELS(q5_1)},
    [GGML_TYPE_IQ4_NL] = {"iq4_nl", 32, 18, 1, BM_ACT_Q8_0, bm_to_f32_iq4_nl, {F16(0, "d")}, KERNELS(iq4_nl)},
    [GGML_TYPE_MXFP4] = {"mxfp4", 32, 17, 1, BM_ACT_Q8_0, bm_to_f32_mxfp4, {{BM_FIELD_E8M0, 0, "e"}}, KERNELS(mxfp4)},
    [GGML_TYPE_Q2_K] = {"q2_K", 256, 84, 1, BM_ACT_Q8_K, bm_to_f32_q2_K, {F16(80, "d"), F16(82, "dmin")}, KERNELS(q2_K)},
    [GGML_TYPE_Q3_K] = {"q3_K", 256, 110, 1, BM_ACT_Q8_K, bm_to_f32_q3_K, {F16(108, "d")}, KERNELS(q3_K)},
    [GGML_TYPE_Q4_K] = {"q4_K", 256, 144, 1, BM_ACT_Q8_K, bm_to_f32_q4_K, {F16(0, "d"), F16(2, "dmin")}, KERNELS(q4_K)},
    [GGML_TYPE_Q5_K] = {"q5_K", 256, 176, 1, BM_ACT_Q8_K, bm_to_f32_q5_K, {F16(0, "d"), F16(2, "dmin")}, KERNELS(q5_K)},
    [GGML_TYPE_Q6_K] = {"q6_K", 256, 210, 1, BM_ACT_Q8_K, bm_to_f32_q6_K, {F16(208, "d")}, KERNELS(q6_K)},
    [GGML_TYPE_IQ4_XS] = {"iq4_xs", 256, 136, 1, BM_ACT_Q8_K, bm_to_f32_iq4_xs, {F16(0, "d")}, KERNELS(iq4_xs)},
};

/* ggml's names of every id (ggml.c's type_traits), supported or not, for messages. */
static const char *const NAMES[GGML_TYPE_COUNT] = {
    "f32", "f16", "q4_0", "q4_1", "q4_2 (removed)", "q4_3 (removed)", "q5_0", "q5_1", "q8_0", "q8_1",
    "q2_K", "q3_K", "q4_K", "q5_K", "q6_K", "q8_K", "iq2_xxs", "iq2_xs", "iq3_xxs", "iq1_s", "iq4_nl",
    "iq3_s", "iq2_s", "iq4_xs", "i8", "i16", "i32", "i64", "f64", "iq1_m", "bf16",
    "q4_0_4_4 (removed)", "q4_0_4_8 (removed)", "q4_0_8_8 (removed)", "tq1_0", "tq2_0",
    "iq4_nl_4_4 (removed)", "iq4_nl_4_8 (removed)", "iq4_nl_8_8 (removed)", "mxfp4", "nvfp4", "q1_0",
};

const bm_type_traits *bm_type(uint32_t id) { return id < GGML_TYPE_COUNT && TYPES[id].blck ? &TYPES[id] : NULL; }

const char *bm_type_name(uint32_t id) { return id < GGML_TYPE_COUNT ? NAMES[id] : "unknown"; }

uint64_t bm_type_nbytes(uint32_t id, uint64_t n) {
    const bm_type_traits *t = bm_type(id);
    if (!t || n % t->blck != 0) return 0;
    uint64_t nb = n / t->blck; /* divide first, then multiply */
    if (nb > UINT64_MAX / t->bytes) return 0;
    return nb * t->bytes;
}

const char *bm_types_supported(char *buf, size_t size) {
    size_t len = 0;
    if (!size) return buf;
    for (uint32_t id = 0; id < GGML_TYPE_COUNT; id++) {
        if (!bm_type(id)) continue;
        const char *name = TYPES[id].name;
        size_t k = strlen(name);
        if (len + k + 3 > size) break;
        if (len) { buf[len++] = ','; buf[len++] = ' '; }
        memcpy(buf + len, name, k);
        len += k;
    }
    buf[len] = '\0';
    return buf;
}

static const char *const ACT_NAMES[BM_ACT_COUNT] = {"f32", "q8_0", "q8_1", "q8_K"};
static const uint32_t ACT_BLOCK[BM_ACT_COUNT] = {1, 32, 32, 256};

const char *bm_act_name(bm_act_kind a) { return (unsigned)a < BM_ACT_COUNT ? ACT_NAMES[a] : "?"; }
uint32_t bm_act_block(bm_act_kind a) { return (unsigned)a < BM_ACT_COUNT ? ACT_BLOCK[a] : 0; }
