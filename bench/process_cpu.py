"""Where a command's CPU goes, per process: samples every process's user + system time from
/proc/<pid>/stat while the command runs, then prints the core-seconds of each kind of process (the
emulated engines, the x86 engines, the xdist workers, the controller, the stand-ins, ...) and the
busiest processes. Processes older than the command count only what they used while it ran (the
machine's own, too: a VM's agent, kernel threads). Processes that start and end between two samples
are missed: sample often.

    python bench/process_cpu.py -- make gates
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


def _cpu_seconds() -> dict[tuple[int, str], float]:
    """(pid, command line) -> user + system seconds, for every process readable now."""
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        out[(int(entry.name), cmd or f"[{stat[stat.index('(') + 1 : stat.rindex(')')]}]")] = (
            int(fields[11]) + int(fields[12])
        ) / TICK
    return out


def kind(cmd: str) -> str:
    """A process's kind, by its command line."""
    rules = (
        ("qemu-aarch64", "emulated engine (qemu)"),
        ("bmoe_ci.standins.adbd", "stand-in adbd"),
        ("import sys;exec(eval(sys.stdin.readline()))", "xdist worker"),
        ("pytest", "pytest controller"),
        ("sshd", "sshd"),
        ("adb", "adb server"),
        ("zig", "zig (builds)"),
        ("/store/", "x86 engine"),
    )
    return next((name for needle, name in rules if needle in cmd), cmd.split(" ")[0][-40:])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--every", type=float, default=0.5, help="seconds between samples (default 0.5)")
    ap.add_argument("--top", type=int, default=15, help="how many single processes to list")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("name a command after --")
    before = _cpu_seconds()  # what the machine's older processes had used already: not the command's
    seen: dict[tuple[int, str], float] = {}
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            seen.update(_cpu_seconds())  # a process's time only grows: the last sample is its total
            done.wait(args.every)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    started = time.monotonic()
    rc = subprocess.call(command)
    done.set()
    sampler.join()
    seen.update(_cpu_seconds())
    seen = {key: seconds - before.get(key, 0.0) for key, seconds in seen.items()}
    wall = time.monotonic() - started
    by_kind: dict[str, float] = collections.defaultdict(float)
    for (_, cmd), seconds in seen.items():
        by_kind[kind(cmd)] += seconds
    print(f"{' '.join(command)}: exit {rc}, {wall:.1f} s wall; core-seconds by kind of process:", file=sys.stderr)
    for name, total in sorted(by_kind.items(), key=lambda kv: -kv[1])[:20]:
        print(f"{total:8.1f}  {name}", file=sys.stderr)
    print("busiest processes:", file=sys.stderr)
    for (pid, cmd), seconds in sorted(seen.items(), key=lambda kv: -kv[1])[: args.top]:
        print(f"{seconds:8.1f}  {pid} {cmd[:120]}", file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main())
