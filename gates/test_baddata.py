"""BAD-DATA: on every device, corrupted copies of a fixture are refused, resident and streamed.

The copies (bmoe_ci.baddata: a NaN or infinite scale in the first block of a dense tensor, in the last
block of another, in one expert of the last MoE layer that layer 0 routes too, and the file cut inside
its last block) are made on the device from the pushed fixture in one round trip. Each copy runs
`bmoe run --mmap` and the default streamed run (cache off) on the gate prompt as a process of its own,
and each must end with exit 3, no signal, exactly one stderr line `bmoe: error: <file>: ...` naming the
tensor, the expert and the block as the case expects, and a JSON error of kind `model`. The copies are
removed afterwards.
"""

from __future__ import annotations

import shlex
from functools import cache
from pathlib import Path, PurePosixPath

import pytest

from bmoe_ci.baddata import Case, cases, routed_by_layer
from bmoe_ci.farm import Ending, InfraError
from bmoe_ci.gaterun.context import DeviceContext
from bmoe_ci.gaterun.engine import EngineResult
from bmoe_ci.gaterun.runner import DeviceRunner
from bmoe_ci.gaterun.state import GateState
from bmoe_ci.reference import GATE_REQUEST
from bmoe_ci.reference.forward import Model
from gates.plan import model_args

#: the fixtures whose copies are corrupted (quantised dense and expert tensors; the K-quant mix)
BASES = ("qwen3moe-q4k", "qwen3moe-types")
MODES = (("resident", ("--mmap",)), ("streamed", ()))
N_PREDICT = "4"


@cache
def _cases(model_path: str) -> tuple[Case, ...]:
    model = Model.load(model_path)
    prefill = model.generate(model.tokenize(GATE_REQUEST.prompt), 1)
    return tuple(cases(Path(model_path), routed_by_layer(prefill.routes)))


def _controller_copy(gate_state: GateState, device: DeviceContext, fixture: str) -> Path:
    ref = gate_state.run.references.get(fixture)
    if ref is None:
        raise InfraError(device.name, "setup", f"no reference output was prepared for fixture {fixture}")
    return Path(ref).parent / PurePosixPath(device.models[fixture]).name


def _verdict(case: Case, mode: str, r: EngineResult, path: str) -> str | None:
    """Why this run is not the refusal the case expects (None: it is)."""
    if r.crashed is not None:
        return f"{case.name} ({mode}): the engine crashed ({r.crashed})"
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    want = f"bmoe: error: {path}: "
    if r.exit_code != 3:
        return f"{case.name} ({mode}): exit {r.exit_code}, expected 3 ({'; '.join(lines[:2]) or 'no stderr'})"
    if len(lines) != 1 or not lines[0].startswith(want) or case.expect not in lines[0]:
        return f"{case.name} ({mode}): stderr {lines[:3]}, expected one line `{want}...{case.expect}...`"
    err = r.data.get("error") or {}
    if r.data.get("ok") is not False or err.get("kind") != "model" or case.expect not in str(err.get("message")):
        return f"{case.name} ({mode}): JSON result {r.data.get('ok')!r} {err}, expected a `model` error naming it"
    return None


@pytest.mark.gate("BAD-DATA")
def test_corrupted_copies_are_refused(
    runner: DeviceRunner, device: DeviceContext, fixture: str, gate_state: GateState, artifacts: Path
) -> None:
    if fixture not in BASES:
        pytest.skip(f"BAD-DATA corrupts {', '.join(BASES)} (quantised dense and expert tensors of every type)")
    case_id = fixture
    base = device.models[case_id]
    todo = _cases(str(_controller_copy(gate_state, device, case_id)))
    paths = {c.name: runner.session.file(c.file) for c in todo}
    script = " && ".join(c.script(base, paths[c.name]) for c in todo)
    made = runner.session.run(["sh", "-c", script], runner.session.entry_deadline)
    if made.outcome is Ending.INFRA or made.exit_code != 0:
        raise made.infra or InfraError(device.name, "setup", f"making the corrupted copies: {made.describe()}")
    wrong = []
    try:
        for c in todo:
            for mode, flags in MODES:
                argv = model_args(
                    paths[c.name], *flags, "-p", GATE_REQUEST.prompt, "-n", N_PREDICT, "--json", "-t", "1"
                )
                why = _verdict(c, mode, runner.single(argv), paths[c.name])
                if why is not None:
                    wrong.append(why)
    finally:
        runner.session.run(["sh", "-c", "rm -f " + " ".join(shlex.quote(p) for p in paths.values())], 60.0)
    if wrong:
        artifacts.mkdir(parents=True, exist_ok=True)
        (artifacts / "baddata.txt").write_text("\n".join(wrong) + "\n")
        raise AssertionError(
            f"{len(wrong)} of {2 * len(todo)} corrupted runs of {case_id} were not refused as expected: "
            + "; ".join(wrong[:4])
        )
