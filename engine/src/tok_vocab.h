/* A tokenizer's vocabulary as loaded (tokenizer.c's tok_load) and the lookups every encoder shares:
 * the token texts and their map, the merges, the byte images, a growing token vector. The encoders
 * (tok_bpe.c, tok_spm.c), the end-of-generation set (tok_eog.c) and the chat templates (chat.c)
 * include this header, never tokenizer.h: nothing they call is tokenizer.c's. */
#ifndef BMOE_TOK_VOCAB_H
#define BMOE_TOK_VOCAB_H

#include <stddef.h>
#include <stdint.h>

typedef enum { TOK_BPE = 1, TOK_SPM = 2, TOK_GEMMA4 = 3 } tok_kind;

/* token attributes (from tokenizer.ggml.token_type: 1 normal, 2 unknown, 3 control, 4 user-defined,
 * 5 unused, 6 byte, anything else undefined) */
enum {
    TOK_ATTR_UNDEFINED = 1u << 0,
    TOK_ATTR_NORMAL = 1u << 1,
    TOK_ATTR_UNKNOWN = 1u << 2,
    TOK_ATTR_CONTROL = 1u << 3,
    TOK_ATTR_USER = 1u << 4,
    TOK_ATTR_UNUSED = 1u << 5,
    TOK_ATTR_BYTE = 1u << 6,
    TOK_ATTR_RSTRIP = 1u << 7, /* white space after this special token in the text is dropped (phi-3) */
};

/* chat templates recognised in tokenizer.chat_template (chat.c) */
typedef enum { TOK_CHAT_NONE = 0, TOK_CHAT_CHATML, TOK_CHAT_GEMMA, TOK_CHAT_LLAMA3 } tok_chat;

typedef struct bmoe_tokenizer {
    int n_vocab;
    tok_kind kind;
    int pre;                 /* pretok_kind (BPE) */
    uint8_t *text;           /* every token's text as stored, back to back */
    uint64_t *text_off;      /* token i's text is text[text_off[i] .. text_off[i+1]) */
    uint8_t *attr;           /* TOK_ATTR_* per token */
    float *score;            /* SPM merge scores (NULL for BPE) */
    uint8_t *bytes;          /* every token's decoded bytes (tok_piece), back to back */
    uint64_t *off;           /* token i decodes to bytes[off[i] .. off[i+1]) (n_vocab + 1 entries) */
    int32_t byte_token[256]; /* the token of each byte (BPE: its byte image; SPM: <0xXX>), -1 when none */
    int32_t bos, eos;        /* -1 when absent */
    int32_t *eog;            /* the end-of-generation ids, ascending (tok_eog.c) */
    int n_eog;
    int add_bos, add_eos, add_space_prefix, ignore_merges, clean_spaces;
    int32_t *map;            /* text → id, open addressing over map_mask + 1 slots, -1 empty */
    uint32_t map_mask;
    uint64_t *merge_key;     /* (left id, right id) → rank and result id, open addressing */
    int32_t *merge_rank, *merge_result;
    uint32_t merge_mask;
    int n_merges;
    int32_t *special;        /* the ids matched in text, longest text first */
    int n_special;
    tok_chat chat;
} bmoe_tokenizer;

/* GPT-2's bytes_to_unicode: the code point that stands for byte b in token texts. */
uint32_t tok_byte_to_cp(uint8_t b);
/* The inverse: the byte a code point stands for, or -1. */
int tok_cp_to_byte(uint32_t cp);

/* id of a token text, -1 when the vocabulary has none */
int32_t tok_find(const bmoe_tokenizer *tk, const uint8_t *s, size_t len);

/* token id's text as stored (id in range) */
const uint8_t *tok_text(const bmoe_tokenizer *tk, int32_t id, size_t *len);

/* The rank of the merge of tokens a and b (*result: the merged token), -1 when they do not merge. */
int tok_merge_find(const bmoe_tokenizer *tk, int32_t a, int32_t b, int32_t *result);

/* The hashes of the open-addressing tables: a token text (map) and a pair of ids (merge_key). */
uint64_t tok_hash_text(const uint8_t *s, size_t n);
uint64_t tok_hash_pair(uint64_t key);

/* A growing vector of token ids (the encoders append to it). tok_vec_push: 0, or -3 out of memory. */
typedef struct {
    int32_t *v;
    int n, cap;
} tok_vec;
int tok_vec_push(tok_vec *v, int32_t id);

#endif
