/* Finite-scale checks of weight data (block_check.h). */
#include "block_check.h"

#include <string.h>

#include "tensor.h"
#include "type_traits.h"

static uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | (uint16_t)p[1] << 8); }

/* Field f of the block at p as a float, and whether it is finite. An f16, f32 or bf16 with every
 * exponent bit set is an infinity or a NaN; an E8M0 exponent (a power of two, 2^(e - 127)) has one
 * non-finite encoding, 0xFF, NaN in the OCP microscaling formats that define it. */
static int field_bad(const bm_float_field *f, const uint8_t *p, float *value) {
    uint32_t u;
    switch (f->fmt) {
    case BM_FIELD_F16: {
        uint16_t h = rd16(p);
        *value = bm_f16_to_f32(h);
        return (h & 0x7c00u) == 0x7c00u;
    }
    case BM_FIELD_F32: memcpy(&u, p, 4); break;
    case BM_FIELD_BF16: u = (uint32_t)rd16(p) << 16; break;
    case BM_FIELD_E8M0:
        if (p[0] != 0xFF) return 0;
        u = 0x7fc00000u;
        break;
    default: return 0;
    }
    memcpy(value, &u, 4);
    return (u & 0x7f800000u) == 0x7f800000u;
}

int bm_check_blocks(uint32_t type, const uint8_t *data, uint64_t nbytes, bm_bad_block *bad) {
    memset(bad, 0, sizeof *bad);
    const bm_type_traits *t = bm_type(type);
    if (!t) return 0;
    for (uint64_t b = 0; b < nbytes / t->bytes; b++)
        for (int k = 0; k < BM_TYPE_FIELDS && t->fields[k].fmt; k++) {
            float v;
            if (!field_bad(&t->fields[k], data + b * t->bytes + t->fields[k].off, &v)) continue;
            bad->block = b;
            bad->field = t->fields[k].name;
            bad->value = v;
            return 1;
        }
    return 0;
}
