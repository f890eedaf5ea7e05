"""`pytest gates` anywhere: the argument `gates` names the gate suite of the source tree.

pytest resolves a path argument against the working directory, so in a directory without a gates/
folder (a wheel install, used from any project) `pytest gates` would find nothing. The hook below runs
before pytest collects its initial conftests (pytest calls `pytest_load_initial_conftests` of the
plugins loaded from entry points before the built-in one, which reads the path arguments), and rewrites
a path argument that is exactly `gates` or starts with `gates/` into the same path inside the source tree
(bmoe_ci.paths.Places.source_tree: $BMOE_CI_REPO, the checkout, or the wheel's packaged copy) when the working directory
has no gates/. Anything else is left alone, and a working directory with a gates/ of its own keeps it.

The same hook registers :class:`OriginWarning`, which says when this pytest runs another checkout's
bmoe_ci than the one it is started in (bmoe_ci.origin).
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from bmoe_ci.origin import foreign_checkout_warning
from bmoe_ci.paths import Places

SUITE = "gates"


def _path_part(arg: str) -> str:
    return arg.split("::", 1)[0]


def names_suite(arg: str) -> bool:
    """`gates`, `gates/`, `gates/test_x.py`, `gates/test_x.py::test_y`."""
    path = _path_part(arg)
    return path == SUITE or path.startswith(SUITE + "/")


def suite_path(arg: str, tree: Path) -> str:
    """``arg`` with its leading `gates` replaced by the source tree's gate suite."""
    path, sep, rest = arg.partition("::")
    return str(tree / path) + sep + rest


def rewrite_args(args: Sequence[str], positional: Sequence[str], cwd: Path, tree: Path) -> dict[int, str]:
    """Index in ``args`` -> replacement, for each positional argument naming the gate suite, when ``cwd``
    has no gates/ of its own (``positional`` are the path arguments pytest parsed out of ``args``)."""
    if (cwd / SUITE).exists() or not (tree / SUITE).is_dir():
        return {}
    wanted = {a for a in positional if names_suite(a)}
    if not wanted:
        return {}
    return {i: suite_path(a, tree) for i, a in enumerate(args) if a in wanted}


def _positional_indices(
    parser: pytest.Parser, args: list[str], candidates: dict[int, str], namespace: argparse.Namespace
) -> dict[int, str]:
    """Keep only the candidates that pytest parses as path arguments (not, say, the value of `-k gates`):
    each is swapped for a sentinel and the arguments parsed again."""
    kept = {}
    for i, new in candidates.items():
        probe = list(args)
        probe[i] = sentinel = f"\0bmoe-ci-{i}"
        ns = parser.parse_known_args(probe, namespace=copy.copy(namespace))
        if sentinel in (getattr(ns, "file_or_dir", None) or []):
            kept[i] = new
    return kept


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config, parser: pytest.Parser, args: list[str]) -> None:
    if not os.environ.get("PYTEST_XDIST_WORKER"):  # the controller says it once, not each worker
        early_config.pluginmanager.register(OriginWarning(), "bmoe-origin-warning")
    namespace = early_config.known_args_namespace
    positional = list(getattr(namespace, "file_or_dir", None) or [])
    if getattr(namespace, "pyargs", False):
        return
    try:
        tree = Places.from_environ(os.environ).source_tree()  # the plugin is an entry point
    except RuntimeError:
        return  # no tree at all: pytest reports the missing path as usual
    cwd = early_config.invocation_params.dir
    candidates = rewrite_args(args, positional, cwd, tree)
    changes = _positional_indices(parser, args, candidates, namespace) if candidates else {}
    if not changes:
        return
    renamed = {args[i]: new for i, new in changes.items()}
    for i, new in changes.items():
        args[i] = new  # pytest parses these same `args` again for config.args
    # ... and the built-in hook, after this one, finds the initial conftests from the early namespace
    namespace.file_or_dir = [renamed.get(a, a) for a in positional]


class OriginWarning:
    """Prints the second-clone warning once the terminal is free (during pytest_load_initial_conftests
    pytest captures stderr and would keep the line from the user)."""

    def pytest_configure(self, config: pytest.Config) -> None:
        message = foreign_checkout_warning(config.invocation_params.dir)
        if message:
            print(message, file=sys.stderr, flush=True)
