"""The device x gate matrix of the nightly report, as an HTML table and as a few lines of markdown.

matrix.svg (the gate suite's picture) is as wide as its text: with twenty gates and cells like
``FAIL 1/3`` it is wider than a laptop screen. The report's table is built to fit 1280 px instead:
gate names are written vertically, a cell holds a short code whose meaning the legend gives (the full
text is its tooltip), and the colour says the verdict. With many gates and few devices the table is
transposed (gates as rows), so neither dimension grows past the page.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

# More gates than this as columns would not fit 1280 px (a column is about 40 px); the table is then
# transposed when there are fewer devices than gates.
MAX_GATE_COLUMNS = 26

# (verdict, fill, text colour): pale green so a green night is calm, and strong red where it failed.
_STYLE = {
    "pass": ("#dafbe1", "#116329"),
    "fail": ("#cf222e", "#ffffff"),
    "error": ("#bc4c00", "#ffffff"),
    "skip": ("#eaeef2", "#57606a"),
    None: ("#ffffff", "#8c959f"),
}
_FAULT = ("#9a6700", "#ffffff")  # a fault build's status is never green
_STATUS = {"pass": "PASS", "fail": "FAIL", "error": "ERROR", "skip": "SKIP"}
_MARK = {"fail": "✗", "error": "E", "skip": "S"}
NOT_RUN = "-"

MATRIX_CSS = """
.matrix { border-collapse: collapse; font-size: 12px; }
.matrix td, .matrix th { border: 1px solid #d0d7de; padding: 2px 4px; }
.matrix td { text-align: center; font-family: "DejaVu Sans Mono", Menlo, Consolas, monospace; white-space: nowrap;
  min-width: 2.4em; }
.matrix thead th { background: #f6f8fa; vertical-align: bottom; }
.matrix thead th.v span { writing-mode: vertical-rl; transform: rotate(180deg); white-space: nowrap; }
.matrix tbody th { text-align: left; font-weight: 600; max-width: 14em; overflow-wrap: anywhere; }
.matrix tbody th small { display: block; font-weight: normal; color: #57606a; }
.legend { font-size: 12px; color: #57606a; margin: .4em 0 0; }
.legend span.sw { display: inline-block; border: 1px solid #d0d7de; padding: 0 4px; margin: 0 2px 0 8px;
  font-family: "DejaVu Sans Mono", Menlo, Consolas, monospace; }
"""


@dataclass(frozen=True)
class Cell:
    text: str
    verdict: str | None
    title: str
    href: str = ""  # a failed or errored cell: its first failing test's evidence page


def counts_of(d: dict[str, Any], gate: str) -> dict[str, int]:
    """What a cell counts: fixtures (summary.json ``gate_fixtures``; an older summary: its tests)."""
    return (d.get("gate_fixtures") or d["gate_counts"]).get(gate, {})


def linked(c: Cell, d: dict[str, Any], gate: str) -> Cell:
    """*c* with the evidence of its first failing test, and that test's reason in its tooltip."""
    first = (d.get("cells") or {}).get(gate)
    if not first or c.verdict not in ("fail", "error"):
        return c
    more = f" (and {first['tests'] - 1} more)" if first["tests"] > 1 else ""
    reason = f": {first['message']}" if first["message"] else ""
    title = f"{c.title}; {first['test']}{more}{reason}"
    return Cell(c.text, c.verdict, title, first["evidence"])


def cell(counts: dict[str, int]) -> Cell:
    """A gate's outcomes on one device (counted over fixtures) as a short code:
    ``3/3`` three passed; ``2/3`` two passed, one skipped; ``✗1/3`` one of three failed; ``E1/3`` one
    errored; ``S3/3`` all skipped; ``-`` not run. The worst outcome wins (error, fail, pass, skip)."""
    total = sum(counts.values())
    if total == 0:
        return Cell(NOT_RUN, None, "not run")
    verdict = next(o for o in ("error", "fail", "pass", "skip") if counts.get(o))
    n = counts[verdict]
    word = {"pass": "passed", "fail": "failed", "error": "infrastructure error", "skip": "skipped"}[verdict]
    title = f"{n} of {total} fixture(s) {word}"
    if verdict == "pass":
        return Cell(f"{n}/{total}", verdict, title)
    return Cell(f"{_MARK[verdict]}{n}/{total}", verdict, title)


def _status(d: dict[str, Any]) -> Cell:
    title = _STATUS[d["status"]]
    if d.get("faults"):
        title += f" (fault build: {', '.join(d['faults'])})"
    if d.get("infra_error"):
        title += f": {d['infra_error']}"
    return Cell(_STATUS[d["status"]], "fault" if d.get("faults") else d["status"], title, d.get("evidence", ""))


def _td(c: Cell, where: str) -> str:
    fill, colour = _FAULT if c.verdict == "fault" else _STYLE[c.verdict]
    text = html.escape(c.text)
    if c.href:  # one click from the cell to its evidence
        text = f'<a href="{html.escape(quote(c.href))}" style="color:{colour}">{text}</a>'
    return f'<td style="background:{fill};color:{colour}" title="{html.escape(where + ": " + c.title)}">{text}</td>'


def _device_th(name: str, d: dict[str, Any], mixed: bool) -> str:
    """The device's name and arch; *mixed*: only some devices ran a fault build (shards merged), so
    the row says which (when all did, the report's banner says it once)."""
    note = d["arch"] + (" · FAULT BUILD" if mixed and d.get("faults") else "")
    return f"<th>{html.escape(name)}<small>{html.escape(note)}</small></th>"


def transposed(s: dict[str, Any]) -> bool:
    """Gates as rows: when there are too many gates for columns and fewer devices than gates."""
    return len(s["gates"]) > MAX_GATE_COLUMNS and len(s["devices"]) < len(s["gates"])


def matrix_html(s: dict[str, Any]) -> str:
    """The matrix of summary.json *s* as an HTML table, with its legend."""
    gates: list[str] = s["gates"]
    devices: dict[str, Any] = s["devices"]
    grid = {(dev, g): linked(cell(counts_of(d, g)), d, g) for dev, d in devices.items() for g in gates}
    mixed = len({bool(d.get("faults")) for d in devices.values()}) > 1
    out = ['<table class="matrix">']
    if not transposed(s):
        heads = "".join(f'<th class="v"><span>{html.escape(g)}</span></th>' for g in [*gates, "status"])
        out.append(f"<thead><tr><th>device</th>{heads}</tr></thead><tbody>")
        for dev, d in devices.items():
            out.append(
                "<tr>"
                + _device_th(dev, d, mixed)
                + "".join(_td(grid[dev, g], f"{dev} {g}") for g in gates)
                + _td(_status(d), dev)
                + "</tr>"
            )
    else:
        out.append(
            "<thead><tr><th>gate</th>"
            + "".join(f'<th class="v"><span>{html.escape(dev)}</span></th>' for dev in devices)
            + "</tr></thead><tbody>"
        )
        for g in gates:
            out.append(
                f"<tr><th>{html.escape(g)}</th>" + "".join(_td(grid[dev, g], f"{dev} {g}") for dev in devices) + "</tr>"
            )
        out.append("<tr><th>status</th>" + "".join(_td(_status(d), dev) for dev, d in devices.items()) + "</tr>")
    out.append("</tbody></table>")
    swatch = "".join(
        f'<span class="sw" style="background:{_STYLE[v][0]};color:{_STYLE[v][1]}">{html.escape(t)}</span>{w}'
        for v, t, w in (
            ("pass", "3/3", "passed (of fixtures run)"),
            ("pass", "2/3", "passed, the rest skipped"),
            ("fail", "✗1/3", "failed"),
            ("error", "E1/3", "infrastructure error"),
            ("skip", "S3/3", "skipped"),
            (None, NOT_RUN, "not run"),
        )
    )
    out.append(
        '<p class="legend">Cells count fixtures (each once, as the worst of the gate\'s tests on it): '
        f"{swatch}. "
        f'<span class="sw" style="background:{_FAULT[0]};color:{_FAULT[1]}">status</span>'
        "fault build. Hover a cell for its full text; click a failed one for its evidence.</p>"
    )
    return "\n".join(out)


def matrix_markdown(s: dict[str, Any]) -> list[str]:
    """The matrix for chat and e-mail: its size, then only the cells that did not pass (a twenty-column
    table does not fit a chat window)."""
    gates: list[str] = s["gates"]
    devices: dict[str, Any] = s["devices"]
    bad = []
    for dev, d in devices.items():
        for g in gates:
            c = linked(cell(counts_of(d, g)), d, g)
            if c.verdict in ("fail", "error"):
                where = f" ([evidence]({quote(c.href)}))" if c.href else ""
                bad.append(f"- {dev} ({d['arch']}) {g}: {c.title}{where}")
        if d.get("infra_error"):
            bad.append(f"- {dev} ({d['arch']}): {d['infra_error']}")
    head = f"{len(devices)} device(s) x {len(gates)} gate(s)"
    if not bad:
        return [f"{head}: every gate that ran passed on every device."]
    return [f"{head}; not passing:", "", *bad]
