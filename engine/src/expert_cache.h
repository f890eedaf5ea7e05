/* The expert cache: an LRU over (layer, expert) with a byte budget. Bookkeeping only: it decides what
 * is resident and what to evict; the caller (stream_hook.c) reads and releases the memory.
 *
 * - An entry of layer l costs entry_bytes[l] (one committed slot of that layer, expert_stream.h: layers
 *   whose experts differ in type or width cost differently); the budget is in bytes.
 * - An entry can be pinned (counted): a pinned entry is never evicted. The hook pins the experts of
 *   the layer being computed, so when one layer needs more than the budget holds, the cache goes
 *   over budget until the pins are dropped (cache_trim then brings it back).
 * - Victims are taken from the least-recently-used end, skipping pinned entries. Every eviction is
 *   reported through the callback before cache_insert / cache_trim returns.
 * O(1) lookups and touches (arrays indexed by layer * n_expert + e, an intrusive doubly-linked list). */
#ifndef BMOE_EXPERT_CACHE_H
#define BMOE_EXPERT_CACHE_H

#include <stdint.h>

typedef struct bmoe_cache bmoe_cache;

/* Called for each evicted entry, in eviction order. */
typedef void (*bmoe_evict_fn)(void *user, int layer, int e);

/* entry_bytes [n_layers] is copied. NULL when out of memory or a size is not positive. budget may be
 * anything >= 0. */
bmoe_cache *cache_create(int n_layers, int n_expert, uint64_t budget, const uint64_t *entry_bytes);
void cache_destroy(bmoe_cache *c);

int cache_contains(const bmoe_cache *c, int layer, int e);
/* A hit makes the entry the most recently used and returns 1; a miss returns 0 and changes nothing. */
int cache_touch(bmoe_cache *c, int layer, int e);
/* Inserts a non-resident (layer, e) as most recently used, evicting LRU unpinned entries until it
 * fits the budget. If pinned entries alone fill the budget: with allow_over the entry goes in anyway
 * (over budget, returns 1); without it nothing is inserted or evicted (returns 0). Already resident:
 * behaves as cache_touch. */
int cache_insert(bmoe_cache *c, int layer, int e, int allow_over, bmoe_evict_fn evict, void *user);
void cache_pin(bmoe_cache *c, int layer, int e);
void cache_unpin(bmoe_cache *c, int layer, int e);
int cache_pinned(const bmoe_cache *c, int layer, int e);
/* Evicts LRU unpinned entries until the cache is within budget. */
void cache_trim(bmoe_cache *c, bmoe_evict_fn evict, void *user);
/* Removes an entry without calling the callback (the caller has already released it). */
void cache_remove(bmoe_cache *c, int layer, int e);

uint64_t cache_bytes(const bmoe_cache *c);   /* the sum of the resident entries' costs */
uint64_t cache_budget(const bmoe_cache *c);
int cache_count(const bmoe_cache *c);
uint64_t cache_evictions(const bmoe_cache *c);
/* Fills keys[0..n) with layer * n_expert + e from most to least recently used; returns n. */
int cache_order(const bmoe_cache *c, int *keys, int cap);

#endif
