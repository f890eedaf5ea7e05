"""The nightly report, three forms of one content: ``nightly.json`` (machines), ``report.md`` (chat and
e-mail) and ``report.html`` (one self-contained file: inline SVG pictures, inline CSS, no JavaScript),
plus ``<DIR>/index.html`` pointing at the latest run.

Both human forms are rendered from the same list of :class:`Section` built from nightly.json, so they
cannot disagree with it.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bmoe_ci.nightly.history import RunSummary
from bmoe_ci.nightly.trend import import_matplotlib as import_matplotlib  # re-exported: run.py warms it up
from bmoe_ci.nightly.trend import trend_svg
from bmoe_ci.reports.records import atomic_write, write_json
from bmoe_ci.reports.summary import matrix_svg

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


@dataclass(frozen=True)
class Section:
    key: str
    title: str
    note: str
    header: list[str]
    rows: list[list[str]]


def verdict_line(n: dict[str, Any]) -> str:
    """One line: what a reader must know first."""
    if not n["verdicts"]:
        return f"NO VERDICT: {n['no_verdict_reason']}"
    parts = []
    for key, title, _ in CLASSES:
        if n[key]:
            parts.append(f"{len(n[key])} {title.lower()}")
    if n["disagreements"]:
        parts.append(f"{len(n['disagreements'])} cross-device disagreement(s)")
    head = "FAIL" if n["exit_code"] == 1 else "OK"
    t = n["totals"]
    counts = (f"{t['devices']} device(s), {t['tests']} tests: {t['passed']} passed, {t['failed']} failed, "
              f"{t['errors']} errors, {t['skipped']} skipped")
    return f"{head}: {', '.join(parts) if parts else 'nothing new'} ({counts})"


def _finding_row(f: dict[str, Any], key: str) -> list[str]:
    if key == "devices_missing":
        return [f["device"], f["arch"], f["reason"], f["since"] or ""]
    row = [f["device"], f["arch"], f["gate"], f["fixture"], f["name"], f.get("last_outcome") or "new"]
    if key == "still_failing":
        row.append(f.get("since") or "")
    row.append(f.get("message", ""))
    return row


def _finding_header(key: str) -> list[str]:
    if key == "devices_missing":
        return ["device", "arch", "reason", "missing since"]
    head = ["device", "arch", "gate", "fixture", "test", "last time"]
    if key == "still_failing":
        head.append("failing since")
    return [*head, "message"]


def sections(n: dict[str, Any]) -> list[Section]:
    """Every table of the report, from nightly.json content."""
    out = [
        Section(key, f"{title} ({len(n[key])})", note, _finding_header(key), [_finding_row(f, key) for f in n[key]])
        for key, title, note in CLASSES
    ]
    out.append(Section(
        "disagreements", f"Cross-device disagreements ({len(n['disagreements'])})",
        f"devices whose output differs from the others (source: {n['disagreement_source']})",
        ["fixture", "entry", "field", "minority", "values"],
        [[d["fixture"], d["entry"], d["field"], ", ".join(d["minority"]),
          "; ".join(f"{dev}: {v[:12]}" for dev, v in d["values"].items())] for d in n["disagreements"]],
    ))
    out.append(Section(
        "output_changes", f"Outputs changed since the previous run ({len(n['output_changes'])})",
        "expected when the device's engine build changed too; unexpected means the device or toolchain",
        ["device", "arch", "fixture", "entry", "before", "after", "engine build changed"],
        [[c["device"], c["arch"], c["fixture"], c["entry"], c["before"][:12], c["after"][:12],
          "yes (expected)" if c["build_changed"] else "NO (device or toolchain)"] for c in n["output_changes"]],
    ))
    m = n["mutation_score"]
    out.append(Section(
        "mutation_score", "Mutation score",
        "faults built into the engine and caught by the gates, one device per architecture"
        if m else "not measured tonight (run with --mutants)",
        ["device", "arch", "caught", "total"],
        [[d["device"], d["arch"], str(d["caught"]), str(d["total"])] for d in m["devices"]] if m else [],
    ))
    out.append(Section(
        "devices", f"Devices ({len(n['devices'])})", "per-device facts confirmed at preflight, and the session",
        ["device", "arch", "os", "kind", "target", "engine build", "pushed bytes", "engine s", "wall s", "state",
         "junit", "artifacts"],
        [[name, d["arch"], d["os"], d["kind"], d["target"], d["engine_build_id"], str(d["pushed_bytes"]),
          f"{d['engine_s']:.2f}", f"{d['wall_s']:.2f}", d["infra_error"] or "reached", d["junit"],
          d["artifacts"]] for name, d in n["devices"].items()],
    ))
    return out


# ---------------------------------------------------------------------------- markdown


def _md(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def markdown(n: dict[str, Any]) -> str:
    lines = [f"# bmoe-ci nightly {n['run']} (pool {n['pool']})", "", f"**{verdict_line(n)}**", ""]
    lines += [f"Started {n['started'] or '?'}, finished {n['finished'] or '?'}; git {n['git_commit'][:12] or '?'}"
              f"{' (dirty)' if n['git_dirty'] else ''}; exit {n['exit_code']}.", ""]
    if n["verdicts"]:
        lines += ["![device x gate matrix](matrix.svg)", "", f"![trend]({TREND_SVG})", ""]
    for s in sections(n):
        lines += [f"## {s.title}", "", f"_{s.note}_", ""]
        if s.rows:
            lines.append("| " + " | ".join(_md(h) for h in s.header) + " |")
            lines.append("|" + "---|" * len(s.header))
            lines += ["| " + " | ".join(_md(c) for c in row) + " |" for row in s.rows]
            lines.append("")
    lines += ["## Files", "", "- [merged JUnit](junit.xml)", "- [summary](summary.md)",
              "- [nightly.json](nightly.json)", ""]
    return "\n".join(lines)


# ---------------------------------------------------------------------------- HTML

_CSS = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #1f2328; max-width: 80em; }
h1 { font-size: 1.4em; } h2 { font-size: 1.1em; margin-top: 1.6em; border-bottom: 1px solid #d0d7de; }
.verdict { font-size: 1.15em; font-weight: bold; padding: .5em .8em; border-radius: 6px; }
.ok { background: #dafbe1; } .fail { background: #ffebe9; } .none { background: #fff8c5; }
table { border-collapse: collapse; font-size: .85em; } td, th { border: 1px solid #d0d7de; padding: .25em .5em;
text-align: left; vertical-align: top; } th { background: #f6f8fa; } .note { color: #57606a; font-style: italic; }
.empty { color: #57606a; } figure { margin: 1em 0; overflow-x: auto; }
"""


def _link(cell: str) -> str:
    if cell.endswith((".xml", "/")) and not cell.startswith(("http:", "https:")) and ".." not in cell:
        return f'<a href="{html.escape(cell)}">{html.escape(cell)}</a>'
    return html.escape(cell)


def render_html(n: dict[str, Any], matrix: str | None, trend: str | None) -> str:
    klass = "none" if not n["verdicts"] else "fail" if n["exit_code"] == 1 else "ok"
    out = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>bmoe-ci nightly {html.escape(n['run'])}</title><style>{_CSS}</style></head><body>",
        f"<h1>bmoe-ci nightly {html.escape(n['run'])} (pool {html.escape(n['pool'])})</h1>",
        f'<p class="verdict {klass}" id="verdict">{html.escape(verdict_line(n))}</p>',
        f"<p>Started {html.escape(n['started'] or '?')}, finished {html.escape(n['finished'] or '?')}; "
        f"git {html.escape(n['git_commit'][:12] or '?')}{' (dirty)' if n['git_dirty'] else ''}; "
        f"exit {n['exit_code']}. Engine builds: "
        + html.escape(", ".join(f"{t} {b}" for t, b in n["engine_builds"].items()) or "none") + ".</p>",
    ]
    if matrix:
        out.append(f'<h2>Device x gate</h2><figure id="matrix">{matrix}</figure>')
    if trend:
        out.append(f'<h2>Trend</h2><figure id="trend">{trend}</figure>')
    for s in sections(n):
        out.append(f'<h2 id="{s.key}">{html.escape(s.title)}</h2><p class="note">{html.escape(s.note)}</p>')
        if not s.rows:
            out.append('<p class="empty">none</p>')
            continue
        out.append("<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in s.header) + "</tr>")
        out += ["<tr>" + "".join(f"<td>{_link(c)}</td>" for c in row) + "</tr>" for row in s.rows]
        out.append("</table>")
    out.append('<h2>Files</h2><ul><li><a href="junit.xml">merged JUnit</a></li>'
               '<li><a href="summary.md">summary.md</a></li><li><a href="nightly.json">nightly.json</a></li>'
               f'<li><a href="{REPORT_MD}">report.md</a></li></ul>')
    out.append("</body></html>")
    return "\n".join(out) + "\n"


def write_report(run_dir: Path, n: dict[str, Any], summary: dict[str, Any] | None,
                 trend_runs: list[RunSummary]) -> Path:
    """nightly.json, report.md, trend.svg and report.html in *run_dir*; returns the HTML's path."""
    write_json(run_dir / NIGHTLY_JSON, n)
    trend = trend_svg(trend_runs) if trend_runs else None
    if trend:
        atomic_write(run_dir / TREND_SVG, trend.encode("utf-8"))
    atomic_write(run_dir / REPORT_MD, markdown(n).encode("utf-8"))
    # The matrix titled with the nightly's run id (the gate suite's own id is in summary.json).
    matrix = matrix_svg({**summary, "run": n["run"]}) if summary and summary["devices"] else None
    path = run_dir / REPORT_HTML
    atomic_write(path, render_html(n, matrix, trend).encode("utf-8"))
    return path


def write_index(history_dir: Path, latest: Path, runs: list[tuple[str, str]]) -> Path:
    """``<DIR>/index.html``: the latest report, then the earlier runs still on disk (id, verdict)."""
    rel = latest.relative_to(history_dir).as_posix()
    items = "".join(
        f'<li><a href="{html.escape(rid)}/{REPORT_HTML}">{html.escape(rid)}</a>: {html.escape(v)}</li>'
        for rid, v in runs
    )
    body = (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>bmoe-ci nightly: latest</title><style>{_CSS}</style></head><body>"
        f'<h1>bmoe-ci nightly</h1><p>Latest: <a href="{html.escape(rel)}">{html.escape(rel)}</a></p>'
        f"<h2>Runs on disk</h2><ul>{items}</ul></body></html>\n"
    )
    path = history_dir / INDEX_HTML
    atomic_write(path, body.encode("utf-8"))
    return path
