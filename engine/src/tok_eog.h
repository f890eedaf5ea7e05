/* The end-of-generation set (tok_eog.c): llama.cpp's EOS, EOT, EOM and the tokens it recognises by
 * text. */
#ifndef BMOE_TOK_EOG_H
#define BMOE_TOK_EOG_H

#include <stddef.h>
#include <stdint.h>

#include "gguf.h"
#include "tok_vocab.h"

/* Whether generating id ends generation: llama.cpp's end-of-generation set (EOS, EOT, EOM and the
 * tokens it recognises by text, such as <|im_end|>, <|eot_id|>, <end_of_turn>). */
int tok_is_eog(const bmoe_tokenizer *tk, int32_t id);

/* At tok_load: builds tk->eog, making the tokens it finds by text control tokens. 0, 3 or 1. */
int tok_build_eog(bmoe_tokenizer *tk, const gguf_model *g, const char *path, char *err, size_t errlen);

#endif
