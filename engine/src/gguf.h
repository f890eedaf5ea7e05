/* GGUF v3 reader: metadata, tensor infos, split models.
 *
 * Every count, length and offset read from a file is bounded by what the file can hold before it is
 * used; nothing here asserts on input. A malformed file yields BMOE_GGUF_EMALFORMED (or EIO for an
 * unreadable one) and a one-line message in `err`. Tensor data is not read here: callers get the
 * shard index and the absolute file offset of each tensor and map or pread it themselves.
 *
 * Accepted: GGUF versions 2 and 3 (identical little-endian layouts), little-endian only. Tensor types:
 * those of the type table (type_traits.h: the types the engine computes with); every other ggml type is
 * rejected by name ("type 16 (iq2_xxs) is not supported (f32, f16, ... are)").
 *
 * Ownership. gguf_open maps each file read-only, parses its header from memory with bounds checks and
 * unmaps it again: every string, array and table the caller sees is a copy in an arena owned by the
 * gguf_model, valid until gguf_close. Nothing points into a file mapping. Each shard's file stays open
 * (gguf_shard.fd, O_CLOEXEC, read-only) for the caller's tensor reads; gguf_close closes it.
 *
 * Limits (all rejected with a message, never truncated silently): n_dims 1..4; every ne >= 1 and
 * < 2^62; element count <= INT64_MAX; keys and tensor names 1..65535 bytes without NUL bytes;
 * `general.alignment` a u32 power of two <= 1 MiB (default 32); at most GGUF_MAX_SHARDS shards.
 *
 * Error messages are one line: "<file>: <where>: <what>", e.g.
 *   m.gguf: tensor 3 (blk.0.attn_q.weight): offset 123456 + 4096 bytes past end of file (size 100000)
 * Names read from the file are escaped (\xNN for bytes outside printable ASCII) and shortened, so a
 * hostile name cannot break the line. */
#ifndef BMOE_GGUF_H
#define BMOE_GGUF_H

#include <stddef.h>
#include <stdint.h>

enum gguf_type {
    GGUF_TYPE_UINT8 = 0, GGUF_TYPE_INT8 = 1, GGUF_TYPE_UINT16 = 2, GGUF_TYPE_INT16 = 3,
    GGUF_TYPE_UINT32 = 4, GGUF_TYPE_INT32 = 5, GGUF_TYPE_FLOAT32 = 6, GGUF_TYPE_BOOL = 7,
    GGUF_TYPE_STRING = 8, GGUF_TYPE_ARRAY = 9, GGUF_TYPE_UINT64 = 10, GGUF_TYPE_INT64 = 11,
    GGUF_TYPE_FLOAT64 = 12, GGUF_TYPE_COUNT
};

/* Tensor element types (ggml numbering) and what the engine knows of each: type_traits.h. */
#include "type_traits.h"

#define GGUF_MAX_DIMS 4
#define GGUF_MAX_SHARDS 256
#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_ALIGNMENT (1u << 20)
#define GGUF_MAX_NAME_LEN 65535

enum gguf_status { BMOE_GGUF_OK = 0, BMOE_GGUF_EMALFORMED = 3, BMOE_GGUF_EIO = 4, BMOE_GGUF_ENOMEM = 1 };

typedef struct {
    const char *ptr; /* points into the model's arena copy; ptr[len] == '\0' always, but the string may
                      * itself contain NUL bytes (values only: keys and tensor names cannot): use len */
    uint64_t len;
} gguf_str;

typedef struct gguf_kv {
    gguf_str key;
    uint32_t type;      /* enum gguf_type */
    uint32_t arr_type;  /* element type when type == ARRAY (never ARRAY: nested arrays are rejected) */
    uint64_t n;         /* element count when type == ARRAY, else 1 */
    /* scalar value, widened: unsigned types and BOOL (0/1) in u, signed types in i (sign-extended),
     * FLOAT32/FLOAT64 in f; for STRING see str; for ARRAY see data */
    union { uint64_t u; int64_t i; double f; } v;
    gguf_str str;
    const void *data;   /* ARRAY of numbers: packed elements of the element type's size, decoded to host
                         * order (little-endian on every supported target), 8-byte aligned; BOOL elements
                         * are bytes 0/1. ARRAY of STRING: gguf_str[n]. NULL when n == 0. */
} gguf_kv;

typedef struct gguf_tensor {
    gguf_str name;
    uint32_t n_dims;
    uint64_t ne[GGUF_MAX_DIMS]; /* unused dims are 1 */
    uint32_t type;              /* enum ggml_type (only supported types are accepted) */
    uint32_t shard;             /* index into gguf_model.shards */
    uint64_t offset;            /* absolute byte offset in that shard's file (aligned) */
    uint64_t nbytes;            /* bytes of data; offset + nbytes <= shard file size, checked */
    uint64_t row_bytes;         /* bytes of one ne[0] row */
} gguf_tensor;

typedef struct gguf_shard {
    char *path;                 /* as opened; "<buffer>" for gguf_parse_buffer */
    int fd;                     /* open read-only; -1 for gguf_parse_buffer */
    uint64_t size;              /* file size */
    uint64_t data_offset;       /* start of the tensor data section */
} gguf_shard;

typedef struct gguf_model {
    uint32_t n_shards;
    gguf_shard *shards;
    uint64_t n_kv;              /* metadata of the first shard */
    gguf_kv *kv;
    uint64_t n_tensors;         /* tensors of every shard, shard by shard in file order */
    gguf_tensor *tensors;
    uint64_t alignment;         /* of the first shard (each shard's data_offset used its own) */
    void *arena;                /* owns strings, arrays, tables and the lookup indexes (opaque) */
} gguf_model;

/* Opens `path` (a whole model or the first shard `NAME-00001-of-0000N.gguf`; siblings are found from its
 * name and `split.*` metadata). Returns a gguf_status; on failure *out is NULL and err holds one line.
 * A split model: `split.count` > 1 (any integer type), `split.no` 0-based (the file names count from 1),
 * `split.tensors.count` required; every shard must exist (missing → EIO naming the file), be a GGUF,
 * carry the same split.count and its own split.no; metadata comes from the first shard (which may hold
 * no tensors); tensor names are unique across shards and their number equals split.tensors.count.
 * A file without `split.count` (or with split.count 1) is a plain model. */
int gguf_open(const char *path, gguf_model **out, char *err, size_t errlen);
void gguf_close(gguf_model *m); /* NULL is fine */

/* Parses one in-memory GGUF image (no shard discovery; split.* keys are ordinary metadata here). For the
 * fuzz target and unit tests. The buffer is not referenced after the call. */
int gguf_parse_buffer(const uint8_t *buf, size_t size, gguf_model **out, char *err, size_t errlen);

/* Lookups by exact name (O(log n)); NULL when absent. */
const gguf_kv *gguf_find_kv(const gguf_model *m, const char *key);
const gguf_tensor *gguf_find_tensor(const gguf_model *m, const char *name);

/* Typed getters: return 1 when the key exists with a compatible type and the value fits, 0 when absent,
 * -1 when present with the wrong type or out of range (err set: one line naming the key, e.g.
 * "qwen3moe.block_count has type string, expected an integer"; the caller prefixes the file name).
 * Integers accept any integer type (u64: negative values are out of range; i64: u64 values above
 * INT64_MAX are). f64 accepts FLOAT32, FLOAT64 and any integer type. bool accepts BOOL only, str STRING. */
int gguf_get_u64(const gguf_model *m, const char *key, uint64_t *out, char *err, size_t errlen);
int gguf_get_i64(const gguf_model *m, const char *key, int64_t *out, char *err, size_t errlen);
int gguf_get_f64(const gguf_model *m, const char *key, double *out, char *err, size_t errlen);
int gguf_get_bool(const gguf_model *m, const char *key, int *out, char *err, size_t errlen);
int gguf_get_str(const gguf_model *m, const char *key, gguf_str *out, char *err, size_t errlen);

/* Arrays: gguf_get_arr returns 1 and the kv when `key` is an ARRAY whose elements have type `elem_type`
 * (or, for elem_type GGUF_TYPE_COUNT, any element type; for elem_type GGUF_TYPE_UINT64, any integer
 * element type), 0 when absent, -1 otherwise (err set). Element readers (i < kv->n, checked):
 * gguf_arr_u64 / _i64 accept integer arrays (range-checked like the getters), _f64 numeric arrays,
 * _str string arrays. They return 1, or 0 when the index or the type does not fit. */
int gguf_get_arr(const gguf_model *m, const char *key, uint32_t elem_type, const gguf_kv **out,
                 char *err, size_t errlen);
int gguf_arr_u64(const gguf_kv *kv, uint64_t i, uint64_t *out);
int gguf_arr_i64(const gguf_kv *kv, uint64_t i, int64_t *out);
int gguf_arr_f64(const gguf_kv *kv, uint64_t i, double *out);
int gguf_arr_str(const gguf_kv *kv, uint64_t i, gguf_str *out);

/* The type table's sizes and names (type_traits.h), under the reader's names: bytes of `n` elements of
 * `type` (n a multiple of the block size; 0 on overflow or an unsupported type), values per block (0
 * for unsupported types), and the name of any ggml type id ("q4_K"; "unknown" past ggml's table). */
uint64_t ggml_type_nbytes(uint32_t type, uint64_t n);
uint32_t ggml_type_block(uint32_t type);
const char *ggml_type_name(uint32_t type);
const char *gguf_type_name(uint32_t type);     /* KV value type: "u8" ... "f64"; "unknown" */

int gguf_str_eq(gguf_str s, const char *c);

#endif
