"""The nightly history store: schema, round trip, concurrent writers, import, retention."""

from __future__ import annotations

import multiprocessing
import sqlite3
from pathlib import Path

import pytest

from bmoe_ci.cli import main
from bmoe_ci.nightly.history import (
    HISTORY_FILE,
    SCHEMA_VERSION,
    History,
    HistoryError,
    MutationScore,
    run_record,
)
from bmoe_ci.nightly.run import apply_retention
from bmoe_ci.reports import DeviceRun, RunMeta, TestRecord, finalize


def device_run(
    device: str,
    outcome: str = "pass",
    *,
    arch: str = "aarch64",
    infra: str | None = None,
    build: str = "b1",
    records: bool = True,
) -> DeviceRun:
    recs = (
        [
            TestRecord(
                device=device,
                gate=g,
                fixture="qwen3moe",
                name=f"{g}[qwen3moe]",
                classname="gates.t",
                outcome=outcome if g == "G1" else "pass",
                message="boom" if outcome == "fail" else "",
            )
            for g in ("G1", "G2")
        ]
        if records
        else []
    )
    return DeviceRun(
        device=device,
        arch=arch,
        os="android",
        kind="phone",
        target=f"{arch}-linux-musl",
        engine_build_id=build,
        engine_s=1.5,
        wall_s=2.5,
        outputs={"qwen3moe": "ab" * 32},
        infra_error=infra,
        records=recs,
    )


def meta(run: str, started: str) -> RunMeta:
    return RunMeta(
        run=run,
        started=started,
        finished=started,
        engine_builds={"aarch64-linux-musl": "b1"},
        compiled=["aarch64-linux-musl"],
    )


def test_schema_is_versioned_and_a_run_round_trips(tmp_path: Path) -> None:
    with History(tmp_path) as h:
        h.record(
            run_record(
                meta("r1", "2026-01-01T00:00:00"),
                [device_run("pixel8", "fail"), device_run("gone", infra="ssh: refused", records=False)],
                pool="nightly",
                pool_devices=["pixel8", "gone", "absent"],
                git_commit="abc",
                git_dirty=True,
                farm_sha256="f" * 64,
                mutation_scores=(MutationScore(device="pixel8", arch="aarch64", caught=9, total=10),),
            )
        )
        assert h.run_ids("nightly") == ["r1"] and h.run_ids("other") == []
        rows = {r.name: r for r in h.results(["r1"])}
        assert rows["G1[qwen3moe]"].outcome == "fail" and rows["G1[qwen3moe]"].message == "boom"
        assert rows["G1[qwen3moe]"].engine_build_id == "b1" and rows["G1[qwen3moe]"].arch == "aarch64"
        assert rows["infrastructure"].outcome == "error" and rows["infrastructure"].device == "gone"
        devices = {d.device: d for d in h.devices("r1")}
        assert devices["pixel8"].reached and not devices["gone"].reached and not devices["absent"].reached
        assert devices["gone"].infra_error == "ssh: refused"
        assert devices["pixel8"].facts["target"] == "aarch64-linux-musl"
        assert [(o.device, o.fixture, o.entry) for o in h.outputs(["r1"])] == [
            ("gone", "qwen3moe", "greedy"),
            ("pixel8", "qwen3moe", "greedy"),
        ]
        (summary,) = h.run_summaries(["r1"])
        assert (summary.tests, summary.passed, summary.failed, summary.errors) == (3, 1, 1, 1)
        assert summary.mutation == (9, 10) and summary.engine_builds == {"aarch64-linux-musl": "b1"}
    conn = sqlite3.connect(tmp_path / HISTORY_FILE)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("SELECT git_commit, git_dirty FROM runs").fetchone() == ("abc", 1)


def test_recording_a_run_again_replaces_it(tmp_path: Path) -> None:
    with History(tmp_path) as h:
        for outcome in ("fail", "pass"):
            h.record(run_record(meta("r1", "2026-01-01"), [device_run("pixel8", outcome)], pool="p"))
        assert {r.outcome for r in h.results(["r1"])} == {"pass"}
        assert len(h.results(["r1"])) == 2


def test_run_order_and_before(tmp_path: Path) -> None:
    with History(tmp_path) as h:
        for i, started in enumerate(["2026-01-03", "2026-01-01", "2026-01-02"]):
            h.record(run_record(meta(f"r{i}", started), [device_run("a")], pool="p"))
        assert h.run_ids("p") == ["r1", "r2", "r0"]
        assert h.run_ids("p", before="r0") == ["r1", "r2"]
        assert h.run_ids("p", limit=2) == ["r2", "r0"]


def test_newer_schema_and_garbage_are_refused_with_one_line(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / HISTORY_FILE)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(HistoryError, match="newer than this bmoe-ci"):
        History(tmp_path)
    other = tmp_path / "x"
    other.mkdir()
    (other / HISTORY_FILE).write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(HistoryError, match=f"{HISTORY_FILE}: not a usable history database"):
        History(other)


def _writer(directory: str, prefix: str, n: int) -> None:
    with History(directory) as h:
        for i in range(n):
            devices = [device_run(f"d{j}", "fail" if (i + j) % 3 else "pass") for j in range(4)]
            h.record(run_record(meta(f"{prefix}{i:03d}", f"2026-01-01T00:00:{i:02d}"), devices, pool=prefix))


def test_two_concurrent_writers_do_not_corrupt_the_history(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), p, 25)) for p in ("a", "b")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0]
    conn = sqlite3.connect(tmp_path / HISTORY_FILE)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert conn.execute("SELECT pool, COUNT(*) FROM runs GROUP BY pool ORDER BY pool").fetchall() == [
        ("a", 25),
        ("b", 25),
    ]
    # Every run is whole: 4 devices x 2 tests, never half a transaction.
    counts = {n for (n,) in conn.execute("SELECT COUNT(*) FROM results GROUP BY run")}
    assert counts == {8}


def _results_dir(root: Path, name: str, outcome: str) -> Path:
    d = root / name
    finalize(
        d,
        [device_run("pixel8", outcome), device_run("ws", arch="x86_64")],
        RunMeta(run="gate-own-id", started=f"2026-01-0{name[-1]}T00:00:00+0000"),
    )
    return d


def test_history_import_records_results_directories(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    r1, r2 = _results_dir(tmp_path, "run1", "pass"), _results_dir(tmp_path, "run2", "fail")
    hist = tmp_path / "hist"
    assert main(["history", "import", "--history", str(hist), "--pool", "lab", str(r1), str(r2)]) == 0
    assert capsys.readouterr().out.splitlines() == [f"run1\t{r1}", f"run2\t{r2}"]
    with History(hist) as h:
        assert h.run_ids("lab") == ["run1", "run2"]  # known by directory name
        assert {r.outcome for r in h.results(["run2"]) if r.device == "pixel8" and r.gate == "G1"} == {"fail"}
    assert main(["history", "import", "--history", str(hist), str(tmp_path / "nope")]) == 2
    assert "nope: no such directory" in capsys.readouterr().err


def test_retention_removes_only_old_recorded_run_directories(tmp_path: Path) -> None:
    hist_dir = tmp_path / "hist"
    hist_dir.mkdir()
    for i in range(1, 5):
        _results_dir(hist_dir, f"run{i}", "pass")
    (hist_dir / "notes").mkdir()  # not a run: never touched
    (hist_dir / "run9").mkdir()  # a nightly still running (not recorded yet): never touched
    with History(hist_dir) as h:
        for i in range(1, 5):
            path = hist_dir / f"run{i}"
            h.record(run_record(meta(f"run{i}", f"2026-01-0{i}"), [device_run("a")], pool="p", results_dir=str(path)))
        removed = apply_retention(hist_dir, h, keep=2)
        assert sorted(p.name for p in removed) == ["run1", "run2"]
        assert sorted(p.name for p in hist_dir.iterdir() if p.is_dir()) == ["notes", "run3", "run4", "run9"]
        assert h.results_dir("run1") == "" and h.results_dir("run4").endswith("run4")
        assert len(h.results(["run1"])) == 2  # rows are kept
        assert apply_retention(hist_dir, h, keep=2) == []
