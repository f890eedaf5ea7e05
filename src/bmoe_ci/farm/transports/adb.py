"""``transport: adb``: an Android device through the Android Debug Bridge, the way device labs reach
phones: the ``adb`` client (Debian's ``adb`` package, or the platform tools) talks to an adb server,
which holds the USB or TCP link to the device's ``adbd``.

Device keys: ``serial`` (what ``adb devices`` lists: a USB serial, or ``HOST:PORT`` for adb over Wi-Fi),
``adb_server`` (``HOST:PORT`` of the adb server to use; default the client's own, localhost:5037, which
the client starts when it is not running), ``workdir`` (default ``/data/local/tmp/bmoe``, the one
directory an app-less shell user may write and execute from on every Android).

* connect: the named server must answer (it is never started for you), then ``adb get-state`` must say
  ``device``. A ``HOST:PORT`` serial that the server does not know is connected (``adb connect``) first:
  that is what brings a Wi-Fi device back after a drop. ``unauthorized`` (the phone never accepted this
  computer's key), ``offline`` and an unknown serial are one-line errors. The device must have the
  ``shell_v2`` feature (Android 7 and later): its exit codes and a stderr of its own come from it.
* run: ``adb shell`` with the wrapper of :mod:`.remote_shell`, so deadlines (``timeout -s KILL`` on the
  device), exit status and stderr capture are exactly those of the ssh transport. The local client runs
  in its own process group, killed at the controller's deadline; the adb server then closes the stream,
  and adbd kills the command.
* files: ``adb push`` / ``adb pull``; the store verifies every upload's hash on the device and renames it
  into place (:mod:`bmoe_ci.farm.store`).
"""

from __future__ import annotations

import re
import shutil
import socket
from pathlib import Path
from typing import Any

from ..errors import InfraError
from ..model import Device, DeviceSpec, NonEmpty, TransportKeys
from .base import Ending, Problem, RunResult, Transport, _tail, command_text, grace
from .local import ProcessRun, run_process
from .remote_shell import build_remote_command, new_marker, split_marker, status_result

DEFAULT_WORKDIR = "/data/local/tmp/bmoe"
#: a serial of the form HOST:PORT is a device adb reaches over TCP (``adb connect``)
_TCP_SERIAL = re.compile(r"^(?P<host>[A-Za-z0-9._-]+|\[[0-9A-Fa-f:]+\]):(?P<port>\d{1,5})$")
#: what the adb client prints when the device went away under a command
_GONE = ("not found", "no devices", "offline", "closed", "protocol fault", "device still authorizing")


def parse_server(value: str) -> tuple[str, int] | None:
    """``HOST:PORT`` -> (host, port), None when malformed."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        return None
    return host.strip("[]"), int(port)


class AdbKeys(TransportKeys):
    """The keys of an adb device (``serial`` is required: checked by the transport)."""

    serial: NonEmpty | None = None
    adb_server: NonEmpty | None = None

    def where(self) -> str:
        return f"adb {self.serial}" + (f" on server {self.adb_server}" if self.adb_server else "")


class AdbTransport(Transport):
    """An Android device over adb; see the module docstring."""

    name = "adb"
    keys = AdbKeys
    default_workdir = DEFAULT_WORKDIR

    @classmethod
    def check_device(cls, spec: DeviceSpec, keys: Any, base: Path, problem: Problem) -> dict[str, Any]:
        if keys.serial is None:
            problem("", "missing required key 'serial' (transport adb: what `adb devices` lists)")
        if keys.adb_server is not None and parse_server(keys.adb_server) is None:
            problem("adb_server", f"expected HOST:PORT of an adb server, e.g. 127.0.0.1:5037 (got {keys.adb_server!r})")
        if not (spec.workdir or "").startswith("/"):
            problem("workdir", f"workdir of an adb device must be absolute (got {spec.workdir!r})")
        return {}

    def __init__(self, device: Device):
        super().__init__(device)
        assert isinstance(device.link, AdbKeys), device.link
        self.link = device.link

    # -- the adb client
    def _server_client(self) -> list[str]:
        """The adb client talking to the device's server."""
        adb = shutil.which("adb")
        if adb is None:
            raise InfraError(self.device.name, "setup", "the adb client is not installed (Debian: apt-get install adb)")
        if not self.link.adb_server:
            return [adb]
        host, port = parse_server(self.link.adb_server) or ("", 0)
        return [adb, "-H", host, "-P", str(port)]

    def _client(self) -> list[str]:
        """The adb client talking to the device."""
        return [*self._server_client(), "-s", str(self.link.serial)]

    def _adb(self, *args: str, timeout: float | None = None) -> ProcessRun:
        """One adb client command about the device (not a device command): get-state, features, ..."""
        return run_process([*self._client(), *args], timeout or float(self.device.connect_timeout))

    def _server_answers(self) -> None:
        """A named adb server must be running: the client would start a server of its own on a local
        address, which would know none of the lab's devices."""
        if not self.link.adb_server:
            return
        host, port = parse_server(self.link.adb_server) or ("", 0)
        try:
            with socket.create_connection((host, port), timeout=float(self.device.connect_timeout)):
                pass
        except TimeoutError:
            raise InfraError(
                self.device.name,
                "timeout",
                f"adb server {self.link.adb_server}: no connection within {self.device.connect_timeout:g}s",
            ) from None
        except OSError as exc:
            raise InfraError(
                self.device.name,
                "unreachable",
                f"adb server {self.link.adb_server} not reachable ({exc.strerror or exc}): start it there "
                f"(adb -P {port} start-server) or fix adb_server",
            ) from None

    def _state(self) -> tuple[str, str]:
        """(``adb get-state``'s answer, the client's stderr)."""
        r = self._adb("get-state")
        if r.timed_out:
            raise InfraError(
                self.device.name,
                "timeout",
                f"adb get-state: no answer in {r.duration:.0f}s (the adb server {self.link.adb_server or ''} hung?)",
            )
        return r.stdout.decode(errors="replace").strip(), r.stderr.decode(errors="replace").strip()

    def _connect(self) -> None:
        d, k = self.device, self.link
        self._server_answers()
        state, err = self._state()
        if state != "device" and "not found" in err and _TCP_SERIAL.match(str(k.serial)):
            r = run_process([*self._server_client(), "connect", str(k.serial)], float(d.connect_timeout))
            if r.timed_out:
                raise InfraError(d.name, "timeout", f"adb connect {k.serial}: no answer in {r.duration:.0f}s")
            said = (r.stdout + r.stderr).decode(errors="replace").strip()
            if "authenticate" in said:  # connected, but the phone never accepted this server's key
                raise self._state_error("unauthorized", said)
            if "connected to" not in said:
                raise InfraError(d.name, "unreachable", f"adb connect {k.serial}: {said or 'no answer'}")
            state, err = self._state()
        if state != "device":
            raise self._state_error(state, err)
        features = self._adb("features")
        if features.timed_out:
            raise InfraError(d.name, "timeout", f"adb features: no answer in {features.duration:.0f}s")
        if "shell_v2" not in features.stdout.decode(errors="replace").replace("\n", ",").split(","):
            raise InfraError(
                d.name,
                "setup",
                f"device {k.serial} lacks adb's shell_v2 feature (Android 7 or later): its exit codes cannot be read",
            )

    def _state_error(self, state: str, err: str) -> InfraError:
        d, k = self.device, self.link
        text = f"{state} {err}".lower()
        if "unauthorized" in text:
            return InfraError(
                d.name,
                "auth",
                f"device {k.serial} is unauthorized: unlock it and accept the 'Allow USB debugging' prompt for the "
                "adb server's key (~/.android/adbkey.pub of the user running the server)",
            )
        if "offline" in text:
            return InfraError(d.name, "unreachable", f"device {k.serial} is offline (reconnect its cable or adb link)")
        if "not found" in text:
            listed = self._adb("devices", timeout=float(d.connect_timeout)).stdout.decode(errors="replace")
            serials = [ln.split()[0] for ln in listed.splitlines()[1:] if ln.strip() and not ln.startswith("*")]
            server = k.adb_server or "localhost:5037"
            return InfraError(
                d.name,
                "unreachable",
                f"unknown serial {k.serial}: the adb server at {server} lists "
                + (", ".join(serials) if serials else "no device"),
            )
        return InfraError(d.name, "unreachable", f"adb get-state for {k.serial}: {_tail((err or state).encode())}")

    def close(self) -> None:
        # the link belongs to the adb server; there is nothing of ours to close
        self._connected = False

    # -- commands
    def _run(self, argv, timeout, *, cwd, env, stdin, argv_shown, idle_timeout=None):
        name = self.device.name
        shown = argv_shown or tuple(argv)
        secs = max(1, int(-(-timeout // 1)))
        marker = new_marker()
        command = build_remote_command(argv, secs, cwd or self.workdir, marker, env)
        try:
            client = self._client()
        except InfraError as exc:
            return RunResult(name, shown, Ending.INFRA, infra=exc, timeout=timeout)
        shell = [*client, "shell", "-T", *(["-n"] if stdin is None else []), command]
        p = run_process(shell, secs + grace(secs), stdin=stdin, idle_timeout=idle_timeout)

        def infra(kind: str, reason: str) -> RunResult:
            return RunResult(
                name,
                shown,
                Ending.INFRA,
                stdout=p.stdout,
                stderr=p.stderr,
                duration=p.duration,
                infra=InfraError(name, kind, reason),
                timeout=timeout,
                link_hung=p.silent or p.timed_out,
            )

        if p.spawn_error is not None:
            return infra("setup", f"cannot run the adb client: {p.spawn_error[1]}")
        if p.silent:
            return infra(
                "timeout",
                f"{command_text(shown)}: no progress for {idle_timeout:g}s (the device-side deadline "
                "should have answered; device or link hung)",
            )
        if p.timed_out:
            return infra(
                "timeout",
                f"{command_text(shown)}: no answer {secs + grace(secs):g}s after start "
                "(link hung; the device-side timeout kills the process)",
            )
        status, stderr = split_marker(p.stderr, marker)
        if status is None:
            said = _tail(stderr)
            if any(k in said.lower() for k in _GONE):
                return infra("disconnect", f"the device went away while the command ran: {said}")
            return infra(
                "disconnect", f"the remote wrapper ended without reporting a status (adb exit {p.returncode}: {said})"
            )
        return status_result(
            name,
            shown,
            status,
            stdout=p.stdout,
            stderr=stderr,
            duration=p.duration,
            seconds=secs,
            timeout=timeout,
            cwd=cwd or self.workdir,
        )

    # -- files
    def _transfer(self, verb: str, src: str, dst: str, what: str, size: int) -> None:
        # transfer_timeout (a minute by default), plus a second per MB: slower than 1 MB/s is a hung link
        r = run_process([*self._client(), verb, src, dst], float(self.device.transfer_timeout) + size / 1e6)
        if r.returncode == 0:
            return
        said = _tail(r.stderr + r.stdout)
        if r.timed_out:
            raise InfraError(self.device.name, "disconnect", f"{what}: adb {verb} hung for {r.duration:.0f}s")
        kind = "disconnect" if any(k in said.lower() for k in _GONE) else "transfer"
        raise InfraError(self.device.name, kind, f"{what}: adb {verb}: {said}")

    def _put(self, local: Path, remote: str) -> int:
        self._transfer("push", str(local), remote, f"upload of {local.name} to {remote}", local.stat().st_size)
        return local.stat().st_size

    def _get(self, remote: str, local: Path, size: int = 0) -> int:
        self._transfer("pull", remote, str(local), f"download of {remote}", size)
        return local.stat().st_size
