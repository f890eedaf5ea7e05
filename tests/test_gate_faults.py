"""Every gate can fail: each fault built into the engine (`pytest gates --fault
NAME`, i.e. -DBMOE_FAULT_<NAME>=1) makes the gate that exists to catch it report a *failure* (not an
error, not a pass), through the real gate suite on the host device; the clean build passes them all.

Core (gates/test_determinism.py, gates/test_config.py):
  THREAD_ORDER      a row's value depends on the thread that computed it          -> DET fails
  BATCH_STATE       an engine instance inherits state from the previous one        -> DET fails
  CFG_LOOSE_RANGE   validate() forgets the upper bound of F and L                 -> CFG fails

Streaming (gates/test_streaming.py):
  WRONG_OFFSET      every expert slot is filled from its neighbour's offset       -> G1 fails
                    (G2 and G5 compare streamed runs that read the same wrong bytes: they pass,
                    which is exactly why G1 compares against the resident reference)
  EVICT_IN_USE      eviction ignores the in-use pin and takes the hottest entry:  -> G2 fails
                    the running layer's expert is released before its matmul, which then faults
                    (SIGSEGV on the released slot: the engine crashes instead of reading stale bytes)
  SKIP_LOAD_ON_HIT  a prefetched expert is marked resident but never read: its    -> G5 fails
                    first use is a "hit" that was not one, on a never-committed slot (a fault again)

Lossy knobs (gates/test_lossy.py):
  NO_REPOINT          a dropped slot keeps the id of the expert it declined to read: the matmul
                      touches that expert's released slot (SIGSEGV)                      -> G8b fails
  NO_PIN              the top-weighted expert is droppable: on qwen3moe-nonorm at top-k 1 the
                      only weight is a probability below F/k = 1, so the top goes (SIGSEGV)  -> G8c fails
  SKIP_DEFERRED_LOAD  the load deferred to the terminal node never happens, and the
                      EXPERTS backstop is skipped too: the matmul touches unloaded memory -> G8a fails
  MODEL_TOPK          the threshold is F / the model's top-k, not the effective one: at
                      --n-expert-used k+1 misses above F/(k+1) are dropped                 -> G8r fails
  SUBST_INERT         substitution examines and never changes                           -> G8e fails
  SUBST_COUNT_REORDER the re-ranked set is written back in id order and compared slot by
                      slot, so re-orderings count (and are written) as substitutions      -> G8d fails
  WARN_HARDCODED      the warning's evidence side says 12.5% whatever F                  -> G8w fails

Absolute reference and batch contract (gates/test_reference.py, gates/test_batch.py):
  ROPE_POS          every position is rotated as the next one: all configurations alike, so every
                    identity gate passes; only the comparison with the reference can see it  -> REF fails
  BATCH_STDERR      batch writes a line to stderr after each entry                  -> BATCH-STDERR fails

Cross-device agreement (XDEV, derived from the results of all devices): one device of three runs an
engine built with WRONG_OFFSET; its gates alone cannot tell, XDEV fails it and the run exits non-zero.
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from gate_run import REPO, run_gates

DETERMINISM = ("gates/test_determinism.py",)
CONFIG = ("gates/test_config.py",)
STREAMING = ("gates/test_streaming.py",)
LOSSY = ("gates/test_lossy.py",)
REFERENCE = ("gates/test_reference.py",)
BATCH = ("gates/test_batch.py",)
STREAMING_GATES = ("G1", "G2", "G5", "DET")
LOSSY_GATES = ("G8a", "G8a'", "G8b", "G8c", "G8d", "G8e", "G8w", "G8r")


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
    # qwen3moe: G8r applies; qwen3moe-nonorm: the fixture G8c's faults need (G8r skips it, with the reason)
    run = run_gates(tmp_path, modules=LOSSY, fixtures=("qwen3moe", "qwen3moe-nonorm"))
    assert run.returncode == 0, run.output[-3000:]
    for gate in LOSSY_GATES:
        assert run.gate("host", gate) == "pass", (gate, run.output[-3000:])
    counts = run.summary["devices"]["host"]["gate_counts"]
    assert counts["G8r"]["pass"] == 1 and counts["G8r"]["skip"] == 1, counts


def test_clean_build_passes_ref_and_batch_stderr(tmp_path: Path) -> None:
    run = run_gates(tmp_path, modules=REFERENCE + BATCH, fixtures=("qwen3moe", "gemma4", "qwen3moe-q8_0"))
    assert run.returncode == 0, run.output[-3000:]
    assert run.gate("host", "REF") == "pass" and run.gate("host", "BATCH-STDERR") == "pass"
    counts = run.summary["devices"]["host"]["gate_counts"]
    assert counts["REF"]["pass"] == 3 and counts["BATCH-STDERR"]["pass"] == 3
    # one device: XDEV has nothing to compare, and says so (a skip, never a pass)
    assert counts["XDEV"] == {"pass": 0, "fail": 0, "error": 0, "skip": 3}, counts


FAULTS = [
    ("THREAD_ORDER", DETERMINISM, "qwen3moe", "DET", (), False),
    ("BATCH_STATE", DETERMINISM, "qwen3moe", "DET", (), False),
    ("CFG_LOOSE_RANGE", CONFIG, "qwen3moe", "CFG", (), False),
    ("WRONG_OFFSET", STREAMING, "qwen3moe", "G1", ("G2", "G5", "DET"), False),
    ("EVICT_IN_USE", STREAMING, "qwen3moe", "G2", ("G1",), True),
    ("SKIP_LOAD_ON_HIT", STREAMING, "qwen3moe", "G5", ("G1", "G2"), True),
    ("NO_REPOINT", LOSSY, "qwen3moe", "G8b", ("G8a", "G8a'", "G8c", "G8d", "G8e", "G8w"), True),
    ("NO_PIN", LOSSY, "qwen3moe-nonorm", "G8c", ("G8a", "G8a'", "G8d", "G8e", "G8w"), True),
    ("SKIP_DEFERRED_LOAD", LOSSY, "qwen3moe", "G8a", ("G8d", "G8e", "G8w"), True),
    ("MODEL_TOPK", LOSSY, "qwen3moe", "G8r", ("G8a", "G8a'", "G8b", "G8c", "G8d", "G8e", "G8w"), False),
    ("SUBST_INERT", LOSSY, "qwen3moe", "G8e", ("G8a", "G8a'", "G8b", "G8c", "G8d", "G8w", "G8r"), False),
    ("SUBST_COUNT_REORDER", LOSSY, "qwen3moe", "G8d", ("G8a", "G8a'", "G8b", "G8c", "G8e", "G8w", "G8r"),
     False),
    ("WARN_HARDCODED", LOSSY, "qwen3moe", "G8w", ("G8a", "G8a'", "G8b", "G8c", "G8d", "G8e", "G8r"), False),
    ("ROPE_POS", DETERMINISM + STREAMING + LOSSY + REFERENCE + BATCH, "qwen3moe", "REF",
     STREAMING_GATES + LOSSY_GATES + ("BATCH-STDERR",), False),
    ("BATCH_STDERR", BATCH + REFERENCE, "qwen3moe", "BATCH-STDERR", ("REF",), False),
]


@pytest.mark.parametrize(("fault", "modules", "fixture", "fails", "passes", "crash"), FAULTS,
                         ids=[f"{f[0]}-{f[3]}" for f in FAULTS])
def test_fault_makes_its_gate_fail(tmp_path: Path, fault: str, modules: tuple[str, ...], fixture: str, fails: str,
                                   passes: tuple[str, ...], crash: bool) -> None:
    run = run_gates(tmp_path, faults=(fault,), modules=modules, fixtures=(fixture,))
    assert run.returncode != 0
    assert run.gate("host", fails) == "fail", run.output[-3000:]
    for gate in passes:
        assert run.gate("host", gate) == "pass", (gate, run.output[-3000:])
    assert run.summary["totals"]["errors"] == 0, "a wrong engine must be a failure, not an error"
    if crash:
        # the memory model's teeth: a released / never-committed slot faults, it is not read stale
        assert "engine crashed (SIGSEGV)" in run.output or "engine crashed (SIGBUS)" in run.output, run.output[-3000:]


def test_a_device_with_another_engine_fails_xdev(tmp_path: Path) -> None:
    """Three local devices share one results directory: `odd` runs first with a WRONG_OFFSET engine (its
    streamed runs read every expert from the wrong place, so their bytes change), then
    `a` and `b` with the clean one. Only BATCH-STDERR runs on the devices, and it passes everywhere:
    what fails is XDEV, derived over the three, on `odd` alone, and the second run exits non-zero."""
    farm = tmp_path / "farm.yaml"
    arch = {"arm64": "aarch64", "amd64": "x86_64"}.get(platform.machine().lower(), platform.machine().lower())
    farm.write_text("version: 1\ndevices:\n" + "".join(
        f"  - name: {n}\n    kind: desktop\n    os: linux\n    arch: {arch}\n    transport: local\n"
        f"    workdir: {tmp_path / ('work-' + n)}\n" for n in ("a", "b", "odd")))
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
    report = subprocess.run([sys.executable, "-m", "bmoe_ci.cli", "report", str(results)], cwd=REPO,
                            capture_output=True, text=True, check=False)
    assert report.returncode == 1, report.stdout + report.stderr


def test_ref_fails_on_logits_beyond_the_tolerance(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A wrong expectation: the cached reference's position 5 moved by 1e-4 relative (ten times REF's
    tolerance) with its tokens untouched. REF must fail on the logits alone, naming the position."""
    from bmoe_ci.fixtures import generate
    from bmoe_ci.paths import cache_dir
    from bmoe_ci.reference import GATE_REQUEST

    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "engine").symlink_to(cache_dir() / "engine")  # share the engine builds; the fixtures are private
    monkeypatch.setenv("BMOE_CI_CACHE", str(cache))  # for generate() here and the gate run it starts
    (fixture,) = generate(names=["qwen3moe"], reference=GATE_REQUEST)
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
