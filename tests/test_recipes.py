"""The recipe table is one table: the engine's rows (engine/src/arch.c, printed by `bmoe archs`) and the
Python rows (bmoe_ci.recipes, read by the reference and the fixture generator) agree field by field."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from bmoe_ci.recipes import FIELDS, RECIPES, Recipe


def engine_rows(engine: Path) -> dict[str, dict[str, Any]]:
    proc = subprocess.run([str(engine), "archs"], capture_output=True, text=True, check=True)
    doc = json.loads(proc.stdout)
    assert doc["ok"] is True
    return {row["arch"]: row for row in doc["recipes"]}


def differences(c_rows: dict[str, dict[str, Any]], py: dict[str, Recipe]) -> list[str]:
    """Every field where the two tables differ, one line each."""
    out = [f"{a}: only in arch.c" for a in c_rows if a not in py]
    out += [f"{a}: only in recipes.py" for a in py if a not in c_rows]
    for arch in sorted(set(c_rows) & set(py)):
        c, p = c_rows[arch], py[arch].engine_fields()
        for key in sorted(set(c) | set(p)):
            if c.get(key, "<absent>") != p.get(key, "<absent>"):
                out.append(f"{arch}.{key}: arch.c {c.get(key, '<absent>')!r}, recipes.py {p.get(key, '<absent>')!r}")
    return out


@pytest.fixture(scope="module")
def rows(engine_bin: Path) -> dict[str, dict[str, Any]]:
    return engine_rows(engine_bin)


def test_the_two_tables_agree(rows: dict[str, dict[str, Any]]) -> None:
    assert differences(rows, RECIPES) == []
    assert list(rows) == list(RECIPES)  # the same order: error messages list the known ones in it


def test_every_field_is_printed(rows: dict[str, dict[str, Any]]) -> None:
    for arch, row in rows.items():
        assert sorted(row) == sorted(FIELDS), arch


@pytest.mark.parametrize("field", [f for f in FIELDS if f != "arch"])
def test_a_changed_field_is_caught(rows: dict[str, dict[str, Any]], field: str) -> None:
    """The comparison has teeth for every field: changing it in one row of the Python table is reported."""
    arch = next(iter(RECIPES))
    old = getattr(RECIPES[arch], field)
    if isinstance(old, bool):
        new: Any = not old
    elif isinstance(old, int | float):
        new = old + 1
    elif isinstance(old, tuple):
        new = (*old, "other")
    else:
        new = f"{old}-changed"
    changed = {**RECIPES, arch: dataclasses.replace(RECIPES[arch], **{field: new})}
    assert [d.split(":")[0] for d in differences(rows, changed)] == [f"{arch}.{field}"]


def test_unknown_argument_is_refused(engine_bin: Path) -> None:
    proc = subprocess.run([str(engine_bin), "archs", "--bogus"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.startswith("bmoe: error: archs: unexpected argument '--bogus'")
