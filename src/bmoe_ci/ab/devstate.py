"""The state of a device that changes decode speed, read from /sys and /proc over the device transport
(and, on Android, where an app-less shell cannot read the battery's /sys files, from ``dumpsys
battery``), and the drift rule between two readings.

One shell round trip prints ``PATH<TAB>VALUE`` for every readable file of a fixed list of globs. What a
device does not expose (no cpufreq in a container, no battery on a desktop) is recorded as missing and
never checked; nothing is estimated.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

# One round trip; POSIX sh. Each readable file: "path<TAB>first line". Unreadable ones are skipped.
STATE_SCRIPT = r"""
for f in /sys/devices/system/cpu/cpu[0-9]*/cpufreq/scaling_cur_freq \
         /sys/devices/system/cpu/cpu[0-9]*/cpufreq/scaling_max_freq \
         /sys/devices/system/cpu/cpu[0-9]*/cpufreq/scaling_governor \
         /sys/class/thermal/thermal_zone*/temp /sys/class/thermal/thermal_zone*/type \
         /sys/class/power_supply/*/capacity /sys/class/power_supply/*/status \
         /sys/class/power_supply/*/type /proc/loadavg; do
  [ -r "$f" ] || continue
  v=$(head -n 1 "$f" 2>/dev/null) || continue
  printf '%s\t%s\n' "$f" "$v"
done
printf 'ncpu\t%s\n' "$(getconf _NPROCESSORS_ONLN 2>/dev/null || nproc 2>/dev/null)"
if command -v dumpsys >/dev/null 2>&1; then
  dumpsys battery 2>/dev/null | while IFS=: read -r k v; do
    k=$(echo $k); case "$k" in level|temperature|status) printf 'battery.%s\t%s\n' "$k" "$(echo $v)";; esac
  done
fi
"""

FIELDS = ("cpu_freq_khz", "cpu_max_freq_khz", "governor", "thermal_c", "load1", "battery_pct", "charging")

_CPU = re.compile(r"/sys/devices/system/cpu/(cpu\d+)/cpufreq/(scaling_\w+)$")
_ZONE = re.compile(r"/sys/class/thermal/(thermal_zone\d+)/(temp|type)$")
_SUPPLY = re.compile(r"/sys/class/power_supply/([^/]+)/(capacity|status|type)$")
#: Android's BatteryManager status codes, as ``dumpsys battery`` prints them
_ANDROID_STATUS = {"1": "Unknown", "2": "Charging", "3": "Discharging", "4": "Not charging", "5": "Full"}


@dataclass(frozen=True)
class DeviceState:
    """One reading. Each mapping is keyed by cpu / thermal zone ("zone (type)"); ``missing`` names the
    fields the device did not expose."""

    at: float  # controller's wall clock, seconds since the epoch
    cpu_freq_khz: dict[str, int] = field(default_factory=dict)
    cpu_max_freq_khz: dict[str, int] = field(default_factory=dict)
    governor: dict[str, str] = field(default_factory=dict)
    thermal_c: dict[str, float] = field(default_factory=dict)
    load1: float | None = None
    ncpu: int | None = None
    battery_pct: float | None = None
    charging: str | None = None  # the power supply's status: Charging, Discharging, Full, Not charging
    missing: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(self).items()}


def parse_state(text: str, at: float) -> DeviceState:
    """A :class:`DeviceState` from :data:`STATE_SCRIPT`'s output (unparseable values count as missing)."""
    freq: dict[str, int] = {}
    maxf: dict[str, int] = {}
    gov: dict[str, str] = {}
    temps: dict[str, float] = {}
    types: dict[str, str] = {}
    load1 = ncpu = battery = None
    charging = None
    for line in text.splitlines():
        path, sep, value = line.partition("\t")
        value = value.strip()
        if not sep or not value:
            continue
        try:
            if m := _CPU.match(path):
                if m.group(2) == "scaling_cur_freq":
                    freq[m.group(1)] = int(value)
                elif m.group(2) == "scaling_max_freq":
                    maxf[m.group(1)] = int(value)
                else:
                    gov[m.group(1)] = value
            elif m := _ZONE.match(path):
                if m.group(2) == "temp":
                    temps[m.group(1)] = int(value) / 1000.0  # millidegrees Celsius
                else:
                    types[m.group(1)] = value
            elif m := _SUPPLY.match(path):
                if m.group(2) == "capacity" and battery is None:
                    battery = float(value)
                elif m.group(2) == "status" and charging is None:
                    charging = value
            elif path == "battery.level" and battery is None:
                battery = float(value)
            elif path == "battery.temperature":
                temps["battery"] = int(value) / 10.0  # tenths of a degree Celsius
            elif path == "battery.status" and charging is None:
                charging = _ANDROID_STATUS.get(value, value)
            elif path == "/proc/loadavg":
                load1 = float(value.split()[0])
            elif path == "ncpu":
                ncpu = int(value)
        except ValueError:
            continue
    thermal = {f"{z} ({types[z]})" if z in types else z: t for z, t in sorted(temps.items())}
    state = DeviceState(
        at=at,
        cpu_freq_khz=dict(sorted(freq.items())),
        cpu_max_freq_khz=dict(sorted(maxf.items())),
        governor=dict(sorted(gov.items())),
        thermal_c=thermal,
        load1=load1,
        ncpu=ncpu,
        battery_pct=battery,
        charging=charging,
    )
    missing = tuple(f for f in FIELDS if getattr(state, f) in (None, {}))
    return DeviceState(**{**asdict(state), "missing": missing})


def read_state(run: Callable[..., Any]) -> DeviceState:
    """Read the state with ``run(argv, timeout)`` (a :meth:`DeviceSession.run`). An unreadable state is
    a state with every field missing (the drift rule then has nothing to check, and says so)."""
    r = run(["sh", "-c", STATE_SCRIPT], 30.0)
    text = r.stdout.decode("utf-8", "replace") if getattr(r, "ok", False) else ""
    return parse_state(text, time.time())


@dataclass(frozen=True)
class DriftBounds:
    """How far the device state may move within one cell (before → after) and how loaded it may be."""

    max_thermal_rise_c: float = 5.0
    max_load_per_cpu: float = 1.5
    max_battery_drop_pct: float = 5.0


def drift(before: DeviceState, after: DeviceState, bounds: DriftBounds) -> list[str]:
    """Why the device state between ``before`` and ``after`` is outside ``bounds`` (empty: it is not).
    Each reason carries the numbers. Only fields present in both readings are compared."""
    out: list[str] = []
    for zone, t0 in before.thermal_c.items():
        t1 = after.thermal_c.get(zone)
        if t1 is not None and t1 - t0 > bounds.max_thermal_rise_c:
            out.append(
                f"thermal {zone} rose {t1 - t0:.1f} °C ({t0:.1f} → {t1:.1f}), bound {bounds.max_thermal_rise_c} °C"
            )
    for cpu, g0 in before.governor.items():
        g1 = after.governor.get(cpu)
        if g1 is not None and g1 != g0:
            out.append(f"governor of {cpu} changed: {g0} → {g1}")
    for cpu, f0 in before.cpu_max_freq_khz.items():
        f1 = after.cpu_max_freq_khz.get(cpu)
        if f1 is not None and f1 != f0:
            out.append(f"max frequency of {cpu} changed: {f0} → {f1} kHz (throttled or capped)")
    for s in (before, after):
        if s.load1 is not None and s.ncpu:
            per_cpu = s.load1 / s.ncpu
            if per_cpu > bounds.max_load_per_cpu:
                which = "before" if s is before else "after"
                out.append(
                    f"load {which}: {s.load1:.2f} on {s.ncpu} CPUs = {per_cpu:.2f} per CPU, "
                    f"bound {bounds.max_load_per_cpu}"
                )
    if before.charging is not None and after.charging is not None and before.charging != after.charging:
        out.append(f"charging state changed: {before.charging} → {after.charging}")
    if before.battery_pct is not None and after.battery_pct is not None:
        drop = before.battery_pct - after.battery_pct
        if drop > bounds.max_battery_drop_pct:
            out.append(
                f"battery fell {drop:.0f} points ({before.battery_pct:.0f} → {after.battery_pct:.0f} %), "
                f"bound {bounds.max_battery_drop_pct}"
            )
    return out
