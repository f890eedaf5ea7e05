/* Unit tests of the GGUF reader: valid images built in memory, every malformation class, split models
 * written to a temporary directory, typed getters. Run under ASan + UBSan by `make -C engine test`. */
#include "check.h"
#include "gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---------------------------------------------------------------------------------------------- */
/* a byte builder                                                                                 */

typedef struct { uint8_t *b; size_t n, cap; } buf;

static void put(buf *b, const void *p, size_t n) {
    if (b->n + n > b->cap) {
        size_t c = b->cap ? b->cap : 256;
        while (c < b->n + n) c *= 2;
        b->b = realloc(b->b, c);
        if (!b->b) abort();
        b->cap = c;
    }
    if (n) memcpy(b->b + b->n, p, n);
    b->n += n;
}
static void put_le(buf *b, uint64_t v, int n) {
    uint8_t t[8];
    for (int i = 0; i < n; i++) t[i] = (uint8_t)(v >> (8 * i));
    put(b, t, (size_t)n);
}
static void u8_(buf *b, uint64_t v) { put_le(b, v, 1); }
static void u16_(buf *b, uint64_t v) { put_le(b, v, 2); }
static void u32_(buf *b, uint64_t v) { put_le(b, v, 4); }
static void u64_(buf *b, uint64_t v) { put_le(b, v, 8); }
static void f32_(buf *b, float f) { uint32_t u; memcpy(&u, &f, 4); u32_(b, u); }
static void f64_(buf *b, double f) { uint64_t u; memcpy(&u, &f, 8); u64_(b, u); }
static void str_(buf *b, const char *s) { u64_(b, strlen(s)); put(b, s, strlen(s)); }
static void pad_(buf *b, size_t a) { while (b->n % a) u8_(b, 0); }
static void patch_le(buf *b, size_t at, uint64_t v, int n) {
    for (int i = 0; i < n; i++) b->b[at + (size_t)i] = (uint8_t)(v >> (8 * i));
}

static void hdr(buf *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    put(b, "GGUF", 4);
    u32_(b, version);
    u64_(b, n_tensors);
    u64_(b, n_kv);
}
static void kv_hdr(buf *b, const char *key, uint32_t type) { str_(b, key); u32_(b, type); }
static void kv_u32(buf *b, const char *key, uint32_t v) { kv_hdr(b, key, GGUF_TYPE_UINT32); u32_(b, v); }
static void kv_u16(buf *b, const char *key, uint16_t v) { kv_hdr(b, key, GGUF_TYPE_UINT16); u16_(b, v); }
static void kv_i32(buf *b, const char *key, int32_t v) { kv_hdr(b, key, GGUF_TYPE_INT32); u32_(b, (uint32_t)v); }
static void kv_str(buf *b, const char *key, const char *v) { kv_hdr(b, key, GGUF_TYPE_STRING); str_(b, v); }

typedef struct { const char *name; uint32_t n_dims; uint64_t ne[4]; uint32_t type; uint64_t off; } tspec;
#define AUTO UINT64_MAX

static uint64_t tbytes(const tspec *t) {
    uint64_t n = 1;
    for (uint32_t d = 0; d < t->n_dims && d < 4; d++) n *= t->ne[d];
    return ggml_type_nbytes(t->type, n);
}

/* Tensor infos (auto offsets laid out with `align`), padding, data (a byte pattern), no end padding:
 * the last tensor ends exactly at the end of the image, so every proper prefix is malformed. */
static void tensors_(buf *b, const tspec *ts, int nt, size_t align) {
    uint64_t offs[16], next = 0;
    for (int i = 0; i < nt; i++) {
        offs[i] = ts[i].off == AUTO ? next : ts[i].off;
        if (ts[i].off == AUTO) next = (offs[i] + tbytes(&ts[i]) + align - 1) / align * align;
    }
    for (int i = 0; i < nt; i++) {
        str_(b, ts[i].name);
        u32_(b, ts[i].n_dims);
        for (uint32_t d = 0; d < ts[i].n_dims; d++) u64_(b, ts[i].ne[d < 4 ? d : 0]);
        u32_(b, ts[i].type);
        u64_(b, offs[i]);
    }
    if (!nt) return;
    pad_(b, align);
    size_t start = b->n, end = start;
    for (int i = 0; i < nt; i++) { /* absurd sizes and offsets are lies the test tells: not materialised */
        uint64_t tb = tbytes(&ts[i]);
        if (offs[i] < (1u << 22) && tb < (1u << 20) && start + offs[i] + tb > end) end = start + offs[i] + tb;
    }
    while (b->n < end) u8_(b, (uint8_t)(b->n * 7 + 1));
}

/* ---------------------------------------------------------------------------------------------- */
/* helpers                                                                                        */

static char err[1024];

static int parse(const buf *b, gguf_model **m) { return gguf_parse_buffer(b->b, b->n, m, err, sizeof err); }

static int one_line(const char *s) { return s[0] && !strchr(s, '\n') && !strchr(s, '\r'); }

/* The image must be rejected as malformed with a one-line message naming the buffer and containing
 * `frag`. */
static void expect_bad_(const buf *b, const char *frag, int line) {
    gguf_model *m = (gguf_model *)&m; /* must be reset to NULL */
    int rc = parse(b, &m);
    int ok = rc == BMOE_GGUF_EMALFORMED && m == NULL && one_line(err) && !strncmp(err, "<buffer>: ", 10) &&
             strstr(err, frag) != NULL;
    check_count++;
    if (!ok) {
        check_failures++;
        fprintf(stderr, "%s:%d: expected malformed with \"%s\", got rc %d: %s\n", __FILE__, line, frag, rc, err);
    }
    gguf_close(m == (gguf_model *)&m ? NULL : m);
}
#define expect_bad(b, frag) expect_bad_(b, frag, __LINE__)

static gguf_model *expect_ok_(const buf *b, int line) {
    gguf_model *m = NULL;
    int rc = parse(b, &m);
    check_count++;
    if (rc != 0 || !m) {
        check_failures++;
        fprintf(stderr, "%s:%d: expected a valid image, got rc %d: %s\n", __FILE__, line, rc, err);
        gguf_close(m);
        return NULL;
    }
    return m;
}
#define expect_ok(b) expect_ok_(b, __LINE__)

static const tspec T_F32 = { "a.weight", 2, { 4, 2 }, GGML_TYPE_F32, AUTO };
static const tspec T_F16 = { "b.weight", 1, { 8 }, GGML_TYPE_F16, AUTO };
static const tspec T_Q8 = { "c.weight", 3, { 64, 2, 3 }, GGML_TYPE_Q8_0, AUTO };

/* A model with one tensor spec and a given list of extra KVs written by `kvs` (count n_kv). */
static void one_tensor(buf *b, tspec t, uint32_t align) {
    hdr(b, 3, 1, 1);
    kv_str(b, "general.architecture", "test");
    tensors_(b, &t, 1, align);
}

/* ---------------------------------------------------------------------------------------------- */
/* valid images                                                                                   */

static void build_every_type(buf *b) {
    tspec ts[3] = { T_F32, T_F16, T_Q8 };
    hdr(b, 3, 3, 18);
    kv_str(b, "general.architecture", "test");
    kv_hdr(b, "t.u8", GGUF_TYPE_UINT8); u8_(b, 200);
    kv_hdr(b, "t.i8", GGUF_TYPE_INT8); u8_(b, (uint8_t)-5);
    kv_hdr(b, "t.u16", GGUF_TYPE_UINT16); u16_(b, 60000);
    kv_hdr(b, "t.i16", GGUF_TYPE_INT16); u16_(b, (uint16_t)-30000);
    kv_u32(b, "t.u32", 4000000000u);
    kv_i32(b, "t.i32", -2000000000);
    kv_hdr(b, "t.f32", GGUF_TYPE_FLOAT32); f32_(b, 0.5f);
    kv_hdr(b, "t.bool", GGUF_TYPE_BOOL); u8_(b, 1);
    kv_hdr(b, "t.u64", GGUF_TYPE_UINT64); u64_(b, UINT64_C(1) << 63);
    kv_hdr(b, "t.i64", GGUF_TYPE_INT64); u64_(b, (uint64_t)INT64_C(-1099511627776));
    kv_hdr(b, "t.f64", GGUF_TYPE_FLOAT64); f64_(b, -0.25);
    kv_hdr(b, "t.arr.i16", GGUF_TYPE_ARRAY); u32_(b, GGUF_TYPE_INT16); u64_(b, 3);
    u16_(b, (uint16_t)-1); u16_(b, 2); u16_(b, 0x7fff);
    kv_hdr(b, "t.arr.f32", GGUF_TYPE_ARRAY); u32_(b, GGUF_TYPE_FLOAT32); u64_(b, 2); f32_(b, 1.5f); f32_(b, -2.0f);
    kv_hdr(b, "t.arr.str", GGUF_TYPE_ARRAY); u32_(b, GGUF_TYPE_STRING); u64_(b, 3);
    str_(b, "a"); str_(b, ""); u64_(b, 3); put(b, "x\0y", 3);
    kv_hdr(b, "t.arr.empty", GGUF_TYPE_ARRAY); u32_(b, GGUF_TYPE_UINT64); u64_(b, 0);
    kv_hdr(b, "t.arr.bool", GGUF_TYPE_ARRAY); u32_(b, GGUF_TYPE_BOOL); u64_(b, 2); u8_(b, 0); u8_(b, 1);
    kv_u32(b, "general.alignment", 64);
    tensors_(b, ts, 3, 64);
}

static void test_valid(void) {
    buf b = { 0 };
    build_every_type(&b);
    gguf_model *m = expect_ok(&b);
    if (!m) return;
    CHECK(m->n_kv == 18 && m->n_tensors == 3 && m->n_shards == 1 && m->alignment == 64);
    CHECK(m->shards[0].fd == -1 && m->shards[0].size == b.n && !strcmp(m->shards[0].path, "<buffer>"));
    CHECK(m->shards[0].data_offset % 64 == 0);

    uint64_t u; int64_t i; double f; int bo; gguf_str s; const gguf_kv *kv;
    CHECK(gguf_get_str(m, "general.architecture", &s, err, sizeof err) == 1 && gguf_str_eq(s, "test"));
    CHECK(s.ptr[s.len] == '\0');
    CHECK(gguf_get_u64(m, "t.u8", &u, err, sizeof err) == 1 && u == 200);
    CHECK(gguf_get_i64(m, "t.i8", &i, err, sizeof err) == 1 && i == -5);
    CHECK(gguf_get_u64(m, "t.i8", &u, err, sizeof err) == -1 && one_line(err) && strstr(err, "t.i8 = -5 is negative"));
    CHECK(gguf_get_u64(m, "t.u16", &u, err, sizeof err) == 1 && u == 60000);
    CHECK(gguf_get_i64(m, "t.i16", &i, err, sizeof err) == 1 && i == -30000);
    CHECK(gguf_get_u64(m, "t.u32", &u, err, sizeof err) == 1 && u == 4000000000u);
    CHECK(gguf_get_i64(m, "t.i32", &i, err, sizeof err) == 1 && i == -2000000000);
    CHECK(gguf_get_f64(m, "t.f32", &f, err, sizeof err) == 1 && f == 0.5);
    CHECK(gguf_get_bool(m, "t.bool", &bo, err, sizeof err) == 1 && bo == 1);
    CHECK(gguf_get_u64(m, "t.u64", &u, err, sizeof err) == 1 && u == UINT64_C(1) << 63);
    CHECK(gguf_get_i64(m, "t.u64", &i, err, sizeof err) == -1 && strstr(err, "out of range"));
    CHECK(gguf_get_i64(m, "t.i64", &i, err, sizeof err) == 1 && i == INT64_C(-1099511627776));
    CHECK(gguf_get_f64(m, "t.f64", &f, err, sizeof err) == 1 && f == -0.25);
    CHECK(gguf_get_f64(m, "t.u32", &f, err, sizeof err) == 1 && f == 4000000000.0);
    CHECK(gguf_get_f64(m, "t.i8", &f, err, sizeof err) == 1 && f == -5.0);
    /* wrong types: -1 and a message naming the file and key */
    CHECK(gguf_get_u64(m, "general.architecture", &u, err, sizeof err) == -1 &&
          !strcmp(err, "general.architecture has type string, expected an integer"));
    CHECK(gguf_get_str(m, "t.u8", &s, err, sizeof err) == -1 && strstr(err, "t.u8 has type u8, expected string"));
    CHECK(gguf_get_bool(m, "t.u8", &bo, err, sizeof err) == -1);
    CHECK(gguf_get_f64(m, "t.arr.f32", &f, err, sizeof err) == -1 && strstr(err, "type array"));
    /* absent */
    CHECK(gguf_get_u64(m, "nope", &u, err, sizeof err) == 0);
    CHECK(gguf_get_str(m, "t.u", &s, err, sizeof err) == 0);
    CHECK(gguf_find_kv(m, "t.u8x") == NULL && gguf_find_kv(m, "") == NULL && gguf_find_kv(m, NULL) == NULL);
    CHECK(gguf_find_kv(m, "t.f64") == &m->kv[11]);

    /* arrays */
    CHECK(gguf_get_arr(m, "t.arr.i16", GGUF_TYPE_UINT64, &kv, err, sizeof err) == 1 && kv->n == 3);
    CHECK(gguf_arr_i64(kv, 0, &i) == 1 && i == -1);
    CHECK(gguf_arr_u64(kv, 0, &u) == 0);                 /* negative */
    CHECK(gguf_arr_u64(kv, 2, &u) == 1 && u == 0x7fff);
    CHECK(gguf_arr_i64(kv, 3, &i) == 0);                 /* past the end */
    CHECK(gguf_arr_str(kv, 0, &s) == 0);                 /* not strings */
    CHECK(gguf_get_arr(m, "t.arr.i16", GGUF_TYPE_STRING, &kv, err, sizeof err) == -1 &&
          strstr(err, "array of i16, expected an array of string"));
    CHECK(gguf_get_arr(m, "t.arr.f32", GGUF_TYPE_FLOAT32, &kv, err, sizeof err) == 1);
    CHECK(gguf_arr_f64(kv, 1, &f) == 1 && f == -2.0);
    CHECK(gguf_arr_u64(kv, 1, &u) == 0);
    CHECK(gguf_get_arr(m, "t.arr.str", GGUF_TYPE_STRING, &kv, err, sizeof err) == 1 && kv->n == 3);
    CHECK(gguf_arr_str(kv, 0, &s) == 1 && gguf_str_eq(s, "a"));
    CHECK(gguf_arr_str(kv, 1, &s) == 1 && s.len == 0 && s.ptr && s.ptr[0] == '\0');
    CHECK(gguf_arr_str(kv, 2, &s) == 1 && s.len == 3 && !memcmp(s.ptr, "x\0y", 4));
    CHECK(gguf_get_arr(m, "t.arr.empty", GGUF_TYPE_COUNT, &kv, err, sizeof err) == 1 && kv->n == 0 && !kv->data);
    CHECK(gguf_get_arr(m, "t.arr.bool", GGUF_TYPE_BOOL, &kv, err, sizeof err) == 1);
    CHECK(gguf_arr_f64(kv, 1, &f) == 0 && ((const uint8_t *)kv->data)[1] == 1);
    CHECK(gguf_get_arr(m, "t.u8", GGUF_TYPE_COUNT, &kv, err, sizeof err) == -1 && strstr(err, "expected an array"));
    CHECK(gguf_get_arr(m, "absent", GGUF_TYPE_COUNT, &kv, err, sizeof err) == 0);

    /* tensors */
    const gguf_tensor *a = gguf_find_tensor(m, "a.weight"), *bt = gguf_find_tensor(m, "b.weight"),
                      *c = gguf_find_tensor(m, "c.weight");
    CHECK(a && bt && c && gguf_find_tensor(m, "d.weight") == NULL && gguf_find_tensor(m, "a.weigh") == NULL);
    if (a && bt && c) {
        uint64_t d0 = m->shards[0].data_offset;
        CHECK(a->n_dims == 2 && a->ne[0] == 4 && a->ne[1] == 2 && a->ne[2] == 1 && a->ne[3] == 1);
        CHECK(a->type == GGML_TYPE_F32 && a->nbytes == 32 && a->row_bytes == 16 && a->offset == d0 && a->shard == 0);
        CHECK(bt->type == GGML_TYPE_F16 && bt->nbytes == 16 && bt->row_bytes == 16 && bt->offset == d0 + 64);
        CHECK(c->type == GGML_TYPE_Q8_0 && c->row_bytes == 68 && c->nbytes == 68 * 6 && c->offset == d0 + 128);
        CHECK(c->offset + c->nbytes == b.n);
        CHECK(a->name.ptr[a->name.len] == '\0');
    }
    gguf_close(m);

    /* the dequantised types: ggml's block sizes and bytes; a file one byte short of the last tensor's
     * data is refused naming it */
    {
        static const struct { uint32_t type; uint64_t ne0, row; } T[] = {
            { GGML_TYPE_Q4_K, 512, 288 }, { GGML_TYPE_Q5_K, 256, 176 }, { GGML_TYPE_Q6_K, 768, 630 },
            { GGML_TYPE_Q4_0, 64, 36 },   { GGML_TYPE_Q5_0, 96, 66 },   { GGML_TYPE_BF16, 5, 10 },
        };
        for (size_t k = 0; k < sizeof T / sizeof T[0]; k++) {
            buf q = { 0 };
            hdr(&q, 3, 1, 0);
            tspec one = { "blk.0.ffn_up_exps.weight", 3, { T[k].ne0, 3, 2 }, T[k].type, AUTO };
            tensors_(&q, &one, 1, 32);
            gguf_model *mq = NULL;
            CHECK(parse(&q, &mq) == 0);
            const gguf_tensor *tq = mq ? gguf_find_tensor(mq, "blk.0.ffn_up_exps.weight") : NULL;
            CHECK(tq && tq->type == T[k].type && tq->row_bytes == T[k].row && tq->nbytes == T[k].row * 6 &&
                  tq->offset + tq->nbytes == q.n);
            gguf_close(mq);
            q.n -= 1;
            expect_bad(&q, "bytes past end of file");
            free(q.b);
        }
    }

    /* version 2 is the same layout */
    patch_le(&b, 4, 2, 4);
    m = expect_ok(&b);
    gguf_close(m);

    /* a metadata-only image (no tensors): padding after the header is not required */
    buf h = { 0 };
    hdr(&h, 3, 0, 1);
    kv_str(&h, "general.architecture", "x");
    m = expect_ok(&h);
    if (m) CHECK(m->n_tensors == 0 && m->tensors == NULL && gguf_find_tensor(m, "x") == NULL);
    gguf_close(m);
    /* and an image with nothing at all */
    buf z = { 0 };
    hdr(&z, 3, 0, 0);
    m = expect_ok(&z);
    if (m) CHECK(m->n_kv == 0 && gguf_find_kv(m, "a") == NULL);
    gguf_close(m);
    /* many keys: lookups by binary search find each one */
    buf mk = { 0 };
    hdr(&mk, 3, 0, 500);
    for (int k = 0; k < 500; k++) {
        char key[32];
        snprintf(key, sizeof key, "k.%03d", (k * 37) % 500);
        kv_u32(&mk, key, (uint32_t)((k * 37) % 500));
    }
    m = expect_ok(&mk);
    int all = 1;
    for (int k = 0; m && k < 500; k++) {
        char key[32];
        snprintf(key, sizeof key, "k.%03d", k);
        if (gguf_get_u64(m, key, &u, err, sizeof err) != 1 || u != (uint64_t)k) all = 0;
    }
    CHECK(m && all);
    gguf_close(m);
    free(b.b);
    free(h.b);
    free(z.b);
    free(mk.b);
}

/* ---------------------------------------------------------------------------------------------- */
/* malformations                                                                                  */

static void test_truncation_everywhere(void) {
    buf b = { 0 };
    build_every_type(&b);
    int all = 1;
    for (size_t n = 0; n < b.n; n++) {
        gguf_model *m = NULL;
        int rc = gguf_parse_buffer(b.b, n, &m, err, sizeof err);
        if (rc != BMOE_GGUF_EMALFORMED || m || !one_line(err)) {
            all = 0;
            fprintf(stderr, "prefix %zu: rc %d: %s\n", n, rc, err);
            gguf_close(m);
        }
    }
    CHECK(all);
    /* spot checks of the messages */
    gguf_model *m = NULL;
    CHECK(gguf_parse_buffer(b.b, 0, &m, err, sizeof err) == 3 && strstr(err, "empty file"));
    CHECK(gguf_parse_buffer(b.b, 10, &m, err, sizeof err) == 3 && strstr(err, "truncated header: 10 bytes"));
    CHECK(gguf_parse_buffer(b.b, 30, &m, err, sizeof err) == 3 &&
          !strcmp(err, "<buffer>: tensor count 3 cannot fit: the 6 bytes after the header hold at most 0 tensor infos"));
    CHECK(gguf_parse_buffer(b.b, 400, &m, err, sizeof err) == 3 && strstr(err, "<buffer>: truncated in kv "));
    CHECK(gguf_parse_buffer(b.b, b.n - 1, &m, err, sizeof err) == 3 && strstr(err, "tensor 2 (c.weight): offset") &&
          strstr(err, "bytes past end of file"));
    free(b.b);
}

static void test_header(void) {
    buf b = { 0 };
    build_every_type(&b);
    buf c = { 0 };
    put(&c, b.b, b.n);
    memcpy(c.b, "GGML", 4);
    expect_bad(&c, "not a GGUF file (starts with 47 47 4d 4c");
    memcpy(c.b, "GGUF", 4);
    patch_le(&c, 4, 1, 4);
    expect_bad(&c, "GGUF version 1 is not supported");
    patch_le(&c, 4, 4, 4);
    expect_bad(&c, "GGUF version 4 is not supported");
    patch_le(&c, 4, 0x03000000, 4);
    expect_bad(&c, "big-endian GGUF");
    patch_le(&c, 4, 3, 4);
    /* absurd counts: rejected from the size before any allocation */
    patch_le(&c, 8, UINT64_MAX, 8);
    expect_bad(&c, "tensor count 18446744073709551615 cannot fit");
    patch_le(&c, 8, UINT64_C(1) << 58, 8);
    expect_bad(&c, "tensor count");
    patch_le(&c, 8, 3, 8);
    patch_le(&c, 16, UINT64_MAX / 14 + 1, 8);
    expect_bad(&c, "kv count");
    patch_le(&c, 16, UINT64_C(1) << 40, 8);
    expect_bad(&c, "kv count 1099511627776 cannot fit");
    /* one KV more than present: the parser runs into the tensor infos and fails there */
    patch_le(&c, 16, 19, 8);
    expect_bad(&c, "truncated in tensor 0: name length");
    /* a tensor count that fits the remaining bytes arithmetically but not after the metadata */
    patch_le(&c, 16, 18, 8);
    uint64_t fits = (c.n - 24 - 18 * 14) / 33;
    patch_le(&c, 8, fits, 8);
    expect_bad(&c, "");
    free(b.b);
    free(c.b);
}

static void test_kv_malformations(void) {
    buf b = { 0 };
    /* key length past the end */
    hdr(&b, 3, 0, 1); u64_(&b, UINT64_C(1) << 32); put(&b, "general.name", 12); u32_(&b, 8);
    expect_bad(&b, "truncated in kv 0: key length 4294967296 exceeds the");
    b.n = 0; hdr(&b, 3, 0, 1); u64_(&b, UINT64_MAX); put(&b, "abcdefghijklmn", 14);
    expect_bad(&b, "key length 18446744073709551615 exceeds");
    b.n = 0; hdr(&b, 3, 0, 1); str_(&b, ""); u32_(&b, GGUF_TYPE_UINT8); u8_(&b, 1); u8_(&b, 1);
    expect_bad(&b, "kv 0: empty key");
    b.n = 0; hdr(&b, 3, 0, 1); u64_(&b, 3); put(&b, "a\0b", 3); u32_(&b, GGUF_TYPE_UINT8); u8_(&b, 1);
    expect_bad(&b, "key contains a NUL byte");
    /* key longer than the maximum (but inside the file) */
    b.n = 0; hdr(&b, 3, 0, 1); u64_(&b, 70000);
    for (int i = 0; i < 70000; i++) u8_(&b, 'k');
    u32_(&b, GGUF_TYPE_UINT8); u8_(&b, 1);
    expect_bad(&b, "key length 70000 exceeds the maximum 65535");
    /* string value past the end: the example message of the design */
    b.n = 0; hdr(&b, 3, 0, 2); kv_u32(&b, "a", 1);
    kv_hdr(&b, "tokenizer.ggml.tokens", GGUF_TYPE_STRING); u64_(&b, UINT64_C(4294967296));
    for (int i = 0; i < 20; i++) u8_(&b, 'x');
    expect_bad(&b, "truncated in kv 1 (tokenizer.ggml.tokens): string length 4294967296 exceeds the 20 bytes left");
    /* unknown value types */
    b.n = 0; hdr(&b, 3, 0, 1); kv_hdr(&b, "k", 13); u64_(&b, 0);
    expect_bad(&b, "kv 0 (k): unknown value type 13");
    b.n = 0; hdr(&b, 3, 0, 1); kv_hdr(&b, "k", 0x80000000u); u64_(&b, 0);
    expect_bad(&b, "unknown value type 2147483648");
    /* scalar cut short */
    b.n = 0; hdr(&b, 3, 0, 1); kv_hdr(&b, "k", GGUF_TYPE_UINT64); u32_(&b, 0);
    expect_bad(&b, "truncated in kv 0 (k): value (u64) needs 8 bytes, 4 left");
    /* bool other than 0 / 1 */
    b.n = 0; hdr(&b, 3, 0, 1); kv_hdr(&b, "k", GGUF_TYPE_BOOL); u8_(&b, 2); u64_(&b, 0);
    expect_bad(&b, "bool value 2 is neither 0 nor 1");
    /* arrays */
    b.n = 0; hdr(&b, 3, 0, 1); kv_hdr(&b, "n", GGUF_TYPE_ARRAY); u32_(&b, GGUF_TYPE_ARRAY); u64_(&b, 1);
    u32_(&b, GGUF_TYPE_UINT8); u64_(&b, 1); u8_(&b, 1);
    expect_bad(&b, "kv 0 (n): nested arrays are not supported");
    b.n = 0; hdr(&b, 3, 0, 1); kv_hdr(&b, "n", GGUF_TYPE_ARRAY); u32_(&b, 77); u64_(&b, 1); u64_(&b, 0);
    expect_bad(&b, "unknown array element type 77");
    b.n = 0; hdr(&b, 3, 0, 1); kv_hdr(&b, "n", GGUF_TYPE_ARRAY); u32_(&b, GGUF_TYPE_UINT32);
    u64_(&b, UINT64_C(1) << 62); u32_(&b, 1); u32_(&b, 2);
    expect_bad(&b, "array of 4611686018427387904 u32 (4 bytes each) exceeds the 8 bytes left");
    /* fewer elements than bytes left, but more than fit */
    b.n = 0; hdr(&b, 3, 0, 1); kv_hdr(&b, "n", GGUF_TYPE_ARRAY); u32_(&b, GGUF_TYPE_FLOAT64); u64_(&b, 3);
    u64_(&b, 0); u64_(&b, 0);
    expect_bad(&b, "array of 3 f64 (8 bytes each) exceeds the 16 bytes left");
    b.n = 0; hdr(&b, 3, 0, 1); kv_hdr(&b, "n", GGUF_TYPE_ARRAY); u32_(&b, GGUF_TYPE_UINT64);
    u64_(&b, UINT64_C(1) << 61); /* x 8 wraps to 0 in 64 bits: must not pass */
    u64_(&b, 1);
    expect_bad(&b, "array of 2305843009213693952 u64");
    b.n = 0; hdr(&b, 3, 0, 1); kv_hdr(&b, "n", GGUF_TYPE_ARRAY); u32_(&b, GGUF_TYPE_STRING);
    u64_(&b, UINT64_C(1) << 60); u64_(&b, 0); u64_(&b, 0);
    expect_bad(&b, "array of 1152921504606846976 strings cannot fit in the 16 bytes left");
    b.n = 0; hdr(&b, 3, 0, 1); kv_hdr(&b, "tok", GGUF_TYPE_ARRAY); u32_(&b, GGUF_TYPE_STRING); u64_(&b, 3);
    str_(&b, "ab"); u64_(&b, 1000); put(&b, "cd", 2); u64_(&b, 0);
    expect_bad(&b, "truncated in kv 0 (tok): element 1: string length 1000 exceeds the 10 bytes left");
    b.n = 0; hdr(&b, 3, 0, 1); kv_hdr(&b, "bb", GGUF_TYPE_ARRAY); u32_(&b, GGUF_TYPE_BOOL); u64_(&b, 3);
    u8_(&b, 1); u8_(&b, 0); u8_(&b, 0xff); u64_(&b, 0);
    expect_bad(&b, "kv 0 (bb): element 2: bool value 255 is neither 0 nor 1");
    /* duplicate keys: the second occurrence is reported */
    b.n = 0; hdr(&b, 3, 0, 4); kv_u32(&b, "x.a", 1); kv_u32(&b, "x.b", 1); kv_u32(&b, "x.b", 2); kv_u32(&b, "x.a", 3);
    expect_bad(&b, "kv 2 (x.b): duplicate key (also kv 1)");
    /* names are escaped in messages: the line stays one line */
    b.n = 0; hdr(&b, 3, 0, 1); kv_hdr(&b, "evil\nkey\x1b[31m", 99); u64_(&b, 0);
    expect_bad(&b, "kv 0 (evil\\x0akey\\x1b[31m): unknown value type 99");
    free(b.b);
}

static void test_alignment(void) {
    static const struct { uint32_t type; uint64_t v; const char *frag; } cases[] = {
        { GGUF_TYPE_UINT32, 0, "general.alignment is 0" },
        { GGUF_TYPE_UINT32, 3, "general.alignment 3 is not a power of two" },
        { GGUF_TYPE_UINT32, 48, "general.alignment 48 is not a power of two" },
        { GGUF_TYPE_UINT32, UINT64_C(1) << 31, "general.alignment 2147483648 exceeds the maximum 1048576" },
        { GGUF_TYPE_UINT32, 2u << 20, "exceeds the maximum" },
        { GGUF_TYPE_UINT64, 32, "general.alignment has type u64, expected u32" },
        { GGUF_TYPE_INT32, 32, "general.alignment has type i32, expected u32" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        buf b = { 0 };
        hdr(&b, 3, 1, 1);
        kv_hdr(&b, "general.alignment", cases[i].type);
        put_le(&b, cases[i].v, cases[i].type == GGUF_TYPE_UINT64 ? 8 : 4);
        tensors_(&b, &T_F32, 1, 32);
        expect_bad(&b, cases[i].frag);
        free(b.b);
    }
    /* alignment 1 and 1 MiB are fine */
    static const uint32_t fine[] = { 1, 1u << 20 };
    for (size_t k = 0; k < 2; k++) {
        uint32_t a = fine[k];
        buf b = { 0 };
        hdr(&b, 3, 2, 1);
        kv_u32(&b, "general.alignment", a);
        tspec ts[2] = { T_F16, T_F32 };
        tensors_(&b, ts, 2, a);
        gguf_model *m = expect_ok(&b);
        if (m) CHECK(m->alignment == a && m->shards[0].data_offset % a == 0 && m->tensors[1].offset % a == 0);
        gguf_close(m);
        free(b.b);
    }
}

static void test_tensor_malformations(void) {
    buf b = { 0 };
    tspec t;
#define BAD_TENSOR(spec, frag) do { t = (tspec)spec; b.n = 0; one_tensor(&b, t, 32); expect_bad(&b, frag); } while (0)
    BAD_TENSOR(((tspec){ "a_name_long_enough", 0, { 4 }, 0, AUTO }), "tensor 0 (a_name_long_enough): n_dims 0 outside 1..4");
    BAD_TENSOR(((tspec){ "w", 5, { 1, 1, 1, 1 }, 0, AUTO }), "n_dims 5 outside 1..4");
    BAD_TENSOR(((tspec){ "w", 2, { 4, 0 }, 0, AUTO }), "ne[1] = 0");
    BAD_TENSOR(((tspec){ "w", 2, { 4, (uint64_t)-5 }, 0, AUTO }), "ne[1] = -5 is negative");
    BAD_TENSOR(((tspec){ "w", 1, { UINT64_C(1) << 62 }, 0, AUTO }), "ne[0] = 4611686018427387904 is not below 2^62");
    BAD_TENSOR(((tspec){ "w", 2, { UINT64_C(1) << 40, UINT64_C(1) << 40 }, 0, AUTO }), "element count overflows");
    BAD_TENSOR(((tspec){ "w", 4, { 1 << 16, 1 << 16, 1 << 16, 1 << 16 }, 0, AUTO }), "element count overflows");
    /* the element count fits in int64 but the f32 byte size does not fit in the file */
    BAD_TENSOR(((tspec){ "w", 2, { UINT64_C(1) << 31, UINT64_C(1) << 30 }, 0, AUTO }), "+ 9223372036854775808 bytes past end of file");
    /* ... or does not even fit in 64 bits */
    BAD_TENSOR(((tspec){ "w", 2, { UINT64_C(1) << 31, UINT64_C(1) << 31 }, 0, AUTO }),
               "byte size overflows (2147483648 rows of 8589934592 bytes)");
    /* q8_0: divisibility checked first, then (n / 32) * 34 (which cannot overflow once n <= INT64_MAX) */
    BAD_TENSOR(((tspec){ "w", 1, { 33 }, GGML_TYPE_Q8_0, AUTO }), "ne[0] = 33 is not a multiple of the q8_0 block size 32");
    BAD_TENSOR(((tspec){ "w", 2, { UINT64_C(1) << 61, 3 }, GGML_TYPE_Q8_0, AUTO }), "+ 7349874591868649472 bytes past end");
    {   /* the list of supported types is the type table's, in id order */
        char list[256], want[512];
        snprintf(want, sizeof want, "tensor 0 (blk.0.ffn_down_exps.weight): type 16 (iq2_xxs) is not supported (%s are)",
                 bm_types_supported(list, sizeof list));
        BAD_TENSOR(((tspec){ "blk.0.ffn_down_exps.weight", 1, { 256 }, 16, AUTO }), want);
        CHECK(strncmp(list, "f32, f16, q4_0, q4_1, q5_0, q5_1, q8_0, ", 40) == 0);
    }
    BAD_TENSOR(((tspec){ "w", 1, { 256 }, 19, AUTO }), "type 19 (iq1_s) is not supported");
    BAD_TENSOR(((tspec){ "w", 1, { 256 }, 34, AUTO }), "type 34 (tq1_0) is not supported");
    BAD_TENSOR(((tspec){ "w", 1, { 256 }, 15, AUTO }), "type 15 (q8_K) is not supported");
    /* the K-quants: rows of whole 256-value blocks; the other block types: of whole 32-value blocks */
    BAD_TENSOR(((tspec){ "w", 2, { 320, 2 }, GGML_TYPE_Q4_K, AUTO }), "ne[0] = 320 is not a multiple of the q4_K block size 256");
    BAD_TENSOR(((tspec){ "w", 1, { 128 }, GGML_TYPE_Q6_K, AUTO }), "ne[0] = 128 is not a multiple of the q6_K block size 256");
    BAD_TENSOR(((tspec){ "w", 1, { 255 }, GGML_TYPE_Q5_K, AUTO }), "ne[0] = 255 is not a multiple of the q5_K block size 256");
    BAD_TENSOR(((tspec){ "w", 1, { 48 }, GGML_TYPE_Q4_0, AUTO }), "ne[0] = 48 is not a multiple of the q4_0 block size 32");
    BAD_TENSOR(((tspec){ "w", 1, { 16 }, GGML_TYPE_Q5_0, AUTO }), "ne[0] = 16 is not a multiple of the q5_0 block size 32");
    BAD_TENSOR(((tspec){ "w", 2, { UINT64_C(1) << 56, 4 }, GGML_TYPE_Q6_K, AUTO }), "bytes past end");
    BAD_TENSOR(((tspec){ "w", 1, { 32 }, 4, AUTO }), "type 4 (q4_2 (removed)) is not supported");
    BAD_TENSOR(((tspec){ "w", 1, { 32 }, 1000, AUTO }), "type 1000 (unknown) is not supported");
    BAD_TENSOR(((tspec){ "w", 1, { 32 }, 0xffffffffu, AUTO }), "type 4294967295 (unknown)");
    BAD_TENSOR(((tspec){ "w", 1, { 4 }, 0, 4 }), "offset 4 is not a multiple of the alignment 32");
    BAD_TENSOR(((tspec){ "w", 1, { 4 }, 0, 1u << 23 }), "offset 8388608 (relative to the data section at");
    BAD_TENSOR(((tspec){ "w", 1, { 4 }, 0, UINT64_MAX - 31 }), "is past end of file");
    /* empty / oversized names */
    BAD_TENSOR(((tspec){ "", 1, { 4 }, 0, AUTO }), "tensor 0: empty name");
    b.n = 0; hdr(&b, 3, 1, 0); u64_(&b, UINT64_C(1) << 40); for (int i = 0; i < 40; i++) u8_(&b, 'n');
    expect_bad(&b, "truncated in tensor 0: name length 1099511627776 exceeds the 40 bytes left");

    /* the design's example: data running past the end */
    b.n = 0; hdr(&b, 3, 4, 0);
    tspec ts[4] = { { "blk.0.a", 1, { 8 }, 0, AUTO }, { "blk.0.b", 1, { 8 }, 0, AUTO }, { "blk.0.c", 1, { 8 }, 0, AUTO },
                    { "blk.0.attn_q.weight", 2, { 32, 32 }, 0, AUTO } };
    tensors_(&b, ts, 4, 32);
    b.n -= 1;
    char want[160];
    gguf_model *m = NULL;
    CHECK(gguf_parse_buffer(b.b, b.n, &m, err, sizeof err) == 3);
    uint64_t d0 = (24 + 3 * (8 + 7 + 4 + 8 + 4 + 8) + (8 + 19 + 4 + 16 + 4 + 8) + 31) / 32 * 32;
    snprintf(want, sizeof want, "<buffer>: tensor 3 (blk.0.attn_q.weight): offset %llu + 4096 bytes past end of file (size %zu)",
             (unsigned long long)(d0 + 96), b.n);
    CHECK(!strcmp(err, want));
    if (strcmp(err, want)) fprintf(stderr, "  got  %s\n  want %s\n", err, want);

    /* overlapping data */
    b.n = 0; hdr(&b, 3, 3, 0);
    tspec ov[3] = { { "x", 1, { 16 }, 0, 0 }, { "y", 1, { 8 }, 0, 64 }, { "z", 1, { 16 }, 0, 32 } };
    tensors_(&b, ov, 3, 32);
    expect_bad(&b, "tensor 2 (z): data [");
    expect_bad(&b, "overlaps tensor 0 (x)");
    /* two tensors at the same offset */
    b.n = 0; hdr(&b, 3, 2, 0);
    tspec same[2] = { { "x", 1, { 8 }, 0, 0 }, { "y", 1, { 8 }, 0, 0 } };
    tensors_(&b, same, 2, 32);
    expect_bad(&b, "tensor 1 (y)");
    /* adjacent is fine */
    b.n = 0; hdr(&b, 3, 2, 0);
    tspec adj[2] = { { "x", 1, { 8 }, 0, 32 }, { "y", 1, { 8 }, 0, 0 } };
    tensors_(&b, adj, 2, 32);
    m = expect_ok(&b);
    gguf_close(m);
    /* duplicate names */
    b.n = 0; hdr(&b, 3, 3, 0);
    tspec du[3] = { { "x", 1, { 8 }, 0, AUTO }, { "y", 1, { 8 }, 0, AUTO }, { "x", 1, { 8 }, 0, AUTO } };
    tensors_(&b, du, 3, 32);
    expect_bad(&b, "tensor 2 (x): duplicate tensor name (also tensor 0)");
    /* truncated inside the tensor infos */
    b.n = 0; hdr(&b, 3, 1, 0); str_(&b, "w"); u32_(&b, 2); u64_(&b, 4); u64_(&b, 1); u32_(&b, 0);
    expect_bad(&b, "truncated in tensor 0 (w): offset needs 8 bytes, 0 left");
    /* a long hostile name is shortened in the message */
    char longname[300];
    memset(longname, 'q', sizeof longname - 1);
    longname[sizeof longname - 1] = '\0';
    b.n = 0; t = (tspec){ longname, 1, { 4 }, 0, 4 }; one_tensor(&b, t, 32);
    expect_bad(&b, "qqq...): offset 4");
    CHECK(strlen(err) < 200);
    free(b.b);
#undef BAD_TENSOR
}

static void test_type_helpers(void) {
    CHECK(ggml_type_nbytes(GGML_TYPE_F32, 3) == 12);
    CHECK(ggml_type_nbytes(GGML_TYPE_F16, 3) == 6);
    CHECK(ggml_type_nbytes(GGML_TYPE_Q8_0, 64) == 68);
    CHECK(ggml_type_nbytes(GGML_TYPE_Q8_0, 33) == 0);
    CHECK(ggml_type_nbytes(GGML_TYPE_F32, UINT64_MAX / 2) == 0);
    CHECK(ggml_type_nbytes(16, 256) == 0); /* iq2_xxs: not supported */
    CHECK(ggml_type_block(GGML_TYPE_Q8_0) == 32 && ggml_type_block(16) == 0);
    CHECK(ggml_type_nbytes(GGML_TYPE_Q4_K, 512) == 288 && ggml_type_nbytes(GGML_TYPE_Q4_K, 300) == 0);
    CHECK(ggml_type_nbytes(GGML_TYPE_Q5_K, 256) == 176 && ggml_type_nbytes(GGML_TYPE_Q6_K, 256) == 210);
    CHECK(ggml_type_nbytes(GGML_TYPE_Q4_0, 32) == 18 && ggml_type_nbytes(GGML_TYPE_Q5_0, 64) == 44);
    CHECK(ggml_type_nbytes(GGML_TYPE_BF16, 3) == 6 && ggml_type_block(GGML_TYPE_Q6_K) == 256);
    CHECK(!strcmp(ggml_type_name(12), "q4_K") && !strcmp(ggml_type_name(8), "q8_0") &&
          !strcmp(ggml_type_name(12345), "unknown") && !strcmp(ggml_type_name(UINT32_MAX), "unknown"));
    CHECK(!strcmp(gguf_type_name(GGUF_TYPE_STRING), "string") && !strcmp(gguf_type_name(99), "unknown"));
    gguf_str s = { "abc", 3 };
    CHECK(gguf_str_eq(s, "abc") && !gguf_str_eq(s, "ab") && !gguf_str_eq(s, "abcd") && !gguf_str_eq(s, NULL));
    /* NULL-safety of the API */
    gguf_close(NULL);
    CHECK(gguf_find_kv(NULL, "a") == NULL && gguf_find_tensor(NULL, "a") == NULL);
    gguf_model *m = NULL;
    CHECK(gguf_parse_buffer(NULL, 0, &m, err, sizeof err) == 3 && m == NULL);
    CHECK(gguf_parse_buffer((const uint8_t *)"GGUF", 4, &m, NULL, 0) == 3); /* no error buffer */
    char tiny[8];
    CHECK(gguf_parse_buffer((const uint8_t *)"GGUF", 4, &m, tiny, sizeof tiny) == 3 && strlen(tiny) == 7);
}

/* ---------------------------------------------------------------------------------------------- */
/* files and split models                                                                         */

static char dir[256];

static void write_file(const char *name, const buf *b) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    if (!f) { perror(p); abort(); }
    if (b->n) fwrite(b->b, 1, b->n, f);
    fclose(f);
}

static int open_(const char *name, gguf_model **m) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    *m = NULL;
    return gguf_open(p, m, err, sizeof err);
}

/* shard s (0-based) of n: split.no, split.count (u16 as llama.cpp writes them), split.tensors.count (i32) */
static void shard(buf *b, int s, int n, int total, int nt, int first_tensor, int meta) {
    b->n = 0;
    hdr(b, 3, (uint64_t)nt, meta ? 5 : 3);
    if (meta) { kv_str(b, "general.architecture", "test"); kv_u32(b, "test.block_count", 2); }
    kv_u16(b, "split.no", (uint16_t)s);
    kv_u16(b, "split.count", (uint16_t)n);
    kv_i32(b, "split.tensors.count", total);
    tspec ts[8];
    char names[8][16];
    for (int i = 0; i < nt; i++) {
        snprintf(names[i], sizeof names[i], "t%d", first_tensor + i);
        ts[i] = (tspec){ names[i], 1, { 8 }, 0, AUTO };
    }
    tensors_(b, ts, nt, 32);
}

static void write_split4(void) { /* metadata-only first shard, 3 data shards of 2 tensors */
    buf b = { 0 };
    char name[64];
    for (int s = 0; s < 4; s++) {
        shard(&b, s, 4, 6, s ? 2 : 0, s ? 2 * (s - 1) : 0, s == 0);
        snprintf(name, sizeof name, "m-%05d-of-00004.gguf", s + 1);
        write_file(name, &b);
    }
    free(b.b);
}

static void test_files(void) {
    buf b = { 0 };
    build_every_type(&b);
    write_file("plain.gguf", &b);
    gguf_model *m;
    CHECK(open_("plain.gguf", &m) == 0 && m);
    if (m) {
        CHECK(m->n_shards == 1 && m->shards[0].fd >= 0 && m->shards[0].size == b.n && m->n_tensors == 3);
        CHECK(strstr(m->shards[0].path, "/plain.gguf") != NULL);
        /* the data is where the reader says: read it back through the kept fd */
        const gguf_tensor *c = gguf_find_tensor(m, "c.weight");
        uint8_t tmp[512];
        CHECK(c && c->nbytes <= sizeof tmp && pread(m->shards[0].fd, tmp, c->nbytes, (off_t)c->offset) == (ssize_t)c->nbytes &&
              !memcmp(tmp, b.b + c->offset, c->nbytes));
        gguf_str s;
        CHECK(gguf_get_str(m, "general.architecture", &s, err, sizeof err) == 1 && gguf_str_eq(s, "test"));
        CHECK(gguf_get_u64(m, "general.architecture", NULL, err, sizeof err) == -1 && !strstr(err, "plain.gguf"));
    }
    gguf_close(m);

    /* unreadable: EIO, one line naming the file */
    CHECK(open_("missing.gguf", &m) == BMOE_GGUF_EIO && !m && strstr(err, "missing.gguf: cannot open: No such file"));
    CHECK(one_line(err));
    CHECK(open_("", &m) == BMOE_GGUF_EIO && strstr(err, "Is a directory"));
    char p[512];
    snprintf(p, sizeof p, "%s/fifo.gguf", dir);
    if (mkfifo(p, 0600) == 0) { /* must not block waiting for a writer */
        CHECK(open_("fifo.gguf", &m) == BMOE_GGUF_EIO && strstr(err, "not a regular file"));
        unlink(p);
    }
    if (geteuid() != 0) {
        write_file("noperm.gguf", &b);
        snprintf(p, sizeof p, "%s/noperm.gguf", dir);
        chmod(p, 0);
        CHECK(open_("noperm.gguf", &m) == BMOE_GGUF_EIO && strstr(err, "Permission denied"));
        unlink(p);
    }
    CHECK(gguf_open(NULL, &m, err, sizeof err) == BMOE_GGUF_EIO && m == NULL);
    /* malformed: status 3 with the file's name */
    buf e = { 0 };
    write_file("empty.gguf", &e);
    CHECK(open_("empty.gguf", &m) == BMOE_GGUF_EMALFORMED && strstr(err, "empty.gguf: empty file"));
    buf t = { 0 };
    put(&t, b.b, b.n - 5);
    write_file("short.gguf", &t);
    CHECK(open_("short.gguf", &m) == BMOE_GGUF_EMALFORMED && strstr(err, "short.gguf: tensor 2 (c.weight)") &&
          strstr(err, "past end of file"));
    free(b.b);
    free(t.b);
}

static void test_split(void) {
    gguf_model *m;
    write_split4();
    CHECK(open_("m-00001-of-00004.gguf", &m) == 0 && m);
    if (m) {
        CHECK(m->n_shards == 4 && m->n_tensors == 6 && m->n_kv == 5);
        uint64_t u;
        CHECK(gguf_get_u64(m, "test.block_count", &u, err, sizeof err) == 1 && u == 2);
        CHECK(gguf_get_u64(m, "split.count", &u, err, sizeof err) == 1 && u == 4);
        for (int i = 0; i < 6; i++) {
            char nm[16];
            snprintf(nm, sizeof nm, "t%d", i);
            const gguf_tensor *t = gguf_find_tensor(m, nm);
            CHECK(t && t->shard == (uint32_t)(1 + i / 2) && t->offset == m->shards[t->shard].data_offset + (uint64_t)(i % 2) * 32);
        }
        for (uint32_t s = 0; s < 4; s++) CHECK(m->shards[s].fd >= 0);
        CHECK(strstr(m->shards[3].path, "m-00004-of-00004.gguf") != NULL);
        CHECK(m->tensors[0].shard == 1 && m->tensors[5].shard == 3); /* shard by shard in file order */
    }
    gguf_close(m);

    /* not the first shard */
    CHECK(open_("m-00002-of-00004.gguf", &m) == 3 && strstr(err, "split.no 1: this is shard 2 of 4; pass the first shard (") &&
          strstr(err, "/m-00001-of-00004.gguf)"));

    buf b = { 0 };
    /* a missing shard: EIO naming the missing file */
    char p[512];
    snprintf(p, sizeof p, "%s/m-00003-of-00004.gguf", dir);
    unlink(p);
    CHECK(open_("m-00001-of-00004.gguf", &m) == BMOE_GGUF_EIO && strstr(err, "m-00003-of-00004.gguf: cannot open shard 3 of 4: No such file"));
    CHECK(one_line(err));
    /* inconsistent shards: the shard and the key are named */
    shard(&b, 1, 4, 6, 2, 2, 0); /* split.no 1 where 2 belongs */
    write_file("m-00003-of-00004.gguf", &b);
    CHECK(open_("m-00001-of-00004.gguf", &m) == 3 &&
          strstr(err, "m-00003-of-00004.gguf: split.no is 1, expected 2 for file 00003 of 00004 (split.no counts from 0)"));
    shard(&b, 2, 5, 6, 2, 2, 0);
    write_file("m-00003-of-00004.gguf", &b);
    CHECK(open_("m-00001-of-00004.gguf", &m) == 3 && strstr(err, "m-00003-of-00004.gguf: split.count is 5, expected 4 (as in "));
    shard(&b, 2, 4, 7, 2, 2, 0);
    write_file("m-00003-of-00004.gguf", &b);
    CHECK(open_("m-00001-of-00004.gguf", &m) == 3 && strstr(err, "m-00003-of-00004.gguf: split.tensors.count is 7, expected 6"));
    shard(&b, 2, 4, 6, 1, 2, 0); /* one tensor fewer than promised */
    write_file("m-00003-of-00004.gguf", &b);
    CHECK(open_("m-00001-of-00004.gguf", &m) == 3 && strstr(err, "m-00001-of-00004.gguf: split.tensors.count is 6 but the 4 shards hold 5 tensors"));
    shard(&b, 2, 4, 6, 2, 0, 0); /* t0, t1 again */
    write_file("m-00003-of-00004.gguf", &b);
    CHECK(open_("m-00001-of-00004.gguf", &m) == 3 && strstr(err, "m-00003-of-00004.gguf: tensor 0 (t0): duplicate tensor name (also tensor 0 of ") &&
          strstr(err, "m-00002-of-00004.gguf)"));
    b.n = 0; hdr(&b, 3, 0, 0);
    write_file("m-00003-of-00004.gguf", &b);
    CHECK(open_("m-00001-of-00004.gguf", &m) == 3 && strstr(err, "m-00003-of-00004.gguf: split.count is missing (expected 4"));
    b.n = 0; put(&b, "GGML", 4);
    write_file("m-00003-of-00004.gguf", &b);
    CHECK(open_("m-00001-of-00004.gguf", &m) == 3 && strstr(err, "m-00003-of-00004.gguf: truncated header") == NULL &&
          strstr(err, "m-00003-of-00004.gguf: not a GGUF file"));
    shard(&b, 2, 4, 6, 2, 2, 0);
    write_file("m-00003-of-00004.gguf", &b);
    CHECK(open_("m-00001-of-00004.gguf", &m) == 0);
    gguf_close(m);

    /* the first shard's own keys */
    shard(&b, 0, 4, 6, 0, 0, 1);
    write_file("solo.gguf", &b); /* split.count 4 but not a shard name */
    CHECK(open_("solo.gguf", &m) == 3 && strstr(err, "split.count is 4 but the file name does not end in -00001-of-00004.gguf"));
    write_file("x-00001-of-00003.gguf", &b); /* name and split.count disagree */
    CHECK(open_("x-00001-of-00003.gguf", &m) == 3 && strstr(err, "-00001-of-00004.gguf"));
    b.n = 0; hdr(&b, 3, 0, 2); kv_u16(&b, "split.count", 4); kv_u16(&b, "split.no", 0);
    write_file("y-00001-of-00004.gguf", &b);
    CHECK(open_("y-00001-of-00004.gguf", &m) == 3 && strstr(err, "split.tensors.count is missing"));
    b.n = 0; hdr(&b, 3, 0, 1); kv_u16(&b, "split.count", 0);
    write_file("z.gguf", &b);
    CHECK(open_("z.gguf", &m) == 3 && strstr(err, "split.count is 0"));
    b.n = 0; hdr(&b, 3, 0, 1); kv_u32(&b, "split.count", 100000);
    write_file("z.gguf", &b);
    CHECK(open_("z.gguf", &m) == 3 && strstr(err, "split.count 100000 exceeds the supported maximum 256"));
    b.n = 0; hdr(&b, 3, 0, 1); kv_str(&b, "split.count", "4");
    write_file("z.gguf", &b);
    CHECK(open_("z.gguf", &m) == 3 && strstr(err, "split.count has type string, expected an integer"));
    b.n = 0; hdr(&b, 3, 0, 2); kv_u16(&b, "split.count", 2); kv_i32(&b, "split.no", -1);
    write_file("w-00001-of-00002.gguf", &b);
    CHECK(open_("w-00001-of-00002.gguf", &m) == 3 && strstr(err, "split.no = -1 is negative"));
    /* split.count 1 is a plain file; a plain file may carry a shard-like name */
    b.n = 0; hdr(&b, 3, 1, 2); kv_u16(&b, "split.count", 1); kv_u16(&b, "split.no", 0);
    tensors_(&b, &T_F32, 1, 32);
    write_file("one-00001-of-00001.gguf", &b);
    CHECK(open_("one-00001-of-00001.gguf", &m) == 0 && m && m->n_shards == 1 && m->n_tensors == 1);
    gguf_close(m);
    b.n = 0; hdr(&b, 3, 1, 0); tensors_(&b, &T_F32, 1, 32);
    write_file("p-00002-of-00004.gguf", &b);
    CHECK(open_("p-00002-of-00004.gguf", &m) == 0 && m && m->n_shards == 1);
    gguf_close(m);

    /* the first shard may also hold tensors; shards may use their own alignment */
    shard(&b, 0, 2, 3, 1, 0, 1);
    write_file("q-00001-of-00002.gguf", &b);
    b.n = 0; hdr(&b, 3, 2, 4);
    kv_u16(&b, "split.no", 1); kv_u16(&b, "split.count", 2); kv_i32(&b, "split.tensors.count", 3);
    kv_u32(&b, "general.alignment", 128);
    tspec ts[2] = { { "t1", 1, { 8 }, 0, AUTO }, { "t2", 1, { 8 }, 0, AUTO } };
    tensors_(&b, ts, 2, 128);
    write_file("q-00002-of-00002.gguf", &b);
    CHECK(open_("q-00001-of-00002.gguf", &m) == 0 && m);
    if (m) {
        const gguf_tensor *t2 = gguf_find_tensor(m, "t2");
        CHECK(m->n_tensors == 3 && m->alignment == 32 && m->shards[1].data_offset % 128 == 0 && t2 && t2->shard == 1 &&
              t2->offset == m->shards[1].data_offset + 128);
    }
    gguf_close(m);
    free(b.b);
}

static int rm_rf(const char *d) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", d);
    return system(cmd);
}

int main(void) {
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/test_gguf.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) { perror("mkdtemp"); return 1; }
    test_valid();
    test_truncation_everywhere();
    test_header();
    test_kv_malformations();
    test_alignment();
    test_tensor_malformations();
    test_type_helpers();
    test_files();
    test_split();
    (void)rm_rf(dir);
    return check_report("test_gguf");
}
