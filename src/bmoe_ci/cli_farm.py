"""``bmoe-ci farm up|down|status|check``: register with :func:`add_farm_commands`.

Each handler is stored as ``func`` on the parsed namespace and returns the exit status:
0 success, 1 a device failed its check (``check``), 2 bad input (farm file, ``--device``, farm not up,
missing tool).
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import socket
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .farm import (
    FarmConfigError,
    FarmError,
    InfraError,
    check_lite,
    default_run_id,
    embedded,
    force_unlock,
    load_farm,
    open_session,
    open_transport,
    read_lock,
    select_devices,
)
from .farm.health import HealthBook
from .standins import localfarm


def add_farm_commands(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``farm`` with its four subcommands to a top-level ``subparsers`` object."""
    farm = subparsers.add_parser(
        "farm",
        help="start, stop and inspect device farms",
        description="Manage the embedded local farm (up/down) and inspect any farm (status/check).",
    )
    sub = farm.add_subparsers(dest="farm_command", metavar="{up,down,status,check,gc,unlock,release}")
    sub.required = True

    def common(p: argparse.ArgumentParser, selection: bool) -> None:
        p.add_argument(
            "--farm",
            metavar="FILE",
            type=Path,
            default=None,
            help="farm file (default: the embedded local farm, started by `bmoe-ci farm up`)",
        )
        if selection:
            p.add_argument(
                "--device",
                metavar="SEL",
                action="append",
                default=None,
                help="devices to include: NAME, a,b, pool:NAME, arch:ARCH, label:X, kind:K, all "
                "(repeatable; default all)",
            )
            p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")

    p = sub.add_parser(
        "up",
        help="start the embedded local farm (sshd instances on 127.0.0.x)",
        description="Start the embedded local farm: keys, sshd on 127.0.0.2 and 127.0.0.3, "
        "pinned known_hosts, the resolved farm file. State dir: $BMOE_CI_STATE "
        "(default <repo>/.cache/bmoe-ci/farm, or ~/.cache/bmoe-ci/farm for a wheel install). Idempotent.",
    )
    common(p, selection=False)
    p.set_defaults(func=cmd_up)
    p = sub.add_parser(
        "down",
        help="stop the processes `farm up` started",
        description="Stop the sshd instances recorded by `farm up` (only if still ours).",
    )
    common(p, selection=False)
    p.set_defaults(func=cmd_down)
    p = sub.add_parser(
        "status",
        help="list devices and whether they are reachable",
        description="List the farm's devices, whether each answers, and who holds its lock.",
    )
    common(p, selection=True)
    p.set_defaults(func=cmd_status)
    p = sub.add_parser(
        "check",
        help="preflight-lite: reachable and the declared arch",
        description="For each device: connect, `uname -m` against the declared arch (an "
        "emulated device: its exec prefix must exist). Exit 1 if any fails.",
    )
    common(p, selection=True)
    p.set_defaults(func=cmd_check)
    p = sub.add_parser(
        "gc",
        help="remove stored engines and fixtures the last runs did not use",
        description="For each device (taking its lock): remove files of WORKDIR/store that none of the "
        "device's last N runs used (N: --keep, else the device's keep_runs) and leftover upload temporaries.",
    )
    common(p, selection=True)
    p.add_argument("--keep", metavar="N", type=int, default=None, help="runs whose files are kept (>= 1)")
    p.set_defaults(func=cmd_gc)
    p = sub.add_parser(
        "unlock",
        help="break a device's lease (needs --force)",
        description="Break DEVICE's lease whoever holds it, say what was broken, and append an audit line "
        "to WORKDIR/.bmoe-ci-audit.log. A stale lease is broken by the next run anyway; use this for a "
        "live one only when you know its run is gone.",
    )
    common(p, selection=False)
    p.add_argument("device", metavar="DEVICE", help="device name")
    p.add_argument("--force", action="store_true", help="required: you know the holder is gone")
    p.set_defaults(func=cmd_unlock)
    p = sub.add_parser(
        "release",
        help="lift a device's quarantine",
        description="Lift DEVICE's quarantine (and reset its count of failed health checks), so that the "
        "next run selects it again.",
    )
    common(p, selection=False)
    p.add_argument("device", metavar="DEVICE", help="device name")
    p.set_defaults(func=cmd_release)
    return farm


def _err(cmd: str, exc: BaseException) -> int:
    text = str(exc)
    if isinstance(exc, FarmConfigError):
        print(f"bmoe-ci farm {cmd}: invalid farm file:", file=sys.stderr)
        print(text, file=sys.stderr)
    else:
        print(f"bmoe-ci farm {cmd}: {text}", file=sys.stderr)
    return 2


def _progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _local_only(cmd: str, args: argparse.Namespace) -> int | None:
    if args.farm is None:
        return None
    try:
        same = args.farm.resolve() == embedded.farm_file(places=args.places).resolve()
    except FarmError:
        same = False
    if same:
        return None
    print(
        f"bmoe-ci farm {cmd}: `farm {cmd}` manages the embedded local farm only; {args.farm} is a farm "
        f"file (use `farm status --farm {args.farm}`)",
        file=sys.stderr,
    )
    return 2


def cmd_up(args: argparse.Namespace) -> int:
    bad = _local_only("up", args)
    if bad is not None:
        return bad
    try:
        state = embedded.state_dir(args.places)
        _progress(f"local farm state: {state}")
        path = localfarm.up(state, log=_progress, places=args.places)
        farm = load_farm(path)
    except FarmError as exc:
        return _err("up", exc)
    for d in farm.devices.values():
        print(d.describe())
    print(f"farm file: {path}")
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    bad = _local_only("down", args)
    if bad is not None:
        return bad
    try:
        stopped = localfarm.down(log=_progress, places=args.places)
    except FarmError as exc:
        return _err("down", exc)
    print(down_line(stopped))
    return 0


def down_line(stopped: list[str]) -> str:
    """What `farm down` stopped, by kind: ``stopped 2 sshd (ssh-x86, ssh-arm64), the adb server and the
    stand-in adbd (adb-arm64)`` (localfarm.down names each sshd's device, ``adb-server``, the adbd's)."""
    sshd = [n for n in stopped if n not in ("adb-server", localfarm.ADB_DEVICE)]
    parts = [f"{len(sshd)} sshd" + (f" ({', '.join(sshd)})" if sshd else "")]
    if "adb-server" in stopped:
        parts.append("the adb server")
    if localfarm.ADB_DEVICE in stopped:
        parts.append(f"the stand-in adbd ({localfarm.ADB_DEVICE})")
    if not stopped:
        return "stopped nothing: no process of the local farm was running"
    return "stopped " + (", ".join(parts[:-1]) + " and " + parts[-1] if len(parts) > 1 else parts[0])


def _load(cmd: str, args: argparse.Namespace):
    farm = load_farm(args.farm, args.places)
    devices = select_devices(farm, args.device) if args.device else list(farm.devices.values())
    return farm, devices


def _probe(device, with_lock: bool) -> dict:
    t = open_transport(device)
    row = {
        "device": device.name,
        "kind": device.kind,
        "os": device.os,
        "arch": device.arch,
        "transport": device.transport,
        "address": device.where,
        "exec_prefix": list(device.exec_prefix),
        "labels": list(device.labels),
    }
    try:
        t.connect()
        row["reachable"] = True
        if with_lock:
            owner = read_lock(t)
            row["lock"] = f"{owner.describe()} since {owner.since_iso}; {owner.lease_state()}" if owner else None
    except InfraError as exc:
        row["reachable"] = False
        row["error"] = f"{exc.kind}: {exc.reason}"
    finally:
        t.close()
    return row


def cmd_status(args: argparse.Namespace) -> int:
    try:
        farm, devices = _load("status", args)
    except FarmError as exc:
        return _err("status", exc)
    with ThreadPoolExecutor(max_workers=min(8, len(devices))) as pool:
        rows = list(pool.map(lambda d: _probe(d, True), devices))
    health = HealthBook(farm.path, places=args.places)
    for r in rows:
        h = health.get(farm.devices[r["device"]])  # about its entry as the farm file has it now
        r["quarantine"] = h.quarantine.describe() if h.quarantine else None
        r["failed_checks"] = h.failures
    if args.json:
        print(
            json.dumps(
                {"farm": str(farm.path), "devices": rows, "pools": {k: list(v) for k, v in farm.pools.items()}},
                indent=2,
            )
        )
        return 0
    print(f"farm: {farm.path}")
    width = max(len(r["device"]) for r in rows)
    for r in rows:
        state = "up" if r["reachable"] else f"DOWN ({r['error']})"
        lock = f"  locked by {r['lock']}" if r.get("lock") else ""
        lock += f"  QUARANTINED ({r['quarantine']})" if r["quarantine"] else ""
        prefix = f" via {' '.join(r['exec_prefix'])}" if r["exec_prefix"] else ""
        print(f"{r['device']:<{width}}  {r['kind']:<7} {r['arch']:<8} {r['address']:<20} {state}{prefix}{lock}")
    for name, members in farm.pools.items():
        print(f"pool {name}: {', '.join(members)}")
    return 0


def _check(device) -> dict:
    t = open_transport(device)
    try:
        rep = check_lite(t)
        return {"device": device.name, "ok": True, "detail": ", ".join([f"uname {rep.uname}", *rep.notes])}
    except InfraError as exc:
        return {"device": device.name, "ok": False, "detail": f"{exc.kind}: {exc.reason}"}
    finally:
        t.close()


def cmd_check(args: argparse.Namespace) -> int:
    try:
        _farm, devices = _load("check", args)
    except FarmError as exc:
        return _err("check", exc)
    with ThreadPoolExecutor(max_workers=min(8, len(devices))) as pool:
        rows = list(pool.map(_check, devices))
    if args.json:
        print(json.dumps({"devices": rows}, indent=2))
    else:
        width = max(len(r["device"]) for r in rows)
        for r in rows:
            print(f"{r['device']:<{width}}  {'ok  ' if r['ok'] else 'FAIL'}  {r['detail']}")
    failed = [r["device"] for r in rows if not r["ok"]]
    if failed:
        print(
            f"bmoe-ci farm check: {len(failed)} of {len(rows)} device(s) failed: {', '.join(failed)}", file=sys.stderr
        )
        return 1
    return 0


def _gc(device, keep: int | None) -> dict:
    row: dict = {"device": device.name, "ok": False, "removed": 0, "freed_bytes": 0}
    try:
        with open_session(device, run_id=f"gc-{default_run_id()}", check=False) as session:
            rep = session.gc(keep)
            row.update(
                ok=True,
                removed=len(rep.removed),
                freed_bytes=rep.freed,
                detail=f"removed {len(rep.removed)} file(s), {rep.freed} bytes",
            )
    except InfraError as exc:
        row["detail"] = f"{exc.kind}: {exc.reason}"
    return row


def cmd_gc(args: argparse.Namespace) -> int:
    if args.keep is not None and args.keep < 1:
        print("bmoe-ci farm gc: --keep must be at least 1", file=sys.stderr)
        return 2
    try:
        _farm, devices = _load("gc", args)
    except FarmError as exc:
        return _err("gc", exc)
    with ThreadPoolExecutor(max_workers=min(8, len(devices))) as pool:
        rows = list(pool.map(lambda d: _gc(d, args.keep), devices))
    if args.json:
        print(json.dumps({"devices": rows}, indent=2))
    else:
        width = max(len(r["device"]) for r in rows)
        for r in rows:
            print(f"{r['device']:<{width}}  {'ok  ' if r['ok'] else 'FAIL'}  {r['detail']}")
    return 0 if all(r["ok"] for r in rows) else 1


def cmd_unlock(args: argparse.Namespace) -> int:
    try:
        farm = load_farm(args.farm, args.places)
        device = farm.device(args.device)
    except FarmError as exc:
        return _err("unlock", exc)
    if not args.force:
        print(
            f"bmoe-ci farm unlock: breaking {device.name}'s lease can let two runs share it; "
            "add --force if its holder is gone",
            file=sys.stderr,
        )
        return 2
    actor = f"{getpass.getuser()}@{socket.gethostname()} pid {os.getpid()}"
    t = open_transport(device)
    try:
        t.connect()
        broke = force_unlock(t, actor=actor)
    except InfraError as exc:
        print(f"bmoe-ci farm unlock: {exc}", file=sys.stderr)
        return 1
    finally:
        t.close()
    if broke is None:
        print(f"{device.name}: no lease held; nothing broken")
    else:
        print(
            f"{device.name}: broke the lease of {broke.describe()} since {broke.since_iso}; {broke.lease_state()} "
            f"(audit line in {device.workdir}/.bmoe-ci-audit.log)"
        )
    return 0


def cmd_release(args: argparse.Namespace) -> int:
    try:
        farm = load_farm(args.farm, args.places)
        device = farm.device(args.device)
    except FarmError as exc:
        return _err("release", exc)
    before = HealthBook(farm.path, places=args.places).release(device.name)
    if before.quarantine is not None:
        print(f"{device.name}: released (was {before.quarantine.describe()})")
    else:
        print(f"{device.name}: not quarantined ({before.failures} failed health check(s) in a row, now reset)")
    return 0
