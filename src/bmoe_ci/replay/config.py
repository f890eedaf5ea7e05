"""What the replay needs to know about a run besides its trace: the flags that steer the cache and
the policies, read from the run's own command line (docs/engine-flags.md)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

MIB = 1 << 20
SWITCHES = frozenset(
    {
        "--mmap",
        "--force-cache",
        "--no-odirect",
        "--prefetch-sync",
        "--drop-in-prefill",
        "--drop-no-renorm",
        "--json",
        "--chat",
    }
)


@dataclass(frozen=True)
class RunConfig:
    cache_mb: int = 0
    prefetch: int = 0
    drop_F: float | None = None  # --drop-cold-experts
    renorm: bool = True  # not --drop-no-renorm
    drop_in_prefill: bool = False
    subst_L: float | None = None  # --expert-substitute
    mmap: bool = False

    @property
    def budget(self) -> int:
        return self.cache_mb * MIB

    @classmethod
    def from_argv(cls, argv: Sequence[str]) -> RunConfig:
        """The run's configuration from `bmoe run ...` arguments (long options as `--x V` or `--x=V`)."""
        values: dict[str, str] = {}
        switches: set[str] = set()
        args = list(argv)
        i = 0
        while i < len(args):
            a = args[i]
            if a in SWITCHES:
                switches.add(a)
            elif a.startswith("--") and "=" in a:
                key, _, value = a.partition("=")
                values[key] = value
            elif a.startswith("-") and i + 1 < len(args):
                values[a] = args[i + 1]
                i += 1
            i += 1
        F, L = values.get("--drop-cold-experts"), values.get("--expert-substitute")
        return cls(
            cache_mb=int(values.get("--cache-mb", "0")),
            prefetch=int(values.get("--prefetch", "0")),
            drop_F=float(F) if F is not None else None,
            renorm="--drop-no-renorm" not in switches,
            drop_in_prefill="--drop-in-prefill" in switches,
            subst_L=float(L) if L is not None else None,
            mmap="--mmap" in switches,
        )
