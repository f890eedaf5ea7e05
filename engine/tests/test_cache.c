/* The expert cache (LRU with a byte budget and pins) and the prefetch planner: exact behaviour on
 * small cases, then a long random run against a naive reference implementation. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "expert_cache.h"
#include "prefetch.h"

typedef struct { int n, layer[64], e[64]; } evlog;

static void log_evict(void *user, int layer, int e) {
    evlog *l = user;
    if (l->n < 64) { l->layer[l->n] = layer; l->e[l->n] = e; }
    l->n++;
}

static void test_lru_order(void) {
    evlog l = {0};
    static const uint64_t eb100[2] = { 100, 100 };
    bmoe_cache *c = cache_create(2, 4, 3 * 100, eb100); /* 3 entries fit */
    CHECK(c != NULL);
    CHECK(cache_insert(c, 0, 0, 1, log_evict, &l));
    CHECK(cache_insert(c, 0, 1, 1, log_evict, &l));
    CHECK(cache_insert(c, 1, 0, 1, log_evict, &l));
    CHECK(l.n == 0 && cache_count(c) == 3 && cache_bytes(c) == 300);
    CHECK(cache_touch(c, 0, 0));        /* (0,0) becomes the most recent; (0,1) is now the LRU */
    CHECK(!cache_touch(c, 1, 3));       /* a miss changes nothing */
    CHECK(cache_insert(c, 1, 1, 1, log_evict, &l));
    CHECK(l.n == 1 && l.layer[0] == 0 && l.e[0] == 1);
    CHECK(!cache_contains(c, 0, 1) && cache_contains(c, 0, 0) && cache_contains(c, 1, 1));
    int keys[8];
    int n = cache_order(c, keys, 8);
    CHECK(n == 3 && keys[0] == 1 * 4 + 1 && keys[1] == 0 && keys[2] == 1 * 4 + 0);
    /* inserting what is resident is a touch, never a second entry */
    CHECK(cache_insert(c, 1, 0, 1, log_evict, &l));
    CHECK(cache_count(c) == 3 && l.n == 1);
    n = cache_order(c, keys, 8);
    CHECK(keys[0] == 1 * 4 + 0);
    CHECK(cache_evictions(c) == 1);
    /* out-of-range keys are refused without touching anything */
    CHECK(!cache_insert(c, 2, 0, 1, log_evict, &l) && !cache_insert(c, 0, 4, 1, log_evict, &l));
    CHECK(!cache_contains(c, -1, 0) && cache_count(c) == 3);
    cache_destroy(c);
}

static void test_pins(void) {
    evlog l = {0};
    static const uint64_t eb10[1] = { 10 };
    bmoe_cache *c = cache_create(1, 8, 2 * 10, eb10); /* 2 entries fit */
    cache_insert(c, 0, 0, 1, log_evict, &l);
    cache_pin(c, 0, 0);
    cache_insert(c, 0, 1, 1, log_evict, &l);
    cache_pin(c, 0, 1);
    /* both pinned: a demand insert goes over budget, a speculative one is refused and evicts nothing */
    CHECK(!cache_insert(c, 0, 2, 0, log_evict, &l));
    CHECK(!cache_contains(c, 0, 2) && l.n == 0 && cache_count(c) == 2);
    CHECK(cache_insert(c, 0, 2, 1, log_evict, &l));
    CHECK(cache_count(c) == 3 && cache_bytes(c) == 30 && l.n == 0);
    cache_pin(c, 0, 2);
    /* pins are counted */
    cache_pin(c, 0, 0);
    cache_unpin(c, 0, 0);
    CHECK(cache_pinned(c, 0, 0));
    /* trimming evicts only unpinned entries, least recent first */
    cache_unpin(c, 0, 0);
    cache_unpin(c, 0, 1);
    cache_trim(c, log_evict, &l);
    CHECK(l.n == 1 && l.e[0] == 0);
    CHECK(cache_bytes(c) == 20 && cache_contains(c, 0, 1) && cache_contains(c, 0, 2));
    /* a speculative insert that fits by evicting an unpinned entry does so */
    CHECK(cache_insert(c, 0, 3, 0, log_evict, &l));
    CHECK(l.n == 2 && l.e[1] == 1 && cache_contains(c, 0, 3) && cache_contains(c, 0, 2));
    cache_unpin(c, 0, 2);
    cache_unpin(c, 0, 2); /* unpinning below zero is ignored */
    CHECK(!cache_pinned(c, 0, 2));
    /* a budget below one entry: demand still gets its expert (the hook refuses such budgets first) */
    bmoe_cache *tiny = cache_create(1, 2, 5, eb10);
    CHECK(!cache_insert(tiny, 0, 0, 0, NULL, NULL));
    CHECK(cache_insert(tiny, 0, 0, 1, NULL, NULL) && cache_count(tiny) == 1);
    CHECK(cache_insert(tiny, 0, 1, 1, NULL, NULL) && cache_count(tiny) == 1 && cache_contains(tiny, 0, 1));
    cache_remove(tiny, 0, 1);
    CHECK(cache_count(tiny) == 0 && cache_bytes(tiny) == 0);
    cache_destroy(tiny);
    cache_destroy(c);
    static const uint64_t eb0[2] = { 10, 0 };
    CHECK(cache_create(0, 4, 10, eb10) == NULL && cache_create(2, 4, 10, eb0) == NULL && cache_create(1, 4, 10, NULL) == NULL);
}

/* Layers whose experts cost differently (a Q6_K down projection in one layer, Q4_K in the other): the
 * budget is in bytes, each entry is charged its own layer's cost, and an insert evicts until its own
 * cost fits. */
static void test_mixed_costs(void) {
    evlog l = {0};
    static const uint64_t cost[2] = { 100, 250 };
    bmoe_cache *c = cache_create(2, 4, 400, cost);
    CHECK(c != NULL);
    CHECK(cache_insert(c, 0, 0, 1, log_evict, &l) && cache_insert(c, 0, 1, 1, log_evict, &l));
    CHECK(cache_insert(c, 0, 2, 1, log_evict, &l));
    CHECK(l.n == 0 && cache_bytes(c) == 300 && cache_count(c) == 3);
    /* a layer-1 entry (250) needs 150 bytes freed: the two least recent layer-0 entries go */
    CHECK(cache_insert(c, 1, 0, 1, log_evict, &l));
    CHECK(l.n == 2 && l.layer[0] == 0 && l.e[0] == 0 && l.layer[1] == 0 && l.e[1] == 1);
    CHECK(cache_bytes(c) == 350 && cache_count(c) == 2);
    /* a layer-0 entry (100): 350 + 100 > 400, so the least recent entry, (0,2), goes */
    CHECK(cache_insert(c, 0, 3, 1, log_evict, &l));
    CHECK(l.n == 3 && l.layer[2] == 0 && l.e[2] == 2 && cache_bytes(c) == 350);
    /* speculative: a second layer-1 entry would need the pinned one evicted: refused, nothing changes */
    cache_pin(c, 1, 0);
    cache_pin(c, 0, 3);
    CHECK(!cache_insert(c, 1, 1, 0, log_evict, &l) && l.n == 3 && cache_bytes(c) == 350);
    cache_unpin(c, 0, 3);
    /* now evicting the unpinned 100 makes room for 250? 350 - 100 + 250 = 500 > 400: still refused */
    CHECK(!cache_insert(c, 1, 1, 0, log_evict, &l) && l.n == 3);
    /* a layer-0 entry fits by evicting (0,3): 350 - 100 + 100 <= 400 */
    CHECK(cache_insert(c, 0, 2, 0, log_evict, &l) && l.n == 4 && l.e[3] == 3 && cache_bytes(c) == 350);
    cache_destroy(c);
}

/* ---- a naive reference: a recency stamp per key, linear scans ---- */
typedef struct { int n; int in[48]; int pins[48]; long stamp[48]; long clock; uint64_t bytes, budget, lb[6]; } ref_cache;

/* the cost of key k (8 experts a layer) */
static uint64_t ref_cost(const ref_cache *r, int k) { return r->lb[k / 8]; }

static int ref_victim(const ref_cache *r) {
    int v = -1;
    for (int k = 0; k < r->n; k++)
        if (r->in[k] && r->pins[k] == 0 && (v < 0 || r->stamp[k] < r->stamp[v])) v = k;
    return v;
}

static int ref_insert(ref_cache *r, int k, int allow_over, int *ev, int *nev) {
    if (r->in[k]) { r->stamp[k] = ++r->clock; return 1; }
    uint64_t need = ref_cost(r, k);
    if (!allow_over && r->bytes + need > r->budget) {
        uint64_t freeb = 0;
        for (int j = 0; j < r->n; j++)
            if (r->in[j] && !r->pins[j]) freeb += ref_cost(r, j);
        if (need > r->budget || r->bytes - freeb + need > r->budget) return 0;
    }
    while (r->bytes > 0 && r->bytes + need > r->budget) {
        int v = ref_victim(r);
        if (v < 0) break;
        r->in[v] = 0;
        r->bytes -= ref_cost(r, v);
        ev[(*nev)++] = v;
    }
    r->in[k] = 1;
    r->bytes += need;
    r->stamp[k] = ++r->clock;
    return 1;
}

typedef struct { int n; int keys[4096]; } keylog;
static void log_key(void *user, int layer, int e) {
    keylog *l = user;
    if (l->n < 4096) l->keys[l->n++] = layer * 8 + e;
}

static void test_against_reference(void) {
    const int L = 6, E = 8;
    /* every layer alike, and layers of three different costs (a mixed-type model) */
    static const uint64_t costs[2][6] = { { 7, 7, 7, 7, 7, 7 }, { 7, 11, 7, 13, 7, 11 } };
    for (int mixed = 0; mixed <= 1; mixed++)
    for (int budget_entries = 1; budget_entries <= 20; budget_entries += 3) {
        bmoe_cache *c = cache_create(L, E, (uint64_t)budget_entries * 13, costs[mixed]);
        ref_cache r;
        memset(&r, 0, sizeof r);
        r.n = L * E;
        r.budget = (uint64_t)budget_entries * 13;
        memcpy(r.lb, costs[mixed], sizeof r.lb);
        uint64_t s = 99 + (uint64_t)budget_entries;
        int agree = 1;
        for (int step = 0; step < 3000 && agree; step++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            int op = (int)(s >> 60) % 5, k = (int)((s >> 33) % (uint64_t)(L * E));
            int layer = k / E, e = k % E;
            keylog got = {0};
            int want_ev[64], nwant = 0;
            switch (op) {
            case 0: case 1: {
                int allow = op == 0;
                int a = cache_insert(c, layer, e, allow, log_key, &got);
                int b = ref_insert(&r, k, allow, want_ev, &nwant);
                agree &= a == b;
                break;
            }
            case 2:
                agree &= cache_touch(c, layer, e) == r.in[k];
                if (r.in[k]) r.stamp[k] = ++r.clock;
                break;
            case 3:
                if (r.pins[k] < 3) { cache_pin(c, layer, e); r.pins[k]++; }
                break;
            default:
                if (r.pins[k] > 0) { cache_unpin(c, layer, e); r.pins[k]--; }
                if ((s >> 20) % 4 == 0) {
                    cache_trim(c, log_key, &got);
                    while (r.bytes > r.budget) {
                        int v = ref_victim(&r);
                        if (v < 0) break;
                        r.in[v] = 0;
                        r.bytes -= ref_cost(&r, v);
                        want_ev[nwant++] = v;
                    }
                }
            }
            agree &= got.n == nwant;
            for (int i = 0; i < nwant && i < got.n; i++) agree &= got.keys[i] == want_ev[i];
            agree &= cache_bytes(c) == r.bytes;
            for (int j = 0; j < L * E; j++) {
                agree &= cache_contains(c, j / E, j % E) == r.in[j];
                agree &= cache_pinned(c, j / E, j % E) == (r.pins[j] > 0);
                /* a pinned entry is never the one that went */
            }
            for (int i = 0; i < got.n; i++) agree &= r.pins[got.keys[i]] == 0;
        }
        CHECK(agree);
        cache_destroy(c);
    }
}

static void test_prefetch_plan(void) {
    bmoe_prefetch *p = prefetch_create(4, 8, 2, 2);
    CHECK(p != NULL && prefetch_depth(p) == 2);
    int ls[16], es[16];
    CHECK(prefetch_plan(p, 0, ls, es, 16) == 0); /* nothing recorded yet */
    int32_t r0[2] = {1, 2}, r1[2] = {3, 4}, r2[2] = {5, 5}, r3[2] = {7, 99};
    prefetch_record(p, 0, r0, 2);
    prefetch_record(p, 1, r1, 2);
    prefetch_record(p, 2, r2, 2);
    prefetch_record(p, 3, r3, 2);
    int n = prefetch_plan(p, 0, ls, es, 16); /* layers 1, 2: nearest first, rank order, no duplicate */
    CHECK(n == 3 && ls[0] == 1 && es[0] == 3 && ls[1] == 1 && es[1] == 4 && ls[2] == 2 && es[2] == 5);
    n = prefetch_plan(p, 3, ls, es, 16);     /* wraps to the next token's first layers; 99 was ignored */
    CHECK(n == 4 && ls[0] == 0 && es[0] == 1 && ls[2] == 1 && es[2] == 3);
    n = prefetch_plan(p, 2, ls, es, 2);      /* capped */
    CHECK(n == 2 && ls[0] == 3 && es[0] == 7 && ls[1] == 0 && es[1] == 1);
    CHECK(prefetch_plan(p, 4, ls, es, 16) == 0 && prefetch_plan(p, -1, ls, es, 16) == 0);
    prefetch_destroy(p);
    bmoe_prefetch *deep = prefetch_create(3, 4, 1, 64); /* depth capped at the layer count */
    CHECK(prefetch_depth(deep) == 3);
    prefetch_destroy(deep);
    CHECK(prefetch_create(0, 4, 1, 1) == NULL);
}

int main(void) {
    test_lru_order();
    test_pins();
    test_mixed_costs();
    test_against_reference();
    test_prefetch_plan();
    return check_report("test_cache");
}
