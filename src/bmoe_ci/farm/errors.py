"""Errors of the farm layer.

Two families matter to callers:

* :class:`FarmConfigError`, :class:`SelectionError`, :class:`FarmNotUp` and :class:`MissingTool` are
  *usage* problems: the user has to fix a file, a ``--device`` expression or the machine.
* :class:`InfraError` (and its subclass :class:`DeviceBusy`) is an *infrastructure* problem with one
  device: unreachable, authentication refused, host key not pinned or changed, connection dropped,
  command timed out, preflight failed, push failed, device locked by another run. The gate suite turns
  it into a JUnit ``<error>``, never a ``<failure>`` and never a pass.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass


class FarmError(Exception):
    """Base class of every error raised by :mod:`bmoe_ci.farm`."""


@dataclass(frozen=True)
class ConfigIssue:
    """One problem in a farm file, located by file, line and key path."""

    file: str
    line: int | None
    key: str
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        return f"{where}: {self.key}: {self.message}" if self.key else f"{where}: {self.message}"


class FarmConfigError(FarmError):
    """A farm file is unreadable or invalid. ``issues`` lists every problem found, in file order."""

    def __init__(self, issues: list[ConfigIssue]):
        # one line per problem: a bad value in `defaults` is reported once, not once per device
        self.issues = sorted(dict.fromkeys(issues), key=lambda i: (i.file, i.line or 0, i.key))
        super().__init__("\n".join(str(i) for i in self.issues))


class SelectionError(FarmError):
    """A ``--device`` expression is malformed, names an unknown device or pool, or selects nothing."""


class FarmNotUp(FarmError):
    """The embedded local farm is needed but was not started."""


class MissingTool(FarmError):
    """A program the local farm needs is not installed; the message names the Debian package."""


#: Kinds of infrastructure error. Each is a reason to report a JUnit error, never a verdict.
INFRA_KINDS = (
    "unreachable",  # TCP connect refused, name did not resolve, the SSH handshake broke
    "hostkey",  # host key unknown to the pinned known_hosts, or different from the pinned one
    "auth",  # the device refused our key
    "disconnect",  # the connection dropped while a command or a transfer was running
    "timeout",  # a command ran past its deadline (it was killed on the device)
    "transfer",  # an upload or a download failed
    "push",  # content-addressed push failed (hash mismatch, no space, rename failed)
    "preflight",  # a preflight check failed (arch, free space, engine --version, build id)
    "busy",  # the device is locked by another run
    "setup",  # the device could not be prepared (work directory, missing tool on the device)
)


class InfraError(FarmError):
    """An infrastructure problem with one device (see :data:`INFRA_KINDS`).

    ``step`` names what the run was doing when it happened (``connect``, ``push``, ``plan
    'fixture:qwen3moe'``, ``pull ref-qwen3moe.logits.f32`` ...); :meth:`line` is the one line a report
    shows: device, step, kind and cause, each once."""

    def __init__(self, device: str, kind: str | None = None, reason: str | None = None, step: str = ""):
        kind = kind or "setup"
        if kind not in INFRA_KINDS:  # pragma: no cover - programming error
            raise ValueError(f"unknown infrastructure error kind {kind!r}")
        self.device = device
        self.kind = kind
        self.reason = _without_prefix(reason or "", device, kind)
        self.step = step
        super().__init__(f"{device}: {kind}: {self.reason}")

    def at(self, step: str) -> InfraError:
        """The same error, saying what the run was doing (the first step given stands)."""
        if self.step or not step:
            return self
        out = copy.copy(self)
        out.step = step
        return out

    def __str__(self) -> str:
        step = f"{self.step}: " if self.step else ""
        return f"{self.device}: {step}{self.kind}: {self.reason}"

    def line(self) -> str:
        """``DEVICE: STEP: KIND: REASON`` on one line (the reason's first line, at most 400 characters)."""
        reason = " ".join(self.reason.split())
        reason = reason if len(reason) <= 400 else reason[:397] + "..."
        step = f"{self.step}: " if self.step else ""
        return f"{self.device}: {step}{self.kind}: {reason}"

    def __reduce__(self):  # survive pickling (xdist, multiprocessing) with device and kind intact
        return (self.__class__, (self.device, self.kind, self.reason, self.step))


def _without_prefix(reason: str, device: str, kind: str) -> str:
    """A reason that repeats its device and kind (an error re-raised from another one's text) is kept
    once: ``dev: setup: dev: unreachable: ...`` reads ``dev: unreachable: ...``."""
    for prefix in (f"{device}: {kind}: ", f"{device}: "):
        while reason.startswith(prefix):
            reason = reason[len(prefix) :]
    return reason


class DeviceBusy(InfraError):
    """The device lock is held by someone else (``owner`` describes them, ``since`` is ISO time,
    ``lease`` the heartbeat age and expiry)."""

    def __init__(self, device: str, owner: str, since: str, lease: str = ""):
        self.owner = owner
        self.since = since
        self.lease = lease
        super().__init__(device, "busy", f"busy, held by {owner} since {since}" + (f"; {lease}" if lease else ""))

    def __reduce__(self):
        return (_busy, (self.device, self.owner, self.since, self.lease, self.step))


def _busy(device: str, owner: str, since: str, lease: str, step: str) -> DeviceBusy:
    out = DeviceBusy(device, owner, since, lease)
    out.step = step
    return out
