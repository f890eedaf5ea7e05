/* Chat templates (chat.c): the ones recognised in tokenizer.chat_template, and a prompt wrapped in
 * the model's (--chat). */
#ifndef BMOE_CHAT_H
#define BMOE_CHAT_H

#include <stddef.h>

#include "tok_vocab.h"

/* The prompt as one user turn plus the generation prompt in the model's template (malloc'd,
 * NUL-terminated). Returns 0, 2 when the model has no recognised template (err set), -3 memory. */
int tok_chat_wrap(const bmoe_tokenizer *tk, const char *prompt, char **out, char *err, size_t errlen);
tok_chat tok_chat_detect(const char *tmpl, size_t len);
const char *tok_chat_name(tok_chat c);

#endif
