"""Reading the files people hand bmoe-ci (a farm file, a results directory's JSON, evidence, a policy):
bounded in size and nesting, and read as the kind of file they claim to be, so that a bad one is one
line naming the file and why, never a traceback, a hang or an exhausted memory.

* only a regular file is read: a directory, a FIFO (which would block the reader for ever) or a device
  (``/dev/zero`` would be read until memory runs out) is refused; the file is opened without blocking and
  checked again through its descriptor, so nothing swapped in between is read either;
* at most ``limit`` bytes: the size is checked before reading, and no more than ``limit + 1`` bytes are
  read whatever the size claimed;
* JSON: nested at most :data:`MAX_DEPTH` deep (checked before parsing: a deeply nested file is refused,
  not a ``RecursionError``), and no ``NaN`` or ``Infinity`` (not JSON, and a NaN compares false with
  everything: a requirement ``x <= bound`` would pass it).
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

#: How deep JSON may nest ({"a": [[...]]}): the project's own files nest a handful of levels.
MAX_DEPTH = 64
#: The default size limit of a JSON input (results, evidence): far above anything the project writes.
MAX_JSON_BYTES = 64 << 20


class InputError(ValueError):
    """An input file that cannot be used; the message is ``FILE: why`` on one line."""


def read_bytes(path: str | os.PathLike[str], *, what: str, limit: int) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes (see the module docstring)."""
    p = Path(path)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise InputError(f"{p}: no such file") from None
    except OSError as exc:
        raise InputError(f"{p}: cannot read the {what}: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = (
                "a directory"
                if stat.S_ISDIR(st.st_mode)
                else "a FIFO"
                if stat.S_ISFIFO(st.st_mode)
                else "a device"
                if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)
                else "not a regular file"
            )
            raise InputError(f"{p}: {kind}, not a file: a {what} is read from a regular file")
        if st.st_size > limit:
            raise InputError(f"{p}: {st.st_size} bytes, larger than {limit} bytes (the most a {what} may have)")
        chunks, left = [], limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
    except OSError as exc:
        raise InputError(f"{p}: cannot read the {what}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if len(data) > limit:
        raise InputError(f"{p}: larger than {limit} bytes (the most a {what} may have; it grew while read)")
    return data


def read_text(path: str | os.PathLike[str], *, what: str, limit: int) -> str:
    """:func:`read_bytes`, decoded as UTF-8."""
    data = read_bytes(path, what=what, limit=limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not UTF-8 text (byte {exc.start}): not a {what}") from None


def json_depth_problem(text: str, max_depth: int = MAX_DEPTH) -> str | None:
    """Why ``text`` nests too deep to parse, or None: brackets counted outside strings, one pass."""
    depth = 0
    in_string = escaped = False
    for i, c in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c in "[{":
            depth += 1
            if depth > max_depth:
                return f"nested deeper than {max_depth} levels (at character {i})"
        elif c in "]}":
            depth -= 1
    return None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def parse_json(text: str, source: str, *, what: str = "JSON file") -> Any:
    """JSON text, bounded in depth, without NaN or Infinity; :class:`InputError` ``SOURCE: why``."""
    problem = json_depth_problem(text)
    if problem is not None:
        raise InputError(f"{source}: {problem}: not a {what}")
    try:
        return json.loads(text, parse_constant=_no_constant)
    except ValueError as exc:
        raise InputError(f"{source}: not valid JSON ({exc}): not a {what}") from None


def read_json(path: str | os.PathLike[str], *, what: str = "JSON file", limit: int = MAX_JSON_BYTES) -> Any:
    """A JSON file, read as :func:`read_text` reads and parsed as :func:`parse_json` parses."""
    return parse_json(read_text(path, what=what, limit=limit), str(path), what=what)


__all__ = [
    "MAX_DEPTH",
    "MAX_JSON_BYTES",
    "InputError",
    "json_depth_problem",
    "parse_json",
    "read_bytes",
    "read_json",
    "read_text",
]
