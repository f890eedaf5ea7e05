"""The farm under faults, end to end through the real gate suite on local devices: every scenario
asserts the verdicts, the counts, a time bound and what is left on the device."""

from __future__ import annotations

import os
import time
from pathlib import Path

from gate_run import host_farm, run_gates

DET = ("gates/test_determinism.py",)


def _store(tmp_path: Path) -> Path:
    return tmp_path / "work" / "store"


def _flip_byte(path: Path, offset: int) -> None:
    path.chmod(0o644)
    data = bytearray(path.read_bytes())
    data[offset % len(data)] ^= 0x01
    path.write_bytes(bytes(data))


def test_flipped_bytes_in_the_stored_engine_and_fixture_are_repushed_and_the_run_passes(tmp_path: Path) -> None:
    farm = host_farm(tmp_path)
    first = run_gates(tmp_path, farm=farm, modules=DET, results=tmp_path / "r1")
    assert first.returncode == 0, first.output[-3000:]
    stored = sorted(p for p in _store(tmp_path).iterdir() if not p.name.startswith("."))
    assert len(stored) >= 2  # the engine and the fixture
    for i, p in enumerate(stored):
        _flip_byte(p, 1000 + i)
    start = time.monotonic()
    second = run_gates(tmp_path, farm=farm, modules=DET, results=tmp_path / "r2")
    took = time.monotonic() - start
    host = second.summary["devices"]["host"]
    assert second.returncode == 0, second.output[-3000:]
    assert host["status"] == "pass" and host["failed"] == 0 and host["errors"] == 0
    assert host["tests"] == first.summary["devices"]["host"]["tests"] > 0
    assert len(host["repushed"]) == len(stored) and all("stored copy" in r for r in host["repushed"])
    assert host["verified_files"] == len(stored)
    assert host["pushed_bytes"] == sum(p.stat().st_size for p in stored)
    assert took < 300
    # what is left on the device: intact files under their hashes, no temporaries
    import hashlib

    for p in _store(tmp_path).iterdir():
        assert not p.name.startswith(".tmp-")
        assert hashlib.sha256(p.read_bytes()).hexdigest() == p.name
    assert "re-pushed" in (tmp_path / "r2" / "summary.md").read_text()


def test_a_file_that_keeps_arriving_corrupted_is_an_infrastructure_error(tmp_path: Path) -> None:
    # The device's sha256sum sees every upload differently from the controller: a broken link or disk.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    liar = bin_dir / "sha256sum"
    liar.write_text('#!/bin/sh\necho "0000000000000000000000000000000000000000000000000000000000000000  $1"\n')
    liar.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    run = run_gates(tmp_path, modules=DET, env=env)
    host = run.summary["devices"]["host"]
    assert run.returncode == 1, run.output[-3000:]
    assert host["status"] != "pass" and host["passed"] == 0 and host["failed"] == 0
    assert "hash mismatch again" in host["infra_error"] and "expected" in host["infra_error"]
    assert not [p for p in _store(tmp_path).iterdir() if p.name.startswith(".tmp-")]
