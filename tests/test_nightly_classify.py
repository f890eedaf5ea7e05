"""Classification against earlier runs: every class, its boundaries, and cross-device agreement over
time. Pure functions over history rows: no engine, no farm."""

from __future__ import annotations

import pytest

from bmoe_ci.nightly.classify import (
    FlakyPolicy,
    changed_archs,
    classify,
    disagreements_from_outputs,
    disagreements_from_summary,
    is_flaky,
    output_changes,
)
from bmoe_ci.nightly.history import DeviceRow, OutputRow, ResultRow


def row(
    run: str,
    outcome: str,
    *,
    device: str = "pixel8",
    gate: str = "G1",
    fixture: str = "qwen3moe",
    build: str = "b1",
    name: str | None = None,
) -> ResultRow:
    return ResultRow(
        run=run,
        started=run,
        device=device,
        arch="aarch64",
        gate=gate,
        fixture=fixture,
        name=name or f"{gate}[{fixture}]",
        outcome=outcome,
        message=f"{outcome} msg",
        engine_build_id=build,
    )


def dev(run: str, device: str = "pixel8", *, reached: bool = True, in_pool: bool = True) -> DeviceRow:
    return DeviceRow(
        run=run,
        device=device,
        arch="aarch64",
        in_pool=in_pool,
        reached=reached,
        infra_error=None if reached else "ssh: connection refused",
        engine_build_id="b1",
        engine_s=1.0,
        wall_s=2.0,
        facts={},
    )


def one(
    previous: list[str], tonight: str, builds: list[str] | None = None, policy: FlakyPolicy | None = None
) -> dict[str, list[str]]:
    """Classify one test whose earlier outcomes are *previous* (oldest first); returns the non-empty
    classes with the test's extra info."""
    builds = builds or ["b1"] * (len(previous) + 1)
    past = [row(f"r{i}", o, build=builds[i]) for i, o in enumerate(previous)]
    now = row("now", tonight, build=builds[-1])
    c = classify([now], past, [dev("now")], {}, policy)
    out = {}
    for key in ("new_failures", "still_failing", "fixed", "flaky", "new_errors", "devices_missing"):
        items = getattr(c, key)
        if items:
            out[key] = [getattr(i, "since", None) or "" for i in items]
    return out


@pytest.mark.parametrize(
    ("previous", "tonight", "expected"),
    [
        ([], "pass", {}),
        ([], "fail", {"new_failures": [""]}),  # a test that never ran before and fails is new
        (["pass"], "fail", {"new_failures": [""]}),
        (["skip"], "fail", {"new_failures": [""]}),
        (["error"], "fail", {"new_failures": [""]}),  # the error hid it; it is a new failure
        (["pass"], "pass", {}),
        (["fail"], "pass", {"fixed": [""]}),
        (["error"], "pass", {}),  # recovered from infrastructure: nothing to fix in the engine
        (["fail"], "skip", {}),
        (["pass"], "error", {"new_errors": [""]}),
        ([], "error", {"new_errors": [""]}),
        (["error"], "error", {}),  # not new
        (["fail"], "error", {"new_errors": [""]}),
    ],
)
def test_each_class_against_the_last_run(previous: list[str], tonight: str, expected: dict[str, list[str]]) -> None:
    # Engine build changes every run: no flakiness by construction.
    builds = [f"b{i}" for i in range(len(previous) + 1)]
    assert one(previous, tonight, builds) == expected


def test_still_failing_reports_the_first_run_of_the_unbroken_streak() -> None:
    builds = ["b0", "b1", "b2", "b3", "b4"]
    assert one(["fail", "pass", "fail", "fail"], "fail", builds) == {"still_failing": ["r2"]}
    assert one(["fail"], "fail", ["b0", "b1"]) == {"still_failing": ["r0"]}


def test_flaky_same_build_both_outcomes() -> None:
    # pass then fail with the same engine build: flaky, not a new failure.
    assert one(["pass"], "fail") == {"flaky": [""]}
    # fail then pass with the same build: flaky, not fixed.
    assert one(["fail"], "pass") == {"flaky": [""]}


def test_fault_night_and_back_is_new_then_fixed_not_flaky() -> None:
    # clean (b1), fault (b2), clean again (b1): build b1 only ever passed, b2 only failed.
    assert one(["pass"], "fail", ["b1", "b2"]) == {"new_failures": [""]}
    assert one(["pass", "fail"], "pass", ["b1", "b2", "b1"]) == {"fixed": [""]}


def test_flaky_window_forgets_old_runs() -> None:
    policy = FlakyPolicy(window=2, flips=3)
    # The same-build pass is three runs back: outside a window of 2 (tonight + one before).
    builds = ["b1", "b2", "b3", "b1"]
    assert one(["pass", "pass", "pass"], "fail", builds, policy) == {"new_failures": [""]}
    assert one(["pass", "pass", "pass"], "fail", builds, FlakyPolicy(window=4, flips=3)) == {"flaky": [""]}


def test_errors_and_skips_do_not_count_for_flakiness() -> None:
    assert one(["error", "skip"], "fail") == {"new_failures": [""]}


def test_alternation_counts_flips_within_one_build_only() -> None:
    history = [
        row(f"r{i}", o, build=b)
        for i, (o, b) in enumerate([("pass", "a"), ("fail", "b"), ("pass", "c"), ("fail", "d")])
    ]
    assert not is_flaky(history, FlakyPolicy(window=10, flips=1))
    # Make two consecutive runs share a build: that flip counts.
    history[1] = row("r1", "fail", build="a")
    assert is_flaky(history, FlakyPolicy(window=10, flips=1))


def test_flips_threshold() -> None:
    # Same-build rule off (each build once except the alternating pair), flips counted.
    history = [row("r0", "pass", build="a"), row("r1", "fail", build="a")]
    assert is_flaky(history, FlakyPolicy(window=10, flips=1))
    assert is_flaky(history, FlakyPolicy(window=10, flips=5))  # same build, both outcomes
    history = [row("r0", "pass", build="a"), row("r1", "pass", build="a")]
    assert not is_flaky(history, FlakyPolicy(window=10, flips=1))


def test_flaky_policy_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        FlakyPolicy(window=1)
    with pytest.raises(ValueError):
        FlakyPolicy(flips=0)


def test_tests_of_one_gate_and_fixture_are_classified_one_by_one() -> None:
    past = [row("r0", "pass", gate="DET", name="DET-a[q]"), row("r0", "pass", gate="DET", name="DET-b[q]")]
    now = [
        row("r1", "fail", gate="DET", name="DET-a[q]", build="b2"),
        row("r1", "pass", gate="DET", name="DET-b[q]", build="b2"),
    ]
    c = classify(now, past, [dev("r1")], {})
    assert [f.name for f in c.new_failures] == ["DET-a[q]"] and not c.flaky and not c.fixed


def test_devices_are_independent() -> None:
    past = [row("r0", "fail", device="a"), row("r0", "pass", device="b")]
    now = [row("r1", "fail", device="a", build="b2"), row("r1", "fail", device="b", build="b2")]
    c = classify(now, past, [dev("r1", "a"), dev("r1", "b")], {})
    assert [f.device for f in c.still_failing] == ["a"]
    assert [f.device for f in c.new_failures] == ["b"]


def test_device_missing_with_since_and_its_infra_error_is_a_new_error() -> None:
    infra = row("r2", "error", gate="INFRA", fixture="", name="infrastructure")
    previous = {"r0": [dev("r0")], "r1": [dev("r1", reached=False)]}
    c = classify([infra], [], [dev("r2", reached=False)], previous)
    assert [(m.device, m.since, m.reason) for m in c.devices_missing] == [("pixel8", "r1", "ssh: connection refused")]
    assert [f.gate for f in c.new_errors] == ["INFRA"]
    assert not c.new_failures
    # Reached last time: missing since tonight.
    c = classify([infra], [], [dev("r2", reached=False)], {"r0": [dev("r0")], "r1": [dev("r1")]})
    assert c.devices_missing[0].since == "r2"


def test_a_device_outside_the_pool_or_reached_is_not_missing() -> None:
    c = classify([], [], [dev("r", "a", reached=False, in_pool=False), dev("r", "b")], {})
    assert c.devices_missing == []


def out(
    run: str, device: str, sha: str, *, arch: str = "aarch64", build: str = "b1", fixture: str = "qwen3moe"
) -> OutputRow:
    return OutputRow(
        run=run, device=device, arch=arch, fixture=fixture, entry="greedy", sha256=sha, engine_build_id=build
    )


def test_disagreement_from_outputs_names_the_minority() -> None:
    rows = [out("r", "a", "x"), out("r", "b", "x"), out("r", "c", "y"), out("r", "d", "x", fixture="gemma4")]
    found = disagreements_from_outputs(rows)
    assert len(found) == 1
    d = found[0]
    assert (d.fixture, d.entry, d.minority) == ("qwen3moe", "greedy", ["c"])
    assert d.values == {"a": "x", "b": "x", "c": "y"}
    assert disagreements_from_outputs([out("r", "a", "x"), out("r", "b", "x")]) == []


def test_disagreement_tie_puts_all_but_one_group_in_the_minority() -> None:
    found = disagreements_from_outputs([out("r", "a", "x"), out("r", "b", "y")])
    assert found[0].minority == ["b"]


def test_summary_disagreements_are_used_when_present() -> None:
    assert disagreements_from_summary({"outputs": {}}) is None
    got = disagreements_from_summary(
        {
            "disagreements": [
                {"fixture": "f", "entry": "e", "field": "logits", "values": {"a": "1", "b": "2"}, "minority": ["b"]}
            ]
        }
    )
    assert got is not None and got[0].minority == ["b"] and got[0].field == "logits"


def test_output_change_with_and_without_an_engine_build_change() -> None:
    previous = [out("r0", "phone", "old", build="b1"), out("r0", "desk", "same", arch="x86_64", build="d1")]
    tonight = [out("r1", "phone", "new", build="b1"), out("r1", "desk", "same2", arch="x86_64", build="d2")]
    changes = output_changes(tonight, previous)
    by_device = {c.device: c for c in changes}
    assert not by_device["phone"].build_changed  # same build, new bytes: device or toolchain
    assert by_device["desk"].build_changed
    assert changed_archs(changes) == {
        "aarch64": {"expected": [], "unexpected": ["qwen3moe/greedy"]},
        "x86_64": {"expected": ["qwen3moe/greedy"], "unexpected": []},
    }
    # The most recent earlier output is the reference, not the oldest.
    assert output_changes([out("r2", "phone", "new")], [*previous, *tonight]) == []


def test_a_device_not_reached_has_one_new_error_not_one_per_test() -> None:
    tonight = [
        row("r1", "error", gate="INFRA", fixture="", name="infrastructure"),
        row("r1", "error", gate="G1"),
        row("r1", "error", device="alive", gate="G1"),
    ]
    c = classify(tonight, [], [dev("r1", reached=False), dev("r1", "alive")], {})
    assert sorted((f.device, f.gate) for f in c.new_errors) == [("alive", "G1"), ("pixel8", "INFRA")]
