"""The gate suite end to end on real (local) devices: warm re-runs, cross-architecture outputs,
infrastructure errors kept apart from verdicts, and bad selections."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import junitparser
import pytest

from gate_run import DET, DET_TWO_CALLS, REPO, host_farm, run_gates

CORE = ("gates/test_determinism.py", "gates/test_config.py")


def test_warm_rerun_builds_nothing_and_pushes_nothing(tmp_path: Path) -> None:
    farm = host_farm(tmp_path)
    first = run_gates(tmp_path, farm=farm, modules=CORE, results=tmp_path / "r1")
    second = run_gates(tmp_path, farm=farm, modules=CORE, results=tmp_path / "r2")
    assert first.returncode == 0 and second.returncode == 0, second.output[-2000:]
    assert second.summary["compiled"] == []
    assert second.summary["devices"]["host"]["pushed_bytes"] == 0
    assert first.summary["devices"]["host"]["pushed_bytes"] > 0 or first.summary["compiled"] == []
    assert "pushed: 0 B" in second.output  # sizes read as the progress lines give them
    # JUnit per device and merged, readable by junitparser, one testsuite named after the device.
    merged = junitparser.JUnitXml.fromfile(str(tmp_path / "r2" / "junit.xml"))
    suites = [s.name for s in merged]
    assert suites == ["host"]
    device = junitparser.JUnitXml.fromfile(str(tmp_path / "r2" / "host" / "junit.xml"))
    assert sum(s.tests for s in device) == second.summary["devices"]["host"]["tests"] > 0


@pytest.mark.skipif(shutil.which("qemu-aarch64-static") is None, reason="needs Debian's qemu-user-static")
def test_same_output_bytes_on_x86_64_and_emulated_aarch64(tmp_path: Path) -> None:
    farm = host_farm(tmp_path)
    farm.write_text(
        farm.read_text()
        + "  - name: phone-emu\n    kind: phone\n    os: linux\n    arch: aarch64\n    transport: local\n"
        f"    workdir: {tmp_path / 'phone'}\n    exec_prefix: [qemu-aarch64-static]\n    timeout_scale: 8\n"
    )
    run = run_gates(
        tmp_path,
        farm=farm,
        device="all",
        modules=("gates/test_determinism.py",),
        fixtures=("qwen3moe", "gemma4", "qwen3moe-q8_0"),
    )
    assert run.returncode == 0, run.output[-3000:]
    host, phone = run.summary["devices"]["host"], run.summary["devices"]["phone-emu"]
    assert phone["arch"] == "aarch64" and host["arch"] != "aarch64"
    assert set(host["outputs"]) == {"qwen3moe", "gemma4", "qwen3moe-q8_0"}
    assert host["outputs"] == phone["outputs"]
    assert all(run.summary["outputs_agree"].values())


def test_unreachable_device_is_an_error_and_the_others_still_pass(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.mkdir()
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(keys / "id")], check=True)
    (tmp_path / "known_hosts").write_text("")
    farm = host_farm(tmp_path)
    farm.write_text(
        farm.read_text() + "  - name: gone\n    kind: phone\n    os: linux\n    arch: x86_64\n    transport: ssh\n"
        f"    host: 127.0.0.1\n    port: 9\n    user: nobody\n    key: {keys / 'id'}\n"
        f"    known_hosts: {tmp_path / 'known_hosts'}\n    workdir: /tmp/gone\n    connect_timeout: 2\n"
    )
    run = run_gates(tmp_path, farm=farm, device="all", modules=CORE)
    assert run.returncode != 0
    gone, host = run.summary["devices"]["gone"], run.summary["devices"]["host"]
    assert host["failed"] == 0 and host["errors"] == 0 and host["passed"] > 0
    assert gone["errors"] > 0 and gone["failed"] == 0 and gone["passed"] == 0
    merged = junitparser.JUnitXml.fromfile(str(tmp_path / "results" / "junit.xml"))
    errors = {s.name: s.errors for s in merged}
    failures = {s.name: s.failures for s in merged}
    assert errors["gone"] > 0 and failures["gone"] == 0


def test_device_dying_mid_run_keeps_the_results_it_gave(tmp_path: Path) -> None:
    # The device answers its first engine command, then hangs: a timeout, i.e. infrastructure.
    wrapper = tmp_path / "dies.sh"
    wrapper.write_text(
        "#!/bin/sh\n"
        f"n=$(cat {tmp_path}/count 2>/dev/null || echo 0); echo $((n + 1)) > {tmp_path}/count\n"
        '[ "$n" -ge 2 ] && exec sleep 600\n'  # 0: --version at preflight, 1: the first plan
        'exec "$@"\n'
    )
    wrapper.chmod(0o755)
    farm = host_farm(tmp_path)
    farm.write_text(farm.read_text() + f"    exec_prefix: [{wrapper}]\n    timeout_scale: 0.05\n")
    run = run_gates(tmp_path, farm=farm, modules=DET, select=DET_TWO_CALLS, fixtures=("qwen3moe",))
    host = run.summary["devices"]["host"]
    # DET-repeat comes from the first plan (answered); DET-batch needs an engine process of its own,
    # which hangs: an error, not a failure, and the verdict already obtained stays.
    assert host["passed"] == 1 and host["errors"] == 1 and host["failed"] == 0, run.output[-3000:]
    assert host["tests"] == len(DET_TWO_CALLS)
    [problem] = run.summary["problems"]
    assert problem["message"].startswith("host: single run: timeout: gave no result within its deadline"), problem


def test_unknown_device_lists_the_known_ones(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "gates",
            "-p",
            "no:cacheprovider",
            "--bmoe-farm",
            str(host_farm(tmp_path)),
            "--bmoe-device",
            "pixel9",
            "--bmoe-results",
            str(tmp_path / "r"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 4  # pytest's usage error
    assert "pixel9" in proc.stderr and "host" in proc.stderr


def test_engine_that_does_not_compile_stops_the_run_with_the_compiler_output(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    shutil.copytree(REPO / "engine" / "src", tree / "engine" / "src")
    shutil.copytree(REPO / "fixtures", tree / "fixtures")
    shutil.copy(REPO / "pyproject.toml", tree / "pyproject.toml")
    (tree / "engine" / "src" / "zz_broken.c").write_text("int zz_broken(void) { return not_declared; }\n")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "gates",
            "-p",
            "no:cacheprovider",
            "--bmoe-farm",
            str(host_farm(tmp_path)),
            "--bmoe-device",
            "host",
            "--bmoe-results",
            str(tmp_path / "r"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env={**os.environ, "BMOE_CI_REPO": str(tree), "BMOE_CI_CACHE": str(tmp_path / "cache")},
    )
    assert proc.returncode == 3, proc.stdout[-2000:] + proc.stderr[-2000:]
    out = proc.stdout + proc.stderr
    assert "cannot prepare the gate run" in out and "not_declared" in out and "INTERNALERROR" not in out
    assert not (tmp_path / "r").exists()


def test_xdist_keeps_each_device_on_one_worker(tmp_path: Path) -> None:
    farm = host_farm(tmp_path)
    farm.write_text(
        farm.read_text()
        + farm.read_text().split("devices:\n", 1)[1].replace("name: host", "name: host2").replace("/work", "/work2")
    )
    run = run_gates(tmp_path, farm=farm, device="all", modules=CORE, extra=("-n", "2", "-vv"))
    assert run.returncode == 0, run.output[-3000:]
    workers: dict[str, set[str]] = {}
    for line in run.output.splitlines():
        if line.startswith("[gw") and "PASSED" in line:
            worker = line.split("]", 1)[0].lstrip("[")
            nodeid = line.split("PASSED", 1)[1].strip().split("@", 1)[0]
            device = nodeid.rsplit("[", 1)[1].rstrip("]").split("-", 1)[0]
            workers.setdefault(device, set()).add(worker)
    assert set(workers) == {"host", "host2"}
    assert all(len(w) == 1 for w in workers.values()), workers
    assert "@" not in (tmp_path / "results" / "junit.xml").read_text()  # no xdist group suffix in names
