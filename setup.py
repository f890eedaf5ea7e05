"""Build hook: the wheel carries the parts of the source tree bmoe-ci reads at run time.

Everything else is configured in pyproject.toml. The engine's C sources, the fault catalogue, the fixture
specifications and the committed trained model, the local farm template and the gate suite live at the
top of the repository (they are not Python package data there, and must not be duplicated in git), so
`build_py` copies them into the wheel under bmoe_ci/_tree/, where bmoe_ci.paths.packaged_tree() finds
them. An editable install copies nothing: it runs from the checkout itself. The sdist carries the same
files (MANIFEST.in), so a wheel built from it is the same.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

# Paths relative to the project root; keep in step with MANIFEST.in and tests/test_packaging.py.
TREE: tuple[str, ...] = (
    "engine/src",  # what the builder compiles (and the mutants read for fault sites)
    "engine/faults.toml",  # the fault catalogue
    "fixtures/fixtures.yaml",  # the fixture specifications
    "fixtures/trained",  # the committed trained model, its held-out texts and multiple-choice set
    "devices/local.yaml",  # the local farm's template
    "gates",  # the gate suite, with its data/
)
PACKAGED_TREE = "bmoe_ci/_tree"  # bmoe_ci.paths.PACKAGED_TREE inside the package
SKIP = shutil.ignore_patterns("__pycache__", "*.pyc", ".*")
BUILD_JSON = "build.json"  # in the packaged tree: the commit the wheel was built from (bmoe_ci.origin reads it)


def source_commit(root: Path) -> dict[str, object]:
    """The commit of the tree being built: git's, else $BMOE_CI_COMMIT (a build from a copy or an
    sdist, where the builder knows it), else unknown (None)."""
    try:
        commit = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, check=True, timeout=30
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout.strip()
        return {"commit": commit, "dirty": bool(dirty)}
    except (OSError, subprocess.SubprocessError):
        given = os.environ.get("BMOE_CI_COMMIT", "").strip()
        return {"commit": given or None, "dirty": None}


class BuildPyWithTree(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        root = Path(__file__).resolve().parent
        dest = Path(self.build_lib) / PACKAGED_TREE
        if dest.exists():
            shutil.rmtree(dest)  # a stale build/ must not leak files that left the tree
        for rel in TREE:
            src = root / rel
            if src.is_dir():
                shutil.copytree(src, dest / rel, ignore=SKIP)
            elif src.is_file():
                (dest / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dest / rel)
            else:
                raise FileNotFoundError(f"setup.py: {rel} is missing from the source tree {root}")
        (dest / BUILD_JSON).write_text(json.dumps(source_commit(root)) + "\n")


setup(cmdclass={"build_py": BuildPyWithTree})
