"""Statistics of an A/B: tok/s from per-token decode times, and a bootstrap confidence interval of the
B/A speed ratio with a fixed seed (the same cells give the same interval, byte for byte)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

DEFAULT_SEED = 20261201
DEFAULT_RESAMPLES = 2000


def tok_s(step_s: Sequence[float]) -> float:
    """Decode speed of one cell: evaluated decode steps over their summed wall time."""
    total = float(sum(step_s))
    return len(step_s) / total if total > 0 else 0.0


@dataclass(frozen=True)
class RatioCI:
    """``ratio`` = mean tok/s of B over mean tok/s of A; [``low``, ``high``] its two-sided interval at
    ``confidence`` from ``resamples`` bootstrap resamples of the cells (``seed`` fixed)."""

    ratio: float
    low: float
    high: float
    confidence: float
    resamples: int
    seed: int

    def to_dict(self) -> dict[str, float | int]:
        return {
            "ratio": self.ratio,
            "low": self.low,
            "high": self.high,
            "confidence": self.confidence,
            "resamples": self.resamples,
            "seed": self.seed,
        }


def ratio_ci(
    a: Sequence[float],
    b: Sequence[float],
    *,
    confidence: float = 0.9,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
) -> RatioCI:
    """Bootstrap over cells: each resample draws len(a) of A's cells and len(b) of B's with replacement
    (a cell is one engine run, so the warm-up inside a run stays with it) and takes the ratio of means;
    the interval is the percentile interval. Needs at least one cell with a speed on each side."""
    xa, xb = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if xa.size == 0 or xb.size == 0 or xa.mean() <= 0:
        raise ValueError("a speed ratio needs at least one timed cell of each configuration")
    rng = np.random.default_rng(seed)
    ia = rng.integers(0, xa.size, size=(resamples, xa.size))
    ib = rng.integers(0, xb.size, size=(resamples, xb.size))
    ra = xa[ia].mean(axis=1)
    rb = xb[ib].mean(axis=1)
    ratios = np.where(ra > 0, rb / np.where(ra > 0, ra, 1.0), np.inf)
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(ratios, [tail, 1.0 - tail])
    return RatioCI(
        ratio=float(xb.mean() / xa.mean()),
        low=float(low),
        high=float(high),
        confidence=confidence,
        resamples=resamples,
        seed=seed,
    )
