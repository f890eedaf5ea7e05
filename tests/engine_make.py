"""The engine's own build (engine/Makefile, the system compiler) for the project's tests."""

from __future__ import annotations

import fcntl
import subprocess
from pathlib import Path

ENGINE = Path(__file__).resolve().parents[1] / "engine"


def make_engine(target: str) -> Path:
    """Builds `target` (a path under engine/, e.g. ``build/bmoe``) and returns it. xdist workers share
    engine/build: one make runs at a time (two would write the same object files at once)."""
    (ENGINE / "build").mkdir(exist_ok=True)
    with open(ENGINE / "build" / ".make.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        subprocess.run(["make", "-s", "-C", str(ENGINE), target], check=True)
    return ENGINE / target
