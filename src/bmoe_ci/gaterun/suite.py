"""Running the gate suite from a command and reading its verdict: :func:`run_gate_suite`.

`bmoe-ci nightly`, `bmoe-ci mutants` and `bmoe-ci release` never re-implement a gate: each runs the
real suite as a subprocess (`pytest <tree>/gates --bmoe-device ... --bmoe-results DIR`), so that the
suite's own process owns the pytest session, its xdist workers and its device leases, and reads the
verdicts back from the `summary.json` it wrote. The command line and the reading are built here only.

The farm is always named on the command line: the gate suite would otherwise take `$BMOE_FARM` or the
ini's `bmoe_farm`, not the farm the calling command loaded and chose its devices from.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from bmoe_ci.paths import is_checkout
from bmoe_ci.reports.records import Outcome
from bmoe_ci.reports.summary import SUMMARY_JSON

#: Seconds an interrupted gate run gets to end its session (and free its devices) before SIGKILL.
STOP_GRACE_S = 30
#: pytest's exit status for a usage error: the suite refused its options and ran nothing.
EXIT_USAGE = 4
#: A gate run's console log, beside its results when the caller keeps one.
LOG_NAME = "pytest.log"
#: The environment variable that gives the gate run its run id (read by the plugin: bmoe_ci.plugin).
ENV_RUN_ID = "BMOE_CI_RUN_ID"


@dataclass(frozen=True, kw_only=True)
class SuiteCall:
    """One gate run: which devices, where its results go, what it builds and runs."""

    tree: Path  # the source tree: its gates/ is the suite run
    farm: Path
    devices: Sequence[str]  # --bmoe-device selectors, each one option (`pool:nightly`, `host`, `a,b`)
    results: Path
    fixtures: Sequence[str] = ()
    faults: Sequence[str] = ()
    workers: int = 1  # xdist workers (`-n`); 1 runs in one process
    log: Path | None = None  # the console goes there (the command line first); None: to our stderr
    timeout: float | None = None  # seconds; then the run is stopped as on an interrupt
    run_id: str | None = None  # the gate run's id ($BMOE_CI_RUN_ID); None: it picks its own


@dataclass(frozen=True)
class DeviceVerdict:
    """One device's part of a gate run's summary."""

    device: str
    gates: dict[str, Outcome]  # gate id -> its outcome on the device
    build_id: str = ""
    infra_error: str | None = None


@dataclass(frozen=True)
class SuiteResult:
    """What a gate run left: its exit status and its summary.json (None when it wrote none, or one that
    cannot be read; :attr:`problem` then says why)."""

    command: tuple[str, ...]
    returncode: int
    results: Path
    summary: dict[str, Any] | None
    seconds: float
    log: Path | None = None
    problem: str | None = None
    timed_out: bool = False

    @property
    def refused(self) -> bool:
        """pytest refused the options (a usage error): nothing ran."""
        return self.returncode == EXIT_USAGE

    @property
    def complete(self) -> bool:
        """The session ran to its end (tests passed or failed) and wrote its summary."""
        return self.returncode in (0, 1) and self.summary is not None

    def devices(self) -> dict[str, DeviceVerdict]:
        out = {}
        for name, d in ((self.summary or {}).get("devices") or {}).items():
            out[name] = DeviceVerdict(
                device=name,
                gates=dict(d.get("gates") or {}),
                build_id=d.get("engine_build_id") or "",
                infra_error=d.get("infra_error"),
            )
        return out

    def verdicts(self, device: str) -> tuple[dict[str, Outcome], str | None]:
        """(gate -> outcome on ``device``, why there are no verdicts). Verdicts come from summary.json
        only; a device with an infrastructure error keeps what it has, and says why."""
        if self.summary is None:
            return {}, self.problem
        d = self.devices().get(device)
        if d is None:
            return {}, f"the gate run has no results for device {device}{self._see_log()}"
        if d.infra_error:
            return dict(d.gates), f"{device}: {d.infra_error}"
        return dict(d.gates), None

    def problem_of(self, gate: str, outcome: Outcome) -> str:
        """`name: message` of the first test of ``gate`` with ``outcome`` (summary.json `problems`)."""
        for p in (self.summary or {}).get("problems", []):
            if p.get("gate") == gate and p.get("outcome") == outcome:
                return f"{p.get('name', gate)}: {p.get('message', '')}"
        return ""

    def _see_log(self) -> str:
        return f" (log {self.log})" if self.log is not None else ""


def suite_command(call: SuiteCall) -> list[str]:
    """The gate run's command line."""
    cmd = [sys.executable, "-m", "pytest", str(call.tree / "gates"), "-p", "no:cacheprovider", "-q"]
    for selector in call.devices:
        cmd += ["--bmoe-device", selector]
    # absolute: the gate run's working directory is the source tree, not the caller's (a farm file given
    # as devices/lab.yaml is the caller's devices/lab.yaml)
    cmd += ["--bmoe-results", str(call.results.absolute()), "--bmoe-farm", str(call.farm.absolute())]
    if call.workers > 1:
        cmd += ["-n", str(call.workers)]
    for name in call.fixtures:
        cmd += ["--bmoe-fixture", name]
    for name in call.faults:
        cmd += ["--bmoe-fault", name]
    return cmd


def run_gate_suite(call: SuiteCall) -> SuiteResult:
    """Run the gate suite and read what it wrote. If this process is interrupted (Ctrl-C, or a SIGTERM
    the command turned into one), the run gets SIGINT first, so that pytest ends its session and gives
    its device leases back, and SIGKILL only if it does not end within :data:`STOP_GRACE_S`."""
    cmd = suite_command(call)
    # a checkout is the gate run's working directory; a wheel's packaged tree is not (nothing may be
    # written into site-packages), so the child then keeps ours
    cwd = call.tree if is_checkout(call.tree) else None
    env = {**os.environ, ENV_RUN_ID: call.run_id} if call.run_id else None
    started = time.monotonic()
    if call.log is not None:
        call.log.parent.mkdir(parents=True, exist_ok=True)
        with call.log.open("w", encoding="utf-8") as fh:
            fh.write(" ".join(cmd) + "\n")
            fh.flush()
            rc, timed_out = _run_child(cmd, cwd, fh, call.timeout, env)
    else:
        rc, timed_out = _run_child(cmd, cwd, sys.stderr, call.timeout, env)
    seconds = time.monotonic() - started
    summary, unreadable = read_summary(call.results)
    problem = None
    if summary is None:
        where = f" (log {call.log})" if call.log is not None else ""
        last = f": {last_line(call.log)}" if call.log is not None else ""
        problem = unreadable or f"the gate run wrote no summary (exit {rc}){last}{where}"
    return SuiteResult(tuple(cmd), rc, call.results, summary, seconds, call.log, problem, timed_out)


def read_summary(results: Path) -> tuple[dict[str, Any] | None, str | None]:
    """A results directory's summary.json, or (None, why it cannot be read); (None, None) when absent."""
    path = results / SUMMARY_JSON
    if not path.is_file():
        return None, None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return None, f"{path}: unreadable ({exc})"
    if not isinstance(data, dict):
        return None, f"{path}: not a summary object"
    return data, None


def last_line(log: Path | None) -> str:
    if log is None:
        return ""
    try:
        lines = [ln.strip() for ln in log.read_text(encoding="utf-8", errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1] if lines else ""


def _run_child(
    cmd: list[str], cwd: Path | None, out: IO[str], timeout: float | None, env: dict[str, str] | None = None
) -> tuple[int, bool]:
    """(exit status, whether it timed out); -1 for a run stopped at its timeout."""
    out.flush()
    proc = subprocess.Popen(
        cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT if out is not sys.stderr else None, env=env
    )
    try:
        return proc.wait(timeout=timeout), False
    except subprocess.TimeoutExpired:
        out.write(f"\nbmoe-ci: the gate run timed out after {timeout:g} s\n")
        _stop(proc)
        return -1, True
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


__all__ = [
    "EXIT_USAGE",
    "LOG_NAME",
    "DeviceVerdict",
    "SuiteCall",
    "SuiteResult",
    "last_line",
    "read_summary",
    "run_gate_suite",
    "suite_command",
]
