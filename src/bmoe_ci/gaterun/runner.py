"""Runs engine work on one device: whole plans through `bmoe batch`, single runs on demand.

A plan is a list of (id, argv) entries. It goes to the device in ONE round trip (`bmoe batch
/dev/stdin`), and each entry runs on a fresh engine instance there. If the engine crashes on an
entry, the batch process dies: the lines already printed are kept, the entry that was running is
recorded as a crash (a gate verdict: the engine is wrong), and the rest of the plan is sent again.
An infrastructure problem (unreachable, timeout, disconnect) is raised as InfraError: no verdict.

Hangs cost one deadline, once. Each entry has the device's entry deadline (`entry_timeout` x
`timeout_scale`), enforced on the device (`farm/deadline.py`); an entry that passes it is a `timeout`
error naming the entry. That error is remembered for the plan: every later test of the device that
needs the same plan gets it again without re-running anything. After two timeouts the device is
taken out of the run: its remaining tests are errors with that reason, the other devices go on.
"""

from __future__ import annotations

import dataclasses
import json
import os
import posixpath
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from bmoe_ci.farm import DeviceSession, Ending, InfraError, RunResult
from bmoe_ci.farm.deadline import deadline_hit, kill_leftovers, strip_marks
from bmoe_ci.gaterun.engine import EngineResult, crash_of, from_run, parse_result

#: Timeouts after which a device is taken out of the run.
MAX_TIMEOUTS = 2
#: Infrastructure errors that mean the link itself is gone (a hung link is a ``timeout`` the transport
#: marks as hung): the breaker then tries one reconnect.
LINK_LOST = ("disconnect", "unreachable")

T = TypeVar("T")


@dataclass(frozen=True)
class PlanDone:
    """One plan that ran on the device (for the progress lines): its key, entries, wall seconds, and
    how it ended ("ok", or the InfraError kind that stopped it, e.g. "timeout")."""

    key: str
    entries: int
    seconds: float
    outcome: str = "ok"
    crashed: int = 0  # entries the engine died on (verdicts, not infrastructure)

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "entries": self.entries,
            "seconds": round(self.seconds, 3),
            "outcome": self.outcome,
            "crashed": self.crashed,
        }


@dataclass
class DeviceRunner:
    """Per-device engine work on a worker, cached so each plan runs once per device and key."""

    session: DeviceSession
    engine_s: float = 0.0  # engine time on the device not yet attributed to a test
    timeouts: list[str] = field(default_factory=list)  # every timeout of this device, in order
    retired: str | None = None  # why the device is out of the run
    #: the device's breaker: set once its link was lost and one reconnect failed; every later call
    #: raises it at once instead of reaching for the device again
    broken: InfraError | None = None
    _quiet: bool = True  # False after an engine command ended without a verdict: it may still run there
    _cache: dict[str, dict[str, EngineResult] | InfraError] = field(default_factory=dict)
    _texts: dict[str, dict[str, str | None]] = field(default_factory=dict)
    # plans run since the last take_plans_done(): they travel to the controller on the test report
    # that ran them (xdist workers print nothing themselves)
    _plans_done: list[PlanDone] = field(default_factory=list)
    #: the kernel paths (the engine JSON's ``kernels``) the engine ran since the last take_kernels()
    _kernels: set[str] = field(default_factory=set)

    def take_engine_seconds(self) -> float:
        spent, self.engine_s = self.engine_s, 0.0
        return spent

    def take_kernels(self) -> list[str]:
        """The kernel paths the engine reported since the last call (the run's records name them)."""
        seen, self._kernels = sorted(self._kernels), set()
        return seen

    def take_plans_done(self) -> list[PlanDone]:
        done, self._plans_done = self._plans_done, []
        return done

    def plan(self, key: str, entries: Sequence[tuple[str, Sequence[str]]]) -> dict[str, EngineResult]:
        """Results of every entry, by id; runs the plan the first time `key` is asked for. A plan that
        timed out raises the same InfraError every time it is asked for."""
        if key not in self._cache:
            self._check_in_run()
            started = time.monotonic()
            try:
                results = self._guarded(f"plan {key!r}", lambda: self._run_batch(key, entries), engine=True)
            except InfraError as exc:
                self._plans_done.append(PlanDone(key, len(entries), time.monotonic() - started, exc.kind))
                if exc.kind == "timeout" and self.broken is None:
                    self._cache[key] = self._timed_out(exc)
                raise
            try:
                self._refuse_missing_path(results.values())
            except InfraError as exc:
                self._plans_done.append(PlanDone(key, len(entries), time.monotonic() - started, exc.kind))
                refused = exc.at(f"plan {key!r}")
                self._cache[key] = refused
                raise refused from None
            crashed = sum(1 for r in results.values() if r.crashed)
            self._plans_done.append(PlanDone(key, len(entries), time.monotonic() - started, "ok", crashed))
            self._cache[key] = results
        cached = self._cache[key]
        if isinstance(cached, InfraError):
            raise cached
        return cached

    def texts(self, key: str, paths: Sequence[str]) -> dict[str, str | None]:
        """The text of device files (e.g. the route traces a plan wrote) in ONE round trip, cached by
        `key`: path -> text, or None for a file that is not there (its run did not write it). Each file
        is verified against its size and sha256 on the device: one that stays short is an InfraError."""
        if key not in self._texts:
            self._texts[key] = self._guarded(f"read {key}", lambda: self._read_texts(paths))
        return self._texts[key]

    def _read_texts(self, paths: Sequence[str]) -> dict[str, str | None]:
        if not paths:
            return {}
        got = self.session.read_files(paths)  # verified on the device: a short read is an InfraError
        return {p: (None if b is None else b.decode(errors="replace")) for p, b in got.items()}

    def pull(self, remote_path: str, local: str | os.PathLike[str]) -> Path:
        """A device file copied into the device's results directory, verified (see
        :meth:`DeviceSession.pull`); behind the device's breaker like every other call."""
        step = f"pull {posixpath.basename(remote_path)}"
        return self._guarded(step, lambda: self.session.pull(remote_path, local))

    def single(self, argv: Sequence[str], env: Mapping[str, str] | None = None) -> EngineResult:
        """One engine process for one command (the batch == single-process identity needs this; `env`:
        variables for the engine, e.g. BMOE_KERNELS)."""

        def once() -> EngineResult:
            # under the plan's watcher too: the same deadline, and a pid file that lets a later command
            # kill it should its link be lost while it runs
            r = self.session.run_plan(list(argv), 1, stdin=None, env=env)
            self.engine_s += r.duration
            if r.outcome is Ending.INFRA:
                raise r.infra or InfraError(self.session.device.name, "disconnect", r.describe())
            if deadline_hit(r.stderr):
                raise InfraError(
                    self.session.device.name,
                    "timeout",
                    f"gave no result within its deadline of {self.session.entry_deadline:g}s; killed on the "
                    f"device ({' '.join(map(str, argv))[:160]})",
                )
            stderr = _without_emulator_lines(strip_marks(r.stderr.decode(errors="replace")))
            result = from_run(argv, dataclasses.replace(r, stderr=stderr.encode()))
            self._refuse_missing_path([result], own_path=not (env and "BMOE_KERNELS" in env))
            return result

        try:
            return self._guarded("single run", once, engine=True)
        except InfraError as exc:
            if exc.kind == "timeout" and self.broken is None:
                raise self._timed_out(exc) from None
            raise

    def _refuse_missing_path(self, results: Iterable[EngineResult], *, own_path: bool = True) -> None:
        """The engine refuses a kernel path its CPU or build lacks (exit 2, "BMOE_KERNELS: the X kernels
        are not available"). When that path is the device's pinned ``kernels``, the farm file asks for
        what the device cannot do: an infrastructure error naming the device, never a gate verdict.
        ``own_path``: the runs used the device's own path (not one a gate asked for), so their ``kernels``
        is recorded as the path the device ran."""
        device = self.session.device
        results = list(results)
        if own_path:
            self._kernels.update(str(r.data["kernels"]) for r in results if r.data.get("kernels"))
        if device.kernels == "auto":
            return
        for r in results:
            err = r.data.get("error")
            text = f"{err.get('message', '') if isinstance(err, dict) else err or ''} {r.stderr}"
            if "BMOE_KERNELS: the" in text and "not available" in text:
                raise InfraError(
                    device.name,
                    "preflight",
                    f"kernels: {device.kernels} ({device.source}): the engine says this CPU or build does "
                    "not have that kernel path",
                )

    def connect(self) -> None:
        """Connect the session (a worker's own connection), behind the breaker: a device that cannot be
        reached now is out of the run after that one try."""

        def once() -> None:
            try:
                self.session.transport.connect(retries=0)
            except InfraError as exc:
                self.broken = InfraError(
                    exc.device, exc.kind, f"taken out of the run: it could not be reached again ({exc.reason})"
                )
                raise

        self._guarded("connect", once)

    # -- the breaker
    def _guarded(self, step: str, call: Callable[[], T], *, engine: bool = False) -> T:
        """``call()`` behind the device's breaker: refused at once when the device is broken; after a lost
        link (dropped, refused, or hung past the controller's deadline) one reconnect, bounded by
        ``connect_timeout``, decides: back, and the run goes on; still gone, and the breaker opens. Before
        an engine command, whatever an earlier command of this run left running on the device is killed
        (a lost link does not stop it there), so two engines never run side by side."""
        self._check_in_run()
        try:
            if engine and not self._quiet:
                kill_leftovers(self.session.transport, self.session.device.connect_timeout)
                self._quiet = True
            return call()
        except InfraError as exc:
            if engine:
                self._quiet = False
            if exc.kind in LINK_LOST or (exc.kind == "timeout" and self.session.transport.link_hung):
                self._reconnect_or_break(exc.at(step))
            raise exc.at(step) from None

    def _reconnect_or_break(self, lost: InfraError) -> None:
        if self.broken is not None:
            return
        try:
            self.session.transport.reconnect()
        except InfraError as again:
            self.broken = InfraError(
                lost.device,
                lost.kind,
                f"taken out of the run: its link was lost ({lost.step + ': ' if lost.step else ''}{lost.reason}) "
                f"and one reconnect failed ({again.kind}: {again.reason})",
            )

    def _check_in_run(self) -> None:
        if self.broken is not None:
            raise self.broken
        if self.retired is not None:
            raise InfraError(self.session.device.name, "timeout", self.retired)

    def _timed_out(self, exc: InfraError) -> InfraError:
        self.timeouts.append(f"{exc.step}: {exc.reason}" if exc.step else exc.reason)
        if len(self.timeouts) >= MAX_TIMEOUTS and self.retired is None:
            self.retired = f"taken out of the run after {len(self.timeouts)} timeouts: " + "; ".join(self.timeouts)
        return exc

    def _checked(self, r: RunResult) -> RunResult:
        self.engine_s += r.duration
        if r.outcome is Ending.INFRA:
            raise r.infra or InfraError(self.session.device.name, "disconnect", r.describe())
        return r

    def _run_batch(self, key: str, entries: Sequence[tuple[str, Sequence[str]]]) -> dict[str, EngineResult]:
        results: dict[str, EngineResult] = {}
        pending = list(entries)
        device = self.session.device.name
        while pending:
            plan = "".join(json.dumps({"id": i, "argv": list(a)}) + "\n" for i, a in pending)
            r = self.session.run_plan(["batch", "/dev/stdin"], len(pending), stdin=plan.encode())
            if r.outcome is Ending.INFRA and r.infra is not None and r.infra.kind == "timeout":
                first_id = pending[0][0]
                raise InfraError(device, "timeout", f"from entry {first_id!r}: {r.infra.reason}")
            r = self._checked(r)
            stderr = _without_emulator_lines(strip_marks(r.stderr.decode(errors="replace")))
            for line in r.stdout.decode(errors="replace").splitlines():
                if not line.strip():
                    continue
                data = parse_result(line)
                entry_id = data.pop("id", None)
                argv = dict(pending).get(entry_id)
                if argv is not None:
                    results[entry_id] = EngineResult(tuple(argv), data, None, 0, stderr)
            pending = [(i, a) for i, a in pending if i not in results]
            if not pending:
                break
            first_id, first_argv = pending[0]
            if deadline_hit(r.stderr):
                raise InfraError(
                    device,
                    "timeout",
                    f"entry {first_id!r} gave no result within its deadline of "
                    f"{self.session.entry_deadline:g}s; killed on the device ({' '.join(map(str, first_argv))[:160]})",
                )
            crashed = crash_of(r)
            if crashed is None:
                # The batch ended by itself without answering every entry: the engine broke its
                # contract. Record that as a verdict on the first unanswered entry.
                crashed = f"batch exited {r.exit_code} without a result"
            results[first_id] = EngineResult(tuple(first_argv), {}, crashed, r.exit_code, stderr)
            pending = pending[1:]
        return results


# What qemu-user (a device's exec prefix) prints itself when the program it runs dies of a signal:
# the emulator's line, not the engine's, and a real device prints nothing there. The signal itself
# still reaches the controller (qemu dies of it too), so the crash is recorded as on any device.
_EMULATOR_LINES = ("qemu: uncaught target signal",)


def _without_emulator_lines(stderr: str) -> str:
    if "qemu: " not in stderr:
        return stderr
    return "".join(ln for ln in stderr.splitlines(keepends=True) if not ln.startswith(_EMULATOR_LINES))


__all__ = ["MAX_TIMEOUTS", "DeviceRunner", "EngineResult", "PlanDone"]
