"""Measuring the evidence of a release verdict on devices and in the nightly history, each piece
traceable to the run that produced it (run id, device, engine build id, fixture):

* gate results: rows of the nightly history (fresh, for the exact engine build and on the policy's
  fixture) or a gate run now (:func:`bmoe_ci.gaterun.suite.run_gate_suite`);
* replay: a traced run of the proposal replayed by :mod:`bmoe_ci.replay` (REPLAY's model);
* reachability: a device that answers a command.

Speed (`bmoe-ci ab`) and quality (:mod:`~bmoe_ci.release.quality`) have their own modules. Nothing here
decides a requirement: that is :func:`bmoe_ci.release.judge.judge`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path

from bmoe_ci.farm import Device, InfraError, PushItem, open_session
from bmoe_ci.gaterun.engine import run_engine
from bmoe_ci.gaterun.suite import LOG_NAME, SuiteCall, run_gate_suite, suite_command
from bmoe_ci.release.evidence import GateRecord, Refusal, ReplayRecord

HOUR = 3600.0


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
    history_dir: Path,
    devices: Sequence[str],
    builds: dict[str, str],
    fixture: str,
    freshness_hours: float,
    now: float | None = None,
) -> tuple[dict[str, GateRecord], list[Refusal]]:
    """For each device, the newest history run that reached it with results on ``fixture``, if it is
    for the device's exact engine build (``builds``: device -> build id) and at most ``freshness_hours``
    old. Newer runs on other fixtures only are refused (they say nothing about this fixture) and the
    search goes on to older runs; a run of another build or past the window is refused and ends it
    (only the newest run on the fixture counts). Results without a fixture (CFG) count on any run."""
    from bmoe_ci.nightly.history import HISTORY_FILE, History

    now = time.time() if now is None else now
    found: dict[str, GateRecord] = {}
    refused: list[Refusal] = []
    if not (history_dir / HISTORY_FILE).is_file():
        return found, refused
    with History(history_dir) as hist:
        run_ids = list(reversed(hist.run_ids()))  # newest first
        for name in devices:
            for rid in run_ids:
                row = next((d for d in hist.devices(rid) if d.device == name and d.reached), None)
                if row is None:
                    continue
                rows = [r for r in hist.results([rid]) if r.device == name]
                on = sorted({r.fixture for r in rows if r.fixture})
                if on and fixture not in on:
                    refused.append(
                        Refusal(
                            device=name,
                            run=rid,
                            reason=f"gate results of run {rid} on {name} are for fixture {', '.join(on)}, "
                            f"the policy's fixture is {fixture}: refused",
                        )
                    )
                    continue
                started = hist.started(rid)
                age = _age_hours(started, now)
                if row.engine_build_id != builds[name]:
                    refused.append(
                        Refusal(
                            device=name,
                            run=rid,
                            reason=f"evidence of run {rid} on {name} is for engine build "
                            f"{row.engine_build_id or '?'}, this build is {builds[name]}: refused as stale",
                        )
                    )
                elif age is None or age > freshness_hours:
                    shown = "of unknown age" if age is None else f"{age:.1f} h old"
                    refused.append(
                        Refusal(
                            device=name,
                            run=rid,
                            reason=f"evidence of run {rid} on {name} is {shown}, "
                            f"freshness is {freshness_hours:g} h: refused as stale",
                        )
                    )
                else:
                    gates: dict[str, str] = {}
                    for r in rows:
                        if r.fixture in ("", fixture):
                            gates[r.gate] = _worst(gates.get(r.gate), r.outcome)
                    found[name] = GateRecord(
                        device=name,
                        run=rid,
                        build_id=row.engine_build_id,
                        source="history",
                        fixtures=(fixture,),
                        started=started,
                        gates=gates,
                    )
                break  # only the newest run on the fixture that reached the device counts
    return found, refused


_RANK = {"fail": 3, "error": 2, "skip": 1, "pass": 0}


def _worst(a: str | None, b: str) -> str:
    return b if a is None or _RANK[b] > _RANK[a] else a


def run_gates(
    repo: Path, farm: Path, devices: Sequence[str], fixtures: Sequence[str], results: Path, say: Callable[[str], None]
) -> tuple[dict[str, GateRecord], str | None]:
    """The gate suite on ``devices`` now; returns per-device evidence, or an error when the run wrote no
    summary (it could not start). Its console is kept in ``results``/pytest.log."""
    call = SuiteCall(
        tree=repo, farm=farm, devices=(",".join(devices),), results=results, fixtures=fixtures, log=results / LOG_NAME
    )
    say(f"gate run: {' '.join(suite_command(call)[2:])}")
    run = run_gate_suite(call)
    if run.summary is None:
        return {}, run.problem
    summary = run.summary
    out = {}
    for name, d in run.devices().items():
        out[name] = GateRecord(
            device=name,
            run=summary["run"],
            build_id=d.build_id,
            source="gate run",
            fixtures=tuple(sorted(summary.get("fixtures") or fixtures)),
            gates=dict(d.gates),
            infra_error=d.infra_error,
            started=summary.get("started"),
        )
    return out, None


def probe(device: Device) -> str | None:
    """None when the device answers a command, else why not."""
    try:
        with open_session(device, lock=False, check=False) as s:
            r = s.run(["true"], 30.0)
            return None if r.ok else f"{r.infra or f'exit {r.exit_code}'}"
    except InfraError as exc:
        return str(exc)


def replay_run(
    device: Device,
    engine: Path,
    build_id: str,
    model: Path,
    fixture: str,
    flags: Sequence[str],
    prompt: str,
    n_predict: int,
    run_id: str,
    say: Callable[[str], None],
) -> ReplayRecord:
    """A traced run of ``flags`` on the device, replayed by the model of docs/policies.md."""

    from bmoe_ci.replay import RunConfig, TraceError, mismatches, parse_trace, replay

    def record(found: Sequence[str] = (), rows: int = 0, error: str | None = None) -> ReplayRecord:
        return ReplayRecord(
            device=device.name,
            run=run_id,
            build_id=build_id,
            fixture=fixture,
            mismatches=tuple(found),
            rows=rows,
            error=error,
        )

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
        return record(error=str(exc))
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
        r = run_engine(s, argv, device.entry_timeout)
        if not r.exited_0:
            why = r.infra or r.stderr.strip()[-300:]
            return record(error=f"traced run failed: {why}")
        text = s.run(["cat", trace_path], 60.0)
        s.run(["rm", "-f", trace_path], 30.0)
        if not text.ok:
            return record(error="cannot read the route trace back")
        try:
            trace = parse_trace(text.stdout.decode("utf-8", "replace"), trace_path)
        except TraceError as exc:
            return record(error=str(exc))
        counters = r.data.get("counters")
        if not isinstance(counters, dict):
            return record(error="the traced run printed no counters")
        pred = replay(trace, RunConfig.from_argv(argv))
        found = [*pred.problems, *(str(m) for m in mismatches(trace, pred, counters))]
        return record(found, len(trace.rows))
