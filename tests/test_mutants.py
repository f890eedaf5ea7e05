"""The fault catalogue and `bmoe-ci mutants`: the catalogue names exactly the engine's fault sites; an
unknown `--fault` is refused before any device is touched; a fault build is recorded and never shown as
a plain green run; `bmoe-ci mutants` on a subset prints the table and the score and writes mutants.json;
docs/gates.md carries the generated fault table."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bmoe_ci.faults import CatalogueError, fault_sites, load_catalogue
from bmoe_ci.gaterun.suite import SuiteResult
from bmoe_ci.mutants.report import DOC_BEGIN, DOC_END, DOC_HEADER, doc_section, write_doc
from bmoe_ci.mutants.run import NoVerdict, check_clean, classify
from gate_run import REPO, host_farm, run_gates

STATE_AREAS = {"policies", "cache", "prefetch", "trace", "counters"}


# ---------------------------------------------------------------------------- the catalogue


def test_catalogue_names_exactly_the_engine_fault_sites() -> None:
    cat = load_catalogue()
    sites = fault_sites()
    assert set(cat.names()) == set(sites), {
        "in engine/src, not catalogued": sorted(set(sites) - set(cat.names())),
        "catalogued, no site in engine/src": sorted(set(cat.names()) - set(sites)),
    }
    for fault in cat.faults:
        assert fault.file in sites[fault.name], (fault.name, fault.file, sites[fault.name])


def test_catalogue_covers_the_engine_state_and_the_kernels() -> None:
    faults = load_catalogue().faults
    assert len(faults) >= 30
    assert sum(f.area in STATE_AREAS for f in faults) * 2 >= len(faults)
    assert sum(f.area in ("kernels", "attention") for f in faults) >= 5


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('[[fault]]\nname = "X"\narea = "cache"\nfile = "a.c"\nbreaks = "b"\n', "fault[0] (X).expected"),
        ('[[fault]]\nname = "X"\narea = "gpu"\nfile = "a.c"\nbreaks = "b"\nexpected = ["G1"]\n', "fault[0] (X).area"),
        ('[[fault]]\nname = "x"\narea = "cache"\nfile = "a.c"\nbreaks = "b"\nexpected = ["G1"]\n', "fault[0] (x).name"),
        (
            '[[fault]]\nname = "X"\narea = "cache"\nfile = "a.c"\nbreaks = "b"\nexpected = ["G1"]\ncolour = 1\n',
            "fault[0].colour: unknown key",
        ),
        (
            '[[fault]]\nname = "X"\narea = "cache"\nfile = "a.c"\nbreaks = "b"\nexpected = ["G1"]\n' * 2,
            "fault[1].name: X is listed twice",
        ),
        ("[[fault]\n", "faults.toml: "),
        ("", "no [[fault]] entries"),
    ],
)
def test_malformed_catalogue_is_one_line_naming_the_entry(tmp_path: Path, body: str, message: str) -> None:
    path = tmp_path / "faults.toml"
    path.write_text(body)
    with pytest.raises(CatalogueError) as info:
        load_catalogue(path)
    assert message in str(info.value) and str(path) in str(info.value)
    assert "\n" not in str(info.value)


# ---------------------------------------------------------------------------- --fault in the gate suite


def test_unknown_fault_is_refused_before_any_device_is_touched(tmp_path: Path) -> None:
    results = tmp_path / "results"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "gates",
            "-p",
            "no:cacheprovider",
            "-q",
            "--bmoe-farm",
            str(host_farm(tmp_path)),
            "--bmoe-device",
            "host",
            "--bmoe-results",
            str(results),
            "--bmoe-fault",
            "NO_SUCH_FAULT",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 4, proc.stdout + proc.stderr  # pytest's usage-error status
    errors = [ln for ln in proc.stderr.splitlines() if "NO_SUCH_FAULT" in ln]
    assert len(errors) == 1 and "not in the fault catalogue" in errors[0], proc.stderr
    assert errors[0].startswith("ERROR: --bmoe-fault NO_SUCH_FAULT:"), errors[0]
    assert "Traceback" not in proc.stderr + proc.stdout
    assert not (tmp_path / "work").exists(), "the device's work directory was touched"
    assert not results.exists()


def test_a_fault_build_is_recorded_and_never_plain_green(tmp_path: Path) -> None:
    # CFG_LOOSE_RANGE only breaks the CFG gate: the DET gates of this run pass on a fault build
    run = run_gates(tmp_path, faults=("cfg_loose_range",), modules=("gates/test_determinism.py",))
    assert run.returncode == 0, run.output[-3000:]
    assert run.summary["status"] == "pass" and run.summary["faults"] == ["CFG_LOOSE_RANGE"]
    assert run.summary["devices"]["host"]["faults"] == ["CFG_LOOSE_RANGE"]
    assert "PASS (FAULT BUILD: CFG_LOOSE_RANGE)" in run.output
    assert "PASS (fault)" in run.output  # the device row of the console matrix: never a plain PASS
    results = tmp_path / "results"
    for junit in (results / "junit.xml", results / "host" / "junit.xml"):
        assert '<property name="engine_faults" value="CFG_LOOSE_RANGE"' in junit.read_text(), junit
    assert "FAULT BUILD: CFG_LOOSE_RANGE" in (results / "summary.md").read_text()
    assert "#9a6700" in (results / "matrix.svg").read_text()  # the status cell is not green
    # `bmoe-ci report` rebuilds the same from the directory alone
    (results / "host" / "device.json").unlink()
    (results / "run.json").unlink()
    from bmoe_ci.reports import rebuild

    assert rebuild(results)["faults"] == ["CFG_LOOSE_RANGE"]


# ---------------------------------------------------------------------------- classification


def _outcome(
    tmp_path: Path,
    gates: dict[str, str] | None,
    problems: list[dict] | None = None,
    infra: str | None = None,
    rc: int = 1,
) -> SuiteResult:
    log = tmp_path / "pytest.log"
    log.write_text("last words\n")
    summary = (
        None
        if gates is None
        else {"devices": {"host": {"gates": gates, "infra_error": infra}}, "problems": problems or []}
    )
    problem = None if summary is not None else f"the gate run wrote no summary (exit {rc}): last words (log {log})"
    return SuiteResult(("pytest",), rc, tmp_path, summary, 1.0, log, problem)


def test_classify_a_failure_is_a_catch_an_error_never_is(tmp_path: Path) -> None:
    fault = load_catalogue().get("WRONG_OFFSET")
    caught = classify(
        fault,
        _outcome(
            tmp_path,
            {"G1": "fail", "G2": "error", "DET": "pass"},
            [{"gate": "G1", "outcome": "fail", "name": "G1[q]", "message": "bytes differ"}],
        ),
        "host",
    )
    assert (caught.outcome, caught.caught_by, caught.message) == ("caught", ["G1"], "G1[q]: bytes differ")
    error = classify(
        fault,
        _outcome(
            tmp_path,
            {"G1": "error", "DET": "pass"},
            [{"gate": "G1", "outcome": "error", "name": "G1[q]", "message": "timeout"}],
        ),
        "host",
    )
    assert (error.outcome, error.caught_by) == ("error", []) and "timeout" in error.message
    survived = classify(fault, _outcome(tmp_path, {"G1": "pass", "REPLAY": "skip"}, rc=0), "host")
    assert (survived.outcome, survived.caught_by) == ("survived", [])
    assert classify(fault, _outcome(tmp_path, None, rc=3), "host").outcome == "error"
    dead = classify(fault, _outcome(tmp_path, {"G1": "error"}, infra="unreachable"), "host")
    assert dead.outcome == "error" and "unreachable" in dead.message


def test_a_clean_engine_that_fails_gives_no_verdict(tmp_path: Path) -> None:
    assert check_clean(_outcome(tmp_path, {"G1": "pass", "REPLAY": "skip"}, rc=0), "host") == {
        "G1": "pass",
        "REPLAY": "skip",
    }
    for gates in ({"G1": "fail"}, {"G1": "error"}, {}, None):
        with pytest.raises(NoVerdict):
            check_clean(_outcome(tmp_path, gates), "host")


# ---------------------------------------------------------------------------- bmoe-ci mutants


def test_mutants_on_a_subset_prints_the_table_and_the_score(tmp_path: Path) -> None:
    results = tmp_path / "mutants"
    doc_file = tmp_path / "gates.md"
    doc_file.write_text(f"# gates\n\nbefore\n\n{DOC_BEGIN}\nold\n{DOC_END}\n\nafter\n")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bmoe_ci.cli",
            "mutants",
            "--farm",
            str(host_farm(tmp_path)),
            "--device",
            "host",
            "--fixture",
            "qwen3moe",
            "--fault",
            "WRONG_OFFSET",
            "--fault",
            "cfg_loose_range",
            "--results",
            str(results),
            "--write-doc",
            str(doc_file),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    doc = json.loads((results / "mutants.json").read_text())
    assert doc["schema"] == "bmoe-ci.mutants/1" and doc["device"] == "host" and doc["fixtures"] == ["qwen3moe"]
    assert doc["score"] == {"caught": 2, "total": 2}
    assert set(doc["engine_builds"]) == {"clean", "WRONG_OFFSET", "CFG_LOOSE_RANGE"}
    assert len({next(iter(b.values())) for b in doc["engine_builds"].values()}) == 3  # three distinct builds
    by_name = {f["name"]: f for f in doc["faults"]}
    assert by_name["WRONG_OFFSET"]["outcome"] == "caught" and "G1" in by_name["WRONG_OFFSET"]["caught_by"]
    assert by_name["CFG_LOOSE_RANGE"]["caught_by"] == ["CFG"]
    for f in doc["faults"]:
        assert set(f) >= {"name", "area", "caught_by", "expected", "outcome", "message"}
    # the table: a header with the gates, one row per fault with X under the gates that caught it
    lines = proc.stdout.splitlines()
    header = next(ln for ln in lines if ln.startswith("fault "))
    cols = header.split()
    row = next(ln for ln in lines if ln.startswith("CFG_LOOSE_RANGE")).split()
    assert row[cols.index("CFG")] == "X" and row[cols.index("G1")] == "." and row[-1] == "CAUGHT"
    assert "mutation score on host (x86_64): 2/2 caught (100%)" in proc.stdout.replace("aarch64", "x86_64")
    assert "[2/2]" in proc.stderr  # progress
    assert "<svg" in (results / "mutants.svg").read_text()
    text = doc_file.read_text()
    assert text.startswith("# gates\n\nbefore\n\n") and text.endswith("\n\nafter\n") and "\nold\n" not in text
    assert "| `WRONG_OFFSET` | streamer |" in text
    # the clean engine and each fault are ordinary gate runs, with their own summary
    assert (results / "clean" / "summary.json").is_file()
    assert json.loads((results / "faults" / "WRONG_OFFSET" / "summary.json").read_text())["faults"] == ["WRONG_OFFSET"]


def test_own_fixture_runs_each_fault_on_the_fixture_that_exposes_it(tmp_path: Path) -> None:
    results = tmp_path / "mutants"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bmoe_ci.cli",
            "mutants",
            "--farm",
            str(host_farm(tmp_path)),
            "--device",
            "host",
            "--own-fixture",
            "--fault",
            "DROP_AT_THRESHOLD",
            "--results",
            str(results),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    doc = json.loads((results / "mutants.json").read_text())
    assert load_catalogue().get("DROP_AT_THRESHOLD").fixture == "qwen3moe-tied"
    assert doc["fixtures"] == ["qwen3moe-tied"] and doc["score"] == {"caught": 1, "total": 1}
    (fault,) = doc["faults"]
    assert fault["fixtures"] == ["qwen3moe-tied"] and "REPLAY" in fault["caught_by"]
    for run in (results / "clean", results / "faults" / "DROP_AT_THRESHOLD"):
        assert sorted(json.loads((run / "summary.json").read_text())["fixtures"]) == ["qwen3moe-tied"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--fault", "NOPE"], "--fault NOPE: not in the fault catalogue"),
        (["--device", "nosuch"], "nosuch"),
        (["--fixture", "nosuch"], "--fixture nosuch: no such fixture"),
        (["--jobs", "0"], "--jobs 0"),
        (["--own-fixture", "--fixture", "qwen3moe"], "--own-fixture and --fixture"),
    ],
)
def test_mutants_bad_input_is_one_line_exit_2(tmp_path: Path, argv: list[str], message: str) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bmoe_ci.cli",
            "mutants",
            "--farm",
            str(host_farm(tmp_path)),
            "--results",
            str(tmp_path / "r"),
            *argv,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (tmp_path / "work").exists()


def test_results_that_is_a_file_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "file"
    target.write_text("x")
    proc = subprocess.run(
        [sys.executable, "-m", "bmoe_ci.cli", "mutants", "--farm", str(host_farm(tmp_path)), "--results", str(target)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2 and "not a directory" in proc.stderr


# ---------------------------------------------------------------------------- docs/gates.md


ROW = re.compile(r"^\| `([A-Z0-9_]+)` \| ([a-z]+) \| [^|]+ \| ([^|]+) \| ([^|]+) \| (caught|survived|error) \|$")


def test_docs_fault_table_is_the_generated_one_and_names_every_fault() -> None:
    text = (REPO / "docs" / "gates.md").read_text()
    assert text.count(DOC_BEGIN) == 1 and text.count(DOC_END) == 1
    block = text[text.index(DOC_BEGIN) : text.index(DOC_END) + len(DOC_END)]
    lines = block.splitlines()
    assert DOC_HEADER in lines
    rows = [ROW.match(ln) for ln in lines if ln.startswith("| `")]
    assert all(rows), [ln for ln in lines if ln.startswith("| `") and not ROW.match(ln)]
    cat = load_catalogue()
    assert [m.group(1) for m in rows if m] == cat.names(), "the table is stale: run the documented command"
    for m in rows:
        assert m is not None and m.group(2) == cat.get(m.group(1)).area
    # regenerating from the same data gives the same block (it is the generator's format, not a hand edit)
    faults = [
        {
            "name": m.group(1),
            "area": m.group(2),
            "breaks": cat.get(m.group(1)).breaks,
            "caught_by": [] if m.group(3).strip() == "none" else m.group(3).strip().split(", "),
            "expected": m.group(4).strip().split(", "),
            "outcome": m.group(5),
        }
        for m in rows
        if m
    ]
    header = lines[2]
    meta = re.match(
        r"Last run: `bmoe-ci mutants` on `([^`]+)` \(([^)]+)\), fixtures: (.*), (\S+), ([0-9.]+) s\. ", header
    )
    assert meta, header
    doc = {
        "device": meta.group(1),
        "arch": meta.group(2),
        "fixtures": meta.group(3).split(", "),
        "started": meta.group(4),
        "seconds": float(meta.group(5)),
        "score": {"caught": sum(f["outcome"] == "caught" for f in faults), "total": len(faults)},
        "faults": faults,
    }
    assert doc_section(doc) == block


def test_write_doc_without_markers_is_refused(tmp_path: Path) -> None:
    from bmoe_ci.mutants.report import MutantsFileError

    path = tmp_path / "gates.md"
    path.write_text("# no markers\n")
    with pytest.raises(MutantsFileError, match="no generated block"):
        write_doc(path, {"faults": []})
    assert path.read_text() == "# no markers\n"


def _mutants_file(path: Path, device: str, arch: str, caught: dict[str, list[str]]) -> Path:
    from bmoe_ci.mutants.report import mutants_doc, write_mutants

    faults = [
        {
            "name": n,
            "area": "cache",
            "caught_by": g,
            "expected": ["G1"],
            "outcome": "caught" if g else "survived",
            "message": "",
            "breaks": "",
            "gates": {x: "fail" for x in g},
        }
        for n, g in caught.items()
    ]
    doc = mutants_doc(
        device=device,
        arch=arch,
        engine_builds={},
        fixtures=["qwen3moe"],
        faults=faults,
        gates=["G1", "REPLAY"],
        clean={},
        started="t",
        seconds=1.0,
    )
    path.mkdir()
    write_mutants(path, doc)
    return path


def _compare(a: Path, b: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bmoe_ci.cli", "mutants", "--from", str(a), "--compare", str(b)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_compare_puts_two_runs_side_by_side_and_fails_on_a_difference(tmp_path: Path) -> None:
    host = _mutants_file(tmp_path / "host", "host", "x86_64", {"A": ["G1"], "B": ["REPLAY", "G1"]})
    same = _mutants_file(tmp_path / "same", "phone-emu", "aarch64", {"A": ["G1"], "B": ["G1", "REPLAY"]})
    other = _mutants_file(tmp_path / "other", "phone-emu", "aarch64", {"A": ["G1"], "B": ["REPLAY"], "C": []})
    ok = _compare(host, same)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "caught on phone-emu (aarch64)" in ok.stdout and "DIFFERS" not in ok.stdout
    assert "the two runs catch every fault with the same gates" in ok.stdout
    bad = _compare(host, other)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    rows = {ln.split()[0]: ln for ln in bad.stdout.splitlines() if ln[:1] in "ABC"}
    assert rows["A"].endswith("same") and rows["B"].endswith("DIFFERS") and rows["C"].endswith("DIFFERS")
    assert "(not run)" in rows["C"] and "2 fault(s) caught differently" in bad.stdout
    alone = subprocess.run(
        [sys.executable, "-m", "bmoe_ci.cli", "mutants", "--compare", str(host)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert alone.returncode == 2 and "--compare DIR needs --from DIR" in alone.stderr


def test_a_terminated_run_stops_its_gate_run_and_frees_the_device(tmp_path: Path) -> None:
    import os
    import signal
    import time

    results = tmp_path / "mutants"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bmoe_ci.cli",
            "mutants",
            "--farm",
            str(host_farm(tmp_path)),
            "--device",
            "host",
            "--fixture",
            "qwen3moe",
            "--fault",
            "WRONG_OFFSET",
            "--results",
            str(results),
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lock = tmp_path / "work" / ".bmoe-ci-lock"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None and not lock.exists():
        time.sleep(0.05)  # the clean engine's gate run has leased the device
    assert proc.poll() is None and lock.exists(), "the gate run never took the device"
    proc.send_signal(signal.SIGTERM)
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    assert "interrupted" in err and "Traceback" not in err
    assert not lock.exists(), "the gate run was not ended cleanly: its lease is still there"
    mine = str(results).encode()
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        assert mine not in argv, f"pid {pid} of the run is still running: {argv!r}"
