"""Every gate can fail: each fault built into the engine (`pytest gates --fault
NAME`, i.e. -DBMOE_FAULT_<NAME>=1) makes the gate that exists to catch it report a *failure* (not an
error, not a pass), through the real gate suite on the host device; the clean build passes them all.

Core (gates/test_determinism.py, gates/test_config.py):
  THREAD_ORDER      a row's value depends on the thread that computed it          -> DET fails
  BATCH_STATE       an engine instance inherits state from the previous one        -> DET fails
  CFG_LOOSE_RANGE   validate() forgets the upper bound of F and L                 -> CFG fails

Streaming (gates/test_streaming.py):
  WRONG_OFFSET      every expert slot is filled from its neighbour's offset       -> G1 fails
                    (G2 and G5 compare streamed runs that read the same wrong bytes: they pass,
                    which is exactly why G1 compares against the resident reference)
  EVICT_IN_USE      eviction ignores the in-use pin and takes the hottest entry:  -> G2 fails
                    the running layer's expert is released before its matmul, which then faults
                    (SIGSEGV on the released slot: the engine crashes instead of reading stale bytes)
  SKIP_LOAD_ON_HIT  a prefetched expert is marked resident but never read: its    -> G5 fails
                    first use is a "hit" that was not one, on a never-committed slot (a fault again)

Lossy knobs (gates/test_lossy.py):
  NO_REPOINT          a dropped slot keeps the id of the expert it declined to read: the matmul
                      touches that expert's released slot (SIGSEGV)                      -> G8b fails
  NO_PIN              the top-weighted expert is droppable: on qwen3moe-nonorm at top-k 1 the
                      only weight is a probability below F/k = 1, so the top goes (SIGSEGV)  -> G8c fails
  SKIP_DEFERRED_LOAD  the load deferred to the terminal node never happens, and the
                      EXPERTS backstop is skipped too: the matmul touches unloaded memory -> G8a fails
  MODEL_TOPK          the threshold is F / the model's top-k, not the effective one: at
                      --n-expert-used k+1 misses above F/(k+1) are dropped     -> REPLAY (and G8b) fail
  SUBST_INERT         substitution examines and never changes                           -> G8e fails
  SUBST_COUNT_REORDER the re-ranked set is written back in id order and compared slot by
                      slot, so re-orderings count (and are written) as substitutions      -> G8d fails
  WARN_HARDCODED      the warning's evidence side says 12.5% whatever F                  -> G8w fails
  SUBST_PREFER_MISS   substitution raises the misses instead of the resident experts: it
                      fires, toward experts that must be read                            -> G8e fails

Replay and counter invariants (gates/test_replay.py, gates/test_invariants.py): faults that change
no output byte, or change every configuration alike, so no identity gate can see them:
  LRU_NO_REFRESH      a hit is not made most recent (the cache evicts by insertion order) -> REPLAY fails
  FLASH_BYTES_TWICE   a demand read through the cache is counted twice in flash_bytes    -> INV fails
  PREFETCH_USED_TWICE a prefetched expert's first use is counted twice      -> INV (and G5) fail
  RENORM_INVERTED     after a drop the survivors are scaled by kept/orig, not orig/kept  -> INV fails
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gate_run import run_gates

DETERMINISM = ("gates/test_determinism.py",)
CONFIG = ("gates/test_config.py",)
STREAMING = ("gates/test_streaming.py",)
LOSSY = ("gates/test_lossy.py",)
MODEL = ("gates/test_replay.py", "gates/test_invariants.py")
STREAMING_GATES = ("G1", "G2", "G5", "DET")
LOSSY_GATES = ("G8a", "G8a'", "G8b", "G8c", "G8d", "G8e", "G8w")


def test_clean_build_passes_det_and_cfg(tmp_path: Path) -> None:
    run = run_gates(tmp_path, modules=DETERMINISM + CONFIG)
    assert run.returncode == 0, run.output[-3000:]
    assert run.gate("host", "DET") == "pass" and run.gate("host", "CFG") == "pass"


def test_clean_build_passes_the_streaming_gates(tmp_path: Path) -> None:
    run = run_gates(tmp_path, modules=STREAMING, fixtures=("qwen3moe", "qwen3moe-split4"))
    assert run.returncode == 0, run.output[-3000:]
    for gate in STREAMING_GATES:
        assert run.gate("host", gate) == "pass", (gate, run.output[-3000:])


def test_clean_build_passes_the_lossy_gates(tmp_path: Path) -> None:
    # qwen3moe-nonorm: the fixture G8c's faults need; REPLAY replays unnormalised routings too
    run = run_gates(tmp_path, modules=LOSSY + MODEL, fixtures=("qwen3moe", "qwen3moe-nonorm"))
    assert run.returncode == 0, run.output[-3000:]
    for gate in (*LOSSY_GATES, "REPLAY", "INV"):
        assert run.gate("host", gate) == "pass", (gate, run.output[-3000:])
    counts = run.summary["devices"]["host"]["gate_counts"]
    assert counts["REPLAY"]["pass"] == 2 and counts["INV"]["pass"] == 2, counts


FAULTS = [
    ("THREAD_ORDER", DETERMINISM, "qwen3moe", "DET", (), False),
    ("BATCH_STATE", DETERMINISM, "qwen3moe", "DET", (), False),
    ("CFG_LOOSE_RANGE", CONFIG, "qwen3moe", "CFG", (), False),
    ("WRONG_OFFSET", STREAMING, "qwen3moe", "G1", ("G2", "G5", "DET"), False),
    ("EVICT_IN_USE", STREAMING, "qwen3moe", "G2", ("G1",), True),
    ("SKIP_LOAD_ON_HIT", STREAMING, "qwen3moe", "G5", ("G1", "G2"), True),
    ("NO_REPOINT", LOSSY, "qwen3moe", "G8b", ("G8a", "G8a'", "G8c", "G8d", "G8e", "G8w"), True),
    ("NO_PIN", LOSSY, "qwen3moe-nonorm", "G8c", ("G8a", "G8a'", "G8d", "G8e", "G8w"), True),
    ("SKIP_DEFERRED_LOAD", LOSSY, "qwen3moe", "G8a", ("G8d", "G8e", "G8w"), True),
    ("MODEL_TOPK", LOSSY + MODEL, "qwen3moe", "REPLAY", ("G8a", "G8a'", "G8c", "G8d", "G8e", "G8w", "INV"), False),
    ("SUBST_INERT", LOSSY, "qwen3moe", "G8e", ("G8a", "G8a'", "G8b", "G8c", "G8d", "G8w"), False),
    # G8e's direction check sees it too: re-ordered slots flagged "substituted" hold misses
    ("SUBST_COUNT_REORDER", LOSSY, "qwen3moe", "G8d", ("G8a", "G8a'", "G8b", "G8c", "G8w"), False),
    ("WARN_HARDCODED", LOSSY, "qwen3moe", "G8w", ("G8a", "G8a'", "G8b", "G8c", "G8d", "G8e"), False),
    ("SUBST_PREFER_MISS", LOSSY + MODEL, "qwen3moe", "G8e", ("G8a", "G8a'", "G8b", "G8c", "G8w", "INV"), False),
    ("LRU_NO_REFRESH", STREAMING + MODEL, "qwen3moe", "REPLAY", ("G1", "G2", "G5", "DET", "INV"), False),
    ("FLASH_BYTES_TWICE", STREAMING + MODEL, "qwen3moe", "INV", ("G1", "G2", "G5", "DET"), False),
    # G5 too, where prefetch_used then exceeds prefetch_issued
    ("PREFETCH_USED_TWICE", STREAMING + MODEL, "qwen3moe", "INV", ("G1", "G2", "DET"), False),
    ("RENORM_INVERTED", LOSSY + MODEL, "qwen3moe", "INV", ("G8a", "G8a'", "G8b", "G8c", "G8d", "G8e", "G8w"),
     False),
]


@pytest.mark.parametrize(("fault", "modules", "fixture", "fails", "passes", "crash"), FAULTS,
                         ids=[f"{f[0]}-{f[3]}" for f in FAULTS])
def test_fault_makes_its_gate_fail(tmp_path: Path, fault: str, modules: tuple[str, ...], fixture: str, fails: str,
                                   passes: tuple[str, ...], crash: bool) -> None:
    run = run_gates(tmp_path, faults=(fault,), modules=modules, fixtures=(fixture,))
    assert run.returncode != 0
    assert run.gate("host", fails) == "fail", run.output[-3000:]
    for gate in passes:
        assert run.gate("host", gate) == "pass", (gate, run.output[-3000:])
    assert run.summary["totals"]["errors"] == 0, "a wrong engine must be a failure, not an error"
    if crash:
        # the memory model's teeth: a released / never-committed slot faults, it is not read stale
        assert "engine crashed (SIGSEGV)" in run.output or "engine crashed (SIGBUS)" in run.output, run.output[-3000:]
