/* Unit tests of the weight-chain learner (weight_chain.c): the terminal node learned from the node
 * sequence of each gating row of docs/model-math.md (qwen3moe ends at _norm, a gemma4-like scaled
 * routing at _scaled, softmax over the selected at _softmax, an unnormalised routing at _weights),
 * "unknown" before a layer has completed once and for a shape not seen (another E or k), per-layer
 * independence, protocol breaks (never learned, and a learned layer forgotten), re-learning, and the
 * description string. Built and run under AddressSanitizer + UBSan by `make -C engine test`. */
#include "check.h"
#include "weight_chain.h"

#include <stdio.h>
#include <string.h>

#define END (-9)

/* Feeds one layer's pass the way forward.c emits it: LOGITS, PROBS, TOPK, the given weight nodes, EXPERTS.
 * Returns the sum of chain_observe's return values (0 when every node was accepted). */
static int pass(chain_learner *L, int il, int E, int k, const int *weights) {
    int rc = 0;
    rc += chain_observe(L, il, BMOE_NODE_LOGITS, E, E);
    rc += chain_observe(L, il, BMOE_NODE_PROBS, E, E);
    rc += chain_observe(L, il, BMOE_NODE_TOPK, E, k);
    for (int i = 0; weights[i] != END; i++) rc += chain_observe(L, il, (bmoe_node)weights[i], E, k);
    rc += chain_observe(L, il, BMOE_NODE_EXPERTS, E, k);
    return rc;
}

typedef struct chain_case {
    const char *name;
    int weights[6];
    int terminal;
    const char *desc;
} chain_case;

static const chain_case CASES[] = {
    {"qwen3moe: softmax, norm", {BMOE_NODE_WEIGHTS, BMOE_NODE_WEIGHTS_NORM, END}, BMOE_NODE_WEIGHTS_NORM,
     "E=8 k=2 weights>weights_norm"},
    {"gemma4-like: softmax, norm, scale 1.25",
     {BMOE_NODE_WEIGHTS, BMOE_NODE_WEIGHTS_NORM, BMOE_NODE_WEIGHTS_SCALED, END}, BMOE_NODE_WEIGHTS_SCALED,
     "E=8 k=2 weights>weights_norm>weights_scaled"},
    {"softmax over the selected (gpt-oss style), no norm",
     {BMOE_NODE_WEIGHTS, BMOE_NODE_WEIGHTS_SOFTMAX, END}, BMOE_NODE_WEIGHTS_SOFTMAX,
     "E=8 k=2 weights>weights_softmax"},
    {"softmax, no norm, no scale", {BMOE_NODE_WEIGHTS, END}, BMOE_NODE_WEIGHTS, "E=8 k=2 weights"},
    {"sigmoid, norm, scale 2.5", {BMOE_NODE_WEIGHTS, BMOE_NODE_WEIGHTS_NORM, BMOE_NODE_WEIGHTS_SCALED, END},
     BMOE_NODE_WEIGHTS_SCALED, "E=8 k=2 weights>weights_norm>weights_scaled"},
    {"every weight node", {BMOE_NODE_WEIGHTS, BMOE_NODE_WEIGHTS_SOFTMAX, BMOE_NODE_WEIGHTS_NORM,
                           BMOE_NODE_WEIGHTS_SCALED, END},
     BMOE_NODE_WEIGHTS_SCALED, "E=8 k=2 weights>weights_softmax>weights_norm>weights_scaled"},
    {"no weight node at all", {END}, CHAIN_UNKNOWN, "E=8 k=2 (no weight node)"},
};

static void test_gatings(void) {
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
        const chain_case *c = &CASES[i];
        chain_learner *L = chain_new(4);
        CHECK(L != NULL);
        if (!L) return;
        char d[128];
        /* the first pass: unknown at TOPK and at every weight node, known once EXPERTS closed it */
        int bad = 0;
        bad |= chain_observe(L, 1, BMOE_NODE_TOPK, 8, 2) != 0;
        bad |= chain_terminal(L, 1, 8, 2) != CHAIN_UNKNOWN;
        for (int j = 0; c->weights[j] != END; j++) {
            bad |= chain_observe(L, 1, (bmoe_node)c->weights[j], 8, 2) != 0;
            bad |= chain_terminal(L, 1, 8, 2) != CHAIN_UNKNOWN;
        }
        bad |= chain_observe(L, 1, BMOE_NODE_EXPERTS, 8, 2) != 0;
        bad |= chain_terminal(L, 1, 8, 2) != c->terminal;
        /* the second pass: known at TOPK, same answer after it, nothing re-learned */
        bad |= chain_observe(L, 1, BMOE_NODE_TOPK, 8, 2) != 0;
        bad |= chain_terminal(L, 1, 8, 2) != c->terminal;
        for (int j = 0; c->weights[j] != END; j++) bad |= chain_observe(L, 1, (bmoe_node)c->weights[j], 8, 2) != 0;
        bad |= chain_layer_done(L, 1) != c->terminal;
        bad |= chain_relearned(L) != 0;
        bad |= strcmp(chain_describe(L, 1, d, sizeof d), c->desc) != 0;
        /* the other layers have not been seen */
        bad |= chain_terminal(L, 0, 8, 2) != CHAIN_UNKNOWN || chain_terminal(L, 2, 8, 2) != CHAIN_UNKNOWN;
        bad |= strcmp(chain_describe(L, 0, d, sizeof d), "unknown") != 0;
        if (bad) fprintf(stderr, "case '%s' failed (describe: %s)\n", c->name, chain_describe(L, 1, d, sizeof d));
        CHECK(!bad);
        chain_free(L);
    }
}

static const int QWEN[] = { BMOE_NODE_WEIGHTS, BMOE_NODE_WEIGHTS_NORM, END };
static const int GEMMA[] = { BMOE_NODE_WEIGHTS, BMOE_NODE_WEIGHTS_NORM, BMOE_NODE_WEIGHTS_SCALED, END };

/* The key is the layer shape: another width or expert count is a shape not seen yet. */
static void test_shape_key(void) {
    chain_learner *L = chain_new(3);
    CHECK(pass(L, 0, 8, 2, QWEN) == 0);
    CHECK(chain_terminal(L, 0, 8, 2) == BMOE_NODE_WEIGHTS_NORM);
    CHECK(chain_terminal(L, 0, 8, 1) == CHAIN_UNKNOWN); /* --n-expert-used 1 */
    CHECK(chain_terminal(L, 0, 16, 2) == CHAIN_UNKNOWN);
    /* a layer that runs at another width is learned at that width */
    CHECK(pass(L, 0, 8, 1, QWEN) == 0);
    CHECK(chain_terminal(L, 0, 8, 1) == BMOE_NODE_WEIGHTS_NORM);
    CHECK(chain_terminal(L, 0, 8, 2) == CHAIN_UNKNOWN);
    CHECK(chain_relearned(L) == 1);
    /* layers are independent: a dense layer 1 never reports, layer 2 has its own chain */
    CHECK(pass(L, 2, 8, 2, GEMMA) == 0);
    CHECK(chain_terminal(L, 1, 8, 2) == CHAIN_UNKNOWN);
    CHECK(chain_terminal(L, 2, 8, 2) == BMOE_NODE_WEIGHTS_SCALED);
    CHECK(chain_terminal(L, 0, 8, 1) == BMOE_NODE_WEIGHTS_NORM);
    chain_free(L);
}

/* A batch of another size (prefill vs decode) is the same shape: T is not part of the key. Many
 * passes over many layers keep the answer. */
static void test_steady(void) {
    chain_learner *L = chain_new(40);
    int bad = 0;
    for (int step = 0; step < 50; step++)
        for (int il = 0; il < 40; il++) {
            if (step > 0 && chain_terminal(L, il, 256, 8) != BMOE_NODE_WEIGHTS_NORM) bad++;
            if (pass(L, il, 256, 8, QWEN) != 0) bad++;
        }
    CHECK(bad == 0);
    CHECK(chain_relearned(L) == 0);
    chain_free(L);
}

/* A chain that changes after it was learned: re-learned, counted, and the new terminal reported. */
static void test_relearn(void) {
    chain_learner *L = chain_new(2);
    CHECK(pass(L, 0, 8, 2, QWEN) == 0);
    CHECK(pass(L, 0, 8, 2, GEMMA) == 0);
    CHECK(chain_relearned(L) == 1);
    CHECK(chain_terminal(L, 0, 8, 2) == BMOE_NODE_WEIGHTS_SCALED);
    CHECK(pass(L, 0, 8, 2, GEMMA) == 0);
    CHECK(chain_relearned(L) == 1);
    chain_free(L);
}

/* Sequences the seam never produces are not learned, and they make a learned layer unknown again so
 * that the hook falls back to loading at TOPK, undropped. */
static void test_protocol(void) {
    chain_learner *L = chain_new(2);
    static const int DUP[] = { BMOE_NODE_WEIGHTS, BMOE_NODE_WEIGHTS, END };
    static const int BACKWARDS[] = { BMOE_NODE_WEIGHTS_NORM, BMOE_NODE_WEIGHTS, END };
    CHECK(pass(L, 0, 8, 2, DUP) != 0);
    CHECK(chain_terminal(L, 0, 8, 2) == CHAIN_UNKNOWN);
    CHECK(pass(L, 0, 8, 2, BACKWARDS) != 0);
    CHECK(chain_terminal(L, 0, 8, 2) == CHAIN_UNKNOWN);

    CHECK(pass(L, 0, 8, 2, QWEN) == 0);
    CHECK(chain_terminal(L, 0, 8, 2) == BMOE_NODE_WEIGHTS_NORM);
    CHECK(pass(L, 0, 8, 2, BACKWARDS) != 0); /* forgets */
    CHECK(chain_terminal(L, 0, 8, 2) == CHAIN_UNKNOWN);

    /* a weight node or EXPERTS with no TOPK before it */
    CHECK(chain_observe(L, 1, BMOE_NODE_WEIGHTS, 8, 2) == -1);
    CHECK(chain_observe(L, 1, BMOE_NODE_EXPERTS, 8, 2) == -1);
    CHECK(chain_terminal(L, 1, 8, 2) == CHAIN_UNKNOWN);
    /* the width changes inside a pass */
    CHECK(chain_observe(L, 1, BMOE_NODE_TOPK, 8, 2) == 0);
    CHECK(chain_observe(L, 1, BMOE_NODE_WEIGHTS, 8, 3) == -1);
    CHECK(chain_observe(L, 1, BMOE_NODE_EXPERTS, 8, 2) == -1);
    CHECK(chain_terminal(L, 1, 8, 2) == CHAIN_UNKNOWN);
    /* an aborted pass (TOPK, no EXPERTS) is replaced by the next TOPK */
    CHECK(chain_observe(L, 1, BMOE_NODE_TOPK, 8, 2) == 0);
    CHECK(chain_observe(L, 1, BMOE_NODE_WEIGHTS, 8, 2) == 0);
    CHECK(pass(L, 1, 8, 2, QWEN) == 0);
    CHECK(chain_terminal(L, 1, 8, 2) == BMOE_NODE_WEIGHTS_NORM);
    /* a zero width or expert count is refused */
    CHECK(chain_observe(L, 1, BMOE_NODE_TOPK, 8, 0) == -1);
    CHECK(chain_observe(L, 1, BMOE_NODE_EXPERTS, 8, 0) == -1);
    CHECK(chain_terminal(L, 1, 8, 0) == CHAIN_UNKNOWN);

    /* out of range, unknown node values, NULL */
    CHECK(chain_observe(L, 2, BMOE_NODE_TOPK, 8, 2) == -1);
    CHECK(chain_observe(L, -1, BMOE_NODE_TOPK, 8, 2) == -1);
    CHECK(chain_observe(L, 0, BMOE_NODE_COUNT, 8, 2) == -1);
    CHECK(chain_observe(L, 0, (bmoe_node)-3, 8, 2) == -1);
    CHECK(chain_terminal(L, 2, 8, 2) == CHAIN_UNKNOWN);
    CHECK(chain_layer_done(L, 5) == CHAIN_UNKNOWN);
    CHECK(chain_observe(NULL, 0, BMOE_NODE_TOPK, 8, 2) == -1);
    CHECK(chain_terminal(NULL, 0, 8, 2) == CHAIN_UNKNOWN);
    CHECK(chain_new(0) == NULL);
    chain_free(NULL);
    char d[8];
    CHECK(pass(L, 1, 8, 2, QWEN) == 0);
    CHECK(strlen(chain_describe(L, 1, d, sizeof d)) == sizeof d - 1); /* truncated, terminated */
    chain_free(L);
}

int main(void) {
    test_gatings();
    test_shape_key();
    test_steady();
    test_relearn();
    test_protocol();
    return check_report("test_weight_chain");
}
