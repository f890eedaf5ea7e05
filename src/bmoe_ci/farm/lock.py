"""A per-device lease held for a whole test session.

The lease is the directory ``<workdir>/.bmoe-ci-lock`` (``mkdir`` is atomic on every POSIX filesystem,
local or on the device) holding one file, ``owner``: a JSON line with the controller's host name and
boot id, its pid (and that pid's start time), the run id, the start time, a heartbeat and the lease's
TTL. While held, :class:`Heartbeat` renews it from a background thread of the controller, through its
own connection (so an engine command running on the session's connection never delays it), every
TTL/4. A controller that dies stops renewing it: the lease expires within its TTL.

* A second run gets :class:`~bmoe_ci.farm.errors.DeviceBusy`: ``busy, held by <run> (pid <pid> on
  <host>) since <time>; heartbeat <n>s ago, expires in <m>s``, or polls until ``wait`` seconds have
  passed (saying so every 10 s).
* A lock is *stale*, and is broken, when its owner ran on this very machine (same host name and boot
  id) and that process is gone (pid dead, or reused by another process), or when this controller has
  itself watched it for the holder's TTL (bounded to [:data:`MIN_TTL`, :data:`MAX_TTL`]) on its own
  monotonic clock without seeing it renewed. The holder's wall-clock heartbeat is only a hint (another
  machine's clock need not agree with ours): it decides whether a busy lease is watched past ``wait``,
  never whether it is broken. Every break is recorded in :attr:`DeviceLock.broke` with the holder and
  why. Breaking renames the directory away only if its owner is still the stale one read a moment
  before (a narrow race remains between that read and the rename; the rename itself is atomic).
* :func:`force_unlock` (``bmoe-ci farm unlock DEVICE --force``) breaks a lease whatever its state and
  appends an audit line to ``<workdir>/.bmoe-ci-audit.log``.
* The lease belongs to the :class:`DeviceLock` that took it (the session
  :func:`~bmoe_ci.farm.session.open_session` opened with ``lock=True``): nothing else renews or
  releases it. Another lock of the same run id is one more run for it: busy.
* :meth:`DeviceLock.release` removes the lock only if it is still ours; an ``atexit`` hook releases
  locks a crashed session forgot.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import math
import os
import secrets
import socket
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import asdict, dataclass

from .errors import DeviceBusy, InfraError
from .pids import pid_alive
from .transports import Transport, name_script

LOCK_DIR = ".bmoe-ci-lock"
#: Seconds a lease lives without a heartbeat (a farm file can set ``lease_ttl`` per device).
DEFAULT_TTL = 180.0
AUDIT_LOG = ".bmoe-ci-audit.log"


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            return fh.read().strip()
    except OSError:
        return ""


def _pid_start(pid: int) -> str | None:
    """Start time of a process in clock ticks since boot (field 22 of /proc/PID/stat), or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    # the command name (field 2) may contain spaces and parentheses: split after its last ')'
    rest = data[data.rfind(b")") + 2 :].split()
    return rest[19].decode() if len(rest) > 19 else None


@dataclass(frozen=True)
class LockOwner:
    host: str
    boot: str
    pid: int
    pid_start: str | None
    run_id: str
    since: float
    beat: float
    token: str
    ttl: float = DEFAULT_TTL
    seq: int = 0  #: renewals so far: a lease that is alive changes with each, whatever the clocks say

    @classmethod
    def mine(cls, run_id: str, ttl: float = DEFAULT_TTL) -> LockOwner:
        now = time.time()
        return cls(
            socket.gethostname(),
            _boot_id(),
            os.getpid(),
            _pid_start(os.getpid()),
            run_id,
            now,
            now,
            secrets.token_hex(8),
            ttl,
        )

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> LockOwner | None:
        try:
            d = json.loads(text)
            return cls(
                str(d["host"]),
                str(d.get("boot", "")),
                int(d["pid"]),
                d.get("pid_start"),
                str(d["run_id"]),
                float(d["since"]),
                float(d.get("beat", d["since"])),
                str(d.get("token", "")),
                float(d.get("ttl", DEFAULT_TTL)),
                int(d.get("seq", 0)),
            )
        except (ValueError, KeyError, TypeError, OverflowError):
            return None

    def describe(self) -> str:
        return f"{self.run_id} (pid {self.pid} on {self.host})"

    @property
    def since_iso(self) -> str:
        return time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(self.since))

    def lease_state(self, now: float | None = None) -> str:
        """``heartbeat 12s ago, expires in 168s`` (or ``expired 5s ago``)."""
        now = time.time() if now is None else now
        age = now - self.beat
        left = self.ttl - age
        expiry = f"expires in {left:.0f}s" if left >= 0 else f"expired {-left:.0f}s ago"
        return f"heartbeat {age:.0f}s ago, {expiry} (ttl {self.ttl:.0f}s)"

    def bounded_ttl(self, fallback: float) -> float:
        """The holder's TTL, finite and within [:data:`MIN_TTL`, :data:`MAX_TTL`] (``fallback``, ours, for
        one that is not a number): a lease can never be made to live for ever."""
        ttl = self.ttl if math.isfinite(self.ttl) and self.ttl > 0 else fallback
        return min(max(ttl, MIN_TTL), MAX_TTL)

    def looks_stale(self, ttl: float, now: float | None = None) -> bool:
        """By the wall clocks (the holder's heartbeat against ours): no heartbeat for the TTL, one from the
        future, or one that is not a number. Only a hint: the clocks of two machines need not agree, so
        a lease is broken on what this controller itself saw (:meth:`DeviceLock.acquire`)."""
        now = time.time() if now is None else now
        beat = self.beat
        return not math.isfinite(beat) or now - beat > ttl or beat - now > ttl

    def stale_reason(self, ttl: float | None = None, now: float | None = None) -> str | None:
        """Why this lock may be broken at once, from facts of this machine alone (its holder ran here and
        its process is gone), or None. A holder elsewhere is judged by watching its heartbeat
        (:meth:`DeviceLock.acquire`), never by comparing its clock with ours."""
        if self.host == socket.gethostname() and self.boot and self.boot == _boot_id():
            if not pid_alive(self.pid):
                return f"its process {self.pid} on this machine is gone"
            if self.pid_start and _pid_start(self.pid) not in (None, self.pid_start):
                return f"its process {self.pid} on this machine is gone (pid reused)"
        return None


#: Bounds on any lease's TTL, whatever its owner file says.
MIN_TTL = 4.0
MAX_TTL = 86400.0

_ACQUIRE = name_script(
    r"""
d=$1; owner=$2
if mkdir "$d" 2>/dev/null; then
  if printf '%s\n' "$owner" > "$d/owner"; then echo ACQUIRED; else rmdir "$d" 2>/dev/null; echo NOWRITE; fi
  exit 0
fi
echo BUSY
if [ -n "$(find "$d" -prune -mmin +$3 2>/dev/null)" ]; then echo OLD; fi
cat "$d/owner" 2>/dev/null
exit 0
""",
    "lease acquire",
)

_BREAK = name_script(
    r"""
d=$1; expect=$2; grave=$3
cur=$(cat "$d/owner" 2>/dev/null)
if [ "$cur" = "$expect" ] && mv "$d" "$grave" 2>/dev/null; then rm -rf "$grave"; echo BROKEN; fi
""",
    "lease break",
)

_REWRITE = name_script(
    r"""
d=$1; expect=$2; new=$3
cur=$(cat "$d/owner" 2>/dev/null)
if [ "$cur" != "$expect" ]; then echo NOTOURS; exit 0; fi
if [ "$new" = "-" ]; then rm -rf "$d" && echo RELEASED
else printf '%s\n' "$new" > "$d/owner.tmp" && mv -f "$d/owner.tmp" "$d/owner" && echo REFRESHED; fi
""",
    "lease rewrite",
)


def lease_deadline(transport: Transport) -> float:
    """The deadline of one lease command (acquire, heartbeat, release, status): the device's
    ``connect_timeout`` (at least 2 s). These are tiny; a link that cannot do one in that time is hung,
    and a run ending on a hung device waits that long for each, not minutes."""
    return max(2.0, float(transport.device.connect_timeout))


_live_locks: weakref.WeakSet[DeviceLock] = weakref.WeakSet()


@atexit.register
def _release_all() -> None:  # pragma: no cover - exercised at interpreter exit
    for lock in list(_live_locks):
        with contextlib.suppress(Exception):
            lock.release()


class DeviceLock:
    """The session lock of one device, taken through its transport."""

    def __init__(
        self,
        transport: Transport,
        run_id: str,
        *,
        ttl: float = DEFAULT_TTL,
        progress: Callable[[str], None] | None = None,
    ):
        self.transport = transport
        self.progress = progress
        self.run_id = run_id
        self.ttl = ttl
        self.owner: LockOwner | None = None  #: set while we hold the lock
        self.broke: list[str] = []  #: reasons of stale locks we broke
        self._refreshing = threading.Lock()  # a heartbeat never rewrites a lease being released

    @property
    def path(self) -> str:
        return self.transport.path(LOCK_DIR)

    @property
    def held(self) -> bool:
        return self.owner is not None

    def _sh(self, script: str, *args: str):
        r = self.transport.sh(script, *args, timeout=lease_deadline(self.transport)).raise_for_infra()
        if not r.ok:
            raise InfraError(
                self.transport.device.name,
                "setup",
                f"lock {self.path}: {r.stderr.decode(errors='replace').strip() or r.describe()}",
            )
        return r.stdout.decode(errors="replace")

    def acquire(self, wait: float = 0.0, poll: float = 1.0) -> DeviceLock:
        """Take the lock; poll up to ``wait`` seconds while it is busy.

        A lease is broken when its holder ran on this machine and its process is gone, or when this
        controller has itself watched it for the holder's (bounded) TTL, on its own monotonic clock,
        without seeing it renewed. A lease that looks stale by the wall clocks (an old heartbeat, one
        from the future, an unreadable owner) is watched that long even past ``wait``: the other
        controller's clock may be off, and a live run's lease is never broken for it.

        Raises :class:`DeviceBusy` (an :class:`InfraError`) when still busy at the end."""
        if self.held:
            return self
        deadline = time.monotonic() + wait
        name = self.transport.device.name
        said = 0.0
        seen_raw: str | None = None
        seen_since = 0.0
        renewed = False
        while True:
            me = LockOwner.mine(self.run_id, self.ttl)
            out = self._sh(_ACQUIRE, self.path, me.to_json(), str(max(1, int(self.ttl // 60)))).splitlines()
            if out and out[0] == "ACQUIRED":
                self.owner = me
                _live_locks.add(self)
                return self
            if out and out[0] == "NOWRITE":
                raise InfraError(name, "setup", f"cannot write lock owner in {self.path}")
            old = len(out) > 1 and out[1] == "OLD"
            raw = "\n".join(out[2 if old else 1 :]).strip()
            holder = LockOwner.from_json(raw)
            now = time.monotonic()
            if raw != seen_raw:  # first sight, or renewed since: it is watched afresh
                renewed = seen_raw is not None
                seen_raw, seen_since = raw, now
            ttl = holder.bounded_ttl(self.ttl) if holder is not None else min(max(self.ttl, MIN_TTL), MAX_TTL)
            quiet = now - seen_since
            reason = holder.stale_reason() if holder is not None else None
            if reason is None and quiet >= ttl:
                who = "its holder" if holder is not None else "an unreadable owner"
                reason = f"{who} did not renew it for {quiet:.0f}s by this controller's own clock (ttl {ttl:.0f}s)"
                if holder is not None:
                    reason += f", held since {holder.since_iso}"
            if reason:
                grave = f"{self.path}.stale-{secrets.token_hex(4)}"
                if "BROKEN" in self._sh(_BREAK, self.path, raw, grave):
                    who = holder.describe() if holder else "unknown owner"
                    self.broke.append(f"broke stale lock of {who}: {reason}")
                    if self.progress:
                        self.progress(self.broke[-1])
                seen_raw, renewed = None, False
                continue  # retry at once (someone else may have broken it first: fine)
            # watched past `wait` only while it looks stale and was not seen renewed (then it is alive)
            suspect = (holder is None or holder.looks_stale(ttl)) and not renewed
            if now >= deadline and not suspect:
                raise DeviceBusy(name, holder.describe(), holder.since_iso, holder.lease_state())  # type: ignore[union-attr]
            if self.progress and now - said >= 10:
                said = now
                who = holder.describe() if holder else "an unknown owner"
                state = f"; {holder.lease_state()}" if holder else ""
                if now >= deadline:
                    self.progress(
                        f"the lock held by {who} looks stale{state}: watching it up to {ttl - quiet:.0f}s more "
                        "before breaking it (another machine's clock is not ours to trust)"
                    )
                else:
                    self.progress(f"waiting up to {deadline - now:.0f}s more for the lock held by {who}{state}")
            step = min(10.0, max(poll, ttl / 16))
            time.sleep(min(step, max(0.05, (deadline if now < deadline else seen_since + ttl) - time.monotonic())))

    def refresh(self, transport: Transport | None = None) -> None:
        """Renew the heartbeat (through ``transport`` if given: the heartbeat thread's own link)."""
        with self._refreshing:
            owner = self.owner
            if owner is None:
                return
            new = LockOwner(**{**asdict(owner), "beat": time.time(), "seq": owner.seq + 1})
            t = transport or self.transport
            r = t.sh(_REWRITE, self.path, owner.to_json(), new.to_json(), timeout=lease_deadline(t)).raise_for_infra()
            out = r.stdout.decode(errors="replace")
            if "REFRESHED" in out:
                if self.owner is owner:  # not released meanwhile
                    self.owner = new
            elif self.owner is owner:
                self.owner = None
                raise InfraError(self.transport.device.name, "busy", "our lock was taken over by another run")

    def release(self) -> None:
        """Remove the lock if it is still ours."""
        with self._refreshing:
            owner, self.owner = self.owner, None
        _live_locks.discard(self)
        if owner is not None:
            self._sh(_REWRITE, self.path, owner.to_json(), "-")

    def abandon(self) -> None:
        """Give the lease up without a word to the device (it does not answer): it expires after its TTL,
        and nothing (not the exit hook either) waits on the device for it."""
        self.owner = None  # not under the renewal lock: a renewal hung on the device holds it
        _live_locks.discard(self)

    def __enter__(self) -> DeviceLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def read_lock(transport: Transport) -> LockOwner | None:
    """The current holder of a device's lock, if any (for ``farm status``)."""
    r = transport.sh(
        'cat "$1/owner" 2>/dev/null', transport.path(LOCK_DIR), timeout=lease_deadline(transport)
    ).raise_for_infra()
    return LockOwner.from_json(r.stdout.decode(errors="replace").strip()) if r.ok else None


class Heartbeat:
    """Renews one lease every ``ttl / 4`` seconds from a daemon thread, through its own transport
    (opened lazily; never the session's, which an engine command may hold for minutes).

    A failed renewal is retried at the next beat; ``lost`` says why the lease is gone if another run
    took it over."""

    def __init__(self, lock: DeviceLock, *, progress: Callable[[str], None] | None = None):
        self.lock = lock
        self.progress = progress
        self.lost: str | None = None
        #: the last renewal got no answer (a hung device or link): releasing would only wait as long again
        self.unanswered = False
        self._stop = threading.Event()
        self._transport: Transport | None = None
        self._thread = threading.Thread(
            target=self._loop, name=f"bmoe-ci-heartbeat-{lock.transport.device.name}", daemon=True
        )

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def _loop(self) -> None:
        from .transports import open_transport

        interval = max(0.5, self.lock.ttl / 4)
        while not self._stop.wait(interval):
            if self.lock.owner is None:
                return
            try:
                if self._transport is None:
                    self._transport = open_transport(self.lock.transport.device)
                    self._transport.workdir = self.lock.transport.workdir
                self.lock.refresh(self._transport)
                self.unanswered = False
            except InfraError as exc:
                self.unanswered = exc.kind == "timeout"
                if exc.kind == "busy":
                    self.lost = exc.reason
                    if self.progress:
                        self.progress(f"lease lost: {exc.reason}")
                    return
                if self.progress:
                    self.progress(f"heartbeat failed (retrying in {interval:.0f}s): {exc}")
                if self._transport is not None:
                    self._transport.close()
                    self._transport = None

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            # a renewal under way ends within its own deadline (plus the controller's grace); the release
            # waits for it anyway (it takes the lease's lock), unless the device stopped answering
            self._thread.join(timeout=1.0 if self.unanswered else lease_deadline(self.lock.transport) + 15)
        if self._transport is not None:
            with contextlib.suppress(Exception):
                self._transport.close()


def force_unlock(transport: Transport, *, actor: str) -> LockOwner | None:
    """Break the device's lease whatever its state; append an audit line naming ``actor`` and what
    was broken to ``<workdir>/.bmoe-ci-audit.log``. Returns the owner it broke (None: no lease)."""
    path = transport.path(LOCK_DIR)
    r = transport.sh('cat "$1/owner" 2>/dev/null', path, timeout=lease_deadline(transport)).raise_for_infra()
    raw = r.stdout.decode(errors="replace").strip()
    holder = LockOwner.from_json(raw)
    if not raw and not transport.sh('[ -d "$1" ]', path, timeout=lease_deadline(transport)).raise_for_infra().ok:
        return None
    what = f"{holder.describe()} since {holder.since_iso}, {holder.lease_state()}" if holder else "unreadable owner"
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    line = f"{stamp} force-unlock by {actor}: broke the lease of {what}"
    grave = f"{path}.forced-{secrets.token_hex(4)}"
    script = 'mv "$1" "$2" 2>/dev/null && rm -rf "$2"; printf "%s\\n" "$3" >> "$4"'
    r = transport.sh(
        script, path, grave, line, transport.path(AUDIT_LOG), timeout=lease_deadline(transport)
    ).raise_for_infra()
    if not r.ok:
        raise InfraError(transport.device.name, "setup", f"cannot write {AUDIT_LOG}: {r.stderr.decode().strip()}")
    return holder or LockOwner("?", "", 0, None, "unreadable owner", 0.0, 0.0, "")
