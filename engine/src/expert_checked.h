/* An expert source that checks each expert's weights (block_check.h) the first time it is viewed,
 * in front of the real source (resident or streaming). Behind the seam like the others: forward.c
 * does not know it is there. A bad expert stops the pass with exit 3 and a line naming the tensor,
 * the expert and the block. */
#ifndef BMOE_EXPERT_CHECKED_H
#define BMOE_EXPERT_CHECKED_H

#include <stddef.h>
#include <stdint.h>

#include "model.h"
#include "seam.h"
#include "threads.h"

typedef struct bmoe_checked {
    bmoe_expert_source inner;
    const bmoe_model *model;
    uint8_t *seen;   /* [n_layer * n_expert]: 1 once the expert's weights were found finite */
    char msg[512];   /* why the last view failed ("" when none did) */
} bmoe_checked;

/* 0, or 1 (out of memory). */
int checked_init(bmoe_checked *c, bmoe_expert_source inner, const bmoe_model *m);
bmoe_expert_source checked_source(bmoe_checked *c);
/* Checks every expert of the model now, on the pool's threads (the inner source must then be one
 * whose views any thread may take: the resident one), so that no view checks anything later. For
 * the resident mode, which has just faulted the whole file in (resident_populate): its prompt then
 * spends no time on checks. 0, or 3 with the line of the first bad expert in (layer, expert) order. */
int checked_all(bmoe_checked *c, bmoe_pool *pool);
/* The message of a failed check, "" when no check failed. */
const char *checked_error(const bmoe_checked *c);
void checked_free(bmoe_checked *c);

/* Checks every tensor of the model that is not an expert tensor (those are checked when used).
 * 0, or 3 with one line in err. */
int check_dense_tensors(const bmoe_model *m, char *err, size_t errlen);

#endif
