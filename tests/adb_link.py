"""An adb link for the project's own tests: the stand-in adbd (bmoe_ci.standins.adbd) on a loopback port and
an adb server of the test's own (Debian's `adb`, never the user's 5037), connected to each other, so that
the real adb client reaches a device that executes commands on this machine."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ADB = shutil.which("adb")
needs_adb = pytest.mark.skipif(ADB is None, reason="Debian's adb client is not installed (apt-get install adb)")


def free_port(address: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return s.getsockname()[1]


@dataclass
class AdbLink:
    serial: str  #: 127.0.0.1:PORT of the stand-in
    server: str  #: 127.0.0.1:PORT of the adb server
    adbd: subprocess.Popen
    server_port: int

    def adb(self, *args: str, timeout: float = 30) -> subprocess.CompletedProcess:
        """The adb client against this link's server (``-s`` is the caller's to give)."""
        return subprocess.run(
            [ADB, "-P", str(self.server_port), *args], capture_output=True, text=True, timeout=timeout, check=False
        )

    def device_yaml(self, name: str, arch: str, workdir: Path, extra: str = "") -> str:
        """The farm file lines of a device on this link."""
        return (
            f"  - name: {name}\n    kind: phone\n    os: android\n    arch: {arch}\n    transport: adb\n"
            f'    serial: "{self.serial}"\n    adb_server: "{self.server}"\n    workdir: {workdir}\n'
            f"    connect_timeout: 5\n{extra}"
        )

    def server_pid(self) -> int:
        """The pid of this link's adb server (the process `adb start-server` left listening on our port)."""
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"fork-server" in cmdline and any(f"tcp:{self.server_port}".encode() in a for a in cmdline):
                return int(proc.name)
        raise AssertionError(f"no adb server on port {self.server_port}")

    def stop_adbd(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.adbd.pid, signal.SIGKILL)
        self.adbd.wait(timeout=10)


@contextlib.contextmanager
def adb_link(tmp: Path, *args: str, abi: str = "x86_64") -> Iterator[AdbLink]:
    """Start a stand-in adbd (``args``: more of its options) and an adb server; connect them."""
    tmp.mkdir(parents=True, exist_ok=True)
    portfile = tmp / "adbd.port"
    log = open(tmp / "adbd.log", "ab")  # noqa: SIM115 (closed below)
    adbd = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bmoe_ci.standins.adbd",
            "--listen",
            "127.0.0.1:0",
            "--port-file",
            str(portfile),
            "--prop",
            f"ro.product.cpu.abi={abi}",
            *args,
        ],
        stdout=log,
        stderr=log,
        start_new_session=True,
    )
    server_port = free_port()
    link = None
    try:
        deadline = time.monotonic() + 20
        while not portfile.is_file():
            assert adbd.poll() is None, (tmp / "adbd.log").read_text()
            assert time.monotonic() < deadline, "the stand-in adbd never wrote its port"
            time.sleep(0.02)
        serial = f"127.0.0.1:{int(portfile.read_text())}"
        link = AdbLink(serial, f"127.0.0.1:{server_port}", adbd, server_port)
        started = link.adb("start-server")
        assert started.returncode == 0, started.stderr
        connected = link.adb("connect", serial)
        # an unauthorized device is connected all the same: the client says it failed to authenticate
        assert "connected to" in connected.stdout or "failed to authenticate" in connected.stdout, (
            connected.stdout + connected.stderr
        )
        yield link
    finally:
        subprocess.run([ADB, "-P", str(server_port), "kill-server"], capture_output=True, timeout=30, check=False)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(adbd.pid, signal.SIGKILL)
        adbd.wait(timeout=10)
        log.close()
