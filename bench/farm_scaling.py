"""Farm scaling and orchestration overhead of the gate suite, measured side by side in one run.

    bmoe-ci farm up && python bench/farm_scaling.py [--rounds 2] [--workers 4]

For each round: every device of the farm alone (serially), then all of them at once with xdist
`-n WORKERS`. Prints the wall time of each, the sum of the single-device runs against the parallel
run (the scaling ratio), and, from each run's summary.json, the engine's own time against the wall
time (the orchestration overhead). Everything is warm (built, generated and pushed before timing),
so the figures are the gates themselves. Read the ratios; absolute seconds vary on shared machines.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

from bmoe_ci.farm import load_farm
from bmoe_ci.gaterun.suite import LOG_NAME, SuiteCall, run_gate_suite
from bmoe_ci.paths import Places

REPO = Path(__file__).resolve().parents[1]


def gate_run(farm: Path, devices: str, workers: int, results: Path) -> tuple[float, dict]:
    call = SuiteCall(tree=REPO, farm=farm, devices=(devices,), results=results, workers=workers, log=results / LOG_NAME)
    run = run_gate_suite(call)
    if run.returncode != 0 or run.summary is None:
        log = run.log.read_text(errors="replace") if run.log and run.log.is_file() else ""
        sys.exit(f"gate run failed ({' '.join(run.command)}):\n{log[-5000:]}")
    return run.seconds, run.summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--workers", type=int, default=4)
    args = parser.parse_args()
    farm = load_farm(None, Places.from_environ(os.environ))  # a script: it reads its environment itself
    names = list(farm.devices)
    out = Path(tempfile.mkdtemp(prefix="bmoe-bench-"))
    gate_run(farm.path, "all", 0, out / "warm-up")  # build, generate, push: not part of the figures

    alone: dict[str, list[float]] = {n: [] for n in names}
    parallel: list[float] = []
    engine_parallel: list[float] = []
    overheads: list[float] = []
    for r in range(args.rounds):
        for name in names:
            wall, summary = gate_run(farm.path, name, 0, out / f"{r}-{name}")
            alone[name].append(wall)
            overheads.append(wall - summary["devices"][name]["engine_s"])
        wall, summary = gate_run(farm.path, "all", args.workers, out / f"{r}-all")
        parallel.append(wall)
        engine_parallel.append(max(d["engine_s"] for d in summary["devices"].values()))

    print(f"{'run':<24}{'wall s (median of ' + str(args.rounds) + ')':>26}")
    for name in names:
        print(f"{name + ' alone':<24}{statistics.median(alone[name]):>26.2f}")
    total = sum(statistics.median(v) for v in alone.values())
    par = statistics.median(parallel)
    print(f"{'sum of devices alone':<24}{total:>26.2f}")
    print(f"{'all, -n ' + str(args.workers):<24}{par:>26.2f}")
    print(
        f"scaling: parallel / sum of single-device runs = {par / total:.2f} "
        f"(1.00 = no gain; {1 / len(names):.2f} = perfect on {len(names)} devices)"
    )
    print(
        f"orchestration overhead of a single-device run (wall - engine time), median: "
        f"{statistics.median(overheads):.2f} s"
    )
    print(f"parallel run: wall {par:.2f} s vs busiest device's engine time {statistics.median(engine_parallel):.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
