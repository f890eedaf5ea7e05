"""The verdict of a release proposal from its evidence: :func:`judge`, the only place where the policy's
requirements are checked.

It is a pure function of the :class:`~bmoe_ci.release.evidence.Evidence` record, the policy and the
proposal: no file, device, clock or randomness (the speed interval's bootstrap has a fixed seed that
the evidence carries). So the same evidence always gives the same verdict, gathering can ask it after
every measurement whether a requirement has already failed, and ``--rejudge`` re-derives an earlier
run's verdict from its ``evidence.json``. What needs the clock or a device (is a history row fresh, is
a device reachable) was settled while gathering and is recorded in the evidence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, TypeGuard

from bmoe_ci.ab.stats import ratio_ci
from bmoe_ci.release.evidence import Evidence, GateRecord
from bmoe_ci.release.policy import PolicyFile, Quality, Requirement
from bmoe_ci.release.settings import Settings, diff
from bmoe_ci.release.verdict import EXIT, FAIL, MISSING, NO_VERDICT, PASS, Check, decide

STOPPED = "not measured: gathering stopped after a requirement had failed"


@dataclass(frozen=True)
class Verdict:
    verdict: str  # GO | NO-GO | NO VERDICT
    reason: str
    checks: tuple[Check, ...] = ()
    not_measured: tuple[str, ...] = ()
    refused: bool = False  # the evidence as a whole does not fit this policy or proposal

    @property
    def exit_code(self) -> int:
        return EXIT[self.verdict]


# keys of what gathering measures, shared with it so ``not_measured`` names the same things
def device_key(device: str) -> str:
    return f"gates and reachability of {device}"


def speed_key(cls: str) -> str:
    return f"speed on {cls}"


def replay_key(cls: str) -> str:
    return f"replay on {cls}"


QUALITY_KEY = "quality"


def mismatch(ev: Evidence, policy: PolicyFile, proposal: Settings) -> str | None:
    """Why this evidence cannot be judged against this policy and proposal at all (one line), or None."""
    wanted = policy.evaluation
    if ev.fixture != wanted.speed_fixture or ev.quality_fixture != wanted.quality_fixture:
        return (
            f"the evidence of run {ev.run} was gathered on fixture {ev.fixture} (quality {ev.quality_fixture}), "
            f"the policy's fixture is {wanted.speed_fixture} (quality {wanted.quality_fixture}): refused"
        )
    if proposal != ev.proposal:
        return f"the evidence of run {ev.run} is for another proposal ({ev.proposal_source}): refused"
    changed = [c.setting for c in diff(ev.base, proposal)]
    unruled = [s for s in changed if s not in policy.settings]
    if unruled:
        return f"the policy has no requirement for {', '.join(unruled)}, which the proposal changes: refused"
    classes = sorted({c for s in changed for c in policy.settings[s].classes} - set(policy.device_classes))
    if classes:
        return f"the policy's requirements name device class(es) {', '.join(classes)} it does not define: refused"
    return None


def judge(ev: Evidence, policy: PolicyFile, proposal: Settings) -> Verdict:
    """GO / NO-GO / NO VERDICT with every check. Evidence still missing (a partial record while
    gathering, or what gathering skipped) gives missing checks, so a failure is never hidden by a gap
    and a gap never passes."""
    why = mismatch(ev, policy, proposal)
    if why:
        return Verdict(NO_VERDICT, why, not_measured=ev.not_measured, refused=True)
    changes = diff(ev.base, proposal)
    if not changes:
        verdict, reason = decide([], False)
        return Verdict(verdict, reason)
    reqs = [(c.setting, policy.settings[c.setting]) for c in changes]
    checks: list[Check] = []
    classes = sorted({c for _, r in reqs for c in r.classes})
    stopped = set(ev.not_measured)

    def each(cls: str) -> list[tuple[str, Requirement]]:
        return [(s, r) for s, r in reqs if cls in r.classes]

    for cls in classes:
        if not ev.classes.get(cls):
            spec = policy.device_classes[cls]
            detail = (
                f"no {spec.kind} {spec.arch} device in pool {ev.pool!r}"
                if cls in ev.classes
                else "the evidence does not cover this class"
            )
            checks += [Check(s, "device class", cls, MISSING, detail=detail) for s, _ in each(cls)]
    reached: dict[str, list[str]] = {}
    for cls in classes:
        members = list(ev.classes.get(cls, ()))
        ok = [d for d in members if d in ev.reached]
        reached[cls] = ok
        if members and not ok:
            why_not = "; ".join(
                f"{d}: {ev.unreachable.get(d) or (STOPPED if device_key(d) in stopped else 'not checked')}"
                for d in members
            )
            checks += [
                Check(s, "device class", cls, MISSING, detail="no reachable device: " + why_not) for s, _ in each(cls)
            ]
        for setting, r in each(cls):
            if ok:
                checks += _gate_checks(ev, policy, setting, r.gates, cls, ok, stopped)
    for cls in classes:
        needs = [(s, r) for s, r in each(cls) if r.speed is not None]
        if needs and reached[cls]:
            checks += _speed_checks(ev, cls, needs, stopped)
    for cls in classes:
        needs = [(s, r) for s, r in each(cls) if r.replay]
        if needs and reached[cls]:
            checks += _replay_checks(ev, cls, [s for s, _ in needs], stopped)
    for setting, r in reqs:
        if r.quality is not None:
            checks += _quality_checks(ev, setting, r.quality, stopped)
    verdict, reason = decide(checks, True)
    return Verdict(verdict, reason, tuple(checks), ev.not_measured)


def _trace(rec: Any, source: str) -> dict[str, Any]:
    return {"run": rec.run, "device": rec.device, "build_id": rec.build_id, "source": source}


def _gate_checks(
    ev: Evidence,
    policy: PolicyFile,
    setting: str,
    gates: tuple[str, ...],
    cls: str,
    devices: list[str],
    stopped: set[str],
) -> list[Check]:
    out = []
    fixture = policy.evaluation.speed_fixture
    for gate in gates:
        for d in devices:
            rec: GateRecord | None = ev.gates.get(d)
            if rec is None:
                refused = [s.reason for s in ev.refused if s.device == d]
                detail = (
                    STOPPED
                    if device_key(d) in stopped
                    else "; ".join(refused)
                    if refused
                    else "no gate results for this build"
                )
                out.append(Check(setting, f"gate {gate}", cls, MISSING, detail=detail))
                continue
            trace = _trace(rec, rec.source)
            if fixture not in rec.fixtures:
                shown = ", ".join(rec.fixtures) or "no fixture"
                out.append(
                    Check(
                        setting,
                        f"gate {gate}",
                        cls,
                        MISSING,
                        detail=f"gate results of run {rec.run} on {d} are for fixture {shown}, "
                        f"the policy's fixture is {fixture}: refused",
                        evidence=trace,
                    )
                )
                continue
            outcome = rec.gates.get(gate)
            status = PASS if outcome == "pass" else FAIL if outcome == "fail" else MISSING
            detail = {None: "the gate did not run", "skip": "skipped", "error": "infrastructure error"}.get(outcome, "")
            out.append(
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
    return out


def _speed_checks(ev: Evidence, cls: str, needs: list[tuple[str, Requirement]], stopped: set[str]) -> list[Check]:
    rec = ev.speed.get(cls)
    if rec is None:
        detail = STOPPED if speed_key(cls) in stopped else "not measured"
        return [Check(s, "speed", cls, MISSING, detail=detail) for s, _ in needs]
    if rec.verdict == "error":
        return [Check(s, "speed", cls, MISSING, detail=f"no measurement: {rec.error}") for s, _ in needs]
    trace = _trace(rec, "ab")
    out = []
    for setting, r in needs:
        sp = r.speed
        assert sp is not None
        if rec.verdict == "refused":
            out.append(
                Check(
                    setting,
                    "speed",
                    cls,
                    MISSING,
                    threshold=f">= {sp.min_ratio}",
                    detail="device state drifted: " + "; ".join(rec.refusals),
                    evidence=trace,
                )
            )
            continue
        try:
            ci = ratio_ci(rec.a_tok_s, rec.b_tok_s, confidence=float(sp.confidence), seed=rec.seed)
        except ValueError as exc:
            out.append(Check(setting, "speed", cls, MISSING, detail=str(exc), evidence=trace))
            continue
        ok = ci.low >= float(sp.min_ratio)
        a_mean, b_mean = sum(rec.a_tok_s) / len(rec.a_tok_s), sum(rec.b_tok_s) / len(rec.b_tok_s)
        out.append(
            Check(
                setting,
                "speed",
                cls,
                PASS if ok else FAIL,
                value=round(ci.low, 4),
                threshold=f"lower bound of the {sp.confidence:.0%} interval >= {sp.min_ratio}",
                detail=f"B/A tok/s {ci.ratio:.3f}, interval {ci.low:.3f} .. {ci.high:.3f} "
                f"({a_mean:.1f} -> {b_mean:.1f} tok/s)",
                evidence=trace,
            )
        )
    return out


def _replay_checks(ev: Evidence, cls: str, settings: list[str], stopped: set[str]) -> list[Check]:
    rec = ev.replay.get(cls)
    if rec is None:
        detail = STOPPED if replay_key(cls) in stopped else "not measured"
        return [Check(s, "replay", cls, MISSING, detail=detail) for s in settings]
    trace = _trace(rec, "replay")
    if rec.error:
        return [Check(s, "replay", cls, MISSING, detail=rec.error, evidence=trace) for s in settings]
    return [
        Check(
            s,
            "replay",
            cls,
            FAIL if rec.mismatches else PASS,
            value=f"{len(rec.mismatches)} mismatches in {rec.rows} trace rows",
            threshold="0",
            detail="; ".join(rec.mismatches[:5]),
            evidence=trace,
        )
        for s in settings
    ]


def _num(v: Any) -> str:
    return f"{v:.4f}" if isinstance(v, int | float) else "?"


def _finite(x: Any) -> TypeGuard[float]:
    """A number a bound can be checked against: a NaN compares false with every bound, an infinity makes
    a ratio vanish (an infinite base ppl lets any rise pass)."""
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def _quality_checks(ev: Evidence, setting: str, q: Quality, stopped: set[str]) -> list[Check]:
    qe = ev.quality
    if qe is None or qe.error:
        detail = qe.error if qe is not None and qe.error else STOPPED if QUALITY_KEY in stopped else "not measured"
        return [Check(setting, "quality", None, MISSING, detail=str(detail))]
    out = []
    trace = _trace(qe, "instruments")
    base, prop = qe.base, qe.proposed
    if q.max_ppl_increase is not None:
        pa, pb = base.get("ppl"), prop.get("ppl")
        if not _finite(pa) or not _finite(pb) or pa <= 0:
            out.append(
                Check(setting, "quality ppl", None, MISSING, detail="the run reported no finite ppl", evidence=trace)
            )
        else:
            rise = pb / pa - 1.0
            out.append(
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
        if not _finite(agree):
            out.append(
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
            out.append(
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
        if not _finite(aa) or not _finite(ab_):
            out.append(
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
            out.append(
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
    return out
