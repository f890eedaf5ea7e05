"""Preflight: is this device fit to run the gates?

Checks, in order (the first failure raises :class:`~bmoe_ci.farm.errors.InfraError`, kind ``preflight``
or the transport's own kind when the device cannot be reached):

1. reachable: the transport connects and a trivial command runs;
2. arch: ``uname -m`` equals the declared arch (``arm64`` = ``aarch64``); on a device whose exec prefix
   runs a qemu user-mode emulator for the declared arch, the prefix must be present on the device and the
   arch is confirmed later from the target triple the engine reports;
3. free space in the work directory (``df -Pk``) of at least ``min_free_mb``;
4. clock: the device's ``date +%s`` within ``max_clock_skew`` seconds of the controller's clock (read in
   the same round trip; its duration is allowed for). The device's clock stamps its use lists and
   files, read next to the controller's times; far off, it marks a device that lost its time;
5. engine: ``<exec prefix> <engine> --version`` prints ``bmoe <version> build <id> target <triple>``,
   with the expected build id and a triple whose arch is the declared arch;
6. kernels (a device whose ``kernels`` pins a path): ``<engine> info --types`` lists that path among the
   ``kernels_available`` of the device's CPU and build (the engine would refuse every run otherwise).

:func:`check_lite` runs 1 and 2 only (``bmoe-ci farm check``: no engine needed).
"""

from __future__ import annotations

import json
import re
import shlex
import time
from dataclasses import dataclass, field

from .errors import InfraError
from .model import normalize_arch, triple_arch
from .transports import Transport, name_script

#: Android ABI names (``ro.product.cpu.abi``) -> architecture
ANDROID_ABIS = {"arm64-v8a": "aarch64", "armeabi-v7a": "armv7", "armeabi": "arm", "x86_64": "x86_64", "x86": "i686"}

VERSION_RE = re.compile(r"^bmoe (?P<version>\S+) build (?P<build>\S+) target (?P<target>\S+)\s*$")


@dataclass(frozen=True)
class EngineVersion:
    version: str
    build: str
    target: str

    @property
    def arch(self) -> str:
        return triple_arch(self.target)


def parse_version(text: str) -> EngineVersion | None:
    """Parse ``bmoe --version`` output (its first line)."""
    first = text.strip().splitlines()[0] if text.strip() else ""
    m = VERSION_RE.match(first)
    return EngineVersion(m["version"], m["build"], m["target"]) if m else None


@dataclass
class PreflightReport:
    device: str
    uname: str = ""
    arch_confirmed_by: str = ""  #: "getprop" (Android), "uname", "engine" (emulated devices), or "" when deferred
    free_mb: int | None = None
    clock_skew_s: float | None = None  #: device clock minus controller clock
    engine: EngineVersion | None = None
    kernels: str = ""  #: the path the device pins, checked against its CPU ("" when it pins none)
    notes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        parts = [f"uname {self.uname}"]
        if self.arch_confirmed_by:
            parts.append(f"arch by {self.arch_confirmed_by}")
        if self.free_mb is not None:
            parts.append(f"{self.free_mb} MiB free")
        if self.clock_skew_s is not None:
            parts.append(f"clock {self.clock_skew_s:+.0f}s")
        if self.engine:
            parts.append(f"engine {self.engine.version} build {self.engine.build} target {self.engine.target}")
        if self.kernels:
            parts.append(f"kernels {self.kernels} (pinned)")
        return ", ".join(parts + self.notes)


def _fail(t: Transport, reason: str) -> InfraError:
    return InfraError(t.device.name, "preflight", reason)


_PROBE = name_script(
    r"""
printf 'uname %s\n' "$(uname -m)"
command -v getprop >/dev/null 2>&1 && printf 'abi %s\n' "$(getprop ro.product.cpu.abi)"
if [ -n "$2" ]; then
  if command -v "$2" >/dev/null 2>&1; then echo "prefix ok"; else echo "prefix missing"; fi
fi
df -Pk "$1" 2>/dev/null | tail -n 1 | sed 's/^/df /'
printf 'clock %s\n' "$(date +%s)"
""",
    "preflight probe",
)


def _probe(t: Transport) -> dict[str, str]:
    """One round trip: ``uname -m``, whether the exec prefix exists, the work directory's ``df`` line,
    the device's clock; ``sent``/``back`` are the controller's clock around the round trip."""
    t.connect()
    tool = t.device.exec_prefix[0] if t.device.exec_prefix else ""
    sent = time.time()
    r = t.sh(_PROBE, t.workdir, tool, timeout=float(t.device.command_timeout)).raise_for_infra()
    back = time.time()
    if not r.ok:
        raise _fail(t, f"probe (uname, df) failed: {r.describe()}: {r.stderr.decode(errors='replace').strip()[-200:]}")
    out: dict[str, str] = {}
    for line in r.stdout.decode(errors="replace").splitlines():
        key, _, value = line.partition(" ")
        out[key] = value.strip()
    out["sent"], out["back"] = f"{sent:.3f}", f"{back:.3f}"
    return out


def check_lite(
    t: Transport, report: PreflightReport | None = None, probe: dict[str, str] | None = None
) -> PreflightReport:
    """Reachability and arch (without the engine)."""
    d = t.device
    report = report or PreflightReport(d.name)
    probe = probe if probe is not None else _probe(t)
    if not probe.get("uname"):
        raise _fail(t, "'uname -m' printed nothing")
    report.uname = normalize_arch(probe["uname"])
    if d.exec_prefix and probe.get("prefix") != "ok":
        tool = d.exec_prefix[0]
        raise _fail(
            t,
            f"exec prefix {tool!r} not found on the device"
            + (" (Debian: apt-get install qemu-user-static)" if "qemu-" in tool else ""),
        )
    abi = probe.get("abi", "")
    if abi:
        arch = ANDROID_ABIS.get(abi, abi)
        if arch != d.arch:
            raise _fail(
                t,
                f"wrong ABI: declared arch {d.arch} but the device's user space is {abi} (getprop ro.product.cpu.abi)",
            )
        report.arch_confirmed_by = "getprop"
        if d.exec_prefix and d.emulated_arch == d.arch:
            report.notes.append(f"{d.arch} emulated by {d.exec_prefix[0]}")
    elif report.uname == d.arch:
        report.arch_confirmed_by = "uname"
    elif d.emulated_arch == d.arch:
        report.notes.append(f"{d.arch} emulated by {d.exec_prefix[0]} on {report.uname}")
    else:
        raise _fail(
            t,
            f"declared arch {d.arch} but 'uname -m' says {report.uname}"
            + ("" if not d.emulated_arch else f" and the exec prefix emulates {d.emulated_arch}"),
        )
    return report


def check_free_space(t: Transport, report: PreflightReport, probe: dict[str, str] | None = None) -> None:
    d = t.device
    probe = probe if probe is not None else _probe(t)
    fields = probe.get("df", "").split()
    try:
        avail_kb = int(fields[3] if len(fields) == 6 else fields[-3])
    except (IndexError, ValueError):
        raise _fail(t, f"cannot read free space of {t.workdir} from 'df -Pk' ({probe.get('df')!r})") from None
    report.free_mb = avail_kb // 1024
    if report.free_mb < d.min_free_mb:
        raise _fail(t, f"only {report.free_mb} MiB free in {t.workdir}, need {d.min_free_mb} MiB (min_free_mb)")


def check_clock(t: Transport, report: PreflightReport, probe: dict[str, str]) -> None:
    """The device's clock against the controller's: the device read it somewhere in the round trip, so
    the skew is measured from the round trip's middle and half its duration is allowed on top."""
    d = t.device
    try:
        device_s = int(probe.get("clock", ""))
        sent, back = float(probe["sent"]), float(probe["back"])
    except (KeyError, ValueError):
        raise _fail(t, f"cannot read the device's clock from 'date +%s' ({probe.get('clock')!r})") from None
    skew = device_s - (sent + back) / 2
    report.clock_skew_s = skew
    # date +%s truncates to whole seconds: one more second of slack
    if abs(skew) > d.max_clock_skew + (back - sent) / 2 + 1:
        side = "ahead of" if skew > 0 else "behind"
        raise _fail(
            t,
            f"clock {abs(skew):.0f}s {side} the controller's (device {device_s}, controller {back:.0f}, "
            f"max_clock_skew {d.max_clock_skew:g}s): set the device's time",
        )


def check_engine(
    t: Transport, engine_path: str, build_id: str | None, report: PreflightReport, timeout: float | None = None
) -> EngineVersion:
    d = t.device
    timeout = float(d.command_timeout) if timeout is None else timeout
    r = t.run([engine_path, "--version"], timeout * d.timeout_scale, engine=True).raise_for_infra()
    shown = shlex.join([*d.exec_prefix, engine_path, "--version"])
    if not r.ok:
        raise _fail(t, f"{shown}: {r.describe()}: {r.stderr.decode(errors='replace').strip()[-300:]}")
    v = parse_version(r.stdout.decode(errors="replace"))
    if v is None:
        raise _fail(t, f"{shown} printed {r.stdout[:120]!r}, not 'bmoe <version> build <id> target <triple>'")
    if build_id is not None and v.build != build_id:
        raise _fail(t, f"engine on the device reports build {v.build}, expected {build_id}")
    if v.arch != d.arch:
        raise _fail(t, f"declared arch {d.arch} but the engine reports target {v.target}")
    report.engine = v
    if not report.arch_confirmed_by:
        report.arch_confirmed_by = "engine"
    if d.kernels != "auto":
        check_kernels(t, engine_path, report, timeout)
    return v


def check_kernels(t: Transport, engine_path: str, report: PreflightReport, timeout: float) -> None:
    """Check 6: the device's pinned kernel path is one its CPU and engine build have."""
    d = t.device
    r = t.run([engine_path, "info", "--types"], timeout * d.timeout_scale, engine=True).raise_for_infra()
    try:
        available = json.loads(r.stdout.decode(errors="replace"))["kernels_available"]
    except (ValueError, KeyError, TypeError):
        raise _fail(t, f"`bmoe info --types` gave no kernels_available: {r.describe()}") from None
    if d.kernels not in available:
        raise _fail(
            t,
            f"kernels: {d.kernels} ({d.source or 'farm file'}): this device's CPU or engine build does not "
            f"have that kernel path (it has {', '.join(available)})",
        )
    report.kernels = d.kernels


def check_platform(t: Transport) -> PreflightReport:
    """Checks 1-4 (reachable, arch or ABI, exec prefix, free space, clock) in one round trip: what a
    run checks before it pushes anything. The engine check (5) follows the push."""
    probe = _probe(t)
    report = check_lite(t, probe=probe)
    check_free_space(t, report, probe)
    check_clock(t, report, probe)
    return report


def preflight(t: Transport, *, engine_path: str | None = None, build_id: str | None = None) -> PreflightReport:
    """Every check (see the module docstring). ``engine_path`` None skips the engine check."""
    probe = _probe(t)
    report = check_lite(t, probe=probe)
    check_free_space(t, report, probe)
    check_clock(t, report, probe)
    if engine_path is not None:
        check_engine(t, engine_path, build_id, report)
    elif not report.arch_confirmed_by:
        report.notes.append("arch not confirmed (no engine to ask)")
    return report
