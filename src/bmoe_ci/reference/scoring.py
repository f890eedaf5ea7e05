"""The reference's own answers to the engine's scoring instruments (docs/engine-flags.md, scoring): what
`--ppl` / `--ppl-step`, `--ppl-choices` and `--session` must report on a model with no lossy knob, from
the numpy forward pass and the reference tokenizer (gate SCORE compares every device with them).

Each is written from the documented rules, not from the engine: a scored text (and a question's
context and options) reads special-token texts as plain text, BOS as the model asks; a question's
shared prefix is the context's leading tokens that every context + option tokenization keeps; each
session prompt is a fresh greedy generation of `-n` tokens, ended by an end-of-generation token.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .forward import Generation, Model


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    m = logits.max(axis=1, keepdims=True)
    return logits - (m + np.log(np.exp(logits - m).sum(axis=1, keepdims=True)))


@dataclass(frozen=True)
class TextScore:
    tokens: list[int]
    nll_mean: float
    top1_agreement: float


def score_text(model: Model, text: bytes) -> TextScore:
    """The mean next-token nll and top-1 agreement over a text (one window: the gates' texts fit)."""
    tokens = model.tokenize(text, parse_special=False)
    logits = np.asarray(model.logits(tokens), dtype=np.float64)
    lp = _log_softmax(logits)
    nxt = np.array(tokens[1:])
    nll = -lp[np.arange(len(tokens) - 1), nxt]
    top1 = float((logits[:-1].argmax(axis=1) == nxt).mean())
    return TextScore(tokens, float(nll.mean()), top1)


@dataclass(frozen=True)
class ChoiceScore:
    id: object
    answer: int
    prefix: int  # tokens of the shared prefix (BOS included)
    scored: list[int]  # tokens scored per option
    logprobs: list[float]
    chosen: int  # the highest total, the lower index on a tie

    @property
    def margin(self) -> float:
        """Gap between the chosen option's total and the best other one's (how close the choice was)."""
        rest = [v for j, v in enumerate(self.logprobs) if j != self.chosen]
        return self.logprobs[self.chosen] - max(rest) if rest else float("inf")


def score_choices(model: Model, lines: Sequence[str]) -> list[ChoiceScore]:
    """`--ppl-choices`: every question of a JSONL file's lines, in file order."""
    out = []
    for line in lines:
        if not line.strip():
            continue
        q = json.loads(line)
        ctx = model.tokenize(q["context"].encode(), parse_special=False)
        fulls = [model.tokenize((q["context"] + opt).encode(), parse_special=False) for opt in q["options"]]
        prefix = len(ctx)
        for f in fulls:
            k = 0
            while k < min(prefix, len(f)) and f[k] == ctx[k]:
                k += 1
            prefix = k
        if prefix == 0:
            raise ValueError(f"question {q.get('id')!r}: its options change the context's first token")
        logprobs, scored = [], []
        for f in fulls:
            lp = _log_softmax(np.asarray(model.logits(f), dtype=np.float64))
            logprobs.append(float(sum(lp[i - 1, f[i]] for i in range(prefix, len(f)))))
            scored.append(len(f) - prefix)
        chosen = int(np.argmax(logprobs))  # the first maximum
        out.append(ChoiceScore(q.get("id"), int(q["answer"]), prefix, scored, logprobs, chosen))
    return out


def session_prompts(data: bytes) -> list[bytes]:
    """The prompts of a `--session` file: JSON objects when the first non-blank line starts with `{`,
    else one prompt per non-blank line (raw bytes, a trailing CR removed)."""
    lines = [ln for ln in data.split(b"\n") if ln.strip()]
    if lines and lines[0].lstrip().startswith(b"{"):
        return [json.loads(ln)["prompt"].encode() for ln in lines]
    return [ln[:-1] if ln.endswith(b"\r") else ln for ln in lines]


def run_session(model: Model, data: bytes, n_predict: int) -> list[Generation]:
    """`--session`: each prompt tokenized as `-p` (specials parsed) and generated greedily from a fresh
    context; with no lossy knob the warm cache changes nothing."""
    return [model.generate(model.tokenize(p), n_predict) for p in session_prompts(data)]
