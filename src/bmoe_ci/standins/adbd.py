"""A stand-in adbd: the device end of a real ADB connection, served from this machine on a loopback TCP
port, so that the real ``adb`` client and server are tested without a phone::

    python -m bmoe_ci.standins.adbd --listen 127.0.0.1:0 --port-file adbd.port \\
        --prop ro.product.cpu.abi=arm64-v8a --battery-level 80

docs/adbd-standin.md is its manual: the options, the services, what it leaves out. Not a security
boundary: a client's command runs as ``/bin/sh -c`` as the local user and push/pull reach any path that
user can, hence loopback addresses only.

The wire protocol is AOSP's ``protocol.txt`` and ``SYNC.TXT`` (``packages/modules/adb``). Version
0x01000001 is announced, so neither side needs the data check; it is still computed, and verified when a
host announces 0x01000000. Only ``shell_v2`` is advertised, so a host falls back to the version 1 sync
requests and pushes a directory by running ``mkdir`` first, as for an Android 9 device. The fault options
(``--corrupt-push``, ``--cut-pull``, ``--cut-output``) count files or commands from 1 over the server's
lifetime: what the tests of the farm's push, pull and output checks need.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import ipaddress
import logging
import os
import platform
import re
import secrets
import shlex
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import termios
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bmoe_ci.farm.pids import pid_alive

log = logging.getLogger("bmoe_ci.standins.adbd")

# -- the transport layer (protocol.txt) -----------------------------------------------------------------------

A_SYNC = 0x434E5953
A_CNXN = 0x4E584E43
A_AUTH = 0x48545541
A_OPEN = 0x4E45504F
A_OKAY = 0x59414B4F
A_CLSE = 0x45534C43
A_WRTE = 0x45545257
A_STLS = 0x534C5453
COMMAND_NAMES = {
    A_SYNC: "SYNC",
    A_CNXN: "CNXN",
    A_AUTH: "AUTH",
    A_OPEN: "OPEN",
    A_OKAY: "OKAY",
    A_CLSE: "CLSE",
    A_WRTE: "WRTE",
    A_STLS: "STLS",
}

VERSION_MIN = 0x01000000
#: From this version on neither side checks the payload's data check (adb.h: A_VERSION_SKIP_CHECKSUM).
VERSION_SKIP_CHECKSUM = 0x01000001
VERSION = VERSION_SKIP_CHECKSUM
#: The largest payload this device accepts (announced in its CNXN) and sends.
MAX_PAYLOAD = 256 * 1024
#: Hosts older than adb 1.0.32 hard-coded 4 KiB; a host announcing less than that is not one we can talk to.
MIN_PEER_PAYLOAD = 4096

AUTH_TOKEN = 1
AUTH_SIGNATURE = 2
AUTH_RSAPUBLICKEY = 3
TOKEN_SIZE = 20

HEADER = struct.Struct("<6I")
FEATURES = ("shell_v2",)
BANNER_PROPS = ("ro.product.name", "ro.product.model", "ro.product.device")

#: Buffered stream input above which the device holds back its OKAY until the service has read some.
INBOX_HIGH_WATER = 1024 * 1024
#: How long a stream being closed by the device waits for the host's OKAY to its last WRTE.
CLOSE_FLUSH_TIMEOUT = 10.0

# -- the shell protocol (shell_protocol.h) --------------------------------------------------------------------

SHELL_STDIN = 0
SHELL_STDOUT = 1
SHELL_STDERR = 2
SHELL_EXIT = 3
SHELL_CLOSE_STDIN = 4
SHELL_WINDOW_SIZE = 5
SHELL_HEADER = struct.Struct("<BI")
#: adbd's status when a shell cannot be started (shell_service.cpp ReportError).
SHELL_START_FAILED = 126

# -- the sync protocol (file_sync_protocol.h, SYNC.TXT) -------------------------------------------------------


def _sync_id(name: bytes) -> int:
    return int.from_bytes(name, "little")


ID_STAT = _sync_id(b"STAT")
ID_LIST = _sync_id(b"LIST")
ID_DENT = _sync_id(b"DENT")
ID_SEND = _sync_id(b"SEND")
ID_RECV = _sync_id(b"RECV")
ID_DONE = _sync_id(b"DONE")
ID_DATA = _sync_id(b"DATA")
ID_OKAY = _sync_id(b"OKAY")
ID_FAIL = _sync_id(b"FAIL")
ID_QUIT = _sync_id(b"QUIT")
SYNC_REQUEST = struct.Struct("<II")
SYNC_STAT = struct.Struct("<IIII")
SYNC_DENT = struct.Struct("<IIIII")
SYNC_DATA_MAX = 64 * 1024
SYNC_PATH_MAX = 1024

#: The tools directory is ``$TMPDIR/bmoe-adbd-<pid>-<random>``: the pid tells a stale one (see _sweep_stale_roots).
ROOT_PREFIX = "bmoe-adbd-"
PROP_KEY = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")
PLUGGED = ("ac", "usb", "wireless", "none")


def _default_abi() -> str:
    return {"aarch64": "arm64-v8a", "arm64": "arm64-v8a", "x86_64": "x86_64", "amd64": "x86_64"}.get(
        platform.machine().lower(), platform.machine().lower()
    )


#: Properties every stand-in has unless ``--prop`` says otherwise.
DEFAULT_PROPS: Mapping[str, str] = {
    "ro.product.name": "bmoe_standin",
    "ro.product.model": "BMOE_Standin",
    "ro.product.device": "standin",
    "ro.product.manufacturer": "bmoe-ci",
    "ro.product.cpu.abi": _default_abi(),
    "ro.build.version.sdk": "29",
    "ro.build.version.release": "10",
    "ro.serialno": "bmoe-standin",
}


class ProtocolError(Exception):
    """The peer broke the transport protocol: the connection is closed."""


class StreamClosed(Exception):
    """The stream (or its whole connection) is closed: nothing more can be written to it."""


# -- configuration ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Battery:
    """The canned ``dumpsys battery`` state."""

    level: int = 100
    temperature_tenths: int = 250
    plugged: str = "usb"

    def dumpsys(self) -> str:
        """The block Android's BatteryService prints (status 2 charging, 3 discharging, 5 full; health 2 good)."""
        status = 3 if self.plugged == "none" else 5 if self.level >= 100 else 2
        lines = [
            "Current Battery Service state:",
            f"  AC powered: {str(self.plugged == 'ac').lower()}",
            f"  USB powered: {str(self.plugged == 'usb').lower()}",
            f"  Wireless powered: {str(self.plugged == 'wireless').lower()}",
            "  Max charging current: 500000",
            "  Max charging voltage: 5000000",
            f"  Charge counter: {self.level * 40000}",
            f"  status: {status}",
            "  health: 2",
            "  present: true",
            f"  level: {self.level}",
            "  scale: 100",
            f"  voltage: {3600 + 6 * self.level}",
            f"  temperature: {self.temperature_tenths}",
            "  technology: Li-ion",
        ]
        return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class DeviceConfig:
    """What the stand-in pretends to be."""

    props: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_PROPS))
    auth: str = "accept"
    battery: Battery = field(default_factory=Battery)
    #: 1-based numbers of the sync SENDs whose file gets one byte flipped.
    corrupt_push: frozenset[int] = frozenset()
    #: 1-based numbers of the sync RECVs sent back cut to half their size.
    cut_pull: frozenset[int] = frozenset()
    #: 1-based numbers of the shell commands whose stdout is cut after half of it.
    cut_output: frozenset[int] = frozenset()

    def banner(self) -> bytes:
        props = [f"{key}={self.props.get(key, '')}" for key in BANNER_PROPS]
        props.append("features=" + ",".join(FEATURES))
        return ("device::" + ";".join(props)).encode()


def parse_props(items: Sequence[str]) -> dict[str, str]:
    """``KEY=VALUE`` strings over :data:`DEFAULT_PROPS`. Keys are property names; the banner's three
    properties may not contain ``:``, ``;`` or ``=``, which would break the banner the host parses."""
    props = dict(DEFAULT_PROPS)
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not PROP_KEY.fullmatch(key):
            raise ValueError(f"--prop {item!r}: expected KEY=VALUE with KEY made of letters, digits, '.', '_', '-'")
        if "\n" in value or "\0" in value:
            raise ValueError(f"--prop {key}: the value may not contain a newline or NUL")
        if key in BANNER_PROPS and any(c in value for c in ":;="):
            raise ValueError(f"--prop {key}: the value goes into the connection banner and may not contain : ; =")
        props[key] = value
    return props


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``[V6]:PORT`` -> (address, port); only loopback addresses."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ValueError(f"--listen {text!r}: expected HOST:PORT")
    host = host.removeprefix("[").removesuffix("]")
    if host == "localhost":
        host = "127.0.0.1"
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(f"--listen {text!r}: HOST must be a literal loopback address") from None
    if not address.is_loopback:
        raise ValueError(f"--listen {text!r}: not a loopback address (the stand-in runs commands unsandboxed)")
    return str(address), int(port_text)


# -- streams and connections -----------------------------------------------------------------------------------


class Stream:
    """One multiplexed stream: the device's end of a service the host OPENed.

    Input (the host's WRTEs) is buffered and read with :meth:`read`; output goes through :meth:`write`, which
    sends one WRTE at a time and waits for the host's OKAY before the next.
    """

    def __init__(self, conn: Connection, local_id: int, remote_id: int, name: str) -> None:
        self.conn = conn
        self.local_id = local_id
        self.remote_id = remote_id
        self.name = name
        self._cond = threading.Condition()
        self._inbox = bytearray()
        self._okay_owed = False
        # An OPEN implies a READY from the host (protocol.txt): the first WRTE needs no OKAY.
        self._can_send = True
        self._closed = False
        self._write_lock = threading.Lock()
        self._close_hooks: list[Callable[[], None]] = []

    # input ---------------------------------------------------------------------------------------------------

    def feed(self, data: bytes) -> None:
        """A WRTE arrived (connection's reader thread): buffer it and acknowledge it, now or once read."""
        with self._cond:
            if self._closed:
                return
            self._inbox += data
            self._okay_owed = len(self._inbox) >= INBOX_HIGH_WATER
            owed = self._okay_owed
            self._cond.notify_all()
        if not owed:
            self._send_okay()

    def read(self, size: int) -> bytes:
        """Up to ``size`` bytes of input; ``b""`` once the stream is closed and the buffer empty."""
        with self._cond:
            self._cond.wait_for(lambda: self._inbox or self._closed)
            if not self._inbox:
                return b""
            data = bytes(self._inbox[:size])
            del self._inbox[:size]
            release = self._okay_owed and len(self._inbox) < INBOX_HIGH_WATER
            if release:
                self._okay_owed = False
        if release:
            self._send_okay()
        return data

    def read_exact(self, size: int) -> bytes:
        """Exactly ``size`` bytes; :class:`EOFError` if the stream closes first."""
        parts: list[bytes] = []
        left = size
        while left:
            part = self.read(left)
            if not part:
                raise EOFError(f"stream {self.name!r} closed {size - left} bytes into a {size}-byte read")
            parts.append(part)
            left -= len(part)
        return b"".join(parts)

    def _send_okay(self) -> None:
        with contextlib.suppress(StreamClosed):
            self.conn.send(A_OKAY, self.local_id, self.remote_id)

    # output --------------------------------------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        """Send ``data`` in WRTEs of at most the host's maxdata, one in flight at a time. One call's bytes are
        never interleaved with another's (callers write whole shell or sync packets)."""
        view = memoryview(data)
        with self._write_lock:
            while view:
                chunk = bytes(view[: self.conn.peer_max])
                view = view[len(chunk) :]
                with self._cond:
                    self._cond.wait_for(lambda: self._can_send or self._closed)
                    if self._closed:
                        raise StreamClosed(self.name)
                    self._can_send = False
                self.conn.send(A_WRTE, self.local_id, self.remote_id, chunk)

    def ready(self) -> None:
        """The host's OKAY: the next WRTE may go."""
        with self._cond:
            self._can_send = True
            self._cond.notify_all()

    # closing -------------------------------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        with self._cond:
            return self._closed

    def on_remote_close(self, hook: Callable[[], None]) -> None:
        """Call ``hook`` when the host closes the stream or the connection goes (now, if it already has)."""
        with self._cond:
            if not self._closed:
                self._close_hooks.append(hook)
                return
        hook()

    def close(self) -> None:
        """The service is done: CLSE, once the host has taken the last WRTE."""
        with self._cond:
            if self._closed:
                return
            # Waiting for the last OKAY makes sure the host has queued all output before it sees the CLSE.
            self._cond.wait_for(lambda: self._can_send or self._closed, timeout=CLOSE_FLUSH_TIMEOUT)
            if self._closed:
                return
            self._closed = True
            self._close_hooks.clear()
            self._cond.notify_all()
        self.conn.forget(self)
        with contextlib.suppress(StreamClosed):
            self.conn.send(A_CLSE, self.local_id, self.remote_id)

    def remote_close(self) -> None:
        """The host sent CLSE, or the connection is gone: wake readers and writers, run the hooks."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            hooks, self._close_hooks = self._close_hooks, []
            self._cond.notify_all()
        self.conn.forget(self)
        for hook in hooks:
            try:
                hook()
            except Exception:  # a hook's failure must not take the connection's reader down
                log.exception("close hook of stream %s failed", self.name)


class Connection:
    """One host connection: reads packets, runs the handshake, dispatches OPENs to services."""

    def __init__(self, server: StandInAdbd, sock: socket.socket, peer: str) -> None:
        self.server = server
        self.sock = sock
        self.peer = peer
        self.peer_version = VERSION_MIN
        self.peer_max = MIN_PEER_PAYLOAD
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()
        self._streams: dict[int, Stream] = {}
        self._threads: list[threading.Thread] = []
        self._next_id = 1
        self._online = False
        self._version_known = False
        self._token = b""
        self._closed = False

    # sending -------------------------------------------------------------------------------------------------

    def send(self, command: int, arg0: int, arg1: int, data: bytes = b"") -> None:
        header = HEADER.pack(command, arg0, arg1, len(data), sum(data) & 0xFFFFFFFF, command ^ 0xFFFFFFFF)
        with self._send_lock:
            if self._closed:
                raise StreamClosed(f"connection {self.peer} is closed")
            try:
                self.sock.sendall(header + data)
            except OSError as exc:
                raise StreamClosed(f"connection {self.peer}: {exc}") from None

    # receiving -----------------------------------------------------------------------------------------------

    def _recv_exact(self, size: int) -> bytes:
        buf = bytearray(size)
        view = memoryview(buf)
        got = 0
        while got < size:
            n = self.sock.recv_into(view[got:])
            if n == 0:
                raise EOFError("connection closed by the host")
            got += n
        return bytes(buf)

    def _read_packet(self) -> tuple[int, int, int, bytes]:
        command, arg0, arg1, length, check, magic = HEADER.unpack(self._recv_exact(HEADER.size))
        if magic != command ^ 0xFFFFFFFF:
            raise ProtocolError(f"bad magic {magic:#010x} for command {command:#010x}")
        if command not in COMMAND_NAMES:
            raise ProtocolError(f"unknown command {command:#010x}")
        if length > MAX_PAYLOAD:
            raise ProtocolError(f"{COMMAND_NAMES[command]} payload of {length} bytes (at most {MAX_PAYLOAD})")
        data = self._recv_exact(length) if length else b""
        # Only a host that announced the old version still fills in and checks the data check.
        if self._version_known and self.peer_version < VERSION_SKIP_CHECKSUM and sum(data) & 0xFFFFFFFF != check:
            raise ProtocolError(f"{COMMAND_NAMES[command]} data check {check:#x} does not match its payload")
        return command, arg0, arg1, data

    def serve(self) -> None:
        """The reader loop (the connection's own thread)."""
        try:
            while True:
                self._handle(*self._read_packet())
        except ProtocolError as exc:
            log.info("%s: protocol error, closing the connection: %s", self.peer, exc)
        except (EOFError, OSError) as exc:
            log.info("%s: connection ended: %s", self.peer, exc)
        finally:
            self.close()

    def _handle(self, command: int, arg0: int, arg1: int, data: bytes) -> None:
        log.debug("%s: recv %s(%#x, %#x) %d bytes", self.peer, COMMAND_NAMES[command], arg0, arg1, len(data))
        if command == A_CNXN:
            self._handle_cnxn(arg0, arg1, data)
        elif command == A_AUTH:
            self._handle_auth(arg0, data)
        elif command in (A_SYNC, A_STLS):
            # SYNC is obsolete and never valid on the wire; only a device starts TLS.
            raise ProtocolError(f"unexpected {COMMAND_NAMES[command]} from a host")
        elif not self._online:
            # protocol.txt: nothing but CNXN (and the AUTH exchange) counts before the connection is up.
            return
        elif command == A_OPEN:
            if arg0 != 0 and arg1 == 0:
                self._open(arg0, data)
        elif command == A_OKAY:
            stream = self._stream(arg1)
            if stream is not None and arg0 == stream.remote_id:
                stream.ready()
        elif command == A_WRTE:
            stream = self._stream(arg1)
            if stream is not None and arg0 == stream.remote_id:
                stream.feed(data)
        elif command == A_CLSE:
            stream = self._stream(arg1)
            if stream is not None and arg0 in (0, stream.remote_id):
                log.info("%s: host closed stream %d (%s)", self.peer, stream.local_id, stream.name)
                stream.remote_close()

    def _handle_cnxn(self, version: int, maxdata: int, banner: bytes) -> None:
        if version < VERSION_MIN or (version >> 24) != 1:
            raise ProtocolError(f"CNXN with unknown version {version:#010x}")
        if maxdata < MIN_PEER_PAYLOAD:
            raise ProtocolError(f"CNXN with maxdata {maxdata} (at least {MIN_PEER_PAYLOAD})")
        log.info("%s: CNXN version %#x maxdata %d banner %r", self.peer, version, maxdata, banner)
        # A new CNXN restarts the session (adb.cpp handle_new_connection): whatever ran is dropped.
        self._drop_streams()
        self._online = False
        self.peer_version = min(version, VERSION)
        self.peer_max = min(maxdata, MAX_PAYLOAD)
        self._version_known = True
        self._send_token()

    def _send_token(self) -> None:
        self._token = secrets.token_bytes(TOKEN_SIZE)
        self.send(A_AUTH, AUTH_TOKEN, 0, self._token)

    def _handle_auth(self, kind: int, data: bytes) -> None:
        if not self._token or self._online:
            return  # nothing asked for: ignore, as adbd does
        if kind == AUTH_SIGNATURE:
            if self.server.config.auth == "accept":
                self._go_online("signature accepted")
            else:
                self._send_token()  # "try another key"
        elif kind == AUTH_RSAPUBLICKEY:
            if self.server.config.auth == "accept":
                self._go_online("public key accepted")
            else:
                # A phone now shows its prompt; this one never gets an answer, so the host stays unauthorized.
                log.info("%s: public key offered and ignored (--auth reject)", self.peer)
        else:
            raise ProtocolError(f"AUTH of type {kind} from a host")

    def _go_online(self, why: str) -> None:
        log.info("%s: online (%s)", self.peer, why)
        self._online = True
        self.send(A_CNXN, VERSION, MAX_PAYLOAD, self.server.config.banner())

    # streams -------------------------------------------------------------------------------------------------

    def _stream(self, local_id: int) -> Stream | None:
        with self._lock:
            return self._streams.get(local_id)

    def forget(self, stream: Stream) -> None:
        with self._lock:
            if self._streams.get(stream.local_id) is stream:
                del self._streams[stream.local_id]

    def _open(self, remote_id: int, payload: bytes) -> None:
        name = payload.rstrip(b"\0")
        service = resolve_service(name)
        if service is None:
            log.info("%s: OPEN %r refused: no such service", self.peer, name)
            self.send(A_CLSE, 0, remote_id)
            return
        with self._lock:
            local_id = self._next_id
            self._next_id = self._next_id % 0xFFFFFFFF + 1
            stream = Stream(self, local_id, remote_id, name.decode(errors="replace"))
            self._streams[local_id] = stream
        log.info("%s: OPEN %r -> stream %d", self.peer, name, local_id)
        self.send(A_OKAY, local_id, remote_id)
        thread = threading.Thread(
            target=self._run_service, args=(service, stream), name=f"adbd-{stream.name[:24]}", daemon=True
        )
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()]
            self._threads.append(thread)
        thread.start()

    def _run_service(self, service: Callable[[Stream, StandInAdbd], None], stream: Stream) -> None:
        try:
            service(stream, self.server)
        except (StreamClosed, EOFError) as exc:
            log.info("%s: stream %d (%s) ended early: %s", self.peer, stream.local_id, stream.name, exc)
        except Exception:
            log.exception("%s: service %s failed", self.peer, stream.name)
        finally:
            stream.close()

    def _drop_streams(self) -> None:
        with self._lock:
            streams = list(self._streams.values())
        for stream in streams:
            stream.remote_close()

    def close(self) -> None:
        """Close the socket and every stream (their hooks kill the commands still running)."""
        with self._send_lock:
            if self._closed:
                return
            self._closed = True
        self._drop_streams()
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        self.server.forget(self)

    def join(self, timeout: float) -> None:
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(timeout)


# -- services --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ShellSpec:
    command: bytes
    protocol: bool
    pty: bool
    term: str


def parse_shell(args: bytes) -> ShellSpec | None:
    """The part after ``shell``: ``[,ARG...]:COMMAND`` (daemon/services.cpp ShellService)."""
    options, sep, command = args.partition(b":")
    if not sep or (options and not options.startswith(b",")):
        return None
    pty = not command  # adbd's default: a pty for an interactive shell, raw otherwise
    protocol = False
    term = "dumb"
    for arg in options.split(b",")[1:]:
        if arg == b"raw":
            pty = False
        elif arg == b"pty":
            pty = True
        elif arg == b"v2":
            protocol = True
        elif arg.startswith(b"TERM="):
            term = arg[5:].decode(errors="replace")
        # anything else is ignored, as adbd does, to allow for new arguments
    return ShellSpec(command, protocol, pty, term)


def resolve_service(name: bytes) -> Callable[[Stream, StandInAdbd], None] | None:
    if name.startswith(b"shell"):
        shell = parse_shell(name[len(b"shell") :])
        if shell is None:
            return None
        return lambda stream, server: ShellSession(stream, server, shell).run()
    if name.startswith(b"exec:"):
        spec = ShellSpec(name[len(b"exec:") :], protocol=False, pty=False, term="dumb")
        return lambda stream, server: ShellSession(stream, server, spec).run()
    if name.startswith(b"sync:"):
        return lambda stream, server: SyncSession(stream, server).run()
    return None


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class ShellSession:
    """One command behind a shell or exec stream."""

    def __init__(self, stream: Stream, server: StandInAdbd, spec: ShellSpec) -> None:
        self.stream = stream
        self.server = server
        self.spec = spec
        self._proc: subprocess.Popen[bytes] | None = None
        self._reaped = threading.Event()
        self._cut = server.next_shell_number() in server.config.cut_output  # --cut-output

    def _emit(self, channel: int, data: bytes) -> None:
        if self.spec.protocol:
            self.stream.write(SHELL_HEADER.pack(channel, len(data)) + data)
        else:
            self.stream.write(data)

    def _fail(self, message: str) -> None:
        text = f"error: {message}\n".encode()
        self._emit(SHELL_STDERR, text)
        if self.spec.protocol:
            self._emit(SHELL_EXIT, bytes([SHELL_START_FAILED]))

    def run(self) -> None:
        if not self.spec.command.strip():
            self._fail("interactive shells are not supported by the bmoe-ci stand-in adbd; give a command")
            return
        master = slave = -1
        if self.spec.pty:
            master, slave = os.openpty()
            stdio: dict[str, int] = {"stdin": slave, "stdout": slave, "stderr": slave}
        else:
            stdio = {
                "stdin": subprocess.PIPE,
                "stdout": subprocess.PIPE,
                "stderr": subprocess.PIPE if self.spec.protocol else subprocess.STDOUT,
            }
        try:
            try:
                proc = subprocess.Popen(
                    [b"/bin/sh", b"-c", self.spec.command],
                    cwd="/",
                    env=self.server.command_env(self.spec.term if self.spec.pty else None),
                    start_new_session=True,
                    **stdio,  # type: ignore[call-overload]
                )
            except OSError as exc:
                self._fail(f"cannot run /bin/sh: {exc.strerror}")
                return
            finally:
                if slave >= 0:
                    os.close(slave)
            self._proc = proc
            log.info("stream %d: pid %d runs %r", self.stream.local_id, proc.pid, self.spec.command)
            self.stream.on_remote_close(self._kill)

            outputs: list[tuple[int, int]] = []
            if self.spec.pty:
                outputs.append((master, SHELL_STDOUT))
                stdin_fd = master
            else:
                assert proc.stdin is not None and proc.stdout is not None
                outputs.append((proc.stdout.fileno(), SHELL_STDOUT))
                if proc.stderr is not None:
                    outputs.append((proc.stderr.fileno(), SHELL_STDERR))
                stdin_fd = proc.stdin.fileno()
            pumps = [
                threading.Thread(target=self._pump_output, args=(fd, channel, self._cut and channel == SHELL_STDOUT))
                for fd, channel in outputs
            ]
            for pump in pumps:
                pump.daemon = True
            pumps.append(threading.Thread(target=self._pump_input, args=(stdin_fd,), daemon=True))
            for pump in pumps:
                pump.start()
            for pump in pumps[:-1]:
                pump.join()
            status = proc.wait()
            self._reaped.set()
            code = 128 + -status if status < 0 else status & 0xFF
            log.info("stream %d: pid %d exited with status %d", self.stream.local_id, proc.pid, code)
            if self.spec.protocol:
                with contextlib.suppress(StreamClosed):
                    self._emit(SHELL_EXIT, bytes([code]))
        finally:
            # The stdin pump may still be blocked on the stream; closing it wakes the pump, which then exits.
            self.stream.close()
            if self._proc is not None:
                for pipe in (self._proc.stdout, self._proc.stderr):
                    if pipe is not None:
                        pipe.close()
            if master >= 0:
                with contextlib.suppress(OSError):
                    os.close(master)

    def _kill(self) -> None:
        """The host closed the stream: kill the command's process group, unless it is already reaped (its
        group id might then belong to someone else)."""
        proc = self._proc
        if proc is None or self._reaped.is_set():
            return
        log.info("stream %d closed by the host: killing process group %d", self.stream.local_id, proc.pid)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)

    def _pump_output(self, fd: int, channel: int, cut: bool = False) -> None:
        size = max(self.stream.conn.peer_max - SHELL_HEADER.size, 1024)
        writable = True
        if cut:  # --cut-output: read it all, send the first half only
            whole = bytearray()
            while chunk := self._read_output(fd, size):
                whole += chunk
            with contextlib.suppress(StreamClosed):
                for i in range(0, len(whole) // 2, size):
                    self._emit(channel, bytes(whole[i : min(i + size, len(whole) // 2)]))
            log.info(
                "stream %d: output cut to %d of %d bytes (--cut-output)",
                self.stream.local_id,
                len(whole) // 2,
                len(whole),
            )
            return
        while True:
            try:
                data = os.read(fd, size)
            except OSError as exc:
                # A pty's master reads EIO once every slave is closed: the normal end. Anything else ends the
                # output too (logged, not raised: an unhandled thread error would print without --verbose).
                if exc.errno != errno.EIO:
                    log.warning("stream %d: reading the command's output: %s", self.stream.local_id, exc)
                return
            if not data:
                return
            if writable:
                try:
                    self._emit(channel, data)
                except StreamClosed:
                    writable = False  # keep draining so the command never blocks on a full pipe

    def _read_output(self, fd: int, size: int) -> bytes:
        try:
            return os.read(fd, size)
        except OSError:
            return b""

    def _pump_input(self, fd: int) -> None:
        stdin_open = True

        def feed(data: bytes) -> None:
            nonlocal stdin_open
            if not stdin_open:
                return
            try:
                _write_all(fd, data)
            except OSError:
                stdin_open = False  # the command stopped reading: drop the rest, as adbd does

        try:
            if not self.spec.protocol:
                while data := self.stream.read(SYNC_DATA_MAX):
                    feed(data)
                return
            while True:
                channel, length = SHELL_HEADER.unpack(self.stream.read_exact(SHELL_HEADER.size))
                data = self.stream.read_exact(length)
                if channel == SHELL_STDIN:
                    feed(data)
                elif channel == SHELL_CLOSE_STDIN:
                    if not self.spec.pty and stdin_open:  # a pty cannot close input alone (adbd ignores it too)
                        stdin_open = False
                        assert self._proc is not None and self._proc.stdin is not None
                        self._proc.stdin.close()
                elif channel == SHELL_WINDOW_SIZE and self.spec.pty:
                    self._resize(fd, data)
        except EOFError:
            return
        finally:
            if not self.spec.pty and self._proc is not None and self._proc.stdin is not None:
                with contextlib.suppress(OSError):
                    self._proc.stdin.close()

    @staticmethod
    def _resize(fd: int, data: bytes) -> None:
        match = re.fullmatch(rb"(\d+)x(\d+),(\d+)x(\d+)\0*", data)
        if match:
            rows, cols, xpix, ypix = (min(int(v), 0xFFFF) for v in match.groups())
            with contextlib.suppress(OSError):
                fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, xpix, ypix))


class SyncSession:
    """The ``sync:`` service (v1 requests only, as only v1 is advertised)."""

    def __init__(self, stream: Stream, server: StandInAdbd) -> None:
        self.stream = stream
        self.server = server

    def run(self) -> None:
        try:
            while self._request():
                pass
        except EOFError:
            pass
        except OSError as exc:
            # Something this service did not foresee (say, a file that vanished): a FAIL says so, rather than
            # a stream that just ends; adbd closes the stream after a FAIL, and so does this one.
            log.warning("stream %d: sync failed: %s", self.stream.local_id, exc)
            with contextlib.suppress(StreamClosed):
                self._fail(str(exc))

    def _fail(self, message: str) -> None:
        text = message.encode(errors="replace")
        self.stream.write(SYNC_REQUEST.pack(ID_FAIL, len(text)) + text)

    @staticmethod
    def _path(raw: bytes) -> bytes:
        # adbd's working directory is /: a relative path is relative to it.
        return raw if raw.startswith(b"/") else b"/" + raw

    def _request(self) -> bool:
        """One request; False ends the session (QUIT, or an error after which adbd closes the stream)."""
        ident, length = SYNC_REQUEST.unpack(self.stream.read_exact(SYNC_REQUEST.size))
        if length > SYNC_PATH_MAX:
            self._fail("path too long")
            return False
        name = self.stream.read_exact(length)
        log.debug("stream %d: sync %s %r", self.stream.local_id, ident.to_bytes(4, "little"), name)
        if ident == ID_STAT:
            self._stat(self._path(name))
        elif ident == ID_LIST:
            self._list(self._path(name))
        elif ident == ID_SEND:
            return self._send(name)
        elif ident == ID_RECV:
            return self._recv(self._path(name))
        elif ident == ID_QUIT:
            return False
        else:
            self._fail(f"unknown command {ident:08x}")
            return False
        return True

    def _stat(self, path: bytes) -> None:
        try:
            st = os.lstat(path)
            reply = SYNC_STAT.pack(ID_STAT, st.st_mode, st.st_size & 0xFFFFFFFF, int(st.st_mtime) & 0xFFFFFFFF)
        except OSError:
            reply = SYNC_STAT.pack(ID_STAT, 0, 0, 0)  # v1 has no errno: all zeros means "failed"
        self.stream.write(reply)

    def _list(self, path: bytes) -> None:
        out = bytearray()
        try:
            names = [b".", b"..", *os.listdir(path)]
        except OSError:
            names = []
        for entry in names:
            try:
                st = os.lstat(os.path.join(path, entry))
            except OSError:
                continue  # v1 cannot report a per-entry error: adbd skips the entry
            out += (
                SYNC_DENT.pack(ID_DENT, st.st_mode, st.st_size & 0xFFFFFFFF, int(st.st_mtime) & 0xFFFFFFFF, len(entry))
                + entry
            )
            if len(out) >= SYNC_DATA_MAX:
                self.stream.write(bytes(out))
                out.clear()
        # The end is a whole DENT-sized record with the id DONE.
        out += SYNC_DENT.pack(ID_DONE, 0, 0, 0, 0)
        self.stream.write(bytes(out))

    @staticmethod
    def _parse_mode(text: bytes) -> int:
        """adbd reads the mode with strtoul(..., 0): decimal (what adb sends), 0-prefixed octal, 0x hex."""
        text = text.strip()
        if text[:2].lower() == b"0x":
            return int(text[2:], 16)
        if text.startswith(b"0") and len(text) > 1:
            return int(text[1:], 8)
        return int(text or b"0", 10)

    def _send(self, spec: bytes) -> bool:
        raw_path, sep, mode_text = spec.rpartition(b",")
        if not sep:
            self._fail("missing , in ID_SEND")
            return False
        try:
            mode = self._parse_mode(mode_text)
        except ValueError:
            self._fail("bad mode")
            return False
        path = self._path(raw_path)
        number = self.server.next_push_number()
        # Like adbd, a regular file (or a symlink about to become a file) is removed before it is written;
        # a device node or a fifo is written in place.
        try:
            st = os.lstat(path)
            unlink = stat.S_ISREG(st.st_mode) or (stat.S_ISLNK(st.st_mode) and not stat.S_ISLNK(mode))
        except OSError:
            unlink = True
        if unlink:
            with contextlib.suppress(OSError):
                os.unlink(path)
        if stat.S_ISLNK(mode):
            ok, mtime = self._receive_link(path)
        else:
            ok, mtime = self._receive_file(path, mode & 0o777, number in self.server.config.corrupt_push)
        if not ok:
            return False
        with contextlib.suppress(OSError):
            os.utime(path, (mtime, mtime), follow_symlinks=False)
        self.stream.write(SYNC_REQUEST.pack(ID_OKAY, 0))
        return True

    def _open_for_send(self, path: bytes, mode: int) -> int:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
        try:
            return os.open(path, flags, mode)
        except FileNotFoundError:
            os.makedirs(os.path.dirname(path), 0o775, exist_ok=True)
            return os.open(path, flags, mode)
        except FileExistsError:
            return os.open(path, os.O_WRONLY | os.O_CLOEXEC)

    def _receive_file(self, path: bytes, mode: int, corrupt: bool) -> tuple[bool, int]:
        try:
            fd = self._open_for_send(path, mode)
        except OSError as exc:
            self._fail(f"couldn't create file: {exc.strerror}")
            self._drain()
            return False, 0
        size = 0
        try:
            os.fchmod(fd, mode)  # the umask must not strip bits the host asked for
            while True:
                ident, length = SYNC_REQUEST.unpack(self.stream.read_exact(SYNC_REQUEST.size))
                if ident == ID_DONE:
                    mtime = length
                    break
                if ident != ID_DATA:
                    self._fail("invalid data message")
                    raise _Abort
                if length > SYNC_DATA_MAX:
                    self._fail("oversize data message")
                    raise _Abort
                data = self.stream.read_exact(length)
                try:
                    _write_all(fd, data)
                except OSError as exc:
                    self._fail(f"write failed: {exc.strerror}")
                    self._drain()
                    raise _Abort from None
                size += length
            if corrupt and size:
                self._flip_byte(path, size // 2)
            return True, mtime
        except (_Abort, EOFError, StreamClosed):
            with contextlib.suppress(OSError):
                os.unlink(path)
            return False, 0
        finally:
            os.close(fd)

    @staticmethod
    def _flip_byte(path: bytes, offset: int) -> None:
        """--corrupt-push: one byte flipped after the fact; the host is told OKAY all the same. (A file of its
        own: the one being written may be write-only.)"""
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        try:
            byte = os.pread(fd, 1, offset)[0]
            os.pwrite(fd, bytes([byte ^ 0xFF]), offset)
        finally:
            os.close(fd)
        log.info("sync SEND %r: byte %d flipped (--corrupt-push)", path, offset)

    def _receive_link(self, path: bytes) -> tuple[bool, int]:
        ident, length = SYNC_REQUEST.unpack(self.stream.read_exact(SYNC_REQUEST.size))
        if ident != ID_DATA:
            self._fail("invalid data message: expected ID_DATA")
            return False, 0
        if length > SYNC_DATA_MAX:
            self._fail("oversize data message")
            return False, 0
        target = self.stream.read_exact(length).split(b"\0", 1)[0]
        try:
            try:
                os.symlink(target, path)
            except FileNotFoundError:
                os.makedirs(os.path.dirname(path), 0o775, exist_ok=True)
                os.symlink(target, path)
        except OSError as exc:
            self._fail(f"symlink failed: {exc.strerror}")
            return False, 0
        ident, mtime = SYNC_REQUEST.unpack(self.stream.read_exact(SYNC_REQUEST.size))
        if ident != ID_DONE:
            self._fail("invalid data message: expected ID_DONE")
            return False, 0
        return True, mtime

    def _drain(self) -> None:
        """After a FAIL, swallow the DATA the host is still sending up to its DONE (adbd does the same, so
        the FAIL is not lost in a reset)."""
        while True:
            ident, length = SYNC_REQUEST.unpack(self.stream.read_exact(SYNC_REQUEST.size))
            if ident != ID_DATA or length > SYNC_DATA_MAX:
                return
            self.stream.read_exact(length)

    def _recv(self, path: bytes) -> bool:
        cut = self.server.next_pull_number() in self.server.config.cut_pull
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            self._fail(f"open failed: {exc.strerror}")
            return False
        left = os.fstat(fd).st_size // 2 if cut else None  # --cut-pull: the first half, then DONE
        if cut:
            log.info("sync RECV %r: cut to %d bytes (--cut-pull)", path, left)
        try:
            while left is None or left > 0:
                try:
                    data = os.read(fd, SYNC_DATA_MAX)
                except OSError as exc:
                    self._fail(f"read failed: {exc.strerror}")
                    return False
                if not data:
                    break
                if left is not None:
                    data = data[:left]
                    left -= len(data)
                self.stream.write(SYNC_REQUEST.pack(ID_DATA, len(data)) + data)
        finally:
            os.close(fd)
        self.stream.write(SYNC_REQUEST.pack(ID_DONE, 0))
        return True


class _Abort(Exception):
    """A SEND failed after its FAIL was sent."""


# -- the server ------------------------------------------------------------------------------------------------


def _write_tools(root: Path, config: DeviceConfig) -> Path:
    """``root/bin/getprop`` and ``root/bin/dumpsys`` (shell scripts reading files under ``root``)."""
    bin_dir = root / "bin"
    props_dir = root / "props"
    bin_dir.mkdir()
    props_dir.mkdir()
    for key, value in config.props.items():
        (props_dir / key).write_text(value + "\n")
    (root / "getprop.all").write_text("".join(f"[{k}]: [{v}]\n" for k, v in sorted(config.props.items())))
    (root / "battery.txt").write_text(config.battery.dumpsys())
    q = shlex.quote
    scripts = {
        "getprop": (
            "#!/bin/sh\n"
            "# getprop of the bmoe-ci stand-in adbd: the properties are files written from --prop\n"
            f"if [ $# -eq 0 ]; then cat {q(str(root / 'getprop.all'))}; exit 0; fi\n"
            'case "$1" in\n'
            f'  [A-Za-z0-9_]*) if [ -f {q(str(props_dir))}/"$1" ] && '
            f'[ "${{1#*/}}" = "$1" ]; then cat {q(str(props_dir))}/"$1"; exit 0; fi;;\n'
            "esac\n"
            "printf '%s\\n' \"$2\"\n"
        ),
        "dumpsys": (
            "#!/bin/sh\n"
            "# dumpsys of the bmoe-ci stand-in adbd: only the battery service exists\n"
            'case "$1" in\n'
            f"  battery) cat {q(str(root / 'battery.txt'))};;\n"
            f"  '') echo 'DUMP OF SERVICE battery:'; cat {q(str(root / 'battery.txt'))};;\n"
            '  *) echo "Can\'t find service: $1" >&2; exit 1;;\n'
            "esac\n"
        ),
    }
    for name, text in scripts.items():
        path = bin_dir / name
        path.write_text(text)
        path.chmod(0o755)
    return bin_dir


def _sweep_stale_roots(tmp: Path) -> None:
    """Remove the tools directories of stand-ins that died without cleaning up (SIGKILL): ours (same uid),
    named after a pid that no longer exists. A reused pid only keeps a stale directory a while longer."""
    for root in tmp.glob(f"{ROOT_PREFIX}*-*"):
        pid_text = root.name[len(ROOT_PREFIX) :].partition("-")[0]
        try:
            if not pid_text.isdigit() or root.lstat().st_uid != os.getuid() or not root.is_dir():
                continue
        except OSError:
            continue
        if not pid_alive(int(pid_text)):
            log.info("removing %s, left by a stand-in that is gone", root)
            shutil.rmtree(root, ignore_errors=True)


class StandInAdbd:
    """The listening socket, its connections, and the private directory of device tools."""

    def __init__(self, config: DeviceConfig, host: str = "127.0.0.1", port: int = 0) -> None:
        self.config = config
        self.host = host
        self.requested_port = port
        self.port = 0
        self._lock = threading.Lock()
        self._connections: set[Connection] = set()
        self._pushes = 0
        self._pulls = 0
        self._shells = 0
        self._stopping = False
        self._listener: socket.socket | None = None
        self._accept_thread: threading.Thread | None = None
        self._root: Path | None = None
        self._bin_dir: Path | None = None

    def start(self) -> int:
        """Create the tools directory, bind, listen and accept in a thread; return the bound port."""
        _sweep_stale_roots(Path(tempfile.gettempdir()))
        self._root = Path(tempfile.mkdtemp(prefix=f"{ROOT_PREFIX}{os.getpid()}-"))
        self._bin_dir = _write_tools(self._root, self.config)
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((self.host, self.requested_port))
            listener.listen(16)
        except OSError:
            listener.close()
            self._remove_root()
            raise
        self._listener = listener
        self.port = listener.getsockname()[1]
        self._accept_thread = threading.Thread(target=self._accept_loop, name="adbd-accept", daemon=True)
        self._accept_thread.start()
        log.info("listening on %s:%d", self.host, self.port)
        return self.port

    def command_env(self, term: str | None) -> dict[str, str]:
        assert self._bin_dir is not None
        env = dict(os.environ)
        env["PATH"] = f"{self._bin_dir}{os.pathsep}{env.get('PATH', os.defpath)}"
        if term is not None:
            env["TERM"] = term
        return env

    def next_push_number(self) -> int:
        with self._lock:
            self._pushes += 1
            return self._pushes

    def next_pull_number(self) -> int:
        with self._lock:
            self._pulls += 1
            return self._pulls

    def next_shell_number(self) -> int:
        with self._lock:
            self._shells += 1
            return self._shells

    def forget(self, conn: Connection) -> None:
        with self._lock:
            self._connections.discard(conn)

    def _accept_loop(self) -> None:
        assert self._listener is not None
        while True:
            try:
                sock, address = self._listener.accept()
            except OSError:
                return  # the listener was shut down
            peer = f"{address[0]}:{address[1]}"
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = Connection(self, sock, peer)
            with self._lock:
                if self._stopping:
                    sock.close()
                    return
                self._connections.add(conn)
            log.info("%s: connected", peer)
            threading.Thread(target=conn.serve, name=f"adbd-conn-{peer}", daemon=True).start()

    def close(self, join_timeout: float = 3.0) -> None:
        """Stop accepting, close every connection (killing the commands still running), remove the tools."""
        with self._lock:
            self._stopping = True
            connections = list(self._connections)
        if self._listener is not None:
            # shutdown() wakes a thread blocked in accept(); close() alone does not on Linux.
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
        for conn in connections:
            conn.close()
        # Give the service threads a moment to reap the killed commands.
        for conn in connections:
            conn.join(join_timeout / max(len(connections), 1))
        if self._accept_thread is not None:
            self._accept_thread.join(1.0)
        self._remove_root()

    def _remove_root(self) -> None:
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None


# -- command line ----------------------------------------------------------------------------------------------


def _write_port_file(path: Path, port: int) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(f"{port}\n")
    os.replace(tmp, path)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bmoe_ci.standins.adbd",
        description="A stand-in adbd on loopback TCP: commands run unsandboxed as the local user.",
    )
    p.add_argument(
        "--listen", default="127.0.0.1:0", metavar="HOST:PORT", help="loopback address (default %(default)s)"
    )
    p.add_argument("--port-file", type=Path, metavar="FILE", help="write the bound port here once listening")
    p.add_argument("--prop", action="append", default=[], metavar="KEY=VALUE", help="a device property (repeatable)")
    p.add_argument("--auth", choices=("accept", "reject"), default="accept", help="answer to the host's AUTH")
    p.add_argument("--battery-level", type=int, default=100, metavar="N", help="dumpsys battery level, 0-100")
    p.add_argument("--temperature-tenths", type=int, default=250, metavar="N", help="battery temperature, 0.1 °C")
    p.add_argument("--plugged", choices=PLUGGED, default="usb", help="battery power source")
    p.add_argument(
        "--corrupt-push",
        type=int,
        action="append",
        default=[],
        metavar="N",
        help="flip a byte of the N-th file pushed (repeatable)",
    )
    for flag, what in (("--cut-pull", "file pulled"), ("--cut-output", "shell command's stdout")):
        p.add_argument(
            flag, type=int, action="append", default=[], metavar="N", help=f"cut the N-th {what} to half (repeatable)"
        )
    p.add_argument("--verbose", action="store_true", help="log to stderr")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        host, port = parse_listen(args.listen)
        props = parse_props(args.prop)
        if not 0 <= args.battery_level <= 100:
            raise ValueError(f"--battery-level {args.battery_level}: expected 0-100")
        for flag, numbers in (
            ("--corrupt-push", args.corrupt_push),
            ("--cut-pull", args.cut_pull),
            ("--cut-output", args.cut_output),
        ):
            if any(n < 1 for n in numbers):
                raise ValueError(f"{flag} counts from 1")
    except ValueError as exc:
        print(f"adbd: {exc}", file=sys.stderr)
        return 2
    if args.verbose:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("adbd[%(process)d] %(threadName)s: %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.DEBUG)
    else:
        log.addHandler(logging.NullHandler())
    log.propagate = False
    config = DeviceConfig(
        props=props,
        auth=args.auth,
        battery=Battery(args.battery_level, args.temperature_tenths, args.plugged),
        corrupt_push=frozenset(args.corrupt_push),
        cut_pull=frozenset(args.cut_pull),
        cut_output=frozenset(args.cut_output),
    )
    server = StandInAdbd(config, host, port)
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        log.info("signal %d: shutting down", signum)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        bound = server.start()
    except OSError as exc:
        print(f"adbd: cannot listen on {args.listen}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    try:
        if args.port_file is not None:
            _write_port_file(args.port_file, bound)
        # A timed wait keeps the main thread returning to the interpreter, where signal handlers run.
        while not stop.wait(0.5):
            pass
    finally:
        server.close()
        if args.port_file is not None:
            with contextlib.suppress(OSError):
                if args.port_file.read_text().strip() == str(bound):
                    args.port_file.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
