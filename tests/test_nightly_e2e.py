"""`bmoe-ci nightly` end to end through the real gate suite, on local devices written into a temporary
farm (fixture qwen3moe to stay fast):

* three nights in a row (clean, an engine fault injected, clean) classify as nothing new, new failures,
  fixed, with exit codes 0, 1, 0, and nightly.json, report.md and report.html agree;
* a device that stops answering is `device missing` and `new error`, never a failure;
* two pools run as two nightly processes (shards: the last clean night and a second pool) merge into one
  report whose counts are the sums.
"""

from __future__ import annotations

import html
import json
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import pytest

from bmoe_ci.nightly.history import History
from gate_run import REPO, host_farm

FIXTURE = ("--fixture", "qwen3moe")


def nightly(history: Path, farm: Path, *args: str) -> tuple[int, dict[str, Any], Path, str]:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bmoe_ci.cli",
            "nightly",
            "--farm",
            str(farm),
            "--history",
            str(history),
            *FIXTURE,
            *args,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    lines = proc.stdout.strip().splitlines()
    assert lines, f"no report path printed (exit {proc.returncode}):\n{proc.stderr[-3000:]}"
    report = Path(lines[-1])
    assert report.name == "report.html" and report.is_file(), proc.stderr[-3000:]
    data = json.loads((report.parent / "nightly.json").read_text())
    return proc.returncode, data, report, proc.stderr


def keys(items: list[dict[str, Any]]) -> set[tuple[str, str]]:
    return {(i["device"], i["name"]) for i in items}


@pytest.fixture(scope="module")
def farm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two local devices: `host`, and `spare`, whose exec prefix stops answering once a kill file exists."""
    tmp = tmp_path_factory.mktemp("farm")
    wrapper = tmp / "spare.sh"
    wrapper.write_text(f'#!/bin/sh\n[ -e {tmp}/killed ] && {{ echo "spare: powered off" >&2; exit 255; }}\nexec "$@"\n')
    wrapper.chmod(0o755)
    path = host_farm(tmp)
    text = path.read_text()
    spare = text.split("devices:\n", 1)[1].replace("name: host", "name: spare").replace("/work", "/spare")
    path.write_text(
        text + spare + f"    exec_prefix: [{wrapper}]\n"
        "pools:\n  nightly: [host]\n  shard-b: [spare]\n  both: [host, spare]\n"
    )
    return path


@pytest.fixture(scope="module")
def three_nights(tmp_path_factory: pytest.TempPathFactory, farm: Path) -> list[tuple[int, dict[str, Any], Path, str]]:
    """Clean, an engine fault injected, clean again (with --keep 2), in one history."""
    history = tmp_path_factory.mktemp("nightly")
    return [
        nightly(history, farm),
        nightly(history, farm, "--fault", "THREAD_ORDER"),
        nightly(history, farm, "--keep", "2"),
    ]


def test_three_nights_clean_fault_clean(three_nights: list[tuple[int, dict[str, Any], Path, str]]) -> None:
    (code1, n1, _, err1), (code2, n2, report2, err2), (code3, n3, report3, err3) = three_nights
    history = report3.parent.parent
    assert code1 == 0, err1[-3000:]
    assert n1["verdicts"] and n1["totals"]["failed"] == 0 and n1["totals"]["passed"] > 0
    assert all(
        not n1[k]
        for k in ("new_failures", "fixed", "flaky", "still_failing", "new_errors", "devices_missing", "disagreements")
    )

    assert code2 == 1, err2[-3000:]
    assert n2["faults"] == ["THREAD_ORDER"]
    assert keys(n2["new_failures"]) == {("host", "DET-threads[qwen3moe]")}
    assert n2["new_failures"][0]["last_outcome"] == "pass" and n2["new_failures"][0]["gate"] == "DET"
    assert n2["totals"]["failed"] == 1 and not n2["flaky"] and not n2["new_errors"]
    assert n2["engine_builds"] != n1["engine_builds"]

    assert code3 == 0, err3[-3000:]
    assert keys(n3["fixed"]) == keys(n2["new_failures"])
    assert not n3["new_failures"] and not n3["flaky"] and not n3["still_failing"]

    # nightly.json, report.md and report.html agree (the fault night).
    md = (report2.parent / "report.md").read_text()
    page = report2.read_text()
    # a fault build says so before anything else
    assert md.splitlines()[2].startswith("> **FAULT BUILD") and 'id="fault"' in page
    verdict = "FAIL (FAULT BUILD: THREAD_ORDER): 1 new failures"
    assert verdict in md and verdict in page
    assert "FAULT BUILD" not in (report3.parent / "report.md").read_text()
    # the commits since the previous night of the pool
    assert n1["commit_range"] is None and n2["commit_range"]["previous_run"] == n1["run"]
    assert n2["commit_range"]["to"] == n2["git_commit"]
    assert "## New failures (1)" in md and ">New failures (1)</h2>" in page
    assert "DET-threads[qwen3moe]" in md and "DET-threads[qwen3moe]" in page
    assert "OK: 1 fixed" in (report3.parent / "report.md").read_text() and ">Fixed (1)</h2>" in report3.read_text()
    assert '<figure id="matrix"><table' in page and '<figure id="trend"><svg' in page and "<script" not in page
    # One device, green: every test that ran passed, nothing skipped, no XDEV column (nothing to compare)
    # the one skip is BAD-DATA's: it corrupts only the fixtures with quantised tensors, not qwen3moe
    assert n1["totals"]["skipped"] == 1 and n1["totals"]["passed"] + 1 == n1["totals"]["tests"]
    assert n1["totals"]["xdev"]["verdicts"] == 0 and "XDEV" not in (report3.parent / "report.md").read_text()
    # the gate run was given the nightly's run id
    for n, report in ((n1, None), (n2, report2), (n3, report3)):
        run_dir = history / n["run"] if report is None else report.parent
        if run_dir.is_dir():
            assert json.loads((run_dir / "run.json").read_text())["run"] == n["run"]
    with History(history) as hist:  # the trend: 100 % on the green nights, the fault night marked
        rates = {r.id: (r.rate, r.faults) for r in hist.run_summaries([n1["run"], n2["run"], n3["run"]])}
    assert rates[n1["run"]] == (1.0, ()) and rates[n3["run"]] == (1.0, ())
    assert rates[n2["run"]][1] == ("THREAD_ORDER",) and rates[n2["run"]][0] < 1.0
    assert "fault night" in (report2.parent / "trend.svg").read_text()
    # The failure, one click from its evidence: the failed cell and the finding link its page, which has
    # the reason and the files the test saved; and its history, on its own page
    (failure,) = n2["new_failures"]
    evidence = report2.parent / unquote(failure["evidence"])
    assert f'href="{quote(failure["evidence"])}"' in page.split('id="matrix"', 1)[1].split("</figure>", 1)[0]
    assert evidence.is_file() and html.escape(failure["message"]) in evidence.read_text()
    assert "first_difference.txt" in evidence.read_text() and not failure["message"].startswith("AssertionError")
    assert str(report2.parent) not in failure["message"]  # the reason, not where its artifacts are
    assert [r["outcome"] for r in failure["recent"]] == ["pass", "fail"] and failure["flips"] == 1
    assert failure["last_pass"]["run"] == n1["run"]
    fixed = n3["fixed"][0]
    assert [r["outcome"] for r in fixed["recent"]] == ["pass", "fail", "pass"] and fixed["flips"] == 2
    history_page = (report3.parent / fixed["history"]).read_text()
    assert "fault build: THREAD_ORDER" in history_page and n2["run"] in history_page
    # Retention kept the last two runs' directories; the history keeps all three.
    runs = sorted(p.name for p in history.iterdir() if p.is_dir())
    assert runs == sorted([n2["run"], n3["run"]])
    index = (history / "index.html").read_text()
    assert f'href="{n3["run"]}/report.html"' in index and n1["run"] not in index
    assert "history.sqlite" in {p.name for p in history.iterdir()}


def test_killed_device_is_missing_not_failing_and_shards_merge(
    tmp_path: Path, farm: Path, three_nights: list[tuple[int, dict[str, Any], Path, str]]
) -> None:
    # Shard A is the last clean night (pool nightly = host); shard B the pool of the other device.
    _, na, report_a, _ = three_nights[2]
    b = tmp_path / "b"
    code_b, nb, report_b, err = nightly(b, farm, "--device", "spare")  # a selection instead of a pool
    assert code_b == 0, err[-3000:]
    assert nb["pool"] == "device:spare" and list(nb["devices"]) == ["spare"]

    merged = tmp_path / "merged"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bmoe_ci.cli",
            "report",
            "--merge",
            str(report_a.parent),
            str(report_b.parent),
            "--out",
            str(merged),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == str(merged / "report.html")
    m = json.loads((merged / "nightly.json").read_text())
    # XDEV is judged over both shards: each shard's lone device had nothing to compare (no XDEV verdict,
    # no skip); merged, they agree: one XDEV pass per device, over and above the shards' tests
    assert na["totals"]["xdev"]["verdicts"] == nb["totals"]["xdev"]["verdicts"] == 0
    assert na["totals"]["skipped"] == nb["totals"]["skipped"] == 1  # BAD-DATA's, as above
    assert m["totals"]["xdev"] == {"verdicts": 2, "passed": 2, "failed": 0, "errors": 0, "skipped": 0}
    for key in ("devices", "tests", "passed", "failed", "errors", "skipped"):
        xdev = m["totals"]["xdev"].get(key, m["totals"]["xdev"]["verdicts"] if key == "tests" else 0)
        assert m["totals"][key] - (0 if key == "devices" else xdev) == na["totals"][key] + nb["totals"][key], key
    assert m["totals"]["devices"] == 2 and set(m["devices"]) == {"host", "spare"}
    assert m["pool"] == "nightly+device:spare" and not m["disagreements"]  # host and spare agree byte for byte
    assert (merged / "junit.xml").is_file() and (merged / "host" / "junit.xml").is_file()
    # A device in two shards cannot be merged (its counts would be taken twice).
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bmoe_ci.cli",
            "report",
            "--merge",
            str(report_a.parent),
            str(report_a.parent),
            "--out",
            str(tmp_path / "twice"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 2 and "device 'host' is also in shard" in proc.stderr

    (farm.parent / "killed").touch()
    try:
        # One device of the pool is gone: it is missing and a new error; the other still gives verdicts.
        code, nk, report_k, err = nightly(tmp_path / "both", farm, "--pool", "both", "--workers", "1")
        assert code == 0, err[-3000:]
        assert [(d["device"], d["since"]) for d in nk["devices_missing"]] == [("spare", nk["run"])]
        assert "spare: powered off" in nk["devices_missing"][0]["reason"]
        assert [(e["device"], e["gate"]) for e in nk["new_errors"]] == [("spare", "INFRA")]
        assert not nk["new_failures"] and nk["totals"]["failed"] == 0 and nk["totals"]["passed"] > 0
        assert ">Devices missing (1)</h2>" in report_k.read_text()
        # The only device of the pool is gone: no verdicts at all (3), and the report says why.
        code, n0, report_0, err = nightly(b, farm, "--pool", "shard-b")
        assert code == 3, err[-3000:]
        assert [d["device"] for d in n0["devices_missing"]] == ["spare"] and not n0["verdicts"]
        assert "NO VERDICT: no device of the pool gave a verdict" in report_0.read_text()
    finally:
        (farm.parent / "killed").unlink()


def test_nightly_with_mutants_records_the_score(tmp_path: Path, farm: Path) -> None:
    """`--mutants` end to end: the real `bmoe-ci mutants` on the pool's one architecture, two faults of
    the catalogue (a subset: the whole catalogue is the documented `bmoe-ci nightly --mutants`), the score
    in nightly.json, the reports and the history's trend."""
    history = tmp_path / "nightly"
    code, n, report, err = nightly(
        history, farm, "--mutants", "--mutants-fault", "THREAD_ORDER", "--mutants-fault", "LRU_NO_REFRESH"
    )
    assert code == 0, err[-3000:]
    assert n["mutation_problem"] == ""
    score = n["mutation_score"]
    assert (score["caught"], score["total"]) == (2, 2), err[-3000:]
    assert [(d["device"], d["arch"]) for d in score["devices"]] == [("host", n["devices"]["host"]["arch"])]
    per_fault = json.loads((report.parent / "mutants" / "host" / "mutants.json").read_text())
    assert sorted(f["name"] for f in per_fault["faults"]) == ["LRU_NO_REFRESH", "THREAD_ORDER"]
    arch = n["devices"]["host"]["arch"]
    assert f"| host | {arch} | 2 | 2 |" in (report.parent / "report.md").read_text()
    assert "<td>host</td><td>" + arch + "</td><td>2</td><td>2</td>" in report.read_text().replace("\n", "")
    with sqlite3.connect(history / "history.sqlite") as db:
        rows = db.execute("SELECT device, caught, total FROM mutation_scores WHERE run = ?", (n["run"],)).fetchall()
    assert rows == [("host", 2, 2)]
