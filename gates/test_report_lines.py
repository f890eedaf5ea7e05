"""G8w-lines: the `moe-drop:` and `moe-subst:` lines of a single-process run carry the replay's counts.

A single-process `bmoe run` prints one line per armed knob at its end (docs/policies.md, "Counters,
lines and the warning"): `moe-drop: <dropped>/<routed> routed experts dropped (<pct>%), threshold <F> x
uniform` and `moe-subst: <changed>/<examined> slots substituted (<pct>%), margin <L> x range`. The
plan's `drop-full` and `subst-full` entries run the same configurations in the batch, with a route
trace that bmoe_ci.replay replays from the documents; here each runs once more as a process of its own
(the batch prints neither line), and its line must be exactly the one the gate writes itself from the
replay's counts: the integers as they are, the percentage with one decimal rounded half up from the
integers (Python's Decimal, not the engine's arithmetic), F and L in the shortest %g that reads back.
"""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

import pytest

from bmoe_ci.gaterun.engine import EngineResult
from bmoe_ci.gaterun.runner import DeviceRunner
from bmoe_ci.replay import RunConfig, Trace, replay
from gates.compare import save
from gates.plan import DROP, SUBST

#: plan entry -> (the knob's flag, the counters of its line, its line's format)
DROP_LINE = "moe-drop: {a}/{b} routed experts dropped ({pct}%), threshold {v} x uniform"
SUBST_LINE = "moe-subst: {a}/{b} slots substituted ({pct}%), margin {v} x range"
LINES = {
    "drop-full": (DROP, "experts_dropped", "experts_routed", DROP_LINE),
    "subst-full": (SUBST, "subst_changed", "subst_examined", SUBST_LINE),
}


def pct_tenths(part: int, whole: int) -> str:
    """100 * part / whole with one decimal, rounded half up; 0/0 is 0.0."""
    if whole == 0:
        return "0.0"
    return str((Decimal(100 * part) / Decimal(whole)).quantize(Decimal("0.1"), rounding=ROUND_HALF_UP))


def shortest_g(value: float) -> str:
    """The shortest %g text that reads back as the value (C's, as config_fmt_real documents it)."""
    for p in range(1, 18):
        text = f"{value:.{p}g}"
        if float(text) == value:
            return text
    return repr(value)


def single_argv(argv: tuple[str, ...]) -> list[str]:
    """The batch entry's command without its route trace (the single run writes none)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a == "--route-trace":
            skip = True
            continue
        out.append(a)
    return out


#: the fixtures it runs on: two engine processes more per fixture, so a few whose lines need rounding up
#: (43/336 -> 12.8, 47/336 -> 14.0, 52/336 -> 15.5), F32 and quantised, rather than all of them; and
#: trained, the release gate's quality fixture, whose verdict on a knob needs every G8w gate there
FIXTURES = ("qwen3moe", "qwen3moe-q4k", "qwen3moe-types", "trained")


@pytest.mark.gate("G8w", "lines")
def test_policy_lines_carry_the_replayed_counts(
    runs: dict[str, EngineResult],
    traces: dict[str, Trace | str],
    runner: DeviceRunner,
    fixture: str,
    artifacts: Path,
) -> None:
    if fixture not in FIXTURES:
        pytest.skip(f"G8w-lines runs on {', '.join(FIXTURES)} only (two more engine processes per fixture)")
    problems: list[str] = []
    singles: dict[str, EngineResult] = {}
    for entry, (flag, top, bottom, fmt) in LINES.items():
        trace = traces.get(entry)
        if trace is None or isinstance(trace, str):
            problems.append(trace or f"{entry}: no route trace to replay")
            continue
        r = runs[entry]
        argv = r.argv
        value = float(argv[argv.index(flag) + 1])
        pred = replay(trace, RunConfig.from_argv(argv)).counters
        a, b = int(pred[top]), int(pred[bottom])
        want = fmt.format(a=a, b=b, pct=pct_tenths(a, b), v=shortest_g(value))
        single = singles[entry] = runner.single(single_argv(argv))
        if not single.ok:
            problems.append(f"{entry} (single process): {single.describe()}")
            continue
        lines = [ln for ln in single.stderr.splitlines() if ln.startswith(("moe-drop:", "moe-subst:"))]
        if lines != [want]:
            problems.append(f"{entry}: stderr's policy lines {lines}, expected exactly [{want!r}] (replayed counts)")
    if problems:
        save(artifacts, **{f"{e}-single": s for e, s in singles.items()})
        raise AssertionError("; ".join(problems) + f" (artifacts in {artifacts})")
