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

/* Blocks are scanned a chunk at a time: a chunk's bad fields are folded into one unsigned minimum of
 * (~field & exponent mask), zero exactly when some field has every exponent bit set. The fold has no
 * early exit, so the compiler makes it SIMD (an F32 model's check was a third of a short run's
 * instructions, and more under emulation, where every entry of a gate plan loads the model anew);
 * only a chunk that holds a bad field is walked again for its first one. */
#define SCAN_CHUNK 256u

static int bad16(uint16_t v, uint16_t mask) { return (v & mask) == mask; }

/* Contiguous 16-bit fields (an F16 or BF16 tensor: each block is one value) or strided ones (the F16
 * scale of a quantised block): the first of nb whose exponent bits under mask are all set, or nb. */
static inline uint32_t fold16(const uint8_t *p, uint32_t stride, uint64_t from, uint64_t to, uint16_t mask) {
    uint32_t lo = 0xffffu;
    for (uint64_t b = from; b < to; b++) {
        uint32_t m = (uint32_t)(~rd16(p + b * stride)) & mask;
        lo = m < lo ? m : lo;
    }
    return lo;
}

static uint64_t first_bad16(const uint8_t *p, uint32_t stride, uint64_t nb, uint16_t mask) {
    for (uint64_t c = 0; c < nb; c += SCAN_CHUNK) {
        uint64_t end = nb - c < SCAN_CHUNK ? nb : c + SCAN_CHUNK;
        /* a literal stride for the contiguous case, so that the fold is vectorised */
        uint32_t lo = stride == 2 ? fold16(p, 2, c, end, mask) : fold16(p, stride, c, end, mask);
        if (lo != 0) continue;
        for (uint64_t b = c; b < end; b++)
            if (bad16(rd16(p + b * stride), mask)) return b;
    }
    return nb;
}

/* The same for 32-bit floats (an F32 tensor, or an F32 field of a block). */
static inline uint32_t fold32(const uint8_t *p, uint32_t stride, uint64_t from, uint64_t to) {
    uint32_t lo = 0xffffffffu;
    for (uint64_t b = from; b < to; b++) {
        uint32_t u;
        memcpy(&u, p + b * stride, 4);
        uint32_t m = ~u & 0x7f800000u;
        lo = m < lo ? m : lo;
    }
    return lo;
}

static uint64_t first_bad32(const uint8_t *p, uint32_t stride, uint64_t nb) {
    for (uint64_t c = 0; c < nb; c += SCAN_CHUNK) {
        uint64_t end = nb - c < SCAN_CHUNK ? nb : c + SCAN_CHUNK;
        uint32_t lo = stride == 4 ? fold32(p, 4, c, end) : fold32(p, stride, c, end);
        if (lo != 0) continue;
        for (uint64_t b = c; b < end; b++) {
            uint32_t u;
            memcpy(&u, p + b * stride, 4);
            if ((u & 0x7f800000u) == 0x7f800000u) return b;
        }
    }
    return nb;
}

/* The first block (of nb) whose field f is not finite, or nb. */
static uint64_t first_bad(const bm_float_field *f, const uint8_t *data, uint32_t bytes, uint64_t nb) {
    const uint8_t *p = data + f->off;
    switch (f->fmt) {
    case BM_FIELD_F16: return first_bad16(p, bytes, nb, 0x7c00u);
    case BM_FIELD_BF16: return first_bad16(p, bytes, nb, 0x7f80u);
    case BM_FIELD_F32: return first_bad32(p, bytes, nb);
    default: break;
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
    uint64_t nb = nbytes / t->bytes;
#ifdef BMOE_FAULT_BADDATA_LAST_BLOCK
    if (nb) nb--; /* fault: the last block is not checked */
#endif
    uint64_t best = nb;
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
