"""What every transport shares: the :class:`Transport` interface, the :class:`RunResult` of a command
and its :class:`Ending`, the retry rule for transient failures, and the results-directory guard of
downloads.

:meth:`Transport.run` never raises for infrastructure problems: it returns a :class:`RunResult` whose
:attr:`~RunResult.outcome` tells an exited process (any exit code) from one killed by a signal (the engine
crashed: a gate verdict) from an infrastructure problem (unreachable, auth, host key, dropped
connection, timeout: never a verdict).

A transport class also describes its part of the farm file: the ``transport:`` value that selects it
(:attr:`Transport.name`), the model of the device keys only it reads (:attr:`Transport.keys`, a
:class:`~bmoe_ci.farm.model.TransportKeys`), its default work directory, and
:meth:`Transport.check_device`, which checks and resolves those keys beyond their types.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import os
import secrets
import shlex
import signal
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, ClassVar

from ..errors import InfraError
from ..model import Device, DeviceSpec, TransportKeys

#: Reports a problem with a device key: ``problem(key, message)`` (``key`` "" for the device itself).
Problem = Callable[[str, str], None]

#: Extra seconds the controller waits past a command's own timeout before declaring the link dead (the
#: device-side ``timeout`` answers first when the link is fine): a quarter of the timeout, 2 to 10 s.
DEADLINE_GRACE = 10.0


def grace(timeout: float) -> float:
    """The controller's grace past a command's own ``timeout`` (see :data:`DEADLINE_GRACE`)."""
    return min(DEADLINE_GRACE, max(2.0, timeout / 4))


#: First wait before retrying a transient connect or upload failure; doubled at each retry.
RETRY_BACKOFF = 1.0

log = logging.getLogger("bmoe_ci.farm")

#: Names of the shell scripts the farm sends (``sh -c SCRIPT``), for messages: a script is shown by its
#: name, never by its text (whose first line would be all a one-line message keeps of it).
_SCRIPT_NAMES: dict[str, str] = {}


def name_script(script: str, name: str) -> str:
    """Register ``name`` as what messages call ``script``; returns the script."""
    _SCRIPT_NAMES[script] = name
    return script


def command_text(argv: Sequence[str], limit: int = 200) -> str:
    """A command on one line for messages: ``sh -c SCRIPT`` is shown as ``sh -c <name>`` (the script's
    registered name, or its first line), whitespace collapsed, at most ``limit`` characters."""
    parts = list(map(str, argv))
    for i in range(len(parts) - 2):
        if parts[i] == "sh" and parts[i + 1] == "-c":
            script = parts[i + 2]
            name = _SCRIPT_NAMES.get(script)
            if name is not None:  # a script of ours: its name says it (the caller says what it was for)
                return f"<{name}>"
            if name is None:
                lines = [ln.strip() for ln in script.splitlines() if ln.strip()]
                first = lines[0] if lines else ""
                name = first if len(lines) == 1 and len(first) <= 60 else f"script: {first[:40]} ..."
            parts[i + 2] = f"<{name}>"
            # the script's $0 and what follows are its arguments
            break
    text = " ".join(shlex.quote(p) if not (p.startswith("<") and p.endswith(">")) else p for p in parts)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def retrying(device: Device, what: str, kinds: tuple[str, ...], notes: list[str], call, retries: int | None = None):
    """``call()``, retried up to ``device.retries`` times (or ``retries``) with backoff (1 s, 2 s, 4 s,
    ...) while it raises an :class:`InfraError` of one of ``kinds`` (transient: refused, reset, a dropped
    upload). Each retry is logged and noted in ``notes``; the last error names the attempts."""
    retries = device.retries if retries is None else retries
    for attempt in range(retries + 1):
        try:
            return call()
        except InfraError as exc:
            if exc.kind not in kinds:
                raise
            if attempt == retries:
                if attempt == 0:
                    raise
                raise InfraError(exc.device, exc.kind, f"{exc.reason} ({attempt + 1} attempts)", exc.step) from None
            wait = RETRY_BACKOFF * 2**attempt
            note = f"{what} failed ({exc.kind}: {exc.reason}); retry {attempt + 1} of {retries} in {wait:g}s"
            notes.append(note)
            log.warning("%s: %s", device.name, note)
            time.sleep(wait)
    raise AssertionError("unreachable")  # pragma: no cover


# What connecting runs on the device once the link is up: the work directory exists, `timeout` is there.
_SETUP = name_script('mkdir -p "$1" && command -v timeout >/dev/null 2>&1 && echo ready', "work directory set-up")


class Ending(enum.StrEnum):
    """How a command on a device ended (a gate test's outcome is :data:`bmoe_ci.reports.Outcome`)."""

    EXITED = "exited"  #: the process exited by itself (look at ``exit_code``)
    SIGNALED = "signaled"  #: the process was killed by a signal: the engine crashed (a gate problem)
    INFRA = "infra"  #: infrastructure problem: no verdict (see ``infra``)


@dataclass
class RunResult:
    """The result of :meth:`Transport.run`."""

    device: str
    argv: tuple[str, ...]  #: what ran on the device, exec prefix included
    outcome: Ending
    exit_code: int | None = None  #: set when ``outcome`` is EXITED
    signal: int | None = None  #: set when ``outcome`` is SIGNALED
    stdout: bytes = b""
    stderr: bytes = b""
    duration: float = 0.0  #: seconds, measured on the controller
    infra: InfraError | None = None  #: set when ``outcome`` is INFRA
    timeout: float | None = None  #: the timeout that applied (seconds)
    #: the link itself stopped answering (no output, no status, past the controller's deadline): the
    #: transport then probes the link before its next command instead of waiting out another deadline
    link_hung: bool = False

    @property
    def ok(self) -> bool:
        """Exited with status 0."""
        return self.outcome is Ending.EXITED and self.exit_code == 0

    @property
    def signal_name(self) -> str | None:
        if self.signal is None:
            return None
        try:
            return signal.Signals(self.signal).name
        except ValueError:
            return f"signal {self.signal}"

    def raise_for_infra(self) -> RunResult:
        """Raise the :class:`InfraError` if this is an infrastructure outcome; return self otherwise."""
        if self.infra is not None:
            raise self.infra
        return self

    def describe(self) -> str:
        """One line: what happened."""
        if self.outcome is Ending.EXITED:
            return f"exit {self.exit_code} after {self.duration:.2f}s"
        if self.outcome is Ending.SIGNALED:
            return f"killed by {self.signal_name} after {self.duration:.2f}s"
        return f"infrastructure error: {self.infra}"


@dataclass
class _Stats:
    bytes_up: int = 0
    bytes_down: int = 0
    commands: int = 0
    command_seconds: float = 0.0


class Transport(ABC):
    """Runs commands on, and moves files to and from, one device.

    Remote paths that are not absolute are relative to the device's work directory. Subclasses implement
    :meth:`_connect`, :meth:`_run`, :meth:`_put`, :meth:`_get` and :meth:`close`, and describe their
    farm-file keys with the class attributes below.
    """

    #: the farm file's ``transport:`` value that selects this class
    name: ClassVar[str]
    #: the model of the device keys only this transport reads (a device of another transport may not set
    #: them); a device's are its ``link``
    keys: ClassVar[type[TransportKeys]] = TransportKeys
    #: the work directory when the farm file gives none (None: ``workdir`` is required)
    default_workdir: ClassVar[str | None] = None

    @classmethod
    def check_device(cls, spec: DeviceSpec, keys: Any, base: Path, problem: Problem) -> dict[str, Any]:
        """Check a device's common keys (``spec``) and this transport's (``keys``, of :attr:`keys`) beyond
        their types (relative paths are relative to ``base``, the farm file's directory); report each
        problem with ``problem(key, message)``. Returns the values to replace (resolved paths), of either."""
        return {}

    def __init__(self, device: Device):
        self.device = device
        if device.workdir is None:
            raise ValueError(f"{device.name}: no workdir (the farm file's loader gives every device one)")
        self.workdir: str = device.workdir  #: resolved at connect (``~`` expanded on ssh devices)
        self.stats = _Stats()
        self._connected = False
        self._lock = threading.RLock()
        self.retries: list[str] = []  #: every transient failure that was retried (connect, upload)
        self._link_hung = False

    # -- lifecycle
    def connect(self, *, retries: int | None = None) -> None:
        """Open the link and make sure the work directory exists and ``timeout`` is present.

        A refused or reset connect is retried (``device.retries`` times, or ``retries``); one that got
        no answer within ``connect_timeout`` (kind ``timeout``: a hung server, adbd or link) is not:
        waiting again would cost another full timeout for the same silence. Raises :class:`InfraError`
        (unreachable, timeout, hostkey, auth, setup)."""
        with self._lock:
            if self._connected:
                return
            retrying(self.device, "connect", ("unreachable",), self.retries, self._connect, retries)
            self._connected = True
            wait = float(self.device.connect_timeout)
            r = self._run(
                ["sh", "-c", _SETUP, "bmoe-ci", self.workdir],
                wait,
                cwd="/",
                env=None,
                stdin=None,
                argv_shown=None,
                idle_timeout=wait,
            )
            if r.outcome is Ending.INFRA:
                self.close()
                assert r.infra is not None
                if r.link_hung:
                    self._link_hung = True
                    raise InfraError(
                        self.device.name, "timeout", f"connected, but the device gave no answer in {wait:g}s"
                    ).at("connect")
                raise r.infra.at("connect")
            if b"ready" not in r.stdout:
                self.close()
                raise InfraError(
                    self.device.name,
                    "setup",
                    f"cannot create work directory {self.workdir} or no 'timeout' command on the "
                    f"device (coreutils, busybox or toybox): {_tail(r.stderr)}",
                    step="connect",
                )
            self._link_hung = False

    def reconnect(self) -> None:
        """After a lost link: close it and connect once more, without retries (so at most about one
        ``connect_timeout``). Raises :class:`InfraError` when the device is still gone."""
        with self._lock:
            self._drop()
            self.connect(retries=0)

    @property
    def link_hung(self) -> bool:
        """The last command got no answer at all by the controller's deadline (see :meth:`run`)."""
        return self._link_hung

    @abstractmethod
    def _connect(self) -> None: ...

    @abstractmethod
    def close(self) -> None:
        """Close the link (idempotent)."""

    def __enter__(self) -> Transport:
        self.connect()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- paths
    def path(self, *parts: str) -> str:
        """A path on the device: absolute parts as is, relative ones under the work directory."""
        if self.workdir.startswith("~"):
            self.connect()  # ``~`` is resolved on the device, at connect
        p = PurePosixPath(*parts) if parts else PurePosixPath(".")
        return str(p if p.is_absolute() else PurePosixPath(self.workdir) / p)

    # -- commands
    def run(
        self,
        argv: Sequence[str],
        timeout: float,
        *,
        engine: bool = False,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | None = None,
        idle_timeout: float | None = None,
    ) -> RunResult:
        """Run ``argv`` on the device, killing it after ``timeout`` seconds.

        ``engine=True`` prepends the device's exec prefix (e.g. ``qemu-aarch64-static``). ``cwd`` defaults
        to the work directory. ``idle_timeout``: the controller's no-progress watchdog, giving up (a
        ``timeout``) when no output at all arrives for that long. Never raises for infrastructure
        problems: see :class:`RunResult`.
        """
        if timeout <= 0:
            raise ValueError("timeout must be positive")
        full = [*(self.device.exec_prefix if engine else ()), *map(str, argv)]
        with self._lock:
            if not self._connected:
                try:
                    self.connect()
                except InfraError as exc:
                    return RunResult(self.device.name, tuple(full), Ending.INFRA, infra=exc, timeout=timeout)
            if self._link_hung and (still := self._probe_hung_link(tuple(full), timeout)) is not None:
                return still
            r = self._run(
                full,
                timeout,
                cwd=self.path(cwd) if cwd else self.workdir,
                env=env,
                stdin=stdin,
                argv_shown=tuple(full),
                idle_timeout=idle_timeout,
            )
            self.stats.commands += 1
            self.stats.command_seconds += r.duration
            self._link_hung = r.link_hung
            if r.outcome is Ending.INFRA and r.infra is not None and r.infra.kind == "disconnect":
                self._drop()
            return r

    def _probe_hung_link(self, shown: tuple[str, ...], timeout: float) -> RunResult | None:
        """After the link hung: does it answer a trivial command within ``connect_timeout``? None if it
        does (go on), else the command's result without running it. A hung device then costs one connect
        timeout per command (the lease's heartbeat and release included), not one full deadline each."""
        wait = float(self.device.connect_timeout)
        probe = self._run(["echo", "alive"], wait, cwd="/", env=None, stdin=None, argv_shown=None, idle_timeout=wait)
        if probe.ok and probe.stdout == b"alive\n":
            self._link_hung = False
            return None
        self._link_hung = probe.link_hung
        if probe.infra is not None and not probe.link_hung:  # not hung any more: gone (or refusing)
            if probe.infra.kind == "disconnect":
                self._drop()
            return RunResult(
                self.device.name, shown, Ending.INFRA, infra=probe.infra, duration=probe.duration, timeout=timeout
            )
        why = f"the link hung earlier and still gives no answer in {wait:g}s; {command_text(shown, 120)} not run"
        return RunResult(
            self.device.name,
            shown,
            Ending.INFRA,
            infra=InfraError(self.device.name, "timeout", why),
            duration=probe.duration,
            timeout=timeout,
            link_hung=True,
        )

    def sh(self, script: str, *args: str, timeout: float = 60.0) -> RunResult:
        """Run a POSIX shell script with positional arguments (each quoted; never interpolated)."""
        return self.run(["sh", "-c", script, "bmoe-ci", *args], timeout)

    @abstractmethod
    def _run(
        self,
        argv: list[str],
        timeout: float,
        *,
        cwd: str | None,
        env: Mapping[str, str] | None,
        stdin: bytes | None,
        argv_shown: tuple[str, ...] | None,
        idle_timeout: float | None = None,
    ) -> RunResult: ...

    def _drop(self) -> None:
        """Forget a broken link so that the next call reconnects."""
        with contextlib.suppress(Exception):
            self.close()

    # -- files
    def put(self, local_path: str | os.PathLike[str], remote_path: str) -> int:
        """Upload a file (a dropped upload is retried, see :func:`retrying`); returns the bytes sent.
        Raises :class:`InfraError` (transfer, disconnect)."""

        def once() -> int:
            self.connect()
            return self._put(Path(local_path), self.path(remote_path))

        with self._lock:
            n = retrying(self.device, f"upload of {Path(local_path).name}", ("disconnect",), self.retries, once)
            self.stats.bytes_up += n
            return n

    def get(self, remote_path: str, local_path: str | os.PathLike[str], *, root: str | os.PathLike[str]) -> Path:
        """Download a file to ``local_path``, which must stay inside ``root`` (the results directory).

        A relative ``local_path`` is taken relative to ``root``. A path that escapes ``root`` (``..``,
        absolute elsewhere, through a symlink) is refused with :class:`ValueError`. Returns the local path.
        """
        dest = safe_local_path(root, local_path)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f".{dest.name}.part-{secrets.token_hex(4)}")
        with self._lock:
            self.connect()
            try:
                n = self._get(self.path(remote_path), tmp)
                os.replace(tmp, dest)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    tmp.unlink()
            self.stats.bytes_down += n
        return dest

    @abstractmethod
    def _put(self, local: Path, remote: str) -> int: ...

    @abstractmethod
    def _get(self, remote: str, local: Path) -> int: ...


def safe_local_path(root: str | os.PathLike[str], local_path: str | os.PathLike[str]) -> Path:
    """``local_path`` (relative paths are under ``root``) if it stays inside ``root``; else ValueError."""
    root_r = Path(root).resolve()
    p = Path(local_path)
    candidate = p if p.is_absolute() else root_r / p
    resolved = candidate.resolve()
    if resolved != root_r and not resolved.is_relative_to(root_r):
        raise ValueError(f"refusing to write {local_path}: outside the results directory {root_r}")
    if resolved == root_r:
        raise ValueError(f"refusing to write over the results directory {root_r} itself")
    return resolved


def _tail(data: bytes, n: int = 300) -> str:
    text = data.decode("utf-8", "replace").strip()
    return text[-n:] if text else "(no output)"
