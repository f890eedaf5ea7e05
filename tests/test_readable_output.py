"""What a person reads, line by line: the small things that add up (issue of the team's morning read).

Errors said once and saying where a value came from (also under -q), the run id the nightly gives
its gate run, `farm down` counting what it stopped by kind, the watcher's marks kept out of the engine's
stderr, the history's fault nights and its per-test history, the trend's rate over what can pass.
Terminal output is pytest's own capture of a child `pytest gates` (no device is touched: each case is
refused before anything is built)."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from bmoe_ci.cli import main
from bmoe_ci.cli_farm import down_line
from bmoe_ci.farm.deadline import deadline_hit, strip_marks
from bmoe_ci.nightly.history import HISTORY_FILE, SCHEMA_VERSION, History, RunSummary, run_record
from bmoe_ci.nightly.testhistory import collect, strip_text
from bmoe_ci.nightly.trend import trend_figure
from bmoe_ci.reports import DeviceRun, RunMeta, TestRecord
from gate_run import REPO, host_farm


def _gates(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("BMOE_FARM", "BMOE_DEVICE", "BMOE_CI_RUN_ID")}
    base["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO / "src"), base.get("PYTHONPATH", "")) if p)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "gates", "-p", "no:cacheprovider", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**base, **(env or {})},
    )


def test_an_unknown_fixture_is_said_once_before_anything_is_built(tmp_path: Path) -> None:
    farm = host_farm(tmp_path)
    for verbosity in ("-q", "-v"):
        r = _gates(tmp_path, verbosity, "--bmoe-farm", str(farm), "--bmoe-fixture", "nope")
        out = r.stdout + r.stderr
        assert r.returncode == 4, out[-3000:]  # a usage error, as an unknown --bmoe-fault is
        assert out.count("unknown fixture 'nope'") == 1, out[-3000:]
        assert "--bmoe-fixture: " in out and "building" not in out and "Exit:" not in out, out[-3000:]


def test_under_q_an_error_says_where_the_value_came_from(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.yaml"
    r = _gates(tmp_path, "-q", env={"BMOE_FARM": str(missing)})
    out = r.stdout + r.stderr
    assert r.returncode == 4 and f"(farm {missing} from $BMOE_FARM)" in out, out[-3000:]
    ini = tmp_path / "pytest.ini"
    ini.write_text("[pytest]\nbmoe_farm = lab.yaml\nbmoe_device = pixel8\n")
    r = _gates(tmp_path, "-q", "-c", str(ini), "--rootdir", str(REPO))
    out = r.stdout + r.stderr
    assert r.returncode == 4, out[-3000:]
    assert f"farm {tmp_path / 'lab.yaml'} from ini bmoe_farm of {ini}" in out, out[-3000:]
    assert f"devices pixel8 from ini bmoe_device of {ini}" in out, out[-3000:]
    # and a device selection from the environment that selects nothing
    r = _gates(tmp_path, "-q", "--bmoe-farm", str(host_farm(tmp_path)), env={"BMOE_DEVICE": "pixel9"})
    out = r.stdout + r.stderr
    assert r.returncode == 4 and "unknown device 'pixel9'" in out and "from $BMOE_DEVICE" in out, out[-3000:]


def test_a_run_id_given_by_the_caller_must_be_a_directory_name(tmp_path: Path) -> None:
    r = _gates(tmp_path, "-q", "--bmoe-farm", str(host_farm(tmp_path)), env={"BMOE_CI_RUN_ID": "../escape"})
    out = r.stdout + r.stderr
    assert r.returncode == 4 and "$BMOE_CI_RUN_ID '../escape': not usable as a run id" in out, out[-3000:]


def test_nightly_device_selection_is_checked_first(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    farm = host_farm(tmp_path)
    history = tmp_path / "h"
    assert main(["nightly", "--farm", str(farm), "--history", str(history), "--device", "host", "--pool", "x"]) == 2
    assert "--device and --pool: give one" in capsys.readouterr().err
    assert main(["nightly", "--farm", str(farm), "--history", str(history), "--device", "pixel9"]) == 2
    err = capsys.readouterr().err
    assert "--device: " in err and "unknown device 'pixel9'" in err and "host" in err
    assert not history.exists()  # nothing ran, nothing recorded


def test_farm_down_counts_what_it_stopped_by_kind() -> None:
    assert down_line(["ssh-x86", "ssh-arm64", "adb-server", "adb-arm64"]) == (
        "stopped 2 sshd (ssh-x86, ssh-arm64), the adb server and the stand-in adbd (adb-arm64)"
    )
    assert down_line(["ssh-x86"]) == "stopped 1 sshd (ssh-x86)"
    assert down_line([]) == "stopped nothing: no process of the local farm was running"


def test_the_watchers_marks_never_reach_the_engines_stderr() -> None:
    # the engine's last write had no newline yet: the watcher's line is glued to it
    glued = "moe-warn: narrow routi__bmoe_ci_progress__ 812\nng (k=1)\n__bmoe_ci_progress__ 900\n"
    assert strip_marks(glued) == "moe-warn: narrow routing (k=1)\n"
    assert strip_marks("plain\n") == "plain\n"
    # the watcher's alive line (every 5 s without growth: a slow entry under emulation)
    assert strip_marks("moe-drop: 3/9__bmoe_ci_alive__ 5\n routed\n__bmoe_ci_alive__ 10\n") == "moe-drop: 3/9 routed\n"
    assert deadline_hit("partial__bmoe_ci_entry_deadline__ 8\n") and not deadline_hit("__bmoe_ci_progress__ 3\n")


# ------------------------------------------------------------------------------------------ history


def _run(rid: str, day: int, outcome: str, faults: list[str] | None = None) -> tuple[RunMeta, list[DeviceRun]]:
    rec = TestRecord(device="a", gate="DET", fixture="q", name="DET-threads[q]", classname="gates.t", outcome=outcome)  # type: ignore[arg-type]
    skip = TestRecord(device="a", gate="G1", fixture="q", name="G1[q]", classname="gates.t", outcome="skip")
    dev = DeviceRun(device="a", arch="x86_64", engine_build_id=f"b-{rid}", records=[rec, skip])
    return RunMeta(run=rid, started=f"2026-01-{day:02d}T02:00:00+00:00", faults=faults or []), [dev]


def test_fault_nights_are_recorded_and_a_tests_history_read_back(tmp_path: Path) -> None:
    with History(tmp_path) as h:
        for i, (outcome, faults) in enumerate([("pass", None), ("fail", ["THREAD_ORDER"]), ("pass", None)], 1):
            meta, devs = _run(f"r{i}", i, outcome, faults)
            h.record(run_record(meta, devs, pool="p"))
        summaries = {s.id: s for s in h.run_summaries(["r1", "r2", "r3"])}
        # the trend's rate is over what can pass: the skip is left out, a green night is 100 %
        assert summaries["r1"].rate == 1.0 and summaries["r2"].rate == 0.0
        assert summaries["r2"].faults == ("THREAD_ORDER",) and summaries["r1"].faults == ()
        (hist,) = collect(h, "p", "r3", [("a", "DET-threads[q]")], 30).values()
    assert [p.outcome for _, p in hist.series()] == ["pass", "fail", "pass"]
    assert hist.flips == 2 and hist.failing_since is None
    assert hist.last_pass is not None and hist.last_pass.run == "r1"  # before tonight: tonight's pass is no news
    assert hist.last_pass.engine_build_id == "b-r1" and hist.last_failure and hist.last_failure.run == "r2"
    d = hist.to_dict()
    assert strip_text(d["recent"]) == "✓✗✓" and d["history"] == "_history/DET-threads[q].html"
    # the chart marks it
    fig = trend_figure(list(summaries.values()))
    assert fig is not None
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert any("fault night" in t for t in labels), labels


def test_a_version_1_history_is_migrated_in_place(tmp_path: Path) -> None:
    with History(tmp_path) as h:
        meta, devs = _run("old", 1, "pass")
        h.record(run_record(meta, devs, pool="p"))
    db = sqlite3.connect(tmp_path / HISTORY_FILE)
    db.execute("ALTER TABLE runs DROP COLUMN faults")  # as bmoe-ci wrote it before schema 2
    db.execute("PRAGMA user_version = 1")
    db.commit()
    db.close()
    with History(tmp_path) as h:
        meta, devs = _run("new", 2, "fail", ["THREAD_ORDER"])
        h.record(run_record(meta, devs, pool="p"))
        got = {s.id: s.faults for s in h.run_summaries(["old", "new"])}
    assert got == {"old": (), "new": ("THREAD_ORDER",)}
    assert sqlite3.connect(tmp_path / HISTORY_FILE).execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def test_a_green_night_with_skips_reads_100_percent() -> None:
    run = RunSummary(
        id="r",
        pool="p",
        started=None,
        verdicts=True,
        engine_builds={},
        tests=211,
        passed=201,
        failed=0,
        errors=0,
        engine_s={},
        mutation=None,
    )
    assert run.rate == 1.0
