"""What each gate needs the engine to run, per fixture: one plan, run once per device and fixture
through `bmoe batch` (one round trip), shared by every gate that reads it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import cache

from bmoe_ci.paths import Places
from bmoe_ci.reference import GATE_REQUEST

# The reference outputs REF compares against are computed for this prompt and length.
PROMPT = GATE_REQUEST.prompt
N_PREDICT = GATE_REQUEST.n_predict

# The resident reference: the configuration every identity gate compares against.
REFERENCE = ("--mmap", "-p", PROMPT, "-n", str(N_PREDICT), "--json")


# Streamed (no --mmap): the experts come from the file through the expert memory (docs/design.md, expert memory).
STREAMED = ("-p", PROMPT, "-n", str(N_PREDICT), "--json")
# A cache far below the fixtures' ~3 MiB of experts, so it evicts all the time (G2, G5, G8*).
EVICTING = ("--cache-mb", "2", "--force-cache")
PREFETCH = ("--prefetch", "1", "--prefetch-sync")

# The lossy knobs (gates/test_lossy.py). Inert settings must leave the bytes alone; full strength must
# fire without a signal. Dropping is armed in prefill too where the gate says so (docs/gates.md).
DROP = "--drop-cold-experts"
SUBST = "--expert-substitute"
INERT = "1e-6"
WARN_F = "0.75"  # G8w: the app's default rung; 37.5% against 9.4% at top-k 2
# G8w only reads the load-time warning: one generated token (no decode step) is enough.
WARN_ONLY = ("-p", PROMPT, "-n", "1", "--json")


def model_args(model: str, *args: str) -> list[str]:
    return ["run", "-m", model, *args]


# Stress (REPLAY, INV): a decode long enough to cycle the evicting cache many times over (64 steps route
# 512-1024 experts through a cache that holds about 20), and a routing
# of every expert at once (top-k == the expert count) with two layers of prefetch against a 1 MiB cache
# (on `wide`, one layer's experts alone outweigh it: demand loads go over budget).
LONG_DECODE = ("-p", PROMPT, "-n", "64", "--json")
# every expert of a layer, every step, against a 1 MiB cache reads ~8x the default entry's experts:
# 8 tokens (7 decode steps, each with two prefetch rounds' worth of guesses) are enough to stress it
SHORT = ("-p", PROMPT, "-n", "8", "--json")
SMALL_CACHE = ("--cache-mb", "1", "--force-cache")
PREFETCH2 = ("--prefetch", "2", "--prefetch-sync")

# The quality instruments (gate SCORE, gates/test_scoring.py): the text pushed beside the fixtures
# (gates/data/score.txt, see bmoe_ci.gaterun.prepare), scored wide and step-wise.
SCORE_TEXT = "score.txt"
CHOICES = "choices.jsonl"  # --ppl-choices: each option against the reference's log-probabilities
# --session (gates/data/session.txt, pushed with the scoring inputs), through the evicting cache: DET-session
# (the first and the third prompt are the gate's own: each a new context, they generate what `ref` does),
# SCORE-session (every prompt against the reference's own generation) and INV (the prompts' counters)
SESSION_TEXT = "session.txt"
SESSION_REPEATS = (0, 2)
SESSION_ARGS = ("-n", str(N_PREDICT), "--json", "-t", "1")
SCORING_DIR = "scoring"  # the text's directory, beside the device's fixtures

# Plan entries that write a route trace (REPLAY replays each; INV and the direction checks read them).
# Every streamed entry but the warning's one-token runs and the scoring runs (REPLAY models generation:
# a prefill, then decode steps at growing positions; a scoring run's steps restart at position 0).
UNTRACED = frozenset({"drop-warn", "drop-warn-k4", "score-step", "score-step-subst", "score-wide-subst", "session"})


def traced_entry(entry: str, argv: Sequence[str]) -> bool:
    """An entry that writes a route trace (REPLAY replays each; `@pytest.mark.entries(where=...)`)."""
    return "--route-trace" in argv


def traced_drop(entry: str, argv: Sequence[str]) -> bool:
    """A traced entry that drops (G8b holds each to the dropping rule)."""
    return DROP in argv and "--route-trace" in argv


def scoring_file(model: str, name: str) -> str:
    """Device path of a scoring input pushed beside the fixtures: <fixtures dir>/scoring/<name>."""
    return f"{model.rsplit('/', 1)[0]}/{SCORING_DIR}/{name}" if "/" in model else f"{SCORING_DIR}/{name}"


TracePath = Callable[[str], str]


@cache
def _spec_dims(fixture: str, places: Places | None) -> tuple[int, int] | None:
    """(top-k, expert count) of a fixture from fixtures.yaml; None when it is not there."""
    from bmoe_ci.models.spec import load_specs

    spec = load_specs(places=places).specs.get(fixture)
    return (spec.dims.top_k, spec.dims.experts) if spec is not None else None


# Gate families a fixture may leave out (fixtures.yaml `skip_gates`, each with its reason): the gates of
# each (gate id, or (gate id, sub-gate)) and the plan entries only they read. The rest of the suite (G1,
# REF, DET but io-lanes and session, INV, XDEV, BATCH-STDERR, BAD-DATA) and the entries `ref`, `again`,
# `threads2`, `stream` and `score-wide` run on every fixture. A skipped gate says which family and why; an entry
# of a skipped family is not run (unless a family the fixture keeps reads it too: `stream-evict`).
FAMILY_GATES: dict[str, frozenset[str | tuple[str, str]]] = {
    "cache": frozenset({"G2", "G5", ("DET", "io-lanes")}),
    "lossy": frozenset({"G8a", "G8a'", "G8b", "G8c", "G8d", "G8e", "G8w", "REPLAY"}),
    "scoring": frozenset({"SCORE", ("DET", "session")}),
}
FAMILY_ENTRIES: dict[str, frozenset[str]] = {
    "cache": frozenset({"stream-evict", "stream-prefetch", "stream-lanes4", "stream-evict-lanes4"}),
    "lossy": frozenset(
        {
            "stream-evict",
            "stream-long",
            "drop-inert",
            "drop-full",
            "drop-norenorm",
            "k1-evict",
            "k1-drop",
            "subst-inert",
            "subst-full",
            "drop-warn",
            "drop-warn-k4",
            "drop-kplus1",
            "topk-all-prefetch2",
        }
    ),
    "scoring": frozenset({"session", "score-step", "score-step-subst", "score-wide-subst", "score-choices"}),
}


@cache
def skipped_families(fixture: str | None, places: Places | None = None) -> dict[str, str]:
    """The gate families a fixture leaves out (fixtures.yaml `skip_gates`): family -> why."""
    if not fixture:
        return {}
    from bmoe_ci.models.spec import load_specs

    spec = load_specs(places=places).specs.get(fixture)
    return dict(spec.skip_gates) if spec is not None else {}


def family_skip(fixture: str | None, gate: str, sub: str, places: Places | None = None) -> str | None:
    """The skip reason of gate (gate, sub) on a fixture that leaves out its family, else None."""
    for family, why in skipped_families(fixture, places).items():
        gates = FAMILY_GATES[family]
        if gate in gates or (gate, sub) in gates:
            return f"{fixture} leaves out the {family} gates (fixtures.yaml skip_gates): {why}"
    return None


def _kept(entry: str, skipped: Sequence[str]) -> bool:
    """Whether a plan entry is read by a gate of a family the fixture keeps (or by the core gates)."""
    families = [f for f, entries in FAMILY_ENTRIES.items() if entry in entries]
    return not families or any(f not in skipped for f in families)


def is_dense(fixture: str | None, places: Places | None = None) -> bool:
    """A fixture of a dense architecture (gemma3): no expert to stream, route, drop or substitute."""
    dims = _spec_dims(fixture, places) if fixture else None
    return dims is not None and dims[1] == 0


# What a dense model's plan keeps: the resident and determinism runs and the scoring runs without a
# routing knob (the knobs are refused at load on a dense model; the streamed runs are --mmap's bytes
# with every expert counter 0, so the streaming gates have nothing to compare: they skip).
DENSE_PLAN = frozenset({"ref", "again", "threads2", "score-wide", "score-step", "score-choices", "session"})


def fixture_plan(
    model: str,
    fixture: str | None = None,
    trace: TracePath | None = None,
    logits: str | None = None,
    places: Places | None = None,
) -> list[tuple[str, list[str]]]:
    """(id, argv) entries for one fixture on one device. `trace(entry id)`: the device path the entry's
    route trace is written to (no traces without it). `logits`: the device path the resident reference
    run writes its logits to (for REF). Entries that need the fixture's top-k and expert count are left
    out when the fixture is not in fixtures.yaml.

    One lossy flag per entry, or a flag together with a width override (`--n-expert-used`) that a
    single-flag entry covers on its own (k1-evict), so a failure points at one rule."""
    logits_out = ("--logits-out", logits) if logits is not None else ()
    text = scoring_file(model, SCORE_TEXT)
    entries = [
        ("ref", model_args(model, *REFERENCE, "-t", "1", *logits_out)),
        ("again", model_args(model, *REFERENCE, "-t", "1")),
        ("threads2", model_args(model, *REFERENCE, "-t", "2")),
        # every --session prompt a new context: the gate prompt again after another one (DET-session)
        # every --session prompt a new context, through the warm evicting cache (DET-session, SCORE-session,
        # INV per prompt)
        ("session", model_args(model, "--session", scoring_file(model, SESSION_TEXT), *EVICTING, *SESSION_ARGS)),
        # streaming (gates/test_streaming.py); stream-evict is also the lossy gates' cached reference
        ("stream", model_args(model, *STREAMED, "-t", "1")),
        ("stream-evict", model_args(model, *STREAMED, *EVICTING, "-t", "1")),
        ("stream-prefetch", model_args(model, *STREAMED, *EVICTING, *PREFETCH, "-t", "1")),
        ("stream-lanes4", model_args(model, *STREAMED, "--io-threads", "4", "-t", "1")),
        ("stream-evict-lanes4", model_args(model, *STREAMED, *EVICTING, "--io-threads", "4", "-t", "1")),
        ("stream-long", model_args(model, *LONG_DECODE, *EVICTING, "-t", "1")),  # REPLAY: 64 decode steps
        # the lossy knobs (gates/test_lossy.py)
        ("drop-inert", model_args(model, *STREAMED, *EVICTING, DROP, INERT, "-t", "1")),  # G8a, G8a'
        ("drop-full", model_args(model, *STREAMED, *EVICTING, DROP, "1.0", "--drop-in-prefill", "-t", "1")),  # G8b
        ("drop-norenorm", model_args(model, *STREAMED, *EVICTING, DROP, "1.0", "--drop-no-renorm", "-t", "1")),
        ("k1-evict", model_args(model, *STREAMED, *EVICTING, "--n-expert-used", "1", "-t", "1")),  # G8c
        (
            "k1-drop",
            model_args(
                model, *STREAMED, *EVICTING, "--n-expert-used", "1", DROP, "1.0", "--drop-in-prefill", "-t", "1"
            ),
        ),  # G8c
        ("subst-inert", model_args(model, *STREAMED, *EVICTING, SUBST, INERT, "-t", "1")),  # G8d
        ("subst-full", model_args(model, *STREAMED, *EVICTING, SUBST, "1.0", "-t", "1")),  # G8e
        ("drop-warn", model_args(model, *WARN_ONLY, *EVICTING, DROP, WARN_F, "-t", "1")),  # G8w
        (
            "drop-warn-k4",
            model_args(model, *WARN_ONLY, *EVICTING, "--n-expert-used", "4", DROP, WARN_F, "-t", "1"),
        ),  # G8w
        # the quality instruments (gates/test_scoring.py): wide vs step-wise, with and without a knob
        ("score-wide", score_wide_argv(model)),
        ("score-step", model_args(model, "--ppl-step", text, *EVICTING, "--json", "-t", "1")),
        ("score-step-subst", model_args(model, "--ppl-step", text, *EVICTING, SUBST, "1.0", "--json", "-t", "1")),
        ("score-wide-subst", model_args(model, "--ppl", text, *EVICTING, SUBST, "1.0", "--json", "-t", "1")),
        (
            "score-choices",
            model_args(model, "--mmap", "--ppl-choices", scoring_file(model, CHOICES), "--json", "-t", "1"),
        ),
    ]
    dims = _spec_dims(fixture, places) if fixture else None
    if dims is not None and dims[1] == 0:
        entries = [(i, a) for i, a in entries if i in DENSE_PLAN]
    elif dims is not None:
        k, n_expert = dims
        # the threshold at a width above the model's: F/(k+1), not F/k (REPLAY predicts each drop)
        entries.append(
            (
                "drop-kplus1",
                model_args(model, *STREAMED, *EVICTING, DROP, "1.0", "--n-expert-used", str(k + 1), "-t", "1"),
            )
        )
        entries.append(
            (
                "topk-all-prefetch2",
                model_args(model, *SHORT, *SMALL_CACHE, *PREFETCH2, "--n-expert-used", str(n_expert), "-t", "1"),
            )
        )
    skipped = list(skipped_families(fixture, places))
    if skipped:
        entries = [(i, a) for i, a in entries if _kept(i, skipped)]
    if trace is not None:
        entries = [
            (i, [*a, "--route-trace", trace(i)] if i not in UNTRACED and "--mmap" not in a else a) for i, a in entries
        ]
    return entries


def score_wide_argv(model: str) -> list[str]:
    """The `score-wide` entry's command (DET-kernels runs it again on the scalar kernels)."""
    return model_args(model, "--mmap", "--ppl", scoring_file(model, SCORE_TEXT), "--json", "-t", "1")


def warn_single_argv(model: str) -> list[str]:
    """G8w's single-process run (its stderr must carry the warning exactly once): at top-k 4, where the
    warning is due on every fixture, wide's top-k 8 included."""
    return model_args(model, *WARN_ONLY, *EVICTING, "--n-expert-used", "4", DROP, WARN_F, "-t", "1")
