/* The checking expert source (expert_checked.h). */
#include "expert_checked.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "block_check.h"

int checked_init(bmoe_checked *c, bmoe_expert_source inner, const bmoe_model *m) {
    memset(c, 0, sizeof *c);
    c->inner = inner;
    c->model = m;
    size_t n = (size_t)m->hp.n_layer * (size_t)(m->hp.n_expert > 0 ? m->hp.n_expert : 1);
    c->seen = calloc(n, 1);
    return c->seen ? 0 : 1;
}

void checked_free(bmoe_checked *c) {
    free(c->seen);
    c->seen = NULL;
}

const char *checked_error(const bmoe_checked *c) { return c->msg; }

static int checked_view(void *self, int il, int e, bmoe_expert_view *out) {
    bmoe_checked *c = self;
    int rc = c->inner.view(c->inner.self, il, e, out);
    if (rc) return rc;
#ifndef BMOE_FAULT_BADDATA_SEEN_BY_EXPERT
    uint8_t *seen = &c->seen[(size_t)il * (size_t)c->model->hp.n_expert + (size_t)e];
#else
    uint8_t *seen = &c->seen[(size_t)e]; /* fault: checked once per expert id, whichever layer it is in */
#endif
    if (*seen) return 0;
    const bmoe_layer *ly = &c->model->layers[il];
    const void *data[BMOE_EXP_NPARTS] = { out->gate, out->up, out->gate_up, out->down };
    for (int p = 0; p < BMOE_EXP_NPARTS; p++) {
        const bmoe_expert_part *P = &ly->exp_part[p];
        if (!P->present || !data[p]) continue;
        bm_bad_block bad;
        if (bm_check_blocks(P->type, data[p], P->bytes, &bad)) {
            snprintf(c->msg, sizeof c->msg, "%s: %s: expert %d: block %llu has a non-finite %s (%g)",
                     c->model->path, P->name, e, (unsigned long long)bad.block, bad.field, (double)bad.value);
            return 3;
        }
    }
    *seen = 1;
    return 0;
}

bmoe_expert_source checked_source(bmoe_checked *c) {
    bmoe_expert_source s = { .self = c, .view = checked_view };
    return s;
}

/* An expert tensor is one of the parts some MoE layer binds. */
static int is_expert_tensor(const bmoe_model *m, const gguf_tensor *t) {
    for (int i = 0; i < m->n_moe_layers; i++)
        for (int p = 0; p < BMOE_EXP_NPARTS; p++)
            if (m->layers[m->moe_layers[i]].exps[p].t == t) return 1;
    return 0;
}

int check_dense_tensors(const bmoe_model *m, char *err, size_t errlen) {
    const gguf_model *g = m->g;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const gguf_tensor *t = &g->tensors[i];
        if (!m->maps || !m->maps[t->shard] || is_expert_tensor(m, t)) continue;
        bm_bad_block bad;
        if (bm_check_blocks(t->type, (const uint8_t *)m->maps[t->shard] + t->offset, t->nbytes, &bad)) {
            snprintf(err, errlen, "%s: %.*s: block %llu has a non-finite %s (%g)", m->path, (int)t->name.len,
                     t->name.ptr, (unsigned long long)bad.block, bad.field, (double)bad.value);
            return 3;
        }
    }
    return 0;
}
