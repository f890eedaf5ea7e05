/* The streaming hook: what sits behind the seam (seam.h) when the engine runs without --mmap.
 *
 * It owns the expert memory (expert_stream.h), the cache (expert_cache.h), the I/O lanes, the
 * prefetch planner (prefetch.h), the route trace (route_trace.h) and the counters, and it is the one
 * place routing policies plug into. forward.c only emits the named MoE results and asks the expert
 * source for views.
 *
 * Per MoE layer and token batch, as forward.c emits the named results:
 *   ffn_moe_logits   a new layer begins: the previous layer's experts are unpinned (the cache may
 *                    evict them now) and the cache is trimmed back to its budget
 *   ffn_moe_topk     [policy->at_topk: may re-rank the ids (substitution); residency is queried
 *                    for it after pending speculation on the layer settles, BEFORE residency is
 *                    taken for the load and before any drop]
 *                    the routing is recorded for prefetch; then, unless a policy defers it, the
 *                    layer's routed experts are LOADED: residency is taken per expert, each unique
 *                    expert is looked up once (hit: refresh the LRU; miss: evict/commit/read), all of
 *                    them are pinned, the demand reads are issued in the order the matmuls use
 *                    the experts, then speculative reads for the next layers; nothing is waited
 *                    for here: each expert's view (the expert source) waits for its own reads, so
 *                    the matmuls of the first experts overlap the reads of the later ones
 *   weight nodes     the layer's weight chain. Its last node before the matmuls (the TERMINAL node)
 *                    is learned by weight_chain.c, keyed by the layer's shape (E, k, the chain), from
 *                    the first pass of that shape: no per-architecture table. With a deferring policy
 *                    the load happens at that terminal node instead: policy->at_terminal sees the
 *                    final weights and the residency and may drop slots (zero weight, repoint the
 *                    id at a kept slot's expert); dropped slots are not loaded and cost no read. A
 *                    layer whose shape has not been seen yet loads at topk, undropped.
 *   EXPERTS          closes the layer's chain for the learner; backstop: a deferred layer whose
 *                    terminal node never came (its chain changed shape) loads here, undropped; the
 *                    route-trace rows are written with the weights as finally applied
 *
 * Counters: cache_hits + cache_misses == experts_routed (every routed slot, residency taken before
 * the load); flash_reads / flash_bytes count every expert read, demand and speculative, with the
 * bytes of the expert's slices in its own layer (not the alignment padding an O_DIRECT read adds);
 * they are also kept per streamed layer (stream_hook_flash_layers), where bytes == reads x that
 * layer's expert bytes. */
#ifndef BMOE_STREAM_HOOK_H
#define BMOE_STREAM_HOOK_H

#include <stdint.h>

#include "model.h"
#include "result.h"
#include "seam.h"

typedef struct bmoe_stream_hook bmoe_stream_hook;

/* A routing policy (the lossy knobs of docs/design.md, the seam and the lossy knobs; policies.c builds the real one from the config)
 * plugged into the hook. Both callbacks are optional; flag arrays are [T * k], zeroed by the hook
 * before the call, rank order per token. `resident[e]` is 1 when expert e of the layer is in the
 * cache (after its pending speculative reads settled); all zeros with the cache off. */
typedef struct bmoe_route_policy {
    void *self;
    /* At ffn_moe_topk, before residency is taken for the load. May rewrite r->ids (each id in
     * [0, E)). Sets changed[i] = 1 for every slot whose expert is not in the router's own selection
     * (a set change; a reordering is not one) and adds the slots it examined to c->subst_examined.
     * Returns 0, or an engine exit code that stops the forward pass. */
    int (*at_topk)(void *self, bmoe_moe_result *r, const uint8_t *resident, uint8_t *changed, bmoe_counters *c);
    /* Non-NULL: the layer's load is deferred to its terminal weight node, where this runs with the
     * final weights (r->weights, mutable) and ids (mutable). Sets dropped[i] = 1 for each dropped
     * slot, whose id it must repoint at an expert that another, kept slot of the same token loads:
     * the hook does not load a dropped slot's expert (it costs no read), so a slot left pointing at
     * an expert that is not resident makes the matmul touch uncommitted memory (a fault, by design:
     * docs/design.md, expert memory). The hook counts experts_dropped from the flags. */
    int (*at_terminal)(void *self, bmoe_moe_result *r, const uint8_t *resident, uint8_t *dropped, bmoe_counters *c);
    int topk_in_prefill;      /* 0: at_topk runs on decode batches only */
    int terminal_in_prefill;  /* 0: prefill batches load at topk and are never dropped */
} bmoe_route_policy;

/* What the hook takes from the run's options (engine.c fills it from the command line); the hook
 * sees nothing else of the configuration. The expert streamer below it has its own, narrower options
 * (bmoe_stream_opts, expert_stream.h), which the hook fills. */
typedef struct bmoe_stream_hook_opts {
    int cache_mb;            /* --cache-mb: the cache's budget in MiB; 0 = no cache (shared slots) */
    int odirect;             /* expert reads with O_DIRECT where the file system allows (not --no-odirect) */
    int io_lanes;            /* --io-threads */
    int prefetch;            /* --prefetch depth, 0 = off (needs the cache) */
    int prefetch_sync;       /* --prefetch-sync */
    const char *route_trace; /* --route-trace file, NULL = none */
} bmoe_stream_hook_opts;

/* Streaming setup for engine.c: makes the model's dense weights resident (read into owned memory;
 * the shard mappings are then unmapped, so no tensor is read through a mapping afterwards), opens
 * the expert store, the cache (o->cache_mb; a budget smaller than one expert is a config error,
 * exit 2), the prefetcher and the route trace. max_batch: the largest batch forward_eval gets.
 * 0, or an exit code with err set. */
int stream_hook_create(bmoe_stream_hook **out, bmoe_model *m, const bmoe_stream_hook_opts *o, int top_k,
                       int max_batch, bmoe_error *err);
void stream_hook_destroy(bmoe_stream_hook *h); /* NULL is fine */

/* The seam: hook function (user = the hook) and expert source. */
int stream_hook_fn(void *user, bmoe_moe_result *r);
bmoe_expert_source stream_hook_source(bmoe_stream_hook *h);

/* Plugs a policy in (copied). Call before the first forward pass. */
void stream_hook_set_policy(bmoe_stream_hook *h, const bmoe_route_policy *p);

/* resident[0..E) for model layer il, after the layer's pending speculative reads settle. 0, or an
 * exit code (4: a speculative read failed) with the message in stream_hook_error. */
int stream_query_residency(bmoe_stream_hook *h, int il, uint8_t *resident);

/* After the last forward pass: settles speculative reads, closes the route trace. 0 or an exit code. */
int stream_hook_finish(bmoe_stream_hook *h, bmoe_error *err);
/* Adds the hook's counters (everything but experts_routed, which forward.c counts) into c. */
void stream_hook_counters(const bmoe_stream_hook *h, bmoe_counters *c);
/* The message of the error that made the hook stop a forward pass ("" when none). */
const char *stream_hook_error(const bmoe_stream_hook *h);
/* Warnings for the result (e.g. O_DIRECT refused by the filesystem). Returns how many were written. */
int stream_hook_warnings(const bmoe_stream_hook *h, const char **out, int cap);

/* flash_reads and flash_bytes of each streamed layer (the model's MoE layers in order): *reads and
 * *bytes point at arrays the hook owns; returns how many layers (0 when nothing is streamed). */
int stream_hook_flash_layers(const bmoe_stream_hook *h, const uint64_t **reads, const uint64_t **bytes);

/* For tests and benchmarks: bytes of one committed expert slot of model layer il (0 for a layer that
 * is not streamed), resident bytes, evictions so far. */
uint64_t stream_hook_slot_bytes(const bmoe_stream_hook *h, int il);
uint64_t stream_hook_cache_bytes(const bmoe_stream_hook *h);
uint64_t stream_hook_evictions(const bmoe_stream_hook *h);
/* The frame pool's figures (stream_frames; all 0 with the cache off). */
void stream_hook_frames(const bmoe_stream_hook *h, size_t *created, size_t *in_use, size_t *warm);

#endif
