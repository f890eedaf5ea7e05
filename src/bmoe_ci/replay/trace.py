"""Reading `--route-trace` files, version 4 (the format is in docs/streaming.md)."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

VERSION_LINE = "# route_trace v4"
COLUMNS = (
    "turn",
    "phase",
    "step",
    "layer",
    "slot",
    "router_expert",
    "expert",
    "router_weight",
    "weight",
    "residency",
    "expert_bytes",
    "dropped",
    "substituted",
    "scores",
)
FLOAT_COLUMNS = frozenset({"router_weight", "weight"})
N_PARTS = 4  # gate, up, gate_up, down: the order of `part_bytes`


class TraceError(ValueError):
    """A trace that does not follow the documented format: one line naming the file, line and key."""


def f32(x: float) -> float:
    """The float32 nearest to x (round to nearest even, as a C cast does), as a Python float."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


@dataclass(frozen=True)
class TraceRow:
    line: int  # 1-based line in the file, for messages
    turn: int
    phase: int
    step: int
    layer: int
    slot: int
    router_expert: int
    expert: int
    router_weight: float  # exactly the float32 the engine printed with %.9g
    weight: float
    residency: int
    expert_bytes: int
    dropped: int
    substituted: int
    scores: tuple[float, ...] | None  # slot 0 of a routing substitution examined: its E scores, as float32


@dataclass
class Trace:
    path: str
    model: str
    arch: str
    layers: int
    experts: int
    top_k: int
    page_bytes: int
    shared_slot_bytes: int  # one shared slot (--cache-mb 0), else 0
    scores_are_probs: bool
    expert_bytes: dict[int, int] = field(default_factory=dict)  # MoE layer -> bytes of one expert
    part_bytes: dict[int, tuple[int, ...]] = field(default_factory=dict)  # MoE layer -> bytes per part
    slot_bytes: dict[int, int] = field(default_factory=dict)  # MoE layer -> one resident expert's slot
    rows: list[TraceRow] = field(default_factory=list)

    @property
    def moe_layers(self) -> list[int]:
        return list(self.expert_bytes)


def _int(value: str, where: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise TraceError(f"{where}: not an integer: {value!r}") from None


def _float32(cell: str, where: str) -> float:
    try:
        return f32(float(cell))
    except ValueError:
        raise TraceError(f"{where}: not a number: {cell!r}") from None


def _scores(cell: str, experts: int, where: str) -> tuple[float, ...] | None:
    """The `scores` cell: empty, or `experts` space-separated floats."""
    if not cell:
        return None
    values = cell.split(" ")
    if len(values) != experts:
        raise TraceError(f"{where}: {len(values)} scores, expected {experts} (one per expert)")
    return tuple(_float32(v, where) for v in values)


def _pairs(body: str, where: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in body.split(" "):
        key, sep, value = item.partition("=")
        if not sep:
            raise TraceError(f"{where}: expected key=value, got {item!r}")
        out[key] = value
    return out


def parse_trace(text: str, path: str = "<trace>") -> Trace:
    lines = text.splitlines()
    if not lines or lines[0] != VERSION_LINE:
        first = lines[0] if lines else ""
        raise TraceError(f"{path}:1: expected {VERSION_LINE!r}, got {first[:60]!r}")
    meta: dict[str, str] = {}
    layer_bytes: dict[int, int] = {}
    parts: dict[int, tuple[int, ...]] = {}
    slots: dict[int, int] = {}
    i = 1
    while i < len(lines) and lines[i].startswith("# "):
        body, where = lines[i][2:], f"{path}:{i + 1}"
        if body.startswith("layer="):
            kv = _pairs(body, where)
            il = _int(kv.get("layer", ""), f"{where}:layer")
            layer_bytes[il] = _int(kv.get("expert_bytes", ""), f"{where}:expert_bytes")
            pb = kv.get("part_bytes", "").split(",")
            if len(pb) != N_PARTS:
                raise TraceError(f"{where}:part_bytes: expected {N_PARTS} values, got {kv.get('part_bytes')!r}")
            parts[il] = tuple(_int(v, f"{where}:part_bytes") for v in pb)
            slots[il] = _int(kv.get("slot_bytes", ""), f"{where}:slot_bytes")
        elif body.startswith("page_bytes="):
            meta.update(_pairs(body, where))
        else:
            key, _, value = body.partition("=")
            meta[key] = value
        i += 1
    for key in ("model", "arch", "layers", "experts", "top_k", "scores_are_probs", "page_bytes", "shared_slot_bytes"):
        if key not in meta:
            raise TraceError(f"{path}:{i}:{key}: missing from the preamble")
    if i >= len(lines) or tuple(lines[i].split(",")) != COLUMNS:
        got = lines[i] if i < len(lines) else "end of file"
        raise TraceError(f"{path}:{i + 1}: expected the header {','.join(COLUMNS)!r}, got {got[:80]!r}")
    t = Trace(
        path=path,
        model=meta["model"],
        arch=meta["arch"],
        layers=_int(meta["layers"], f"{path}:layers"),
        experts=_int(meta["experts"], f"{path}:experts"),
        top_k=_int(meta["top_k"], f"{path}:top_k"),
        page_bytes=_int(meta["page_bytes"], f"{path}:page_bytes"),
        shared_slot_bytes=_int(meta["shared_slot_bytes"], f"{path}:shared_slot_bytes"),
        scores_are_probs=_int(meta["scores_are_probs"], f"{path}:scores_are_probs") != 0,
        expert_bytes=layer_bytes,
        part_bytes=parts,
        slot_bytes=slots,
    )
    for n, line in enumerate(lines[i + 1 :], start=i + 2):
        cells = line.split(",")
        if len(cells) != len(COLUMNS):
            raise TraceError(f"{path}:{n}: {len(cells)} fields, expected {len(COLUMNS)}")
        values: dict[str, int | float | tuple[float, ...] | None] = {}
        for key, cell in zip(COLUMNS, cells, strict=True):
            if key == "scores":
                values[key] = _scores(cell, t.experts, f"{path}:{n}:scores")
            elif key in FLOAT_COLUMNS:
                values[key] = _float32(cell, f"{path}:{n}:{key}")
            else:
                values[key] = _int(cell, f"{path}:{n}:{key}")
        t.rows.append(TraceRow(line=n, **values))  # type: ignore[arg-type]
    return t
