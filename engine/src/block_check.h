/* Checking weight data before it is computed with: every float a block carries must be finite.
 *
 * The floats of each block that the type table lists (type_traits.h, `fields`: a quantised block's f16
 * scales d / dmin / m or its E8M0 exponent, every value of an F32/F16/BF16 tensor) are checked, as
 * llama.cpp's row validation does. A NaN or infinite
 * scale would not crash the matmul: it would silently turn logits into NaN, and greedy decoding of
 * NaNs is garbage that looks like output. The engine refuses such a file instead (exit 3).
 *
 * Dense tensors are checked when the model is opened (engine.c). Experts are checked the first time
 * each is used (expert_checked.c): checking all of them at open would read the whole file from flash,
 * which streaming exists to avoid. */
#ifndef BMOE_BLOCK_CHECK_H
#define BMOE_BLOCK_CHECK_H

#include <stddef.h>
#include <stdint.h>

typedef struct bm_bad_block {
    uint64_t block;    /* index of the first bad block (of the value, for F32/F16/BF16) */
    const char *field; /* the field's name in the type table: "d", "dmin", "m", "e" or "value" */
    float value;       /* what it holds (NaN or +-inf) */
} bm_bad_block;

/* Checks `nbytes` bytes of `type` data (a whole number of blocks). 0 when every checked float is
 * finite; 1 with *bad describing the first one that is not. Unknown types are not checked (0). */
int bm_check_blocks(uint32_t type, const uint8_t *data, uint64_t nbytes, bm_bad_block *bad);

#endif
