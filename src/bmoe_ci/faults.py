"""The engine's fault catalogue (engine/faults.toml): one entry per `BMOE_FAULT_<NAME>` site.

The catalogue is the one place that says which faults exist, what each breaks and which gates are
expected to catch it. The gate suite refuses `--fault` names not in it, `bmoe-ci mutants` builds every
entry, and the project's tests check that it names exactly the faults of engine/src.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bmoe_ci.paths import Places

AREAS: tuple[str, ...] = (
    "kernels",
    "attention",
    "streamer",
    "cache",
    "prefetch",
    "policies",
    "trace",
    "counters",
    "config",
    "engine",
    "tokenizer",
    "scoring",
    "loader",
)
_NAME = re.compile(r"^[A-Z][A-Z0-9_]*$")
_SITE = re.compile(r"\bBMOE_FAULT_([A-Z0-9_]+)\b")
_KEYS = {"name", "area", "file", "breaks", "expected", "fixture", "crash", "tested", "arch"}
#: a fault's `arch`: the one architecture whose engine runs the faulty code (a SIMD path's own kernel)
ARCHES = ("x86_64", "aarch64")


class CatalogueError(ValueError):
    """The catalogue file is unreadable or an entry is malformed (one line: file: fault[i].key: why)."""


@dataclass(frozen=True)
class Fault:
    name: str
    area: str
    file: str
    breaks: str
    expected: tuple[str, ...]
    fixture: str = "qwen3moe"
    crash: bool = False
    tested: bool = False
    arch: str | None = None  # only this architecture's engine runs the code (None: every one)

    def runs_on(self, arch: str) -> bool:
        return self.arch is None or self.arch == arch

    @property
    def define(self) -> str:
        return f"BMOE_FAULT_{self.name}=1"


@dataclass(frozen=True)
class Catalogue:
    path: Path
    faults: tuple[Fault, ...]

    def names(self) -> list[str]:
        return [f.name for f in self.faults]

    def get(self, name: str) -> Fault:
        for f in self.faults:
            if f.name == name:
                return f
        raise KeyError(name)

    def resolve(self, names: list[str] | tuple[str, ...]) -> list[Fault]:
        """The faults named (case-insensitive), in the order given; an unknown name is a CatalogueError
        naming it and the catalogue."""
        out: list[Fault] = []
        known = {f.name: f for f in self.faults}
        for raw in names:
            name = raw.strip().upper()
            if name not in known:
                raise CatalogueError(
                    f"--fault {raw}: not in the fault catalogue {self.path} "
                    f"({len(known)} faults; list them with `bmoe-ci mutants --list`)"
                )
            if known[name] not in out:
                out.append(known[name])
        return out


def catalogue_path(places: Places | None = None) -> Path:
    return (places or Places()).source_tree() / "engine" / "faults.toml"


def _entry(path: Path, i: int, raw: Any) -> Fault:
    where = f"{path}: fault[{i}]"
    if not isinstance(raw, dict):
        raise CatalogueError(f"{where}: not a table")
    unknown = sorted(set(raw) - _KEYS)
    if unknown:
        raise CatalogueError(f"{where}.{unknown[0]}: unknown key (known: {', '.join(sorted(_KEYS))})")
    for key in ("name", "area", "file", "breaks"):
        if not isinstance(raw.get(key), str) or not raw[key].strip():
            raise CatalogueError(f"{where}.{key}: missing or not a non-empty string")
    name = raw["name"]
    where = f"{path}: fault[{i}] ({name})"
    if not _NAME.match(name):
        raise CatalogueError(f"{where}.name: must be upper case letters, digits and '_'")
    if raw["area"] not in AREAS:
        raise CatalogueError(f"{where}.area: {raw['area']!r} is not one of {', '.join(AREAS)}")
    expected = raw.get("expected")
    if not isinstance(expected, list) or not expected or not all(isinstance(g, str) and g for g in expected):
        raise CatalogueError(f"{where}.expected: a non-empty list of gate ids")
    fixture = raw.get("fixture", "qwen3moe")
    if not isinstance(fixture, str) or not fixture:
        raise CatalogueError(f"{where}.fixture: not a fixture name")
    for key in ("crash", "tested"):
        if not isinstance(raw.get(key, False), bool):
            raise CatalogueError(f"{where}.{key}: must be true or false")
    arch = raw.get("arch")
    if arch is not None and arch not in ARCHES:
        raise CatalogueError(f"{where}.arch: {arch!r} is not one of {', '.join(ARCHES)}")
    return Fault(
        name=name,
        area=raw["area"],
        file=raw["file"],
        breaks=raw["breaks"].strip(),
        expected=tuple(expected),
        fixture=fixture,
        crash=raw.get("crash", False),
        tested=raw.get("tested", False),
        arch=arch,
    )


def load_catalogue(path: Path | None = None, places: Places | None = None) -> Catalogue:
    """The catalogue at ``path`` (default: engine/faults.toml of the source tree of ``places``)."""
    path = path or catalogue_path(places)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise CatalogueError(f"{path}: cannot read the fault catalogue: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise CatalogueError(f"{path}: {exc}") from None
    entries = data.get("fault")
    if not isinstance(entries, list) or not entries:
        raise CatalogueError(f"{path}: no [[fault]] entries")
    faults = [_entry(path, i, raw) for i, raw in enumerate(entries)]
    seen: set[str] = set()
    for i, f in enumerate(faults):
        if f.name in seen:
            raise CatalogueError(f"{path}: fault[{i}].name: {f.name} is listed twice")
        seen.add(f.name)
    return Catalogue(path, tuple(faults))


def fault_sites(engine_src: Path | None = None, places: Places | None = None) -> dict[str, set[str]]:
    """Every BMOE_FAULT_<NAME> the engine's sources mention -> the files that mention it."""
    src = engine_src or (places or Places()).source_tree() / "engine" / "src"
    sites: dict[str, set[str]] = {}
    for path in sorted(src.iterdir()):
        if path.suffix in (".c", ".h"):
            for name in _SITE.findall(path.read_text(encoding="utf-8", errors="replace")):
                sites.setdefault(name, set()).add(path.name)
    return sites
