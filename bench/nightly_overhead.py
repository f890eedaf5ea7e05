"""Wall-time overhead of `bmoe-ci nightly` over the plain gate run it drives, side by side.

    bmoe-ci farm up && python bench/nightly_overhead.py [--rounds 3] [--pool nightly] [--fixture NAME ...]

Each round runs the exact gate command the nightly runs (`pytest gates --bmoe-device pool:P -n N ...`, built
by the nightly's own `gate_command`) and then `bmoe-ci nightly` on the same pool, alternating so both
see the same machine load. Everything is warm (one untimed nightly first: built, generated, pushed).
Prints each wall time, the medians, and the nightly's overhead as a ratio and in seconds: what the
history, classification and report add to a night. On a loaded machine the paired runs are noisy, so
it also prints CPU seconds (user + sys of the processes each command waited for) and the nightly's own
split (its log line: the gate run's wall time, and the nightly's own work around it), which depend
far less on how busy the machine was.
"""

from __future__ import annotations

import argparse
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bmoe_ci.farm import load_farm
from bmoe_ci.nightly.run import NightlyOptions, gate_command

REPO = Path(__file__).resolve().parents[1]


OWN = re.compile(r"wall time: gate run ([0-9.]+) s, the nightly's own work ([0-9.]+) s")


def timed(cmd: list[str]) -> tuple[float, str, float]:
    """Wall seconds, stderr, and CPU seconds (user + sys) of the command and every process it waited
    for (local engines, qemu, ssh clients; not what sshd runs for it, which both commands share)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False)
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        sys.exit(f"failed ({' '.join(cmd)}):\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, proc.stderr, cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--pool", default="nightly")
    ap.add_argument("--farm", help="farm YAML (default: the embedded local farm)")
    ap.add_argument("--fixture", action="append", default=[])
    args = ap.parse_args()
    farm = load_farm(args.farm)
    n_devices = len(farm.pools[args.pool])
    with tempfile.TemporaryDirectory(prefix="bmoe-nightly-bench-") as tmp:
        history = Path(tmp) / "nightly"
        opts = NightlyOptions(
            history=history, pool=args.pool, farm=Path(args.farm) if args.farm else None, fixtures=tuple(args.fixture)
        )
        nightly = [sys.executable, "-m", "bmoe_ci.cli", "nightly", "--pool", args.pool, "--history", str(history)]
        if args.farm:
            nightly += ["--farm", args.farm]
        for f in args.fixture:
            nightly += ["--fixture", f]
        timed(nightly)  # warm-up: build, fixtures, push; and a first history row
        plain, full, own, plain_cpu, full_cpu = [], [], [], [], []
        for r in range(args.rounds):
            wall, _, cpu = timed(gate_command(opts, Path(tmp) / f"plain-{r}", n_devices))
            plain.append(wall)
            plain_cpu.append(cpu)
            wall, log, cpu = timed(nightly)
            full.append(wall)
            full_cpu.append(cpu)
            m = OWN.search(log)
            if m is None:
                sys.exit("the nightly did not log its wall-time split")
            own.append(wall - float(m.group(1)))  # everything but the gate run: start-up included
            print(
                f"round {r + 1}: plain gate run {plain[-1]:.2f} s ({plain_cpu[-1]:.1f} CPU s), nightly "
                f"{full[-1]:.2f} s ({full_cpu[-1]:.1f} CPU s; its gate run {float(m.group(1)):.2f} s, the rest "
                f"{own[-1]:.2f} s)",
                flush=True,
            )
    p, n = statistics.median(plain), statistics.median(full)
    print(
        f"pool {args.pool} ({n_devices} devices), fixtures {', '.join(args.fixture) or 'default'}, "
        f"{args.rounds} rounds, medians:"
    )
    print(f"  plain gate run  {p:7.2f} s")
    print(f"  bmoe-ci nightly {n:7.2f} s")
    print(f"  nightly / plain {n / p:7.3f}   (overhead {n - p:+.2f} s, {100 * (n - p) / p:+.1f} %)")
    pc, nc = statistics.median(plain_cpu), statistics.median(full_cpu)
    print(f"  CPU seconds     {pc:7.1f} plain, {nc:.1f} nightly: ratio {nc / pc:.3f} (less sensitive to other load)")
    o = statistics.median(own)
    print(f"  the nightly's own work (its wall minus its gate run): {o:.2f} s = {100 * o / p:.1f} % of the plain run")


if __name__ == "__main__":
    main()
