"""The substitution rule of docs/policies.md (`--expert-substitute L`, one routing row), in double as
the doc states it, with the engine's portable logarithm as docs/policies.md describes it, so the
prediction is exact to the bit: re-rank the router's scores with every resident expert raised by
L x (max - min), take the top k again."""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass

LN2 = 6.93147180559945286227e-01
SQRT2 = 1.41421356237309504880
MIN_NORMAL = 2.2250738585072014e-308
TWO_54 = 18014398509481984.0


def bm_log(x: float) -> float:
    """docs/policies.md, "The logarithm": m x 2^e with m in [sqrt(1/2), sqrt(2)], log m = 2 atanh(z),
    z = (m-1)/(m+1), by the odd series to z^25 in nested form, plus e x ln 2."""
    if not x > 0.0:
        return -math.inf if x == 0.0 else math.nan
    if x == math.inf:
        return x
    adj = 0
    if x < MIN_NORMAL:
        x *= TWO_54
        adj = -54
    bits = struct.unpack("<Q", struct.pack("<d", x))[0]
    e = ((bits >> 52) & 0x7FF) - 1023 + adj
    m = struct.unpack("<d", struct.pack("<Q", (bits & 0x000FFFFFFFFFFFFF) | 0x3FF0000000000000))[0]
    if m > SQRT2:
        m *= 0.5
        e += 1
    z = (m - 1.0) / (m + 1.0)
    z2 = z * z
    p = 0.0
    for k in range(25, 2, -2):
        p = (p + 1.0 / k) * z2
    logm = 2.0 * z * (1.0 + p)
    return e * LN2 + logm


def key_of(v: float, scores_are_probs: bool) -> float:
    """Step 1: the ranking key of one score (a float32 read exactly into a double)."""
    if math.isnan(v) or not scores_are_probs:
        return v
    return bm_log(v) if v > 0.0 else -math.inf


def finite_range(key: Sequence[float]) -> float:
    """Step 2: max - min over the finite keys; 0 when fewer than two are finite."""
    finite = [v for v in key if math.isfinite(v)]
    return max(finite) - min(finite) if len(finite) >= 2 else 0.0


def top_k(adj: Sequence[float], k: int) -> list[int]:
    """Step 4: the k largest in descending order, ties to the lower id, NaN below everything."""
    out: list[int] = []
    for _ in range(k):
        best = -1
        for e, v in enumerate(adj):
            if e in out:
                continue
            if best < 0 or v > adj[best] or (math.isnan(adj[best]) and not math.isnan(v)):
                best = e
        out.append(best)
    return out


@dataclass(frozen=True)
class SubstResult:
    ids: list[int]  # as executed: the router's own ids (and order) when nothing changed
    substituted: list[int]  # per slot: 1 when its expert is not in the router's set
    examined: int
    changed: int


def subst_row(
    scores: Sequence[float], scores_are_probs: bool, resident: Sequence[bool], router: Sequence[int], L: float
) -> SubstResult:
    k = len(router)
    key = [key_of(v, scores_are_probs) for v in scores]
    margin = L * finite_range(key)
    adj = (
        [v + margin if resident[e] else v for e, v in enumerate(key)]
        if margin != 0.0 and not math.isnan(margin)
        else key
    )
    fresh = top_k(adj, k)
    came_in = [int(e not in router) for e in fresh]
    if not any(came_in):
        return SubstResult(list(router), [0] * k, k, 0)
    return SubstResult(fresh, came_in, k, sum(came_in))
