"""Where a device's gate time goes: the engine time of the gate plans of `gates/plan.py`.

    python bench/plan_entries.py FIXTURE [--arch aarch64] [--rounds 3]
    python bench/plan_entries.py --batch [FIXTURE ...] [--arch aarch64] [--kernels neon,neon-dot] [--rounds 1]

Without `--batch`: every entry of FIXTURE's plan one by one (its own process, route traces into a
temporary directory); each entry's median is printed with its share of the plan, largest first.

With `--batch`: each fixture's whole plan as one `bmoe batch` process, as a device runs it (default: every
default fixture), once per kernel path of `--kernels` (`BMOE_KERNELS`; default: the path the engine
picks), the paths side by side in one table with each fixture's seconds and the totals.

The engine is built for the host or, with `--arch aarch64`, for aarch64 and run under
`qemu-aarch64-static` (the emulated phones of the local farm). Rounds are interleaved.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bmoe_ci.builder import build
from bmoe_ci.models import FixtureFile, generate
from bmoe_ci.paths import Places

sys.path.insert(0, str(Places.from_environ(os.environ).source_tree()))  # a script reads its environment
from gates.plan import SCORING_DIR, fixture_plan


def stage(fixtures: list[FixtureFile], work: Path) -> dict[str, Path]:
    """Each fixture's file (every shard of a split one) linked into `work`, the scoring inputs beside them
    (as the gate run pushes them); fixture name -> the path its plan names."""
    data = Places.from_environ(os.environ).source_tree() / "gates" / "data"
    (work / SCORING_DIR).mkdir()
    for f in data.iterdir():
        if f.is_file():
            shutil.copy(f, work / SCORING_DIR / f.name)
    models = {}
    for fx in fixtures:
        stem = Path(fx.path).name.split("-00001-of-")[0].removesuffix(".gguf")
        for part in Path(fx.path).parent.glob(f"{stem}*.gguf"):
            if not (work / part.name).exists():
                (work / part.name).symlink_to(part.resolve())
        models[fx.name] = work / Path(fx.path).name
    return models


def run(cmd: list[str], env: dict[str, str], stdin: bytes | None = None) -> float:
    start = time.monotonic()
    proc = subprocess.run(cmd, input=stdin, capture_output=True, check=False, env=env)
    took = time.monotonic() - start
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd[:4])}: exit {proc.returncode}: {proc.stderr.decode(errors='replace')[:300]}")
    return took


def per_entry(fixture: str, engine: list[str], rounds: int, arch: str) -> None:
    (fx,) = generate(names=[fixture])
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model = stage([fx], work)[fixture]
        plan = fixture_plan(str(model), fixture, trace=lambda e: str(work / f"{e}.trace"), logits=str(work / "l.bin"))
        times: dict[str, list[float]] = {i: [] for i, _ in plan}
        for _ in range(rounds):
            for entry, argv in plan:
                times[entry].append(run([*engine, *argv], dict(os.environ)))
    med = {e: statistics.median(t) for e, t in times.items()}
    total = sum(med.values())
    print(f"{fixture} on {arch}, {len(plan)} entries, median of {rounds} rounds")
    for entry, t in sorted(med.items(), key=lambda kv: -kv[1]):
        print(f"{t:7.2f} s  {100 * t / total:5.1f} %  {entry}")
    print(f"{total:7.2f} s  total")


def batches(names: list[str] | None, engine: list[str], rounds: int, arch: str, kernels: list[str]) -> None:
    fixtures = generate(names=names or None)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        models = stage(fixtures, work)
        plans = {}
        for fx in fixtures:
            plan = fixture_plan(str(models[fx.name]), fx.name, trace=lambda e, n=fx.name: str(work / f"{n}-{e}.trace"))
            plans[fx.name] = "".join(json.dumps({"id": i, "argv": a}) + "\n" for i, a in plan).encode()
        times: dict[tuple[str, str], list[float]] = {}
        for r in range(rounds):
            for k in kernels if r % 2 == 0 else kernels[::-1]:  # alternate the order: drift hits every path
                env = dict(os.environ, **({"BMOE_KERNELS": k} if k != "default" else {}))
                for name, plan_bytes in plans.items():
                    times.setdefault((name, k), []).append(run([*engine, "batch", "-"], env, plan_bytes))
    print(f"each fixture's plan as one `bmoe batch` on {arch}, seconds, median of {rounds} round(s)")
    print("| fixture | entries | " + " | ".join(kernels) + " |")
    print("|---|---|" + "---|" * len(kernels))
    totals = dict.fromkeys(kernels, 0.0)
    for name, plan_bytes in plans.items():
        cells = []
        for k in kernels:
            t = statistics.median(times[(name, k)])
            totals[k] += t
            cells.append(f"{t:.1f}")
        entries = plan_bytes.count(b"\n")
        print(f"| `{name}` | {entries} | " + " | ".join(cells) + " |")
    print("| all | | " + " | ".join(f"**{totals[k]:.1f}**" for k in kernels) + " |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("fixtures", nargs="*", metavar="FIXTURE")
    ap.add_argument("--arch", choices=("host", "aarch64"), default="host")
    ap.add_argument("--rounds", type=int, default=None, help="default: 3 per entry, 1 with --batch")
    ap.add_argument("--batch", action="store_true", help="each fixture's whole plan as one bmoe batch")
    ap.add_argument("--kernels", default="default", help="comma-separated BMOE_KERNELS paths (with --batch)")
    args = ap.parse_args()
    engine_path = build("aarch64-linux-musl" if args.arch == "aarch64" else "host").path
    engine = [*(["qemu-aarch64-static"] if args.arch == "aarch64" else []), str(engine_path)]
    if args.batch:
        batches(args.fixtures, engine, args.rounds or 1, args.arch, args.kernels.split(","))
    elif len(args.fixtures) == 1:
        per_entry(args.fixtures[0], engine, args.rounds or 3, args.arch)
    else:
        ap.error("name one FIXTURE, or use --batch")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
