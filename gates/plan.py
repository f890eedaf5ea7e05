"""What each gate needs the engine to run, per fixture: one plan, run once per device and fixture
through `bmoe batch` (one round trip), shared by every gate that reads it."""

from __future__ import annotations

PROMPT = "The quick brown fox"
N_PREDICT = 24

# The resident reference: the configuration every identity gate compares against.
REFERENCE = ("--mmap", "-p", PROMPT, "-n", str(N_PREDICT), "--json")


def model_args(model: str, *args: str) -> list[str]:
    return ["run", "-m", model, *args]


def fixture_plan(model: str) -> list[tuple[str, list[str]]]:
    """(id, argv) entries for one fixture on one device."""
    return [
        ("ref", model_args(model, *REFERENCE, "-t", "1")),
        ("again", model_args(model, *REFERENCE, "-t", "1")),
        ("threads2", model_args(model, *REFERENCE, "-t", "2")),
    ]
