"""Shared fixtures of the project's own tests: engine binaries built from this tree, generated models."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ENGINE = REPO / "engine"


def _make(target: str) -> Path:
    subprocess.run(["make", "-s", "-C", str(ENGINE), target], check=True)
    return ENGINE / target


@pytest.fixture(scope="session")
def engine_bin() -> Path:
    """The engine built with the system compiler, -O2 (fast; for determinism and reference checks)."""
    return _make("build/bmoe")


@pytest.fixture(scope="session")
def engine_asan_bin() -> Path:
    """The engine under AddressSanitizer + UBSan (for bad-input tests: a crash must not hide)."""
    return _make("build/bmoe-asan")


@pytest.fixture(scope="session")
def fixture_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every fixture model, generated once per test session (the generator caches by spec)."""
    from bmoe_ci.models import generate

    out = Path(os.environ.get("BMOE_TEST_FIXTURES", tmp_path_factory.mktemp("fixtures")))
    generate(out)
    return out


@pytest.fixture(scope="session")
def fixtures(fixture_dir: Path) -> dict[str, Path]:
    """name -> path of the model file to pass to -m (the first shard for split models): every default
    fixture."""
    from bmoe_ci.models import generate

    return {f.name: f.path for f in generate(fixture_dir)}
