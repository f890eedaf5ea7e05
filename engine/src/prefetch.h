/* Temporal prefetch planning (--prefetch L): when layer li of a token has been routed, the experts
 * the previous token routed at the next L streamed layers are good guesses for what this token will
 * route there. This module only remembers routings and plans; stream_hook.c issues the reads on the
 * speculative priority of the I/O lanes and the cache decides what stays.
 *
 * "The next L layers" run cyclically: past the last streamed layer they are the first layers of the
 * next token, whose previous token is the current one, so the routing recorded there is already the
 * current token's. Pure: no I/O, no clock, no globals. */
#ifndef BMOE_PREFETCH_H
#define BMOE_PREFETCH_H

#include <stdint.h>

typedef struct bmoe_prefetch bmoe_prefetch;

/* NULL when out of memory or a size is not positive. depth is capped at n_layers. */
bmoe_prefetch *prefetch_create(int n_layers, int n_expert, int top_k, int depth);
void prefetch_destroy(bmoe_prefetch *p);

/* The routing of the last token of a batch at streamed layer li: ids[0..k) in rank order. Ids out of
 * range are ignored. */
void prefetch_record(bmoe_prefetch *p, int li, const int32_t *ids, int k);

/* After layer li is routed: the (layer, expert) guesses for the next `depth` layers, nearest layer
 * first and in rank order within a layer, without duplicates; at most cap; returns the count.
 * Layers with nothing recorded yet contribute nothing. */
int prefetch_plan(const bmoe_prefetch *p, int li, int *layers, int *experts, int cap);

int prefetch_depth(const bmoe_prefetch *p);

#endif
