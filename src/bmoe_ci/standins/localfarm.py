"""The embedded local farm: this machine as five devices.

===============  =========  ========  =============================================================
device           transport  arch      how
===============  =========  ========  =============================================================
``host``         local      host      the engine runs as a subprocess
``phone-emu``    local      aarch64   ``qemu-aarch64-static`` exec prefix (no prefix on an aarch64 host)
``ssh-x86``      ssh        host      OpenSSH ``sshd`` on 127.0.0.2 (named ``ssh-<uname -m>`` on a
                                      host that is not x86_64)
``ssh-arm64``    ssh        aarch64   ``sshd`` on 127.0.0.3, qemu exec prefix like ``phone-emu``
``adb-arm64``    adb        aarch64   Debian's ``adb`` client and an adb server of the farm's own
                                      (127.0.0.1, a free port), connected to the stand-in adbd of
                                      :mod:`bmoe_ci.standins.adbd` on 127.0.0.4 (an Android-like device:
                                      ``getprop`` says arm64-v8a); qemu exec prefix like ``phone-emu``
===============  =========  ========  =============================================================

:func:`up` prepares the state directory (``$BMOE_CI_STATE``, default ``<checkout>/.cache/bmoe-ci/farm``, or
``$XDG_CACHE_HOME/bmoe-ci/farm`` for a wheel install)::

    farm.yaml          the resolved farm file (from the template devices/local.yaml)
    farm.json          what up started: sshd pids, addresses, ports
    known_hosts        each sshd's host key pinned at [127.0.0.x]:PORT
    keys/              client_ed25519(.pub), authorized_keys
    sshd/<device>/     sshd_config, ssh_host_ed25519_key(.pub), sshd.pid, sshd.log
    adb/               adbd.port, adbd.log (the stand-in), server.log
    devices/<device>/  the work directories

and starts one ``sshd -f sshd_config`` per SSH device, the stand-in adbd and an adb server on a port of
its own (never the user's 5037), which it connects to the stand-in (``adb connect``). It is idempotent:
sshds, the stand-in and the server still running are kept, keys are generated once. :func:`down` stops
exactly what ``farm.json`` records after checking that each pid is still what was started (an sshd with
our pid file; the stand-in with our port file; the adb server answering on its port).
"""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

from bmoe_ci.farm.embedded import FARM_FILE, state_dir
from bmoe_ci.farm.errors import FarmError, MissingTool
from bmoe_ci.farm.model import normalize_arch
from bmoe_ci.farm.pids import pid_running
from bmoe_ci.paths import Places

SSHD_CANDIDATES = ("/usr/sbin/sshd", "/usr/local/sbin/sshd", "/sbin/sshd")
QEMU_AARCH64 = "qemu-aarch64-static"
RECORD = "farm.json"


def template_path(places: Places | None = None) -> Path:
    """devices/local.yaml of the source tree (the checkout, or the wheel's packaged copy)."""
    try:
        path = (places or Places()).source_tree() / "devices" / "local.yaml"
    except RuntimeError as exc:
        raise FarmError(f"cannot find devices/local.yaml (the local farm template): {exc}") from None
    if not path.is_file():
        raise FarmError(f"cannot find the local farm template {path}")
    return path


def host_arch() -> str:
    return normalize_arch(platform.machine())


@dataclass(frozen=True)
class SshdSpec:
    device: str
    address: str


ADB_DEVICE = "adb-arm64"
ADBD_ADDRESS = "127.0.0.4"
ADB_SERVER_ADDRESS = "127.0.0.1"  # an adb server listens on localhost


class Layout(TypedDict):
    """The local farm on this host: template values, the sshd instances to run, the adb device."""

    HOST_ARCH: str
    SSH_HOST_NAME: str
    ARM64_PREFIX: list[str]
    ARM64_SCALE: int
    ARM64_MODE: str
    SSH_HOST_KERNELS: str
    SSH_ARM64_KERNELS: str
    sshd: list[SshdSpec]
    adb: str


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str]:
    """The CPU's feature flags (x86 ``flags``, aarch64 ``Features``), empty when unknown."""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return set()


def pinned_kernels(arch: str, emulate: bool, flags: set[str]) -> tuple[str, str]:
    """The kernel paths the ssh devices pin (``kernels`` in the farm file), so that the farm runs every
    SIMD path of both architectures: the host and phone-emu run the engine's own choice (auto); where
    that choice would be the wider path, ``ssh-<arch>`` pins the one below it (avx2 under avx512-vnni,
    neon under neon-dot). qemu-aarch64-static emulates a CPU with the dot product, so its auto path is
    always neon-dot."""
    x86 = "avx2" if arch == "x86_64" and {"avx2", "avx512f", "avx512bw", "avx512vl", "avx512_vnni"} <= flags else "auto"
    dot = emulate or "asimddp" in flags
    return x86, ("neon" if dot else "auto")


def layout() -> Layout:
    """Names and arches of the devices on this host, the sshd instances to run and the adb device."""
    arch = host_arch()
    emulate = arch != "aarch64"
    ssh_kernels, arm_kernels = pinned_kernels(arch, emulate, cpu_flags())
    ssh_host = "ssh-x86" if arch == "x86_64" else f"ssh-{arch}"
    return {
        "HOST_ARCH": arch,
        "SSH_HOST_NAME": ssh_host,
        "ARM64_PREFIX": [QEMU_AARCH64] if emulate else [],
        "ARM64_SCALE": 8 if emulate else 1,
        "ARM64_MODE": "emulated" if emulate else "native",
        "SSH_HOST_KERNELS": ssh_kernels,
        "SSH_ARM64_KERNELS": arm_kernels,
        "sshd": [SshdSpec(ssh_host, "127.0.0.2"), SshdSpec("ssh-arm64", "127.0.0.3")],
        "adb": ADB_DEVICE,
    }


def _need(tool: str, package: str, candidates: tuple[str, ...] = ()) -> str:
    for c in candidates:
        if os.access(c, os.X_OK):
            return c
    found = shutil.which(tool)
    if not found:
        raise MissingTool(f"{tool} not found: install the Debian package {package} (apt-get install {package})")
    return found


def _free_port(address: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((address, 0))
        return s.getsockname()[1]


def _port_free(address: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((address, port))
        except OSError:
            return False
        return True


def _ssh_banner(address: str, port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((address, port), timeout=timeout) as s:
            return s.recv(64).startswith(b"SSH-")
    except OSError:
        return False


def _is_our_sshd(pid: int, pidfile: Path, sshd: str | None = None) -> bool:
    """pid is a live sshd and our pid file names it."""
    try:
        if int(pidfile.read_text().strip()) != pid:
            return False
    except (OSError, ValueError):
        return False
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return False
    exe = exe.removesuffix(" (deleted)")
    return os.path.basename(exe) == "sshd" and (sshd is None or os.path.realpath(sshd) == os.path.realpath(exe))


def _keygen(keygen: str, path: Path, comment: str) -> None:
    if path.is_file() and path.with_suffix(".pub").is_file():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    for p in (path, path.with_suffix(".pub")):
        with contextlib.suppress(FileNotFoundError):
            p.unlink()
    subprocess.run(
        [keygen, "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)], check=True, stdout=subprocess.DEVNULL
    )
    path.chmod(0o600)


def _sshd_config(state: Path, spec: SshdSpec, port: int) -> str:
    d = state / "sshd" / spec.device
    root = os.geteuid() == 0
    lines = [
        "# written by `bmoe-ci farm up`; regenerated on every up",
        f"ListenAddress {spec.address}",
        f"Port {port}",
        f"HostKey {d / 'ssh_host_ed25519_key'}",
        f"PidFile {d / 'sshd.pid'}",
        f"AuthorizedKeysFile {state / 'keys' / 'authorized_keys'}",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "PermitRootLogin prohibit-password" if root else "PermitRootLogin no",
        f"AllowUsers {getpass.getuser()}",
        "StrictModes no",
        "UsePAM no",
        "UseDNS no",
        "PrintMotd no",
        "X11Forwarding no",
        "AllowTcpForwarding no",
        "MaxStartups 64",
        "MaxSessions 64",
        "LogLevel INFO",
        "Subsystem sftp internal-sftp",
        # bash reads ~/.bashrc for commands run by sshd when it is a top-level shell (SHLVL unset);
        # SHLVL=1 spares every round trip the cost of the user's rc file (pyenv init and the like)
        "SetEnv SHLVL=1",
    ]
    return "\n".join(lines) + "\n"


def _record(state: Path) -> dict:
    try:
        return json.loads((state / RECORD).read_text())
    except (OSError, ValueError):
        return {}


def _write(path: Path, text: str, mode: int | None = None) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    if mode is not None:
        tmp.chmod(mode)
    os.replace(tmp, path)


def _yaml_value(v: object) -> str:
    return json.dumps(v)  # JSON scalars and lists are valid YAML flow values


def _start_sshd(sshd: str, state: Path, spec: SshdSpec, port: int, timeout: float) -> int | None:
    """Start one sshd; its pid once it answers, None if the port was taken. FarmError otherwise."""
    d = state / "sshd" / spec.device
    cfg, pidfile, log = d / "sshd_config", d / "sshd.pid", d / "sshd.log"
    _write(cfg, _sshd_config(state, spec, port))
    test = subprocess.run([sshd, "-t", "-f", str(cfg)], capture_output=True, text=True)
    if test.returncode != 0:
        raise FarmError(f"sshd rejects {cfg}: {test.stderr.strip()}")
    for stale in (pidfile, log):
        with contextlib.suppress(FileNotFoundError):
            stale.unlink()
    start = subprocess.run([sshd, "-f", str(cfg), "-E", str(log)], capture_output=True, text=True)
    if start.returncode != 0:
        raise FarmError(f"sshd for {spec.device} did not start: {start.stderr.strip()} (see {log})")
    deadline = time.monotonic() + timeout
    while not (pidfile.is_file() and _ssh_banner(spec.address, port)):
        text = log.read_text(errors="replace") if log.exists() else ""
        if "Cannot bind any address" in text or "Address already in use" in text:
            return None
        if time.monotonic() > deadline:
            raise FarmError(
                f"sshd for {spec.device} is not answering on {spec.address}:{port} after {timeout:g}s: "
                f"{text[-400:].strip()}"
            )
        time.sleep(0.05)
    return int(pidfile.read_text().strip())


def up(
    state: Path | None = None,
    *,
    log: Callable[[str], None] | None = None,
    timeout: float = 15.0,
    places: Places | None = None,
) -> Path:
    """Start (or keep) the local farm; returns the resolved farm file. Idempotent."""
    say = log or (lambda _m: None)
    state = (state or state_dir(places)).resolve()
    lay = layout()
    sshd = _need("sshd", "openssh-server", SSHD_CANDIDATES)
    keygen = _need("ssh-keygen", "openssh-client")
    if lay["ARM64_PREFIX"]:
        _need(QEMU_AARCH64, "qemu-user-static")
    _need("timeout", "coreutils")
    adb = _need("adb", "adb")
    template = template_path(places).read_text()

    for sub in ("keys", "sshd", "devices"):
        (state / sub).mkdir(parents=True, exist_ok=True)
    state.chmod(0o700)
    client = state / "keys" / "client_ed25519"
    _keygen(keygen, client, "bmoe-ci local farm client")
    _write(state / "keys" / "authorized_keys", client.with_suffix(".pub").read_text(), 0o600)

    privsep = Path("/run/sshd")
    if not privsep.is_dir():
        try:
            privsep.mkdir(mode=0o755, parents=True, exist_ok=True)
        except OSError as exc:
            raise FarmError(
                f"sshd needs its privilege separation directory {privsep}: {exc.strerror} "
                "(create it as root: mkdir -p /run/sshd)"
            ) from None

    record = _record(state)
    sshds = record.get("sshd", {})
    ports: dict[str, int] = {}
    known: list[str] = []
    for spec in lay["sshd"]:
        d = state / "sshd" / spec.device
        d.mkdir(parents=True, exist_ok=True)
        hostkey = d / "ssh_host_ed25519_key"
        _keygen(keygen, hostkey, f"bmoe-ci local farm {spec.device}")
        prev = sshds.get(spec.device, {})
        pid, port = prev.get("pid"), prev.get("port")
        pidfile = d / "sshd.pid"
        if (
            pid
            and port
            and prev.get("address") == spec.address
            and _is_our_sshd(pid, pidfile, sshd)
            and _ssh_banner(spec.address, port)
        ):
            say(f"{spec.device}: sshd already running on {spec.address}:{port} (pid {pid})")
        else:
            if pid and _is_our_sshd(pid, pidfile, sshd):
                _stop(pid)
            if not (port and _port_free(spec.address, port)):
                port = _free_port(spec.address)
            for attempt in range(3):  # the free port may be taken between the probe and sshd's bind
                pid = _start_sshd(sshd, state, spec, port, timeout)
                if pid is not None:
                    break
                if attempt == 2:
                    raise FarmError(f"sshd for {spec.device} could not bind {spec.address} (see {d / 'sshd.log'})")
                port = _free_port(spec.address)
            say(f"{spec.device}: sshd started on {spec.address}:{port} (pid {pid})")
        sshds[spec.device] = {"pid": pid, "port": port, "address": spec.address, "pidfile": str(pidfile)}
        # recorded at once: if a later step fails, `down` still finds what was started
        _write(state / RECORD, json.dumps({**record, "state": str(state), "sshd": sshds}, indent=2) + "\n")
        ports[spec.device] = port
        pub = (d / "ssh_host_ed25519_key.pub").read_text().split()
        known.append(f"[{spec.address}]:{port} {pub[0]} {pub[1]}")

    _write(state / "known_hosts", "\n".join(known) + "\n", 0o644)
    adb_record = _adb_up(adb, state, record.get("adb", {}), say, timeout)
    record = {**record, "state": str(state), "sshd": sshds, "adb": adb_record}
    _write(state / RECORD, json.dumps(record, indent=2) + "\n")
    ssh_host, ssh_arm = (s.device for s in lay["sshd"])
    values = {
        "STATE": str(state),
        "USER": getpass.getuser(),
        "HOST_ARCH": lay["HOST_ARCH"],
        "SSH_HOST_NAME": lay["SSH_HOST_NAME"],
        "SSH_HOST_PORT": ports[ssh_host],
        "SSH_ARM64_PORT": ports[ssh_arm],
        "ARM64_PREFIX": lay["ARM64_PREFIX"],
        "ARM64_SCALE": lay["ARM64_SCALE"],
        "ARM64_MODE": lay["ARM64_MODE"],
        "SSH_HOST_KERNELS": lay["SSH_HOST_KERNELS"],
        "SSH_ARM64_KERNELS": lay["SSH_ARM64_KERNELS"],
        "ADB_NAME": ADB_DEVICE,
        "ADB_SERIAL": f"{ADBD_ADDRESS}:{adb_record['adbd']['port']}",
        "ADB_SERVER": f"{ADB_SERVER_ADDRESS}:{adb_record['server']['port']}",
    }
    resolved = _render(template, values)
    _write(state / FARM_FILE, resolved)
    record = {
        "state": str(state),
        "sshd": sshds,
        "adb": adb_record,
        "started": record.get("started") or time.time(),
        "updated": time.time(),
    }
    _write(state / RECORD, json.dumps(record, indent=2) + "\n")
    # validate what we wrote: a broken template must fail here, not in the first test
    from bmoe_ci.farm.farmfile import load_farm_file

    load_farm_file(state / FARM_FILE)
    return state / FARM_FILE


def _render(template: str, values: dict[str, object]) -> str:
    out = template
    for k, v in values.items():
        # strings go inside the template's double quotes, JSON-escaped; lists and numbers as JSON
        rendered = json.dumps(v)[1:-1] if isinstance(v, str) else json.dumps(v)
        out = out.replace("${" + k + "}", rendered)
    header = "# GENERATED by `bmoe-ci farm up` from devices/local.yaml; edits are lost on the next up.\n"
    return header + out


def _stop(pid: int, timeout: float = 5.0) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not pid_running(pid):
            return
        time.sleep(0.02)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def down(
    state: Path | None = None, *, log: Callable[[str], None] | None = None, places: Places | None = None
) -> list[str]:
    """Stop the sshds that :func:`up` started (only those still verifiably ours). Returns their names."""
    say = log or (lambda _m: None)
    state = (state or state_dir(places)).resolve()
    record = _record(state)
    stopped = []
    for name, info in record.get("sshd", {}).items():
        pid, pidfile = info.get("pid"), Path(info.get("pidfile", ""))
        if pid and _is_our_sshd(int(pid), pidfile):
            _stop(int(pid))
            stopped.append(name)
            say(f"{name}: sshd (pid {pid}) stopped")
        else:
            say(f"{name}: sshd not running")
        with contextlib.suppress(OSError):
            pidfile.unlink()
    adb_record = record.get("adb", {})
    if adb_record:
        stopped += _adb_down(adb_record, say)
    if record:
        record["sshd"] = {}
        record["adb"] = {}
        _write(state / RECORD, json.dumps(record, indent=2) + "\n")
    with contextlib.suppress(FileNotFoundError):
        (state / FARM_FILE).unlink()
    return stopped


def sshd_status(state: Path | None = None, places: Places | None = None) -> dict[str, dict]:
    """Per sshd device: address, port, pid, running (verifiably ours) and answering."""
    state = (state or state_dir(places)).resolve()
    out = {}
    for name, info in _record(state).get("sshd", {}).items():
        pid = info.get("pid")
        running = bool(pid) and _is_our_sshd(int(pid), Path(info.get("pidfile", "")))
        out[name] = {
            **info,
            "running": running,
            "answering": running and _ssh_banner(info["address"], int(info["port"])),
        }
    return out


# --------------------------------------------------------------------------------------------------
# adb: the stand-in adbd and an adb server of the farm's own


def _adb_server_answers(port: int, timeout: float = 1.0) -> bool:
    """An adb server answers ``host:version`` on localhost:port (the smart-socket protocol)."""
    try:
        with socket.create_connection((ADB_SERVER_ADDRESS, port), timeout=timeout) as s:
            s.sendall(b"000chost:version")
            return s.recv(4) == b"OKAY"
    except OSError:
        return False


def _is_our_adbd(pid: int, portfile: Path) -> bool:
    """pid is a live stand-in adbd started with our port file."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    # (bmoe_ci.farm.adbd: its name before the stand-ins left the farm, for a farm brought up then)
    named = b"bmoe_ci.standins.adbd" in argv or b"bmoe_ci.farm.adbd" in argv
    return pid_running(pid) and named and str(portfile).encode() in argv


def _start_adbd(state: Path, timeout: float) -> dict:
    d = state / "adb"
    portfile, log = d / "adbd.port", d / "adbd.log"
    with contextlib.suppress(FileNotFoundError):
        portfile.unlink()
    with open(log, "ab") as fh:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bmoe_ci.standins.adbd",
                "--listen",
                f"{ADBD_ADDRESS}:0",
                "--port-file",
                str(portfile),
                "--prop",
                "ro.product.cpu.abi=arm64-v8a",
                "--prop",
                "ro.product.model=bmoe-ci stand-in",
                "--prop",
                "ro.product.manufacturer=bmoe-ci",
                "--prop",
                "ro.build.version.sdk=34",
            ],
            stdin=subprocess.DEVNULL,
            stdout=fh,
            stderr=fh,
            start_new_session=True,
        )
    deadline = time.monotonic() + timeout
    while not portfile.is_file():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise FarmError(f"the stand-in adbd did not start: {log.read_text(errors='replace')[-400:].strip()}")
        time.sleep(0.05)
    return {
        "pid": proc.pid,
        "port": int(portfile.read_text().strip()),
        "address": ADBD_ADDRESS,
        "portfile": str(portfile),
    }


def _adb_up(adb: str, state: Path, prev: dict, say: Callable[[str], None], timeout: float) -> dict:
    """Start (or keep) the stand-in adbd and the farm's adb server, and connect the one to the other."""
    (state / "adb").mkdir(parents=True, exist_ok=True)
    adbd = prev.get("adbd", {})
    if adbd.get("pid") and _is_our_adbd(int(adbd["pid"]), Path(adbd.get("portfile", ""))):
        say(f"{ADB_DEVICE}: stand-in adbd already running on {ADBD_ADDRESS}:{adbd['port']} (pid {adbd['pid']})")
    else:
        adbd = _start_adbd(state, timeout)
        say(f"{ADB_DEVICE}: stand-in adbd started on {ADBD_ADDRESS}:{adbd['port']} (pid {adbd['pid']})")
    server = prev.get("server", {})
    port = server.get("port")
    if port and _adb_server_answers(int(port)):
        say(f"{ADB_DEVICE}: adb server already running on {ADB_SERVER_ADDRESS}:{port}")
    else:
        port = _free_port(ADB_SERVER_ADDRESS)
        with open(state / "adb" / "server.log", "ab") as fh:
            started = subprocess.run(
                [adb, "-P", str(port), "start-server"], stdout=fh, stderr=fh, timeout=timeout, check=False
            )
        if started.returncode != 0 or not _adb_server_answers(port):
            raise FarmError(f"the adb server did not start on port {port} (see {state / 'adb' / 'server.log'})")
        say(f"{ADB_DEVICE}: adb server started on {ADB_SERVER_ADDRESS}:{port}")
    serial = f"{ADBD_ADDRESS}:{adbd['port']}"
    r = subprocess.run(
        [adb, "-P", str(port), "connect", serial], capture_output=True, text=True, timeout=timeout, check=False
    )
    if "connected to" not in r.stdout:
        raise FarmError(f"adb connect {serial}: {(r.stdout + r.stderr).strip()}")
    return {"adbd": adbd, "server": {"port": port, "address": ADB_SERVER_ADDRESS, "adb": adb}}


def _adb_down(record: dict, say: Callable[[str], None]) -> list[str]:
    stopped = []
    server = record.get("server", {})
    if server.get("port") and _adb_server_answers(int(server["port"])):
        subprocess.run(
            [server.get("adb", "adb"), "-P", str(server["port"]), "kill-server"],
            capture_output=True,
            timeout=15,
            check=False,
        )
        stopped.append("adb-server")
        say(f"adb server on port {server['port']} stopped")
    adbd = record.get("adbd", {})
    if adbd.get("pid") and _is_our_adbd(int(adbd["pid"]), Path(adbd.get("portfile", ""))):
        _stop(int(adbd["pid"]))
        stopped.append(ADB_DEVICE)
        say(f"{ADB_DEVICE}: stand-in adbd (pid {adbd['pid']}) stopped")
    return stopped


@contextlib.contextmanager
def running(
    state: Path | None = None, *, log: Callable[[str], None] | None = None, places: Places | None = None
) -> Iterator[Path]:
    """``up`` on entry, ``down`` on exit (for test sessions): yields the resolved farm file."""
    path = up(state, log=log, places=places)
    try:
        yield path
    finally:
        down(state, log=log, places=places)
