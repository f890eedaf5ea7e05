/* Persistent pthread pool. A job is published by bumping a generation counter; workers and the
 * caller first spin briefly on atomics (a decode token issues a few hundred short jobs, and a
 * futex round trip per job costs more than the job), then fall back to sleeping on a condition
 * variable so idle pools cost nothing. No globals: everything lives in the pool object. */
#include "threads.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

/* Spin iterations before sleeping: a few microseconds, the gap between two matmuls of a token. */
#define POOL_SPIN 20000
/* Chunks per thread and job (a job is split into about n_threads * POOL_CHUNKS chunks). */
#define POOL_CHUNKS 4

struct worker { bmoe_pool *pool; int tid; pthread_t th; };

struct bmoe_pool {
    int n_threads;
    struct worker *workers; /* n_threads - 1 of them; the caller is thread 0 */
    int n_started;
    pthread_mutex_t mu;
    pthread_cond_t wake, done;
    atomic_ulong generation;
    atomic_int pending;     /* workers still busy with the current generation */
    atomic_int quit;
    /* the current job, written before generation is bumped */
    bmoe_pool_fn fn;
    void *ctx;
    int n, chunk;
    atomic_int next;        /* the first item not yet claimed */
    unsigned long jobs;     /* jobs published to the workers (each ends in a barrier); caller-only */
};

/* Claims chunks until none is left: a thread the OS delays leaves its chunks to the others. */
static void run_share(bmoe_pool *p, int tid) {
    for (;;) {
        int i0 = atomic_fetch_add(&p->next, p->chunk);
        if (i0 >= p->n) break;
        int i1 = p->n - i0 > p->chunk ? i0 + p->chunk : p->n;
        p->fn(p->ctx, i0, i1, tid);
    }
}

static void *worker_main(void *arg) {
    struct worker *w = arg;
    bmoe_pool *p = w->pool;
    unsigned long seen = 0;
    for (;;) {
        for (int spin = 0; spin < POOL_SPIN && atomic_load(&p->generation) == seen && !atomic_load(&p->quit); spin++) {
        }
        if (atomic_load(&p->generation) == seen && !atomic_load(&p->quit)) {
            pthread_mutex_lock(&p->mu);
            while (!atomic_load(&p->quit) && atomic_load(&p->generation) == seen) pthread_cond_wait(&p->wake, &p->mu);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->quit)) break;
        seen = atomic_load(&p->generation);
        run_share(p, w->tid);
        if (atomic_fetch_sub(&p->pending, 1) == 1) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->done);
            pthread_mutex_unlock(&p->mu);
        }
    }
    return NULL;
}

bmoe_pool *pool_create(int n_threads) {
    if (n_threads < 1) return NULL;
    bmoe_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->n_threads = n_threads;
    atomic_init(&p->generation, 0);
    atomic_init(&p->pending, 0);
    atomic_init(&p->quit, 0);
    atomic_init(&p->next, 0);
    if (pthread_mutex_init(&p->mu, NULL) != 0) { free(p); return NULL; }
    if (pthread_cond_init(&p->wake, NULL) != 0) { pthread_mutex_destroy(&p->mu); free(p); return NULL; }
    if (pthread_cond_init(&p->done, NULL) != 0) {
        pthread_cond_destroy(&p->wake); pthread_mutex_destroy(&p->mu); free(p); return NULL;
    }
    if (n_threads > 1) {
        p->workers = calloc((size_t)n_threads - 1, sizeof *p->workers);
        if (!p->workers) { pool_destroy(p); return NULL; }
        for (int i = 0; i < n_threads - 1; i++) {
            p->workers[i].pool = p;
            p->workers[i].tid = i + 1;
            if (pthread_create(&p->workers[i].th, NULL, worker_main, &p->workers[i]) != 0) {
                pool_destroy(p);
                return NULL;
            }
            p->n_started++;
        }
    }
    return p;
}

int pool_threads(const bmoe_pool *p) { return p->n_threads; }

unsigned long pool_jobs(const bmoe_pool *p) { return p->jobs; }

void pool_run(bmoe_pool *p, int n, bmoe_pool_fn fn, void *ctx) {
    if (n <= 0) return;
    if (p->n_threads == 1) { fn(ctx, 0, n, 0); return; }
    p->fn = fn;
    p->ctx = ctx;
    p->n = n;
    /* about POOL_CHUNKS chunks per thread, so the threads finish close together */
    p->chunk = n / (p->n_threads * POOL_CHUNKS);
    if (p->chunk < 1) p->chunk = 1;
    atomic_store(&p->next, 0);
    atomic_store(&p->pending, p->n_threads - 1);
    p->jobs++;
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add(&p->generation, 1); /* seq_cst: the job fields above are visible to whoever sees it */
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    run_share(p, 0);
    for (int spin = 0; spin < POOL_SPIN && atomic_load(&p->pending) > 0; spin++) {
    }
    if (atomic_load(&p->pending) > 0) {
        pthread_mutex_lock(&p->mu);
        while (atomic_load(&p->pending) > 0) pthread_cond_wait(&p->done, &p->mu);
        pthread_mutex_unlock(&p->mu);
    }
}

void pool_destroy(bmoe_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->quit, 1);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->n_started; i++) pthread_join(p->workers[i].th, NULL);
    free(p->workers);
    pthread_cond_destroy(&p->done);
    pthread_cond_destroy(&p->wake);
    pthread_mutex_destroy(&p->mu);
    free(p);
}
