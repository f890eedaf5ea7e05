"""The farm under faults, end to end through the real gate suite on local devices: every scenario
asserts the verdicts, the counts, a time bound and what is left on the device."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import junitparser

from bmoe_ci.reports.journal import finished_tests
from bmoe_ci.standins import localfarm
from gate_run import DET, DET_ONE, DET_ONE_PLAN, DET_TWO_CALLS, REPO, host_farm, run_gates, without_xdev


def _k(selection: tuple[str, ...]) -> tuple[str, ...]:
    """pytest's -k for a selection of DET's tests (a gate run started here, not through run_gates)."""
    return ("-k", " or ".join(selection))


def _store(tmp_path: Path) -> Path:
    return tmp_path / "work" / "store"


STORE_MARK = ".bmoe-ci"  # the empty file that says bmoe-ci made the store (farm/store.py)


def _held(store: Path) -> list[Path]:
    """The stored files (named by their sha256): neither the store's mark nor an upload temporary."""
    return sorted(p for p in store.iterdir() if not p.name.startswith("."))


def _assert_whole(store: Path) -> None:
    """What is left in a store: its mark, and files under their own sha256; no temporaries."""
    for p in store.iterdir():
        if p.name == STORE_MARK:
            assert p.is_file() and not p.is_symlink() and p.stat().st_size == 0
        else:
            assert not p.name.startswith(".tmp-"), p.name
            assert hashlib.sha256(p.read_bytes()).hexdigest() == p.name


def _flip_byte(path: Path, offset: int) -> None:
    path.chmod(0o644)
    data = bytearray(path.read_bytes())
    data[offset % len(data)] ^= 0x01
    path.write_bytes(bytes(data))


def test_flipped_bytes_in_the_stored_engine_and_fixture_are_repushed_and_the_run_passes(tmp_path: Path) -> None:
    farm = host_farm(tmp_path)
    first = run_gates(tmp_path, farm=farm, modules=DET, select=DET_ONE, results=tmp_path / "r1")
    assert first.returncode == 0, first.output[-3000:]
    stored = _held(_store(tmp_path))
    assert len(stored) >= 2  # the engine and the fixture
    for i, p in enumerate(stored):
        _flip_byte(p, 1000 + i)
    start = time.monotonic()
    second = run_gates(tmp_path, farm=farm, modules=DET, select=DET_ONE, results=tmp_path / "r2")
    took = time.monotonic() - start
    host = without_xdev(second.summary["devices"]["host"])
    assert second.returncode == 0, second.output[-3000:]
    assert host["status"] == "pass" and host["failed"] == 0 and host["errors"] == 0
    assert host["tests"] == without_xdev(first.summary["devices"]["host"])["tests"] == len(DET_ONE)
    assert len(host["repushed"]) == len(stored) and all("stored copy" in r for r in host["repushed"])
    assert host["verified_files"] == len(stored)
    assert host["pushed_bytes"] == sum(p.stat().st_size for p in stored)
    assert took < 300
    _assert_whole(_store(tmp_path))  # what is left on the device: intact files under their hashes
    assert "re-pushed" in (tmp_path / "r2" / "summary.md").read_text()


def test_a_file_that_keeps_arriving_corrupted_is_an_infrastructure_error(tmp_path: Path) -> None:
    # The device's sha256sum sees every upload differently from the controller: a broken link or disk.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    liar = bin_dir / "sha256sum"
    liar.write_text('#!/bin/sh\necho "0000000000000000000000000000000000000000000000000000000000000000  $1"\n')
    liar.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    run = run_gates(tmp_path, modules=DET, select=DET_ONE, env=env)
    host = without_xdev(run.summary["devices"]["host"])
    assert run.returncode == 1, run.output[-3000:]
    assert host["status"] != "pass" and host["passed"] == 0 and host["failed"] == 0
    assert "hash mismatch again" in host["infra_error"] and "expected" in host["infra_error"]
    assert not [p for p in _store(tmp_path).iterdir() if p.name.startswith(".tmp-")]


def _two_device_farm(tmp_path: Path, entry_timeout: float) -> Path:
    base = host_farm(tmp_path).read_text().split("devices:\n", 1)
    one = base[1]
    two = one.replace("name: host", "name: host-b").replace(str(tmp_path / "work"), str(tmp_path / "work-b"))
    farm = tmp_path / "farm2.yaml"
    farm.write_text(f"{base[0]}defaults:\n  entry_timeout: {entry_timeout}\ndevices:\n{one}{two}")
    return farm


def _engines_under(store: Path) -> list[int]:
    """Pids of engine processes started from `store` (the watcher's sh names it too: not counted)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].startswith(str(store).encode()) and b"batch" in argv:
            pids.append(int(proc.name))
    return pids


def test_a_stopped_engine_is_one_named_timeout_and_the_other_device_finishes(tmp_path: Path) -> None:
    deadline = 8.0
    farm = _two_device_farm(tmp_path, deadline)
    start = time.monotonic()
    healthy = run_gates(tmp_path, farm=farm, device="all", modules=DET, select=DET_ONE_PLAN, results=tmp_path / "r1")
    healthy_s = time.monotonic() - start
    assert healthy.returncode == 0, healthy.output[-3000:]

    stopped: set[int] = set()
    done = threading.Event()

    def stop_engines() -> None:  # SIGSTOP every engine batch on device `host`, as it starts
        while not done.is_set():
            for pid in _engines_under(tmp_path / "work" / "store"):
                if pid not in stopped:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGSTOP)
                    stopped.add(pid)
            # the plan's batch lives some tens of milliseconds on an idle machine: a 20 ms poll let it
            # finish before it was stopped (CI, 2026-12-04); one scan of /proc takes about a millisecond
            time.sleep(0.001)

    stopper = threading.Thread(target=stop_engines, daemon=True)
    stopper.start()
    start = time.monotonic()
    try:
        run = run_gates(tmp_path, farm=farm, device="all", modules=DET, select=DET_ONE_PLAN, results=tmp_path / "r2")
    finally:
        done.set()
        stopper.join()
    took = time.monotonic() - start
    host, other = without_xdev(run.summary["devices"]["host"]), without_xdev(run.summary["devices"]["host-b"])
    assert run.returncode == 1, run.output[-3000:]
    assert other["status"] == "pass" and other["tests"] == other["passed"] == len(DET_ONE_PLAN)
    # every test of `host` needs the one plan: one timeout, one engine stopped, no re-run, no verdict
    assert len(stopped) == 1
    assert host["errors"] == host["tests"] == other["tests"] and host["failed"] == host["passed"] == 0
    problems = [p for p in run.summary["problems"] if p["device"] == "host"]
    assert len(problems) == host["tests"]
    # one line each: device, the plan (the step), the kind, and the entry that gave no result
    assert all(
        re.match(
            r"host: plan 'fixture:qwen3moe': timeout: entry '[\w-]+' gave no result within its deadline of 8s",
            p["message"],
        )
        for p in problems
    ), problems
    assert took <= healthy_s + deadline + 60, (took, healthy_s)
    # what is left: the stopped engine was killed on the device, no result file behind
    assert all(not Path(f"/proc/{pid}").exists() or "Z" in _state(pid) for pid in stopped)
    assert not [p for p in (tmp_path / "work" / "store").iterdir() if p.name.startswith(".tmp-")]


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"


def test_a_killed_controller_leaves_results_that_add_up_and_the_next_run_starts(tmp_path: Path) -> None:
    ttl = 6.0
    farm = _two_device_farm(tmp_path, 60.0)
    farm.write_text(farm.read_text().replace("defaults:\n", f"defaults:\n  lease_ttl: {ttl}\n"))
    killed = tmp_path / "killed"
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        *DET,
        *_k(DET_ONE_PLAN),
        "-p",
        "no:cacheprovider",
        "-q",
        "-n",
        "2",
        "--bmoe-farm",
        str(farm),
        "--bmoe-device",
        "all",
        "--bmoe-results",
        str(killed),
        "--bmoe-fixture",
        "qwen3moe",
        "--bmoe-fixture",
        "gemma4",
    ]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and proc.poll() is None:
            if _finished_records(killed) >= 1:
                break
            time.sleep(0.05)
        assert proc.poll() is None, "the run ended before it could be killed"
        os.killpg(proc.pid, signal.SIGKILL)  # the controller and its xdist workers
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    finished = _finished_records(killed)
    assert not (killed / "summary.json").exists() and (killed / "plan.json").is_file()
    # local engines die with their controller: the watcher's loop sees its shell gone within about a
    # second (parent-death signal on the shell); a loaded machine gets a few more seconds, not more
    left = _engines_left(tmp_path, within_s=10.0)
    assert left == [], left

    start = time.monotonic()
    nxt = run_gates(tmp_path, farm=farm, device="all", modules=DET, select=DET_ONE, results=tmp_path / "next")
    assert nxt.returncode == 0, nxt.output[-3000:]
    assert time.monotonic() - start < ttl + 10 + 120
    assert "broke stale lock" in nxt.output

    out = subprocess.run(
        [sys.executable, "-m", "bmoe_ci.cli", "report", str(killed), "--format", "json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 1, out.stderr
    summary = json.loads(out.stdout)
    plan = json.loads((killed / "plan.json").read_text())["tests"]
    merged = junitparser.JUnitXml.fromfile(str(killed / "junit.xml"))
    cases = [c for suite in merged for c in suite]
    xdev = [c for c in cases if c.classname.endswith("reports.xdev")]  # derived, over and above the plan
    cases = [c for c in cases if c not in xdev]
    assert len(cases) == len(plan) == 2 * 2 * len(DET_ONE_PLAN) == summary["totals"]["tests"] - len(xdev)
    interrupted = [c for c in cases if c.result and "run interrupted" in (c.result[0].message or "")]
    assert len(interrupted) == len(plan) - finished > 0
    xdev_passed = sum(1 for c in xdev if not c.result)
    assert summary["totals"]["passed"] - xdev_passed == finished and summary["totals"]["failed"] == 0


def _engines_left(tmp_path: Path, within_s: float) -> list[int]:
    """The engines still running under either device's store once `within_s` seconds have passed."""
    deadline = time.monotonic() + within_s
    while True:
        left = [
            pid
            for work in ("work", "work-b")
            for pid in _engines_under(tmp_path / work / "store")
            if "Z" not in _state(pid)
        ]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def _finished_records(results: Path) -> int:
    return sum(finished_tests(results / dev) for dev in ("host", "host-b"))


def _gates(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "pytest", *DET, "-p", "no:cacheprovider", "-q", "--bmoe-fixture", "qwen3moe", *args]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300, check=False)


def test_bad_options_are_refused_before_any_device_is_touched(tmp_path: Path) -> None:
    farm = host_farm(tmp_path)
    a_file = tmp_path / "results-file"
    a_file.write_text("not a directory\n")
    read_only = tmp_path / "ro"
    read_only.mkdir()
    read_only.chmod(0o555)
    cases = [
        (("--bmoe-results", str(a_file)), "exists and is not a directory"),
        (("--bmoe-results", str(a_file / "sub")), "is not a directory"),
        (("--bmoe-lock-wait", "-1"), "--bmoe-lock-wait -1: must be 0 or more seconds"),
    ]
    if os.geteuid() != 0:  # root writes anywhere
        cases.append((("--bmoe-results", str(read_only / "r")), "is not writable"))
    mips = tmp_path / "mips.yaml"
    mips.write_text(farm.read_text().replace("arch: x86_64", "arch: mips").replace("arch: aarch64", "arch: mips"))
    cases.append(
        (("--bmoe-farm", str(mips), "--bmoe-results", str(tmp_path / "r")), f"{mips}:6: devices[0].arch: unknown arch")
    )
    for args, expected in cases:
        full = args if "--bmoe-farm" in args else ("--bmoe-farm", str(farm), *args)
        r = _gates(tmp_path, "--bmoe-device", "host", *full)
        out = r.stdout + r.stderr
        assert r.returncode == 4 and expected in out, (args, out[-2000:])
        assert "Traceback" not in out
        assert not (tmp_path / "work").exists()  # the device's work directory was never created
    assert a_file.read_text() == "not a directory\n"


def test_a_device_failing_its_health_check_is_quarantined_skipped_and_released(tmp_path: Path) -> None:
    farm = host_farm(tmp_path)
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    farm.write_text(
        farm.read_text() + "  - name: broken\n    kind: phone\n    arch: x86_64\n    transport: local\n"
        f"    workdir: {blocker}/work\n    quarantine_after: 1\n    quarantine_hours: 1\n"
    )
    start = time.monotonic()
    first = run_gates(tmp_path, farm=farm, device="all", modules=DET, select=DET_ONE, results=tmp_path / "r1")
    broken = first.summary["devices"]["broken"]
    assert first.returncode == 1 and broken["errors"] == 2 and broken["passed"] == broken["failed"] == 0
    assert "broken: quarantined until" in first.output and first.summary["notes"] == []
    second = run_gates(tmp_path, farm=farm, device="all", modules=DET, select=DET_ONE, results=tmp_path / "r2")
    assert time.monotonic() - start < 240
    assert second.returncode == 0, second.output[-2000:]
    assert list(second.summary["devices"]) == ["host"]
    assert without_xdev(second.summary["devices"]["host"])["status"] == "pass"
    [note] = second.summary["notes"]
    assert note.startswith("broken skipped: quarantined until ")
    assert "failed its health check on 1 consecutive runs" in note and "cannot create work directory" in note
    assert "broken skipped: quarantined" in (tmp_path / "r2" / "summary.md").read_text()
    status = subprocess.run(
        [sys.executable, "-m", "bmoe_ci.cli", "farm", "status", "--farm", str(farm)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert "QUARANTINED (quarantined until" in status.stdout
    rel = subprocess.run(
        [sys.executable, "-m", "bmoe_ci.cli", "farm", "release", "broken", "--farm", str(farm)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert rel.returncode == 0 and rel.stdout.startswith("broken: released (was quarantined until")
    status = subprocess.run(
        [sys.executable, "-m", "bmoe_ci.cli", "farm", "status", "--farm", str(farm), "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert [d["quarantine"] for d in json.loads(status.stdout)["devices"]] == [None, None]


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(proc.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def test_a_device_whose_sshd_dies_mid_run_gives_errors_and_the_other_passes(tmp_path: Path) -> None:
    state = tmp_path / "farm"
    with localfarm.running(state) as resolved:
        ssh_name = str(localfarm.layout()["SSH_HOST_NAME"])
        farm = state / "faults.yaml"  # beside the resolved file: its relative paths still hold
        farm.write_text(resolved.read_text().replace("  min_free_mb: 64\n", "  min_free_mb: 64\n  retries: 1\n"))
        sshd = json.loads((state / "farm.json").read_text())["sshd"][ssh_name]["pid"]
        results = tmp_path / "r"
        killed: list[int] = []

        def kill_when_one_test_finished() -> None:
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline and not killed:
                with contextlib.suppress(OSError, ValueError):
                    if finished_tests(results / ssh_name):
                        for pid in [sshd, *_descendants(sshd)]:  # the listener and every session under it
                            with contextlib.suppress(ProcessLookupError):
                                os.kill(pid, signal.SIGKILL)
                            killed.append(pid)
                time.sleep(0.05)

        killer = threading.Thread(target=kill_when_one_test_finished, daemon=True)
        killer.start()
        start = time.monotonic()
        run = run_gates(
            tmp_path, farm=farm, device=f"host,{ssh_name}", modules=DET, select=DET_TWO_CALLS, results=results
        )
        took = time.monotonic() - start
        killer.join()
        assert killed, "the ssh device never finished a test"
        host, dead = without_xdev(run.summary["devices"]["host"]), without_xdev(run.summary["devices"][ssh_name])
        assert run.returncode == 1, run.output[-3000:]
        assert host["status"] == "pass" and host["passed"] == host["tests"] == len(DET_TWO_CALLS)
        assert dead["failed"] == 0 and dead["passed"] >= 1 and dead["errors"] >= 1
        assert dead["passed"] + dead["errors"] == dead["tests"] == len(DET_TWO_CALLS)
        problems = [p for p in run.summary["problems"] if p["device"] == ssh_name]
        assert problems and all(any(k in p["message"] for k in ("unreachable", "disconnect")) for p in problems)
        assert took < 240
        assert _engines_under(state / "devices" / ssh_name / "store") == []


def _gates_cmd(farm: Path, results: Path, *args: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "pytest",
        *DET,
        *_k(DET_ONE),
        "-p",
        "no:cacheprovider",
        "-q",
        "--bmoe-farm",
        str(farm),
        "--bmoe-device",
        "host",
        "--bmoe-results",
        str(results),
        "--bmoe-fixture",
        "qwen3moe",
        *args,
    ]


def _summary(results: Path) -> dict:
    return json.loads((results / "summary.json").read_text())


def test_a_second_run_on_a_leased_device_is_busy_or_waits_for_it(tmp_path: Path) -> None:
    farm = host_farm(tmp_path)
    # The same device, its engine held by an exec prefix (farm file only) until `go` exists: the first run
    # holds the lease until the busy run has been refused and the waiting one has said it waits. Its
    # command_timeout outlasts the others' start-up on a loaded machine: held at its preflight probe, it
    # would otherwise give up after the default 120 s and end before they met its lease.
    go = tmp_path / "go"
    held = tmp_path / "held.yaml"
    held.write_text(
        farm.read_text()
        + f'    exec_prefix: [sh, -c, \'while [ ! -e "$0" ]; do sleep 0.05; done; exec "$@"\', {go}]\n'
        + "    command_timeout: 900\n"
    )
    lease = tmp_path / "work" / ".bmoe-ci-lock" / "owner"
    start = time.monotonic()
    first = subprocess.Popen(
        _gates_cmd(held, tmp_path / "r1"),
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    waiter: subprocess.Popen[str] | None = None
    try:
        while not lease.is_file() and first.poll() is None and time.monotonic() - start < 120:
            time.sleep(0.05)
        assert first.poll() is None and lease.is_file(), "the first run never leased the device"
        waiter = subprocess.Popen(
            _gates_cmd(farm, tmp_path / "r3", "--bmoe-lock-wait", "900"),
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},  # its lines as it says them
        )
        waited: list[str] = []
        waiting = threading.Event()

        def read_waiter() -> None:
            assert waiter is not None and waiter.stdout is not None
            for line in waiter.stdout:
                waited.append(line)
                if "waiting up to" in line:
                    waiting.set()

        reader = threading.Thread(target=read_waiter, daemon=True)
        reader.start()
        busy = subprocess.run(
            _gates_cmd(farm, tmp_path / "r2"), cwd=REPO, capture_output=True, text=True, timeout=600, check=False
        )
        met = waiting.wait(timeout=600)
        still_held = first.poll() is None
        go.touch()  # the first run goes on, ends and releases the lease; the waiter takes it
        first_rc = first.wait(timeout=120)
        waiter.wait(timeout=180)
        reader.join(timeout=10)
        waited_out = "".join(waited)
    finally:
        go.touch()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(first.pid, signal.SIGKILL)
        if waiter is not None and waiter.poll() is None:
            waiter.kill()
    assert still_held, "the first run ended before the others met its lease"
    assert met, f"the waiting run never said it waits:\n{waited_out[-3000:]}"
    # the busy run: every test an infrastructure error naming the holder, nothing pushed, no verdict
    refused = without_xdev(_summary(tmp_path / "r2")["devices"]["host"])
    assert busy.returncode == 1, busy.stdout[-3000:]
    # the gate's tests and the device's own setup record: all errors
    n = len(DET_ONE)
    assert refused["errors"] == refused["tests"] == n + 1 and refused["passed"] == refused["failed"] == 0
    assert refused["gate_counts"]["DET"] == {"pass": 0, "fail": 0, "error": n, "skip": 0}
    assert refused["pushed_bytes"] == 0
    msg = refused["infra_error"]
    holder = rf"\S+ \(pid {first.pid} on {re.escape(socket.gethostname())}\)"
    assert re.search(
        rf"busy, held by {holder} since [\d-]+ [\d:]+ UTC; "
        r"heartbeat \d+s ago, expires in \d+s \(ttl 180s\)",
        msg,
    ), msg
    # the first run and the waiting one both pass; the waiter ran after the first released the lease
    assert first_rc == 0 and without_xdev(_summary(tmp_path / "r1")["devices"]["host"])["passed"] == n
    assert waiter.returncode == 0, waited_out[-3000:]
    assert without_xdev(_summary(tmp_path / "r3")["devices"]["host"])["passed"] == n
    assert f"pid {first.pid}" in waited_out
    # it took the lease the first run released, not a lease it broke as stale (its owner gone)
    assert "broke stale lock" not in waited_out, waited_out[-3000:]
    assert not lease.exists()  # what is left: no lease, no temporaries
    assert not [p for p in _store(tmp_path).iterdir() if p.name.startswith(".tmp-")]


def test_too_little_free_space_refuses_the_device_before_any_upload_and_the_other_goes_on(tmp_path: Path) -> None:
    farm = _two_device_farm(tmp_path, 60.0)
    text = farm.read_text().replace("name: host\n", "name: host\n    min_free_mb: 100000000\n", 1)
    farm.write_text(text)
    start = time.monotonic()
    run = run_gates(tmp_path, farm=farm, device="all", modules=DET, select=DET_ONE)
    took = time.monotonic() - start
    full, other = without_xdev(run.summary["devices"]["host"]), without_xdev(run.summary["devices"]["host-b"])
    assert run.returncode == 1, run.output[-3000:]
    assert other["status"] == "pass" and other["passed"] == other["tests"] == len(DET_ONE)
    assert full["errors"] == full["tests"] and full["passed"] == full["failed"] == 0
    assert full["gate_counts"]["DET"] == {"pass": 0, "fail": 0, "error": len(DET_ONE), "skip": 0}
    assert full["pushed_bytes"] == 0
    assert "MiB free" in full["infra_error"] and "100000000 MiB" in full["infra_error"]
    assert "min_free_mb" in full["infra_error"]
    assert took < 90
    # what is left on the refused device: nothing stored, nothing half-uploaded
    store = _store(tmp_path)
    assert not store.exists() or {p.name for p in store.iterdir()} <= {STORE_MARK}


@contextlib.contextmanager
def _cut_first_upload(store: Path, sshd: int) -> Iterator[list[int]]:
    """The device drops while the first upload's temporary grows: every ssh session (sftp is served inside
    the session process) is killed; the listener stays, so a reconnect or the next run gets in."""
    killed: list[int] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set() and not killed:
            if store.is_dir() and any(p.name.startswith(".tmp-") for p in store.iterdir()):
                for pid in _descendants(sshd):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
            time.sleep(0.002)

    killer = threading.Thread(target=watch, daemon=True)
    killer.start()
    try:
        yield killed
    finally:
        done.set()
        killer.join()
    assert killed, "no upload was caught in flight"


def _junit_props(path: Path) -> dict[str, str]:
    suite = next(iter(junitparser.JUnitXml.fromfile(str(path))))
    return {p.name: p.value for p in suite.properties()}


def test_an_interrupted_push_leaves_nothing_served_and_the_next_run_passes(tmp_path: Path) -> None:
    state = tmp_path / "farm"
    with localfarm.running(state) as resolved:
        ssh_name = str(localfarm.layout()["SSH_HOST_NAME"])
        farm = state / "no-retry.yaml"  # beside the resolved file: its relative paths still hold
        farm.write_text(resolved.read_text().replace("  min_free_mb: 64\n", "  min_free_mb: 64\n  retries: 0\n"))
        sshd = json.loads((state / "farm.json").read_text())["sshd"][ssh_name]["pid"]
        store = state / "devices" / ssh_name / "store"
        start = time.monotonic()
        with _cut_first_upload(store, sshd):
            cut = run_gates(tmp_path, farm=farm, device=ssh_name, modules=DET, select=DET_ONE, results=tmp_path / "r1")
        cut_s = time.monotonic() - start
        dev = without_xdev(cut.summary["devices"][ssh_name])
        assert cut.returncode == 1, cut.output[-3000:]
        assert dev["errors"] == dev["tests"] and dev["passed"] == dev["failed"] == 0
        assert dev["gate_counts"]["DET"] == {"pass": 0, "fail": 0, "error": len(DET_ONE), "skip": 0}
        assert "disconnect" in dev["infra_error"] and "upload of" in dev["infra_error"], dev["infra_error"]
        # never served unverified: the cut upload is left only under its temporary name, what has a name is complete
        [cut_tmp] = [p for p in store.iterdir() if p.name.startswith(".tmp-")]
        cut_sha = cut_tmp.name.split("-")[1]
        assert not (store / cut_sha).exists()
        for p in _held(store):
            assert hashlib.sha256(p.read_bytes()).hexdigest() == p.name

        again = run_gates(tmp_path, farm=farm, device=ssh_name, modules=DET, select=DET_ONE, results=tmp_path / "r2")
        took = time.monotonic() - start
        dev = without_xdev(again.summary["devices"][ssh_name])
        assert again.returncode == 0, again.output[-3000:]
        assert dev["status"] == "pass" and dev["passed"] == dev["tests"] == len(DET_ONE)
        assert cut_s < 60 and took < 120
        left = _held(store)
        assert left
        _assert_whole(store)
        assert cut_sha in {p.name for p in left}  # the cut file, uploaded again and verified
        assert without_xdev(cut.summary["devices"][ssh_name])["retries"] == dev["retries"] == 0  # retries: 0

        # with a retry allowed, the same cut costs one retry and the run passes; the retry is recorded
        for p in left:
            p.chmod(0o644)
            p.unlink()
        farm.write_text(farm.read_text().replace("  retries: 0\n", "  retries: 1\n"))
        with _cut_first_upload(store, sshd):
            retried = run_gates(
                tmp_path, farm=farm, device=ssh_name, modules=DET, select=DET_ONE, results=tmp_path / "r3"
            )
        dev = without_xdev(retried.summary["devices"][ssh_name])
        assert retried.returncode == 0, retried.output[-3000:]
        assert dev["status"] == "pass" and dev["passed"] == dev["tests"] == len(DET_ONE) and dev["retries"] == 1
        [note] = dev["retry_notes"]
        assert note.startswith("upload of ") and "disconnect" in note and "retry 1 of 1" in note
        props = _junit_props(tmp_path / "r3" / ssh_name / "junit.xml")
        assert props["retries"] == "1" and props["retry.0"] == note
        assert "Transient failures retried" in (tmp_path / "r3" / "summary.md").read_text()
        assert not [p for p in store.iterdir() if p.name.startswith(".tmp-")]
        assert time.monotonic() - start < 150
