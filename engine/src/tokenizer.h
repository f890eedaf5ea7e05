/* Byte-level tokenizer (GPT-2 byte-to-unicode vocabulary, no merges): a prompt is its bytes, one
 * token each; a token decodes to the bytes its text stands for; special tokens decode to nothing. */
#ifndef BMOE_TOKENIZER_H
#define BMOE_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "gguf.h"

typedef struct bmoe_tokenizer {
    int n_vocab;
    uint8_t *bytes;          /* every token's decoded bytes, back to back */
    uint64_t *off;           /* token i is bytes[off[i] .. off[i+1]) (n_vocab + 1 entries) */
    int32_t byte_token[256]; /* the token of each byte, -1 when the vocabulary has none */
    int32_t bos, eos;        /* -1 when absent */
    int add_bos;
} bmoe_tokenizer;

/* GPT-2's bytes_to_unicode: the code point that stands for byte b in token texts. */
uint32_t tok_byte_to_cp(uint8_t b);
/* The inverse: the byte a code point stands for, or -1. */
int tok_cp_to_byte(uint32_t cp);

/* Reads tokenizer.ggml.* from the model. Returns 0 or 3 (malformed) / 1 (memory) with err set.
 * `path` only names the file in messages. */
int tok_load(bmoe_tokenizer *tk, const gguf_model *g, const char *path, char *err, size_t errlen);
void tok_free(bmoe_tokenizer *tk);

/* Encodes text (BOS first when the model asks for it) into out (capacity cap). Returns the count, or
 * -1 when a byte has no token (err names it), or -2 when cap is too small. */
int tok_encode(const bmoe_tokenizer *tk, const uint8_t *text, size_t len, int32_t *out, int cap, char *err,
               size_t errlen);
/* The bytes of token id (NULL/0 for specials or an id out of range). */
const uint8_t *tok_piece(const bmoe_tokenizer *tk, int32_t id, size_t *len);

#endif
