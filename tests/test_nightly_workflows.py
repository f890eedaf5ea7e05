"""The CI workflows in ci/: valid YAML with the structure their CI system needs, and every `bmoe-ci`
command they run exists with exactly those options (parsed by bmoe-ci's own argument parser)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from bmoe_ci.cli import make_parser

REPO = Path(__file__).resolve().parents[1]
GITHUB = REPO / "ci" / "github" / "nightly.yml"
GITLAB = REPO / "ci" / "gitlab" / ".gitlab-ci.yml"
RELEASE = REPO / "ci" / "github" / "release-gate.yml"


def load(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text())
    assert isinstance(data, dict), path
    return data


def bmoe_ci_commands(scripts: list[str]) -> list[list[str]]:
    """The argument lists of every `bmoe-ci ...` command in *scripts* (shell text). CI expressions and
    shell variables become a placeholder word; an optional word list (`"${fault[@]}"`, `$fault`)
    becomes nothing: it is checked separately."""
    found = []
    for script in scripts:
        for line in script.splitlines():
            start = line.find("bmoe-ci ")
            if start < 0 or line.lstrip().startswith("#"):
                continue
            cmd = re.split(r"\s[|>]\s?", line[start:])[0]
            cmd = cmd.replace('"${fault[@]}"', "").replace("$fault", "")
            cmd = re.sub(r"\$\{\{[^}]*\}\}", "X", cmd)
            cmd = re.sub(r"\$\{?[A-Za-z_][A-Za-z0-9_]*\}?", "X", cmd)
            found.append(shlex.split(cmd)[1:])
    return found


def check_command(argv: list[str]) -> None:
    try:
        make_parser().parse_args(argv)
    except SystemExit as exc:
        raise AssertionError(f"bmoe-ci {' '.join(argv)}: rejected by the parser") from exc


def github_scripts(wf: dict[str, Any]) -> list[str]:
    return [step["run"] for job in wf["jobs"].values() for step in job["steps"] if "run" in step]


def gitlab_scripts(wf: dict[str, Any]) -> list[str]:
    return [line for job in wf.values() if isinstance(job, dict) for line in job.get("script", [])]


def test_github_workflow_structure() -> None:
    wf = load(GITHUB)
    on = wf[True] if True in wf else wf["on"]  # YAML 1.1 reads the key `on` as a boolean
    assert on["schedule"][0]["cron"] and "workflow_dispatch" in on
    shard, merge = wf["jobs"]["shard"], wf["jobs"]["merge"]
    assert shard["strategy"]["fail-fast"] is False and len(shard["strategy"]["matrix"]["include"]) >= 2
    assert "self-hosted" in shard["runs-on"]
    uses = [s.get("uses", "") for s in shard["steps"]]
    assert any(u.startswith("actions/upload-artifact@") for u in uses)
    assert merge["needs"] == "shard" and merge["if"] == "always()"
    merge_uses = [s.get("uses", "") for s in merge["steps"]]
    assert any(u.startswith("actions/download-artifact@") for u in merge_uses)
    assert any(u.startswith("mikepenz/action-junit-report@") for u in merge_uses)
    assert any(u.startswith("actions/upload-artifact@") for u in merge_uses)
    # Workflow inputs reach scripts through the environment, never pasted into shell text.
    assert all("${{ inputs." not in s for s in github_scripts(wf))


def test_gitlab_example_structure() -> None:
    wf = load(GITLAB)
    assert wf["stages"] == ["nightly", "report"]
    shard, merge = wf["shard"], wf["merge"]
    assert shard["stage"] == "nightly" and len(shard["parallel"]["matrix"]) >= 2
    assert shard["artifacts"]["when"] == "always" and shard["artifacts"]["reports"]["junit"]
    assert merge["stage"] == "report" and merge["needs"] == ["shard"] and merge["when"] == "always"
    rules = wf[".only-scheduled-or-manual"]["rules"]
    assert {r["if"] for r in rules} == {'$CI_PIPELINE_SOURCE == "schedule"', '$CI_PIPELINE_SOURCE == "web"'}


@pytest.mark.parametrize("path", [GITHUB, GITLAB], ids=["github", "gitlab"])
def test_every_bmoe_ci_command_exists_with_its_options(path: Path) -> None:
    wf = load(path)
    scripts = github_scripts(wf) if path == GITHUB else gitlab_scripts(wf)
    commands = bmoe_ci_commands(scripts)
    assert {c[0] for c in commands} == {"nightly", "report"}
    for argv in commands:
        check_command(argv)
    # The optional fault words, when present, form a valid option too.
    check_command(["nightly", "--fault", "THREAD_ORDER"])
    assert any("--merge" in c for c in commands)


def test_release_gate_workflow_runs_on_default_changes_with_existing_options() -> None:
    wf = load(RELEASE)
    on = wf[True] if True in wf else wf["on"]
    assert "ci/app-defaults.yaml" in on["pull_request"]["paths"]
    (job,) = wf["jobs"].values()
    checkout = next(s for s in job["steps"] if s.get("uses", "").startswith("actions/checkout@"))
    assert checkout["with"]["fetch-depth"] == 0  # `git show BASE:ci/app-defaults.yaml` needs the base commit
    assert all("${{ github.event" not in s for s in github_scripts(wf))  # event data only through env
    commands = bmoe_ci_commands(github_scripts(wf))
    assert [c[0] for c in commands] == ["release-gate"]
    for argv in commands:
        check_command(argv)
    assert {"--proposed", "--base", "--pool", "--out"} <= set(commands[0])


def test_the_command_check_can_fail() -> None:
    (bad,) = bmoe_ci_commands(["bmoe-ci nightly --pool ${{ matrix.pool }} --histroy x | tee out"])
    assert bad == ["nightly", "--pool", "X", "--histroy", "x"]
    with pytest.raises(AssertionError, match="rejected"):
        check_command(bad)
    with pytest.raises(AssertionError, match="rejected"):
        check_command(["nightly-run"])
