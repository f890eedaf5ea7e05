"""The app's shipped engine settings (``ci/app-defaults.yaml``), a proposal of new ones, their engine
flags and the diff between two of them."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt

from bmoe_ci.farm.errors import ConfigIssue
from bmoe_ci.paths import Places
from bmoe_ci.release.yamlfile import Real, ReleaseConfigError, key_line, parse_text, read_text, validate

DEFAULTS_PATH = "ci/app-defaults.yaml"

Fraction = Annotated[Real, Field(ge=0, le=1)]


class Settings(BaseModel):
    """One value per setting the app ships. ``null`` turns a lossy knob off."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cache_mb: Annotated[StrictInt, Field(ge=0, le=1048576)]
    drop_cold_experts: Fraction | None
    expert_substitute: Fraction | None
    prefetch: Annotated[StrictInt, Field(ge=0, le=64)]


class SettingsFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    version: Literal[1] = 1
    settings: Settings


SETTINGS: tuple[str, ...] = tuple(Settings.model_fields)

# setting -> the engine option it sets (what a validate() message names)
OPTION = {
    "cache_mb": "--cache-mb",
    "drop_cold_experts": "--drop-cold-experts",
    "expert_substitute": "--expert-substitute",
    "prefetch": "--prefetch",
}


def flags(s: Settings, *, cache_scale: float | None = None) -> list[str]:
    """The engine flags of ``s``: the one place a settings file becomes engine flags (validation, the
    A/B, the replay and the quality runs all take theirs from here, so they cannot disagree).

    ``cache_scale`` gives the evaluation's flags: the app's budget is for real models, so on the small
    evaluation models it is ``cache_mb x cache_scale`` MiB (at least 1; 0 stays 0, the cache off), with
    ``--force-cache`` when that lies in the band validate() refuses without it."""
    mb = s.cache_mb
    out = ["--cache-mb", str(mb)]
    if cache_scale is not None:
        mb = max(1, round(s.cache_mb * cache_scale)) if s.cache_mb else 0
        out = ["--cache-mb", str(mb)]
        if 0 < mb < 1500:
            out.append("--force-cache")
    if s.prefetch:
        out += ["--prefetch", str(s.prefetch)]
    if s.drop_cold_experts is not None:
        out += ["--drop-cold-experts", repr(float(s.drop_cold_experts))]
    if s.expert_substitute is not None:
        out += ["--expert-substitute", repr(float(s.expert_substitute))]
    return out


@dataclass(frozen=True)
class LoadedSettings:
    settings: Settings
    source: str  # FILE, or REF:ci/app-defaults.yaml
    raw: Any

    def line(self, key: str) -> int | None:
        return key_line(self.raw, ("settings", key))


def parse_settings(text: str, shown: str, *, check: bool = True, places: Places | None = None) -> LoadedSettings:
    """Validate a settings file; with ``check`` its flags must also pass the engine's validate()
    (`bmoe check`); a refusal is reported at the line of the setting the message names."""
    raw = parse_text(text, shown)
    if isinstance(raw, dict) and "settings" not in raw:
        stray = [k for k in raw if k in SETTINGS]
        if stray:
            raise ReleaseConfigError(
                [
                    ConfigIssue(
                        shown,
                        key_line(raw, (stray[0],)),
                        str(stray[0]),
                        "a setting at the top level: put the settings under 'settings:' (see ci/app-defaults.yaml)",
                    )
                ]
            )
    model = validate(SettingsFile, raw, shown, "a settings file")
    loaded = LoadedSettings(model.settings, shown, raw)
    if check:
        from bmoe_ci.enginecheck import check_flags

        why = check_flags(flags(model.settings), places=places)
        if why:
            option = why.split(":", 1)[0]
            key = next((k for k, o in OPTION.items() if o == option), "")
            loc = ("settings", key) if key else ("settings",)
            raise ReleaseConfigError(
                [
                    ConfigIssue(
                        shown,
                        key_line(raw, loc),
                        ".".join(loc),
                        f"the engine's validate() refuses these settings: {why}",
                    )
                ]
            )
    return loaded


def load_settings(path: Path, *, check: bool = True, places: Places | None = None) -> LoadedSettings:
    text, shown = read_text(path, "settings file")
    return parse_settings(text, shown, check=check, places=places)


def load_base(ref: str, repo: Path, *, check: bool = True, places: Places | None = None) -> LoadedSettings:
    """``git show COMMIT:ci/app-defaults.yaml`` for the commit ``ref`` names (ValueError when the ref or the
    file does not exist). ``ref`` is resolved with ``--end-of-options`` first and refused when it starts
    with ``-``: a value is never read by git as an option (``--base=--output=FILE`` had git write FILE)."""
    if not ref or ref.startswith("-") or any(c in ref for c in "\0\n"):
        raise ValueError(f"--base {ref!r}: not a git revision (a revision never starts with '-')")
    found = subprocess.run(
        ["git", "rev-parse", "--verify", "--quiet", "--end-of-options", f"{ref}^{{commit}}"],
        cwd=repo,
        capture_output=True,
        text=True,
        check=False,
    )
    commit = found.stdout.strip()
    if found.returncode != 0 or len(commit) < 40 or any(c not in "0123456789abcdef" for c in commit):
        raise ValueError(f"--base {ref}: cannot read {DEFAULTS_PATH} there: no such commit in {repo}")
    proc = subprocess.run(
        ["git", "show", f"{commit}:{DEFAULTS_PATH}"], cwd=repo, capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise ValueError(
            f"--base {ref}: cannot read {DEFAULTS_PATH} there: "
            f"{proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else 'git failed'}"
        )
    return parse_settings(proc.stdout, f"{ref}:{DEFAULTS_PATH}", check=check, places=places)


@dataclass(frozen=True)
class Change:
    setting: str
    base: Any
    proposed: Any

    def __str__(self) -> str:
        def show(v: Any) -> str:
            return "off" if v is None else str(v)

        return f"{self.setting}: {show(self.base)} -> {show(self.proposed)}"


def diff(base: Settings, proposed: Settings) -> list[Change]:
    """The settings whose value differs (1 and 1.0 are the same value), in file order."""
    out = []
    for key in SETTINGS:
        a, b = getattr(base, key), getattr(proposed, key)
        if (a is None) != (b is None) or (a is not None and float(a) != float(b)):
            out.append(Change(key, a, b))
    return out
