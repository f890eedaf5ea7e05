"""The run's plan: every test the run means to run, written before the first one starts.

``results/<run>/plan.json`` lists each planned test as (device, gate, fixture, name, classname), the
same identity a :class:`~bmoe_ci.reports.records.TestRecord` has. Per-device results are written as
each test finishes, so a run killed half way leaves finished tests on disk and the plan beside them:
:func:`reconcile` adds one ``error`` record, "run interrupted", for every planned test without a
record, and the counts of the merged JUnit and the summary add up to the plan.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

from pydantic import TypeAdapter

from bmoe_ci.reports.records import (
    DeviceRun,
    ReportError,
    TestRecord,
    read_json,
    strip_xdist_group,
    write_json,
)

PLAN_JSON = "plan.json"
PLAN_SCHEMA = "bmoe-ci.plan/1"
INTERRUPTED = "run interrupted: the test did not run to the end"


@dataclass(frozen=True)
class PlannedTest:
    device: str
    gate: str
    fixture: str | None
    name: str
    classname: str

    def key(self) -> tuple[str, str, str]:
        return (self.device, self.classname, strip_xdist_group(self.name))


_PLAN = TypeAdapter(list[PlannedTest])


def write_plan(results_dir: Path | str, run_id: str, tests: list[PlannedTest]) -> Path:
    """Write ``plan.json`` atomically (xdist workers each write the same plan: the last one stands)."""
    path = Path(results_dir) / PLAN_JSON
    write_json(path, {"schema": PLAN_SCHEMA, "run": run_id, "tests": [asdict(t) for t in tests]})
    return path


def read_plan(results_dir: Path | str) -> list[PlannedTest] | None:
    """The plan of a results directory, or None when it has none. Raises :class:`ReportError`."""
    path = Path(results_dir) / PLAN_JSON
    if not path.is_file():
        return None
    data = read_json(path)
    if not isinstance(data, dict) or data.get("schema") != PLAN_SCHEMA:
        raise ReportError(f"{path}: not a bmoe-ci plan (schema {PLAN_SCHEMA!r})")
    try:
        return _PLAN.validate_python(data.get("tests"))
    except ValueError as exc:
        raise ReportError(f"{path}: {str(exc).splitlines()[0]}") from None


def reconcile(runs: list[DeviceRun], plan: list[PlannedTest]) -> list[str]:
    """Add a "run interrupted" error to ``runs`` for each planned test without a record (a device
    with no results at all gets a DeviceRun of its own). Returns the devices that changed."""
    by_device = {r.device: r for r in runs}
    have = Counter((r.device, r.classname, r.name) for run in runs for r in run.records)
    changed: list[str] = []
    for t in plan:
        if have[t.key()] > 0:
            have[t.key()] -= 1
            continue
        run = by_device.get(t.device)
        if run is None:
            run = by_device[t.device] = DeviceRun(device=t.device, arch="")
            runs.append(run)
        run.records.append(
            TestRecord(
                device=t.device, gate=t.gate, fixture=t.fixture, name=t.name, classname=t.classname,
                outcome="error", message=INTERRUPTED, details=INTERRUPTED,
            )
        )
        if t.device not in changed:
            changed.append(t.device)
    return changed
