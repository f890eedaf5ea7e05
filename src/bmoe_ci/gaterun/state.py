"""Per-process state of a gate run: the prepared run and one engine runner per device.

The controller holds the device sessions it opened while preparing (and their leases); an xdist worker
opens its own session to each device it runs tests on, from the device's spec in the prepared run
(:func:`~bmoe_ci.farm.open_session` with ``lock=False``: the lease stays the controller's). Also the progress line of
one plan that ran (:func:`plan_line`), which a worker's test report carries to the controller.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bmoe_ci.farm import DeviceSession, InfraError, device_from_spec, open_session
from bmoe_ci.gaterun.context import DeviceContext, GateRun
from bmoe_ci.gaterun.runner import DeviceRunner
from bmoe_ci.paths import Places

#: Picks plan entries by id and argv (a gate that reads "every traced dropping entry" says so this way).
EntryFilter = Callable[[str, Sequence[str]], bool]


@dataclass
class PlanNeeds:
    """Which entries of a fixture's plan the selected tests of one device read: by id, by a predicate,
    or all of them (``every``: a test that iterates over the whole plan, or one that does not say)."""

    ids: set[str] = field(default_factory=set)
    filters: list[EntryFilter] = field(default_factory=list)
    every: bool = False

    def add(self, ids: Sequence[str] | None, where: EntryFilter | None = None) -> None:
        if ids is None and where is None:
            self.every = True
            return
        self.ids.update(ids or ())
        if where is not None:
            self.filters.append(where)

    def select(self, entries: Sequence[tuple[str, Sequence[str]]]) -> list[tuple[str, Sequence[str]]]:
        if self.every:
            return list(entries)
        return [(i, a) for i, a in entries if i in self.ids or any(f(i, a) for f in self.filters)]


class GateState:
    """The run and one runner per device, for the tests of one process.

    ``run`` is first the plan the tests were collected from (devices and fixture names); once the
    controller has readied what the selected tests need it is the prepared run (engine and model paths,
    unavailable devices). A worker reads that from ``prepared_file``, written by the controller before it
    hands out the first test."""

    def __init__(
        self,
        run: GateRun,
        sessions: dict[str, DeviceSession] | None = None,
        places: Places | None = None,
        prepared_file: Path | None = None,
    ):
        self.run = run
        self.places = places or Places()  # where the gate tests find the source tree and the caches
        self._sessions = sessions or {}
        self._runners: dict[str, DeviceRunner] = {}
        self._prepared_file = prepared_file
        self._ready = prepared_file is None and bool(run.engine_builds)
        #: (device, fixture) -> the plan entries its selected tests read (set at collection)
        self.needs: dict[tuple[str, str], PlanNeeds] = {}

    def set_prepared(self, run: GateRun, sessions: dict[str, DeviceSession]) -> None:
        self.run, self._sessions, self._ready = run, dict(sessions), True

    def prepared(self) -> GateRun:
        """The prepared run (read from the controller's file on a worker, once)."""
        if not self._ready:
            if self._prepared_file is None or not self._prepared_file.is_file():
                raise RuntimeError("the gate run was not prepared (the controller readied no device)")
            self.run = GateRun.from_json(self._prepared_file.read_text(encoding="utf-8"))
            self._ready = True
        return self.run

    def device(self, name: str) -> DeviceContext:
        return self.prepared().device(name)

    def entries(
        self, device: str, fixture: str, plan: Sequence[tuple[str, Sequence[str]]]
    ) -> list[tuple[str, Sequence[str]]]:
        """The entries of ``plan`` the selected tests of ``device`` on ``fixture`` read."""
        needs = self.needs.get((device, fixture))
        return list(plan) if needs is None else needs.select(plan)

    def runner(self, device: DeviceContext) -> DeviceRunner:
        if device.infra_error:
            reason = device.infra_reason or device.infra_error
            raise InfraError(device.name, device.infra_kind, reason, device.infra_step or "set-up")
        if device.name not in self._runners:
            session = self._sessions.get(device.name)
            fresh = session is None
            if session is None:  # an xdist worker: its own connection, the controller holds the lease
                session = open_session(
                    device_from_spec(device.spec),
                    run_id=self.run.run_id,
                    results_dir=Path(self.run.results_dir) / device.name,
                    pushed_engine=device.engine,
                    build_id=device.build_id,
                    connect=False,  # the runner connects, behind its breaker
                    lock=False,
                    check=False,
                )
            self._runners[device.name] = DeviceRunner(session)
            if fresh:
                # behind the breaker: a device gone since the set-up costs one connect, not one per test
                self._runners[device.name].connect()
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
