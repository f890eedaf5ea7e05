/* The weight-chain learner (weight_chain.h). Per layer: the record being observed in this batch and the
 * chain learned from the last complete, valid one. */
#include "weight_chain.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct chain_shape {
    int n_expert, k;
    int n;                                  /* weight nodes in the chain */
    unsigned char nodes[CHAIN_MAX_WEIGHT_NODES];
} chain_shape;

typedef struct layer_rec {
    int open, valid;  /* a TOPK was seen and EXPERTS not yet; the record still follows the protocol */
    chain_shape cur;  /* the record being observed */
    int learned;
    chain_shape shape; /* the learned chain */
} layer_rec;

struct chain_learner {
    int n_layer;
    unsigned long relearned;
    layer_rec *layers;
};

static int is_weight_node(bmoe_node n) {
    return n >= BMOE_NODE_WEIGHTS && n <= BMOE_NODE_WEIGHTS_SCALED;
}

static int same_shape(const chain_shape *a, const chain_shape *b) {
    return a->n_expert == b->n_expert && a->k == b->k && a->n == b->n && memcmp(a->nodes, b->nodes, (size_t)a->n) == 0;
}

static int terminal_of(const chain_shape *s) {
    return s->n > 0 ? (int)s->nodes[s->n - 1] : CHAIN_UNKNOWN;
}

chain_learner *chain_new(int n_layer) {
    if (n_layer < 1 || n_layer > (1 << 20)) return NULL;
    chain_learner *L = calloc(1, sizeof *L);
    if (!L) return NULL;
    L->layers = calloc((size_t)n_layer, sizeof *L->layers);
    if (!L->layers) { free(L); return NULL; }
    L->n_layer = n_layer;
    return L;
}

void chain_free(chain_learner *L) {
    if (!L) return;
    free(L->layers);
    free(L);
}

int chain_observe(chain_learner *L, int il, bmoe_node node, int n_expert, int k) {
    if (!L || il < 0 || il >= L->n_layer) return -1;
    layer_rec *r = &L->layers[il];
    if (node == BMOE_NODE_LOGITS || node == BMOE_NODE_PROBS) return 0;
    if (node == BMOE_NODE_TOPK) {
        /* a record left open by an aborted pass is simply replaced */
        r->open = 1;
        r->valid = n_expert >= 1 && k >= 1;
        memset(&r->cur, 0, sizeof r->cur);
        r->cur.n_expert = n_expert;
        r->cur.k = k;
        return r->valid ? 0 : -1;
    }
    if (is_weight_node(node)) {
        if (!r->open) return -1;
        chain_shape *c = &r->cur;
        if (!r->valid || n_expert != c->n_expert || k != c->k || c->n >= CHAIN_MAX_WEIGHT_NODES ||
            (c->n > 0 && (int)node <= (int)c->nodes[c->n - 1])) {
            r->valid = 0;
            return -1;
        }
        c->nodes[c->n++] = (unsigned char)node;
        return 0;
    }
    if (node == BMOE_NODE_EXPERTS) {
        if (!r->open) return -1;
        int ok = r->valid && n_expert == r->cur.n_expert && k == r->cur.k;
        if (!ok) r->valid = 0;
        chain_layer_done(L, il);
        return ok ? 0 : -1;
    }
    return -1;
}

int chain_layer_done(chain_learner *L, int il) {
    if (!L || il < 0 || il >= L->n_layer) return CHAIN_UNKNOWN;
    layer_rec *r = &L->layers[il];
    if (!r->open) return r->learned ? terminal_of(&r->shape) : CHAIN_UNKNOWN;
    r->open = 0;
    if (!r->valid) {
        /* the graph did something the protocol does not describe: forget this layer, load it at TOPK */
        r->learned = 0;
        return CHAIN_UNKNOWN;
    }
    if (r->learned && !same_shape(&r->shape, &r->cur)) L->relearned++;
    r->shape = r->cur;
    r->learned = 1;
    return terminal_of(&r->shape);
}

int chain_terminal(const chain_learner *L, int il, int n_expert, int k) {
    if (!L || il < 0 || il >= L->n_layer) return CHAIN_UNKNOWN;
    const layer_rec *r = &L->layers[il];
    if (!r->learned || r->shape.n_expert != n_expert || r->shape.k != k) return CHAIN_UNKNOWN;
    return terminal_of(&r->shape);
}

unsigned long chain_relearned(const chain_learner *L) {
    return L ? L->relearned : 0;
}

static const char *short_name(int node) {
    switch (node) {
    case BMOE_NODE_WEIGHTS: return "weights";
    case BMOE_NODE_WEIGHTS_SOFTMAX: return "weights_softmax";
    case BMOE_NODE_WEIGHTS_NORM: return "weights_norm";
    case BMOE_NODE_WEIGHTS_SCALED: return "weights_scaled";
    default: return "?";
    }
}

const char *chain_describe(const chain_learner *L, int il, char *buf, size_t n) {
    if (!buf || n == 0) return buf;
    if (!L || il < 0 || il >= L->n_layer || !L->layers[il].learned) {
        snprintf(buf, n, "unknown");
        return buf;
    }
    const chain_shape *s = &L->layers[il].shape;
    int off = snprintf(buf, n, "E=%d k=%d", s->n_expert, s->k);
    if (s->n == 0 && off >= 0 && (size_t)off < n) snprintf(buf + off, n - (size_t)off, " (no weight node)");
    for (int i = 0; i < s->n && off >= 0 && (size_t)off < n; i++)
        off += snprintf(buf + off, n - (size_t)off, "%s%s", i ? ">" : " ", short_name(s->nodes[i]));
    return buf;
}
