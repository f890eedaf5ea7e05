/* Learning each MoE layer's weight chain from the graph, with no per-architecture table
 * (docs/policies.md, "Where the decision sits").
 *
 * --drop-cold-experts needs the FINAL routing weights, which exist only at the last weight node of the
 * layer (ffn_moe_weights, then whichever of _softmax, _norm, _scaled the gating runs). That last node
 * is the layer's TERMINAL node. The learner watches the nodes the hook sees and records, per layer, the
 * chain between TOPK and EXPERTS. Nothing about the architecture is assumed: a layer the learner has
 * not seen complete reports "unknown" and the hook loads it at TOPK, undropped.
 *
 * Layer shape (the key a learned terminal is valid for):
 *   (n_expert E, top-k k as the row width at TOPK, the ordered list of weight nodes seen between
 *    TOPK and EXPERTS)
 * chain_terminal(il, E, k) answers only when layer il completed a chain with the same E and k; a pass
 * that runs at another width (e.g. another --n-expert-used) is a shape not seen yet.
 *
 * Protocol, per layer and per batch: TOPK opens the record, weight nodes append to it, EXPERTS (or
 * chain_layer_done) closes it. LOGITS and PROBS are ignored. A sequence that breaks the protocol (a
 * weight node without TOPK, a node twice, nodes out of the seam's order) is not learned. When a later
 * pass of a learned layer closes with a different chain, the layer is re-learned from that pass and
 * `relearned` counts it: the hook must treat EXPERTS as a backstop and load undropped there if the
 * terminal it deferred to never came.
 *
 * Pure apart from the learner's own memory: no I/O. One learner per engine instance; not thread-safe
 * (the hook runs on the eval thread). */
#ifndef BMOE_WEIGHT_CHAIN_H
#define BMOE_WEIGHT_CHAIN_H

#include <stddef.h>

#include "seam.h"

#define CHAIN_UNKNOWN (-1)
#define CHAIN_MAX_WEIGHT_NODES 4 /* WEIGHTS, _SOFTMAX, _NORM, _SCALED */

typedef struct chain_learner chain_learner;

/* A learner for layers 0..n_layer-1 (dense layers simply never report). NULL on bad n or no memory. */
chain_learner *chain_new(int n_layer);
void chain_free(chain_learner *L);

/* Feeds one node the hook saw for layer il; n_expert and k are the result's n_expert and, at TOPK and
 * after, its n_cols. Returns 0, or -1 when the node breaks the protocol (the layer's open record is
 * then discarded) or il is out of range. Observing EXPERTS closes the layer (chain_layer_done). */
int chain_observe(chain_learner *L, int il, bmoe_node node, int n_expert, int k);

/* Closes layer il's open record and learns it. Returns the learned terminal node, or CHAIN_UNKNOWN if
 * there was no valid open record or the chain has no weight node. Idempotent on a closed layer. */
int chain_layer_done(chain_learner *L, int il);

/* The terminal node (BMOE_NODE_WEIGHTS .. BMOE_NODE_WEIGHTS_SCALED) learned for layer il at this shape,
 * or CHAIN_UNKNOWN: not learned yet, learned at another E or k, or learned with no weight node. */
int chain_terminal(const chain_learner *L, int il, int n_expert, int k);

/* Number of times a learned layer closed with a different shape than the one it had learned. */
unsigned long chain_relearned(const chain_learner *L);

/* "E=8 k=2 weights>weights_norm" for logs and tests; "unknown" if not learned. Returns buf. */
const char *chain_describe(const chain_learner *L, int il, char *buf, size_t n);

#endif
