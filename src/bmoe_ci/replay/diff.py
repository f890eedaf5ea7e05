"""Field-by-field comparison of what the engine wrote and reported with what the replay predicts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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


def mismatches(
    trace: Trace,
    pred: Prediction,
    counters: Mapping[str, Any],
    flash_by_layer: Sequence[Mapping[str, Any]] | None = None,
) -> list[Mismatch]:
    """Every disagreement: the slot geometry, counters (and, given the result's `flash_by_layer`, each
    MoE layer's reads and bytes), then rows in trace order."""
    out: list[Mismatch] = []
    for il in sorted(set(trace.slot_bytes) | set(pred.slot_bytes)):
        got, want = trace.slot_bytes.get(il), pred.slot_bytes.get(il)
        if got != want:
            out.append(Mismatch(f"preamble layer {il}", "slot_bytes", got, want))
    if trace.shared_slot_bytes != pred.shared_slot_bytes:
        out.append(Mismatch("preamble", "shared_slot_bytes", trace.shared_slot_bytes, pred.shared_slot_bytes))
    for name in COUNTERS:
        if name in counters and counters[name] != pred.counters[name]:
            out.append(Mismatch("counters", name, counters[name], pred.counters[name]))
    if flash_by_layer is not None:
        engine = {int(x["layer"]): [x["flash_reads"], x["flash_bytes"]] for x in flash_by_layer}
        for il in sorted(set(engine) | set(pred.flash_by_layer)):
            got_layer, want_layer = engine.get(il), pred.flash_by_layer.get(il)
            for i, name in enumerate(("flash_reads", "flash_bytes")):
                g = None if got_layer is None else got_layer[i]
                w = None if want_layer is None else want_layer[i]
                if g != w:
                    out.append(Mismatch(f"flash_by_layer layer {il}", name, g, w))
    written = {r.line: r for r in trace.rows}  # the trace as it stands, row by row
    for p in pred.rows:
        r = written.get(p.row.line, p.row)
        for f in ROW_FIELDS:
            got, want = getattr(r, f), getattr(p, f)
            if got != want:
                where = f"phase {r.phase} step {r.step} layer {r.layer} slot {r.slot} (line {r.line})"
                out.append(Mismatch(where, f, got, want))
    return out
