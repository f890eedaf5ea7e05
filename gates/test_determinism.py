"""DET: the engine's output is a function of (build, model, prompt, config) alone (docs/design.md, determinism)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from bmoe_ci.gaterun.engine import EngineResult
from bmoe_ci.gaterun.runner import DeviceRunner
from gates.compare import assert_identical, check, output_digest
from gates.plan import PROMPT, REFERENCE, SESSION_REPEATS, model_args, score_wide_argv

# What a scoring run reports to the last bit (the mean nll of a text is a sum over every logit row, so
# one changed bit of any logit shows).
SCORE_BITS = ("prompt_tokens", "tokens_scored", "nll_sum", "nll_mean", "ppl", "top1_agreement")


@pytest.mark.gate("DET", "repeat")
@pytest.mark.entries("ref", "again")
def test_same_config_twice(
    runs: dict[str, EngineResult], fixture: str, artifacts: Path, request: pytest.FixtureRequest
) -> None:
    assert_identical(runs["ref"], runs["again"], "ref", "again", artifacts)
    request.node.user_properties.append(("bmoe.output", f"{fixture}={output_digest(runs['ref'])}"))


@pytest.mark.gate("DET", "threads")
@pytest.mark.entries("ref", "threads2")
def test_one_vs_two_threads(runs: dict[str, EngineResult], artifacts: Path) -> None:
    assert_identical(runs["ref"], runs["threads2"], "threads1", "threads2", artifacts)


@pytest.mark.gate("DET", "batch")
@pytest.mark.entries(
    "ref",
)
def test_batch_equals_single_process(
    runs: dict[str, EngineResult], runner: DeviceRunner, model: str, artifacts: Path
) -> None:
    single = runner.single(model_args(model, *REFERENCE, "-t", "1"))
    assert_identical(runs["ref"], single, "batch", "single", artifacts)


@pytest.mark.gate("DET", "session")
@pytest.mark.entries("ref", "session")
def test_session_prompts_are_new_contexts(runs: dict[str, EngineResult], artifacts: Path) -> None:
    """Each `--session` prompt is a new context (docs/engine-flags.md): the gate's prompt, run as the
    first and again as the third prompt of a session with another prompt between them, generates what
    `ref` generates. No state of an earlier prompt (a KV cache position, a recurrent layer's state)
    reaches a later one; the expert cache, which may carry over, changes no byte."""
    ref, ses = runs["ref"], runs["session"]
    for r, label in ((ref, "ref"), (ses, "session")):
        check(r.ok, f"{label}: {r.describe()}", artifacts, ref=ref, session=ses)
    prompts = ses.data["prompts"]
    for i in SESSION_REPEATS:
        got = prompts[i]
        check(
            got["prompt_tokens"] == len(ref.data["prompt_tokens"]),
            f"session prompt {i} has {got['prompt_tokens']} tokens, the gate prompt {PROMPT!r} "
            f"{len(ref.data['prompt_tokens'])}: gates/data/session.txt is not the file this gate expects",
            artifacts,
            ref=ref,
            session=ses,
        )
        pairs = enumerate(zip(got["tokens"], ref.data["tokens"], strict=False))
        first = next((j for j, (a, b) in pairs if a != b), None)
        check(
            got["tokens"] == ref.data["tokens"] and got["text_hex"] == ref.data["text_hex"],
            f"session prompt {i} (the gate prompt after {i} other prompts) generated other tokens than ref"
            + (f": first difference at generated token {first}" if first is not None else " (another length)"),
            artifacts,
            ref=ref,
            session=ses,
        )


@pytest.mark.gate("DET", "kernels")
@pytest.mark.entries(
    "score-wide",
)
def test_kernel_path_changes_no_byte(
    runs: dict[str, EngineResult],
    runner: DeviceRunner,
    model: str,
    artifacts: Path,
    record_property: Callable[[str, object], None],
) -> None:
    """The device's kernel path (its engine's own choice, or the farm file's ``kernels`` pin: AVX2,
    AVX-512 VNNI, NEON, sdot) against the scalar one that defines every bit (docs/model-math.md): the
    text's scores, which sum every logit row, to the last bit. One engine process more per fixture,
    with BMOE_KERNELS=scalar. The path compared is a JUnit property (``kernels``)."""
    auto = runs["score-wide"]
    check(auto.ok, f"score-wide: {auto.describe()}", artifacts, score_wide=auto)
    record_property("kernels", auto.data.get("kernels"))
    pinned = runner.session.device.kernels
    check(
        pinned in ("auto", auto.data.get("kernels")),
        f"the device pins the {pinned} kernels, but its engine ran the {auto.data.get('kernels')} ones",
        artifacts,
        score_wide=auto,
    )
    if auto.data.get("kernels") == "scalar":
        pytest.skip("this device's engine runs the scalar kernels itself (no SIMD path): nothing to compare")
    scalar = runner.single(score_wide_argv(model), env={"BMOE_KERNELS": "scalar"})
    check(
        scalar.ok and scalar.data.get("kernels") == "scalar",
        f"the scalar run: {scalar.describe()}",
        artifacts,
        scalar=scalar,
    )
    for key in SCORE_BITS:
        check(
            auto.data.get(key) == scalar.data.get(key),
            f"{key}: {auto.data.get(key)!r} on the {auto.data.get('kernels')} kernels, "
            f"{scalar.data.get(key)!r} on the scalar kernels",
            artifacts,
            auto=auto,
            scalar=scalar,
        )
