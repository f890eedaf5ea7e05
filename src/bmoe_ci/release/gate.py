"""The release gate: diff a proposal against the base's defaults, gather the evidence the changed
settings require, check it against the policy, and decide GO / NO-GO / NO VERDICT."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from bmoe_ci.ab.devstate import DriftBounds
from bmoe_ci.ab.run import AbError, AbSpec, run_ab
from bmoe_ci.ab.stats import ratio_ci
from bmoe_ci.farm import Device, default_run_id, load_farm
from bmoe_ci.release.evidence import GateEvidence, Stale, gates_from_history, probe, replay_run, run_gate_suite
from bmoe_ci.release.policy import POLICY_PATH, Policy, load_policy
from bmoe_ci.release.quality import QualityEvidence, quality_run
from bmoe_ci.release.settings import Change, LoadedSettings, Settings, diff, flags, load_base, load_settings
from bmoe_ci.release.verdict import EXIT, FAIL, MISSING, PASS, Check, decide

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


def _say(msg: str) -> None:
    print(f"bmoe-ci release-gate: {msg}", file=sys.stderr, flush=True)


def eval_flags(s: Settings, policy: Policy) -> list[str]:
    """The settings' flags with the cache budget scaled onto the evaluation models."""
    mb = max(1, round(s.cache_mb * policy.model.evaluation.cache_scale)) if s.cache_mb else 0
    return flags(s, cache_mb=mb)


class _Run:
    """One release-gate run's state (the steps below fill ``checks``)."""

    def __init__(
        self,
        opts: ReleaseOptions,
        policy: Policy,
        base: LoadedSettings,
        proposed: LoadedSettings,
        changes: list[Change],
        say: Callable[[str], None],
    ):
        self.opts, self.policy, self.base, self.proposed, self.changes, self.say = (
            opts,
            policy,
            base,
            proposed,
            changes,
            say,
        )
        self.run_id = default_run_id()
        self.checks: list[Check] = []
        self.stale: list[Stale] = []
        self.notes: list[str] = []
        self.ab: dict[str, dict[str, Any]] = {}
        self.replays: dict[str, Any] = {}
        self.quality: QualityEvidence | None = None
        self.gate_evidence: dict[str, GateEvidence] = {}
        self.builds: dict[str, Any] = {}  # target -> Build
        self.members: dict[str, list[Device]] = {}
        self.out_dir: Path = opts.out or opts.repo / "results" / f"release-{self.run_id}"
        self.farm_path: Path | None = opts.farm

    # ------------------------------------------------------------------ helpers
    def reqs(self) -> list[tuple[str, Any]]:
        return [(c.setting, self.policy.requirement(c.setting)) for c in self.changes]

    def build_for(self, device: Device) -> Any:
        from bmoe_ci.builder import build
        from bmoe_ci.plugin.prepare import target_for

        target = target_for(device)
        if target not in self.builds:
            self.builds[target] = build(target, progress=self.say)
        return self.builds[target]

    def add(self, check: Check) -> None:
        self.checks.append(check)
        self.say(f"{check.status.upper()}: {check.line()}")

    # ------------------------------------------------------------------ steps
    def execute(self) -> None:
        try:
            farm = load_farm(self.opts.farm)
        except Exception as exc:  # FarmError family: a usage problem
            raise ReleaseUsageError(str(exc)) from None
        if self.opts.pool not in farm.pools:
            raise ReleaseUsageError(
                f"unknown pool {self.opts.pool!r} in {farm.path} (pools: {', '.join(farm.pools) or 'none'})"
            )
        pool = [farm.devices[n] for n in farm.pools[self.opts.pool]]
        classes = sorted({c for _, r in self.reqs() for c in r.classes})
        members: dict[str, list[Device]] = {}
        for cls in classes:
            spec = self.policy.classes[cls]
            members[cls] = [d for d in pool if d.kind == spec.kind and d.arch == spec.arch]
            if not members[cls]:
                for setting, r in self.reqs():
                    if cls in r.classes:
                        self.add(
                            Check(
                                setting,
                                "device class",
                                cls,
                                MISSING,
                                detail=f"no {spec.kind} {spec.arch} device in pool {self.opts.pool!r}",
                            )
                        )
        self.members = members
        self._gates()
        reached = self._reachability()
        self._speed(reached)
        self._replay(reached)
        self._quality(reached)

    def _gates(self) -> None:
        wanted = {
            d.name: d
            for cls, devs in self.members.items()
            for d in devs
            if any(cls in r.classes and r.gates for _, r in self.reqs())
        }
        if not wanted:
            return
        builds = {n: self.build_for(d).build_id for n, d in wanted.items()}
        todo = list(wanted)
        if self.opts.evidence != "run":
            hist = self.opts.history or self.opts.repo / "results" / "nightly"
            found, stale = gates_from_history(hist, todo, builds, float(self.policy.model.freshness_hours))
            self.gate_evidence.update(found)
            self.stale += stale
            for s in stale:
                self.say(s.reason)
            todo = [n for n in todo if n not in found]
        if todo and self.opts.evidence != "history":
            fixtures = [self.policy.model.evaluation.speed_fixture]
            out = self.out_dir / "gates"
            ev, err = run_gate_suite(self.opts.repo, self.farm_path, todo, fixtures, out, self.say)
            if err:
                self.notes.append(err)
            self.gate_evidence.update(ev)

    def _reachability(self) -> dict[str, list[Device]]:
        """Per class, its devices that answered (a gate run reached them, or a probe did)."""
        reached: dict[str, list[Device]] = {}
        for cls, devs in self.members.items():
            ok, why = [], []
            for d in devs:
                ev = self.gate_evidence.get(d.name)
                if ev is not None and ev.source == "gate run" and ev.infra_error:
                    why.append(f"{d.name}: {ev.infra_error}")
                    continue
                err = probe(d) if ev is None or ev.source == "history" else None
                if err:
                    why.append(f"{d.name}: {err}")
                else:
                    ok.append(d)
            reached[cls] = ok
            if devs and not ok:
                for setting, r in self.reqs():
                    if cls in r.classes:
                        self.add(
                            Check(
                                setting, "device class", cls, MISSING, detail="no reachable device: " + "; ".join(why)
                            )
                        )
            for setting, r in self.reqs():
                if cls in r.classes and ok:
                    self._gate_checks(setting, r.gates, cls, ok)
        return reached

    def _gate_checks(self, setting: str, gates: tuple[str, ...], cls: str, devices: list[Device]) -> None:
        for gate in gates:
            for d in devices:
                ev = self.gate_evidence.get(d.name)
                trace = {"run": ev.run, "device": d.name, "build_id": ev.build_id, "source": ev.source} if ev else {}
                if ev is None:
                    stale = [s.reason for s in self.stale if s.device == d.name]
                    detail = "; ".join(stale) if stale else "no gate results for this build"
                    self.add(Check(setting, f"gate {gate}", cls, MISSING, detail=detail))
                    continue
                outcome = ev.gates.get(gate)
                status = PASS if outcome == "pass" else FAIL if outcome == "fail" else MISSING
                detail = {None: "the gate did not run", "skip": "skipped", "error": "infrastructure error"}.get(
                    outcome, ""
                )
                self.add(
                    Check(
                        setting,
                        f"gate {gate}",
                        cls,
                        status,
                        value=outcome or "absent",
                        threshold="pass",
                        detail=detail,
                        evidence=trace,
                    )
                )

    def _speed(self, reached: dict[str, list[Device]]) -> None:
        ev = self.policy.model.evaluation
        a, b = eval_flags(self.base.settings, self.policy), eval_flags(self.proposed.settings, self.policy)
        model = _fixture(ev.speed_fixture)
        for cls, devs in reached.items():
            needs = [(s, r.speed) for s, r in self.reqs() if r.speed is not None and cls in r.classes]
            if not needs or not devs:
                continue
            device = devs[0]
            spec = AbSpec(
                device=device,
                model=model,
                a=tuple(a),
                b=tuple(b),
                rounds=ev.rounds,
                n_predict=ev.n_predict,
                prompt=ev.prompt,
                bounds=DriftBounds(**ev.drift.model_dump()),
            )
            try:
                ab = run_ab(spec, build=self.build_for, say=lambda m: self.say(f"ab: {m}"))
            except AbError as exc:
                for setting, _ in needs:
                    self.add(Check(setting, "speed", cls, MISSING, detail=f"no measurement: {exc}"))
                continue
            from bmoe_ci.ab.report import write_ab

            write_ab(self.out_dir / "ab" / cls, ab)
            self.ab[cls] = ab
            trace = {"run": ab["run"], "device": ab["device"], "build_id": ab["engine_build_id"], "source": "ab"}
            for setting, sp in needs:
                if ab["verdict"] == "refused":
                    self.add(
                        Check(
                            setting,
                            "speed",
                            cls,
                            MISSING,
                            threshold=f">= {sp.min_ratio}",
                            detail="device state drifted: " + "; ".join(ab["refusals"]),
                            evidence=trace,
                        )
                    )
                    continue
                ci = ratio_ci(
                    ab["configs"]["A"]["tok_s"],
                    ab["configs"]["B"]["tok_s"],
                    confidence=float(sp.confidence),
                    seed=ab["ratios"]["B"]["seed"],
                )
                ok = ci.low >= float(sp.min_ratio)
                self.add(
                    Check(
                        setting,
                        "speed",
                        cls,
                        PASS if ok else FAIL,
                        value=round(ci.low, 4),
                        threshold=f"lower bound of the {sp.confidence:.0%} interval >= {sp.min_ratio}",
                        detail=f"B/A tok/s {ci.ratio:.3f}, interval {ci.low:.3f} .. {ci.high:.3f} "
                        f"({ab['configs']['A']['tok_s_mean']:.1f} -> {ab['configs']['B']['tok_s_mean']:.1f} "
                        "tok/s)",
                        evidence=trace,
                    )
                )

    def _replay(self, reached: dict[str, list[Device]]) -> None:
        ev = self.policy.model.evaluation
        b = eval_flags(self.proposed.settings, self.policy)
        for cls, devs in reached.items():
            needs = [s for s, r in self.reqs() if r.replay and cls in r.classes]
            if not needs or not devs:
                continue
            device = devs[0]
            bld = self.build_for(device)
            rep = replay_run(
                device,
                bld.path,
                bld.build_id,
                _fixture(ev.speed_fixture),
                b,
                ev.prompt,
                ev.n_predict,
                self.run_id,
                self.say,
            )
            self.replays[cls] = vars(rep)
            trace = {"run": rep.run, "device": rep.device, "build_id": rep.build_id, "source": "replay"}
            for setting in needs:
                if rep.error:
                    self.add(Check(setting, "replay", cls, MISSING, detail=rep.error, evidence=trace))
                else:
                    self.add(
                        Check(
                            setting,
                            "replay",
                            cls,
                            FAIL if rep.mismatches else PASS,
                            value=f"{len(rep.mismatches)} mismatches in {rep.rows} trace rows",
                            threshold="0",
                            detail="; ".join(rep.mismatches[:5]),
                            evidence=trace,
                        )
                    )

    def _quality(self, reached: dict[str, list[Device]]) -> None:
        needs = [(s, r.quality) for s, r in self.reqs() if r.quality is not None]
        if not needs:
            return
        devs = [d for cls in sorted(reached) for d in reached[cls]]
        ev = self.policy.model.evaluation
        error = None
        if not devs:
            error = "no reachable device to measure on"
        elif ev.quality_text is None:
            error = "the policy names no evaluation.quality_text"
        else:
            try:
                model = _fixture(ev.quality_fixture)
            except ValueError as exc:
                error = str(exc)
        if error is None:
            device = devs[0]
            bld = self.build_for(device)
            texts = [ev.quality_text] if isinstance(ev.quality_text, str) else list(ev.quality_text)
            text = self.out_dir / "quality-text.txt"  # the held-out texts, concatenated in the order given
            self.out_dir.mkdir(parents=True, exist_ok=True)
            try:
                text.write_bytes(b"".join((self.opts.repo / t).read_bytes() for t in texts))
            except OSError as exc:
                error = f"evaluation.quality_text: {exc}"
            choices = self.opts.repo / ev.quality_choices if ev.quality_choices else None
            if choices is not None and not choices.is_file():
                error = f"evaluation.quality_choices: {choices}: no such file"
        if error is None:
            self.quality = quality_run(
                device,
                bld.path,
                bld.build_id,
                model,
                text,
                choices,
                eval_flags(self.base.settings, self.policy),
                eval_flags(self.proposed.settings, self.policy),
                self.run_id,
                self.say,
            )
            error = self.quality.error
        for setting, q in needs:
            if error:
                self.add(Check(setting, "quality", None, MISSING, detail=error))
                continue
            self._quality_checks(setting, q)

    def _quality_checks(self, setting: str, q: Any) -> None:
        qe = self.quality
        assert qe is not None
        trace = {"run": qe.run, "device": qe.device, "build_id": qe.build_id, "source": "instruments"}
        base, prop = qe.base, qe.proposed
        if q.max_ppl_increase is not None:
            pa, pb = base.get("ppl"), prop.get("ppl")
            if not isinstance(pa, int | float) or not isinstance(pb, int | float) or pa <= 0:
                self.add(Check(setting, "quality ppl", None, MISSING, detail="the run reported no ppl", evidence=trace))
            else:
                rise = pb / pa - 1.0
                self.add(
                    Check(
                        setting,
                        "quality ppl",
                        None,
                        PASS if rise <= q.max_ppl_increase else FAIL,
                        value=round(rise, 5),
                        threshold=f"relative increase <= {q.max_ppl_increase}",
                        detail=f"ppl {pa:.4f} -> {pb:.4f}",
                        evidence=trace,
                    )
                )
        if q.min_agreement is not None:
            agree = prop.get("ref_agreement")
            if not isinstance(agree, int | float):
                self.add(
                    Check(
                        setting,
                        "quality agreement",
                        None,
                        MISSING,
                        detail="the run reported no agreement with the base",
                        evidence=trace,
                    )
                )
            else:
                self.add(
                    Check(
                        setting,
                        "quality agreement",
                        None,
                        PASS if agree >= q.min_agreement else FAIL,
                        value=round(float(agree), 5),
                        threshold=f">= {q.min_agreement}",
                        detail=f"share of positions whose argmax equals the lossless reference's (base "
                        f"{_num(base.get('ref_agreement'))}; kl_mean {_num(base.get('kl_mean'))} -> "
                        f"{_num(prop.get('kl_mean'))})",
                        evidence=trace,
                    )
                )
        if q.max_accuracy_drop is not None:
            aa, ab_ = base.get("accuracy"), prop.get("accuracy")
            if not isinstance(aa, int | float) or not isinstance(ab_, int | float):
                self.add(
                    Check(
                        setting,
                        "quality accuracy",
                        None,
                        MISSING,
                        detail="no multiple-choice accuracy (evaluation.quality_choices)",
                        evidence=trace,
                    )
                )
            else:
                drop = aa - ab_
                self.add(
                    Check(
                        setting,
                        "quality accuracy",
                        None,
                        PASS if drop <= q.max_accuracy_drop else FAIL,
                        value=round(drop, 5),
                        threshold=f"drop <= {q.max_accuracy_drop}",
                        detail=f"accuracy {aa:.4f} -> {ab_:.4f}",
                        evidence=trace,
                    )
                )


def _num(v: Any) -> str:
    return f"{v:.4f}" if isinstance(v, int | float) else "?"


def _fixture(name: str) -> Path:
    from bmoe_ci.fixtures import SpecError, generate

    try:
        return generate(None, names=[name])[0].path
    except SpecError as exc:
        raise ValueError(f"evaluation fixture {name!r}: {exc}") from None


def run_release(opts: ReleaseOptions, say: Callable[[str], None] = _say) -> tuple[dict[str, Any], Path]:
    """Everything; returns (release.json content, output directory). ReleaseConfigError / ValueError for
    bad files or options (exit 2)."""
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    policy_path = opts.policy or opts.repo / POLICY_PATH
    policy = load_policy(policy_path)
    proposed = load_settings(opts.proposed)
    base = load_base(opts.base, opts.repo)
    changes = diff(base.settings, proposed.settings)
    run = _Run(opts, policy, base, proposed, changes, say)
    if changes:
        if run.farm_path is None:
            from bmoe_ci.farm.localfarm import farm_file

            run.farm_path = farm_file()
        run.execute()
    verdict, reason = decide(run.checks, bool(changes))
    out = {
        "schema": RELEASE_SCHEMA,
        "run": run.run_id,
        "started": started,
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "verdict": verdict,
        "reason": reason,
        "exit_code": EXIT[verdict],
        "proposed": proposed.source,
        "base": base.source,
        "policy": policy.source,
        "farm": str(run.farm_path) if run.farm_path else None,
        "pool": opts.pool,
        "evidence_mode": opts.evidence,
        "changes": [{"setting": c.setting, "base": c.base, "proposed": c.proposed} for c in changes],
        "flags": {
            "base": flags(base.settings),
            "proposed": flags(proposed.settings),
            "base_eval": eval_flags(base.settings, policy),
            "proposed_eval": eval_flags(proposed.settings, policy),
        },
        "engine_builds": {t: b.build_id for t, b in sorted(run.builds.items())},
        "classes": {cls: [d.name for d in devs] for cls, devs in run.members.items()},
        "checks": [c.to_dict() for c in run.checks],
        "stale": [vars(s) for s in run.stale],
        "gate_evidence": {n: vars(e) for n, e in sorted(run.gate_evidence.items())},
        "ab": run.ab,
        "replay": run.replays,
        "quality": vars(run.quality) if run.quality else None,
        "notes": run.notes,
    }
    return out, run.out_dir
