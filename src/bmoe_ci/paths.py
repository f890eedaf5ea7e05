"""Where things live: the source tree the package was installed from, and the cache directory."""

from __future__ import annotations

import os
from pathlib import Path


def repo_root() -> Path:
    """The checkout holding engine/, fixtures/, devices/ (the package is installed editable from it)."""
    env = os.environ.get("BMOE_CI_REPO")
    if env:
        return Path(env).resolve()
    here = Path(__file__).resolve()
    for parent in here.parents:
        if (parent / "engine" / "src").is_dir() and (parent / "pyproject.toml").is_file():
            return parent
    raise RuntimeError(
        "cannot find the bmoe-ci source tree (engine/src); set BMOE_CI_REPO to the checkout"
    )


def cache_dir() -> Path:
    """Build and fixture cache: $BMOE_CI_CACHE, else <repo>/.cache/bmoe-ci."""
    env = os.environ.get("BMOE_CI_CACHE")
    path = Path(env) if env else repo_root() / ".cache" / "bmoe-ci"
    path.mkdir(parents=True, exist_ok=True)
    return path
