/* `bmoe tokenize`: the model's tokenizer on its own (docs/engine-flags.md, tokenize). */
#ifndef BMOE_TOKENIZE_CMD_H
#define BMOE_TOKENIZE_CMD_H

#include "result.h"

/* argv after the subcommand. Prints one JSON object per text on stdout; returns the exit code with
 * err set on failure (2 usage, 3 malformed or unsupported tokenizer metadata, 4 I/O, 1 memory). */
int tokenize_main(int argc, char **argv, bmoe_error *err);

#endif
