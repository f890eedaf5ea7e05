"""The run summary: ``summary.json`` (for machines), ``summary.md`` and ``matrix.svg`` (for people),
and a compact device x gate matrix for the console.

A matrix cell counts the fixtures a gate ran on for one device: ``3/3`` (all passed), ``2/3`` (two
passed, the rest skipped), ``FAIL 1/3`` (one of three failed), ``ERR 1/3``, ``SKIP 3/3``. A fixture's
outcome is the worst of the gate's tests on it (DET has several per fixture; a gate without fixtures
counts its tests). The word is the aggregate verdict (any error, else any fail, else any pass, else
skip) and the count is how many fixtures had that outcome. A failed or errored cell links to the
evidence page of its first failing test (reports/evidence.py).

The headline counts the tests pytest ran (plus one ``infrastructure`` case per dead device) and, on
their own, the XDEV verdicts, which are derived over the devices rather than run: ``1005 tests: 1005
passed ...; XDEV: 50 verdicts, 50 passed``. JUnit carries both (its totals are their sum).
"""

from __future__ import annotations

import contextlib
import json
from collections import defaultdict
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape

from bmoe_ci.reports.evidence import evidence_href, href, write_evidence
from bmoe_ci.reports.journal import merge_journal
from bmoe_ci.reports.junit import (
    JUNIT_XML,
    device_dirs,
    device_run_from_junit,
    is_run_dir,
    merge,
    read_junit,
    salvage_junit,
    write_device_junit,
)
from bmoe_ci.reports.plan import INTERRUPTED, NOT_PLANNED, Plan, read_plan, reconcile
from bmoe_ci.reports.records import (
    DEVICE_JSON,
    INFRA_GATE,
    OUTCOMES,
    RUN_JSON,
    Counts,
    DeviceRun,
    ReportError,
    RunMeta,
    TestRecord,
    aggregate,
    atomic_write,
    read_device_json,
    read_run_json,
    salvage_device_json,
    write_json,
    write_run_json,
)
from bmoe_ci.reports.xdev import XDEV_GATE, disagreements, lone, with_xdev

SUMMARY_SCHEMA = "bmoe-ci.summary/1"
SUMMARY_JSON = "summary.json"
SUMMARY_MD = "summary.md"
MATRIX_SVG = "matrix.svg"

# Catalogue order of the gate ids (docs/gates.md); ids not listed here follow, sorted.
GATE_ORDER: tuple[str, ...] = (
    "G1",
    "G2",
    "G5",
    "G8a",
    "G8a'",
    "G8b",
    "G8c",
    "G8d",
    "G8e",
    "G8w",
    "REPLAY",
    "INV",
    "CFG",
    "DET",
    "REF",
    "XDEV",
    "BATCH-STDERR",
    "SCORE",
    "TOK",
    "BAD-DATA",
)

# What every evidence page links back to, when the run directory has it (relative to the run directory).
EVIDENCE_LINKS: tuple[tuple[str, str], ...] = (
    ("the nightly report", "report.html"),
    ("the run's summary", SUMMARY_MD),
    ("the device's JUnit", "{device}/junit.xml"),
)

_WORD = {"pass": "", "fail": "FAIL", "error": "ERR", "skip": "SKIP"}
_STATUS = {"pass": "PASS", "fail": "FAIL", "error": "ERROR", "skip": "SKIP"}
_NOT_RUN = "-"
_MAX_LISTED = 15


def gate_sort_key(gate: str) -> tuple[int, str]:
    try:
        return (GATE_ORDER.index(gate), "")
    except ValueError:
        return (len(GATE_ORDER), gate)


def human_bytes(n: int) -> str:
    """A size as people read it, the one form every report and console line uses: ``40.0 MiB``,
    ``12.3 KiB``, ``512 B`` (summary.json and the JUnit properties keep the bytes)."""
    if n >= 1048576:
        return f"{n / 1048576:.1f} MiB"
    return f"{n / 1024:.1f} KiB" if n >= 1024 else f"{n} B"


def plural(n: int, one: str, many: str | None = None) -> str:
    """``1 fixture``, ``3 fixtures``."""
    return f"{n} {one if n == 1 else (many or one + 's')}"


def fixture_counts(records: list[TestRecord]) -> dict[str, int]:
    """A gate's records on one device counted per fixture: each fixture's outcome is the worst of its
    tests (a test without a fixture counts as one of its own)."""
    worst: dict[str, list[str]] = defaultdict(list)
    for rec in records:
        worst[rec.fixture if rec.fixture is not None else f"\0{rec.name}"].append(rec.outcome)
    out = dict.fromkeys(OUTCOMES, 0)
    for outcomes in worst.values():
        out[aggregate(outcomes)] += 1
    return out


def cell_text(counts: dict[str, int]) -> str:
    """``{"pass": 2, "fail": 1}`` -> ``FAIL 1/3``; ``{"pass": 3}`` -> ``3/3``; nothing -> ``-``."""
    total = sum(counts.values())
    if total == 0:
        return _NOT_RUN
    verdict = aggregate(o for o, n in counts.items() if n)
    word = _WORD[verdict]
    return f"{word} {counts[verdict]}/{total}" if word else f"{counts['pass']}/{total}"


# ---------------------------------------------------------------------------- loading


def load_results(results_dir: Path | str) -> tuple[RunMeta | None, list[DeviceRun]]:
    """Read a results directory: every device (device.json, else rebuilt from its junit.xml; a
    junit.xml present must parse) and run.json when there is one. Raises :class:`ReportError`."""
    meta, runs, _ = _load(Path(results_dir), salvage=False)
    return meta, runs


def _load_device(dev_dir: Path, salvage: bool, notes: list[str]) -> DeviceRun:
    """One device directory: its files, then the tests its journal holds beyond them (a run killed
    between two rewrites of its files: bmoe_ci.reports.journal)."""
    run = _load_device_files(dev_dir, salvage, notes)
    merge_journal(run, dev_dir)
    return run


def _load_device_files(dev_dir: Path, salvage: bool, notes: list[str]) -> DeviceRun:
    """One device directory's device.json, else its junit.xml. With *salvage* (a run with a plan,
    whose losses the plan counts), a damaged file is read as far as it is valid instead of refused:
    device.json, else the whole junit.xml, else what is whole of either; the damage is said in
    *notes*."""
    dev_json, junit = dev_dir / DEVICE_JSON, dev_dir / JUNIT_XML
    try:
        if junit.is_file():
            read_junit(junit)
        return read_device_json(dev_json) if dev_json.is_file() else device_run_from_junit(junit)
    except ReportError as exc:
        if not salvage:
            raise
        damage = str(exc)
    with contextlib.suppress(ReportError):
        if dev_json.is_file():
            run = read_device_json(dev_json)
            notes.append(f"{damage} (ignored: {dev_dir.name}/{DEVICE_JSON} is whole and was used)")
            return run
    with contextlib.suppress(ReportError):
        if junit.is_file():
            run = device_run_from_junit(junit)
            notes.append(f"{damage} (its {dev_dir.name}/{JUNIT_XML} is whole and was used)")
            return run
    from_json, n_json = salvage_device_json(dev_json, dev_dir.name) if dev_json.is_file() else (None, 0)
    from_xml, n_xml = salvage_junit(junit) if junit.is_file() else (None, 0)
    salvaged = from_xml if from_xml is not None and (from_json is None or n_xml > n_json) else from_json
    run = salvaged if salvaged is not None else DeviceRun(device=dev_dir.name, arch="")
    notes.append(
        f"{damage}: damaged, {len(run.records)} whole result(s) read from it; "
        "the planned tests it does not hold count as interrupted"
    )
    return run


def _load(root: Path, salvage: bool) -> tuple[RunMeta | None, list[DeviceRun], list[str]]:
    if not root.exists():
        raise ReportError(f"{root}: no such directory")
    if not root.is_dir():
        raise ReportError(f"{root}: not a directory")
    runs: list[DeviceRun] = []
    notes: list[str] = []
    for dev_dir in device_dirs(root):
        run = _load_device(dev_dir, salvage, notes)
        if run.device != dev_dir.name:
            dev_json = dev_dir / DEVICE_JSON
            where = dev_json if dev_json.is_file() else dev_dir / JUNIT_XML
            raise ReportError(f"{where}: device {run.device!r} does not match its directory {dev_dir.name!r}")
        runs.append(run)
    if not runs:
        runs_below = any(is_run_dir(p) for p in root.iterdir())
        hint = " (a results root? pass one run's directory)" if runs_below else ""
        raise ReportError(f"{root}: no device results (no <device>/{DEVICE_JSON} or <device>/{JUNIT_XML}){hint}")
    meta_path = root / RUN_JSON
    meta = read_run_json(meta_path) if meta_path.is_file() else None
    return meta, runs, notes


def derive_run_meta(results_dir: Path | str, runs: list[DeviceRun]) -> RunMeta:
    """A RunMeta from the devices alone, for a directory without run.json."""
    builds = {r.target: r.engine_build_id for r in runs if r.target and r.engine_build_id}
    fixtures: dict[str, str] = {}
    for r in runs:
        fixtures.update(r.fixtures)
    return RunMeta(
        run=Path(results_dir).resolve().name,
        engine_builds=builds,
        fixtures=dict(sorted(fixtures.items())),
        faults=sorted({f for r in runs for f in r.faults}),
    )


# ---------------------------------------------------------------------------- the summary


def _order(meta: RunMeta, runs: list[DeviceRun]) -> list[DeviceRun]:
    """The devices as the farm file lists them (run.json ``devices``), then any other by name."""
    rank = {name: i for i, name in enumerate(meta.devices)}
    return sorted(runs, key=lambda r: (rank.get(r.device, len(rank)), r.device))


def _problem(rec: TestRecord) -> dict[str, Any]:
    page = evidence_href(rec)
    return {
        "device": rec.device,
        "gate": rec.gate,
        "fixture": rec.fixture,
        "name": rec.name,
        "outcome": rec.outcome,
        "message": rec.message,
        "artifacts": [f"{rec.device}/{a}" for a in rec.artifacts],
        "artifacts_dir": page.rsplit("/", 1)[0] + "/",
        "evidence": page,
    }


def build_summary(meta: RunMeta, runs: list[DeviceRun], interrupted: str | None = None) -> dict[str, Any]:
    """The content of summary.json (see docs/results.md for the schema). *interrupted*: why the run
    did not end (its status is then ``error``, whatever its tests did)."""
    runs = _order(meta, runs)
    gates: set[str] = set()
    devices: dict[str, Any] = {}
    problems: list[dict[str, Any]] = []
    totals = Counts()
    xdev_totals = Counts()
    for run in runs:
        counts = run.counts()
        totals = totals + counts
        xdev_totals = xdev_totals + Counts.of(r.outcome for r in run.records if r.gate == XDEV_GATE)
        per_gate: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(OUTCOMES, 0))
        by_gate: dict[str, list[TestRecord]] = defaultdict(list)
        for rec in run.records:
            per_gate[rec.gate][rec.outcome] += 1
            by_gate[rec.gate].append(rec)
        cells: dict[str, dict[str, Any]] = {}
        for rec in run.reported_records():
            if rec.outcome in ("fail", "error"):
                problems.append(_problem(rec))
        for gate, recs in by_gate.items():
            verdict = aggregate(r.outcome for r in recs)
            bad = [r for r in recs if r.outcome == verdict] if verdict in ("fail", "error") else []
            if bad:
                cells[gate] = {
                    "evidence": evidence_href(bad[0]),
                    "test": bad[0].name,
                    "message": bad[0].message,
                    "tests": len(bad),
                }
        gates.update(per_gate)
        ordered = sorted(per_gate, key=gate_sort_key)
        devices[run.device] = {
            "arch": run.arch,
            "os": run.os,
            "kind": run.kind,
            "target": run.target,
            "kernels": list(run.kernels),
            "engine_build_id": run.engine_build_id,
            "status": run.status,
            "infra_error": run.infra_error,
            "tests": counts.tests,
            "passed": counts.passed,
            "failed": counts.failed,
            "errors": counts.errors,
            "skipped": counts.skipped,
            "pushed_bytes": run.pushed_bytes,
            "verified_files": run.verified_files,
            "repushed": list(run.repushed),
            "retries": len(run.retries),
            "retry_notes": list(run.retries),
            "engine_s": round(run.engine_s, 3),
            "wall_s": round(run.wall_s, 3),
            "overhead_s": round(run.wall_s - run.engine_s, 3),
            "gates": {g: aggregate(o for o, n in per_gate[g].items() if n) for g in ordered},
            "gate_counts": {g: per_gate[g] for g in ordered},
            "gate_fixtures": {g: fixture_counts(by_gate[g]) for g in ordered},
            "cells": {g: cells[g] for g in ordered if g in cells},
            "outputs": dict(sorted(run.outputs.items())),
            "fixtures": dict(sorted(run.fixtures.items())),
            "faults": sorted(run.faults),
        }
        if run.infra_error is not None or not run.records:
            devices[run.device]["evidence"] = evidence_href(run.reported_records()[-1])

    groups: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for run in runs:
        for fixture, sha in run.outputs.items():
            groups[fixture][sha].append(run.device)
    output_groups = {f: {sha: sorted(devs) for sha, devs in sorted(g.items())} for f, g in sorted(groups.items())}
    cross_arch = {}
    for fixture, g in output_groups.items():
        archs = sorted({devices[d]["arch"] for devs in g.values() for d in devs})
        cross_arch[fixture] = {"archs": archs, "agree": len(g) == 1}

    status = aggregate(r.status for r in runs) if runs and interrupted is None else "error"
    judged = meta.xdev_fixtures
    found = [d for d in disagreements(runs) if judged is None or d.fixture in judged]
    return {
        "schema": SUMMARY_SCHEMA,
        "run": meta.run,
        "started": meta.started,
        "finished": meta.finished,
        "status": status,
        "interrupted": interrupted,
        "totals": {
            "devices": len(runs),
            **vars(totals),
            # XDEV verdicts on their own: derived over the devices, never run (included in the counts above)
            "xdev": {"verdicts": xdev_totals.tests, **{k: v for k, v in vars(xdev_totals).items() if k != "tests"}},
        },
        # fixtures XDEV had nothing to compare for (one device ran them), and whether the selection kept XDEV
        "xdev_lone": lone(runs, judged) if judged is None or judged else [],
        "xdev_selected": judged is None or bool(judged),
        "engine_builds": dict(sorted(meta.engine_builds.items())),
        "compiled": sorted(meta.compiled),
        "notes": list(meta.notes),
        "faults": sorted(set(meta.faults) | {f for r in runs for f in r.faults}),
        "fixtures": dict(sorted(meta.fixtures.items())),
        "gates": sorted(gates - {INFRA_GATE}, key=gate_sort_key),
        "devices": devices,
        "outputs_agree": {f: len(g) == 1 for f, g in output_groups.items()},
        "output_groups": output_groups,
        "outputs_cross_arch": cross_arch,
        "disagreements": [d.to_dict() for d in found],
        "problems": problems,
    }


def exit_code(summary_data: dict[str, Any]) -> int:
    """0 when nothing failed or errored (skips are not failures), 1 otherwise."""
    t = summary_data["totals"]
    if summary_data.get("interrupted"):  # a run that did not end never reads as green
        return 1
    return 0 if t["failed"] == 0 and t["errors"] == 0 and t["devices"] > 0 else 1


# ---------------------------------------------------------------------------- rendering


def _cell_counts(d: dict[str, Any], gate: str) -> dict[str, int]:
    """What a matrix cell counts: fixtures (``gate_fixtures``; a summary written before it: tests)."""
    return (d.get("gate_fixtures") or d["gate_counts"]).get(gate, {})


def _status_text(d: dict[str, Any]) -> str:
    return _STATUS[d["status"]] + (" (fault)" if d.get("faults") else "")


def _matrix_rows(s: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    header = ["device", "arch", *s["gates"], "status"]
    rows = []
    for name, d in s["devices"].items():
        cells = [cell_text(_cell_counts(d, g)) for g in s["gates"]]
        rows.append([name, d["arch"], *cells, _status_text(d)])
    return header, rows


def counts_text(t: dict[str, Any], xdev_note: str = "") -> str:
    """``5 device(s), 1005 tests: 1005 passed, 0 failed, 0 errors, 0 skipped; XDEV: 50 verdicts, 50
    passed``: the tests pytest ran (and infrastructure cases), then the XDEV verdicts on their own.
    *t*: summary.json's ``totals``; *xdev_note*: said instead of the XDEV counts when there are none
    (one device: nothing to compare)."""
    x = t.get("xdev") or {"verdicts": 0, "passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    tests = t["tests"] - x["verdicts"]
    text = (
        f"{t['devices']} device(s), {plural(tests, 'test')}: {t['passed'] - x['passed']} passed, "
        f"{t['failed'] - x['failed']} failed, {plural(t['errors'] - x['errors'], 'error')}, "
        f"{t['skipped'] - x['skipped']} skipped"
    )
    if x["verdicts"]:
        parts = [f"{x['passed']} passed"] + [
            f"{x[k]} {word}" for k, word in (("failed", "failed"), ("errors", "errors"), ("skipped", "skipped")) if x[k]
        ]
        text += f"; XDEV: {plural(x['verdicts'], 'verdict')}, {', '.join(parts)}"
    elif xdev_note:
        text += f"; XDEV: {xdev_note}"
    return text


def xdev_note(s: dict[str, Any]) -> str:
    """Why a run has no XDEV verdict, when it has none but could have had (empty otherwise)."""
    if (s["totals"].get("xdev") or {}).get("verdicts"):
        return ""
    if s.get("xdev_lone"):
        return "nothing to compare (one device ran each fixture)"
    return ""


def _headline(s: dict[str, Any]) -> str:
    # a fault-injected engine is never shown as a plain green run
    faults = s.get("faults") or []
    built = f" (FAULT BUILD: {', '.join(faults)})" if faults else ""
    if s.get("interrupted"):
        built += " (INTERRUPTED)"
    return f"{_STATUS[s['status']]}{built}: {counts_text(s['totals'], xdev_note(s))}"


def _agreement_line(s: dict[str, Any]) -> str:
    cross = s["outputs_cross_arch"]
    if not cross:
        return "outputs: no reference outputs recorded"
    differ = [f for f, c in cross.items() if not c["agree"]]
    archs = sorted({a for c in cross.values() for a in c["archs"]})
    if differ:
        return f"outputs: DIFFER across devices for {', '.join(differ)} (of {plural(len(cross), 'fixture')})"
    where = f"across {' and '.join(archs)}" if len(archs) > 1 else f"on {archs[0] if archs else '?'} only"
    if len(cross) == 1:
        return f"outputs: {next(iter(cross))} identical {where}"
    return f"outputs: all {len(cross)} fixtures identical {where}"


#: The console matrix is laid out to fit this many columns unless told the terminal's width.
CONSOLE_WIDTH = 100


def _layout(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    return ["  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in [header, *rows]]


def matrix_lines(s: dict[str, Any], width: int = CONSOLE_WIDTH) -> list[str]:
    """The device x gate matrix as text no wider than *width* when it can be: devices as rows when
    that fits; else, with three devices or more, gates as rows (a column per device) when that fits;
    else (one or two devices: a gates-as-rows table would be long and thin) the rows cut into blocks of
    gate columns, one under the other, each starting with the device's name."""
    header, rows = _matrix_rows(s)
    lines = _layout(header, rows)
    if max(map(len, lines)) <= width or not rows:
        return lines
    names = [r[0] for r in rows]
    t_rows = [["arch", *(r[1] for r in rows)]]
    t_rows += [[g, *(r[2 + i] for r in rows)] for i, g in enumerate(s["gates"])]
    t_rows.append(["status", *(r[-1] for r in rows)])
    transposed = _layout(["gate", *names], t_rows)
    if len(rows) >= 3 and max(map(len, transposed)) <= width:
        return transposed
    return _blocks(header, rows, width)


def _blocks(header: list[str], rows: list[list[str]], width: int) -> list[str]:
    """Devices as rows, the gate columns cut into blocks that fit *width* (the device and arch columns
    start each block; the status is the last block's last column)."""
    lead = max(len(str(r[0])) for r in [header, *rows]), max(len(str(r[1])) for r in [header, *rows])
    cols = [[str(r[i]) for r in [header, *rows]] for i in range(2, len(header))]
    out: list[str] = []
    chunk: list[list[str]] = []
    used = lead[0] + 2 + lead[1]

    def flush() -> None:
        table = [[r[0], r[1], *(c[i] for c in chunk)] for i, r in enumerate([header, *rows])]
        if out:
            out.append("")
        out.extend(_layout(table[0], table[1:]))

    for col in cols:
        w = 2 + max(map(len, col))
        if chunk and used + w > width:
            flush()
            chunk, used = [], lead[0] + 2 + lead[1]
        chunk.append(col)
        used += w
    if chunk:
        flush()
    return out


_PROBLEM_CHARS = 160  # of a reason on the console (the evidence page has all of it)


def _problem_line(p: dict[str, Any]) -> str:
    what = "infrastructure" if p["gate"] == INFRA_GATE else p["name"]
    where = f"  -> {p['artifacts_dir']}" if p.get("artifacts_dir") else ""
    message = p["message"] if len(p["message"]) <= _PROBLEM_CHARS else p["message"][: _PROBLEM_CHARS - 1] + "…"
    return f"  {_STATUS[p['outcome']]} {p['device']} {what}: {message}{where}"


def console_matrix(s: dict[str, Any], width: int = CONSOLE_WIDTH) -> str:
    """A compact text matrix for the end of a pytest run or ``bmoe-ci report``, laid out for a
    terminal *width* columns wide. Each failure and error follows on a line of its own: the first line
    of its reason, then its evidence directory (relative to the results directory)."""
    lines = [f"bmoe-ci run {s['run']}: {_headline(s)}", *matrix_lines(s, width)]
    for p in s["problems"][:_MAX_LISTED]:
        lines.append(_problem_line(p))
    if len(s["problems"]) > _MAX_LISTED:
        lines.append(f"  ... and {len(s['problems']) - _MAX_LISTED} more (see {SUMMARY_MD})")
    lines.append(_agreement_line(s))
    for d in s["disagreements"][:_MAX_LISTED]:
        lines.append(
            f"  XDEV {d['fixture']} {d['entry']} {d['field']}: {_values_text(d['values'])} "
            f"(minority: {', '.join(d['minority'])})"
        )
    if len(s["disagreements"]) > _MAX_LISTED:
        lines.append(f"  ... and {len(s['disagreements']) - _MAX_LISTED} more disagreements (see {SUMMARY_MD})")
    lines += [f"note: {n}" for n in s.get("notes", [])]
    return "\n".join(lines)


def _values_text(values: dict[str, Any]) -> str:
    """``{"a": <sha256>, "b": 3}`` -> ``a=0123456789ab b=3`` (digests shortened to 12 characters)."""

    def short(v: Any) -> str:
        return v[:12] if isinstance(v, str) and len(v) == 64 else str(v)

    return " ".join(f"{dev}={short(v)}" for dev, v in values.items())


def _md(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    out = ["| " + " | ".join(_md(h) for h in header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(_md(c) for c in row) + " |" for row in rows]
    return out


def _md_link(text: str, target: str) -> str:
    label = text.replace("[", "\\[").replace("]", "\\]")
    return f"[{label}]({href(target)})"


def markdown(s: dict[str, Any]) -> str:
    """summary.md."""
    lines = [f"# bmoe-ci results: run {s['run']}", "", f"**{_headline(s)}**", ""]
    if s["started"] or s["finished"]:
        lines += [f"Started {s['started'] or '?'}, finished {s['finished'] or '?'}.", ""]
    if s.get("notes"):
        lines += [f"- {_md(n)}" for n in s["notes"]] + [""]
    lines += [f"![device x gate matrix]({MATRIX_SVG})", "", "## Device x gate", ""]
    header, rows = _matrix_rows(s)
    body = []
    for (name, d), row in zip(s["devices"].items(), rows, strict=True):
        cells = []
        for gate, text in zip(s["gates"], row[2:-1], strict=True):
            cell = (d.get("cells") or {}).get(gate)
            if cell:  # a failed or errored cell: a link to its first failing test's evidence
                cells.append(f"**{_md_link(text, cell['evidence'])}**")
            else:
                cells.append(text if text == _NOT_RUN or text[0].isdigit() else f"**{text}**")
        status = row[-1] if d["status"] == "pass" and not d.get("faults") else f"**{row[-1]}**"
        body.append([name, row[1], *cells, status])
    lines += [
        "| " + " | ".join(_md(h) for h in header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(str(c) for c in r) + " |" for r in body),
    ]
    lines += [
        "",
        "A cell counts the fixtures the gate ran on (a fixture's outcome is the worst of the gate's tests "
        "on it; a gate without fixtures counts its tests): `3/3` all passed; `2/3` two passed and the rest "
        "were skipped; `FAIL 1/3`, `ERR 1/3`, `SKIP 3/3` give the worst outcome and how many fixtures had "
        "it, and link to the evidence of the first that did; `-` the gate did not run on that device.",
        "",
        "## Devices",
        "",
    ]
    dev_rows = []
    for name, d in s["devices"].items():
        dev_rows.append(
            [
                name,
                d["arch"],
                d["os"],
                d["kind"],
                d["tests"],
                d["passed"],
                d["failed"],
                d["errors"],
                d["skipped"],
                human_bytes(d["pushed_bytes"]),
                f"{d['engine_s']:.2f}",
                f"{d['wall_s']:.2f}",
                f"{d['overhead_s']:.2f}",
            ]
        )
    lines += _table(
        [
            "device",
            "arch",
            "os",
            "kind",
            "tests",
            "passed",
            "failed",
            "errors",
            "skipped",
            "pushed",
            "engine s",
            "wall s",
            "overhead s",
        ],
        dev_rows,
    )
    lines += [
        "",
        "A device's tests include its XDEV verdicts (as its JUnit testsuite does). Overhead is the wall time "
        "of the device's session minus the engine's own time on it.",
        "",
    ]
    verified = ", ".join(f"{n} {d.get('verified_files', 0)}" for n, d in s["devices"].items())
    lines += [f"Stored files verified on the device (sha256) before use: {verified}.", ""]
    repushed = [(n, what) for n, d in s["devices"].items() for what in d.get("repushed", [])]
    if repushed:
        lines += ["Found corrupted on the device, re-pushed and verified again:", ""]
        lines += [f"- {n}: {what}" for n, what in repushed] + [""]
    retried = [(n, what) for n, d in s["devices"].items() for what in d.get("retry_notes", [])]
    if retried:
        lines += ["Transient failures retried (connect, upload):", ""]
        lines += [f"- {n}: {what}" for n, what in retried] + [""]
    if s["problems"]:
        lines += ["## Failures and errors", ""]
        lines += [
            "| device | test | outcome | reason | evidence |",
            "|---|---|---|---|---|",
        ]
        for p in s["problems"]:
            what = "infrastructure" if p["gate"] == INFRA_GATE else p["name"]
            links = [_md_link("evidence", p["evidence"])] if p.get("evidence") else []
            links += [_md_link(Path(a).name, a) for a in p["artifacts"]]
            lines.append(
                f"| {_md(p['device'])} | {_md(what)} | {_STATUS[p['outcome']]} | {_md(p['message'])} | "
                + " ".join(links)
                + " |"
            )
        lines += [
            "",
            "A failure is a wrong engine result; an error is infrastructure (unreachable, timeout, died). "
            "Each evidence page has the whole reason and the files the test saved.",
            "",
        ]
    lines += ["## Engine builds", ""]
    build_rows = []
    targets = sorted(set(s["engine_builds"]) | {d["target"] for d in s["devices"].values() if d["target"]})
    for target in targets:
        bid = s["engine_builds"].get(target, "")
        on = []
        for name, d in s["devices"].items():
            if d["target"] == target:
                shown = name if not bid or d["engine_build_id"] == bid else f"{name} (build {d['engine_build_id']})"
                on.append(f"{shown}: {'+'.join(d['kernels'])}" if d.get("kernels") else shown)
        build_rows.append([target, bid or "?", "compiled" if target in s["compiled"] else "cached", ", ".join(on)])
    lines += _table(["target", "build id", "this run", "devices"], build_rows)
    if s["fixtures"]:
        lines += ["", "## Fixtures", ""]
        lines += _table(["fixture", "sha256"], [[f, f"`{h}`"] for f, h in s["fixtures"].items()])
    lines += ["", "## Cross-device output agreement", "", _agreement_line(s), ""]
    if s["output_groups"]:
        arch_of = {n: d["arch"] for n, d in s["devices"].items()}
        rows_o = []
        for fixture, groups in s["output_groups"].items():
            cross = s["outputs_cross_arch"][fixture]
            archs = " and ".join(cross["archs"])
            if not cross["agree"]:
                verdict = f"**DIFFER** ({len(groups)} outputs)"
            elif len(cross["archs"]) > 1:
                verdict = f"identical across {archs}"
            else:
                verdict = f"identical ({archs} only)"
            outs = "; ".join(
                f"`{sha[:12]}`: " + ", ".join(f"{d} ({arch_of.get(d, '?')})" for d in devs)
                for sha, devs in groups.items()
            )
            rows_o.append([fixture, verdict, outs])
        lines += _table(["fixture", "verdict", "output sha256: devices (arch)"], rows_o)
    if s["disagreements"]:
        lines += ["", "## XDEV: what differed between devices", ""]
        rows_d = [
            [d["fixture"], d["entry"], d["field"], _values_text(d["values"]), ", ".join(d["minority"])]
            for d in s["disagreements"]
        ]
        lines += _table(["fixture", "plan entry", "field", "values", "minority (fails XDEV)"], rows_d)
    elif s.get("xdev_lone") and not (s["totals"].get("xdev") or {}).get("verdicts"):
        lines += ["", f"XDEV: {xdev_note(s)}: no verdict (only cross-device comparisons are XDEV's).", ""]
    return "\n".join(lines) + "\n"


_FAULT_BUILD = "#9a6700"
_COLOURS = {"pass": "#2da44e", "fail": "#cf222e", "error": "#bc4c00", "skip": "#8c959f", None: "#eaeef2"}


CellStyle = Callable[[int, int], tuple[str, str]]
CellLink = Callable[[int, int], tuple[str, str] | None]


def svg_table(
    title: str, header: list[str], rows: list[list[Any]], style: CellStyle, link: CellLink | None = None
) -> str:
    """A titled table as a self-contained SVG picture (the run's matrix, the mutants' matrix).
    `style(row, column)` gives a body cell's (fill, text colour); the header row is grey, and the
    header and the last column are bold. `link(row, column)`: (href, tooltip) of a body cell that
    links somewhere (a failed cell: its evidence), or None."""
    char, pad, row_h, title_h = 7.4, 10, 24, 30
    widths = [max(48.0, max(len(str(r[i])) for r in [header, *rows]) * char + 2 * pad) for i in range(len(header))]
    width = int(max(sum(widths), len(title) * (char + 0.6) + 8)) + 2
    height = title_h + row_h * (len(rows) + 1) + 2
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" xmlns:xlink="http://www.w3.org/1999/xlink" width="{width}" '
        f'height="{height}" font-family="DejaVu Sans Mono, Menlo, Consolas, monospace" font-size="12">',
        f'<rect width="{width}" height="{height}" fill="#ffffff"/>',
        f'<text x="4" y="19" font-size="13" font-weight="bold">{escape(title)}</text>',
    ]
    for ri, row in enumerate([header, *rows]):
        y = title_h + ri * row_h
        x = 1.0
        for ci, text in enumerate(row):
            fill, colour = ("#f6f8fa", "#1f2328") if ri == 0 else style(ri - 1, ci)
            target = link(ri - 1, ci) if link is not None and ri > 0 else None
            if target is not None:
                url = escape(target[0], {'"': "&quot;"})
                out.append(f'<a href="{url}" xlink:href="{url}"><title>{escape(target[1])}</title>')
            out.append(
                f'<rect x="{x:.1f}" y="{y}" width="{widths[ci]:.1f}" height="{row_h}" fill="{fill}" stroke="#d0d7de"/>'
            )
            weight = ' font-weight="bold"' if ri == 0 or ci == len(row) - 1 else ""
            deco = ' text-decoration="underline"' if target is not None else ""
            out.append(f'<text x="{x + pad:.1f}" y="{y + 16}" fill="{colour}"{weight}{deco}>{escape(str(text))}</text>')
            if target is not None:
                out.append("</a>")
            x += widths[ci]
    out.append("</svg>")
    return "\n".join(out) + "\n"


def matrix_svg(s: dict[str, Any]) -> str:
    """The device x gate matrix as a self-contained SVG picture; a failed or errored cell links to the
    evidence of its first failing test (relative to the results directory, where the picture is)."""
    header, rows = _matrix_rows(s)
    devices = list(s["devices"].values())

    def style(row: int, col: int) -> tuple[str, str]:
        device = devices[row]
        if 2 <= col < len(header) - 1:
            verdict = device["gates"].get(s["gates"][col - 2])
            return _COLOURS[verdict], ("#ffffff" if verdict else "#57606a")
        if col == len(header) - 1:  # a fault build is never green
            return (_FAULT_BUILD if device.get("faults") else _COLOURS[device["status"]]), "#ffffff"
        return "#ffffff", "#1f2328"

    def link(row: int, col: int) -> tuple[str, str] | None:
        device = devices[row]
        if 2 <= col < len(header) - 1:
            cell = (device.get("cells") or {}).get(s["gates"][col - 2])
            if cell:
                return href(cell["evidence"]), f"{cell['test']}: {cell['message']}"
        if col == len(header) - 1 and device.get("evidence"):
            return href(device["evidence"]), device.get("infra_error") or ""
        return None

    return svg_table(f"run {s['run']}: {_headline(s)}", header, rows, style, link)


# ---------------------------------------------------------------------------- writing


def _write(results_dir: Path, meta: RunMeta, runs: list[DeviceRun], interrupted: str | None = None) -> dict[str, Any]:
    data = build_summary(meta, runs, interrupted)
    write_json(results_dir / SUMMARY_JSON, data)
    atomic_write(results_dir / SUMMARY_MD, markdown(data).encode("utf-8"))
    atomic_write(results_dir / MATRIX_SVG, matrix_svg(data).encode("utf-8"))
    records = [rec for run in runs for rec in run.reported_records()]
    write_evidence(results_dir, meta.run, records, EVIDENCE_LINKS)
    # last: a run.json with `finished` is what says a session wrote its summary to the end (rebuild)
    write_run_json(results_dir, meta)
    return data


def summary(results_dir: Path | str, run_meta: RunMeta, *, absolute: bool = False) -> dict[str, Any]:
    """Write summary.json, summary.md, matrix.svg and run.json for the devices found in *results_dir*;
    returns the summary.json content (pass it to :func:`console_matrix`). XDEV is derived over those
    devices and written into their junit.xml and device.json (and the merged junit.xml)."""
    _, runs = load_results(results_dir)
    return _judge_and_write(Path(results_dir), run_meta, runs, absolute=absolute)


def finalize(
    results_dir: Path | str, device_runs: list[DeviceRun], run_meta: RunMeta, *, absolute: bool = False
) -> dict[str, Any]:
    """End of a session in one call: every device's junit.xml + device.json, the merged junit.xml, the
    summary files. Merge and summary cover every device directory in *results_dir* (use a fresh
    directory per run). ``absolute``: attachments by absolute path. Returns the summary.json content."""
    root = Path(results_dir)
    for run in device_runs:
        write_device_junit(root, run, absolute=absolute)
    return summary(root, run_meta, absolute=absolute)


def rebuild(results_dir: Path | str, *, absolute: bool = False) -> dict[str, Any]:
    """What ``bmoe-ci report`` does: re-derive XDEV, re-merge and re-summarise from the directory alone."""
    root = Path(results_dir)
    plan = read_plan(root)
    # a run with a plan: damaged files are read as far as they are valid, the plan counts the rest
    meta, runs, notes = _load(root, salvage=plan is not None)
    interrupted: str | None = None
    if plan is not None:  # a killed run: what never finished is an error, and counts add up to the plan
        reconcile(runs, plan)
        interrupted = _interruption(plan, meta, runs)
    meta = meta or derive_run_meta(root, runs)
    if notes:
        meta = replace(meta, notes=[*meta.notes, *(n for n in notes if n not in meta.notes)])
    return _judge_and_write(root, meta, runs, interrupted, absolute=absolute)


_SOME_INTERRUPTED = "run interrupted: some planned tests did not run to the end"


def _interruption(plan: Plan, meta: RunMeta | None, runs: list[DeviceRun]) -> str | None:
    """Why a planned run did not end, or None. The session writes run.json, with `finished`, after
    everything else (so a run killed even while writing its summary, every test recorded, still
    reads as interrupted); `bmoe-ci report` keeps `finished` unset for a run that never set it."""
    if plan.pending:
        return NOT_PLANNED
    if any(r.message == INTERRUPTED for run in runs for r in run.records):
        return _SOME_INTERRUPTED
    if meta is None or meta.finished is None:
        return "run interrupted: the session did not write its summary to the end"
    return None


def _judge_and_write(
    root: Path, meta: RunMeta, runs: list[DeviceRun], interrupted: str | None = None, *, absolute: bool = False
) -> dict[str, Any]:
    """XDEV is a verdict on the devices of the whole directory: derive it over all of them, write it into
    each device's junit.xml and device.json, then merge and summarise. A planned test that did not run
    to the end (a session stopped by -x or Ctrl-C, reconciled at its end) makes the run interrupted in
    the session's own summary as in any later report of it."""
    if interrupted is None and any(r.message == INTERRUPTED for run in runs for r in run.records):
        interrupted = _SOME_INTERRUPTED
    runs = with_xdev(runs, meta.xdev_fixtures)
    for run in runs:
        write_device_junit(root, run, absolute=absolute)
    merge(root, absolute=absolute)
    return _write(root, meta, runs, interrupted)


def summary_json(s: dict[str, Any]) -> str:
    return json.dumps(s, indent=2) + "\n"
