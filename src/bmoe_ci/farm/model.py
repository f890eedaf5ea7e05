"""Farm files: the schema, a line-aware YAML loader and the loader that turns a file into a :class:`Farm`.

A farm file is YAML::

    version: 1
    defaults: {user: ci, key: keys/ci_ed25519, known_hosts: known_hosts}
    devices:
      - {name: pixel8, kind: phone, os: android, arch: aarch64, transport: ssh,
         host: 10.0.0.8, port: 8022, workdir: /data/local/tmp/bmoe-ci, exec_prefix: [taskset, -c, 4-7]}
    pools:
      nightly: [pixel8, label:desktop]

Every problem is reported as ``FILE:LINE: KEY.PATH: message`` (see :class:`ConfigIssue`); all problems
of a file are reported at once. The full reference is ``docs/farm.md``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StringConstraints, ValidationError

from bmoe_ci import inputs
from bmoe_ci.builder import KNOWN_ARCHES, normalize_arch

from .errors import ConfigIssue, FarmConfigError
from .yamllines import (
    MAX_FARM_BYTES,
    LineDict,
    LineList,
    closest,
    display_path,
    format_loc,
    load_yaml_with_lines,
    locate,
)

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


class DeviceSpec(BaseModel):
    """One device as written in a farm file (see docs/farm.md for every key)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Name
    kind: Literal["phone", "desktop"]
    os: NonEmpty = "linux"
    arch: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-]+$")]
    transport: NonEmpty  # a name of bmoe_ci.farm.transports.registry(), checked by load_farm_file
    host: NonEmpty | None = None
    port: Annotated[StrictInt, Field(ge=1, le=65535)] = 22
    user: NonEmpty | None = None
    key: NonEmpty | None = None
    known_hosts: NonEmpty | None = None
    serial: NonEmpty | None = None
    adb_server: NonEmpty | None = None
    workdir: NonEmpty | None = None  # required unless the transport has a default (adb)
    exec_prefix: tuple[NonEmpty, ...] = ()
    timeout_scale: Annotated[float, Field(gt=0, le=1000)] = 1.0
    labels: tuple[Name, ...] = ()
    connect_timeout: Annotated[float, Field(gt=0, le=600)] = 10.0
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

    ``source`` is ``FILE:LINE`` of its definition.
    """

    source: str = ""

    @property
    def emulated_arch(self) -> str | None:
        """The arch a qemu in ``exec_prefix`` emulates (the engine runs under it), else None."""
        return emulated_arch(self.exec_prefix)

    @property
    def where(self) -> str:
        """Where the device is, for humans: ``user@host:port``, ``adb SERIAL``, ``local``."""
        from .transports import transport_class

        return transport_class(self.transport).where(self)

    def spec(self) -> dict[str, Any]:
        """The device as JSON-ready values (:meth:`from_spec` makes it again): how the controller of a
        gate run hands a device to its workers."""
        return self.model_dump(mode="json")

    @classmethod
    def from_spec(cls, spec: dict[str, Any]) -> Device:
        return cls.model_validate(spec)

    def describe(self) -> str:
        where = self.where
        prefix = f" via {' '.join(self.exec_prefix)}" if self.exec_prefix else ""
        return f"{self.name} ({self.kind}, {self.os}/{self.arch}, {where}{prefix})"


_DEVICE_KEYS = tuple(DeviceSpec.model_fields)
_TOP_KEYS = ("version", "defaults", "devices", "pools")


class _FarmSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: Literal[1] = 1
    defaults: dict[str, Any] = {}
    devices: Annotated[list[DeviceSpec], Field(min_length=1)]
    pools: dict[Name, list[NonEmpty]] = {}


@dataclass
class Farm:
    """A loaded farm: devices in file order and pools resolved to device names."""

    path: Path
    devices: dict[str, Device]
    pools: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def device(self, name: str) -> Device:
        """The device called ``name`` (a :class:`~bmoe_ci.farm.errors.SelectionError` lists the known)."""
        from .errors import SelectionError

        if name in self.devices:
            return self.devices[name]
        hint = closest(name, list(self.devices))
        raise SelectionError(f"unknown device '{name}'{hint}; known devices: {', '.join(self.devices)}")

    def select(self, specs: str | list[str] | tuple[str, ...]) -> list[Device]:
        """Devices matching ``--device`` expressions (see :func:`bmoe_ci.farm.select.select_devices`)."""
        from .select import select_devices

        return select_devices(self, specs)

    @property
    def names(self) -> list[str]:
        return list(self.devices)


# --------------------------------------------------------------------------------------------------
# Loading


def _message(err: dict[str, Any], loc: tuple[Any, ...], parent_fields: tuple[str, ...]) -> str:
    etype = err["type"]
    if etype == "extra_forbidden":
        return "unknown key" + closest(str(loc[-1]), parent_fields)
    if etype == "missing":
        return "missing required key"
    got = err.get("input")
    shown = "" if isinstance(got, dict | list) else f" (got {got!r})"
    if etype in ("tuple_type", "list_type"):
        return f"expected a list, e.g. [a, b]{shown}"
    if etype == "string_pattern_mismatch":
        return f"invalid name{shown}: use letters, digits, '.', '_' and '-', starting with a letter or digit"
    return f"{err['msg']}{shown}"


def _fields_for(loc: tuple[Any, ...]) -> tuple[str, ...]:
    if len(loc) >= 2 and loc[0] == "devices":
        return _DEVICE_KEYS
    if loc and loc[0] == "defaults":
        return tuple(k for k in _DEVICE_KEYS if k != "name")
    return _TOP_KEYS


def _expand(value: str, variables: dict[str, str]) -> str:
    def sub(m: re.Match[str]) -> str:
        name = m.group(1)
        if name not in variables:
            raise KeyError(name)
        return variables[name]

    return re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", sub, value)


def load_farm_file(path: str | os.PathLike[str], variables: dict[str, str] | None = None) -> Farm:
    """Read, validate and resolve a farm file. Raises :class:`FarmConfigError` listing every problem.

    ``variables`` are substituted for ``${NAME}`` in string values (``${FARM_DIR}``, the directory of
    the file, is always defined); an unknown ``${NAME}`` is an error.
    """
    path = Path(path)
    shown = display_path(path)
    try:
        # a regular file of at most MAX_FARM_BYTES, read no further: a 400 MB file, /dev/zero or a FIFO is
        # one line, not a wait or an exhausted memory
        text = inputs.read_text(path, what="farm file", limit=MAX_FARM_BYTES)
    except inputs.InputError as exc:
        why = str(exc).split(": ", 1)[-1]
        raise FarmConfigError([ConfigIssue(shown, None, "", f"cannot read farm file: {why}")]) from None
    try:
        raw = load_yaml_with_lines(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        line = mark.line + 1 if mark else None
        problem = getattr(exc, "problem", None) or str(exc)
        raise FarmConfigError([ConfigIssue(shown, line, "", f"invalid YAML: {problem}")]) from None
    issues: list[ConfigIssue] = []

    def issue(line: int | None, loc: tuple[Any, ...], msg: str) -> None:
        issues.append(ConfigIssue(shown, line, format_loc(loc), msg))

    if not isinstance(raw, LineDict):
        issue(getattr(raw, "line", 1) or 1, (), "a farm file is a mapping with 'devices' (and 'pools')")
        raise FarmConfigError(issues)

    # duplicate YAML keys, anywhere in the file
    def walk_dups(node: Any, loc: tuple[Any, ...]) -> None:
        if isinstance(node, LineDict):
            for key, line, first in node.duplicates:
                issue(line, (*loc, key), f"duplicate key (first given at line {first})")
            for k, v in node.items():
                walk_dups(v, (*loc, k))
        elif isinstance(node, LineList):
            for i, v in enumerate(node):
                walk_dups(v, (*loc, i))

    walk_dups(raw, ())

    # ${VAR} expansion in every string value
    variables = {"FARM_DIR": str(path.resolve().parent), **(variables or {})}

    def expand(node: Any, loc: tuple[Any, ...], line: int | None) -> Any:
        if isinstance(node, LineDict):
            for k in list(node):
                node[k] = expand(node[k], (*loc, k), node.key_lines.get(k, line))
        elif isinstance(node, LineList):
            for i in range(len(node)):
                node[i] = expand(node[i], (*loc, i), node.item_lines[i])
        elif isinstance(node, str) and "${" in node:
            try:
                return _expand(node, variables)
            except KeyError as exc:
                issue(line, loc, f"unknown variable ${{{exc.args[0]}}} (known: {', '.join(sorted(variables))})")
        return node

    expand(raw, (), raw.line)

    # defaults: validated for unknown keys, then merged into each device mapping
    defaults = raw.get("defaults", LineDict())
    if isinstance(defaults, LineDict):
        for k in list(defaults):
            if k not in _DEVICE_KEYS or k == "name":
                why = (
                    "'name' cannot have a default"
                    if k == "name"
                    else "unknown key" + closest(str(k), [f for f in _DEVICE_KEYS if f != "name"])
                )
                issue(defaults.key_lines.get(k), ("defaults", k), why)
        devices_raw = raw.get("devices")
        if isinstance(devices_raw, LineList):
            for dev in devices_raw:
                if isinstance(dev, LineDict):
                    for k, v in defaults.items():
                        if k in _DEVICE_KEYS and k != "name" and k not in dev:
                            dev[k] = v
                            dev.inherited[k] = defaults.key_lines.get(k)

    try:
        spec = _FarmSpec.model_validate(raw)
    except ValidationError as exc:
        for err in exc.errors():
            loc = tuple(err["loc"])
            line, shown_loc = locate(raw, loc)
            if err["type"] == "extra_forbidden" and shown_loc and shown_loc[0] == "defaults":
                continue  # already reported with a better message
            issue(line, shown_loc, _message(err, loc, _fields_for(loc)))
        raise FarmConfigError(issues) from None
    if issues:
        raise FarmConfigError(issues)

    from .transports import registry

    base = path.resolve().parent
    devices: dict[str, Device] = {}
    raw_devices: LineList = raw["devices"]
    for i, (dspec, draw) in enumerate(zip(spec.devices, raw_devices, strict=True)):
        loc = ("devices", i)

        def key_line(k: str, draw: LineDict = draw) -> int | None:
            return draw.inherited[k] if k in draw.inherited else draw.key_lines.get(k, draw.line)

        def key_loc(k: str, draw: LineDict = draw, loc: tuple[Any, ...] = loc) -> tuple[Any, ...]:
            return ("defaults", k) if k in draw.inherited else (*loc, k)

        if dspec.name in devices:
            first = devices[dspec.name].source.rsplit(":", 1)[-1]
            issue(
                key_line("name"),
                (*loc, "name"),
                f"duplicate device name '{dspec.name}' (first defined at line {first})",
            )
            continue
        update: dict[str, Any] = {"arch": normalize_arch(dspec.arch), "source": f"{shown}:{draw.line}"}
        if update["arch"] not in KNOWN_ARCHES:
            issue(
                key_line("arch"),
                key_loc("arch"),
                f"unknown arch {dspec.arch!r}: the engine is built for {', '.join(KNOWN_ARCHES)} "
                "(arm64 is accepted for aarch64, amd64/x64 for x86_64)" + closest(update["arch"], KNOWN_ARCHES),
            )
        transports = registry()
        tclass = transports.get(dspec.transport)
        if tclass is None:
            issue(
                key_line("transport"),
                key_loc("transport"),
                f"unknown transport {dspec.transport!r} (known: {', '.join(transports)})"
                + closest(dspec.transport, list(transports)),
            )
        else:
            update.update(_check_transport_keys(tclass, transports, dspec, draw, base, key_line, key_loc, issue))
        devices[dspec.name] = Device(**{**dspec.model_dump(), **update})

    pools = _resolve_pools(spec.pools, raw.get("pools"), devices, issue)
    if issues:
        raise FarmConfigError(issues)
    return Farm(path=path.resolve(), devices=devices, pools=pools)


def _check_transport_keys(tclass, transports, dspec, draw, base, key_line, key_loc, issue) -> dict[str, Any]:
    """The transport's own checks of a device, and the keys of other transports refused (an error when
    written for this device, dropped when inherited from defaults aimed at another transport's devices).
    Returns the values to replace."""
    update: dict[str, Any] = {}
    for other in transports.values():
        for k in other.own_keys:
            if k in tclass.own_keys or k not in draw:
                continue
            if k in draw.inherited:
                update[k] = DeviceSpec.model_fields[k].default
            else:
                owners = " or ".join(t.name for t in transports.values() if k in t.own_keys)
                issue(key_line(k), key_loc(k), f"only meaningful for transport {owners}")
    if dspec.workdir is None:
        if tclass.default_workdir is None:
            issue(draw.line, key_loc("name")[:-1], f"missing required key 'workdir' (transport {tclass.name})")
            return update
        dspec = dspec.model_copy(update={"workdir": tclass.default_workdir})
        update["workdir"] = tclass.default_workdir

    def problem(k: str, msg: str) -> None:
        if k:
            issue(key_line(k), key_loc(k), msg)
        else:
            issue(draw.line, key_loc("name")[:-1], msg)

    update.update(tclass.check_device(dspec, base, problem))
    return update


def match_selector(device: Device, field_name: str, value: str) -> bool:
    """Does ``device`` match ``arch:X`` / ``label:X`` / ``kind:X`` / ``os:X``?"""
    if field_name == "arch":
        return device.arch == normalize_arch(value)
    if field_name == "label":
        return value in device.labels
    return getattr(device, field_name) == value


def _resolve_pools(
    pools: dict[str, list[str]], raw: Any, devices: dict[str, Device], issue: Any
) -> dict[str, tuple[str, ...]]:
    resolved: dict[str, tuple[str, ...]] = {}
    known = ", ".join(devices) or "(none)"

    def member_line(pool: str, i: int) -> int | None:
        node = raw.get(pool) if isinstance(raw, LineDict) else None
        if isinstance(node, LineList) and i < len(node.item_lines):
            return node.item_lines[i]
        return raw.key_lines.get(pool) if isinstance(raw, LineDict) else None

    def resolve(name: str, stack: tuple[str, ...]) -> tuple[str, ...]:
        if name in resolved:
            return resolved[name]
        names: list[str] = []
        if not pools[name]:
            issue(raw.key_lines.get(name) if isinstance(raw, LineDict) else None, ("pools", name), "empty pool")
        for i, member in enumerate(pools[name]):
            line, loc = member_line(name, i), ("pools", name, i)
            prefix, sep, value = member.partition(":")
            if sep and prefix == "pool":
                if value not in pools:
                    issue(line, loc, f"unknown pool '{value}'{closest(value, list(pools))} (pools: {', '.join(pools)})")
                    continue
                if value in stack or value == name:
                    issue(line, loc, f"pool '{name}' includes itself through '{value}'")
                    continue
                hits = list(resolve(value, (*stack, name)))
            elif sep and prefix in SELECTOR_FIELDS:
                hits = [d.name for d in devices.values() if match_selector(d, prefix, value)]
                if not hits:
                    issue(line, loc, f"selector '{member}' matches no device")
            elif sep:
                issue(
                    line,
                    loc,
                    f"unknown selector '{prefix}:' (use a device name, pool:, "
                    f"{', '.join(s + ':' for s in SELECTOR_FIELDS)})",
                )
                continue
            else:
                if member not in devices:
                    issue(line, loc, f"unknown device '{member}'{closest(member, list(devices))} (devices: {known})")
                    continue
                hits = [member]
            names.extend(h for h in hits if h not in names)
        order = list(devices)
        resolved[name] = tuple(sorted(names, key=order.index))
        return resolved[name]

    for name in pools:
        resolve(name, ())
    return resolved
