"""INV: the counters' documented identities, on every run of every plan entry.

Counters are what a user reads to decide how to configure the engine, and identity gates only compare
them between runs. Here each run is held to the identities of docs/streaming.md#counters on its own
(hits + misses == routed, 0 <= prefetch_used <= prefetch_issued, flash_bytes == reads x expert bytes,
subst_changed <= subst_examined, ...) and, when it wrote a route trace, to its trace (bytes, reads,
residencies, drops, substitutions, the routed weight mass, renormalisation's mass and ratios)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bmoe_ci.gaterun.engine import EngineResult
from bmoe_ci.replay import Trace
from gates.compare import counter_invariants, save


@pytest.mark.gate("INV")
def test_counter_invariants(runs: dict[str, EngineResult], traces: dict[str, Trace | str], artifacts: Path) -> None:
    problems: list[str] = []
    checked = 0
    for entry, r in runs.items():
        if not r.ok:
            continue  # a failed run is the verdict of the gate that reads it; it has no counters
        t = traces.get(entry)
        problems += counter_invariants(entry, r, t if isinstance(t, Trace) else None)
        checked += 1
    if checked == 0:
        pytest.fail("no run of the plan completed: no counter could be checked")
    if problems:
        save(artifacts, **{e: runs[e] for e in runs if runs[e].ok})
        raise AssertionError(
            f"{len(problems)} counter invariant(s) violated: "
            + "; ".join(problems[:12])
            + f" (artifacts in {artifacts})"
        )
