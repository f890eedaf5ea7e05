"""Every gate can fail: each fault of the catalogue (engine/faults.toml) marked `tested` is built into the
engine (`pytest gates --fault NAME`, i.e. -DBMOE_FAULT_<NAME>=1) and the real gate suite runs on the host
device: it must be caught — a gate reports a *failure*, not an error — only by gates the catalogue
expects to catch it, and every other gate of the modules that run passes. The clean build passes them all.

The catalogue is the one table of faults and the gates that catch them: this file only decides which
gate modules to run for a fault (the modules holding its expected gates) and reads everything else
from there. `bmoe-ci mutants` runs the whole catalogue against the whole suite (docs/gates.md).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bmoe_ci.mutants import Fault, load_catalogue
from gate_run import REPO, run_gates

DETERMINISM = ("gates/test_determinism.py",)
CONFIG = ("gates/test_config.py",)
STREAMING = ("gates/test_streaming.py",)
LOSSY = ("gates/test_lossy.py",)
STREAMING_GATES = ("G1", "G2", "G5", "DET")
LOSSY_GATES = ("G8a", "G8a'", "G8b", "G8c", "G8d", "G8e", "G8w", "G8r")


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
    # qwen3moe: G8r applies; qwen3moe-nonorm: the fixture G8c's faults need (G8r skips it, with the reason)
    run = run_gates(tmp_path, modules=LOSSY, fixtures=("qwen3moe", "qwen3moe-nonorm"))
    assert run.returncode == 0, run.output[-3000:]
    for gate in LOSSY_GATES:
        assert run.gate("host", gate) == "pass", (gate, run.output[-3000:])
    counts = run.summary["devices"]["host"]["gate_counts"]
    assert counts["G8r"]["pass"] == 1 and counts["G8r"]["skip"] == 1, counts


GATE_MARK = re.compile(r"""@pytest\.mark\.gate\(["']([^"']+)["']""")


def gate_modules() -> dict[str, str]:
    """gate id -> the gates/ module that holds it (read from the modules' gate markers)."""
    out: dict[str, str] = {}
    for path in sorted((REPO / "gates").glob("test_*.py")):
        for gate in GATE_MARK.findall(path.read_text()):
            out.setdefault(gate, f"gates/{path.name}")
    return out


MODULES = gate_modules()
FAULTS = [f for f in load_catalogue().faults if f.tested]


def test_every_tested_fault_names_gates_of_the_suite() -> None:
    assert FAULTS, "no fault of the catalogue is marked tested"
    for fault in FAULTS:
        assert any(g in MODULES for g in fault.expected), (fault.name, fault.expected, sorted(MODULES))


@pytest.mark.parametrize("fault", FAULTS, ids=[f.name for f in FAULTS])
def test_fault_makes_its_gates_fail(tmp_path: Path, fault: Fault) -> None:
    modules = tuple(sorted({MODULES[g] for g in fault.expected if g in MODULES}))
    run = run_gates(tmp_path, faults=(fault.name,), modules=modules, fixtures=(fault.fixture,))
    assert run.returncode != 0
    verdicts = run.summary["devices"]["host"]["gates"]
    failed = sorted(g for g, v in verdicts.items() if v == "fail")
    # caught, by gates the catalogue expects (which of them fire can depend on the fixture), and by no other
    assert failed, (verdicts, run.output[-3000:])
    assert set(failed) <= set(fault.expected), (fault.expected, verdicts, run.output[-3000:])
    assert all(v in ("pass", "skip") for g, v in verdicts.items() if g not in fault.expected), verdicts
    assert run.summary["totals"]["errors"] == 0, "a wrong engine must be a failure, not an error"
    if fault.crash:
        # the memory model's teeth: a released / never-committed slot faults, it is not read stale
        assert "engine crashed (SIGSEGV)" in run.output or "engine crashed (SIGBUS)" in run.output, run.output[-3000:]
