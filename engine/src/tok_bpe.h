/* The BPE encoders of one raw text fragment (tok_bpe.c), appending to out: byte-level BPE
 * ("gpt2": pre-tokenizer words, merges by rank) and gemma4's BPE over raw UTF-8. 0, -1 when a byte has
 * no token (err names it), -3 out of memory. */
#ifndef BMOE_TOK_BPE_H
#define BMOE_TOK_BPE_H

#include <stddef.h>
#include <stdint.h>

#include "tok_vocab.h"

int tok_bpe_fragment(const bmoe_tokenizer *tk, const uint8_t *s, size_t len, tok_vec *out, char *err, size_t errlen);
int tok_gemma4_fragment(const bmoe_tokenizer *tk, const uint8_t *s, size_t len, tok_vec *out, char *err,
                        size_t errlen);

#endif
