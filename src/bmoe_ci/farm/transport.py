"""Transports: how commands and files reach a device.

One interface, two implementations:

* :class:`LocalTransport` runs on this machine with :mod:`subprocess` (each command in its own process
  group, killed as a group at the deadline).
* :class:`SshTransport` runs over SSH through Fabric (connection set-up, SFTP) and a raw paramiko channel
  per command (byte-exact capture, our own deadline). Host keys are checked against the farm's pinned
  ``known_hosts`` and anything unknown or changed is refused; a connect timeout is always set.

:meth:`Transport.run` never raises for infrastructure problems: it returns a :class:`RunResult` whose
:attr:`~RunResult.outcome` tells an exited process (any exit code) from one killed by a signal (the engine
crashed: a gate verdict) from an infrastructure problem (unreachable, auth, host key, dropped
connection, timeout: never a verdict).

On an SSH device every command runs as::

    sh -c 'WRAPPER' bmoe-ci WORKDIR SECONDS MARKER ARGV...

where the wrapper changes to the work directory, runs ``timeout -s KILL SECONDS ARGV...`` (so the
remote process group dies at the deadline even if the connection is gone) and prints its exit status
after a per-call random marker on stderr; the marker is stripped from the captured stderr. No marker
means the wrapper never finished: the connection dropped. Every argument is quoted with
:func:`shlex.quote`. A status of 128+N is read as "killed by signal N" (a shell cannot tell it from a
process that exits with 128+N; the engine's own exit codes are 0-4), except that 124/137 after the full
timeout has elapsed is the timeout itself.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import math
import os
import secrets
import select
import shlex
import shutil
import signal
import socket
import subprocess
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from .errors import InfraError
from .model import Device

#: Extra seconds the controller waits past a command's own timeout before declaring the link dead.
DEADLINE_GRACE = 10.0
#: First wait before retrying a transient connect or upload failure; doubled at each retry.
RETRY_BACKOFF = 1.0

log = logging.getLogger("bmoe_ci.farm")


def retrying(device: Device, what: str, kinds: tuple[str, ...], notes: list[str], call):
    """``call()``, retried up to ``device.retries`` times with backoff (1 s, 2 s, 4 s, ...) while it
    raises an :class:`InfraError` of one of ``kinds`` (transient: refused, reset, banner timeout, a
    dropped upload). Each retry is logged and noted in ``notes``; the last error names the attempts."""
    for attempt in range(device.retries + 1):
        try:
            return call()
        except InfraError as exc:
            if exc.kind not in kinds:
                raise
            if attempt == device.retries:
                if attempt == 0:
                    raise
                raise InfraError(exc.device, exc.kind, f"{exc.reason} ({attempt + 1} attempts)") from None
            wait = RETRY_BACKOFF * 2**attempt
            note = f"{what} failed ({exc.kind}: {exc.reason}); retry {attempt + 1} of {device.retries} in {wait:g}s"
            notes.append(note)
            log.warning("%s: %s", device.name, note)
            time.sleep(wait)
    raise AssertionError("unreachable")  # pragma: no cover


class Outcome(enum.StrEnum):
    """How a command ended."""

    EXITED = "exited"  #: the process exited by itself (look at ``exit_code``)
    SIGNALED = "signaled"  #: the process was killed by a signal: the engine crashed (a gate problem)
    INFRA = "infra"  #: infrastructure problem: no verdict (see ``infra``)


@dataclass
class RunResult:
    """The result of :meth:`Transport.run`."""

    device: str
    argv: tuple[str, ...]  #: what ran on the device, exec prefix included
    outcome: Outcome
    exit_code: int | None = None  #: set when ``outcome`` is EXITED
    signal: int | None = None  #: set when ``outcome`` is SIGNALED
    stdout: bytes = b""
    stderr: bytes = b""
    duration: float = 0.0  #: seconds, measured on the controller
    infra: InfraError | None = None  #: set when ``outcome`` is INFRA
    timeout: float | None = None  #: the timeout that applied (seconds)

    @property
    def ok(self) -> bool:
        """Exited with status 0."""
        return self.outcome is Outcome.EXITED and self.exit_code == 0

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
        if self.outcome is Outcome.EXITED:
            return f"exit {self.exit_code} after {self.duration:.2f}s"
        if self.outcome is Outcome.SIGNALED:
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
    :meth:`_connect`, :meth:`_run`, :meth:`_put`, :meth:`_get` and :meth:`close`.
    """

    def __init__(self, device: Device):
        self.device = device
        self.workdir = device.workdir  #: resolved at connect (``~`` expanded on ssh devices)
        self.stats = _Stats()
        self._connected = False
        self._lock = threading.RLock()
        self.retries: list[str] = []  #: every transient failure that was retried (connect, upload)

    # -- lifecycle
    def connect(self) -> None:
        """Open the link and make sure the work directory exists and ``timeout`` is present.

        Raises :class:`InfraError` (unreachable, hostkey, auth, setup)."""
        with self._lock:
            if self._connected:
                return
            retrying(self.device, "connect", ("unreachable",), self.retries, self._connect)
            self._connected = True
            r = self._run(
                [
                    "sh",
                    "-c",
                    'mkdir -p "$1" && command -v timeout >/dev/null 2>&1 && echo ready',
                    "bmoe-ci",
                    self.workdir,
                ],
                60.0,
                cwd="/",
                env=None,
                stdin=None,
                argv_shown=None,
            )
            if r.outcome is Outcome.INFRA:
                self.close()
                raise r.infra  # type: ignore[misc]
            if b"ready" not in r.stdout:
                self.close()
                raise InfraError(
                    self.device.name,
                    "setup",
                    f"cannot create work directory {self.workdir} or no 'timeout' command on the "
                    f"device (coreutils, busybox or toybox): {_tail(r.stderr)}",
                )

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
                    return RunResult(self.device.name, tuple(full), Outcome.INFRA, infra=exc, timeout=timeout)
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
            if r.outcome is Outcome.INFRA and r.infra is not None and r.infra.kind == "disconnect":
                self._drop()
            return r

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


# --------------------------------------------------------------------------------------------------
# Local


class LocalTransport(Transport):
    """Commands run as subprocesses of this process; files are copied.

    Each command runs in its own process group, and, where util-linux's ``setpriv`` exists, with a
    parent-death signal (``SIGKILL``): a controller that dies takes its local engines with it."""

    def __init__(self, device: Device):
        super().__init__(device)
        self._pdeathsig = shutil.which("setpriv")

    def _connect(self) -> None:
        try:
            Path(self.workdir).mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # an infrastructure error of this device, never a traceback
            raise InfraError(self.device.name, "setup", f"cannot create work directory {self.workdir}: {exc}") from None

    def close(self) -> None:
        self._connected = False

    def _run(self, argv, timeout, *, cwd, env, stdin, argv_shown, idle_timeout=None):  # type: ignore[override]
        full_env = {**os.environ, **env} if env else None
        start = time.monotonic()
        shown = argv_shown or tuple(argv)
        if cwd and not os.path.isdir(cwd):
            return RunResult(
                self.device.name,
                shown,
                Outcome.INFRA,
                timeout=timeout,
                infra=InfraError(self.device.name, "setup", f"no such directory {cwd}"),
            )
        try:
            proc = subprocess.Popen(
                [self._pdeathsig, "--pdeathsig", "KILL", "--", *argv] if self._pdeathsig else argv,
                cwd=cwd,
                env=full_env,
                stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except FileNotFoundError as exc:  # what a shell says for a missing command
            return RunResult(
                self.device.name,
                shown,
                Outcome.EXITED,
                exit_code=127,
                stderr=f"{exc}\n".encode(),
                duration=time.monotonic() - start,
                timeout=timeout,
            )
        except PermissionError as exc:
            return RunResult(
                self.device.name,
                shown,
                Outcome.EXITED,
                exit_code=126,
                stderr=f"{exc}\n".encode(),
                duration=time.monotonic() - start,
                timeout=timeout,
            )
        try:
            if idle_timeout is None:
                out, err = proc.communicate(stdin, timeout=timeout)
            else:
                out, err, silent = _pump(proc, stdin, start + timeout, idle_timeout)
                if silent:
                    _killpg(proc.pid)
                    proc.wait()
                    exc = InfraError(
                        self.device.name,
                        "timeout",
                        f"{shlex.join(shown)[:200]}: no progress for {idle_timeout:g}s; killed",
                    )
                    dur = time.monotonic() - start
                    return RunResult(
                        self.device.name, shown, Outcome.INFRA, stdout=out, stderr=err, duration=dur, infra=exc,
                        timeout=timeout,
                    )
        except subprocess.TimeoutExpired:
            _killpg(proc.pid)
            try:
                out, err = proc.communicate(timeout=5)
            except subprocess.TimeoutExpired:  # a descendant left the group and still holds our pipes
                for pipe in (proc.stdin, proc.stdout, proc.stderr):
                    if pipe is not None:
                        with contextlib.suppress(OSError):
                            pipe.close()
                proc.wait()
                out, err = b"", b""
            dur = time.monotonic() - start
            exc = InfraError(self.device.name, "timeout", f"{shlex.join(shown)[:200]} ran past {timeout:g}s; killed")
            return RunResult(
                self.device.name, shown, Outcome.INFRA, stdout=out, stderr=err, duration=dur, infra=exc, timeout=timeout
            )
        except BaseException:
            _killpg(proc.pid)
            proc.wait()
            raise
        dur = time.monotonic() - start
        rc = proc.returncode
        if rc < 0:
            return RunResult(
                self.device.name,
                shown,
                Outcome.SIGNALED,
                signal=-rc,
                stdout=out,
                stderr=err,
                duration=dur,
                timeout=timeout,
            )
        return RunResult(
            self.device.name, shown, Outcome.EXITED, exit_code=rc, stdout=out, stderr=err, duration=dur, timeout=timeout
        )

    def _put(self, local: Path, remote: str) -> int:
        try:
            shutil.copyfile(local, remote)
        except OSError as exc:
            raise InfraError(self.device.name, "transfer", f"copy {local} -> {remote}: {exc}") from None
        return local.stat().st_size

    def _get(self, remote: str, local: Path) -> int:
        try:
            shutil.copyfile(remote, local)
        except OSError as exc:
            raise InfraError(self.device.name, "transfer", f"copy {remote} -> {local}: {exc}") from None
        return local.stat().st_size


def _pump(
    proc: subprocess.Popen, stdin: bytes | None, deadline_at: float, idle: float
) -> tuple[bytes, bytes, bool]:
    """Like ``communicate`` with a deadline, plus a watchdog: returns (stdout, stderr, silent) where
    ``silent`` means nothing arrived for ``idle`` seconds. Raises TimeoutExpired at the deadline."""
    if proc.stdin is not None:
        def feed() -> None:
            with contextlib.suppress(OSError):
                if stdin:
                    proc.stdin.write(stdin)
                proc.stdin.close()

        threading.Thread(target=feed, daemon=True).start()
    bufs: dict[int, bytearray] = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    open_fds = set(bufs)
    last = time.monotonic()
    while open_fds:
        now = time.monotonic()
        if now >= deadline_at:
            raise subprocess.TimeoutExpired(proc.args, deadline_at)
        if now - last >= idle:
            return bytes(bufs[proc.stdout.fileno()]), bytes(bufs[proc.stderr.fileno()]), True
        ready, _, _ = select.select(list(open_fds), [], [], min(0.5, deadline_at - now, idle - (now - last)))
        for fd in ready:
            data = os.read(fd, 1 << 16)
            if data:
                bufs[fd] += data
                last = time.monotonic()
            else:
                open_fds.discard(fd)
    proc.wait(timeout=max(0.01, deadline_at - time.monotonic()))  # TimeoutExpired at the deadline
    return bytes(bufs[proc.stdout.fileno()]), bytes(bufs[proc.stderr.fileno()]), False


def _killpg(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


# --------------------------------------------------------------------------------------------------
# SSH

_WRAPPER = (
    'm=$3; if cd "$1"; then t=$2; shift 3; timeout -s KILL "$t" "$@"; rc=$?; '
    "else rc=cd; fi; "
    'printf \'\\n%s %s\\n\' "$m" "$rc" >&2; '
    'case $rc in cd) exit 125;; *) exit "$rc";; esac'
)


def build_remote_command(
    argv: Sequence[str], timeout_s: int, cwd: str, marker: str, env: Mapping[str, str] | None = None
) -> str:
    """The exact command line sent to an SSH device (exposed for tests and for docs)."""
    full = list(argv)
    if env:
        full = ["env", *(f"{k}={v}" for k, v in env.items()), *full]
    return shlex.join(["sh", "-c", _WRAPPER, "bmoe-ci", cwd, str(timeout_s), marker, *full])


class _PinnedOnly:
    """paramiko missing-host-key policy: refuse, naming the host and the key's fingerprint."""

    def __init__(self, device: Device):
        self.device = device

    def missing_host_key(self, client, hostname, key):
        raise InfraError(
            self.device.name,
            "hostkey",
            f"host key of {hostname} ({key.get_name()} {key.fingerprint}) is not in the pinned known_hosts "
            f"{self.device.known_hosts}; refusing to trust it on first use (check the fingerprint on the "
            f"device, then add the line to that file)",
        )


class SshTransport(Transport):
    """SSH via Fabric; see the module docstring for the remote command wrapper."""

    def __init__(self, device: Device, *, keepalive: int = 15):
        super().__init__(device)
        self.keepalive = keepalive
        self._conn = None
        self._sftp = None

    # -- connection
    def _connect(self) -> None:
        import paramiko
        from fabric import Config, Connection
        from paramiko.config import SSHConfig

        d = self.device
        ct = float(d.connect_timeout)
        # lazy + explicit empty SSHConfig: no ~/.ssh/config, no /etc/fabric.yml can change what the
        # farm file says (hosts, keys, host key policy).
        cfg = Config(lazy=True, ssh_config=SSHConfig())
        conn = Connection(
            d.host,
            user=d.user,
            port=d.port,
            config=cfg,
            connect_kwargs={
                "key_filename": [d.key],
                "look_for_keys": False,
                "allow_agent": False,
                "timeout": ct,
                "banner_timeout": ct,
                "auth_timeout": ct,
                "channel_timeout": ct,
            },
        )
        # Fabric's Connection installs AutoAddPolicy: replace it, and load only the pinned file.
        conn.client.set_missing_host_key_policy(_PinnedOnly(d))
        try:
            conn.client.load_system_host_keys(d.known_hosts)
        except (OSError, paramiko.SSHException, ValueError) as exc:
            raise InfraError(d.name, "hostkey", f"cannot load known_hosts {d.known_hosts}: {exc}") from None
        try:
            conn.open()
        except BaseException as exc:
            with contextlib.suppress(Exception):
                conn.close()
            mapped = self._connect_error(exc, conn.user)
            if mapped is None:
                raise
            raise mapped from None
        conn.transport.set_keepalive(self.keepalive)
        with contextlib.suppress(OSError, AttributeError):
            # small request packets must not wait for a delayed ACK (Nagle): ~40 ms per command otherwise
            conn.transport.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._conn = conn
        if self.workdir == "~" or self.workdir.startswith("~/"):
            r = self._run(["sh", "-c", 'printf %s "$HOME"'], 30.0, cwd="/", env=None, stdin=None, argv_shown=None)
            if not r.ok or not r.stdout.startswith(b"/"):
                raise InfraError(d.name, "setup", f"cannot resolve $HOME for workdir {self.workdir}: {r.describe()}")
            self.workdir = r.stdout.decode() + self.workdir[1:]

    def _connect_error(self, exc: BaseException, user: str) -> InfraError | None:
        import paramiko

        d = self.device
        where = f"{d.host}:{d.port}"
        ct = float(d.connect_timeout)
        if isinstance(exc, InfraError):
            return exc
        if isinstance(exc, paramiko.BadHostKeyException):
            return InfraError(
                d.name,
                "hostkey",
                f"HOST KEY CHANGED for {where}: the device offered {exc.key.get_name()} {exc.key.fingerprint}, "
                f"the pinned known_hosts {d.known_hosts} says {exc.expected_key.fingerprint}; refusing to connect",
            )
        if isinstance(exc, paramiko.PasswordRequiredException):
            return InfraError(
                d.name, "auth", f"key {d.key} is passphrase-protected; the farm needs a key without passphrase"
            )
        if isinstance(exc, paramiko.AuthenticationException):
            return InfraError(d.name, "auth", f"{where} refused key {d.key} for user {user!r}: {exc}")
        if isinstance(exc, TimeoutError | socket.timeout):
            return InfraError(d.name, "unreachable", f"{where}: connect timed out after {ct:g}s")
        if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
            why = "; ".join(sorted({e.strerror or str(e) for e in exc.errors.values()}))
            return InfraError(d.name, "unreachable", f"{where}: {why}")
        if isinstance(exc, socket.gaierror):
            return InfraError(d.name, "unreachable", f"{d.host}: cannot resolve: {exc.strerror}")
        if isinstance(exc, paramiko.SSHException | EOFError | OSError):
            return InfraError(d.name, "unreachable", f"{where}: {type(exc).__name__}: {exc}")
        return None

    def close(self) -> None:
        self._connected = False
        sftp, conn, self._sftp, self._conn = self._sftp, self._conn, None, None
        if sftp is not None:
            with contextlib.suppress(Exception):
                sftp.close()
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    def _alive(self) -> bool:
        t = self._conn.transport if self._conn is not None else None
        return bool(t is not None and t.is_active())

    # -- commands
    def _run(self, argv, timeout, *, cwd, env, stdin, argv_shown, idle_timeout=None):  # type: ignore[override]
        import paramiko

        name = self.device.name
        shown = argv_shown or tuple(argv)
        secs = max(1, math.ceil(timeout))
        marker = f"__bmoe_ci_status_{secrets.token_hex(8)}__"
        command = build_remote_command(argv, secs, cwd or self.workdir, marker, env)
        start = time.monotonic()

        def infra(kind: str, reason: str, out: bytes = b"", err: bytes = b"") -> RunResult:
            return RunResult(
                name,
                shown,
                Outcome.INFRA,
                stdout=out,
                stderr=err,
                duration=time.monotonic() - start,
                infra=InfraError(name, kind, reason),
                timeout=timeout,
            )

        if not self._alive():
            return infra("disconnect", "the SSH connection is not open")
        try:
            chan = self._conn.transport.open_session(timeout=float(self.device.connect_timeout))
            chan.exec_command(command)
            if stdin:
                chan.sendall(stdin)
            chan.shutdown_write()
        except (paramiko.SSHException, EOFError, OSError) as exc:
            return infra("disconnect", f"cannot start a command: {type(exc).__name__}: {exc}")

        out, err = bytearray(), bytearray()
        deadline = start + secs + DEADLINE_GRACE
        timed_out = silent = False
        last = start
        try:
            while True:
                seen = len(out) + len(err)
                while chan.recv_ready():
                    out += chan.recv(1 << 16)
                while chan.recv_stderr_ready():
                    err += chan.recv_stderr(1 << 16)
                if len(out) + len(err) != seen:
                    last = time.monotonic()
                if chan.exit_status_ready() and (chan.eof_received or chan.closed):
                    break
                if chan.closed or not self._alive():
                    break
                now = time.monotonic()
                if now >= deadline:
                    timed_out = True
                    break
                if idle_timeout is not None and now - last >= idle_timeout:
                    silent = True
                    break
                wait = min(0.5, deadline - now)
                if chan.eof_received:  # output done (the pipe stays readable): wait for the status itself
                    chan.status_event.wait(wait)
                else:
                    select.select([chan], [], [], wait)
            while chan.recv_ready():
                out += chan.recv(1 << 16)
            while chan.recv_stderr_ready():
                err += chan.recv_stderr(1 << 16)
        except (paramiko.SSHException, EOFError, OSError) as exc:
            return infra("disconnect", f"connection lost: {type(exc).__name__}: {exc}", bytes(out), bytes(err))
        finally:
            with contextlib.suppress(Exception):
                chan.close()
        dur = time.monotonic() - start
        if silent:
            return infra(
                "timeout",
                f"{shlex.join(shown)[:200]}: no progress for {idle_timeout:g}s (the device-side deadline "
                "should have answered; device or link hung)",
                bytes(out),
                bytes(err),
            )
        if timed_out:
            return infra(
                "timeout",
                f"{shlex.join(shown)[:200]}: no answer {secs + DEADLINE_GRACE:g}s after start "
                "(link hung; the device-side timeout kills the process)",
                bytes(out),
                bytes(err),
            )
        status, stderr = _split_marker(bytes(err), marker)
        if status is None:
            if not self._alive():
                return infra("disconnect", "connection lost while the command ran", bytes(out), stderr)
            return infra(
                "disconnect",
                f"the remote wrapper ended without reporting a status (channel status {chan.exit_status})",
                bytes(out),
                stderr,
            )
        common = {"stdout": bytes(out), "stderr": stderr, "duration": dur, "timeout": timeout}
        if status == "cd":
            return RunResult(
                name,
                shown,
                Outcome.INFRA,
                infra=InfraError(name, "setup", f"cannot enter directory {cwd or self.workdir}: {_tail(stderr)}"),
                **common,
            )
        rc = int(status)
        if rc in (124, 137) and dur >= secs - 0.01:
            return RunResult(
                name,
                shown,
                Outcome.INFRA,
                infra=InfraError(
                    name, "timeout", f"{shlex.join(shown)[:200]} ran past {timeout:g}s; killed on the device"
                ),
                **common,
            )
        if 128 < rc < 128 + 65:
            return RunResult(name, shown, Outcome.SIGNALED, signal=rc - 128, **common)
        return RunResult(name, shown, Outcome.EXITED, exit_code=rc, **common)

    # -- files
    def _sftp_client(self):
        if self._sftp is None:
            self._sftp = self._conn.sftp()
        return self._sftp

    def _put(self, local: Path, remote: str) -> int:
        import paramiko

        try:
            attrs = self._sftp_client().put(str(local), remote, confirm=True)
        except (paramiko.SSHException, EOFError) as exc:
            self._drop()
            raise InfraError(self.device.name, "disconnect", f"upload of {local.name} to {remote}: {exc}") from None
        except OSError as exc:
            if not self._alive():
                self._drop()
                raise InfraError(self.device.name, "disconnect", f"upload of {local.name}: {exc}") from None
            raise InfraError(self.device.name, "transfer", f"upload of {local} to {remote}: {exc}") from None
        return int(attrs.st_size or 0)

    def _get(self, remote: str, local: Path) -> int:
        import paramiko

        try:
            self._sftp_client().get(remote, str(local))
        except (paramiko.SSHException, EOFError) as exc:
            self._drop()
            raise InfraError(self.device.name, "disconnect", f"download of {remote}: {exc}") from None
        except OSError as exc:
            if not self._alive():
                self._drop()
                raise InfraError(self.device.name, "disconnect", f"download of {remote}: {exc}") from None
            raise InfraError(self.device.name, "transfer", f"download of {remote}: {exc}") from None
        return local.stat().st_size


def _split_marker(err: bytes, marker: str) -> tuple[str | None, bytes]:
    token = b"\n" + marker.encode() + b" "
    i = err.rfind(token)
    if i < 0:
        return None, err
    rest = err[i + len(token) :]
    line, _, after = rest.partition(b"\n")
    return line.decode("ascii", "replace").strip(), err[:i] + after


def open_transport(device: Device) -> Transport:
    """The transport for ``device`` (not yet connected)."""
    return SshTransport(device) if device.is_ssh else LocalTransport(device)


__all__ = [
    "DEADLINE_GRACE",
    "LocalTransport",
    "Outcome",
    "RunResult",
    "SshTransport",
    "Transport",
    "build_remote_command",
    "open_transport",
    "safe_local_path",
]
