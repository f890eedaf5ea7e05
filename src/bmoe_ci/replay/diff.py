"""Field-by-field comparison of what the engine wrote and reported with what the replay predicts."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bmoe_ci.replay.model import COUNTERS, Prediction
from bmoe_ci.replay.trace import Trace

ROW_FIELDS = ("expert", "residency", "expert_bytes", "dropped", "substituted", "weight")


@dataclass(frozen=True)
class Mismatch:
    where: str  # "counters", or "phase P step S layer L slot K (line N)"
    field: str
    engine: Any
    replay: Any

    def __str__(self) -> str:
        return f"{self.where}: {self.field}: engine {self.engine!r}, replay {self.replay!r}"


def mismatches(trace: Trace, pred: Prediction, counters: Mapping[str, Any]) -> list[Mismatch]:
    """Every disagreement, counters first, then rows in trace order."""
    out: list[Mismatch] = []
    if trace.slot_bytes != pred.slot_bytes:
        out.append(Mismatch("preamble", "slot_bytes", trace.slot_bytes, pred.slot_bytes))
    for name in COUNTERS:
        if name in counters and counters[name] != pred.counters[name]:
            out.append(Mismatch("counters", name, counters[name], pred.counters[name]))
    written = {r.line: r for r in trace.rows}  # the trace as it stands, row by row
    for p in pred.rows:
        r = written.get(p.row.line, p.row)
        for f in ROW_FIELDS:
            got, want = getattr(r, f), getattr(p, f)
            if got != want:
                where = f"phase {r.phase} step {r.step} layer {r.layer} slot {r.slot} (line {r.line})"
                out.append(Mismatch(where, f, got, want))
    return out
