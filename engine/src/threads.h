/* A persistent pthread pool with one operation: a parallel for over [0, n), split into chunks.
 *
 * The threads claim contiguous chunks of about n / (4 N) items from a shared counter until none is
 * left, so which thread computes an item varies from run to run. Work items must therefore be
 * independent (each output element computed by exactly one call, with the same code and inputs
 * whichever thread runs it and whatever N is), which is what makes results identical for any thread
 * count. The calling thread is thread 0. */
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
/* Jobs this pool has handed to its workers so far: each is one barrier (every thread waits for the
 * slowest). A job run on the caller alone (one thread, or n <= 0) is not counted. Deterministic for a
 * given model, prompt and thread count, so it measures a change to the work split whatever the load. */
unsigned long pool_jobs(const bmoe_pool *p);
void pool_destroy(bmoe_pool *p);

#endif
