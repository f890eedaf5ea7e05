"""The streaming gates can fail: each fault built into the engine (`pytest gates --fault NAME`, i.e.
-DBMOE_FAULT_<NAME>=1) makes the gate that exists to catch it report a *failure* (not an error, not a
pass), through the real gate suite on the host device; the clean build passes them all.

  WRONG_OFFSET      every expert slot is filled from its neighbour's offset       -> G1 fails
                    (G2 and G5 compare streamed runs that read the same wrong bytes: they pass,
                    which is exactly why G1 compares against the resident reference)
  EVICT_IN_USE      eviction ignores the in-use pin and takes the hottest entry:  -> G2 fails
                    the running layer's expert is released before its matmul, which then faults
                    (SIGSEGV on the released slot: the engine crashes instead of reading stale bytes)
  SKIP_LOAD_ON_HIT  a prefetched expert is marked resident but never read: its    -> G5 fails
                    first use is a "hit" that was not one, on a never-committed slot (a fault again)
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gate_run import run_gates

MODULE = ("gates/test_streaming.py",)
GATES = ("G1", "G2", "G5", "DET")


def test_clean_build_passes_the_streaming_gates(tmp_path: Path) -> None:
    run = run_gates(tmp_path, modules=MODULE, fixtures=("qwen3moe", "qwen3moe-split4"))
    assert run.returncode == 0, run.output[-3000:]
    for gate in GATES:
        assert run.gate("host", gate) == "pass", (gate, run.output[-3000:])


@pytest.mark.parametrize(
    ("fault", "fails", "passes", "crash"),
    [
        ("WRONG_OFFSET", "G1", ("G2", "G5", "DET"), False),
        ("EVICT_IN_USE", "G2", ("G1",), True),
        ("SKIP_LOAD_ON_HIT", "G5", ("G1", "G2"), True),
    ],
)
def test_fault_makes_its_gate_fail(tmp_path: Path, fault: str, fails: str, passes: tuple[str, ...],
                                   crash: bool) -> None:
    run = run_gates(tmp_path, faults=(fault,), modules=MODULE)
    assert run.returncode != 0
    assert run.gate("host", fails) == "fail", run.output[-3000:]
    for gate in passes:
        assert run.gate("host", gate) == "pass", (gate, run.output[-3000:])
    assert run.summary["totals"]["errors"] == 0, "a wrong engine must be a failure, not an error"
    if crash:
        # the memory model's teeth: a released / never-committed slot faults, it is not read stale
        assert "engine crashed (SIGSEGV)" in run.output or "engine crashed (SIGBUS)" in run.output, run.output[-3000:]
