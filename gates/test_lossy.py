"""The lossy knobs (DESIGN 3.5, docs/policies.md): the gates cover their machinery, not their output.

G8a   drop at an inert threshold (1e-6) == the cached undropped stream, byte for byte
G8a'  that run examined routings at the terminal node and dropped none
G8b   drop at 1.0 with --drop-in-prefill against the evicting cache: completes, no signal, fired
G8c   top-k forced to 1: drop at 1.0 == the undropped k=1 run, byte for byte, nothing dropped
G8d   substitution at margin 1e-6 == the cached stream; slots examined, none changed
G8e   substitution at margin 1.0 completes and fires
G8w   the narrow-routing warning: present once with F/k and F/8 computed here, exactly when the
      effective top-k is 4 or less; absent with dropping off and at top-k 8; once on stderr too
G8r   the drop rule replayed from the route trace of a run at an effective top-k one above the
      model's (--drop-no-renorm, so the trace's weights are the router's)

Every run comes from the fixture's one batch (gates/plan.py); `stream-evict` is the cached
undropped reference. A run that dies on a signal is a failure of its gate, not an error."""

from __future__ import annotations

import csv
import io
import re
from collections import defaultdict
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

import pytest

from bmoe_ci.plugin.runner import DeviceRunner, EngineResult
from gates.compare import assert_identical, check, counters, require_ok, save
from gates.plan import WARN_F, warn_single_argv

WARNING_MARK = "WARNING drop-cold-experts="
WARNING_RE = re.compile(
    r"^bmoe: WARNING drop-cold-experts=(\S+) with top-k (\d+): the threshold is (\d+\.\d)% of the routing "
    r"here, against (\d+\.\d)% at the top-k 8 this was measured on; "
)
DROP_LINE_RE = re.compile(r"^moe-drop: (\d+)/(\d+) routed experts dropped \((\d+\.\d)%\), threshold (\S+) x uniform$")
NARROW_TOPK = 4  # DESIGN 3.2: warn when the effective top-k is this or less


def ok_or_fail(r: EngineResult, label: str, artifacts: Path) -> None:
    if not r.ok:
        save(artifacts, **{label: r})
        require_ok(r, label)


# -- dropping ----------------------------------------------------------------------------------------


@pytest.mark.gate("G8a")
def test_inert_drop_is_byte_identical(runs: dict[str, EngineResult], artifacts: Path) -> None:
    assert_identical(runs["stream-evict"], runs["drop-inert"], "cached", "drop_1e-6", artifacts)


@pytest.mark.gate("G8a'")
def test_inert_drop_examined_and_dropped_nothing(runs: dict[str, EngineResult], artifacts: Path) -> None:
    r = runs["drop-inert"]
    ok_or_fail(r, "drop_1e-6", artifacts)
    c = counters(r)
    check(c["experts_routed"] > 0, f"no routing was examined: {c}", artifacts, drop_inert=r)
    # the rule really ran at the learned terminal node (a policy that never ran would pass G8a too)
    check(c["weight_routed"] > 0, f"the drop rule examined no routing row (weight_routed 0): {c}", artifacts,
          drop_inert=r)
    check(c["experts_dropped"] == 0,
          f"an inert threshold dropped {c['experts_dropped']} of {c['experts_routed']} routed experts", artifacts,
          drop_inert=r)


@pytest.mark.gate("G8b")
def test_full_drop_completes_and_fires(runs: dict[str, EngineResult], artifacts: Path) -> None:
    r = runs["drop-full"]
    ok_or_fail(r, "drop_1.0", artifacts)  # a signal here is the repointing failing: a gate failure
    c = counters(r)
    check(c["experts_dropped"] > 0,
          f"dropping at 1.0 against an evicting cache dropped nothing ({c['experts_routed']} routed): the gate "
          "would prove nothing about the repointing", artifacts, drop_full=r)
    check(c["experts_dropped"] < c["experts_routed"] and c["cache_hits"] + c["cache_misses"] == c["experts_routed"],
          f"inconsistent counters: {c}", artifacts, drop_full=r)


@pytest.mark.gate("G8c")
def test_top1_drop_is_a_no_op(runs: dict[str, EngineResult], artifacts: Path) -> None:
    base, dropped = runs["k1-evict"], runs["k1-drop"]
    assert_identical(base, dropped, "k1", "k1_drop_1.0", artifacts)
    c = counters(dropped)
    check(dropped.data["model"]["top_k_effective"] == 1, "the run did not route at top-k 1", artifacts,
          k1_drop=dropped)
    check(c["experts_routed"] > 0 and c["weight_routed"] > 0,
          f"the drop rule examined no routing at top-k 1: {c}", artifacts, k1_drop=dropped)
    check(c["experts_dropped"] == 0, f"at top-k 1 every routed expert is the top one, yet "
          f"{c['experts_dropped']} were dropped", artifacts, k1_drop=dropped)


# -- substitution ------------------------------------------------------------------------------------


@pytest.mark.gate("G8d")
def test_inert_substitution_is_byte_identical(runs: dict[str, EngineResult], artifacts: Path) -> None:
    ref, sub = runs["stream-evict"], runs["subst-inert"]
    assert_identical(ref, sub, "cached", "subst_1e-6", artifacts)
    c = counters(sub)
    check(c["subst_examined"] > 0, f"substitution examined no slot: {c}", artifacts, subst_inert=sub)
    check(c["subst_changed"] == 0,
          f"a margin of 1e-6 changed {c['subst_changed']} of {c['subst_examined']} slots (a re-ordering of the "
          "router's own set is not a substitution)", artifacts, subst_inert=sub)


@pytest.mark.gate("G8e")
def test_full_substitution_fires(runs: dict[str, EngineResult], artifacts: Path) -> None:
    r = runs["subst-full"]
    ok_or_fail(r, "subst_1.0", artifacts)
    c = counters(r)
    check(0 < c["subst_changed"] <= c["subst_examined"],
          f"substitution at margin 1.0 changed {c['subst_changed']} of {c['subst_examined']} slots: the knob "
          "is inert", artifacts, subst_full=r)


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
        return (f"{where}: expected F={F}, top-k {k}, {want[2]}% here against {want[3]}% at top-k 8; "
                f"got {m.groups()}")
    return None


@pytest.mark.gate("G8w")
def test_narrow_routing_warning(runs: dict[str, EngineResult], runner: DeviceRunner, model: str,
                                artifacts: Path) -> None:
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


# -- replay of the drop rule -------------------------------------------------------------------------


def parse_trace(text: str) -> tuple[dict[str, str], list[dict[str, float]]]:
    lines = text.splitlines()
    if not lines or lines[0] != "# route_trace v1":
        raise AssertionError("the route trace does not start with '# route_trace v1'")
    meta: dict[str, str] = {}
    i = 1
    while i < len(lines) and lines[i].startswith("# "):
        body = lines[i][2:]
        if not body.startswith("layer=") and "=" in body:
            key, value = body.split("=", 1)
            meta[key] = value
        i += 1
    reader = csv.DictReader(io.StringIO("\n".join(lines[i:]) + "\n"))
    rows = [{key: float(v) if key == "weight" else int(v) for key, v in r.items()} for r in reader]
    return meta, rows


def replay(rows: list[dict[str, float]], F: float, k: int, mass: float = 1.0) -> tuple[list[str], int, float]:
    """The drop rule checked row by row; `mass` is what a routing's weights sum to before any drop
    (normalised gating: its scale). Returns (violations, dropped slots, dropped mass in decode)."""
    thr = F / k
    routings: dict[tuple[int, int, int], list[dict[str, float]]] = defaultdict(list)
    for r in rows:
        routings[(int(r["phase"]), int(r["step"]), int(r["layer"]))].append(r)
    bad: list[str] = []
    n_dropped, mass_dropped = 0, 0.0
    for (phase, step, layer), slots in routings.items():
        where = f"phase {phase} step {step} layer {layer}"
        if len(slots) != k:
            bad.append(f"{where}: {len(slots)} slots, expected {k}")
            continue
        dropped = [s for s in slots if s["dropped"]]
        n_dropped += len(dropped)
        if phase == 0:
            # the prompt is each layer's first pass: an unseen shape loads at topk, undropped
            if dropped:
                bad.append(f"{where}: {len(dropped)} slots dropped on the layer's first pass "
                           "(its shape is not learned yet)")
            continue
        top = max(slots, key=lambda s: (s["weight"], -s["slot"]))  # the first maximum in rank order
        for s in dropped:
            if s["residency"] != 0:
                bad.append(f"{where} slot {s['slot']}: a resident expert (residency {s['residency']}) was dropped")
            if s["expert_bytes"] != 0 or s["weight"] != 0.0:
                bad.append(f"{where} slot {s['slot']}: dropped, but read {s['expert_bytes']} bytes and weighs "
                           f"{s['weight']}")
        if len(dropped) == k or top["dropped"]:
            bad.append(f"{where}: the top-weighted slot was dropped")
        # --drop-no-renorm: survivors keep the router's weights, and the router's row weighs `mass`
        gone = mass - sum(s["weight"] for s in slots)
        mass_dropped += gone
        if dropped and not gone < len(dropped) * thr + 1e-6:
            bad.append(f"{where}: {len(dropped)} slot(s) dropped carrying {gone:.6f} of the routing, not below "
                       f"{len(dropped)} x F/k = {len(dropped) * thr:.6f}")
        for s in slots:
            if s is not top and not s["dropped"] and s["residency"] == 0 and not s["weight"] >= thr:
                bad.append(f"{where} slot {s['slot']}: a miss weighing {s['weight']!r} < F/k = {thr!r} was kept")
    return bad, n_dropped, mass_dropped


@pytest.mark.gate("G8r")
def test_drop_rule_replayed_from_the_trace(runs: dict[str, EngineResult], runner: DeviceRunner, fixture: str,
                                           artifacts: Path) -> None:
    if "drop-replay" not in runs:
        pytest.skip(f"no route-trace replay planned for {fixture} (its top-k is not in fixtures.yaml)")
    r = runs["drop-replay"]
    gating = (runs["ref"].data.get("model") or r.data.get("model") or {}).get("gating") or {}
    if not gating.get("norm"):
        pytest.skip(f"{fixture}: routing weights are not normalised (gating {gating}): a routing's mass before the "
                    "drop is unknown, so the dropped mass cannot be read back from the trace")
    ok_or_fail(r, "drop_replay", artifacts)
    argv = list(r.argv)
    remote = argv[argv.index("--route-trace") + 1]
    k = r.data["model"]["top_k_effective"]
    local = runner.session.pull(remote, artifacts / "route_trace.csv")  # stays inside the results directory
    meta, rows = parse_trace(local.read_text())
    c = counters(r)
    problems: list[str] = []
    if int(meta.get("top_k", -1)) != k or k != r.data["model"]["top_k"] + 1:
        problems.append(f"the run's effective top-k is {k} (trace {meta.get('top_k')}), expected the model's + 1")
    bad, n_dropped, mass = replay(rows, 1.0, k, float(gating.get("scale", 1.0)))
    problems += bad[:20]
    if n_dropped != c["experts_dropped"]:
        problems.append(f"the trace marks {n_dropped} slots dropped, the counter says {c['experts_dropped']}")
    if c["experts_dropped"] == 0:
        problems.append("nothing was dropped: the replay would prove nothing")
    if abs(mass - c["weight_dropped"]) > 1e-4:
        problems.append(f"dropped mass from the trace {mass:.6f} != weight_dropped {c['weight_dropped']:.6f}")
    if problems:
        save(artifacts, drop_replay=r)
        raise AssertionError(f"{len(bad)} rule violation(s); " + "; ".join(problems[:12])
                             + f" (artifacts in {artifacts})")
    local.unlink()  # artifacts are kept for failures only
    for d in (local.parent, local.parent.parent):  # the test's directory, then artifacts/ if now empty
        if d.is_dir() and not any(d.iterdir()):
            d.rmdir()
