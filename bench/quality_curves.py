"""Quality against the lossy knobs, side by side in one run: what substitution and dropping cost in
perplexity, next-token agreement, KL and multiple-choice accuracy, and what they save in flash reads,
measured step-wise (`--ppl-step`, as in decode) and wide (`--ppl`, one prompt batch per window).

    python bench/quality_curves.py --text HELD_OUT.txt... [--choices MC.jsonl] [--fixture trained | --model M]
                                   [--cache-mb 1 --text-bytes 8192 --threads 1]

The texts are concatenated in the order given and the first --text-bytes bytes are scored (the engine
splits what exceeds the context into windows; docs/engine-flags.md, scoring). The reference is one
resident run (`--mmap --ppl --logits-out`): `ref agr` and `KL` are against it. Every configuration
streams through the same LRU cache of --cache-mb MiB (`--force-cache`), so the knobs act on the same
budget:

  base                no knob (cached)
  subst 0 ... 0.6     --expert-substitute L   (0: armed and inert)
  drop 0.5 ... 1.0    --drop-cold-experts F   (off = base)

Per configuration and mode, exact (counters and scores; the same on every run and machine):
  ppl, nll            exp(mean nll) and mean nll (nats) of the next token
  top1                share of positions whose argmax is the next token
  ref agr, KL         share whose argmax is the reference's, mean KL(reference || run)
  acc                 --ppl-choices accuracy (options are always scored step-wise: printed once)
  MiB/tok             flash MiB read per scored token
  hit rate            routed slots that were cache hits
  fired               slots substituted / examined, or experts dropped / routed
The last lines state, per configuration, where step-wise and wide disagree.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

MIB = 2**20
SUBST = (0.0, 0.15, 0.3, 0.6)
DROP = (0.5, 0.75, 1.0)


@dataclass(frozen=True)
class Config:
    label: str
    args: tuple[str, ...]


@dataclass(frozen=True)
class Row:
    ppl: float
    nll: float
    top1: float
    ref_agr: float
    kl: float
    mib_tok: float
    hit_rate: float
    fired: str


def configs() -> list[Config]:
    out = [Config("base", ())]
    out += [Config(f"subst {x:g}", ("--expert-substitute", f"{x:g}")) for x in SUBST]
    out += [Config(f"drop {x:g}", ("--drop-cold-experts", f"{x:g}")) for x in DROP]
    return out


def engine_json(cmd: list[str]) -> dict:
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        sys.exit(f"engine failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr}")
    return json.loads(proc.stdout)


def row(d: dict) -> Row:
    c = d["counters"]
    n = d["tokens_scored"]
    slots = c["cache_hits"] + c["cache_misses"]
    if c["subst_examined"]:
        fired = f"{c['subst_changed']}/{c['subst_examined']} subst"
    elif c["weight_routed"]:
        fired = f"{c['experts_dropped']}/{c['experts_routed']} drop"
    else:
        fired = "-"
    return Row(
        d["ppl"],
        d["nll_mean"],
        d["top1_agreement"],
        d["ref_agreement"],
        d["kl_mean"],
        c["flash_bytes"] / MIB / n,
        c["cache_hits"] / slots if slots else 0.0,
        fired,
    )


def resolve_model(args: argparse.Namespace) -> str:
    if args.model:
        return args.model
    from bmoe_ci.models import generate

    (fx,) = generate(None, names=[args.fixture])
    return str(fx.path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--text", required=True, nargs="+", help="held-out text(s) to score, concatenated")
    parser.add_argument("--choices", help="multiple-choice JSONL (--ppl-choices)")
    parser.add_argument("--fixture", default="trained", help="fixture name (bmoe-ci fixtures)")
    parser.add_argument("--model", help="a GGUF file instead of --fixture")
    parser.add_argument("--cache-mb", type=int, default=1)
    parser.add_argument("--text-bytes", type=int, default=8192)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--engine", help="engine binary (default: bmoe-ci build host)")
    args = parser.parse_args()

    if args.engine:
        engine = args.engine
    else:
        from bmoe_ci.builder import build

        engine = str(build("host").path)
    model = resolve_model(args)
    facts = engine_json([engine, "info", "-m", model])
    experts_mib = sum(facts["expert_bytes_per_layer"]) * facts["n_expert"] / MIB
    with tempfile.TemporaryDirectory() as tmp:
        text = Path(tmp) / "text.txt"
        text.write_bytes(b"".join(Path(t).read_bytes() for t in args.text)[: args.text_bytes])
        ref = Path(tmp) / "ref.f32"
        base = [engine, "run", "-m", model, "--json", "-t", str(args.threads)]
        resident = engine_json([*base, "--mmap", "--ppl", str(text), "--logits-out", str(ref)])
        cache = ("--cache-mb", str(args.cache_mb), "--force-cache")
        rows: dict[tuple[str, str], Row] = {}
        acc: dict[str, float] = {}
        for cfg in configs():
            for mode in ("--ppl-step", "--ppl"):
                d = engine_json([*base, *cache, *cfg.args, mode, str(text), "--ppl-ref", str(ref)])
                rows[cfg.label, mode] = row(d)
            if args.choices:
                acc[cfg.label] = engine_json([*base, *cache, *cfg.args, "--ppl-choices", args.choices])["accuracy"]

    print(
        f"model {model}: {facts['n_expert']} experts, top-{facts['top_k']}, {len(facts['moe_layers'])} MoE layers, "
        f"{experts_mib:.2f} MiB of experts; cache {args.cache_mb} MiB "
        f"({100 * min(1.0, args.cache_mb / experts_mib):.0f}% of the experts)"
    )
    print(
        f"text: {resident['tokens_scored']} tokens scored in {resident['windows']} window(s); "
        f"resident (--mmap) ppl {resident['ppl']:.4f}, nll {resident['nll_mean']:.4f}, "
        f"top1 {resident['top1_agreement']:.4f}"
    )
    print()
    head = "| config | mode | ppl | nll | top1 | ref agr | KL | acc | MiB/tok | hit rate | fired |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for cfg in configs():
        for mode, name in (("--ppl-step", "step"), ("--ppl", "wide")):
            r = rows[cfg.label, mode]
            a = f"{acc[cfg.label]:.3f}" if cfg.label in acc and mode == "--ppl-step" else "-"
            print(
                f"| {cfg.label} | {name} | {r.ppl:.4f} | {r.nll:.4f} | {r.top1:.4f} | {r.ref_agr:.4f} | "
                f"{r.kl:.5f} | {a} | {r.mib_tok:.4f} | {100 * r.hit_rate:.1f}% | {r.fired} |"
            )
    print()
    for cfg in configs():
        s, w = rows[cfg.label, "--ppl-step"], rows[cfg.label, "--ppl"]
        print(
            f"{cfg.label}: step-wise ppl {s.ppl:.4f} vs wide {w.ppl:.4f} (x{s.ppl / w.ppl:.4f}), "
            f"ref agreement {s.ref_agr:.4f} vs {w.ref_agr:.4f}, KL {s.kl:.5f} vs {w.kl:.5f}; "
            f"fired step-wise {s.fired}, wide {w.fired}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
