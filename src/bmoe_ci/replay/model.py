"""The replay: walks a route trace pass by pass (one MoE layer of one token batch) and predicts what
the engine decided and counted, following docs/streaming.md (the cache, the load, prefetch) and
docs/policies.md (the drop rule, the substitution rule).

What it takes from the trace as input: the router's choice (`router_expert`), the final weights
before any drop (`router_weight`), the slot geometry and, where substitution examined a routing, the
router's scores over all experts (`scores`). Everything else (the substitution decisions, residency,
reads, bytes, drops, the weights as applied, every counter) is predicted."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from bmoe_ci.replay.cache import LruCache
from bmoe_ci.replay.config import RunConfig
from bmoe_ci.replay.subst import subst_row
from bmoe_ci.replay.trace import Trace, TraceRow, f32

STREAM_ALIGN = 4096
COUNTERS = (
    "experts_routed",
    "experts_dropped",
    "subst_examined",
    "subst_changed",
    "cache_hits",
    "cache_misses",
    "flash_bytes",
    "flash_reads",
    "prefetch_issued",
    "prefetch_used",
    "weight_routed",
    "weight_dropped",
)


def round_up(n: int, m: int) -> int:
    return (n + m - 1) // m * m


def slot_bytes(trace: Trace) -> dict[int, int]:
    """docs/streaming.md, slot geometry, per MoE layer: each part of the layer's expert gets room for its
    slice at any in-block offset, in a 4096-aligned sub-slot; the slot is the sub-slots together
    rounded up to a page."""
    page = max(trace.page_bytes, STREAM_ALIGN)
    out: dict[int, int] = {}
    for il, parts in trace.part_bytes.items():
        total = sum(round_up(b + STREAM_ALIGN - 1, STREAM_ALIGN) for b in parts if b)
        out[il] = round_up(total or STREAM_ALIGN, page)
    return out


def shared_slot_bytes(slots: dict[int, int], page_bytes: int) -> int:
    """A shared slot (--cache-mb 0) holds any layer's expert: the largest layer's slot, at least a page."""
    return max([*slots.values(), max(page_bytes, STREAM_ALIGN)])


@dataclass(frozen=True)
class RowPrediction:
    row: TraceRow
    expert: int  # what executes (the router's, unless substitution changed it)
    residency: int
    expert_bytes: int
    dropped: int
    substituted: int
    weight: float


@dataclass
class Prediction:
    rows: list[RowPrediction] = field(default_factory=list)
    counters: dict[str, int | float] = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0))
    slot_bytes: dict[int, int] = field(default_factory=dict)  # MoE layer -> its slot
    shared_slot_bytes: int = 0  # with the cache off, else 0
    flash_by_layer: dict[int, list[int]] = field(default_factory=dict)  # MoE layer -> [reads, bytes]
    over_budget_loads: int = 0  # demand loads made while every resident entry was pinned (one layer's
    # working set larger than the budget): the cache's least trodden path
    problems: list[str] = field(default_factory=list)  # rule violations found while replaying


def _passes(rows: list[TraceRow]) -> list[list[TraceRow]]:
    """Consecutive rows of one MoE layer of one token batch (the trace writes layer by layer within a
    batch, token by token, slot by slot; a prompt batch's rows carry each token's position as step)."""
    out: list[tuple[tuple[int, int, int], list[TraceRow]]] = []
    for r in rows:
        key = (r.phase, r.layer, r.step if r.phase == 1 else -1)
        if out and out[-1][0] == key:
            out[-1][1].append(r)
        else:
            out.append((key, [r]))
    return [p for _, p in out]


def drop_row(w: list[float], resident: list[bool], F: float, renorm: bool) -> tuple[list[int], list[float]]:
    """docs/policies.md, drop_row: which slots go, and the weights as applied."""
    k = len(w)
    thr = F / k
    top = -1
    for s in range(k):  # the first maximum in rank order; NaN never the top
        if not math.isnan(w[s]) and (top < 0 or w[s] > w[top]):
            top = s
    top = max(top, 0)
    dropped = [int(s != top and not resident[s] and w[s] < thr) for s in range(k)]
    if not any(dropped):
        return dropped, list(w)
    orig = kept = 0.0
    for s in range(k):
        orig += w[s]
        if not dropped[s]:
            kept += w[s]
    rescale = renorm and math.isfinite(orig) and math.isfinite(kept) and kept > 0.0
    out = [0.0 if dropped[s] else f32(w[s] * (orig / kept)) if rescale else w[s] for s in range(k)]
    return dropped, out


@dataclass
class _Replayer:
    trace: Trace
    cfg: RunConfig
    pred: Prediction
    cache: LruCache | None
    li_of: dict[int, int]
    last: list[list[int]]  # prefetch record: the previous token's experts per streamed layer
    pinned: list[tuple[int, int]] = field(default_factory=list)
    learned: set[int] = field(default_factory=set)  # layers whose weight chain closed once (policies.md)

    def count(self, name: str, n: int | float = 1) -> None:
        self.pred.counters[name] += n

    def read(self, li: int, n: int = 1) -> None:
        """n reads of whole experts of streamed layer li: flash_reads and flash_bytes, in all and per
        layer (each expert its own layer's bytes)."""
        il = self.trace.moe_layers[li]
        nbytes = n * self.trace.expert_bytes[il]
        self.count("flash_reads", n)
        self.count("flash_bytes", nbytes)
        per = self.pred.flash_by_layer.setdefault(il, [0, 0])
        per[0] += n
        per[1] += nbytes

    def unpin_layer(self) -> None:
        if self.cache is not None:
            for key in self.pinned:
                self.cache.unpin(key)
            self.cache.trim()
        self.pinned = []

    def resident(self, li: int, e: int) -> bool:
        return self.cache is not None and (li, e) in self.cache

    def substitute(self, li: int, rows: list[TraceRow], k: int) -> tuple[list[int], list[int]]:
        """The ids that execute and the substituted flags. With substitution armed on a decode pass:
        the rule of docs/policies.md on the scores the trace recorded, against the residency this
        model holds at the decision; otherwise the router's own ids, unflagged."""
        router = [r.router_expert for r in rows]
        if self.cfg.subst_L is None or rows[0].phase != 1:
            return router, [0] * len(rows)
        ids: list[int] = []
        flags: list[int] = []
        resident = [self.resident(li, e) for e in range(self.trace.experts)]
        for t in range(0, len(rows), k):
            scores = rows[t].scores
            if scores is None:
                self.pred.problems.append(
                    f"line {rows[t].line}: step {rows[t].step} layer {rows[t].layer}: "
                    "substitution armed but the routing's scores are not in the trace"
                )
                ids += router[t : t + k]
                flags += [0] * k
                continue
            res = subst_row(scores, self.trace.scores_are_probs, resident, router[t : t + k], self.cfg.subst_L)
            self.count("subst_examined", res.examined)
            self.count("subst_changed", res.changed)
            ids += res.ids
            flags += res.substituted
        return ids, flags

    def prefetch(self, li: int) -> None:
        """docs/streaming.md, --prefetch: the previous token's experts at the next L layers (cyclic)."""
        assert self.cache is not None
        n, depth = len(self.last), min(self.cfg.prefetch, len(self.last))
        round_pins: list[tuple[int, int]] = []
        for d in range(1, depth + 1):
            lj = (li + d) % n
            seen: list[int] = []
            for e in self.last[lj]:
                if e < 0 or e in seen:
                    continue
                seen.append(e)
                key = (lj, e)
                if key not in self.cache:
                    if not self.cache.insert(key, speculative=True):
                        continue  # no room without evicting a pinned entry: skipped
                    self.count("prefetch_issued")
                    self.read(lj)
                self.cache.pin(key)
                round_pins.append(key)
        for key in round_pins:
            self.cache.unpin(key)

    def run_pass(self, rows: list[TraceRow]) -> None:
        k = self.trace.top_k
        layer, phase = rows[0].layer, rows[0].phase
        li = self.li_of[layer]
        eb = {self.li_of[il]: b for il, b in self.trace.expert_bytes.items()}
        self.unpin_layer()  # ffn_moe_logits: a new layer
        self.count("experts_routed", len(rows))
        ids, subst = self.substitute(li, rows, k)  # ffn_moe_topk
        self.last[li] = ids[len(rows) - k :]  # the batch's last token, for prefetch
        # the drop rule at the terminal node: decode, or prefill with --drop-in-prefill, and only on a
        # layer whose chain was learned from an earlier pass (a one-batch prompt is every layer's first)
        weights = [r.router_weight for r in rows]
        dropped = [0] * len(rows)
        applies = phase == 1 or self.cfg.drop_in_prefill
        if self.cfg.drop_F is not None and applies and li in self.learned:
            for t in range(0, len(rows), k):
                w = weights[t : t + k]
                res = [self.resident(li, e) for e in ids[t : t + k]]
                d, w2 = drop_row(w, res, self.cfg.drop_F, self.cfg.renorm)
                routed = gone = 0.0
                for s in range(k):
                    routed += w[s]
                    if d[s]:
                        gone += w[s]
                self.count("weight_routed", routed)
                self.count("weight_dropped", gone)
                dropped[t : t + k], weights[t : t + k] = d, w2
        self.count("experts_dropped", sum(dropped))
        self.learned.add(li)
        # the load: residency per slot before anything loads, then one lookup per unique kept expert
        residency = []
        for e in ids:
            entry = self.cache.entries.get((li, e)) if self.cache is not None else None
            residency.append(0 if entry is None else 2 if entry.prefetched else 1)
        for state in residency:
            self.count("cache_hits" if state else "cache_misses")
        uniq: list[int] = []
        for e, was_dropped in zip(ids, dropped, strict=True):
            if not was_dropped and e not in uniq:
                uniq.append(e)
        charged: set[int] = set()
        if self.cache is None:
            charged = set(uniq)  # shared slots: every executing expert is read again
            self.read(li, len(uniq))
        else:
            for e in uniq:  # hits first: refreshed and pinned before any miss can evict
                key = (li, e)
                if key not in self.cache:
                    continue
                self.cache.touch(key)
                if self.cache.entries[key].prefetched:
                    self.cache.entries[key].prefetched = False
                    self.count("prefetch_used")
                    charged.add(e)  # its speculative read is charged to its first use
                self.cache.pin(key)
                self.pinned.append(key)
            for e in uniq:
                key = (li, e)
                if key in self.cache:
                    continue
                self.cache.insert(key)
                self.cache.pin(key)
                self.pinned.append(key)
                charged.add(e)
                self.read(li)
            if self.cfg.prefetch and phase == 1:
                self.prefetch(li)
        for i, r in enumerate(rows):
            e = ids[i]
            nbytes = 0
            if not dropped[i] and e in charged:
                nbytes = eb[li]
                charged.discard(e)
            self.pred.rows.append(RowPrediction(r, e, residency[i], nbytes, dropped[i], subst[i], weights[i]))


def replay(trace: Trace, cfg: RunConfig) -> Prediction:
    """Every decision and counter of the traced run, predicted."""
    slots = slot_bytes(trace)
    pred = Prediction(
        slot_bytes=slots,
        shared_slot_bytes=shared_slot_bytes(slots, trace.page_bytes) if cfg.cache_mb == 0 else 0,
        flash_by_layer={il: [0, 0] for il in trace.moe_layers},
    )
    li_of = {il: i for i, il in enumerate(trace.moe_layers)}
    cache = LruCache(cfg.budget, {li_of[il]: b for il, b in slots.items()}) if cfg.cache_mb > 0 else None
    r = _Replayer(trace, cfg, pred, cache, li_of, [[] for _ in li_of])
    k = trace.top_k
    for rows in _passes(trace.rows):
        if rows[0].layer not in li_of or len(rows) % k:
            pred.problems.append(
                f"line {rows[0].line}: a pass of {len(rows)} rows at layer {rows[0].layer} "
                f"(top-k {k}, MoE layers {trace.moe_layers})"
            )
            continue
        r.run_pass(rows)
    pred.over_budget_loads = cache.over_budget_loads if cache is not None else 0
    return pred
