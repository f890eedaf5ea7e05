/* The quality instruments' pure parts (scoring.h): row scoring (nll, argmax agreement, KL to a
 * reference), the input files' refusals, and the --ppl-choices / --session readers, whose errors must
 * name the file and the line. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "mini_gguf.h"
#include "scoring.h"

/* A byte-level vocabulary (GPT-2 byte images in byte order, so byte b is token b; none for 'Z', whose
 * slot holds "<pad>"), then "<s>" (256, control, BOS) and "ab" (257) with the merge "a b" when `merge`. */
static void make_tok(bmoe_tokenizer *tk, int add_bos, int merge) {
    meta m = {0};
    char *toks[258];
    int32_t types[258];
    for (int b = 0; b < 256; b++) {
        uint32_t cp = tok_byte_to_cp((uint8_t)b);
        toks[b] = malloc(8);
        if (b == 'Z') strcpy(toks[b], "<pad>");
        else if (cp < 0x80) { toks[b][0] = (char)cp; toks[b][1] = 0; }
        else { toks[b][0] = (char)(0xc0 | (cp >> 6)); toks[b][1] = (char)(0x80 | (cp & 0x3f)); toks[b][2] = 0; }
        types[b] = 1;
    }
    toks[256] = strdup("<s>");
    toks[257] = strdup("ab");
    types[256] = 3;
    types[257] = 1;
    char *merges[1] = { "a b" };
    kv_str(&m, "tokenizer.ggml.model", "gpt2");
    kv_str(&m, "tokenizer.ggml.pre", "qwen2");
    kv_strs(&m, "tokenizer.ggml.tokens", toks, 258);
    kv_i32s(&m, "tokenizer.ggml.token_type", types, 258);
    kv_strs(&m, "tokenizer.ggml.merges", merges, merge);
    kv_u32(&m, "tokenizer.ggml.bos_token_id", 256);
    kv_bool(&m, "tokenizer.ggml.add_bos_token", add_bos);
    for (int i = 0; i < 258; i++) free(toks[i]);
    gguf_model *g = finish(&m);
    char err[256] = "";
    int rc = g ? tok_load(tk, g, "vocab.gguf", err, sizeof err) : -1;
    if (rc) fprintf(stderr, "make_tok: %s\n", err);
    CHECK(rc == 0);
    gguf_close(g); /* the tokenizer keeps copies of what it needs */
}

static void test_row(void) {
    score_acc a;
    memset(&a, 0, sizeof a);
    float flat[4] = {0, 0, 0, 0};
    double lp = score_row(&a, flat, 4, 2, NULL);
    CHECK(fabs(lp + log(4.0)) < 1e-12);
    CHECK(a.n == 1 && a.top1 == 0); /* argmax of a tie is the first index */
    score_row(&a, flat, 4, 0, NULL);
    CHECK(a.n == 2 && a.top1 == 1);
    CHECK(fabs(a.nll_sum - 2 * log(4.0)) < 1e-12);

    /* a reference equal to the row: full agreement, KL exactly 0 */
    float row[5] = {1.5f, -2.0f, 0.25f, 3.0f, 0.0f};
    memset(&a, 0, sizeof a);
    score_row(&a, row, 5, 3, row);
    CHECK(a.top1 == 1 && a.ref_agree == 1 && a.kl_sum == 0.0);

    /* KL(ref || row) against a direct computation */
    float ref[5] = {0.0f, 1.0f, 2.0f, -1.0f, 0.5f};
    memset(&a, 0, sizeof a);
    score_row(&a, row, 5, 1, ref);
    double zr = 0, zl = 0, kl = 0;
    for (int i = 0; i < 5; i++) { zr += exp(ref[i]); zl += exp(row[i]); }
    for (int i = 0; i < 5; i++) {
        double pr = exp(ref[i]) / zr;
        kl += pr * (log(pr) - (row[i] - log(zl)));
    }
    CHECK(fabs(a.kl_sum - kl) < 1e-9 && a.kl_sum > 0);
    CHECK(a.ref_agree == 0 && a.top1 == 0);
    CHECK(fabs(a.nll_sum - (log(zl) - row[1])) < 1e-9);

    /* the same rows in the same order give the same bits */
    score_acc b;
    memset(&b, 0, sizeof b);
    score_row(&b, row, 5, 1, ref);
    CHECK(memcmp(&a, &b, sizeof a) == 0);
}

static const char *write_tmp(const char *name, const void *data, size_t n) {
    static char path[256];
    snprintf(path, sizeof path, "/tmp/bmoe_test_scoring_%d_%s", (int)getpid(), name);
    FILE *f = fopen(path, "wb");
    if (f) {
        if (n) fwrite(data, 1, n, f);
        fclose(f);
    }
    return path;
}

static void test_text_files(void) {
    bmoe_tokenizer tk;
    bmoe_error err;
    int32_t *ids = NULL;
    int n = 0;
    make_tok(&tk, 1, 1);
    const char *p = write_tmp("a.txt", "hi", 2);
    CHECK(score_text_tokens("--ppl", p, &tk, &ids, &n, &err) == 0);
    CHECK(n == 3 && ids[0] == 256 && ids[1] == 'h' && ids[2] == 'i');
    free(ids);
    unlink(p);

    p = write_tmp("empty.txt", "", 0);
    CHECK(score_text_tokens("--ppl", p, &tk, &ids, &n, &err) == 2 && strstr(err.msg, "is empty") &&
          strncmp(err.msg, "--ppl: ", 7) == 0);
    unlink(p);

    p = write_tmp("bin.txt", "ab\0cd", 5);
    CHECK(score_text_tokens("--ppl-step", p, &tk, &ids, &n, &err) == 2 && strstr(err.msg, "NUL byte at offset 2"));
    unlink(p);

    p = write_tmp("z.txt", "abZ", 3);
    CHECK(score_text_tokens("--ppl", p, &tk, &ids, &n, &err) == 2 && strstr(err.msg, "byte 0x5a has no token") &&
          strstr(err.msg, "--ppl: /tmp/"));
    CHECK(strcmp(err.kind, "config") == 0);
    unlink(p);

    /* the model's tokenizer: merges apply, special-token texts stay text */
    p = write_tmp("m.txt", "xab<s>", 6);
    CHECK(score_text_tokens("--ppl", p, &tk, &ids, &n, &err) == 0);
    CHECK(n == 6 && ids[0] == 256 && ids[1] == 'x' && ids[2] == 257 && ids[3] == '<' && ids[5] == '>');
    free(ids);
    unlink(p);
    tok_free(&tk);

    p = write_tmp("one.txt", "x", 1);
    make_tok(&tk, 0, 1);
    CHECK(score_text_tokens("--ppl", p, &tk, &ids, &n, &err) == 2 && strstr(err.msg, "at least 2"));
    unlink(p);

    CHECK(score_text_tokens("--ppl", "/nonexistent/t.txt", &tk, &ids, &n, &err) == 2 &&
          strstr(err.msg, "cannot open /nonexistent/t.txt") && strcmp(err.kind, "usage") == 0);
    CHECK(score_text_tokens("--ppl", "/tmp", &tk, &ids, &n, &err) == 2 && strstr(err.msg, "is a directory"));
    tok_free(&tk);
}

static void test_ref(void) {
    bmoe_error err;
    float rows[6] = {1, 2, 3, 4, 5, 6};
    float *out = NULL;
    const char *p = write_tmp("ref.bin", rows, sizeof rows);
    CHECK(score_read_ref(p, 3, 2, &out, &err) == 0 && out && out[0] == 1 && out[5] == 6);
    free(out);
    CHECK(score_read_ref(p, 2, 2, &out, &err) == 0 && out[3] == 4); /* 3 rows of 2 = n_scored + 1 */
    free(out);
    CHECK(score_read_ref(p, 3, 5, &out, &err) == 2 && strstr(err.msg, "has 24 bytes, expected 5 or 6 rows"));
    unlink(p);
    CHECK(score_read_ref("/nonexistent/r.bin", 3, 2, &out, &err) == 2 && strstr(err.msg, "cannot open"));
}

static const char *choices_error(const char *text) {
    static bmoe_error err;
    choice_question *q = NULL;
    int n = 0;
    memset(&err, 0, sizeof err);
    int rc = choices_parse("mc.jsonl", (const uint8_t *)text, strlen(text), &q, &n, &err);
    choices_free(q, n);
    return rc ? err.msg : "";
}

static void test_choices(void) {
    const char *text =
        "{\"id\": \"q1\", \"context\": \"ab\", \"options\": [\"c\", \"d\\u00e9\"], \"answer\": 1, \"extra\": [1, {\"x\": null}]}\n"
        "\n"
        "{\"answer\": 0, \"options\": [\"x\", \"y\", \"z\"], \"context\": \"\", \"id\": 7}\n";
    choice_question *q = NULL;
    int n = 0;
    bmoe_error err;
    CHECK(choices_parse("mc.jsonl", (const uint8_t *)text, strlen(text), &q, &n, &err) == 0);
    CHECK(n == 2);
    if (n == 2) {
        CHECK(strcmp(q[0].id, "q1") == 0 && q[0].id_is_string && q[0].answer == 1 && q[0].n_options == 2);
        CHECK(q[0].option_len[1] == 3 && memcmp(q[0].options[1], "d\xc3\xa9", 3) == 0);
        CHECK(strcmp(q[1].id, "7") == 0 && !q[1].id_is_string && q[1].line == 3 && q[1].n_options == 3);
    }
    choices_free(q, n);

    CHECK(strstr(choices_error("{\"id\":1,\"context\":\"a\",\"options\":[\"b\",\"c\"],\"answer\":0}\n{\"id\":2,"),
                 "--ppl-choices: mc.jsonl: line 2: ") != NULL);
    CHECK(strstr(choices_error("{\"id\":1,\"context\":\"a\",\"options\":[\"b\",\"c\"],\"answer\":0}\n\n{\"id\":2,"),
                 "mc.jsonl: line 3:") != NULL);
    CHECK(strcmp(choices_error("{\"id\":1,\"context\":\"a\",\"options\":[\"b\",\"c\"]}"),
                 "--ppl-choices: mc.jsonl: line 1: missing key \"answer\"") == 0);
    CHECK(strcmp(choices_error("{\"id\":1,\"context\":\"a\",\"options\":[\"b\",\"c\"],\"answer\":2}"),
                 "--ppl-choices: mc.jsonl: line 1: \"answer\" 2 is not an index into the 2 options") == 0);
    CHECK(strcmp(choices_error("{\"id\":1,\"context\":\"a\",\"options\":[\"b\"],\"answer\":0}"),
                 "--ppl-choices: mc.jsonl: line 1: \"options\" has 1 entries, at least 2 are needed") == 0);
    CHECK(strcmp(choices_error("{\"id\":1,\"context\":\"a\",\"options\":[\"b\",\"\"],\"answer\":0}"),
                 "--ppl-choices: mc.jsonl: line 1: option 1 is empty") == 0);
    CHECK(strcmp(choices_error("{\"id\":1,\"context\":\"a\",\"options\":[\"b\",\"c\"],\"answer\":0.5}"),
                 "--ppl-choices: mc.jsonl: line 1: expected an integer") == 0);
    CHECK(strcmp(choices_error("[1, 2]"), "--ppl-choices: mc.jsonl: line 1: expected a JSON object") == 0);
    CHECK(strcmp(choices_error("{\"id\":1,\"context\":\"a\",\"options\":[\"b\",\"c\"],\"answer\":0} x"),
                 "--ppl-choices: mc.jsonl: line 1: unexpected text after the object") == 0);
    CHECK(strcmp(choices_error("{\"id\":1,\"context\":\"a\\u0000\",\"options\":[\"b\",\"c\"],\"answer\":0}"),
                 "--ppl-choices: mc.jsonl: line 1: \\u0000 is not accepted") == 0);
    CHECK(strcmp(choices_error("{\"id\":true,\"context\":\"a\",\"options\":[\"b\",\"c\"],\"answer\":0}"),
                 "--ppl-choices: mc.jsonl: line 1: \"id\" must be a string or an integer") == 0);
    CHECK(strcmp(choices_error("\n \n"), "--ppl-choices: mc.jsonl has no questions") == 0);
}

static void test_session(void) {
    session_prompt *p = NULL;
    int n = 0;
    bmoe_error err;
    const char *plain = "hello there\r\n\nsecond line\n";
    CHECK(session_parse("s.txt", (const uint8_t *)plain, strlen(plain), &p, &n, &err) == 0 && n == 2);
    if (n == 2) {
        CHECK(p[0].len == 11 && memcmp(p[0].text, "hello there", 11) == 0 && strcmp(p[0].id, "1") == 0);
        CHECK(p[1].len == 11 && strcmp(p[1].id, "3") == 0 && p[1].line == 3);
    }
    session_free(p, n);
    const char *jsonl = "{\"id\": \"a\", \"prompt\": \"x\\ny\"}\n{\"prompt\": \"z\", \"id\": 5}\n";
    CHECK(session_parse("s.jsonl", (const uint8_t *)jsonl, strlen(jsonl), &p, &n, &err) == 0 && n == 2);
    if (n == 2) {
        CHECK(strcmp(p[0].id, "a") == 0 && p[0].len == 3 && memcmp(p[0].text, "x\ny", 3) == 0);
        CHECK(strcmp(p[1].id, "5") == 0);
    }
    session_free(p, n);
    const char *bad = "{\"prompt\": \"x\"}\nplain text\n";
    CHECK(session_parse("s.jsonl", (const uint8_t *)bad, strlen(bad), &p, &n, &err) == 2 &&
          strcmp(err.msg, "--session: s.jsonl: line 2: expected a JSON object") == 0);
    const char *noprompt = "{\"id\": 1}\n";
    CHECK(session_parse("s.jsonl", (const uint8_t *)noprompt, strlen(noprompt), &p, &n, &err) == 2 &&
          strcmp(err.msg, "--session: s.jsonl: line 1: missing key \"prompt\"") == 0);
}

/* one question's tokens: the prefix every option shares, each option's own tokens */
static int choice_is(const bmoe_tokenizer *tk, const char *line, const int32_t *prefix, int np, const int32_t *o0, int n0,
                     const int32_t *o1, int n1, bmoe_error *err) {
    choice_question *q = NULL;
    int n = 0;
    CHECK(choices_parse("mc.jsonl", (const uint8_t *)line, strlen(line), &q, &n, err) == 0 && n == 1);
    if (n != 1) return -1;
    choice_tokens t;
    int rc = choice_tokens_build(tk, &q[0], "--ppl-choices", "mc.jsonl", &t, err);
    if (rc == 0) {
        CHECK(t.n_prefix == np && memcmp(t.prefix, prefix, (size_t)np * 4) == 0);
        CHECK(t.n_opt[0] == n0 && memcmp(t.opt[0], o0, (size_t)n0 * 4) == 0);
        CHECK(t.n_opt[1] == n1 && memcmp(t.opt[1], o1, (size_t)n1 * 4) == 0);
    }
    choice_tokens_free(&t, q[0].n_options);
    choices_free(q, n);
    return rc;
}

static void test_tokens(void) {
    bmoe_tokenizer tk;
    bmoe_error err;
    /* byte-level: the context's bytes (BOS first), each option's bytes */
    make_tok(&tk, 1, 0);
    CHECK(choice_is(&tk, "{\"id\":1,\"context\":\"xa\",\"options\":[\"b\",\"cd\"],\"answer\":0}",
                    (const int32_t[]){ 256, 'x', 'a' }, 3, (const int32_t[]){ 'b' }, 1, (const int32_t[]){ 'c', 'd' }, 2,
                    &err) == 0);
    tok_free(&tk);
    /* "a" + "b" merge: the context's last token is scored with the options (tokenized as context + option) */
    make_tok(&tk, 1, 1);
    CHECK(choice_is(&tk, "{\"id\":1,\"context\":\"xa\",\"options\":[\"b\",\"cd\"],\"answer\":0}",
                    (const int32_t[]){ 256, 'x' }, 2, (const int32_t[]){ 257 }, 1, (const int32_t[]){ 'a', 'c', 'd' }, 3,
                    &err) == 0);
    tok_free(&tk);
    /* no BOS and the merge takes the context's only token: nothing predicts the option */
    make_tok(&tk, 0, 1);
    CHECK(choice_is(&tk, "{\"id\":1,\"context\":\"a\",\"options\":[\"b\",\"c\"],\"answer\":0}", NULL, 0, NULL, 0,
                    NULL, 0, &err) == 2 &&
          strstr(err.msg, "line 1: an option changes the context's first token"));
    CHECK(choice_is(&tk, "{\"id\":1,\"context\":\"\",\"options\":[\"b\",\"c\"],\"answer\":0}", NULL, 0, NULL, 0,
                    NULL, 0, &err) == 2 &&
          strstr(err.msg, "the context is empty"));
    CHECK(choice_is(&tk, "{\"id\":1,\"context\":\"a\",\"options\":[\"b\",\"Z\"],\"answer\":0}", NULL, 0,
                    NULL, 0, NULL, 0, &err) == 2);
    tok_free(&tk);

    /* a session prompt is tokenized as -p: specials parsed, BOS as the model asks */
    make_tok(&tk, 1, 1);
    session_prompt sp = { .text = (uint8_t *)"<s>ab", .len = 5, .line = 4 };
    int32_t *ids = NULL;
    int n = 0;
    CHECK(session_tokens(&tk, &sp, "--session", "s.txt", &ids, &n, &err) == 0);
    CHECK(n == 3 && ids[0] == 256 && ids[1] == 256 && ids[2] == 257);
    free(ids);
    sp.text = (uint8_t *)"aZ";
    sp.len = 2;
    CHECK(session_tokens(&tk, &sp, "--session", "s.txt", &ids, &n, &err) == 2 && ids == NULL &&
          strstr(err.msg, "--session: s.txt: line 4: byte 0x5a has no token"));
    tok_free(&tk);
}

int main(void) {
    test_row();
    test_text_files();
    test_ref();
    test_choices();
    test_session();
    test_tokens();
    return check_report("test_scoring");
}
