"""The stand-in adbd (bmoe_ci.standins.adbd) driven by the real adb client and server.

Every adb call goes to a private adb server on a free port (``adb -P PORT``, never the default 5037) with its own
``HOME`` (so its own key pair) and ``TMPDIR`` (its own log); the server is killed at the end of the module. Each
stand-in runs as ``python -m bmoe_ci.standins.adbd`` on a free loopback port, found through its ``--port-file``.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from bmoe_ci.standins import adbd

ADB = shutil.which("adb")
pytestmark = pytest.mark.skipif(ADB is None, reason="adb (Android platform-tools) is not on PATH; CI installs it")

SRC = Path(adbd.__file__).resolve().parents[2]
#: Bound on any single adb call; a push of a few MiB over loopback takes well under a second.
CALL_TIMEOUT = 30.0
#: Environment variables that would point adb at another server, device or key set.
ADB_ENV_OUT = ("ANDROID_SERIAL", "ANDROID_ADB_SERVER_PORT", "ADB_VENDOR_KEYS", "ANDROID_SDK_HOME",
               "ANDROID_USER_HOME", "ADB_TRACE", "ADB_SERVER_SOCKET")  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(what: str, check, timeout: float = 10.0, step: float = 0.05):
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(step)


def process_gone(pid: int) -> bool:
    """Dead: no such process, or a zombie waiting for its parent (the stand-in) to reap it."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):  # ESRCH: reaped between the open and the read
        return True
    return fields[0] in ("Z", "X")


@dataclass
class Adb:
    """The private adb server: ``adb(...)`` runs the client against it."""

    port: int
    env: dict[str, str]

    def __call__(
        self, *args: str, serial: str | None = None, input: bytes | None = None, timeout: float = CALL_TIMEOUT
    ) -> subprocess.CompletedProcess[bytes]:
        cmd = [str(ADB), "-P", str(self.port), *(["-s", serial] if serial else []), *args]
        return subprocess.run(
            cmd,
            input=input,
            stdin=subprocess.DEVNULL if input is None else None,
            capture_output=True,
            env=self.env,
            timeout=timeout,
            check=False,
        )

    def popen(self, *args: str, serial: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [str(ADB), "-P", str(self.port), "-s", serial, *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=self.env,
        )

    def state(self, serial: str) -> str | None:
        out = self("devices").stdout.decode()
        for line in out.splitlines():
            name, _, state = line.partition("\t")
            if name == serial:
                return state
        return None

    def connect(self, serial: str, state: str = "device") -> str:
        out = self("connect", serial)
        assert out.returncode == 0, out
        wait_until(f"{serial} to be {state}", lambda: self.state(serial) == state)
        return out.stdout.decode()


@dataclass
class StandIn:
    proc: subprocess.Popen[bytes]
    port: int
    port_file: Path
    log: Path
    tmpdir: Path
    serial: str = field(init=False)

    def __post_init__(self) -> None:
        self.serial = f"127.0.0.1:{self.port}"


@pytest.fixture(scope="module")
def adb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Adb]:
    home = tmp_path_factory.mktemp("adb-home")
    env = {k: v for k, v in os.environ.items() if k not in ADB_ENV_OUT}
    env.update(HOME=str(home), TMPDIR=str(home))
    server = Adb(free_port(), env)
    with (home / "start-server.out").open("wb") as out:
        # The forked server must not inherit a pipe of ours (run() would wait for it to close): a file.
        subprocess.run([str(ADB), "-P", str(server.port), "start-server"], stdin=subprocess.DEVNULL, stdout=out,
                       stderr=out, env=env, timeout=CALL_TIMEOUT, check=True)  # fmt: skip
    try:
        yield server
    finally:
        subprocess.run([str(ADB), "-P", str(server.port), "kill-server"], stdin=subprocess.DEVNULL,
                       capture_output=True, env=env, timeout=CALL_TIMEOUT, check=False)  # fmt: skip

        def server_gone() -> bool:
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", server.port)) != 0

        wait_until("the adb server to stop", server_gone)


@contextlib.contextmanager
def stand_in(tmp: Path, *options: str) -> Iterator[StandIn]:
    """``python -m bmoe_ci.standins.adbd`` on a free loopback port; SIGTERM (then SIGKILL) at the end."""
    tmp.mkdir(parents=True, exist_ok=True)
    port_file = tmp / "adbd.port"
    log = tmp / "adbd.log"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]), TMPDIR=str(tmp))
    with log.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "bmoe_ci.standins.adbd", "--port-file", str(port_file), *options],
            stdin=subprocess.DEVNULL,
            stdout=err,
            stderr=err,
            env=env,
        )
    try:

        def port() -> int | None:
            assert proc.poll() is None, f"the stand-in exited: {log.read_text()}"
            text = port_file.read_text() if port_file.exists() else ""
            return int(text) if text.strip() else None

        yield StandIn(proc, wait_until("the port file", port), port_file, log, tmp)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


@pytest.fixture(scope="module")
def device(adb: Adb, tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandIn]:
    options = ["--prop", "ro.product.cpu.abi=arm64-v8a", "--prop", "ro.product.model=Pixel_Test",
               "--prop", "ro.serialno=TEST0001", "--battery-level", "42", "--temperature-tenths", "317"]  # fmt: skip
    with stand_in(tmp_path_factory.mktemp("device"), *options) as dev:
        adb.connect(dev.serial)
        yield dev


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_listed_as_a_device_with_the_banner_properties(adb: Adb, device: StandIn) -> None:
    out = adb("devices", "-l").stdout.decode()
    line = next(line for line in out.splitlines() if line.startswith(device.serial))
    assert line.split()[1] == "device"
    assert "model:Pixel_Test" in line and "product:bmoe_standin" in line


def test_shell_output_and_exit_status(adb: Adb, device: StandIn) -> None:
    r = adb("shell", "echo hi", serial=device.serial)
    assert (r.returncode, r.stdout, r.stderr) == (0, b"hi\n", b"")
    assert adb("shell", "exit 3", serial=device.serial).returncode == 3
    # Killed by signal N arrives as 128 + N, as adbd reports it.
    assert adb("shell", "kill -9 $$", serial=device.serial).returncode == 128 + 9


def test_stdout_and_stderr_stay_apart(adb: Adb, device: StandIn) -> None:
    r = adb("shell", "echo out; echo err >&2; echo out2", serial=device.serial)
    assert (r.returncode, r.stdout, r.stderr) == (0, b"out\nout2\n", b"err\n")


def test_stdin_reaches_the_command(adb: Adb, device: StandIn) -> None:
    r = adb("shell", "cat", serial=device.serial, input=b"data\n")
    assert (r.returncode, r.stdout) == (0, b"data\n")
    # 3 MiB to a command that only starts reading after a while: the device holds back its OKAYs meanwhile.
    blob = os.urandom(3 << 20)
    r = adb("shell", "sleep 0.5; sha256sum", serial=device.serial, input=blob)
    assert r.returncode == 0 and r.stdout.split()[0].decode() == sha256(blob)


def test_legacy_shell_exec_out_and_pty(adb: Adb, device: StandIn) -> None:
    # -x: the legacy "shell:" service, output merged and no exit status.
    r = adb("shell", "-x", "echo out; echo err >&2; exit 3", serial=device.serial)
    assert (r.returncode, r.stdout) == (0, b"out\nerr\n")
    r = adb("exec-out", r"printf 'a\000b\377'", serial=device.serial)
    assert (r.returncode, r.stdout) == (0, b"a\0b\xff")
    # -tt forces "shell,v2,...,pty:": a terminal on the device (hence \r\n), the status still comes back.
    r = adb("shell", "-tt", "[ -t 1 ] && echo tty; exit 4", serial=device.serial)
    assert (r.returncode, r.stdout) == (4, b"tty\r\n")


def test_an_interactive_shell_is_refused(adb: Adb, device: StandIn) -> None:
    r = adb("shell", serial=device.serial)
    assert r.returncode == 126 and b"interactive shells are not supported" in r.stderr


def test_push_pull_round_trip(adb: Adb, device: StandIn, tmp_path: Path) -> None:
    blob = os.urandom(5 << 20)
    local = tmp_path / "blob.bin"
    local.write_bytes(blob)
    remote = tmp_path / "device" / "sub" / "blob.bin"  # parent directories do not exist yet
    r = adb("push", str(local), str(remote), serial=device.serial)
    assert r.returncode == 0, r.stderr
    assert sha256(remote.read_bytes()) == sha256(blob)
    assert remote.stat().st_mtime == int(local.stat().st_mtime)  # DONE carries the mtime
    r = adb("shell", f"sha256sum {remote}", serial=device.serial)
    assert r.stdout.split()[0].decode() == sha256(blob)
    back = tmp_path / "back.bin"
    r = adb("pull", str(remote), str(back), serial=device.serial)
    assert r.returncode == 0, r.stderr
    assert sha256(back.read_bytes()) == sha256(blob)


def test_push_keeps_the_mode(adb: Adb, device: StandIn, tmp_path: Path) -> None:
    script = tmp_path / "tool.sh"
    script.write_text("#!/bin/sh\necho tool ran\n")
    script.chmod(0o755)
    private = tmp_path / "private.txt"
    private.write_text("secret\n")
    private.chmod(0o640)
    dest = tmp_path / "device"
    for item in (script, private):
        assert adb("push", str(item), str(dest / item.name), serial=device.serial).returncode == 0
    assert stat.S_IMODE((dest / "tool.sh").stat().st_mode) == 0o755
    assert stat.S_IMODE((dest / "private.txt").stat().st_mode) == 0o640
    assert adb("shell", str(dest / "tool.sh"), serial=device.serial).stdout == b"tool ran\n"


def test_push_a_directory_with_a_symlink_and_list_it(adb: Adb, device: StandIn, tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "deep").mkdir(parents=True)
    (tree / "deep" / "a.txt").write_text("a\n")
    (tree / "link").symlink_to("deep/a.txt")
    dest = tmp_path / "device" / "tree"
    r = adb("push", str(tree), str(dest), serial=device.serial)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (dest / "deep" / "a.txt").read_text() == "a\n"
    assert os.readlink(dest / "link") == "deep/a.txt"
    # adb ls: LIST, one line per DENT: mode, size, mtime in hex, then the name
    listing = {
        line.split()[-1]: line.split()[0]
        for line in adb("ls", str(dest), serial=device.serial).stdout.decode().splitlines()
    }
    assert set(listing) == {".", "..", "deep", "link"}
    assert stat.S_ISDIR(int(listing["deep"], 16)) and stat.S_ISLNK(int(listing["link"], 16))


def test_pull_of_a_missing_file_fails(adb: Adb, device: StandIn, tmp_path: Path) -> None:
    r = adb("pull", str(tmp_path / "nothing"), str(tmp_path / "here"), serial=device.serial)
    # adb 29 prints a sync error on stdout when stdout is not a terminal (its LinePrinter)
    assert r.returncode != 0 and b"does not exist" in r.stdout + r.stderr


def test_getprop_and_dumpsys_battery(adb: Adb, device: StandIn) -> None:
    assert adb("shell", "getprop ro.product.cpu.abi", serial=device.serial).stdout == b"arm64-v8a\n"
    assert adb("shell", "getprop ro.serialno", serial=device.serial).stdout == b"TEST0001\n"
    assert adb("shell", "getprop no.such.prop", serial=device.serial).stdout == b"\n"
    listing = adb("shell", "getprop", serial=device.serial).stdout.decode().splitlines()
    assert "[ro.product.cpu.abi]: [arm64-v8a]" in listing and "[ro.product.model]: [Pixel_Test]" in listing
    battery = adb("shell", "dumpsys battery", serial=device.serial).stdout.decode().splitlines()
    assert battery[0] == "Current Battery Service state:"
    assert "  level: 42" in battery and "  temperature: 317" in battery and "  status: 2" in battery


def test_a_killed_client_kills_the_device_command(adb: Adb, device: StandIn, tmp_path: Path) -> None:
    pid_file = tmp_path / "sleeper.pid"
    client = adb.popen("shell", f"echo $$ > {pid_file}; exec sleep 100", serial=device.serial)
    try:
        pid = wait_until("the pid file", lambda: pid_file.exists() and pid_file.read_text().strip())
        assert not process_gone(int(pid))
        client.kill()  # the adb server closes the stream: CLSE to the device
        client.wait(10)
        wait_until("the device command to die", lambda: process_gone(int(pid)))
    finally:
        if client.poll() is None:
            client.kill()
            client.wait(10)


def test_streams_run_concurrently(adb: Adb, device: StandIn, tmp_path: Path) -> None:
    """One connection, several streams at once: the first command only ends once the second has run."""
    flag = tmp_path / "flag"
    waiter = subprocess.Popen(
        [str(ADB), "-P", str(adb.port), "-s", device.serial, "shell",
         f"i=0; while [ ! -e {flag} ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done; cat {flag}"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=adb.env,
    )  # fmt: skip
    try:
        blob = tmp_path / "blob"
        blob.write_bytes(os.urandom(1 << 20))
        assert adb("push", str(blob), str(tmp_path / "pushed"), serial=device.serial).returncode == 0
        assert adb("shell", f"echo second > {flag}", serial=device.serial).returncode == 0
        out, _ = waiter.communicate(timeout=CALL_TIMEOUT)
        assert (waiter.returncode, out) == (0, b"second\n")
    finally:
        if waiter.poll() is None:
            waiter.kill()
            waiter.wait(10)


class RawHost:
    """A minimal host side on a plain socket, for what the adb server never does (small maxdata, the old
    checksummed version, holding back OKAYs)."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)

    def send(self, command: int, arg0: int, arg1: int, data: bytes = b"", check: int | None = None) -> None:
        check = sum(data) if check is None else check
        self.sock.sendall(struct.pack("<6I", command, arg0, arg1, len(data), check, command ^ 0xFFFFFFFF) + data)

    def recv(self) -> tuple[int, int, int, bytes]:
        header = self._exact(24)
        command, arg0, arg1, length, check, magic = struct.unpack("<6I", header)
        assert magic == command ^ 0xFFFFFFFF
        data = self._exact(length)
        assert check == sum(data) & 0xFFFFFFFF  # the stand-in always fills in the data check
        return command, arg0, arg1, data

    def _exact(self, size: int) -> bytes:
        buf = b""
        while len(buf) < size:
            part = self.sock.recv(size - len(buf))
            if not part:
                raise EOFError
            buf += part
        return buf

    def open(self, local: int, service: bytes) -> int:
        self.send(adbd.A_OPEN, local, 0, service + b"\0")
        command, remote, arg1, _ = self.recv()
        assert (command, arg1) == (adbd.A_OKAY, local) and remote != 0
        return remote

    def write(self, local: int, remote: int, data: bytes) -> None:
        """A WRTE; its OKAY is taken by :meth:`pump` (it may come before or after the device's output)."""
        self.send(adbd.A_WRTE, local, remote, data)

    def pump(self, local: int, remote: int, maxdata: int, until=lambda data: False) -> tuple[bytes, bool]:
        """The device's WRTEs to stream ``local``, each acknowledged only after checking that nothing but
        OKAYs arrives while it is unacknowledged; up to its CLSE (True) or until ``until(data)`` (False)."""
        data = b""
        while not until(data):
            command, arg0, arg1, payload = self.recv()
            if command == adbd.A_OKAY:
                continue
            if command == adbd.A_CLSE:
                assert (arg0, arg1) == (remote, local)
                return data, True
            assert (command, arg0, arg1) == (adbd.A_WRTE, remote, local)
            assert 0 < len(payload) <= maxdata
            data += payload
            deadline = time.monotonic() + 0.03
            while (left := deadline - time.monotonic()) > 0:
                self.sock.settimeout(left)
                try:
                    self.sock.recv(1, socket.MSG_PEEK)
                except TimeoutError:
                    break
                finally:
                    self.sock.settimeout(5)
                assert self.recv()[0] == adbd.A_OKAY, "a second WRTE before our OKAY"
            self.send(adbd.A_OKAY, local, remote)
        return data, False

    def handshake(self, version: int, maxdata: int) -> bytes:
        self.send(adbd.A_CNXN, version, maxdata, b"host::\0")
        command, kind, _, token = self.recv()
        assert (command, kind, len(token)) == (adbd.A_AUTH, adbd.AUTH_TOKEN, 20)
        self.send(adbd.A_AUTH, adbd.AUTH_SIGNATURE, 0, b"s" * 256)
        command, dev_version, dev_max, banner = self.recv()
        assert (command, dev_version, dev_max) == (adbd.A_CNXN, 0x01000001, 256 * 1024)
        return banner


def test_protocol_limits_with_a_raw_host(tmp_path: Path) -> None:
    maxdata = 4096
    served = tmp_path / "served.bin"
    served.write_bytes(os.urandom(30_000))
    with stand_in(tmp_path / "adbd") as dev:
        host = RawHost(dev.port)
        try:
            banner = host.handshake(version=0x01000000, maxdata=maxdata)
            assert banner.startswith(b"device::ro.product.name=bmoe_standin;")
            assert banner.endswith(b";features=shell_v2")

            # A shell: output in WRTEs no larger than our maxdata, one at a time, then CLSE.
            local = host.open(7, b"shell,v2,raw:head -c 12000 /dev/zero")
            host.write(7, local, bytes([adbd.SHELL_CLOSE_STDIN, 0, 0, 0, 0]))
            stream, closed = host.pump(7, local, maxdata)
            assert closed
            out, status = b"", None
            while stream:
                channel, length = struct.unpack("<BI", stream[:5])
                if channel == adbd.SHELL_STDOUT:
                    out += stream[5 : 5 + length]
                elif channel == adbd.SHELL_EXIT:
                    status = stream[5 : 5 + length]
                stream = stream[5 + length :]
            assert (out, status) == (bytes(12000), b"\0")

            # sync RECV writes 64 KiB chunks: they too are cut to our maxdata.
            local = host.open(9, b"sync:")
            path = str(served).encode()
            host.write(9, local, struct.pack("<4sI", b"RECV", len(path)) + path)
            expected = len(served.read_bytes())
            stream, closed = host.pump(9, local, maxdata, until=lambda b: b.endswith(b"DONE\0\0\0\0"))
            assert not closed
            data = b""
            while stream[:4] == b"DATA":
                (length,) = struct.unpack("<I", stream[4:8])
                data += stream[8 : 8 + length]
                stream = stream[8 + length :]
            assert stream == b"DONE\0\0\0\0" and data == served.read_bytes() and len(data) == expected
            host.write(9, local, struct.pack("<4sI", b"QUIT", 0))
            assert host.pump(9, local, maxdata) == (b"", True)

            # Input is acknowledged once buffered, but not past 1 MiB the command has not read: then the OKAY
            # waits until the command reads.
            local = host.open(11, b"shell,v2,raw:sleep 1; cat >/dev/null")
            payload = bytes(256 * 1024 - 5)
            held = None
            for i in range(12):
                host.write(11, local, struct.pack("<BI", adbd.SHELL_STDIN, len(payload)) + payload)
                host.sock.settimeout(0.3)
                try:
                    command = host.recv()[0]
                except TimeoutError:
                    held = i
                    break
                finally:
                    host.sock.settimeout(5)
                assert command == adbd.A_OKAY
            assert held is not None and held >= 4  # at least 1 MiB was taken before the device held back
            assert host.recv()[:3] == (adbd.A_OKAY, local, 11)  # cat has started reading
            host.send(adbd.A_CLSE, 11, local)

            # An unknown service is refused with CLSE(0, id).
            host.send(adbd.A_OPEN, 8, 0, b"framebuffer:\0")
            assert host.recv()[:3] == (adbd.A_CLSE, 0, 8)
            # With the old version a bad data check is a broken stream: the connection is closed.
            host.send(adbd.A_WRTE, 8, 1, b"abc", check=1)
            with pytest.raises(EOFError):
                host.recv()
        finally:
            host.sock.close()


def test_an_unauthorized_device(adb: Adb, tmp_path: Path) -> None:
    with stand_in(tmp_path, "--auth", "reject") as dev:
        out = adb.connect(dev.serial, state="unauthorized")
        assert "failed to authenticate" in out
        r = adb("shell", "echo hi", serial=dev.serial)
        assert r.returncode != 0 and b"unauthorized" in r.stderr and r.stdout == b""
        adb("disconnect", dev.serial)


def test_a_corrupted_push(adb: Adb, tmp_path: Path) -> None:
    with stand_in(tmp_path / "adbd", "--corrupt-push", "1") as dev:
        adb.connect(dev.serial)
        blob = os.urandom(1 << 20)
        local = tmp_path / "blob.bin"
        local.write_bytes(blob)
        first, second = tmp_path / "first.bin", tmp_path / "second.bin"
        for remote in (first, second):
            r = adb("push", str(local), str(remote), serial=dev.serial)
            assert r.returncode == 0, r.stdout + r.stderr  # the device says OKAY all the same
        assert first.stat().st_size == len(blob)
        assert sha256(first.read_bytes()) != sha256(blob)
        assert sum(a != b for a, b in zip(first.read_bytes(), blob, strict=True)) == 1
        assert sha256(second.read_bytes()) == sha256(blob)  # only the first push is corrupted
        back = tmp_path / "back.bin"
        assert adb("pull", str(first), str(back), serial=dev.serial).returncode == 0
        assert sha256(back.read_bytes()) == sha256(first.read_bytes()) != sha256(blob)
        adb("disconnect", dev.serial)


def test_disconnect_then_connect_again(adb: Adb, tmp_path: Path) -> None:
    with stand_in(tmp_path) as dev:
        adb.connect(dev.serial)
        assert adb("disconnect", dev.serial).returncode == 0
        r = adb("shell", "echo hi", serial=dev.serial)
        assert r.returncode != 0 and b"not found" in r.stderr
        adb.connect(dev.serial)
        assert adb("shell", "echo hi", serial=dev.serial).stdout == b"hi\n"
        adb("disconnect", dev.serial)


def test_garbage_closes_only_its_connection(adb: Adb, tmp_path: Path) -> None:
    cnxn = adbd.A_CNXN
    garbage = [
        b"GET / HTTP/1.0\r\n\r\n" + b"x" * 8,  # not a header at all: bad magic
        struct.pack("<6I", cnxn, 0x01000001, 4096, 0, 0, 0x12345678),  # bad magic
        struct.pack("<6I", 0x41414141, 0, 0, 0, 0, 0x41414141 ^ 0xFFFFFFFF),  # unknown command
        struct.pack("<6I", cnxn, 0x01000001, 4096, 1 << 30, 0, cnxn ^ 0xFFFFFFFF),  # 1 GiB payload
        struct.pack("<6I", cnxn, 0x02000000, 4096, 0, 0, cnxn ^ 0xFFFFFFFF),  # unknown version
    ]
    with stand_in(tmp_path) as dev:
        for packet in garbage:
            with socket.create_connection(("127.0.0.1", dev.port), timeout=5) as s:
                s.sendall(packet)
                assert s.recv(100) == b"", packet  # closed by the stand-in, nothing sent back
        assert dev.proc.poll() is None
        adb.connect(dev.serial)
        assert adb("shell", "echo still here", serial=dev.serial).stdout == b"still here\n"
        adb("disconnect", dev.serial)


def test_sigterm_kills_running_commands_and_cleans_up(adb: Adb, tmp_path: Path) -> None:
    pid_file = tmp_path / "sleeper.pid"
    # Tools directories left by stand-ins killed with SIGKILL: one whose pid is gone, one whose pid lives.
    gone = subprocess.Popen(["true"])
    gone.wait()
    stale = tmp_path / "adbd" / f"bmoe-adbd-{gone.pid}-stale"
    live = tmp_path / "adbd" / f"bmoe-adbd-{os.getpid()}-live"
    for root in (stale, live):
        (root / "bin").mkdir(parents=True)
    with stand_in(tmp_path / "adbd") as dev:
        adb.connect(dev.serial)
        assert not stale.exists() and live.exists()
        assert list((tmp_path / "adbd").glob(f"bmoe-adbd-{dev.proc.pid}-*/bin/getprop"))  # its tools directory
        client = adb.popen("shell", f"echo $$ > {pid_file}; exec sleep 100", serial=dev.serial)
        try:
            pid = int(wait_until("the pid file", lambda: pid_file.exists() and pid_file.read_text().strip()))
            dev.proc.send_signal(signal.SIGTERM)
            assert dev.proc.wait(10) == 0
            wait_until("the device command to die", lambda: process_gone(pid))
            assert client.wait(10) is not None  # its stream is gone, so is the client
        finally:
            if client.poll() is None:
                client.kill()
                client.wait(10)
        assert not dev.port_file.exists()
        assert list((tmp_path / "adbd").glob("bmoe-adbd-*")) == [live]
        assert dev.log.read_bytes() == b""  # without --verbose it prints nothing
        adb("disconnect", dev.serial)


def test_only_loopback_is_accepted() -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-m", "bmoe_ci.standins.adbd", "--listen", "0.0.0.0:5555"],
                       capture_output=True, env=env, timeout=CALL_TIMEOUT, check=False)  # fmt: skip
    assert r.returncode == 2 and r.stdout == b""
    assert len(r.stderr.decode().splitlines()) == 1 and "not a loopback address" in r.stderr.decode()
    for bad in ("10.1.2.3:5555", "example.com:5555", "[::]:0", "127.0.0.1", "127.0.0.1:99999"):
        with pytest.raises(ValueError):
            adbd.parse_listen(bad)
    assert adbd.parse_listen("127.0.0.4:0") == ("127.0.0.4", 0)
    assert adbd.parse_listen("localhost:5555") == ("127.0.0.1", 5555)
    assert adbd.parse_listen("[::1]:5555") == ("::1", 5555)
