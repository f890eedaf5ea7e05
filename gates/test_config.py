"""CFG: validate() gives the same verdict and message on every device as the table says.

validate() is pure (no model, no I/O), so any difference between devices is a porting bug: a libc
that parses numbers differently, a platform-dependent message. The whole table runs in one batch."""

from __future__ import annotations

import pytest

from bmoe_ci.check_table import CASES, Case
from bmoe_ci.plugin.context import DeviceContext
from bmoe_ci.plugin.runner import DeviceRunner

PLAN = [(case.name, ["check", *case.argv]) for case in CASES]


@pytest.mark.gate("CFG")
@pytest.mark.parametrize(("case_id", "case"), [(c.name, c) for c in CASES], ids=[c.name for c in CASES])
def test_validate_table(runner: DeviceRunner, device: DeviceContext, case_id: str, case: Case) -> None:
    result = runner.plan("check-table", PLAN)[case.name]
    assert result.crashed is None, result.describe()
    if case.verdict == "ok":
        assert result.data.get("ok") is True, f"expected ok, got {result.data.get('error')}"
    else:
        assert result.data.get("ok") is False, "expected a rejection, got ok"
        assert result.data.get("error", {}).get("message") == case.message
