/* Matrix products over a batch of tokens (matmul.h). */
#include "matmul.h"

#include <stdlib.h>
#include <string.h>

#include "tensor.h"

/* Below this many weight bytes touched, a matmul is not worth splitting across threads. */
#define MM_PARALLEL_MIN_BYTES (16u * 1024u)

/* Below this many input values, quantising runs on the caller. */
#define MM_QUANT_PARALLEL_MIN 32768u

/* Rows per tile when T >= 2: a tile's weights stay in cache while every token passes over them, and
 * each group of tokens is read once per tile, not once per row; y is written in runs of a tile. */
#define MM_ROW_TILE 8

/* Rows per block of the tile path: a block's token tiles run one after another over its row tiles,
 * so the block's weights (a few KiB per tile) stay in cache across token tiles, and each token's
 * outputs of the block fill whole cache lines of y at once. Visiting every tile of one row tile's
 * tokens first instead scattered 32-byte writes over T rows of y: 6 % of a 1024-token prefill. */
#define MM_ROW_BLOCK 64

/* Weight streams one thread reads side by side in a decode matmul. */
#define MM_STREAMS 4

int mm_qbuf_alloc(mm_qbuf *buf, size_t rows, size_t width) {
    size_t r = rows ? rows : 1, nb = width / BMOE_Q8_0_BLOCK + 1, nk = width / BM_Q8K_BLOCK + 1;
    buf->q = calloc(r * (width ? width : 1), sizeof(int8_t));
    buf->d = calloc(r * nb, sizeof(float));
    buf->s = calloc(r * nb, sizeof(float));
    buf->k = calloc(r * nk, sizeof(bm_q8k));
    return buf->q && buf->d && buf->s && buf->k ? 0 : 1;
}

void mm_qbuf_free(mm_qbuf *buf) {
    free(buf->q);
    free(buf->d);
    free(buf->s);
    free(buf->k);
    memset(buf, 0, sizeof *buf);
}

void mm_quantise_rows(const bm_kernels *k, bm_act_kind kind, const float *x, int t0, int t1, size_t n,
                      const mm_qbuf *buf) {
    const size_t nb = n / BMOE_Q8_0_BLOCK, nk = n / BM_Q8K_BLOCK;
    for (int t = t0; t < t1; t++) {
        const size_t u = (size_t)t;
        if (kind == BM_ACT_Q8_0) k->quantize_q8_0(x + u * n, n, buf->q + u * n, buf->d + u * nb);
        else if (kind == BM_ACT_Q8_1) k->quantize_q8_1(x + u * n, n, buf->q + u * n, buf->d + u * nb, buf->s + u * nb);
        else if (kind == BM_ACT_Q8_K) bm_quantize_q8_k(x + u * n, n, buf->k + u * nk);
    }
}

typedef struct {
    const bm_kernels *k;
    bm_act_kind kind;
    const float *x;
    size_t n;
    const mm_qbuf *buf;
} quant_job;

static void quant_rows(void *ctx, int t0, int t1, int tid) {
    (void)tid;
    const quant_job *J = ctx;
    mm_quantise_rows(J->k, J->kind, J->x, t0, t1, J->n, J->buf);
}

void mm_quantise(bmoe_pool *pool, const bm_kernels *k, bm_act_kind kind, const float *x, int T, size_t n,
                 const mm_qbuf *buf) {
    if (kind == BM_ACT_F32) return;
    quant_job J = {k, kind, x, n, buf};
    /* each row's bytes are a function of that row alone: where it is computed changes nothing */
    if (T < 2 || (size_t)T * n < MM_QUANT_PARALLEL_MIN) quant_rows(&J, 0, T, 0);
    else pool_run(pool, T, quant_rows, &J);
}

void mm_act_copy_row(bm_act_kind kind, size_t n, const bm_act *src, int i, float *xdst, const mm_qbuf *dst, int j) {
    const size_t si = (size_t)i, dj = (size_t)j, nb = n / BMOE_Q8_0_BLOCK, nk = n / BM_Q8K_BLOCK;
    switch (kind) {
    case BM_ACT_F32: memcpy(xdst + dj * n, src->x + si * n, n * sizeof(float)); break;
    case BM_ACT_Q8_1: memcpy(dst->s + dj * nb, src->s + si * nb, nb * sizeof(float)); /* fall through */
    case BM_ACT_Q8_0:
        memcpy(dst->q + dj * n, src->q + si * n, n);
        memcpy(dst->d + dj * nb, src->d + si * nb, nb * sizeof(float));
        break;
    case BM_ACT_Q8_K: memcpy(dst->k + dj * nk, src->k + si * nk, nk * sizeof(bm_q8k)); break;
    default: break;
    }
}

/* One weight row times one input row, and times nt (2 .. BM_MT_MAX) consecutive ones (out[t] is
 * row_dot's value for each, bit for bit: kernels.h, *_mt; the row's weights are loaded and converted
 * once): the type table's kernels of the engine's path. The model accepts no type without them
 * (model.c, bind). */
static inline float row_dot(const bm_kernels *k, uint32_t type, const uint8_t *row, const bm_act *a, size_t n) {
    return k->dot[type](row, a, n);
}

static inline void row_dot_mt(const bm_kernels *k, uint32_t type, const uint8_t *row, const bm_act *a, size_t n, int nt,
                              float *out) {
    k->dot_mt[type](row, a, n, nt, out);
}

static inline float *out_row(const mm_job *J, int t) {
    return J->y + (size_t)(J->yrow ? J->yrow[t] : t) * (J->ldy ? J->ldy : J->n_out);
}

static void mm_rows(const mm_job *J, const bm_kernels *k, int j0, int j1, int tid) {
    size_t n = J->n_in;
    (void)tid;
    if (J->T == 1) {
        /* Decode: the one-token kernel, row by row, the rows taken from MM_STREAMS equal parts of the
         * range in turn, so that several sequential streams of weights are in flight (the comment
         * above forward.c's tok_experts_job says why). Visiting order changes no value. */
        float *y = out_row(J, 0);
        int part = (j1 - j0 + MM_STREAMS - 1) / MM_STREAMS;
        for (int a = 0; a < part; a++)
            for (int j = j0 + a; j < j1; j += part) y[j] = row_dot(k, J->type, J->w + (size_t)j * J->row_bytes, &J->a, n);
    } else if (k->dot_tile[J->type]) {
        /* Several tokens on a path with row x token tiles for the type: BM_TILE_R rows times up to
         * BM_TILE_T tokens per call (a last lone token with the one-token kernel), each output with the
         * one-token kernel's bits. */
        const bm_dot_tile_fn tile = k->dot_tile[J->type];
        for (int b0 = j0; b0 < j1; b0 += MM_ROW_BLOCK) {
            const int b1 = j1 - b0 < MM_ROW_BLOCK ? j1 : b0 + MM_ROW_BLOCK;
            for (int t = 0; t < J->T; t += BM_TILE_T) {
                int nt = J->T - t < BM_TILE_T ? J->T - t : BM_TILE_T;
                const bm_act at = bm_act_token(&J->a, n, t);
                for (int r0 = b0; r0 < b1; r0 += BM_TILE_R) {
                    int nr = b1 - r0 < BM_TILE_R ? b1 - r0 : BM_TILE_R;
                    const uint8_t *rows = J->w + (size_t)r0 * J->row_bytes;
                    float o[BM_TILE_R * BM_TILE_T];
                    if (nt == 1)
                        for (int r = 0; r < nr; r++) o[r * BM_TILE_T] = row_dot(k, J->type, rows + (size_t)r * J->row_bytes, &at, n);
                    else tile(rows, J->row_bytes, nr, &at, n, nt, o);
                    for (int u = 0; u < nt; u++) {
                        float *y = out_row(J, t + u);
                        for (int r = 0; r < nr; r++) y[r0 + r] = o[r * BM_TILE_T + u];
                    }
                }
            }
        }
    } else {
        /* Several tokens: up to BM_MT_MAX per call (a last lone token with the one-token kernel), each
         * with the one-token kernel's bits, so the order rows and tokens are visited in changes nothing. */
        for (int r0 = j0; r0 < j1; r0 += MM_ROW_TILE) {
            int r1 = j1 - r0 < MM_ROW_TILE ? j1 : r0 + MM_ROW_TILE;
            for (int t = 0; t < J->T; t += BM_MT_MAX) {
                int nt = J->T - t < BM_MT_MAX ? J->T - t : BM_MT_MAX;
                const bm_act at = bm_act_token(&J->a, n, t);
                float o[MM_ROW_TILE][BM_MT_MAX];
                for (int j = r0; j < r1; j++) {
                    const uint8_t *row = J->w + (size_t)j * J->row_bytes;
                    if (nt == 1) o[j - r0][0] = row_dot(k, J->type, row, &at, n);
                    else row_dot_mt(k, J->type, row, &at, n, nt, o[j - r0]);
                }
                for (int u = 0; u < nt; u++) {
                    float *y = out_row(J, t + u);
                    for (int j = r0; j < r1; j++) y[j] = o[j - r0][u];
                }
            }
        }
    }
#ifdef BMOE_FAULT_THREAD_ORDER
    /* Fault: the result depends on which thread computed the row (DET-threads must notice). */
    if (tid > 0)
        for (int t = 0; t < J->T; t++)
            for (int j = j0; j < j1; j++) out_row(J, t)[j] *= 1.25f;
#endif
}

typedef struct {
    const bm_kernels *k;
    int n, rows;
    const mm_job *mm;
} mm_multi_job;

/* Items are the jobs' rows one after another: job m's rows follow job m-1's. */
static void mm_multi_rows(void *ctx, int i0, int i1, int tid) {
    const mm_multi_job *M = ctx;
    for (int m = 0, base = 0; m < M->n && base < i1; m++) {
        int end = base + (int)M->mm[m].n_out, a = i0 > base ? i0 : base, b = i1 < end ? i1 : end;
        if (a < b) mm_rows(&M->mm[m], M->k, a - base, b - base, tid);
        base = end;
    }
}

void mm_run(bmoe_pool *pool, const bm_kernels *k, int n, const mm_job *jobs) {
    mm_multi_job M = {k, n, 0, jobs};
    size_t bytes = 0;
    for (int m = 0; m < n; m++) {
        M.rows += (int)jobs[m].n_out;
        bytes += (size_t)jobs[m].T * jobs[m].n_out * jobs[m].row_bytes;
    }
    /* Too small to amortise waking the pool: the caller runs it. Same rows, same code, so the result is
     * the same either way. */
    if (bytes < MM_PARALLEL_MIN_BYTES) mm_multi_rows(&M, 0, M.rows, 0);
    else pool_run(pool, M.rows, mm_multi_rows, &M);
}
