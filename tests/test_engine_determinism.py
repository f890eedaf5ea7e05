"""The engine's output depends on nothing but (build, model, prompt, config): not on the thread
count, not on the run. Byte-identity gates stand on this (docs/design.md, determinism)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

DEFAULT_FIXTURES = [
    "qwen3moe",
    "qwen3moe-split4",
    "gemma4",
    "wide",
    "qwen3moe-q8_0",
    "qwen3moe-q4k",
    "qwen3moe-nonorm",
    "qwen3moe-tied",
]


def run(engine: Path, model: Path, threads: int, logits: Path) -> bytes:
    proc = subprocess.run(
        [
            str(engine),
            "run",
            "-m",
            str(model),
            "--mmap",
            "-p",
            "Determinism, please.",
            "-n",
            "24",
            "-t",
            str(threads),
            "--json",
            "--logits-out",
            str(logits),
        ],
        capture_output=True,
        check=True,
    )
    return proc.stdout


@pytest.mark.parametrize("name", DEFAULT_FIXTURES)
def test_threads_do_not_change_a_byte(engine_bin: Path, fixtures: dict[str, Path], name: str, tmp_path: Path) -> None:
    one = run(engine_bin, fixtures[name], 1, tmp_path / "t1.f32")
    two = run(engine_bin, fixtures[name], 2, tmp_path / "t2.f32")
    # The JSON carries timings, which differ; the generated tokens and bytes must not.
    a, b = json.loads(one), json.loads(two)
    assert a["tokens"] == b["tokens"] and a["text_hex"] == b["text_hex"]
    assert len(a["tokens"]) == 24
    assert (tmp_path / "t1.f32").read_bytes() == (tmp_path / "t2.f32").read_bytes()
