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

/* Expert e of layer il, viewed through the inner source: 0 when its weights are finite, else 3 with
 * the reason in msg. */
static int check_expert(const bmoe_checked *c, int il, int e, char *msg, size_t msglen) {
    bmoe_expert_view v;
    int rc = c->inner.view(c->inner.self, il, e, &v);
    if (rc) return rc;
    const bmoe_layer *ly = &c->model->layers[il];
    const void *data[BMOE_EXP_NPARTS] = { v.gate, v.up, v.gate_up, v.down };
    for (int p = 0; p < BMOE_EXP_NPARTS; p++) {
        const bmoe_expert_part *P = &ly->exp_part[p];
        if (!P->present || !data[p]) continue;
        bm_bad_block bad;
        if (bm_check_blocks(P->type, data[p], P->bytes, &bad)) {
            snprintf(msg, msglen, "%s: %s: expert %d: block %llu has a non-finite %s (%g)", c->model->path, P->name, e,
                     (unsigned long long)bad.block, bad.field, (double)bad.value);
            return 3;
        }
    }
    return 0;
}

static int checked_view(void *self, int il, int e, bmoe_expert_view *out) {
    bmoe_checked *c = self;
    int rc = c->inner.view(c->inner.self, il, e, out);
    if (rc) return rc;
    uint8_t *seen = &c->seen[(size_t)il * (size_t)c->model->hp.n_expert + (size_t)e];
    if (*seen) return 0;
    if ((rc = check_expert(c, il, e, c->msg, sizeof c->msg))) return rc;
    *seen = 1;
    return 0;
}

typedef struct {
    bmoe_checked *c;
    uint8_t *rc; /* [n_moe_layers * n_expert] each expert's check */
} all_job;

static void check_items(void *ctx, int i0, int i1, int tid) {
    (void)tid;
    all_job *J = ctx;
    const bmoe_model *m = J->c->model;
    char msg[8];
    for (int i = i0; i < i1; i++) {
        int il = m->moe_layers[i / m->hp.n_expert], e = i % m->hp.n_expert;
        J->rc[i] = (uint8_t)check_expert(J->c, il, e, msg, sizeof msg);
    }
}

int checked_all(bmoe_checked *c, bmoe_pool *pool) {
    const bmoe_model *m = c->model;
    int n = m->n_moe_layers * m->hp.n_expert;
    if (n <= 0) return 0;
    all_job J = { c, calloc((size_t)n, 1) };
    if (!J.rc) return 1;
    pool_run(pool, n, check_items, &J);
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        int il = m->moe_layers[i / m->hp.n_expert], e = i % m->hp.n_expert;
        if (J.rc[i]) rc = check_expert(c, il, e, c->msg, sizeof c->msg); /* the first bad one, its message again */
        else c->seen[(size_t)il * (size_t)m->hp.n_expert + (size_t)e] = 1;
    }
    free(J.rc);
    return rc;
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
