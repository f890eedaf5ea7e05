"""The command wrapper of the transports that reach a device's shell over a link (ssh, adb).

Every command runs on the device as::

    sh -c 'WRAPPER' bmoe-ci WORKDIR SECONDS MARKER ARGV...

where the wrapper changes to the work directory, runs ``timeout -s KILL SECONDS ARGV...`` (so the
remote process group dies at the deadline even if the link is gone) and prints its exit status after a
per-call random marker on stderr; the marker is stripped from the captured stderr. No marker means the
wrapper never finished: the link dropped. Every argument is quoted with :func:`shlex.quote`. A status of
128+N is read as "killed by signal N" (a shell cannot tell it from a process that exits with 128+N; the
engine's own exit codes are 0-4), except that 124/137 after the full timeout has elapsed is the timeout
itself.
"""

from __future__ import annotations

import secrets
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import InfraError
from .base import Ending, RunResult, _tail, command_text

_WRAPPER = (
    'm=$3; if cd "$1"; then t=$2; shift 3; timeout -s KILL "$t" "$@"; rc=$?; '
    "else rc=cd; fi; "
    'printf \'\\n%s %s\\n\' "$m" "$rc" >&2; '
    'case $rc in cd) exit 125;; *) exit "$rc";; esac'
)


def new_marker() -> str:
    """A fresh per-call status marker (random: a command cannot forge it)."""
    return f"__bmoe_ci_status_{secrets.token_hex(8)}__"


def build_remote_command(
    argv: Sequence[str], timeout_s: int, cwd: str, marker: str, env: Mapping[str, str] | None = None
) -> str:
    """The exact command line sent to the device's shell (exposed for tests and for docs)."""
    full = list(argv)
    if env:
        full = ["env", *(f"{k}={v}" for k, v in env.items()), *full]
    return shlex.join(["sh", "-c", _WRAPPER, "bmoe-ci", cwd, str(timeout_s), marker, *full])


def split_marker(err: bytes, marker: str) -> tuple[str | None, bytes]:
    """The status the wrapper printed after ``marker`` (None when it printed none), and stderr without
    the marker line."""
    token = b"\n" + marker.encode() + b" "
    i = err.rfind(token)
    if i < 0:
        return None, err
    rest = err[i + len(token) :]
    line, _, after = rest.partition(b"\n")
    return line.decode("ascii", "replace").strip(), err[:i] + after


def status_result(
    device: str,
    shown: tuple[str, ...],
    status: str,
    *,
    stdout: bytes,
    stderr: bytes,
    duration: float,
    seconds: int,
    timeout: float,
    cwd: str,
) -> RunResult:
    """The :class:`RunResult` of a wrapper that reported ``status`` (see the module docstring)."""
    common: dict[str, Any] = {"stdout": stdout, "stderr": stderr, "duration": duration, "timeout": timeout}
    if status == "cd":
        why = f"cannot enter directory {cwd}: {_tail(stderr)}"
        return RunResult(device, shown, Ending.INFRA, infra=InfraError(device, "setup", why), **common)
    try:
        rc = int(status)
    except ValueError:
        why = f"the remote wrapper reported an unreadable status {status[:40]!r}"
        return RunResult(device, shown, Ending.INFRA, infra=InfraError(device, "disconnect", why), **common)
    if rc in (124, 137) and duration >= seconds - 0.01:
        why = f"{command_text(shown)} ran past {timeout:g}s; killed on the device"
        return RunResult(device, shown, Ending.INFRA, infra=InfraError(device, "timeout", why), **common)
    if 128 < rc < 128 + 65:
        return RunResult(device, shown, Ending.SIGNALED, signal=rc - 128, **common)
    return RunResult(device, shown, Ending.EXITED, exit_code=rc, **common)
