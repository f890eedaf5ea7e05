/* --route-trace FILE: one CSV row per routed slot (docs/streaming.md#the-route-trace---route-trace-file).
 *
 *   # route_trace v4
 *   # model=<path>
 *   # arch=<arch>
 *   # layers=<block_count>
 *   # experts=<n_expert>
 *   # top_k=<effective top-k>
 *   # scores_are_probs=<0|1>              1: substitution ranks log(scores) (softmax gating)
 *   # page_bytes=<n> shared_slot_bytes=<n>   the slot rounding; a shared slot (0: per-expert slots)
 *   # layer=<il> expert_bytes=<n> part_bytes=<gate>,<up>,<gate_up>,<down> slot_bytes=<n>   per MoE layer:
 *     one expert's bytes (what a read of it costs), per part, and what one resident expert of the
 *     layer costs the cache (its slot); layers whose experts differ in type differ in all three
 *   turn,phase,step,layer,slot,router_expert,expert,router_weight,weight,residency,expert_bytes,dropped,substituted,scores
 *   0,0,0,0,0,5,5,0.612345695,0.612345695,0,98304,0,0,
 *
 * v2 carries what an exact replay of the cache and the policies needs: the router's own choice
 * (router_expert, before substitution) and the final weight before any drop edit (router_weight),
 * beside what executed; the slot geometry lets a reader derive the cache's capacity.
 * v3 adds `scores`: on the first slot row of each routing that substitution examined, the n_expert
 * scores it re-ranked, space-separated (%.9g: each reads back to the same float32); empty otherwise,
 * so a trace without substitution grows by one comma a row.
 * v4 gives each layer its own slot_bytes (expert tensors may differ in type between layers), in place
 * of v3's one `# slot_bytes=`.
 *
 * Values written from the file (model path, arch) are shown with control bytes, commas and
 * non-ASCII bytes as '?', so the preamble stays one line per key. Weights are printed with %.9g
 * (enough digits to read the float back exactly; glibc and musl print them identically). */
#ifndef BMOE_ROUTE_TRACE_H
#define BMOE_ROUTE_TRACE_H

#include <stddef.h>
#include <stdint.h>

#include "model.h"

typedef struct bmoe_route_trace bmoe_route_trace;

typedef struct bmoe_trace_row {
    int turn, phase, step, layer, slot;
    int router_expert;       /* the router's choice, before any substitution */
    int expert;              /* as executed after substitution, before drop repointing */
    float router_weight;     /* the final weight before any drop edit (== weight when nothing was edited) */
    float weight;            /* as finally applied */
    int residency;           /* 0 miss, 1 hit, 2 hit on a prefetched expert's first use */
    uint64_t expert_bytes;   /* bytes read for this row (charged once per read expert), else 0 */
    int dropped, substituted;
    const float *scores;     /* the scores substitution re-ranked for this routing (slot 0 only), else NULL */
    int n_scores;
} bmoe_trace_row;

/* The expert memory's slot geometry, for the preamble. */
typedef struct bmoe_trace_geometry {
    const uint64_t *slot_bytes;      /* [n_moe_layers] one slot of each MoE layer (borrowed) */
    uint64_t shared_slot_bytes;      /* a shared slot (--cache-mb 0), else 0 */
    uint64_t page_bytes;
} bmoe_trace_geometry;

/* Opens (truncates) the file and writes the preamble. 0, or 4 with err set. */
int trace_open(bmoe_route_trace **out, const char *path, const bmoe_model *m, int top_k, bmoe_trace_geometry geo,
               char *err, size_t errlen);
void trace_row(bmoe_route_trace *t, const bmoe_trace_row *r);
/* Flushes and closes. 0, or 4 when anything could not be written. NULL is fine (returns 0). */
int trace_close(bmoe_route_trace *t, char *err, size_t errlen);
uint64_t trace_rows(const bmoe_route_trace *t);

#endif
