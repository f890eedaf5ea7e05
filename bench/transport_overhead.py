"""What one command and one upload cost on each transport of the embedded local farm, side by side.

    bmoe-ci farm up && python bench/transport_overhead.py --commands 50 --mib 10

Every device gets the same work in interleaved rounds (local, ssh, adb, local, ...), so a noisy
machine slows them alike: read the ratios to the local transport, not the milliseconds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from bmoe_ci.farm import load_farm, open_transport
from bmoe_ci.standins import localfarm


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--commands", type=int, default=50, help="commands per device (default 50)")
    ap.add_argument("--mib", type=int, default=10, help="size of the uploaded file in MiB (default 10)")
    ap.add_argument("--rounds", type=int, default=3, help="uploads per device (default 3)")
    args = ap.parse_args()
    farm = load_farm()
    names = ["host", str(localfarm.layout()["SSH_HOST_NAME"]), localfarm.ADB_DEVICE]
    transports = {n: open_transport(farm.devices[n]) for n in names}
    for t in transports.values():
        t.connect()
    cmd: dict[str, list[float]] = {n: [] for n in names}
    put: dict[str, list[float]] = {n: [] for n in names}
    for _ in range(args.commands):
        for n, t in transports.items():
            start = time.perf_counter()
            assert t.run(["true"], 30).ok
            cmd[n].append(time.perf_counter() - start)
    with tempfile.TemporaryDirectory() as tmp:
        blob = Path(tmp) / "blob.bin"
        blob.write_bytes(os.urandom(args.mib << 20))
        for _ in range(args.rounds):
            for n, t in transports.items():
                start = time.perf_counter()
                t.put(blob, "bench-blob.bin")
                put[n].append(time.perf_counter() - start)
    for t in transports.values():
        t.run(["rm", "-f", "bench-blob.bin"], 30)
        t.close()
    base_cmd, base_put = statistics.median(cmd["host"]), statistics.median(put["host"])
    upload = f"{args.mib} MiB put ms"
    print(f"{'device':<12} {'transport':<9} {'command ms':>10} {'x local':>8} {upload:>14} {'x local':>8}")
    for n in names:
        c, p = statistics.median(cmd[n]), statistics.median(put[n])
        print(
            f"{n:<12} {farm.devices[n].transport:<9} {c * 1e3:>10.1f} {c / base_cmd:>8.1f} "
            f"{p * 1e3:>14.1f} {p / base_put:>8.1f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
