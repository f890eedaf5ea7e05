"""A quarantine is about the device's farm entry: a corrected entry (the serial fixed, another host) is a
device to check again, not one refused until `bmoe-ci farm release`, quoting its old serial."""

from __future__ import annotations

from pathlib import Path

from bmoe_ci.farm import load_farm_file
from bmoe_ci.farm.health import HealthBook


def _farm(tmp_path: Path, serial: str) -> Path:
    farm = tmp_path / "farm.yaml"
    farm.write_text(
        "version: 1\ndevices:\n  - name: phone\n    kind: phone\n    os: android\n    arch: aarch64\n"
        f'    transport: adb\n    serial: "{serial}"\n    quarantine_after: 2\n'
    )
    return farm


def test_a_quarantine_follows_the_entry_not_the_name(tmp_path: Path) -> None:
    book = HealthBook(_farm(tmp_path, "WRONG123"), tmp_path / "health.json")
    wrong = load_farm_file(_farm(tmp_path, "WRONG123")).device("phone")
    book.record(wrong, "unreachable: unknown serial WRONG123")
    h = book.record(wrong, "unreachable: unknown serial WRONG123")
    assert h.quarantine is not None and book.get(wrong).quarantine is not None
    assert book.peek(wrong).quarantine is not None
    fixed = load_farm_file(_farm(tmp_path, "35161FDJH000GX")).device("phone")
    for h in (book.get(fixed), book.peek(fixed)):
        assert h.quarantine is None and h.failures == 0  # checked again, from scratch
    assert book.record(fixed, None).failures == 0
    # back to the old entry: nothing of its old quarantine survived the fixed entry's healthy run
    assert book.get(wrong).quarantine is None


def test_a_damaged_health_file_costs_the_counts_only(tmp_path: Path) -> None:
    state = tmp_path / "health.json"
    state.write_text("[" * 100_000)
    book = HealthBook(_farm(tmp_path, "X"), state)
    phone = load_farm_file(_farm(tmp_path, "X")).device("phone")
    assert book.get(phone).failures == 0 and book.peek(phone).failures == 0
    assert book.record(phone, "unreachable: x").failures == 1
