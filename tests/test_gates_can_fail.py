"""Each core gate fails on the engine fault it exists to catch, and passes on the clean build.

The faults are compiled in with `pytest gates --fault NAME` (-DBMOE_FAULT_<NAME>=1): the gate suite
must report the gate as a *failure* (not an error: the device is fine, the engine is wrong)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gate_run import run_gates

MODULES = {"DET": "gates/test_determinism.py", "CFG": "gates/test_config.py"}


def test_clean_build_passes_det_and_cfg(tmp_path: Path) -> None:
    run = run_gates(tmp_path, modules=tuple(MODULES.values()))
    assert run.returncode == 0, run.output[-3000:]
    assert run.gate("host", "DET") == "pass"
    assert run.gate("host", "CFG") == "pass"


@pytest.mark.parametrize(
    ("fault", "gate"),
    [
        ("THREAD_ORDER", "DET"),  # a row's value depends on the thread that computed it
        ("BATCH_STATE", "DET"),  # an engine instance inherits state from the previous one
        ("CFG_LOOSE_RANGE", "CFG"),  # validate() forgets the upper bound of F and L
    ],
)
def test_fault_makes_gate_fail(tmp_path: Path, fault: str, gate: str) -> None:
    run = run_gates(tmp_path, faults=(fault,), modules=(MODULES[gate],))
    assert run.returncode != 0
    assert run.gate("host", gate) == "fail", run.output[-3000:]
    assert run.summary["totals"]["errors"] == 0, "a wrong engine must be a failure, not an error"
