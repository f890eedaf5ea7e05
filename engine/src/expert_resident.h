/* The resident expert source: expert views are slices of the model's read-only mapping. This is the
 * `--mmap` reference the streamed modes are compared against. */
#ifndef BMOE_EXPERT_RESIDENT_H
#define BMOE_EXPERT_RESIDENT_H

#include "model.h"
#include "seam.h"

typedef struct bmoe_resident { const bmoe_model *model; } bmoe_resident;

/* The model must have been opened with its shards mapped. */
bmoe_expert_source resident_source(bmoe_resident *r, const bmoe_model *m);

#endif
