"""Content-addressed push: ``<workdir>/store/<sha256>`` on the device.

A push costs at most two shell round trips plus the uploads:

1. one script lists which hashes the store already has (and re-applies the mode of those present);
2. each missing file is uploaded to ``store/.tmp-<sha256>-<random>``;
3. one script verifies every upload's hash *on the device*, sets its mode, renames it onto
   ``store/<sha256>`` (``mv`` within one directory is an atomic ``rename(2)``), and makes the named links
   (``<workdir>/<name>`` -> ``store/<sha256>``) that give files the names the engine expects
   (split GGUF shards find each other by name).

The device-side hash is computed with the first of ``sha256sum`` (GNU coreutils, busybox, Android
toybox, Termux), ``shasum -a 256`` (macOS, perl) and ``openssl dgst -sha256 -r`` that exists. A
mismatch deletes the upload and raises :class:`~bmoe_ci.farm.errors.InfraError` (kind ``push``). A warm
re-run (everything present) uploads nothing: :attr:`PushReport.bytes_pushed` is 0.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from .errors import InfraError
from .transport import Transport

STORE = "store"

_hash_cache: dict[tuple[str, int, int, int], str] = {}


def sha256_file(path: str | os.PathLike[str]) -> str:
    """sha256 of a local file (cached by path, size, mtime and inode)."""
    st = os.stat(path)
    key = (os.fspath(path), st.st_size, st.st_mtime_ns, st.st_ino)
    if key not in _hash_cache:
        h = hashlib.sha256()
        with open(path, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
        _hash_cache[key] = h.hexdigest()
    return _hash_cache[key]


@dataclass(frozen=True)
class PushItem:
    """A file to push. ``name``: also make ``<workdir>/<name>`` point at it (relative, no ``..``)."""

    local: Path
    name: str | None = None
    executable: bool = False


@dataclass
class PushedFile:
    local: Path
    sha256: str
    size: int
    store_path: str  #: ``<workdir>/store/<sha256>``
    path: str  #: the path to use on the device: the named link if any, else the store path
    pushed_bytes: int  #: 0 when the store already had it


@dataclass
class PushReport:
    device: str
    files: list[PushedFile] = field(default_factory=list)

    @property
    def bytes_pushed(self) -> int:
        return sum(f.pushed_bytes for f in self.files)

    @property
    def uploaded(self) -> int:
        return sum(1 for f in self.files if f.pushed_bytes)

    def path_of(self, local_or_name: str | os.PathLike[str]) -> str:
        """The device path of a pushed file, by its local path or its link name."""
        key = os.fspath(local_or_name)
        for f in self.files:
            if os.fspath(f.local) == key or f.path.endswith("/" + key):
                return f.path
        raise KeyError(key)


_CHECK = r"""
d=$1; shift
mkdir -p "$d" || exit 3
while [ $# -ge 2 ]; do
  if [ -f "$d/$1" ]; then chmod "$2" "$d/$1" 2>/dev/null; echo "have $1"; fi
  shift 2
done
"""

_COMMIT = r"""
d=$1; shift
hashit() {
  { sha256sum "$1" 2>/dev/null || shasum -a 256 "$1" 2>/dev/null || openssl dgst -sha256 -r "$1" 2>/dev/null; } \
    | cut -c1-64
}
status=0
while [ $# -ge 4 ]; do
  case $1 in
  put)
    tmp=$2; want=$3; mode=$4
    got=$(hashit "$d/$tmp")
    if [ -z "$got" ]; then rm -f "$d/$tmp"; echo "nohash $want"; status=3
    elif [ "$got" != "$want" ]; then rm -f "$d/$tmp"; echo "mismatch $want $got"; status=3
    elif chmod "$mode" "$d/$tmp" && mv -f "$d/$tmp" "$d/$want"; then echo "stored $want"
    else rm -f "$d/$tmp"; echo "failed $want"; status=3
    fi;;
  link)
    link=$2; target=$3
    mkdir -p "$(dirname "$link")" && ln -sfn "$target" "$link" || { echo "nolink $link"; status=3; };;
  esac
  shift 4
done
exit $status
"""


def _check_name(name: str) -> str:
    p = PurePosixPath(name)
    if p.is_absolute() or ".." in p.parts or not p.parts or name.endswith("/"):
        raise ValueError(f"push name {name!r} must be a relative path without '..'")
    return str(p)


def push(
    transport: Transport,
    items: Iterable[PushItem | str | os.PathLike[str]],
    *,
    progress: Callable[[str], None] | None = None,
    timeout: float = 600.0,
) -> PushReport:
    """Push files into the device's content-addressed store; see the module docstring.

    Raises :class:`InfraError` (``push``, ``transfer``, ``disconnect``, ...) on any failure.
    """
    dev = transport.device.name
    norm = [it if isinstance(it, PushItem) else PushItem(Path(it)) for it in items]
    store = transport.path(STORE)
    entries: list[tuple[PushItem, str, int]] = []
    for it in norm:
        if it.name is not None:
            _check_name(it.name)
        try:
            entries.append((it, sha256_file(it.local), it.local.stat().st_size))
        except OSError as exc:
            raise ValueError(f"cannot read {it.local}: {exc.strerror}") from None
    modes = {}
    for it, sha, _ in entries:
        modes[sha] = "555" if (it.executable or modes.get(sha) == "555") else "444"

    args: list[str] = [store]
    for sha, mode in modes.items():
        args += [sha, mode]
    r = transport.sh(_CHECK, *args, timeout=timeout).raise_for_infra()
    if not r.ok:
        raise InfraError(dev, "push", f"cannot prepare store {store}: {r.stderr.decode(errors='replace').strip()}")
    present = {line.split()[1] for line in r.stdout.decode().splitlines() if line.startswith("have ")}

    report = PushReport(dev)
    commit: list[str] = [store]
    uploaded: set[str] = set()
    for it, sha, size in entries:
        pushed = 0
        if sha not in present and sha not in uploaded:
            tmp = f".tmp-{sha}-{secrets.token_hex(4)}"
            if progress:
                progress(f"pushing {it.local.name} ({size / 1048576:.1f} MiB)")
            pushed = transport.put(it.local, posixpath.join(store, tmp))
            uploaded.add(sha)
            commit += ["put", tmp, sha, modes[sha]]
        store_path = posixpath.join(store, sha)
        path = store_path
        if it.name is not None:
            path = transport.path(it.name)
            target = posixpath.relpath(store_path, posixpath.dirname(path))
            commit += ["link", path, target, "-"]
        report.files.append(PushedFile(it.local, sha, size, store_path, path, pushed))
    if len(commit) > 1:
        r = transport.sh(_COMMIT, *commit, timeout=timeout).raise_for_infra()
        out = r.stdout.decode(errors="replace").splitlines()
        bad = [line for line in out if not line.startswith("stored ")]
        if bad or not r.ok:
            first = bad[0].split() if bad else ["failed", "?"]
            if first[0] == "mismatch":
                reason = f"hash mismatch after upload: expected {first[1]}, the device computed {first[2]}"
            elif first[0] == "nohash":
                reason = "no sha256 tool on the device (need sha256sum, shasum or openssl)"
            elif first[0] == "nolink":
                reason = f"cannot create link {first[1]}"
            else:
                reason = f"cannot store {first[1]}: {r.stderr.decode(errors='replace').strip()}"
            raise InfraError(dev, "push", reason)
    return report
