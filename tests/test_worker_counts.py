"""Any number of xdist workers, fewer or more than devices, gives the verdicts of one worker per device,
under load. (A nightly's 4 workers for 5 devices once reported G8b and REPLAY failing on a clean engine:
a plan run again next to its first run, still going on the device after a lost link; and REF failed
clearing an artifacts directory another test was writing into.)"""

from __future__ import annotations

import contextlib
import os
import platform
import signal
import subprocess
from pathlib import Path

from gate_run import run_gates

ARCH = {"arm64": "aarch64", "amd64": "x86_64"}.get(platform.machine().lower(), platform.machine().lower())
DEVICES = 5
MODULES = ("gates/test_reference.py", "gates/test_lossy.py")


def _farm(tmp_path: Path) -> Path:
    farm = tmp_path / "farm.yaml"
    farm.write_text(
        "version: 1\ndevices:\n"
        + "".join(
            f"  - name: d{i}\n    kind: desktop\n    arch: {ARCH}\n    transport: local\n"
            f"    workdir: {tmp_path / f'work{i}'}\n"
            for i in range(DEVICES)
        )
    )
    return farm


def _verdicts(tmp_path: Path, farm: Path, workers: int) -> dict[str, dict[str, str]]:
    run = run_gates(
        tmp_path,
        farm=farm,
        device="all",
        modules=MODULES,
        results=tmp_path / f"r{workers}",
        extra=("-n", str(workers), "-m", "G8b or REF"),
    )
    assert run.returncode == 0, run.output[-3000:]
    return {name: d["gates"] for name, d in run.summary["devices"].items()}


def test_two_four_and_eight_workers_give_the_verdicts_of_five_under_load(tmp_path: Path) -> None:
    farm = _farm(tmp_path)
    hogs = [subprocess.Popen(["nice", "-n", "19", "sh", "-c", "while :; do :; done"]) for _ in range(2)]
    try:
        one_each = _verdicts(tmp_path, farm, DEVICES)
        assert set(one_each) == {f"d{i}" for i in range(DEVICES)}
        assert all(v == "pass" for gates in one_each.values() for v in gates.values()), one_each
        for workers in (2, 4, 8):
            assert _verdicts(tmp_path, farm, workers) == one_each, f"-n {workers}"
    finally:
        for hog in hogs:
            with contextlib.suppress(ProcessLookupError):
                os.kill(hog.pid, signal.SIGKILL)
            hog.wait()
    # every test of a device left its artifacts directory to itself: none left behind by a passing run
    assert not any((tmp_path / f"r{DEVICES}" / f"d{i}" / "artifacts").exists() for i in range(DEVICES))


def test_clearing_a_tests_artifacts_never_touches_the_directory_other_tests_share(tmp_path: Path) -> None:
    """REF used to clear its artifacts and then the device's shared `artifacts/` directory when it looked
    empty: with another test of the device writing into it at the same moment (a second process on the
    device: xdist's re-run of a lost worker's test, a plan re-run beside its first run) the rmdir raised
    `[Errno 39] Directory not empty`, a gate failure. The race, shown; then the plugin's way: a test
    removes only its own directory, at its teardown, and the shared one stays until the session ends."""
    shared = tmp_path / "host" / "artifacts"
    shared.mkdir(parents=True)
    # another test of the device, in another process, writing its artifacts
    writer = subprocess.Popen(
        ["sh", "-c", 'while :; do mkdir -p "$1/t" 2>/dev/null; rmdir "$1/t" 2>/dev/null; done', "w", str(shared)]
    )

    def old_ref_cleanup(local: Path) -> None:  # what gates/test_reference.py did after a pass
        local.unlink(missing_ok=True)
        for d in (local.parent, local.parent.parent):
            if d.is_dir() and not any(d.iterdir()):
                d.rmdir()

    raced = 0
    try:
        for _ in range(20000):
            own = shared / "test_ref"
            with contextlib.suppress(FileExistsError, FileNotFoundError):
                own.mkdir(parents=True, exist_ok=True)
                (own / "logits.f32").write_bytes(b"x")
            try:
                old_ref_cleanup(own / "logits.f32")
            except FileNotFoundError:
                continue
            except OSError as exc:
                assert exc.errno == 39  # Directory not empty
                raced += 1
                break
    finally:
        writer.kill()
        writer.wait()
    assert raced, "the old clean-up did not race in 20000 tries (a slow machine?)"
    # the plugin's teardown removes the test's own directory only
    own = shared / "test_ref"
    shared.mkdir(parents=True, exist_ok=True)
    own.mkdir(exist_ok=True)
    (own / "logits.f32").write_bytes(b"x")
    import shutil

    shutil.rmtree(own)
    assert shared.is_dir()
