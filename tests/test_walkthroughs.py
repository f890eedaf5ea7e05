"""Every walkthrough of docs/ followed literally, as a person would: adding a phone over USB and over
Wi-Fi, a desktop over SSH (docs/farm.md), running one gate on one phone (docs/farm.md), the nightly on
a self-hosted runner (docs/ci.md). A step that fails when typed as written fails here.

The walkthroughs are read from the docs themselves, between ``<!-- walkthrough NAME -->`` and
``<!-- /walkthrough -->``, with the conventions docs/farm.md states: each line of a ``sh`` block is a
command typed on the controller in the walkthrough's directory (a fresh one: the root of a repository
that runs the gates), ``# exit N`` the exit status to expect (else 0), ``# -> TEXT`` what its output
must say; a ``sh`` block marked *on the desktop* (or phone) is done on the device, which here is a
stand-in set up the same way by :data:`ON_DEVICE`; a ``yaml`` block starting with ``# PATH`` is that
whole file. ``bmoe-ci`` and ``pytest`` are this checkout's, on ``PATH``.

The devices are the embedded local farm's stand-ins, in a farm of this module's own (``farm up`` with
its own state: no other test's farm is touched): the stand-in adbd plays the phone (its serial
replaces the example's, and the controller's adb server is the farm's, through ``ADB_SERVER_SOCKET``
as a controller's default server would be), the loopback sshd plays the desktop (its address, port
and user replace the example's). The one thing the docs cannot say for a stand-in: its phone runs this
host's CPU, so on an x86_64 host the phone gets the local farm's exec prefix (qemu) for the aarch64
engine, as the farm's own adb device has. Lean on purpose: one fixture, one gate, two nights.
"""

from __future__ import annotations

import getpass
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from bmoe_ci.farm import load_farm_file
from bmoe_ci.standins import localfarm
from gate_run import REPO

DOCS = REPO / "docs"
_WALKTHROUGH = re.compile(r"<!-- walkthrough (\S+) -->(.*?)<!-- /walkthrough -->", re.S)
_FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>\w+)(?P<info>[^\n]*)\n(?P<body>.*?)^(?P=indent)```", re.S | re.M)
_EXPECT = re.compile(r"\s+#\s*(?:exit (?P<exit>\d+)|-> (?P<says>.+?))\s*$")

needs_farm_tools = pytest.mark.skipif(
    shutil.which("adb") is None or (shutil.which("sshd") is None and not Path("/usr/sbin/sshd").exists()),
    reason="needs Debian's adb and openssh-server (scripts/setup.sh installs them)",
)


@dataclass(frozen=True)
class Step:
    kind: str  # "run" (on the controller), "device" (on the device), "file" (write it)
    text: str  # the command, the device block, or the file's content
    path: str = ""  # a file's path
    exit: int = 0
    says: str = ""


def walkthroughs() -> dict[str, list[Step]]:
    """Every walkthrough of docs/*.md, by name: its steps in order."""
    found: dict[str, list[Step]] = {}
    for doc in sorted(DOCS.glob("*.md")):
        for name, body in _WALKTHROUGH.findall(doc.read_text(encoding="utf-8")):
            assert name not in found, f"{doc.name}: walkthrough {name} twice"
            steps: list[Step] = []
            for m in _FENCE.finditer(body):
                text = textwrap.dedent(m["body"])
                if m["lang"] == "yaml":
                    first, _, rest = text.partition("\n")
                    assert first.startswith("# "), f"{name}: a yaml block must start with '# PATH'"
                    steps.append(Step("file", rest, path=first[2:].strip()))
                elif m["lang"] == "sh" and m["info"].strip():
                    steps.append(Step("device", text, path=m["info"].strip()))
                elif m["lang"] == "sh":
                    for line in text.splitlines():
                        if not line.strip() or line.lstrip().startswith("#"):
                            continue
                        e = _EXPECT.search(line)
                        command = line[: e.start()] if e else line.split("  #", 1)[0]
                        steps.append(
                            Step(
                                "run",
                                command.strip(),
                                exit=int(e["exit"]) if e and e["exit"] else 0,
                                says=e["says"] if e and e["says"] else "",
                            )
                        )
            found[name] = steps
    return found


@dataclass
class StandIns:
    state: Path
    serial: str  # the stand-in adbd, as the farm's adb server lists it
    adb_server: int  # the farm's adb server's port
    ssh_host: str
    ssh_port: int
    phone_prefix: list[str]  # the local farm's exec prefix for its arm64 devices ([] on an aarch64 host)


@pytest.fixture(scope="module")
def stand_ins(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandIns]:
    state = tmp_path_factory.mktemp("walkthrough-farm")
    with localfarm.running(state):
        record = json.loads((state / "farm.json").read_text())
        adbd, sshd = record["adb"]["adbd"], record["sshd"][str(localfarm.layout()["SSH_HOST_NAME"])]
        phone = load_farm_file(state / "farm.yaml").devices[localfarm.ADB_DEVICE]
        yield StandIns(
            state=state,
            serial=f"{adbd['address']}:{adbd['port']}",
            adb_server=int(record["adb"]["server"]["port"]),
            ssh_host=sshd["address"],
            ssh_port=int(sshd["port"]),
            phone_prefix=list(phone.exec_prefix),
        )


def _shims(bin_dir: Path) -> None:
    """`bmoe-ci` and `pytest` of this checkout, as an installed bmoe-ci puts them on PATH."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name, module in (("bmoe-ci", "bmoe_ci.cli"), ("pytest", "pytest")):
        shim = bin_dir / name
        shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m {module} "$@"\n')
        shim.chmod(0o755)


def _env(s: StandIns, bin_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("BMOE_FARM", "BMOE_DEVICE", "PYTEST_ADDOPTS")}
    env.update(
        PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
        PYTHONPATH=os.pathsep.join(p for p in (str(REPO / "src"), os.environ.get("PYTHONPATH", "")) if p),
        ADB_SERVER_SOCKET=f"tcp:127.0.0.1:{s.adb_server}",  # the controller's adb server: the farm's
        BMOE_CI_STATE=str(s.state),
    )
    return env


def _phone(s: StandIns, lab: Path) -> dict[str, str]:
    """The example phone's values -> the stand-in's."""
    subs = {"35161FDJH000GX": s.serial, "10.20.0.8:5555": s.serial}
    if s.phone_prefix:  # the stand-in runs this host's CPU: the aarch64 engine under the farm's emulator
        subs["transport: adb\n"] = f"transport: adb\n    exec_prefix: {json.dumps(s.phone_prefix)}\n"
    return subs


def _desktop(s: StandIns, lab: Path) -> dict[str, str]:
    """The example desktop's values -> the loopback sshd's."""
    return {
        "ws-x86.lab.example": s.ssh_host,
        "-p 22 ": f"-p {s.ssh_port} ",
        "port: 22\n": f"port: {s.ssh_port}\n",
        "user: ci\n": f"user: {getpass.getuser()}\n",
        "/var/tmp/bmoe-ci": str(lab / "desktop-workdir"),
        "arch: x86_64\n": f"arch: {localfarm.host_arch()}\n",  # the sshd runs on this host
    }


def _authorize(s: StandIns, lab: Path, block: str) -> None:
    """On the desktop: its farm user's authorized keys get the controller's public key."""
    assert "farm_ed25519.pub" in block and "authorized_keys" in block, block
    pub = (lab / "devices" / "keys" / "farm_ed25519.pub").read_text()
    with (s.state / "keys" / "authorized_keys").open("a") as fh:
        fh.write(pub)


# walkthrough -> (its substitutions, what each of its device steps is done as on the stand-in)
Subs = Callable[[StandIns, Path], dict[str, str]]
ON_DEVICE: dict[str, tuple[Subs, Callable[[StandIns, Path, str], None] | None]] = {
    "usb-phone": (_phone, None),
    "wifi-phone": (_phone, None),
    "one-gate": (_phone, None),
    "ssh-desktop": (_desktop, _authorize),
    "self-hosted-nightly": (_desktop, None),
}


def follow(name: str, s: StandIns, lab: Path) -> list[subprocess.CompletedProcess[str]]:
    """Do walkthrough *name* in *lab* step by step; fail at the first step that does not do what the
    doc says. Returns what each command printed."""
    steps = walkthroughs()[name]
    subs_of, on_device = ON_DEVICE[name]
    subs = subs_of(s, lab)

    def local(text: str) -> str:
        for old, new in subs.items():
            text = text.replace(old, new)
        return text

    bin_dir = lab.parent / f"{lab.name}-bin"
    _shims(bin_dir)
    env = _env(s, bin_dir)
    done = []
    for i, step in enumerate(steps, 1):
        where = f"{name} step {i}"
        if step.kind == "file":
            path = lab / step.path
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(local(step.text))
        elif step.kind == "device":
            assert on_device is not None, f"{where}: no stand-in does {step.path!r}: {step.text}"
            on_device(s, lab, step.text)
        else:
            command = local(step.text)
            proc = subprocess.run(
                ["bash", "-c", command], cwd=lab, env=env, capture_output=True, text=True, timeout=900, check=False
            )
            out = proc.stdout + proc.stderr
            assert proc.returncode == step.exit, f"{where}: `{command}` exited {proc.returncode}:\n{out[-4000:]}"
            assert local(step.says) in out, f"{where}: `{command}` did not say {local(step.says)!r}:\n{out[-4000:]}"
            done.append(proc)
    return done


# ------------------------------------------------------------------------------------------ the parser


def test_every_walkthrough_is_found_and_has_a_stand_in() -> None:
    found = walkthroughs()
    assert set(found) == set(ON_DEVICE), sorted(found)
    for name, steps in found.items():
        assert any(s.kind == "run" for s in steps), name
        assert [s.path for s in steps if s.kind == "file"] in ([], ["devices/lab.yaml"]), name
    # the fixes that following them literally needed: the key's directory first; a whole farm file
    ssh = [s.text for s in found["ssh-desktop"] if s.kind == "run"]
    assert ssh.index("mkdir -p devices/keys") < next(i for i, t in enumerate(ssh) if t.startswith("ssh-keygen"))
    for name in ("usb-phone", "wifi-phone", "ssh-desktop"):
        (farm,) = [s.text for s in found[name] if s.kind == "file"]
        assert farm.startswith("version: 1\n") and "\ndevices:\n" in farm, name


# ------------------------------------------------------------------------------------------ followed


@pytest.fixture(scope="module")
def phone_lab(stand_ins: StandIns, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list]:
    lab = tmp_path_factory.mktemp("phone-lab")
    return lab, follow("usb-phone", stand_ins, lab)


@pytest.fixture(scope="module")
def desktop_lab(stand_ins: StandIns, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list]:
    lab = tmp_path_factory.mktemp("desktop-lab")
    return lab, follow("ssh-desktop", stand_ins, lab)


@needs_farm_tools
def test_a_phone_over_usb(phone_lab: tuple[Path, list]) -> None:
    lab, done = phone_lab
    assert (lab / "devices" / "lab.yaml").is_file() and done[-1].returncode == 0


@needs_farm_tools
def test_a_phone_over_wifi(stand_ins: StandIns, tmp_path: Path) -> None:
    follow("wifi-phone", stand_ins, tmp_path)


@needs_farm_tools
def test_a_desktop_over_ssh(desktop_lab: tuple[Path, list]) -> None:
    lab, done = desktop_lab
    assert (lab / "devices" / "keys" / "farm_ed25519").is_file()
    assert "[" in (lab / "devices" / "lab_known_hosts").read_text()  # pinned as [host]:port
    gates = done[-1].stdout
    assert "bmoe-ci run" in gates and "G8b" in gates and "XDEV" not in gates, gates[-3000:]  # what it selected


@needs_farm_tools
def test_one_gate_on_one_phone(stand_ins: StandIns, phone_lab: tuple[Path, list]) -> None:
    lab, _ = phone_lab
    run, report = follow("one-gate", stand_ins, lab)
    assert "G8b" in run.stdout and "G8b" in report.stdout, run.stdout[-3000:]
    summary = json.loads((lab / "results" / "first-g8b" / "summary.json").read_text())
    assert summary["gates"] == ["G8b"] and summary["totals"]["skipped"] == 0  # nothing nobody selected
    assert list(summary["devices"]) == ["pixel8"]


@needs_farm_tools
def test_the_nightly_on_a_self_hosted_runner(stand_ins: StandIns, desktop_lab: tuple[Path, list]) -> None:
    lab, _ = desktop_lab  # the runner has the key and the pinned host key of the SSH walkthrough
    follow("self-hosted-nightly", stand_ins, lab)
    history = lab / "results" / "nightly" / "lab-desktops"
    fault, clean = (json.loads(p.read_text()) for p in sorted(history.glob("*/nightly.json")))  # by run id: time
    assert fault["faults"] == ["THREAD_ORDER"] and fault["new_failures"]
    assert {(f["device"], f["name"]) for f in clean["fixed"]} == {
        (f["device"], f["name"]) for f in fault["new_failures"]
    }
    assert (history / "index.html").is_file()
