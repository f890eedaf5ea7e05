"""The run's plan: every test the run means to run, written before the first one starts.

``results/<run>/plan.json`` lists each planned test as (device, gate, fixture, name, classname), the
same identity a :class:`~bmoe_ci.reports.records.TestRecord` has. Per-device results are written as
each test finishes, so a run killed half way leaves finished tests on disk and the plan beside them:
:func:`reconcile` makes every planned test count exactly once, as what it recorded or as one
``error`` record, "run interrupted", and the counts of the merged JUnit and the summary add up to the
plan (plus XDEV, derived, and one ``infrastructure`` case per dead device).

Before its tests are collected the controller writes a *pending* plan (no tests yet): a run killed
then (building, pushing, starting xdist workers) is told apart from a directory of a version that
wrote no plan, and reads as interrupted rather than as devices that merely recorded nothing.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path

from pydantic import TypeAdapter

from bmoe_ci.reports.junit import xml_text
from bmoe_ci.reports.records import (
    DeviceRun,
    ReportError,
    TestRecord,
    read_json,
    strip_xdist_group,
    write_json,
)
from bmoe_ci.reports.xdev import XDEV_GATE

PLAN_JSON = "plan.json"
PLAN_SCHEMA = "bmoe-ci.plan/1"
INTERRUPTED = "run interrupted: the test did not run to the end"
NOT_PLANNED = "run interrupted before its tests were collected: no test ran"

# Which of several records of one planned test stands: the worst (a test recorded twice, e.g. by a
# worker and again by the controller's end-of-session sweep, counts once, and never as the better).
_SEVERITY = {"error": 0, "fail": 1, "pass": 2, "skip": 3}


def _as_in_junit(text: str) -> str:
    """*text* in the form a junit.xml keeps it: characters XML cannot carry escaped, and of a text
    over 1000 characters only its head and tail (the junit.xml cuts the middle out and says so; the
    same once more for a text read back from a junit.xml, so this is stable on its own output)."""
    text = xml_text(text, 10**9)
    return text if len(text) <= 1000 else text[:500] + text[-500:]


def plan_key(device: str, classname: str, name: str) -> tuple[str, str, str]:
    """A test's identity as both the plan and the records spell it, compared as a junit.xml keeps it,
    so records rebuilt from a device's junit.xml (its device.json lost) still match their plan
    entries."""
    return (device, _as_in_junit(classname), _as_in_junit(strip_xdist_group(name)))


@dataclass(frozen=True)
class PlannedTest:
    device: str
    gate: str
    fixture: str | None
    name: str
    classname: str

    def key(self) -> tuple[str, str, str]:
        return plan_key(self.device, self.classname, self.name)


@dataclass(frozen=True)
class Plan:
    """``tests`` is every planned test; ``pending`` a plan the run never got to write (killed before
    its tests were collected), which has no tests."""

    tests: list[PlannedTest]
    pending: bool = False


_PLAN = TypeAdapter(list[PlannedTest])


def write_plan(results_dir: Path | str, run_id: str, tests: list[PlannedTest]) -> Path:
    """Write ``plan.json`` atomically (xdist workers each write the same plan: the last one stands)."""
    path = Path(results_dir) / PLAN_JSON
    write_json(path, {"schema": PLAN_SCHEMA, "run": run_id, "tests": [asdict(t) for t in tests]})
    return path


def write_pending_plan(results_dir: Path | str, run_id: str) -> Path:
    """Mark the run as started but not yet planned (replaced by :func:`write_plan` after collection)."""
    path = Path(results_dir) / PLAN_JSON
    write_json(path, {"schema": PLAN_SCHEMA, "run": run_id, "pending": True, "tests": []})
    return path


def read_plan(results_dir: Path | str) -> Plan | None:
    """The plan of a results directory, or None when it has none. Raises :class:`ReportError`."""
    path = Path(results_dir) / PLAN_JSON
    if not path.is_file():
        return None
    data = read_json(path)
    if not isinstance(data, dict) or data.get("schema") != PLAN_SCHEMA:
        raise ReportError(f"{path}: not a bmoe-ci plan (schema {PLAN_SCHEMA!r})")
    try:
        tests = _PLAN.validate_python(data.get("tests"))
    except ValueError as exc:
        raise ReportError(f"{path}: {str(exc).splitlines()[0]}") from None
    return Plan(tests=tests, pending=data.get("pending") is True)


def reconcile(runs: list[DeviceRun], plan: Plan) -> list[str]:
    """Make ``runs`` account for ``plan``: each planned test without a record gets one "run
    interrupted" error (a device with no results at all gets a DeviceRun of its own); a planned test
    recorded more times than planned keeps its worst records only. Records the plan does not list
    (XDEV, derived; a device copied in from another runner) are left as they are. Under a pending
    plan every device without a record gets an infrastructure error saying the run never got to its
    tests. Returns the devices that changed."""
    changed: list[str] = []

    def touched(device: str) -> None:
        if device not in changed:
            changed.append(device)

    if plan.pending:
        for run in runs:
            if not run.records and run.infra_error is None:
                run.infra_error = NOT_PLANNED
                touched(run.device)
        return changed

    by_device = {r.device: r for r in runs}
    planned: dict[tuple[str, str, str], list[PlannedTest]] = defaultdict(list)
    for t in plan.tests:
        planned[t.key()].append(t)
    recorded: dict[tuple[str, str, str], list[TestRecord]] = defaultdict(list)
    for run in runs:
        for rec in run.records:
            if rec.gate != XDEV_GATE:
                recorded[plan_key(rec.device, rec.classname, rec.name)].append(rec)

    dropped: set[int] = set()
    for key, tests in planned.items():
        have = recorded.get(key, [])
        if len(have) > len(tests):
            keep = sorted(have, key=lambda r: _SEVERITY[r.outcome])[: len(tests)]
            dropped.update(id(r) for r in have if all(r is not k for k in keep))
            touched(key[0])
        for t in tests[len(have) :]:
            target = by_device.get(t.device)
            if target is None:
                target = by_device[t.device] = DeviceRun(device=t.device, arch="")
                runs.append(target)
            target.records.append(
                TestRecord(
                    device=t.device,
                    gate=t.gate,
                    fixture=t.fixture,
                    name=t.name,
                    classname=t.classname,
                    outcome="error",
                    message=INTERRUPTED,
                    details=INTERRUPTED,
                )
            )
            touched(t.device)
    if dropped:
        for run in runs:
            run.records = [r for r in run.records if id(r) not in dropped]
    return changed
