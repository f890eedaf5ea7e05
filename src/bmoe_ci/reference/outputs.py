"""What the REF gate compares a device against: the reference's greedy tokens and first logit rows
for one prompt, computed on the controller from the fixture file (never by the engine).

    out = compute(fixture_path, GATE_REQUEST)
    out.tokens, out.logits            # generated ids; [logit_rows, V] float64
    out.to_json() / ReferenceOutput.from_json(text)

`code_hash()` covers this package's source: a change to the reference invalidates every cached
output (bmoe_ci.models.cache keys the cache on it and on the fixture's spec hash).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from .forward import Model

FORMAT = "bmoe-ci.reference/2"


@dataclass(frozen=True)
class ReferenceRequest:
    """A prompt (as text: the engine tokenizes it itself), how many tokens to generate, and how many
    leading positions' logits to keep."""

    prompt: str
    n_predict: int
    logit_rows: int


# The gate plan's resident run (gates/plan.py takes its prompt and length from here). Eight rows:
# the first positions are where a position-dependent bug (RoPE, the KV cache) shows first, and the
# file stays small enough to pull from a phone in one round trip.
GATE_REQUEST = ReferenceRequest(prompt="The quick brown fox", n_predict=24, logit_rows=8)


@dataclass(frozen=True)
class ReferenceOutput:
    request: ReferenceRequest
    prompt_tokens: list[int]
    tokens: list[int]  # generated, EOS excluded
    logits: np.ndarray  # [min(logit_rows, positions run), V] float64
    min_logit_margin: float  # smallest best-vs-second logit gap where a token was chosen
    min_route_margin: float  # smallest router gap at the top-k boundary
    #: per position run, its activation rounding's smallest distance to a boundary (agree.py uses it)
    quant_margins: list[float]

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": FORMAT,
                "request": asdict(self.request),
                "prompt_tokens": self.prompt_tokens,
                "tokens": self.tokens,
                "logits": self.logits.tolist(),
                "min_logit_margin": self.min_logit_margin,
                "min_route_margin": self.min_route_margin,
                "quant_margins": self.quant_margins,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> ReferenceOutput:
        raw: dict[str, Any] = json.loads(text)
        if raw.get("format") != FORMAT:
            raise ValueError(f"format {raw.get('format')!r}, expected {FORMAT!r}")
        return cls(
            request=ReferenceRequest(**raw["request"]),
            prompt_tokens=[int(t) for t in raw["prompt_tokens"]],
            tokens=[int(t) for t in raw["tokens"]],
            logits=np.asarray(raw["logits"], dtype=np.float64),
            min_logit_margin=float(raw["min_logit_margin"]),
            min_route_margin=float(raw["min_route_margin"]),
            quant_margins=[float(m) for m in raw["quant_margins"]],
        )


@cache
def code_hash() -> str:
    """sha256 of the reference's source files (sorted by name)."""
    h = hashlib.sha256()
    for path in sorted(Path(__file__).parent.glob("*.py")):
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def row_errors(engine_rows: np.ndarray, ref_rows: np.ndarray) -> np.ndarray:
    """Each row's max_j |engine - ref| / max_j |ref| (0 for a row that is zero in both: a model may give a
    token an all-zero embedding, whose logits are then all zero)."""
    err = np.abs(engine_rows.astype(np.float64) - ref_rows).max(axis=1)
    return err / np.maximum(np.abs(ref_rows).max(axis=1), 1e-30)


def relative_error(engine_rows: np.ndarray, ref_rows: np.ndarray) -> tuple[float, int]:
    """(the worst row's max_j |engine - ref| / max_j |ref|, that row): how REF and the project's tests
    measure an engine's logits against the reference's, row by row."""
    rel = row_errors(engine_rows, ref_rows)
    worst = int(np.argmax(rel))
    return float(rel[worst]), worst


def compute(model_path: Path | str, request: ReferenceRequest) -> ReferenceOutput:
    model = Model.load(model_path)
    prompt = model.tokenize(request.prompt)
    gen = model.generate(prompt, request.n_predict)
    return ReferenceOutput(
        request=request,
        prompt_tokens=prompt,
        tokens=gen.tokens,
        logits=gen.logits[: request.logit_rows].copy(),
        min_logit_margin=gen.min_logit_margin,
        min_route_margin=gen.min_route_margin,
        quant_margins=list(gen.quant_margins),
    )
