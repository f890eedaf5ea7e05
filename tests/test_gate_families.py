"""Gate families a fixture leaves out (fixtures.yaml `skip_gates`, gates/plan.py): the plan of such a fixture
runs none of the family's entries, its gates skip with the fixture's reason (never a pass), and the key is
checked, not inherited and not part of the file's hash."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import yaml

from bmoe_ci.models import SpecError, load_specs, parse_specs, spec_hash
from bmoe_ci.models.spec import default_specs_path
from gates.plan import FAMILY_ENTRIES, FAMILY_GATES, family_skip, fixture_plan

REPO = Path(__file__).resolve().parents[1]
GATE_MARK = re.compile(r'@pytest\.mark\.gate\("([^"]+)"(?:,\s*"([^"]+)")?\)')


def _doc() -> dict:
    return yaml.safe_load(default_specs_path().read_text())


def _entry(doc: dict, name: str) -> dict:
    return next(f for f in doc["fixtures"] if f["name"] == name)


def test_every_family_names_gates_and_entries_of_the_suite() -> None:
    marks = set()
    for path in (REPO / "gates").glob("test_*.py"):
        for gate, sub in GATE_MARK.findall(path.read_text()):
            marks.add(gate)
            if sub:
                marks.add((gate, sub))
    full = {i for i, _ in fixture_plan("m.gguf", "qwen3moe")}
    for family, gates in FAMILY_GATES.items():
        assert gates <= marks, (family, gates - marks)
        assert FAMILY_ENTRIES[family] <= full, (family, FAMILY_ENTRIES[family] - full)
    # the core every fixture runs: G1, REF, DET's repeat, threads, batch and kernels, INV, BATCH-STDERR
    core = full - set().union(*FAMILY_ENTRIES.values())
    assert {"ref", "again", "threads2", "stream", "score-wide"} == core


def test_a_fixture_leaving_families_out_runs_none_of_their_entries() -> None:
    specs = load_specs().specs
    full = {i for i, _ in fixture_plan("m.gguf", "qwen3moe")}
    assert not specs["qwen3moe"].skip_gates
    for name, spec in specs.items():
        if not spec.skip_gates:
            continue
        plan = {i for i, _ in fixture_plan("m.gguf", name)}
        kept = [f for f in FAMILY_ENTRIES if f not in spec.skip_gates]
        for family in spec.skip_gates:
            for entry in FAMILY_ENTRIES[family]:
                assert (entry in plan) == any(entry in FAMILY_ENTRIES[f] for f in kept), (name, family, entry)
        assert {"ref", "again", "threads2", "stream", "score-wide"} <= plan <= full, name
    types = {i for i, _ in fixture_plan("m.gguf", "qwen3moe-types")}
    assert "stream-evict" not in types and "drop-full" not in types and "score-choices" in types


def test_a_skipped_gate_says_which_family_and_why() -> None:
    why = family_skip("qwen3moe-types", "G8b", "")
    assert why is not None and why.startswith("qwen3moe-types leaves out the lossy gates (fixtures.yaml skip_gates): ")
    assert "qwen3moe-q4k" in why  # the reason names the fixture that covers them
    assert family_skip("qwen3moe-types", "DET", "io-lanes", None) is not None  # a sub-gate of the cache family
    assert family_skip("qwen3moe-types", "DET", "kernels") is None
    assert family_skip("qwen3moe-types", "G1", "") is None  # streaming itself runs on every fixture
    assert family_skip("qwen3moe-types", "REF", "") is None
    assert family_skip("qwen3moe", "G8b", "") is None
    assert family_skip("qwen3moe-split4", "SCORE", "choices") is not None


def test_skip_gates_is_checked_not_inherited_and_not_hashed() -> None:
    doc = _doc()
    bad = copy.deepcopy(doc)
    _entry(bad, "qwen3moe-types")["skip_gates"] = {"streaming-all": "no"}
    with pytest.raises(SpecError, match=r"qwen3moe-types.*skip_gates"):
        parse_specs(bad)
    # a fixture derived from one that leaves families out runs every gate unless it says otherwise
    derived = copy.deepcopy(doc)
    derived["fixtures"].append({"name": "types-again", "base": "qwen3moe-types"})
    specs = parse_specs(derived).specs
    assert specs["qwen3moe-types"].skip_gates and not specs["types-again"].skip_gates
    # what the gate suite runs is not what the file holds: the same bytes, the same hash
    again = specs["qwen3moe-types"].model_copy(update={"name": "types-again", "default": False, "description": ""})
    assert spec_hash(specs["types-again"]) == spec_hash(again)
