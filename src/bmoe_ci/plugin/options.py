"""The gate suite's options: prefixed command-line options, their short aliases, ini keys and environment
variables, resolved once into a GateOptions value.

Every command-line option is prefixed (`--bmoe-device`, `--bmoe-farm`, ...): pytest has one option
namespace for every installed plugin, and a short name another plugin also defines (pytest-playwright
defines `--device`) makes argparse refuse the second registration, which kills every pytest run before
it starts. The short names (`--device`, `--farm`, ...) stay usable as aliases, registered by the gate
suite's conftest (gates/conftest.py) through :func:`add_short_aliases`: pytest loads the initial
conftests after every entry-point, `-p` and PYTEST_PLUGINS plugin (Config.parse in pytest 9:
consider_preparse, load_setuptools_entrypoints("pytest11"), consider_env, then
pytest_load_initial_conftests), so by then every option another plugin defines is known, and an
alias is only added for a name nobody took.

Precedence, per setting: command line > environment (BMOE_FARM, BMOE_DEVICE) > ini (bmoe_farm,
bmoe_device, bmoe_fixture in pytest.ini, tox.ini, setup.cfg or pyproject.toml) > default. The
environment is read by the plugin's hook and passed in (:func:`resolve`), never read here.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from bmoe_ci.paths import Places
from bmoe_ci.reports.junit import absolute_attachments

GROUP = "bmoe"

# short name -> argparse attributes. The option is --bmoe-<name> with dest bmoe_<name> ("-" -> "_");
# the alias --<name> writes the same dest.
OPTIONS: dict[str, dict[str, Any]] = {
    "device": dict(
        action="append",
        metavar="SEL",
        help="NAME, a,b, pool:NAME, arch:A, label:L or all (repeatable; default: $BMOE_DEVICE, "
        "ini bmoe_device, else all)",
    ),
    "farm": dict(metavar="FILE", help="farm YAML (default: $BMOE_FARM, ini bmoe_farm, else the embedded local farm)"),
    "results": dict(metavar="DIR", help="results directory (default results/<run-id>)"),
    "rebuild": dict(action="store_true", default=False, help="ignore the engine build cache"),
    "fixture": dict(
        action="append",
        metavar="NAME",
        help="only this fixture (repeatable; default: ini bmoe_fixture, else every default fixture)",
    ),
    "lock-wait": dict(
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="wait up to SECONDS for a device another run holds (default 0: busy is an error)",
    ),
    "fault": dict(
        action="append",
        metavar="NAME",
        help="build the engine with fault BMOE_FAULT_<NAME> of engine/faults.toml injected "
        "(to show a gate can fail; repeatable)",
    ),
}

ENV_FARM = "BMOE_FARM"
ENV_DEVICE = "BMOE_DEVICE"
INI_FARM = "bmoe_farm"
INI_DEVICE = "bmoe_device"
INI_FIXTURE = "bmoe_fixture"


def option(name: str) -> str:
    """`device` -> `--bmoe-device`."""
    return f"--bmoe-{name}"


def dest(name: str) -> str:
    """`lock-wait` -> `bmoe_lock_wait` (what config.getoption takes)."""
    return "bmoe_" + name.replace("-", "_")


def add_options(parser: pytest.Parser) -> None:
    """The prefixed options and the ini keys (the plugin's pytest_addoption)."""
    group = parser.getgroup(GROUP, "bmoe-ci gate suite")
    for name, attrs in OPTIONS.items():
        group.addoption(option(name), dest=dest(name), **attrs)
    parser.addini(
        INI_FARM, "farm YAML of the gate suite, relative to the ini file (--bmoe-farm wins)", type="string", default=""
    )
    parser.addini(
        INI_DEVICE, "device selectors of the gate suite, space-separated (--bmoe-device wins)", type="args", default=[]
    )
    parser.addini(
        INI_FIXTURE, "fixtures of the gate suite, space-separated (--bmoe-fixture wins)", type="args", default=[]
    )


def _taken(parser: pytest.Parser) -> set[str]:
    """Every option string registered so far, by any plugin (pytest 9 adds each to one argparse parser;
    its own groups are consulted too, in case a pytest version keeps them apart)."""
    names: set[str] = set(getattr(getattr(parser, "optparser", None), "_option_string_actions", {}))
    for group in getattr(parser, "_groups", []):
        for opt in getattr(group, "options", []):
            names.update(opt.names())
    return names


def add_short_aliases(parser: pytest.Parser) -> list[str]:
    """Register `--device`, `--farm`, ... as aliases of the prefixed options, each only if no other
    plugin registered that name first; returns the short names left to their owner. Safe to call from
    an initial conftest's pytest_addoption (see the module docstring for why that is late enough)."""
    taken = _taken(parser)
    if option("device") not in taken:
        return list(OPTIONS)  # the plugin is disabled (-p no:bmoe): nothing to alias
    group = parser.getgroup(GROUP)
    skipped = []
    for name, attrs in OPTIONS.items():
        short = f"--{name}"
        if short in taken:
            skipped.append(name)
            continue
        alias = {**attrs, "help": f"alias of {option(name)} (only while no other plugin defines {short})"}
        try:
            group.addoption(short, dest=dest(name), **alias)
        except (ValueError, argparse.ArgumentError):
            skipped.append(name)  # registered by a route _taken does not see: the name is not ours
    return skipped


@dataclass(frozen=True)
class GateOptions:
    """The gate suite's settings after precedence (command line > environment > ini > default)."""

    selectors: tuple[str, ...] = ("all",)
    farm: str | None = None  # None: the embedded local farm
    results: str | None = None
    fixtures: tuple[str, ...] | None = None  # None: every default fixture
    rebuild: bool = False
    lock_wait: float = 0.0
    faults: tuple[str, ...] = ()
    selectors_from: str = "default"  # where the selectors came from (for messages)
    farm_from: str = "default"
    fixtures_from: str = "default"
    places: Places = field(default_factory=Places)  # $BMOE_CI_REPO, $BMOE_CI_CACHE, $BMOE_CI_STATE
    absolute_attachments: bool = False  # $BMOE_CI_ATTACHMENT_PATHS=absolute


def resolve(
    *,
    cli: Mapping[str, Any],
    environ: Mapping[str, str],
    ini: Mapping[str, Any],
    ini_dir: Path | None,
    ini_file: Path | None = None,
) -> GateOptions:
    """`cli`: the parsed options by short name (None or [] when not given); `ini`: the ini values by key
    ("" or [] when absent); `ini_dir`: what a relative ini path is relative to; `ini_file`: the ini file,
    named in where a setting came from. Pure, for the tests."""
    of = f" of {ini_file}" if ini_file is not None else ""
    selectors: Sequence[str]
    if cli.get("device"):
        selectors, selectors_from = cli["device"], "command line"
    elif environ.get(ENV_DEVICE, "").split():
        selectors, selectors_from = environ[ENV_DEVICE].split(), f"${ENV_DEVICE}"
    elif ini.get(INI_DEVICE):
        selectors, selectors_from = ini[INI_DEVICE], f"ini {INI_DEVICE}{of}"
    else:
        selectors, selectors_from = ("all",), "default"

    farm: str | None
    if cli.get("farm"):
        farm, farm_from = str(cli["farm"]), "command line"
    elif environ.get(ENV_FARM, "").strip():
        farm, farm_from = environ[ENV_FARM].strip(), f"${ENV_FARM}"
    elif str(ini.get(INI_FARM) or "").strip():
        raw = Path(str(ini[INI_FARM]).strip()).expanduser()
        # relative to the file that names it, as pytest does for its own path-valued ini keys
        farm = str(raw if raw.is_absolute() or ini_dir is None else ini_dir / raw)
        farm_from = f"ini {INI_FARM}{of}"
    else:
        farm, farm_from = None, "default"

    fixtures = cli.get("fixture") or ini.get(INI_FIXTURE) or None
    fixtures_from = "command line" if cli.get("fixture") else f"ini {INI_FIXTURE}{of}" if fixtures else "default"
    return GateOptions(
        selectors=tuple(selectors),
        farm=farm,
        results=cli.get("results") or None,
        fixtures=tuple(fixtures) if fixtures else None,
        rebuild=bool(cli.get("rebuild")),
        lock_wait=float(cli.get("lock-wait") or 0.0),
        faults=tuple(cli.get("fault") or ()),
        selectors_from=selectors_from,
        farm_from=farm_from,
        fixtures_from=fixtures_from,
        places=Places.from_environ(environ),
        absolute_attachments=absolute_attachments(environ),
    )


def from_config(config: pytest.Config, environ: Mapping[str, str]) -> GateOptions:
    """:func:`resolve` with a pytest config's command line and ini values."""
    cli = {name: config.getoption(dest(name)) for name in OPTIONS}
    ini = {key: config.getini(key) for key in (INI_FARM, INI_DEVICE, INI_FIXTURE)}
    ini_dir = config.inipath.parent if config.inipath is not None else config.rootpath
    return resolve(cli=cli, environ=environ, ini=ini, ini_dir=ini_dir, ini_file=config.inipath)


def given_on_command_line(config: pytest.Config) -> bool:
    """Whether --bmoe-device (or its alias) was given: that alone asks for the gate suite."""
    return bool(config.getoption(dest("device")))


def foreign_short_options(config: pytest.Config) -> list[str]:
    """Short names typed on the command line that reached another plugin, not this one: with
    pytest-playwright installed `--device pixel8` is playwright's device emulation, and the gate suite
    would quietly run on its default selection (every device of the farm). The caller refuses them.
    A short name is ours when typing it set the prefixed option; if it is still unset, the name went
    to the plugin that owns it."""
    typed = {arg.split("=", 1)[0] for arg in map(str, config.invocation_params.args) if arg.startswith("--")}
    foreign = []
    for name, attrs in OPTIONS.items():
        if f"--{name}" in typed and config.getoption(dest(name)) in (None, [], attrs.get("default")):
            foreign.append(f"--{name}")
    return foreign


# Options under which pytest looks at the tests without running them: nothing may be built, leased
# or pushed (--help and --markers never start a session; --fixtures and --fixtures-per-test collect).
DRY_OPTIONS = ("collectonly", "showfixtures", "show_fixtures_per_test", "setupplan", "help", "markers")


def dry_run(config: pytest.Config) -> bool:
    return any(getattr(config.option, name, False) for name in DRY_OPTIONS)


__all__ = [
    "ENV_DEVICE",
    "ENV_FARM",
    "INI_DEVICE",
    "INI_FARM",
    "INI_FIXTURE",
    "OPTIONS",
    "GateOptions",
    "add_options",
    "add_short_aliases",
    "dest",
    "dry_run",
    "foreign_short_options",
    "from_config",
    "given_on_command_line",
    "option",
    "resolve",
]
