"""Expert streaming on a model several times larger than the cache: flash bytes per token, hit rate,
decode tokens/s, and streamed against --mmap, side by side in one run.

    python bench/streaming.py [--rounds 3] [--tokens 32] [--threads 1] [--budgets 64,512] [--baseline REF]

The model is the generated `bench-large` fixture (32 experts x 8 MoE layers, top-4, Q8_0: ~411 MiB
of experts, 1.6 MiB each) read from its file with O_DIRECT (the result's warnings say so if the
filesystem refused). Configurations: --mmap (the resident reference, whole file mapped; after the
first round it sits in the page cache), streamed with the cache off, and streamed with each budget.

`--baseline REF` also builds the engine of a git revision (its `engine/` directory, from `git
archive`) and runs its streamed configurations in the same rounds, marked `@REF`: a before/after
table from one run. `vs cache off` compares each row with the cache-off row of the same engine.

Runs are interleaved (every configuration once per round, in a rotating order) so drift on a shared
machine hits all of them alike; the medians are the figures to read. Flash bytes per token and the
hit rate are decode-only, taken from the route trace (the prompt is one batch whose reads would
otherwise dominate a short run); they are exact and identical in every round. Read amplification is
the whole run's bytes the reads returned from the file (`flash_read_bytes`: a direct read's alignment
padding included) over the bytes of the experts read (`flash_bytes`); the goal is <= 1.02. The script also
checks that every configuration generated the same bytes (a speed-up that changed the output would
be a bug).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from bmoe_ci.builder import build
from bmoe_ci.models import generate
from bmoe_ci.paths import Places

PROMPT = "The quick brown fox jumps over the lazy dog"
MIB = 2**20


def run(engine: str, model: str, args: list[str], tokens: int, threads: int, trace: Path) -> dict:
    cmd = [
        engine,
        "run",
        "-m",
        model,
        "-p",
        PROMPT,
        "-n",
        str(tokens),
        "-t",
        str(threads),
        "--json",
        "--route-trace",
        str(trace),
        *args,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        sys.exit(f"engine failed: {' '.join(cmd)}\n{proc.stderr}")
    return json.loads(proc.stdout)


def baseline_engine(ref: str, into: Path) -> str:
    """Builds the engine as it is at git revision `ref` (its engine/ directory) and returns its path."""
    archive = subprocess.run(
        ["git", "-C", str(Places.from_environ(os.environ).source_tree()), "archive", ref, "engine"],
        capture_output=True,
        check=False,
    )
    if archive.returncode != 0:
        sys.exit(f"--baseline {ref}: git archive failed: {archive.stderr.decode(errors='replace').strip()}")
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(into, filter="data")
    return str(build("host", engine_dir=into / "engine").path)


def decode_figures(trace: Path) -> tuple[float, float, int]:
    """(flash bytes per decode token, decode hit rate, decode steps) from a route trace."""
    lines = [ln for ln in trace.read_text().splitlines() if not ln.startswith("#")]
    rows = [r for r in csv.DictReader(io.StringIO("\n".join(lines))) if r["phase"] == "1"]
    steps = len({r["step"] for r in rows})
    if not rows or not steps:
        return 0.0, 0.0, 0
    hits = sum(1 for r in rows if r["residency"] != "0")
    return sum(int(r["expert_bytes"]) for r in rows) / steps, hits / len(rows), steps


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--budgets", default="64,512", help="cache budgets in MiB, comma-separated")
    parser.add_argument("--baseline", default="", help="a git revision whose engine runs beside this one")
    args = parser.parse_args()

    engine = str(build("host").path)
    keep = tempfile.TemporaryDirectory()
    base_engine = baseline_engine(args.baseline, Path(keep.name)) if args.baseline else ""
    (model,) = generate(None, names=["bench-large"])
    size_mib = sum(f.stat().st_size for f in model.files) / MIB
    facts = json.loads(
        subprocess.run([engine, "info", "-m", str(model.path)], capture_output=True, text=True, check=True).stdout
    )
    per_layer = facts["expert_bytes_per_layer"]  # one expert of each MoE layer (types may differ per layer)
    experts_mib = sum(per_layer) * facts["n_expert"] / MIB
    budgets = [int(b) for b in args.budgets.split(",") if b]
    streamed: dict[str, list[str]] = {"cache off": []}
    for b in budgets:
        streamed[f"cache {b} MiB"] = ["--cache-mb", str(b), "--force-cache"]
    # configuration -> (engine, arguments, the cache-off row of the same engine)
    configs: dict[str, tuple[str, list[str], str]] = {"mmap": (engine, ["--mmap"], "cache off")}
    configs.update({name: (engine, a, "cache off") for name, a in streamed.items()})
    if base_engine:
        off = f"cache off @{args.baseline}"
        configs.update({f"{name} @{args.baseline}": (base_engine, a, off) for name, a in streamed.items()})
    print(
        f"model {model.name}: {size_mib:.0f} MiB file, {experts_mib:.0f} MiB of experts "
        f"({facts['n_expert']} x {len(facts['moe_layers'])} layers, "
        f"{sum(per_layer) / len(per_layer) / MIB:.2f} MiB each on average, "
        f"top-{facts['top_k']}); engine {engine}; {args.tokens} tokens, -t {args.threads}, {args.rounds} rounds"
    )
    if base_engine:
        print(f"  baseline @{args.baseline}: engine {base_engine}")
    for b in budgets:
        share, ratio = b / experts_mib, experts_mib / b
        print(f"  cache {b} MiB holds {share:.0%} of the experts (the model is {ratio:.1f}x the budget)")

    speeds: dict[str, list[float]] = {c: [] for c in configs}
    figures: dict[str, tuple[float, float, int]] = {}
    counters: dict[str, dict] = {}
    outputs: dict[str, set[str]] = {c: set() for c in configs}
    warnings: set[str] = set()
    names = list(configs)
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.csv"
        for rnd in range(args.rounds):
            order = names[rnd % len(names) :] + names[: rnd % len(names)]
            for name in order:
                exe, extra, _ = configs[name]
                r = run(exe, str(model.path), extra, args.tokens, args.threads, trace)
                speeds[name].append(r["timing"]["decode_tok_s"])
                outputs[name].add(r["text_hex"])
                warnings.update(r["warnings"])
                counters[name] = {**r["counters"], **r.get("io", {})}
                if name != "mmap":
                    figures[name] = decode_figures(trace)

    mmap_speed = statistics.median(speeds["mmap"])
    print()
    print(
        f"{'configuration':<24} {'flash MiB/token':>15} {'hit rate':>9} {'decode tok/s (min/med/max)':>28} "
        f"{'vs --mmap':>10} {'vs cache off':>13} {'reads':>7} {'flash MiB':>10} {'read amp':>9}"
    )
    for name in names:
        s = speeds[name]
        med = statistics.median(s)
        if name == "mmap":
            per_tok, hit, reads, flash, amp = "-", "-", "-", "-", "-"
        else:
            f = figures[name]
            per_tok, hit = f"{f[0] / MIB:.2f}", f"{f[1]:.1%}"
            c = counters[name]
            reads, flash = str(c["flash_reads"]), f"{c['flash_bytes'] / MIB:.0f}"
            amp = f"{c['flash_read_bytes'] / c['flash_bytes']:.4f}" if "flash_read_bytes" in c else "-"
        off = statistics.median(speeds[configs[name][2]])
        print(
            f"{name:<24} {per_tok:>15} {hit:>9} {min(s):>9.2f} {med:>8.2f} {max(s):>8.2f} "
            f"{med / mmap_speed:>9.2f}x {med / off:>12.2f}x {reads:>7} {flash:>10} {amp:>9}"
        )
    keep.cleanup()
    same = len(set().union(*outputs.values())) == 1
    print()
    print(f"O_DIRECT: {'refused: ' + '; '.join(sorted(warnings)) if warnings else 'used (no fallback warning)'}")
    print(f"identical output in every configuration and round: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
