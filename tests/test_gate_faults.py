"""Every gate can fail: each fault of the catalogue (engine/faults.toml) marked `tested` is built into the
engine (`pytest gates --fault NAME`, i.e. -DBMOE_FAULT_<NAME>=1) and the real gate suite runs on the host
device: it must be caught — a gate reports a *failure*, not an error — only by gates the catalogue
expects to catch it, and every other gate of the modules that run passes. The clean build passes them all.

The catalogue is the one table of faults and the gates that catch them: this file only decides which
gate modules to run for a fault (the modules holding its expected gates) and reads everything else
from there. `bmoe-ci mutants` runs the whole catalogue against the whole suite (docs/gates.md).

Beyond the catalogue: XDEV, derived from the results of all devices, fails a device whose engine was
built with WRONG_OFFSET while two others ran the clean one; REF fails on logits alone when its
expectation is moved by ten times its tolerance.
"""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bmoe_ci.builder import BuildError
from bmoe_ci.faults import Fault, load_catalogue
from bmoe_ci.mutants.run import build_all
from gate_run import REPO, emulated_farm, run_gates

DETERMINISM = ("gates/test_determinism.py",)
CONFIG = ("gates/test_config.py",)
STREAMING = ("gates/test_streaming.py",)
LOSSY = ("gates/test_lossy.py",)
REFERENCE = ("gates/test_reference.py",)
BATCH = ("gates/test_batch.py",)
MODEL = ("gates/test_replay.py", "gates/test_invariants.py")
SCORING = ("gates/test_scoring.py",)
STREAMING_GATES = ("G1", "G2", "G5", "DET")
LOSSY_GATES = ("G8a", "G8a'", "G8b", "G8c", "G8d", "G8e", "G8w")


def test_clean_build_passes_det_and_cfg(tmp_path: Path) -> None:
    run = run_gates(tmp_path, modules=DETERMINISM + CONFIG)
    assert run.returncode == 0, run.output[-3000:]
    assert run.gate("host", "DET") == "pass" and run.gate("host", "CFG") == "pass"


def test_clean_build_passes_the_streaming_gates(tmp_path: Path) -> None:
    run = run_gates(tmp_path, modules=STREAMING, fixtures=("qwen3moe", "qwen3moe-split4"))
    assert run.returncode == 0, run.output[-3000:]
    for gate in STREAMING_GATES:
        assert run.gate("host", gate) == "pass", (gate, run.output[-3000:])


def test_clean_build_passes_the_lossy_gates(tmp_path: Path) -> None:
    # qwen3moe-nonorm: the fixture G8c's faults need; REPLAY replays unnormalised routings too
    run = run_gates(tmp_path, modules=LOSSY + MODEL, fixtures=("qwen3moe", "qwen3moe-nonorm"))
    assert run.returncode == 0, run.output[-3000:]
    for gate in (*LOSSY_GATES, "REPLAY", "INV"):
        assert run.gate("host", gate) == "pass", (gate, run.output[-3000:])
    counts = run.summary["devices"]["host"]["gate_counts"]
    assert counts["REPLAY"]["pass"] == 2 and counts["INV"]["pass"] == 2, counts


def test_clean_build_passes_ref_and_batch_stderr(tmp_path: Path) -> None:
    run = run_gates(tmp_path, modules=REFERENCE + BATCH, fixtures=("qwen3moe", "gemma4", "qwen3moe-q8_0"))
    assert run.returncode == 0, run.output[-3000:]
    assert run.gate("host", "REF") == "pass" and run.gate("host", "BATCH-STDERR") == "pass"
    counts = run.summary["devices"]["host"]["gate_counts"]
    assert counts["REF"]["pass"] == 3 and counts["BATCH-STDERR"]["pass"] == 3
    # one device: XDEV has nothing to compare: no verdict (neither a pass nor a skip), and the headline
    # says why; the run has no skipped test and nothing it did not select
    assert "XDEV" not in counts and run.summary["totals"]["skipped"] == 0, counts
    assert run.summary["xdev_lone"] == ["gemma4", "qwen3moe", "qwen3moe-q8_0"]
    assert "; XDEV: nothing to compare (one device ran each fixture)" in run.output


def test_clean_build_passes_score(tmp_path: Path) -> None:
    # gemma4: a dense layer, a shared expert and a weight chain ending at _scaled; trained-q8_0: Q8_0 (the
    # Q8_0 fixture that keeps the scoring family: qwen3moe-q8_0 leaves it out)
    run = run_gates(
        tmp_path, modules=(*SCORING, "gates/test_invariants.py"), fixtures=("qwen3moe", "gemma4", "trained-q8_0")
    )
    assert run.returncode == 0, run.output[-3000:]
    counts = run.summary["devices"]["host"]["gate_counts"]
    # SCORE: three tests per fixture (the text scores, the options, the session), each pinned to the reference
    assert counts["SCORE"] == {"pass": 9, "fail": 0, "error": 0, "skip": 0}, counts
    assert counts["INV"]["pass"] == 3, counts


GATE_MARK = re.compile(r"""@pytest\.mark\.gate\(["']([^"']+)["']""")


def gate_modules() -> dict[str, tuple[str, ...]]:
    """gate id -> the gates/ modules that hold its tests (read from the modules' gate markers): a gate's
    sub-gates may live in several (G8w's lines are in test_report_lines.py)."""
    out: dict[str, tuple[str, ...]] = {}
    for path in sorted((REPO / "gates").glob("test_*.py")):
        for gate in GATE_MARK.findall(path.read_text()):
            if f"gates/{path.name}" not in out.get(gate, ()):
                out[gate] = (*out.get(gate, ()), f"gates/{path.name}")
    return out


MODULES = gate_modules()
FAULTS = [f for f in load_catalogue().faults if f.tested]
HOST_ARCH = {"arm64": "aarch64", "amd64": "x86_64"}.get(platform.machine().lower(), platform.machine().lower())


def test_every_tested_fault_names_gates_of_the_suite() -> None:
    assert FAULTS, "no fault of the catalogue is marked tested"
    for fault in FAULTS:
        assert any(g in MODULES for g in fault.expected), (fault.name, fault.expected, sorted(MODULES))


@pytest.fixture(scope="module")
def fault_engines() -> None:
    """Every tested fault's host engine, compiled up front one compiler per CPU: each build recompiles
    the whole engine (about 9 CPU seconds), and one at a time, inside each test's gate run, they were
    a third of this file's time. The gate runs then find them in the build cache."""
    here = [f for f in FAULTS if f.runs_on(HOST_ARCH)]
    _clean, builds = build_all("host", here, os.cpu_count() or 1, False, lambda _msg: None)
    failed = {name: str(b) for name, b in builds.items() if isinstance(b, BuildError)}
    assert not failed, failed


@pytest.mark.parametrize("fault", FAULTS, ids=[f.name for f in FAULTS])
def test_fault_makes_its_gates_fail(tmp_path: Path, fault: Fault, fault_engines: None) -> None:
    modules = tuple(sorted({m for g in fault.expected for m in MODULES.get(g, ())}))
    device, farm = "host", None
    if not fault.runs_on(HOST_ARCH):  # a SIMD path's own kernel: on a device of its architecture
        assert fault.arch is not None
        device, farm = "emu", emulated_farm(tmp_path, fault.arch)
        if farm is None:
            pytest.skip(f"{fault.name} runs on {fault.arch} only, and there is no qemu-{fault.arch}-static here")
    run = run_gates(
        tmp_path, faults=(fault.name,), modules=modules, fixtures=(fault.fixture,), farm=farm, device=device
    )
    assert run.returncode != 0
    verdicts = run.summary["devices"][device]["gates"]
    failed = sorted(g for g, v in verdicts.items() if v == "fail")
    # caught, by gates the catalogue expects (which of them fire can depend on the fixture), and by no other
    assert failed, (verdicts, run.output[-3000:])
    assert set(failed) <= set(fault.expected), (fault.expected, verdicts, run.output[-3000:])
    assert all(v in ("pass", "skip") for g, v in verdicts.items() if g not in fault.expected), verdicts
    assert run.summary["totals"]["errors"] == 0, "a wrong engine must be a failure, not an error"
    if fault.crash:
        # the memory model's teeth: a released / never-committed slot faults, it is not read stale
        assert "engine crashed (SIGSEGV)" in run.output or "engine crashed (SIGBUS)" in run.output, run.output[-3000:]


def test_a_device_with_another_engine_fails_xdev(tmp_path: Path) -> None:
    """Three local devices share one results directory: `odd` runs first with a WRONG_OFFSET engine (its
    streamed runs read every expert from the wrong place, so their bytes change), then
    `a` and `b` with the clean one. Only BATCH-STDERR runs on the devices, and it passes everywhere:
    what fails is XDEV, derived over the three, on `odd` alone, and the second run exits non-zero."""
    farm = tmp_path / "farm.yaml"
    arch = {"arm64": "aarch64", "amd64": "x86_64"}.get(platform.machine().lower(), platform.machine().lower())
    farm.write_text(
        "version: 1\ndevices:\n"
        + "".join(
            f"  - name: {n}\n    kind: desktop\n    os: linux\n    arch: {arch}\n    transport: local\n"
            f"    workdir: {tmp_path / ('work-' + n)}\n"
            for n in ("a", "b", "odd")
        )
    )
    results = tmp_path / "results"
    first = run_gates(tmp_path, faults=("WRONG_OFFSET",), modules=BATCH, farm=farm, device="odd", results=results)
    assert first.returncode == 0, first.output[-3000:]  # alone, nothing on `odd` can tell
    run = run_gates(tmp_path, modules=BATCH, farm=farm, device="a,b", results=results)
    assert run.returncode != 0, run.output[-3000:]
    devices = run.summary["devices"]
    assert {n: d["gates"]["BATCH-STDERR"] for n, d in devices.items()} == dict.fromkeys(("a", "b", "odd"), "pass")
    assert {n: d["gates"]["XDEV"] for n, d in devices.items()} == {"a": "pass", "b": "pass", "odd": "fail"}
    found = run.summary["disagreements"]
    assert found and all(d["minority"] == ["odd"] and d["fixture"] == "qwen3moe" for d in found)
    assert {"output", "tokens"} <= {d["field"] for d in found if d["entry"] == "stream"}
    assert not [d for d in found if d["entry"] == "ref"]  # --mmap reads no expert through the streamer
    assert "XDEV qwen3moe" in run.output  # the console names what differed
    report = subprocess.run(
        [sys.executable, "-m", "bmoe_ci.cli", "report", str(results)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert report.returncode == 1, report.stdout + report.stderr


def test_ref_fails_on_logits_beyond_the_tolerance(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A wrong expectation: the cached reference's position 5 moved by 1e-4 relative (ten times REF's
    tolerance) with its tokens untouched. REF must fail on the logits alone, naming the position."""
    from bmoe_ci.models import generate
    from bmoe_ci.paths import Places
    from bmoe_ci.reference import GATE_REQUEST

    cache = tmp_path / "cache"
    cache.mkdir()
    # share the engine builds; the fixtures are private
    (cache / "engine").symlink_to(Places.from_environ(os.environ).cache_dir() / "engine")
    monkeypatch.setenv("BMOE_CI_CACHE", str(cache))  # for the gate run it starts
    (fixture,) = generate(names=["qwen3moe"], reference=GATE_REQUEST, places=Places(cache=cache))
    assert fixture.reference is not None
    doc = json.loads(fixture.reference.read_text())
    row = doc["logits"][5]
    top = max(range(len(row)), key=lambda j: abs(row[j]))
    row[top] *= 1 + 1e-4
    fixture.reference.write_text(json.dumps(doc))  # same key: the gate run reuses it as the expectation
    run = run_gates(tmp_path, modules=REFERENCE, fixtures=("qwen3moe",))
    assert run.returncode != 0
    assert run.gate("host", "REF") == "fail", run.output[-3000:]
    (problem,) = [p for p in run.summary["problems"] if p["gate"] == "REF"]
    assert "logits of position 5 differ from the reference by" in problem["message"], problem
    assert "above 1e-05" in problem["message"], problem
