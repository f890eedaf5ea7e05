"""The release gate's evidence and verdict without devices: the pure judge on hand-made evidence,
gathering with fake instruments (the order and the early stop), the evidence file and ``--rejudge``,
fixture matching of history rows, and the single source of engine flags."""

from __future__ import annotations

import builtins
import json
import re
import socket
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from bmoe_ci.cli import main
from bmoe_ci.nightly.history import History, run_record
from bmoe_ci.release.evidence import (
    EVIDENCE_JSON,
    Evidence,
    GateRecord,
    QualityRecord,
    Refusal,
    ReplayRecord,
    SpeedRecord,
    load_evidence,
    save_evidence,
)
from bmoe_ci.release.gate import flag_sets
from bmoe_ci.release.gather import PoolDevice, gather
from bmoe_ci.release.judge import judge
from bmoe_ci.release.measure import gates_from_history
from bmoe_ci.release.policy import PolicyFile, parse_policy
from bmoe_ci.release.settings import Settings, flags
from bmoe_ci.reports.records import DeviceRun, RunMeta, TestRecord

REPO = Path(__file__).resolve().parents[1]
POLICY = parse_policy((REPO / "ci" / "release-policy.yaml").read_text(), "policy.yaml").model
BASE = Settings(cache_mb=2048, drop_cold_experts=0.75, expert_substitute=None, prefetch=1)
DROP1 = BASE.model_copy(update={"drop_cold_experts": 1.0})
GATES = POLICY.settings["drop_cold_experts"].gates
FIX = POLICY.evaluation.speed_fixture
POOL = [PoolDevice("host", "desktop", "x86_64"), PoolDevice("phone", "phone", "aarch64")]


def policy_with(**evaluation: Any) -> PolicyFile:
    return POLICY.model_copy(update={"evaluation": POLICY.evaluation.model_copy(update=evaluation)})


def empty(proposal: Settings = DROP1) -> Evidence:
    return Evidence(
        run="rel-1",
        started="2026-12-02T10:00:00+0000",
        base=BASE,
        base_source="HEAD:ci/app-defaults.yaml",
        proposal=proposal,
        proposal_source="p.yaml",
        policy=POLICY,
        policy_source="policy.yaml",
        fixture=FIX,
        quality_fixture=POLICY.evaluation.quality_fixture,
        pool="release",
        flags=flag_sets(BASE, proposal, POLICY.evaluation.cache_scale),
    )


def gate_rec(device: str, outcome: str = "pass", source: str = "history", fixture: str = FIX) -> GateRecord:
    return GateRecord(
        device=device,
        run=f"n-{device}",
        build_id="b1",
        source=source,  # type: ignore[arg-type]
        fixtures=(fixture,),
        started="2026-12-02T01:00:00+0000",
        gates={g: outcome for g in GATES},
    )


def speed_rec(cls: str, device: str, faster: float = 2.0) -> SpeedRecord:
    return SpeedRecord(
        device_class=cls,
        device=device,
        run=f"ab-{device}",
        build_id="b1",
        fixture=FIX,
        verdict="measured",
        a_tok_s=(100.0, 101.0, 99.0, 100.5),
        b_tok_s=tuple(x * faster for x in (100.0, 101.0, 99.0, 100.5)),
        seed=7,
    )


def replay_rec(device: str, mismatches: tuple[str, ...] = ()) -> ReplayRecord:
    return ReplayRecord(device=device, run="rel-1", build_id="b1", fixture=FIX, mismatches=mismatches, rows=100)


def quality_rec(ppl_b: float = 7.4) -> QualityRecord:
    return QualityRecord(
        device="host",
        run="rel-1",
        build_id="b1",
        fixture=POLICY.evaluation.quality_fixture,
        base={"ppl": 7.39, "ref_agreement": 0.915, "accuracy": 0.7},
        proposed={"ppl": ppl_b, "ref_agreement": 0.9, "accuracy": 0.7},
    )


def complete(**over: Any) -> Evidence:
    """Evidence for dropping at 1.0 on both classes, everything passing unless ``over`` says otherwise."""
    fields: dict[str, Any] = {
        "classes": {"desktop-x86_64": ("host",), "phone-aarch64": ("phone",)},
        "reached": ("host", "phone"),
        "gates": {"host": gate_rec("host"), "phone": gate_rec("phone")},
        "speed": {
            "desktop-x86_64": speed_rec("desktop-x86_64", "host"),
            "phone-aarch64": speed_rec("phone-aarch64", "phone"),
        },
        "replay": {"desktop-x86_64": replay_rec("host"), "phone-aarch64": replay_rec("phone")},
        "quality": quality_rec(),
    }
    fields.update(over)
    return empty().model_copy(update=fields)


# ---------------------------------------------------------------------------------------------- judge


def test_the_judge_says_go_on_passing_evidence_and_no_go_on_a_failed_gate() -> None:
    v = judge(complete(), POLICY, DROP1)
    assert (v.verdict, v.exit_code) == ("GO", 0) and all(c.status == "pass" for c in v.checks)
    assert len([c for c in v.checks if c.requirement.startswith("gate ")]) == 2 * len(GATES)
    bad = complete(gates={"host": gate_rec("host"), "phone": gate_rec("phone", "fail")})
    v = judge(bad, POLICY, DROP1)
    assert (v.verdict, v.exit_code) == ("NO-GO", 1)
    assert v.reason.startswith("drop_cold_experts: gate DET on phone-aarch64: fail") and "[run n-phone" in v.reason


@pytest.mark.parametrize(
    "over,failed",
    [
        ({"speed": {"desktop-x86_64": speed_rec("desktop-x86_64", "host", 0.5)}}, "speed"),
        ({"replay": {"desktop-x86_64": replay_rec("host", ("row 3: hit expected, miss seen",))}}, "replay"),
        ({"quality": quality_rec(ppl_b=9.0)}, "quality ppl"),
    ],
)
def test_each_measured_requirement_can_fail(over: dict[str, Any], failed: str) -> None:
    ev = complete()
    for key, value in over.items():
        over[key] = {**getattr(ev, key), **value} if isinstance(value, dict) else value
    v = judge(ev.model_copy(update=over), POLICY, DROP1)
    assert v.verdict == "NO-GO" and [c.requirement for c in v.checks if c.status == "fail"] == [failed]


def test_missing_evidence_is_no_verdict_and_a_failure_outranks_it() -> None:
    v = judge(complete(speed={}), POLICY, DROP1)
    assert v.verdict == "NO VERDICT" and "speed on desktop-x86_64 - not measured" in v.reason
    v = judge(complete(reached=("host",), unreachable={"phone": "connect refused"}), POLICY, DROP1)
    assert v.verdict == "NO VERDICT" and "no reachable device: phone: connect refused" in v.reason
    v = judge(complete(speed={}, quality=quality_rec(ppl_b=9.0)), POLICY, DROP1)
    assert v.verdict == "NO-GO"


def test_the_judge_is_pure(monkeypatch: pytest.MonkeyPatch) -> None:
    ev = complete(gates={"host": gate_rec("host"), "phone": gate_rec("phone", "fail")})
    first = judge(ev, POLICY, DROP1)

    def forbidden(*_: Any, **__: Any) -> Any:
        raise AssertionError("the judge touched the outside world")

    for target, name in ((builtins, "open"), (time, "time"), (time, "strftime"), (socket, "socket")):
        monkeypatch.setattr(target, name, forbidden)
    again = judge(ev, POLICY, DROP1)
    assert again == first and judge(ev, POLICY, DROP1) == first


def test_evidence_on_another_fixture_is_refused_with_one_line_naming_both() -> None:
    v = judge(complete(), policy_with(speed_fixture="qwen3moe"), DROP1)
    assert (v.verdict, v.exit_code, v.refused, v.checks) == ("NO VERDICT", 3, True, ())
    assert "\n" not in v.reason and f"fixture {FIX}" in v.reason and "fixture is qwen3moe" in v.reason
    # one gate record on another fixture (the file was edited, or gathered by an older bmoe-ci)
    ev = complete(gates={"host": gate_rec("host"), "phone": gate_rec("phone", fixture="qwen3moe")})
    v = judge(ev, POLICY, DROP1)
    assert v.verdict == "NO VERDICT"
    assert f"gate results of run n-phone on phone are for fixture qwen3moe, the policy's fixture is {FIX}" in v.reason


def test_evidence_for_another_proposal_is_refused() -> None:
    v = judge(complete(), POLICY, DROP1.model_copy(update={"prefetch": 2}))
    assert v.verdict == "NO VERDICT" and v.refused and "another proposal" in v.reason


# -------------------------------------------------------------------------------------------- gather


class Fake:
    """Instruments that measure nothing: canned records, and a log of what was asked."""

    def __init__(self, history: dict[str, GateRecord], run: dict[str, GateRecord] | None = None, speed: float = 2.0):
        self.history, self.run, self.faster = history, run or {}, speed
        self.calls: list[str] = []

    def build_id(self, device: str) -> tuple[str, str]:
        return ("aarch64-linux-musl" if device == "phone" else "x86_64-linux-musl"), "b1"

    def history_gates(
        self, devices: Sequence[str], builds: dict[str, str]
    ) -> tuple[dict[str, GateRecord], list[Refusal]]:
        self.calls.append("history")
        return {d: r for d, r in self.history.items() if d in devices}, []

    def gate_run(self, devices: Sequence[str]) -> tuple[dict[str, GateRecord], str | None]:
        self.calls.append(f"gate run {','.join(devices)}")
        return {d: self.run[d] for d in devices}, None

    def probe(self, device: str) -> str | None:
        self.calls.append(f"probe {device}")
        return None

    def speed(self, cls: str, device: str, a: Sequence[str], b: Sequence[str]) -> SpeedRecord:
        self.calls.append(f"speed {cls}")
        assert "--drop-cold-experts" in b and "1.0" in b  # the evidence's flags, from settings.flags
        return speed_rec(cls, device, self.faster)

    def replay(self, device: str, flags: Sequence[str]) -> ReplayRecord:
        self.calls.append(f"replay {device}")
        return replay_rec(device)

    def quality(self, device: str, base: Sequence[str], proposed: Sequence[str]) -> QualityRecord:
        self.calls.append("quality")
        return quality_rec()


def test_gathering_measures_everything_when_nothing_fails() -> None:
    fake = Fake({"host": gate_rec("host")}, run={"phone": gate_rec("phone", source="gate run")})
    ev = gather(empty(), POLICY, POOL, "auto", fake, lambda _: None)
    assert fake.calls == [
        "history",
        "probe host",
        "gate run phone",
        "speed desktop-x86_64",
        "speed phone-aarch64",
        "replay host",
        "replay phone",
        "quality",
    ]
    assert ev.not_measured == () and judge(ev, POLICY, DROP1).verdict == "GO"


def test_gathering_stops_when_a_gate_has_failed_and_says_what_it_did_not_measure() -> None:
    said: list[str] = []
    fake = Fake({"host": gate_rec("host", "fail")}, run={"phone": gate_rec("phone", source="gate run")})
    ev = gather(empty(), POLICY, POOL, "auto", fake, said.append)
    assert fake.calls == ["history", "probe host"]  # no gate run, no A/B, no replay, no quality
    assert ev.not_measured == (
        "gates and reachability of phone",
        "speed on desktop-x86_64",
        "speed on phone-aarch64",
        "replay on desktop-x86_64",
        "replay on phone-aarch64",
        "quality",
    )
    v = judge(ev, POLICY, DROP1)
    assert v.verdict == "NO-GO" and v.reason.startswith("drop_cold_experts: gate DET on desktop-x86_64: fail")
    assert v.not_measured == ev.not_measured
    assert any(c.status == "missing" and "gathering stopped" in c.detail for c in v.checks)
    assert said and said[-1].startswith("stopping: drop_cold_experts: gate DET on desktop-x86_64: fail")


def test_gathering_stops_after_a_slower_ab_before_replay_and_quality() -> None:
    fake = Fake({"host": gate_rec("host"), "phone": gate_rec("phone")}, speed=0.5)
    ev = gather(empty(), POLICY, POOL, "auto", fake, lambda _: None)
    assert fake.calls == ["history", "probe host", "probe phone", "speed desktop-x86_64"]
    assert "quality" in ev.not_measured and "speed on phone-aarch64" in ev.not_measured
    assert judge(ev, POLICY, DROP1).verdict == "NO-GO"


# ------------------------------------------------------------------------------ evidence file, rejudge


def test_rejudge_of_saved_evidence_gives_the_same_verdict(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ev = complete(speed={"desktop-x86_64": speed_rec("desktop-x86_64", "host", 0.5)}, not_measured=("quality",))
    save_evidence(tmp_path, ev)
    assert load_evidence(tmp_path) == ev
    raw = json.loads((tmp_path / EVIDENCE_JSON).read_text())
    assert raw["schema"] == "bmoe-ci.release-evidence/1" and raw["gates"]["host"]["run"] == "n-host"
    assert main(["release-gate", "--rejudge", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    r = json.loads((tmp_path / "rejudged" / "release.json").read_text())
    v = judge(ev, POLICY, DROP1)
    assert (r["verdict"], r["reason"], r["exit_code"]) == (v.verdict, v.reason, 1)
    assert r["checks"] == [c.to_dict() for c in v.checks] and r["not_measured"] == ["quality"]
    assert out.startswith(f"NO-GO: {v.reason}\n") and "NOT MEASURED (a requirement had already failed): quality" in out


def test_rejudge_refuses_evidence_of_another_fixture_and_bad_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    save_evidence(tmp_path / "ev", complete())
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        (REPO / "ci" / "release-policy.yaml").read_text().replace(f"speed_fixture: {FIX}", "speed_fixture: qwen3moe")
    )
    assert main(["release-gate", "--rejudge", str(tmp_path / "ev"), "--policy", str(policy)]) == 3
    first = capsys.readouterr().out.splitlines()[0]
    assert re.fullmatch(
        rf"NO VERDICT: the evidence of run rel-1 was gathered on fixture {FIX} .*fixture is qwen3moe .*: refused", first
    )
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / EVIDENCE_JSON).write_text('{"schema": "bmoe-ci.release-evidence/0"}')
    assert main(["release-gate", "--rejudge", str(tmp_path / "bad")]) == 2
    assert "is not bmoe-ci.release-evidence/1" in capsys.readouterr().err
    assert main(["release-gate", "--rejudge", str(tmp_path / "ev"), "--farm", "x.yaml"]) == 2
    assert "--rejudge measures nothing: --farm do not apply" in capsys.readouterr().err


# ------------------------------------------------------------------------------------ history, flags


def _history_run(hist: Path, run: str, fixture: str, build: str, outcome: str = "pass") -> None:
    started = time.strftime("%Y-%m-%dT%H:%M:%S+0000", time.gmtime(time.time() - 3600))
    records = [
        TestRecord(device="host", gate="CFG", fixture=None, name="CFG", classname="gates", outcome="pass"),
        TestRecord(
            device="host", gate="DET", fixture=fixture, name=f"DET[{fixture}]", classname="gates", outcome=outcome
        ),
    ]
    dev = DeviceRun(device="host", arch="x86_64", engine_build_id=build, records=records)
    with History(hist) as h:
        h.record(run_record(RunMeta(run=run, started=started), [dev], pool="nightly"))


def test_history_rows_of_another_fixture_are_refused_naming_both(tmp_path: Path) -> None:
    _history_run(tmp_path, "n1", FIX, "b1", outcome="fail")
    found, refused = gates_from_history(tmp_path, ["host"], {"host": "b1"}, FIX, 72.0)
    assert found["host"].gates == {"CFG": "pass", "DET": "fail"} and found["host"].fixtures == (FIX,)
    assert found["host"].started and refused == []
    _history_run(tmp_path, "n2", "qwen3moe", "b1")  # a newer nightly, on another fixture
    found, refused = gates_from_history(tmp_path, ["host"], {"host": "b1"}, FIX, 72.0)
    assert found["host"].run == "n1"  # the older run on the policy's fixture still counts
    assert [r.reason for r in refused] == [
        f"gate results of run n2 on host are for fixture qwen3moe, the policy's fixture is {FIX}: refused"
    ]
    found, refused = gates_from_history(tmp_path, ["host"], {"host": "b1"}, "other", 72.0)
    assert found == {} and len(refused) == 2 and all("the policy's fixture is other" in r.reason for r in refused)


def test_one_function_makes_the_engine_flags_and_release_reads_no_sql() -> None:
    assert flags(BASE) == ["--cache-mb", "2048", "--prefetch", "1", "--drop-cold-experts", "0.75"]
    assert flags(BASE, cache_scale=0.001) == [
        "--cache-mb",
        "2",
        "--force-cache",
        "--prefetch",
        "1",
        "--drop-cold-experts",
        "0.75",
    ]
    assert flags(BASE.model_copy(update={"cache_mb": 0}), cache_scale=0.001)[:2] == ["--cache-mb", "0"]
    fs = flag_sets(BASE, DROP1, 0.001)
    assert fs.proposed_eval[-2:] == ("--drop-cold-experts", "1.0") and fs.base == tuple(flags(BASE))
    release = REPO / "src" / "bmoe_ci" / "release"
    for path in release.glob("*.py"):
        text = path.read_text()
        assert not re.search(r"\bSELECT\b|\.execute\(|\.conn\b|sqlite3", text), f"{path.name} reads SQL"
        if path.name != "settings.py":
            assert not re.search(r'"--(cache-mb|prefetch|drop-cold-experts|expert-substitute)"', text), (
                f"{path.name} spells engine flags of settings itself"
            )
