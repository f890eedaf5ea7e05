"""Evidence for a release verdict, each piece traceable to the run that produced it (run id, device,
engine build id):

* gate results: rows of the nightly history (fresh and for the exact engine build) or a gate run now;
* speed: `bmoe-ci ab` of the base settings (A) against the proposal (B) on one device of a class;
* replay: a traced run of the proposal replayed by :mod:`bmoe_ci.replay` (REPLAY's model);
* quality: the engine's instruments on the quality model, base against proposal.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from bmoe_ci.farm import Device, InfraError, PushItem, open_session

HOUR = 3600.0


@dataclass
class GateEvidence:
    """Outcomes of the gates on one device: gate -> pass / fail / error / skip, and where they come from."""

    device: str
    run: str
    build_id: str
    source: str  # "history" or "gate run"
    gates: dict[str, str] = field(default_factory=dict)
    infra_error: str | None = None
    started: str | None = None


@dataclass(frozen=True)
class Stale:
    device: str
    run: str
    reason: str


def _age_hours(started: str | None, now: float) -> float | None:
    if not started:
        return None
    for fmt in ("%Y-%m-%dT%H:%M:%S%z", "%Y-%m-%dT%H:%M:%S.%f%z", "%Y-%m-%dT%H:%M:%SZ"):
        try:
            t = datetime.strptime(started, fmt)
            if t.tzinfo is None:
                t = t.replace(tzinfo=UTC)
            return (now - t.timestamp()) / HOUR
        except ValueError:
            continue
    return None


def gates_from_history(
    history_dir: Path, devices: Sequence[str], builds: dict[str, str], freshness_hours: float, now: float | None = None
) -> tuple[dict[str, GateEvidence], list[Stale]]:
    """For each device, the newest history run that reached it, if it is for the device's exact engine
    build (``builds``: device -> build id) and at most ``freshness_hours`` old. Anything else found is
    returned as :class:`Stale`, with the reason."""
    from bmoe_ci.nightly.history import HISTORY_FILE, History

    now = time.time() if now is None else now
    found: dict[str, GateEvidence] = {}
    stale: list[Stale] = []
    if not (history_dir / HISTORY_FILE).is_file():
        return found, stale
    with History(history_dir) as hist:
        run_ids = list(reversed(hist.run_ids()))  # newest first
        for name in devices:
            for rid in run_ids:
                row = next((d for d in hist.devices(rid) if d.device == name and d.reached), None)
                if row is None:
                    continue
                started = hist.conn.execute("SELECT started FROM runs WHERE id = ?", (rid,)).fetchone()[0]
                age = _age_hours(started, now)
                if row.engine_build_id != builds[name]:
                    stale.append(
                        Stale(
                            name,
                            rid,
                            f"evidence of run {rid} on {name} is for engine build "
                            f"{row.engine_build_id or '?'}, this build is {builds[name]}: "
                            "refused as stale",
                        )
                    )
                elif age is None or age > freshness_hours:
                    shown = "of unknown age" if age is None else f"{age:.1f} h old"
                    stale.append(
                        Stale(
                            name,
                            rid,
                            f"evidence of run {rid} on {name} is {shown}, "
                            f"freshness is {freshness_hours:g} h: refused as stale",
                        )
                    )
                else:
                    ev = GateEvidence(
                        device=name, run=rid, build_id=row.engine_build_id, source="history", started=started
                    )
                    for r in hist.results([rid]):
                        if r.device == name:
                            ev.gates[r.gate] = _worst(ev.gates.get(r.gate), r.outcome)
                    found[name] = ev
                break  # only the newest run that reached the device counts
    return found, stale


_RANK = {"fail": 3, "error": 2, "skip": 1, "pass": 0}


def _worst(a: str | None, b: str) -> str:
    return b if a is None or _RANK[b] > _RANK[a] else a


def run_gate_suite(
    repo: Path, farm: Path, devices: Sequence[str], fixtures: Sequence[str], results: Path, say: Callable[[str], None]
) -> tuple[dict[str, GateEvidence], str | None]:
    """`pytest gates` on ``devices`` now; returns per-device evidence, or an error when the run wrote no
    summary (it could not start)."""
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "gates",
        "-p",
        "no:cacheprovider",
        "-q",
        "--farm",
        str(farm),
        "--device",
        ",".join(devices),
        "--results",
        str(results),
    ]
    for f in fixtures:
        cmd += ["--fixture", f]
    say(f"gate run: {' '.join(cmd[2:])}")
    proc = subprocess.run(cmd, cwd=repo, capture_output=True, text=True, check=False)
    summary_file = results / "summary.json"
    if not summary_file.is_file():
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-3:]
        return {}, f"the gate run wrote no summary (exit {proc.returncode}): {' | '.join(tail)}"
    summary = json.loads(summary_file.read_text())
    out = {}
    for name, d in summary["devices"].items():
        out[name] = GateEvidence(
            device=name,
            run=summary["run"],
            build_id=d.get("engine_build_id") or "",
            source="gate run",
            gates=dict(d["gates"]),
            infra_error=d.get("infra_error"),
            started=summary.get("started"),
        )
    return out, None


def probe(device: Device) -> str | None:
    """None when the device answers a command, else why not."""
    from bmoe_ci.farm import DeviceSession

    s = DeviceSession(device)
    try:
        s.connect()
        r = s.run(["true"], 30.0)
        return None if r.ok else f"{r.infra or f'exit {r.exit_code}'}"
    except InfraError as exc:
        return str(exc)
    finally:
        s.close()


@dataclass
class ReplayEvidence:
    device: str
    run: str
    build_id: str
    mismatches: list[str]
    rows: int
    error: str | None = None


def replay_run(
    device: Device,
    engine: Path,
    build_id: str,
    model: Path,
    flags: Sequence[str],
    prompt: str,
    n_predict: int,
    run_id: str,
    say: Callable[[str], None],
) -> ReplayEvidence:
    """A traced run of ``flags`` on the device, replayed by the model of docs/policies.md."""
    from bmoe_ci.replay import RunConfig, TraceError, mismatches, parse_trace, replay

    try:
        s = open_session(
            device,
            run_id=run_id,
            engine=engine,
            build_id=build_id,
            files=[PushItem(model, name=f"ab/{model.name}")],
            progress=lambda m: say(f"{device.name}: {m}"),
        )
    except InfraError as exc:
        return ReplayEvidence(device.name, run_id, build_id, [], 0, error=str(exc))
    with s:
        trace_path = s.file(f"release-{run_id}.trace.csv")
        argv = [
            "run",
            "-m",
            s.file(f"ab/{model.name}"),
            "-p",
            prompt,
            "-n",
            str(n_predict),
            "-t",
            "1",
            "--json",
            *flags,
            "--route-trace",
            trace_path,
        ]
        r = s.run_engine(argv, device.entry_timeout)
        if not r.ok:
            why = r.infra or r.stderr.decode("utf-8", "replace").strip()[-300:]
            return ReplayEvidence(device.name, run_id, build_id, [], 0, error=f"traced run failed: {why}")
        text = s.run(["cat", trace_path], 60.0)
        s.run(["rm", "-f", trace_path], 30.0)
        if not text.ok:
            return ReplayEvidence(device.name, run_id, build_id, [], 0, error="cannot read the route trace back")
        try:
            trace = parse_trace(text.stdout.decode("utf-8", "replace"), trace_path)
        except TraceError as exc:
            return ReplayEvidence(device.name, run_id, build_id, [], 0, error=str(exc))
        counters = json.loads(r.stdout)["counters"]
        pred = replay(trace, RunConfig.from_argv(argv))
        found = [*pred.problems, *(str(m) for m in mismatches(trace, pred, counters))]
        return ReplayEvidence(device.name, run_id, build_id, found, len(trace.rows))
