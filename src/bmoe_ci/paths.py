"""Where things live: the source tree (engine sources, fixture specs, the local farm template, the gate
suite), and the writable directory for caches and the local farm's state.

The source tree is, in this order:

* ``$BMOE_CI_REPO`` when set (a checkout, or any directory laid out like one). It is read here, on every
  call, rather than once at the entry points: the gate runs that ``bmoe-ci nightly``, ``bmoe-ci mutants``
  and the project's tests start as subprocesses get it through their environment.
* the checkout the package is imported from (``src/bmoe_ci`` of a checkout: an editable install, or
  ``PYTHONPATH=src``);
* the copy packed into the wheel under ``bmoe_ci/_tree`` (see setup.py) when the package is installed
  from a wheel.

Nothing is ever written into the packaged copy: without a checkout, caches and the farm state go to
``$XDG_CACHE_HOME/bmoe-ci`` (default ``~/.cache/bmoe-ci``).
"""

from __future__ import annotations

import os
from pathlib import Path

ENV_REPO = "BMOE_CI_REPO"
ENV_CACHE = "BMOE_CI_CACHE"
# the folder of the wheel that holds the packaged source tree (filled by setup.py's build hook)
PACKAGED_TREE = "_tree"


def package_dir() -> Path:
    """The directory of the imported ``bmoe_ci`` package."""
    return Path(__file__).resolve().parent


def is_checkout(path: Path) -> bool:
    """``path`` looks like a bmoe-ci checkout (the packaged copy has no pyproject.toml)."""
    return (path / "pyproject.toml").is_file() and (path / "engine" / "src").is_dir()


def own_checkout() -> Path | None:
    """The checkout the imported package lives in (``<checkout>/src/bmoe_ci``), or None for a wheel."""
    pkg = package_dir()
    root = pkg.parent.parent
    # Only the src layout counts: a venv created inside some checkout must not make a wheel install
    # look like that checkout.
    if pkg.parent.name == "src" and is_checkout(root):
        return root
    return None


def packaged_tree() -> Path | None:
    """The source tree packed into the wheel, or None (a checkout has none)."""
    tree = package_dir() / PACKAGED_TREE
    return tree if (tree / "engine" / "src").is_dir() else None


def source_tree() -> Path:
    """The tree holding engine/, fixtures/, devices/ and gates/: ``$BMOE_CI_REPO``, else the checkout the
    package runs from, else the wheel's packaged copy."""
    env = os.environ.get(ENV_REPO)
    if env:
        return Path(env).expanduser().resolve()
    tree = own_checkout() or packaged_tree()
    if tree is None:
        raise RuntimeError(
            f"cannot find the bmoe-ci source tree (engine/src) beside {package_dir()}: "
            f"set {ENV_REPO} to a checkout, or reinstall the wheel"
        )
    return tree


def checkout() -> Path | None:
    """The source tree when it is a checkout (where results and caches may go, and git can be asked),
    None when it is the wheel's packaged copy."""
    try:
        tree = source_tree()
    except RuntimeError:
        return None
    return tree if is_checkout(tree) else None


def user_cache_root() -> Path:
    """``$XDG_CACHE_HOME/bmoe-ci``, else ``~/.cache/bmoe-ci`` (the XDG base directory rule: a relative
    ``$XDG_CACHE_HOME`` is ignored)."""
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".cache"
    return base / "bmoe-ci"


def local_root() -> Path:
    """The default root of caches and local state: ``<checkout>/.cache/bmoe-ci`` when running from a
    checkout, else the user's cache directory (never the packaged tree in site-packages)."""
    tree = checkout()
    return tree / ".cache" / "bmoe-ci" if tree is not None else user_cache_root()


def cache_dir() -> Path:
    """Build and fixture cache: ``$BMOE_CI_CACHE``, else :func:`local_root`."""
    env = os.environ.get(ENV_CACHE)
    path = Path(env) if env else local_root()
    path.mkdir(parents=True, exist_ok=True)
    return path
