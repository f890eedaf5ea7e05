/* GGUF reader. See gguf.h for the contract.
 *
 * Rules followed throughout (each one answers a known class of GGUF parser bugs):
 * - every multi-byte field is decoded byte by byte, little-endian, from a bounds-checked cursor
 *   (no unaligned loads, no host-endianness assumptions);
 * - a length or count is compared with the bytes that remain (`n > left`, `n > left / size`), never by
 *   computing `pos + n` first; counts are bounded by what the file could hold BEFORE anything is
 *   allocated for them;
 * - enums read from the file are range-checked before they index a table;
 * - element counts and byte sizes are computed with explicit overflow checks, block types divided
 *   first (ne[0] must be a multiple of the block) and multiplied after;
 * - no assert(), no abort(): every problem becomes a status and one line of text. */
#include "gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define GGUF_HEADER_BYTES 24
#define MIN_KV_BYTES 14  /* key length 8 + key >= 1 byte + value type 4 + smallest value 1 */
#define MIN_TI_BYTES 33  /* name length 8 + name >= 1 + n_dims 4 + one ne 8 + type 4 + offset 8 */
#define NE_LIMIT (UINT64_C(1) << 62)
#define BUFFER_LABEL "<buffer>"

/* ------------------------------------------------------------------------------------------------ */
/* type tables                                                                                      */

static const char *const kv_type_names[GGUF_TYPE_COUNT] = {
    "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64",
};
static const uint8_t kv_type_size[GGUF_TYPE_COUNT] = { 1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8 };

const char *gguf_type_name(uint32_t type) {
    return type < GGUF_TYPE_COUNT ? kv_type_names[type] : "unknown";
}

const char *ggml_type_name(uint32_t type) { return bm_type_name(type); }

uint32_t ggml_type_block(uint32_t type) {
    const bm_type_traits *t = bm_type(type);
    return t ? t->blck : 0;
}

uint64_t ggml_type_nbytes(uint32_t type, uint64_t n) { return bm_type_nbytes(type, n); }

int gguf_str_eq(gguf_str s, const char *c) {
    if (!c) return 0;
    size_t n = strlen(c);
    return s.len == n && (n == 0 || (s.ptr && memcmp(s.ptr, c, n) == 0));
}

/* ------------------------------------------------------------------------------------------------ */
/* arena                                                                                            */

typedef struct ablock { struct ablock *next; size_t used, cap; } ablock;
#define ABLOCK_HDR ((sizeof(ablock) + 15) & ~(size_t)15)
#define ABLOCK_DEFAULT (64 * 1024)

typedef struct gguf_priv {
    ablock *blocks;           /* head is the current bump block */
    const gguf_kv **kv_sorted;
    const gguf_tensor **t_sorted;
} gguf_priv;

/* Links a full block into the arena without making it the current bump block. */
static void arena_link(gguf_priv *pv, ablock *nb) {
    ablock *b = pv->blocks;
    if (b) {
        nb->next = b->next;
        b->next = nb;
    } else {
        nb->next = NULL;
        pv->blocks = nb;
    }
}

/* n bytes aligned to `align` (1 for string bytes, 16 for structs) */
static void *arena_alloc_aligned(gguf_priv *pv, uint64_t n, size_t align) {
    if (n > (uint64_t)SIZE_MAX - 2 * ABLOCK_HDR - 16) return NULL;
    size_t need = (size_t)n ? (size_t)n : 1;
    ablock *b = pv->blocks;
    if (b) {
        size_t at = (b->used + align - 1) & ~(align - 1);
        if (at <= b->cap && b->cap - at >= need) {
            b->used = at + need;
            return (char *)b + ABLOCK_HDR + at;
        }
    }
    if (need > ABLOCK_DEFAULT / 4) { /* a dedicated block: keep the current one current */
        ablock *nb = malloc(ABLOCK_HDR + need);
        if (!nb) return NULL;
        nb->cap = nb->used = need;
        arena_link(pv, nb);
        return (char *)nb + ABLOCK_HDR;
    }
    ablock *nb = malloc(ABLOCK_HDR + ABLOCK_DEFAULT);
    if (!nb) return NULL;
    nb->cap = ABLOCK_DEFAULT;
    nb->used = need;
    nb->next = b;
    pv->blocks = nb;
    return (char *)nb + ABLOCK_HDR;
}

static void *arena_alloc(gguf_priv *pv, uint64_t n) { return arena_alloc_aligned(pv, n, 16); }

static void *arena_zalloc(gguf_priv *pv, uint64_t n) {
    void *p = arena_alloc(pv, n);
    if (p) memset(p, 0, (size_t)n);
    return p;
}

/* n elements of `size` bytes, overflow-checked */
static void *arena_array(gguf_priv *pv, uint64_t n, uint64_t size) {
    if (size && n > UINT64_MAX / size) return NULL;
    return arena_zalloc(pv, n * size);
}

/* A growable array of fixed-size elements in one malloc'd block, adopted by the arena when complete.
 * Tables whose length the file claims (key-value pairs, tensor infos, string arrays) grow with what
 * has actually been parsed, so a count that passes the size bound but is followed by garbage costs
 * no more memory than the bytes read so far. */
typedef struct gvec {
    ablock *blk;
    size_t es;
    uint64_t n, cap, max;
} gvec;

static void *gvec_push(gvec *v) {
    if (v->n == v->cap) {
        uint64_t nc = v->cap ? v->cap * 2 : 16;
        if (nc > v->max) nc = v->max;
        if (nc <= v->n || nc > ((uint64_t)SIZE_MAX - ABLOCK_HDR) / v->es) return NULL;
        ablock *nb = realloc(v->blk, ABLOCK_HDR + (size_t)nc * v->es);
        if (!nb) return NULL;
        v->blk = nb;
        v->cap = nc;
    }
    void *p = (char *)v->blk + ABLOCK_HDR + (size_t)v->n * v->es;
    memset(p, 0, v->es);
    v->n++;
    return p;
}

/* Hands the block to the arena; returns the elements (NULL when empty). */
static void *gvec_adopt(gguf_priv *pv, gvec *v) {
    if (!v->blk) return NULL;
    ablock *b = v->blk;
    b->cap = b->used = (size_t)v->cap * v->es;
    arena_link(pv, b);
    v->blk = NULL;
    return (char *)b + ABLOCK_HDR;
}

static void gvec_free(gvec *v) {
    free(v->blk);
    v->blk = NULL;
}

static void priv_free(gguf_priv *pv) {
    if (!pv) return;
    ablock *b = pv->blocks;
    while (b) {
        ablock *nx = b->next;
        free(b);
        b = nx;
    }
    free(pv);
}

/* ------------------------------------------------------------------------------------------------ */
/* errors                                                                                           */

#define ESC_MAX 300

typedef struct ectx {
    char *err;
    size_t errlen;
    const char *label;  /* the file name messages start with */
    char where[ESC_MAX + 64];
} ectx;

/* Keeps the message on one printable line whatever a path or name contains. */
static void sanitize_line(char *s) {
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c < 0x20 || c == 0x7f) *s = '?';
    }
}

static int fail(ectx *e, int status, const char *fmt, ...) {
    if (e->err && e->errlen) {
        int n = snprintf(e->err, e->errlen, "%s: ", e->label);
        if (n >= 0 && (size_t)n < e->errlen) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(e->err + n, e->errlen - (size_t)n, fmt, ap);
            va_end(ap);
        }
        sanitize_line(e->err);
    }
    return status;
}

/* Escaped, shortened copy of a name read from the file, for messages. buf has ESC_MAX bytes. */
static const char *esc(char *buf, const char *p, uint64_t len) {
    static const char hex[] = "0123456789abcdef";
    size_t o = 0;
    uint64_t shown = len > 64 ? 64 : len;
    for (uint64_t i = 0; i < shown; i++) {
        unsigned char c = (unsigned char)p[i];
        if (c >= 0x20 && c < 0x7f && c != '\\') {
            buf[o++] = (char)c;
        } else {
            buf[o++] = '\\';
            buf[o++] = 'x';
            buf[o++] = hex[c >> 4];
            buf[o++] = hex[c & 15];
        }
    }
    if (shown < len) {
        memcpy(buf + o, "...", 3);
        o += 3;
    }
    buf[o] = '\0';
    return buf;
}

static const char *escs(char *buf, gguf_str s) { return esc(buf, s.ptr, s.len); }

typedef unsigned long long ull;

/* ------------------------------------------------------------------------------------------------ */
/* cursor                                                                                           */

typedef struct cur {
    const uint8_t *b;
    uint64_t size, pos;
} cur;

static uint64_t cur_left(const cur *c) { return c->size - c->pos; }

static uint64_t le_load(const uint8_t *p, unsigned n) {
    uint64_t v = 0;
    for (unsigned i = n; i-- > 0;) v = (v << 8) | p[i];
    return v;
}

/* Reads an n-byte (1..8) little-endian field named `what`. */
static int rd(cur *c, ectx *e, unsigned n, const char *what, uint64_t *out) {
    *out = 0;
    if (cur_left(c) < n)
        return fail(e, BMOE_GGUF_EMALFORMED, "truncated in %s: %s needs %u bytes, %llu left", e->where,
                    what, n, (ull)cur_left(c));
    *out = le_load(c->b + c->pos, n);
    c->pos += n;
    return 0;
}

/* Reads a GGUF string (u64 length + bytes) into the arena, NUL-terminated. `what` names it in messages
 * ("key", "string", "name", "element 5"). is_name: keys and tensor names (non-empty, bounded, no NUL). */
static int rd_str(cur *c, ectx *e, gguf_priv *pv, const char *what, int is_name, gguf_str *out) {
    uint64_t len;
    char w[96];
    snprintf(w, sizeof w, "%s length", what);
    int rc = rd(c, e, 8, w, &len);
    if (rc) return rc;
    if (len > cur_left(c))
        return fail(e, BMOE_GGUF_EMALFORMED, "truncated in %s: %s length %llu exceeds the %llu bytes left",
                    e->where, what, (ull)len, (ull)cur_left(c));
    if (is_name) {
        if (len == 0) return fail(e, BMOE_GGUF_EMALFORMED, "%s: empty %s", e->where, what);
        if (len > GGUF_MAX_NAME_LEN)
            return fail(e, BMOE_GGUF_EMALFORMED, "%s: %s length %llu exceeds the maximum %u", e->where,
                        what, (ull)len, GGUF_MAX_NAME_LEN);
        if (memchr(c->b + c->pos, 0, (size_t)len))
            return fail(e, BMOE_GGUF_EMALFORMED, "%s: %s contains a NUL byte", e->where, what);
    }
    char *p = arena_alloc_aligned(pv, len + 1, 1);
    if (!p) return fail(e, BMOE_GGUF_ENOMEM, "out of memory (%s of %llu bytes)", what, (ull)len);
    if (len) memcpy(p, c->b + c->pos, (size_t)len);
    p[len] = '\0';
    c->pos += len;
    out->ptr = p;
    out->len = len;
    return 0;
}

/* ------------------------------------------------------------------------------------------------ */
/* sorting and lookup                                                                               */

static int str_cmp(gguf_str a, gguf_str b) {
    uint64_t n = a.len < b.len ? a.len : b.len;
    int r = n ? memcmp(a.ptr, b.ptr, (size_t)n) : 0;
    if (r) return r;
    return a.len < b.len ? -1 : a.len > b.len ? 1 : 0;
}

static int cstr_cmp(gguf_str a, const char *k, size_t klen) {
    gguf_str b = { k, klen };
    return str_cmp(a, b);
}

/* kv and tensor pointers sort by name, ties by address (= file order): a total, deterministic order */
static int kvp_cmp(const void *x, const void *y) {
    const gguf_kv *a = *(const gguf_kv *const *)x, *b = *(const gguf_kv *const *)y;
    int r = str_cmp(a->key, b->key);
    return r ? r : (a < b ? -1 : a > b);
}

static int tp_cmp(const void *x, const void *y) {
    const gguf_tensor *a = *(const gguf_tensor *const *)x, *b = *(const gguf_tensor *const *)y;
    int r = str_cmp(a->name, b->name);
    return r ? r : (a < b ? -1 : a > b);
}

static int tp_off_cmp(const void *x, const void *y) {
    const gguf_tensor *a = *(const gguf_tensor *const *)x, *b = *(const gguf_tensor *const *)y;
    if (a->shard != b->shard) return a->shard < b->shard ? -1 : 1;
    if (a->offset != b->offset) return a->offset < b->offset ? -1 : 1;
    return a < b ? -1 : a > b;
}

static const gguf_kv *kv_lookup(const gguf_kv **sorted, const gguf_kv *kv, uint64_t n, const char *key) {
    if (!key) return NULL;
    size_t klen = strlen(key);
    if (sorted) {
        uint64_t lo = 0, hi = n;
        while (lo < hi) {
            uint64_t mid = lo + (hi - lo) / 2;
            int r = cstr_cmp(sorted[mid]->key, key, klen);
            if (r == 0) return sorted[mid];
            if (r < 0) lo = mid + 1;
            else hi = mid;
        }
        return NULL;
    }
    for (uint64_t i = 0; i < n; i++)
        if (cstr_cmp(kv[i].key, key, klen) == 0) return &kv[i];
    return NULL;
}

/* ------------------------------------------------------------------------------------------------ */
/* one GGUF image                                                                                   */

typedef struct image {
    uint64_t n_kv;
    gguf_kv *kv;
    const gguf_kv **kv_sorted;
    uint64_t n_tensors;
    gguf_tensor *tensors;  /* offsets absolute */
    uint64_t alignment;
    uint64_t data_offset;
    uint64_t size;
} image;

static int decode_scalar(cur *c, ectx *e, uint32_t type, gguf_kv *kv) {
    uint64_t raw;
    char what[32];
    snprintf(what, sizeof what, "value (%s)", kv_type_names[type]);
    int rc = rd(c, e, kv_type_size[type], what, &raw);
    if (rc) return rc;
    switch (type) {
    case GGUF_TYPE_UINT8: case GGUF_TYPE_UINT16: case GGUF_TYPE_UINT32: case GGUF_TYPE_UINT64:
        kv->v.u = raw;
        break;
    case GGUF_TYPE_BOOL:
        if (raw > 1) return fail(e, BMOE_GGUF_EMALFORMED, "%s: bool value %llu is neither 0 nor 1", e->where, (ull)raw);
        kv->v.u = raw;
        break;
    case GGUF_TYPE_INT8: kv->v.i = (int8_t)(uint8_t)raw; break;
    case GGUF_TYPE_INT16: kv->v.i = (int16_t)(uint16_t)raw; break;
    case GGUF_TYPE_INT32: kv->v.i = (int32_t)(uint32_t)raw; break;
    case GGUF_TYPE_INT64: {
        int64_t s;
        memcpy(&s, &raw, sizeof s);
        kv->v.i = s;
        break;
    }
    case GGUF_TYPE_FLOAT32: {
        uint32_t r32 = (uint32_t)raw;
        float f;
        memcpy(&f, &r32, sizeof f);
        kv->v.f = f;
        break;
    }
    case GGUF_TYPE_FLOAT64: {
        double d;
        memcpy(&d, &raw, sizeof d);
        kv->v.f = d;
        break;
    }
    default:
        return fail(e, BMOE_GGUF_EMALFORMED, "%s: internal: not a scalar type %u", e->where, type);
    }
    return 0;
}

static int parse_array(cur *c, ectx *e, gguf_priv *pv, gguf_kv *kv) {
    uint64_t at, n;
    int rc = rd(c, e, 4, "array element type", &at);
    if (rc) return rc;
    if (at == GGUF_TYPE_ARRAY)
        return fail(e, BMOE_GGUF_EMALFORMED, "%s: nested arrays are not supported (array of arrays)", e->where);
    if (at >= GGUF_TYPE_COUNT)
        return fail(e, BMOE_GGUF_EMALFORMED, "%s: unknown array element type %llu", e->where, (ull)at);
    rc = rd(c, e, 8, "array length", &n);
    if (rc) return rc;
    kv->arr_type = (uint32_t)at;
    kv->n = n;
    kv->data = NULL;
    if (at == GGUF_TYPE_STRING) {
        /* every element takes at least its 8-byte length */
        if (n > cur_left(c) / 8)
            return fail(e, BMOE_GGUF_EMALFORMED,
                        "truncated in %s: array of %llu strings cannot fit in the %llu bytes left", e->where,
                        (ull)n, (ull)cur_left(c));
        if (n == 0) return 0;
        gvec v = { NULL, sizeof(gguf_str), 0, 0, n };
        for (uint64_t j = 0; j < n; j++) {
            char what[48];
            snprintf(what, sizeof what, "element %llu: string", (ull)j);
            gguf_str *s = gvec_push(&v);
            if (!s) {
                gvec_free(&v);
                return fail(e, BMOE_GGUF_ENOMEM, "out of memory (array of %llu strings)", (ull)n);
            }
            if ((rc = rd_str(c, e, pv, what, 0, s))) {
                gvec_free(&v);
                return rc;
            }
        }
        kv->data = gvec_adopt(pv, &v);
        return 0;
    }
    unsigned es = kv_type_size[at];
    if (n > cur_left(c) / es)
        return fail(e, BMOE_GGUF_EMALFORMED,
                    "truncated in %s: array of %llu %s (%u bytes each) exceeds the %llu bytes left", e->where,
                    (ull)n, kv_type_names[at], es, (ull)cur_left(c));
    if (n == 0) return 0;
    uint8_t *d = arena_array(pv, n, es);
    if (!d) return fail(e, BMOE_GGUF_ENOMEM, "out of memory (array of %llu %s)", (ull)n, kv_type_names[at]);
    const uint8_t *src = c->b + c->pos;
    for (uint64_t j = 0; j < n; j++) {
        uint64_t raw = le_load(src + j * es, es);
        switch (es) {
        case 1:
            if (at == GGUF_TYPE_BOOL && raw > 1)
                return fail(e, BMOE_GGUF_EMALFORMED, "%s: element %llu: bool value %llu is neither 0 nor 1",
                            e->where, (ull)j, (ull)raw);
            d[j] = (uint8_t)raw;
            break;
        case 2: { uint16_t v = (uint16_t)raw; memcpy(d + j * 2, &v, 2); break; }
        case 4: { uint32_t v = (uint32_t)raw; memcpy(d + j * 4, &v, 4); break; }
        default: memcpy(d + j * 8, &raw, 8); break;
        }
    }
    c->pos += n * es;
    kv->data = d;
    return 0;
}

static int parse_kv(cur *c, ectx *e, gguf_priv *pv, uint64_t i, gguf_kv *kv) {
    char nb[ESC_MAX];
    snprintf(e->where, sizeof e->where, "kv %llu", (ull)i);
    int rc = rd_str(c, e, pv, "key", 1, &kv->key);
    if (rc) return rc;
    snprintf(e->where, sizeof e->where, "kv %llu (%s)", (ull)i, escs(nb, kv->key));
    uint64_t t;
    rc = rd(c, e, 4, "value type", &t);
    if (rc) return rc;
    if (t >= GGUF_TYPE_COUNT)
        return fail(e, BMOE_GGUF_EMALFORMED, "%s: unknown value type %llu", e->where, (ull)t);
    kv->type = (uint32_t)t;
    kv->n = 1;
    if (t == GGUF_TYPE_STRING) return rd_str(c, e, pv, "string", 0, &kv->str);
    if (t == GGUF_TYPE_ARRAY) return parse_array(c, e, pv, kv);
    return decode_scalar(c, e, (uint32_t)t, kv);
}

static int parse_tensor_info(cur *c, ectx *e, gguf_priv *pv, uint64_t i, gguf_tensor *t) {
    char nb[ESC_MAX];
    snprintf(e->where, sizeof e->where, "tensor %llu", (ull)i);
    int rc = rd_str(c, e, pv, "name", 1, &t->name);
    if (rc) return rc;
    snprintf(e->where, sizeof e->where, "tensor %llu (%s)", (ull)i, escs(nb, t->name));
    uint64_t nd;
    rc = rd(c, e, 4, "n_dims", &nd);
    if (rc) return rc;
    if (nd < 1 || nd > GGUF_MAX_DIMS)
        return fail(e, BMOE_GGUF_EMALFORMED, "%s: n_dims %llu outside 1..%d", e->where, (ull)nd, GGUF_MAX_DIMS);
    t->n_dims = (uint32_t)nd;
    for (unsigned d = 0; d < GGUF_MAX_DIMS; d++) t->ne[d] = 1;
    for (unsigned d = 0; d < nd; d++) {
        char what[16];
        snprintf(what, sizeof what, "ne[%u]", d);
        uint64_t v;
        rc = rd(c, e, 8, what, &v);
        if (rc) return rc;
        if (v > (uint64_t)INT64_MAX) /* negative as int64: print it without a signed overflow */
            return fail(e, BMOE_GGUF_EMALFORMED, "%s: ne[%u] = %lld is negative", e->where, d,
                        -(long long)(~v) - 1);
        if (v == 0)
            return fail(e, BMOE_GGUF_EMALFORMED, "%s: ne[%u] = 0 (every dimension must be at least 1)",
                        e->where, d);
        if (v >= NE_LIMIT)
            return fail(e, BMOE_GGUF_EMALFORMED, "%s: ne[%u] = %llu is not below 2^62", e->where, d, (ull)v);
        t->ne[d] = v;
    }
    uint64_t nel = 1;
    for (unsigned d = 0; d < nd; d++) {
        if (nel > (uint64_t)INT64_MAX / t->ne[d])
            return fail(e, BMOE_GGUF_EMALFORMED,
                        "%s: element count overflows (ne = %llu x %llu x %llu x %llu)", e->where,
                        (ull)t->ne[0], (ull)t->ne[1], (ull)t->ne[2], (ull)t->ne[3]);
        nel *= t->ne[d];
    }
    uint64_t ty;
    rc = rd(c, e, 4, "type", &ty);
    if (rc) return rc;
    const bm_type_traits *tt = ty > UINT32_MAX ? NULL : bm_type((uint32_t)ty);
    if (!tt) {
        char list[256];
        return fail(e, BMOE_GGUF_EMALFORMED, "%s: type %llu (%s) is not supported (%s are)", e->where, (ull)ty,
                    ty > UINT32_MAX ? "unknown" : ggml_type_name((uint32_t)ty), bm_types_supported(list, sizeof list));
    }
    t->type = (uint32_t)ty;
    uint64_t blk = tt->blck, bb = tt->bytes;
    if (t->ne[0] % blk != 0)
        return fail(e, BMOE_GGUF_EMALFORMED, "%s: ne[0] = %llu is not a multiple of the %s block size %llu",
                    e->where, (ull)t->ne[0], ggml_type_name(t->type), (ull)blk);
    uint64_t nblocks = t->ne[0] / blk;
    if (nblocks > UINT64_MAX / bb)
        return fail(e, BMOE_GGUF_EMALFORMED, "%s: row size overflows", e->where);
    t->row_bytes = nblocks * bb;
    uint64_t nrows = nel / t->ne[0];
    if (t->row_bytes > UINT64_MAX / nrows)
        return fail(e, BMOE_GGUF_EMALFORMED, "%s: byte size overflows (%llu rows of %llu bytes)", e->where,
                    (ull)nrows, (ull)t->row_bytes);
    t->nbytes = t->row_bytes * nrows;
    rc = rd(c, e, 8, "offset", &t->offset); /* relative to the data section until parse_image fixes it */
    return rc;
}

/* Parses one GGUF image held in memory into *im (arena-backed). */
static int parse_image(const uint8_t *buf, uint64_t size, ectx *e, gguf_priv *pv, image *im) {
    memset(im, 0, sizeof *im);
    im->size = size;
    cur c = { buf, size, 0 };
    if (size == 0) return fail(e, BMOE_GGUF_EMALFORMED, "empty file, not a GGUF file");
    if (size >= 4 && memcmp(buf, "GGUF", 4) != 0)
        return fail(e, BMOE_GGUF_EMALFORMED, "not a GGUF file (starts with %02x %02x %02x %02x, expected \"GGUF\")",
                    buf[0], buf[1], buf[2], buf[3]);
    if (size < GGUF_HEADER_BYTES)
        return fail(e, BMOE_GGUF_EMALFORMED, "truncated header: %llu bytes, a GGUF header needs %d", (ull)size,
                    GGUF_HEADER_BYTES);
    c.pos = 4;
    strcpy(e->where, "header");
    uint64_t version, n_tensors, n_kv;
    rd(&c, e, 4, "version", &version);
    if (version != 2 && version != 3) {
        uint32_t sw = (uint32_t)(((version & 0xff) << 24) | ((version & 0xff00) << 8) | ((version >> 8) & 0xff00) |
                                 (version >> 24));
        if (sw == 2 || sw == 3)
            return fail(e, BMOE_GGUF_EMALFORMED, "big-endian GGUF (version %u byte-swapped) is not supported", sw);
        return fail(e, BMOE_GGUF_EMALFORMED, "GGUF version %llu is not supported (versions 2 and 3 are)",
                    (ull)version);
    }
    rd(&c, e, 8, "tensor count", &n_tensors);
    rd(&c, e, 8, "kv count", &n_kv);
    uint64_t rem = cur_left(&c);
    if (n_tensors > rem / MIN_TI_BYTES)
        return fail(e, BMOE_GGUF_EMALFORMED,
                    "tensor count %llu cannot fit: the %llu bytes after the header hold at most %llu tensor infos",
                    (ull)n_tensors, (ull)rem, (ull)(rem / MIN_TI_BYTES));
    rem -= n_tensors * MIN_TI_BYTES;
    if (n_kv > rem / MIN_KV_BYTES)
        return fail(e, BMOE_GGUF_EMALFORMED,
                    "kv count %llu cannot fit: the %llu bytes left for metadata hold at most %llu key-value pairs",
                    (ull)n_kv, (ull)rem, (ull)(rem / MIN_KV_BYTES));

    int rc;
    gvec kvs = { NULL, sizeof(gguf_kv), 0, 0, n_kv };
    for (uint64_t i = 0; i < n_kv; i++) {
        gguf_kv *kv = gvec_push(&kvs);
        if (!kv) rc = fail(e, BMOE_GGUF_ENOMEM, "out of memory (%llu key-value pairs)", (ull)n_kv);
        else rc = parse_kv(&c, e, pv, i, kv);
        if (rc) {
            gvec_free(&kvs);
            return rc;
        }
    }
    im->kv = gvec_adopt(pv, &kvs);
    im->n_kv = n_kv;

    /* duplicate keys */
    if (n_kv) {
        im->kv_sorted = arena_array(pv, n_kv, sizeof(gguf_kv *));
        if (!im->kv_sorted) return fail(e, BMOE_GGUF_ENOMEM, "out of memory (key index)");
        for (uint64_t i = 0; i < n_kv; i++) im->kv_sorted[i] = &im->kv[i];
        qsort(im->kv_sorted, (size_t)n_kv, sizeof(gguf_kv *), kvp_cmp);
        const gguf_kv *da = NULL, *db = NULL; /* report the duplicate that appears first in the file */
        for (uint64_t i = 1; i < n_kv; i++)
            if (str_cmp(im->kv_sorted[i - 1]->key, im->kv_sorted[i]->key) == 0 && (!db || im->kv_sorted[i] < db)) {
                da = im->kv_sorted[i - 1];
                db = im->kv_sorted[i];
            }
        if (db) {
            char nb[ESC_MAX];
            return fail(e, BMOE_GGUF_EMALFORMED, "kv %llu (%s): duplicate key (also kv %llu)", (ull)(db - im->kv),
                        escs(nb, db->key), (ull)(da - im->kv));
        }
    }

    /* alignment */
    im->alignment = GGUF_DEFAULT_ALIGNMENT;
    const gguf_kv *al = kv_lookup(im->kv_sorted, im->kv, n_kv, "general.alignment");
    if (al) {
        if (al->type != GGUF_TYPE_UINT32)
            return fail(e, BMOE_GGUF_EMALFORMED, "general.alignment has type %s, expected u32",
                        gguf_type_name(al->type));
        uint64_t a = al->v.u;
        if (a == 0) return fail(e, BMOE_GGUF_EMALFORMED, "general.alignment is 0");
        if (a & (a - 1))
            return fail(e, BMOE_GGUF_EMALFORMED, "general.alignment %llu is not a power of two", (ull)a);
        if (a > GGUF_MAX_ALIGNMENT)
            return fail(e, BMOE_GGUF_EMALFORMED, "general.alignment %llu exceeds the maximum %u", (ull)a,
                        GGUF_MAX_ALIGNMENT);
        im->alignment = a;
    }

    /* tensor infos: re-bound the count by what is actually left now */
    if (n_tensors > cur_left(&c) / MIN_TI_BYTES)
        return fail(e, BMOE_GGUF_EMALFORMED,
                    "truncated: tensor count %llu cannot fit in the %llu bytes left after the metadata",
                    (ull)n_tensors, (ull)cur_left(&c));
    gvec tv = { NULL, sizeof(gguf_tensor), 0, 0, n_tensors };
    for (uint64_t i = 0; i < n_tensors; i++) {
        gguf_tensor *t = gvec_push(&tv);
        if (!t) rc = fail(e, BMOE_GGUF_ENOMEM, "out of memory (%llu tensor infos)", (ull)n_tensors);
        else rc = parse_tensor_info(&c, e, pv, i, t);
        if (rc) {
            gvec_free(&tv);
            return rc;
        }
    }
    im->tensors = gvec_adopt(pv, &tv);
    im->n_tensors = n_tensors;

    /* data section: aligned start; every tensor aligned and inside the file */
    uint64_t pos = c.pos, r = pos % im->alignment;
    im->data_offset = r ? pos + (im->alignment - r) : pos; /* pos <= size < 2^63: no overflow */
    for (uint64_t i = 0; i < n_tensors; i++) {
        gguf_tensor *t = &im->tensors[i];
        char nb[ESC_MAX];
        uint64_t rel = t->offset;
        if (rel % im->alignment)
            return fail(e, BMOE_GGUF_EMALFORMED, "tensor %llu (%s): offset %llu is not a multiple of the alignment %llu",
                        (ull)i, escs(nb, t->name), (ull)rel, (ull)im->alignment);
        if (im->data_offset > size || rel > size - im->data_offset)
            return fail(e, BMOE_GGUF_EMALFORMED,
                        "tensor %llu (%s): offset %llu (relative to the data section at %llu) is past end of file (size %llu)",
                        (ull)i, escs(nb, t->name), (ull)rel, (ull)im->data_offset, (ull)size);
        uint64_t abs = im->data_offset + rel;
        if (t->nbytes > size - abs)
            return fail(e, BMOE_GGUF_EMALFORMED, "tensor %llu (%s): offset %llu + %llu bytes past end of file (size %llu)",
                        (ull)i, escs(nb, t->name), (ull)abs, (ull)t->nbytes, (ull)size);
        t->offset = abs;
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------------ */
/* model assembly                                                                                   */

/* Checks over the merged tensor table: unique names (across shards), no overlapping data (per shard).
 * first[s] is the global index of shard s's first tensor, for messages. */
static int finish_tensors(gguf_model *m, gguf_priv *pv, const uint64_t *first, char *err, size_t errlen) {
    uint64_t n = m->n_tensors;
    ectx e = { err, errlen, m->shards[0].path, "" };
    if (n == 0) return 0;
    const gguf_tensor **s = arena_array(pv, n, sizeof(gguf_tensor *));
    if (!s) return fail(&e, BMOE_GGUF_ENOMEM, "out of memory (tensor index)");
    for (uint64_t i = 0; i < n; i++) s[i] = &m->tensors[i];
    char nb[ESC_MAX];

    qsort(s, (size_t)n, sizeof *s, tp_off_cmp);
    for (uint64_t i = 1; i < n; i++) {
        const gguf_tensor *a = s[i - 1], *b = s[i];
        if (a->shard == b->shard && a->nbytes > b->offset - a->offset) {
            /* report against the later tensor in file order */
            const gguf_tensor *x = a < b ? b : a, *y = a < b ? a : b;
            char nb2[ESC_MAX];
            e.label = m->shards[x->shard].path;
            return fail(&e, BMOE_GGUF_EMALFORMED,
                        "tensor %llu (%s): data [%llu, %llu) overlaps tensor %llu (%s) [%llu, %llu)",
                        (ull)(x - m->tensors - first[x->shard]), escs(nb, x->name), (ull)x->offset,
                        (ull)(x->offset + x->nbytes), (ull)(y - m->tensors - first[y->shard]), escs(nb2, y->name),
                        (ull)y->offset, (ull)(y->offset + y->nbytes));
        }
    }

    qsort(s, (size_t)n, sizeof *s, tp_cmp);
    const gguf_tensor *da = NULL, *db = NULL;
    for (uint64_t i = 1; i < n; i++)
        if (str_cmp(s[i - 1]->name, s[i]->name) == 0 && (!db || s[i] < db)) {
            da = s[i - 1];
            db = s[i];
        }
    if (db) {
        e.label = m->shards[db->shard].path;
        if (da->shard == db->shard)
            return fail(&e, BMOE_GGUF_EMALFORMED, "tensor %llu (%s): duplicate tensor name (also tensor %llu)",
                        (ull)(db - m->tensors - first[db->shard]), escs(nb, db->name),
                        (ull)(da - m->tensors - first[da->shard]));
        return fail(&e, BMOE_GGUF_EMALFORMED, "tensor %llu (%s): duplicate tensor name (also tensor %llu of %s)",
                    (ull)(db - m->tensors - first[db->shard]), escs(nb, db->name),
                    (ull)(da - m->tensors - first[da->shard]), m->shards[da->shard].path);
    }
    pv->t_sorted = s;
    return 0;
}

static gguf_model *model_new(gguf_priv **pvp) {
    gguf_model *m = calloc(1, sizeof *m);
    gguf_priv *pv = calloc(1, sizeof *pv);
    if (!m || !pv) {
        free(m);
        free(pv);
        return NULL;
    }
    m->arena = pv;
    *pvp = pv;
    return m;
}

static char *arena_strdup(gguf_priv *pv, const char *s) {
    size_t n = strlen(s);
    char *p = arena_alloc(pv, (uint64_t)n + 1);
    if (p) memcpy(p, s, n + 1);
    return p;
}

int gguf_parse_buffer(const uint8_t *buf, size_t size, gguf_model **out, char *err, size_t errlen) {
    if (err && errlen) err[0] = '\0';
    if (!out) return BMOE_GGUF_EMALFORMED;
    *out = NULL;
    ectx e = { err, errlen, BUFFER_LABEL, "" };
    if (!buf && size) return fail(&e, BMOE_GGUF_EMALFORMED, "no buffer");
    gguf_priv *pv;
    gguf_model *m = model_new(&pv);
    if (!m) return fail(&e, BMOE_GGUF_ENOMEM, "out of memory");
    image im;
    int rc = parse_image(buf, size, &e, pv, &im);
    if (rc) goto bad;
    m->shards = arena_array(pv, 1, sizeof(gguf_shard));
    if (!m->shards || !(m->shards[0].path = arena_strdup(pv, BUFFER_LABEL))) {
        rc = fail(&e, BMOE_GGUF_ENOMEM, "out of memory");
        goto bad;
    }
    m->n_shards = 1;
    m->shards[0].fd = -1;
    m->shards[0].size = size;
    m->shards[0].data_offset = im.data_offset;
    m->n_kv = im.n_kv;
    m->kv = im.kv;
    pv->kv_sorted = im.kv_sorted;
    m->n_tensors = im.n_tensors;
    m->tensors = im.tensors;
    m->alignment = im.alignment;
    uint64_t first = 0;
    if ((rc = finish_tensors(m, pv, &first, err, errlen))) goto bad;
    *out = m;
    return 0;
bad:
    gguf_close(m);
    return rc;
}

/* ------------------------------------------------------------------------------------------------ */
/* files and split models                                                                           */

typedef struct mapped {
    int fd;
    uint64_t size;
    const uint8_t *map;
} mapped;

static void unmap(mapped *f) {
    if (f->map) munmap((void *)f->map, (size_t)f->size);
    f->map = NULL;
}

/* Opens and maps `path` read-only. `what` prefixes the reason ("cannot open shard 3 of 4"). */
static int map_file(const char *path, ectx *e, const char *what, mapped *f) {
    f->fd = -1;
    f->size = 0;
    f->map = NULL;
    /* O_NONBLOCK: opening a FIFO must not hang; cleared again below for the regular file */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) return fail(e, BMOE_GGUF_EIO, "%s: %s", what, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int er = errno;
        close(fd);
        return fail(e, BMOE_GGUF_EIO, "%s: %s", what, strerror(er));
    }
    if (S_ISDIR(st.st_mode)) {
        close(fd);
        return fail(e, BMOE_GGUF_EIO, "%s: %s", what, strerror(EISDIR));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return fail(e, BMOE_GGUF_EIO, "%s: not a regular file", what);
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) (void)fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    if (st.st_size < 0 || (uint64_t)st.st_size > (uint64_t)SIZE_MAX) {
        close(fd);
        return fail(e, BMOE_GGUF_EIO, "%s: file too large to map", what);
    }
    f->fd = fd;
    f->size = (uint64_t)st.st_size;
    if (f->size == 0) return 0; /* parse_image reports the empty file */
    void *p = mmap(NULL, (size_t)f->size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
        int er = errno;
        close(fd);
        f->fd = -1;
        return fail(e, BMOE_GGUF_EIO, "%s: cannot map: %s", what, strerror(er));
    }
    f->map = p;
    return 0;
}

/* "NAME-00001-of-00004.gguf": returns 1 and the stem length, the file number and the count. */
static int split_name(const char *path, size_t *stem, unsigned *no, unsigned *count) {
    const size_t SUF = 20; /* "-00001-of-00004.gguf" */
    size_t n = strlen(path);
    if (n < SUF) return 0;
    const char *s = path + n - SUF;
    if (s[0] != '-' || memcmp(s + 6, "-of-", 4) != 0 || memcmp(s + 15, ".gguf", 5) != 0) return 0;
    unsigned a = 0, b = 0;
    for (int i = 0; i < 5; i++) {
        if (s[1 + i] < '0' || s[1 + i] > '9' || s[10 + i] < '0' || s[10 + i] > '9') return 0;
        a = a * 10 + (unsigned)(s[1 + i] - '0');
        b = b * 10 + (unsigned)(s[10 + i] - '0');
    }
    *stem = n - SUF;
    *no = a;
    *count = b;
    return 1;
}

/* Reads an integer split.* key of one image: 1 found, 0 absent, else a status (error set). */
static int split_key(const image *im, ectx *e, const char *key, uint64_t *out) {
    const gguf_kv *kv = kv_lookup(im->kv_sorted, im->kv, im->n_kv, key);
    if (!kv) return 0;
    switch (kv->type) {
    case GGUF_TYPE_UINT8: case GGUF_TYPE_UINT16: case GGUF_TYPE_UINT32: case GGUF_TYPE_UINT64:
        *out = kv->v.u;
        return 1;
    case GGUF_TYPE_INT8: case GGUF_TYPE_INT16: case GGUF_TYPE_INT32: case GGUF_TYPE_INT64:
        if (kv->v.i < 0) return -fail(e, BMOE_GGUF_EMALFORMED, "%s = %lld is negative", key, (long long)kv->v.i);
        *out = (uint64_t)kv->v.i;
        return 1;
    default:
        return -fail(e, BMOE_GGUF_EMALFORMED, "%s has type %s, expected an integer", key, gguf_type_name(kv->type));
    }
}

int gguf_open(const char *path, gguf_model **out, char *err, size_t errlen) {
    if (err && errlen) err[0] = '\0';
    if (!out) return BMOE_GGUF_EIO;
    *out = NULL;
    ectx e = { err, errlen, path ? path : "(null)", "" };
    if (!path || !*path) return fail(&e, BMOE_GGUF_EIO, "cannot open: no file name");

    gguf_priv *pv;
    gguf_model *m = model_new(&pv);
    if (!m) return fail(&e, BMOE_GGUF_ENOMEM, "out of memory");
    int rc;
    mapped f = { -1, 0, NULL };
    image *ims = NULL;
    uint64_t *first = NULL;
    char *spath = NULL;

    image im0;
    if ((rc = map_file(path, &e, "cannot open", &f))) goto bad;
    rc = parse_image(f.map, f.size, &e, pv, &im0);
    unmap(&f);
    if (rc) goto bad_fd;

    uint64_t count = 1, no = 0, tcount = 0;
    int r1 = split_key(&im0, &e, "split.count", &count);
    if (r1 < 0) { rc = -r1; goto bad_fd; }
    int r2 = split_key(&im0, &e, "split.no", &no);
    if (r2 < 0) { rc = -r2; goto bad_fd; }
    int r3 = split_key(&im0, &e, "split.tensors.count", &tcount);
    if (r3 < 0) { rc = -r3; goto bad_fd; }
    if (!r1) count = 1;
    if (r1 && count == 0) { rc = fail(&e, BMOE_GGUF_EMALFORMED, "split.count is 0"); goto bad_fd; }
    if (count > GGUF_MAX_SHARDS) {
        rc = fail(&e, BMOE_GGUF_EMALFORMED, "split.count %llu exceeds the supported maximum %d", (ull)count,
                  GGUF_MAX_SHARDS);
        goto bad_fd;
    }
    size_t stem = 0;
    unsigned fno = 0, fcount = 0;
    int named = split_name(path, &stem, &fno, &fcount);
    if (count > 1) {
        if (!r2) { rc = fail(&e, BMOE_GGUF_EMALFORMED, "split.count is %llu but split.no is missing", (ull)count); goto bad_fd; }
        if (no != 0) {
            if (named)
                rc = fail(&e, BMOE_GGUF_EMALFORMED,
                          "split.no %llu: this is shard %llu of %llu; pass the first shard (%.*s-00001-of-%05llu.gguf)",
                          (ull)no, (ull)no + 1, (ull)count, (int)(stem > 200 ? 200 : stem), path, (ull)count);
            else
                rc = fail(&e, BMOE_GGUF_EMALFORMED, "split.no %llu: this is shard %llu of %llu, not the first",
                          (ull)no, (ull)no + 1, (ull)count);
            goto bad_fd;
        }
        if (!named || fno != 1 || fcount != count) {
            rc = fail(&e, BMOE_GGUF_EMALFORMED,
                      "split.count is %llu but the file name does not end in -00001-of-%05llu.gguf", (ull)count,
                      (ull)count);
            goto bad_fd;
        }
        if (!r3) {
            rc = fail(&e, BMOE_GGUF_EMALFORMED, "split.tensors.count is missing (required when split.count > 1)");
            goto bad_fd;
        }
    } else if (r2 && no != 0) {
        rc = fail(&e, BMOE_GGUF_EMALFORMED, "split.no %llu but split.count is %s", (ull)no, r1 ? "1" : "absent");
        goto bad_fd;
    }

    ims = calloc((size_t)count, sizeof *ims);
    first = calloc((size_t)count, sizeof *first);
    m->shards = arena_array(pv, count, sizeof(gguf_shard));
    spath = malloc(strlen(path) + 1);
    if (!ims || !first || !m->shards || !spath) { rc = fail(&e, BMOE_GGUF_ENOMEM, "out of memory"); goto bad_fd; }
    for (uint64_t s = 0; s < count; s++) m->shards[s].fd = -1;
    m->n_shards = (uint32_t)count;
    ims[0] = im0;
    m->shards[0].path = arena_strdup(pv, path);
    if (!m->shards[0].path) { rc = fail(&e, BMOE_GGUF_ENOMEM, "out of memory"); goto bad_fd; }
    m->shards[0].fd = f.fd;
    f.fd = -1;
    m->shards[0].size = im0.size;
    m->shards[0].data_offset = im0.data_offset;

    for (uint64_t s = 1; s < count; s++) {
        /* same length as the first shard's name: only the 5-digit counter differs */
        memcpy(spath, path, stem);
        snprintf(spath + stem, strlen(path) + 1 - stem, "-%05u-of-%05u.gguf", (unsigned)(s + 1), (unsigned)count);
        ectx es = { err, errlen, spath, "" };
        char what[64];
        snprintf(what, sizeof what, "cannot open shard %llu of %llu", (ull)s + 1, (ull)count);
        mapped fs;
        if ((rc = map_file(spath, &es, what, &fs))) goto bad_fd;
        m->shards[s].fd = fs.fd;
        rc = parse_image(fs.map, fs.size, &es, pv, &ims[s]);
        unmap(&fs);
        if (rc) goto bad_fd;
        if (!(m->shards[s].path = arena_strdup(pv, spath))) { rc = fail(&es, BMOE_GGUF_ENOMEM, "out of memory"); goto bad_fd; }
        m->shards[s].size = ims[s].size;
        m->shards[s].data_offset = ims[s].data_offset;
        uint64_t c2 = 0, n2 = 0, t2 = 0;
        int q1 = split_key(&ims[s], &es, "split.count", &c2);
        if (q1 < 0) { rc = -q1; goto bad_fd; }
        if (!q1) { rc = fail(&es, BMOE_GGUF_EMALFORMED, "split.count is missing (expected %llu, as in %s)", (ull)count, path); goto bad_fd; }
        if (c2 != count) {
            rc = fail(&es, BMOE_GGUF_EMALFORMED, "split.count is %llu, expected %llu (as in %s)", (ull)c2, (ull)count, path);
            goto bad_fd;
        }
        int q2 = split_key(&ims[s], &es, "split.no", &n2);
        if (q2 < 0) { rc = -q2; goto bad_fd; }
        if (!q2) { rc = fail(&es, BMOE_GGUF_EMALFORMED, "split.no is missing (expected %llu)", (ull)s); goto bad_fd; }
        if (n2 != s) {
            rc = fail(&es, BMOE_GGUF_EMALFORMED,
                      "split.no is %llu, expected %llu for file %05llu of %05llu (split.no counts from 0)", (ull)n2,
                      (ull)s, (ull)s + 1, (ull)count);
            goto bad_fd;
        }
        int q3 = split_key(&ims[s], &es, "split.tensors.count", &t2);
        if (q3 < 0) { rc = -q3; goto bad_fd; }
        if (q3 && t2 != tcount) {
            rc = fail(&es, BMOE_GGUF_EMALFORMED, "split.tensors.count is %llu, expected %llu (as in %s)", (ull)t2,
                      (ull)tcount, path);
            goto bad_fd;
        }
    }

    /* merge the tensor tables */
    uint64_t total = 0;
    for (uint64_t s = 0; s < count; s++) {
        first[s] = total;
        total += ims[s].n_tensors; /* each bounded by its file size: no overflow */
    }
    if (count > 1 && total != tcount) {
        rc = fail(&e, BMOE_GGUF_EMALFORMED, "split.tensors.count is %llu but the %llu shards hold %llu tensors",
                  (ull)tcount, (ull)count, (ull)total);
        goto bad_fd;
    }
    if (count == 1) {
        m->tensors = ims[0].tensors;
    } else if (total) {
        m->tensors = arena_array(pv, total, sizeof(gguf_tensor));
        if (!m->tensors) { rc = fail(&e, BMOE_GGUF_ENOMEM, "out of memory"); goto bad_fd; }
        for (uint64_t s = 0; s < count; s++)
            if (ims[s].n_tensors) memcpy(m->tensors + first[s], ims[s].tensors, (size_t)ims[s].n_tensors * sizeof(gguf_tensor));
    }
    for (uint64_t s = 0; s < count; s++)
        for (uint64_t i = 0; i < ims[s].n_tensors; i++) m->tensors[first[s] + i].shard = (uint32_t)s;
    m->n_tensors = total;
    m->n_kv = im0.n_kv;
    m->kv = im0.kv;
    pv->kv_sorted = im0.kv_sorted;
    m->alignment = im0.alignment;
    if ((rc = finish_tensors(m, pv, first, err, errlen))) goto bad;
    free(ims);
    free(first);
    free(spath);
    *out = m;
    return 0;

bad_fd:
    if (f.fd >= 0) close(f.fd);
bad:
    free(ims);
    free(first);
    free(spath);
    gguf_close(m);
    return rc;
}

void gguf_close(gguf_model *m) {
    if (!m) return;
    if (m->shards)
        for (uint32_t s = 0; s < m->n_shards; s++)
            if (m->shards[s].fd >= 0) close(m->shards[s].fd);
    priv_free(m->arena);
    free(m);
}

/* ------------------------------------------------------------------------------------------------ */
/* lookups and typed getters                                                                        */

const gguf_kv *gguf_find_kv(const gguf_model *m, const char *key) {
    if (!m) return NULL;
    const gguf_priv *pv = m->arena;
    return kv_lookup(pv ? pv->kv_sorted : NULL, m->kv, m->n_kv, key);
}

const gguf_tensor *gguf_find_tensor(const gguf_model *m, const char *name) {
    if (!m || !name) return NULL;
    const gguf_priv *pv = m->arena;
    size_t n = strlen(name);
    if (pv && pv->t_sorted) {
        uint64_t lo = 0, hi = m->n_tensors;
        while (lo < hi) {
            uint64_t mid = lo + (hi - lo) / 2;
            int r = cstr_cmp(pv->t_sorted[mid]->name, name, n);
            if (r == 0) return pv->t_sorted[mid];
            if (r < 0) lo = mid + 1;
            else hi = mid;
        }
        return NULL;
    }
    for (uint64_t i = 0; i < m->n_tensors; i++)
        if (cstr_cmp(m->tensors[i].name, name, n) == 0) return &m->tensors[i];
    return NULL;
}

/* Getter messages name the key but not the file: callers prefix the file (and what they wanted). */
static int get_fail(const gguf_model *m, char *err, size_t errlen, const char *fmt, ...) {
    (void)m;
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
        sanitize_line(err);
    }
    return -1;
}

static int is_uint_type(uint32_t t) {
    return t == GGUF_TYPE_UINT8 || t == GGUF_TYPE_UINT16 || t == GGUF_TYPE_UINT32 || t == GGUF_TYPE_UINT64;
}
static int is_sint_type(uint32_t t) {
    return t == GGUF_TYPE_INT8 || t == GGUF_TYPE_INT16 || t == GGUF_TYPE_INT32 || t == GGUF_TYPE_INT64;
}

int gguf_get_u64(const gguf_model *m, const char *key, uint64_t *out, char *err, size_t errlen) {
    const gguf_kv *kv = gguf_find_kv(m, key);
    if (!kv) return 0;
    if (is_uint_type(kv->type)) { *out = kv->v.u; return 1; }
    if (is_sint_type(kv->type)) {
        if (kv->v.i < 0)
            return get_fail(m, err, errlen, "%s = %lld is negative, expected a non-negative integer", key,
                            (long long)kv->v.i);
        *out = (uint64_t)kv->v.i;
        return 1;
    }
    return get_fail(m, err, errlen, "%s has type %s, expected an integer", key, gguf_type_name(kv->type));
}

int gguf_get_i64(const gguf_model *m, const char *key, int64_t *out, char *err, size_t errlen) {
    const gguf_kv *kv = gguf_find_kv(m, key);
    if (!kv) return 0;
    if (is_sint_type(kv->type)) { *out = kv->v.i; return 1; }
    if (is_uint_type(kv->type)) {
        if (kv->v.u > (uint64_t)INT64_MAX)
            return get_fail(m, err, errlen, "%s = %llu is out of range", key, (ull)kv->v.u);
        *out = (int64_t)kv->v.u;
        return 1;
    }
    return get_fail(m, err, errlen, "%s has type %s, expected an integer", key, gguf_type_name(kv->type));
}

int gguf_get_f64(const gguf_model *m, const char *key, double *out, char *err, size_t errlen) {
    const gguf_kv *kv = gguf_find_kv(m, key);
    if (!kv) return 0;
    if (kv->type == GGUF_TYPE_FLOAT32 || kv->type == GGUF_TYPE_FLOAT64) { *out = kv->v.f; return 1; }
    if (is_uint_type(kv->type)) { *out = (double)kv->v.u; return 1; }
    if (is_sint_type(kv->type)) { *out = (double)kv->v.i; return 1; }
    return get_fail(m, err, errlen, "%s has type %s, expected a number", key, gguf_type_name(kv->type));
}

int gguf_get_bool(const gguf_model *m, const char *key, int *out, char *err, size_t errlen) {
    const gguf_kv *kv = gguf_find_kv(m, key);
    if (!kv) return 0;
    if (kv->type == GGUF_TYPE_BOOL) { *out = kv->v.u != 0; return 1; }
    return get_fail(m, err, errlen, "%s has type %s, expected bool", key, gguf_type_name(kv->type));
}

int gguf_get_str(const gguf_model *m, const char *key, gguf_str *out, char *err, size_t errlen) {
    const gguf_kv *kv = gguf_find_kv(m, key);
    if (!kv) return 0;
    if (kv->type == GGUF_TYPE_STRING) { *out = kv->str; return 1; }
    return get_fail(m, err, errlen, "%s has type %s, expected string", key, gguf_type_name(kv->type));
}

int gguf_get_arr(const gguf_model *m, const char *key, uint32_t elem_type, const gguf_kv **out, char *err,
                 size_t errlen) {
    const gguf_kv *kv = gguf_find_kv(m, key);
    if (!kv) return 0;
    if (kv->type != GGUF_TYPE_ARRAY)
        return get_fail(m, err, errlen, "%s has type %s, expected an array", key, gguf_type_name(kv->type));
    int ok = elem_type == GGUF_TYPE_COUNT || kv->arr_type == elem_type ||
             (elem_type == GGUF_TYPE_UINT64 && (is_uint_type(kv->arr_type) || is_sint_type(kv->arr_type)));
    if (!ok)
        return get_fail(m, err, errlen, "%s is an array of %s, expected an array of %s", key,
                        gguf_type_name(kv->arr_type),
                        elem_type == GGUF_TYPE_UINT64 ? "integers" : gguf_type_name(elem_type));
    *out = kv;
    return 1;
}

/* raw element i of a numeric array, widened by its type: kind 0 unsigned, 1 signed, 2 float */
static int arr_elem(const gguf_kv *kv, uint64_t i, int *kind, uint64_t *u, int64_t *s, double *f) {
    if (!kv || kv->type != GGUF_TYPE_ARRAY || i >= kv->n || !kv->data || kv->arr_type >= GGUF_TYPE_COUNT) return 0;
    const uint8_t *p = (const uint8_t *)kv->data + i * kv_type_size[kv->arr_type];
    switch (kv->arr_type) {
    case GGUF_TYPE_UINT8: case GGUF_TYPE_BOOL: *kind = 0; *u = p[0]; return 1;
    case GGUF_TYPE_UINT16: { uint16_t v; memcpy(&v, p, 2); *kind = 0; *u = v; return 1; }
    case GGUF_TYPE_UINT32: { uint32_t v; memcpy(&v, p, 4); *kind = 0; *u = v; return 1; }
    case GGUF_TYPE_UINT64: { uint64_t v; memcpy(&v, p, 8); *kind = 0; *u = v; return 1; }
    case GGUF_TYPE_INT8: { int8_t v; memcpy(&v, p, 1); *kind = 1; *s = v; return 1; }
    case GGUF_TYPE_INT16: { int16_t v; memcpy(&v, p, 2); *kind = 1; *s = v; return 1; }
    case GGUF_TYPE_INT32: { int32_t v; memcpy(&v, p, 4); *kind = 1; *s = v; return 1; }
    case GGUF_TYPE_INT64: { int64_t v; memcpy(&v, p, 8); *kind = 1; *s = v; return 1; }
    case GGUF_TYPE_FLOAT32: { float v; memcpy(&v, p, 4); *kind = 2; *f = v; return 1; }
    case GGUF_TYPE_FLOAT64: { double v; memcpy(&v, p, 8); *kind = 2; *f = v; return 1; }
    default: return 0;
    }
}

int gguf_arr_u64(const gguf_kv *kv, uint64_t i, uint64_t *out) {
    int kind; uint64_t u = 0; int64_t s = 0; double f = 0;
    if (!arr_elem(kv, i, &kind, &u, &s, &f) || kv->arr_type == GGUF_TYPE_BOOL) return 0;
    if (kind == 0) { *out = u; return 1; }
    if (kind == 1 && s >= 0) { *out = (uint64_t)s; return 1; }
    return 0;
}

int gguf_arr_i64(const gguf_kv *kv, uint64_t i, int64_t *out) {
    int kind; uint64_t u = 0; int64_t s = 0; double f = 0;
    if (!arr_elem(kv, i, &kind, &u, &s, &f) || kv->arr_type == GGUF_TYPE_BOOL) return 0;
    if (kind == 1) { *out = s; return 1; }
    if (kind == 0 && u <= (uint64_t)INT64_MAX) { *out = (int64_t)u; return 1; }
    return 0;
}

int gguf_arr_f64(const gguf_kv *kv, uint64_t i, double *out) {
    int kind; uint64_t u = 0; int64_t s = 0; double f = 0;
    if (!arr_elem(kv, i, &kind, &u, &s, &f) || kv->arr_type == GGUF_TYPE_BOOL) return 0;
    *out = kind == 0 ? (double)u : kind == 1 ? (double)s : f;
    return 1;
}

int gguf_arr_str(const gguf_kv *kv, uint64_t i, gguf_str *out) {
    if (!kv || kv->type != GGUF_TYPE_ARRAY || kv->arr_type != GGUF_TYPE_STRING || i >= kv->n || !kv->data) return 0;
    *out = ((const gguf_str *)kv->data)[i];
    return 1;
}
