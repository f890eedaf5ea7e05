"""`bmoe-ci mutants`: build every fault of the catalogue and run the real gate suite against each.

The gates are not re-implemented here: each fault is one gate run (:func:`bmoe_ci.gaterun.suite.run_gate_suite`:
`pytest gates --bmoe-fault NAME --bmoe-device D --bmoe-results DIR/faults/NAME`, a subprocess), and its
verdicts are read back from that run's summary.json.
Before any fault, the clean engine runs the same suite: a gate that fails on the clean build would
"catch" every fault, so a clean run that is not green gives no verdict at all.

Builds are independent and cached by content hash, so they run first, `--jobs` at a time; the gate
runs then go one after the other (they lease the same device).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from bmoe_ci.builder import Build, BuildError, build
from bmoe_ci.faults import Fault
from bmoe_ci.gaterun.suite import LOG_NAME, SuiteCall, SuiteResult, run_gate_suite
from bmoe_ci.paths import Places
from bmoe_ci.reports.records import Outcome

#: What a fault's gate run says of it (the gates' own outcomes are :data:`bmoe_ci.reports.Outcome`).
#: "n/a": the fault's code does not run on the device's architecture (its `arch`), so it was not run
FaultVerdict = Literal["caught", "survived", "error", "n/a"]
CLEAN = "clean"  # the key of the clean build in engine_builds (fault names are upper case)
RUN_TIMEOUT_S = 3600


class NoVerdict(Exception):
    """The clean build does not pass the suite (or cannot run): no fault can be judged."""


@dataclass
class GateRunSpec:
    """What every gate run of one `bmoe-ci mutants` invocation shares."""

    device: str
    target: str
    farm: Path  # always named on the gate run's command line (bmoe_ci.gaterun.suite)
    fixtures: tuple[str, ...]
    results: Path
    repo: Path  # the source tree: its gates/ is the suite run


@dataclass
class FaultResult:
    fault: Fault
    outcome: FaultVerdict
    caught_by: list[str] = field(default_factory=list)
    gates: dict[str, Outcome] = field(default_factory=dict)  # gate -> pass / fail / error / skip
    message: str = ""
    build_id: str = ""
    seconds: float = 0.0


def gate_run(spec: GateRunSpec, fault: str | None, out: Path) -> SuiteResult:
    """One gate run of the suite on the device (with ``fault`` built in); its console goes to
    out/pytest.log."""
    return run_gate_suite(
        SuiteCall(
            tree=spec.repo,
            farm=spec.farm,
            devices=(spec.device,),
            results=out,
            fixtures=spec.fixtures,
            faults=(fault,) if fault else (),
            log=out / LOG_NAME,
            timeout=RUN_TIMEOUT_S,
        )
    )


def classify(fault: Fault, run: SuiteResult, device: str) -> FaultResult:
    """A gate *failure* is a catch; an error (infrastructure, no verdict) never is."""
    gates, why_none = run.verdicts(device)
    caught_by = [g for g, v in gates.items() if v == "fail"]
    errors = [g for g, v in gates.items() if v == "error"]
    if caught_by:
        return FaultResult(fault, "caught", caught_by, gates, run.problem_of(caught_by[0], "fail"), seconds=run.seconds)
    if why_none or errors:
        message = why_none or f"{', '.join(errors)}: {run.problem_of(errors[0], 'error')}"
        return FaultResult(fault, "error", [], gates, message, seconds=run.seconds)
    if not gates:
        return FaultResult(fault, "error", [], gates, f"no gate ran (log {run.log})", seconds=run.seconds)
    return FaultResult(fault, "survived", [], gates, "every gate passed or was skipped", seconds=run.seconds)


def check_clean(run: SuiteResult, device: str) -> dict[str, Outcome]:
    """The clean build's verdicts, or NoVerdict when it is not a clean pass."""
    gates, why_none = run.verdicts(device)
    if why_none:
        raise NoVerdict(f"the clean engine gave no verdict: {why_none}")
    bad = {g: v for g, v in gates.items() if v in ("fail", "error")}
    if bad or not gates:
        listed = ", ".join(f"{g} {v}" for g, v in bad.items()) or "no gate ran"
        raise NoVerdict(
            f"the clean engine does not pass the gate suite ({listed}; log {run.log}): "
            "a fault's failures would mean nothing"
        )
    return gates


def build_all(
    target: str,
    faults: Sequence[Fault],
    jobs: int,
    rebuild: bool,
    say: Callable[[str], None],
    places: Places | None = None,
) -> tuple[Build, dict[str, Build | BuildError]]:
    """The clean engine and every fault's, `jobs` compilers at a time (each build is cached by its
    content hash, so an unchanged tree compiles nothing)."""
    quiet: Callable[[str], None] = lambda _msg: None  # noqa: E731 - one progress line per build instead
    clean = build(target, rebuild=rebuild, progress=say, places=places)

    def one(fault: Fault) -> tuple[str, Build | BuildError]:
        try:
            b = build(target, defines=[fault.define], rebuild=rebuild, progress=quiet, places=places)
        except BuildError as exc:
            return fault.name, exc
        say(f"built {fault.name}: {b.build_id} ({'compiled' if b.compiled else 'cached'})")
        return fault.name, b

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        builds = dict(pool.map(one, faults))
    return clean, builds
