"""`bmoe-ci mutants`: build every fault of the catalogue and run the real gate suite against each.

The gates are not re-implemented here: each fault is one `pytest gates --bmoe-fault NAME --bmoe-device D
--bmoe-results DIR/faults/NAME` subprocess, and its verdicts are read back from that run's summary.json.
Before any fault, the clean engine runs the same suite: a gate that fails on the clean build would
"catch" every fault, so a clean run that is not green gives no verdict at all.

Builds are independent and cached by content hash, so they run first, `--jobs` at a time; the gate
runs then go one after the other (they lease the same device).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Literal

from bmoe_ci.builder import Build, BuildError, build
from bmoe_ci.farm.localfarm import farm_file
from bmoe_ci.mutants.catalogue import Fault
from bmoe_ci.paths import is_checkout

Outcome = Literal["caught", "survived", "error"]
CLEAN = "clean"  # the key of the clean build in engine_builds (fault names are upper case)
RUN_TIMEOUT_S = 3600
#: Seconds an interrupted gate run gets to end its session (and free its device) before SIGKILL.
STOP_GRACE_S = 30


class NoVerdict(Exception):
    """The clean build does not pass the suite (or cannot run): no fault can be judged."""


@dataclass
class GateRunSpec:
    """What every gate run of one `bmoe-ci mutants` invocation shares."""

    device: str
    target: str
    farm: str | None
    fixtures: tuple[str, ...]
    results: Path
    repo: Path  # the source tree: its gates/ is the suite run


@dataclass
class FaultResult:
    fault: Fault
    outcome: Outcome
    caught_by: list[str] = field(default_factory=list)
    gates: dict[str, str] = field(default_factory=dict)  # gate -> pass / fail / error / skip
    message: str = ""
    build_id: str = ""
    seconds: float = 0.0


@dataclass
class GateRunOutcome:
    returncode: int
    summary: dict[str, Any] | None
    log: Path
    seconds: float


def run_gate_suite(spec: GateRunSpec, fault: str | None, out: Path) -> GateRunOutcome:
    """One `pytest gates` subprocess; its console goes to out/pytest.log."""
    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pytest", str(spec.repo / "gates"), "-p", "no:cacheprovider", "-q",
           "--bmoe-device", spec.device, "--bmoe-results", str(out)]
    # always named: the gate suite would otherwise take $BMOE_FARM or the ini's bmoe_farm, not the farm
    # the device was chosen from
    cmd += ["--bmoe-farm", spec.farm or str(farm_file())]
    if fault:
        cmd += ["--bmoe-fault", fault]
    for name in spec.fixtures:
        cmd += ["--bmoe-fixture", name]
    log = out / "pytest.log"
    started = time.monotonic()
    with log.open("w", encoding="utf-8") as fh:
        fh.write(" ".join(cmd) + "\n")
        fh.flush()
        # a checkout is the gate run's working directory as before; a wheel's packaged tree is not
        # (nothing may be written into site-packages), so the child then keeps ours
        rc = _run_child(cmd, spec.repo if is_checkout(spec.repo) else None, fh)
    summary_file = out / "summary.json"
    summary = None
    if summary_file.is_file():
        try:
            summary = json.loads(summary_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            summary = None
    return GateRunOutcome(rc, summary, log, time.monotonic() - started)


def _run_child(cmd: list[str], cwd: Path | None, fh: IO[str]) -> int:
    """The gate run's exit status. If this process is interrupted (Ctrl-C, or SIGTERM, which
    `bmoe-ci mutants` turns into the same), the child gets SIGINT first, so that pytest ends its
    session and gives its device lease back, and SIGKILL only if it does not end within the grace."""
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=fh, stderr=subprocess.STDOUT)
    try:
        return proc.wait(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        fh.write(f"\nbmoe-ci mutants: the gate run timed out after {RUN_TIMEOUT_S} s\n")
        _stop(proc)
        return -1
    except BaseException:
        _stop(proc)
        raise


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _last_line(log: Path) -> str:
    try:
        lines = [ln.strip() for ln in log.read_text(encoding="utf-8", errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1] if lines else ""


def verdicts(run: GateRunOutcome, device: str) -> tuple[dict[str, str], str | None]:
    """(gate -> verdict on the device, why there are none). Verdicts come from summary.json only."""
    if run.summary is None:
        return {}, f"the gate run wrote no summary (exit {run.returncode}): {_last_line(run.log)} (log {run.log})"
    dev = run.summary.get("devices", {}).get(device)
    if dev is None:
        return {}, f"the gate run has no results for device {device} (log {run.log})"
    if dev.get("infra_error"):
        return dict(dev.get("gates", {})), f"{device}: {dev['infra_error']}"
    return dict(dev.get("gates", {})), None


def _problem(summary: dict[str, Any] | None, gate: str, outcome: str) -> str:
    for p in (summary or {}).get("problems", []):
        if p.get("gate") == gate and p.get("outcome") == outcome:
            return f"{p.get('name', gate)}: {p.get('message', '')}"
    return ""


def classify(fault: Fault, run: GateRunOutcome, device: str) -> FaultResult:
    """A gate *failure* is a catch; an error (infrastructure, no verdict) never is."""
    gates, why_none = verdicts(run, device)
    caught_by = [g for g, v in gates.items() if v == "fail"]
    errors = [g for g, v in gates.items() if v == "error"]
    if caught_by:
        return FaultResult(fault, "caught", caught_by, gates, _problem(run.summary, caught_by[0], "fail"),
                           seconds=run.seconds)
    if why_none or errors:
        message = why_none or f"{', '.join(errors)}: {_problem(run.summary, errors[0], 'error')}"
        return FaultResult(fault, "error", [], gates, message, seconds=run.seconds)
    if not gates:
        return FaultResult(fault, "error", [], gates, f"no gate ran (log {run.log})", seconds=run.seconds)
    return FaultResult(fault, "survived", [], gates, "every gate passed or was skipped", seconds=run.seconds)


def check_clean(run: GateRunOutcome, device: str) -> dict[str, str]:
    """The clean build's verdicts, or NoVerdict when it is not a clean pass."""
    gates, why_none = verdicts(run, device)
    if why_none:
        raise NoVerdict(f"the clean engine gave no verdict: {why_none}")
    bad = {g: v for g, v in gates.items() if v in ("fail", "error")}
    if bad or not gates:
        listed = ", ".join(f"{g} {v}" for g, v in bad.items()) or "no gate ran"
        raise NoVerdict(f"the clean engine does not pass the gate suite ({listed}; log {run.log}): "
                        "a fault's failures would mean nothing")
    return gates


def build_all(target: str, faults: Sequence[Fault], jobs: int, rebuild: bool,
              say: Callable[[str], None]) -> tuple[Build, dict[str, Build | BuildError]]:
    """The clean engine and every fault's, `jobs` compilers at a time (each build is cached by its
    content hash, so an unchanged tree compiles nothing)."""
    quiet: Callable[[str], None] = lambda _msg: None  # noqa: E731 - one progress line per build instead
    clean = build(target, rebuild=rebuild, progress=say)

    def one(fault: Fault) -> tuple[str, Build | BuildError]:
        try:
            b = build(target, defines=[fault.define], rebuild=rebuild, progress=quiet)
        except BuildError as exc:
            return fault.name, exc
        say(f"built {fault.name}: {b.build_id} ({'compiled' if b.compiled else 'cached'})")
        return fault.name, b

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        builds = dict(pool.map(one, faults))
    return clean, builds
