"""What `bmoe-ci mutants` writes: mutants.json (a contract: nightly CI reads it), the console table,
the fault x gate picture (mutants.svg) and the generated table of docs/gates.md."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bmoe_ci.reports.records import atomic_write
from bmoe_ci.reports.summary import gate_sort_key, svg_table

MUTANTS_SCHEMA = "bmoe-ci.mutants/1"
MUTANTS_JSON = "mutants.json"
MUTANTS_SVG = "mutants.svg"
DOC_BEGIN = "<!-- BEGIN GENERATED: bmoe-ci mutants (do not edit by hand; `bmoe-ci mutants --write-doc`) -->"
DOC_END = "<!-- END GENERATED: bmoe-ci mutants -->"
DOC_HEADER = "| fault | area | breaks | caught by | expected | outcome |"
_CELL = {"fail": "X", "pass": ".", "skip": "s", "error": "E", None: "-"}
_COLOURS = {"fail": "#2da44e", "pass": "#eaeef2", "skip": "#d0d7de", "error": "#bc4c00", None: "#ffffff"}
_OUTCOME_COLOURS = {"caught": "#2da44e", "survived": "#cf222e", "error": "#bc4c00", "n/a": "#8c959f"}


class MutantsFileError(ValueError):
    """mutants.json is missing or not in the bmoe-ci.mutants/1 format."""


def mutants_doc(
    *,
    device: str,
    arch: str,
    engine_builds: dict[str, dict[str, str]],
    fixtures: list[str],
    faults: list[dict[str, Any]],
    gates: list[str],
    clean: Mapping[str, str],
    started: str,
    seconds: float,
) -> dict[str, Any]:
    caught = sum(1 for f in faults if f["outcome"] == "caught")
    applicable = sum(1 for f in faults if f["outcome"] != "n/a")  # a fault whose code this arch never runs
    return {
        "schema": MUTANTS_SCHEMA,
        "device": device,
        "arch": arch,
        "engine_builds": engine_builds,
        "fixtures": fixtures,
        "started": started,
        "seconds": round(seconds, 1),
        "score": {"caught": caught, "total": applicable},
        "gates": gates,
        "clean": clean,
        "faults": faults,
    }


def write_mutants(results: Path, doc: dict[str, Any]) -> None:
    atomic_write(results / MUTANTS_JSON, (json.dumps(doc, indent=2) + "\n").encode("utf-8"))
    atomic_write(results / MUTANTS_SVG, matrix_svg(doc).encode("utf-8"))


def read_mutants(results: Path) -> dict[str, Any]:
    path = results / MUTANTS_JSON if results.is_dir() else results
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise MutantsFileError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise MutantsFileError(f"{path}: not JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("schema") != MUTANTS_SCHEMA:
        raise MutantsFileError(f"{path}: schema: not {MUTANTS_SCHEMA}")
    for key in ("device", "arch", "score", "faults"):
        if key not in doc:
            raise MutantsFileError(f"{path}: {key}: missing")
    return doc


def score_line(doc: dict[str, Any]) -> str:
    s = doc["score"]
    outcomes = [f["outcome"] for f in doc["faults"]]
    pct = 100.0 * s["caught"] / s["total"] if s["total"] else 0.0
    return (
        f"mutation score on {doc['device']} ({doc['arch']}): {s['caught']}/{s['total']} caught ({pct:.0f}%), "
        f"{outcomes.count('survived')} survived, {outcomes.count('error')} error(s)"
        + (f", {outcomes.count('n/a')} not run (their code runs on another architecture)" if "n/a" in outcomes else "")
    )


def _gates(doc: dict[str, Any]) -> list[str]:
    gates = set(doc.get("gates", []))
    for f in doc["faults"]:
        gates.update(f.get("gates", {}))
    return sorted(gates, key=gate_sort_key)


def console_table(doc: dict[str, Any]) -> str:
    """One row per fault: a cell per gate (X failed = caught, . passed, s skipped, E error)."""
    gates = _gates(doc)
    header = ["fault", "area", *gates, "outcome"]
    rows = [
        [f["name"], f["area"], *(_CELL[f.get("gates", {}).get(g)] for g in gates), f["outcome"].upper()]
        for f in doc["faults"]
    ]
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in [header, *rows]]
    lines.append("cells: X the gate failed (caught), . passed, s skipped, E error (no verdict), - did not run")
    for f in doc["faults"]:
        if f["outcome"] != "caught":
            lines.append(f"  {f['outcome'].upper()} {f['name']}: {f['message']}")
    lines.append(score_line(doc))
    return "\n".join(lines)


def compare_runs(a: dict[str, Any], b: dict[str, Any]) -> tuple[str, bool]:
    """Two runs' catches side by side, fault by fault (the faults both ran, in a's order).

    Returns the table and whether they agree: every shared fault has the same outcome and was caught
    by the same gates. Faults only one run has are listed, and are a difference too."""
    name_a, name_b = f"{a['device']} ({a['arch']})", f"{b['device']} ({b['arch']})"
    by_b = {f["name"]: f for f in b["faults"]}
    names_a = [f["name"] for f in a["faults"]]
    rows, same = [], True
    for fa in a["faults"]:
        fb = by_b.get(fa["name"])
        cell_a = ", ".join(sorted(fa["caught_by"])) or fa["outcome"]
        if fb is None:
            rows.append([fa["name"], cell_a, "(not run)", "DIFFERS"])
            same = False
            continue
        cell_b = ", ".join(sorted(fb["caught_by"])) or fb["outcome"]
        agree = fa["outcome"] == fb["outcome"] and sorted(fa["caught_by"]) == sorted(fb["caught_by"])
        same = same and agree
        rows.append([fa["name"], cell_a, cell_b, "same" if agree else "DIFFERS"])
    for fb in b["faults"]:
        if fb["name"] not in names_a:
            rows.append([fb["name"], "(not run)", ", ".join(sorted(fb["caught_by"])) or fb["outcome"], "DIFFERS"])
            same = False
    header = ["fault", f"caught on {name_a}", f"caught on {name_b}", ""]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in [header, *rows]]
    differ = sum(1 for r in rows if r[-1] == "DIFFERS")
    lines.append(f"{score_line(a)}\n{score_line(b)}")
    lines.append(
        "the two runs catch every fault with the same gates" if same else f"{differ} fault(s) caught differently"
    )
    return "\n".join(lines), same


def matrix_svg(doc: dict[str, Any]) -> str:
    """The fault x gate matrix as a picture, in the style of the run's matrix.svg."""
    gates = _gates(doc)
    header = ["fault", "area", *gates, "outcome"]
    rows = [
        [f["name"], f["area"], *(_CELL[f.get("gates", {}).get(g)] for g in gates), f["outcome"].upper()]
        for f in doc["faults"]
    ]

    def style(row: int, col: int) -> tuple[str, str]:
        fault = doc["faults"][row]
        if 2 <= col < len(header) - 1:
            verdict = fault.get("gates", {}).get(gates[col - 2])
            return _COLOURS[verdict], ("#ffffff" if verdict in ("fail", "error") else "#57606a")
        if col == len(header) - 1:
            return _OUTCOME_COLOURS[fault["outcome"]], "#ffffff"
        return "#ffffff", "#1f2328"

    return svg_table(score_line(doc), header, rows, style)


def _md(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def doc_section(doc: dict[str, Any]) -> str:
    """The generated block of docs/gates.md (markers included)."""
    fixtures = ", ".join(doc.get("fixtures") or []) or "every default fixture"
    lines = [
        DOC_BEGIN,
        "",
        f"Last run: `bmoe-ci mutants` on `{doc['device']}` ({doc['arch']}), fixtures: {fixtures}, "
        f"{doc.get('started', '?')}, {doc.get('seconds', '?')} s. **{_md(score_line(doc))}.**",
        "",
        DOC_HEADER,
        "|---|---|---|---|---|---|",
    ]
    for f in doc["faults"]:
        caught = ", ".join(f["caught_by"]) or "none"
        lines.append(
            f"| `{f['name']}` | {f['area']} | {_md(f.get('breaks', ''))} | {_md(caught)} | "
            f"{_md(', '.join(f['expected']))} | {f['outcome']} |"
        )
    lines += ["", DOC_END]
    return "\n".join(lines)


def write_doc(path: Path, doc: dict[str, Any]) -> None:
    """Replace the generated block of `path` (between the markers) with the table of `doc`."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise MutantsFileError(f"{path}: cannot read: {exc.strerror or exc}") from None
    begin, end = text.find(DOC_BEGIN), text.find(DOC_END)
    if begin < 0 or end < begin:
        raise MutantsFileError(f"{path}: no generated block (a line {DOC_BEGIN!r} followed by {DOC_END!r})")
    new = text[:begin] + doc_section(doc) + text[end + len(DOC_END) :]
    atomic_write(path, new.encode("utf-8"))
