"""The plan follows the selection: only the devices, fixtures and plan entries the selected tests need are
built for, leased, pushed and run; an empty selection touches nothing; gate markers take the
catalogue's spelling, in any case (`-m G8b` used to select nothing, and `-m g8b` ran and pushed every
fixture's whole plan: about a third of the suite's engine time for ten tests)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from bmoe_ci.gaterun.state import PlanNeeds
from bmoe_ci.plugin.marks import normalize_markexpr
from gate_run import REPO, host_farm, run_gates


def test_gate_ids_select_in_the_catalogues_spelling_in_any_case() -> None:
    assert normalize_markexpr("G8b") == "g8b"
    assert normalize_markexpr("REF or G8a'") == "ref or g8a-prime"
    assert normalize_markexpr("DET-kernels and not G8W") == "det-kernels and not g8w"
    assert normalize_markexpr("slow or Custom") == "slow or Custom"  # not a gate: left as typed


def test_plan_needs_pick_entries_by_id_or_predicate_or_all() -> None:
    plan = [("ref", ["--mmap"]), ("drop-full", ["--drop-cold-experts", "1", "--route-trace", "t"]), ("x", [])]
    need = PlanNeeds()
    need.add(("ref",))
    need.add(("missing",), where=lambda i, a: "--route-trace" in a)
    assert [i for i, _ in need.select(plan)] == ["ref", "drop-full"]
    need.add(None)  # a test that does not say reads everything
    assert [i for i, _ in need.select(plan)] == ["ref", "drop-full", "x"]


def test_m_G8b_runs_only_its_entries_on_the_selected_fixture(tmp_path: Path) -> None:
    run = run_gates(
        tmp_path,
        modules=("gates",),
        fixtures=("qwen3moe", "gemma4"),
        extra=("-v", "-m", "G8b", "-k", "not gemma4"),  # -v cancels -q: the step lines; G8b as spelled
    )
    assert run.returncode == 0, run.output[-3000:]
    host = run.summary["devices"]["host"]
    assert set(host["gate_counts"]) <= {"G8b", "XDEV"} and host["gate_counts"]["G8b"]["pass"] == 1
    # G8b reads every traced dropping entry and drop-full: five of the plan's entries, not all of them
    plans = re.findall(r"plans: host (\d+) \((\d+) entries\)", run.output)
    assert plans == [("1", "5")], run.output[-3000:]
    # only the selected fixture was generated and pushed
    fixtures_line = next(line for line in run.output.splitlines() if "bmoe-ci: fixtures:" in line)
    assert "qwen3moe" in fixtures_line and "gemma4" not in fixtures_line
    linked = {p.name for p in (tmp_path / "work" / "fixtures").iterdir() if p.suffix == ".gguf"}
    assert linked == {"qwen3moe.gguf"}, linked


def test_an_empty_selection_builds_leases_and_pushes_nothing(tmp_path: Path) -> None:
    farm = host_farm(tmp_path)
    results = tmp_path / "results"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "gates",
            "-p",
            "no:cacheprovider",
            "-q",
            "--bmoe-farm",
            str(farm),
            "--bmoe-device",
            "host",
            "--bmoe-results",
            str(results),
            "-m",
            "xdev",  # derived from the others: no test of its own
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 5, out[-2000:]  # pytest's "no tests ran"
    assert "no gate test selected: nothing built, leased or pushed" in out
    assert not (tmp_path / "work").exists() and not results.exists()
    assert "build " not in out and "push" not in out.replace("nothing built, leased or pushed", "")
