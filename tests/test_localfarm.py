"""The embedded local farm (up/down/status/check), device locks and sessions (push + preflight) on it."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import threading
import time
from pathlib import Path

import pytest

from bmoe_ci.cli import environment_defaults
from bmoe_ci.cli_farm import add_farm_commands
from bmoe_ci.farm import (
    DeviceBusy,
    DeviceLock,
    Ending,
    InfraError,
    LockOwner,
    MissingTool,
    PushItem,
    embedded,
    load_farm,
    load_farm_file,
    open_session,
    open_transport,
    read_lock,
    select_devices,
)
from bmoe_ci.farm.lock import LOCK_DIR
from bmoe_ci.farm.pids import pid_running
from bmoe_ci.paths import Places
from bmoe_ci.standins import localfarm

SSH = str(localfarm.layout()["SSH_HOST_NAME"])
ARCH = localfarm.host_arch()


@pytest.fixture(scope="module")
def state(tmp_path_factory: pytest.TempPathFactory):
    st = tmp_path_factory.mktemp("localfarm")
    with localfarm.running(st):
        yield st


@pytest.fixture(scope="module")
def farm(state: Path):
    return load_farm_file(state / "farm.yaml")


#: what a stand-in engine says its CPU runs (`info --types`): every path, so any pinned one passes
ALL_PATHS = '{"ok":true,"kernels_available":["scalar","avx2","avx512-vnni","neon","neon-dot"]}'


def stand_in(tmp_path: Path, target: str = f"{ARCH}-linux-musl", build: str = "abc", name: str = "bmoe") -> Path:
    """A stand-in engine: answers --version like the real one, and can sleep or crash on request."""
    p = tmp_path / name
    p.write_text(
        "#!/bin/sh\n"
        f'case "$1" in --version) echo "bmoe 0.1.0 build {build} target {target}";;\n'
        f"  info) echo '{ALL_PATHS}';;\n"  # the preflight's check of a device's pinned kernel path
        '  sleep) sleep "$2";; crash) kill -SEGV $$;; *) echo "ran: $*";; esac\n'
    )
    p.chmod(0o755)
    return p


def run_cli(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="bmoe-ci")
    add_farm_commands(parser.add_subparsers(dest="command"))
    parser.set_defaults(**environment_defaults(os.environ))  # as bmoe_ci.cli.main does
    args = parser.parse_args(list(argv))
    return args.func(args)


# ------------------------------------------------------------------------------------------ up / down


def test_up_is_idempotent_and_the_farm_is_complete(state: Path, farm) -> None:
    record = json.loads((state / "farm.json").read_text())
    again = localfarm.up(state)
    after = json.loads((state / "farm.json").read_text())
    assert after["sshd"] == record["sshd"] and after["adb"] == record["adb"]  # same pids, same ports
    assert load_farm_file(again).devices == farm.devices
    assert farm.names == ["host", "phone-emu", SSH, "ssh-arm64", "adb-arm64"]
    adb = farm.devices["adb-arm64"]
    assert (adb.transport, adb.kind, adb.os, adb.arch) == ("adb", "phone", "android", "aarch64")
    assert adb.link.serial == f"127.0.0.4:{record['adb']['adbd']['port']}"
    assert adb.link.adb_server == f"127.0.0.1:{record['adb']['server']['port']}"
    assert record["adb"]["server"]["port"] != 5037  # never the user's own adb server
    phone = farm.devices["phone-emu"]
    assert (phone.kind, phone.arch) == ("phone", "aarch64")
    if ARCH != "aarch64":
        assert phone.exec_prefix == ("qemu-aarch64-static",) and phone.timeout_scale == 8
        assert farm.devices["ssh-arm64"].exec_prefix == ("qemu-aarch64-static",)
    assert (farm.devices[SSH].link.host, farm.devices["ssh-arm64"].link.host) == ("127.0.0.2", "127.0.0.3")
    assert [d.name for d in select_devices(farm, "pool:nightly")] == farm.names
    kh = (state / "known_hosts").read_text()
    assert f"[127.0.0.2]:{farm.devices[SSH].link.port} ssh-ed25519 " in kh
    assert all(v["running"] and v["answering"] for v in localfarm.sshd_status(state).values())


def test_status_and_check_commands(state: Path, farm, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setenv("BMOE_CI_STATE", str(state))  # read by the command line (run_cli) below
    # the default farm is the local farm's state file
    assert load_farm(places=Places.from_environ(os.environ)).names == farm.names
    assert run_cli("farm", "check") == 0
    out = capsys.readouterr().out
    assert out.count(" ok ") == 5, out
    assert run_cli("farm", "status", "--json") == 0
    rows = json.loads(capsys.readouterr().out)["devices"]
    assert [r["device"] for r in rows] == farm.names and all(r["reachable"] for r in rows)
    assert run_cli("farm", "status", "--device", "nope") == 2
    assert "unknown device 'nope'; known devices: host, phone-emu" in capsys.readouterr().err
    assert run_cli("farm", "check", "--farm", str(state / "missing.yaml")) == 2
    assert "cannot read farm file" in capsys.readouterr().err


def test_check_reports_an_unreachable_device(farm, tmp_path: Path, capsys) -> None:
    text = (farm.path).read_text().replace(f"port: {farm.devices[SSH].link.port}", "port: 1")
    bad = farm.path.parent / "broken.yaml"
    bad.write_text(text)
    try:
        assert run_cli("farm", "check", "--farm", str(bad), "--device", f"{SSH},host") == 1
    finally:
        bad.unlink()
    out = capsys.readouterr()
    assert f"{SSH}  FAIL  unreachable:" in out.out and "1 of 2 device(s) failed" in out.err


def test_down_stops_only_what_up_started(tmp_path: Path) -> None:
    st = tmp_path / "farm2"
    localfarm.up(st)
    first = json.loads((st / "farm.json").read_text())["sshd"][SSH]
    localfarm._stop(first["pid"])  # an sshd that died: the next `up` restarts it on the same port
    localfarm.up(st)
    record = json.loads((st / "farm.json").read_text())
    again = record["sshd"][SSH]
    assert again["pid"] != first["pid"] and again["port"] == first["port"]
    assert localfarm.sshd_status(st)[SSH]["answering"]
    pids = [v["pid"] for v in record["sshd"].values()]
    decoy = subprocess.Popen(["sleep", "30"])
    try:
        # a recorded pid that is not (any more) our sshd must survive `down`
        record["sshd"]["decoy"] = {"pid": decoy.pid, "port": 1, "address": "127.0.0.9", "pidfile": str(st / "x.pid")}
        (st / "x.pid").write_text(str(decoy.pid))
        (st / "farm.json").write_text(json.dumps(record))
        adbd_pid, server_port = record["adb"]["adbd"]["pid"], record["adb"]["server"]["port"]
        stopped = localfarm.down(st)
        assert sorted(stopped) == sorted([*(k for k in record["sshd"] if k != "decoy"), "adb-server", "adb-arm64"])
        assert decoy.poll() is None
        assert all(not pid_running(p) for p in [*pids, adbd_pid])
        assert not localfarm._adb_server_answers(server_port)
        assert not (st / "farm.yaml").exists()
        from bmoe_ci.farm import FarmNotUp

        with pytest.raises(FarmNotUp, match="run `bmoe-ci farm up`"):
            embedded.farm_file(st)
        assert localfarm.down(st) == []  # twice is fine
    finally:
        decoy.kill()
        decoy.wait()


def test_missing_tools_name_the_debian_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(localfarm, "SSHD_CANDIDATES", ())
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(MissingTool, match="apt-get install openssh-server"):
        localfarm.up(tmp_path / "s")
    monkeypatch.undo()
    monkeypatch.setattr(localfarm, "QEMU_AARCH64", "qemu-aarch64-static-absent")
    monkeypatch.setattr(localfarm, "host_arch", lambda: "x86_64")
    with pytest.raises(MissingTool, match="qemu-user-static"):
        localfarm.up(tmp_path / "s")


# ------------------------------------------------------------------------------------------ locks


@pytest.fixture(params=["host", "ssh"])
def device(request: pytest.FixtureRequest, farm):
    return farm.devices["host" if request.param == "host" else SSH]


def test_lock_busy_then_free(device) -> None:
    with open_transport(device) as t1, open_transport(device) as t2:
        a = DeviceLock(t1, "run-a").acquire()
        b = DeviceLock(t2, "run-b")
        with pytest.raises(DeviceBusy) as ei:
            b.acquire()
        msg = str(ei.value)
        assert msg.startswith(f"{device.name}: busy: busy, held by run-a (pid {os.getpid()} on ") and " since " in msg
        assert ei.value.kind == "busy"  # an infrastructure error: never a verdict
        start = time.monotonic()
        with pytest.raises(DeviceBusy):
            b.acquire(wait=0.6, poll=0.2)
        assert 0.5 < time.monotonic() - start < 5
        assert read_lock(t2).run_id == "run-a"
        b.release()  # not ours: must not remove a's lock
        assert read_lock(t2).run_id == "run-a"
        with pytest.raises(DeviceBusy):  # the lease is the lock's that took it, not its run id's
            DeviceLock(t2, "run-a").acquire()
        assert read_lock(t2).run_id == "run-a"
        a.release()
        assert read_lock(t2) is None
        b.acquire()
        b.release()


def test_stale_locks_expire(device) -> None:
    """On each transport: a lease whose holder ran on this machine and is gone is broken at once; one
    from elsewhere is broken after this controller watched it unrenewed for the holder's TTL (its own
    clock, however old the heartbeat claims to be); a live one elsewhere is busy."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    with open_transport(device) as t:
        lock_dir = t.path(LOCK_DIR)
        now = time.time()
        mine = LockOwner.mine("crashed")
        owners = [  # (owner, seconds this controller must watch it first)
            (LockOwner(mine.host, mine.boot, dead.pid, None, "crashed", now, now, "t1"), 0.0),  # its process is gone
            (LockOwner("other-host", "b", 1, None, "ancient", now - 9000, now - 9000, "t2", 4.0), 4.0),  # unrenewed
        ]
        for owner, watch in owners:
            _plant(t, owner)
            start = time.monotonic()
            lock = DeviceLock(t, "fresh", ttl=3600).acquire()
            took = time.monotonic() - start
            held = lock.held
            lock.release()
            assert held and lock.broke and owner.run_id in lock.broke[0]
            assert watch <= took < watch + 5, f"{owner.run_id}: broken after {took:.1f}s"
            if watch:
                assert "did not renew it for 4s by this controller's own clock (ttl 4s)" in lock.broke[0]
        # a live owner elsewhere, recent heartbeat: respected
        now = time.time()
        _plant(t, LockOwner("other-host", "b", 1, None, "remote-run", now, now, "t3"))
        with pytest.raises(DeviceBusy, match="held by remote-run"):
            DeviceLock(t, "fresh", ttl=3600).acquire()
        t.sh('rm -rf "$1"', lock_dir).raise_for_infra()


def _plant(t, owner: LockOwner) -> None:
    t.sh('mkdir -p "$1" && printf "%s\\n" "$2" > "$1/owner"', t.path(LOCK_DIR), owner.to_json()).raise_for_infra()


def test_busy_names_the_lease_and_a_dead_holders_lease_expires_within_its_ttl(device) -> None:
    now = time.time()
    gone = LockOwner("other-host", "b", 4242, None, "dead-run", now - 1, now - 1, "t4", 4.0)
    with open_transport(device) as t:
        _plant(t, gone)
        with pytest.raises(DeviceBusy) as ei:
            DeviceLock(t, "next-run").acquire()
        msg = str(ei.value)
        assert "held by dead-run (pid 4242 on other-host) since " in msg
        assert re.search(r"heartbeat [0-9]+s ago, expires in [0-9]+s \(ttl 4s\)", msg), msg
        said: list[str] = []
        start = time.monotonic()
        lock = DeviceLock(t, "next-run", progress=said.append).acquire(wait=15, poll=0.2)
        took = time.monotonic() - start
        lock.release()  # before the checks: a failure here leaves no lease to the next test
        assert 4.0 <= took < 4 + 10  # the holder's TTL, watched on our own clock; not ours (180 s)
        assert lock.broke and "dead-run (pid 4242 on other-host)" in lock.broke[0]
        assert re.search(
            r"did not renew it for [0-9]+s by this controller's own clock \(ttl 4s\), held since ", lock.broke[0]
        )
        assert said[0].startswith("waiting up to ") and "held by dead-run" in said[0] and said[-1] == lock.broke[0]


def test_the_heartbeat_keeps_a_lease_while_an_engine_command_holds_the_session(device, tmp_path: Path) -> None:
    dev = device.model_copy(update={"lease_ttl": 4.0})
    engine = stand_in(tmp_path, build="lease")  # its own content: later tests count first pushes
    with open_session(dev, run_id="long-run", engine=engine, build_id="lease") as s:
        worker = threading.Thread(target=s.run_engine, args=(["sleep", "7"], 30))
        worker.start()
        time.sleep(6)  # past the TTL, while the session's own connection runs the engine
        with open_transport(dev) as t:
            with pytest.raises(DeviceBusy, match="held by long-run"):
                DeviceLock(t, "intruder", ttl=4.0).acquire()
            assert time.time() - read_lock(t).beat < 4.0
        worker.join()
        assert s.heartbeat is not None and s.heartbeat.lost is None
    with open_transport(dev) as t:
        assert read_lock(t) is None


def test_farm_unlock_needs_force_and_leaves_an_audit_line(state: Path, device, capsys) -> None:
    now = time.time()
    with open_transport(device) as t:
        _plant(t, LockOwner("lab-pc", "b", 77, None, "stuck-run", now, now, "t5", 180.0))
        farm_file = str(state / "farm.yaml")
        assert run_cli("farm", "unlock", "--farm", farm_file, device.name) == 2
        assert read_lock(t).run_id == "stuck-run"
        capsys.readouterr()
        assert run_cli("farm", "unlock", "--farm", farm_file, device.name, "--force") == 0
        out = capsys.readouterr().out
        assert f"{device.name}: broke the lease of stuck-run (pid 77 on lab-pc) since " in out
        assert read_lock(t) is None
        audit = t.run(["cat", t.path(".bmoe-ci-audit.log")], 10).stdout.decode().splitlines()
        assert "force-unlock by " in audit[-1] and "broke the lease of stuck-run (pid 77 on lab-pc)" in audit[-1]
        assert run_cli("farm", "unlock", "--farm", farm_file, device.name, "--force") == 0
        assert "no lease held" in capsys.readouterr().out
    assert run_cli("farm", "unlock", "--farm", farm_file, "no-such-device", "--force") == 2


# ------------------------------------------------------------------------------------------ sessions


def test_session_pushes_preflights_and_runs(device, tmp_path: Path) -> None:
    engine = stand_in(tmp_path)
    model = tmp_path / "tiny.gguf"
    model.write_bytes(b"GGUF" + os.urandom(64))
    results = tmp_path / "results" / device.name
    with open_session(
        device,
        run_id="r1",
        results_dir=results,
        engine=engine,
        build_id="abc",
        files=[PushItem(model, name="fx/tiny.gguf")],
    ) as s:
        assert s.pushed_bytes == engine.stat().st_size + model.stat().st_size
        assert s.engine_version.build == "abc" and s.preflight_report.arch_confirmed_by == "uname"
        r = s.run_engine(["run", "-m", s.file("fx/tiny.gguf")], 10)
        assert r.ok and r.stdout.decode().strip() == f"ran: run -m {s.file('fx/tiny.gguf')}"
        crash = s.run_engine(["crash"], 10)
        assert crash.outcome is Ending.SIGNALED and crash.signal == 11
        assert s.pull(s.file("fx/tiny.gguf"), "artifacts/tiny.gguf").read_bytes() == model.read_bytes()
        assert read_lock(s.transport).run_id == "r1"
    with open_transport(device) as t:
        assert read_lock(t) is None  # released on close
    warm = open_session(device, run_id="r2", engine=engine, build_id="abc")
    try:
        assert warm.pushed_bytes == 0
    finally:
        warm.close()


def test_farm_gc_keeps_what_the_last_runs_used(state: Path, device, tmp_path: Path, capsys) -> None:
    engine = stand_in(tmp_path)
    old, new = tmp_path / "old.gguf", tmp_path / "new.gguf"
    old.write_bytes(b"old " + os.urandom(32))
    new.write_bytes(b"new " + os.urandom(32))
    with open_session(device, run_id="gc-r1", engine=engine, build_id="abc", files=[old]) as s:
        old_path = s.pushes[-1].files[0].store_path
    time.sleep(1.05)  # use lists are ordered by modification time
    with open_session(device, run_id="gc-r2", engine=engine, build_id="abc", files=[new]) as s:
        new_path = s.pushes[-1].files[0].store_path
        engine_path = s.engine
        s.transport.sh('echo half > "$1/.tmp-x-1"', s.transport.path("store")).raise_for_infra()
    capsys.readouterr()
    assert run_cli("farm", "gc", "--farm", str(state / "farm.yaml"), "--device", device.name, "--keep", "1") == 0
    out = capsys.readouterr().out
    line = rf"^{re.escape(device.name)}  ok    removed [1-9][0-9]* file\(s\), [1-9][0-9]* bytes$"
    assert re.search(line, out, re.M), out
    with open_transport(device) as t:
        listing = t.run(["ls", "-a", t.path("store")], 10).stdout.decode().split()
        assert old_path.rsplit("/", 1)[1] not in listing and ".tmp-x-1" not in listing
        assert new_path.rsplit("/", 1)[1] in listing and engine_path.rsplit("/", 1)[1] in listing
        assert read_lock(t) is None  # gc took the lock and gave it back
    assert run_cli("farm", "gc", "--farm", str(state / "farm.yaml"), "--keep", "0") == 2


def test_timeout_scale_applies_to_engine_runs(farm, tmp_path: Path) -> None:
    dev = farm.devices["host"].model_copy(update={"timeout_scale": 0.5})
    with open_session(dev, engine=stand_in(tmp_path), build_id="abc") as s:
        r = s.run_engine(["sleep", "5"], 2)
    assert r.outcome is Ending.INFRA and r.infra.kind == "timeout" and r.timeout == 1.0 and r.duration < 3


def test_preflight_failures_are_infrastructure(farm, tmp_path: Path) -> None:
    host = farm.devices[SSH]
    with pytest.raises(InfraError, match="reports build abc, expected xyz") as ei:
        open_session(host, engine=stand_in(tmp_path), build_id="xyz")
    assert ei.value.kind == "preflight"
    full = host.model_copy(update={"min_free_mb": 99999999})
    with pytest.raises(InfraError, match=r"99999999 MiB must stay free \(min_free_mb\): nothing was uploaded") as ei:
        # the push's own check, refused before the upload (the preflight, which comes first, is off)
        open_session(full, engine=stand_in(tmp_path, build="full"), check=False)
    assert ei.value.kind == "preflight"
    with open_transport(host) as t:
        assert b".tmp-" not in t.run(["ls", "-a", t.path("store")], 10).stdout
    with pytest.raises(InfraError, match=r"need 99999999 MiB \(min_free_mb\)"):
        open_session(full, engine=stand_in(tmp_path, build="full"))  # the platform check, before any push
    other = "riscv64" if ARCH != "riscv64" else "x86_64"
    with pytest.raises(InfraError, match=f"declared arch {other} but 'uname -m' says {ARCH}"):
        open_session(host.model_copy(update={"arch": other}))
    with pytest.raises(InfraError, match="exec prefix 'qemu-nowhere-static' not found"):
        open_session(host.model_copy(update={"exec_prefix": ("qemu-nowhere-static",)}))
    with open_transport(host) as t:  # every failed open released its lock
        assert read_lock(t) is None


def test_the_local_farm_file_pins_the_kernel_paths(farm) -> None:
    """ssh-<arch> and ssh-arm64 pin the path below their CPU's own choice, so that every SIMD path of
    both architectures runs on some device; the others run the engine's choice."""
    want_x86, want_arm = localfarm.pinned_kernels(ARCH, ARCH != "aarch64", localfarm.cpu_flags())
    assert farm.devices[SSH].kernels == want_x86 and farm.devices["ssh-arm64"].kernels == want_arm
    assert {farm.devices[n].kernels for n in ("host", "phone-emu", localfarm.ADB_DEVICE)} == {"auto"}
    if ARCH == "x86_64" and "avx512_vnni" in localfarm.cpu_flags():  # this machine's CPU: auto is avx512-vnni
        assert (want_x86, want_arm) == ("avx2", "neon")


def pinning_stand_in(tmp_path: Path, available: str) -> Path:
    """A stand-in engine that lists `available` as its CPU's kernel paths and prints BMOE_KERNELS."""
    p = stand_in(tmp_path)
    p.write_text(
        "#!/bin/sh\n"
        f'case "$1" in --version) echo "bmoe 0.1.0 build abc target {ARCH}-linux-musl";;\n'
        f'  info) echo \'{{"ok":true,"kernels_available":[{available}]}}\';;\n'
        '  *) echo "kernels=${BMOE_KERNELS:-unset}";; esac\n'
    )
    return p


def test_a_pinned_kernel_path_reaches_every_engine_run_and_a_missing_one_is_a_preflight_error(
    farm, tmp_path: Path
) -> None:
    host = farm.devices["host"]
    engine = pinning_stand_in(tmp_path, '"scalar","avx2"')
    with open_session(host.model_copy(update={"kernels": "avx2"}), engine=engine, build_id="abc") as s:
        assert s.run_engine(["run"], 10).stdout.strip() == b"kernels=avx2"
        assert s.run_engine(["run"], 10, env={"BMOE_KERNELS": "scalar"}).stdout.strip() == b"kernels=scalar"
    with open_session(host, engine=engine, build_id="abc") as s:  # auto: the engine's own choice
        assert s.run_engine(["run"], 10).stdout.strip() == b"kernels=unset"
    pinned = host.model_copy(update={"kernels": "neon", "source": "farm.yaml:9"})
    with pytest.raises(InfraError) as ei:
        open_session(pinned, engine=engine, build_id="abc")
    assert ei.value.kind == "preflight" and ei.value.device == "host"
    assert "kernels: neon (farm.yaml:9): this device's CPU or engine build does not have that kernel path" in str(
        ei.value
    )
    assert "(it has scalar, avx2)" in str(ei.value)


@pytest.mark.skipif(ARCH == "aarch64", reason="emulation is what is being tested")
def test_emulated_device_arch_comes_from_the_engine(farm, tmp_path: Path) -> None:
    """uname says x86_64 under qemu; the declared aarch64 is confirmed by the engine's target triple."""
    fake_qemu = tmp_path / "qemu-aarch64"  # stands in for qemu: runs the (shell) stand-in natively
    fake_qemu.write_text('#!/bin/sh\nexec "$@"\n')
    fake_qemu.chmod(0o755)
    dev = farm.devices["ssh-arm64"].model_copy(update={"exec_prefix": (str(fake_qemu),)})
    with open_session(dev, engine=stand_in(tmp_path, target="aarch64-linux-musl"), build_id="abc") as s:
        assert s.preflight_report.arch_confirmed_by == "engine" and s.engine_version.arch == "aarch64"
    with pytest.raises(InfraError, match="declared arch aarch64 but the engine reports target x86_64-linux-musl"):
        open_session(dev, engine=stand_in(tmp_path, name="bmoe-x86"), build_id="abc")
