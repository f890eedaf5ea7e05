"""The nightly report's trend chart: pass rate, mutation score and engine time per device over the
recent runs of a pool, against the date each run started.

The pass rate is over what can pass: passed / (passed + failed + errors); a skip (a gate that does not
apply to a fixture) is left out, so a green night reads 100 %. A fault night (an engine built with an
injected fault, `--fault`) is marked: an amber band on both axes and an amber point, so its dip is
never read as the real engine's.

Honest axes: both y axes start at 0 (a pass rate of 96 % drawn from 95 to 100 looks like a collapse),
the rate axis ends at 100 %, and x is the start date, so a gap of three nights without a run shows as a
gap instead of three evenly spaced points.
"""

from __future__ import annotations

import io
import re
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from typing import Any

from bmoe_ci.nightly.history import RunSummary

_RUN_ID_TIME = re.compile(r"^(\d{8}-\d{6})")
FAULT_COLOUR = "#9a6700"  # as a fault build's status cell and banner


def import_matplotlib() -> tuple[Any, Any]:
    """matplotlib's SVG canvas and Figure. Importing matplotlib takes about a second: the nightly calls
    this in a thread while the gate run works, so the report does not wait for it."""
    from matplotlib.backends.backend_svg import FigureCanvasSVG
    from matplotlib.figure import Figure

    return FigureCanvasSVG, Figure


def run_time(run: RunSummary) -> datetime | None:
    """When *run* started, in UTC: its ``started`` (ISO 8601, as the gate suite writes it), else the
    date and time its id begins with (``YYYYMMDD-HHMMSS-...``, local time of the runner, read as UTC),
    else None."""
    if run.started:
        try:
            t = datetime.fromisoformat(run.started)
        except ValueError:
            t = None
        if t is not None:
            return t.astimezone(UTC) if t.tzinfo else t.replace(tzinfo=UTC)
    m = _RUN_ID_TIME.match(run.id)
    if m:
        try:
            return datetime.strptime(m.group(1), "%Y%m%d-%H%M%S").replace(tzinfo=UTC)
        except ValueError:
            return None
    return None


def trend_figure(runs: list[RunSummary]) -> Any | None:
    """The chart of *runs* as a matplotlib Figure with an SVG canvas (two axes: rates, engine time); None
    when no run has a date.

    matplotlib's object API (no pyplot): no global figure state, nothing shown."""
    dated = [(t, r) for r in runs if (t := run_time(r)) is not None]
    if not dated:
        return None
    dated.sort(key=lambda tr: tr[0])
    FigureCanvasSVG, Figure = import_matplotlib()
    from matplotlib.dates import AutoDateLocator, ConciseDateFormatter  # imported with the rest of matplotlib

    fig = Figure(figsize=(9, 5.4))
    fig.subplots_adjust(left=0.08, right=0.98, top=0.93, bottom=0.1, hspace=0.12)  # fixed: layout engines are slow
    FigureCanvasSVG(fig)
    rate_ax, time_ax = fig.subplots(2, 1, sharex=True)
    xs = [t for t, _ in dated]
    rate = [100.0 * r.rate if r.rate is not None else float("nan") for _, r in dated]
    # clip_on=False: a point at exactly 100 % is drawn whole instead of cut in half by the axis' top
    rate_ax.plot(
        xs,
        rate,
        marker="o",
        color="#2da44e",
        label="pass rate % (of the tests that ran; skips left out)",
        clip_on=False,
    )
    faulty = [(t, r) for t, r in dated if r.faults]
    if faulty:
        # a band as wide as a night at most, and narrower than the gap to the nearest other run
        gaps = [b - a for a, b in pairwise(xs) if b > a]
        half = min([timedelta(hours=5), *(0.4 * g for g in gaps)])
        for t, _ in faulty:
            for ax in (rate_ax, time_ax):
                ax.axvspan(t - half, t + half, color=FAULT_COLOUR, alpha=0.25, lw=0)
        rate_ax.plot(
            [t for t, _ in faulty],
            [100.0 * r.rate if r.rate is not None else float("nan") for _, r in faulty],
            marker="D",
            linestyle="none",
            color=FAULT_COLOUR,
            label="fault night (--fault: not the real engine)",
            clip_on=False,
        )
    mut = [100.0 * r.mutation[0] / r.mutation[1] if r.mutation and r.mutation[1] else float("nan") for _, r in dated]
    if any(v == v for v in mut):
        rate_ax.plot(xs, mut, marker="s", linestyle="none", color="#8250df", label="mutation score %", clip_on=False)
    rate_ax.set_ylim(0, 100)
    rate_ax.set_ylabel("%")
    rate_ax.legend(loc="lower left", fontsize=8)
    rate_ax.grid(alpha=0.3)
    span = f"{xs[0]:%Y-%m-%d} to {xs[-1]:%Y-%m-%d}" if xs[0].date() != xs[-1].date() else f"{xs[0]:%Y-%m-%d}"
    rate_ax.set_title(f"last {len(dated)} run(s), {span} (UTC)", fontsize=10)
    devices = sorted({d for _, r in dated for d in r.engine_s})
    for dev in devices:
        time_ax.plot(xs, [r.engine_s.get(dev, float("nan")) for _, r in dated], marker=".", label=dev)
    times = [v for _, r in dated for v in r.engine_s.values() if v == v]
    # from 0, with headroom: the slowest point is drawn whole, not on the frame
    time_ax.set_ylim(0, 1.1 * max(times) if times and max(times) > 0 else 1.0)
    time_ax.set_ylabel("engine s per device")
    time_ax.grid(alpha=0.3)
    if devices:
        time_ax.legend(loc="lower left", fontsize=8, ncols=min(6, len(devices)))
    locator = AutoDateLocator(minticks=3, maxticks=8)
    time_ax.xaxis.set_major_locator(locator)
    time_ax.xaxis.set_major_formatter(ConciseDateFormatter(locator))
    if len(xs) == 1:  # one run: the day around it, rather than matplotlib's arbitrary span
        time_ax.set_xlim(xs[0] - timedelta(hours=12), xs[0] + timedelta(hours=12))
    return fig


def trend_svg(runs: list[RunSummary]) -> str | None:
    """Pass rate, mutation score and engine time per device over *runs* (oldest first), as SVG; None when
    no run has a date."""
    fig = trend_figure(runs)
    if fig is None:
        return None
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None})
    svg = buf.getvalue()
    return svg[svg.index("<svg") :]  # drop the XML prolog and DOCTYPE: the SVG is embedded in HTML
