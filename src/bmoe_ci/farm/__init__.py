"""The farm: devices described in YAML, reached through one transport interface.

API (what the pytest plugin and the commands use)::

    from bmoe_ci import farm

    f = farm.load_farm()                     # default: the local farm's farm.yaml; FarmNotUp if not up
    f = farm.load_farm("devices/lab.yaml")   # or a farm file (FarmConfigError: FILE:LINE: KEY: why)
    devices = farm.select_devices(f, ["pool:nightly", "host"])   # --device syntax; SelectionError

    with farm.open_session(dev, run_id=rid, results_dir=out / dev.name,
                           engine=engine_path, build_id=bid,
                           files=[farm.PushItem(p, name=f"fixtures/{p.name}")]) as s:
        # connected, locked (DeviceBusy if held), pushed (s.pushed_bytes), preflighted (s.engine_version)
        r = s.run_engine(["run", "-m", s.file("fixtures/m.gguf"), "--json"], timeout=30)
        # timeout x device.timeout_scale, exec prefix applied; r.outcome: EXITED | SIGNALED | INFRA
        if r.outcome is farm.Ending.INFRA: ...            # JUnit error (r.infra: InfraError)
        elif r.outcome is farm.Ending.SIGNALED: ...       # engine crashed: gate failure
        s.pull(s.file("trace.csv"), "artifacts/trace.csv")  # inside results_dir, size and sha256 checked
    # lock released, transport closed

Names:

* :func:`load_farm`, :func:`load_farm_file`, :func:`device_from_spec` (farmfile: the loader);
  :class:`Farm`, :class:`Device`, :class:`TransportKeys` (model: the schema)
* :func:`select_devices` (``NAME``, comma lists, ``pool:``, ``arch:``, ``label:``, ``kind:``, ``os:``, ``all``)
* :func:`open_session` (the one way in: connect, lease, preflight, push, each step reported to
  ``on_step``), :class:`DeviceSession` (run_engine / run_plan / run / pull / read_files / gc / close)
* :func:`open_transport`, :class:`Transport`, :class:`RunResult`, :class:`Ending`, :func:`registry`
  (the transports, one module each in :mod:`bmoe_ci.farm.transports`: local, ssh, adb)
* :func:`push`, :class:`PushItem`, :class:`PushReport` (content-addressed store); :mod:`bmoe_ci.farm.pull`
  (verified reads back: ``pull``, ``read_files``)
* :func:`preflight`, :func:`check_lite`, :class:`PreflightReport`, :class:`EngineVersion`, :func:`parse_version`
* :class:`DeviceLock`, :func:`read_lock`
* errors: :class:`FarmError` > :class:`FarmConfigError`, :class:`SelectionError`, :class:`FarmNotUp`,
  :class:`MissingTool`, :class:`InfraError` > :class:`DeviceBusy`
* :mod:`bmoe_ci.farm.embedded`: ``state_dir``, ``farm_file`` (where the embedded local farm's file is;
  :mod:`bmoe_ci.standins.localfarm` brings it up)

The lease's owner is the session that took it (see :func:`open_session`): in a gate run the
controller, whose xdist workers open their sessions with ``lock=False``.
"""

from __future__ import annotations

import os
from pathlib import Path

from bmoe_ci.paths import Places

from .errors import (
    ConfigIssue,
    DeviceBusy,
    FarmConfigError,
    FarmError,
    FarmNotUp,
    InfraError,
    MissingTool,
    SelectionError,
)
from .farmfile import device_from_spec, load_farm_file
from .lock import DeviceLock, Heartbeat, LockOwner, force_unlock, read_lock
from .model import Device, Farm, TransportKeys, normalize_arch, triple_arch
from .preflight import EngineVersion, PreflightReport, check_lite, parse_version, preflight
from .select import select_devices
from .session import DeviceSession, default_run_id, open_session
from .store import GcReport, Mismatch, PushItem, PushReport, gc, push, sha256_file
from .transports import Ending, RunResult, Transport, open_transport, registry


def load_farm(path: str | os.PathLike[str] | None = None, places: Places | None = None) -> Farm:
    """Load a farm file; ``None`` means the embedded local farm of ``places`` (:class:`FarmNotUp` if not
    started)."""
    if path is None:
        from .embedded import farm_file

        path = farm_file(places=places)
    return load_farm_file(Path(path))


__all__ = [
    "ConfigIssue",
    "Device",
    "DeviceBusy",
    "DeviceLock",
    "DeviceSession",
    "Ending",
    "EngineVersion",
    "Farm",
    "FarmConfigError",
    "FarmError",
    "FarmNotUp",
    "GcReport",
    "Heartbeat",
    "InfraError",
    "LockOwner",
    "Mismatch",
    "MissingTool",
    "PreflightReport",
    "PushItem",
    "PushReport",
    "RunResult",
    "SelectionError",
    "Transport",
    "TransportKeys",
    "check_lite",
    "default_run_id",
    "device_from_spec",
    "force_unlock",
    "gc",
    "load_farm",
    "load_farm_file",
    "normalize_arch",
    "open_session",
    "open_transport",
    "parse_version",
    "preflight",
    "push",
    "read_lock",
    "registry",
    "select_devices",
    "sha256_file",
    "triple_arch",
]
