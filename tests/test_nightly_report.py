"""The nightly report: report.md and report.html say what nightly.json says; a green night is short; a
fault build says so first; the commits since the previous night; links relative to the report; the trend
chart by date with y axes from 0; the HTML is one self-contained file that renders in headless Chromium
without console errors and fits 1280 px with 2 and with 12 devices (screenshots are kept under
results/tests/); the mutants.json reader; --mutants refuses to run without `bmoe-ci mutants`."""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest

from bmoe_ci.cli import main
from bmoe_ci.nightly.history import History, Outcome, RunRecord, RunSummary
from bmoe_ci.nightly.matrix import MAX_GATE_COLUMNS, cell, matrix_html, matrix_markdown, transposed
from bmoe_ci.nightly.merge import merged_nightly
from bmoe_ci.nightly.report import (
    CLASSES,
    Link,
    cell_text,
    commit_line,
    markdown,
    render_html,
    sections,
    verdict_line,
    write_report,
)
from bmoe_ci.nightly.run import commit_range, read_mutants
from bmoe_ci.nightly.testhistory import TestHistory
from bmoe_ci.nightly.trend import trend_figure, trend_svg
from bmoe_ci.reports import DeviceRun, ReportError, RunMeta, TestRecord
from bmoe_ci.reports.summary import GATE_ORDER, build_summary, finalize

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = Path(os.environ.get("BMOE_CI_TEST_ARTIFACTS", REPO / "results" / "tests"))
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--enable-logging=stderr",
    "--v=0",
)
FINDINGS = [key for key, _, _ in CLASSES] + ["disagreements", "output_changes"]


def finding(device: str, gate: str, name: str, **extra: str) -> dict[str, str]:
    return {
        "device": device,
        "arch": "aarch64",
        "gate": gate,
        "fixture": "qwen3moe",
        "name": name,
        "message": f"{name} <b>went</b> wrong | here",
        "last_outcome": "pass",
        **extra,
    }


def sample_nightly() -> dict[str, Any]:
    return {
        "schema": "bmoe-ci.nightly/1",
        "run": "20260101-000000-ci-1",
        "pool": "nightly",
        "started": "2026-01-01T00:00:00+0000",
        "finished": "2026-01-01T00:10:00+0000",
        "git_commit": "a" * 40,
        "git_dirty": False,
        "farm_sha256": "f" * 64,
        "faults": [],
        "engine_builds": {"aarch64-linux-musl": "b1"},
        "commit_range": {"previous_run": "20251231-000000-ci-1", "from": "9" * 40, "to": "a" * 40, "count": 3},
        "verdicts": True,
        "no_verdict_reason": "",
        "exit_code": 1,
        "totals": {"devices": 2, "tests": 20, "passed": 15, "failed": 3, "errors": 1, "skipped": 1},
        "new_failures": [finding("pixel8", "G1", "G1[qwen3moe]"), finding("rpi5", "DET", "DET-threads[qwen3moe]")],
        "still_failing": [finding("pixel8", "G2", "G2[qwen3moe]", since="20251230-000000-ci-1")],
        "fixed": [finding("rpi5", "G5", "G5[qwen3moe]")],
        "flaky": [finding("rpi5", "G8a", "G8a[qwen3moe]")],
        "new_errors": [finding("gone", "INFRA", "infrastructure")],
        "devices_missing": [{"device": "gone", "arch": "x86_64", "reason": "ssh: refused", "since": "r0"}],
        "disagreements": [
            {
                "fixture": "qwen3moe",
                "entry": "greedy",
                "field": "sha256",
                "values": {"pixel8": "1" * 64, "rpi5": "2" * 64},
                "minority": ["rpi5"],
            }
        ],
        "disagreement_source": "per-device outputs",
        "output_changes": [
            {
                "device": "rpi5",
                "arch": "aarch64",
                "fixture": "qwen3moe",
                "entry": "greedy",
                "before": "3" * 64,
                "after": "2" * 64,
                "previous_run": "r0",
                "build_changed": False,
            }
        ],
        "changed_archs": {"aarch64": {"expected": [], "unexpected": ["qwen3moe/greedy"]}},
        "mutation_score": {
            "caught": 11,
            "total": 12,
            "devices": [{"device": "pixel8", "arch": "aarch64", "caught": 11, "total": 12}],
        },
        "mutation_problem": "",
        "devices": {
            d: {
                "arch": "aarch64",
                "os": "android",
                "kind": "phone",
                "target": "aarch64-linux-musl",
                "engine_build_id": "b1",
                "pushed_bytes": 10,
                "engine_s": 1.0,
                "wall_s": 2.0,
                "infra_error": None,
                "junit": f"{d}/junit.xml",
                "artifacts": f"{d}/",
            }
            for d in ("pixel8", "rpi5")
        },
        "flaky_policy": {"window": 10, "flips": 3},
    }


def green_nightly() -> dict[str, Any]:
    n = sample_nightly()
    for key in FINDINGS:
        n[key] = []
    n.update(
        exit_code=0,
        mutation_score=None,
        changed_archs={},
        totals={"devices": 2, "tests": 20, "passed": 19, "failed": 0, "errors": 0, "skipped": 1},
    )
    return n


START = datetime(2026, 1, 1, 2, 0, tzinfo=UTC)


def trend_runs(n: int = 30) -> list[RunSummary]:
    """*n* nightly runs at 02:00, one a night but for a gap of four nights after the tenth."""

    def day(i: int) -> datetime:
        return START + timedelta(days=i + (4 if i >= 10 else 0))

    return [
        RunSummary(
            id=f"{day(i):%Y%m%d-%H%M%S}-ci-{i}",
            pool="nightly",
            started=f"{day(i):%Y-%m-%dT%H:%M:%S%z}",
            verdicts=True,
            engine_builds={},
            tests=20,
            passed=20 - i % 4,
            failed=i % 4,
            errors=0,
            engine_s={"pixel8": 1.0 + i / 30, "rpi5": 2.0 - i / 40},
            mutation=(10 + i % 3, 12) if i % 5 else None,
        )
        for i in range(n)
    ]


def device_runs(
    devices: list[str], gates: list[str], failing: set[tuple[str, str]] = frozenset(), faults: tuple[str, ...] = ()
) -> list[DeviceRun]:
    return [
        DeviceRun(
            device=d,
            arch="aarch64" if i % 2 else "x86_64",
            faults=list(faults),
            records=[
                TestRecord(
                    device=d,
                    gate=g,
                    fixture="qwen3moe",
                    name=f"{g}[qwen3moe]",
                    classname="gates.t",
                    outcome="fail" if (d, g) in failing else "pass",
                )
                for g in gates
            ],
        )
        for i, d in enumerate(devices)
    ]


# ---------------------------------------------------------------------------- content


def visible_text(page: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", " ", re.sub(r"<style>.*?</style>", "", page, flags=re.S)))


def test_markdown_and_html_carry_every_entry_of_nightly_json() -> None:
    n = sample_nightly()
    md = markdown(n)
    page = render_html(n, None, None)
    text = html.unescape(re.sub(r"<[^>]+>", " ", page))
    for key, title, _ in CLASSES:
        heading = f"{title} ({len(n[key])})"
        assert f"## {heading}" in md and f">{heading}</h2>" in page
        for item in n[key]:
            assert item["device"] in md and item["device"] in text
            if "name" in item:
                assert item["name"] in md and item["name"] in text
    assert "Cross-device disagreements (1)" in md and "Cross-device disagreements (1)" in page
    assert "NO (device or toolchain)" in md and "NO (device or toolchain)" in text
    assert "| pixel8 | aarch64 | 11 | 12 |" in md
    # Every table row of the HTML is a row of the markdown, cell by cell.
    for s in sections(n):
        for row in s.rows:
            md_row = (
                "| "
                + " | ".join(
                    f"[{c.text}]({c.href})" if isinstance(c, Link) else c.replace("|", "\\|").replace("\n", " ")
                    for c in row
                )
                + " |"
            )
            assert md_row in md
            assert all(html.escape(cell_text(c)) in page for c in row), row
    # The verdict line is the same everywhere, and it is the first thing said.
    verdict = (
        "FAIL: 2 new failures, 1 new errors, 1 devices missing, 1 flaky, 1 still failing, 1 fixed, "
        "1 cross-device disagreement(s)"
    )
    assert verdict in md.splitlines()[2] and verdict in html.unescape(page)
    # Message text is escaped, not markup.
    assert "<b>went</b>" not in page and "&lt;b&gt;went&lt;/b&gt;" in page


def test_a_green_night_is_short_and_leaves_empty_sections_out() -> None:
    n = green_nightly()
    md, page = markdown(n), render_html(n, None, None)
    assert "OK: nothing new" in md and "OK: nothing new" in page
    # No heading of a section with nothing in it, and no "none" filler.
    assert [s.key for s in sections(n)] == ["devices"]
    for key, title, _ in CLASSES:
        assert title not in md and f'id="{key}"' not in page
    text = visible_text(page)
    for absent in ("Cross-device", "Outputs changed", "Mutation score", "none", "(0)"):
        assert absent not in md and absent not in text, absent
    assert [line for line in md.splitlines() if line.startswith("## ")] == ["## Devices (2)"]
    assert len(md.splitlines()) < 20
    # A failing night keeps what it found; a measured mutation score is kept on a green night.
    n["mutation_score"] = sample_nightly()["mutation_score"]
    assert "## Mutation score (11/12)" in markdown(n)
    n.update(verdicts=False, exit_code=3, no_verdict_reason="the gate run exited 3 without a summary")
    assert "NO VERDICT: the gate run exited 3" in render_html(n, None, None)


def test_a_fault_build_says_so_first_everywhere() -> None:
    real = green_nightly()
    for text in (markdown(real), render_html(real, None, None), verdict_line(real)):
        assert "FAULT" not in text
    n = green_nightly()
    n["faults"] = ["THREAD_ORDER"]
    md, page = markdown(n), render_html(n, None, None)
    # report.md: the warning is the first thing after the title, then the verdict names it too.
    lines = [line for line in md.splitlines() if line]
    assert lines[1].startswith("> **FAULT BUILD") and "THREAD_ORDER" in lines[1]
    assert lines[2].startswith("**OK (FAULT BUILD: THREAD_ORDER): ")
    # report.html: in the title, a banner before the verdict, and the verdict (also the index's line).
    assert re.search(r"<title>FAULT BUILD OK[^<]*</title>", page)
    assert page.index('id="fault"') < page.index('id="verdict"')
    assert "the real engine" in html.unescape(page[page.index('id="fault"') : page.index('id="verdict"')])
    assert verdict_line(n).startswith("OK (FAULT BUILD: THREAD_ORDER)")
    n.update(verdicts=False, no_verdict_reason="x")
    assert verdict_line(n).startswith("NO VERDICT (FAULT BUILD: THREAD_ORDER)")


def test_a_fault_build_in_one_shard_makes_the_merged_report_a_fault_build() -> None:
    summary = build_summary(RunMeta(run="m"), device_runs(["a", "b"], ["G1"], faults=("THREAD_ORDER",)))
    shards = [green_nightly(), green_nightly()]
    shards[0]["faults"] = ["THREAD_ORDER"]
    merged = merged_nightly("m", shards, summary, Path("/nonexistent"))
    assert merged["faults"] == ["THREAD_ORDER"]
    assert "FAULT BUILD" in markdown(merged).splitlines()[2]
    # The summary alone (gate runs, no nightly.json) is enough to know.
    assert merged_nightly("m", [], summary, Path("/nonexistent"))["faults"] == ["THREAD_ORDER"]


# ---------------------------------------------------------------------------- commit range


def test_commit_line_names_the_range_since_the_previous_night() -> None:
    n = sample_nightly()
    assert commit_line(n) == "commits 9999999..aaaaaaa (3 commits) since the previous night (20251231-000000-ci-1)"
    assert "commits 9999999..aaaaaaa (3 commits)" in markdown(n) and "9999999..aaaaaaa" in render_html(n, None, None)
    n["commit_range"] = {**n["commit_range"], "count": None}
    assert commit_line(n).startswith("commits 9999999..aaaaaaa since")
    n["commit_range"] = {**n["commit_range"], "from": "a" * 40, "count": 0}
    assert commit_line(n) == "git aaaaaaa: no new commits since the previous night (20251231-000000-ci-1)"
    n["commit_range"] = None
    assert commit_line(n) == "git aaaaaaa: first night of pool nightly, nothing earlier to compare with"
    del n["commit_range"]  # a nightly.json of an older bmoe-ci
    assert commit_line(n) == "git aaaaaaa"


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout.strip()


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_commit_range_comes_from_the_history_and_git(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    commits = []
    for i in range(4):
        (repo / "f").write_text(str(i))
        _git(repo, "add", "f")
        _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", str(i))
        commits.append(_git(repo, "rev-parse", "HEAD"))
    with History(tmp_path / "h") as hist:
        hist.record(RunRecord(id="r1", pool="nightly", started="2026-01-01T02:00:00+0000", git_commit=commits[0]))
        assert commit_range(hist, "nightly", "r1", commits[0], repo) is None  # the first night
        hist.record(RunRecord(id="other", pool="other", started="2026-01-02T01:00:00+0000", git_commit=commits[2]))
        hist.record(RunRecord(id="r2", pool="nightly", started="2026-01-02T02:00:00+0000", git_commit=commits[3]))
        # the previous night of the same pool, not of another pool
        assert commit_range(hist, "nightly", "r2", commits[3], repo) == {
            "previous_run": "r1",
            "from": commits[0],
            "to": commits[3],
            "count": 3,
        }
        # git does not know the older commit (a shallow clone): the range without a count
        hist.record(RunRecord(id="r3", pool="nightly", started="2026-01-03T02:00:00+0000", git_commit="b" * 40))
        assert commit_range(hist, "nightly", "r3", "b" * 40, repo) == {
            "previous_run": "r2",
            "from": commits[3],
            "to": "b" * 40,
            "count": None,
        }
        hist.record(RunRecord(id="r4", pool="nightly", started="2026-01-04T02:00:00+0000", git_commit="b" * 40))
        assert commit_range(hist, "nightly", "r4", "b" * 40, repo)["count"] == 0  # the same commit again


# ---------------------------------------------------------------------------- links


def _links(page: str, md: str) -> list[str]:
    found = re.findall(r'\s(?:href|src)="([^"]*)"', page) + re.findall(r"\]\(([^)\s]*)\)", md)
    return [unquote(html.unescape(link)) for link in found]


def test_artifacts_are_relative_links_that_work_from_a_copy(tmp_path: Path) -> None:
    run_dir = tmp_path / "results" / "nightly" / "20260101-000000-ci-1"
    run_dir.mkdir(parents=True)
    runs = device_runs(["pixel8", "rpi5"], ["G1", "G2"], failing={("pixel8", "G1")})
    artifact = "artifacts/G1[qwen3moe]/bmoe stdout.txt"  # as the plugin names them, and a space
    runs[0].records[0].artifacts = [artifact]
    (run_dir / "pixel8" / "artifacts" / "G1[qwen3moe]").mkdir(parents=True)
    (run_dir / "pixel8" / artifact).write_text("out")
    summary = finalize(run_dir, runs, RunMeta(run="gate-run"))
    n = sample_nightly()
    n["devices"] = {
        d: {**n["devices"]["pixel8"], "junit": f"{d}/junit.xml", "artifacts": f"{d}/"} for d in ("pixel8", "rpi5")
    }
    write_report(run_dir, n, summary, trend_runs())
    copy = tmp_path / "elsewhere" / "copied"
    shutil.copytree(run_dir, copy)
    shutil.rmtree(tmp_path / "results")  # nothing may point back at the original place
    page, md = (copy / "report.html").read_text(), (copy / "report.md").read_text()
    links = _links(page, md)
    for expected in (
        "junit.xml",
        "summary.md",
        "summary.json",
        "nightly.json",
        "trend.svg",
        "report.md",
        "pixel8/junit.xml",
        "rpi5/",
        "matrix.svg",
        "pixel8/artifacts/G1[qwen3moe]/index.html",  # the failed cell's and the finding's evidence
    ):
        assert expected in links, (expected, links)
    for link in links:
        assert not re.match(r"^([a-z]+:|/|\.\.)", link) and str(tmp_path) not in link, link
        assert (copy / link).exists(), link
    # the evidence page links the files the test saved, relative to itself, and back to the report
    evidence = copy / "pixel8" / "artifacts" / "G1[qwen3moe]" / "index.html"
    ev_links = _links(evidence.read_text(), "")
    assert "bmoe stdout.txt" in ev_links, ev_links
    for link in ev_links:
        assert not re.match(r"^([a-z]+:|/)", link) and (evidence.parent / link).exists(), link
    # A file that is not there is not linked.
    (copy / "summary.md").unlink()
    (copy / "trend.svg").unlink()
    write_report(copy, n, summary, [])
    links = _links((copy / "report.html").read_text(), (copy / "report.md").read_text())
    assert "summary.md" not in links and "trend.svg" not in links and "summary.json" in links


# ---------------------------------------------------------------------------- trend


def test_trend_chart_is_an_embeddable_svg() -> None:
    svg = trend_svg(trend_runs())
    assert svg is not None and svg.startswith("<svg") and svg.rstrip().endswith("</svg>")
    assert "<!DOCTYPE" not in svg and "<?xml" not in svg
    assert "pass rate" in svg and "mutation score" in svg and "rpi5" in svg
    assert trend_svg([]) is None


def test_trend_chart_has_dates_on_x_and_y_axes_from_zero() -> None:
    from matplotlib.dates import date2num

    runs = trend_runs()
    fig = trend_figure(runs)
    assert fig is not None
    fig.canvas.draw()  # tick labels exist once drawn
    rate_ax, time_ax = fig.axes
    # y: counts and rates start at 0; the rate axis ends at 100 %.
    assert rate_ax.get_ylim() == (0.0, 100.0)
    slowest = max(v for r in runs for v in r.engine_s.values())
    assert time_ax.get_ylim()[0] == 0.0 and time_ax.get_ylim()[1] > slowest  # the slowest point drawn whole
    # x: the start dates, so the four nights without a run are a gap, not an even step.
    xs = list(rate_ax.lines[0].get_xdata(orig=False))
    assert xs[0] == pytest.approx(date2num(START))
    assert xs[10] - xs[9] == pytest.approx(5.0) and xs[9] - xs[8] == pytest.approx(1.0)
    labels = [t.get_text() for t in time_ax.get_xticklabels() if t.get_text()]
    assert 3 <= len(labels) <= 10, labels
    assert any(re.search(r"Jan|Feb|2026", t) for t in [*labels, time_ax.xaxis.get_offset_text().get_text()]), labels
    assert not any("ci-" in t or "-000000" in t for t in labels)  # no run ids
    title = rate_ax.get_title()
    assert "2026-01-01" in title and "2026-02-03" in title
    # The first night: the day around it.
    one = trend_figure(runs[:1])
    assert one is not None and one.axes[1].get_xlim()[1] - one.axes[1].get_xlim()[0] == pytest.approx(1.0)
    # A run whose `started` is missing is placed by the date its id begins with.
    legacy = RunSummary(
        id="20251231-020000-ci-0",
        pool="nightly",
        started=None,
        verdicts=True,
        engine_builds={},
        tests=10,
        passed=10,
        failed=0,
        errors=0,
        engine_s={},
        mutation=None,
    )
    fig = trend_figure([legacy, *runs[:2]])
    assert fig is not None
    assert fig.axes[0].lines[0].get_xdata(orig=False)[0] == pytest.approx(date2num(START - timedelta(days=1)))


# ---------------------------------------------------------------------------- matrix


def test_matrix_cells_and_orientation() -> None:
    assert (cell({"pass": 3}).text, cell({"pass": 2, "skip": 1}).text) == ("3/3", "2/3")
    assert cell({"pass": 2, "fail": 1}).text == "✗1/3" and cell({"fail": 1, "error": 1}).text == "E1/2"
    assert (cell({"skip": 3}).text, cell({}).text) == ("S3/3", "-")
    gates = [*GATE_ORDER, "PERF", "MEM"]
    few = build_summary(RunMeta(run="r"), device_runs(["a", "b"], gates, failing={("a", "G5")}))
    assert not transposed(few)
    assert matrix_markdown(few) == [
        f"2 device(s) x {len(gates)} gate(s); not passing:",
        "",
        "- a (x86_64) G5: 1 of 1 fixture(s) failed; G5[qwen3moe] ([evidence](a/artifacts/G5%5Bqwen3moe%5D/index.html))",
    ]
    # in the HTML the failed cell is a link to that evidence, its tooltip the test and its reason
    page = matrix_html(few)
    assert '<a href="a/artifacts/G5%5Bqwen3moe%5D/index.html"' in page and "G5[qwen3moe]" in html.unescape(page)
    green = build_summary(RunMeta(run="r"), device_runs(["a", "b"], gates))
    assert matrix_markdown(green) == [
        f"2 device(s) x {len(gates)} gate(s): every gate that ran passed on every device."
    ]
    # a fault build's status is never green; a merge of a fault shard and a real one says which is which
    fault = build_summary(RunMeta(run="r"), device_runs(["a"], gates, faults=("THREAD_ORDER",)))
    assert "#9a6700" in matrix_html(fault) and "FAULT BUILD" not in matrix_html(fault)
    mixed = build_summary(
        RunMeta(run="r"), [*device_runs(["a"], gates, faults=("THREAD_ORDER",)), *device_runs(["b"], gates)]
    )
    assert matrix_html(mixed).count("FAULT BUILD") == 1
    many_gates = build_summary(RunMeta(run="r"), device_runs(["a"], [f"X{i}" for i in range(MAX_GATE_COLUMNS + 1)]))
    assert transposed(many_gates)


# ---------------------------------------------------------------------------- in a browser


def chromium() -> str | None:
    return shutil.which("chromium")


needs_chromium = pytest.mark.skipif(chromium() is None, reason="needs Debian's chromium (scripts/setup.sh installs it)")


def _chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    profile = tmp_path / "chromium-profile"
    proc = subprocess.run(
        [chromium() or "chromium", *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc


def render_in_chromium(page: Path, out_png: Path, tmp_path: Path, height: int = 2600) -> tuple[str, str]:
    """Open *page* in headless Chromium: a screenshot in *out_png*; returns (DOM, browser log)."""
    shot = _chromium(tmp_path, f"--window-size=1280,{height}", f"--screenshot={out_png}", page.as_uri())
    dom = _chromium(tmp_path, "--dump-dom", page.as_uri())
    return dom.stdout, shot.stderr + dom.stderr


def console_errors(log: str) -> list[str]:
    """Chromium logs page console messages and failed loads as `CONSOLE(...)` / `ERR_FILE_NOT_FOUND` lines."""
    return [
        line for line in log.splitlines() if "CONSOLE(" in line or "ERR_FILE_NOT_FOUND" in line or "Uncaught" in line
    ]


# Run in a copy of the report (the report itself has no script): what the laid-out page measures.
_MEASURE = """<script>
const m = document.getElementById("matrix"), t = m.querySelector("table");
document.body.setAttribute("data-measured", JSON.stringify({
  viewport: window.innerWidth, page: document.documentElement.scrollWidth,
  height: document.documentElement.scrollHeight,
  th_height: Math.max(...Array.from(document.querySelectorAll("table:not(.matrix) th"),
                                    th => th.getBoundingClientRect().height)),
  matrix_scroll: m.scrollWidth, matrix_client: m.clientWidth, table_right: t.getBoundingClientRect().right}));
</script>"""


def measure_layout(page: Path, tmp_path: Path, width: int = 1280) -> dict[str, float]:
    """The widths of *page* laid out by headless Chromium in a window *width* px wide."""
    probe = page.with_name("measure-" + page.name)
    probe.write_text(page.read_text().replace("</body>", _MEASURE + "</body>"))
    dom = _chromium(
        tmp_path,
        f"--window-size={width},900",
        "--run-all-compositor-stages-before-draw",
        "--virtual-time-budget=2000",
        "--dump-dom",
        probe.as_uri(),
    ).stdout
    probe.unlink()
    found = re.search(r'data-measured="([^"]+)"', dom)
    assert found, dom[-2000:]
    return json.loads(html.unescape(found.group(1)))


def realistic_report(
    run_dir: Path, n_devices: int, *, faults: tuple[str, ...] = (), green: bool = False, n_gates: int = 20
) -> Path:
    """A failing (or *green*) night of *n_devices* devices (realistic names) and *n_gates* gates (the
    catalogue's, then made-up ones), in *run_dir*."""
    names = [
        "pixel8-pro-lab03",
        "galaxy-s24-ultra",
        "rpi5-desk-a",
        "ssh-x86",
        "ssh-arm64",
        "phone-emu",
        "oneplus12-lab07",
        "jetson-orin-nano",
        "macbook-m3-ci",
        "host",
        "adb-arm64",
        "mediatek-dimensity",
    ]
    devices = names[:n_devices]
    gates = [*GATE_ORDER, "PERF-DECODE", "MEM-PEAK", *(f"EXTRA-{i}" for i in range(n_gates))][:n_gates]
    failing = set() if green else {(devices[0], "G1"), (devices[-1], "DET")}
    runs = device_runs(devices, gates, failing=failing, faults=faults)
    summary = finalize(run_dir, runs, RunMeta(run="gate-run", faults=list(faults)))
    n = green_nightly() if green else sample_nightly()
    if not green:  # a message as the gate suite writes them: long, with a long path
        n["new_failures"][0]["message"] = (
            "AssertionError: threads1 and threads2 differ: first differing generated token at index 8 (24 vs 24 "
            f"tokens; artifacts in {run_dir}/{devices[0]}/artifacts/test_one_vs_two_threads[{devices[0]}-qwen3moe])"
        )
    n["faults"] = list(faults)
    n["totals"] = summary["totals"]
    n["devices"] = {d: {**n["devices"]["pixel8"], "junit": f"{d}/junit.xml", "artifacts": f"{d}/"} for d in devices}
    trend = trend_runs()
    return write_report(run_dir, n, summary, trend, histories=histories_for(n, trend))


def histories_for(n: dict[str, Any], trend: list[RunSummary]) -> dict[tuple[str, str], TestHistory]:
    """A history for each finding of *n* over the nights of *trend* (tonight last): passing, then
    failing on every third night, with a fault night among them."""
    runs = (*(r.id for r in trend[:-1]), n["run"])
    out = {}
    for key, _, _ in CLASSES:
        for f in n[key] if key != "devices_missing" else []:
            points = {
                rid: Outcome(
                    run=rid,
                    started=None,
                    outcome="fail" if i % 3 == 2 or rid == n["run"] else "pass",
                    message="differs",
                    engine_build_id=f"b{i // 10}",
                    faults=("THREAD_ORDER",) if i == 20 else (),
                )
                for i, rid in enumerate(runs)
            }
            last = points[runs[-2]] if points[runs[-2]].outcome == "pass" else points[runs[-3]]
            out[(f["device"], f["name"])] = TestHistory(
                device=f["device"], name=f["name"], points=points, runs=runs, last_pass=last
            )
    return out


@needs_chromium
def test_report_renders_in_headless_chromium_without_console_errors(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    page = realistic_report(run_dir, 2)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    png = ARTIFACTS / "nightly-report.png"
    dom, log = render_in_chromium(page, png, tmp_path)
    assert console_errors(log) == [], console_errors(log)
    assert png.is_file() and png.stat().st_size > 10_000 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert 'id="verdict"' in dom and "New failures (2)" in dom
    assert '<figure id="matrix"><table' in dom and '<figure id="trend"><svg' in dom
    # Self-contained: no script, nothing loaded from elsewhere.
    source = page.read_text()
    assert "<script" not in source and not re.search(r'\s(src|href)="(https?:)?//', source)
    assert not re.search(r"<(img|link|iframe)\b", source)


@needs_chromium
@pytest.mark.parametrize(("n_devices", "n_gates"), [(2, 20), (12, 20), (3, 34)])
def test_the_matrix_fits_1280_px_at_any_device_count(tmp_path: Path, n_devices: int, n_gates: int) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    page = realistic_report(run_dir, n_devices, faults=("THREAD_ORDER",) if n_devices == 12 else (), n_gates=n_gates)
    assert ("<thead><tr><th>gate</th>" in page.read_text()) == (n_gates > MAX_GATE_COLUMNS)  # transposed
    widths = measure_layout(page, tmp_path)
    assert widths["viewport"] == 1280, widths  # measured at the width asked for
    assert widths["page"] <= 1280, widths  # no horizontal scrolling of the page
    assert widths["matrix_scroll"] <= widths["matrix_client"], widths  # nor of the matrix inside it
    assert widths["table_right"] <= 1280, widths
    assert widths["th_height"] < 32, widths  # the findings' headers are one line: no column squeezed
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    png = ARTIFACTS / f"nightly-matrix-{n_devices}x{n_gates}.png"
    _chromium(tmp_path, "--window-size=1280,1400", f"--screenshot={png}", page.as_uri())


@needs_chromium
def test_a_green_night_fits_little_more_than_a_screen(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    page = realistic_report(run_dir, 5, green=True)
    widths = measure_layout(page, tmp_path)
    # verdict, commits, matrix, trend, devices, files: no empty sections pushing the devices down
    assert widths["page"] <= 1280 and widths["height"] < 1800, widths
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    _chromium(tmp_path, "--window-size=1280,1700", f"--screenshot={ARTIFACTS / 'nightly-green.png'}", page.as_uri())


@needs_chromium
def test_the_layout_measure_catches_an_overflow(tmp_path: Path) -> None:
    page = tmp_path / "wide.html"
    page.write_text(
        '<!DOCTYPE html><html><body><figure id="matrix" style="overflow-x:auto">'
        '<table style="width:1500px"><tr><td>x</td></tr></table></figure></body></html>'
    )
    widths = measure_layout(page, tmp_path)
    assert widths["viewport"] == 1280 and widths["matrix_scroll"] > widths["matrix_client"], widths


@needs_chromium
def test_the_console_check_catches_a_page_error(tmp_path: Path) -> None:
    page = tmp_path / "bad.html"
    page.write_text("<!DOCTYPE html><html><body><p>x</p><script>undefinedFunction();</script></body></html>")
    _, log = render_in_chromium(page, tmp_path / "bad.png", tmp_path)
    assert console_errors(log), log[-2000:]


def test_mutants_json_is_read_and_checked(tmp_path: Path) -> None:
    good = {
        "schema": "bmoe-ci.mutants/1",
        "device": "pixel8",
        "arch": "aarch64",
        "engine_builds": {},
        "score": {"caught": 11, "total": 12},
        "faults": [],
    }
    path = tmp_path / "mutants.json"
    path.write_text(json.dumps(good))
    score = read_mutants(path)
    assert (score.device, score.arch, score.caught, score.total) == ("pixel8", "aarch64", 11, 12)
    for bad, reason in [
        ({**good, "schema": "x"}, "not a bmoe-ci.mutants/1"),
        ({**good, "score": {"caught": 13, "total": 12}}, "impossible"),
        ({k: v for k, v in good.items() if k != "score"}, "missing or bad key"),
    ]:
        path.write_text(json.dumps(bad))
        with pytest.raises(ReportError, match=reason):
            read_mutants(path)
    path.write_text("{")
    with pytest.raises(ReportError, match=r"mutants\.json: not valid JSON"):
        read_mutants(path)


def test_mutants_fault_option_is_checked_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    history = tmp_path / "h"
    assert main(["nightly", "--mutants", "--mutants-fault", "NO_SUCH_FAULT", "--history", str(history)]) == 2
    err = capsys.readouterr().err
    assert "--mutants-fault" in err and "NO_SUCH_FAULT" in err
    assert main(["nightly", "--mutants-fault", "THREAD_ORDER", "--history", str(history)]) == 2
    assert "--mutants-fault needs --mutants" in capsys.readouterr().err
    assert not history.exists()  # nothing ran, nothing recorded


def test_bad_options_are_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    farm = tmp_path / "farm.yaml"
    farm.write_text(
        f"version: 1\ndevices:\n  - name: host\n    kind: desktop\n    arch: x86_64\n    transport: local\n"
        f"    workdir: {tmp_path / 'w'}\npools:\n  other: [host]\n"
    )
    assert main(["nightly", "--farm", str(farm), "--history", str(tmp_path / "h")]) == 2
    assert "pool 'nightly' is not defined" in capsys.readouterr().err
    assert main(["nightly", "--farm", str(farm), "--keep", "0"]) == 2
    assert "--keep must be at least 1" in capsys.readouterr().err
    assert main(["nightly", "--farm", str(farm), "--pool", "other", "--flaky-window", "1"]) == 2
    assert "--flaky-window" in capsys.readouterr().err
    assert main(["nightly", "--farm", str(tmp_path / "missing.yaml")]) == 2
    assert "missing.yaml" in capsys.readouterr().err
