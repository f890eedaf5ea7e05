"""The release gate under hostile or broken inputs: values never reach git as options, a rejudged verdict
never overwrites the original, and evidence that is deeply nested, holds NaN or infinity, or does not fit
its policy is one line (or a check that fails), never a traceback or a pass."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_release_judge import DROP1, POLICY, complete, quality_rec

from bmoe_ci.cli import main
from bmoe_ci.release.evidence import EVIDENCE_JSON, save_evidence
from bmoe_ci.release.judge import judge

REPO = Path(__file__).resolve().parents[1]


def test_a_base_that_looks_like_an_option_never_reaches_git_as_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    written = tmp_path / "written-by-git"
    proposed = tmp_path / "p.yaml"
    proposed.write_text((REPO / "ci" / "app-defaults.yaml").read_text())
    rc = main(["release-gate", "--proposed", str(proposed), f"--base=--output={written}", "--out", str(tmp_path / "o")])
    assert rc == 2 and not written.exists()
    assert "not a git revision" in capsys.readouterr().err


def test_rejudge_never_writes_over_the_run_it_rejudges(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    save_evidence(run, complete())
    (run / "release.json").write_text('{"verdict": "GO"}')
    assert main(["release-gate", "--rejudge", str(run), "--out", str(run)]) == 2
    assert "its verdict would be overwritten" in capsys.readouterr().err
    assert json.loads((run / "release.json").read_text()) == {"verdict": "GO"}


@pytest.mark.parametrize(
    "damage",
    [
        lambda raw: json.dumps(
            {**raw, "quality": {"x": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}}
        ).replace("[]", "[" * 5000 + "]" * 5000),
        lambda raw: json.dumps(raw).replace('"ppl": 7.4', '"ppl": NaN'),
        lambda raw: json.dumps(raw).replace('"ppl": 7.39', '"ppl": Infinity'),
    ],
    ids=["nested 5000 deep", "NaN", "Infinity"],
)
def test_damaged_evidence_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], damage) -> None:
    save_evidence(tmp_path, complete())
    path = tmp_path / EVIDENCE_JSON
    path.write_text(damage(json.loads(path.read_text())))
    assert main(["release-gate", "--rejudge", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and EVIDENCE_JSON in err and "Traceback" not in err


def test_an_infinite_or_nan_score_never_passes_a_bound() -> None:
    for base_ppl, proposed_ppl in ((float("inf"), 99.0), (7.39, float("nan"))):
        q = quality_rec(proposed_ppl).model_copy(
            update={"base": {"ppl": base_ppl, "ref_agreement": 0.9, "accuracy": 0.7}}
        )
        v = judge(complete(quality=q), POLICY, DROP1)
        ppl = [c for c in v.checks if c.requirement == "quality ppl"]
        assert ppl and ppl[0].status != "pass", ppl


def test_a_stored_policy_that_does_not_fit_its_evidence_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    save_evidence(tmp_path, complete())
    path = tmp_path / EVIDENCE_JSON
    raw = json.loads(path.read_text())
    del raw["policy"]["settings"]["drop_cold_experts"]  # the setting the proposal changes
    path.write_text(json.dumps(raw))
    rc = main(["release-gate", "--rejudge", str(tmp_path)])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    assert rc == 3 and out.splitlines()[0].startswith("NO VERDICT: the policy has no requirement for drop_cold_experts")
