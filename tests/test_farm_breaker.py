"""The per-device breaker, and what a lost link leaves running on the device.

* Once a device's link is lost and one reconnect (bounded by ``connect_timeout``) fails, every later call
  of the run on that device is an infrastructure error at once, one line each: a dead phone costs one
  reconnect, not three per test (a 25 s run took 585 s when the adb server was killed six seconds in).
* A command whose link was lost keeps running on the device (neither adbd nor sshd kills a process that
  left the shell's group, and the engine does, under the plan's watcher). The nightly's short route trace
  was that: a plan re-run after a dropped link while the first run, still going on the device, rewrote
  its traces; the re-run read one of them half-written (G8b and REPLAY failed on a clean engine). Now the
  engine left behind is killed before the next engine command.
"""

from __future__ import annotations

import platform
import socket
import threading
import time
from pathlib import Path

import pytest
from adb_link import adb_link, needs_adb

from bmoe_ci.farm import DeviceSession, Ending, InfraError, RunResult, load_farm_file
from bmoe_ci.farm.transports.local import LocalTransport
from bmoe_ci.gaterun.runner import DeviceRunner

ARCH = {"arm64": "aarch64", "amd64": "x86_64"}.get(platform.machine().lower(), platform.machine().lower())


def _farm(tmp_path: Path, body: str) -> Path:
    farm = tmp_path / "farm.yaml"
    farm.write_text("version: 1\ndevices:\n" + body)
    return farm


class Link(LocalTransport):
    """A local device whose link can be cut (commands then fail as a dropped connection does) and whose
    connects are counted and can be refused."""

    def __init__(self, device):
        super().__init__(device)
        self.cut = False
        self.cut_once = False  # only the next command drops
        self.refuse = False
        self.connects = 0
        self.commands = 0

    def _connect(self) -> None:
        self.connects += 1
        if self.refuse:
            time.sleep(0.2)  # what a refused connect costs, more or less
            raise InfraError(self.device.name, "unreachable", "connection refused")
        super()._connect()

    def _run(self, argv, timeout, **kw):
        self.commands += 1
        if self.cut or self.cut_once:
            self.cut_once = False
            shown = kw.get("argv_shown") or tuple(argv)
            infra = InfraError(self.device.name, "disconnect", "the device went away while the command ran")
            return RunResult(self.device.name, shown, Ending.INFRA, infra=infra, timeout=timeout)
        return super()._run(argv, timeout, **kw)


FAKE_ENGINE = r'''#!/usr/bin/env python3
"""A stand-in engine for `batch /dev/stdin`: each entry writes its route trace (slowly while the file
`slow` exists beside it), then prints its result line."""
import json, os, sys, time
here = os.path.dirname(os.path.abspath(__file__))
for line in sys.stdin:
    entry = json.loads(line)
    argv = entry["argv"]
    slow = os.path.exists(os.path.join(here, "slow"))
    if "--route-trace" not in argv:
        print(json.dumps({"id": entry["id"], "ok": True}), flush=True)
        continue
    with open(argv[argv.index("--route-trace") + 1], "w") as fh:
        for row in range(300):
            fh.write(f"0,1,{row},0,0,1,0.5,0,1024,0,0,0,0,{os.getpid()}\n")  # whose row it is
            fh.flush()
            if slow:
                time.sleep(0.02)
    print(json.dumps({"id": entry["id"], "ok": True}), flush=True)
'''


def _runner(tmp_path: Path) -> tuple[DeviceRunner, Link]:
    farm = _farm(
        tmp_path,
        f"  - name: phone\n    kind: phone\n    arch: {ARCH}\n    transport: local\n    workdir: {tmp_path / 'w'}\n"
        "    retries: 2\n",
    )
    device = load_farm_file(farm).device("phone")
    link = Link(device)
    session = DeviceSession(device, results_dir=tmp_path / "results", transport=link)
    session.connect()
    (tmp_path / "w" / "store").mkdir()
    engine = tmp_path / "w" / "fake-engine"
    engine.write_text(FAKE_ENGINE)
    engine.chmod(0o755)
    session.engine = str(engine)
    return DeviceRunner(session), link


PLAN = [("one", ["run"])]


def test_a_lost_link_and_a_failed_reconnect_make_every_later_call_an_error_at_once(tmp_path: Path) -> None:
    runner, link = _runner(tmp_path)
    assert runner.plan("fixture:a", PLAN)["one"].ok
    link.cut, link.refuse = True, True  # the phone is gone: commands drop, connects are refused
    connects = link.connects
    with pytest.raises(InfraError) as first:
        runner.plan("fixture:b", PLAN)
    assert first.value.kind == "disconnect"
    assert link.connects == connects + 1  # ONE reconnect, no retries
    assert runner.broken is not None
    started = time.monotonic()
    calls = [
        lambda: runner.plan("fixture:c", PLAN),
        lambda: runner.single(["-c", "pass"]),
        lambda: runner.texts("traces:c", [str(tmp_path / "w" / "x")]),
        lambda: runner.pull(str(tmp_path / "w" / "x"), "x"),
    ] * 5
    lines = []
    for call in calls:
        with pytest.raises(InfraError) as err:
            call()
        lines.append(err.value.line())
    assert time.monotonic() - started < 1.0  # nothing reached for the device again
    assert link.connects == connects + 1 and link.commands == link.commands
    assert all("\n" not in line and line.startswith("phone: ") for line in lines)
    assert "taken out of the run: its link was lost" in lines[0] and "one reconnect failed" in lines[0]
    assert "unreachable: connection refused" in lines[0]
    assert lines[0].count("phone:") == 1  # the device named once, not "phone: setup: phone: ..."


def test_a_link_that_comes_back_at_the_reconnect_keeps_the_device_in_the_run(tmp_path: Path) -> None:
    runner, link = _runner(tmp_path)
    link.cut_once = True  # one command drops; the reconnect finds the device again
    with pytest.raises(InfraError):
        runner.plan("fixture:a", PLAN)
    assert runner.broken is None
    # the plan is not remembered as failed: the next test that needs it runs it (it is that test's first run)
    assert runner.plan("fixture:a", PLAN)["one"].ok


@needs_adb
def test_an_engine_left_running_by_a_lost_link_is_killed_before_the_plan_runs_again(tmp_path: Path) -> None:
    work = tmp_path / "phone"
    (work / "store").mkdir(parents=True)
    engine = work / "fake-engine"
    engine.write_text(FAKE_ENGINE)
    engine.chmod(0o755)
    trace = work / "trace-x-e1.csv"
    plan = [("e1", ["run", "--route-trace", str(trace)])]
    with adb_link(tmp_path / "link") as link:
        farm = _farm(tmp_path, link.device_yaml("phone", ARCH, work, "    retries: 0\n"))
        session = DeviceSession(load_farm_file(farm).device("phone"), results_dir=tmp_path / "results")
        session.connect()
        session.engine = str(engine)
        runner = DeviceRunner(session)
        (work / "slow").touch()  # the first run takes 6 s
        errors: list[InfraError] = []

        def first() -> None:
            try:
                got = runner.plan("fixture:x", plan)
                raise AssertionError(f"the plan survived its link: {got}")
            except InfraError as exc:
                errors.append(exc)

        thread = threading.Thread(target=first)
        thread.start()
        deadline = time.monotonic() + 30
        while (not trace.exists() or trace.stat().st_size < 2000) and time.monotonic() < deadline:
            time.sleep(0.05)
        link.adb("disconnect", link.serial)  # the link drops; the plan goes on running on the phone
        thread.join(60)
        assert errors and errors[0].kind in ("disconnect", "unreachable"), errors
        assert runner.broken is None  # the reconnect (adb connect) found the phone again
        (work / "slow").unlink()  # the second run is quick: without the kill it would be read mid-rewrite
        results = runner.plan("fixture:x", plan)
        assert results["e1"].ok
        text = runner.texts("traces:x", [str(trace)])[str(trace)]
        time.sleep(1.5)  # what the first run would still have written meanwhile
        rows = [line.split(",") for line in (text or "").splitlines()]
        assert [int(r[2]) for r in rows] == list(range(300))
        assert len({r[-1] for r in rows}) == 1, "rows of two runs in one trace"
        assert trace.read_text() == text, "the trace changed after the run that wrote it had ended"
    assert not list((work / "store").glob(".tmp-batch-*")), "the killed run's files are gone too"


@needs_adb
def test_a_hung_adb_server_costs_one_connect_timeout(tmp_path: Path) -> None:
    """A server that accepts and never answers (it used to cost 48.6 s per connect: three tries of
    connect_timeout + 5 s and their backoff)."""
    with socket.socket() as hung:
        hung.bind(("127.0.0.1", 0))
        hung.listen(8)  # the kernel accepts; nobody reads
        port = hung.getsockname()[1]
        farm = _farm(
            tmp_path,
            f"  - name: phone\n    kind: phone\n    os: android\n    arch: {ARCH}\n    transport: adb\n"
            f'    serial: "127.0.0.1:5555"\n    adb_server: "127.0.0.1:{port}"\n    workdir: /data/local/tmp/x\n'
            "    connect_timeout: 2\n    retries: 2\n",
        )
        session = DeviceSession(load_farm_file(farm).device("phone"))
        started = time.monotonic()
        with pytest.raises(InfraError) as err:
            session.connect()
        took = time.monotonic() - started
    assert err.value.kind == "timeout" and "no answer" in err.value.reason, err.value
    assert took < 2 + 2, f"{took:.1f}s"
