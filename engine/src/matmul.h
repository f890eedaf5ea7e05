/* Matrix products over a batch of tokens: y[t, j] = row_j(W) . x[t], parallel over the rows j.
 *
 * A matmul's input is first put in its weight type's activation format (type_traits.h: the floats as
 * they are, Q8_0 / Q8_1 blocks or Q8_K super-blocks), once per input row; then every output element is
 * one call of the type's kernel (kernels.h) on one weight row and one token, computed by one thread:
 * which thread, and which other tokens share the call (the multi-token kernels give each token the
 * one-token kernel's bits), change no value. So the output depends neither on the thread count nor on
 * the batch a token is in (docs/engine.md, determinism rules 1, 2 and 6). */
#ifndef BMOE_MATMUL_H
#define BMOE_MATMUL_H

#include <stddef.h>
#include <stdint.h>

#include "kernels.h"
#include "threads.h"

/* Writable buffers of an input in every quantised format, [rows, width] as bm_act reads them (the
 * floats stay the caller's). */
typedef struct {
    int8_t *q;
    float *d, *s;
    bm_q8k *k;
} mm_qbuf;

/* Allocates buf for rows x width (width a multiple of 32); 0, or 1 out of memory (buf then holds what
 * was allocated: mm_qbuf_free it). */
int mm_qbuf_alloc(mm_qbuf *buf, size_t rows, size_t width);
void mm_qbuf_free(mm_qbuf *buf);

/* The input x (floats, [T, width]) and its quantised forms in buf, as one bm_act. */
static inline bm_act mm_act(const float *x, const mm_qbuf *buf) {
    bm_act a = {x, buf->q, buf->d, buf->s, buf->k};
    return a;
}

/* Rows t0 .. t1-1 of x ([*, n]) quantised as `kind` takes them into the same rows of buf; F32 leaves
 * everything as it is. */
void mm_quantise_rows(const bm_kernels *k, bm_act_kind kind, const float *x, int t0, int t1, size_t n,
                      const mm_qbuf *buf);
/* The same for all T rows, on the pool's threads when it is worth waking them. */
void mm_quantise(bmoe_pool *pool, const bm_kernels *k, bm_act_kind kind, const float *x, int T, size_t n,
                 const mm_qbuf *buf);
/* Copies token i's input (format kind, width n) from src to row j of dst (floats to xdst). */
void mm_act_copy_row(bm_act_kind kind, size_t n, const bm_act *src, int i, float *xdst, const mm_qbuf *dst, int j);

/* One matmul: n_out rows of row_bytes (n_in values each) of a weight type, times T tokens' inputs in
 * its format; token t's outputs go to y + r(t) * ldy, r(t) = yrow ? yrow[t] : t, ldy = n_out when 0. */
typedef struct {
    const uint8_t *w;
    uint32_t type;
    size_t row_bytes, n_in, n_out;
    bm_act a;
    float *y;
    int T;
    const int *yrow;
    size_t ldy;
} mm_job;

/* Runs n (>= 1) matmuls as one pool job over all their rows (one wake-up and one barrier instead of
 * one each: q, k and v; gate and up; a group of experts' matrices), or on the caller when together
 * they touch too few weight bytes to be worth it. */
void mm_run(bmoe_pool *pool, const bm_kernels *k, int n, const mm_job *jobs);

/* The activation format of a weight type (every type a model binds has a row). */
static inline bm_act_kind mm_act_kind(uint32_t type) { return bm_type(type)->act; }

#endif
