"""The nightly report, three forms of one content: ``nightly.json`` (machines), ``report.md`` (chat and
e-mail) and ``report.html`` (one self-contained file: inline CSS and SVG, no JavaScript), plus
``<DIR>/index.html`` pointing at the latest run.

Both human forms are rendered from the same list of :class:`Section` built from nightly.json, so they
cannot disagree with it. What a person reads at 9 a.m. comes first: a fault build's warning, the
verdict, the commits tested, the device x gate matrix, then only the findings there are (a green night
has no empty tables), the trend, the devices and the files. Every link is relative to the report's
directory, so the folder can be copied or served from anywhere.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote  # an artifact's name may hold [ ] or spaces: a link must still work

from bmoe_ci.nightly.history import RunSummary
from bmoe_ci.nightly.matrix import MATRIX_CSS, matrix_html, matrix_markdown
from bmoe_ci.nightly.testhistory import (
    HISTORY_DIR,
    TestHistory,
    last_pass_text,
    page_href,
    render_page,
    strip_html,
    strip_text,
)
from bmoe_ci.nightly.trend import import_matplotlib as import_matplotlib  # re-exported: run.py warms it up
from bmoe_ci.nightly.trend import trend_svg
from bmoe_ci.reports.evidence import write_evidence
from bmoe_ci.reports.records import DeviceRun, atomic_write, write_json
from bmoe_ci.reports.summary import EVIDENCE_LINKS, counts_text, human_bytes

NIGHTLY_SCHEMA = "bmoe-ci.nightly/1"
NIGHTLY_JSON = "nightly.json"
REPORT_MD = "report.md"
REPORT_HTML = "report.html"
TREND_SVG = "trend.svg"
INDEX_HTML = "index.html"
TREND_RUNS = 30

# The classification lists of nightly.json, in report order: (key, title, what it means).
CLASSES: tuple[tuple[str, str, str], ...] = (
    ("new_failures", "New failures", "failed tonight, did not fail the last time it ran"),
    ("new_errors", "New errors", "infrastructure errors tonight (not engine failures)"),
    ("devices_missing", "Devices missing", "in the pool, gave no verdict tonight"),
    ("flaky", "Flaky", "both outcomes with the same engine build, or alternating, in recent runs"),
    ("still_failing", "Still failing", "failed last time too"),
    ("fixed", "Fixed", "passes tonight, failed the last time it ran"),
)

# The run directory's files the report links to, when they exist: (file, what it is).
FILES: tuple[tuple[str, str], ...] = (
    ("junit.xml", "merged JUnit"),
    ("summary.md", "gate run summary"),
    ("summary.json", "gate run summary, for machines"),
    ("matrix.svg", "device x gate picture"),
    (TREND_SVG, "trend chart"),
    (NIGHTLY_JSON, "this report, for machines"),
)


@dataclass(frozen=True)
class Link:
    text: str
    href: str  # relative to the report's directory


@dataclass(frozen=True)
class Strip:
    """A test's recent nights on one device (nightly.json's ``recent``, oldest first), linking to its
    history page; *faults*: run id -> faults of the fault nights among them."""

    recent: tuple[tuple[str, str | None], ...]  # (run id, outcome or None: did not run)
    href: str
    faults: tuple[tuple[str, tuple[str, ...]], ...] = ()

    @property
    def text(self) -> str:
        return strip_text([{"run": r, "outcome": o} for r, o in self.recent])


Cell = str | Link | Strip | tuple[Link, ...]  # a tuple: several links in one cell (evidence, history)


def cell_text(c: Cell) -> str:
    if isinstance(c, tuple):
        return " ".join(link.text for link in c)
    return c.text if isinstance(c, Link | Strip) else c


def failure_evidence(summary: dict[str, Any] | None) -> dict[tuple[str, str], dict[str, Any]]:
    """Per (device, test name) that failed or errored tonight: its summary.json ``problems`` entry
    (the reason's first line, the evidence page and artifacts, relative to the run directory)."""
    if not summary:
        return {}
    return {(p["device"], p["name"]): p for p in summary.get("problems", [])}


@dataclass(frozen=True)
class Section:
    key: str
    title: str
    note: str
    header: list[str]
    rows: list[list[Cell]]


def fault_warning(n: dict[str, Any]) -> str | None:
    """What a fault build's report says first, or None for the real engine."""
    faults = n.get("faults") or []
    if not faults:
        return None
    return (
        f"FAULT BUILD: the engine tonight was built with the fault(s) {', '.join(faults)} injected "
        "(--fault). These results rehearse the pipeline; they say nothing about the real engine."
    )


def verdict_line(n: dict[str, Any]) -> str:
    """One line: what a reader must know first (also the index's line for this run)."""
    built = f" (FAULT BUILD: {', '.join(n['faults'])})" if n.get("faults") else ""
    if not n["verdicts"]:
        return f"NO VERDICT{built}: {n['no_verdict_reason']}"
    parts = []
    for key, title, _ in CLASSES:
        if n[key]:
            parts.append(f"{len(n[key])} {title.lower()}")
    if n["disagreements"]:
        parts.append(f"{len(n['disagreements'])} cross-device disagreement(s)")
    head = "FAIL" if n["exit_code"] == 1 else "OK"
    counts = counts_text(n["totals"])
    return f"{head}{built}: {', '.join(parts) if parts else 'nothing new'} ({counts})"


def _short(commits: str) -> str:
    """Commit ids shortened to 7 characters (a merged report joins its shards' commits with commas)."""
    return ",".join(c[:7] for c in commits.split(",")) if commits else "?"


def commit_line(n: dict[str, Any]) -> str:
    """The commits this night tested, against the previous night of the pool (``commit_range``)."""
    dirty = " with uncommitted changes" if n.get("git_dirty") else ""
    if "commit_range" not in n:  # a nightly.json written before the range was recorded, or a merge of shards
        return f"git {_short(n['git_commit'])}{dirty}"
    r = n["commit_range"]
    if r is None:
        return f"git {_short(n['git_commit'])}{dirty}: first night of pool {n['pool']}, nothing earlier to compare with"
    prev, old, new, count = r["previous_run"], r["from"], r["to"], r.get("count")
    if not old or not new:
        return f"git {_short(new)}{dirty}; the previous night ({prev}) has no recorded commit"
    if old == new:
        return f"git {_short(new)}{dirty}: no new commits since the previous night ({prev})"
    counted = f" ({count} commit{'' if count == 1 else 's'})" if count is not None else ""
    return f"commits {_short(old)}..{_short(new)}{counted}{dirty} since the previous night ({prev})"


def _finding_row(f: dict[str, Any], key: str, faults: dict[str, tuple[str, ...]]) -> list[Cell]:
    if key == "devices_missing":
        return [f["device"], f["arch"], f["reason"], f["since"] or ""]
    row: list[Cell] = [f"{f['device']} ({f['arch']})", f["name"], f.get("last_outcome") or "new"]
    if key == "still_failing":
        row.append(f.get("since") or "")
    message = f.get("message", "")
    if not message and f.get("last_failure") and f["last_failure"].get("message"):  # a fixed test: what it was
        message = f"was ({f['last_failure']['run']}): {f['last_failure']['message']}"
    row.append(message)
    if "recent" in f:  # the test's history (a nightly.json of an older bmoe-ci has none)
        recent = tuple((r["run"], r["outcome"]) for r in f["recent"])
        marked = tuple((r, faults[r]) for r, _ in recent if r in faults)
        row += [Strip(recent, f.get("history", ""), marked), last_pass_text(f.get("last_pass")), str(f["flips"])]
    links = tuple(
        Link(text, f[field]) for text, field in (("evidence", "evidence"), ("history", "history")) if f.get(field)
    )
    return [*row, links] if links else row


def _finding_header(key: str, f: dict[str, Any] | None) -> list[str]:
    if key == "devices_missing":
        return ["device", "arch", "reason", "missing since"]
    head = ["device", "test", "last time"]
    if key == "still_failing":
        head.append("failing since")
    head.append("reason")
    if f is not None and "recent" in f:
        head += [f"last {len(f['recent'])} nights", "last pass before", "flips"]
    if f is not None and (f.get("evidence") or f.get("history")):
        head.append("links")
    return head


def _device_links(name: str, d: dict[str, Any]) -> list[Cell]:
    junit: Cell = Link("junit.xml", d["junit"]) if d.get("junit") else ""
    files: Cell = Link(f"{name}/", d["artifacts"]) if d.get("artifacts") else ""
    return [junit, files]


def _finding_section(n: dict[str, Any], key: str, title: str, note: str) -> Section:
    faults = {r: tuple(f) for r, f in (n.get("fault_runs") or {}).items()}
    rows = [_finding_row(f, key, faults) for f in n[key]]
    width = max((len(r) for r in rows), default=0)
    widest = next((f for f, r in zip(n[key], rows, strict=True) if len(r) == width), None)
    header = _finding_header(key, widest)
    rows = [[*r, *([""] * (len(header) - len(r)))] for r in rows]  # a row without links: empty cells
    return Section(key, f"{title} ({len(n[key])})", note, header, rows)


def annotate(n: dict[str, Any], summary: dict[str, Any] | None, histories: dict[tuple[str, str], TestHistory]) -> None:
    """Give each finding of nightly.json *n* what a reader needs next to it: the first line of its
    reason (as summary.json says it), its evidence page, and its history (recent nights, last pass,
    flips, its history page). Also ``fault_runs``: the fault nights among the runs shown."""
    evidence = failure_evidence(summary)
    runs: set[str] = set()
    for key, _, _ in CLASSES:
        if key == "devices_missing":
            continue
        for f in n[key]:
            problem = evidence.get((f["device"], f["name"]))
            if problem is not None:
                f["message"] = problem["message"]
                f["evidence"] = problem["evidence"]
            h = histories.get((f["device"], f["name"]))
            if h is not None:
                f.update(h.to_dict())
                runs.update(r["run"] for r in f["recent"])
    n["fault_runs"] = {
        rid: list(p.faults)
        for h in histories.values()
        for rid, p in h.points.items()
        if p.faults and (rid in runs or not runs)
    }


def sections(n: dict[str, Any]) -> list[Section]:
    """The report's tables from nightly.json content, in report order; a table with nothing to say is
    left out (a green night is short). A finding links its evidence and its history when nightly.json
    has them (:func:`annotate`)."""
    out = [_finding_section(n, key, title, note) for key, title, note in CLASSES]
    out.append(
        Section(
            "disagreements",
            f"Cross-device disagreements ({len(n['disagreements'])})",
            f"devices whose output differs from the others (source: {n['disagreement_source']})",
            ["fixture", "entry", "field", "minority", "values"],
            [
                [
                    d["fixture"],
                    d["entry"],
                    d["field"],
                    ", ".join(d["minority"]),
                    "; ".join(f"{dev}: {v[:12]}" for dev, v in d["values"].items()),
                ]
                for d in n["disagreements"]
            ],
        )
    )
    out.append(
        Section(
            "output_changes",
            f"Outputs changed since the previous run ({len(n['output_changes'])})",
            "expected when the device's engine build changed too; unexpected means the device or toolchain",
            ["device", "arch", "fixture", "entry", "before", "after", "engine build changed"],
            [
                [
                    c["device"],
                    c["arch"],
                    c["fixture"],
                    c["entry"],
                    c["before"][:12],
                    c["after"][:12],
                    "yes (expected)" if c["build_changed"] else "NO (device or toolchain)",
                ]
                for c in n["output_changes"]
            ],
        )
    )
    m = n["mutation_score"]
    if m:
        out.append(
            Section(
                "mutation_score",
                f"Mutation score ({m['caught']}/{m['total']})",
                "faults built into the engine and caught by the gates, one device per architecture",
                ["device", "arch", "caught", "total"],
                [[d["device"], d["arch"], str(d["caught"]), str(d["total"])] for d in m["devices"]],
            )
        )
    if n.get("mutation_problem"):
        out.append(
            Section(
                "mutation_problem",
                "Mutation score incomplete",
                "with --mutants: devices without a score",
                ["problem"],
                [[p] for p in n["mutation_problem"].split("; ")],
            )
        )
    out.append(
        Section(
            "devices",
            f"Devices ({len(n['devices'])})",
            "per-device facts confirmed at preflight, and the session",
            [
                "device",
                "arch",
                "os",
                "kind",
                "target",
                "engine build",
                "pushed",
                "engine s",
                "wall s",
                "state",
                "junit",
                "results",
            ],
            [
                [
                    name,
                    d["arch"],
                    d["os"],
                    d["kind"],
                    d["target"],
                    d["engine_build_id"],
                    human_bytes(d["pushed_bytes"]),
                    f"{d['engine_s']:.2f}",
                    f"{d['wall_s']:.2f}",
                    d["infra_error"] or "reached",
                    *_device_links(name, d),
                ]
                for name, d in n["devices"].items()
            ],
        )
    )
    return [s for s in out if s.rows]


def _split(n: dict[str, Any]) -> tuple[list[Section], list[Section]]:
    """(findings, devices): the trend chart goes between them."""
    all_ = sections(n)
    return [s for s in all_ if s.key != "devices"], [s for s in all_ if s.key == "devices"]


# ---------------------------------------------------------------------------- markdown


def _md(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def md_cell(c: Cell) -> str:
    """One table cell of report.md."""
    if isinstance(c, tuple):
        return " ".join(md_cell(link) for link in c)
    if isinstance(c, Strip):
        return f"[{c.text}]({quote(c.href)})" if c.href else c.text
    return f"[{_md(c.text)}]({quote(c.href)})" if isinstance(c, Link) else _md(c)


def _md_section(s: Section) -> list[str]:
    lines = [f"## {s.title}", "", f"_{s.note}_", ""]
    lines.append("| " + " | ".join(_md(h) for h in s.header) + " |")
    lines.append("|" + "---|" * len(s.header))
    lines += ["| " + " | ".join(md_cell(c) for c in row) + " |" for row in s.rows]
    return [*lines, ""]


def markdown(n: dict[str, Any], summary: dict[str, Any] | None = None, files: Sequence[str] = ()) -> str:
    """report.md; *files*: the run directory's files (names of :data:`FILES`) that exist, to link."""
    lines = [f"# bmoe-ci nightly {n['run']} (pool {n['pool']})", ""]
    warning = fault_warning(n)
    if warning:
        lines += [f"> **{warning}**", ""]
    lines += [f"**{verdict_line(n)}**", ""]
    lines += [
        f"{commit_line(n)}. Started {n['started'] or '?'}, finished {n['finished'] or '?'}; exit {n['exit_code']}.",
        "",
    ]
    if summary and summary["devices"]:
        lines += ["## Device x gate", "", *matrix_markdown(summary), ""]
    findings, devices = _split(n)
    for s in findings:
        lines += _md_section(s)
    for s in devices:
        lines += _md_section(s)
    links = [f"- [{label}]({name})" for name, label in FILES if name in files]
    if links:
        lines += ["## Files", "", *links, ""]
    return "\n".join(lines)


# ---------------------------------------------------------------------------- HTML

#: The nightly pages' style, also the release gate's report's (bmoe_ci.release.report): keep its classes
#: (.empty, .verdict, ...).
REPORT_CSS = (
    """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #1f2328; max-width: 80em; }
h1 { font-size: 1.4em; margin-bottom: .2em; } h1 small { font-weight: normal; color: #57606a; font-size: .6em; }
h2 { font-size: 1.1em; margin-top: 1.6em; border-bottom: 1px solid #d0d7de; }
.verdict { font-size: 1.15em; font-weight: bold; padding: .5em .8em; border-radius: 6px; }
.ok { background: #dafbe1; } .fail { background: #ffebe9; } .none { background: #fff8c5; }
.fault { font-size: 1.2em; font-weight: bold; padding: .7em .9em; border-radius: 6px; background: #9a6700;
  color: #ffffff; border: 3px dashed #4d2d00; }
table { border-collapse: collapse; font-size: .85em; max-width: 100%; }
td, th { border: 1px solid #d0d7de; padding: .25em .5em; text-align: left; vertical-align: top;
  overflow-wrap: break-word; }
table.findings th { white-space: nowrap; }
/* the reason (or the last column) may break a long word anywhere, so the table fits the page; the
   other columns keep their words whole instead of being squeezed to a letter or two */
table.findings td.reason, table.findings td:last-child { overflow-wrap: anywhere; min-width: 12em; }
table.findings td.reason { min-width: 18em; }
table.findings td.links { white-space: nowrap; min-width: 0; }
.nights { text-decoration: none; white-space: nowrap; }
.night { display: inline-block; width: 1.25em; text-align: center; margin-right: 1px; font-size: .85em;
  font-family: "DejaVu Sans Mono", Menlo, Consolas, monospace; border-radius: 2px; }
th { background: #f6f8fa; } .note { color: #57606a; font-style: italic; } .empty { color: #57606a; }
figure { margin: 1em 0; overflow-x: auto; } figure svg { max-width: 100%; height: auto; }
"""
    + MATRIX_CSS
)


def _html_cell(c: Cell) -> str:
    if isinstance(c, tuple):
        return " ".join(_html_cell(link) for link in c)
    if isinstance(c, Strip):
        return strip_html([{"run": r, "outcome": o} for r, o in c.recent], dict(c.faults), c.href)
    if isinstance(c, Link):
        return f'<a href="{html.escape(quote(c.href))}">{html.escape(c.text)}</a>'
    return html.escape(c)


_CLASS = {"reason": ' class="reason"', "message": ' class="reason"', "links": ' class="links"'}


def _html_section(s: Section) -> list[str]:
    out = [
        f'<h2 id="{s.key}">{html.escape(s.title)}</h2><p class="note">{html.escape(s.note)}</p>',
        '<table class="findings"><tr>' + "".join(f"<th>{html.escape(h)}</th>" for h in s.header) + "</tr>",
    ]
    klass = [_CLASS.get(h, "") for h in s.header]
    out += [
        "<tr>" + "".join(f"<td{k}>{_html_cell(c)}</td>" for k, c in zip(klass, row, strict=True)) + "</tr>"
        for row in s.rows
    ]
    return [*out, "</table>"]


def render_html(n: dict[str, Any], summary: dict[str, Any] | None, trend: str | None, files: Sequence[str] = ()) -> str:
    """report.html; *summary*: the gate run's summary.json (for the matrix); *trend*: the chart's SVG;
    *files*: the run directory's files (names of :data:`FILES`) that exist, to link."""
    klass = "none" if not n["verdicts"] else "fail" if n["exit_code"] == 1 else "ok"
    head = "NO VERDICT" if not n["verdicts"] else "FAIL" if n["exit_code"] == 1 else "OK"
    if n.get("faults"):
        head = f"FAULT BUILD {head}"
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{html.escape(head)}: bmoe-ci nightly {html.escape(n['pool'])} {html.escape(n['run'])}</title>"
        f"<style>{REPORT_CSS}</style></head><body>",
        f"<h1>bmoe-ci nightly, pool {html.escape(n['pool'])} <small>run {html.escape(n['run'])}</small></h1>",
    ]
    warning = fault_warning(n)
    if warning:
        out.append(f'<p class="fault" id="fault">{html.escape(warning)}</p>')
    out += [
        f'<p class="verdict {klass}" id="verdict">{html.escape(verdict_line(n))}</p>',
        f'<p id="commits">{html.escape(commit_line(n))}. Started {html.escape(n["started"] or "?")}, finished '
        f"{html.escape(n['finished'] or '?')}; exit {n['exit_code']}. Engine builds: "
        + html.escape(", ".join(f"{t} {b}" for t, b in n["engine_builds"].items()) or "none")
        + ".</p>",
    ]
    if summary and summary["devices"]:
        out.append(f'<h2>Device x gate</h2><figure id="matrix">{matrix_html(summary)}</figure>')
    findings, devices = _split(n)
    for s in findings:
        out += _html_section(s)
    if trend:
        out.append(f'<h2>Trend</h2><figure id="trend">{trend}</figure>')
    for s in devices:
        out += _html_section(s)
    links = [
        f'<li><a href="{html.escape(name)}">{html.escape(label)}</a> ({html.escape(name)})</li>'
        for name, label in FILES
        if name in files
    ]
    out.append(
        f'<h2 id="files">Files</h2><ul>{"".join(links)}<li><a href="{REPORT_MD}">this report, as '
        f"markdown</a> ({REPORT_MD})</li></ul>"
    )
    out.append("</body></html>")
    return "\n".join(out) + "\n"


def write_test_pages(
    run_dir: Path,
    n: dict[str, Any],
    summary: dict[str, Any] | None,
    histories: dict[tuple[str, str], TestHistory],
    started: dict[str, str | None],
) -> list[str]:
    """One page per test of *histories* (``_history/<test>.html``): its history per device across the
    window's nights; returns the pages written (relative to *run_dir*)."""
    by_name: dict[str, list[TestHistory]] = {}
    for (_, name), h in sorted(histories.items()):
        by_name.setdefault(name, []).append(h)
    evidence = failure_evidence(summary)
    faults = {rid: p.faults for hs in by_name.values() for h in hs for rid, p in h.points.items() if p.faults}
    arch = {d: v.get("arch", "") for d, v in (summary or {}).get("devices", {}).items()}
    pages = []
    for name, hs in by_name.items():
        page = page_href(name)
        text = render_page(
            name,
            hs,
            pool=n["pool"],
            run=n["run"],
            started=started,
            faults=faults,
            evidence={h.device: evidence[(h.device, name)]["evidence"] for h in hs if (h.device, name) in evidence},
            arch=arch,
        )
        atomic_write(run_dir / page, text.encode("utf-8"))
        pages.append(page)
    return pages


def write_report(
    run_dir: Path,
    n: dict[str, Any],
    summary: dict[str, Any] | None,
    trend_runs: list[RunSummary],
    *,
    runs: list[DeviceRun] | None = None,
    histories: dict[tuple[str, str], TestHistory] | None = None,
) -> Path:
    """nightly.json, report.md, trend.svg and report.html in *run_dir*; returns the HTML's path. With
    *histories* (:func:`bmoe_ci.nightly.testhistory.collect`), each finding carries its history and
    every test of them gets its page; with *runs* (the gate run's devices), every failure's evidence
    page is written again with links to this report and to the test's history."""
    if histories:
        annotate(n, summary, histories)
        started = {r.id: r.started for r in trend_runs}
        write_test_pages(run_dir, n, summary, histories, started)
    elif summary is not None:
        annotate(n, summary, {})
    write_json(run_dir / NIGHTLY_JSON, n)
    trend = trend_svg(trend_runs) if trend_runs else None
    if trend:
        atomic_write(run_dir / TREND_SVG, trend.encode("utf-8"))
    files = [name for name, _ in FILES if (run_dir / name).is_file()]
    atomic_write(run_dir / REPORT_MD, markdown(n, summary, files).encode("utf-8"))
    path = run_dir / REPORT_HTML
    atomic_write(path, render_html(n, summary, trend, files).encode("utf-8"))
    if runs is not None:
        links = (*EVIDENCE_LINKS, ("this test's history", f"{HISTORY_DIR}/{{name}}.html"))
        write_evidence(run_dir, n["run"], [r for run in runs for r in run.reported_records()], links)
    return path


def write_index(history_dir: Path, latest: Path, runs: list[tuple[str, str]]) -> Path:
    """``<DIR>/index.html``: the latest report, then the earlier runs still on disk (id, verdict)."""
    rel = latest.relative_to(history_dir).as_posix()
    items = "".join(
        f'<li><a href="{html.escape(rid)}/{REPORT_HTML}">{html.escape(rid)}</a>: {html.escape(v)}</li>'
        for rid, v in runs
    )
    body = (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>bmoe-ci nightly: latest</title><style>{REPORT_CSS}</style></head><body>"
        f'<h1>bmoe-ci nightly</h1><p>Latest: <a href="{html.escape(rel)}">{html.escape(rel)}</a></p>'
        f"<h2>Runs on disk</h2><ul>{items}</ul></body></html>\n"
    )
    path = history_dir / INDEX_HTML
    atomic_write(path, body.encode("utf-8"))
    return path
