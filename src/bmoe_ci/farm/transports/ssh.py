"""``transport: ssh``: a device reached over SSH through Fabric (connection set-up, SFTP) and a raw
paramiko channel per command (byte-exact capture, our own deadline). Host keys are checked against the
farm's pinned ``known_hosts`` and anything unknown or changed is refused; a connect timeout is always
set. Commands go through the wrapper of :mod:`.remote_shell`.
"""

from __future__ import annotations

import contextlib
import math
import os
import select
import socket
import stat
import time
from pathlib import Path
from typing import Any

from bmoe_ci import inputs

from ..errors import InfraError
from ..model import Device, DeviceSpec, NonEmpty, Port, TransportKeys
from .base import Ending, Problem, RunResult, Transport, command_text, grace
from .remote_shell import build_remote_command, new_marker, split_marker, status_result


def load_known_hosts(device: Device):
    """([(host name, paramiko key)] of the pinned entries, {key blob: ``FILE:LINE``} of the ``@revoked`` ones)
    from the device's ``known_hosts``, read as OpenSSH reads it: comments and blank lines skipped,
    ``@revoked`` keys refused wherever they are offered (and never trusted, even if pinned on another
    line), ``@cert-authority`` lines ignored (certificates are not used by the farm). A line that cannot be
    read is an infrastructure error of this device naming the file and the line, never one of the run."""
    import paramiko
    from paramiko.hostkeys import HostKeyEntry, InvalidHostKey

    path = str(ssh_keys(device).known_hosts)
    try:
        text = inputs.read_text(path, what="known_hosts file", limit=4 << 20)
    except inputs.InputError as exc:
        raise InfraError(device.name, "hostkey", f"cannot load known_hosts: {exc}") from None
    revoked: dict[bytes, str] = {}
    pinned: list[tuple[list[str], object, str]] = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        marker = ""
        if line.startswith("@"):
            marker, _, line = line.partition(" ")
            line = line.strip()
            if marker == "@cert-authority":
                continue  # certificates are not used by the farm: a CA line trusts nothing here
            if marker != "@revoked":
                raise InfraError(device.name, "hostkey", f"{path}:{n}: unknown marker {marker!r} in known_hosts")
        try:
            entry = HostKeyEntry.from_line(line, lineno=n)
        except (InvalidHostKey, paramiko.SSHException, ValueError, TypeError) as exc:
            raise InfraError(
                device.name, "hostkey", f"{path}:{n}: unreadable known_hosts line ({type(exc).__name__})"
            ) from None
        if entry is None:  # too few fields, or a key type paramiko does not know: OpenSSH skips it too
            continue
        if marker == "@revoked":
            revoked[entry.key.asbytes()] = f"{path}:{n}"
        elif not marker:
            pinned.append((entry.hostnames, entry.key, f"{path}:{n}"))
    trusted = [(name, key) for names, key, _ in pinned if key.asbytes() not in revoked for name in names]  # type: ignore[attr-defined]
    return trusted, revoked


class _PinnedOnly:
    """paramiko missing-host-key policy: refuse, naming the host and the key's fingerprint (a key the
    known_hosts marks ``@revoked`` is refused as such)."""

    def __init__(self, device: Device, revoked: dict[bytes, str] | None = None):
        self.device = device
        self.revoked = revoked or {}

    def missing_host_key(self, client, hostname, key):
        where = self.revoked.get(key.asbytes())
        if where is not None:
            raise InfraError(
                self.device.name,
                "hostkey",
                f"host key of {hostname} ({key.get_name()} {key.fingerprint}) is REVOKED ({where}); refusing to "
                "connect",
            )
        raise InfraError(
            self.device.name,
            "hostkey",
            f"host key of {hostname} ({key.get_name()} {key.fingerprint}) is not in the pinned known_hosts "
            f"{ssh_keys(self.device).known_hosts}; refusing to trust it on first use (check the fingerprint on the "
            f"device, then add the line to that file)",
        )


class SshKeys(TransportKeys):
    """The keys of an ssh device (host, key and known_hosts are required: checked by the transport, which
    says so in the farm file's terms)."""

    host: NonEmpty | None = None
    port: Port = 22
    user: NonEmpty | None = None
    key: NonEmpty | None = None
    known_hosts: NonEmpty | None = None

    def where(self) -> str:
        return f"{self.user + '@' if self.user else ''}{self.host}:{self.port}"


def ssh_keys(device: Device) -> SshKeys:
    """The ssh keys of ``device`` (a device of the ssh transport)."""
    assert isinstance(device.link, SshKeys), device.link
    return device.link


class SshTransport(Transport):
    """SSH via Fabric; see the module docstring."""

    name = "ssh"
    keys = SshKeys

    @classmethod
    def check_device(cls, spec: DeviceSpec, keys: Any, base: Path, problem: Problem) -> dict[str, Any]:
        update: dict[str, Any] = {}
        for k in ("host", "key", "known_hosts"):
            if getattr(keys, k) is None:
                problem("", f"missing required key '{k}' (transport ssh)")
        for k in ("key", "known_hosts"):
            value = getattr(keys, k)
            if value is None:
                continue
            p = Path(os.path.expanduser(value))
            p = p if p.is_absolute() else base / p
            what = "key file" if k == "key" else "known_hosts file"
            try:
                with open(p, "rb") as fh:
                    fh.read(1)
                    mode = os.fstat(fh.fileno()).st_mode
            except OSError as exc:
                problem(k, f"cannot read {what} {p}: {exc.strerror or exc}")
            else:
                if k == "key" and mode & 0o077:
                    # what OpenSSH refuses too: a key others can read is a key others may have copied
                    problem(
                        k,
                        f"key file {p} is accessible by others (mode {stat.S_IMODE(mode):04o}); a private key "
                        f"must be readable by its owner only: chmod 600 {p}",
                    )
            update[k] = str(p)
        wd = spec.workdir or ""
        if not (wd.startswith("/") or wd == "~" or wd.startswith("~/")):
            problem("workdir", f"workdir of an ssh device must be absolute or start with '~/' (got {wd!r})")
        return update

    def __init__(self, device: Device, *, keepalive: int = 15):
        super().__init__(device)
        self.link = ssh_keys(device)
        self.keepalive = keepalive
        self._conn: Any = None  # a fabric Connection while connected (fabric is untyped)
        self._sftp: Any = None

    # -- connection
    def _connect(self) -> None:
        from fabric import Config, Connection
        from paramiko.config import SSHConfig

        d, k = self.device, self.link
        ct = float(d.connect_timeout)
        # lazy + explicit empty SSHConfig: no ~/.ssh/config, no /etc/fabric.yml can change what the
        # farm file says (hosts, keys, host key policy).
        cfg = Config(lazy=True, ssh_config=SSHConfig())
        conn = Connection(
            k.host,
            user=k.user,
            port=k.port,
            config=cfg,
            connect_kwargs={
                "key_filename": [k.key],
                "look_for_keys": False,
                "allow_agent": False,
                "timeout": ct,
                "banner_timeout": ct,
                "auth_timeout": ct,
                "channel_timeout": ct,
            },
        )
        # Fabric's Connection installs AutoAddPolicy: replace it, and load only the pinned file.
        pinned, revoked = load_known_hosts(d)
        conn.client.set_missing_host_key_policy(_PinnedOnly(d, revoked))
        known = conn.client.get_host_keys()
        for name, key in pinned:
            known.add(name, key.get_name(), key)
        opened = time.monotonic()
        try:
            conn.open()
        except BaseException as exc:
            with contextlib.suppress(Exception):
                conn.close()
            mapped = self._connect_error(exc, conn.user, time.monotonic() - opened)
            if mapped is None:
                raise
            raise mapped from None
        conn.transport.set_keepalive(self.keepalive)
        with contextlib.suppress(OSError, AttributeError):
            # small request packets must not wait for a delayed ACK (Nagle): ~40 ms per command otherwise
            conn.transport.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._conn = conn
        if self.workdir == "~" or self.workdir.startswith("~/"):
            r = self._run(["sh", "-c", 'printf %s "$HOME"'], 30.0, cwd="/", env=None, stdin=None, argv_shown=None)
            if not r.ok or not r.stdout.startswith(b"/"):
                raise InfraError(d.name, "setup", f"cannot resolve $HOME for workdir {self.workdir}: {r.describe()}")
            self.workdir = r.stdout.decode() + self.workdir[1:]

    def _connect_error(self, exc: BaseException, user: str, waited: float) -> InfraError | None:
        import paramiko

        d, k = self.device, self.link
        where = f"{k.host}:{k.port}"
        ct = float(d.connect_timeout)
        if isinstance(exc, InfraError):
            return exc
        if isinstance(exc, paramiko.BadHostKeyException):
            return InfraError(
                d.name,
                "hostkey",
                f"HOST KEY CHANGED for {where}: the device offered {exc.key.get_name()} {exc.key.fingerprint}, "
                f"the pinned known_hosts {k.known_hosts} says {exc.expected_key.fingerprint}; refusing to connect",
            )
        if isinstance(exc, paramiko.PasswordRequiredException):
            return InfraError(
                d.name, "auth", f"key {k.key} is passphrase-protected; the farm needs a key without passphrase"
            )
        if isinstance(exc, paramiko.AuthenticationException):
            return InfraError(d.name, "auth", f"{where} refused key {k.key} for user {user!r}: {exc}")
        if isinstance(exc, TimeoutError | socket.timeout):
            # no answer at all: not retried (a retry would wait out the same silence again)
            return InfraError(d.name, "timeout", f"{where}: connect timed out after {ct:g}s")
        # A silent server: paramiko's transport thread gives up on the banner after ct; the client
        # then either sees that error or, racing the thread's exit, "No existing session". Both are
        # the same silence, so both are a timeout (docs/farm.md), whichever thread reported first.
        silent = "no existing session" in str(exc).lower() and waited >= ct
        if isinstance(exc, paramiko.SSHException) and ("banner" in str(exc).lower() or silent):
            return InfraError(d.name, "timeout", f"{where}: no SSH banner within {ct:g}s ({exc})")
        if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
            why = "; ".join(sorted({e.strerror or str(e) for e in exc.errors.values()}))
            return InfraError(d.name, "unreachable", f"{where}: {why}")
        if isinstance(exc, socket.gaierror):
            return InfraError(d.name, "unreachable", f"{k.host}: cannot resolve: {exc.strerror}")
        if isinstance(exc, paramiko.SSHException | EOFError | OSError):
            return InfraError(d.name, "unreachable", f"{where}: {type(exc).__name__}: {exc}")
        return None

    def close(self) -> None:
        self._connected = False
        sftp, conn, self._sftp, self._conn = self._sftp, self._conn, None, None
        if sftp is not None:
            with contextlib.suppress(Exception):
                sftp.close()
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    def _alive(self) -> bool:
        t = self._conn.transport if self._conn is not None else None
        return bool(t is not None and t.is_active())

    # -- commands
    def _run(self, argv, timeout, *, cwd, env, stdin, argv_shown, idle_timeout=None):
        import paramiko

        name = self.device.name
        shown = argv_shown or tuple(argv)
        secs = max(1, math.ceil(timeout))
        marker = new_marker()
        command = build_remote_command(argv, secs, cwd or self.workdir, marker, env)
        start = time.monotonic()

        def infra(kind: str, reason: str, out: bytes = b"", err: bytes = b"", hung: bool = False) -> RunResult:
            return RunResult(
                name,
                shown,
                Ending.INFRA,
                stdout=out,
                stderr=err,
                duration=time.monotonic() - start,
                infra=InfraError(name, kind, reason),
                timeout=timeout,
                link_hung=hung,
            )

        if not self._alive():
            return infra("disconnect", "the SSH connection is not open")
        try:
            chan = self._conn.transport.open_session(timeout=float(self.device.connect_timeout))
            chan.exec_command(command)
            if stdin:
                chan.sendall(stdin)
            chan.shutdown_write()
        except (paramiko.SSHException, EOFError, OSError) as exc:
            return infra("disconnect", f"cannot start a command: {type(exc).__name__}: {exc}")

        out, err = bytearray(), bytearray()
        deadline = start + secs + grace(secs)
        timed_out = silent = False
        last = start
        try:
            while True:
                seen = len(out) + len(err)
                while chan.recv_ready():
                    out += chan.recv(1 << 16)
                while chan.recv_stderr_ready():
                    err += chan.recv_stderr(1 << 16)
                if len(out) + len(err) != seen:
                    last = time.monotonic()
                if chan.exit_status_ready() and (chan.eof_received or chan.closed):
                    break
                if chan.closed or not self._alive():
                    break
                now = time.monotonic()
                if now >= deadline:
                    timed_out = True
                    break
                if idle_timeout is not None and now - last >= idle_timeout:
                    silent = True
                    break
                wait = min(0.5, deadline - now)
                if chan.eof_received:  # output done (the pipe stays readable): wait for the status itself
                    chan.status_event.wait(wait)
                else:
                    select.select([chan], [], [], wait)
            while chan.recv_ready():
                out += chan.recv(1 << 16)
            while chan.recv_stderr_ready():
                err += chan.recv_stderr(1 << 16)
        except (paramiko.SSHException, EOFError, OSError) as exc:
            return infra("disconnect", f"connection lost: {type(exc).__name__}: {exc}", bytes(out), bytes(err))
        finally:
            with contextlib.suppress(Exception):
                chan.close()
        dur = time.monotonic() - start
        if silent:
            return infra(
                "timeout",
                f"{command_text(shown)}: no progress for {idle_timeout:g}s (the device-side deadline "
                "should have answered; device or link hung)",
                bytes(out),
                bytes(err),
                hung=True,
            )
        if timed_out:
            return infra(
                "timeout",
                f"{command_text(shown)}: no answer {secs + grace(secs):g}s after start "
                "(link hung; the device-side timeout kills the process)",
                bytes(out),
                bytes(err),
                hung=True,
            )
        status, stderr = split_marker(bytes(err), marker)
        if status is None:
            if not self._alive():
                return infra("disconnect", "connection lost while the command ran", bytes(out), stderr)
            return infra(
                "disconnect",
                f"the remote wrapper ended without reporting a status (channel status {chan.exit_status})",
                bytes(out),
                stderr,
            )
        return status_result(
            name,
            shown,
            status,
            stdout=bytes(out),
            stderr=stderr,
            duration=dur,
            seconds=secs,
            timeout=timeout,
            cwd=cwd or self.workdir,
        )

    # -- files
    def _sftp_client(self):
        if self._sftp is None:
            self._sftp = self._conn.sftp()
            # a transfer that stalls for transfer_timeout is a hung link, not a wait without end
            self._sftp.get_channel().settimeout(float(self.device.transfer_timeout))
        return self._sftp

    def _put(self, local: Path, remote: str) -> int:
        import paramiko

        try:
            attrs = self._sftp_client().put(str(local), remote, confirm=True)
        except (paramiko.SSHException, EOFError) as exc:
            self._drop()
            raise InfraError(self.device.name, "disconnect", f"upload of {local.name} to {remote}: {exc}") from None
        except OSError as exc:
            if not self._alive():
                self._drop()
                raise InfraError(self.device.name, "disconnect", f"upload of {local.name}: {exc}") from None
            raise InfraError(self.device.name, "transfer", f"upload of {local} to {remote}: {exc}") from None
        return int(attrs.st_size or 0)

    def _get(self, remote: str, local: Path) -> int:
        import paramiko

        try:
            self._sftp_client().get(remote, str(local))
        except (paramiko.SSHException, EOFError) as exc:
            self._drop()
            raise InfraError(self.device.name, "disconnect", f"download of {remote}: {exc}") from None
        except OSError as exc:
            if not self._alive():
                self._drop()
                raise InfraError(self.device.name, "disconnect", f"download of {remote}: {exc}") from None
            raise InfraError(self.device.name, "transfer", f"download of {remote}: {exc}") from None
        return local.stat().st_size
