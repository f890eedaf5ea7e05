"""Fixtures of the gate suite. The `bmoe` pytest plugin (bmoe_ci.plugin) prepares the devices and
parametrises every test over (device, fixture); this file says what a gate reads."""

from __future__ import annotations

import pytest

from bmoe_ci.plugin.context import DeviceContext
from bmoe_ci.plugin.runner import DeviceRunner, EngineResult
from gates.plan import fixture_plan


def trace_path(runner: DeviceRunner, fixture: str) -> str:
    """Device path (in the device's work directory) of the route trace G8r's plan entry writes."""
    return runner.session.file(f"g8r-{fixture}.route-trace.csv")


@pytest.fixture
def runs(runner: DeviceRunner, device: DeviceContext, fixture: str) -> dict[str, EngineResult]:
    """Every engine run of the fixture's plan on this device (run once, then cached)."""
    model = device.models[fixture]
    return runner.plan(f"fixture:{fixture}", fixture_plan(model, fixture, trace_path(runner, fixture)))


@pytest.fixture
def model(device: DeviceContext, fixture: str) -> str:
    """Device path of the fixture model (what -m takes)."""
    return device.models[fixture]
