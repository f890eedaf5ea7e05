"""The adb transport for real: Debian's adb client and an adb server of the test's own, talking to the
stand-in adbd on loopback. Bad input is one clear line, a device that goes away mid-command is an
infrastructure error (never a verdict), a hung device is a timeout, and the device-state record reads an
Android battery. The generic transport behaviour (arguments, exit codes, signals, deadlines, the store) is
tested on adb too, in test_farm_transport.py."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from pathlib import Path

import pytest
from adb_link import AdbLink, adb_link, free_port, needs_adb

from bmoe_ci.ab.devstate import read_state
from bmoe_ci.farm import Ending, InfraError, PushItem, load_farm_file, preflight, push, sha256_file
from bmoe_ci.farm.transports import open_transport

pytestmark = needs_adb


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _device(tmp_path: Path, link: AdbLink, arch: str = "x86_64", extra: str = "", serial: str | None = None):
    text = "version: 1\ndevices:\n" + link.device_yaml("p8", arch, tmp_path / "work", extra)
    if serial is not None:
        text = text.replace(f'serial: "{link.serial}"', f'serial: "{serial}"')
    (tmp_path / "farm.yaml").write_text(text)
    return load_farm_file(tmp_path / "farm.yaml").devices["p8"]


@pytest.fixture
def link(tmp_path: Path):
    with adb_link(tmp_path / "link") as lk:
        yield lk


def test_unknown_serial_is_one_line_naming_what_the_server_has(tmp_path: Path, link: AdbLink) -> None:
    dev = _device(tmp_path, link, serial="R58M00NOTHERE", extra="    retries: 0\n")
    with pytest.raises(InfraError) as ei:
        open_transport(dev).connect()
    assert ei.value.kind == "unreachable"
    assert str(ei.value) == (
        f"p8: unreachable: unknown serial R58M00NOTHERE: the adb server at {link.server} lists {link.serial}"
    )
    r = open_transport(dev).run(["true"], 10)  # run() reports instead of raising
    assert r.outcome is Ending.INFRA and "unknown serial" in str(r.infra)


def test_an_adb_server_that_is_not_running_is_never_started_for_you(tmp_path: Path, link: AdbLink) -> None:
    port = free_port()
    dev = _device(tmp_path, link, extra="").updated(adb_server=f"127.0.0.1:{port}")
    with pytest.raises(InfraError) as ei:
        open_transport(dev).connect()
    assert ei.value.kind == "unreachable" and "\n" not in str(ei.value)
    assert f"adb server 127.0.0.1:{port} not reachable (Connection refused)" in str(ei.value)
    # and the failed attempt started no server of its own on that port
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        pass


def test_an_unauthorized_phone_is_an_auth_error(tmp_path: Path) -> None:
    with adb_link(tmp_path / "link", "--auth", "reject") as lk:
        deadline = time.monotonic() + 10  # the server takes a moment to settle on "unauthorized"
        while "unauthorized" not in lk.adb("devices").stdout and time.monotonic() < deadline:
            time.sleep(0.1)
        dev = _device(tmp_path, lk)
        with pytest.raises(InfraError) as ei:
            open_transport(dev).connect()
    assert ei.value.kind == "auth" and "\n" not in str(ei.value)
    assert f"device {lk.serial} is unauthorized: unlock it and accept the 'Allow USB debugging' prompt" in str(ei.value)


def test_a_wrong_abi_is_refused_at_preflight(tmp_path: Path) -> None:
    # a 32-bit user space: uname -m may well say aarch64 on such a phone; the ABI is what counts
    with adb_link(tmp_path / "link", abi="armeabi-v7a") as lk:
        t = open_transport(_device(tmp_path, lk, arch="aarch64"))
        with pytest.raises(InfraError) as ei:
            preflight(t)
    assert ei.value.kind == "preflight"
    assert str(ei.value) == (
        "p8: preflight: wrong ABI: declared arch aarch64 but the device's user space is "
        "armeabi-v7a (getprop ro.product.cpu.abi)"
    )


def test_the_right_abi_is_confirmed_by_getprop(tmp_path: Path, link: AdbLink) -> None:
    report = preflight(open_transport(_device(tmp_path, link)))
    assert report.arch_confirmed_by == "getprop" and report.free_mb and report.free_mb > 0


def test_adb_disconnect_under_a_command_is_a_disconnect_and_a_tcp_serial_comes_back(
    tmp_path: Path, link: AdbLink
) -> None:
    t = open_transport(_device(tmp_path, link))
    t.connect()
    pidfile = tmp_path / "work" / "sleeper.pid"
    threading.Timer(1.0, lambda: link.adb("disconnect", link.serial)).start()
    start = time.monotonic()
    r = t.run(["sh", "-c", f"echo $$ > {pidfile}; exec sleep 60"], 4)
    assert r.outcome is Ending.INFRA and r.infra is not None and r.infra.kind == "disconnect", r.describe()
    assert time.monotonic() - start < 4
    # with the link gone, the device-side deadline (timeout -s KILL 4) still ends the command there
    pid = int(pidfile.read_text())
    deadline = start + 4 + 5
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid), "the command outlived its deadline on the device"
    # the next command reconnects the HOST:PORT serial (adb connect), as a Wi-Fi phone comes back
    again = t.run(["echo", "back"], 10)
    assert again.ok and again.stdout == b"back\n", again.describe()


def test_a_dead_device_is_unreachable_and_a_hung_one_times_out(tmp_path: Path, link: AdbLink) -> None:
    t = open_transport(_device(tmp_path, link))
    t.connect()
    os.kill(link.adbd.pid, signal.SIGSTOP)  # the device stops answering: a hang, not a refusal
    try:
        start = time.monotonic()
        r = t.run(["echo", "hi"], 2, idle_timeout=3)
        took = time.monotonic() - start
    finally:
        os.kill(link.adbd.pid, signal.SIGCONT)
    assert r.outcome is Ending.INFRA and r.infra is not None and r.infra.kind == "timeout", r.describe()
    assert took < 8
    link.stop_adbd()
    r = t.run(["echo", "hi"], 5)
    assert r.outcome is Ending.INFRA and r.infra is not None and r.infra.kind in ("disconnect", "unreachable")


def test_a_push_corrupted_on_the_device_is_caught_and_repushed(tmp_path: Path) -> None:
    # the stand-in flips a byte of the first file it receives: only the hash on the device can notice
    with adb_link(tmp_path / "link", "--corrupt-push", "1") as lk:
        t = open_transport(_device(tmp_path, lk))
        f = tmp_path / "model.gguf"
        f.write_bytes(b"GGUF" + os.urandom(100_000))
        rep = push(t, [PushItem(f)])
        [m] = rep.mismatches
        assert (m.where, m.expected) == ("upload", sha256_file(f)) and m.found != m.expected
        assert t.run(["cat", rep.files[0].path], 10).stdout == f.read_bytes()


def test_device_state_reads_the_android_battery(tmp_path: Path) -> None:
    with adb_link(tmp_path / "link", "--battery-level", "63", "--temperature-tenths", "312") as lk:
        t = open_transport(_device(tmp_path, lk))
        state = read_state(t.run)
    assert state.battery_pct == 63.0 and state.thermal_c["battery"] == 31.2
    assert state.charging == "Charging" and state.load1 is not None
