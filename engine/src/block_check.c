/* Finite-scale checks of weight data (block_check.h). */
#include "block_check.h"

#include <string.h>

#include "tensor.h"
#include "type_traits.h"

static uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | (uint16_t)p[1] << 8); }

/* Field f of the block at p: whether it is finite, and (only then worth the conversion) its value. An
 * f16, f32 or bf16 with every exponent bit set is an infinity or a NaN; an E8M0 exponent (a power of
 * two, 2^(e - 127)) has one non-finite encoding, 0xFF, NaN in the OCP microscaling formats that define
 * it. */
static int field_bad(const bm_float_field *f, const uint8_t *p) {
    uint32_t u;
    switch (f->fmt) {
    case BM_FIELD_F16: return (rd16(p) & 0x7c00u) == 0x7c00u;
    case BM_FIELD_F32: memcpy(&u, p, 4); break;
    case BM_FIELD_BF16: u = (uint32_t)rd16(p) << 16; break;
    case BM_FIELD_E8M0: return p[0] == 0xFF;
    default: return 0;
    }
    return (u & 0x7f800000u) == 0x7f800000u;
}

static float field_value(const bm_float_field *f, const uint8_t *p) {
    uint32_t u;
    switch (f->fmt) {
    case BM_FIELD_F16: return bm_f16_to_f32(rd16(p));
    case BM_FIELD_F32: memcpy(&u, p, 4); break;
    case BM_FIELD_BF16: u = (uint32_t)rd16(p) << 16; break;
    default: u = 0x7fc00000u; /* E8M0's 0xFF */
    }
    float v;
    memcpy(&v, &u, 4);
    return v;
}

/* The first block (of nb, from b0) whose field f is not finite, or nb. F16 fields, the scales of every
 * quantised type, get a loop of their own: a check reads every expert once, on the first use of each,
 * and prefill pays for it. */
static uint64_t first_bad(const bm_float_field *f, const uint8_t *data, uint32_t bytes, uint64_t nb) {
    const uint8_t *p = data + f->off;
    if (f->fmt == BM_FIELD_F16) {
        for (uint64_t b = 0; b < nb; b++, p += bytes)
            if ((rd16(p) & 0x7c00u) == 0x7c00u) return b;
        return nb;
    }
    for (uint64_t b = 0; b < nb; b++, p += bytes)
        if (field_bad(f, p)) return b;
    return nb;
}

int bm_check_blocks(uint32_t type, const uint8_t *data, uint64_t nbytes, bm_bad_block *bad) {
    memset(bad, 0, sizeof *bad);
    const bm_type_traits *t = bm_type(type);
    if (!t) return 0;
    /* the first bad field in block order, the block's first field on a tie: each field's first bad
     * block, the least of them (a later field only when strictly earlier) */
    uint64_t nb = nbytes / t->bytes, best = nb;
    int which = -1;
    for (int k = 0; k < BM_TYPE_FIELDS && t->fields[k].fmt; k++) {
        uint64_t b = first_bad(&t->fields[k], data, t->bytes, best);
        if (b < best) best = b, which = k;
    }
    if (which < 0) return 0;
    bad->block = best;
    bad->field = t->fields[which].name;
    bad->value = field_value(&t->fields[which], data + best * t->bytes + t->fields[which].off);
    return 1;
}
