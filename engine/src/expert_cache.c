/* LRU expert cache bookkeeping (see expert_cache.h). */
#include "expert_cache.h"

#include <stdlib.h>
#include <string.h>

struct bmoe_cache {
    int n_layers, n_expert, n_keys;
    uint64_t budget, bytes, evictions;
    uint64_t *layer_bytes;   /* [n_layers] what an entry of the layer costs */
    int count;
    int head, tail;          /* most / least recently used key, -1 when empty */
    int *prev, *next;        /* towards head / towards tail */
    uint8_t *in;
    int *pins;
};

bmoe_cache *cache_create(int n_layers, int n_expert, uint64_t budget, const uint64_t *entry_bytes) {
    if (n_layers < 1 || n_expert < 1 || !entry_bytes || (long long)n_layers * n_expert > (1 << 30)) return NULL;
    for (int l = 0; l < n_layers; l++)
        if (entry_bytes[l] == 0) return NULL;
    bmoe_cache *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->n_layers = n_layers;
    c->n_expert = n_expert;
    c->n_keys = n_layers * n_expert;
    c->budget = budget;
    c->layer_bytes = malloc((size_t)n_layers * sizeof *c->layer_bytes);
    if (c->layer_bytes) memcpy(c->layer_bytes, entry_bytes, (size_t)n_layers * sizeof *c->layer_bytes);
    c->head = c->tail = -1;
    c->prev = malloc((size_t)c->n_keys * sizeof *c->prev);
    c->next = malloc((size_t)c->n_keys * sizeof *c->next);
    c->in = calloc((size_t)c->n_keys, 1);
    c->pins = calloc((size_t)c->n_keys, sizeof *c->pins);
    if (!c->layer_bytes || !c->prev || !c->next || !c->in || !c->pins) {
        cache_destroy(c);
        return NULL;
    }
    return c;
}

void cache_destroy(bmoe_cache *c) {
    if (!c) return;
    free(c->prev);
    free(c->next);
    free(c->in);
    free(c->pins);
    free(c->layer_bytes);
    free(c);
}

static int key(const bmoe_cache *c, int layer, int e) {
    if (layer < 0 || layer >= c->n_layers || e < 0 || e >= c->n_expert) return -1;
    return layer * c->n_expert + e;
}

static uint64_t cost(const bmoe_cache *c, int k) { return c->layer_bytes[k / c->n_expert]; }

static void unlink_key(bmoe_cache *c, int k) {
    int p = c->prev[k], n = c->next[k];
    if (p >= 0) c->next[p] = n;
    else c->head = n;
    if (n >= 0) c->prev[n] = p;
    else c->tail = p;
}

static void push_head(bmoe_cache *c, int k) {
    c->prev[k] = -1;
    c->next[k] = c->head;
    if (c->head >= 0) c->prev[c->head] = k;
    c->head = k;
    if (c->tail < 0) c->tail = k;
}

int cache_contains(const bmoe_cache *c, int layer, int e) {
    int k = key(c, layer, e);
    return k >= 0 && c->in[k];
}

int cache_touch(bmoe_cache *c, int layer, int e) {
    int k = key(c, layer, e);
    if (k < 0 || !c->in[k]) return 0;
#ifdef BMOE_FAULT_LRU_NO_REFRESH
    return 1; /* fault: a hit is not made most recent, so the LRU evicts by insertion order */
#endif
    if (c->head != k) {
        unlink_key(c, k);
        push_head(c, k);
    }
    return 1;
}

static void drop(bmoe_cache *c, int k) {
    unlink_key(c, k);
    c->in[k] = 0;
    c->count--;
    c->bytes -= cost(c, k);
}

/* The next victim: the least recently used unpinned entry, or -1. */
static int victim(const bmoe_cache *c) {
#ifdef BMOE_FAULT_EVICT_MRU
    /* fault: the most recently used unpinned entry goes first (MRU, not LRU) */
    for (int k = c->head; k >= 0; k = c->next[k])
        if (c->pins[k] == 0) return k;
    return -1;
#endif
#ifdef BMOE_FAULT_EVICT_IN_USE
    /* injected fault: victims come from the wrong end of the list and pins are ignored, so the
     * experts just loaded for the running layer are released before its matmuls read them */
    return c->head;
#else
    for (int k = c->tail; k >= 0; k = c->prev[k])
        if (c->pins[k] == 0) return k;
    return -1;
#endif
}

static int evictable_bytes(const bmoe_cache *c, uint64_t *out) {
    uint64_t b = 0;
    for (int k = c->tail; k >= 0; k = c->prev[k])
        if (c->pins[k] == 0) b += cost(c, k);
    *out = b;
    return 0;
}

static void evict_one(bmoe_cache *c, int k, bmoe_evict_fn evict, void *user) {
    drop(c, k);
    c->evictions++;
    if (evict) evict(user, k / c->n_expert, k % c->n_expert);
}

int cache_insert(bmoe_cache *c, int layer, int e, int allow_over, bmoe_evict_fn evict, void *user) {
    int k = key(c, layer, e);
    if (k < 0) return 0;
    if (c->in[k]) return cache_touch(c, layer, e);
    uint64_t need = cost(c, k);
    if (!allow_over && c->bytes + need > c->budget) {
        /* only insert when evicting unpinned entries makes it fit; otherwise change nothing */
        uint64_t free_b;
        evictable_bytes(c, &free_b);
        if (need > c->budget || c->bytes - free_b + need > c->budget) return 0;
    }
#ifdef BMOE_FAULT_CACHE_BUDGET_OFF_BY_ONE
    while (c->count > 0 && c->bytes > c->budget) { /* fault: the cache keeps one slot more than its budget */
#else
    while (c->count > 0 && c->bytes + need > c->budget) {
#endif
        int v = victim(c);
        if (v < 0) break;
        evict_one(c, v, evict, user);
    }
    c->in[k] = 1;
    c->count++;
    c->bytes += need;
    push_head(c, k);
    return 1;
}

void cache_pin(bmoe_cache *c, int layer, int e) {
    int k = key(c, layer, e);
    if (k >= 0) c->pins[k]++;
}

void cache_unpin(bmoe_cache *c, int layer, int e) {
    int k = key(c, layer, e);
    if (k >= 0 && c->pins[k] > 0) c->pins[k]--;
}

int cache_pinned(const bmoe_cache *c, int layer, int e) {
    int k = key(c, layer, e);
    return k >= 0 && c->pins[k] > 0;
}

void cache_trim(bmoe_cache *c, bmoe_evict_fn evict, void *user) {
    while (c->bytes > c->budget) {
        int v = -1;
        for (int k = c->tail; k >= 0; k = c->prev[k])
            if (c->pins[k] == 0) { v = k; break; }
        if (v < 0) break;
        evict_one(c, v, evict, user);
    }
}

void cache_remove(bmoe_cache *c, int layer, int e) {
    int k = key(c, layer, e);
    if (k >= 0 && c->in[k]) drop(c, k);
}

uint64_t cache_bytes(const bmoe_cache *c) { return c->bytes; }
uint64_t cache_budget(const bmoe_cache *c) { return c->budget; }
int cache_count(const bmoe_cache *c) { return c->count; }
uint64_t cache_evictions(const bmoe_cache *c) { return c->evictions; }

int cache_order(const bmoe_cache *c, int *keys, int cap) {
    int n = 0;
    for (int k = c->head; k >= 0 && n < cap; k = c->next[k]) keys[n++] = k;
    return n;
}
