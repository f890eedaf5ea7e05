"""Running the real gate suite from the project's own tests: a subprocess `pytest gates` against a
one-device local farm written into a temporary directory (no sshd needed), optionally with a fault
built into the engine. Returns what the run wrote: summary.json, and the exit status."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

# The farm's fault tests run DET, selected down to the least that proves each point (its tests' counts
# are then len(selection) per device and fixture, whatever else DET grows):
DET = ("gates/test_determinism.py",)
#: DET-repeat: one plan of two entries (ref, again)
DET_ONE = ("test_same_config_twice",)
#: DET-repeat and DET-threads: two tests answered by one plan (ref, again, threads2)
DET_ONE_PLAN = ("test_same_config_twice", "test_one_vs_two_threads")
#: DET-repeat and DET-batch: the plan, then an engine process of DET-batch's own (a second device call)
DET_TWO_CALLS = ("test_same_config_twice", "test_batch_equals_single_process")


@dataclass
class GateRunResult:
    returncode: int
    summary: dict[str, Any]
    output: str

    def gate(self, device: str, gate: str) -> str:
        return self.summary["devices"][device]["gates"].get(gate, "absent")


def without_xdev(dev: dict) -> dict:
    """A device's counts (an entry of summary.json's devices) without XDEV: its verdicts are derived over
    the devices of the results (a skip with one device), over and above the planned tests."""
    x = dev["gate_counts"].get("XDEV", {})
    out = dict(dev)
    out["tests"] -= sum(x.values())
    for key, outcome in (("passed", "pass"), ("failed", "fail"), ("errors", "error"), ("skipped", "skip")):
        out[key] -= x.get(outcome, 0)
    return out


def host_farm(tmp_path: Path) -> Path:
    arch = {"arm64": "aarch64", "amd64": "x86_64"}.get(platform.machine().lower(), platform.machine().lower())
    farm = tmp_path / "farm.yaml"
    farm.write_text(
        "version: 1\n"
        "devices:\n"
        "  - name: host\n"
        "    kind: desktop\n"
        "    os: linux\n"
        f"    arch: {arch}\n"
        "    transport: local\n"
        f"    workdir: {tmp_path / 'work'}\n"
    )
    return farm


def emulated_farm(tmp_path: Path, arch: str) -> Path | None:
    """A one-device local farm whose device `emu` runs the `arch` engine under qemu-user (the local
    farm's phone-emu), or None when qemu for that architecture is not installed."""
    import shutil

    qemu = shutil.which(f"qemu-{arch}-static") or shutil.which(f"qemu-{arch}")
    if qemu is None:
        return None
    farm = tmp_path / "farm-emu.yaml"
    farm.write_text(
        "version: 1\n"
        "devices:\n"
        "  - name: emu\n"
        "    kind: phone\n"
        "    os: linux\n"
        f"    arch: {arch}\n"
        "    transport: local\n"
        f"    workdir: {tmp_path / 'work-emu'}\n"
        f"    exec_prefix: [{qemu}]\n"
        "    timeout_scale: 8\n"
    )
    return farm


def run_gates(
    tmp_path: Path,
    *,
    faults: tuple[str, ...] = (),
    fixtures: tuple[str, ...] = ("qwen3moe",),
    modules: tuple[str, ...] = ("gates",),
    select: tuple[str, ...] = (),
    farm: Path | None = None,
    device: str = "host",
    results: Path | None = None,
    extra: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
) -> GateRunResult:
    """`modules`: gate module paths to run (default: the whole suite); `select`: pytest -k terms;
    `env`: the controller's environment (local devices inherit it)."""
    results = results or tmp_path / "results"
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        *modules,
        "-p",
        "no:cacheprovider",
        "-q",
        "--bmoe-farm",
        str(farm or host_farm(tmp_path)),
        "--bmoe-device",
        device,
        "--bmoe-results",
        str(results),
    ]
    for name in faults:
        cmd += ["--bmoe-fault", name]
    for name in fixtures:
        cmd += ["--bmoe-fixture", name]
    if select:
        cmd += ["-k", " or ".join(select)]
    cmd += list(extra)
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1200, check=False, env=env)
    summary_file = results / "summary.json"
    output = proc.stdout + proc.stderr
    assert summary_file.is_file(), f"the gate run wrote no summary (exit {proc.returncode}):\n{output[-3000:]}"
    return GateRunResult(proc.returncode, json.loads(summary_file.read_text()), output)
