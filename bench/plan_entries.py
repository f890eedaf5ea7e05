"""Where a device's gate time goes: the engine time of each entry of one fixture's gate plan.

    python bench/plan_entries.py FIXTURE [--arch aarch64] [--rounds 3]

Runs every entry of `gates/plan.py`'s plan for FIXTURE one by one (its own process, as `bmoe batch`
would run it, route traces into a temporary directory), with the engine built for the host or, with
`--arch aarch64`, for aarch64 under `qemu-aarch64-static` (the emulated phones of the local farm).
Rounds are interleaved; each entry's median is printed with its share of the plan, largest first.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bmoe_ci.builder import build
from bmoe_ci.models import generate
from bmoe_ci.paths import Places

sys.path.insert(0, str(Places.from_environ(os.environ).source_tree()))  # a script reads its environment
from gates.plan import SCORE_TEXT, SCORING_DIR, fixture_plan


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("fixture")
    ap.add_argument("--arch", choices=("host", "aarch64"), default="host")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    engine = build("aarch64-linux-musl" if args.arch == "aarch64" else "host").path
    prefix = ["qemu-aarch64-static"] if args.arch == "aarch64" else []
    (fx,) = generate(names=[args.fixture])
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model = work / Path(fx.path).name
        stem = Path(fx.path).name.split("-00001-of-")[0].removesuffix(".gguf")
        for part in Path(fx.path).parent.glob(f"{stem}*.gguf"):  # every shard of a split fixture
            (work / part.name).symlink_to(part.resolve())
        (work / SCORING_DIR).mkdir()
        data = Places.from_environ(os.environ).source_tree() / "gates" / "data"
        shutil.copy(data / SCORE_TEXT, work / SCORING_DIR / SCORE_TEXT)
        plan = fixture_plan(
            str(model), args.fixture, trace=lambda e: str(work / f"{e}.trace"), logits=str(work / "logits.bin")
        )
        times: dict[str, list[float]] = {i: [] for i, _ in plan}
        for _ in range(args.rounds):
            for entry, argv in plan:
                start = time.monotonic()
                proc = subprocess.run([*prefix, str(engine), *argv], capture_output=True, check=False)
                times[entry].append(time.monotonic() - start)
                if proc.returncode != 0:
                    sys.exit(f"{entry}: exit {proc.returncode}: {proc.stderr.decode(errors='replace')[:300]}")
    med = {e: statistics.median(t) for e, t in times.items()}
    total = sum(med.values())
    print(f"{args.fixture} on {args.arch}, {len(plan)} entries, median of {args.rounds} rounds")
    for entry, t in sorted(med.items(), key=lambda kv: -kv[1]):
        print(f"{t:7.2f} s  {100 * t / total:5.1f} %  {entry}")
    print(f"{total:7.2f} s  total")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
