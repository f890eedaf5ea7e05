"""Which bmoe_ci is running: `bmoe-ci --version`, and the second-clone warning.

A second clone of the repository, used with the Python environment of the first (where the first was
installed editable), runs the first clone's code against the second clone's work: an edit made here
silently does nothing. The console script and the pytest plugin say so on one stderr line.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from bmoe_ci import __version__
from bmoe_ci.paths import ENV_REPO, Places, own_checkout, package_dir, packaged_tree


def enclosing_checkout(start: Path) -> Path | None:
    """The bmoe-ci checkout ``start`` is in (itself or a parent with pyproject.toml and src/bmoe_ci)."""
    for d in (start, *start.parents):
        if (d / "pyproject.toml").is_file() and (d / "src" / "bmoe_ci" / "__init__.py").is_file():
            return d
    return None


def running_from() -> str:
    """Where the imported package lives, in words: ``checkout PATH`` or ``the installed wheel at PATH``."""
    own = own_checkout()
    return f"checkout {own}" if own is not None else f"the installed wheel at {package_dir()}"


def foreign_checkout_warning(cwd: Path) -> str | None:
    """One line when ``cwd`` is inside a bmoe-ci checkout whose src/bmoe_ci is not the imported package."""
    try:
        here = enclosing_checkout(cwd.resolve())
    except OSError:
        return None
    if here is None or (here / "src" / "bmoe_ci").resolve() == package_dir():
        return None
    return (
        f"bmoe-ci: warning: the working directory is in the checkout {here}, but the bmoe_ci running is "
        f"{running_from()}: edits in {here} are not used; run `pip install -e .` in {here}, "
        f"or set PYTHONPATH={here / 'src'}"
    )


def git_commit(tree: Path) -> str:
    """``git <short hash>`` (``+dirty`` when tracked files changed), or ``git unknown``."""
    try:
        head = subprocess.run(
            ["git", "-C", str(tree), "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(tree), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "git unknown"
    return f"git {head}{'+dirty' if dirty else ''}"


def wheel_commit(tree: Path) -> str:
    """``git <short hash>`` (``+dirty``) of the tree a wheel was built from (its ``build.json``, written
    by setup.py), or ``an unknown commit``."""
    try:
        data = json.loads((tree / "build.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "an unknown commit"
    commit = data.get("commit") if isinstance(data, dict) else None
    if not isinstance(commit, str) or not commit:
        return "an unknown commit"
    return f"git {commit[:12]}{'+dirty' if data.get('dirty') else ''}"


def version_line(places: Places) -> str:
    """`bmoe-ci --version`: the version and where the code runs from, on one line."""
    own = own_checkout()
    if own is not None:
        where = f"checkout {own}, {git_commit(own)}"
    elif (tree := packaged_tree()) is not None:
        where = f"installed wheel built from {wheel_commit(tree)}, {package_dir()}"
    else:
        where = f"installed without its source tree, {package_dir()}"
    extra = f"; source tree from {ENV_REPO}={places.repo}" if places.repo is not None else ""
    return f"bmoe-ci {__version__} ({where}){extra}"
