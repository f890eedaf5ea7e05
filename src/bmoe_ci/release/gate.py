"""The release gate: diff a proposal against the base's defaults, gather the evidence the changed
settings require (:mod:`~bmoe_ci.release.gather`, saved as ``evidence.json``), then judge it
(:func:`~bmoe_ci.release.judge.judge`) into GO / NO-GO / NO VERDICT. ``--rejudge`` skips gathering and
judges an earlier run's saved evidence."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from bmoe_ci.farm import default_run_id, load_farm
from bmoe_ci.paths import Places
from bmoe_ci.release.evidence import EVIDENCE_JSON, Evidence, FlagSets, load_evidence, save_evidence
from bmoe_ci.release.gather import DeviceInstruments, PoolDevice, gather
from bmoe_ci.release.judge import Verdict, judge
from bmoe_ci.release.policy import POLICY_PATH, Policy, load_policy
from bmoe_ci.release.settings import LoadedSettings, Settings, diff, flags, load_base, load_settings

RELEASE_SCHEMA = "bmoe-ci.release/1"
Mode = Literal["auto", "history", "run"]


class ReleaseUsageError(ValueError):
    """Bad options or files: exit 2."""


@dataclass(frozen=True)
class ReleaseOptions:
    proposed: Path
    repo: Path
    base: str = "HEAD"
    policy: Path | None = None
    farm: Path | None = None
    pool: str = "release"
    history: Path | None = None
    out: Path | None = None
    evidence: Mode = "auto"
    places: Places = field(default_factory=Places)  # as the command line read them from the environment


def _say(msg: str) -> None:
    print(f"bmoe-ci release-gate: {msg}", file=sys.stderr, flush=True)


def flag_sets(base: Settings, proposed: Settings, cache_scale: float) -> FlagSets:
    return FlagSets(
        base=tuple(flags(base)),
        proposed=tuple(flags(proposed)),
        base_eval=tuple(flags(base, cache_scale=cache_scale)),
        proposed_eval=tuple(flags(proposed, cache_scale=cache_scale)),
    )


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def run_release(opts: ReleaseOptions, say: Callable[[str], None] = _say) -> tuple[Evidence, Verdict, Path]:
    """Gather and judge; the evidence is saved in the output directory before it is judged.
    ReleaseConfigError / ValueError for bad files or options (exit 2)."""
    started = _now()
    policy_path = opts.policy or opts.repo / POLICY_PATH
    policy = load_policy(policy_path)
    proposed = load_settings(opts.proposed, places=opts.places)
    base = load_base(opts.base, opts.repo, places=opts.places)
    run_id = default_run_id()
    out = opts.out or opts.repo / "results" / f"release-{run_id}"
    ev = _start(run_id, started, policy, base, proposed, opts)
    if diff(base.settings, proposed.settings):
        ev = _gather(ev, policy, opts, run_id, out, say)
    ev = ev.model_copy(update={"finished": _now()})
    save_evidence(out, ev)
    return ev, judge(ev, policy.model, proposed.settings), out


def _start(
    run_id: str, started: str, policy: Policy, base: LoadedSettings, proposed: LoadedSettings, opts: ReleaseOptions
) -> Evidence:
    evaluation = policy.model.evaluation
    return Evidence(
        run=run_id,
        started=started,
        base=base.settings,
        base_source=base.source,
        proposal=proposed.settings,
        proposal_source=proposed.source,
        policy=policy.model,
        policy_source=policy.source,
        fixture=evaluation.speed_fixture,
        quality_fixture=evaluation.quality_fixture,
        pool=opts.pool,
        evidence_mode=opts.evidence,
        flags=flag_sets(base.settings, proposed.settings, float(evaluation.cache_scale)),
    )


def _gather(
    ev: Evidence, policy: Policy, opts: ReleaseOptions, run_id: str, out: Path, say: Callable[[str], None]
) -> Evidence:
    farm_path = opts.farm
    if farm_path is None:
        from bmoe_ci.farm.embedded import farm_file

        farm_path = farm_file(places=opts.places)
    try:
        farm = load_farm(farm_path)
    except Exception as exc:  # FarmError family: a usage problem
        raise ReleaseUsageError(str(exc)) from None
    if opts.pool not in farm.pools:
        raise ReleaseUsageError(f"unknown pool {opts.pool!r} in {farm.path} (pools: {', '.join(farm.pools) or 'none'})")
    pool = [farm.devices[n] for n in farm.pools[opts.pool]]
    inst = DeviceInstruments(
        repo=opts.repo,
        farm_path=farm_path,
        devices={d.name: d for d in pool},
        policy=policy.model,
        history=opts.history or opts.repo / "results" / "nightly",
        out_dir=out,
        run_id=run_id,
        say=say,
        places=opts.places,
    )
    ev = ev.model_copy(update={"farm": str(farm_path)})
    return gather(ev, policy.model, [PoolDevice(d.name, d.kind, d.arch) for d in pool], opts.evidence, inst, say)


def rejudge(
    directory: Path,
    *,
    policy_file: Path | None = None,
    proposed_file: Path | None = None,
    out: Path | None = None,
    places: Places | None = None,
) -> tuple[Evidence, Verdict, Path]:
    """The verdict of an earlier run's evidence (``DIR/evidence.json``), with no device: under the policy
    it was gathered for, or ``policy_file``; for its proposal, or ``proposed_file`` (which must be the
    same settings). Written to ``out`` (default ``DIR/rejudged``) so the original verdict stays: an
    ``out`` that is the run itself, or holds another run's evidence, is refused."""
    target = out or directory / "rejudged"
    if target.resolve() == directory.resolve() or (target / EVIDENCE_JSON).exists():
        raise ReleaseUsageError(
            f"--out {target}: that is a release run's own directory (it holds {EVIDENCE_JSON}); its verdict "
            f"would be overwritten. Give another directory (default: {directory / 'rejudged'})"
        )
    ev = load_evidence(directory)
    policy = load_policy(policy_file).model if policy_file else ev.policy
    proposal = load_settings(proposed_file, places=places).settings if proposed_file else ev.proposal
    return ev, judge(ev, policy, proposal), target


def release_record(
    ev: Evidence, v: Verdict, *, policy_source: str | None = None, rejudged: str | None = None
) -> dict[str, Any]:
    """release.json: the verdict with every check, and the evidence it was judged on (for the report)."""
    return {
        "schema": RELEASE_SCHEMA,
        "run": ev.run,
        "started": ev.started,
        "finished": ev.finished,
        "verdict": v.verdict,
        "reason": v.reason,
        "exit_code": v.exit_code,
        "rejudged_from": rejudged,
        "evidence": EVIDENCE_JSON,
        "proposed": ev.proposal_source,
        "base": ev.base_source,
        "policy": policy_source or ev.policy_source,
        "farm": ev.farm,
        "pool": ev.pool,
        "evidence_mode": ev.evidence_mode,
        "fixture": ev.fixture,
        "changes": [{"setting": c.setting, "base": c.base, "proposed": c.proposed} for c in diff(ev.base, ev.proposal)],
        "flags": {k: list(f) for k, f in ev.flags.model_dump().items()},
        "engine_builds": dict(sorted(ev.engine_builds.items())),
        "classes": {cls: list(devs) for cls, devs in ev.classes.items()},
        "checks": [c.to_dict() for c in v.checks],
        "not_measured": list(v.not_measured),
        "stale": [r.model_dump(mode="json") for r in ev.refused],
        "gate_evidence": {n: g.model_dump(mode="json") for n, g in sorted(ev.gates.items())},
        "ab": {cls: s.ab for cls, s in ev.speed.items() if s.ab},
        "replay": {cls: r.model_dump(mode="json") for cls, r in ev.replay.items()},
        "quality": ev.quality.model_dump(mode="json") if ev.quality else None,
        "notes": list(ev.notes),
    }
