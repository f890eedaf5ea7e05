"""The lossy knobs side by side in one run: what --drop-cold-experts and --expert-substitute buy in
flash reads and what they cost in router weight, against --n-expert-used at comparable cost.

    python bench/lossy_knobs.py [--cache-mb 24] [--tokens 48] [--threads 1]

The model is the generated `bench-lossy` fixture (top-8 of 32 experts, 8 MoE layers, Q8_0, about 52
MiB of experts, 208 KiB each), streamed through an LRU cache of --cache-mb MiB, greedy, over a few
fixed prompts. Every configuration runs on every prompt, prompt by prompt, in one invocation.

Per configuration, decode phase only (the prompt is one batch whose reads would otherwise dominate),
summed over the prompts and taken from the route trace and the counters (exact, not timed):
  reads/token       expert reads per decode token (trace rows with expert_bytes > 0)
  MiB/token         flash bytes per decode token
  reads avoided     1 - reads / the undropped cached baseline's reads
  weight discarded  router weight mass thrown away, as a share of the routing's mass:
                      --drop-cold-experts F    weight_dropped / weight_routed (the engine's counters)
                      --n-expert-used k'       from the BASELINE's route trace: the final weights of the
                                               slots beyond k' of each decode routing (what the narrower
                                               routing drops) over the routing's mass
                      --expert-substitute L    0: the same number of experts runs, weights are the router's
  hit rate          decode routed slots that were cache hits (residency != 0)
  substituted       subst_changed / subst_examined
The "comparable" lines pair each drop threshold with the --n-expert-used width whose discarded mass is
closest, and print the ratio of the reads each avoids. Decode tok/s is printed for orientation only
(one run per cell on a shared machine; read the exact columns).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import subprocess
import sys
import tempfile
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from bmoe_ci.builder import build
from bmoe_ci.models import generate

PROMPTS = [
    "Once upon a time in a land far away",
    "The quick brown fox jumps over the lazy dog",
    "def fibonacci(n):\n    return",
    "In 1905 a patent clerk in Bern",
]
MIB = 2**20


@dataclass
class Cell:
    steps: int = 0
    reads: int = 0
    bytes: int = 0
    slots: int = 0
    hits: int = 0
    weight_routed: float = 0.0
    weight_dropped: float = 0.0
    changed: int = 0
    examined: int = 0
    decode_s: float = 0.0
    tail_mass: dict[int, float] = field(default_factory=lambda: defaultdict(float))  # baseline only
    mass: float = 0.0  # baseline only: sum of the decode routings' final weights


def run(
    engine: str, model: str, prompt: str, tokens: int, threads: int, cache_mb: int, extra: list[str], trace: Path
) -> dict:
    cmd = [
        engine,
        "run",
        "-m",
        model,
        "-p",
        prompt,
        "-n",
        str(tokens),
        "-t",
        str(threads),
        "--json",
        "--cache-mb",
        str(cache_mb),
        "--force-cache",
        "--route-trace",
        str(trace),
        *extra,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        sys.exit(f"engine failed: {' '.join(cmd)}\n{proc.stderr}")
    return json.loads(proc.stdout)


def decode_rows(trace: Path) -> list[dict[str, str]]:
    lines = [ln for ln in trace.read_text().splitlines() if not ln.startswith("#")]
    return [r for r in csv.DictReader(io.StringIO("\n".join(lines))) if r["phase"] == "1"]


def add(cell: Cell, result: dict, rows: list[dict[str, str]], k: int, baseline: bool) -> None:
    c = result["counters"]
    cell.steps += len({r["step"] for r in rows})
    cell.reads += sum(1 for r in rows if int(r["expert_bytes"]) > 0)
    cell.bytes += sum(int(r["expert_bytes"]) for r in rows)
    cell.slots += len(rows)
    cell.hits += sum(1 for r in rows if r["residency"] != "0")
    cell.weight_routed += c["weight_routed"]
    cell.weight_dropped += c["weight_dropped"]
    cell.changed += c["subst_changed"]
    cell.examined += c["subst_examined"]
    cell.decode_s += result["timing"]["decode_s"]
    if baseline:
        for r in rows:
            w = float(r["weight"])
            cell.mass += w
            for kk in range(1, k):
                if int(r["slot"]) >= kk:
                    cell.tail_mass[kk] += w


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache-mb", type=int, default=24)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--widths", default="7,6,5,4,3", help="--n-expert-used values, comma-separated")
    args = parser.parse_args()

    engine = str(build("host").path)
    (model,) = generate(None, names=["bench-lossy"])
    facts = json.loads(
        subprocess.run([engine, "info", "-m", str(model.path)], capture_output=True, text=True, check=True).stdout
    )
    k, n_layers = facts["top_k"], len(facts["moe_layers"])
    per_layer = facts["expert_bytes_per_layer"]  # one expert of each MoE layer (types may differ per layer)
    experts_mib = sum(per_layer) * facts["n_expert"] / MIB
    widths = [int(w) for w in args.widths.split(",") if w]
    configs: dict[str, list[str]] = {"baseline (cached, undropped)": []}
    for F in ("0.5", "0.75", "1.0"):
        configs[f"--drop-cold-experts {F}"] = ["--drop-cold-experts", F]
    for w in widths:
        configs[f"--n-expert-used {w}"] = ["--n-expert-used", str(w)]
    for L in ("0.15", "0.30"):
        configs[f"--expert-substitute {L}"] = ["--expert-substitute", L]
    print(
        f"model {model.name}: {facts['n_expert']} experts x {n_layers} MoE layers, top-{k}, "
        f"{sum(per_layer) / n_layers / 1024:.0f} KiB per expert (mean over layers), {experts_mib:.1f} MiB of experts; "
        f"cache {args.cache_mb} MiB ({args.cache_mb / experts_mib:.0%} of them); {len(PROMPTS)} prompts x "
        f"{args.tokens} tokens, -t {args.threads}; engine {engine}"
    )

    cells = {name: Cell() for name in configs}
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.csv"
        for prompt in PROMPTS:
            for name, extra in configs.items():
                r = run(engine, str(model.path), prompt, args.tokens, args.threads, args.cache_mb, extra, trace)
                add(cells[name], r, decode_rows(trace), k, baseline=not extra)

    base = cells["baseline (cached, undropped)"]

    def discarded(name: str) -> float:
        cell = cells[name]
        if name.startswith("--drop-cold-experts"):
            return cell.weight_dropped / cell.weight_routed if cell.weight_routed else 0.0
        if name.startswith("--n-expert-used"):
            return base.tail_mass[int(name.split()[-1])] / base.mass
        return 0.0

    def avoided(name: str) -> float:
        return 1.0 - cells[name].reads / base.reads

    print()
    head = (
        f"{'configuration':<30} {'reads/token':>11} {'MiB/token':>9} {'reads avoided':>13} "
        f"{'weight discarded':>16} {'hit rate':>8} {'substituted':>11} {'decode tok/s':>12}"
    )
    print(head)
    print("-" * len(head))
    for name, cell in cells.items():
        subst = f"{cell.changed / cell.examined:.1%}" if cell.examined else "-"
        print(
            f"{name:<30} {cell.reads / cell.steps:>11.2f} {cell.bytes / cell.steps / MIB:>9.2f} "
            f"{avoided(name):>13.1%} {discarded(name):>16.1%} {cell.hits / cell.slots:>8.1%} {subst:>11} "
            f"{cell.steps / cell.decode_s:>12.1f}"
        )
    print()
    print("comparable cost (the --n-expert-used width whose discarded mass is closest):")
    for F in ("0.5", "0.75", "1.0"):
        d = f"--drop-cold-experts {F}"
        w = min((f"--n-expert-used {w}" for w in widths), key=lambda n: abs(discarded(n) - discarded(d)))
        ratio = avoided(d) / avoided(w) if avoided(w) > 0 else float("inf")
        print(
            f"  {d:<26} discards {discarded(d):5.1%}, avoids {avoided(d):5.1%} of the reads; "
            f"{w} discards {discarded(w):5.1%}, avoids {avoided(w):5.1%}: {ratio:.2f}x the reads avoided"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
