"""SCORE: the quality instruments measure what they claim (docs/engine-flags.md, scoring).

  wide == step   with no lossy knob, `--ppl` (one resident prompt batch) and `--ppl-step` (one decode
                 step per token through the evicting cache) give the same nll, ppl and agreement to the
                 bit: prefill rows equal single rows, and the cache changes no byte
  reference      the wide score equals the numpy reference's mean nll over the same text within
                 NLL_TOL, and its top-1 agreement exactly (models with rounded matmul inputs: within NLL_TOL_Q8_0 and
                 TOP1_TOL_Q8_0; GELU models: NLL_TOL_GELU and TOP1_TOL_Q8_0; see there)
  fires          with substitution at margin 1.0 the step-wise run examines every routed slot and
                 changes some; the wide run examines none and scores what the model scores

The text (gates/data/score.txt) is pushed beside the fixtures; all four runs come from the fixture's
one batch (gates/plan.py). The reference is computed here, on the controller, from the fixture file
the device was given (found beside the fixture's REF output), once per fixture and process.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import pickle
from collections.abc import Callable
from functools import cache
from pathlib import Path, PurePosixPath
from typing import TypeVar

import pytest

from bmoe_ci.farm import InfraError
from bmoe_ci.gaterun.context import DeviceContext
from bmoe_ci.gaterun.engine import EngineResult
from bmoe_ci.gaterun.state import GateState
from bmoe_ci.reference import agreement, code_hash
from bmoe_ci.reference.forward import Model
from bmoe_ci.reference.scoring import run_session, score_choices, score_text
from gates.compare import check, counters, require_ok
from gates.plan import CHOICES, N_PREDICT, SCORE_TEXT, SESSION_TEXT, is_dense

# engine f32 against reference float64: measured at most 1.4e-7 on the default fixtures (gemma4, before its f16 GELU)
NLL_TOL = 1e-5
# Models whose matmuls round their input to 8-bit blocks (Q8_0 for Q8_0/Q4_0/Q5_0 weights, Q8_K for the
# K-quants) round it in the engine and in the reference alike, but an activation that float32 and float64
# put on the two sides of a rounding step moves what follows. On gates/data/score.txt: 3.6e-5
# (qwen3moe-q8_0, ggml's scalar rounding rule, halves away from zero) and 7.2e-4 (the same fixture with
# ggml's x86 rule the engine follows since, 127/amax and halves to even: docs/model-math.md), 4.3e-6
# (trained-q8_0) of mean nll, and one near-tie prediction of 246 flipped (trained-q8_0). A kernel bug
# moves the nll by far more (the K-quant faults: REF and SCORE catch them, docs/gates.md).
NLL_TOL_Q8_0 = 2e-3
TOP1_TOL_Q8_0 = 0.01
# A model whose matmuls round their inputs both ways (Q8_0 blocks and Q8_K super-blocks, a mix of types)
# has near-ties at almost every position: measured 4.6e-3 on qwen3moe-types (eight types), 1.25e-3 on
# qwen3moe-q4k (llama.cpp's Q4_K_M mix); a wrong kernel moves the nll by tenths of a nat and more.
NLL_TOL_MIXED = 1e-2
# gemma4's GELU rounds its input and output to f16 as ggml's table does (docs/model-math.md): the same kind
# of step, many per token, so later logits move by ~1e-4 and a near-tie routing can flip: measured 3.6e-4
# of mean nll on the text (llama.cpp is 1.6e-5 from the reference there).
NLL_TOL_GELU = 2e-3
SCORES = ("tokens_scored", "windows", "nll_sum", "nll_mean", "ppl", "top1_agreement")
KNOB_ENTRIES = ("score-step-subst", "score-wide-subst")


@cache
def reference_model(model_path: str) -> Model:
    return Model.load(model_path)


@cache
def mixed_rounding(model_path: str) -> bool:
    model = reference_model(model_path)
    return bool(model.q8_0) and bool(model.q8_k)


T = TypeVar("T")


@cache
def _file_sha256(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def shared_reference(cache_dir: Path, kind: str, model_path: str, data: bytes, compute: Callable[[], T]) -> T:
    """The reference's answer for one fixture file and one input, computed once for the whole run and kept in
    the cache (`<cache>/score-reference/`, keyed by the file's and the input's bytes and the reference's
    source): every device's worker scores the same text on the same file, and the numpy reference of a
    quantized fixture takes seconds, so the first worker computes it (under a lock) and the others read it."""
    key = hashlib.sha256(
        "\0".join((kind, _file_sha256(model_path), hashlib.sha256(data).hexdigest(), code_hash())).encode()
    ).hexdigest()
    where = cache_dir / "score-reference"
    where.mkdir(parents=True, exist_ok=True)
    path = where / f"{kind}-{key[:32]}.pickle"
    with open(where / f"{kind}-{key[:32]}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.is_file():
            try:
                return pickle.loads(path.read_bytes())  # written by this run's own workers (or an earlier one)
            except (pickle.UnpicklingError, EOFError, AttributeError, ImportError):
                pass  # a stale or torn entry: compute it again
        value = compute()
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(pickle.dumps(value))
        os.replace(tmp, path)
        return value


@cache
def reference_scores(cache_dir: Path, model_path: str, text_path: str) -> tuple[list[int], float, float, bool, bool]:
    """(tokens, mean nll, top-1 agreement, whether a matmul rounds its input, whether the activation is GELU) of the
    numpy reference over the text."""

    def compute() -> tuple[list[int], float, float, bool, bool]:
        model = reference_model(model_path)
        s = score_text(model, data)
        return s.tokens, s.nll_mean, s.top1_agreement, bool(model.q8_0 or model.q8_k), model.recipe.act != "silu"

    data = Path(text_path).read_bytes()
    return shared_reference(cache_dir, "text", model_path, data, compute)


def local_model(gate_state: GateState, device: DeviceContext, fixture: str) -> Path:
    """The controller's copy of the fixture file the device runs (beside its REF output)."""
    ref = gate_state.run.references.get(fixture)
    if ref is None:  # the controller prepares one per fixture: its absence is not the engine's doing
        raise InfraError(device.name, "setup", f"no reference output was prepared for fixture {fixture}")
    path = Path(ref).parent / PurePosixPath(device.models[fixture]).name
    if not path.is_file():
        raise InfraError(device.name, "setup", f"the fixture file {path} is not on the controller")
    return path


@pytest.mark.gate("SCORE")
@pytest.mark.entries("score-wide", "score-step", "score-step-subst", "score-wide-subst")
def test_scoring_instruments(
    runs: dict[str, EngineResult], device: DeviceContext, fixture: str, gate_state: GateState, artifacts: Path
) -> None:
    wide, step = runs["score-wide"], runs["score-step"]
    dense = is_dense(fixture, gate_state.places)  # no routing knob to fire: those entries are not in the plan
    for label in ("score-wide", "score-step") if dense else ("score-wide", "score-step", *KNOB_ENTRIES):
        require_ok(runs[label], label)

    # wide == step, to the bit
    for key in SCORES:
        check(
            wide.data[key] == step.data[key],
            f"{key}: wide (--ppl, --mmap) {wide.data[key]!r} != step-wise (--ppl-step, evicting cache) "
            f"{step.data[key]!r}",
            artifacts,
            wide=wide,
            step=step,
        )

    # the numpy reference
    tokens, nll, top1, q8_0, gelu = reference_scores(
        gate_state.places.cache_dir(),
        str(local_model(gate_state, device, fixture)),
        str(gate_state.places.source_tree() / "gates" / "data" / SCORE_TEXT),
    )
    check(
        wide.data["prompt_tokens"] == tokens,
        "the engine tokenized the text differently from the reference",
        artifacts,
        wide=wide,
    )
    nll_tol, top1_tol = (
        (NLL_TOL_Q8_0, TOP1_TOL_Q8_0) if q8_0 else (NLL_TOL_GELU, TOP1_TOL_Q8_0) if gelu else (NLL_TOL, 0.0)
    )
    if mixed_rounding(str(local_model(gate_state, device, fixture))):
        nll_tol = NLL_TOL_MIXED
    check(
        abs(wide.data["nll_mean"] - nll) < nll_tol,
        f"nll_mean {wide.data['nll_mean']!r}, reference {nll!r} (tolerance {nll_tol})",
        artifacts,
        wide=wide,
    )
    check(
        abs(wide.data["top1_agreement"] - top1) <= top1_tol,
        f"top1_agreement {wide.data['top1_agreement']!r}, reference {top1!r} (tolerance {top1_tol})",
        artifacts,
        wide=wide,
    )

    if dense:
        return
    # the policy fires step-wise, not in the wide batch
    step_subst, wide_subst = runs["score-step-subst"], runs["score-wide-subst"]
    cs, cw = counters(step_subst), counters(wide_subst)
    check(
        cs["subst_examined"] == cs["experts_routed"] > 0 and cs["subst_changed"] > 0,
        f"step-wise with --expert-substitute 1.0: {cs['subst_changed']}/{cs['subst_examined']} slots changed of "
        f"{cs['experts_routed']} routed (expected every slot examined, some changed)",
        artifacts,
        step_subst=step_subst,
    )
    check(
        cw["subst_examined"] == 0 and wide_subst.data["nll_sum"] == wide.data["nll_sum"],
        f"wide with --expert-substitute 1.0: {cw['subst_examined']} slots examined, nll_sum "
        f"{wide_subst.data['nll_sum']!r} against {wide.data['nll_sum']!r} (expected none, and the model's own)",
        artifacts,
        wide_subst=wide_subst,
        wide=wide,
    )


# --ppl-choices: each option's total log-probability (nats) against the reference's, per question. Measured
# on the five questions of gates/data/choices.jsonl, engine f32 against reference float64 (2026-12-03): at
# most 4.4e-6 on the SiLU fixtures with unrounded matmuls; 1.4e-3 with the f16 GELU (gemma4, gemma3-spm);
# 6.1e-2 where matmul inputs are rounded to 8-bit blocks (qwen3moe-q4k; 4.5e-2 qwen3moe-q8_0): an activation
# that f32 and float64 put on the two sides of a rounding step moves every later row by about a quantum.
# An option scored at another position, or a token off, moves a total by whole nats.
CHOICE_TOL = 1e-4
CHOICE_TOL_GELU = 5e-3
CHOICE_TOL_ROUNDED = 0.15


@pytest.mark.gate("SCORE", "choices")
def test_choices_match_reference(
    runs: dict[str, EngineResult], device: DeviceContext, fixture: str, gate_state: GateState, artifacts: Path
) -> None:
    r = runs["score-choices"]
    require_ok(r, "score-choices")
    model_path = str(local_model(gate_state, device, fixture))
    model = reference_model(model_path)
    raw = (gate_state.places.source_tree() / "gates" / "data" / CHOICES).read_bytes()
    lines = raw.decode("utf-8").splitlines()
    want = shared_reference(
        gate_state.places.cache_dir(), "choices", model_path, raw, lambda: score_choices(model, lines)
    )
    gelu = model.recipe.act != "silu"
    tol = CHOICE_TOL_ROUNDED if model.q8_0 or model.q8_k else CHOICE_TOL_GELU if gelu else CHOICE_TOL
    got = r.data["questions"]
    check(
        r.data["questions_scored"] == len(want) == len(got),
        f"questions_scored {r.data['questions_scored']} ({len(got)} listed), the file has {len(want)}",
        artifacts,
        choices=r,
    )
    check(
        r.data["tokens_scored"] == sum(sum(w.scored) for w in want),
        f"tokens_scored {r.data['tokens_scored']}, the reference scores {sum(sum(w.scored) for w in want)} option "
        "tokens (after each question's shared prefix)",
        artifacts,
        choices=r,
    )
    correct = 0
    for w, g in zip(want, got, strict=True):
        where = f"question {w.id!r}"
        check(g["id"] == w.id and g["answer"] == w.answer, f"{where}: id/answer {g['id']!r}/{g['answer']}", artifacts)
        diffs = [abs(a - b) for a, b in zip(g["logprobs"], w.logprobs, strict=True)]
        check(
            len(g["logprobs"]) == len(w.logprobs) and max(diffs) <= tol,
            f"{where}: option log-probabilities {g['logprobs']}, reference {w.logprobs} (tolerance {tol})",
            artifacts,
            choices=r,
        )
        check(
            g["chosen"] == w.chosen or w.margin <= 2 * tol,
            f"{where}: chose option {g['chosen']}, the reference {w.chosen} (margin {w.margin:.3g})",
            artifacts,
            choices=r,
        )
        check(g["correct"] == (g["chosen"] == g["answer"]), f"{where}: correct {g['correct']!r}", artifacts, choices=r)
        correct += g["chosen"] == g["answer"]
    check(
        r.data["correct"] == correct and r.data["accuracy"] == correct / len(want),
        f"correct {r.data['correct']}, accuracy {r.data['accuracy']!r}: the questions say {correct}/{len(want)}",
        artifacts,
        choices=r,
    )


@pytest.mark.gate("SCORE", "session")
def test_session_matches_reference(
    runs: dict[str, EngineResult], device: DeviceContext, fixture: str, gate_state: GateState, artifacts: Path
) -> None:
    """Every prompt of a `--session` through the warm evicting cache generates what the reference generates
    for it from scratch (the cache changes no byte; tokens compared as REF compares them)."""
    r = runs["session"]
    require_ok(r, "session")
    model_path = str(local_model(gate_state, device, fixture))
    model = reference_model(model_path)
    data = (gate_state.places.source_tree() / "gates" / "data" / SESSION_TEXT).read_bytes()
    want = shared_reference(
        gate_state.places.cache_dir(),
        f"session{N_PREDICT}",
        model_path,
        data,
        lambda: run_session(model, data, N_PREDICT),
    )
    got = r.data["prompts"]
    check(
        r.data["prompts_run"] == len(want) == len(got),
        f"prompts_run {r.data['prompts_run']} ({len(got)} listed), the file has {len(want)}",
        artifacts,
        session=r,
    )
    for i, (w, g) in enumerate(zip(want, got, strict=True)):
        check(
            g["prompt_tokens"] == len(w.prompt),
            f"prompt {i}: {g['prompt_tokens']} prompt tokens, the reference tokenizes {len(w.prompt)}",
            artifacts,
            session=r,
        )
        a = agreement(len(w.prompt), w.tokens, w.logits[:0], w.quant_margins, g["tokens"], w.logits[:0], 0.0)
        check(a.ok, f"prompt {i}: {a.message}", artifacts, session=r)
        if a.flip_row is None:
            check(
                g["tokens"] == w.tokens and (g["stop"] == "eog") == w.stopped_at_eog,
                f"prompt {i}: tokens {g['tokens']} (stop {g['stop']}), reference {w.tokens} (eog {w.stopped_at_eog})",
                artifacts,
                session=r,
            )
    check(
        r.data["tokens"] == [t for g in got for t in g["tokens"]],
        "the session's tokens are not its prompts' generations concatenated",
        artifacts,
        session=r,
    )
