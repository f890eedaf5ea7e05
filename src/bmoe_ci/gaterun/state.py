"""Per-process state of a gate run: the prepared run and one engine runner per device.

The controller holds the device sessions it opened while preparing; an xdist worker opens its own
connection to each device it runs tests on (the controller keeps the lease). Also the progress line of
one plan that ran (:func:`plan_line`), which a worker's test report carries to the controller.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bmoe_ci.farm import DeviceSession, InfraError, load_farm
from bmoe_ci.gaterun.context import DeviceContext, GateRun
from bmoe_ci.gaterun.runner import DeviceRunner
from bmoe_ci.paths import Places


class GateState:
    """The run context and one runner per device, for the tests of one process."""

    def __init__(self, run: GateRun, sessions: dict[str, DeviceSession] | None = None, places: Places | None = None):
        self.run = run
        self.places = places or Places()  # where the gate tests find the source tree and the caches
        self._sessions = sessions or {}
        self._runners: dict[str, DeviceRunner] = {}

    def runner(self, device: DeviceContext) -> DeviceRunner:
        if device.infra_error:
            reason = device.infra_reason or device.infra_error
            raise InfraError(device.name, device.infra_kind, reason, device.infra_step or "set-up")
        if device.name not in self._runners:
            session = self._sessions.get(device.name)
            if session is None:  # an xdist worker: its own connection, the controller holds the lock
                spec = load_farm(self.run.farm_file).device(device.name)
                session = DeviceSession(
                    spec, run_id=self.run.run_id, results_dir=Path(self.run.results_dir) / device.name
                )
                session.connect()
                session.engine = device.engine
                session.build_id = device.build_id
            self._runners[device.name] = DeviceRunner(session)
        return self._runners[device.name]

    def close_worker_sessions(self) -> None:
        """Close the connections this process opened itself (the controller's are closed by it)."""
        for name, r in self._runners.items():
            if name not in self._sessions:
                r.session.close()


def plan_line(device: str, plan: dict[str, Any]) -> str:
    """`host x qwen3moe: plan of 24 entries done, 5.2 s` (a fixture plan's key is `fixture:<name>`)."""
    what = str(plan.get("key", ""))
    what = what.split(":", 1)[1] if what.startswith("fixture:") else what
    entries, seconds = plan.get("entries", 0), float(plan.get("seconds", 0.0))
    outcome = plan.get("outcome", "ok")
    if outcome != "ok":
        return f"{device} x {what}: plan of {entries} entries stopped ({outcome}) after {seconds:.1f} s"
    crashed = int(plan.get("crashed", 0))
    crashes = f", {crashed} crashed" if crashed else ""
    return f"{device} x {what}: plan of {entries} entries done{crashes}, {seconds:.1f} s"


__all__ = ["GateState", "plan_line"]
