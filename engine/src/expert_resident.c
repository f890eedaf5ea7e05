/* Resident expert source: expert e of layer il is the e-th contiguous slice of each expert tensor. */
#include "expert_resident.h"

#include <string.h>
#include <sys/mman.h>

static int resident_view(void *self, int il, int e, bmoe_expert_view *out) {
    const bmoe_resident *r = self;
    const bmoe_model *m = r->model;
    memset(out, 0, sizeof *out);
    if (il < 0 || il >= m->hp.n_layer || !m->layers[il].is_moe || e < 0 || e >= m->hp.n_expert) return 1;
    const bmoe_layer *ly = &m->layers[il];
    const void **slot[BMOE_EXP_NPARTS] = { &out->gate, &out->up, &out->gate_up, &out->down };
    for (int p = 0; p < BMOE_EXP_NPARTS; p++) {
        const bmoe_expert_part *part = &ly->exp_part[p];
        if (!part->present) continue;
        const uint8_t *base = m->maps[part->shard];
        if (!base) return 1;
        *slot[p] = base + part->offset + (uint64_t)e * part->stride;
    }
    return 0;
}

bmoe_expert_source resident_source(bmoe_resident *r, const bmoe_model *m) {
    r->model = m;
    bmoe_expert_source s = { .self = r, .view = resident_view };
    return s;
}

void resident_populate(const bmoe_model *m) {
#ifdef MADV_POPULATE_READ
    for (uint32_t i = 0; m->maps && i < m->g->n_shards; i++)
        if (m->maps[i] && m->map_len[i]) (void)madvise(m->maps[i], (size_t)m->map_len[i], MADV_POPULATE_READ);
#else
    (void)m;
#endif
}
