/* Unit tests of the finite-value checks (block_check.h): every type's checked fields, found at the right
 * block and reported with the right name, and nothing else flagged (a check that passes everything would
 * fail the first half; one that flags finite data, the second). Run by `make -C engine test`. */
#include "check.h"
#include "block_check.h"
#include "gguf.h"

#include <math.h>
#include <string.h>

static void put16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }

/* type, block bytes, offset of a checked f16, its name: a NaN there in block 2 is found, a finite one is not */
static void scale_case(uint32_t type, size_t bb, size_t off, const char *field) {
    uint8_t buf[4 * 210];
    memset(buf, 0, sizeof buf);
    for (size_t b = 0; b < 4; b++) put16(buf + b * bb + off, 0x3c00); /* 1.0 */
    bm_bad_block bad;
    CHECK(bm_check_blocks(type, buf, 4 * bb, &bad) == 0);
    put16(buf + 2 * bb + off, 0x7e00); /* NaN */
    CHECK(bm_check_blocks(type, buf, 4 * bb, &bad) == 1 && bad.block == 2 && strcmp(bad.field, field) == 0 &&
          isnan(bad.value));
    put16(buf + 2 * bb + off, 0xfc00); /* -inf */
    CHECK(bm_check_blocks(type, buf, 4 * bb, &bad) == 1 && bad.block == 2 && isinf(bad.value) && bad.value < 0);
}

static void test_scales(void) {
    scale_case(GGML_TYPE_Q8_0, 34, 0, "d");
    scale_case(GGML_TYPE_Q4_0, 18, 0, "d");
    scale_case(GGML_TYPE_Q5_0, 22, 0, "d");
    scale_case(GGML_TYPE_Q4_1, 20, 0, "d");
    scale_case(GGML_TYPE_Q4_1, 20, 2, "m");
    scale_case(GGML_TYPE_Q5_1, 24, 0, "d");
    scale_case(GGML_TYPE_Q5_1, 24, 2, "m");
    scale_case(GGML_TYPE_Q2_K, 84, 80, "d");
    scale_case(GGML_TYPE_Q2_K, 84, 82, "dmin");
    scale_case(GGML_TYPE_Q3_K, 110, 108, "d");
    scale_case(GGML_TYPE_IQ4_NL, 18, 0, "d");
    scale_case(GGML_TYPE_IQ4_XS, 136, 0, "d");
    scale_case(GGML_TYPE_Q4_K, 144, 0, "d");
    scale_case(GGML_TYPE_Q4_K, 144, 2, "dmin");
    scale_case(GGML_TYPE_Q5_K, 176, 2, "dmin");
    scale_case(GGML_TYPE_Q6_K, 210, 208, "d");
    /* quantised values are never floats: all-ones bytes outside the scales are fine */
    uint8_t q[144];
    memset(q, 0xff, sizeof q);
    put16(q, 0x3c00);
    put16(q + 2, 0x3c00);
    bm_bad_block bad;
    CHECK(bm_check_blocks(GGML_TYPE_Q4_K, q, sizeof q, &bad) == 0);
}

/* MXFP4's scale is an E8M0 exponent: 0xFF (NaN in the OCP formats) is refused, every other byte is a
 * finite power of two (0 and 0xFE included); its quantised nibbles are never checked. */
static void test_e8m0(void) {
    uint8_t buf[4 * 17];
    memset(buf, 0x77, sizeof buf);
    for (int b = 0; b < 4; b++) buf[17 * b] = (uint8_t)(b == 0 ? 0 : b == 1 ? 0xFE : 127);
    bm_bad_block bad;
    CHECK(bm_check_blocks(GGML_TYPE_MXFP4, buf, sizeof buf, &bad) == 0);
    memset(buf + 1, 0xFF, 16); /* all-ones levels are fine */
    CHECK(bm_check_blocks(GGML_TYPE_MXFP4, buf, sizeof buf, &bad) == 0);
    buf[17 * 3] = 0xFF;
    CHECK(bm_check_blocks(GGML_TYPE_MXFP4, buf, sizeof buf, &bad) == 1 && bad.block == 3 && strcmp(bad.field, "e") == 0 &&
          isnan(bad.value));
}

static void test_values(void) {
    float f[5] = { 1.0f, -2.0f, 0.0f, 3.0f, 4.0f };
    bm_bad_block bad;
    CHECK(bm_check_blocks(GGML_TYPE_F32, (const uint8_t *)f, sizeof f, &bad) == 0);
    f[3] = INFINITY;
    CHECK(bm_check_blocks(GGML_TYPE_F32, (const uint8_t *)f, sizeof f, &bad) == 1 && bad.block == 3 &&
          strcmp(bad.field, "value") == 0 && isinf(bad.value));
    uint8_t h[8];
    put16(h, 0x3c00); put16(h + 2, 0x4000); put16(h + 4, 0x0001); put16(h + 6, 0x7bff); /* 1, 2, subnormal, max */
    CHECK(bm_check_blocks(GGML_TYPE_F16, h, sizeof h, &bad) == 0);
    put16(h + 4, 0x7c01); /* NaN */
    CHECK(bm_check_blocks(GGML_TYPE_F16, h, sizeof h, &bad) == 1 && bad.block == 2 && isnan(bad.value));
    uint8_t b[6];
    put16(b, 0x3f80); put16(b + 2, 0xc000); put16(b + 4, 0x7f7f); /* 1, -2, max finite */
    CHECK(bm_check_blocks(GGML_TYPE_BF16, b, sizeof b, &bad) == 0);
    put16(b + 2, 0xff80); /* -inf */
    CHECK(bm_check_blocks(GGML_TYPE_BF16, b, sizeof b, &bad) == 1 && bad.block == 1 && isinf(bad.value) &&
          bad.value < 0);
}

/* The scan folds a chunk of blocks at a time (block_check.c): a bad value at either edge of a chunk, in
 * the last block, or two in one chunk, is found at its own block, in every contiguous and strided layout;
 * two bad ones report the first. Lengths that end inside a chunk and exactly on one are both run. */
static void test_chunk_edges(void) {
    enum { N = 1000 };
    static float f[N];
    static uint8_t h[2 * N], q[18 * N];
    const uint64_t at[] = { 0, 1, 255, 256, 257, 511, 512, 767, 768, N - 1 };
    for (size_t n = N - 232; n <= N; n += 232) { /* 768 blocks (three whole chunks), then 1000 */
        for (size_t k = 0; k < sizeof at / sizeof at[0]; k++) {
            if (at[k] >= n) continue;
            bm_bad_block bad;
            for (size_t i = 0; i < N; i++) f[i] = (float)i - 500.0f;
            f[at[k]] = NAN;
            if (at[k] + 3 < n) f[at[k] + 3] = INFINITY; /* a later one in the same chunk: not reported */
            CHECK(bm_check_blocks(GGML_TYPE_F32, (const uint8_t *)f, n * 4, &bad) == 1 && bad.block == at[k]);
            for (size_t i = 0; i < N; i++) put16(h + 2 * i, 0x3c00);
            put16(h + 2 * at[k], 0x7c00);
            CHECK(bm_check_blocks(GGML_TYPE_F16, h, n * 2, &bad) == 1 && bad.block == at[k]);
            for (size_t i = 0; i < N; i++) put16(h + 2 * i, 0x3f80);
            put16(h + 2 * at[k], 0x7fc0);
            CHECK(bm_check_blocks(GGML_TYPE_BF16, h, n * 2, &bad) == 1 && bad.block == at[k]);
            memset(q, 0xff, sizeof q); /* every quant byte all-ones, every scale 1.0 */
            for (size_t i = 0; i < N; i++) put16(q + 18 * i, 0x3c00);
            put16(q + 18 * at[k], 0xfc00);
            CHECK(bm_check_blocks(GGML_TYPE_Q4_0, q, n * 18, &bad) == 1 && bad.block == at[k]);
        }
    }
    for (size_t i = 0; i < N; i++) f[i] = (float)i;
    bm_bad_block bad;
    CHECK(bm_check_blocks(GGML_TYPE_F32, (const uint8_t *)f, sizeof f, &bad) == 0);
}

int main(void) {
    test_chunk_edges();
    test_scales();
    test_e8m0();
    test_values();
    return check_report("test_block_check");
}
