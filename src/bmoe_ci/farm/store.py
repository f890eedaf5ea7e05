"""Content-addressed, verified store: ``<workdir>/store/<sha256>`` on the device.

A push costs two shell round trips plus the uploads (more only when a file arrives corrupted):

1. one script hashes, *on the device*, every file of the manifest the store already has: a file whose
   content matches its name is kept (and its mode re-applied); one that does not is reported
   (expected and found hash), deleted and uploaded again. The same script can sweep leftover upload
   temporaries (``store/.tmp-*``, from an interrupted push) and append the manifest's hashes to the
   run's use list ``<workdir>/runs/<run id>`` (what :func:`gc` keeps);
2. each missing file is uploaded to ``store/.tmp-<sha256>-<random>``;
3. one script verifies every upload's hash on the device, sets its mode, renames it onto
   ``store/<sha256>`` (``mv`` within one directory is an atomic ``rename(2)``: a name in the store is
   always complete and verified), and makes the named links (``<workdir>/<name>`` -> ``store/<sha256>``)
   that give files the names the engine expects (split GGUF shards find each other by name).

A file gets one second chance: after a mismatch (found in the store, or after its upload) it is
uploaded and verified once more; a second mismatch raises :class:`~bmoe_ci.farm.errors.InfraError`
(kind ``push``) naming the file and both hashes. Every mismatch is in :attr:`PushReport.mismatches`.
So every file a push returns was verified in this push, and nothing unverified is ever served.

The device-side hash is computed with the first of ``sha256sum`` (GNU coreutils, busybox, Android
toybox, Termux), ``shasum -a 256`` (macOS, perl) and ``openssl dgst -sha256 -r`` that exists. A
warm re-run (everything present and intact) uploads nothing: :attr:`PushReport.bytes_pushed` is 0.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from .deadline import KILL_LEFTOVERS_FN
from .errors import InfraError
from .transports import Transport, name_script

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


@dataclass(frozen=True)
class Mismatch:
    """A file whose content on the device was not what its hash says."""

    name: str  #: the local file's name
    expected: str
    found: str  #: the hash the device computed ("" when the file could not be read)
    where: str  #: ``store`` (a stored copy went bad) or ``upload`` (it arrived corrupted)

    def __str__(self) -> str:
        what = "stored copy" if self.where == "store" else "upload"
        return f"{self.name}: {what} has sha256 {self.found or '(unreadable)'}, expected {self.expected}"


@dataclass
class PushReport:
    device: str
    files: list[PushedFile] = field(default_factory=list)
    mismatches: list[Mismatch] = field(default_factory=list)  #: every mismatch seen (then re-pushed)
    swept: int = 0  #: leftover upload temporaries removed

    @property
    def verified(self) -> int:
        """Distinct files whose hash was checked on the device in this push."""
        return len({f.sha256 for f in self.files})

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


HASHIT = r"""
hashit() {
  # the file on stdin: a tool prints a name it was given escaped ("\HASH" for a name with a newline)
  { sha256sum <"$1" 2>/dev/null || shasum -a 256 <"$1" 2>/dev/null || openssl dgst -sha256 -r <"$1" 2>/dev/null; } \
    | cut -c1-64
}
"""

#: Shell function ``ours DIR KIND``: succeeds when DIR is a directory bmoe-ci made (it carries the marker
#: file ``.bmoe-ci``), creating and marking it when absent. An existing directory without the marker is
#: adopted (and marked) only when everything in it is what bmoe-ci would have put there (``store``: files
#: named by their sha256 and upload temporaries; ``runs``: use lists, files of sha256 lines), as a store of
#: a bmoe-ci that wrote no marker is; anything else, or a symlink, prints ``notours DIR WHY`` and fails:
#: nothing bmoe-ci did not make is deleted, and no symlink leads it out of the work directory.
OURS_FN = r"""
ours() {
  if [ -L "$1" ]; then echo "notours $1 is a symlink"; return 1; fi
  if [ ! -e "$1" ]; then
    mkdir -p "$1" && : > "$1/.bmoe-ci" && return 0
    echo "notours $1 cannot be created"; return 1
  fi
  if [ ! -d "$1" ]; then echo "notours $1 is not a directory"; return 1; fi
  if [ -f "$1/.bmoe-ci" ] && [ ! -L "$1/.bmoe-ci" ]; then return 0; fi
  for f in "$1"/* "$1"/.[!.]* "$1"/..?*; do
    [ -e "$f" ] || [ -L "$f" ] || continue
    b=${f##*/}
    if [ -L "$f" ] || [ ! -f "$f" ]; then echo "notours $1 holds $b, which bmoe-ci did not make"; return 1; fi
    case $2 in
      store) case $b in .tmp-*) continue;; esac
             printf '%s\n' "$b" | grep -qx '[0-9a-f]\{64\}' && continue;;
      runs) grep -qvx '[0-9a-f]\{64\}' "$f" || continue;;
    esac
    echo "notours $1 holds $b, which bmoe-ci did not make"; return 1
  done
  : > "$1/.bmoe-ci"
}
"""

# $1 store, $2 sweep (1: remove .tmp-* leftovers), $3 use list ("-": none), then pairs SHA MODE.
_CHECK = name_script(
    HASHIT
    + KILL_LEFTOVERS_FN
    + OURS_FN
    + r"""
d=$1; sweep=$2; uses=$3; shift 3
ours "$d" store || exit 4
command -v sha256sum >/dev/null 2>&1 || command -v shasum >/dev/null 2>&1 \
  || command -v openssl >/dev/null 2>&1 || { echo nohash; exit 3; }
if [ "$sweep" = 1 ]; then
  kill_leftovers "$d"
  for f in "$d"/.tmp-*; do [ -f "$f" ] || [ -L "$f" ] || continue; rm -f "$f" && echo swept; done
fi
if [ "$uses" != - ]; then
  ours "$(dirname "$uses")" runs || exit 4
  if [ -L "$uses" ] || { [ -e "$uses" ] && [ ! -f "$uses" ]; }; then echo "notours $uses is not a use list"; exit 4; fi
  : >> "$uses" || exit 3
fi
df -Pk "$d" 2>/dev/null | tail -n 1 | sed 's/^/df /'
while [ $# -ge 2 ]; do
  [ "$uses" != - ] && echo "$1" >> "$uses"
  if [ -f "$d/$1" ] && [ ! -L "$d/$1" ]; then
    got=$(hashit "$d/$1")
    if [ "$got" = "$1" ]; then chmod "$2" "$d/$1" 2>/dev/null; echo "have $1"
    else rm -f "$d/$1"; echo "corrupt $1 ${got:--}"
    fi
  fi
  shift 2
done
""",
    "store check",
)

_COMMIT = name_script(
    HASHIT
    + r"""
d=$1; shift
status=0
while [ $# -ge 4 ]; do
  case $1 in
  put)
    tmp=$2; want=$3; mode=$4
    got=$(hashit "$d/$tmp")
    if [ -z "$got" ]; then rm -f "$d/$tmp"; echo "nohash $want"; status=3
    elif [ "$got" != "$want" ]; then rm -f "$d/$tmp"; echo "mismatch $want $got"
    elif chmod "$mode" "$d/$tmp" && mv -f "$d/$tmp" "$d/$want"; then echo "stored $want"
    else rm -f "$d/$tmp"; echo "failed $want"; status=3
    fi;;
  link)
    # $2 the link, $3 its target, $4 the work directory: no component between them may be a symlink
    # (it would lead out), and an existing file there that is not a link is left alone
    link=$2; target=$3; top=$4; p=$(dirname "$link"); bad=
    while [ "$p" != "$top" ] && [ "${#p}" -gt "${#top}" ]; do [ -L "$p" ] && bad=$p; p=$(dirname "$p"); done
    if [ -n "$bad" ]; then echo "notours $bad is a symlink"; status=4
    elif [ -e "$link" ] && [ ! -L "$link" ]; then echo "notours $link is not a link bmoe-ci made"; status=4
    else mkdir -p "$(dirname "$link")" && ln -sfn "$target" "$link" || { echo "nolink $link"; status=3; }
    fi;;
  esac
  shift 4
done
exit $status
""",
    "store commit",
)


def _refuse_foreign(device: str, stdout: bytes) -> None:
    """An ``ours`` refusal (see :data:`OURS_FN`) is a ``setup`` error naming the directory and why."""
    for line in stdout.decode(errors="replace").splitlines():
        if line.startswith("notours "):
            raise InfraError(
                device,
                "setup",
                f"{line[len('notours ') :]}: bmoe-ci deletes and follows nothing it did not make; give the "
                "device a work directory of its own (or move that away)",
            )


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
    timeout: float | None = None,
    sweep: bool = False,
    uses: str | None = None,
    min_free_mb: int | None = None,
) -> PushReport:
    """Push files into the device's verified store; see the module docstring.

    ``sweep``: remove leftover upload temporaries first (only safe while holding the device lock).
    ``uses``: a device path to append the manifest's hashes to (the run's use list, for :func:`gc`).
    ``min_free_mb``: refuse (InfraError ``preflight``) before uploading anything when the uploads would
    leave less free space than that in the store's filesystem.
    Raises :class:`InfraError` (``push``, ``transfer``, ``disconnect``, ...) on any failure.
    """
    dev = transport.device.name
    timeout = float(transport.device.command_timeout) if timeout is None else timeout
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
    modes: dict[str, str] = {}
    first: dict[str, PushItem] = {}
    for it, sha, _ in entries:
        modes[sha] = "555" if (it.executable or modes.get(sha) == "555") else "444"
        first.setdefault(sha, it)

    args: list[str] = [store, "1" if sweep else "0", uses or "-"]
    for sha, mode in modes.items():
        args += [sha, mode]
    r = transport.sh(_CHECK, *args, timeout=timeout).raise_for_infra()
    lines = [line.split() for line in r.stdout.decode(errors="replace").splitlines() if line.strip()]
    _refuse_foreign(dev, r.stdout)
    if ["nohash"] in lines:
        raise InfraError(dev, "push", "no sha256 tool on the device (need sha256sum, shasum or openssl)")
    if not r.ok:
        raise InfraError(dev, "push", f"cannot prepare store {store}: {r.stderr.decode(errors='replace').strip()}")
    report = PushReport(dev, swept=sum(1 for w in lines if w == ["swept"]))
    present = {w[1] for w in lines if w[0] == "have"}
    for w in lines:
        if w[0] == "corrupt":
            report.mismatches.append(Mismatch(first[w[1]].local.name, w[1], w[2].strip("-"), "store"))

    missing = [sha for sha in modes if sha not in present]
    if min_free_mb is not None:
        need = sum(size for sha, size in {s: z for _, s, z in entries}.items() if sha in missing)
        fields = next((w[1:] for w in lines if w[0] == "df"), [])
        try:
            avail_kb = int(fields[3] if len(fields) == 6 else fields[-3])
        except (IndexError, ValueError):
            raise InfraError(dev, "preflight", f"cannot read free space of {store} from 'df -Pk'") from None
        if avail_kb * 1024 - need < min_free_mb * 1048576:
            raise InfraError(
                dev,
                "preflight",
                f"only {avail_kb // 1024} MiB free in {store}; the push needs {need / 1048576:.1f} MiB and "
                f"{min_free_mb} MiB must stay free (min_free_mb): nothing was uploaded",
            )

    pushed: dict[str, int] = {}
    links: list[str] = []
    for it, sha, _size in entries:
        if it.name is not None:
            path = transport.path(it.name)
            target = posixpath.relpath(posixpath.join(store, sha), posixpath.dirname(path))
            links += ["link", path, target, transport.path()]
    while missing or links:
        commit: list[str] = [store]
        for sha in missing:
            it = first[sha]
            tmp = f".tmp-{sha}-{secrets.token_hex(4)}"
            if progress:
                progress(f"pushing {it.local.name} ({it.local.stat().st_size / 1048576:.1f} MiB)")
            pushed[sha] = pushed.get(sha, 0) + transport.put(it.local, posixpath.join(store, tmp))
            commit += ["put", tmp, sha, modes[sha]]
        commit += links
        links = []
        r = transport.sh(_COMMIT, *commit, timeout=timeout).raise_for_infra()
        out = [line.split() for line in r.stdout.decode(errors="replace").splitlines() if line.strip()]
        _refuse_foreign(dev, r.stdout)
        retry: list[str] = []
        for w in out:
            if w[0] == "mismatch":
                bad = Mismatch(first[w[1]].local.name, w[1], w[2], "upload")
                if any(m.expected == w[1] for m in report.mismatches):
                    report.mismatches.append(bad)
                    raise InfraError(dev, "push", f"hash mismatch again after re-pushing {bad}")
                report.mismatches.append(bad)
                retry.append(w[1])
        failed = [w for w in out if w[0] not in ("stored", "mismatch")]
        if failed or not r.ok:
            w = failed[0] if failed else ["failed", "?"]
            if w[0] == "nohash":
                reason = "no sha256 tool on the device (need sha256sum, shasum or openssl)"
            elif w[0] == "nolink":
                reason = f"cannot create link {w[1]}"
            else:
                reason = f"cannot store {w[1]}: {r.stderr.decode(errors='replace').strip()}"
            raise InfraError(dev, "push", reason)
        missing = retry

    for it, sha, size in entries:
        store_path = posixpath.join(store, sha)
        path = transport.path(it.name) if it.name is not None else store_path
        sent = pushed.pop(sha, 0)  # bytes count once, on the first item of that content
        report.files.append(PushedFile(it.local, sha, size, store_path, path, sent))
    return report


RUNS = "runs"

# $1 store, $2 runs dir, $3 how many use lists to keep. Newest use lists (by mtime) are kept; every
# stored file none of them names is removed, and printed with its size; upload temporaries too.
_GC = name_script(
    OURS_FN
    + r"""
s=$1; r=$2; keep=$3
ours "$s" store || exit 4
ours "$r" runs || exit 4
n=0
for f in $(ls -t "$r"); do
  [ -f "$r/$f" ] && [ ! -L "$r/$f" ] || continue
  n=$((n+1)); [ "$n" -gt "$keep" ] && rm -f "$r/$f"
done
for f in "$s"/.tmp-*; do [ -f "$f" ] || [ -L "$f" ] || continue; rm -f "$f" && echo "swept"; done
for f in "$s"/*; do
  [ -f "$f" ] && [ ! -L "$f" ] || continue
  b=${f##*/}
  printf '%s\n' "$b" | grep -qx '[0-9a-f]\{64\}' || continue
  if ! cat "$r"/* 2>/dev/null | grep -qx "$b"; then
    size=$(wc -c < "$f"); rm -f "$f" && echo "removed $b $size"
  fi
done
""",
    "store gc",
)


@dataclass
class GcReport:
    device: str
    removed: list[tuple[str, int]] = field(default_factory=list)  #: (sha256, bytes)
    swept: int = 0  #: leftover upload temporaries removed

    @property
    def freed(self) -> int:
        return sum(n for _, n in self.removed)


def gc(transport: Transport, keep_runs: int, *, timeout: float | None = None) -> GcReport:
    """Remove stored files that none of the last ``keep_runs`` runs used, and upload temporaries
    (hold the lock to call this).

    A run's use list ``<workdir>/runs/<run id>`` is written by :func:`push` (``uses=``)."""
    if keep_runs < 1:
        raise ValueError("keep_runs must be at least 1")
    timeout = float(transport.device.command_timeout) if timeout is None else timeout
    r = transport.sh(_GC, transport.path(STORE), transport.path(RUNS), str(keep_runs), timeout=timeout)
    r.raise_for_infra()
    _refuse_foreign(transport.device.name, r.stdout)
    if not r.ok:
        why = r.stderr.decode(errors="replace").strip()
        raise InfraError(transport.device.name, "setup", f"store gc failed: {why}")
    report = GcReport(transport.device.name)
    for line in r.stdout.decode(errors="replace").splitlines():
        w = line.split()
        if len(w) == 3 and w[0] == "removed":
            report.removed.append((w[1], int(w[2])))
        elif w == ["swept"]:
            report.swept += 1
    return report
