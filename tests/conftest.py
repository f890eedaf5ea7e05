"""Shared fixtures of the project's own tests: engine binaries built from this tree, generated models."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from engine_make import make_engine

REPO = Path(__file__).resolve().parents[1]
ENGINE = REPO / "engine"


#: modules that run whole gate runs, farms, zig or emulated builds, llama.cpp or a browser: what
#: `make test-fast` leaves out
SLOW_MODULES = frozenset(
    {
        "test_builder.py",
        "test_farm_adb.py",
        "test_farm_adb_faults.py",
        "test_farm_faults.py",
        "test_gate_faults.py",
        "test_gate_suite_e2e.py",
        "test_gemma3_checkpoint.py",
        "test_independent_models.py",
        "test_kernel_paths.py",
        "test_killed_runs.py",
        "test_llama_cpp.py",
        "test_llama_quantized.py",
        "test_localfarm.py",
        "test_mix.py",
        "test_mutants.py",
        "test_nightly_e2e.py",
        "test_packaging.py",
        "test_pytest_conventions.py",
        "test_readable_output.py",
        "test_release_config.py",
        "test_release_gate.py",
        "test_selection.py",
        "test_tokenizers_llama_cpp.py",
        "test_walkthroughs.py",
        "test_worker_counts.py",
        "test_xdev.py",
        "test_xdist_crash.py",
    }
)


#: what pytest-xdist puts in a worker's environment; the project's tests start pytest runs of their own
#: (gate runs, mutants, the nightly), which must run as a user's would, not as xdist workers (the bmoe-ci
#: plugin and other plugins read these)
XDIST_ENVIRONMENT = ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID")


def pytest_configure(config: pytest.Config) -> None:
    for name in XDIST_ENVIRONMENT:
        os.environ.pop(name, None)
    config.addinivalue_line("markers", "slow: runs whole gate runs, farms or llama.cpp (left out by make test-fast)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.name in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)


def _shared_dir(config: pytest.Config, factory: pytest.TempPathFactory, name: str) -> Path:
    """A directory all xdist workers of this session share (their base temps are siblings), or this
    process's own without xdist. What goes in it must be safe for concurrent writers (the fixture
    generator locks its directory)."""
    base = factory.getbasetemp()
    root = base.parent if hasattr(config, "workerinput") else base  # an xdist worker
    out = root / name
    out.mkdir(exist_ok=True)
    return out


@pytest.fixture(scope="session")
def engine_bin() -> Path:
    """The engine built with the system compiler, -O2 (fast; for determinism and reference checks)."""
    return make_engine("build/bmoe")


@pytest.fixture(scope="session")
def engine_asan_bin() -> Path:
    """The engine under AddressSanitizer + UBSan (for bad-input tests: a crash must not hide)."""
    return make_engine("build/bmoe-asan")


@pytest.fixture(scope="session")
def fixture_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every fixture model, generated once per test session (the generator caches by spec)."""
    from bmoe_ci.models import generate

    out = Path(os.environ.get("BMOE_TEST_FIXTURES", "") or _shared_dir(request.config, tmp_path_factory, "fixtures"))
    generate(out)
    return out


@pytest.fixture(scope="session")
def fixtures(fixture_dir: Path) -> dict[str, Path]:
    """name -> path of the model file to pass to -m (the first shard for split models): every default
    fixture."""
    from bmoe_ci.models import generate

    return {f.name: f.path for f in generate(fixture_dir)}
