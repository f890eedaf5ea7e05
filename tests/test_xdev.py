"""XDEV, derived in the reports layer from what each device recorded (reports/xdev.py): who is in
the minority, what a single device or a device with an infrastructure error gets (no verdict), how
the headline counts XDEV apart from the tests, a selection that leaves XDEV out, and that
`bmoe-ci report` re-derives it from a results directory alone (several runners merged)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from junitparser import Failure, JUnitXml

from bmoe_ci.reports import DeviceRun, RunMeta, TestRecord, console_matrix, exit_code, finalize, rebuild
from bmoe_ci.reports.xdev import disagreements, fingerprint

OK_RUN = {
    "ok": True,
    "tokens": [5, 6, 7],
    "text_hex": "616263",
    "counters": {"cache_hits": 4, "cache_misses": 8, "weight_routed": 1.5},
    "flash_by_layer": [{"layer": 0, "flash_reads": 3, "flash_bytes": 300}],
}
META = RunMeta(run="run-x")


def prints(**changes: object) -> dict[str, dict[str, object]]:
    """Two plan entries' fingerprints; `changes` overrides fields of the second entry."""
    second = {**fingerprint(OK_RUN), **changes}
    return {"ref": fingerprint(OK_RUN), "stream-evict": second}


def device(name: str, digests: dict | None = None, infra: str | None = None, sha: str = "aa" * 32) -> DeviceRun:
    records = (
        []
        if infra
        else [
            TestRecord(
                device=name,
                gate="G1",
                fixture="qwen3moe",
                name="G1[qwen3moe]",
                classname="gates.test_streaming",
                outcome="pass",
            )
        ]
    )
    return DeviceRun(
        device=name,
        arch="x86_64",
        records=records,
        infra_error=infra,
        fixtures={"qwen3moe": sha},
        digests={"qwen3moe": digests} if digests is not None else {},
    )


def xdev(summary: dict, name: str) -> str:
    return summary["devices"][name]["gates"].get("XDEV", "absent")


def test_fingerprint_covers_bytes_tokens_counters_and_failures() -> None:
    fp = fingerprint(OK_RUN)
    assert fp["outcome"] == "ok" and fp["counters.cache_hits"] == 4 and fp["counters.weight_routed"] == 1.5
    assert fp["flash_by_layer.0"] == [3, 300]
    assert fp["output"] != fingerprint({**OK_RUN, "text_hex": "616264"})["output"]
    assert fp["tokens"] != fingerprint({**OK_RUN, "tokens": [5, 6, 8]})["tokens"]
    assert fingerprint({}, "SIGSEGV") == {"outcome": "crashed (SIGSEGV)"}
    # an engine error: its kind only (the message can name a device path)
    err = {"ok": False, "error": {"kind": "model", "message": "/data/local/tmp/x/m.gguf: missing key"}}
    assert fingerprint(err) == {"outcome": "error (model)"}


def test_agreeing_devices_pass(tmp_path: Path) -> None:
    s = finalize(tmp_path, [device("a", prints()), device("b", prints()), device("c", prints())], META)
    assert [xdev(s, d) for d in "abc"] == ["pass"] * 3
    assert s["disagreements"] == [] and exit_code(s) == 0


def test_the_minority_fails_and_the_summary_names_what_differed(tmp_path: Path) -> None:
    runs = [device("a", prints()), device("b", prints(**{"counters.cache_hits": 5})), device("c", prints())]
    s = finalize(tmp_path, runs, META)
    assert (xdev(s, "a"), xdev(s, "b"), xdev(s, "c")) == ("pass", "fail", "pass")
    assert s["disagreements"] == [
        {
            "fixture": "qwen3moe",
            "entry": "stream-evict",
            "field": "counters.cache_hits",
            "values": {"a": 4, "b": 5, "c": 4},
            "minority": ["b"],
        }
    ]
    assert exit_code(s) == 1
    problem = next(p for p in s["problems"] if p["gate"] == "XDEV")
    assert problem["device"] == "b" and "stream-evict counters.cache_hits: 5" in problem["message"]
    # the JUnit carries it: a <failure> in b's suite, nothing in a's
    suites = {x.name: x for x in JUnitXml.fromfile(str(tmp_path / "junit.xml"))}
    failed = [c.name for c in suites["b"] for r in c.result if isinstance(r, Failure)]
    assert failed == ["XDEV[qwen3moe]"]
    assert all(not c.result for c in suites["a"])
    md = (tmp_path / "summary.md").read_text()
    assert "| qwen3moe | stream-evict | counters.cache_hits | a=4 b=5 c=4 | b |" in md


def test_no_majority_fails_every_device(tmp_path: Path) -> None:
    s = finalize(tmp_path, [device("a", prints()), device("b", prints(output="ff" * 32))], META)
    assert (xdev(s, "a"), xdev(s, "b")) == ("fail", "fail")
    assert s["disagreements"][0]["minority"] == ["a", "b"]
    assert s["disagreements"][0]["values"]["b"] == "ff" * 32


def test_a_crash_on_one_device_is_a_disagreement() -> None:
    crashed = {"ref": fingerprint({}, "SIGSEGV"), "stream-evict": fingerprint(OK_RUN)}
    found = disagreements([device("a", prints()), device("b", crashed), device("c", prints())])
    assert {d.field for d in found} >= {"outcome", "output"} and all(d.minority == ["b"] for d in found)


def test_a_single_device_has_no_xdev_verdict_and_the_headline_says_why(tmp_path: Path) -> None:
    s = finalize(tmp_path, [device("a", prints())], META)
    # nothing to compare: no verdict at all (a skip would count as a test that could have run)
    assert "XDEV" not in s["devices"]["a"]["gate_counts"] and "XDEV" not in s["gates"]
    assert s["totals"]["skipped"] == 0 and s["totals"]["xdev"]["verdicts"] == 0
    assert s["xdev_lone"] == ["qwen3moe"] and exit_code(s) == 0
    head = console_matrix(s).splitlines()[0]
    assert head.endswith(
        "1 test: 1 passed, 0 failed, 0 errors, 0 skipped; XDEV: nothing to compare (one device ran each fixture)"
    )


def test_xdev_counts_on_their_own_line_of_the_headline(tmp_path: Path) -> None:
    runs = [device("a", prints()), device("b", prints()), device("c", prints(output="ee" * 32))]
    s = finalize(tmp_path, runs, META)
    assert s["totals"]["tests"] == 6 and s["totals"]["xdev"] == {
        "verdicts": 3,
        "passed": 2,
        "failed": 1,
        "errors": 0,
        "skipped": 0,
    }
    assert console_matrix(s).splitlines()[0] == (
        "bmoe-ci run run-x: FAIL: 3 device(s), 3 tests: 3 passed, 0 failed, 0 errors, 0 skipped; "
        "XDEV: 3 verdicts, 2 passed, 1 failed"
    )


def test_a_selection_without_xdev_gets_no_xdev_verdict(tmp_path: Path) -> None:
    """`-m g8b`: the run's meta says which fixtures' XDEV the selection kept (none); a later report too."""
    runs = [device("a", prints()), device("b", prints(output="ee" * 32))]
    s = finalize(tmp_path / "none", runs, RunMeta(run="run-x", xdev_fixtures=[]))
    assert "XDEV" not in s["gates"] and s["disagreements"] == [] and not s["xdev_selected"]
    assert exit_code(s) == 0 and "XDEV" not in console_matrix(s)
    assert "XDEV" not in rebuild(tmp_path / "none")["gates"]  # run.json keeps the selection
    kept = finalize(tmp_path / "kept", runs, RunMeta(run="run-x", xdev_fixtures=["qwen3moe"]))
    assert kept["devices"]["a"]["gates"]["XDEV"] == "fail" and exit_code(kept) == 1


def test_a_device_with_an_infrastructure_error_takes_no_part(tmp_path: Path) -> None:
    runs = [device("a", prints()), device("b", prints(**{"counters.cache_hits": 9})), device("dead", infra="gone")]
    s = finalize(tmp_path, runs, META)
    assert (xdev(s, "a"), xdev(s, "b"), xdev(s, "dead")) == ("fail", "fail", "absent")
    assert "dead" not in s["disagreements"][0]["values"]


def test_devices_given_different_fixture_files_are_not_compared(tmp_path: Path) -> None:
    runs = [device("a", prints()), device("b", prints(output="ee" * 32), sha="bb" * 32)]
    s = finalize(tmp_path, runs, META)
    assert s["disagreements"] == [] and (xdev(s, "a"), xdev(s, "b")) == ("absent", "absent")
    records = json.loads((tmp_path / "a" / "device.json").read_text())["records"]
    assert [r for r in records if r["gate"] == "XDEV"] == []
    assert s["xdev_lone"] == ["qwen3moe"] and exit_code(s) == 0


def test_report_rederives_xdev_over_merged_runners(tmp_path: Path) -> None:
    """Two runners' results copied into one directory: neither alone disagrees, together they do."""
    r1, r2, merged = tmp_path / "r1", tmp_path / "r2", tmp_path / "merged"
    s1 = finalize(r1, [device("a", prints()), device("b", prints())], META)
    s2 = finalize(r2, [device("c", prints(output="ee" * 32))], META)
    assert exit_code(s1) == 0 and xdev(s2, "c") == "absent"
    merged.mkdir()
    for src in (r1 / "a", r1 / "b", r2 / "c"):
        shutil.copytree(src, merged / src.name)
    s = rebuild(merged)
    assert (xdev(s, "a"), xdev(s, "b"), xdev(s, "c")) == ("pass", "pass", "fail")
    assert exit_code(s) == 1
    # the re-derived verdict is written into c's own files
    dev_c = json.loads((merged / "c" / "device.json").read_text())
    assert [r["outcome"] for r in dev_c["records"] if r["gate"] == "XDEV"] == ["fail"]
    assert rebuild(merged)["disagreements"] == s["disagreements"]  # idempotent
