"""Transports: how commands and files reach a device, one module per ``transport:`` value of a farm file.

* ``local`` (:mod:`.local`): this machine; commands are subprocesses, files are copied;
* ``ssh`` (:mod:`.ssh`): OpenSSH through Fabric and paramiko, host keys pinned;
* ``adb`` (:mod:`.adb`): an Android device through the Android Debug Bridge client and its server.

A transport is a module of this package holding a :class:`~.base.Transport` subclass with a ``name``
and the model of its keys, and one entry of :data:`TRANSPORTS`, imported below by name (no package
scan: ``tests/test_architecture.py`` checks that every transport module is imported and listed here).
:func:`registry` maps ``transport:`` values to classes, :func:`open_transport` makes the transport of a
device.
"""

from __future__ import annotations

from ..model import Device
from .adb import AdbTransport
from .base import DEADLINE_GRACE, Ending, RunResult, Transport, command_text, name_script, safe_local_path
from .local import LocalTransport
from .ssh import SshTransport

#: Every transport, one per module of this package.
TRANSPORTS: tuple[type[Transport], ...] = (LocalTransport, SshTransport, AdbTransport)


def registry() -> dict[str, type[Transport]]:
    """``transport:`` value -> class, sorted by name."""
    return {t.name: t for t in sorted(TRANSPORTS, key=lambda t: t.name)}


def transport_class(name: str) -> type[Transport]:
    """The class of ``transport: NAME`` (KeyError for an unknown name)."""
    return registry()[name]


def open_transport(device: Device) -> Transport:
    """The transport for ``device`` (not yet connected)."""
    return transport_class(device.transport)(device)


__all__ = [
    "DEADLINE_GRACE",
    "TRANSPORTS",
    "Ending",
    "RunResult",
    "Transport",
    "command_text",
    "name_script",
    "open_transport",
    "registry",
    "safe_local_path",
    "transport_class",
]
