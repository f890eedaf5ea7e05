"""DET: the engine's output is a function of (build, model, prompt, config) alone (docs/design.md, determinism)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bmoe_ci.plugin.runner import DeviceRunner, EngineResult
from gates.compare import assert_identical, output_digest
from gates.plan import REFERENCE, model_args


@pytest.mark.gate("DET", "repeat")
def test_same_config_twice(runs: dict[str, EngineResult], fixture: str, artifacts: Path,
                           request: pytest.FixtureRequest) -> None:
    assert_identical(runs["ref"], runs["again"], "ref", "again", artifacts)
    request.node.user_properties.append(("bmoe.output", f"{fixture}={output_digest(runs['ref'])}"))


@pytest.mark.gate("DET", "threads")
def test_one_vs_two_threads(runs: dict[str, EngineResult], artifacts: Path) -> None:
    assert_identical(runs["ref"], runs["threads2"], "threads1", "threads2", artifacts)


@pytest.mark.gate("DET", "batch")
def test_batch_equals_single_process(runs: dict[str, EngineResult], runner: DeviceRunner, model: str,
                                     artifacts: Path) -> None:
    single = runner.single(model_args(model, *REFERENCE, "-t", "1"))
    assert_identical(runs["ref"], single, "batch", "single", artifacts)
