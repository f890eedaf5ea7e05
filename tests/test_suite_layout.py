"""The project's own test suite: what `make test-fast` leaves out is named by files that exist."""

from __future__ import annotations

from pathlib import Path

from conftest import SLOW_MODULES

TESTS = Path(__file__).resolve().parent


def test_every_slow_module_exists() -> None:
    missing = sorted(name for name in SLOW_MODULES if not (TESTS / name).is_file())
    assert not missing, f"tests/conftest.py SLOW_MODULES names files that are gone: {missing}"
