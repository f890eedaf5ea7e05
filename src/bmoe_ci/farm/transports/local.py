"""``transport: local``: the device is this machine; commands are subprocesses, files are copied.

:func:`run_process` (a process with a deadline, an idle watchdog and a process-group kill) is also what
the adb transport runs its ``adb`` client with.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import InfraError
from ..model import DeviceSpec, TransportKeys
from .base import Ending, Problem, RunResult, Transport, command_text


@dataclass
class ProcessRun:
    """How a local process ended: ``returncode`` (negative: killed by that signal), or ``timed_out``
    (past the deadline) / ``silent`` (no output for the idle time), both killed as a group; or
    ``spawn_error`` (it never started: 127 not found, 126 not executable, like a shell)."""

    stdout: bytes = b""
    stderr: bytes = b""
    returncode: int | None = None
    timed_out: bool = False
    silent: bool = False
    duration: float = 0.0
    spawn_error: tuple[int, str] | None = None


def run_process(
    argv: Sequence[str],
    timeout: float,
    *,
    cwd: str | None = None,
    env: Mapping[str, str] | None = None,
    stdin: bytes | None = None,
    idle_timeout: float | None = None,
) -> ProcessRun:
    """Run ``argv`` in its own process group and, where util-linux's ``setpriv`` exists, with a
    parent-death signal (``SIGKILL``): a controller that dies takes its children with it. The whole
    group is killed at ``timeout`` seconds, or after ``idle_timeout`` seconds without output."""
    pdeathsig = shutil.which("setpriv")
    full_env = {**os.environ, **env} if env else None
    start = time.monotonic()
    try:
        proc = subprocess.Popen(
            [pdeathsig, "--pdeathsig", "KILL", "--", *argv] if pdeathsig else list(argv),
            cwd=cwd,
            env=full_env,
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except FileNotFoundError as exc:  # what a shell says for a missing command
        return ProcessRun(duration=time.monotonic() - start, spawn_error=(127, str(exc)))
    except PermissionError as exc:
        return ProcessRun(duration=time.monotonic() - start, spawn_error=(126, str(exc)))
    try:
        if idle_timeout is None:
            out, err = proc.communicate(stdin, timeout=timeout)
        else:
            out, err, silent = _pump(proc, stdin, start + timeout, idle_timeout)
            if silent:
                _killpg(proc.pid)
                proc.wait()
                return ProcessRun(out, err, silent=True, duration=time.monotonic() - start)
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
        return ProcessRun(out, err, timed_out=True, duration=time.monotonic() - start)
    except BaseException:
        _killpg(proc.pid)
        proc.wait()
        raise
    return ProcessRun(out, err, returncode=proc.returncode, duration=time.monotonic() - start)


class LocalKeys(TransportKeys):
    """A local device has no keys of its own: it is this machine."""

    def where(self) -> str:
        return "local"


class LocalTransport(Transport):
    """Commands run as subprocesses of this process (:func:`run_process`); files are copied."""

    name = "local"
    keys = LocalKeys

    @classmethod
    def check_device(cls, spec: DeviceSpec, keys: Any, base: Path, problem: Problem) -> dict[str, Any]:
        wd = Path(os.path.expanduser(spec.workdir or ""))
        return {"workdir": str(wd if wd.is_absolute() else (base / wd))}

    def _connect(self) -> None:
        try:
            Path(self.workdir).mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # an infrastructure error of this device, never a traceback
            raise InfraError(self.device.name, "setup", f"cannot create work directory {self.workdir}: {exc}") from None

    def close(self) -> None:
        self._connected = False

    def _run(self, argv, timeout, *, cwd, env, stdin, argv_shown, idle_timeout=None):
        name = self.device.name
        shown = argv_shown or tuple(argv)
        if cwd and not os.path.isdir(cwd):
            return RunResult(
                name, shown, Ending.INFRA, timeout=timeout, infra=InfraError(name, "setup", f"no such directory {cwd}")
            )
        p = run_process(argv, timeout, cwd=cwd, env=env, stdin=stdin, idle_timeout=idle_timeout)
        common = {"stdout": p.stdout, "stderr": p.stderr, "duration": p.duration, "timeout": timeout}
        if p.spawn_error is not None:
            code, why = p.spawn_error
            return RunResult(name, shown, Ending.EXITED, exit_code=code, **{**common, "stderr": f"{why}\n".encode()})
        if p.silent:
            why = f"{command_text(shown)}: no progress for {idle_timeout:g}s; killed"
            return RunResult(name, shown, Ending.INFRA, infra=InfraError(name, "timeout", why), **common)
        if p.timed_out:
            why = f"{command_text(shown)} ran past {timeout:g}s; killed"
            return RunResult(name, shown, Ending.INFRA, infra=InfraError(name, "timeout", why), **common)
        assert p.returncode is not None
        if p.returncode < 0:
            return RunResult(name, shown, Ending.SIGNALED, signal=-p.returncode, **common)
        return RunResult(name, shown, Ending.EXITED, exit_code=p.returncode, **common)

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


def _pump(proc: subprocess.Popen, stdin: bytes | None, deadline_at: float, idle: float) -> tuple[bytes, bytes, bool]:
    """Like ``communicate`` with a deadline, plus a watchdog: returns (stdout, stderr, silent) where
    ``silent`` means nothing arrived for ``idle`` seconds. Raises TimeoutExpired at the deadline."""
    assert proc.stdout is not None and proc.stderr is not None  # started with pipes
    if proc.stdin is not None:
        pipe = proc.stdin

        def feed() -> None:
            with contextlib.suppress(OSError):
                if stdin:
                    pipe.write(stdin)
                pipe.close()

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
