"""What the controller prepared for a gate run, in a form that crosses to xdist workers as JSON."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class DeviceContext:
    name: str
    arch: str
    os: str
    kind: str
    target: str
    build_id: str
    engine: str | None = None  # device path of the pushed engine
    models: dict[str, str] = field(default_factory=dict)  # fixture name -> device path for -m
    infra_error: str | None = None  # why this device cannot give verdicts (its tests are errors), one line
    infra_kind: str = "setup"  # ... as the InfraError it was: kind, step (what was being done), reason
    infra_step: str = ""
    infra_reason: str = ""
    pushed_bytes: int = 0
    verified_files: int = 0  # stored files whose hash the device checked in this run
    repushed: list[str] = field(default_factory=list)  # corrupted files found and re-pushed
    retries: list[str] = field(default_factory=list)  # transient connect/upload failures that were retried
    setup_s: float = 0.0  # connect + lock + push + preflight, on the controller
    # the device as the farm file defines it (bmoe_ci.farm.Device.spec()): what a worker opens its own
    # session with, without reading the farm file again
    spec: dict[str, Any] = field(default_factory=dict)


@dataclass
class GateRun:
    run_id: str
    results_dir: str
    farm_file: str | None
    devices: list[DeviceContext]
    fixtures: dict[str, str]  # name -> sha256
    engine_builds: dict[str, str]  # target -> build id
    compiled: list[str]  # targets compiled (not taken from the cache) in this run
    started: str = ""
    notes: list[str] = field(default_factory=list)  # devices skipped by the selection, and why
    faults: list[str] = field(default_factory=list)  # BMOE_FAULT_<NAME> built into every engine of the run
    references: dict[str, str] = field(default_factory=dict)  # fixture -> controller path of its REF output

    def device(self, name: str) -> DeviceContext:
        for d in self.devices:
            if d.name == name:
                return d
        raise KeyError(name)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> GateRun:
        raw = json.loads(text)
        raw["devices"] = [DeviceContext(**d) for d in raw["devices"]]
        return cls(**raw)
