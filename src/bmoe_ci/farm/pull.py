"""Verified reads from a device: what comes back is what the device has, or an infrastructure error.

Pushes are verified on the device (:mod:`bmoe_ci.farm.store`); pulls are verified the other way round:

* :func:`pull` copies one device file into the results directory. One round trip first reads the
  file's size and sha256 *on the device*; the copy is checked against both on the controller. A
  copy that does not match is pulled once more (the size and hash read again); a second mismatch is an
  :class:`~bmoe_ci.farm.errors.InfraError` of kind ``transfer`` naming the file, both sizes and both
  hashes, never a short file handed to a gate.
* :func:`read_files` reads many small device files (the route traces of a plan) in one round trip: each
  file comes back behind a header with a per-call random token, its size and its sha256 computed on the
  device just before it is sent. A file whose bytes do not match its header (cut short on the link, or
  changed while it was read) is read again once, alone with the others that did not match; still
  wrong, it is an ``InfraError`` (``transfer``) naming the file.

The device-side hash is the store's (the first of ``sha256sum``, ``shasum -a 256``, ``openssl dgst``).
"""

from __future__ import annotations

import hashlib
import os
import secrets
from collections.abc import Sequence
from pathlib import Path

from .errors import InfraError
from .store import HASHIT, sha256_file
from .transports import Transport, name_script

# $1 token, then paths: per path (numbered from 1) "\036TOKEN N SIZE SHA\n" + the bytes + "\n", or
# "\037TOKEN N\n" when there is no readable regular file there. SIZE/SHA "-" when the device cannot hash.
_READ = name_script(
    HASHIT
    + r"""
tok=$1; shift; n=0
for f; do
  n=$((n + 1))
  if [ -f "$f" ] && [ -r "$f" ]; then
    s=$(wc -c < "$f" | tr -d ' '); h=$(hashit "$f")
    printf '\036%s %s %s %s\n' "$tok" "$n" "${s:--}" "${h:--}"; cat "$f"; printf '\n'
  else
    printf '\037%s %s\n' "$tok" "$n"
  fi
done
""",
    "read files",
)

# $1 path: "SIZE SHA" of a regular file, or "none"
_INFO = name_script(
    HASHIT
    + r"""
if [ -f "$1" ] && [ -r "$1" ]; then printf '%s %s\n' "$(wc -c < "$1" | tr -d ' ')" "$(hashit "$1")"; else echo none; fi
""",
    "file size and hash",
)


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _short(sha: str) -> str:
    return sha[:12] if sha else "(none)"


def file_info(transport: Transport, path: str, timeout: float) -> tuple[int, str] | None:
    """(size, sha256) of a device file, computed on the device; None when there is no such file."""
    r = transport.sh(_INFO, transport.path(path), timeout=timeout)
    if r.infra is not None:
        raise r.infra
    words = r.stdout.decode(errors="replace").split()
    if words == ["none"]:
        return None
    if not r.ok or len(words) != 2 or not words[0].isdigit() or len(words[1]) != 64:
        raise InfraError(
            transport.device.name,
            "transfer",
            f"cannot read the size and sha256 of {path} on the device ({r.describe()}): "
            + (r.stderr.decode(errors="replace").strip()[-200:] or "no sha256 tool (sha256sum, shasum, openssl)"),
        )
    return int(words[0]), words[1]


def pull(
    transport: Transport,
    remote_path: str,
    local_path: str | os.PathLike[str],
    *,
    root: str | os.PathLike[str],
    timeout: float,
) -> Path:
    """Copy a device file into ``root`` (the results directory; see :meth:`Transport.get` for the path
    rules), verified against the size and sha256 the device computes; see the module docstring."""
    name = os.path.basename(remote_path)
    seen: list[str] = []
    for _attempt in range(2):
        info = file_info(transport, remote_path, timeout)
        if info is None:
            raise InfraError(transport.device.name, "transfer", f"{remote_path}: no such file on the device")
        size, sha = info
        dest = transport.get(remote_path, local_path, root=root)
        got_size, got_sha = dest.stat().st_size, sha256_file(dest)
        if (got_size, got_sha) == (size, sha):
            return dest
        seen.append(f"got {got_size} bytes (sha256 {_short(got_sha)}), the device has {size} ({_short(sha)})")
        dest.unlink(missing_ok=True)
    raise InfraError(
        transport.device.name, "transfer", f"pull of {name} did not arrive whole, twice: {'; then '.join(seen)}"
    )


def read_files(transport: Transport, paths: Sequence[str], timeout: float) -> dict[str, bytes | None]:
    """The bytes of each device file (None: not there), in one round trip, each verified against its
    size and sha256 on the device; a file that does not match is read once more. See the module
    docstring."""
    out: dict[str, bytes | None] = {}
    wrong: dict[str, str] = {}
    todo = list(dict.fromkeys(paths))
    for attempt in range(2):
        if not todo:
            break
        got, bad = _read_once(transport, todo, timeout)
        out.update(got)
        wrong.update(bad)
        for path in got:
            wrong.pop(path, None)
        todo = list(bad) if attempt == 0 else []
    if wrong:
        path, why = next(iter(wrong.items()))
        more = f" (and {len(wrong) - 1} more file(s))" if len(wrong) > 1 else ""
        raise InfraError(transport.device.name, "transfer", f"{path}: {why}, read twice{more}")
    return {p: out.get(p) for p in paths}


def _read_once(
    transport: Transport, paths: Sequence[str], timeout: float
) -> tuple[dict[str, bytes | None], dict[str, str]]:
    """One round trip: (path -> verified bytes or None for a missing file, path -> why it did not verify)."""
    token = secrets.token_hex(8)
    r = transport.sh(_READ, token, *paths, timeout=timeout)
    if r.infra is not None:
        raise r.infra
    if not r.ok:
        raise InfraError(
            transport.device.name,
            "transfer",
            f"reading {len(paths)} file(s) failed ({r.describe()}): {r.stderr.decode(errors='replace').strip()[-200:]}",
        )
    data = r.stdout
    present = b"\x1e" + token.encode() + b" "
    absent = b"\x1f" + token.encode() + b" "
    # every header starts a line: the first one at 0, the others after the newline the script adds
    starts = [i for i in _find_all(data, present) + _find_all(data, absent) if i == 0 or data[i - 1 : i] == b"\n"]
    starts.sort()
    got: dict[str, bytes | None] = {}
    bad: dict[str, str] = {}
    for n, start in enumerate(starts):
        end_header = data.find(b"\n", start)
        if end_header < 0:
            break
        words = data[start + 1 : end_header].decode(errors="replace").split(" ")
        body_end = (starts[n + 1] - 1) if n + 1 < len(starts) else len(data) - 1
        number = int(words[1]) if len(words) > 1 and words[1].isdigit() else 0
        if not 1 <= number <= len(paths):
            continue
        path = paths[number - 1]
        if data[start : start + 1] == b"\x1f":
            got[path] = None
            continue
        size_text, sha = (words[2], words[3]) if len(words) == 4 else ("-", "-")
        body = data[end_header + 1 : max(end_header + 1, body_end)]
        if not size_text.isdigit() or len(sha) != 64:
            bad[path] = "the device could not give its size and sha256 (no sha256 tool?)"
        elif len(body) != int(size_text) or _digest(body) != sha:
            bad[path] = (
                f"{len(body)} bytes arrived (sha256 {_short(_digest(body))}), the device had {size_text} "
                f"({_short(sha)}): cut short on the link, or changed while it was read"
            )
        else:
            got[path] = body
    for path in paths:
        if path not in got and path not in bad:
            bad[path] = "nothing came back for it (the output was cut short)"
    return got, bad


def _find_all(data: bytes, needle: bytes) -> list[int]:
    found, i = [], data.find(needle)
    while i >= 0:
        found.append(i)
        i = data.find(needle, i + 1)
    return found


__all__ = ["file_info", "pull", "read_files"]
