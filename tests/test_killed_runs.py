"""A controller killed (SIGKILL, with its xdist workers) at several moments of a real gate run on a
two-device local farm: each time `bmoe-ci report DIR` counts every planned test, as what it recorded
or as "run interrupted", its counts add up to the plan (plus XDEV, derived, and one `infrastructure`
case per device with nothing planned), and it exits non-zero: an interrupted run never reads green."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import junitparser
import pytest

from bmoe_ci.reports.journal import finished_tests
from gate_run import REPO, host_farm

MODULES = ("gates/test_determinism.py", "gates/test_config.py")
DEVICES = ("host", "host-b")
SEED = 22  # the mid-run kill's delay is random, and the same on every run of this test


def _farm(where: Path) -> Path:
    """Two local devices with their own work directories (so no kill point inherits another's lock)."""
    base = host_farm(where).read_text().split("devices:\n", 1)
    one = base[1]
    two = one.replace("name: host", "name: host-b").replace(str(where / "work"), str(where / "work-b"))
    farm = where / "farm2.yaml"
    farm.write_text(f"{base[0]}devices:\n{one}{two}")
    return farm


def _plan(results: Path) -> dict | None:
    """This run's plan (not the one an earlier session left, see _earlier_session)."""
    with contextlib.suppress(OSError, ValueError):
        plan = json.loads((results / "plan.json").read_text())
        return plan if plan.get("run") != "old" else None
    return None


def _recorded(results: Path) -> int:
    """The tests the devices finished: the whole lines of their journals, which get each test as it
    ends (device.json is rewritten only now and then, and at the end holds XDEV's derived verdicts)."""
    return sum(finished_tests(results / dev) for dev in DEVICES)


def _planned(results: Path) -> int | None:
    plan = _plan(results)
    return None if plan is None or plan.get("pending") else len(plan["tests"])


def _all_recorded(results: Path) -> bool:
    planned = _planned(results)
    return planned is not None and planned > 0 and _recorded(results) >= planned


def _after_plan_with_delay(delay_s: float) -> Callable[[Path], bool]:
    seen: list[float] = []

    def ready(results: Path) -> bool:
        if _planned(results) is None:
            return False
        if not seen:
            seen.append(time.monotonic())
        # never later than the last test: after it the point would be the summary's, not mid-run
        return time.monotonic() - seen[0] >= delay_s or _all_recorded(results)

    return ready


def _earlier_session(results: Path) -> None:
    """What an earlier, finished session left in the same directory: none of it is this run's (its
    plan has another test, its run.json says it finished, its summary is green)."""
    results.mkdir(parents=True)
    test = {"device": "host", "gate": "G1", "fixture": "qwen3moe", "name": "G1[old]", "classname": "gates.old"}
    (results / "plan.json").write_text(json.dumps({"schema": "bmoe-ci.plan/1", "run": "old", "tests": [test]}))
    (results / "run.json").write_text(
        json.dumps({"schema": "bmoe-ci.run/1", "run": "old", "finished": "2026-01-01T00:00:00+0000"})
    )
    (results / "summary.json").write_text(json.dumps({"schema": "bmoe-ci.summary/1", "status": "pass"}))


DELAY_S = round(random.Random(SEED).uniform(0.5, 3.0), 2)


def _pending(results: Path) -> bool:
    return (_plan(results) or {}).get("pending") is True


def _devices_ready(results: Path) -> bool:
    return all((results / dev / "device.json").is_file() for dev in DEVICES)


KILL_POINTS: dict[str, Callable[[Path], bool]] = {
    # collecting, building, pushing: the directory (used before) says a run started, no device has results
    # yet (the devices are readied once the tests are collected, so the plan comes with the devices)
    "while preparing": lambda r: _pending(r) and not any((r / dev).exists() for dev in DEVICES),
    "right after the plan": lambda r: _planned(r) is not None and _devices_ready(r),
    "after the first record": lambda r: _recorded(r) >= 1,
    f"mid-run, {DELAY_S} s after the plan": _after_plan_with_delay(DELAY_S),
    # every test recorded: the session is stopping its workers and writing the summary
    "after the last test": _all_recorded,
}


@pytest.mark.parametrize("point", list(KILL_POINTS))
def test_a_run_killed_at_any_point_reports_counts_that_equal_its_plan(tmp_path: Path, point: str) -> None:
    farm = _farm(tmp_path)
    results = tmp_path / "results"
    _earlier_session(results)
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        *MODULES,
        "-p",
        "no:cacheprovider",
        "-q",
        "-n",
        "2",
        "--bmoe-farm",
        str(farm),
        "--bmoe-device",
        "all",
        "--bmoe-results",
        str(results),
        "--bmoe-fixture",
        "qwen3moe",
    ]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    ready = KILL_POINTS[point]
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None and not ready(results):
            time.sleep(0.01)
        assert proc.poll() is None, f"the run ended before it could be killed ({point})"
        os.killpg(proc.pid, signal.SIGKILL)  # the controller and its xdist workers
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    recorded = _recorded(results)

    out = subprocess.run(
        [sys.executable, "-m", "bmoe_ci.cli", "report", str(results), "--format", "json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    if point == "while preparing":  # nothing to count yet: a bad directory, never a green one
        assert out.returncode == 2 and "no device results" in out.stderr, (out.returncode, out.stderr)
        return
    assert out.returncode == 1, (point, out.returncode, out.stderr[-2000:])
    summary = json.loads(out.stdout)
    assert summary["interrupted"] and summary["status"] == "error", point
    plan = json.loads((results / "plan.json").read_text())
    merged = junitparser.JUnitXml.fromfile(str(results / "junit.xml"))
    cases = [c for suite in merged for c in suite]
    assert len(cases) == summary["totals"]["tests"], point
    derived = [c for c in cases if c.classname.endswith(("reports.xdev", "bmoe_ci.infra"))]
    planned = [c for c in cases if c not in derived]
    assert len(planned) == len(plan["tests"]), (point, len(planned), len(plan["tests"]))
    assert sorted((c.classname, c.name) for c in planned) == sorted(
        (f"{t['device']}.{t['classname']}", t["name"]) for t in plan["tests"]
    ), point
    interrupted = [c for c in planned if c.result and "run interrupted" in (c.result[0].message or "")]
    assert len(interrupted) == len(plan["tests"]) - recorded, point
    if plan.get("pending"):  # nothing planned: each device says the run never got to its tests
        assert {d["infra_error"] for d in summary["devices"].values()} == {summary["interrupted"]}
    # the report is stable: a second one counts the same
    again = subprocess.run(
        [sys.executable, "-m", "bmoe_ci.cli", "report", str(results), "--format", "json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert again.returncode == 1 and json.loads(again.stdout)["totals"] == summary["totals"], point
