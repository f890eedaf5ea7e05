"""The lossy knobs (docs/policies.md): the gates cover their machinery, not their output.

G8a   drop at an inert threshold (1e-6) == the cached undropped stream, byte for byte
G8a'  that run examined routings at the terminal node and dropped none
G8b   drop at 1.0 with --drop-in-prefill against the evicting cache: completes, no signal, fired
G8c   top-k forced to 1: drop at 1.0 == the undropped k=1 run, byte for byte, nothing dropped
G8d   substitution at margin 1e-6 == the cached stream; slots examined, none changed but exact ties
G8e   substitution at margin 1.0 completes and fires
G8w   the narrow-routing warning: present once with F/k and F/8 computed here, exactly when the
      effective top-k is 4 or less; absent with dropping off and at top-k 8; once on stderr too

G8b and G8e also check the knobs' direction from the route traces: a dropped expert was a miss below
F/k and never the top-weighted one; a substituted expert was resident at the decision, and the
substituting run read no more from flash than the same run without it. (G8r, the drop rule replayed
from a trace, is retired: REPLAY in gates/test_replay.py replays every rule on every traced entry.)

Every run comes from the fixture's one batch (gates/plan.py); `stream-evict` is the cached
undropped reference. A run that dies on a signal is a failure of its gate, not an error."""

from __future__ import annotations

import re
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

import pytest

from bmoe_ci.gaterun.engine import EngineResult
from bmoe_ci.gaterun.runner import DeviceRunner
from bmoe_ci.replay import Trace
from gates.compare import (
    assert_identical,
    check,
    counters,
    drop_direction,
    require_ok,
    save,
    subst_direction,
    subst_untied,
)
from gates.plan import DROP, WARN_F, traced_drop, warn_single_argv

WARNING_MARK = "WARNING drop-cold-experts="
WARNING_RE = re.compile(
    r"^bmoe: WARNING drop-cold-experts=(\S+) with top-k (\d+): the threshold is (\d+\.\d)% of the routing "
    r"here, against (\d+\.\d)% at the top-k 8 this was measured on; "
)
DROP_LINE_RE = re.compile(r"^moe-drop: (\d+)/(\d+) routed experts dropped \((\d+\.\d)%\), threshold (\S+) x uniform$")
NARROW_TOPK = 4  # docs/design.md, engine: result and exit codes: warn when the effective top-k is this or less


def ok_or_fail(r: EngineResult, label: str, artifacts: Path) -> None:
    if not r.ok:
        save(artifacts, **{label: r})
        require_ok(r, label)


# -- dropping ----------------------------------------------------------------------------------------


@pytest.mark.gate("G8a")
@pytest.mark.entries("stream-evict", "drop-inert")
def test_inert_drop_is_byte_identical(runs: dict[str, EngineResult], artifacts: Path) -> None:
    assert_identical(runs["stream-evict"], runs["drop-inert"], "cached", "drop_1e-6", artifacts)


@pytest.mark.gate("G8a'")
@pytest.mark.entries(
    "drop-inert",
)
def test_inert_drop_examined_and_dropped_nothing(runs: dict[str, EngineResult], artifacts: Path) -> None:
    r = runs["drop-inert"]
    ok_or_fail(r, "drop_1e-6", artifacts)
    c = counters(r)
    check(c["experts_routed"] > 0, f"no routing was examined: {c}", artifacts, drop_inert=r)
    # the rule really ran at the learned terminal node (a policy that never ran would pass G8a too)
    check(
        c["weight_routed"] > 0, f"the drop rule examined no routing row (weight_routed 0): {c}", artifacts, drop_inert=r
    )
    check(
        c["experts_dropped"] == 0,
        f"an inert threshold dropped {c['experts_dropped']} of {c['experts_routed']} routed experts",
        artifacts,
        drop_inert=r,
    )


def traced(traces: dict[str, Trace | str], entry: str, artifacts: Path, r: EngineResult) -> Trace:
    t = traces.get(entry)
    if not isinstance(t, Trace):
        save(artifacts, **{entry: r})
        raise AssertionError(t or f"{entry}: the plan wrote no route trace")
    return t


def drop_entries(runs: dict[str, EngineResult]) -> list[str]:
    return [e for e, r in runs.items() if traced_drop(e, r.argv)]


@pytest.mark.gate("G8b")
@pytest.mark.entries("drop-full", where=traced_drop)
def test_full_drop_completes_and_fires(
    runs: dict[str, EngineResult], traces: dict[str, Trace | str], artifacts: Path
) -> None:
    # direction, on every traced dropping entry: only misses below F/k go, never the top-weighted one
    problems: list[str] = []
    for entry in drop_entries(runs):
        d = runs[entry]
        ok_or_fail(d, entry, artifacts)
        F = float(d.argv[d.argv.index(DROP) + 1])
        problems += drop_direction(entry, traced(traces, entry, artifacts, d), F)
    if problems:
        save(artifacts, **{e: runs[e] for e in drop_entries(runs)})
        raise AssertionError(f"{len(problems)} drop(s) the rule does not allow: " + "; ".join(problems[:12]))
    r = runs["drop-full"]
    ok_or_fail(r, "drop_1.0", artifacts)  # a signal here is the repointing failing: a gate failure
    c = counters(r)
    check(
        c["experts_dropped"] > 0,
        f"dropping at 1.0 against an evicting cache dropped nothing ({c['experts_routed']} routed): the gate "
        "would prove nothing about the repointing",
        artifacts,
        drop_full=r,
    )
    check(
        c["experts_dropped"] < c["experts_routed"] and c["cache_hits"] + c["cache_misses"] == c["experts_routed"],
        f"inconsistent counters: {c}",
        artifacts,
        drop_full=r,
    )


@pytest.mark.gate("G8c")
@pytest.mark.entries("k1-evict", "k1-drop")
def test_top1_drop_is_a_no_op(runs: dict[str, EngineResult], artifacts: Path) -> None:
    base, dropped = runs["k1-evict"], runs["k1-drop"]
    assert_identical(base, dropped, "k1", "k1_drop_1.0", artifacts)
    c = counters(dropped)
    check(dropped.data["model"]["top_k_effective"] == 1, "the run did not route at top-k 1", artifacts, k1_drop=dropped)
    check(
        c["experts_routed"] > 0 and c["weight_routed"] > 0,
        f"the drop rule examined no routing at top-k 1: {c}",
        artifacts,
        k1_drop=dropped,
    )
    check(
        c["experts_dropped"] == 0,
        f"at top-k 1 every routed expert is the top one, yet {c['experts_dropped']} were dropped",
        artifacts,
        k1_drop=dropped,
    )


# -- substitution ------------------------------------------------------------------------------------


@pytest.mark.gate("G8d")
@pytest.mark.entries("stream-evict", "subst-inert")
def test_inert_substitution_is_byte_identical(
    runs: dict[str, EngineResult], traces: dict[str, Trace | str], artifacts: Path
) -> None:
    ref, sub = runs["stream-evict"], runs["subst-inert"]
    ok_or_fail(sub, "subst_1e-6", artifacts)
    c = counters(sub)
    check(c["subst_examined"] > 0, f"substitution examined no slot: {c}", artifacts, subst_inert=sub)
    # A margin of 1e-6 is below every real gap between two scores, but not below a gap of zero: where
    # the router scores two experts exactly alike (qwen3moe-tied's tied router rows), it may pick the
    # resident one. Every change must be such a tie; with none, the bytes must not move.
    untied = subst_untied("subst-inert", traced(traces, "subst-inert", artifacts, sub))
    check(
        not untied,
        f"a margin of 1e-6 changed {c['subst_changed']} of {c['subst_examined']} slots, "
        f"{len(untied)} without an exact tie (a re-ordering of the router's own set is not a substitution): "
        + "; ".join(untied[:8]),
        artifacts,
        subst_inert=sub,
    )
    if c["subst_changed"] == 0:
        assert_identical(ref, sub, "cached", "subst_1e-6", artifacts)


@pytest.mark.gate("G8e")
@pytest.mark.entries("subst-full", "stream-evict")
def test_full_substitution_fires(
    runs: dict[str, EngineResult], traces: dict[str, Trace | str], artifacts: Path
) -> None:
    r = runs["subst-full"]
    ok_or_fail(r, "subst_1.0", artifacts)
    c = counters(r)
    check(
        0 < c["subst_changed"] <= c["subst_examined"],
        f"substitution at margin 1.0 changed {c['subst_changed']} of {c['subst_examined']} slots: the knob is inert",
        artifacts,
        subst_full=r,
    )
    # direction: only resident experts come in, so the run reads no more than the same run without it
    bad = subst_direction("subst-full", traced(traces, "subst-full", artifacts, r))
    check(not bad, f"{len(bad)} substitution(s) toward a miss: " + "; ".join(bad[:12]), artifacts, subst_full=r)
    base = runs["stream-evict"]
    ok_or_fail(base, "stream-evict", artifacts)
    check(
        c["flash_bytes"] <= counters(base)["flash_bytes"],
        f"substitution read more from flash than the same run without it: flash_bytes {c['flash_bytes']} "
        f"against {counters(base)['flash_bytes']}",
        artifacts,
        subst_full=r,
        stream_evict=base,
    )


# -- the narrow-routing warning ----------------------------------------------------------------------


def share(F: str, k: int) -> str:
    """100·F/k with one decimal, rounded half away from zero (docs/policies.md), computed here."""
    return str((Decimal(F) * 100 / Decimal(k)).quantize(Decimal("0.1"), rounding=ROUND_HALF_UP))


def narrow_warnings(lines: list[str]) -> list[str]:
    return [w for w in lines if WARNING_MARK in w]


def expect_warning(found: list[str], F: str, k: int, where: str) -> str | None:
    """None when `found` (the narrow-routing warnings of one run) is right for F at effective top-k k."""
    if k > NARROW_TOPK:
        return None if not found else f"{where}: warned at top-k {k}: {found}"
    if len(found) != 1:
        return f"{where}: expected the warning exactly once at top-k {k}, found {len(found)}: {found}"
    m = WARNING_RE.match(found[0])
    if not m:
        return f"{where}: the warning does not have the documented shape: {found[0]!r}"
    want = (F, str(k), share(F, k), share(F, 8))
    if float(m.group(1)) != float(F) or m.groups()[1:] != want[1:]:
        return f"{where}: expected F={F}, top-k {k}, {want[2]}% here against {want[3]}% at top-k 8; got {m.groups()}"
    return None


@pytest.mark.gate("G8w")
@pytest.mark.entries("drop-warn", "drop-warn-k4", "stream-evict")
def test_narrow_routing_warning(
    runs: dict[str, EngineResult], runner: DeviceRunner, model: str, artifacts: Path
) -> None:
    problems: list[str] = []
    for label in ("drop-warn", "drop-warn-k4"):
        r = runs[label]
        ok_or_fail(r, label, artifacts)
        k = r.data["model"]["top_k_effective"]
        if (p := expect_warning(narrow_warnings(r.data["warnings"]), WARN_F, k, label)) is not None:
            problems.append(p)
    # dropping off: never
    off = runs["stream-evict"]
    ok_or_fail(off, "stream-evict", artifacts)
    if narrow_warnings(off.data["warnings"]):
        problems.append(f"stream-evict: warned with dropping off: {off.data['warnings']}")
    # a single process prints it to stderr, once, at load (and the JSON carries the same text)
    single = runner.single(warn_single_argv(model))
    ok_or_fail(single, "single", artifacts)
    k = single.data["model"]["top_k_effective"]
    lines = single.stderr.splitlines()
    if (p := expect_warning(narrow_warnings(lines), WARN_F, k, "single-process stderr")) is not None:
        problems.append(p)
    elif narrow_warnings(lines) != narrow_warnings(single.data["warnings"]):
        problems.append(f"stderr and the JSON disagree: {narrow_warnings(lines)} vs {single.data['warnings']}")
    drop_lines = [ln for ln in lines if ln.startswith("moe-drop:")]
    if len(drop_lines) != 1 or not DROP_LINE_RE.match(drop_lines[0]):
        problems.append(f"single-process stderr: expected one moe-drop line, got {drop_lines}")
    if problems:
        save(artifacts, drop_warn=runs["drop-warn"], drop_warn_k4=runs["drop-warn-k4"], single=single)
        raise AssertionError("; ".join(problems) + f" (artifacts in {artifacts})")
