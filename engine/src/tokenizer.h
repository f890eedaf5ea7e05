/* Tokenizers read from GGUF metadata (docs/tokenizers.md):
 *   tokenizer.ggml.model "gpt2"  byte-level BPE: a pre-tokenizer (tokenizer.ggml.pre, pretok.h) cuts the
 *                                text into words, tokenizer.ggml.merges merge each word's bytes by rank
 *   tokenizer.ggml.model "llama" SentencePiece-style: spaces become U+2581, pieces merge by
 *                                tokenizer.ggml.scores, bytes without a piece fall back to <0xXX> tokens
 *   tokenizer.ggml.model "gemma4" BPE over raw UTF-8: spaces become U+2581, the text is cut into runs of
 *                                newlines and runs of the rest, characters merge by rank, a character
 *                                without a token falls back to <0xXX> tokens; BOS always added
 * Special tokens (CONTROL / USER_DEFINED / UNKNOWN types) in the text are found first, longest first,
 * as llama.cpp does with parse_special. A vocabulary without merges is byte-level: one token per byte. */
#ifndef BMOE_TOKENIZER_H
#define BMOE_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "gguf.h"

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

/* Reads tokenizer.ggml.* from the model. Returns 0 or 3 (malformed or unsupported) / 1 (memory) with
 * err set to one line. `path` only names the file in messages. */
int tok_load(bmoe_tokenizer *tk, const gguf_model *g, const char *path, char *err, size_t errlen);
void tok_free(bmoe_tokenizer *tk);

/* Whether generating id ends generation: llama.cpp's end-of-generation set (EOS, EOT, EOM and the
 * tokens it recognises by text, such as <|im_end|>, <|eot_id|>, <end_of_turn>; tok_eog.c). */
int tok_is_eog(const bmoe_tokenizer *tk, int32_t id);

/* id of a token text, -1 when the vocabulary has none */
int32_t tok_find(const bmoe_tokenizer *tk, const uint8_t *s, size_t len);

enum {
    TOK_ADD_SPECIAL = 1u << 0,   /* BOS / EOS as the model asks (add_bos_token / add_eos_token) */
    TOK_PARSE_SPECIAL = 1u << 1, /* control tokens' texts in the input become those tokens */
};

/* Encodes text into *out (malloc'd, caller frees; *n tokens). Returns 0, -1 when a byte has no token
 * (err names it), or -3 when out of memory. */
int tok_encode(const bmoe_tokenizer *tk, const uint8_t *text, size_t len, unsigned flags, int32_t **out, int *n,
               char *err, size_t errlen);
/* The bytes of token id as generation prints them (llama.cpp's token_to_piece without specials):
 * NULL/0 for control, unknown, unused tokens and ids out of range. */
const uint8_t *tok_piece(const bmoe_tokenizer *tk, int32_t id, size_t *len);
/* Tokens back to text like llama.cpp's detokenize(remove_special=false, unparse_special=false): the
 * pieces, the leading space of the first one dropped when the model adds a space prefix, and the
 * clean-up of " ," " ." " 's"... for the BPE vocabularies that ask for it. *out is malloc'd. Returns 0
 * or -3 (memory). Ids out of range decode to nothing. */
int tok_detokenize(const bmoe_tokenizer *tk, const int32_t *ids, int n, uint8_t **out, size_t *len);

/* chat.c: the prompt as one user turn plus the generation prompt in the model's template (malloc'd,
 * NUL-terminated). Returns 0, 2 when the model has no recognised template (err set), -3 memory. */
int tok_chat_wrap(const bmoe_tokenizer *tk, const char *prompt, char **out, char *err, size_t errlen);
tok_chat tok_chat_detect(const char *tmpl, size_t len);
const char *tok_chat_name(tok_chat c);

/* internal (tok_load): builds tk->eog, making the tokens it finds by text control tokens. 0, 3 or 1. */
int tok_build_eog(bmoe_tokenizer *tk, const gguf_model *g, const char *path, char *err, size_t errlen);

/* internal: the encoders of one text fragment (tok_bpe.c, tok_spm.c), appending to a growing vector */
typedef struct {
    int32_t *v;
    int n, cap;
} tok_vec;
int tok_vec_push(tok_vec *v, int32_t id);
int tok_bpe_fragment(const bmoe_tokenizer *tk, const uint8_t *s, size_t len, tok_vec *out, char *err, size_t errlen);
int tok_gemma4_fragment(const bmoe_tokenizer *tk, const uint8_t *s, size_t len, tok_vec *out, char *err,
                        size_t errlen);
int tok_spm_fragment(const bmoe_tokenizer *tk, const uint8_t *s, size_t len, int space_prefix, tok_vec *out, char *err,
                     size_t errlen);

#endif
