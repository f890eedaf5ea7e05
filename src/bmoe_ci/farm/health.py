"""Device health across runs, and quarantine.

A run records, for every device it tried, whether the device passed its health check (connect, lock,
push, preflight: reachable, arch, free space, ``engine --version``). A device that fails it on
``quarantine_after`` consecutive runs is *quarantined* for ``quarantine_hours``: runs skip it (saying
so in their summary) instead of reporting the same infrastructure error night after night.
``bmoe-ci farm status`` shows it and ``bmoe-ci farm release DEVICE`` lifts it; a run where the device
passes resets its count.

The state is one JSON file on the controller, ``<cache>/farm-health.json`` (``$BMOE_CI_CACHE``,
default ``<repo>/.cache/bmoe-ci``), keyed by the farm file's path and the device name; updates are
read-modify-write under an exclusive ``flock`` and an atomic rename, so concurrent runs lose nothing.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from bmoe_ci.paths import Places

from .model import Device

HEALTH_FILE = "farm-health.json"


@dataclass(frozen=True)
class Quarantine:
    reason: str
    since: float
    until: float

    def describe(self) -> str:
        until = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(self.until))
        return f"quarantined until {until}: {self.reason}"


@dataclass
class DeviceHealth:
    failures: int = 0  #: consecutive runs whose health check failed
    last_error: str = ""
    quarantine: Quarantine | None = None
    entry: str = ""  #: the fingerprint of the device's farm entry these counts are about


def entry_fingerprint(device: Device | str) -> str:
    """A device's farm entry, as a fingerprint: a changed entry (a corrected serial, host or key) is a
    device to check again, not one to go on refusing for what the old entry did. ``""`` for a bare name."""
    if isinstance(device, str):
        return ""
    data = device.model_dump(exclude={"source"})
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


class HealthBook:
    """The health state file of one farm (see the module docstring)."""

    def __init__(
        self,
        farm_path: str | os.PathLike[str] | None,
        state_file: str | os.PathLike[str] | None = None,
        places: Places | None = None,
    ):
        if state_file is None:
            state_file = (places or Places()).cache_dir() / HEALTH_FILE
        self.path = Path(state_file)
        self.farm = str(Path(farm_path).resolve()) if farm_path else "(no farm file)"

    def _key(self, device: str) -> str:
        return f"{self.farm}::{device}"

    @contextlib.contextmanager
    def _locked(self) -> Iterator[dict[str, dict]]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_name(self.path.name + ".lock"), "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                data = json.loads(self.path.read_text()) if self.path.is_file() else {}
            except (OSError, ValueError, RecursionError):
                data = {}  # a damaged state file costs the counts, never a run
            if not isinstance(data, dict):
                data = {}
            yield data
            fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.path.parent)
            with os.fdopen(fd, "w") as fh:
                json.dump(data, fh, indent=2, sort_keys=True)
            os.replace(tmp, self.path)

    @staticmethod
    def _load(raw: dict | None, entry: str = "") -> DeviceHealth:
        """The stored state, or a fresh one when it is unreadable or was about another farm entry."""
        if not isinstance(raw, dict) or not raw:
            return DeviceHealth(entry=entry)
        stored = str(raw.get("entry", ""))
        if entry and stored != entry:
            return DeviceHealth(entry=entry)  # the entry changed: check it again from scratch
        try:
            q = raw.get("quarantine")
            quarantine = Quarantine(str(q["reason"]), float(q["since"]), float(q["until"])) if q else None
            return DeviceHealth(int(raw.get("failures", 0)), str(raw.get("last_error", "")), quarantine, stored)
        except (KeyError, TypeError, ValueError):
            return DeviceHealth(entry=entry)

    def get(self, device: Device | str, now: float | None = None) -> DeviceHealth:
        """The device's health (for its current farm entry when given a :class:`Device`); an expired
        quarantine is not reported."""
        now = time.time() if now is None else now
        name = device if isinstance(device, str) else device.name
        with self._locked() as data:
            h = self._load(data.get(self._key(name)), entry_fingerprint(device))
        if h.quarantine is not None and h.quarantine.until <= now:
            h.quarantine = None
        return h

    def peek(self, device: Device | str, now: float | None = None) -> DeviceHealth:
        """Like :meth:`get`, but only reads: no lock file, no rewrite (for `pytest --collect-only`,
        which must leave the controller's state as it found it). Updates replace the file atomically,
        so an unlocked read sees a whole file."""
        now = time.time() if now is None else now
        name = device if isinstance(device, str) else device.name
        try:
            data = json.loads(self.path.read_text()) if self.path.is_file() else {}
        except (OSError, ValueError, RecursionError):
            data = {}
        h = self._load(data.get(self._key(name)) if isinstance(data, dict) else None, entry_fingerprint(device))
        if h.quarantine is not None and h.quarantine.until <= now:
            h.quarantine = None
        return h

    def record(self, device: Device, error: str | None, now: float | None = None) -> DeviceHealth:
        """Record one run's health check (``error`` None: it passed); quarantine the device after
        ``device.quarantine_after`` consecutive failures (0: never)."""
        now = time.time() if now is None else now
        entry = entry_fingerprint(device)
        with self._locked() as data:
            h = self._load(data.get(self._key(device.name)), entry)
            h.entry = entry
            if error is None:
                h = DeviceHealth(entry=entry)
            else:
                h.failures += 1
                h.last_error = error
                if device.quarantine_after and h.failures >= device.quarantine_after:
                    reason = f"failed its health check on {h.failures} consecutive runs; last: {error}"
                    h.quarantine = Quarantine(reason, now, now + device.quarantine_hours * 3600)
            data[self._key(device.name)] = asdict(h)
        return h

    def release(self, device: str) -> DeviceHealth:
        """Lift the quarantine and reset the count; returns the state before."""
        with self._locked() as data:
            before = self._load(data.pop(self._key(device), None))
        return before
