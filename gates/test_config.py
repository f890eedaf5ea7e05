"""CFG: validate() gives the same verdict and message on every device as the table says.

validate() is pure (no model, no I/O), so any difference between devices is a porting bug: a libc
that parses numbers differently, a platform-dependent message. The whole table runs in one batch and
is one test per device; a failure lists every case that disagreed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bmoe_ci.check_table import CASES, Case
from bmoe_ci.gaterun.engine import EngineResult
from bmoe_ci.gaterun.runner import DeviceRunner

PLAN = [(case.name, ["check", *case.argv]) for case in CASES]


def disagreement(case: Case, result: EngineResult) -> str | None:
    if result.crashed is not None:
        return result.describe()
    got_ok = result.data.get("ok")
    message = (result.data.get("error") or {}).get("message")
    if case.verdict == "ok":
        return None if got_ok is True else f"expected ok, got error: {message}"
    if got_ok is not False:
        return f"expected error: {case.message}, got ok"
    return None if message == case.message else f"expected error: {case.message}, got error: {message}"


@pytest.mark.gate("CFG")
def test_validate_table(runner: DeviceRunner, artifacts: Path) -> None:
    results = runner.plan("check-table", PLAN)
    wrong = {c.name: d for c in CASES if (d := disagreement(c, results[c.name])) is not None}
    if wrong:
        artifacts.mkdir(parents=True, exist_ok=True)
        (artifacts / "cfg_disagreements.json").write_text(json.dumps(wrong, indent=1))
    assert not wrong, f"{len(wrong)} of {len(CASES)} cases disagree: " + "; ".join(
        f"{name}: {why}" for name, why in list(wrong.items())[:10]
    )
