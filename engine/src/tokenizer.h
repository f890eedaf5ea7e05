/* Tokenizers read from GGUF metadata (docs/tokenizers.md):
 *   tokenizer.ggml.model "gpt2"  byte-level BPE: a pre-tokenizer (tokenizer.ggml.pre, pretok.h) cuts the
 *                                text into words, tokenizer.ggml.merges merge each word's bytes by rank
 *   tokenizer.ggml.model "llama" SentencePiece-style: spaces become U+2581, pieces merge by
 *                                tokenizer.ggml.scores, bytes without a piece fall back to <0xXX> tokens
 *   tokenizer.ggml.model "gemma4" BPE over raw UTF-8: spaces become U+2581, the text is cut into runs of
 *                                newlines and runs of the rest, characters merge by rank, a character
 *                                without a token falls back to <0xXX> tokens; BOS always added
 * Special tokens (CONTROL / USER_DEFINED / UNKNOWN types) in the text are found first, longest first,
 * as llama.cpp does with parse_special. A vocabulary without merges is byte-level: one token per byte.
 *
 * This header is the tokenizer's whole interface: the vocabulary (tok_vocab.h), the end-of-generation
 * set (tok_eog.h), the chat templates (chat.h), loading, encoding and decoding (tokenizer.c). The
 * per-algorithm encoders (tok_bpe.h, tok_spm.h) are tokenizer.c's to call. */
#ifndef BMOE_TOKENIZER_H
#define BMOE_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "chat.h"
#include "gguf.h"
#include "tok_eog.h"
#include "tok_vocab.h"

/* Reads tokenizer.ggml.* from the model. Returns 0 or 3 (malformed or unsupported) / 1 (memory) with
 * err set to one line. `path` only names the file in messages. */
int tok_load(bmoe_tokenizer *tk, const gguf_model *g, const char *path, char *err, size_t errlen);
void tok_free(bmoe_tokenizer *tk);

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

#endif
