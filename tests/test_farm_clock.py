"""The preflight's clock check on a local device whose `date` runs an hour fast: beyond `max_clock_skew`
(set in the farm file) it is a failed health check naming both clocks; within it the skew is reported."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from bmoe_ci.farm import FarmError, InfraError, load_farm_file, open_session
from bmoe_ci.farm.preflight import preflight
from bmoe_ci.farm.transports import open_transport
from gate_run import host_farm


@pytest.fixture
def fast_clock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = shutil.which("date")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "date"
    fake.write_text(f'#!/bin/sh\n[ "$1" = "+%s" ] && echo $(( $({real} +%s) + 3600 )) && exit 0\nexec {real} "$@"\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{Path(real).parent}:/usr/bin:/bin")


def _farm(tmp_path: Path, skew: str | None) -> Path:
    farm = host_farm(tmp_path)
    if skew is not None:
        farm.write_text(farm.read_text() + f"    max_clock_skew: {skew}\n")
    return farm


def test_a_device_clock_an_hour_ahead_fails_the_health_check(tmp_path: Path, fast_clock: None) -> None:
    device = load_farm_file(_farm(tmp_path, None)).devices["host"]
    assert device.max_clock_skew == 300
    with pytest.raises(InfraError) as err:
        open_session(device)
    assert err.value.kind == "preflight"
    # an hour, give or take the second the probe straddles
    assert re.search(r"clock 3(599|600|601)s ahead of the controller's", err.value.reason), err.value.reason
    assert "max_clock_skew 300s" in err.value.reason


def test_a_skew_within_the_farm_files_limit_passes_and_is_reported(tmp_path: Path, fast_clock: None) -> None:
    device = load_farm_file(_farm(tmp_path, "7200")).devices["host"]
    with open_transport(device) as t:
        report = preflight(t)
    assert report.clock_skew_s is not None and 3598 <= report.clock_skew_s <= 3602
    assert "clock +3600s" in report.summary() or "clock +3599s" in report.summary()


def test_a_sane_clock_passes(tmp_path: Path) -> None:
    device = load_farm_file(_farm(tmp_path, "5")).devices["host"]
    with open_transport(device) as t:
        report = preflight(t)
    assert report.clock_skew_s is not None and abs(report.clock_skew_s) <= 2


def test_max_clock_skew_is_validated_with_file_and_line(tmp_path: Path) -> None:
    farm = _farm(tmp_path, "0")
    with pytest.raises(FarmError, match=rf"{farm}:9: devices\[0\]\.max_clock_skew"):
        load_farm_file(farm)
