"""The engine's configuration-validation table, as data.

Each case is ``(name, argv, verdict, message)``: ``argv`` is what follows ``bmoe check``; ``verdict``
is ``"ok"`` or ``"error"``; ``message`` is the exact one-line message after ``error: `` (``None`` for
``ok``). The contract of ``bmoe check`` (docs/design.md, engine: command line): stdout is exactly ``ok`` with exit 0, or
``error: <message>`` with exit 2. ``validate()`` is pure and needs no model, so every device must
give the same verdict and message for every case: the project's own tests run the table against the
host build (tests/test_check_table.py) and the gate suite runs it on every device (gate CFG).

The C unit test engine/tests/test_config.c carries the same cases; keep the two in step. The rules,
their order and the number grammar are documented in docs/engine-flags.md.
"""

from __future__ import annotations

from typing import NamedTuple

OK = "ok"
ERROR = "error"


class Case(NamedTuple):
    name: str
    argv: tuple[str, ...]
    verdict: str
    message: str | None


def expected_stdout(case: Case) -> str:
    return "ok\n" if case.verdict == OK else f"error: {case.message}\n"


def expected_exit(case: Case) -> int:
    return 0 if case.verdict == OK else 2


# A cache that validate() accepts, for cases about something else.
C = ("--cache-mb", "2000")
# The gates' evicting cache.
TINY = ("--cache-mb", "2", "--force-cache")
BAND = "MiB is in the band 1..1499 MiB where a cache thrashes; pass --force-cache to use it anyway"
DROP = "--drop-cold-experts"
SUBST = "--expert-substitute"
CHAT_NEEDS_P = "--chat: needs a text prompt (-p); it cannot wrap --prompt-tokens or an input file"


def _ok(name: str, *argv: str) -> Case:
    return Case(name, tuple(argv), OK, None)


def _err(name: str, message: str, *argv: str) -> Case:
    return Case(name, tuple(argv), ERROR, message)


def _real_cases(flag: str, tag: str) -> list[Case]:
    """The number grammar, on a flag taking a real in [0, 1] (with a cache, so only the number decides)."""
    return [
        _ok(f"{tag}-zero", flag, "0", *C),
        _ok(f"{tag}-one", flag, "1", *C),
        _ok(f"{tag}-neg-zero", flag, "-0", *C),
        _ok(f"{tag}-neg-zero-point", flag, "-0.0", *C),
        _ok(f"{tag}-plus-one", flag, "+1", *C),
        _ok(f"{tag}-leading-dot", flag, ".5", *C),
        _ok(f"{tag}-exp", flag, "75e-2", *C),
        _ok(f"{tag}-exp-upper-plus", flag, "1E+0", *C),
        _ok(f"{tag}-inert", flag, "1e-6", *C),
        _ok(f"{tag}-dbl-min", flag, "2.2250738585072014e-308", *C),
        _ok(f"{tag}-zero-huge-exp", flag, "0e999999", *C),
        _ok(f"{tag}-equals", f"{flag}=0.75", *C),
        _err(f"{tag}-trailing-dot", f"{flag}: 5 is outside [0, 1]", flag, "5.", *C),
        _err(f"{tag}-just-above-one", f"{flag}: 1.0000001 is outside [0, 1]", flag, "1.0000001", *C),
        _err(f"{tag}-above-one", f"{flag}: 1.5 is outside [0, 1]", flag, "1.5", *C),
        _err(f"{tag}-negative", f"{flag}: -0.5 is outside [0, 1]", flag, "-0.5", *C),
        _err(f"{tag}-nan", f"{flag}: NaN is not accepted", flag, "nan", *C),
        _err(f"{tag}-nan-upper-signed", f"{flag}: NaN is not accepted", flag, "-NaN", *C),
        _err(f"{tag}-inf", f"{flag}: 'inf' is out of range (infinite)", flag, "inf", *C),
        _err(f"{tag}-infinity", f"{flag}: '-Infinity' is out of range (infinite)", flag, "-Infinity", *C),
        _err(f"{tag}-underflow", f"{flag}: '1e-400' underflows", flag, "1e-400", *C),
        _err(f"{tag}-subnormal", f"{flag}: '1e-310' underflows", flag, "1e-310", *C),
        _err(f"{tag}-overflow", f"{flag}: '1e400' overflows", flag, "1e400", *C),
        _err(
            f"{tag}-overflow-huge-exp",
            f"{flag}: '1e99999999999999999999' overflows",
            flag,
            "1e99999999999999999999",
            *C,
        ),
        _err(f"{tag}-hex", f"{flag}: '0x1p-3': hexadecimal is not accepted", flag, "0x1p-3", *C),
        _err(f"{tag}-empty", f"{flag}: empty value, expected a number", f"{flag}=", *C),
        _err(f"{tag}-empty-arg", f"{flag}: empty value, expected a number", flag, "", *C),
        _err(f"{tag}-trailing-garbage", f"{flag}: '0.5x' is not a number (unexpected 'x')", flag, "0.5x", *C),
        _err(f"{tag}-dangling-exp", f"{flag}: '1e' is not a number (unexpected 'e')", flag, "1e", *C),
        _err(f"{tag}-comma", f"{flag}: '0,5' is not a number (unexpected ',5')", flag, "0,5", *C),
        _err(f"{tag}-lone-dot", f"{flag}: '.' is not a number", flag, ".", *C),
        _err(f"{tag}-leading-space", f"{flag}: ' 0.5' is not a number", flag, " 0.5", *C),
        _err(f"{tag}-missing", f"{flag}: missing value", flag),
    ]


def _int_cases(flag: str, tag: str, lo: int, hi: int, *extra: str) -> list[Case]:
    """Edges of an integer option (``extra`` makes the rest of the config valid)."""
    return [
        _ok(f"{tag}-lo", flag, str(lo), *extra),
        _ok(f"{tag}-hi", flag, str(hi), *extra),
        _err(f"{tag}-below", f"{flag}: {lo - 1} is outside {lo}..{hi}", flag, str(lo - 1), *extra),
        _err(f"{tag}-above", f"{flag}: {hi + 1} is outside {lo}..{hi}", flag, str(hi + 1), *extra),
        _err(f"{tag}-beyond-int", f"{flag}: 99999999999 is outside {lo}..{hi}", flag, "99999999999", *extra),
        _err(
            f"{tag}-beyond-int64",
            f"{flag}: 99999999999999999999999 is outside {lo}..{hi}",
            flag,
            "99999999999999999999999",
            *extra,
        ),
        _err(f"{tag}-real", f"{flag}: '1.0' is not an integer", flag, "1.0", *extra),
        _err(f"{tag}-exp", f"{flag}: '1e3' is not an integer", flag, "1e3", *extra),
        _err(f"{tag}-hex", f"{flag}: '0x10' is not an integer", flag, "0x10", *extra),
        _err(f"{tag}-garbage", f"{flag}: '4k' is not an integer", flag, "4k", *extra),
        _err(f"{tag}-empty", f"{flag}: empty value, expected an integer", flag, "", *extra),
        _err(f"{tag}-missing", f"{flag}: missing value", flag),
    ]


CASES: list[Case] = [
    # --- accepted configurations: defaults and what the gates and the app actually run ----------
    _ok("empty"),
    _ok("defaults-prompt", "-p", "hello"),
    _ok("model-not-read", "-m", "/nonexistent/model.gguf", "-p", "hi"),
    _ok(
        "long-names",
        "--model",
        "m.gguf",
        "--prompt",
        "hi",
        "--n-predict",
        "8",
        "--threads",
        "2",
        "--ctx",
        "64",
    ),
    _ok("equals-form", "--model=m.gguf", "--n-predict=8", "--cache-mb=2000", "--io-threads=4"),
    _ok("prompt-tokens", "--prompt-tokens", "1,2,3"),
    _ok("prompt-tokens-plus", "--prompt-tokens", "+1,0,2147483647"),
    _ok("mmap", "--mmap", "-p", "hi"),
    _ok("mmap-io-odirect", "--mmap", "--io-threads", "2", "--no-odirect"),
    _ok("stream-cache-off", "--cache-mb", "0", "--no-odirect", "--io-threads", "8"),
    _ok("gate-G2-evicting", *TINY),
    _ok("gate-G5-prefetch", *TINY, "--prefetch", "2", "--prefetch-sync"),
    _ok("gate-G8a-inert-drop", *TINY, DROP, "1e-6"),
    _ok("gate-G8b-full-drop", *TINY, DROP, "1.0", "--drop-in-prefill"),
    _ok("gate-G8c-k1", *TINY, "--n-expert-used", "1", DROP, "1.0"),
    _ok("gate-G8d-inert-subst", *TINY, SUBST, "1e-6"),
    _ok("gate-G8e-full-subst", *TINY, SUBST, "1.0"),
    _ok("app-default-drop", "--cache-mb", "3000", DROP, "0.75"),
    _ok("drop-no-renorm", *C, DROP, "0.5", "--drop-no-renorm"),
    _ok("drop-and-subst", *C, DROP, "0.5", SUBST, "0.15", "--drop-in-prefill", "--drop-no-renorm"),
    _ok("force-cache-without-cache", "--force-cache"),
    _ok("outputs", "--route-trace", "trace.csv", "--logits-out", "logits.f32", "--json"),
    _ok("repeat-same-value", "-n", "5", "--n-predict", "5", "-n", "05"),
    _ok("repeat-same-real", *C, DROP, "0.5", f"{DROP}=.50"),
    _ok("repeat-bool", "--json", "--json"),
    _ok("repeat-same-tokens", "--prompt-tokens", "1,2", "--prompt-tokens", "1,+2"),
    _ok("prompt-looks-like-flag", "-p", "--json"),
    # --- usage: unknown, malformed, missing, conflicting -------------------------------------
    _err("unknown-long", "--bogus: unknown option", "--bogus"),
    _err("unknown-long-equals", "--bogus: unknown option", "--bogus=3"),
    _err("unknown-short", "-x: unknown option", "-x"),
    _err("unknown-prefix", "--cache: unknown option", "--cache", "2000"),
    _err(
        "short-equals",
        "-n=5: unknown option (a short option takes its value as the next argument: -n VALUE)",
        "-n=5",
    ),
    _err("positional", "unexpected argument 'foo' (options start with -)", "foo"),
    _err("lone-dash", "unexpected argument '-' (options start with -)", "-"),
    _err("bool-with-value", "--json: takes no value", "--json=1"),
    _err("bool-with-empty-value", "--mmap: takes no value", "--mmap="),
    _err("missing-model", "-m: missing value", "-m"),
    _err("missing-prompt", "--prompt: missing value", "--prompt"),
    _err("path-is-option", "--route-trace: missing value ('--json' is an option)", "--route-trace", "--json"),
    _err("model-is-option", "-m: missing value ('-p' is an option)", "-m", "-p", "hi"),
    _err(
        "prompt-then-tokens",
        "--prompt-tokens: cannot be combined with -p (give one prompt)",
        "-p",
        "hi",
        "--prompt-tokens",
        "1,2",
    ),
    _err(
        "tokens-then-prompt",
        "--prompt: cannot be combined with --prompt-tokens (give one prompt)",
        "--prompt-tokens",
        "1",
        "--prompt",
        "hi",
    ),
    _err("repeat-int", "-n: given twice with different values (5, then 6)", "-n", "5", "-n", "6"),
    _err(
        "repeat-int-alias",
        "--n-predict: given twice with different values (5, then 6)",
        "-n",
        "5",
        "--n-predict",
        "6",
    ),
    _err(
        "repeat-real",
        f"{DROP}: given twice with different values (0.5, then 0.25)",
        *C,
        DROP,
        "0.5",
        DROP,
        "0.25",
    ),
    _err(
        "repeat-model",
        "-m: given twice with different values ('a.gguf', then 'b.gguf')",
        "-m",
        "a.gguf",
        "-m",
        "b.gguf",
    ),
    _err(
        "repeat-tokens",
        "--prompt-tokens: given twice with different values",
        "--prompt-tokens",
        "1,2",
        "--prompt-tokens",
        "1,3",
    ),
    # --- -m, the prompt -------------------------------------------------------------------
    _err("model-empty", "-m: the model path is empty", "-m", ""),
    _err("prompt-empty", "-p: the prompt is empty", "-p", ""),
    _ok("chat", "-p", "hi", "--chat"),
    _err("chat-alone", CHAT_NEEDS_P, "--chat"),
    _err("chat-tokens", CHAT_NEEDS_P, "--prompt-tokens", "1", "--chat"),
    _err("prompt-tokens-empty", "--prompt-tokens: the prompt is empty", "--prompt-tokens", ""),
    _err("prompt-tokens-empty-item", "--prompt-tokens: item 1 is empty", "--prompt-tokens", "1,,2"),
    _err("prompt-tokens-trailing-comma", "--prompt-tokens: item 2 is empty", "--prompt-tokens", "1,2,"),
    _err("prompt-tokens-leading-comma", "--prompt-tokens: item 0 is empty", "--prompt-tokens", ",1"),
    _err("prompt-tokens-garbage", "--prompt-tokens: item 1: 'x' is not an integer", "--prompt-tokens", "1,x"),
    _err("prompt-tokens-space", "--prompt-tokens: item 1: ' 2' is not an integer", "--prompt-tokens", "1, 2"),
    _err("prompt-tokens-real", "--prompt-tokens: item 0: '1.0' is not an integer", "--prompt-tokens", "1.0"),
    _err(
        "prompt-tokens-beyond-int32",
        "--prompt-tokens: item 1: 2147483648 is outside 0..2147483647",
        "--prompt-tokens",
        "1,2147483648",
    ),
    _err(
        "prompt-tokens-negative",
        "--prompt-tokens: token id -1 at position 2 is negative",
        "--prompt-tokens",
        "0,1,-1",
    ),
    _ok("prompt-tokens-neg-zero", "--prompt-tokens", "-0"),
    _ok("prompt-tokens-max-count", "--prompt-tokens", ",".join(["1"] * 4096)),
    _err(
        "prompt-tokens-too-many",
        "--prompt-tokens: 4097 tokens, at most 4096 are accepted",
        "--prompt-tokens",
        ",".join(["1"] * 4097),
    ),
    # --- -n, -t, -c, --n-expert-used --------------------------------------------------------
    *_int_cases("-n", "n-predict", 0, 1048576),
    _ok("n-predict-plus", "-n", "+5"),
    _ok("n-predict-neg-zero", "-n", "-0"),
    *_int_cases("-t", "threads", 1, 256),
    *_int_cases("-c", "ctx", 0, 1048576),
    _ok("ctx-fits", "--prompt-tokens", "1,2,3", "-n", "13", "-c", "16"),
    _err(
        "ctx-overflow",
        "-c: 3 prompt tokens + 14 to predict (-n) do not fit a context of 16",
        "--prompt-tokens",
        "1,2,3",
        "-n",
        "14",
        "-c",
        "16",
    ),
    _ok("ctx-default-not-checked", "--prompt-tokens", "1,2,3", "-n", "1048576"),
    *_int_cases("--n-expert-used", "n-expert-used", 0, 256),
    # --- --mmap, --cache-mb, --force-cache ---------------------------------------------------
    _err("cache-negative", "--cache-mb: -1 is negative", "--cache-mb", "-1"),
    _ok("cache-off", "--cache-mb", "0"),
    _err("cache-band-lo", f"--cache-mb: 1 {BAND}", "--cache-mb", "1"),
    _err("cache-band-100", f"--cache-mb: 100 {BAND}", "--cache-mb", "100"),
    _err("cache-band-hi", f"--cache-mb: 1499 {BAND}", "--cache-mb", "1499"),
    _ok("cache-above-band", "--cache-mb", "1500"),
    _ok("cache-band-forced", "--cache-mb", "1", "--force-cache"),
    _ok("cache-band-forced-first", "--force-cache", "--cache-mb", "1499"),
    _ok("cache-max", "--cache-mb", "1048576"),
    _err("cache-above-max", "--cache-mb: 1048577 is outside 0..1048576", "--cache-mb", "1048577"),
    _err("cache-beyond-int", "--cache-mb: 99999999999 is outside 0..1048576", "--cache-mb", "99999999999"),
    _err("cache-not-integer", "--cache-mb: '2GB' is not an integer", "--cache-mb", "2GB"),
    _err(
        "mmap-with-cache",
        "--mmap: cannot be combined with --cache-mb 2000 (there is no expert cache in mmap mode)",
        "--mmap",
        *C,
    ),
    _err(
        "mmap-with-band-cache",
        "--mmap: cannot be combined with --cache-mb 2 (there is no expert cache in mmap mode)",
        "--mmap",
        *TINY,
    ),
    _ok("mmap-cache-zero", "--mmap", "--cache-mb", "0"),
    # --- --io-threads ----------------------------------------------------------------------
    *_int_cases("--io-threads", "io-threads", 1, 8),
    # --- --prefetch, --prefetch-sync --------------------------------------------------------
    *_int_cases("--prefetch", "prefetch", 0, 64, *C),
    _err("prefetch-no-cache", "--prefetch: needs the expert cache (--cache-mb > 0)", "--prefetch", "1"),
    _err(
        "prefetch-mmap",
        "--prefetch: not available with --mmap (nothing is streamed)",
        "--mmap",
        "--prefetch",
        "1",
    ),
    _ok("prefetch-zero-no-cache", "--prefetch", "0"),
    _err("prefetch-sync-alone", "--prefetch-sync: has no effect without --prefetch", "--prefetch-sync"),
    _err(
        "prefetch-sync-zero",
        "--prefetch-sync: has no effect without --prefetch",
        *C,
        "--prefetch",
        "0",
        "--prefetch-sync",
    ),
    # --- --drop-cold-experts and its modifiers ---------------------------------------------
    *_real_cases(DROP, "drop"),
    _err("drop-no-cache", f"{DROP}: needs the expert cache (--cache-mb > 0)", DROP, "0.5"),
    _err("drop-cache-zero", f"{DROP}: needs the expert cache (--cache-mb > 0)", DROP, "0.5", "--cache-mb", "0"),
    _err("drop-mmap", f"{DROP}: not available with --mmap (nothing is streamed)", "--mmap", DROP, "0.5"),
    _err("drop-zero-no-cache", f"{DROP}: needs the expert cache (--cache-mb > 0)", DROP, "0"),
    _err(
        "drop-in-prefill-alone",
        "--drop-in-prefill: has no effect without --drop-cold-experts",
        *C,
        "--drop-in-prefill",
    ),
    _err(
        "drop-no-renorm-alone",
        "--drop-no-renorm: has no effect without --drop-cold-experts",
        *C,
        "--drop-no-renorm",
    ),
    _err(
        "drop-modifiers-with-subst",
        "--drop-in-prefill: has no effect without --drop-cold-experts",
        *C,
        SUBST,
        "0.1",
        "--drop-in-prefill",
    ),
    # --- --expert-substitute ----------------------------------------------------------------
    *_real_cases(SUBST, "subst"),
    _err("subst-no-cache", f"{SUBST}: needs the expert cache (--cache-mb > 0)", SUBST, "0.15"),
    _err("subst-mmap", f"{SUBST}: not available with --mmap (nothing is streamed)", SUBST, "0.15", "--mmap"),
    # --- output files ----------------------------------------------------------------------
    _err("route-trace-empty", "--route-trace: the file name is empty", "--route-trace", ""),
    _err("logits-out-empty", "--logits-out: the file name is empty", "--logits-out="),
    _err(
        "outputs-same-file",
        "--logits-out: the same file as --route-trace",
        "--route-trace",
        "out.bin",
        "--logits-out",
        "out.bin",
    ),
    # --- the scoring instruments and sessions -------------------------------------------------
    _ok("ppl", "--ppl", "text.txt"),
    _ok("ppl-step-armed", "--ppl-step", "text.txt", *TINY, SUBST, "0.15", DROP, "0.75"),
    _ok("ppl-step-ref", "--ppl-step", "text.txt", "--ppl-ref", "ref.bin", "--json"),
    _ok("ppl-logits-out", "--ppl", "text.txt", "--mmap", "--logits-out", "ref.bin"),
    _ok("ppl-choices", "--ppl-choices", "mc.jsonl", *TINY, SUBST, "0.3"),
    _ok("session-n", "--session", "prompts.txt", "-n", "8", *TINY, DROP, "1"),
    _err("ppl-empty", "--ppl: the file name is empty", "--ppl", ""),
    _err("ppl-step-empty", "--ppl-step: the file name is empty", "--ppl-step="),
    _err("ppl-choices-empty", "--ppl-choices: the file name is empty", "--ppl-choices", ""),
    _err("session-empty", "--session: the file name is empty", "--session", ""),
    _err("ppl-ref-empty", "--ppl-ref: the file name is empty", "--ppl", "t.txt", "--ppl-ref", ""),
    _err("ppl-missing-value", "--ppl: missing value ('--json' is an option)", "--ppl", "--json"),
    _err(
        "ppl-two-modes",
        "--ppl-step: cannot be combined with --ppl (one input mode per run)",
        "--ppl-step",
        "a.txt",
        "--ppl",
        "b.txt",
    ),
    _err(
        "session-and-choices",
        "--session: cannot be combined with --ppl-choices (one input mode per run)",
        "--session",
        "a.txt",
        "--ppl-choices",
        "b.jsonl",
    ),
    _err(
        "ppl-with-prompt",
        "--ppl: cannot be combined with -p (the prompts come from the file)",
        "--ppl",
        "a.txt",
        "-p",
        "hi",
    ),
    _err(
        "session-with-prompt-tokens",
        "--session: cannot be combined with --prompt-tokens (the prompts come from the file)",
        "--session",
        "a.txt",
        "--prompt-tokens",
        "1,2",
    ),
    _err(
        "ppl-with-n", "--ppl-step: cannot be combined with -n (scoring generates nothing)", "--ppl-step", "a", "-n", "0"
    ),
    _err("ppl-ref-alone", "--ppl-ref: has no effect without --ppl or --ppl-step", "--ppl-ref", "r.bin"),
    _err("ppl-ref-choices", "--ppl-ref: not available with --ppl-choices", "--ppl-choices", "q", "--ppl-ref", "r"),
    _err(
        "logits-out-session",
        "--logits-out: not available with --session (it writes the rows of --ppl or --ppl-step)",
        "--session",
        "p.txt",
        "--logits-out",
        "l.bin",
    ),
    _err(
        "logits-out-over-ref",
        "--logits-out: the same file as --ppl-ref",
        "--ppl",
        "t",
        "--ppl-ref",
        "r",
        "--logits-out",
        "r",
    ),
    _err("logits-out-over-text", "--logits-out: the same file as --ppl", "--ppl", "t", "--logits-out", "t"),
    _err(
        "route-trace-over-text", "--route-trace: the same file as --ppl-step", "--ppl-step", "t", "--route-trace", "t"
    ),
    _err("order-outputs-before-scoring", "--logits-out: the file name is empty", "--ppl", "", "--logits-out", ""),
    _err("order-cache-before-scoring", f"{DROP}: needs the expert cache (--cache-mb > 0)", "--ppl", "", DROP, "1"),
    # --- order: the first failing rule in the documented order is the one reported ----------
    _err("order-threads-before-io", "-t: 0 is outside 1..256", "--io-threads", "9", "-t", "0"),
    _err("order-prompt-before-n", "-p: the prompt is empty", "-n", "-1", "-p", ""),
    _err("order-range-before-cache", f"{DROP}: 1.5 is outside [0, 1]", DROP, "1.5"),
    _err(
        "order-mmap-before-band",
        "--mmap: cannot be combined with --cache-mb 100 (there is no expert cache in mmap mode)",
        "--cache-mb",
        "100",
        "--mmap",
    ),
    _err("order-band-before-drop", f"--cache-mb: 100 {BAND}", DROP, "0.5", "--cache-mb", "100"),
    _err(
        "order-prefetch-before-drop",
        "--prefetch: needs the expert cache (--cache-mb > 0)",
        DROP,
        "0.5",
        "--prefetch",
        "1",
    ),
    _err(
        "order-drop-before-subst",
        f"{DROP}: needs the expert cache (--cache-mb > 0)",
        SUBST,
        "0.5",
        DROP,
        "0.5",
    ),
    _err(
        "order-modifier-before-subst",
        "--drop-no-renorm: has no effect without --drop-cold-experts",
        SUBST,
        "2",
        "--drop-no-renorm",
    ),
    _err("order-parse-before-validate", "-n: 'x' is not an integer", "-t", "0", "-n", "x"),
    _err("order-parse-left-to-right", "--bogus: unknown option", "--bogus", "-n", "x"),
]


# --- the same table for engine/tests/test_config.c ----------------------------------------------
# The C unit test carries these cases between the two marker lines below (it must build and run
# without Python). tests/test_check_table.py fails when the two differ; regenerate the block with
# `python -m bmoe_ci.check_table --c` and paste it in. Arguments longer than C_MAX_ARG are left to
# hand-written C checks (the prompt-token count cases).
C_BEGIN = "/* BEGIN check_table (generated by src/bmoe_ci/check_table.py --c; do not edit by hand) */"
C_END = "/* END check_table */"
C_MAX_ARG = 200


def _c_str(s: str | None) -> str:
    if s is None:
        return "NULL"
    out = []
    for b in s.encode("utf-8"):
        ch = chr(b)
        if ch in '"\\?':  # '?' too: -std=c11 reads "??x" as a trigraph
            out.append("\\" + ch)
        elif " " <= ch <= "~":
            out.append(ch)
        else:
            out.append(f"\\{b:03o}")  # octal: at most 3 digits, unlike \x
    return '"' + "".join(out) + '"'


def c_cases() -> list[Case]:
    return [c for c in CASES if all(len(a) <= C_MAX_ARG for a in c.argv)]


def c_table() -> str:
    lines = [C_BEGIN]
    for c in c_cases():
        argv = ", ".join(_c_str(a) for a in c.argv) or "NULL"
        lines.append(f"    {{{_c_str(c.name)}, {len(c.argv)}, {{{argv}}}, {_c_str(c.message)}}},")
    lines.append(C_END)
    return "\n".join(lines)


def _check_names_unique() -> None:
    seen: set[str] = set()
    for c in CASES:
        if c.name in seen:
            raise AssertionError(f"duplicate case name {c.name}")
        seen.add(c.name)


_check_names_unique()


if __name__ == "__main__":
    import sys

    if sys.argv[1:] == ["--c"]:
        print(c_table())
    else:
        for case in CASES:
            print(
                case.name,
                case.argv if len(" ".join(case.argv)) < 100 else "(long)",
                case.verdict,
                case.message,
            )
