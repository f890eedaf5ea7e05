"""`bmoe-ci report --merge` on synthetic shards: counts add up, disagreement across shards is found,
bad input is one line and exit 2; and the nightly's exit decision."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bmoe_ci.cli import main
from bmoe_ci.nightly.run import decide_exit
from bmoe_ci.reports import DeviceRun, RunMeta, TestRecord, finalize


def shard(root: Path, name: str, devices: dict[str, str], outcome: str = "pass") -> Path:
    """A gate run's results directory: *devices* maps device -> its qwen3moe output digest."""
    runs = [
        DeviceRun(
            device=d,
            arch="aarch64" if "phone" in d else "x86_64",
            outputs={"qwen3moe": sha},
            records=[
                TestRecord(
                    device=d,
                    gate=g,
                    fixture="qwen3moe",
                    name=f"{g}[qwen3moe]",
                    classname="gates.t",
                    outcome=outcome if g == "G1" else "pass",
                )
                for g in ("G1", "DET")
            ],
        )
        for d, sha in devices.items()
    ]
    path = root / name
    finalize(path, runs, RunMeta(run=name))
    return path


def test_merge_sums_counts_and_finds_a_disagreement_between_shards(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = shard(tmp_path, "a", {"phone1": "1" * 64, "phone2": "1" * 64})
    b = shard(tmp_path, "b", {"desk": "2" * 64}, outcome="fail")
    out = tmp_path / "merged"
    assert main(["report", "--merge", str(a), str(b), "--out", str(out)]) == 1
    assert capsys.readouterr().out.strip() == str(out / "report.html")
    n = json.loads((out / "nightly.json").read_text())
    assert {k: v for k, v in n["totals"].items() if k != "xdev"} == {
        "devices": 3,
        "tests": 6,
        "passed": 5,
        "failed": 1,
        "errors": 0,
        "skipped": 0,
    }
    assert n["totals"]["xdev"]["verdicts"] == 0  # no digests recorded: nothing XDEV could compare
    (d,) = n["disagreements"]
    assert d["minority"] == ["desk"] and d["fixture"] == "qwen3moe"
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["devices"]) == {"phone1", "phone2", "desk"}


def test_merge_exit_0_only_when_the_shards_pass_and_agree(tmp_path: Path) -> None:
    a = shard(tmp_path, "a", {"phone1": "1" * 64})
    b = shard(tmp_path, "b", {"desk": "1" * 64})
    assert main(["report", "--merge", str(a), str(b), "--out", str(tmp_path / "m")]) == 0
    c = shard(tmp_path, "c", {"desk2": "3" * 64})  # passes, but its output differs
    assert main(["report", "--merge", str(a), str(c), "--out", str(tmp_path / "m2")]) == 1


def test_merge_bad_input_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = shard(tmp_path, "a", {"phone1": "1" * 64})
    assert main(["report", "--merge", str(a), "--out", str(tmp_path / "m")]) == 2
    assert "at least two shard directories" in capsys.readouterr().err
    assert main(["report", "--merge", str(a), str(tmp_path / "nope"), "--out", str(tmp_path / "m")]) == 2
    assert "nope: no such directory" in capsys.readouterr().err
    assert main(["report", "--merge", str(a), str(a), "--out", str(tmp_path / "m")]) == 2
    assert "device 'phone1' is also in shard" in capsys.readouterr().err
    assert main(["report", "--merge", str(a), str(a)]) == 2
    assert "--out" in capsys.readouterr().err
    (a / "phone1" / "device.json").write_text("{")
    b = shard(tmp_path, "b", {"desk": "1" * 64})
    assert main(["report", "--merge", str(a), str(b), "--out", str(tmp_path / "m2")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "device.json: not valid JSON" in err


@pytest.mark.parametrize(
    ("verdicts", "new_failures", "disagreements", "code"),
    [(True, [], [], 0), (True, [{}], [], 1), (True, [], [{}], 1), (False, [], [], 3), (False, [{}], [], 3)],
)
def test_exit_decision(verdicts: bool, new_failures: list, disagreements: list, code: int) -> None:
    assert decide_exit({"verdicts": verdicts, "new_failures": new_failures, "disagreements": disagreements}) == code
