"""Farm files' schema: the keys every device has (:class:`DeviceSpec`), the keys only one transport reads
(:class:`TransportKeys`: each transport module of :mod:`bmoe_ci.farm.transports` defines its own), a
validated :class:`Device` and a loaded :class:`Farm`. The loader is :mod:`bmoe_ci.farm.farmfile`.

A farm file is YAML::

    version: 1
    defaults: {user: ci, key: keys/ci_ed25519, known_hosts: known_hosts}
    devices:
      - {name: pixel8, kind: phone, os: android, arch: aarch64, transport: ssh,
         host: 10.0.0.8, port: 8022, workdir: /data/local/tmp/bmoe-ci, exec_prefix: [taskset, -c, 4-7]}
    pools:
      nightly: [pixel8, label:desktop]

The full reference is ``docs/farm.md``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SerializeAsAny, StrictInt, StringConstraints

from bmoe_ci.builder import normalize_arch

from .errors import SelectionError
from .yamllines import closest

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
_NAME_RE = re.compile(NAME_PATTERN)

#: Selector prefixes understood in pools and in ``--device`` (besides ``pool:`` and ``all``).
SELECTOR_FIELDS = ("arch", "label", "kind", "os")


def triple_arch(triple: str) -> str:
    """The architecture of a target triple (``aarch64-linux-musl`` -> ``aarch64``)."""
    return normalize_arch(triple.split("-", 1)[0])


_QEMU_RE = re.compile(r"^qemu-([A-Za-z0-9_]+?)(?:-static)?$")


def emulated_arch(exec_prefix: tuple[str, ...] | list[str]) -> str | None:
    """The architecture a qemu user-mode emulator in the exec prefix runs, or None if there is none."""
    for part in exec_prefix:
        m = _QEMU_RE.match(os.path.basename(part))
        if m:
            return normalize_arch(m.group(1))
    return None


# --------------------------------------------------------------------------------------------------
# Schema

Name = Annotated[str, StringConstraints(pattern=NAME_PATTERN)]
NonEmpty = Annotated[str, StringConstraints(min_length=1)]
#: The engine's kernel paths (docs/engine-flags.md, BMOE_KERNELS); ``auto`` lets the engine choose.
KernelPath = Literal["auto", "scalar", "avx2", "avx512-vnni", "neon", "neon-dot"]
Port = Annotated[StrictInt, Field(ge=1, le=65535)]


class TransportKeys(BaseModel):
    """The device keys one transport reads, and only it. Each transport module defines its subclass
    (``LocalKeys``, ``SshKeys``, ``AdbKeys``) and names it as its ``Transport.keys``; the loader validates
    a device's own keys with its transport's model, so a new transport adds its keys in its own module."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    def where(self) -> str:
        """Where the device is, for humans: ``user@host:port``, ``adb SERIAL``, ``local``."""
        return "local"


class DeviceSpec(BaseModel):
    """The keys of every device, whatever its transport (see docs/farm.md for every key)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Name
    kind: Literal["phone", "desktop"]
    os: NonEmpty = "linux"
    arch: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-]+$")]
    transport: NonEmpty  # a name of bmoe_ci.farm.transports.registry(), checked by the loader
    workdir: NonEmpty | None = None  # required unless the transport has a default (adb)
    exec_prefix: tuple[NonEmpty, ...] = ()
    timeout_scale: Annotated[float, Field(gt=0, le=1000)] = 1.0
    labels: tuple[Name, ...] = ()
    connect_timeout: Annotated[float, Field(gt=0, le=600)] = 10.0
    kernels: KernelPath = "auto"  # pins BMOE_KERNELS for every engine run on the device
    min_free_mb: Annotated[StrictInt, Field(ge=0)] = 256
    keep_runs: Annotated[StrictInt, Field(ge=1, le=10000)] = 10
    entry_timeout: Annotated[float, Field(gt=0, le=86400)] = 120.0
    command_timeout: Annotated[float, Field(gt=0, le=86400)] = 120.0
    transfer_timeout: Annotated[float, Field(gt=0, le=86400)] = 60.0
    lease_ttl: Annotated[float, Field(ge=4, le=86400)] = 180.0
    retries: Annotated[StrictInt, Field(ge=0, le=10)] = 2
    max_clock_skew: Annotated[float, Field(gt=0, le=31_536_000)] = 300.0
    quarantine_after: Annotated[StrictInt, Field(ge=0, le=1000)] = 3
    quarantine_hours: Annotated[float, Field(gt=0, le=8760)] = 24.0


class Device(DeviceSpec):
    """A validated device: arch normalised, key / known_hosts / local workdir made absolute.

    ``source`` is ``FILE:LINE`` of its definition; ``link`` its transport's own keys (a
    :class:`TransportKeys` of the transport's model).
    """

    source: str = ""
    link: SerializeAsAny[TransportKeys] = Field(default_factory=TransportKeys)

    @property
    def emulated_arch(self) -> str | None:
        """The arch a qemu in ``exec_prefix`` emulates (the engine runs under it), else None."""
        return emulated_arch(self.exec_prefix)

    @property
    def where(self) -> str:
        """Where the device is, for humans: ``user@host:port``, ``adb SERIAL``, ``local``."""
        return self.link.where()

    def updated(self, **changes: Any) -> Device:
        """A copy with ``changes`` to its common keys or its transport's (unchecked, as
        ``model_copy``)."""
        own = {k: v for k, v in changes.items() if k in type(self.link).model_fields}
        rest = {k: v for k, v in changes.items() if k not in own}
        unknown = sorted(set(rest) - set(type(self).model_fields))
        if unknown:
            raise KeyError(f"not a key of {self.name} (transport {self.transport}): {', '.join(unknown)}")
        return self.model_copy(update={**rest, "link": self.link.model_copy(update=own)} if own else rest)

    def spec(self) -> dict[str, Any]:
        """The device as JSON-ready values (:func:`bmoe_ci.farm.farmfile.device_from_spec` makes it
        again): how the controller of a gate run hands a device to its workers."""
        return self.model_dump(mode="json")

    def describe(self) -> str:
        where = self.where
        prefix = f" via {' '.join(self.exec_prefix)}" if self.exec_prefix else ""
        return f"{self.name} ({self.kind}, {self.os}/{self.arch}, {where}{prefix})"


@dataclass
class Farm:
    """A loaded farm: devices in file order and pools resolved to device names."""

    path: Path
    devices: dict[str, Device]
    pools: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def device(self, name: str) -> Device:
        """The device called ``name`` (a :class:`~bmoe_ci.farm.errors.SelectionError` lists the known)."""
        if name in self.devices:
            return self.devices[name]
        hint = closest(name, list(self.devices))
        raise SelectionError(f"unknown device '{name}'{hint}; known devices: {', '.join(self.devices)}")

    @property
    def names(self) -> list[str]:
        return list(self.devices)


def match_selector(device: Device, field_name: str, value: str) -> bool:
    """Does ``device`` match ``arch:X`` / ``label:X`` / ``kind:X`` / ``os:X``?"""
    if field_name == "arch":
        return device.arch == normalize_arch(value)
    if field_name == "label":
        return value in device.labels
    return getattr(device, field_name) == value
