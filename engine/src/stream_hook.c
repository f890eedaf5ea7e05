/* The streaming hook (see stream_hook.h for the sequence it follows per MoE layer). */
#include "stream_hook.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "expert_cache.h"
#include "expert_stream.h"
#include "io_lanes.h"
#include "prefetch.h"
#include "route_trace.h"
#include "weight_chain.h"

#define MIB ((uint64_t)1 << 20)

struct bmoe_stream_hook {
    bmoe_model *m;
    int n_layers;               /* streamed (MoE) layers */
    int *li_of;                 /* model layer -> streamed index, -1 for dense layers */
    int E, k, max_batch;
    uint64_t *eb;               /* expert bytes (slices) per streamed layer */
    uint64_t *layer_reads, *layer_bytes; /* flash_reads and flash_bytes per streamed layer */
    bmoe_stream *st;
    bmoe_cache *cache;          /* NULL: cache off, shared slots */
    int S;                      /* shared slots */
    int *shared_of;             /* [E] slot of expert e in shared_layer, -1 */
    int shared_layer;
    bmoe_prefetch *pf;
    int prefetch_sync;
    bmoe_io_group *groups;      /* cache: [n_layers * E]; shared: [S] */
    uint8_t *prefetched;        /* [n_layers * E] read speculatively, not used yet */
    int *spec_keys;             /* issued by the last prefetch round (for --prefetch-sync) */
    int *plan_l, *plan_e;
    /* the layer in progress */
    int cur_li, cur_loaded;
    int cur_terminal;           /* the node the load is deferred to, CHAIN_UNKNOWN: loaded at topk */
    int *pinned, n_pinned;
    int32_t *pre_ids;           /* [max_batch * k] ids after substitution, before any drop repointing */
    int32_t *router_ids;        /* [max_batch * k] the router's ids, before substitution (the trace) */
    float *router_w;            /* [max_batch * k] final weights before the drop edit (the trace) */
    int cur_router_w;           /* router_w holds this layer's weights (a drop decision ran) */
    float *router_scores;       /* [max_batch * E] the scores substitution re-ranked (the trace) */
    int cur_scores;             /* router_scores holds this layer's scores (substitution ran) */
    uint8_t *dropped, *changed, *row_res;
    uint64_t *row_bytes;
    uint8_t *res0, *resident, *seen, *charged; /* [E] */
    int *uniq;                  /* [E] */
    uint8_t *need_read, *in_col; /* [E] issue_reads' bookkeeping */
    chain_learner *chain;       /* each layer's weight chain, learned from the graph (weight_chain.h) */
    bmoe_route_policy policy;
    int has_policy;
    bmoe_route_trace *trace;
    bmoe_counters c;
    int rc;
    char msg[1024];
    void *dense;                /* owned copy of the dense weights */
};

static int hfail(bmoe_stream_hook *h, int code, const char *fmt, ...) {
    if (h->rc) return h->rc; /* the first error wins */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(h->msg, sizeof h->msg, fmt, ap);
    va_end(ap);
    h->rc = code;
    return code;
}

static int take_stream_error(bmoe_stream_hook *h, int code, const char *m) {
    return hfail(h, code, "%s", m);
}

/* ---- dense weights: read once into owned memory, then drop the mappings -------------------------- */

static int pread_full(int fd, uint8_t *dst, uint64_t n, uint64_t off) {
    uint64_t done = 0;
    while (done < n) {
        ssize_t r = pread(fd, dst + done, (size_t)(n - done), (off_t)(off + done));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return r < 0 ? errno : -1;
        done += (uint64_t)r;
    }
    return 0;
}

static int make_dense_resident(bmoe_stream_hook *h, bmoe_error *err) {
    bmoe_model *m = h->m;
    bmoe_weight **ws = malloc(model_dense_capacity(m) * sizeof *ws);
    if (!ws) return err_set(err, 1, NULL, "out of memory");
    size_t n = model_dense_weights(m, ws); /* every dense matrix the forward pass reads (model.h) */
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++)
        if (ws[i]->t) total += (ws[i]->t->nbytes + 63) & ~(uint64_t)63;
    if (total > (uint64_t)SIZE_MAX - 64) { free(ws); return err_set(err, 1, NULL, "the dense weights do not fit in memory"); }
    uint8_t *raw = malloc((size_t)total + 64);
    if (!raw) { free(ws); return err_set(err, 1, NULL, "out of memory for %llu bytes of dense weights", (unsigned long long)total); }
    h->dense = raw;
    uint8_t *p = (uint8_t *)(((uintptr_t)raw + 63) & ~(uintptr_t)63);
    for (size_t i = 0; i < n; i++) {
        bmoe_weight *w = ws[i];
        if (!w->t) continue;
        const gguf_shard *sh = &m->g->shards[w->t->shard];
        int rc = pread_full(sh->fd, p, w->t->nbytes, w->t->offset);
        if (rc) {
            free(ws);
            return err_set(err, 4, NULL, "%s: %.*s: %s reading %llu bytes at offset %llu", sh->path,
                           (int)(w->t->name.len > 80 ? 80 : w->t->name.len), w->t->name.ptr,
                           rc > 0 ? strerror(rc) : "the file ends early", (unsigned long long)w->t->nbytes,
                           (unsigned long long)w->t->offset);
        }
        w->data = p;
        p += (w->t->nbytes + 63) & ~(uint64_t)63;
    }
    free(ws);
    if (m->output_tied) m->output = m->token_embd;
    for (int il = 0; il < m->hp.n_layer; il++)
        for (int q = 0; q < BMOE_EXP_NPARTS; q++) m->layers[il].exps[q].data = NULL;
    /* nothing is read through the model mapping from here on */
    for (uint32_t s = 0; m->maps && s < m->g->n_shards; s++) {
        if (m->maps[s]) munmap(m->maps[s], (size_t)m->map_len[s]);
        m->maps[s] = NULL;
        m->map_len[s] = 0;
    }
    return 0;
}

/* ---- eviction and waiting --------------------------------------------------------------------- */

static size_t key_of(const bmoe_stream_hook *h, int li, int e) { return (size_t)li * (size_t)h->E + (size_t)e; }

static int wait_group(bmoe_stream_hook *h, bmoe_io_group *g) {
    char m[1024];
    if (stream_wait(h->st, g, m, sizeof m)) {
        memset(g, 0, sizeof *g);
        return take_stream_error(h, 4, m);
    }
    memset(g, 0, sizeof *g);
    return 0;
}

/* The cache evicted (li, e): wait for a read still landing in its slot, then release the slot. */
static void on_evict(void *user, int li, int e) {
    bmoe_stream_hook *h = user;
    size_t key = key_of(h, li, e);
    wait_group(h, &h->groups[key]); /* under the lanes' lock; returns at once when nothing is pending */
    stream_release(h->st, li, e);
    h->prefetched[key] = 0;
    /* a miss of the layer being loaded whose read is not issued yet is not read at all: only a
     * broken pin (fault EVICT_IN_USE) gets here, and its matmul must fault as it did when the read
     * was issued before the next miss was inserted */
    if (li == h->cur_li) h->need_read[e] = 0;
}

static void unpin_layer(bmoe_stream_hook *h) {
    if (h->cache && h->cur_li >= 0) {
#ifndef BMOE_FAULT_CACHE_PIN_LEAK /* fault: a layer's experts stay pinned for good */
        for (int i = 0; i < h->n_pinned; i++) cache_unpin(h->cache, h->cur_li, h->pinned[i]);
#endif
        cache_trim(h->cache, on_evict, h);
    }
    h->n_pinned = 0;
}

/* ---- the load ------------------------------------------------------------------------------------ */

/* One speculative round after layer li is routed (decode only): the previous token's experts at the
 * next layers that are not resident are read on the speculative priority. Every guess of the round,
 * resident or new, is pinned until the round ends, so the round never evicts what it guessed itself;
 * a guess that would need a pinned entry evicted is skipped (speculation never goes over budget). */
static int issue_prefetch(bmoe_stream_hook *h, int li) {
    int n = prefetch_plan(h->pf, li, h->plan_l, h->plan_e, prefetch_depth(h->pf) * h->k);
    int issued = 0, pinned = 0, rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        int lj = h->plan_l[i], e = h->plan_e[i];
        size_t key = key_of(h, lj, e);
        if (!cache_contains(h->cache, lj, e)) {
            if (!cache_insert(h->cache, lj, e, 0, on_evict, h)) continue; /* no room */
            if (h->rc) { rc = h->rc; break; }
            h->prefetched[key] = 1;
            h->c.prefetch_issued++;
            h->c.flash_reads++;
            h->c.flash_bytes += h->eb[lj];
            h->layer_reads[lj]++;
            h->layer_bytes[lj] += h->eb[lj];
#ifndef BMOE_FAULT_SKIP_LOAD_ON_HIT
            char m[1024];
            if (stream_load(h->st, lj, e, e, BMOE_IO_SPECULATIVE, &h->groups[key], m, sizeof m)) {
                rc = take_stream_error(h, 1, m);
                break;
            }
#endif
            /* (injected fault SKIP_LOAD_ON_HIT: the expert is marked resident but never read, so its
             * first use is a "hit" on a slot that was never committed) */
            h->spec_keys[issued++] = (int)key;
        }
        cache_pin(h->cache, lj, e);
        h->plan_l[pinned] = lj; /* reuses the plan's slots already consumed */
        h->plan_e[pinned++] = e;
    }
    for (int i = 0; i < pinned; i++) cache_unpin(h->cache, h->plan_l[i], h->plan_e[i]);
    if (rc) return rc;
    if (h->prefetch_sync)
        for (int i = 0; i < issued; i++)
            if (wait_group(h, &h->groups[h->spec_keys[i]])) return h->rc;
    return 0;
}

/* Issues this pass's demand reads in the order forward.c computes the experts (a batch's executing
 * experts in ascending id, each once: seam.h), so the reads land in the order the views wait for them.
 * Cache: the experts marked need_read (the misses, already inserted and pinned), into their own
 * slots; shared slots: every executing expert, into the slot shared_of gave it. The order of the
 * reads changes no decision, counter or byte. */
static int issue_reads(bmoe_stream_hook *h, const bmoe_moe_result *r, int li) {
    char m[1024];
    int n = r->n_tokens * h->k, E = h->E;
    for (int e = 0; e < E; e++) h->in_col[e] = 0;
    for (int i = 0; i < n; i++)
        if (!h->dropped[i]) h->in_col[r->ids[i]] = 1;
    for (int e = 0; e < E; e++) {
        if (!h->in_col[e]) continue;
        int slot, rc;
        bmoe_io_group *g;
        if (h->cache) {
            if (!h->need_read[e]) continue;
            h->need_read[e] = 0;
            slot = e;
            g = &h->groups[key_of(h, li, e)];
        } else {
            if (h->shared_of[e] < 0) continue;
            slot = h->shared_of[e];
            g = &h->groups[slot];
        }
        if ((rc = stream_load(h->st, li, slot, e, BMOE_IO_DEMAND, g, m, sizeof m))) return take_stream_error(h, rc, m);
    }
    return 0;
}

static int load_layer(bmoe_stream_hook *h, bmoe_moe_result *r) {
    int li = h->cur_li, T = r->n_tokens, k = h->k, E = h->E, n = T * k;
    uint64_t eb = h->eb[li];
    h->cur_loaded = 1;
    for (int i = 0; i < n; i++)
        if (r->ids[i] < 0 || r->ids[i] >= E)
            return hfail(h, 1, "%s-%d: expert id %d out of range [0, %d) at the load", bmoe_node_name(r->node), r->layer,
                         (int)r->ids[i], E);

    /* residency before the load, per expert: 0 miss, 1 hit, 2 prefetched and not used yet */
    for (int e = 0; e < E; e++) {
        h->res0[e] = 0;
        if (h->cache && cache_contains(h->cache, li, e)) h->res0[e] = h->prefetched[key_of(h, li, e)] ? 2 : 1;
        h->seen[e] = 0;
        h->charged[e] = 0;
    }
    /* the experts that execute, once each, in order of first appearance. A dropped slot executes
     * nothing of its own: the policy repointed it at a kept slot's expert (policy_drop.h), so it is
     * not loaded for it (it costs no read); the matmul touches whatever its id names. */
    int nu = 0;
    for (int i = 0; i < n; i++) {
        int e = r->ids[i];
        if (h->dropped[i]) continue;
        if (!h->seen[e]) { h->seen[e] = 1; h->uniq[nu++] = e; }
    }
    /* every routed slot is a hit or a miss, taken before the load, for the expert it routed */
    for (int i = 0; i < n; i++) {
        h->row_res[i] = h->res0[h->pre_ids[i]];
        if (h->row_res[i]) h->c.cache_hits++;
#ifndef BMOE_FAULT_MISSES_PER_READ /* fault: misses are counted per expert read, not per routed slot */
        else h->c.cache_misses++;
#endif
        h->row_bytes[i] = 0;
    }

    if (!h->cache) {
        /* shared slots: every executing expert is read again, into slot j of the shared range. A read
         * of the previous layer still landing in a slot must finish before the slot is reused. */
        for (int j = 0; j < h->S; j++)
            if (wait_group(h, &h->groups[j])) return h->rc;
        for (int e = 0; e < E; e++) h->shared_of[e] = -1;
        h->shared_layer = li;
        for (int j = 0; j < nu; j++) {
            int e = h->uniq[j];
            h->shared_of[e] = j;
#ifdef BMOE_FAULT_MISSES_PER_READ
            h->c.cache_misses++;
#endif
            h->c.flash_reads++;
            h->c.flash_bytes += eb;
            h->layer_reads[li]++;
            h->layer_bytes[li] += eb;
            h->charged[e] = 1;
        }
        if (issue_reads(h, r, li)) return h->rc;
    } else {
        /* hits first: refreshed and pinned before any miss can make the cache evict (a miss
         * inserted first could otherwise evict a hit of this very layer) */
        for (int j = 0; j < nu; j++) {
            int e = h->uniq[j];
            size_t key = key_of(h, li, e);
            if (!h->res0[e]) continue;
            cache_touch(h->cache, li, e);
#ifdef BMOE_FAULT_PREFETCH_USED_OVERCOUNT
            if (h->pf) h->c.prefetch_used++; /* fault: every hit counts as a used prefetch */
#endif
            if (h->prefetched[key]) {
                h->prefetched[key] = 0;
                h->c.prefetch_used++;
#ifdef BMOE_FAULT_PREFETCH_USED_TWICE
                h->c.prefetch_used++; /* fault: a prefetched expert's first use is counted twice */
#endif
                h->charged[e] = 1; /* its speculative read is charged to its first use */
            }
            cache_pin(h->cache, li, e);
            h->pinned[h->n_pinned++] = e;
        }
        /* then the misses, in order of first appearance: every decision (insert, evict, pin) is taken
         * here; the reads are issued after, in the order the matmuls use the experts */
        for (int j = 0; j < nu; j++) {
            int e = h->uniq[j];
            if (h->res0[e]) continue;
            cache_insert(h->cache, li, e, 1, on_evict, h);
            if (h->rc) return h->rc;
            cache_pin(h->cache, li, e);
            h->pinned[h->n_pinned++] = e;
#ifdef BMOE_FAULT_MISSES_PER_READ
            h->c.cache_misses++;
#endif
            h->c.flash_reads++;
            h->c.flash_bytes += eb;
            h->layer_reads[li]++;
            h->layer_bytes[li] += eb;
#ifdef BMOE_FAULT_FLASH_BYTES_TWICE
            h->c.flash_bytes += eb; /* fault: a demand read through the cache is counted twice */
#endif
            h->charged[e] = 1;
            h->need_read[e] = 1;
        }
        if (issue_reads(h, r, li)) return h->rc;
        if (h->pf && r->phase == 1 && issue_prefetch(h, li)) return h->rc;
    }
    /* nothing is waited for here: each expert's view waits for its own reads (hook_view), so the
     * matmuls of the first experts run while the later experts are still being read */
    /* bytes go on the first executed row of each expert that was read */
    for (int i = 0; i < n; i++) {
        int e = h->pre_ids[i];
        if (h->dropped[i] || !h->charged[e]) continue;
        h->row_bytes[i] = eb;
#ifndef BMOE_FAULT_TRACE_BYTES_EVERY_ROW /* fault: every row of an expert read carries its bytes */
        h->charged[e] = 0;
#endif
    }
    return 0;
}

static void write_trace(bmoe_stream_hook *h, const bmoe_moe_result *r) {
    int k = h->k;
    for (int t = 0; t < r->n_tokens; t++)
        for (int s = 0; s < k; s++) {
            int i = t * k + s;
            float w = r->weights ? r->weights[i] : 0.0f;
            bmoe_trace_row row = {
                .turn = 0, .phase = r->phase, .step = r->phase == 0 ? r->pos0 + t : r->step, .layer = r->layer,
                .slot = s, .router_expert = h->router_ids[i], .expert = h->pre_ids[i],
                .router_weight = h->cur_router_w ? h->router_w[i] : w, .weight = w,
                .residency = h->row_res[i], .expert_bytes = h->row_bytes[i], .dropped = h->dropped[i],
                .substituted = h->changed[i],
                .scores = h->cur_scores && s == 0 ? h->router_scores + (size_t)t * h->E : NULL, .n_scores = h->E,
            };
#ifdef BMOE_FAULT_TRACE_RESIDENCY_AFTER
            row.residency = 1; /* fault: residency taken after the load, when every executed expert is resident */
#endif
            trace_row(h->trace, &row);
        }
}

static int hook_node(bmoe_stream_hook *h, bmoe_moe_result *r) {
    if (h->rc) return h->rc;
    int li = (r->layer >= 0 && r->layer < h->m->hp.n_layer) ? h->li_of[r->layer] : -1;
    if (li < 0) return hfail(h, 1, "%s-%d: not a streamed layer", bmoe_node_name(r->node), r->layer);
    int k = h->k, n = r->n_tokens * k;
    if (r->node != BMOE_NODE_LOGITS && r->node != BMOE_NODE_PROBS &&
        (r->n_tokens < 1 || r->n_tokens > h->max_batch || r->n_cols != k))
        return hfail(h, 1, "%s-%d: a batch of %d x %d does not match the hook (%d x %d)", bmoe_node_name(r->node),
                     r->layer, r->n_tokens, r->n_cols, h->max_batch, k);

    /* the learner sees every node (it ignores LOGITS and PROBS); a node that breaks its protocol
     * only makes the layer unknown again, which loads it at topk, undropped */
    (void)chain_observe(h->chain, li, r->node, r->n_expert, r->n_cols);

    switch (r->node) {
    case BMOE_NODE_LOGITS:
        unpin_layer(h);
        if (li == 0 && h->st) stream_trim(h->st); /* a pass starts: the frame pool's once-a-pass trim */
        h->cur_li = li;
        h->cur_loaded = 0;
        h->cur_terminal = CHAIN_UNKNOWN;
        break;
    case BMOE_NODE_PROBS:
        break;
    case BMOE_NODE_TOPK: {
        if (li != h->cur_li) { /* a pass that did not start at LOGITS */
            unpin_layer(h);
            if (li == 0 && h->st) stream_trim(h->st);
            h->cur_li = li;
        }
        h->cur_loaded = 0;
        h->cur_terminal = CHAIN_UNKNOWN;
        memset(h->changed, 0, (size_t)n);
        memset(h->dropped, 0, (size_t)n);
        h->cur_router_w = 0;
        h->cur_scores = 0;
        memcpy(h->router_ids, r->ids, (size_t)n * sizeof *r->ids);
        /* 1. re-ranking (substitution), before residency is taken for the load and before any drop */
        if (h->has_policy && h->policy.at_topk && (r->phase == 1 || h->policy.topk_in_prefill)) {
            int rc = stream_query_residency(h, r->layer, h->resident);
            if (rc) return rc;
            rc = h->policy.at_topk(h->policy.self, r, h->resident, h->changed, &h->c);
            if (rc) return hfail(h, rc, "ffn_moe_topk-%d: the substitution policy failed (code %d)", r->layer, rc);
            for (int i = 0; i < n; i++) h->c.subst_changed += h->changed[i] ? 1 : 0;
            if (h->trace && r->scores) {
                memcpy(h->router_scores, r->scores, (size_t)r->n_tokens * h->E * sizeof *r->scores);
                h->cur_scores = 1;
            }
        }
        memcpy(h->pre_ids, r->ids, (size_t)n * sizeof *r->ids);
        for (int i = 0; i < n; i++)
            if (h->pre_ids[i] < 0 || h->pre_ids[i] >= h->E)
                return hfail(h, 1, "ffn_moe_topk-%d: expert id %d out of range [0, %d)", r->layer, (int)h->pre_ids[i], h->E);
        if (h->pf) prefetch_record(h->pf, li, h->pre_ids + (size_t)(r->n_tokens - 1) * k, k);
        /* 2. a deferring policy (dropping) waits for the terminal node of this layer's shape, once the
         * learner knows it; an unseen shape loads here, undropped */
        if (h->has_policy && h->policy.at_terminal && (r->phase == 1 || h->policy.terminal_in_prefill))
            h->cur_terminal = chain_terminal(h->chain, li, r->n_expert, r->n_cols);
        if (h->cur_terminal == CHAIN_UNKNOWN && load_layer(h, r)) return h->rc;
        break;
    }
    case BMOE_NODE_WEIGHTS:
    case BMOE_NODE_WEIGHTS_SOFTMAX:
    case BMOE_NODE_WEIGHTS_NORM:
    case BMOE_NODE_WEIGHTS_SCALED:
        /* 3. the terminal node: the final weights exist; decide, then load the kept slots */
        if (!h->cur_loaded && h->cur_terminal != CHAIN_UNKNOWN && (int)r->node == h->cur_terminal) {
            if (!r->weights) return hfail(h, 1, "%s-%d: no weights at the terminal node", bmoe_node_name(r->node), r->layer);
            int rc = stream_query_residency(h, r->layer, h->resident);
            if (rc) return rc;
            memcpy(h->router_w, r->weights, (size_t)n * sizeof *r->weights);
            h->cur_router_w = 1;
            rc = h->policy.at_terminal(h->policy.self, r, h->resident, h->dropped, &h->c);
            if (rc) return hfail(h, rc, "%s-%d: the drop policy failed (code %d)", bmoe_node_name(r->node), r->layer, rc);
            for (int i = 0; i < n; i++) h->c.experts_dropped += h->dropped[i] ? 1 : 0;
#ifndef BMOE_FAULT_SKIP_DEFERRED_LOAD
            if (load_layer(h, r)) return h->rc;
#endif
            /* (injected fault SKIP_DEFERRED_LOAD: the deferred load never happens) */
        }
        break;
    case BMOE_NODE_EXPERTS:
        /* backstop: a layer deferred to a terminal node that never came (its chain changed shape
         * since it was learned) loads now, undropped */
#ifdef BMOE_FAULT_SKIP_DEFERRED_LOAD
        if (h->cur_terminal != CHAIN_UNKNOWN) h->cur_loaded = 1; /* fault: and no backstop either */
#endif
        if (!h->cur_loaded && load_layer(h, r)) return h->rc;
        if (h->trace) write_trace(h, r);
        break;
    default:
        break;
    }
    return 0;
}

int stream_hook_fn(void *user, bmoe_moe_result *r) {
    bmoe_stream_hook *h = user;
    int rc = hook_node(h, r);
    /* frames freed by this node's evictions and not reused by its loads are closed before the forward
     * pass goes on (expert_stream.h) */
    if (h->st) stream_settle(h->st);
    return rc;
}

/* ---- the expert source --------------------------------------------------------------------------- */

static int hook_view(void *self, int il, int e, bmoe_expert_view *out) {
    bmoe_stream_hook *h = self;
    memset(out, 0, sizeof *out);
    if (il < 0 || il >= h->m->hp.n_layer || e < 0 || e >= h->E) return 1;
    int li = h->li_of[il];
    if (li < 0) return 1;
    /* the reads of this expert (demand, or a speculative one now needed) must have landed; the wait
     * returns at once when none is pending. The memory is not checked: an expert that was not loaded
     * faults when the matmul touches it (the gates' fault builds rely on that). */
    bmoe_io_group *g = NULL;
    int slot = e;
    if (h->cache) {
        g = &h->groups[key_of(h, li, e)];
    } else {
        slot = li == h->shared_layer ? h->shared_of[e] : -1; /* -1: the guard slot, never committed */
        if (slot >= 0) g = &h->groups[slot];
    }
    if (g) {
        char m[1024];
        if (stream_wait(h->st, g, m, sizeof m)) return take_stream_error(h, 4, m);
    }
    stream_view(h->st, li, slot, e, out);
    return 0;
}

bmoe_expert_source stream_hook_source(bmoe_stream_hook *h) {
    bmoe_expert_source s = { .self = h, .view = hook_view };
    return s;
}

/* ---- queries ------------------------------------------------------------------------------------- */

int stream_query_residency(bmoe_stream_hook *h, int il, uint8_t *resident) {
    int li = (il >= 0 && il < h->m->hp.n_layer) ? h->li_of[il] : -1;
    if (li < 0) return hfail(h, 1, "query_residency: layer %d is not streamed", il);
    memset(resident, 0, (size_t)h->E);
    if (!h->cache) return 0;
    for (int e = 0; e < h->E; e++)
        if (wait_group(h, &h->groups[key_of(h, li, e)])) return h->rc;
    for (int e = 0; e < h->E; e++) resident[e] = (uint8_t)cache_contains(h->cache, li, e);
    return 0;
}

int stream_hook_finish(bmoe_stream_hook *h, bmoe_error *err) {
    unpin_layer(h);
    if (h->st) stream_settle(h->st);
    h->cur_li = -1;
    if (h->cache)
        for (size_t key = 0; key < (size_t)h->n_layers * (size_t)h->E; key++) wait_group(h, &h->groups[key]);
    else
        for (int j = 0; j < h->S; j++) wait_group(h, &h->groups[j]);
    char m[1024];
    int rc = trace_close(h->trace, m, sizeof m);
    h->trace = NULL;
    if (rc && !h->rc) take_stream_error(h, rc, m);
    if (h->rc) return err_set(err, h->rc, NULL, "%s", h->msg);
    return 0;
}

void stream_hook_counters(const bmoe_stream_hook *h, bmoe_counters *c) {
    c->experts_dropped += h->c.experts_dropped;
    c->subst_examined += h->c.subst_examined;
    c->subst_changed += h->c.subst_changed;
    c->cache_hits += h->c.cache_hits;
    c->cache_misses += h->c.cache_misses;
    c->flash_bytes += h->c.flash_bytes;
    c->flash_reads += h->c.flash_reads;
    c->prefetch_issued += h->c.prefetch_issued;
    c->prefetch_used += h->c.prefetch_used;
    if (h->st) c->flash_read_bytes += stream_bytes_read(h->st);
    c->weight_routed += h->c.weight_routed;
    c->weight_dropped += h->c.weight_dropped;
}

const char *stream_hook_error(const bmoe_stream_hook *h) { return h && h->rc ? h->msg : ""; }

int stream_hook_warnings(const bmoe_stream_hook *h, const char **out, int cap) {
    int n = 0;
    const char *note = h && h->st ? stream_direct_note(h->st) : NULL;
    if (note && n < cap) out[n++] = note;
    return n;
}

void stream_hook_set_policy(bmoe_stream_hook *h, const bmoe_route_policy *p) {
    h->policy = *p;
    h->has_policy = 1;
}

uint64_t stream_hook_slot_bytes(const bmoe_stream_hook *h, int il) {
    int li = h->st && il >= 0 && il < h->m->hp.n_layer ? h->li_of[il] : -1;
    return li >= 0 ? stream_slot_bytes(h->st, li) : 0;
}

int stream_hook_flash_layers(const bmoe_stream_hook *h, const uint64_t **reads, const uint64_t **bytes) {
    *reads = h->layer_reads;
    *bytes = h->layer_bytes;
    return h->layer_reads ? h->n_layers : 0;
}
uint64_t stream_hook_cache_bytes(const bmoe_stream_hook *h) { return h->cache ? cache_bytes(h->cache) : 0; }
uint64_t stream_hook_evictions(const bmoe_stream_hook *h) { return h->cache ? cache_evictions(h->cache) : 0; }
void stream_hook_frames(const bmoe_stream_hook *h, size_t *created, size_t *in_use, size_t *warm) {
    *created = *in_use = *warm = 0;
    if (h->st) stream_frames(h->st, created, in_use, warm);
}

/* ---- setup --------------------------------------------------------------------------------------- */

int stream_hook_create(bmoe_stream_hook **out, bmoe_model *m, const bmoe_stream_hook_opts *cfg, int top_k,
                       int max_batch, bmoe_error *err) {
    *out = NULL;
    bmoe_stream_hook *h = calloc(1, sizeof *h);
    if (!h) return err_set(err, 1, NULL, "out of memory");
    int rc = 0;
    char msg[1024] = "";
    const char **paths = NULL;
    bmoe_stream_part *parts = NULL;
    h->m = m;
    h->n_layers = m->n_moe_layers;
    h->E = m->hp.n_expert;
    h->k = top_k;
    h->max_batch = max_batch;
    h->cur_li = -1;
    h->cur_terminal = CHAIN_UNKNOWN;
    h->shared_layer = -1;
    if ((rc = make_dense_resident(h, err))) goto fail;
    h->li_of = malloc((size_t)m->hp.n_layer * sizeof *h->li_of);
    if (!h->li_of) { rc = err_set(err, 1, NULL, "out of memory"); goto fail; }
    for (int il = 0; il < m->hp.n_layer; il++) h->li_of[il] = -1;
    for (int i = 0; i < m->n_moe_layers; i++) h->li_of[m->moe_layers[i]] = i;
    if (h->n_layers == 0) { *out = h; return 0; } /* nothing to stream */
    if (h->E < 1 || top_k < 1 || top_k > h->E || max_batch < 1) { rc = err_set(err, 1, NULL, "internal: bad streaming sizes"); goto fail; }

    /* the expert layout, per streamed layer and part */
    parts = calloc((size_t)h->n_layers * BMOE_EXP_NPARTS, sizeof *parts);
    paths = calloc(m->g->n_shards, sizeof *paths);
    h->eb = calloc((size_t)h->n_layers, sizeof *h->eb);
    h->layer_reads = calloc((size_t)h->n_layers, sizeof *h->layer_reads);
    h->layer_bytes = calloc((size_t)h->n_layers, sizeof *h->layer_bytes);
    if (!parts || !paths || !h->eb || !h->layer_reads || !h->layer_bytes) { rc = err_set(err, 1, NULL, "out of memory"); goto fail; }
    for (int i = 0; i < h->n_layers; i++) {
        const bmoe_layer *ly = &m->layers[m->moe_layers[i]];
        h->eb[i] = ly->expert_bytes;
        for (int p = 0; p < BMOE_EXP_NPARTS; p++) {
            const bmoe_expert_part *ep = &ly->exp_part[p];
            bmoe_stream_part *sp = &parts[(size_t)i * BMOE_EXP_NPARTS + (size_t)p];
            sp->present = ep->present;
            sp->shard = ep->shard;
            sp->offset = ep->offset;
            sp->stride = ep->stride;
            sp->bytes = ep->bytes;
            sp->name = ep->name;
        }
    }
    for (uint32_t s = 0; s < m->g->n_shards; s++) paths[s] = m->g->shards[s].path;
    long long shared = 0;
    if (cfg->cache_mb == 0) {
        shared = (long long)max_batch * top_k;
        if (shared > h->E) shared = h->E;
    }
    bmoe_stream_opts so = {
        .n_layers = h->n_layers, .n_expert = h->E, .parts = parts, .n_shards = m->g->n_shards,
        .shard_paths = paths, .shared_slots = (int)shared, .odirect = cfg->odirect, .io_lanes = cfg->io_lanes,
        .frame_pool_bytes = cfg->cache_mb > 0 ? (uint64_t)cfg->cache_mb * MIB : 0,
    };
    rc = stream_open(&so, &h->st, msg, sizeof msg);
    if (rc) { err_set(err, rc, NULL, "%s", msg); goto fail; }
    free(parts);
    parts = NULL;
    free(paths);
    paths = NULL;

    size_t E = (size_t)h->E, keys = (size_t)h->n_layers * E, rows = (size_t)max_batch * (size_t)top_k;
    if (cfg->cache_mb > 0) {
        /* every layer's expert must fit the budget alone: a layer's slot is what one of its experts
         * costs (its parts' types and widths), so the largest slot decides */
        uint64_t budget = (uint64_t)cfg->cache_mb * MIB, slot = 0;
        uint64_t *cost = malloc((size_t)h->n_layers * sizeof *cost);
        if (!cost) { rc = err_set(err, 1, NULL, "out of memory"); goto fail; }
        int big = 0;
        for (int i = 0; i < h->n_layers; i++) {
            cost[i] = stream_slot_bytes(h->st, i);
            if (cost[i] > slot) { slot = cost[i]; big = i; }
        }
        if (budget < slot) {
            free(cost);
            rc = err_set(err, 2, "config", "--cache-mb: %d MiB is smaller than one expert of this model (%llu bytes "
                         "per expert slot of layer %d, the largest); use --cache-mb %llu or more, or 0 for no cache",
                         cfg->cache_mb, (unsigned long long)slot, m->moe_layers[big],
                         (unsigned long long)((slot + MIB - 1) / MIB));
            goto fail;
        }
        h->cache = cache_create(h->n_layers, h->E, budget, cost);
        free(cost);
        h->groups = calloc(keys, sizeof *h->groups);
        if (!h->cache || !h->groups) { rc = err_set(err, 1, NULL, "out of memory"); goto fail; }
        if (cfg->prefetch > 0) {
            h->pf = prefetch_create(h->n_layers, h->E, top_k, cfg->prefetch);
            h->prefetch_sync = cfg->prefetch_sync;
            size_t plan = (size_t)h->n_layers * (size_t)top_k;
            h->plan_l = malloc(plan * sizeof *h->plan_l);
            h->plan_e = malloc(plan * sizeof *h->plan_e);
            h->spec_keys = malloc(plan * sizeof *h->spec_keys);
            if (!h->pf || !h->plan_l || !h->plan_e || !h->spec_keys) { rc = err_set(err, 1, NULL, "out of memory"); goto fail; }
        }
    } else {
        h->S = (int)shared;
        h->groups = calloc((size_t)h->S, sizeof *h->groups);
        if (!h->groups) { rc = err_set(err, 1, NULL, "out of memory"); goto fail; }
    }
    h->prefetched = calloc(keys, 1);
    h->shared_of = malloc(E * sizeof *h->shared_of);
    h->pinned = malloc(E * sizeof *h->pinned);
    h->uniq = malloc(E * sizeof *h->uniq);
    h->need_read = calloc(E, 1);
    h->in_col = calloc(E, 1);
    h->res0 = calloc(E, 1);
    h->resident = calloc(E, 1);
    h->seen = calloc(E, 1);
    h->charged = calloc(E, 1);
    h->chain = chain_new(h->n_layers);
    h->pre_ids = calloc(rows, sizeof *h->pre_ids);
    h->router_ids = calloc(rows, sizeof *h->router_ids);
    h->router_w = calloc(rows, sizeof *h->router_w);
    h->router_scores = calloc((size_t)max_batch * E, sizeof *h->router_scores);
    h->dropped = calloc(rows, 1);
    h->changed = calloc(rows, 1);
    h->row_res = calloc(rows, 1);
    h->row_bytes = calloc(rows, sizeof *h->row_bytes);
    if (!h->prefetched || !h->shared_of || !h->pinned || !h->uniq || !h->need_read || !h->in_col || !h->res0 || !h->resident || !h->seen ||
        !h->charged || !h->chain || !h->pre_ids || !h->router_ids || !h->router_w || !h->router_scores || !h->dropped || !h->changed || !h->row_res || !h->row_bytes) {
        rc = err_set(err, 1, NULL, "out of memory");
        goto fail;
    }
    for (size_t e = 0; e < E; e++) h->shared_of[e] = -1;

    /* last: the trace file (opening a FIFO blocks until a reader comes, and nothing is read before) */
    if (cfg->route_trace) {
        uint64_t *slots = malloc((size_t)h->n_layers * sizeof *slots);
        if (!slots) { rc = err_set(err, 1, NULL, "out of memory"); goto fail; }
        for (int i = 0; i < h->n_layers; i++) slots[i] = stream_slot_bytes(h->st, i);
        bmoe_trace_geometry geo = { .slot_bytes = slots, .shared_slot_bytes = h->S ? stream_slot_max(h->st) : 0,
                                    .page_bytes = stream_page_bytes(h->st) };
        rc = trace_open(&h->trace, cfg->route_trace, m, top_k, geo, msg, sizeof msg);
        free(slots);
        if (rc) { err_set(err, rc, NULL, "%s", msg); goto fail; }
    }
    *out = h;
    return 0;
fail:
    free(parts);
    free(paths);
    stream_hook_destroy(h);
    return rc ? rc : 1;
}

void stream_hook_destroy(bmoe_stream_hook *h) {
    if (!h) return;
    stream_close(h->st); /* joins the lanes: no read lands after this */
    cache_destroy(h->cache);
    prefetch_destroy(h->pf);
    if (h->trace) {
        char m[256];
        trace_close(h->trace, m, sizeof m);
    }
    free(h->li_of); free(h->eb); free(h->layer_reads); free(h->layer_bytes); free(h->shared_of); free(h->groups); free(h->prefetched); free(h->spec_keys);
    free(h->plan_l); free(h->plan_e); free(h->pinned); free(h->pre_ids); free(h->router_ids); free(h->router_w); free(h->router_scores); free(h->dropped); free(h->changed);
    free(h->row_res); free(h->row_bytes); free(h->res0); free(h->resident); free(h->seen); free(h->charged);
    free(h->uniq); free(h->need_read); free(h->in_col);
    chain_free(h->chain);
    free(h->dense);
    free(h);
}
