"""Every fixture in llama.cpp (llama-cpp-python): it loads, and greedy decoding from the engine's prompt
tokens gives the engine's tokens; llama.cpp's logits agree with the numpy reference.

Optional: needs `llama_cpp` (`pip install '.[bench]'`); CI does not install it, and the tests then skip
saying so. llama.cpp runs on one thread with an F32 KV cache and flash attention off, every position's
logits kept (logits_all), the prompt evaluated as one batch, then one token per step (the same shape of
run as the engine's prefill and decode).

Tolerances (relative, per row: max |llama.cpp - reference| / max |reference|, as in test_reference;
measured figures in docs/fixtures.md, "Against llama.cpp"): TOL_F32 = 1e-5 on the F32 qwen3moe and
dots1 fixtures (measured 7e-7); on gemma4, whose GELU goes through ggml's f16 table (input and output
rounded to f16; the engine and the reference do the same, docs/model-math.md), TOL_GEMMA4 = 2e-3 on the
worst row and GEMMA4_MEDIAN = 2e-4 on the median row: the rows agree to ~1e-6 until an input that f32 noise
(llama.cpp's order of summation against the float64 reference's) puts on the other side of an f16
rounding step moves the later logits by ~1e-5..1e-4 (measured 7.5e-4 worst, 3.7e-5 and 8.6e-5 median).
A systematic difference fails the median bound: soft-capping left out (2.5e-2 from the first row), or
a GELU without the f16 table (6e-4 median); TOL_Q8_0 = 1e-3 on Q8_0:
ggml, the engine and the reference all round a Q8_0 matmul's input to 8-bit blocks, so they agree to
1e-7, but an activation that float32 and float64 noise put on opposite sides of a rounding step moves
later logits (measured 1.1e-7 on qwen3moe-q8_0, 4.5e-4 on trained-q8_0 at one position). The same holds
for every fixture whose matmul inputs are rounded (Q8_0, and Q4_0/Q5_0 against Q8_0 blocks, Q4_K/Q5_K/Q6_K
against Q8_K super-blocks): llama.cpp is held to the reference by REF's own rule (bmoe_ci.reference.agree:
within TOL_Q8_0 and the same tokens up to a rounding flip that a near-tie of the reference's rounding
explains), and the engine's tokens must equal llama.cpp's up to there
(the engine and llama.cpp, both float32 with the same rounding, agree to ~3e-7 on those rows). F16 and
BF16: ggml rounds the input of such a matmul to the weight's type, the engine does not; llama.cpp is held
by the same rule to the reference run with that rounding (Model.load(ggml_half_inputs=True), whose
margins count a near-tie of a half rounding as one of a block rounding), the engine to the plain one.
Without the rounding llama.cpp was 6e-3 from the reference on qwen3moe-bf16's prompt rows and 1.9e-2 on
qwen3moe-types' (F16 and BF16 attention projections); with it, 8e-8 and 2e-7 until a near-tie.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from bmoe_ci.models import generate, load_specs
from bmoe_ci.models.spec import quantised_input
from bmoe_ci.recipes import recipe
from bmoe_ci.reference import QUANT_FLIP_LLAMA_CPP, Model, agreement, relative_error
from bmoe_ci.reference.outputs import GATE_REQUEST, row_errors
from llama_plain import without_weight_repacking

llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (pip install '.[bench]')")

REPO = Path(__file__).resolve().parents[1]
#: every fixture but the benchmark models (hundreds of MiB; their spec keys are checked in test_fixtures),
#: and those whose router rows tie on purpose (init.router_tie): llama.cpp's CPU top-k is a heap-based
#: partial sort that breaks exact ties in an unspecified order, the engine breaks them by expert index
#: (docs/model-math.md), so a tie at the edge of the top-k may pick differently. Their keys and tensors
#: are still checked against llama.cpp's tables in test_fixtures, and they load here.
TIED = {n for n, s in load_specs().specs.items() if getattr(s, "init", None) and s.init.router_tie}
FIXTURES = [n for n in load_specs().specs if not n.startswith("bench-") and n not in TIED]
#: fixtures whose matmul inputs are rounded to 8-bit blocks (Q8_0, Q8_1 or Q8_K) by ggml, the engine and the
#: reference: every block type of the type table (bmoe_ci.weight_types), and the mixes
QUANTISED = {n for n, s in load_specs().specs.items() if quantised_input(s.dtype)}
#: fixtures with F16 / BF16 matrices, whose matmul inputs ggml rounds to that type (the engine does not)
HALF = {n for n, s in load_specs().specs.items() if s.dtype in ("F16", "BF16")}
TOL_F32 = 1e-5
TOL_GEMMA4 = 2e-3
GEMMA4_MEDIAN = 2e-4
TOL_Q8_0 = 1e-3
#: the GELU recipes (ggml's f16 table): gemma4, and the dense gemma3
GEMMA4 = {n for n, s in load_specs().specs.items() if recipe(s.arch).act == "gelu_tanh"}
N_PREDICT = GATE_REQUEST.n_predict
PROMPTS = [GATE_REQUEST.prompt, "Hello, world! "]


@pytest.fixture(scope="module")
def models(fixture_dir: Path) -> dict[str, Path]:
    return {f.name: f.path for f in generate(fixture_dir, names=FIXTURES + sorted(TIED))}


def llama_greedy(path: Path, prompt: list[int], n: int) -> tuple[list[int], np.ndarray]:
    """llama.cpp's greedy tokens from `prompt` and the logits of every position it ran."""
    with without_weight_repacking():
        llm = llama_cpp.Llama(
            model_path=str(path),
            n_ctx=len(prompt) + n + 8,
            n_batch=512,
            n_ubatch=512,
            n_threads=1,
            n_threads_batch=1,
            logits_all=True,
            flash_attn=False,
            type_k=llama_cpp.GGML_TYPE_F32,
            type_v=llama_cpp.GGML_TYPE_F32,
            verbose=False,
        )
    try:
        llm.eval(prompt)
        rows = [np.array(llm.scores[: llm.n_tokens], dtype=np.float64)]
        out: list[int] = []
        while len(out) < n:
            tok = int(np.argmax(rows[-1][-1]))
            if tok == llm.token_eos():
                break
            out.append(tok)
            if len(out) == n:
                break
            llm.eval([tok])
            rows.append(np.array(llm.scores[llm.n_tokens - 1 : llm.n_tokens], dtype=np.float64))
        return out, np.vstack(rows)
    finally:
        llm.close()


def llama_tokenize(path: Path, text: str) -> list[int]:
    """llama.cpp's tokens for a prompt, as llama_tokenize(add_special=true, parse_special=true) gives them."""
    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    try:
        return [int(t) for t in llm.tokenize(text.encode(), add_bos=True, special=True)]
    finally:
        llm.close()


def engine_greedy(
    engine: Path, path: Path, prompt: str, n: int, logits: Path | None = None
) -> tuple[list[int], list[int]]:
    """The engine's prompt tokens (its own tokenizer, as the gates run it) and greedy tokens; with logits,
    its logits of every position it ran written there (--logits-out)."""
    cmd = [str(engine), "run", "-m", str(path), "--mmap", "-p", prompt, "-n", str(n), "--json"]
    if logits is not None:
        cmd += ["--logits-out", str(logits)]
    proc = subprocess.run(cmd, capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-2000:]
    result = json.loads(proc.stdout)
    return [int(t) for t in result["prompt_tokens"]], [int(t) for t in result["tokens"]]


@pytest.fixture(scope="module")
def engine(request: pytest.FixtureRequest) -> Path:
    return request.getfixturevalue("engine_bin")


@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("name", FIXTURES)
def test_llama_cpp_decodes_the_engines_tokens(engine: Path, models: dict, name: str, prompt: str, tmp_path: Path):
    prompt_tokens, tokens = engine_greedy(engine, models[name], prompt, N_PREDICT, tmp_path / "logits.f32")
    # the prompt as llama.cpp's own tokenizer cuts it (each fixture's tokenizer.ggml.pre: qwen2, qwen35, lfm2)
    assert llama_tokenize(models[name], prompt) == prompt_tokens, name
    got, rows = llama_greedy(models[name], prompt_tokens, N_PREDICT)
    if name in QUANTISED or name in HALF:
        # llama.cpp in the engine's place under REF's rule: within TOL_Q8_0 of the reference and the same
        # tokens, up to a rounding flip that a near-tie of the reference's activation rounding explains
        # (llama.cpp against the reference that rounds F16 / BF16 matmul inputs as ggml does; the engine
        # against the reference that keeps them f32, as the engine does)
        as_ggml = Model.load(models[name], ggml_half_inputs=True).generate(prompt_tokens, N_PREDICT)
        a = agreement(
            len(prompt_tokens),
            as_ggml.tokens,
            as_ggml.logits,
            as_ggml.quant_margins,
            got,
            rows,
            TOL_Q8_0,
            QUANT_FLIP_LLAMA_CPP,
        )
        assert a.ok, f"{name}: llama.cpp against the reference: {a.message}"
        gen = Model.load(models[name]).generate(prompt_tokens, N_PREDICT)
        # the engine under the same rule (REF's): either may flip at a near-tie (their float orders differ,
        # so a value within a rounding's margin may fall either side), so the tokens are equal wherever
        # both are held to the reference's
        mine = np.fromfile(tmp_path / "logits.f32", dtype=np.float32).reshape(-1, gen.logits.shape[1])
        e = agreement(len(prompt_tokens), gen.tokens, gen.logits, gen.quant_margins, tokens, mine, TOL_Q8_0)
        assert e.ok, f"{name}: the engine against the reference: {e.message}"
        n = min(a.tokens_compared, e.tokens_compared)
        assert got[:n] == tokens[:n], f"{name}: llama.cpp {got[:n]}\nengine    {tokens[:n]} ({a.message}; {e.message})"
        return
    assert got == tokens, f"{name}: llama.cpp {got}\nengine    {tokens}"
    ref = Model.load(models[name]).logits(prompt_tokens + got[:-1])
    rel, worst = relative_error(rows, ref)
    tol = TOL_GEMMA4 if name in GEMMA4 else TOL_F32
    assert rel <= tol, f"{name}: llama.cpp differs from the reference by {rel:.3g} (row {worst}) > {tol:g}"
    if name in GEMMA4:
        med = float(np.median(row_errors(rows, ref)))
        assert med <= GEMMA4_MEDIAN, f"{name}: median row differs from the reference by {med:.3g} > {GEMMA4_MEDIAN:g}"


@pytest.mark.parametrize("name", sorted(TIED))
def test_tied_fixtures_load_in_llama_cpp(engine: Path, models: dict, name: str):
    """A fixture with tied router rows loads in llama.cpp and computes: finite logits for every position
    it ran. (Its greedy tokens are not compared, see TIED.)"""
    prompt_tokens, tokens = engine_greedy(engine, models[name], GATE_REQUEST.prompt, N_PREDICT)
    got, rows = llama_greedy(models[name], prompt_tokens, N_PREDICT)
    assert len(got) == len(tokens) and rows.shape[0] == len(prompt_tokens) + len(got) - 1
    assert np.isfinite(rows).all()
