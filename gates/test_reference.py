"""REF: the device's resident run agrees with the independent reference (bmoe_ci.reference).

Every other gate compares the engine with itself: two configurations that should give the same
bytes. A bug that changes every configuration the same way (a RoPE position, a dequantisation
scale, a normalisation) keeps every such pair identical and passes them all. REF pins an absolute
expectation instead: the numpy reference, written from docs/model-math.md and never from the C,
computed on the controller for the plan's prompt and length (cached beside the fixtures).

  tokens   the `ref` plan entry's prompt and generated token ids equal the reference's, exactly
  logits   its `--logits-out` rows for the first positions are within LOGITS_TOL (LOGITS_TOL_GELU on a
           GELU architecture: the recipe's act is gelu_tanh) of the reference's
           (max over those rows of max_j |engine - ref| / max_j |ref|)

On a model whose matmul inputs are rounded to 8-bit blocks (Q8_0, Q4_0, Q5_0, K-quants) the comparison
stops at an activation rounding that f32 and float64 may legitimately put on different sides of a
boundary (bmoe_ci.reference.agree: never at the first position, and only where the reference saw such
a near-tie); everything before it is held to the same tolerance.

The logits file is written on the device and pulled back once per fixture: the one round trip REF
adds to the plan's single batch.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bmoe_ci.farm import InfraError
from bmoe_ci.gaterun.context import DeviceContext
from bmoe_ci.gaterun.engine import EngineResult
from bmoe_ci.gaterun.runner import DeviceRunner
from bmoe_ci.gaterun.state import GateState
from bmoe_ci.paths import Places
from bmoe_ci.reference import ReferenceOutput, agreement
from gates.compare import require_ok, save

# The engine computes in f32 with fixed reduction orders, the reference in float64: measured at most
# 7.4e-7 over the default fixtures (gemma4 before its f16 GELU, see LOGITS_TOL_GELU; Q8_0 7.6e-8: its
# weights dequantise exactly in f32, and the reference rounds each Q8_0 matmul's input to Q8_0 blocks
# exactly as the engine does, docs/model-math.md).
# 1e-5 leaves a factor of ten of margin and stays far below what a kernel or position bug does.
LOGITS_TOL = 1e-5
# gemma4's GELU goes through ggml's f16 table, as llama.cpp computes it (docs/model-math.md): the engine and
# the reference round each GELU input and output to f16, and an input that f32 and float64 noise put on
# opposite sides of an f16 rounding step (a few per token) moves the logits by ~1e-5..1e-4: measured 3.5e-5
# on the gate prompt's first 8 rows, 1.3e-4 on another prompt's, at most 4.6e-4 over 1800 rows of text.
# A RoPE, position or kernel bug is still 1e-2 or more.
LOGITS_TOL_GELU = 1e-3


def logits_tol(fixture: str, places: Places) -> float:
    from bmoe_ci.models.spec import load_specs
    from bmoe_ci.recipes import recipe

    spec = load_specs(places=places).specs.get(fixture)
    return LOGITS_TOL_GELU if spec is not None and recipe(spec.arch).act == "gelu_tanh" else LOGITS_TOL


def reference_for(gate_state: GateState, device: DeviceContext, fixture: str) -> ReferenceOutput:
    path = gate_state.run.references.get(fixture)
    if path is None:  # the controller computes one per fixture: its absence is not the engine's doing
        raise InfraError(device.name, "setup", f"no reference output was prepared for fixture {fixture}")
    return ReferenceOutput.from_json(Path(path).read_text())


@pytest.mark.gate("REF")
@pytest.mark.entries(
    "ref",
)
def test_resident_run_matches_reference(
    runs: dict[str, EngineResult],
    runner: DeviceRunner,
    device: DeviceContext,
    fixture: str,
    gate_state: GateState,
    artifacts: Path,
) -> None:
    ref = reference_for(gate_state, device, fixture)
    r = runs["ref"]
    require_ok(r, "ref")
    if r.data["prompt_tokens"] != ref.prompt_tokens:
        save(artifacts, ref=r)
        raise AssertionError(
            f"the engine tokenized the prompt as {r.data['prompt_tokens']}, the reference as "
            f"{ref.prompt_tokens} (artifacts in {artifacts})"
        )
    argv = list(r.argv)
    if "--logits-out" not in argv:
        raise AssertionError("the plan's `ref` entry has no --logits-out: REF cannot check the logits")
    # verified against the device's size and hash; the artifacts fixture keeps it only if the test fails
    local = runner.pull(argv[argv.index("--logits-out") + 1], artifacts / "logits.f32")
    raw = local.read_bytes()
    n_vocab = ref.logits.shape[1]
    n_rows = len(ref.logits)
    if len(raw) % (4 * n_vocab) or len(raw) // (4 * n_vocab) < n_rows:
        save(artifacts, ref=r)
        raise AssertionError(
            f"the logits file has {len(raw)} bytes: not at least {n_rows} rows of {n_vocab} f32 "
            f"(artifacts in {artifacts})"
        )
    rows = np.frombuffer(raw, dtype="<f4").reshape(-1, n_vocab)[:n_rows]
    tol = logits_tol(fixture, gate_state.places)
    a = agreement(len(ref.prompt_tokens), ref.tokens, ref.logits, ref.quant_margins, r.data["tokens"], rows, tol)
    if not a.ok:
        save(artifacts, ref=r)
        raise AssertionError(
            f"{a.message} (reference margins: logit {ref.min_logit_margin:.3g}, routing "
            f"{ref.min_route_margin:.3g}; artifacts in {artifacts})"
        )
