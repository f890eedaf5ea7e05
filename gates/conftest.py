"""Fixtures of the gate suite. The `bmoe` pytest plugin (bmoe_ci.plugin) prepares the devices and
parametrises every test over (device, fixture); this file says what a gate reads."""

from __future__ import annotations

import json

import pytest

from bmoe_ci.plugin.context import DeviceContext
from bmoe_ci.plugin.runner import DeviceRunner, EngineResult
from bmoe_ci.reports.xdev import fingerprint
from gates.plan import fixture_plan

# (device, fixture) plans whose fingerprints this process already handed to the controller
_DIGESTS_SENT = pytest.StashKey[set[tuple[str, str]]]()


def trace_path(runner: DeviceRunner, fixture: str) -> str:
    """Device path (in the device's work directory) of the route trace G8r's plan entry writes."""
    return runner.session.file(f"g8r-{fixture}.route-trace.csv")


def logits_path(runner: DeviceRunner, fixture: str) -> str:
    """Device path of the logits file the resident reference run writes (REF pulls it back)."""
    return runner.session.file(f"ref-{fixture}.logits.f32")


@pytest.fixture
def runs(runner: DeviceRunner, device: DeviceContext, fixture: str,
         request: pytest.FixtureRequest) -> dict[str, EngineResult]:
    """Every engine run of the fixture's plan on this device (run once, then cached). What each run
    produced is recorded for the device (its fingerprint: bytes, tokens, counters), for XDEV."""
    model = device.models[fixture]
    results = runner.plan(f"fixture:{fixture}", fixture_plan(model, fixture, trace_path(runner, fixture),
                                                                  logits_path(runner, fixture)))
    recorded = request.config.stash.setdefault(_DIGESTS_SENT, set())
    if (device.name, fixture) not in recorded:  # once per plan: the first test that reads it carries it
        recorded.add((device.name, fixture))
        prints = {entry: fingerprint(r.data, r.crashed) for entry, r in results.items()}
        request.node.user_properties.append(("bmoe.digests", json.dumps({fixture: prints})))
    return results


@pytest.fixture
def model(device: DeviceContext, fixture: str) -> str:
    """Device path of the fixture model (what -m takes)."""
    return device.models[fixture]
