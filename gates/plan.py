"""What each gate needs the engine to run, per fixture: one plan, run once per device and fixture
through `bmoe batch` (one round trip), shared by every gate that reads it."""

from __future__ import annotations

PROMPT = "The quick brown fox"
N_PREDICT = 24

# The resident reference: the configuration every identity gate compares against.
REFERENCE = ("--mmap", "-p", PROMPT, "-n", str(N_PREDICT), "--json")


# Streamed (no --mmap): the experts come from the file through the expert memory of DESIGN 3.4.
STREAMED = ("-p", PROMPT, "-n", str(N_PREDICT), "--json")
# A cache far below the fixtures' ~3 MiB of experts, so it evicts all the time (G2, G5).
EVICTING = ("--cache-mb", "2", "--force-cache")
PREFETCH = ("--prefetch", "1", "--prefetch-sync")


def model_args(model: str, *args: str) -> list[str]:
    return ["run", "-m", model, *args]


def fixture_plan(model: str) -> list[tuple[str, list[str]]]:
    """(id, argv) entries for one fixture on one device."""
    return [
        ("ref", model_args(model, *REFERENCE, "-t", "1")),
        ("again", model_args(model, *REFERENCE, "-t", "1")),
        ("threads2", model_args(model, *REFERENCE, "-t", "2")),
        # streaming (gates/test_streaming.py)
        ("stream", model_args(model, *STREAMED, "-t", "1")),
        ("stream-evict", model_args(model, *STREAMED, *EVICTING, "-t", "1")),
        ("stream-prefetch", model_args(model, *STREAMED, *EVICTING, *PREFETCH, "-t", "1")),
        ("stream-lanes4", model_args(model, *STREAMED, "--io-threads", "4", "-t", "1")),
        ("stream-evict-lanes4", model_args(model, *STREAMED, *EVICTING, "--io-threads", "4", "-t", "1")),
    ]
