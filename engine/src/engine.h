/* One engine instance: a model, its tokenizer, a thread pool, the seam (expert source + hook), the
 * forward pass, and one greedy generation with its counters and timings.
 *
 * Instances share nothing: `bmoe batch` opens a fresh one per plan entry. */
#ifndef BMOE_ENGINE_H
#define BMOE_ENGINE_H

#include <stdio.h>

#include "config.h"
#include "result.h"

typedef struct bmoe_engine bmoe_engine;

/* Validates the configuration against the model, loads it and builds the seam. `cfg` must outlive the
 * engine. Returns 0 or an exit code with *err set (2 config, 3 model, 4 I/O, 1 internal). */
int engine_open(const bmoe_config *cfg, bmoe_engine **out, bmoe_error *err);

/* Prefill + greedy decode of cfg->n_predict tokens (stops at EOS). Returns 0 or an exit code. */
int engine_generate(bmoe_engine *e, bmoe_error *err);

/* Valid after a successful engine_generate, until engine_close. */
const bmoe_result *engine_result(const bmoe_engine *e);

/* The narrow-routing warning (docs/design.md, engine: result and exit codes) when it is due for this run, else NULL. Known after
 * engine_open; a single-process `run` prints it once to stderr at load, and the result carries the
 * same text in `warnings` (batch writes nothing to stderr). Valid until engine_close. */
const char *engine_load_warning(const bmoe_engine *e);

/* Human-mode output of a scoring or session run (docs/engine-flags.md, scoring): one summary line
 * for --ppl / --ppl-step / --ppl-choices, each prompt's generated text on its own line for --session. */
void engine_summary(const bmoe_engine *e, FILE *out);

/* The input mode of this run (BMOE_MODE_RUN for a plain generation). */
enum bmoe_mode engine_mode(const bmoe_engine *e);

void engine_close(bmoe_engine *e);

#endif
