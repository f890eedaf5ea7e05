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
            except (OSError, ValueError):
                data = {}  # a damaged state file costs the counts, never a run
            yield data
            fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.path.parent)
            with os.fdopen(fd, "w") as fh:
                json.dump(data, fh, indent=2, sort_keys=True)
            os.replace(tmp, self.path)

    @staticmethod
    def _load(raw: dict | None) -> DeviceHealth:
        if not raw:
            return DeviceHealth()
        q = raw.get("quarantine")
        return DeviceHealth(int(raw.get("failures", 0)), str(raw.get("last_error", "")), Quarantine(**q) if q else None)

    def get(self, device: str, now: float | None = None) -> DeviceHealth:
        """The device's health; an expired quarantine is not reported."""
        now = time.time() if now is None else now
        with self._locked() as data:
            h = self._load(data.get(self._key(device)))
        if h.quarantine is not None and h.quarantine.until <= now:
            h.quarantine = None
        return h

    def peek(self, device: str, now: float | None = None) -> DeviceHealth:
        """Like :meth:`get`, but only reads: no lock file, no rewrite (for `pytest --collect-only`,
        which must leave the controller's state as it found it). Updates replace the file atomically,
        so an unlocked read sees a whole file."""
        now = time.time() if now is None else now
        try:
            data = json.loads(self.path.read_text()) if self.path.is_file() else {}
        except (OSError, ValueError):
            data = {}
        h = self._load(data.get(self._key(device)) if isinstance(data, dict) else None)
        if h.quarantine is not None and h.quarantine.until <= now:
            h.quarantine = None
        return h

    def record(self, device: Device, error: str | None, now: float | None = None) -> DeviceHealth:
        """Record one run's health check (``error`` None: it passed); quarantine the device after
        ``device.quarantine_after`` consecutive failures (0: never)."""
        now = time.time() if now is None else now
        with self._locked() as data:
            h = self._load(data.get(self._key(device.name)))
            if error is None:
                h = DeviceHealth()
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
