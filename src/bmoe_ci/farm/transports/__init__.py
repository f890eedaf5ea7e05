"""Transports: how commands and files reach a device, one module per ``transport:`` value of a farm file.

* ``local`` (:mod:`.local`): this machine; commands are subprocesses, files are copied;
* ``ssh`` (:mod:`.ssh`): OpenSSH through Fabric and paramiko, host keys pinned;
* ``adb`` (:mod:`.adb`): an Android device through the Android Debug Bridge client and its server.

Every module of this package that defines a :class:`~.base.Transport` subclass with a ``name`` is a
transport: adding one is adding one file. :func:`registry` maps ``transport:`` values to classes,
:func:`open_transport` makes the transport of a device.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from typing import TYPE_CHECKING

from .base import DEADLINE_GRACE, Ending, RunResult, Transport, command_text, name_script, safe_local_path

if TYPE_CHECKING:
    from ..model import Device

#: modules of this package that hold shared code, not a transport
_SUPPORT = frozenset({"base", "remote_shell"})


@functools.cache
def registry() -> dict[str, type[Transport]]:
    """``transport:`` value -> class, for every transport module of this package (imported once)."""
    found: dict[str, type[Transport]] = {}
    for info in pkgutil.iter_modules(__path__):
        if info.name in _SUPPORT or info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        for obj in vars(module).values():
            if isinstance(obj, type) and issubclass(obj, Transport) and "name" in obj.__dict__:
                found[obj.name] = obj
    return dict(sorted(found.items()))


def transport_class(name: str) -> type[Transport]:
    """The class of ``transport: NAME`` (KeyError for an unknown name)."""
    return registry()[name]


def open_transport(device: Device) -> Transport:
    """The transport for ``device`` (not yet connected)."""
    return transport_class(device.transport)(device)


__all__ = [
    "DEADLINE_GRACE",
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
