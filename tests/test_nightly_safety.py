"""The nightly's history is its own: `--keep` with a history row whose run id is `..` deleted the history's
parent directory; another application's SQLite file, or a damaged history, gave a traceback after the
whole gate suite had run. Now both are refused in one line, before anything runs or is removed."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bmoe_ci.nightly.history import History, HistoryError, run_record
from bmoe_ci.nightly.run import apply_retention
from bmoe_ci.reports import RunMeta
from gate_run import REPO, host_farm


def test_keep_never_follows_a_run_id_out_of_the_history(tmp_path: Path) -> None:
    parent = tmp_path / "project"
    history = parent / "nightly"
    history.mkdir(parents=True)
    (parent / "run.json").write_text("{}")  # what made the parent look like a run directory
    (parent / "precious.txt").write_text("keep me")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "run.json").write_text("{}")
    (history / "link").symlink_to(outside)
    with History(history) as hist:
        for day, rid in enumerate(("..", "../outside", "link", "20261201-000000-a", "20261202-000000-b"), 1):
            hist.record(run_record(RunMeta(run=rid, started=f"2026-12-0{day}T00:00:00"), [], pool="nightly"))
            if "/" not in rid and rid not in ("..", "link"):
                (history / rid).mkdir()
                (history / rid / "run.json").write_text("{}")
        removed = apply_retention(history, hist, keep=1)
    assert (parent / "precious.txt").read_text() == "keep me" and (outside / "run.json").is_file()
    assert [p.name for p in removed] == ["20261201-000000-a"]
    assert (history / "20261202-000000-b").is_dir()


def _foreign(path: Path) -> None:
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE photos (id INTEGER PRIMARY KEY, name TEXT)")
    conn.execute("INSERT INTO photos (name) VALUES ('cat.jpg')")
    conn.commit()
    conn.close()


def test_another_applications_database_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    _foreign(tmp_path / "history.sqlite")
    before = (tmp_path / "history.sqlite").read_bytes()
    with pytest.raises(HistoryError, match=r"not a bmoe-ci history .*tables photos"):
        History(tmp_path)
    assert (tmp_path / "history.sqlite").read_bytes() == before  # no table of ours written into it


def test_a_version_1_history_missing_a_column_it_had_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    with History(tmp_path) as hist:
        hist.record(run_record(RunMeta(run="r1", started="1"), [], pool="nightly"))
    conn = sqlite3.connect(tmp_path / "history.sqlite")
    conn.execute("ALTER TABLE runs DROP COLUMN faults")  # version 1 as bmoe-ci wrote it ...
    conn.execute("ALTER TABLE runs DROP COLUMN farm_sha256")  # ... but damaged: version 1 had this one
    conn.execute("PRAGMA user_version = 1")
    conn.commit()
    conn.close()
    before = (tmp_path / "history.sqlite").read_bytes()
    with pytest.raises(HistoryError, match=r"table runs lacks column\(s\) farm_sha256: .* schema version 1$"):
        History(tmp_path)
    assert (tmp_path / "history.sqlite").read_bytes() == before  # not migrated, nothing written


def test_a_damaged_history_is_refused(tmp_path: Path) -> None:
    with History(tmp_path) as hist:
        for i in range(200):
            hist.record(run_record(RunMeta(run=f"r{i:04d}", started=str(i)), [], pool="nightly"))
    data = bytearray((tmp_path / "history.sqlite").read_bytes())
    for i in range(4096, len(data), 997):  # pages scribbled on
        data[i] = data[i] ^ 0x5A
    (tmp_path / "history.sqlite").write_bytes(bytes(data))
    for extra in ("-wal", "-shm"):
        (tmp_path / f"history.sqlite{extra}").unlink(missing_ok=True)
    with pytest.raises(HistoryError) as err:
        History(tmp_path)
    assert "\n" not in str(err.value) and "history.sqlite" in str(err.value)


def test_the_nightly_refuses_a_foreign_history_before_any_gate_runs(tmp_path: Path) -> None:
    history = tmp_path / "h"
    history.mkdir()
    _foreign(history / "history.sqlite")
    farm = host_farm(tmp_path)
    farm.write_text(farm.read_text() + "pools:\n  nightly: [host]\n")
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "bmoe_ci.cli", "nightly", "--farm", str(farm), "--history", str(history)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "not a bmoe-ci history" in proc.stderr and "Traceback" not in proc.stderr
    assert time.monotonic() - started < 30 and sorted(p.name for p in history.iterdir()) == ["history.sqlite"]
