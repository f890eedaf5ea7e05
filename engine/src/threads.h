/* A persistent pthread pool with one operation: a parallel for over [0, n) with a static partition.
 *
 * Thread i of N always gets the contiguous range [n*i/N, n*(i+1)/N). Work items must be independent
 * (each output element computed by exactly one thread, with the same code whatever N is), which is
 * what makes results identical for any thread count. The calling thread is thread 0. */
#ifndef BMOE_THREADS_H
#define BMOE_THREADS_H

typedef struct bmoe_pool bmoe_pool;

/* fn(ctx, i0, i1, tid) processes items [i0, i1); tid in [0, n_threads) indexes per-thread scratch. */
typedef void (*bmoe_pool_fn)(void *ctx, int i0, int i1, int tid);

/* NULL on failure (out of memory or thread creation refused). n_threads >= 1. */
bmoe_pool *pool_create(int n_threads);
int pool_threads(const bmoe_pool *p);
/* Runs fn over [0, n) and returns when every thread has finished. */
void pool_run(bmoe_pool *p, int n, bmoe_pool_fn fn, void *ctx);
void pool_destroy(bmoe_pool *p);

#endif
