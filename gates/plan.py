"""What each gate needs the engine to run, per fixture: one plan, run once per device and fixture
through `bmoe batch` (one round trip), shared by every gate that reads it."""

from __future__ import annotations

from functools import cache

from bmoe_ci.reference import GATE_REQUEST

# The reference outputs REF compares against are computed for this prompt and length.
PROMPT = GATE_REQUEST.prompt
N_PREDICT = GATE_REQUEST.n_predict

# The resident reference: the configuration every identity gate compares against.
REFERENCE = ("--mmap", "-p", PROMPT, "-n", str(N_PREDICT), "--json")


# Streamed (no --mmap): the experts come from the file through the expert memory of DESIGN 3.4.
STREAMED = ("-p", PROMPT, "-n", str(N_PREDICT), "--json")
# A cache far below the fixtures' ~3 MiB of experts, so it evicts all the time (G2, G5, G8*).
EVICTING = ("--cache-mb", "2", "--force-cache")
PREFETCH = ("--prefetch", "1", "--prefetch-sync")

# The lossy knobs (gates/test_lossy.py). Inert settings must leave the bytes alone; full strength must
# fire without a signal. Dropping is armed in prefill too where the gate says so (DESIGN 5).
DROP = "--drop-cold-experts"
SUBST = "--expert-substitute"
INERT = "1e-6"
WARN_F = "0.75"  # G8w: the app's default rung; 37.5% against 9.4% at top-k 2
# G8w only reads the load-time warning: one generated token (no decode step) is enough.
WARN_ONLY = ("-p", PROMPT, "-n", "1", "--json")


def model_args(model: str, *args: str) -> list[str]:
    return ["run", "-m", model, *args]


@cache
def _spec_top_k(fixture: str) -> int | None:
    from bmoe_ci.fixtures.spec import load_specs

    spec = load_specs().specs.get(fixture)
    return spec.dims.top_k if spec is not None else None


def replay_top_k(fixture: str | None) -> int | None:
    """G8r's routing width: one more than the model's own top-k, so a threshold taken against the
    model's top-k (F/k) differs from the effective one (F/(k+1)). None when the fixture is unknown."""
    k = _spec_top_k(fixture) if fixture else None
    return k + 1 if k is not None else None


def fixture_plan(model: str, fixture: str | None = None, trace: str | None = None,
                 logits: str | None = None) -> list[tuple[str, list[str]]]:
    """(id, argv) entries for one fixture on one device. `trace`: the device path G8r's route trace is
    written to (the G8r entry is left out without it, or when the fixture's top-k is unknown).
    `logits`: the device path the resident reference run writes its logits to (for REF)."""
    logits_out = ("--logits-out", logits) if logits is not None else ()
    entries = [
        ("ref", model_args(model, *REFERENCE, "-t", "1", *logits_out)),
        ("again", model_args(model, *REFERENCE, "-t", "1")),
        ("threads2", model_args(model, *REFERENCE, "-t", "2")),
        # streaming (gates/test_streaming.py); stream-evict is also the lossy gates' cached reference
        ("stream", model_args(model, *STREAMED, "-t", "1")),
        ("stream-evict", model_args(model, *STREAMED, *EVICTING, "-t", "1")),
        ("stream-prefetch", model_args(model, *STREAMED, *EVICTING, *PREFETCH, "-t", "1")),
        ("stream-lanes4", model_args(model, *STREAMED, "--io-threads", "4", "-t", "1")),
        ("stream-evict-lanes4", model_args(model, *STREAMED, *EVICTING, "--io-threads", "4", "-t", "1")),
        # the lossy knobs (gates/test_lossy.py)
        ("drop-inert", model_args(model, *STREAMED, *EVICTING, DROP, INERT, "-t", "1")),  # G8a, G8a'
        ("drop-full", model_args(model, *STREAMED, *EVICTING, DROP, "1.0", "--drop-in-prefill", "-t", "1")),  # G8b
        ("k1-evict", model_args(model, *STREAMED, *EVICTING, "--n-expert-used", "1", "-t", "1")),  # G8c
        ("k1-drop", model_args(model, *STREAMED, *EVICTING, "--n-expert-used", "1", DROP, "1.0",
                               "--drop-in-prefill", "-t", "1")),  # G8c
        ("subst-inert", model_args(model, *STREAMED, *EVICTING, SUBST, INERT, "-t", "1")),  # G8d
        ("subst-full", model_args(model, *STREAMED, *EVICTING, SUBST, "1.0", "-t", "1")),  # G8e
        ("drop-warn", model_args(model, *WARN_ONLY, *EVICTING, DROP, WARN_F, "-t", "1")),  # G8w
        ("drop-warn-k4", model_args(model, *WARN_ONLY, *EVICTING, "--n-expert-used", "4", DROP, WARN_F,
                                    "-t", "1")),  # G8w
    ]
    k = replay_top_k(fixture)
    if trace is not None and k is not None:
        entries.append(
            ("drop-replay", model_args(model, *STREAMED, *EVICTING, DROP, "1.0", "--drop-in-prefill",
                                       "--drop-no-renorm", "--n-expert-used", str(k), "--route-trace", trace,
                                       "-t", "1"))  # G8r
        )
    return entries


def warn_single_argv(model: str) -> list[str]:
    """G8w's single-process run (its stderr must carry the warning exactly once): at top-k 4, where the
    warning is due on every fixture, wide's top-k 8 included."""
    return model_args(model, *WARN_ONLY, *EVICTING, "--n-expert-used", "4", DROP, WARN_F, "-t", "1")
