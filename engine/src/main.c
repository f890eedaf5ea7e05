/* bmoe: the command line (docs/design.md, engine: command line).
 *
 *   bmoe --version | run [options] | check [options] | info -m MODEL | batch PLAN.jsonl | tokenize ... | archs
 *
 * Exit codes: 0 ok, 2 invalid configuration or usage, 3 unreadable or malformed model, 4 I/O error,
 * 1 internal error. A failing command writes exactly one line `bmoe: error: <message>` to stderr.
 * A single-process `run` with a lossy knob armed also writes, human or --json: the narrow-routing
 * warning once at load (when due), and `moe-drop: ...` / `moe-subst: ...` at the end. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "engine.h"
#include "json.h"
#include "model.h"
#include "plan.h"
#include "policy_report.h"
#include "result.h"
#include "tokenize_cmd.h"

static const char USAGE[] =
    "usage: bmoe --version\n"
    "       bmoe run [options]        greedy generation (--json for the result object)\n"
    "       bmoe check [options]      validate the options only, no model: prints ok or error: ...\n"
    "       bmoe info -m MODEL        model facts as JSON (--types: the weight types this build computes with)\n"
    "       bmoe archs                the architecture recipes (arch.c) as JSON\n"
    "       bmoe batch PLAN.jsonl     one {\"id\": ..., \"argv\": [\"run\"|\"check\", ...]} per line, a JSON result each\n"
    "       bmoe tokenize -m MODEL -p TEXT | --texts FILE | --eog [--chat] [--no-special] [--no-parse-special]\n"
    "                                 token ids (and the ids decoded) as JSON, one line per text\n"
    "run options: -m/--model FILE, -p/--prompt TEXT | --prompt-tokens 1,2,3, -n N, -t N, -c N,\n"
    "  --n-expert-used K, --mmap, --cache-mb M, --force-cache, --io-threads N, --no-odirect,\n"
    "  --prefetch L, --prefetch-sync, --drop-cold-experts F, --drop-in-prefill, --drop-no-renorm,\n"
    "  --expert-substitute L, --route-trace FILE, --logits-out FILE, --json, --chat,\n"
    "  --ppl FILE | --ppl-step FILE [--ppl-ref FILE] | --ppl-choices FILE | --session FILE  (docs/engine-flags.md)\n";

static void say_error(const bmoe_error *e) { fprintf(stderr, "bmoe: error: %s\n", e->msg); }

/* What the armed lossy knobs did, at the end of a single-process run (the exact shapes of docs/design.md, engine: result and exit codes). */
static void report_policy_lines(const bmoe_config *cfg, const bmoe_counters *c) {
    char line[256];
    if (cfg->drop_set) {
        report_drop_line(line, sizeof line, c->experts_dropped, c->experts_routed, cfg->drop);
        fprintf(stderr, "%s\n", line);
    }
    if (cfg->subst_set) {
        report_subst_line(line, sizeof line, c->subst_changed, c->subst_examined, cfg->subst);
        fprintf(stderr, "%s\n", line);
    }
}

/* The end of a failed single command: JSON object on stdout when asked for, one line on stderr. */
static int failed(const bmoe_error *e, int json) {
    if (json) {
        result_write_error(stdout, 0, NULL, e);
        fflush(stdout);
    }
    say_error(e);
    return e->code;
}

/* One run on a fresh engine. batch: JSON with "id" on `out`, nothing on stderr. Returns the exit code. */
static int do_run(int argc, char **argv, int batch, const char *id) {
    bmoe_config cfg;
    bmoe_error err = {0};
    char msg[1024] = "";
    config_defaults(&cfg);
    int rc = config_parse(&cfg, argc, argv, msg, sizeof msg);
    cfg.kernels = getenv("BMOE_KERNELS"); /* docs/engine-flags.md, environment */
    int json = batch || cfg.json;
    if (rc) err_set(&err, 2, "usage", "%s", msg);
    bmoe_engine *e = NULL;
    if (!rc) rc = engine_open(&cfg, &e, &err);
    /* the narrow-routing warning, once, at load (single process only: batch carries it in the JSON) */
    if (!rc && !batch && engine_load_warning(e)) fprintf(stderr, "%s\n", engine_load_warning(e));
    if (!rc) rc = engine_generate(e, &err);
    if (rc) {
        if (batch) result_write_error(stdout, 1, id, &err);
        else failed(&err, json);
    } else {
        const bmoe_result *r = engine_result(e);
        if (json) {
            result_write_run(stdout, batch, id, r);
        } else if (engine_mode(e) != BMOE_MODE_RUN) {
            engine_summary(e, stdout);
        } else {
            fwrite(r->text, 1, r->text_len, stdout);
            fputc('\n', stdout);
            fprintf(stderr, "bmoe: %d prompt tokens, %d generated; prefill %.3f s, decode %.2f tok/s\n",
                    r->n_prompt_tokens, r->n_tokens, r->timing.prefill_s, r->timing.decode_tok_s);
        }
        if (!batch) report_policy_lines(&cfg, &r->counters);
#ifdef BMOE_FAULT_BATCH_STDERR
        else fprintf(stderr, "bmoe: entry %s done\n", id); /* Fault: batch talks on stderr (BATCH-STDERR must notice). */
#endif
    }
    fflush(stdout);
    engine_close(e);
    config_free(&cfg);
    return rc ? err.code : 0;
}

/* validate() only. Single: `ok` / `error: <message>` on stdout. Batch: {"id", "ok"[, "error"]}. */
static int do_check(int argc, char **argv, int batch, const char *id) {
    bmoe_config cfg;
    bmoe_error err = {0};
    char msg[1024] = "";
    config_defaults(&cfg);
    int rc = config_parse(&cfg, argc, argv, msg, sizeof msg);
    if (rc) err_set(&err, 2, "usage", "%s", msg);
    else if ((rc = config_validate(&cfg, msg, sizeof msg))) err_set(&err, 2, "config", "%s", msg);
    if (batch) {
        if (rc) result_write_error(stdout, 1, id, &err);
        else result_write_check_ok(stdout, 1, id);
    } else {
        if (rc) printf("error: %s\n", err.msg);
        else printf("ok\n");
    }
    fflush(stdout);
    config_free(&cfg);
    return rc ? 2 : 0;
}

static int do_info(int argc, char **argv) {
    bmoe_error err = {0};
    const char *path = NULL;
    int types = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--types") == 0) {
            types = 1;
        } else if (strcmp(a, "-m") == 0 || strcmp(a, "--model") == 0) {
            if (i + 1 >= argc) return failed((err_set(&err, 2, "usage", "%s: missing value", a), &err), 1);
            path = argv[++i];
        } else if (strncmp(a, "--model=", 8) == 0) {
            path = a + 8;
        } else if (strcmp(a, "--json") == 0) {
            /* info always prints JSON */
        } else {
            return failed((err_set(&err, 2, "usage", "info: unexpected argument '%.40s' (usage: bmoe info -m MODEL | --types)", a), &err), 1);
        }
    }
    if (types && path)
        return failed((err_set(&err, 2, "usage", "info: --types lists this build's weight types and takes no -m MODEL"), &err), 1);
    if (types) { /* the weight types this build computes with: no model needed */
        result_write_types(stdout);
        fflush(stdout);
        return 0;
    }
    if (!path || !path[0]) return failed((err_set(&err, 2, "usage", "info: -m MODEL is required"), &err), 1);
    bmoe_model *m = NULL;
    char msg[1024] = "";
    int rc = model_open(path, 0, &m, msg, sizeof msg);
    if (rc) return failed((err_set(&err, rc, NULL, "%s", msg), &err), 1);
    result_write_info(stdout, m);
    fflush(stdout);
    model_close(m);
    return 0;
}

/* The recipe table as one JSON object: {"ok": true, "recipes": [row, ...]} (arch.h, arch_write_json). */
static int do_archs(int argc, char **argv) {
    bmoe_error err = {0};
    if (argc > 0 && strcmp(argv[0], "--json") != 0)
        return failed((err_set(&err, 2, "usage", "archs: unexpected argument '%.40s' (usage: bmoe archs)", argv[0]), &err), 1);
    json_writer w;
    json_init(&w, stdout);
    json_begin_object(&w, NULL);
    json_bool(&w, "ok", 1);
    json_begin_array(&w, "recipes");
    for (int i = 0; i < arch_count(); i++) arch_write_json(&w, arch_at(i));
    json_end_array(&w);
    json_end_object(&w);
    json_end(&w);
    fflush(stdout);
    return 0;
}

/* Reads the whole plan (bounded), then runs each non-empty line on a fresh engine. */
static int do_batch(int argc, char **argv) {
    bmoe_error err = {0};
    if (argc != 1) return failed((err_set(&err, 2, "usage", "batch: expected one plan file (usage: bmoe batch PLAN.jsonl)"), &err), 0);
    const char *path = argv[0];
    FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
    if (!f) return failed((err_set(&err, 2, "usage", "batch: cannot open %s: %s", path, strerror(errno)), &err), 0);
    size_t cap = 1 << 16, len = 0;
    const size_t max = (size_t)64 << 20;
    char *buf = malloc(cap);
    int rd_err = 0;
    while (buf) {
        if (len == cap) {
            if (cap >= max) { rd_err = EFBIG; break; }
            char *nb = realloc(buf, cap * 2);
            if (!nb) { free(buf); buf = NULL; break; }
            buf = nb;
            cap *= 2;
        }
        size_t n = fread(buf + len, 1, cap - len, f);
        len += n;
        if (n == 0) {
            if (ferror(f)) rd_err = errno ? errno : EIO;
            break;
        }
    }
    if (f != stdin) fclose(f);
    if (!buf) return failed((err_set(&err, 1, NULL, "batch: out of memory reading %s", path), &err), 0);
    if (rd_err) {
        free(buf);
        return failed((err_set(&err, 2, "usage", "batch: cannot read %s: %s", path,
                               rd_err == EFBIG ? "larger than 64 MiB" : strerror(rd_err)), &err), 0);
    }
    size_t pos = 0;
    while (pos < len) {
        size_t end = pos;
        while (end < len && buf[end] != '\n') end++;
        const char *line = buf + pos;
        size_t n = end - pos;
        pos = end + 1;
        size_t k = 0;
        while (k < n && (line[k] == ' ' || line[k] == '\t' || line[k] == '\r')) k++;
        if (k == n) continue; /* blank line */
        bmoe_plan_entry e;
        char msg[1024] = "";
        if (plan_parse_line(line, n, &e, msg, sizeof msg)) {
            err_set(&err, 2, "usage", "%s", msg);
            result_write_error(stdout, 1, e.id, &err);
        } else if (strcmp(e.argv[0], "run") == 0) {
            do_run(e.argc - 1, e.argv + 1, 1, e.id);
        } else if (strcmp(e.argv[0], "check") == 0) {
            do_check(e.argc - 1, e.argv + 1, 1, e.id);
        } else {
            err_set(&err, 2, "usage", "batch: argv[0] must be \"run\" or \"check\", not '%.40s'", e.argv[0]);
            result_write_error(stdout, 1, e.id, &err);
        }
        fflush(stdout);
        plan_entry_free(&e);
    }
    free(buf);
    return 0;
}

int main(int argc, char **argv) {
    bmoe_error err = {0};
    if (argc < 2) {
        return failed((err_set(&err, 2, "usage", "no command given (run, check, info, batch, --version; --help for usage)"), &err), 0);
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "--version") == 0 || strcmp(cmd, "version") == 0) {
        printf("bmoe %s build %s target %s\n", BMOE_VERSION, BMOE_BUILD_ID, BMOE_TARGET);
        return 0;
    }
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
        fputs(USAGE, stdout);
        return 0;
    }
    if (strcmp(cmd, "run") == 0) return do_run(argc - 2, argv + 2, 0, NULL);
    if (strcmp(cmd, "check") == 0) return do_check(argc - 2, argv + 2, 0, NULL);
    if (strcmp(cmd, "info") == 0) return do_info(argc - 2, argv + 2);
    if (strcmp(cmd, "batch") == 0) return do_batch(argc - 2, argv + 2);
    if (strcmp(cmd, "archs") == 0) return do_archs(argc - 2, argv + 2);
    if (strcmp(cmd, "tokenize") == 0) {
        int rc = tokenize_main(argc - 2, argv + 2, &err);
        return rc ? failed(&err, 0) : 0;
    }
    return failed((err_set(&err, 2, "usage", "unknown command '%.40s' (run, check, info, batch, tokenize, archs, --version)", cmd), &err), 0);
}
