"""llama.cpp's own files: every file type its quantizer writes that people download, made by llama.cpp
(`llama_cpp.llama_model_quantize` of llama-cpp-python) from two of the project's F32 models, one whose
rows are 256 wide (qwen3moe-q4k's shapes: the K-quants fit) and one whose rows are 128 wide (every
K-quant falls back to a 32-value type for every matrix: Q4_K to Q5_0, Q5_K to Q5_1, Q6_K to Q8_0,
Q2_K / Q3_K to Q4_0, IQ4_XS to IQ4_NL).

For each file, against the types the engine claims (`bmoe info --types`, the engine's type table):

* every type of the file claimed: the engine loads it, tokenizes the prompts as llama.cpp does, and
  agrees with llama.cpp under REF's rule (bmoe_ci.reference.agree, as tests/test_llama_cpp.py applies
  it): llama.cpp's logits within TOL of the numpy reference's and its greedy tokens the reference's up
  to a rounding flip a near-tie explains, and the engine's tokens llama.cpp's up to there; the engine's
  own logits held to the reference by the same rule; and streamed through an evicting cache (2 MiB)
  the engine gives the resident bytes;
* a type the engine does not claim: refused in one line, exit 3, naming the type, resident and
  streamed.

So the test passes for whichever types the engine claims at a commit, and fails when it claims a type
it then gets wrong, or refuses one it claims. Optional: skipped without llama-cpp-python. llama.cpp runs
in a child process (a crash of it must not take pytest down), without its weight repacking
(tests/llama_plain.py). The F32 sources and llama.cpp's files are cached under the checkout's
.cache/bmoe-ci/llama-quant, keyed by the spec, the generator and llama-cpp-python's version.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader

from bmoe_ci.models import load_specs
from bmoe_ci.models.spec import FixtureSpec, spec_hash
from bmoe_ci.models.writer import write
from bmoe_ci.paths import Places
from bmoe_ci.reference import QUANT_FLIP_LLAMA_CPP, Model, agreement, relative_error

llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (pip install '.[bench]')")

TESTS = Path(__file__).resolve().parent
#: the file types llama.cpp's quantizer offers that people download (llama_ftype names)
FTYPES = [
    "F16",
    "BF16",
    "Q8_0",
    "Q4_0",
    "Q4_1",
    "Q5_0",
    "Q5_1",
    "Q2_K",
    "Q3_K_S",
    "Q3_K_M",
    "Q3_K_L",
    "Q4_K_S",
    "Q4_K_M",
    "Q5_K_S",
    "Q5_K_M",
    "Q6_K",
    "IQ4_NL",
    "IQ4_XS",
    "MXFP4_MOE",
]
#: the F32 models: (the fixture whose recipe and seed they take, the dims they change)
MODELS = {
    "w256": ("qwen3moe-q4k", {}),
    "w128": ("qwen3moe", {"d": 128, "head_dim": 32, "expert_ffn": 128}),
}
PROMPTS = ["The quick brown fox", "Hello, world! "]
N_PREDICT = 24
TOL_QUANT = 1e-3  # tests/test_llama_cpp.py's TOL_Q8_0: every matmul input rounded to 8-bit blocks
TOL_FLOAT = 1e-2  # F16 / BF16 weights: llama.cpp rounds the matmul input to f16 / bf16, the engine does not
STREAMED = ("--cache-mb", "2", "--force-cache")
#: what the engine claimed before it listed its types (`bmoe info --types`)
CLAIMED_BEFORE_THE_TABLE = {"f32", "f16", "bf16", "q8_0", "q4_0", "q5_0", "q4_k", "q5_k", "q6_k"}

LLAMA_CHILD = """
import ctypes, json, sys
import numpy as np
import llama_cpp
req = json.load(sys.stdin)
sys.path.insert(0, req["tests"])
from llama_plain import without_weight_repacking
if req["op"] == "quantize":
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, "LLAMA_FTYPE_MOSTLY_" + req["ftype"])
    params.nthread = 1
    rc = llama_cpp.llama_model_quantize(req["src"].encode(), req["dst"].encode(), ctypes.byref(params))
    print(json.dumps({"rc": rc}))
    sys.exit(0)
prompt, n = req["prompt_tokens"], req["n"]
with without_weight_repacking():
    llm = llama_cpp.Llama(model_path=req["path"], n_ctx=len(prompt) + n + 8, n_batch=512, n_ubatch=512,
                          n_threads=1, n_threads_batch=1, logits_all=True, flash_attn=False,
                          type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32, verbose=False)
tokenized = [list(llm.tokenize(p.encode(), add_bos=True, special=True)) for p in req["prompts"]]
llm.eval(prompt)
rows = [np.array(llm.scores[: llm.n_tokens], dtype=np.float64)]
out = []
while len(out) < n:
    tok = int(np.argmax(rows[-1][-1]))
    if tok == llm.token_eos():
        break
    out.append(tok)
    if len(out) == n:
        break
    llm.eval([tok])
    rows.append(np.array(llm.scores[llm.n_tokens - 1 : llm.n_tokens], dtype=np.float64))
np.save(req["rows"], np.vstack(rows))
print(json.dumps({"tokenized": tokenized, "tokens": out}))
"""


def _child(req: dict) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", LLAMA_CHILD],
        input=json.dumps({**req, "tests": str(TESTS)}),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, f"llama.cpp child ({req['op']}) exited {proc.returncode}: {proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _spec(model: str) -> FixtureSpec:
    base, dims = MODELS[model]
    s = load_specs().specs[base]
    assert isinstance(s, FixtureSpec)
    return s.model_copy(update={"name": f"lq-{model}", "dtype": "F32", "dims": s.dims.model_copy(update=dims)})


def _cached(model: str, ftype: str) -> Path:
    """llama.cpp's `ftype` file of the F32 model, made once and kept under .cache/bmoe-ci/llama-quant."""
    spec = _spec(model)
    key = f"{spec_hash(spec)[:16]}-llama_cpp-{llama_cpp.__version__}"
    root = Places.from_environ(os.environ).cache_dir() / "llama-quant" / key
    root.mkdir(parents=True, exist_ok=True)
    src = root / f"{spec.name}.gguf"
    dst = root / f"{spec.name}-{ftype}.gguf"
    # one xdist worker at a time makes the files: two writing the same source model raced on its names
    with open(root / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not src.exists():
            tmp = root / "tmp"
            tmp.mkdir(exist_ok=True)
            (made,) = write(spec, tmp)
            made.replace(src)
        if not dst.exists():
            part = root / f".{dst.name}.part"
            got = _child({"op": "quantize", "src": str(src), "dst": str(part), "ftype": ftype})
            assert got["rc"] == 0, f"llama_model_quantize({ftype}) returned {got['rc']}"
            part.replace(dst)
    return dst


@pytest.fixture(scope="module")
def claimed(engine_bin: Path) -> set[str]:
    """The weight types the engine computes with (lower-case ggml names)."""
    proc = subprocess.run([str(engine_bin), "info", "--types"], capture_output=True, text=True, timeout=60, check=False)
    if proc.returncode != 0:  # an engine from before its type table: the types it refused none of
        return CLAIMED_BEFORE_THE_TABLE
    return {t["type"].lower() for t in json.loads(proc.stdout)["weight_types"]}


@dataclass(frozen=True)
class EngineRun:
    data: dict
    rows: np.ndarray | None


def _engine(binary: Path, path: Path, tmp: Path, *args: str) -> EngineRun:
    logits = tmp / "logits.f32"
    cmd = [str(binary), "run", "-m", str(path), "-p", PROMPTS[0], "-n", str(N_PREDICT), "--json", *args]
    if "--mmap" in args:
        cmd += ["--logits-out", str(logits)]
    proc = subprocess.run(cmd, capture_output=True, timeout=300, check=False)
    assert proc.returncode == 0, f"{path.name} {args}: {proc.stderr.decode(errors='replace')[-2000:]}"
    data = json.loads(proc.stdout)
    rows = None
    if "--mmap" in args:
        rows = np.fromfile(logits, dtype="<f4").reshape(-1, data["model"]["n_vocab"]).astype(np.float64)
    return EngineRun(data, rows)


def _engine_tokenize(binary: Path, path: Path, prompt: str) -> list[int]:
    proc = subprocess.run(
        [str(binary), "tokenize", "-m", str(path), "-p", prompt], capture_output=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-2000:]
    return [int(t) for t in json.loads(proc.stdout.decode().splitlines()[0])["ids"]]


@pytest.mark.parametrize("ftype", FTYPES)
@pytest.mark.parametrize("model", list(MODELS))
def test_llama_cpp_file(engine_bin: Path, claimed: set[str], tmp_path: Path, model: str, ftype: str) -> None:
    path = _cached(model, ftype)
    types = {t.tensor_type.name.lower() for t in GGUFReader(str(path)).tensors}
    missing = sorted(types - claimed)
    if missing:
        # refused in one line (exit 3) naming a type the engine does not claim, resident and streamed
        for mode in (("--mmap",), STREAMED):
            cmd = [str(engine_bin), "run", "-m", str(path), "-p", PROMPTS[0], "-n", "2", *mode]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
            lines = proc.stderr.splitlines()
            assert proc.returncode == 3 and len(lines) == 1 and lines[0].startswith("bmoe: error: "), (
                f"{path.name} {mode}: exit {proc.returncode}: {proc.stderr[-2000:]}"
            )
            assert any(t in lines[0].lower() for t in missing), f"{lines[0]} names none of {missing}"
            assert proc.stdout == ""
        return

    resident = _engine(engine_bin, path, tmp_path, "--mmap")
    streamed = _engine(engine_bin, path, tmp_path, *STREAMED)
    assert streamed.data["tokens"] == resident.data["tokens"], f"{path.name}: streamed differs from resident"
    assert streamed.data["text_hex"] == resident.data["text_hex"]
    assert streamed.data["counters"]["cache_misses"] > 0
    prompt = [int(t) for t in resident.data["prompt_tokens"]]
    tokens = [int(t) for t in resident.data["tokens"]]

    got = _child(
        {
            "op": "run",
            "path": str(path),
            "prompts": PROMPTS,
            "prompt_tokens": prompt,
            "n": N_PREDICT,
            "rows": str(tmp_path / "llama_rows.npy"),
        }
    )
    rows = np.load(tmp_path / "llama_rows.npy")
    # tokenization: the engine's, prompt by prompt, is llama.cpp's
    assert got["tokenized"][0] == prompt, f"{path.name}: llama.cpp {got['tokenized'][0]}, engine {prompt}"
    for text, ids in zip(PROMPTS[1:], got["tokenized"][1:], strict=True):
        assert _engine_tokenize(engine_bin, path, text) == ids, f"{path.name}: {text!r}"

    ref = Model.load(path)
    if ftype in ("F16", "BF16"):
        # llama.cpp rounds a 16-bit matmul's input to 16 bits, the engine and the reference do not. Each is
        # held to the reference on its own tokens (llama.cpp within TOL_FLOAT, the engine as F32 is), and
        # their tokens are equal up to a step where the reference's two best logits are closer than two
        # outputs within TOL_FLOAT of it can tell apart (a near-tie): from there they may part
        mine = ref.logits(prompt + tokens[:-1])
        rel, worst = relative_error(resident.rows[: len(mine)], mine)
        assert rel <= 1e-5, f"{path.name}: the engine differs from the reference by {rel:.3g} (row {worst})"
        theirs = ref.logits(prompt + got["tokens"][:-1])
        rel, worst = relative_error(rows[: len(theirs)], theirs)
        assert rel <= TOL_FLOAT, f"{path.name}: llama.cpp differs from the reference by {rel:.3g} (row {worst})"
        first = next((i for i, (x, y) in enumerate(zip(tokens, got["tokens"], strict=False)) if x != y), None)
        if first is None:
            assert len(got["tokens"]) == len(tokens), f"{path.name}: llama.cpp {got['tokens']}\nengine    {tokens}"
            return
        row = np.sort(mine[len(prompt) - 1 + first])
        gap, scale = row[-1] - row[-2], np.abs(row).max()
        assert gap < 2 * TOL_FLOAT * scale, (
            f"{path.name}: generated tokens part at step {first} (llama.cpp {got['tokens'][first]}, engine "
            f"{tokens[first]}) where the reference's top-2 gap {gap:.3g} is no near-tie "
            f"(2 x {TOL_FLOAT:g} x {scale:.3g})"
        )
        return
    gen = ref.generate(prompt, N_PREDICT)
    a = agreement(
        len(prompt), gen.tokens, gen.logits, gen.quant_margins, got["tokens"], rows, TOL_QUANT, QUANT_FLIP_LLAMA_CPP
    )
    assert a.ok, f"{path.name}: llama.cpp against the reference: {a.message}"
    assert resident.rows is not None
    e = agreement(len(prompt), gen.tokens, gen.logits, gen.quant_margins, tokens, resident.rows, TOL_QUANT)
    assert e.ok, f"{path.name}: the engine against the reference: {e.message}"
    n = min(a.tokens_compared, e.tokens_compared)
    assert got["tokens"][:n] == tokens[:n], f"{path.name}: llama.cpp {got['tokens'][:n]}\nengine    {tokens[:n]}"
