"""Resident decode speed at 1 and 2 threads on a large generated Q8_0 model, side by side.

    python bench/resident_threads.py [--rounds 3] [--tokens 32]

Runs are interleaved (1, 2, 1, 2, ...) so drift on a shared machine hits both columns alike; the
ratio of medians is the figure to read, not the absolute tokens/s. Also checks that both thread
counts produced the same tokens (a speed-up that changed the output would be a bug, not a win).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

from bmoe_ci.builder import build
from bmoe_ci.models import generate


def run(engine: str, model: str, threads: int, tokens: int) -> dict:
    cmd = [
        engine,
        "run",
        "-m",
        model,
        "--mmap",
        "-p",
        "The quick brown fox",
        "-n",
        str(tokens),
        "-t",
        str(threads),
        "--json",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        sys.exit(f"engine failed: {' '.join(cmd)}\n{proc.stderr}")
    return json.loads(proc.stdout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=32)
    args = parser.parse_args()

    engine = str(build("host").path)
    (model,) = generate(None, names=["bench-large"])
    size_mib = sum(f.stat().st_size for f in model.files) / 2**20
    print(f"model {model.name}: {size_mib:.0f} MiB, engine {engine}")

    speeds: dict[int, list[float]] = {1: [], 2: []}
    outputs: dict[int, set[str]] = {1: set(), 2: set()}
    for _ in range(args.rounds):
        for threads in (1, 2):
            result = run(engine, str(model.path), threads, args.tokens)
            speeds[threads].append(result["timing"]["decode_tok_s"])
            outputs[threads].add(result["text_hex"])

    print(f"{'threads':>8} {'decode tok/s (min/median/max)':>32}")
    for threads in (1, 2):
        s = speeds[threads]
        print(f"{threads:>8} {min(s):>10.2f} {statistics.median(s):>10.2f} {max(s):>10.2f}")
    ratio = statistics.median(speeds[2]) / statistics.median(speeds[1])
    same = len(outputs[1] | outputs[2]) == 1
    print(f"speed-up 2 threads / 1 thread (median): {ratio:.2f}x; identical output: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
