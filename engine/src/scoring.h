/* The quality instruments' pure parts (docs/engine-flags.md, scoring): reading the input files of
 * --ppl / --ppl-step / --ppl-ref / --ppl-choices / --session, and scoring one row of logits against
 * the next token (negative log-likelihood, argmax agreement, KL divergence to a reference row).
 *
 * Determinism: every sum runs serially in index order in double precision, exp/log are tensor.c's,
 * and the accumulators add rows in position order, so a score is a function of the logits alone
 * (the same bytes on every thread count and architecture). engine.c drives the forward passes. */
#ifndef BMOE_SCORING_H
#define BMOE_SCORING_H

#include <stddef.h>
#include <stdint.h>

#include "result.h"
#include "tokenizer.h"

#define BMOE_MAX_INPUT_BYTES (4u << 20)   /* an input file larger than 4 MiB is refused */
#define BMOE_MAX_SESSION_PROMPTS 4096
#define BMOE_MAX_CHOICE_QUESTIONS 65536
#define BMOE_MAX_CHOICE_OPTIONS 64

/* Reads a whole input file (at most BMOE_MAX_INPUT_BYTES). `flag` names it in messages. Returns 0
 * (*buf malloc'd, NUL-terminated after len bytes), or 2 with err set (kind "usage": cannot be
 * opened or read, a directory, too large, empty). */
int score_read_file(const char *flag, const char *path, uint8_t **buf, size_t *len, bmoe_error *err);

/* How the scoring inputs become tokens (score_tokens.c): through the model's tokenizer (tok_encode),
 * BOS/EOS as the model asks. Texts scored for likelihood (--ppl, --ppl-step, --ppl-choices) read
 * special-token texts as plain text, as llama.cpp's perplexity tools do; --session prompts parse them,
 * as -p does. */

/* A text file as tokens. A NUL byte makes it binary and is refused (usage); a byte without a token
 * is a config error. At least two tokens (one prediction). Returns 0 (*out malloc'd) or 2/1 with err
 * set. */
int score_text_tokens(const char *flag, const char *path, const bmoe_tokenizer *tk, int32_t **out, int *n,
                      bmoe_error *err);

/* Sums over scored positions, added in position order. */
typedef struct score_acc {
    double nll_sum;          /* sum of -log p(next token) */
    int64_t n;               /* positions scored */
    int64_t top1;            /* argmax == next token */
    int64_t ref_agree;       /* argmax == the reference row's argmax (with a reference) */
    double kl_sum;           /* sum of KL(reference || model) (with a reference) */
} score_acc;

/* Scores one row: logits[0..V) predicting `target`; ref (NULL for none) is the reference run's row
 * for the same position. Adds into a and returns log p(target). */
double score_row(score_acc *a, const float *logits, int V, int32_t target, const float *ref);

/* --ppl-ref: the reference logits [rows, V] as floats (little-endian f32 on disk). rows must be the
 * scored positions (n_scored, what --logits-out writes in a scoring run) or n_scored + 1 (a `run -n 0
 * --logits-out` over the same tokens, every prompt position). 0, or 2 with err set. */
int score_read_ref(const char *path, int V, int64_t n_scored, float **out, bmoe_error *err);

/* One multiple-choice question of --ppl-choices. Strings are byte arrays (JSON escapes decoded). */
typedef struct choice_question {
    char *id;                  /* the "id" as text (a JSON string's bytes, or an integer's digits) */
    int id_is_string;
    uint8_t *context;
    size_t context_len;
    int n_options;
    uint8_t **options;
    size_t *option_len;
    int answer;
    int line;                  /* 1-based line in the file */
} choice_question;

/* Parses the JSONL: one object per non-blank line with "id" (string or integer), "context" (string),
 * "options" (2..64 non-empty strings) and "answer" (an index into options); other keys are skipped.
 * An error names the file and line. 0 or 2 with err set. */
int choices_parse(const char *path, const uint8_t *buf, size_t len, choice_question **out, int *n, bmoe_error *err);
void choices_free(choice_question *q, int n);

/* One question as tokens. The context and each context + option text are tokenized whole; `prefix`
 * is the longest run of leading tokens the context's tokens share with every one of them (all of the
 * context's tokens unless an option merges into its end), evaluated once; each option's own tokens
 * are what its text has after the prefix. */
typedef struct choice_tokens {
    int32_t *prefix;
    int n_prefix;
    int32_t **opt;            /* [n_options] */
    int *n_opt;
} choice_tokens;

/* 0; 2 with err set naming flag, path and the question's line (a byte without a token, an empty
 * context, no shared first token); 1 out of memory. *t is filled (free with choice_tokens_free) even
 * on failure. */
int choice_tokens_build(const bmoe_tokenizer *tk, const choice_question *q, const char *flag, const char *path,
                        choice_tokens *t, bmoe_error *err);
void choice_tokens_free(choice_tokens *t, int n_options);

/* One prompt of --session. */
typedef struct session_prompt {
    char *id;                  /* JSONL "id", or the line number as text */
    uint8_t *text;
    size_t len;
    int line;
} session_prompt;

/* Parses a session file: when its first non-blank line starts with '{' every non-blank line is a JSON
 * object {"prompt": string, "id": string or integer (optional)}; otherwise every non-blank line is a
 * prompt as raw bytes (a trailing '\r' removed). 0 or 2 with err set. */
int session_parse(const char *path, const uint8_t *buf, size_t len, session_prompt **out, int *n, bmoe_error *err);
void session_free(session_prompt *p, int n);

/* A --session prompt as tokens, exactly as -p tokenizes the same text (specials parsed). 0 (*out
 * malloc'd), 2 with err set (a byte without a token, an empty or too long prompt), 1 memory. */
int session_tokens(const bmoe_tokenizer *tk, const session_prompt *p, const char *flag, const char *path,
                   int32_t **out, int *n, bmoe_error *err);

#endif
