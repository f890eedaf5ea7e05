"""Judging engine flags with the engine's own `validate()` (`bmoe check`), run on this machine."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

from bmoe_ci.paths import Places


@lru_cache(maxsize=1)
def host_engine(places: Places | None = None) -> Path:
    """The engine built for this machine (from the build cache when the tree is unchanged)."""
    from bmoe_ci.builder import build

    return build("host", places=places).path


def check_flags(flags: Sequence[str], engine: Path | None = None, places: Places | None = None) -> str | None:
    """None when `bmoe check FLAGS` accepts them, else the engine's one-line message."""
    proc = subprocess.run(
        [str(engine or host_engine(places)), "check", *flags], capture_output=True, text=True, timeout=60, check=False
    )
    if proc.returncode == 0:
        return None
    out = (proc.stdout.strip() or proc.stderr.strip()).removeprefix("error: ")
    return out or f"bmoe check exited {proc.returncode}"
