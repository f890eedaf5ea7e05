/* Run configuration: parsed from the command line (or a batch plan line), checked by validate().
 * validate() is pure: it needs no model, so `bmoe check` gives the same verdict on every device. */
#ifndef BMOE_CONFIG_H
#define BMOE_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#define BMOE_MAX_PROMPT_TOKENS 4096

typedef struct bmoe_config {
    const char *model;          /* -m/--model */
    const char *prompt;         /* -p/--prompt (text) */
    int32_t *prompt_tokens;     /* --prompt-tokens 1,2,3 (owned; NULL if not given) */
    int n_prompt_tokens;
    int n_predict;              /* -n, default 16 */
    int threads;                /* -t, default 1 */
    int ctx;                    /* -c, default 0 = min(model context, 4096) */
    int n_expert_used;          /* --n-expert-used, 0 = the model's top-k */
    int mmap;                   /* --mmap: resident reference, no streaming */
    int cache_mb;               /* --cache-mb, 0 = cache off (default) */
    int force_cache;            /* --force-cache */
    int io_threads;             /* --io-threads, default 1 */
    int no_odirect;             /* --no-odirect */
    int prefetch;               /* --prefetch L (layers ahead), 0 = off */
    int prefetch_sync;          /* --prefetch-sync */
    int drop_set;               /* --drop-cold-experts given */
    double drop;                /* F */
    int drop_in_prefill;        /* --drop-in-prefill */
    int drop_no_renorm;         /* --drop-no-renorm */
    int subst_set;              /* --expert-substitute given */
    double subst;               /* L */
    const char *route_trace;    /* --route-trace FILE */
    int json;                   /* --json */
    int chat;                   /* --chat: -p as one user turn in the model's chat template */
    const char *logits_out;     /* --logits-out FILE: raw f32 [positions, V], every evaluated position */
    const char *kernels;        /* kernel path (kernels.h): the BMOE_KERNELS environment variable, not a flag;
                                 * NULL = auto. Checked by engine_open (it depends on the CPU), not validate() */
    /* Quality instruments and sessions (docs/engine-flags.md, scoring): at most one input mode. */
    const char *ppl;            /* --ppl FILE: the text scored as wide prompt batches */
    const char *ppl_step;       /* --ppl-step FILE: the text scored one token per decode step */
    const char *ppl_ref;        /* --ppl-ref FILE: reference logits (a --logits-out file) for agreement and KL */
    const char *ppl_choices;    /* --ppl-choices FILE: multiple-choice JSONL, options scored step-wise */
    const char *session;        /* --session FILE: several prompts through one engine instance */
    int n_predict_set;          /* -n was given (the parser sets it; scoring modes refuse it) */
} bmoe_config;

/* The input mode a configuration asks for. */
enum bmoe_mode { BMOE_MODE_RUN, BMOE_MODE_PPL, BMOE_MODE_PPL_STEP, BMOE_MODE_CHOICES, BMOE_MODE_SESSION };
enum bmoe_mode config_mode(const bmoe_config *c);

void config_defaults(bmoe_config *c);
void config_free(bmoe_config *c);

/* Parses run options argv[0..argc-1] (after the subcommand). Returns 0, or 2 with a one-line message
 * in err naming the flag (unknown flag, missing value, unparsable number). String fields point into
 * argv (not copied): argv must outlive the config. Call config_free() after a failed parse too.
 * Range rules are validate()'s; the parser only refuses numbers that do not fit an int. */
int config_parse(bmoe_config *c, int argc, char **argv, char *err, size_t errlen);

/* Every rule of validate() (docs/design.md, the seam and the lossy knobs). Returns 0 or 2 with a one-line message naming the flag and why.
 * Pure and deterministic: no I/O, no model, no locale; the first failing rule in the fixed order of
 * docs/engine-flags.md is reported. Does not require -m or a prompt (`bmoe check` runs without them). */
int config_validate(const bmoe_config *c, char *err, size_t errlen);

/* --- additions (compatible) ------------------------------------------------------------------- */

/* Valid ranges, shared by config_validate(), the parser's overflow messages and docs/engine-flags.md. */
#define BMOE_MAX_N_PREDICT   1048576
#define BMOE_MAX_THREADS     256
#define BMOE_MAX_CTX         1048576
#define BMOE_MAX_EXPERT_USED 256
#define BMOE_MAX_CACHE_MB    1048576   /* 1 TiB */
#define BMOE_CACHE_BAND_MB   1499      /* 1..1499 MiB needs --force-cache */
#define BMOE_MAX_IO_THREADS  8
#define BMOE_MAX_PREFETCH    64

/* What `bmoe run` needs beyond validate(): a model path and a prompt (-p or --prompt-tokens).
 * Returns 0 or 2 with a one-line message. */
int config_require_run(const bmoe_config *c, char *err, size_t errlen);

/* The strict, platform-independent number grammar (see docs/engine-flags.md). `flag` names the option
 * in the message. Integers: [+-]?[0-9]+ within [lo, hi] (the message then reads "outside lo..hi").
 * Reals: [+-]?(D+(.D*)?|.D+)([eE][+-]?D+)?, finite, not underflowing; -0 becomes +0. 0 or 2. */
int config_parse_int(const char *flag, const char *s, long long lo, long long hi, long long *out,
                     char *err, size_t errlen);
int config_parse_real(const char *flag, const char *s, double *out, char *err, size_t errlen);

/* Shortest "%.{1..17}g" text that reads back as v (locale-independent); "nan"/"inf"/"-inf" otherwise.
 * buf should hold 32 bytes. Returns buf. */
const char *config_fmt_real(double v, char *buf, size_t n);

/* The effective run configuration as a JSON object (fixed key order) under `key` (NULL in arrays). */
struct json_writer;
void config_to_json(const bmoe_config *c, struct json_writer *w, const char *key);

#endif
