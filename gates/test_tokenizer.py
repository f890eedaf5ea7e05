"""TOK: every device tokenizes the held texts exactly as llama.cpp does (docs/gates.md, TOK).

Each configuration (bmoe_ci.tokgate.CONFIGS: Qwen2's byte-level BPE under the qwen2, llama3, gpt-2 and
default pre-tokenizers, Phi-3's SentencePiece, the fixtures' byte vocabulary) is a vocabulary-only GGUF
pushed beside the fixtures; one `bmoe tokenize --texts` process per configuration and device cuts every
held text (gates/data/tok/texts.json). The ids, and the ids decoded back to bytes, must be the ones
llama.cpp gave (gates/data/tok/pinned.json, `python -m bmoe_ci.tokgate pin`). The Unicode tables, the
pre-tokenizers' classes, the merge order, SentencePiece scores and byte fallback and the special tokens
all run on the device's own build: a port that cuts one text differently on one device fails here.
"""

from __future__ import annotations

import json
import tempfile
from functools import cache
from pathlib import Path

import pytest

from bmoe_ci.farm import InfraError
from bmoe_ci.gaterun.context import DeviceContext
from bmoe_ci.gaterun.runner import DeviceRunner
from bmoe_ci.gaterun.state import GateState
from bmoe_ci.paths import Places
from bmoe_ci.tokgate import CONFIGS, TEXTS_BLOB, TOK_DIR, Pinned, load_pinned, texts, write_inputs

BY_NAME = {c.name: c for c in CONFIGS}


@cache
def _pinned(places: Places) -> tuple[Pinned, list[str], str | None]:
    """The pinned ids, the texts, and why the pin does not belong to the pushed inputs (None: it does)."""
    pinned = load_pinned(places)
    with tempfile.TemporaryDirectory() as tmp:
        stale = pinned.stale(write_inputs(Path(tmp), places), places)
    return pinned, texts(places), stale


def device_file(runner: DeviceRunner, name: str) -> str:
    return runner.session.file(f"fixtures/{TOK_DIR}/{name}")


@pytest.mark.gate("TOK")
@pytest.mark.parametrize("case_id", list(BY_NAME))
def test_held_texts_match_llama_cpp(
    runner: DeviceRunner, device: DeviceContext, case_id: str, gate_state: GateState, artifacts: Path
) -> None:
    config = BY_NAME[case_id]
    pinned, items, stale = _pinned(gate_state.places)
    if stale is not None:  # the expectation is out of date: no verdict on the engine
        raise InfraError(
            device.name, "setup", f"TOK's pinned ids are stale ({stale}): run python -m bmoe_ci.tokgate pin"
        )
    want = pinned.configs[case_id]
    result, rows = runner.lines(
        ["tokenize", "-m", device_file(runner, config.filename), "--texts", device_file(runner, TEXTS_BLOB)]
    )
    if result.crashed is not None or result.exit_code != 0:
        raise AssertionError(f"{case_id}: bmoe tokenize {result.why()} (exit {result.exit_code})")
    if len(rows) != len(items):
        raise AssertionError(f"{case_id}: bmoe tokenize printed {len(rows)} results for {len(items)} texts")
    wrong = []
    for i, (text, row) in enumerate(zip(items, rows, strict=True)):
        ids, decoded = row.get("ids"), row.get("decoded_hex")
        if ids != want["ids"][i]:
            at = next((k for k, (a, b) in enumerate(zip(ids or [], want["ids"][i], strict=False)) if a != b), None)
            at = at if at is not None else min(len(ids or []), len(want["ids"][i]))
            wrong.append(f"text {i} {text[:40]!r}: ids differ at {at}: llama.cpp {want['ids'][i]}, engine {ids}")
        elif decoded != want["decoded_hex"][i]:
            wrong.append(
                f"text {i} {text[:40]!r}: decoded {bytes.fromhex(decoded or '')!r}, llama.cpp "
                f"{bytes.fromhex(want['decoded_hex'][i])!r}"
            )
    if wrong:
        artifacts.mkdir(parents=True, exist_ok=True)
        (artifacts / f"tok-{case_id}.json").write_text(json.dumps({"wrong": wrong, "rows": rows}, indent=1))
        raise AssertionError(
            f"{case_id} ({config.vocab}, pre {want['pre']}): {len(wrong)} of {len(items)} texts differ from "
            f"llama.cpp: " + "; ".join(wrong[:3]) + f" (artifacts in {artifacts})"
        )
