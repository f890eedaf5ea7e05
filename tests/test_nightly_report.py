"""The nightly report: report.md and report.html say what nightly.json says; the HTML is one
self-contained file that renders in headless Chromium without console errors (a screenshot is kept
under results/tests/); the mutants.json reader; --mutants refuses to run without `bmoe-ci mutants`."""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from bmoe_ci.cli import main
from bmoe_ci.nightly.history import RunSummary
from bmoe_ci.nightly.report import CLASSES, markdown, render_html, sections, write_report
from bmoe_ci.nightly.run import read_mutants
from bmoe_ci.nightly.trend import trend_figure, trend_svg
from bmoe_ci.reports import DeviceRun, ReportError, RunMeta, TestRecord
from bmoe_ci.reports.summary import build_summary

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = Path(os.environ.get("BMOE_CI_TEST_ARTIFACTS", REPO / "results" / "tests"))
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--enable-logging=stderr", "--v=0")


def finding(device: str, gate: str, name: str, **extra: str) -> dict[str, str]:
    return {"device": device, "arch": "aarch64", "gate": gate, "fixture": "qwen3moe", "name": name,
            "message": f"{name} <b>went</b> wrong | here", "last_outcome": "pass", **extra}


def sample_nightly() -> dict:
    return {
        "schema": "bmoe-ci.nightly/1", "run": "20260101-000000-ci-1", "pool": "nightly",
        "started": "2026-01-01T00:00:00+0000", "finished": "2026-01-01T00:10:00+0000", "git_commit": "a" * 40,
        "git_dirty": False, "farm_sha256": "f" * 64, "faults": [], "engine_builds": {"aarch64-linux-musl": "b1"},
        "verdicts": True, "no_verdict_reason": "", "exit_code": 1,
        "totals": {"devices": 2, "tests": 20, "passed": 15, "failed": 3, "errors": 1, "skipped": 1},
        "new_failures": [finding("pixel8", "G1", "G1[qwen3moe]"), finding("rpi5", "DET", "DET-threads[qwen3moe]")],
        "still_failing": [finding("pixel8", "G2", "G2[qwen3moe]", since="20251230-000000-ci-1")],
        "fixed": [finding("rpi5", "G5", "G5[qwen3moe]")],
        "flaky": [finding("rpi5", "G8a", "G8a[qwen3moe]")],
        "new_errors": [finding("gone", "INFRA", "infrastructure")],
        "devices_missing": [{"device": "gone", "arch": "x86_64", "reason": "ssh: refused", "since": "r0"}],
        "disagreements": [{"fixture": "qwen3moe", "entry": "greedy", "field": "sha256",
                           "values": {"pixel8": "1" * 64, "rpi5": "2" * 64}, "minority": ["rpi5"]}],
        "disagreement_source": "per-device outputs",
        "output_changes": [{"device": "rpi5", "arch": "aarch64", "fixture": "qwen3moe", "entry": "greedy",
                            "before": "3" * 64, "after": "2" * 64, "previous_run": "r0", "build_changed": False}],
        "changed_archs": {"aarch64": {"expected": [], "unexpected": ["qwen3moe/greedy"]}},
        "mutation_score": {"caught": 11, "total": 12,
                           "devices": [{"device": "pixel8", "arch": "aarch64", "caught": 11, "total": 12}]},
        "devices": {d: {"arch": "aarch64", "os": "android", "kind": "phone", "target": "aarch64-linux-musl",
                        "engine_build_id": "b1", "pushed_bytes": 10, "engine_s": 1.0, "wall_s": 2.0,
                        "infra_error": None, "junit": f"{d}/junit.xml", "artifacts": f"{d}/"}
                    for d in ("pixel8", "rpi5")},
        "flaky_policy": {"window": 10, "flips": 3},
    }


START = datetime(2026, 1, 1, 2, 0, tzinfo=UTC)


def trend_runs(n: int = 30) -> list[RunSummary]:
    """*n* nightly runs at 02:00, one a night but for a gap of four nights after the tenth."""
    def day(i: int) -> datetime:
        return START + timedelta(days=i + (4 if i >= 10 else 0))

    return [RunSummary(id=f"{day(i):%Y%m%d-%H%M%S}-ci-{i}", pool="nightly",
                       started=f"{day(i):%Y-%m-%dT%H:%M:%S%z}", verdicts=True, engine_builds={},
                       tests=20, passed=20 - i % 4, failed=i % 4, errors=0,
                       engine_s={"pixel8": 1.0 + i / 30, "rpi5": 2.0 - i / 40},
                       mutation=(10 + i % 3, 12) if i % 5 else None) for i in range(n)]


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
            md_row = "| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in row) + " |"
            assert md_row in md
            assert all(html.escape(c) in page for c in row), row
    # The verdict line is the same everywhere, and it is the first thing said.
    verdict = "FAIL: 2 new failures, 1 new errors, 1 devices missing, 1 flaky, 1 still failing, 1 fixed, " \
              "1 cross-device disagreement(s)"
    assert verdict in md.splitlines()[2] and verdict in html.unescape(page)
    # Message text is escaped, not markup.
    assert "<b>went</b>" not in page and "&lt;b&gt;went&lt;/b&gt;" in page


def test_a_clean_night_and_no_verdict_read_as_such() -> None:
    n = sample_nightly()
    for key, _, _ in CLASSES:
        n[key] = []
    n.update(disagreements=[], exit_code=0)
    assert "OK: nothing new" in markdown(n)
    n.update(verdicts=False, exit_code=3, no_verdict_reason="the gate run exited 3 without a summary")
    assert "NO VERDICT: the gate run exited 3" in render_html(n, None, None)


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
    assert time_ax.get_ylim()[0] == 0.0
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
    # A run whose `started` is missing is placed by the date its id begins with.
    legacy = RunSummary(id="20251231-020000-ci-0", pool="nightly", started=None, verdicts=True, engine_builds={},
                        tests=10, passed=10, failed=0, errors=0, engine_s={}, mutation=None)
    fig = trend_figure([legacy, *runs[:2]])
    assert fig is not None
    assert fig.axes[0].lines[0].get_xdata(orig=False)[0] == pytest.approx(date2num(START - timedelta(days=1)))


def chromium() -> str | None:
    return shutil.which("chromium")


def render_in_chromium(page: Path, out_png: Path, tmp_path: Path) -> tuple[str, str]:
    """Open *page* in headless Chromium: a screenshot in *out_png*; returns (DOM, browser log)."""
    profile = tmp_path / "chromium-profile"
    common = [chromium() or "chromium", *CHROMIUM_FLAGS, f"--user-data-dir={profile}"]
    shot = subprocess.run([*common, "--window-size=1280,2600", f"--screenshot={out_png}", page.as_uri()],
                          capture_output=True, text=True, timeout=120, check=False)
    dom = subprocess.run([*common, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120,
                         check=False)
    assert shot.returncode == 0 and dom.returncode == 0, shot.stderr[-2000:] + dom.stderr[-2000:]
    return dom.stdout, shot.stderr + dom.stderr


def console_errors(log: str) -> list[str]:
    """Chromium logs page console messages and failed loads as `CONSOLE(...)` / `ERR_FILE_NOT_FOUND` lines."""
    return [line for line in log.splitlines() if "CONSOLE(" in line or "ERR_FILE_NOT_FOUND" in line
            or "Uncaught" in line]


@pytest.mark.skipif(chromium() is None, reason="needs Debian's chromium (scripts/setup.sh installs it)")
def test_report_renders_in_headless_chromium_without_console_errors(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    runs = [DeviceRun(device=d, arch="aarch64", records=[
        TestRecord(device=d, gate=g, fixture="qwen3moe", name=f"{g}[qwen3moe]", classname="gates.t",
                   outcome="fail" if (d, g) == ("pixel8", "G1") else "pass") for g in ("G1", "G2", "G5", "DET")])
        for d in ("pixel8", "rpi5")]
    summary = build_summary(RunMeta(run="gate-run"), runs)
    page = write_report(run_dir, sample_nightly(), summary, trend_runs())
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    png = ARTIFACTS / "nightly-report.png"
    dom, log = render_in_chromium(page, png, tmp_path)
    assert console_errors(log) == [], console_errors(log)
    assert png.is_file() and png.stat().st_size > 10_000 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert 'id="verdict"' in dom and "New failures (2)" in dom
    assert '<figure id="matrix"><svg' in dom and '<figure id="trend"><svg' in dom
    # Self-contained: no script, nothing loaded from elsewhere.
    source = page.read_text()
    assert "<script" not in source and not re.search(r'\s(src|href)="(https?:)?//', source)
    assert not re.search(r"<(img|link|iframe)\b", source)


@pytest.mark.skipif(chromium() is None, reason="needs Debian's chromium (scripts/setup.sh installs it)")
def test_the_console_check_catches_a_page_error(tmp_path: Path) -> None:
    page = tmp_path / "bad.html"
    page.write_text("<!DOCTYPE html><html><body><p>x</p><script>undefinedFunction();</script></body></html>")
    _, log = render_in_chromium(page, tmp_path / "bad.png", tmp_path)
    assert console_errors(log), log[-2000:]


def test_mutants_json_is_read_and_checked(tmp_path: Path) -> None:
    good = {"schema": "bmoe-ci.mutants/1", "device": "pixel8", "arch": "aarch64", "engine_builds": {},
            "score": {"caught": 11, "total": 12}, "faults": []}
    path = tmp_path / "mutants.json"
    path.write_text(json.dumps(good))
    score = read_mutants(path)
    assert (score.device, score.arch, score.caught, score.total) == ("pixel8", "aarch64", 11, 12)
    for bad, reason in [({**good, "schema": "x"}, "not a bmoe-ci.mutants/1"),
                        ({**good, "score": {"caught": 13, "total": 12}}, "impossible"),
                        ({k: v for k, v in good.items() if k != "score"}, "missing or bad key")]:
        path.write_text(json.dumps(bad))
        with pytest.raises(ReportError, match=reason):
            read_mutants(path)
    path.write_text("{")
    with pytest.raises(ReportError, match=r"mutants\.json: not valid JSON"):
        read_mutants(path)


def test_mutants_fault_option_is_checked_before_anything_runs(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    history = tmp_path / "h"
    assert main(["nightly", "--mutants", "--mutants-fault", "NO_SUCH_FAULT", "--history", str(history)]) == 2
    err = capsys.readouterr().err
    assert "--mutants-fault" in err and "NO_SUCH_FAULT" in err
    assert main(["nightly", "--mutants-fault", "THREAD_ORDER", "--history", str(history)]) == 2
    assert "--mutants-fault needs --mutants" in capsys.readouterr().err
    assert not history.exists()  # nothing ran, nothing recorded


def test_bad_options_are_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    farm = tmp_path / "farm.yaml"
    farm.write_text(f"version: 1\ndevices:\n  - name: host\n    kind: desktop\n    arch: x86_64\n    transport: local\n"
                    f"    workdir: {tmp_path / 'w'}\npools:\n  other: [host]\n")
    assert main(["nightly", "--farm", str(farm), "--history", str(tmp_path / "h")]) == 2
    assert "pool 'nightly' is not defined" in capsys.readouterr().err
    assert main(["nightly", "--farm", str(farm), "--keep", "0"]) == 2
    assert "--keep must be at least 1" in capsys.readouterr().err
    assert main(["nightly", "--farm", str(farm), "--pool", "other", "--flaky-window", "1"]) == 2
    assert "--flaky-window" in capsys.readouterr().err
    assert main(["nightly", "--farm", str(tmp_path / "missing.yaml")]) == 2
    assert "missing.yaml" in capsys.readouterr().err
