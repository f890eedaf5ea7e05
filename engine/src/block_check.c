/* Finite-scale checks of weight data (block_check.h). */
#include "block_check.h"

#include <string.h>

#include "gguf.h"
#include "tensor.h"

static uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | (uint16_t)p[1] << 8); }

/* An f16 whose exponent bits are all ones is inf or NaN. */
static int f16_bad(uint16_t h) { return (h & 0x7c00u) == 0x7c00u; }

static int bad_f16(const uint8_t *p, uint64_t block, const char *field, bm_bad_block *bad) {
    uint16_t h = rd16(p);
    if (!f16_bad(h)) return 0;
    bad->block = block;
    bad->field = field;
    bad->value = bm_f16_to_f32(h);
    return 1;
}

/* A block layout's f16 scale fields: their byte offsets in the block, and names. */
typedef struct scale_layout {
    uint32_t type;
    uint32_t block_bytes;
    int n;
    uint32_t off[2];
    const char *name[2];
} scale_layout;

static const scale_layout LAYOUTS[] = {
    {GGML_TYPE_Q8_0, BMOE_Q8_0_BYTES, 1, {0, 0}, {"d", NULL}},
    {GGML_TYPE_Q4_0, BMOE_Q4_0_BYTES, 1, {0, 0}, {"d", NULL}},
    {GGML_TYPE_Q5_0, BMOE_Q5_0_BYTES, 1, {0, 0}, {"d", NULL}},
    {GGML_TYPE_Q4_K, BMOE_Q4_K_BYTES, 2, {0, 2}, {"d", "dmin"}},
    {GGML_TYPE_Q5_K, BMOE_Q5_K_BYTES, 2, {0, 2}, {"d", "dmin"}},
    {GGML_TYPE_Q6_K, BMOE_Q6_K_BYTES, 1, {208, 0}, {"d", NULL}}, /* Q6_K keeps its scale last */
};

int bm_check_blocks(uint32_t type, const uint8_t *data, uint64_t nbytes, bm_bad_block *bad) {
    memset(bad, 0, sizeof *bad);
    switch (type) {
    case GGML_TYPE_F32:
    case GGML_TYPE_BF16: {
        /* a BF16 value is the high half of an F32: both are checked as F32 bits */
        uint64_t size = type == GGML_TYPE_F32 ? 4 : 2;
        for (uint64_t i = 0; i < nbytes / size; i++) {
            uint32_t u;
            if (size == 4) memcpy(&u, data + 4 * i, 4);
            else u = (uint32_t)rd16(data + 2 * i) << 16;
            if ((u & 0x7f800000u) != 0x7f800000u) continue;
            bad->block = i;
            bad->field = "value";
            memcpy(&bad->value, &u, 4);
            return 1;
        }
        return 0;
    }
    case GGML_TYPE_F16:
        for (uint64_t i = 0; i < nbytes / 2; i++)
            if (bad_f16(data + 2 * i, i, "value", bad)) return 1;
        return 0;
    default:
        break;
    }
    for (size_t l = 0; l < sizeof LAYOUTS / sizeof LAYOUTS[0]; l++) {
        const scale_layout *L = &LAYOUTS[l];
        if (L->type != type) continue;
#ifndef BMOE_FAULT_BADDATA_LAST_BLOCK
        for (uint64_t b = 0; b < nbytes / L->block_bytes; b++)
#else
        for (uint64_t b = 0; b + 1 < nbytes / L->block_bytes; b++) /* fault: the last block is not checked */
#endif
            for (int s = 0; s < L->n; s++)
                if (bad_f16(data + b * L->block_bytes + L->off[s], b, L->name[s], bad)) return 1;
        return 0;
    }
    return 0;
}
