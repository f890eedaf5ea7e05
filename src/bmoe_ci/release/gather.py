"""Gathering a release proposal's evidence, step by step, stopping as soon as a requirement has failed.

The steps, in order: gate results from the nightly history (and whether those devices answer), a gate
run for the devices still without results, a probe of the rest, then per device class the A/B and the
replay, then quality. After each piece the partial :class:`~bmoe_ci.release.evidence.Evidence` is given
to the same pure :func:`~bmoe_ci.release.judge.judge` that decides the verdict: once it says NO-GO,
nothing that is still to be measured could change that, so gathering stops and records what it did not
measure (``not_measured``) instead of spending minutes of device time on it.

Devices are reached only through an :class:`Instruments` (the real one: :class:`DeviceInstruments`),
so the order and the early stop are tested without devices.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from bmoe_ci.paths import Places
from bmoe_ci.release.evidence import Evidence, GateRecord, QualityRecord, Refusal, ReplayRecord, SpeedRecord
from bmoe_ci.release.judge import QUALITY_KEY, device_key, judge, replay_key, speed_key
from bmoe_ci.release.policy import PolicyFile
from bmoe_ci.release.settings import diff
from bmoe_ci.release.verdict import FAIL, NO_GO


@dataclass(frozen=True)
class PoolDevice:
    name: str
    kind: str
    arch: str


class Instruments(Protocol):
    """What gathering needs measured. Every method returns a record; none decides a requirement."""

    def build_id(self, device: str) -> tuple[str, str]:
        """(engine target, build id) this checkout builds for the device."""
        ...

    def history_gates(
        self, devices: Sequence[str], builds: dict[str, str]
    ) -> tuple[dict[str, GateRecord], list[Refusal]]: ...

    def gate_run(self, devices: Sequence[str]) -> tuple[dict[str, GateRecord], str | None]: ...

    def probe(self, device: str) -> str | None:
        """None when the device answers a command, else why not."""
        ...

    def speed(self, cls: str, device: str, a: Sequence[str], b: Sequence[str]) -> SpeedRecord: ...

    def replay(self, device: str, flags: Sequence[str]) -> ReplayRecord: ...

    def quality(self, device: str, base: Sequence[str], proposed: Sequence[str]) -> QualityRecord: ...


def _merge(ev: Evidence, **update: Any) -> Evidence:
    return ev.model_copy(update=update)


def gather(
    start: Evidence,
    policy: PolicyFile,
    pool: Sequence[PoolDevice],
    mode: str,
    inst: Instruments,
    say: Callable[[str], None],
) -> Evidence:
    """``start`` with every piece of evidence the changed settings require (mode: ``auto``, ``history``
    or ``run``, for gate results)."""
    ev = start
    changes = diff(ev.base, ev.proposal)
    if not changes:
        return ev
    reqs = [policy.settings[c.setting] for c in changes]
    classes = sorted({c for r in reqs for c in r.classes})
    members = {
        cls: tuple(
            d.name
            for d in pool
            if d.kind == policy.device_classes[cls].kind and d.arch == policy.device_classes[cls].arch
        )
        for cls in classes
    }
    devices = list(dict.fromkeys(d for cls in classes for d in members[cls]))
    wanted = list(
        dict.fromkeys(d for cls in classes if any(cls in r.classes and r.gates for r in reqs) for d in members[cls])
    )
    speed_classes = [cls for cls in classes if any(cls in r.classes and r.speed for r in reqs)]
    replay_classes = [cls for cls in classes if any(cls in r.classes and r.replay for r in reqs)]
    plan = [
        *(device_key(d) for d in devices),
        *(speed_key(c) for c in speed_classes),
        *(replay_key(c) for c in replay_classes),
        *([QUALITY_KEY] if any(r.quality for r in reqs) else []),
    ]
    done: set[str] = set()
    ev = _merge(ev, classes=members)

    def failed() -> bool:
        verdict = judge(ev, policy, ev.proposal)
        if verdict.verdict != NO_GO:
            return False
        left = tuple(k for k in plan if k not in done)
        if left:
            first = next(c for c in verdict.checks if c.status == FAIL)
            say(f"stopping: {first.line()}; not measured: {', '.join(left)}")
        return True

    def stop() -> Evidence:
        return _merge(ev, not_measured=tuple(k for k in plan if k not in done))

    reached: list[str] = []
    unreachable: dict[str, str] = {}

    def reach(device: str, why: str | None) -> None:
        nonlocal ev
        if why:
            unreachable[device] = why
        else:
            reached.append(device)
        done.add(device_key(device))
        ev = _merge(ev, reached=tuple(reached), unreachable=dict(unreachable))

    builds = {d: inst.build_id(d) for d in wanted}
    ev = _merge(ev, engine_builds=dict(sorted({t: b for t, b in builds.values()}.items())))
    ids = {d: b for d, (_, b) in builds.items()}
    todo = list(wanted)
    if wanted and mode != "run":
        found, refused = inst.history_gates(todo, ids)
        for r in refused:
            say(r.reason)
        ev = _merge(ev, gates={**ev.gates, **found}, refused=(*ev.refused, *refused))
        todo = [d for d in todo if d not in found]
        for d in found:  # history rows say nothing about whether the device answers today
            reach(d, inst.probe(d))
        if failed():
            return stop()
    if todo and mode != "history":
        run, err = inst.gate_run(todo)
        ev = _merge(ev, gates={**ev.gates, **run}, notes=(*ev.notes, *([err] if err else [])))
        for d in todo:
            rec = run.get(d)
            if rec is not None:
                reach(d, rec.infra_error)
    for d in devices:
        if device_key(d) not in done:
            reach(d, inst.probe(d))
    if failed():
        return stop()
    ok = {cls: [d for d in members[cls] if d in reached] for cls in classes}
    for cls in speed_classes:
        if ok[cls]:
            speed = inst.speed(cls, ok[cls][0], ev.flags.base_eval, ev.flags.proposed_eval)
            ev = _merge(ev, speed={**ev.speed, cls: speed}, engine_builds=_with(ev.engine_builds, speed))
        done.add(speed_key(cls))
        if failed():
            return stop()
    for cls in replay_classes:
        if ok[cls]:
            ev = _merge(ev, replay={**ev.replay, cls: inst.replay(ok[cls][0], ev.flags.proposed_eval)})
        done.add(replay_key(cls))
        if failed():
            return stop()
    if QUALITY_KEY in plan:
        first = [d for cls in classes for d in ok[cls]]
        q = (
            inst.quality(first[0], ev.flags.base_eval, ev.flags.proposed_eval)
            if first
            else QualityRecord(fixture=ev.quality_fixture, error="no reachable device to measure on")
        )
        ev = _merge(ev, quality=q)
        done.add(QUALITY_KEY)
    return ev


def _with(builds: dict[str, str], rec: SpeedRecord) -> dict[str, str]:
    target = rec.ab.get("target")
    return {**builds, target: rec.build_id} if target and rec.build_id else builds


class DeviceInstruments:
    """The real instruments: the farm's devices, the nightly history, `pytest gates`, `bmoe-ci ab`,
    the replay and the quality runs. Engine builds are made once per target."""

    def __init__(
        self,
        *,
        repo: Path,
        farm_path: Path,
        devices: dict[str, Any],  # name -> bmoe_ci.farm.Device
        policy: PolicyFile,
        history: Path,
        out_dir: Path,
        run_id: str,
        say: Callable[[str], None],
        places: Places | None = None,
    ):
        self.repo, self.farm_path, self.devices, self.policy = repo, farm_path, devices, policy
        self.history, self.out_dir, self.run_id, self.say = history, out_dir, run_id, say
        self.places = places or Places()
        self._builds: dict[str, Any] = {}

    def _build(self, device: Any) -> Any:
        from bmoe_ci.builder import build, target_for

        target = target_for(device)
        if target not in self._builds:
            self._builds[target] = build(target, progress=self.say, places=self.places)
        return self._builds[target]

    def build_id(self, device: str) -> tuple[str, str]:
        from bmoe_ci.builder import target_for

        d = self.devices[device]
        return target_for(d), self._build(d).build_id

    def history_gates(
        self, devices: Sequence[str], builds: dict[str, str]
    ) -> tuple[dict[str, GateRecord], list[Refusal]]:
        from bmoe_ci.release.measure import gates_from_history

        return gates_from_history(
            self.history,
            devices,
            builds,
            self.policy.evaluation.speed_fixture,
            float(self.policy.freshness_hours),
        )

    def gate_run(self, devices: Sequence[str]) -> tuple[dict[str, GateRecord], str | None]:
        from bmoe_ci.release.measure import run_gates

        return run_gates(
            self.repo,
            self.farm_path,
            devices,
            [self.policy.evaluation.speed_fixture],
            self.out_dir / "gates",
            self.say,
        )

    def probe(self, device: str) -> str | None:
        from bmoe_ci.release.measure import probe

        return probe(self.devices[device])

    def speed(self, cls: str, device: str, a: Sequence[str], b: Sequence[str]) -> SpeedRecord:
        from bmoe_ci.ab.devstate import DriftBounds
        from bmoe_ci.ab.report import write_ab
        from bmoe_ci.ab.run import AbError, AbSpec, run_ab

        ev = self.policy.evaluation
        spec = AbSpec(
            device=self.devices[device],
            model=fixture_path(ev.speed_fixture, self.places),
            a=tuple(a),
            b=tuple(b),
            rounds=ev.rounds,
            n_predict=ev.n_predict,
            prompt=ev.prompt,
            bounds=DriftBounds(**ev.drift.model_dump()),
        )
        try:
            ab = run_ab(spec, build=self._build, say=lambda m: self.say(f"ab: {m}"), places=self.places)
        except AbError as exc:
            return SpeedRecord(
                device_class=cls, device=device, fixture=ev.speed_fixture, verdict="error", error=str(exc)
            )
        write_ab(self.out_dir / "ab" / cls, ab)
        configs = ab["configs"]
        return SpeedRecord(
            device_class=cls,
            device=device,
            run=ab["run"],
            build_id=ab["engine_build_id"],
            fixture=ev.speed_fixture,
            verdict="refused" if ab["verdict"] == "refused" else "measured",
            a_tok_s=tuple(configs["A"]["tok_s"]),
            b_tok_s=tuple(configs["B"]["tok_s"]),
            seed=int((ab.get("ratios", {}).get("B") or {}).get("seed", 0)),
            refusals=tuple(ab.get("refusals", ())),
            ab=ab,
        )

    def replay(self, device: str, flags: Sequence[str]) -> ReplayRecord:
        from bmoe_ci.release.measure import replay_run

        ev = self.policy.evaluation
        d = self.devices[device]
        bld = self._build(d)
        return replay_run(
            d,
            bld.path,
            bld.build_id,
            fixture_path(ev.speed_fixture, self.places),
            ev.speed_fixture,
            flags,
            ev.prompt,
            ev.n_predict,
            self.run_id,
            self.say,
        )

    def quality(self, device: str, base: Sequence[str], proposed: Sequence[str]) -> QualityRecord:
        from bmoe_ci.release.quality import quality_run

        ev = self.policy.evaluation
        fixture = ev.quality_fixture
        if ev.quality_text is None:
            return QualityRecord(fixture=fixture, error="the policy names no evaluation.quality_text")
        try:
            model = fixture_path(fixture, self.places)
        except ValueError as exc:
            return QualityRecord(fixture=fixture, error=str(exc))
        texts = [ev.quality_text] if isinstance(ev.quality_text, str) else list(ev.quality_text)
        text = self.out_dir / "quality-text.txt"  # the held-out texts, concatenated in the order given
        self.out_dir.mkdir(parents=True, exist_ok=True)
        try:
            text.write_bytes(b"".join((self.repo / t).read_bytes() for t in texts))
        except OSError as exc:
            return QualityRecord(fixture=fixture, error=f"evaluation.quality_text: {exc}")
        choices = self.repo / ev.quality_choices if ev.quality_choices else None
        if choices is not None and not choices.is_file():
            return QualityRecord(fixture=fixture, error=f"evaluation.quality_choices: {choices}: no such file")
        d = self.devices[device]
        bld = self._build(d)
        q = quality_run(d, bld.path, bld.build_id, model, text, choices, base, proposed, self.run_id, self.say)
        return QualityRecord(
            device=q.device,
            run=q.run,
            build_id=q.build_id,
            fixture=fixture,
            reference=q.reference,
            base=q.base,
            proposed=q.proposed,
            error=q.error,
        )


def fixture_path(name: str, places: Places | None = None) -> Path:
    from bmoe_ci.models import SpecError, generate

    try:
        return generate(None, names=[name], places=places)[0].path
    except SpecError as exc:
        raise ValueError(f"evaluation fixture {name!r}: {exc}") from None
