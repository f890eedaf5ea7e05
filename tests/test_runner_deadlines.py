"""Per-entry deadlines through the device runner, on a local device with a stand-in engine whose
`batch` answers entries and hangs on request: a hang is one named timeout, reused for every test of
that plan without running it again, and two timeouts take the device out of the run."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from bmoe_ci.farm import InfraError, load_farm_file, open_session
from bmoe_ci.gaterun.runner import DeviceRunner
from gate_run import host_farm

ENGINE = """#!{python}
import json, os, sys, time
if sys.argv[1] == "--version":
    print("bmoe 0.1.0 build abc target {target}")
    sys.exit(0)
if sys.argv[1] == "batch":
    for line in open(sys.argv[2]):
        entry = json.loads(line)
        with open(os.environ["RUNS_LOG"], "a") as log:
            log.write(entry["id"] + "\\n")
        if "hang" in entry["argv"]:
            time.sleep(3600)
        if "crash" in entry["argv"]:
            if "emulated" in entry["argv"]:  # what qemu-user prints when its program dies of a signal
                sys.stderr.write("engine: a line of its own\\n")
                sys.stderr.write("qemu: uncaught target signal 11 (Segmentation fault) - core dumped\\n")
                sys.stderr.flush()
            os.kill(os.getpid(), 11)
        print(json.dumps({{"id": entry["id"], "ok": True}}), flush=True)
        time.sleep(float(os.environ.get("ENTRY_S", "0")))
    sys.exit(0)
if "hang" in sys.argv:
    time.sleep(3600)
print(json.dumps({{"ok": True}}))
"""


@pytest.fixture
def runner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    farm = load_farm_file(host_farm(tmp_path))
    device = farm.devices["host"].model_copy(update={"entry_timeout": 2.0})
    engine = tmp_path / "bmoe"
    engine.write_text(ENGINE.format(python=sys.executable, target=f"{device.arch}-linux-musl"))
    engine.chmod(0o755)
    monkeypatch.setenv("RUNS_LOG", str(tmp_path / "runs.log"))
    with open_session(device, run_id="deadlines", engine=engine, build_id="abc") as session:
        yield DeviceRunner(session)


def _ran(tmp_path: Path) -> list[str]:
    log = tmp_path / "runs.log"
    return log.read_text().split() if log.exists() else []


def test_slow_entries_within_the_deadline_pass(
    runner: DeviceRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ENTRY_S", "1.2")  # each entry well under 2 s, the plan well over it
    res = runner.plan("slow", [(f"e{i}", ["run", str(i)]) for i in range(3)])
    assert sorted(res) == ["e0", "e1", "e2"] and all(r.ok and r.stderr == "" for r in res.values())
    assert runner.timeouts == []


def test_a_hang_is_one_named_timeout_then_the_device_is_out(runner: DeviceRunner, tmp_path: Path) -> None:
    start = time.monotonic()
    with pytest.raises(InfraError) as first:
        runner.plan("p1", [("a", ["run", "1"]), ("b", ["run", "hang"]), ("c", ["run", "3"])])
    assert time.monotonic() - start < 2.0 + 10  # one entry deadline (+ the watcher's ticks), not three
    # the step names the plan, the reason the entry; the one line a report shows names both, once each
    assert first.value.kind == "timeout" and first.value.step == "plan 'p1'" and "entry 'b'" in first.value.reason
    assert first.value.line().startswith("host: plan 'p1': timeout: entry 'b' gave no result within its deadline")
    assert _ran(tmp_path) == ["a", "b"]
    with pytest.raises(InfraError) as again:  # a later test of the same plan: same error, nothing run
        runner.plan("p1", [("a", ["run", "1"]), ("b", ["run", "hang"]), ("c", ["run", "3"])])
    assert again.value is first.value and _ran(tmp_path) == ["a", "b"]
    assert runner.retired is None
    assert runner.plan("p2", [("d", ["run", "4"])])["d"].ok  # other plans still run
    with pytest.raises(InfraError) as second:
        runner.single(["run", "hang"])
    assert second.value.kind == "timeout"
    assert runner.retired is not None and runner.retired.startswith("taken out of the run after 2 timeouts")
    with pytest.raises(InfraError, match="taken out of the run") as out:
        runner.plan("p3", [("e", ["run", "5"])])
    assert out.value.kind == "timeout" and "e" not in _ran(tmp_path)


def test_a_crash_under_the_watcher_is_a_crash_verdict(runner: DeviceRunner, tmp_path: Path) -> None:
    res = runner.plan("crashy", [("a", ["run", "1"]), ("b", ["run", "crash"]), ("c", ["run", "3"])])
    assert res["a"].ok and res["c"].ok  # the rest of the plan was sent again
    assert res["b"].crashed == "SIGSEGV" and "engine crashed (SIGSEGV)" in res["b"].describe()
    assert runner.timeouts == [] and _ran(tmp_path) == ["a", "b", "c"]


def test_the_emulators_crash_line_is_not_the_engines_stderr(runner: DeviceRunner) -> None:
    res = runner.plan("emulated", [("a", ["run", "1"]), ("b", ["run", "crash", "emulated"])])
    assert res["a"].ok and res["b"].crashed == "SIGSEGV"
    # the entry that finished in the same batch keeps the engine's own line, not qemu's
    assert res["a"].stderr == res["b"].stderr == "engine: a line of its own\n"


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for its reaper is dead)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.parametrize("hang", [True, False], ids=["timeout", "normal-end"])
def test_what_the_engine_command_started_dies_with_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hang: bool
) -> None:
    # The exec prefix forks a child that outlives nothing on its own: it must die with the engine's
    # process group when the watcher kills the engine at the deadline, and when the engine simply ends.
    farm = load_farm_file(host_farm(tmp_path))
    child = tmp_path / "child.pid"
    prefix = ["sh", "-c", 'sleep 300 </dev/null >/dev/null 2>&1 & echo $! >>"$CHILD_PID"; exec "$@"', "prefix"]
    device = farm.devices["host"].model_copy(update={"entry_timeout": 2.0, "exec_prefix": prefix})
    engine = tmp_path / "bmoe"
    engine.write_text(ENGINE.format(python=sys.executable, target=f"{device.arch}-linux-musl"))
    engine.chmod(0o755)
    monkeypatch.setenv("RUNS_LOG", str(tmp_path / "runs.log"))
    monkeypatch.setenv("CHILD_PID", str(child))
    with open_session(device, run_id="groups", engine=engine, build_id="abc") as session:
        runner = DeviceRunner(session)
        start = time.monotonic()
        if hang:
            with pytest.raises(InfraError) as err:
                runner.plan("p", [("a", ["run", "1"]), ("b", ["run", "hang"])])
            assert err.value.kind == "timeout" and "entry 'b'" in err.value.reason
        else:
            assert runner.plan("p", [("a", ["run", "1"])])["a"].ok
        assert time.monotonic() - start < 2.0 + 10
    pids = [int(p) for p in child.read_text().split()]  # the preflight's --version, then the plan's
    deadline = time.monotonic() + 3
    while _alive(pids[-1]) and time.monotonic() < deadline:
        time.sleep(0.05)
    survived = _alive(pids[-1])
    for pid in pids:  # a single run (the preflight's) is not under the watcher: clean up after it
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
    assert not survived, "the engine command's child outlived it"
