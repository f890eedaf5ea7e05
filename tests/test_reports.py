"""The results layer: per-device JUnit, merge, summary, and `bmoe-ci report` (records built by hand)."""

from __future__ import annotations

import argparse
import json
import os
import xml.etree.ElementTree as ET
from pathlib import Path
from urllib.parse import unquote

import pytest
from junitparser import Error, Failure, JUnitXml, Skipped

from bmoe_ci.cli import environment_defaults
from bmoe_ci.cli_report import add_report_command
from bmoe_ci.reports import (
    DeviceRun,
    RunMeta,
    TestRecord,
    console_matrix,
    finalize,
    merge,
    rebuild,
    strip_xdist_group,
    write_device_junit,
)
from bmoe_ci.reports.journal import JOURNAL, JournalEntry, append_entry, start_journal
from bmoe_ci.reports.summary import cell_text, load_results

FIXTURES = ("qwen3moe", "gemma4", "wide")
FX_SHA = {f: f"{i:064x}" for i, f in enumerate(FIXTURES, 1)}
OUT_SHA = {f: f"{i:02x}" * 32 for i, f in enumerate(FIXTURES, 0xA0)}


def rec(device: str, gate: str, fixture: str | None, outcome: str = "pass", **kw) -> TestRecord:
    name = kw.pop("name", f"{gate}[{fixture}]@{device}" if fixture else f"{gate}@{device}")
    return TestRecord(
        device=device,
        gate=gate,
        fixture=fixture,
        name=name,
        classname=kw.pop("classname", "gates.test_streaming"),
        outcome=outcome,  # type: ignore[arg-type]
        **kw,
    )


def host_run() -> DeviceRun:
    records = [rec("host", g, f, duration_s=0.25) for g in ("G1", "G2", "G8a'") for f in FIXTURES]
    records.append(rec("host", "CFG", None, name="CFG[table]@host", classname="gates.test_config"))
    return DeviceRun(
        device="host",
        arch="x86_64",
        os="linux",
        kind="desktop",
        engine_build_id="bid-x86",
        target="x86_64-linux-musl",
        fixtures=dict(FX_SHA),
        pushed_bytes=3 * 1048576,
        engine_s=2.0,
        wall_s=5.0,
        outputs=dict(OUT_SHA),
        started="2025-01-01T00:00:00+00:00",
        records=records,
    )


def phone_run() -> DeviceRun:
    records = [rec("pixel8", "G1", f) for f in FIXTURES]
    records[1] = rec(
        "pixel8",
        "G1",
        "gemma4",
        "fail",
        message="output differs from the resident reference at token 3\nsecond line",
        details="AssertionError: tokens differ\n  expected 12 got 13",
        system_out="engine stdout\x00with a NUL",
        system_err="moe-drop: 0/96 routed experts dropped",
        artifacts=["G1-gemma4/stdout.txt"],
    )
    records += [rec("pixel8", "G2", f) for f in FIXTURES]
    records[-1] = rec("pixel8", "G2", "wide", "error", message="timeout after 60 s", details="remote timed out")
    records.append(rec("pixel8", "G8a'", "wide", "skip", message="fixture not pushed to this device"))
    return DeviceRun(
        device="pixel8",
        arch="aarch64",
        os="android",
        kind="phone",
        engine_build_id="bid-arm",
        target="aarch64-linux-musl",
        fixtures=dict(FX_SHA),
        pushed_bytes=1234,
        verified_files=3,
        repushed=["m.gguf: stored copy has sha256 aa, expected bb", "bmoe: upload has sha256 cc, expected dd"],
        retries=["connect failed (unreachable: refused); retry 1 of 2 in 1s"],
        engine_s=3.0,
        wall_s=4.5,
        outputs=dict(OUT_SHA),
        records=records,
    )


def dead_run() -> DeviceRun:
    return DeviceRun(
        device="qemu-arm64",
        arch="aarch64",
        os="linux",
        kind="phone",
        infra_error="preflight: connection refused\n(traceback ...)",
    )


META = RunMeta(
    run="run-1",
    started="2025-01-01T00:00:00+00:00",
    finished="2025-01-01T00:01:00+00:00",
    engine_builds={"x86_64-linux-musl": "bid-x86", "aarch64-linux-musl": "bid-arm"},
    compiled=["aarch64-linux-musl"],
    fixtures=dict(FX_SHA),
)


def suites_by_name(path: Path) -> dict:
    return {s.name: s for s in JUnitXml.fromfile(str(path))}


def props(suite) -> dict[str, str]:
    return {p.name: p.value for p in suite.properties()}


@pytest.fixture
def results(tmp_path: Path) -> Path:
    root = tmp_path / "results" / "run-1"
    (root / "pixel8" / "G1-gemma4").mkdir(parents=True)
    (root / "pixel8" / "G1-gemma4" / "stdout.txt").write_text("out\n")
    finalize(root, [host_run(), phone_run(), dead_run()], META)
    return root


def report(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bmoe-ci")
    add_report_command(parser.add_subparsers(dest="command", required=True))
    parser.set_defaults(**environment_defaults(os.environ))  # as bmoe_ci.cli.main does
    args = parser.parse_args(argv)
    return args.func(args)


# ---------------------------------------------------------------------------- records


@pytest.mark.parametrize(
    ("raw", "clean"),
    [
        ("G1[qwen3moe]@pixel8", "G1[qwen3moe]"),
        ("G8a'[wide]@pool_nightly-2", "G8a'[wide]"),
        ("CFG@host", "CFG"),
        ("G1[a@b]", "G1[a@b]"),
        ("G1[qwen3moe]", "G1[qwen3moe]"),
    ],
)
def test_xdist_group_suffix_is_stripped(raw: str, clean: str) -> None:
    assert strip_xdist_group(raw) == clean
    assert rec("host", "G1", None, name=raw).name == clean


def test_record_validation() -> None:
    with pytest.raises(ValueError, match="outcome"):
        rec("host", "G1", "wide", "passed")
    with pytest.raises(ValueError, match="device name"):
        rec("../etc", "G1", "wide")
    for bad in ("/etc/passwd", "../x", "a/../../x"):
        with pytest.raises(ValueError, match="artifact"):
            rec("host", "G1", "wide", artifacts=[bad])
    with pytest.raises(ValueError, match="not 'host'"):
        DeviceRun(device="host", arch="x86_64", records=[rec("pixel8", "G1", "wide")])
    assert rec("host", "G1", "wide", "fail", message="\n  first\nsecond").message == "first"


def test_device_json_is_lossless(tmp_path: Path) -> None:
    run = phone_run()
    run.records[0].system_out = "odd \udcff bytes \x01 and ünïcode"
    write_device_junit(tmp_path, run)
    data = json.loads((tmp_path / "pixel8" / "device.json").read_text())
    assert data["schema"] == "bmoe-ci.device/1"
    assert DeviceRun.from_dict(data) == run


def test_the_journal_holds_what_the_last_rewrite_missed(tmp_path: Path) -> None:
    """A run killed between two rewrites of device.json: the tests its journal has beyond the file are
    read back with what they added (seconds, outputs, XDEV fingerprints), none twice, and a last line
    cut by the kill is ignored."""
    run = host_run()
    first, rest = run.records[:3], run.records[3:]
    snapshot = DeviceRun(**{**run.__dict__, "records": list(first), "engine_s": 1.0, "outputs": {}, "digests": {}})
    write_device_junit(tmp_path, snapshot)
    start_journal(tmp_path, "host")
    for r in first:  # already in the file: never counted twice
        append_entry(tmp_path, JournalEntry(record=r, engine_s=0.5))
    append_entry(
        tmp_path,
        JournalEntry(
            record=rest[0], engine_s=0.25, output=("qwen3moe", "ab" * 32), digests={"qwen3moe": {"ref": {"n": 1}}}
        ),
    )
    for r in rest[1:]:
        append_entry(tmp_path, JournalEntry(record=r, engine_s=0.25))
    with (tmp_path / "host" / JOURNAL).open("ab") as fh:
        fh.write(b'{"record": {"device": "host", "gate": "G9"')  # the kill cut this line
    _, (loaded,) = load_results(tmp_path)
    assert [r.name for r in loaded.records] == [r.name for r in run.records]
    assert loaded.engine_s == 1.0 + 0.25 * len(rest)
    assert loaded.outputs == {"qwen3moe": "ab" * 32}
    assert loaded.digests == {"qwen3moe": {"ref": {"n": 1}}}


def test_a_journal_line_that_does_not_validate_ends_the_reading(tmp_path: Path) -> None:
    """A record device.json would refuse, or seconds that are not a finite count, are not a test: the
    reading stops there as at a cut line, and a journal that is not a file is an error naming it."""
    from bmoe_ci.reports.journal import read_entries
    from bmoe_ci.reports.records import ReportError

    first, second = host_run().records[:2]
    start_journal(tmp_path, "host")
    append_entry(tmp_path, JournalEntry(record=first, engine_s=0.5))
    path = tmp_path / "host" / JOURNAL
    good = path.read_text()
    nan_seconds = '{"record": ' + json.dumps(second.__dict__) + ', "engine_s": NaN}'
    for bad in (nan_seconds, '{"record": {"device": "host"}}'):
        path.write_text(good + bad + "\n" + good)
        assert [e.record.name for e in read_entries(path)] == [first.name]
    path.unlink()
    path.mkdir()
    with pytest.raises(ReportError, match="journal"):
        read_entries(path)


# ---------------------------------------------------------------------------- per-device JUnit


def test_device_junit_shape(results: Path) -> None:
    suites = suites_by_name(results / "pixel8" / "junit.xml")
    assert list(suites) == ["pixel8"]
    suite = suites["pixel8"]
    p = props(suite)
    assert p["device"] == "pixel8" and p["arch"] == "aarch64" and p["os"] == "android"
    assert p["kind"] == "phone" and p["engine_build_id"] == "bid-arm" and p["target"] == "aarch64-linux-musl"
    assert p["pushed_bytes"] == "1234" and p["verified_files"] == "3"
    assert p["repushed.0"].startswith("m.gguf: stored copy") and p["repushed.1"].startswith("bmoe: upload")
    assert p["retries"] == "1" and p["retry.0"].startswith("connect failed (unreachable")
    assert {k: v for k, v in p.items() if k.startswith("fixture.")} == {
        f"fixture.{f}.sha256": sha for f, sha in FX_SHA.items()
    }
    assert (suite.tests, suite.failures, suite.errors, suite.skipped) == (7, 1, 1, 1)
    assert suite.time == 4.5  # the device's wall time, not the sum of the cases

    cases = {c.name: c for c in suite}
    assert all("@" not in name for name in cases)
    assert all(c.classname.startswith("pixel8.gates.") for c in cases.values())
    failed = cases["G1[gemma4]"]
    assert isinstance(failed.result[0], Failure)
    assert failed.result[0].message == "output differs from the resident reference at token 3"
    assert "expected 12 got 13" in failed.result[0].text
    assert "engine stdout\\x00with a NUL" in failed.system_out
    assert failed.system_out.splitlines()[-1].startswith("[[ATTACHMENT|")
    assert failed.system_out.splitlines()[-1].endswith("pixel8/G1-gemma4/stdout.txt]]")
    assert failed.system_err == "moe-drop: 0/96 routed experts dropped"
    assert isinstance(cases["G2[wide]"].result[0], Error)
    skipped = cases["G8a'[wide]"].result[0]
    assert isinstance(skipped, Skipped) and skipped.message == "fixture not pushed to this device"
    assert cases["G1[qwen3moe]"].is_passed


def test_dead_device_is_an_error_not_an_empty_pass(results: Path) -> None:
    suite = suites_by_name(results / "qemu-arm64" / "junit.xml")["qemu-arm64"]
    assert (suite.tests, suite.errors, suite.failures) == (1, 1, 0)
    (case,) = list(suite)
    assert isinstance(case.result[0], Error)
    assert case.result[0].message == "preflight: connection refused"
    assert props(suite)["infra_error"] == "preflight: connection refused"


def test_empty_device_without_infra_error_is_still_an_error(tmp_path: Path) -> None:
    write_device_junit(tmp_path, DeviceRun(device="idle", arch="x86_64"))
    suite = suites_by_name(merge(tmp_path))["idle"]
    assert (suite.tests, suite.errors) == (1, 1)


def test_device_died_mid_run_keeps_its_results(tmp_path: Path) -> None:
    run = host_run()
    run.records = run.records[:2]
    run.infra_error = "connection lost during G2"
    write_device_junit(tmp_path, run)
    suite = suites_by_name(merge(tmp_path))["host"]
    assert (suite.tests, suite.errors) == (3, 1)


def test_long_output_is_cut_in_the_xml_only(tmp_path: Path) -> None:
    run = host_run()
    run.records[0].system_out = "head" + "x" * 200_000 + "tail"
    write_device_junit(tmp_path, run)
    (case,) = [c for c in suites_by_name(tmp_path / "host" / "junit.xml")["host"] if c.system_out]
    assert case.system_out.startswith("head") and case.system_out.endswith("tail")
    assert len(case.system_out) < 70_000 and "characters cut" in case.system_out
    assert len(json.loads((tmp_path / "host" / "device.json").read_text())["records"][0]["system_out"]) == 200_008


# ---------------------------------------------------------------------------- merge


def test_merged_junit(results: Path) -> None:
    merged = JUnitXml.fromfile(str(results / "junit.xml"))
    suites = {s.name: s for s in merged}
    assert sorted(suites) == ["host", "pixel8", "qemu-arm64"]
    assert (suites["host"].tests, suites["host"].failures, suites["host"].errors) == (10, 0, 0)
    assert props(suites["host"])["arch"] == "x86_64"
    assert (merged.tests, merged.failures, merged.errors, merged.skipped) == (18, 1, 2, 1)
    assert merged.name == "run-1"


def test_merge_is_idempotent(results: Path) -> None:
    first = (results / "junit.xml").read_bytes()
    merge(results)
    assert (results / "junit.xml").read_bytes() == first


# ---------------------------------------------------------------------------- summary


@pytest.mark.parametrize(
    ("counts", "text"),
    [
        ({"pass": 3}, "3/3"),
        ({"pass": 2, "skip": 1}, "2/3"),
        ({"pass": 2, "fail": 1}, "FAIL 1/3"),
        ({"pass": 1, "fail": 1, "error": 1}, "ERR 1/3"),
        ({"skip": 3}, "SKIP 3/3"),
        ({}, "-"),
    ],
)
def test_cell_text(counts: dict[str, int], text: str) -> None:
    assert cell_text(counts) == text


def test_summary_json_schema(results: Path) -> None:
    s = json.loads((results / "summary.json").read_text())
    assert s["schema"] == "bmoe-ci.summary/1"
    assert s["run"] == "run-1" and s["status"] == "error"
    assert s["engine_builds"] == META.engine_builds and s["compiled"] == ["aarch64-linux-musl"]
    assert s["gates"] == ["G1", "G2", "G8a'", "CFG"]
    no_xdev = {"verdicts": 0, "passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    assert s["totals"] == {
        "devices": 3,
        "tests": 18,
        "passed": 14,
        "failed": 1,
        "errors": 2,
        "skipped": 1,
        "xdev": no_xdev,
    }
    required = {
        "arch",
        "os",
        "kind",
        "tests",
        "passed",
        "failed",
        "errors",
        "skipped",
        "pushed_bytes",
        "engine_s",
        "wall_s",
        "gates",
        "outputs",
    }
    for dev in s["devices"].values():
        assert required <= set(dev)
    host, phone, dead = s["devices"]["host"], s["devices"]["pixel8"], s["devices"]["qemu-arm64"]
    assert host["gates"] == {"G1": "pass", "G2": "pass", "G8a'": "pass", "CFG": "pass"}
    assert phone["gates"] == {"G1": "fail", "G2": "error", "G8a'": "skip"}
    assert (phone["tests"], phone["passed"], phone["failed"], phone["errors"], phone["skipped"]) == (
        7,
        4,
        1,
        1,
        1,
    )
    assert host["overhead_s"] == 3.0 and host["outputs"] == OUT_SHA
    assert dead["gates"] == {} and dead["status"] == "error" and dead["infra_error"]
    assert s["outputs_agree"] == dict.fromkeys(FIXTURES, True)
    assert s["outputs_cross_arch"]["wide"] == {"archs": ["aarch64", "x86_64"], "agree": True}
    assert {(p["device"], p["outcome"]) for p in s["problems"]} == {
        ("pixel8", "fail"),
        ("pixel8", "error"),
        ("qemu-arm64", "error"),
    }
    assert ["pixel8/G1-gemma4/stdout.txt"] in [p["artifacts"] for p in s["problems"]]


def test_outputs_disagreement(tmp_path: Path) -> None:
    phone = phone_run()
    phone.outputs["gemma4"] = "ff" * 32
    s = finalize(tmp_path, [host_run(), phone], META)
    assert s["outputs_agree"]["gemma4"] is False and s["outputs_agree"]["wide"] is True
    assert s["output_groups"]["gemma4"] == {OUT_SHA["gemma4"]: ["host"], "ff" * 32: ["pixel8"]}
    md = (tmp_path / "summary.md").read_text()
    assert "**DIFFER**" in md and "identical across aarch64 and x86_64" in md


def test_matrix_and_markdown(results: Path) -> None:
    s = json.loads((results / "summary.json").read_text())
    text = console_matrix(s)
    lines = text.splitlines()
    assert lines[0].startswith("bmoe-ci run run-1: ERROR")
    header = lines[1].split()
    assert header[:2] == ["device", "arch"] and header[-1] == "status" and "G8a'" in header
    rows = {line.split()[0]: line for line in lines[2:5]}
    assert rows["host"].split()[2:] == ["3/3", "3/3", "3/3", "1/1", "PASS"]
    assert "FAIL 1/3" in rows["pixel8"] and "ERR 1/3" in rows["pixel8"] and "SKIP 1/1" in rows["pixel8"]
    assert rows["qemu-arm64"].split()[2:] == ["-", "-", "-", "-", "ERROR"]
    assert "preflight: connection refused" in text
    md = (results / "summary.md").read_text()
    # a failed cell links to the evidence of its failing test
    assert "| pixel8 | aarch64 | **[FAIL 1/3](pixel8/artifacts/G1%5Bgemma4%5D/index.html)** |" in md
    assert "matrix.svg" in md and "**ERROR**" in md
    svg = ET.parse(results / "matrix.svg").getroot()  # a well-formed picture, whose failed cells are links
    ns = {"s": "http://www.w3.org/2000/svg"}
    links = {a.get("href"): a.find("s:title", ns).text for a in svg.iterfind(".//s:a", ns)}
    assert links["pixel8/artifacts/G1%5Bgemma4%5D/index.html"].startswith("G1[gemma4]: output differs")
    assert links["qemu-arm64/artifacts/infrastructure/index.html"] == "preflight: connection refused"
    assert all((results / unquote(h)).is_file() for h in links)


def test_every_failure_has_an_evidence_page(results: Path) -> None:
    s = json.loads((results / "summary.json").read_text())
    pages = {(p["device"], p["name"]): p["evidence"] for p in s["problems"]}
    assert pages[("pixel8", "G1[gemma4]")] == "pixel8/artifacts/G1[gemma4]/index.html"
    for (device, name), rel in pages.items():
        page = (results / rel).read_text()
        assert name in page and device in page and 'href="../../../summary.md"' in page
    g1 = (results / pages[("pixel8", "G1[gemma4]")]).read_text()
    # the first line of the reason, then the whole of it
    assert 'id="reason">output differs from the resident reference at token 3</p>' in g1
    assert "expected 12 got 13" in g1 and 'href="../../../pixel8/junit.xml"' in g1
    dead = (results / pages[("qemu-arm64", "infrastructure")]).read_text()
    assert "preflight: connection refused" in dead and "saved no file" in dead


def test_evidence_page_lists_and_shows_the_files_a_test_saved(tmp_path: Path) -> None:
    root = tmp_path / "run"
    saved = root / "pixel8" / "artifacts" / "test_g1[pixel8-gemma4]"
    saved.mkdir(parents=True)
    (saved / "first_difference.txt").write_text("first differing token at index 3: a=[7] b=[8]\n")
    (saved / "logits.f32").write_bytes(b"\0" * 4096)
    phone = phone_run()
    phone.records[1].artifacts = [
        "artifacts/test_g1[pixel8-gemma4]/first_difference.txt",
        "artifacts/test_g1[pixel8-gemma4]/logits.f32",
    ]
    s = finalize(root, [phone], META)
    problem = next(p for p in s["problems"] if p["name"] == "G1[gemma4]")
    assert problem["artifacts_dir"] == "pixel8/artifacts/test_g1[pixel8-gemma4]/"
    page = (root / problem["evidence"]).read_text()
    assert 'href="first_difference.txt"' in page and "first differing token at index 3" in page
    assert 'href="logits.f32"' in page and "4.0 KiB" in page  # binary: linked, not shown
    assert "  -> pixel8/artifacts/test_g1[pixel8-gemma4]/" in console_matrix(s)


def test_cells_count_fixtures_and_devices_keep_the_farm_order(tmp_path: Path) -> None:
    """DET has several tests per fixture: its cell counts fixtures, as the legend says; the devices are
    listed in the order the farm file gives (run.json `devices`), not by name."""
    det = [rec("zeta", "DET", f, name=f"DET-{t}[{f}]") for f in FIXTURES for t in ("threads", "kernels")]
    det[3] = rec("zeta", "DET", "gemma4", "fail", name="DET-kernels[gemma4]", message="kernels differ")
    runs = [DeviceRun(device="zeta", arch="x86_64", records=det), host_run()]
    s = finalize(tmp_path, runs, RunMeta(run="r", devices=["zeta", "host"]))
    assert list(s["devices"]) == ["zeta", "host"]
    assert s["devices"]["zeta"]["gate_counts"]["DET"] == {"pass": 5, "fail": 1, "error": 0, "skip": 0}
    assert s["devices"]["zeta"]["gate_fixtures"]["DET"] == {"pass": 2, "fail": 1, "error": 0, "skip": 0}
    lines = console_matrix(s).splitlines()
    assert lines[2].split()[:2] == ["zeta", "x86_64"] and "FAIL 1/3" in lines[2]
    assert lines[3].startswith("host")


def test_the_console_matrix_fits_the_terminal(tmp_path: Path) -> None:
    """Twenty gates on five devices as rows would be ~160 columns: the matrix turns (gates as rows); on
    one device it is cut into blocks of gate columns instead (a column of twenty rows would be long)."""
    gates = [f"GATE{i:02d}" for i in range(20)]

    def device(name: str) -> DeviceRun:
        return DeviceRun(device=name, arch="aarch64", records=[rec(name, g, f) for g in gates for f in FIXTURES])

    s = finalize(tmp_path / "five", [device(f"device-{d}") for d in range(5)], RunMeta(run="r"))
    wide = console_matrix(s, width=400).splitlines()
    assert wide[1].split()[:3] == ["device", "arch", "GATE00"] and max(map(len, wide)) > 100
    text = console_matrix(s, width=80)
    lines = text.splitlines()
    assert max(map(len, lines[1:])) <= 80, text  # the headline is one sentence; the matrix fits
    assert lines[1].split() == ["gate", *(f"device-{d}" for d in range(5))]
    assert lines[2].split() == ["arch", *["aarch64"] * 5] and lines[3].split() == ["GATE00", *["3/3"] * 5]
    assert lines[-2].split() == ["status", *["PASS"] * 5]
    assert lines[-1] == "outputs: no reference outputs recorded"

    one = finalize(tmp_path / "one", [device("host")], RunMeta(run="r"))
    lines = console_matrix(one, width=80).splitlines()[1:-1]
    assert max(map(len, lines)) <= 80 and len(lines) < 12, lines
    heads = [ln.split() for ln in lines if ln.startswith("device")]
    assert len(heads) > 1 and all(h[:2] == ["device", "arch"] for h in heads)
    assert [g for h in heads for g in h[2:]] == [*gates, "status"]  # every gate once, in order
    assert sum(ln.startswith("host ") for ln in lines) == len(heads)


def test_sizes_and_plurals_read_as_words(tmp_path: Path) -> None:
    s = finalize(tmp_path, [host_run()], META)
    md = (tmp_path / "summary.md").read_text()
    assert "| 3.0 MiB |" in md  # pushed, in the same unit as the console's
    one = finalize(
        tmp_path / "one",
        [DeviceRun(device="h", arch="x86_64", outputs={"qwen3moe": "aa" * 32}, records=[rec("h", "G1", "qwen3moe")])],
        META,
    )
    assert "outputs: qwen3moe identical on x86_64 only" in console_matrix(one)
    assert "all 3 fixtures identical on x86_64 only" in console_matrix(s)
    assert "1 test: 1 passed, 0 failed, 0 errors, 0 skipped" in console_matrix(one)


# ---------------------------------------------------------------------------- bmoe-ci report


def test_report_exit_codes(tmp_path: Path, results: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert report(["report", str(results)]) == 1
    assert "FAIL 1/3" in capsys.readouterr().out

    green = tmp_path / "green"
    finalize(green, [host_run()], META)
    assert report(["report", str(green)]) == 0
    capsys.readouterr()
    assert report(["report", "--format", "json", str(green)]) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "pass"

    assert report(["report", str(tmp_path / "missing")]) == 2
    assert "no such directory" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert report(["report", str(tmp_path / "empty")]) == 2
    assert "no device results" in capsys.readouterr().err
    assert report(["report", str(results.parent)]) == 2  # the results root, not one run
    assert "results root" in capsys.readouterr().err
    assert report(["report", str(results / "summary.json")]) == 2
    assert "not a directory" in capsys.readouterr().err


def test_report_corrupt_junit_names_the_file(results: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = results / "pixel8" / "junit.xml"
    bad.write_text("<testsuites><testsuite name='pixel8'>")
    assert report(["report", str(results)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(bad) in err


def test_report_corrupt_device_json_names_the_file(results: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = results / "host" / "device.json"
    data = json.loads(bad.read_text())
    data["records"][0]["outcome"] = "maybe"
    bad.write_text(json.dumps(data))
    assert report(["report", str(results)]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "records.0" in err


def test_report_rebuilds_from_the_directory_alone(results: Path) -> None:
    before = json.loads((results / "summary.json").read_text())
    for name in ("summary.json", "summary.md", "matrix.svg", "junit.xml", "run.json"):
        (results / name).unlink()
    (results / "pixel8" / "device.json").unlink()  # only its junit.xml left
    (results / "host" / "junit.xml").unlink()  # only its device.json left
    after = rebuild(results)
    assert (results / "host" / "junit.xml").is_file() and (results / "junit.xml").is_file()
    for key in ("totals", "gates", "outputs_agree", "status"):
        assert after[key] == before[key]
    assert after["devices"]["pixel8"]["gates"] == before["devices"]["pixel8"]["gates"]
    assert after["devices"]["pixel8"]["pushed_bytes"] == 1234
    assert after["devices"]["pixel8"]["verified_files"] == 3
    assert after["devices"]["pixel8"]["repushed"] == before["devices"]["pixel8"]["repushed"]
    assert len(after["devices"]["pixel8"]["repushed"]) == 2
    assert after["devices"]["pixel8"]["retries"] == before["devices"]["pixel8"]["retries"] == 1
    assert after["devices"]["pixel8"]["retry_notes"] == before["devices"]["pixel8"]["retry_notes"]
    assert after["devices"]["host"]["retries"] == 0
    problems = {p["name"]: p for p in after["problems"]}
    assert problems["G1[gemma4]"]["artifacts"] == ["pixel8/G1-gemma4/stdout.txt"]
    assert after["engine_builds"] == META.engine_builds  # derived from the devices without run.json
