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
#include "scoring.h"

/* A byte-level tokenizer by hand: byte b is token b, BOS 256, no token for 0xff. */
static void make_tok(bmoe_tokenizer *tk, int add_bos) {
    memset(tk, 0, sizeof *tk);
    tk->n_vocab = 257;
    for (int b = 0; b < 256; b++) tk->byte_token[b] = b == 0xff ? -1 : b;
    tk->bos = 256;
    tk->eos = -1;
    tk->add_bos = add_bos;
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
    make_tok(&tk, 1);
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

    p = write_tmp("ff.txt", "ab\xff", 3);
    CHECK(score_text_tokens("--ppl", p, &tk, &ids, &n, &err) == 2 && strstr(err.msg, "byte 0xff at offset 2"));
    CHECK(strcmp(err.kind, "config") == 0);
    unlink(p);

    p = write_tmp("one.txt", "x", 1);
    make_tok(&tk, 0);
    CHECK(score_text_tokens("--ppl", p, &tk, &ids, &n, &err) == 2 && strstr(err.msg, "at least 2"));
    unlink(p);

    CHECK(score_text_tokens("--ppl", "/nonexistent/t.txt", &tk, &ids, &n, &err) == 2 &&
          strstr(err.msg, "cannot open /nonexistent/t.txt") && strcmp(err.kind, "usage") == 0);
    CHECK(score_text_tokens("--ppl", "/tmp", &tk, &ids, &n, &err) == 2 && strstr(err.msg, "is a directory"));
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

int main(void) {
    test_row();
    test_text_files();
    test_ref();
    test_choices();
    test_session();
    return check_report("test_scoring");
}
