/* Counts the thread pool's jobs (each one a barrier) for one prefill and one decode token of a model:
 * a figure of the work split that the machine's load cannot change. It links the engine's sources
 * except main.c; docs/benchmarks.md ("Barriers per prefill") has the build command and the figures.
 * Usage: prefill_barriers MODEL.gguf TOKENS THREADS */
#include <stdio.h>
#include <stdlib.h>

#include "expert_resident.h"
#include "forward.h"
#include "model.h"
#include "threads.h"

int main(int argc, char **argv) {
    if (argc != 4) { fprintf(stderr, "usage: prefill_barriers MODEL.gguf TOKENS THREADS\n"); return 2; }
    int T = atoi(argv[2]), th = atoi(argv[3]);
    if (T < 1 || th < 1) { fprintf(stderr, "prefill_barriers: TOKENS and THREADS must be >= 1\n"); return 2; }
    bmoe_model *m = NULL;
    char err[512] = "";
    if (model_open(argv[1], 1, &m, err, sizeof err)) { fprintf(stderr, "prefill_barriers: %s\n", err); return 3; }
    bmoe_pool *pool = pool_create(th);
    bmoe_resident res;
    bmoe_seam seam = { 0 };
    seam.experts = resident_source(&res, m);
    int V = m->hp.n_vocab, rc = 3;
    int32_t *toks = malloc(sizeof *toks * (size_t)T);
    float *out = malloc(sizeof(float) * (size_t)V);
    bmoe_forward *f = NULL;
    if (pool && toks && out && !forward_create(&f, m, pool, &seam, T + 1, T, m->hp.n_expert_used, err, sizeof err)) {
        for (int t = 0; t < T; t++) toks[t] = (int32_t)((t * 7 + 3) % V);
        unsigned long j0 = pool_jobs(pool);
        if (!forward_eval(f, toks, T, 0, 0, 0, 0, out, err, sizeof err)) {
            unsigned long pre = pool_jobs(pool) - j0;
            j0 = pool_jobs(pool);
            if (!forward_eval(f, toks, 1, T, 1, 0, 0, out, err, sizeof err)) {
                printf("T=%d threads=%d layers=%d: prefill %lu jobs (%.3f per token, %.1f per layer), decode %lu per token\n",
                       T, th, m->hp.n_layer, pre, (double)pre / T, (double)pre / m->hp.n_layer, pool_jobs(pool) - j0);
                rc = 0;
            }
        }
    }
    if (rc) fprintf(stderr, "prefill_barriers: %s\n", err[0] ? err : "out of memory");
    forward_free(f);
    free(out);
    free(toks);
    pool_destroy(pool);
    model_close(m);
    return rc;
}
