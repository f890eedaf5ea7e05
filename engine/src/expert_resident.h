/* The resident expert source: expert views are slices of the model's read-only mapping. This is the
 * `--mmap` reference the streamed modes are compared against. */
#ifndef BMOE_EXPERT_RESIDENT_H
#define BMOE_EXPERT_RESIDENT_H

#include "model.h"
#include "seam.h"

typedef struct bmoe_resident { const bmoe_model *model; } bmoe_resident;

/* The model must have been opened with its shards mapped. */
bmoe_expert_source resident_source(bmoe_resident *r, const bmoe_model *m);

/* Faults the model's mappings in, page tables and all, as llama.cpp's loader does for a mapped model
 * (MAP_POPULATE): the page cache's pages (read from the file first when they are not there) become
 * part of this process before the first token, so a prompt's time is its compute, not the first touch
 * of every weight page. A hint: where the kernel has no MADV_POPULATE_READ (before Linux 5.14, other
 * systems) it does nothing, and nothing else changes either way. */
void resident_populate(const bmoe_model *m);

#endif
