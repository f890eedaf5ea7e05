"""Fixtures of the gate suite. The `bmoe` pytest plugin (bmoe_ci.plugin) prepares the devices and
parametrises every test over (device, fixture); this file says what a gate reads, and registers the
short option names (`--device`, `--farm`, ...) as aliases of the plugin's `--bmoe-*` options."""

from __future__ import annotations

import json

import pytest

from bmoe_ci.gaterun.context import DeviceContext
from bmoe_ci.gaterun.engine import EngineResult
from bmoe_ci.gaterun.runner import DeviceRunner
from bmoe_ci.gaterun.state import GateState
from bmoe_ci.plugin.options import add_short_aliases
from bmoe_ci.replay import Trace, TraceError, parse_trace
from bmoe_ci.reports.xdev import fingerprint
from gates.plan import TracePath, family_skip, fixture_plan, is_dense


def pytest_addoption(parser: pytest.Parser) -> None:
    # Here, not in the plugin: pytest loads this conftest (an initial conftest of `pytest gates`) after
    # every installed plugin, so a short name another plugin owns (pytest-playwright's --device) is
    # already known and left alone instead of colliding. `--bmoe-device` and the rest always work.
    add_short_aliases(parser)


# Gates about expert streaming and routing: on a dense model (gemma3) there is no expert to stream,
# cache, prefetch, drop or substitute, so they are skipped there, saying so (never passed).
MOE_GATES = frozenset({"G1", "G2", "G5", "G8a", "G8a'", "G8b", "G8c", "G8d", "G8e", "G8w", "REPLAY"})
MOE_SUBGATES = frozenset({("DET", "io-lanes")})


@pytest.fixture(autouse=True)
def _skip_gates_a_fixture_leaves_out(request: pytest.FixtureRequest) -> None:
    marker = request.node.get_closest_marker("gate")
    callspec = getattr(request.node, "callspec", None)
    fixture = callspec.params.get("fixture") if callspec is not None else None
    if marker is None or not marker.args or fixture is None:
        return
    gate, sub = str(marker.args[0]), str(marker.args[1]) if len(marker.args) > 1 else ""
    places = request.getfixturevalue("gate_state").places
    if (gate in MOE_GATES or (gate, sub) in MOE_SUBGATES) and is_dense(fixture, places):
        pytest.skip(f"{fixture} is a dense model: no expert to stream, route, drop or substitute")
    # a gate family the fixture leaves out (fixtures.yaml skip_gates): skipped with the fixture's reason
    why = family_skip(str(fixture), gate, sub, places)
    if why is not None:
        pytest.skip(why)


# (device, fixture) plans whose fingerprints this process already handed to the controller
_DIGESTS_SENT = pytest.StashKey[set[tuple[str, str]]]()


def trace_paths(runner: DeviceRunner, fixture: str) -> TracePath:
    """Device path (in the device's work directory) of the route trace a plan entry writes."""
    return lambda entry: runner.session.file(f"trace-{fixture}-{entry}.csv")


def logits_path(runner: DeviceRunner, fixture: str) -> str:
    """Device path of the logits file the resident reference run writes (REF pulls it back)."""
    return runner.session.file(f"ref-{fixture}.logits.f32")


class PlanResults(dict[str, EngineResult]):
    """A plan's results by entry id; an entry the run left out says why instead of a bare KeyError."""

    def __missing__(self, key: str) -> EngineResult:
        raise KeyError(
            f"plan entry {key!r} was not run: no selected test's @pytest.mark.entries lists it "
            "(a test reading it must say so)"
        )


@pytest.fixture
def runs(
    runner: DeviceRunner, device: DeviceContext, fixture: str, gate_state: GateState, request: pytest.FixtureRequest
) -> dict[str, EngineResult]:
    """Every engine run of the fixture's plan on this device (run once, then cached). What each run
    produced is recorded for the device (its fingerprint: bytes, tokens, counters), for XDEV."""
    model = device.models[fixture]
    plan = fixture_plan(model, fixture, trace_paths(runner, fixture), logits_path(runner, fixture), gate_state.places)
    # only the entries the selected tests read (their `entries` markers): `-m g8b` runs G8b's entries only
    results = PlanResults(runner.plan(f"fixture:{fixture}", gate_state.entries(device.name, fixture, plan)))
    recorded = request.config.stash.setdefault(_DIGESTS_SENT, set())
    if (device.name, fixture) not in recorded:  # once per plan: the first test that reads it carries it
        recorded.add((device.name, fixture))
        prints = {entry: fingerprint(r.data, r.crashed) for entry, r in results.items()}
        request.node.user_properties.append(("bmoe.digests", json.dumps({fixture: prints})))
    return results


# (device, fixture) -> its plan's parsed route traces: parsed once per process, not once per test
_TRACES = pytest.StashKey[dict[tuple[str, str], dict[str, "Trace | str"]]]()


@pytest.fixture
def traces(
    runs: dict[str, EngineResult], runner: DeviceRunner, fixture: str, request: pytest.FixtureRequest
) -> dict[str, Trace | str]:
    """The route trace of every traced plan entry, pulled back in one round trip per fixture and parsed
    once (then cached): entry -> Trace, or one line saying why there is none (the run failed, the file
    is missing or malformed)."""
    parsed = request.config.stash.setdefault(_TRACES, {})
    key = (runner.session.device.name, fixture)
    if key not in parsed:
        parsed[key] = _read_traces(runs, runner, fixture)
    return dict(parsed[key])


def _read_traces(runs: dict[str, EngineResult], runner: DeviceRunner, fixture: str) -> dict[str, Trace | str]:
    paths = {entry: r.argv[r.argv.index("--route-trace") + 1] for entry, r in runs.items() if "--route-trace" in r.argv}
    texts = runner.texts(f"traces:{fixture}", sorted(paths.values()))
    out: dict[str, Trace | str] = {}
    for entry, path in paths.items():
        text = texts.get(path)
        if not runs[entry].ok:
            out[entry] = f"{entry}: no trace to read: {runs[entry].describe()}"
        elif text is None:
            out[entry] = f"{entry}: the run succeeded but wrote no route trace at {path}"
        else:
            try:
                out[entry] = parse_trace(text, f"{entry}:{path}")
            except TraceError as exc:
                out[entry] = str(exc)
    return out


@pytest.fixture
def model(device: DeviceContext, fixture: str) -> str:
    """Device path of the fixture model (what -m takes)."""
    return device.models[fixture]
