"""REPLAY: the engine's cache and routing policies against an independent model of them.

For every traced plan entry (gates/plan.py), the route trace is replayed by `bmoe_ci.replay`, which
is written from docs/streaming.md and docs/policies.md, not from the engine: from the router's choice
and weights it predicts every slot's residency, read bytes, drop, substitution and applied weight, and
every counter. Any difference is a failure naming the entry, the step, layer, slot, field and both
values. Identity gates compare the engine with itself; this one holds it to the documented rules, so a
bug that changes every configuration the same way (an LRU that never refreshes, a counter off by a
factor) fails here."""

from __future__ import annotations

from pathlib import Path

import pytest

from bmoe_ci.gaterun.engine import EngineResult
from bmoe_ci.replay import RunConfig, Trace, mismatches, replay
from gates.compare import save
from gates.plan import traced_entry

SHOWN = 12  # mismatches quoted in the failure message (all are in the artifacts)


@pytest.mark.gate("REPLAY")
@pytest.mark.entries(where=traced_entry)
def test_engine_matches_the_replay(
    runs: dict[str, EngineResult], traces: dict[str, Trace | str], artifacts: Path
) -> None:
    if not traces:
        pytest.skip("no plan entry of this fixture writes a route trace")
    problems: list[str] = []
    for entry, trace in sorted(traces.items()):
        if isinstance(trace, str):
            problems.append(trace)
            continue
        r = runs[entry]
        pred = replay(trace, RunConfig.from_argv(r.argv))
        problems += [f"{entry}: {p}" for p in pred.problems]
        problems += [f"{entry}: {m}" for m in mismatches(trace, pred, r.data["counters"], r.data["flash_by_layer"])]
    if problems:
        artifacts.mkdir(parents=True, exist_ok=True)
        (artifacts / "replay_mismatches.txt").write_text("\n".join(problems) + "\n")
        save(artifacts, **{e: runs[e] for e in traces})
        raise AssertionError(
            f"{len(problems)} difference(s) from the replay; first: "
            + "; ".join(problems[:SHOWN])
            + f" (all in {artifacts / 'replay_mismatches.txt'})"
        )
