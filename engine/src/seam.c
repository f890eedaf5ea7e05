/* The seam's node names (seam.h): llama.cpp's names of the MoE layer's intermediate results. */
#include "seam.h"

const char *bmoe_node_name(bmoe_node n) {
    static const char *const names[BMOE_NODE_COUNT] = {
        "ffn_moe_logits", "ffn_moe_probs", "ffn_moe_topk", "ffn_moe_weights", "ffn_moe_weights_softmax",
        "ffn_moe_weights_norm", "ffn_moe_weights_scaled", "ffn_moe_experts",
    };
    return (unsigned)n < BMOE_NODE_COUNT ? names[n] : "?";
}
