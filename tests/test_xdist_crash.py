"""A test whose xdist worker is killed under it is an infrastructure error, everywhere: xdist runs it
again on another worker, and that second run used to be recorded as a plain pass (JUnit and the summary
said PASS, `bmoe-ci report` exited 0, while pytest exited 1). A test is never retried."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import junitparser

from gate_run import REPO, host_farm

# A gate test of its own (the plugin runs any test module given --bmoe-device): its first run kills its
# own worker; xdist's second run finds the flag and passes.
SUITE = """
import os
from pathlib import Path

import pytest


@pytest.mark.gate("G1")
@pytest.mark.entries()
def test_dies_once(device, fixture):
    flag = Path(os.environ["BMOE_TEST_FLAG"])
    if not flag.exists():
        flag.write_text("killed")
        os.kill(os.getpid(), 9)


@pytest.mark.gate("G2")
@pytest.mark.entries()
def test_fine(device, fixture):
    pass
"""


def test_a_test_whose_worker_was_killed_is_an_error_not_a_pass(tmp_path: Path) -> None:
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_crash.py").write_text(SUITE)
    results = tmp_path / "results"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            str(suite / "test_crash.py"),
            "-p",
            "no:cacheprovider",
            "-q",
            "-n",
            "2",
            "--bmoe-farm",
            str(host_farm(tmp_path)),
            "--bmoe-device",
            "host",
            "--bmoe-fixture",
            "qwen3moe",
            "--bmoe-results",
            str(results),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env={**__import__("os").environ, "BMOE_TEST_FLAG": str(tmp_path / "flag")},
    )
    out = proc.stdout + proc.stderr
    assert (tmp_path / "flag").is_file(), out[-3000:]  # it did die once
    assert proc.returncode == 1, out[-3000:]
    summary = json.loads((results / "summary.json").read_text())
    host = summary["devices"]["host"]
    assert host["gates"]["G1"] == "error" and host["gates"]["G2"] == "pass", host["gates"]
    crashed = [p for p in summary["problems"] if p["gate"] == "G1"]
    assert len(crashed) == 1 and "xdist worker lost" in crashed[0]["message"]
    suites = {s.name: s for s in junitparser.JUnitXml.fromfile(str(results / "junit.xml"))}
    assert suites["host"].errors >= 1 and suites["host"].failures == 0
    # pytest's own summary line agrees: one error (the lost run), one pass; the second run is not counted
    last = proc.stdout.strip().splitlines()[-1]
    assert "1 error" in last and "1 passed" in last and "2 passed" not in last, last
    report = subprocess.run(
        [sys.executable, "-m", "bmoe_ci.cli", "report", str(results)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert report.returncode != 0, report.stdout[-2000:]
