/* The SentencePiece-style encoder of one raw text fragment (tok_spm.c), appending to out; space_prefix:
 * a U+2581 is put in front. 0, -1 when a byte has no token (err names it), -3 out of memory. */
#ifndef BMOE_TOK_SPM_H
#define BMOE_TOK_SPM_H

#include <stddef.h>
#include <stdint.h>

#include "tok_vocab.h"

int tok_spm_fragment(const bmoe_tokenizer *tk, const uint8_t *s, size_t len, int space_prefix, tok_vec *out, char *err,
                     size_t errlen);

#endif
