"""A device session: transport + lock + push + preflight, and engine runs with the device's settings."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import posixpath
import socket
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from .deadline import result_file_name, silence_limit, watched_argv
from .errors import InfraError
from .lock import DeviceLock, Heartbeat
from .model import Device
from .preflight import EngineVersion, PreflightReport, check_engine, check_platform
from .pull import pull as verified_pull
from .pull import read_files
from .store import RUNS, GcReport, Mismatch, PushItem, PushReport, gc, push
from .transports import Ending, RunResult, Transport, open_transport


def default_run_id() -> str:
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{socket.gethostname()}-{os.getpid()}"


class DeviceSession:
    """Everything one run does with one device, opened by :func:`open_session` (the tests also build one
    by hand around a transport they made)::

        with open_session(device, run_id=rid, results_dir=Path("results/rid/host"), engine=path) as s:
            r = s.run_engine(["run", "-m", s.file("fixtures/x.gguf"), "--json"], timeout=30)

    ``pushed_bytes`` sums every push of the session; ``engine_seconds`` the duration of engine runs.
    """

    def __init__(
        self,
        device: Device,
        *,
        run_id: str | None = None,
        results_dir: str | os.PathLike[str] | None = None,
        transport: Transport | None = None,
        lock_ttl: float | None = None,
        progress: Callable[[str], None] | None = None,
    ):
        self.device = device
        self.run_id = run_id or default_run_id()
        self.results_dir = Path(results_dir) if results_dir is not None else None
        self.transport = transport or open_transport(device)
        self.progress = progress
        self.device_lock = DeviceLock(self.transport, self.run_id, ttl=lock_ttl or device.lease_ttl, progress=self._say)
        self.heartbeat: Heartbeat | None = None
        self.engine: str | None = None  #: device path of the pushed engine
        self.build_id: str | None = None
        self.engine_version: EngineVersion | None = None
        self.preflight_report: PreflightReport | None = None
        self.pushes: list[PushReport] = []
        self.engine_seconds = 0.0

    def _say(self, msg: str) -> None:
        if self.progress:
            self.progress(msg)

    # -- steps
    def connect(self) -> DeviceSession:
        self.transport.connect()
        return self

    def lock(self, wait: float = 0.0) -> DeviceSession:
        """Take the device's lease (:class:`~bmoe_ci.farm.errors.DeviceBusy` if held elsewhere after
        ``wait`` seconds) and start renewing it from a background thread until :meth:`close`."""
        self.device_lock.acquire(wait=wait)
        if self.device_lock.owner is not None and self.heartbeat is None:
            self.heartbeat = Heartbeat(self.device_lock, progress=self._say).start()
        return self

    def push_files(self, items: Iterable[PushItem | str | os.PathLike[str]]) -> PushReport:
        """Push into the device's verified store (named items also get ``<workdir>/<name>`` links).

        While the session holds the lock, leftover upload temporaries are swept and the files are
        added to this run's use list (what :meth:`gc` keeps)."""
        locked = self.device_lock.owner is not None
        report = push(
            self.transport,
            items,
            progress=self.progress,
            sweep=locked,
            uses=self.transport.path(RUNS, self.run_id) if locked else None,
            min_free_mb=self.device.min_free_mb,
        )
        self.pushes.append(report)
        return report

    def push_engine(self, path: str | os.PathLike[str], build_id: str | None = None) -> str:
        """Push the engine binary (executable); remember its device path and expected build id."""
        report = self.push_files([PushItem(Path(path), executable=True)])
        self.engine = report.files[0].path
        self.build_id = build_id
        return self.engine

    def check_platform(self) -> PreflightReport:
        """The preflight's checks that need no engine (arch or Android ABI, the exec prefix, free space,
        the clock), in one round trip: what must hold before anything is pushed (a 32-bit phone gets no
        engine it cannot run). :meth:`check_engine` then completes the preflight."""
        self.preflight_report = check_platform(self.transport)
        return self.preflight_report

    def check_engine(self) -> EngineVersion:
        rep = self.preflight_report or PreflightReport(self.device.name)
        self.engine_version = check_engine(self.transport, self._engine(), self.build_id, rep)
        return self.engine_version

    # -- use
    def gc(self, keep_runs: int | None = None) -> GcReport:
        """Remove stored files not used by the device's last ``keep_runs`` runs (default: the
        device's ``keep_runs``). Needs the lock."""
        if self.device_lock.owner is None:
            raise RuntimeError("gc needs the device lock")
        return gc(self.transport, keep_runs or self.device.keep_runs)

    @property
    def pushed_bytes(self) -> int:
        return sum(p.bytes_pushed for p in self.pushes)

    @property
    def verified_files(self) -> int:
        """Distinct stored files whose hash was checked on the device in this session."""
        return len({f.sha256 for p in self.pushes for f in p.files})

    @property
    def mismatches(self) -> list[Mismatch]:
        """Every stored or uploaded file found corrupted (and re-pushed) in this session."""
        return [m for p in self.pushes for m in p.mismatches]

    def file(self, name: str) -> str:
        """Device path of a pushed item's link name (or any path relative to the work directory)."""
        return self.transport.path(name)

    def _engine(self) -> str:
        if self.engine is None:
            raise RuntimeError("no engine pushed in this session (call push_engine first)")
        return self.engine

    def engine_env(self, env: Mapping[str, str] | None) -> dict[str, str]:
        """The engine's environment on this device: ``env`` with the device's pinned kernel path
        (its ``kernels`` key) as BMOE_KERNELS, unless ``env`` names a path itself (DET-kernels' scalar
        run does)."""
        out = dict(env or {})
        if self.device.kernels != "auto":
            out.setdefault("BMOE_KERNELS", self.device.kernels)
        return out

    def engine_argv(self, args: Sequence[str]) -> list[str]:
        """The full command line an engine run uses on this device (exec prefix included)."""
        return [*self.device.exec_prefix, self._engine(), *map(str, args)]

    def run_engine(
        self,
        args: Sequence[str],
        timeout: float,
        *,
        stdin: bytes | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> RunResult:
        """Run the pushed engine with ``args`` under the exec prefix; ``timeout`` is multiplied by the
        device's ``timeout_scale``. Never raises for infrastructure problems (see :class:`RunResult`)."""
        env = self.engine_env(env)
        r = self.transport.run(
            [self._engine(), *map(str, args)],
            timeout * self.device.timeout_scale,
            engine=True,
            stdin=stdin,
            env=env,
            cwd=cwd,
        )
        self.engine_seconds += r.duration
        return r

    @property
    def entry_deadline(self) -> float:
        """Seconds one plan entry may run without a result: ``entry_timeout`` x ``timeout_scale``."""
        return self.device.entry_timeout * self.device.timeout_scale

    def run_plan(
        self, args: Sequence[str], entries: int, *, stdin: bytes | None, env: Mapping[str, str] | None = None
    ) -> RunResult:
        """Run an engine plan (``bmoe batch``) of ``entries`` entries under the device-side watcher
        (:mod:`~bmoe_ci.farm.deadline`): an entry that gives no result within :attr:`entry_deadline` is
        killed on the device. The watcher says it is alive every few seconds; the controller takes the
        device or its link for hung after :func:`~bmoe_ci.farm.deadline.silence_limit` seconds without a
        byte, and the whole plan has ``entries`` deadlines at most. ``env``: variables for the engine."""
        deadline = self.entry_deadline
        command = self.engine_argv(args)
        env = self.engine_env(env)
        if env:
            command = ["env", *(f"{k}={v}" for k, v in env.items()), *command]
        argv = watched_argv(command, deadline, self.transport.path(result_file_name()))
        silence = silence_limit(deadline, self.device.connect_timeout)
        r = self.transport.run(argv, deadline * max(1, entries) + 30.0, stdin=stdin, idle_timeout=silence)
        self.engine_seconds += r.duration
        if r.outcome is Ending.EXITED and r.exit_code is not None and 128 < r.exit_code < 128 + 65:
            # the watcher's shell reports an engine killed by signal N as status 128+N (the engine's
            # own exit codes are 0-4), as the ssh wrapper does for every command
            r = dataclasses.replace(r, outcome=Ending.SIGNALED, signal=r.exit_code - 128, exit_code=None)
        return r

    def run(self, argv: Sequence[str], timeout: float, **kw) -> RunResult:
        """Run any command (no exec prefix, timeout not scaled)."""
        return self.transport.run(argv, timeout, **kw)

    def pull(self, remote_path: str, local_name: str | os.PathLike[str]) -> Path:
        """Fetch a device file into the results directory (paths escaping it are refused), verified
        against the size and sha256 the device computes (:func:`bmoe_ci.farm.pull.pull`: one re-pull,
        then an InfraError naming the file)."""
        if self.results_dir is None:
            raise RuntimeError("this session has no results_dir")
        name = posixpath.basename(remote_path)
        try:
            return verified_pull(
                self.transport, remote_path, local_name, root=self.results_dir, timeout=self.device.command_timeout
            )
        except InfraError as exc:
            raise exc.at(f"pull {name}") from None

    def read_files(self, paths: Sequence[str]) -> dict[str, bytes | None]:
        """The bytes of device files (None: not there) in one round trip, each verified against its size
        and sha256 on the device (:func:`bmoe_ci.farm.pull.read_files`)."""
        try:
            return read_files(self.transport, paths, self.device.command_timeout)
        except InfraError as exc:
            raise exc.at(f"read {len(paths)} file(s)") from None

    def close(self) -> None:
        """Stop the heartbeat, release the lock (if we took it) and close the transport. Never raises."""
        unanswered = False
        if self.heartbeat is not None:
            unanswered = self.heartbeat.unanswered
            self.heartbeat.stop()
            self.heartbeat = None
        if unanswered and self.device_lock.owner is not None:
            # the device gave its last heartbeat no answer: a release would wait out its deadline too
            self._say(
                f"lease not released: the device did not answer its last heartbeat; it expires after its "
                f"{self.device_lock.ttl:g}s TTL (sooner for a run on this machine: its process is gone)"
            )
            self.device_lock.abandon()
        else:
            with contextlib.suppress(InfraError, OSError):
                self.device_lock.release()
        with contextlib.suppress(Exception):
            self.transport.close()

    def __enter__(self) -> DeviceSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


#: ``on_step(session, step, seconds)``: one step of :func:`open_session` is done (``connect``, ``lease``,
#: ``platform``, ``push``, ``store gc``, ``preflight``), in that order, each after it succeeded.
StepDone = Callable[["DeviceSession", str, float], None]


def open_session(
    device: Device,
    *,
    run_id: str | None = None,
    results_dir: str | os.PathLike[str] | None = None,
    engine: str | os.PathLike[str] | None = None,
    build_id: str | None = None,
    files: Iterable[PushItem | str | os.PathLike[str]] = (),
    pushed_engine: str | None = None,
    connect: bool = True,
    lock: bool = True,
    lock_wait: float = 0.0,
    lock_ttl: float | None = None,
    check: bool = True,
    progress: Callable[[str], None] | None = None,
    on_step: StepDone | None = None,
) -> DeviceSession:
    """The one way into a device session: connect, lease, check the platform, push the engine and the
    files, sweep the store, check the engine; return the ready session.

    * ``engine`` (a local binary) and ``files`` are pushed; ``pushed_engine`` instead names the device
      path of an engine this run pushed already (with its ``build_id``): nothing is pushed for it.
    * ``connect=False``: the caller connects (the gate runner does, behind its breaker).
    * ``lock``: take the device's lease. The session that takes it owns it: it renews it while open and
      releases it on :meth:`~DeviceSession.close`. In a gate run that is the controller; an xdist worker
      opens its session with ``lock=False`` (and ``check=False``) and never touches the lease.
    * ``check``: the preflight (the platform before anything is pushed, so a 32-bit phone gets no engine
      it cannot run; the engine once pushed).
    * ``progress`` gets the session's own messages (each upload, a lease it waits for or breaks);
      ``on_step`` hears of each finished step (see :data:`StepDone`).

    On any failure the session is closed (lease released) and the :class:`InfraError` propagates, saying
    which step failed (``connect``, ``lease``, ``preflight``, ``push``, ``store gc``).
    """
    s = DeviceSession(device, run_id=run_id, results_dir=results_dir, lock_ttl=lock_ttl, progress=progress)
    if pushed_engine is not None:
        s.engine, s.build_id = pushed_engine, build_id

    def step(name: str, shown: str, call: Callable[[], object]) -> None:
        t0 = time.monotonic()
        try:
            call()
        except InfraError as exc:
            raise exc.at(name) from None
        if on_step is not None:
            on_step(s, shown, time.monotonic() - t0)

    try:
        if connect:
            step("connect", "connect", s.connect)
        if lock:
            step("lease", "lease", lambda: s.lock(wait=lock_wait))
        if check:
            step("preflight", "platform", s.check_platform)
        files = list(files)
        if engine is not None or files:

            def push() -> None:
                if engine is not None:
                    s.push_engine(engine, build_id)
                if files:
                    s.push_files(files)

            step("push", "push", push)
            if lock:
                step("store gc", "store gc", s.gc)
        if check:
            if s.engine is not None:
                step("preflight", "preflight", s.check_engine)
            else:
                report = s.preflight_report
                assert report is not None
                if not report.arch_confirmed_by:
                    report.notes.append("arch not confirmed (no engine to ask)")
                if on_step is not None:
                    on_step(s, "preflight", 0.0)
    except BaseException:
        s.close()
        raise
    return s
