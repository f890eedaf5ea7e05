"""Whether an engine run agrees with the reference: the one rule the REF gate and the project's tests
apply (docs/model-math.md, "Activation quantisation").

Logit rows must be within a relative tolerance of the reference's and the greedy tokens equal, with one
allowance: where the matmul inputs are rounded to 8-bit blocks (Q8_0, Q8_K), a scaled value that comes
within QUANT_FLIP quantisation steps of a rounding boundary may round one way in the engine (float32)
and the other in the reference (float64). From that position on both are right and differ by about one
quantum; so the first row beyond the tolerance is accepted when such a near-tie happened at or before
it (never at row 0: the first position has nothing before it to explain a kernel bug), and the rows and
tokens after it are not compared. Every row before it is held to the tolerance.

    a = agreement(len(prompt), ref_tokens, ref_rows, quant_margins, engine_tokens, engine_rows, tol)
    assert a.ok, a.message
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

#: A scaled activation closer than this to a rounding boundary (in quantisation steps) may round the other
#: way in the engine: the engine's f32 activations and the reference's float64 ones differ by ~1e-7
#: relative, ~1e-5 steps on a scaled value near 127 and more after a few layers (flips measured at
#: margins up to 5e-5 on the K-quant fixtures, none above).
QUANT_FLIP = 1e-4
#: The same for llama.cpp against the reference: its float noise is larger (approximate expf in softmax and
#: SiLU, FMA, its own summation orders; ~3e-7 relative on a matmul output), and a reference whose matmul
#: outputs were moved by 3e-7 relative flips at margins up to 1.7e-4 (measured on llama.cpp's 128-wide
#: Q2_K mix of the qwen3moe recipe, where llama.cpp does flip there).
QUANT_FLIP_LLAMA_CPP = 1e-3


@dataclass(frozen=True)
class Agreement:
    ok: bool
    rows_compared: int  # logit rows held to the tolerance
    worst_rel: float  # the worst relative error among them
    flip_row: int | None  # the first row beyond the tolerance, accepted as a rounding flip
    tokens_compared: int  # generated tokens that had to be equal
    message: str


def _rel(rows: np.ndarray, ref: np.ndarray) -> np.ndarray:
    err = np.abs(rows.astype(np.float64) - ref).max(axis=1)
    return err / np.maximum(np.abs(ref).max(axis=1), 1e-30)


def agreement(
    n_prompt: int,
    ref_tokens: Sequence[int],
    ref_rows: np.ndarray,
    quant_margins: Sequence[float],
    tokens: Sequence[int],
    rows: np.ndarray,
    tol: float,
    flip_margin: float = QUANT_FLIP,
) -> Agreement:
    """ref_rows: the reference's logits of the first positions (any number); rows: the engine's (at
    least as many); quant_margins: the reference's per position (Generation.quant_margins); flip_margin:
    how close to a boundary a rounding may flip (QUANT_FLIP for the engine, QUANT_FLIP_LLAMA_CPP for
    llama.cpp)."""
    n = min(len(ref_rows), len(rows))
    rel = _rel(rows[:n], ref_rows[:n]) if n else np.zeros(0)
    bad_rows = np.nonzero(~(rel <= tol))[0]  # NaN is bad too
    flip = int(bad_rows[0]) if len(bad_rows) else None
    if flip is not None and (flip == 0 or _near_tie(quant_margins, flip, flip_margin) is None):
        why = "" if flip == 0 else f"; no activation rounding came within {flip_margin:g} of a boundary before it"
        msg = f"logits of position {flip} differ from the reference by {rel[flip]:.3g} (relative), above {tol:g}"
        return Agreement(False, n, float(rel[flip]), None, 0, msg + why)
    limit = n if flip is None else flip  # rows held to the tolerance
    worst = float(np.max(rel[:limit], initial=0.0))
    # token s is chosen from position n_prompt - 1 + s; after an accepted flip only earlier choices count
    n_tok = len(ref_tokens) if flip is None else max(0, min(len(ref_tokens), flip - (n_prompt - 1)))
    first = next((i for i in range(n_tok) if i >= len(tokens) or tokens[i] != ref_tokens[i]), None)
    if (
        first is not None
        and n_prompt - 1 + first >= n
        and _near_tie(quant_margins, n_prompt - 1 + first, flip_margin) is not None
    ):
        # no logit row to look at for that choice: a near-tie at or before it may explain it, as above
        flip, n_tok = n_prompt - 1 + first, first
        first = None
    if first is not None:
        msg = (
            f"generated tokens differ from the reference at step {first}: engine {list(tokens[first : first + 4])}, "
            f"reference {list(ref_tokens[first : first + 4])}"
        )
        return Agreement(False, limit, worst, flip, n_tok, msg)
    note = ""
    if flip is not None:
        tie = _near_tie(quant_margins, flip, flip_margin) or 0  # not None: the flip was accepted for it
        note = (
            f"; position {flip} and later not compared: the activation rounding of position {tie} came within "
            f"{quant_margins[tie]:.2g} steps of a boundary"
        )
    return Agreement(True, limit, worst, flip, n_tok, f"{limit} rows within {tol:g} (worst {worst:.3g}){note}")


def _near_tie(quant_margins: Sequence[float], upto: int, flip_margin: float = QUANT_FLIP) -> int | None:
    """The last position <= upto whose activation rounding came within flip_margin of a boundary."""
    near = [p for p in range(min(upto + 1, len(quant_margins))) if quant_margins[p] < flip_margin]
    return near[-1] if near else None
