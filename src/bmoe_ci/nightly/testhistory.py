"""A test's history across nights, per device: what the nightly report shows next to a finding and on
the test's own page (``<run>/_history/<test>.html``).

For each (device, test) of tonight's findings and failures, from the history database: its outcome in
each of the pool's recent runs (the trend's window, tonight last), the last run it passed in (over the
whole history, with that run's engine build), how often it flipped between pass and fail in the window,
and since when it has been failing. Fault nights are marked wherever a run is shown: their outcomes say
nothing about the real engine.

The page directory starts with ``_``, which a device name cannot (docs/farm.md), so it never collides
with a device's results directory.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from bmoe_ci.nightly.history import History, Outcome
from bmoe_ci.reports.evidence import href, safe_name

HISTORY_DIR = "_history"
RECENT = 10  # nights shown next to a finding (the test's page shows the whole window)
MARK = {"pass": "✓", "fail": "✗", "error": "E", "skip": "S", None: "·"}
_FILL = {
    "pass": ("#dafbe1", "#116329"),
    "fail": ("#cf222e", "#ffffff"),
    "error": ("#bc4c00", "#ffffff"),
    "skip": ("#eaeef2", "#57606a"),
    None: ("#ffffff", "#8c959f"),
}
FAULT = "#9a6700"


def page_href(name: str) -> str:
    """The test's page, relative to the run directory."""
    return f"{HISTORY_DIR}/{safe_name(name)}.html"


@dataclass(frozen=True)
class TestHistory:
    """One test on one device across the window's runs (*runs*, oldest first, tonight last)."""

    __test__ = False  # not a pytest test class

    device: str
    name: str
    points: dict[str, Outcome]  # run id -> its outcome, for the runs it ran in
    runs: tuple[str, ...]
    last_pass: Outcome | None  # the last run before tonight in which it passed

    def series(self) -> list[tuple[str, Outcome | None]]:
        return [(rid, self.points.get(rid)) for rid in self.runs]

    @property
    def flips(self) -> int:
        """Pass <-> fail changes between its consecutive verdicts in the window (errors and skips say
        nothing about the engine and are passed over)."""
        verdicts = [p.outcome for _, p in self.series() if p is not None and p.outcome in ("pass", "fail")]
        return sum(1 for a, b in pairwise(verdicts) if a != b)

    @property
    def failing_since(self) -> str | None:
        """The first run of the unbroken failing streak that ends tonight, or None (not failing)."""
        since = None
        for rid, p in reversed(self.series()):
            if p is None or p.outcome != "fail":
                break
            since = rid
        return since

    @property
    def last_failure(self) -> Outcome | None:
        """Its most recent failure in the window before tonight (what a fixed test was failing of)."""
        earlier = [p for rid, p in self.series()[:-1] if p is not None and p.outcome == "fail"]
        return earlier[-1] if earlier else None

    def to_dict(self, recent: int = RECENT) -> dict[str, Any]:
        """What nightly.json keeps of it, next to a finding."""
        last = self.last_pass
        failed = self.last_failure
        return {
            "last_failure": {"run": failed.run, "message": failed.message} if failed else None,
            "recent": [{"run": rid, "outcome": p.outcome if p else None} for rid, p in self.series()[-recent:]],
            "flips": self.flips,
            "last_pass": (
                {"run": last.run, "started": last.started, "engine_build_id": last.engine_build_id} if last else None
            ),
            "history": page_href(self.name),
        }


def collect(
    hist: History, pool: str, run_id: str, keys: list[tuple[str, str]], window: int
) -> dict[tuple[str, str], TestHistory]:
    """The histories of *keys* ((device, test name)) over the last *window* runs of *pool* up to run
    *run_id* (tonight)."""
    if not keys:
        return {}
    runs = (*hist.run_ids(pool, before=run_id)[-(window - 1) :], run_id) if window > 1 else (run_id,)
    names = sorted({name for _, name in keys})
    points = hist.history_of(pool, names, list(runs))
    last = hist.last_passed(pool, names, before=run_id)
    return {
        key: TestHistory(
            device=key[0],
            name=key[1],
            points={p.run: p for p in points.get(key, [])},
            runs=runs,
            last_pass=last.get(key),
        )
        for key in keys
    }


def strip_text(recent: list[dict[str, Any]]) -> str:
    """``✓✓✗`` (oldest first): a finding's recent nights in the markdown."""
    return "".join(MARK.get(r["outcome"], "?") for r in recent)


def strip_html(recent: list[dict[str, Any]], faults: dict[str, tuple[str, ...]], target: str = "") -> str:
    """The recent nights as small coloured boxes (oldest first; a fault night's box has an amber
    frame); each box's tooltip is its run. *target*: where the strip links (the test's page)."""
    boxes = []
    for r in recent:
        fill, colour = _FILL.get(r["outcome"], _FILL[None])
        fault = faults.get(r["run"], ())
        frame = f"border:2px solid {FAULT}" if fault else "border:1px solid #d0d7de"
        title = f"{r['run']}: {r['outcome'] or 'did not run'}" + (
            f" (fault build: {', '.join(fault)})" if fault else ""
        )
        boxes.append(
            f'<span class="night" style="background:{fill};color:{colour};{frame}" title="{html.escape(title)}">'
            f"{MARK.get(r['outcome'], '?')}</span>"
        )
    inner = "".join(boxes)
    return f'<a class="nights" href="{html.escape(href(target))}">{inner}</a>' if target else inner


def last_pass_text(last: dict[str, Any] | None) -> str:
    if not last:
        return "never (in this history)"
    build = f", build {last['engine_build_id']}" if last.get("engine_build_id") else ""
    return f"{last['run']}{build}"


_CSS = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #1f2328; max-width: 80em; }
h1 { font-size: 1.3em; margin-bottom: .2em; } h1 small { font-weight: normal; color: #57606a; font-size: .65em; }
h2 { font-size: 1.05em; margin-top: 1.4em; border-bottom: 1px solid #d0d7de; }
table { border-collapse: collapse; font-size: .85em; } td, th { border: 1px solid #d0d7de; padding: .25em .5em;
  text-align: left; vertical-align: top; } th { background: #f6f8fa; } .note { color: #57606a; }
td.o { text-align: center; font-family: "DejaVu Sans Mono", Menlo, Consolas, monospace; min-width: 2em; }
tr.fault th { color: #9a6700; }
.night { display: inline-block; width: 1.3em; text-align: center; margin-right: 1px; font-size: .85em;
  font-family: "DejaVu Sans Mono", Menlo, Consolas, monospace; }
"""


def render_page(
    name: str,
    histories: list[TestHistory],
    *,
    pool: str,
    run: str,
    started: dict[str, str | None],
    faults: dict[str, tuple[str, ...]],
    evidence: dict[str, str],
    arch: dict[str, str],
) -> str:
    """The page of test *name*: per device its last pass, flips and failing streak, then every night of
    the window (newest first) as a row, a column per device. *evidence*: device -> tonight's evidence
    page (relative to the run directory); *started*/*faults*: per run id."""
    up = "../"
    gate = name.split("[", 1)[0]
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{html.escape(name)}: history, pool {html.escape(pool)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{html.escape(name)} <small>gate {html.escape(gate)}, pool {html.escape(pool)}, "
        f"up to run {html.escape(run)}</small></h1>",
        f'<p><a href="{up}report.html">the night\'s report</a></p>',
        '<h2 id="devices">Per device</h2>',
        "<table><tr><th>device</th><th>tonight</th><th>last pass before tonight</th><th>flips</th>"
        "<th>failing since</th><th>evidence</th></tr>",
    ]
    for h in histories:
        tonight = h.points.get(run)
        word = tonight.outcome if tonight else "did not run"
        fill, colour = _FILL.get(tonight.outcome if tonight else None, _FILL[None])
        last = h.last_pass
        last_text = (
            f"{last.run}" + (f" ({last.started})" if last.started else "") + f", build {last.engine_build_id}"
            if last
            else "never (in this history)"
        )
        ev = evidence.get(h.device)
        ev_cell = f'<a href="{html.escape(up + href(ev))}">evidence</a>' if ev else ""
        reason = f"<br><small>{html.escape(tonight.message)}</small>" if tonight and tonight.message else ""
        out.append(
            f'<tr id="{html.escape(h.device)}"><th>{html.escape(h.device)} <small>{html.escape(arch.get(h.device, ""))}'
            f'</small></th><td style="background:{fill};color:{colour}">{html.escape(word)}{reason}</td>'
            f"<td>{html.escape(last_text)}</td><td>{h.flips}</td><td>{html.escape(h.failing_since or '')}</td>"
            f"<td>{ev_cell}</td></tr>"
        )
    out.append("</table>")
    out.append(
        '<p class="note">flips: changes between pass and fail over the nights below (errors and skips '
        "left out); an amber night was a fault build (an injected engine fault, not the real engine).</p>"
    )
    runs = histories[0].runs if histories else ()
    out.append('<h2 id="nights">Night by night</h2><table><tr><th>run</th><th>started</th>')
    out += [f"<th>{html.escape(h.device)}</th>" for h in histories]
    out.append("<th>engine build</th></tr>")
    for rid in reversed(runs):
        fault = faults.get(rid, ())
        row = [
            f'<tr class="{"fault" if fault else ""}"><th>{html.escape(rid)}'
            + (f"<br><small>fault build: {html.escape(', '.join(fault))}</small>" if fault else "")
            + f"</th><td>{html.escape(started.get(rid) or '')}</td>"
        ]
        builds = set()
        for h in histories:
            p = h.points.get(rid)
            fill, colour = _FILL.get(p.outcome if p else None, _FILL[None])
            title = (p.message or p.outcome) if p else "did not run"
            row.append(
                f'<td class="o" style="background:{fill};color:{colour}" title="{html.escape(title)}">'
                f"{MARK.get(p.outcome if p else None, '?')}</td>"
            )
            if p and p.engine_build_id:
                builds.add(p.engine_build_id)
        row.append(f"<td>{html.escape(', '.join(sorted(builds)))}</td></tr>")
        out.append("".join(row))
    out.append("</table></body></html>")
    return "\n".join(out) + "\n"


__all__ = [
    "HISTORY_DIR",
    "RECENT",
    "TestHistory",
    "collect",
    "last_pass_text",
    "page_href",
    "render_page",
    "strip_html",
    "strip_text",
]
