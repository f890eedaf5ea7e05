"""Reconciling a results directory with its plan (reports/plan.py): after a killed run `bmoe-ci report`
counts every planned test once, as what it recorded or as "run interrupted", reads damaged files as
far as they are valid, and never reads green."""

from __future__ import annotations

import json
from pathlib import Path

from bmoe_ci.reports import DeviceRun, RunMeta, TestRecord, exit_code, finalize, rebuild, write_device_junit
from bmoe_ci.reports.plan import (
    INTERRUPTED,
    NOT_PLANNED,
    PlannedTest,
    read_plan,
    reconcile,
    write_pending_plan,
    write_plan,
)
from bmoe_ci.reports.records import salvage_json_object

ODD = "G1[a@b\x01 ]@grp"  # an xdist group suffix, an '@' inside the brackets, a control character
LONG = "G1[" + "x" * 1500 + "]"  # cut in the middle in a junit.xml


def _planned(device: str, name: str, gate: str = "G1") -> PlannedTest:
    return PlannedTest(device=device, gate=gate, fixture="qwen3moe", name=name, classname="gates.test_streaming")


def _rec(device: str, name: str, outcome: str = "pass", gate: str = "G1") -> TestRecord:
    return TestRecord(
        device=device, gate=gate, fixture="qwen3moe", name=name, classname="gates.test_streaming", outcome=outcome
    )  # type: ignore[arg-type]


PLAN = [
    _planned("a", "G1[qwen3moe]"),
    _planned("a", "G2[qwen3moe]", "G2"),
    _planned("a", ODD),
    _planned("b", "G1[qwen3moe]"),
    _planned("b", "G2[qwen3moe]", "G2"),
    _planned("b", LONG),
]


def _killed(tmp_path: Path, records: dict[str, list[TestRecord]]) -> Path:
    """A directory as a killed session leaves it: plan, device files as far as they got, no run.json."""
    root = tmp_path / "run"
    write_plan(root, "run", PLAN)
    for device in ("a", "b"):
        write_device_junit(root, DeviceRun(device=device, arch="x86_64", records=records.get(device, [])))
    return root


def _planned_counts(data: dict) -> int:
    """The summary's tests without XDEV (derived) and infrastructure cases (one per dead device)."""
    xdev = sum(sum(d["gate_counts"].get("XDEV", {}).values()) for d in data["devices"].values())
    infra = sum(1 for d in data["devices"].values() if d["infra_error"])
    return data["totals"]["tests"] - xdev - infra


def test_every_planned_test_counts_once_and_odd_names_match(tmp_path: Path) -> None:
    root = _killed(tmp_path, {"a": [_rec("a", "G1[qwen3moe]"), _rec("a", ODD)]})
    data = rebuild(root)
    assert _planned_counts(data) == len(PLAN) and data["totals"]["passed"] == 2
    assert sum(1 for p in data["problems"] if p["message"] == INTERRUPTED) == 4
    assert data["status"] == "error" and data["interrupted"] and exit_code(data) == 1
    # a second report of the same directory counts the same
    assert rebuild(root)["totals"] == data["totals"]


def test_records_rebuilt_from_junit_alone_still_match_their_plan_entries(tmp_path: Path) -> None:
    root = _killed(tmp_path, {"a": [_rec("a", ODD, "fail")], "b": [_rec("b", LONG, "fail")]})
    for device in ("a", "b"):  # the junit.xml escapes the control character, cuts the long name
        (root / device / "device.json").unlink()
    data = rebuild(root)
    assert _planned_counts(data) == len(PLAN) and data["totals"]["failed"] == 2
    assert rebuild(root)["totals"] == data["totals"]


def test_a_test_recorded_twice_counts_once_as_its_worst(tmp_path: Path) -> None:
    twice = [
        _rec("a", "G1[qwen3moe]", "pass"),
        _rec("a", "G1[qwen3moe]", "error"),
        _rec("a", "G2[qwen3moe]", gate="G2"),
        _rec("a", ODD),
    ]
    root = _killed(tmp_path, {"a": twice, "b": [_rec("b", "G1[qwen3moe]"), _rec("b", "G2[qwen3moe]", gate="G2")]})
    assert rebuild(root)["interrupted"]  # b's LONG never ran
    data = rebuild(root)
    assert _planned_counts(data) == len(PLAN)
    assert data["devices"]["a"]["gate_counts"]["G1"] == {"pass": 1, "fail": 0, "error": 1, "skip": 0}


def test_a_run_that_recorded_everything_but_not_its_summary_is_not_green(tmp_path: Path) -> None:
    every = {d: [_rec(d, t.name, gate=t.gate) for t in PLAN if t.device == d] for d in ("a", "b")}
    root = _killed(tmp_path, every)
    data = rebuild(root)
    assert data["totals"]["failed"] == data["totals"]["errors"] == 0 and _planned_counts(data) == len(PLAN)
    assert data["interrupted"] and exit_code(data) == 1 and "INTERRUPTED" in (root / "summary.md").read_text()
    assert exit_code(rebuild(root)) == 1  # and stays so on every later report

    ended = tmp_path / "ended"  # the same results, written by a session that ended
    write_plan(ended, "ended", PLAN)
    finalize(
        ended,
        [DeviceRun(device=d, arch="x86_64", records=r) for d, r in every.items()],
        RunMeta(run="ended", finished="2026-01-01T00:00:00+0000"),
    )
    assert exit_code(rebuild(ended)) == 0


def test_killed_before_the_plan_was_written(tmp_path: Path) -> None:
    root = tmp_path / "run"
    write_pending_plan(root, "run")
    for device in ("a", "b"):
        write_device_junit(root, DeviceRun(device=device, arch="x86_64"))
    data = rebuild(root)
    assert data["interrupted"] == NOT_PLANNED and exit_code(data) == 1
    assert {d["infra_error"] for d in data["devices"].values()} == {NOT_PLANNED}


def test_half_files_are_read_as_far_as_they_are_valid(tmp_path: Path) -> None:
    records = {
        "a": [_rec("a", "G1[qwen3moe]"), _rec("a", "G2[qwen3moe]", gate="G2"), _rec("a", ODD)],
        "b": [_rec("b", "G1[qwen3moe]")],
    }
    root = _killed(tmp_path, records)
    # device a: both files cut in the middle of the third record / case (an older, non-atomic writer)
    for name, marker in (("device.json", '"name": "G1[a@b'), ("junit.xml", 'name="G1[a@b')):
        path = root / "a" / name
        text = path.read_text()
        path.write_text(text[: text.index(marker) + 5])
    # device b: device.json cut, junit.xml whole
    path = root / "b" / "device.json"
    path.write_text(path.read_text()[:40])
    data = rebuild(root)
    assert _planned_counts(data) == len(PLAN)
    assert data["devices"]["a"]["passed"] == 2 and data["devices"]["b"]["passed"] == 1
    assert sum(1 for p in data["problems"] if p["message"] == INTERRUPTED) == 3  # a's ODD, b's G2, LONG
    assert any("a/device.json" in n or "a/junit.xml" in n for n in data["notes"]), data["notes"]
    assert exit_code(data) == 1
    json.loads((root / "a" / "device.json").read_text())  # rewritten whole
    assert rebuild(root)["totals"] == data["totals"]


def test_salvage_json_object_keeps_whole_members_only() -> None:
    assert salvage_json_object('{"a": 1, "r": [{"x": 1}, {"y": 2}, {"z"') == {"a": 1, "r": [{"x": 1}, {"y": 2}]}
    assert salvage_json_object('{"a": "cut') == {}
    assert salvage_json_object("") == {}


def test_a_stopped_session_says_interrupted_in_its_own_summary(tmp_path: Path) -> None:
    """The session reconciles at its end too (-x, Ctrl-C): its summary and later reports agree."""
    root = tmp_path / "run"
    write_plan(root, "run", PLAN)
    runs = [
        DeviceRun(device="a", arch="x86_64", records=[_rec("a", "G1[qwen3moe]")]),
        DeviceRun(device="b", arch="x86_64"),
    ]
    reconcile(runs, read_plan(root))  # type: ignore[arg-type]
    data = finalize(root, runs, RunMeta(run="run", finished="2026-01-01T00:00:00+0000"))
    assert data["interrupted"] and exit_code(data) == 1 and _planned_counts(data) == len(PLAN)
    again = rebuild(root)
    assert again["interrupted"] == data["interrupted"] and again["totals"] == data["totals"]
