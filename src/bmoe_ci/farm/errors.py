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
    "unreachable",  # TCP connect failed or timed out, name did not resolve, SSH banner never came
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
    """An infrastructure problem with one device (see :data:`INFRA_KINDS`)."""

    def __init__(self, device: str, kind: str | None = None, reason: str | None = None):
        kind = kind or "setup"
        if kind not in INFRA_KINDS:  # pragma: no cover - programming error
            raise ValueError(f"unknown infrastructure error kind {kind!r}")
        self.device = device
        self.kind = kind
        self.reason = reason or ""
        super().__init__(f"{device}: {kind}: {self.reason}")

    def __reduce__(self):  # survive pickling (xdist, multiprocessing) with device and kind intact
        return (self.__class__, (self.device, self.kind, self.reason))


class DeviceBusy(InfraError):
    """The device lock is held by someone else (``owner`` describes them, ``since`` is ISO time,
    ``lease`` the heartbeat age and expiry)."""

    def __init__(self, device: str, owner: str, since: str, lease: str = ""):
        self.owner = owner
        self.since = since
        self.lease = lease
        super().__init__(device, "busy", f"busy, held by {owner} since {since}" + (f"; {lease}" if lease else ""))

    def __reduce__(self):
        return (self.__class__, (self.device, self.owner, self.since, self.lease))
