"""The controller's session setup: build each needed target once (the targets side by side, the fixtures
generated meanwhile), then connect, lock, push and preflight every selected device (in parallel). The
plugin calls it where xdist's controller runs, never on a worker, so devices are leased and pushed
exactly once per session.

:func:`plan_only` is the same selection without any of that, for `pytest --collect-only` and the
other modes that look at the tests without running them."""

from __future__ import annotations

import os
import time
from collections.abc import Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bmoe_ci.builder import Build, build, target_for
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
from bmoe_ci.farm.health import DeviceHealth, HealthBook
from bmoe_ci.farm.store import PushReport
from bmoe_ci.gaterun.context import DeviceContext, GateRun
from bmoe_ci.gaterun.progress import Progress
from bmoe_ci.models import FixtureFile, generate, load_specs
from bmoe_ci.paths import Places
from bmoe_ci.reference import GATE_REQUEST


def mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


class Prepared:
    """The controller's state for one session: the run context and the open device sessions."""

    def __init__(self, run: GateRun, sessions: dict[str, DeviceSession]):
        self.run = run
        self.sessions = sessions

    def close(self) -> None:
        """Release every device (in parallel: a hung device costs its own deadlines, not the others')."""
        if not self.sessions:
            return
        with ThreadPoolExecutor(max_workers=len(self.sessions)) as pool:
            list(pool.map(lambda s: s.close(), self.sessions.values()))


def _available(
    selected: Sequence[Device], health: HealthBook, peek: bool, progress: Progress
) -> tuple[list[Device], list[str]]:
    """The selected devices that are not quarantined, and a note for each one that is."""
    devices, notes = [], []
    for device in selected:
        h: DeviceHealth = health.peek(device) if peek else health.get(device)
        if h.quarantine is None:
            devices.append(device)
        else:
            notes.append(
                f"{device.name} skipped: {h.quarantine.describe()} (`bmoe-ci farm release {device.name}` lifts it)"
            )
            progress.notice(notes[-1])
    if not devices:
        raise FarmError("every selected device is quarantined:\n" + "\n".join(notes))
    progress.step(
        f"farm {getattr(health, 'farm', '')}: {len(devices)} device(s): "
        + ", ".join(f"{d.name} ({d.arch})" for d in devices)
    )
    return devices, notes


def plan_only(
    *,
    selectors: Sequence[str],
    farm_file: str | None,
    results_dir: Path,
    run_id: str,
    fixture_names: Sequence[str] | None,
    faults: Sequence[str] = (),
    progress: Progress | None = None,
    places: Places | None = None,
    looking: bool = True,
) -> GateRun:
    """The run's devices and fixtures as the tests are parametrised over them, from the farm file and
    the fixture specs alone: nothing is built, generated, leased, pushed or written (the health state
    is read, not updated). Raises FarmError and SpecError like :func:`prepare`. ``looking``: only looking
    at the tests (``--collect-only``); else this is the plan a real run collects its tests from before
    :func:`prepare` readies what the selected ones need."""
    progress = progress or Progress()
    places = places or Places()
    farm = load_farm(farm_file, places)
    selected = select_devices(farm, list(selectors))
    devices, notes = _available(selected, HealthBook(farm.path, places=places), True, progress)
    specs = load_specs(places=places).select(list(fixture_names) if fixture_names else None)
    if looking:
        progress.step(f"collect only: fixtures {', '.join(s.name for s in specs)}; nothing built, leased or pushed")
    return GateRun(
        run_id=run_id,
        results_dir=str(results_dir),
        farm_file=str(farm.path),
        devices=[
            DeviceContext(
                name=d.name, arch=d.arch, os=d.os, kind=d.kind, target=target_for(d), build_id="", spec=d.spec()
            )
            for d in devices
        ],
        fixtures={s.name: "" for s in specs},
        engine_builds={},
        compiled=[],
        faults=list(faults),
        notes=notes,
    )


def _push_line(reports: Sequence[PushReport], seconds: float, verified: int) -> str:
    files = sum(len(r.files) for r in reports)
    uploaded = sum(r.uploaded for r in reports)
    pushed = sum(r.bytes_pushed for r in reports)
    if not uploaded:
        return f"push: all {files} files already on the device, {verified} verified, {seconds:.1f} s"
    rate = pushed / seconds / 2**20 if seconds > 0 else 0.0
    return (
        f"pushed {mib(pushed)} in {uploaded} of {files} files ({rate:.1f} MiB/s, {files - uploaded} "
        f"already there), {verified} verified, {seconds:.1f} s"
    )


def _session_message(progress: Progress, device: str, msg: str) -> None:
    """A device session's own messages: each file it uploads is detail (the push line sums them up);
    everything else it says is about the lease (waiting for another run's, breaking a stale one, a
    failing heartbeat) and is shown whatever the verbosity."""
    if msg.startswith("pushing "):
        progress.detail(f"{device}: {msg}")
    else:
        progress.notice(f"{device}: {msg}")


def _build_message(progress: Progress, msg: str) -> None:
    """The builder's messages: a target that starts to compile is said even under -q (it takes minutes);
    its "still building" lines come at the normal verbosity."""
    if msg.startswith("still "):
        progress.step(msg)
    else:
        progress.milestone(msg)


def _fixtures_message(progress: Progress, msg: str) -> None:
    """The fixture generator's messages: waiting for another generator, or a manifest it had to ignore,
    are notices; generating and hashing are detail (the fixtures line sums them up)."""
    if msg.startswith(("waiting", "ignoring")):
        progress.notice(f"fixtures: {msg}")
    else:
        progress.detail(f"fixtures: {msg}")


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
    progress: Progress | None = None,
    places: Places | None = None,
    needs: Mapping[str, Collection[str]] | None = None,
) -> Prepared:
    """`faults` are catalogue names (the caller has checked them against engine/faults.toml); `places`
    (default: no override) is where the source tree, the caches and the local farm are. `needs`: device
    name -> the fixtures its selected tests need (None: every selected device, every fixture); a device
    it does not name is not built for, leased or pushed to, and a device gets only its own fixtures.
    Raises FarmError (bad farm file, unknown device) — a usage problem that stops the session.
    A device that cannot be reached or fails preflight does NOT raise: it gets an infra_error."""
    progress = progress or Progress()
    places = places or Places()
    started = time.monotonic()
    farm = load_farm(farm_file, places)
    selected = select_devices(farm, list(selectors))
    health = HealthBook(farm.path, places=places)
    if needs is not None:
        # a quarantined device has no collected tests (the plan left it out), so `needs` does not name
        # it: it is still looked at here, for the note that says it was skipped and why
        selected = [d for d in selected if d.name in needs or health.get(d).quarantine is not None]
    devices, notes = _available(selected, health, False, progress)
    if needs is not None:
        devices = [d for d in devices if d.name in needs]
    if needs is not None:
        wanted = sorted({f for names in needs.values() for f in names})
        fixture_names = [f for f in (fixture_names or wanted) if f in wanted]

    def build_one(target: str) -> Build:
        defines = [f"BMOE_FAULT_{name}=1" for name in faults]
        t0 = time.monotonic()
        b = build(
            target, defines=defines, rebuild=rebuild, progress=lambda m: _build_message(progress, m), places=places
        )
        with_faults = f", faults {', '.join(faults)}" if faults else ""
        progress.step(
            f"build {b.target}: {'compiled' if b.compiled else 'cached'}, "
            f"{time.monotonic() - t0:.1f} s (build {b.build_id}{with_faults})"
        )
        return b

    # A target's first build compiles its libc, about a minute of one core (docs/benchmarks.md): the
    # targets build side by side, and the fixtures are generated meanwhile.
    targets = sorted({target_for(d) for d in devices})
    with ThreadPoolExecutor(max_workers=max(1, len(targets))) as pool:
        building = {t: pool.submit(build_one, t) for t in targets}
        t0 = time.monotonic()
        fixtures: list[FixtureFile] = []
        if needs is None or fixture_names:
            fixtures = generate(
                None,
                names=list(fixture_names) if fixture_names else None,
                reference=GATE_REQUEST,
                progress=lambda m: _fixtures_message(progress, m),
                places=places,
            )
            progress.step(
                "fixtures: "
                + ", ".join(f"{f.name} {f.origin} ({mib(f.size)})" for f in fixtures)
                + f"; {time.monotonic() - t0:.1f} s"
            )
        builds: dict[str, Build] = {t: f.result() for t, f in building.items()}  # a build's error raises here
    tree = places.source_tree()
    tok = _tok_items(places)  # gate TOK's inputs go to every device: small, and no fixture's

    def device_fixtures(device: Device) -> list[FixtureFile]:
        return [f for f in fixtures if needs is None or f.name in needs.get(device.name, ())]

    def open_one(device: Device) -> tuple[DeviceContext, DeviceSession | None]:
        b = builds[target_for(device)]
        ctx = DeviceContext(
            name=device.name,
            arch=device.arch,
            os=device.os,
            kind=device.kind,
            target=b.target,
            build_id=b.build_id,
            spec=device.spec(),
        )
        started = time.monotonic()

        def step_done(s: DeviceSession, step: str, seconds: float) -> None:
            # each step's line comes when it is done (a push to a phone can take minutes)
            if step == "lease":
                progress.detail(f"{device.name}: connected and leased in {time.monotonic() - started:.1f} s")
            elif step == "push":
                progress.step(f"{device.name}: " + _push_line(s.pushes, seconds, s.verified_files))
            elif step == "preflight":
                report = s.preflight_report
                assert report is not None
                progress.step(f"{device.name}: preflight ok, {seconds:.1f} s ({report.summary()})")

        try:
            session = open_session(
                device,
                run_id=run_id,
                results_dir=results_dir / device.name,
                engine=b.path,
                build_id=b.build_id,
                files=_fixture_items(device_fixtures(device), tree) + tok,
                lock_wait=lock_wait,
                progress=lambda m: _session_message(progress, device.name, m),
                on_step=step_done,
            )
        except InfraError as exc:  # open_session closed the session (and released the lease)
            ctx.infra_error = exc.line().split(": ", 1)[1]  # the line without the device's name
            ctx.infra_kind, ctx.infra_step, ctx.infra_reason = exc.kind, exc.step, exc.reason
            ctx.setup_s = time.monotonic() - started
            progress.notice(f"{device.name}: unavailable: {exc}")
            if exc.kind != "busy":  # another run's lease says nothing about the device's health
                h = health.record(device, f"{exc.kind}: {exc.reason}")
                if h.quarantine is not None:
                    progress.notice(f"{device.name}: {h.quarantine.describe()}")
            return ctx, None
        except Exception as exc:  # a bug or a surprise of one device's set-up: never the others' run
            why = " ".join(str(exc).split())[:300] or "(no message)"
            ctx.infra_error = f"set-up: setup: unexpected {type(exc).__name__}: {why}"
            ctx.infra_kind, ctx.infra_step, ctx.infra_reason = (
                "setup",
                "set-up",
                f"unexpected {type(exc).__name__}: {why}",
            )
            ctx.setup_s = time.monotonic() - started
            progress.notice(f"{device.name}: unavailable: {ctx.infra_error}")
            return ctx, None
        health.record(device, None)
        for note in session.transport.retries:
            progress.notice(f"{device.name}: {note}")
        ctx.engine = session.engine
        ctx.models = {f.name: session.file(f"fixtures/{f.path.name}") for f in device_fixtures(device)}
        ctx.pushed_bytes = session.pushed_bytes
        ctx.verified_files = session.verified_files
        ctx.repushed = [str(m) for m in session.mismatches]
        ctx.retries = list(session.transport.retries)
        for m in session.mismatches:
            progress.notice(f"{device.name}: hash mismatch, re-pushed: {m}")
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
    ready = sum(1 for ctx in run.devices if ctx.infra_error is None)
    made = sum(1 for f in fixtures if f.origin != "cached")
    progress.summary(
        f"{ready} of {len(run.devices)} device(s) ready in {time.monotonic() - started:.1f} s: compiled "
        f"{', '.join(run.compiled) or 'nothing'}; fixtures {made} made, {len(fixtures) - made} cached; "
        f"pushed {mib(sum(ctx.pushed_bytes for ctx in run.devices))}"
    )
    return Prepared(run, {ctx.name: s for ctx, s in opened if s is not None})


def results_dir_problem(path: Path) -> str | None:
    """Why ``path`` cannot be the results directory (it is created later, after the devices are
    ready), or None."""
    if path.exists():
        if not path.is_dir():
            return "exists and is not a directory"
        probe = path
    else:
        probe = path.parent
        while not probe.exists():
            probe = probe.parent
        if not probe.is_dir():
            return f"{probe} is not a directory"
    if not os.access(probe, os.W_OK | os.X_OK):
        return f"{probe} is not writable"
    return None


# The inputs of the quality instruments' gate (SCORE): committed texts, pushed beside the fixtures.
SCORING_INPUTS = ("score.txt", "choices.jsonl", "session.txt")


def _fixture_items(fixtures: Sequence[FixtureFile], tree: Path) -> list[PushItem]:
    # Every file of a split model goes to the same directory under its own name: the engine finds
    # the sibling shards from the first one's name. The scoring inputs go with any fixture.
    if not fixtures:
        return []
    data = tree / "gates" / "data"
    scoring = [PushItem(data / name, name=f"fixtures/scoring/{name}") for name in SCORING_INPUTS]
    return [PushItem(p, name=f"fixtures/{p.name}") for f in fixtures for p in f.files] + scoring


def _tok_items(places: Places) -> list[PushItem]:
    """The TOK gate's inputs (bmoe_ci.tokgate): its vocabulary files and texts, made in the cache."""
    from bmoe_ci.tokgate import TOK_DIR, write_inputs

    files = write_inputs(places.cache_dir() / TOK_DIR, places)
    return [PushItem(path, name=f"fixtures/{TOK_DIR}/{name}") for name, path in files.items()]


__all__ = ["FarmError", "Prepared", "plan_only", "prepare", "results_dir_problem"]
