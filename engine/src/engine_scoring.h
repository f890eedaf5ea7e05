/* The engine's scoring modes and sessions (docs/engine-flags.md, scoring): --ppl, --ppl-step,
 * --ppl-choices and --session, driven through the same seam as a run's, so the cache, the policies,
 * the counters and the route trace see a scoring run exactly as they see prefill (--ppl) or decode
 * (--ppl-step, --ppl-choices). Their pure parts (input files, row scores) are scoring.c's; the
 * instance they run on is engine.c's (engine_state.h). */
#ifndef BMOE_ENGINE_SCORING_H
#define BMOE_ENGINE_SCORING_H

#include <stdio.h>

#include "engine_state.h"

/* Reads the mode's input file and sets the tokens, the largest batch and the per-input arrays (at
 * engine_open, before the forward pass is built). 0 or an exit code with *err set. */
int scoring_build_inputs(bmoe_engine *e, bmoe_error *err);

/* Runs the mode (engine_generate of a scoring or session run) and fills e->res, whose write_extra
 * writes the mode's own keys. 0 or an exit code with *err set. */
int scoring_run(bmoe_engine *e, bmoe_error *err);

/* engine_summary: the human-mode lines of a scoring or session run. */
void scoring_summary(const bmoe_engine *e, FILE *out);

/* Frees what scoring_build_inputs and scoring_run allocated (engine_close). */
void scoring_free(bmoe_engine *e);

#endif
