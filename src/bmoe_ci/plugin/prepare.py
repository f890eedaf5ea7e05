"""The controller's session setup: build each needed target once, generate fixtures once, then
connect, lock, push and preflight every selected device (in parallel). Runs where xdist's
controller runs, never on a worker, so devices are leased and pushed exactly once per session."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bmoe_ci.builder import Build, build
from bmoe_ci.farm import (
    Device,
    DeviceSession,
    FarmError,
    InfraError,
    PushItem,
    load_farm,
    open_session,
    select_devices,
)
from bmoe_ci.farm.health import HealthBook
from bmoe_ci.fixtures import FixtureFile, generate
from bmoe_ci.paths import source_tree
from bmoe_ci.plugin.context import DeviceContext, GateRun
from bmoe_ci.reference import GATE_REQUEST


def target_for(device: Device) -> str:
    if device.os.lower() in ("macos", "darwin", "osx"):
        return f"{device.arch}-macos"
    return f"{device.arch}-linux-musl"


def _say(msg: str) -> None:
    print(f"bmoe-ci: {msg}", file=sys.stderr, flush=True)


class Prepared:
    """The controller's state for one session: the run context and the open device sessions."""

    def __init__(self, run: GateRun, sessions: dict[str, DeviceSession]):
        self.run = run
        self.sessions = sessions

    def close(self) -> None:
        for session in self.sessions.values():
            session.close()


def prepare(
    *,
    selectors: Sequence[str],
    farm_file: str | None,
    results_dir: Path,
    run_id: str,
    fixture_names: Sequence[str] | None,
    rebuild: bool,
    faults: Sequence[str] = (),
    lock_wait: float = 0.0,
    say: Callable[[str], None] = _say,
) -> Prepared:
    """`faults` are catalogue names (the caller has checked them against engine/faults.toml).
    Raises FarmError (bad farm file, unknown device) — a usage problem that stops the session.
    A device that cannot be reached or fails preflight does NOT raise: it gets an infra_error."""
    farm = load_farm(farm_file)
    selected = select_devices(farm, list(selectors))
    health = HealthBook(farm.path)
    devices, notes = [], []
    for device in selected:
        q = health.get(device.name).quarantine
        if q is None:
            devices.append(device)
        else:
            notes.append(f"{device.name} skipped: {q.describe()} (`bmoe-ci farm release {device.name}` lifts it)")
            say(notes[-1])
    if not devices:
        raise FarmError("every selected device is quarantined:\n" + "\n".join(notes))

    builds: dict[str, Build] = {}
    for target in sorted({target_for(d) for d in devices}):
        defines = [f"BMOE_FAULT_{name}=1" for name in faults]
        builds[target] = build(target, defines=defines, rebuild=rebuild, progress=say)
    fixtures = generate(None, names=list(fixture_names) if fixture_names else None, reference=GATE_REQUEST)

    def open_one(device: Device) -> tuple[DeviceContext, DeviceSession | None]:
        b = builds[target_for(device)]
        ctx = DeviceContext(
            name=device.name, arch=device.arch, os=device.os, kind=device.kind,
            target=b.target, build_id=b.build_id,
        )
        started = time.monotonic()
        try:
            session = open_session(
                device,
                run_id=run_id,
                results_dir=results_dir / device.name,
                engine=b.path,
                build_id=b.build_id,
                files=_fixture_items(fixtures),
                lock_wait=lock_wait,
                progress=lambda m: say(f"{device.name}: {m}"),
            )
        except InfraError as exc:
            ctx.infra_error = str(exc)
            ctx.setup_s = time.monotonic() - started
            say(f"{device.name}: unavailable: {exc}")
            if exc.kind != "busy":  # another run's lease says nothing about the device's health
                h = health.record(device, f"{exc.kind}: {exc.reason}")
                if h.quarantine is not None:
                    say(f"{device.name}: {h.quarantine.describe()}")
            return ctx, None
        health.record(device, None)
        for note in session.transport.retries:
            say(f"{device.name}: {note}")
        ctx.engine = session.engine
        ctx.models = {f.name: session.file(f"fixtures/{f.path.name}") for f in fixtures}
        ctx.pushed_bytes = session.pushed_bytes
        ctx.verified_files = session.verified_files
        ctx.repushed = [str(m) for m in session.mismatches]
        ctx.retries = list(session.transport.retries)
        for m in session.mismatches:
            say(f"{device.name}: hash mismatch, re-pushed: {m}")
        ctx.setup_s = time.monotonic() - started
        return ctx, session

    with ThreadPoolExecutor(max_workers=max(1, len(devices))) as pool:
        opened = list(pool.map(open_one, devices))

    run = GateRun(
        run_id=run_id,
        results_dir=str(results_dir),
        farm_file=str(farm.path) if getattr(farm, "path", None) else farm_file,
        devices=[ctx for ctx, _ in opened],
        fixtures={f.name: f.sha256 for f in fixtures},
        references={f.name: str(f.reference) for f in fixtures if f.reference is not None},
        engine_builds={t: b.build_id for t, b in builds.items()},
        compiled=[t for t, b in builds.items() if b.compiled],
        faults=list(faults),
        started=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        notes=notes,
    )
    return Prepared(run, {ctx.name: s for ctx, s in opened if s is not None})


# The inputs of the quality instruments' gate (SCORE): committed texts, pushed beside the fixtures.
SCORING_INPUTS = ("score.txt", "choices.jsonl", "session.txt")


def _fixture_items(fixtures: Sequence[FixtureFile]) -> list[PushItem]:
    # Every file of a split model goes to the same directory under its own name: the engine finds
    # the sibling shards from the first one's name.
    data = source_tree() / "gates" / "data"
    scoring = [PushItem(data / name, name=f"fixtures/scoring/{name}") for name in SCORING_INPUTS]
    return [PushItem(p, name=f"fixtures/{p.name}") for f in fixtures for p in f.files] + scoring


__all__ = ["FarmError", "Prepared", "prepare", "target_for"]
