"""The independent numpy reference (bmoe_ci.reference) against the fixtures and against the engine.

Without an engine: the reference runs every fixture, its greedy output varies, it routes every
expert, batch and incremental runs agree, the gating table behaves as docs/model-math.md says.

With the engine (`bmoe run ... --mmap --json --logits-out FILE`): logits of every position agree with
the reference (max relative error per row <= 1e-4 on F32, looser on Q8_0), greedy tokens are
identical, the split model's output is byte-identical to the whole one, and every default fixture
generates 24 tokens from a text prompt.
"""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
from pathlib import Path

import numpy as np
import pytest

from bmoe_ci.models import generate
from bmoe_ci.models.spec import load_specs
from bmoe_ci.recipes import recipe
from bmoe_ci.reference import QUANT_FLIP, Generation, Model, agreement, relative_error

REPO = Path(__file__).resolve().parents[1]
DEFAULTS = [
    "qwen3moe",
    "qwen3moe-split4",
    "gemma4",
    "wide",
    "qwen3moe-q8_0",
    "qwen3moe-q4k",
    "qwen3moe-nonorm",
    "qwen3moe-tied",
    "qwen2moe",
    "gpt-oss",
    "qwen35moe",
    "lfm2moe",
]
#: the gating variants, and one fixture per further weight type (Q5_K, Q6_K, Q4_0, Q5_0, BF16): the block
#: types round their matmul inputs as the reference does (Q8_K for the K-quants, Q8_0 for Q4_0 / Q5_0), so
#: the engine agrees with the reference as on F32 up to a rounding flip (bmoe_ci.reference.agree)
VARIANTS = [
    "qwen3moe-sigmoid",
    "qwen3moe-softmax-sel",
    "qwen3moe-q5k",
    "qwen3moe-q6k",
    "qwen3moe-q4_0",
    "qwen3moe-q5_0",
    "qwen3moe-q4_1",
    "qwen3moe-q5_1",
    "qwen3moe-q2k",
    "qwen3moe-q3k",
    "qwen3moe-iq4xs",
    "qwen3moe-iq4nl",
    "qwen3moe-mxfp4",
    "qwen3moe-bf16",
    "gemma4-file",
]
Q8 = {"qwen3moe-q8_0"}
#: dense fixtures (no experts, outside the default gate set: the gates exercise expert streaming)
DENSE = ["gemma3"]

#: max over rows of max_j |engine - ref| / max_j |ref|  (row-wise infinity norms)
TOL_F32 = 1e-4
#: Q8_0 matmuls round their input to Q8_0 blocks as ggml does (docs/model-math.md, activation quantisation),
#: and the reference models that rounding exactly, so the engine lands near TOL_F32 here too (bmoe: 8e-8
#: on CMP_PROMPT). The rounding is a step function: an activation the engine and the reference place on
#: opposite sides of a rounding boundary (f32 vs float64 noise) moves later logits by ~1e-2; `agreement`
#: stops comparing there when the reference saw such a near-tie (never at the first position).
TOL_Q8_0 = TOL_F32
#: gemma4's GELU goes through ggml's f16 table (input and output rounded to f16, as llama.cpp computes it;
#: docs/model-math.md): the same kind of step, but f16 steps are fine and a model has many GELUs, so a few
#: inputs per token land on opposite sides of one in the engine (f32) and the reference (float64); each
#: moves later logits by ~1e-5..1e-4 (measured: 4.8e-4 worst over 24 tokens, 4.6e-4 worst and 1e-4
#: median over 1800 rows of text).
TOL_GELU = 2e-3
GELU = {n for n, s in load_specs().specs.items() if recipe(s.arch).act == "gelu_tanh"}

TEXT_PROMPT = "Hello, world! "
CMP_PROMPT = "The quick brown fox"
N_CMP = 16
N_TEXT = 24


@pytest.fixture(scope="module")
def models(fixture_dir: Path) -> dict[str, Path]:
    return {f.name: f.path for f in generate(fixture_dir, names=DEFAULTS + VARIANTS + DENSE)}


_cache: dict[Path, Model] = {}


def load(path: Path) -> Model:
    if path not in _cache:
        _cache[path] = Model.load(path)
    return _cache[path]


# ---------------------------------------------------------------------- the reference on its own


@pytest.mark.parametrize("name", DEFAULTS + VARIANTS)
def test_reference_generation_varies_and_routes_every_expert(models: dict, name: str):
    m = load(models[name])
    gen = m.generate(m.tokenize(TEXT_PROMPT), 32)
    assert len(gen.tokens) == 32 and not gen.stopped_at_eog
    specials = {i for i, ty in enumerate(m.token_types) if ty in (2, 3)}  # unknown and control tokens
    assert not specials & set(gen.tokens), "a special token was generated"
    assert len(set(gen.tokens[:N_TEXT])) >= 8, f"greedy output barely varies: {gen.tokens}"
    moe_layers = sorted({r.layer for r in gen.routes})
    assert moe_layers == [i for i in range(m.hp.n_layer) if i >= m.hp.n_dense]
    tie = load_specs().specs[name].init.router_tie
    # a tied expert after the first is only routed together with it, which a short generation may not see
    expected = set(range(m.hp.n_expert)) - set(tie[1:])
    for il in moe_layers:
        used = {e for r in gen.routes if r.layer == il for e in r.ids}
        assert used >= expected, f"layer {il} never routed {expected - used}"
    # near-ties would make an f32 engine legitimately disagree: the fixtures keep clear of them. Exact
    # ties are by design where init.router_tie gives experts one router row (both sides break them by
    # expert index, the engine's documented rank order), so those margins of exactly 0 are left out.
    assert gen.min_logit_margin > 1e-3
    margins = [r.margin for r in gen.routes]
    if load_specs().specs[name].init.router_tie:
        assert 0.0 in margins  # the tie really reaches the top-k boundary
        margins = [x for x in margins if x != 0.0]
    assert min(margins) > 1e-6


@pytest.mark.parametrize("name", DENSE)
def test_reference_dense_generation_varies(models: dict, name: str):
    m = load(models[name])
    gen = m.generate(m.tokenize(TEXT_PROMPT), 32)
    assert len(gen.tokens) == 32 and not gen.stopped_at_eog
    specials = {i for i, ty in enumerate(m.token_types) if ty in (2, 3)}  # unknown and control tokens
    assert not specials & set(gen.tokens), "a special token was generated"
    assert len(set(gen.tokens[:N_TEXT])) >= 8, f"greedy output barely varies: {gen.tokens}"
    assert gen.routes == [] and m.hp.n_expert == 0
    assert gen.min_logit_margin > 1e-3


def test_reference_gemma3_local_and_global_layers(models: dict):
    """No sliding_window_pattern key: llama.cpp's period of 6 makes layers 0-4 local, 5 global. The window
    (8) is shorter than CMP_PROMPT + N_CMP, so it changes the logits from position 8 on, and nothing
    before: positions 0..7 see every earlier position either way."""
    m = load(models["gemma3"])
    assert m.hp.swa == (True, True, True, True, True, False) and m.hp.n_swa == 8
    toks = m.tokenize(CMP_PROMPT)
    toks = toks + m.generate(toks, N_CMP).tokens
    windowed = m.logits(toks)
    unbounded = Model(dataclasses.replace(m.hp, n_swa=10**9), m.t, m.vocab, m.token_types, m.eos, m.add_bos, m.bos)
    wide = unbounded.logits(toks)
    np.testing.assert_allclose(windowed[:8], wide[:8], rtol=0, atol=1e-12)
    assert relative_error(windowed[8:], wide[8:])[0] > 1e-2
    # the global layer's RoPE is scaled (rope_scaling 4): dropping the scale moves the logits
    unscaled = Model(dataclasses.replace(m.hp, rope_scale=1.0), m.t, m.vocab, m.token_types, m.eos, m.add_bos, m.bos)
    assert relative_error(unscaled.logits(toks), windowed)[0] > 1e-3


def test_reference_split_equals_whole(models: dict):
    whole, split = load(models["qwen3moe"]), load(models["qwen3moe-split4"])
    toks = whole.tokenize(CMP_PROMPT)
    np.testing.assert_array_equal(whole.logits(toks), split.logits(toks))


@pytest.mark.parametrize("name", ["qwen3moe", "gemma4", "wide", "gemma3"])
def test_reference_batch_equals_incremental(models: dict, name: str):
    m = load(models[name])
    gen = m.generate(m.tokenize(CMP_PROMPT), N_CMP)
    batch = m.logits(gen.prompt + gen.tokens[:-1])
    np.testing.assert_allclose(gen.logits, batch, rtol=0, atol=1e-9)


def test_reference_tokenizer_is_byte_level(models: dict):
    m = load(models["qwen3moe"])
    text = "héllo\n\x00 wörld"
    toks = m.tokenize(text)
    assert len(toks) == len(text.encode()) and max(toks) < 256
    assert m.detokenize(toks) == text.encode()
    assert m.detokenize([*toks, m.eos]) == text.encode()  # specials decode to nothing


def _route(m: Model, logits: list[float], **hp) -> tuple[list[int], list[float]]:
    saved = m.hp
    m.hp = dataclasses.replace(saved, **hp)
    try:
        ids, w, _ = m.route(np.asarray(logits, dtype=np.float64))
    finally:
        m.hp = saved
    return [int(i) for i in ids], [float(x) for x in w]


def test_gating_table(models: dict):
    m = load(models["qwen3moe"])
    lg = [0.5, 2.0, -1.0, 2.0, 1.0]
    sm = np.exp(lg) / np.sum(np.exp(lg))
    # 1 softmax: ties go to the lower id; weights are probs[ids], then normalised / scaled per keys
    ids, w = _route(m, lg, n_expert=5, n_expert_used=2, gating=1, norm_w=False, w_scale=1.0)
    assert ids == [1, 3] and np.allclose(w, sm[[1, 3]])
    ids, w = _route(m, lg, n_expert=5, n_expert_used=3, gating=1, norm_w=True, w_scale=2.0)
    assert ids == [1, 3, 4] and np.allclose(w, 2.0 * sm[[1, 3, 4]] / sm[[1, 3, 4]].sum())
    # 2 sigmoid
    sg = 1 / (1 + np.exp(-np.asarray(lg)))
    ids, w = _route(m, lg, n_expert=5, n_expert_used=3, gating=2, norm_w=False, w_scale=1.0)
    assert ids == [1, 3, 4] and np.allclose(w, sg[[1, 3, 4]])
    ids, w = _route(m, lg, n_expert=5, n_expert_used=3, gating=2, norm_w=True, w_scale=2.5)
    assert np.allclose(w, 2.5 * sg[[1, 3, 4]] / sg[[1, 3, 4]].sum())
    # 3 softmax over the selected logits
    ids, w = _route(m, lg, n_expert=5, n_expert_used=3, gating=3, norm_w=False, w_scale=1.0)
    sel = np.exp([2.0, 2.0, 1.0])
    assert ids == [1, 3, 4] and np.allclose(w, sel / sel.sum())
    # negative logits under row 3 still rank by the raw logit
    ids, _ = _route(m, [-3.0, -1.0, -2.0], n_expert=3, n_expert_used=1, gating=3, norm_w=False, w_scale=1.0)
    assert ids == [1]


def test_weight_chains_end_where_the_keys_say(models: dict):
    """gemma4's and qwen3moe's weights are normalised (llama.cpp fixes it for both), sigmoid's normed then
    scaled (2.5), nonorm's are not."""
    for name, total in [("gemma4", 1.0), ("qwen3moe", 1.0), ("qwen3moe-sigmoid", 2.5)]:
        m = load(models[name])
        gen = m.generate(m.tokenize(TEXT_PROMPT), 4)
        assert all(math.isclose(sum(r.weights), total, rel_tol=1e-9) for r in gen.routes), name
    m = load(models["qwen3moe-nonorm"])
    gen = m.generate(m.tokenize(TEXT_PROMPT), 4)
    assert all(sum(r.weights) < 1.0 - 1e-6 for r in gen.routes)


def test_softmax_over_selected_equals_normalised_softmax(models: dict):
    """softmax(l[ids]) == softmax(l)[ids] / sum: rows 1+norm and 3 give one output (docs/fixtures.md);
    the no-norm variant is the one whose output differs. softmax-sel and nonorm hold the same weights
    (same dots1 spec but the gating keys)."""
    sel, nonorm = (load(models[n]) for n in ("qwen3moe-softmax-sel", "qwen3moe-nonorm"))
    toks = sel.tokenize(CMP_PROMPT)
    unnormalised = nonorm.logits(toks)
    nonorm.hp = dataclasses.replace(nonorm.hp, norm_w=True)
    try:
        normalised = nonorm.logits(toks)
    finally:
        nonorm.hp = dataclasses.replace(nonorm.hp, norm_w=False)
    np.testing.assert_allclose(sel.logits(toks), normalised, rtol=0, atol=1e-9)
    assert not np.allclose(unnormalised, normalised, atol=1e-3)


# ---------------------------------------------------------------------- against the engine


@pytest.fixture(scope="module")
def engine(request: pytest.FixtureRequest) -> Path:
    if not (REPO / "engine" / "src" / "main.c").exists():
        pytest.skip("the engine's command line (engine/src/main.c) does not exist yet")
    return request.getfixturevalue("engine_bin")


def run_engine(
    engine: Path,
    model: Path,
    out: Path,
    n: int,
    prompt_tokens: list[int] | None = None,
    prompt: str | None = None,
    n_vocab: int | None = None,
) -> tuple[dict, np.ndarray | None, bytes]:
    cmd = [str(engine), "run", "-m", str(model), "--mmap", "-n", str(n), "--json"]
    if prompt_tokens is not None:
        cmd += ["--prompt-tokens", ",".join(map(str, prompt_tokens))]
    else:
        assert prompt is not None
        cmd += ["-p", prompt]
    logits_path = out / f"{model.stem}.logits.f32"
    if n_vocab is not None:
        cmd += ["--logits-out", str(logits_path)]
    proc = subprocess.run(cmd, capture_output=True, timeout=300)
    stderr = proc.stderr.decode(errors="replace")[-2000:]
    assert proc.returncode == 0, f"{' '.join(cmd)}\nexit {proc.returncode}\n{stderr}"
    result = json.loads(proc.stdout)
    assert result.get("ok") is True, result
    if n_vocab is None:
        return result, None, b""
    raw = logits_path.read_bytes()
    assert len(raw) % (4 * n_vocab) == 0, f"logits file of {len(raw)} bytes is not rows of {n_vocab} f32"
    return result, np.frombuffer(raw, dtype="<f4").reshape(-1, n_vocab), raw


def _explain(gen: Generation, tokens: list[int]) -> str:
    first = next((i for i, (a, b) in enumerate(zip(tokens, gen.tokens, strict=False)) if a != b), None)
    return (
        f"engine {tokens}\nref    {gen.tokens}\nfirst difference at step {first}; "
        f"smallest reference logit margin {gen.min_logit_margin:.3g}, "
        f"smallest routing margin {gen.min_route_margin:.3g}, smallest activation rounding margin "
        f"{gen.min_quant_margin:.3g}"
    )


@pytest.mark.parametrize("name", DEFAULTS + VARIANTS + DENSE)
def test_engine_matches_reference(engine: Path, models: dict, name: str, tmp_path: Path):
    m = load(models[name])
    prompt = m.tokenize(CMP_PROMPT)
    gen = m.generate(prompt, N_CMP)
    result, rows, _ = run_engine(engine, models[name], tmp_path, N_CMP, prompt_tokens=prompt, n_vocab=m.n_vocab)
    assert result["prompt_tokens"] == prompt
    assert rows is not None
    P, n = len(prompt), len(gen.tokens)
    # every prompt position, then each decode step's position (the last token may or may not be run)
    assert P + n - 1 <= len(rows) <= P + n, f"{len(rows)} logit rows for {P} prompt + {n} generated"
    tol = TOL_Q8_0 if name in Q8 else TOL_GELU if name in GELU else TOL_F32
    # the rule REF applies: rows within tol and tokens equal, up to a rounding flip of a quantised input
    a = agreement(P, gen.tokens, gen.logits, gen.quant_margins, result["tokens"], rows, tol)
    assert a.ok, f"{a.message}\n{_explain(gen, result['tokens'])}"


def test_engine_refuses_routing_knobs_on_a_dense_model(engine: Path, models: dict):
    """gemma3 has no MoE layer: a knob that changes routing is an error naming it (exit 2), while the
    streaming flags stay valid and every expert counter reads 0."""
    base = [str(engine), "run", "-m", str(models["gemma3"]), "-p", CMP_PROMPT, "-n", "4", "--json"]
    proc = subprocess.run([*base, "--n-expert-used", "1"], capture_output=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert json.loads(proc.stdout)["error"]["message"] == "--n-expert-used: the model (gemma3) has no MoE layers"
    streamed = [*base, "--cache-mb", "1", "--force-cache", "--prefetch", "2"]
    proc = subprocess.run(streamed, capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["model"]["n_expert"] == 0 and result["model"]["moe_layers"] == []
    assert result["counters"]["experts_routed"] == 0 and result["counters"]["flash_bytes"] == 0
    assert len(result["tokens"]) == 4


#: gemma3's keys as llama.cpp reads them, each a rewrite of the gemma3 fixture (docs/model-math.md): the
#: pattern as a per-layer array, as a period, absent window (every layer global), soft-capping given
GEMMA3_VARIANTS = {
    "pattern-array": [("set", "gemma3.attention.sliding_window_pattern", "bools", [True, False] * 3)],
    "pattern-period-3": [("set", "gemma3.attention.sliding_window_pattern", "u32", 3)],
    "no-window": [("unset", "gemma3.attention.sliding_window", "", None)],
    "softcap-3": [("set", "gemma3.final_logit_softcapping", "f32", 3.0)],
    "base-swa-500": [("set", "gemma3.rope.freq_base_swa", "f32", 500.0)],
}


def _rewrite(src: Path, dst: Path, edits: list[tuple[str, str, str, object]]) -> Path:
    import gguf_corpus as gc

    img = gc.parse(src.read_bytes())
    for op, key, kind, value in edits:
        if op == "unset":
            img = img.without(key)
        elif kind == "bools":
            img = img.with_kv(gc.kv_arr(key, gc.BOOL, list(value)))  # type: ignore[arg-type]
        else:
            img = img.with_kv(gc.KV(key, {"u32": gc.U32, "f32": gc.F32, "str": gc.STRING}[kind], value))
    return img.write(dst)


@pytest.mark.parametrize("variant", sorted(GEMMA3_VARIANTS))
def test_engine_matches_reference_on_gemma3_key_variants(engine: Path, models: dict, variant: str, tmp_path: Path):
    path = _rewrite(models["gemma3"], tmp_path / f"gemma3-{variant}.gguf", GEMMA3_VARIANTS[variant])
    m = Model.load(path)
    expected_swa = {
        "pattern-array": (True, False) * 3,
        "pattern-period-3": (True, True, False) * 2,
        "no-window": (),
    }.get(variant, (True,) * 5 + (False,))
    assert m.hp.swa == expected_swa
    assert m.hp.softcap == (3.0 if variant == "softcap-3" else 0.0)
    prompt = m.tokenize(CMP_PROMPT)
    gen = m.generate(prompt, N_CMP)
    result, rows, _ = run_engine(engine, path, tmp_path, N_CMP, prompt_tokens=prompt, n_vocab=m.n_vocab)
    assert result["tokens"] == gen.tokens, _explain(gen, result["tokens"])
    assert rows is not None
    rel, worst = relative_error(rows, m.logits(prompt + gen.tokens)[: len(rows)])
    assert rel <= TOL_GELU, f"max relative error {rel:.3g} at row {worst} exceeds {TOL_GELU:g}"
    # each rewrite changes what the model computes (else it would test nothing)
    assert relative_error(rows, load(models["gemma3"]).logits(prompt + gen.tokens)[: len(rows)])[0] > 1e-3


@pytest.mark.parametrize(
    ("edits", "message"),
    [
        ([("set", "gemma3.rope.scaling.type", "str", "yarn")], "the engine implements linear RoPE scaling for gemma3"),
        (
            [("set", "gemma3.attention.sliding_window_pattern", "bools", [True] * 5)],
            "sliding_window_pattern has 5 entries but block_count is 6",
        ),
    ],
)
def test_engine_refuses_gemma3_keys_it_does_not_implement(
    engine: Path, models: dict, edits: list, message: str, tmp_path: Path
):
    path = _rewrite(models["gemma3"], tmp_path / "bad.gguf", edits)
    proc = subprocess.run([str(engine), "run", "-m", str(path), "-p", "x", "-n", "1"], capture_output=True, timeout=60)
    assert proc.returncode == 3 and message in proc.stderr.decode(), proc.stderr


def test_engine_split_output_identical_to_whole(engine: Path, models: dict, tmp_path: Path):
    m = load(models["qwen3moe"])
    prompt = m.tokenize(CMP_PROMPT)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    r1, _, raw1 = run_engine(engine, models["qwen3moe"], tmp_path / "a", N_CMP, prompt, n_vocab=m.n_vocab)
    r2, _, raw2 = run_engine(engine, models["qwen3moe-split4"], tmp_path / "b", N_CMP, prompt, n_vocab=m.n_vocab)
    assert r1["tokens"] == r2["tokens"]
    assert raw1 == raw2, "split model's logits differ from the whole model's"


@pytest.mark.parametrize("name", DEFAULTS + DENSE)
def test_engine_text_prompt_generates_24_tokens(engine: Path, models: dict, name: str, tmp_path: Path):
    m = load(models[name])
    result, rows, _ = run_engine(engine, models[name], tmp_path, N_TEXT, prompt=TEXT_PROMPT, n_vocab=m.n_vocab)
    assert result["prompt_tokens"] == m.tokenize(TEXT_PROMPT)
    assert len(result["tokens"]) == N_TEXT and rows is not None
    gen = m.generate(m.tokenize(TEXT_PROMPT), N_TEXT)
    tol = TOL_GELU if name in GELU else TOL_F32
    a = agreement(len(gen.prompt), gen.tokens, gen.logits, gen.quant_margins, result["tokens"], rows, tol)
    assert a.ok, f"{a.message}\n{_explain(gen, result['tokens'])}"


# ---------------------------------------------------------------------- cached reference outputs (REF)


def test_reference_outputs_are_cached_with_the_fixtures(
    fixture_dir: Path, models: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """generate(reference=...) writes each fixture's reference output once, keyed by the fixture and the
    reference's code; it equals a fresh computation, and a changed key recomputes it."""
    import bmoe_ci.reference
    from bmoe_ci.models import cache
    from bmoe_ci.reference import ReferenceOutput, ReferenceRequest

    request = ReferenceRequest(prompt=CMP_PROMPT, n_predict=6, logit_rows=3)
    (first,) = generate(fixture_dir, names=["qwen3moe"], reference=request)
    assert first.reference is not None
    out = ReferenceOutput.from_json(first.reference.read_text())
    gen = load(models["qwen3moe"]).generate(load(models["qwen3moe"]).tokenize(CMP_PROMPT), 6)
    assert out.tokens == gen.tokens and out.request == request
    np.testing.assert_array_equal(out.logits, gen.logits[:3])

    calls: list[Path] = []
    real = bmoe_ci.reference.compute
    monkeypatch.setattr(bmoe_ci.reference, "compute", lambda path, req: calls.append(Path(path)) or real(path, req))
    generate(fixture_dir, names=["qwen3moe"], reference=request)
    assert calls == [], "an unchanged fixture and reference must reuse the cached output"
    monkeypatch.setattr(cache, "_reference_key", lambda fixture, req: "another reference source")
    (again,) = generate(fixture_dir, names=["qwen3moe"], reference=request)
    assert calls == [models["qwen3moe"]] and again.reference == first.reference


# ---------------------------------------------------------------------- the agreement rule on its own


def _rows(n: int) -> np.ndarray:
    return np.tile(np.linspace(-1.0, 1.0, 8), (n, 1))


def test_agreement_holds_rows_and_tokens_to_the_tolerance() -> None:
    ref, margins = _rows(6), [0.5] * 6
    ok = agreement(3, [1, 2, 3], ref, margins, [1, 2, 3], ref.astype(np.float32), 1e-5)
    assert ok.ok and ok.rows_compared == 6 and ok.flip_row is None and ok.tokens_compared == 3
    moved = ref.copy()
    moved[4, 0] *= 1 + 1e-3
    bad = agreement(3, [1, 2, 3], ref, margins, [1, 2, 3], moved, 1e-5)
    assert not bad.ok and "logits of position 4 differ" in bad.message
    tok = agreement(3, [1, 2, 3], ref, margins, [1, 9, 3], ref, 1e-5)
    assert not tok.ok and "at step 1" in tok.message
    nan = ref.copy()
    nan[2, 3] = np.nan
    assert not agreement(3, [1], ref, margins, [1], nan, 1e-5).ok


def test_agreement_stops_at_a_rounding_flip_it_can_explain() -> None:
    ref = _rows(6)
    moved = ref.copy()
    moved[4:, 0] *= 1 + 1e-2  # a flip's effect: from position 4 on
    tie = [0.5, 0.5, 0.5, QUANT_FLIP / 3, 0.5, 0.5]  # a near-tie at position 3
    a = agreement(3, [1, 2, 3], ref, tie, [1, 2, 7], moved, 1e-5)  # step 2 is chosen at position 4
    assert a.ok and a.flip_row == 4 and a.rows_compared == 4 and a.tokens_compared == 2, a.message
    assert not agreement(3, [1, 2, 3], ref, [0.5] * 6, [1, 2, 7], moved, 1e-5).ok  # no near-tie: a bug
    early = agreement(3, [1, 2, 3], ref, tie, [9, 2, 3], moved, 1e-5)  # step 0 is chosen at position 2
    assert not early.ok and "at step 0" in early.message
    at0 = ref.copy()
    at0[:, 0] *= 1 + 1e-2
    assert not agreement(3, [1], ref, [0.0] * 6, [1], at0, 1e-5).ok  # never at the first position
    # tokens past the rows the reference kept (REF keeps 8): a near-tie before the choice explains them
    short = agreement(3, [1, 2, 3], ref[:2], tie, [1, 2, 7], ref, 1e-5)
    assert short.ok and short.tokens_compared == 2, short.message
    assert not agreement(3, [1, 2, 3], ref[:2], [0.5] * 6, [1, 2, 7], ref, 1e-5).ok


def test_ggml_half_rounding_of_matmul_inputs() -> None:
    """Model.load(ggml_half_inputs=True) rounds an F16 / BF16 matmul's input as ggml converts it: nearest,
    ties to even; its margin is the distance to a rounding boundary in units of the target's spacing."""
    from bmoe_ci.reference.forward import _round_half

    x = np.array([[1.0, 1.0 + 2**-8, 1.0 + 3 * 2**-8, 1.0 + 3 * 2**-9, -2.7, 1e-6]])
    y, margin = _round_half(x, "bf16")
    # 1 + 2^-8 is half way between 1 and 1 + 2^-7: to the even one, 1; 1 + 3*2^-8 half way up: 1 + 2^-6
    assert y[0, :4].tolist() == [1.0, 1.0, 1.0 + 2**-6, 1.0 + 2**-7] and y[0, 4] == -2.703125
    assert margin.tolist() == [0.0]  # a tie is on the boundary
    y16, m16 = _round_half(x[:, [0, 3, 4, 5]], "f16")
    assert y16.tolist() == [x[0, [0, 3, 4, 5]].astype(np.float32).astype(np.float16).astype(np.float64).tolist()]
    assert 0.0 < m16[0] <= 0.5
    # -2.7 in bf16 units: 2.7 * 64 = 172.8, 0.3 from the boundary at 172.5 (less the f32 rounding of -2.7)
    assert _round_half(np.array([[-2.7]]), "bf16")[1][0] == pytest.approx(0.3, abs=1e-5)  # -2.7 in f32: ~3e-6 off
