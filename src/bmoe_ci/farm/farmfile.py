"""The farm file's loader: read a file, validate it and turn it into a :class:`~bmoe_ci.farm.model.Farm`.

A device's common keys are validated by :class:`~bmoe_ci.farm.model.DeviceSpec`, its transport's own by
the transport's model (``Transport.keys``). Every problem is reported as ``FILE:LINE: KEY.PATH: message``
(see :class:`ConfigIssue`); all problems of a file are reported at once.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from bmoe_ci import inputs
from bmoe_ci.builder import KNOWN_ARCHES, normalize_arch

from .errors import ConfigIssue, FarmConfigError
from .model import SELECTOR_FIELDS, Device, DeviceSpec, Farm, Name, NonEmpty, TransportKeys, match_selector
from .transports import Transport, registry
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

#: The keys every device has, then every transport's own (one list: what a default may set).
COMMON_KEYS = tuple(DeviceSpec.model_fields)
_DEVICE_KEYS = (
    *COMMON_KEYS,
    *dict.fromkeys(k for t in registry().values() for k in t.keys.model_fields if k not in COMMON_KEYS),
)
_TOP_KEYS = ("version", "defaults", "devices", "pools")


class _DeviceEntry(DeviceSpec):
    """A device mapping's common keys validated; the rest kept (``model_extra``) for its transport's model."""

    model_config = ConfigDict(extra="allow", frozen=True)


class _FarmSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: Literal[1] = 1
    defaults: dict[str, Any] = {}
    devices: Annotated[list[_DeviceEntry], Field(min_length=1)]
    pools: dict[Name, list[NonEmpty]] = {}


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

    spec: _FarmSpec | None = None
    try:
        spec = _FarmSpec.model_validate(raw)
    except ValidationError as exc:
        for err in exc.errors():
            loc = tuple(err["loc"])
            line, shown_loc = locate(raw, loc)
            if err["type"] == "extra_forbidden" and shown_loc and shown_loc[0] == "defaults":
                continue  # already reported with a better message
            issue(line, shown_loc, _message(dict(err), loc, _fields_for(loc)))

    # each device's own keys, by its transport's model (reported with the problems above, all at once)
    transports = registry()
    raw_devices = raw.get("devices")
    if not isinstance(raw_devices, LineList):
        raw_devices = LineList()
    links: dict[int, TransportKeys | None] = {}
    for i, draw in enumerate(raw_devices):
        tclass = transports.get(str(draw.get("transport"))) if isinstance(draw, LineDict) else None
        if tclass is not None:
            links[i] = _transport_keys(tclass, transports, draw, ("devices", i), raw, issue)
    if issues or spec is None:
        raise FarmConfigError(issues)

    base = path.resolve().parent
    devices: dict[str, Device] = {}
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
        common = {k: getattr(dspec, k) for k in COMMON_KEYS}
        tclass = transports.get(dspec.transport)
        keys = links.get(i)
        if tclass is None or keys is None:
            issue(
                key_line("transport"),
                key_loc("transport"),
                f"unknown transport {dspec.transport!r} (known: {', '.join(transports)})"
                + closest(dspec.transport, list(transports)),
            )
        elif dspec.workdir is None and tclass.default_workdir is None:
            issue(draw.line, loc, f"missing required key 'workdir' (transport {tclass.name})")
        else:
            common["workdir"] = dspec.workdir or tclass.default_workdir

            def problem(
                k: str, msg: str, key_line: Any = key_line, key_loc: Any = key_loc, draw: Any = draw, loc: Any = loc
            ) -> None:
                if k:
                    issue(key_line(k), key_loc(k), msg)
                else:
                    issue(draw.line, loc, msg)

            link_update: dict[str, Any] = {}
            for k, v in tclass.check_device(DeviceSpec.model_validate(common), keys, base, problem).items():
                (link_update if k in tclass.keys.model_fields else update)[k] = v
            update["link"] = keys.model_copy(update=link_update)
        # a device with a problem is still one, so that the pools naming it say nothing more
        devices[dspec.name] = Device(**{**common, **update})

    pools = _resolve_pools(spec.pools, raw.get("pools"), devices, issue)
    if issues:
        raise FarmConfigError(issues)
    return Farm(path=path.resolve(), devices=devices, pools=pools)


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


def _transport_keys(
    tclass: type[Transport],
    transports: dict[str, type[Transport]],
    draw: LineDict,
    loc: tuple[Any, ...],
    raw: Any,
    issue: Any,
) -> TransportKeys | None:
    """The device's keys of its transport, validated by the transport's model; a key no transport has is
    unknown, a key of another transport an error when written for this device (dropped when inherited
    from defaults aimed at another transport's devices). None when they do not validate."""

    def key_line(k: str) -> int | None:
        return draw.inherited[k] if k in draw.inherited else draw.key_lines.get(k, draw.line)

    def key_loc(k: str) -> tuple[Any, ...]:
        return ("defaults", k) if k in draw.inherited else (*loc, k)

    mine: dict[str, Any] = {}
    for k in draw:
        if k in COMMON_KEYS:
            continue
        if k in tclass.keys.model_fields:
            mine[k] = draw[k]
            continue
        owners = [t.name for t in transports.values() if k in t.keys.model_fields]
        if not owners:
            issue(key_line(k), key_loc(k), "unknown key" + closest(str(k), _DEVICE_KEYS))
        elif k not in draw.inherited:
            issue(key_line(k), key_loc(k), f"only meaningful for transport {' or '.join(owners)}")
    try:
        return tclass.keys.model_validate(mine)
    except ValidationError as exc:
        for err in exc.errors():
            full = (*loc, *err["loc"])
            line, shown_loc = locate(raw, full)
            issue(line, shown_loc, _message(dict(err), full, _DEVICE_KEYS))
        return None


def device_from_spec(spec: dict[str, Any]) -> Device:
    """A device again from :meth:`Device.spec` (its keys validated by its transport's model again)."""
    link = registry()[spec["transport"]].keys.model_validate(spec.get("link") or {})
    return Device.model_validate({**spec, "link": link})
