"""``bmoe-ci report --merge SHARD... --out DIR``: several shards' results (one nightly or gate run each,
typically one per runner of a large farm) made into one report.

The device directories are copied side by side into DIR (a device name may appear in one shard only),
the usual results files are rebuilt from them, and when the shards are nightlies their classification
lists are concatenated. Cross-device agreement is recomputed over all devices, since two shards can
disagree with each other. The merged counts must equal the sum of the shards' counts: a mismatch is an
error, never a report. XDEV is the one gate whose verdicts may move or appear (a shard with one device
has none: nothing to compare; the merge compares that device with the others), so its records are left
out of the comparison.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from bmoe_ci.nightly.classify import disagreements_from_outputs, disagreements_from_summary
from bmoe_ci.nightly.history import GREEDY_ENTRY, OutputRow
from bmoe_ci.nightly.report import CLASSES, NIGHTLY_JSON, NIGHTLY_SCHEMA, write_report
from bmoe_ci.nightly.run import EXIT_NEW, EXIT_NO_VERDICT, EXIT_OK, decide_exit, device_facts_table
from bmoe_ci.reports import ReportError, load_results, rebuild
from bmoe_ci.reports.junit import device_dirs
from bmoe_ci.reports.records import Counts, DeviceRun, read_json
from bmoe_ci.reports.xdev import XDEV_GATE

_TOTALS = ("devices", "tests", "passed", "failed", "errors", "skipped")


def _counts(runs: list[DeviceRun]) -> dict[str, int]:
    """Devices, and the tests and outcomes of every test but XDEV (re-judged over all shards)."""
    recs = [r for run in runs for r in run.reported_records() if r.gate != XDEV_GATE]
    c = Counts.of(r.outcome for r in recs)
    return {
        "devices": len(runs),
        "tests": len(recs),
        "passed": c.passed,
        "failed": c.failed,
        "errors": c.errors,
        "skipped": c.skipped,
    }


def _shard_nightly(shard: Path) -> dict[str, Any] | None:
    path = shard / NIGHTLY_JSON
    return read_json(path) if path.is_file() else None


def merge_shards(shards: list[Path], out: Path, *, absolute: bool = False) -> tuple[int, Path]:
    """Merge *shards* into *out* (which must not exist or be empty); returns (exit code, report path);
    ``absolute``: attachments by absolute path in the JUnit files.
    Raises :class:`ReportError` on a bad shard, a device in two shards, or counts that do not add up."""
    if len(shards) < 2:
        raise ReportError("--merge needs at least two shard directories")
    if out.exists() and any(out.iterdir()):
        raise ReportError(f"{out}: the merge output directory must be new or empty")
    expected = dict.fromkeys(_TOTALS, 0)
    nightlies: list[dict[str, Any]] = []
    owner: dict[str, Path] = {}
    for shard in shards:
        _, runs = load_results(shard)  # validates the shard, names the bad file
        if not (shard / "summary.json").is_file():
            rebuild(shard, absolute=absolute)
            _, runs = load_results(shard)
        for key, value in _counts(runs).items():
            expected[key] += value
        for run in runs:
            if run.device in owner:
                raise ReportError(f"{shard}: device {run.device!r} is also in shard {owner[run.device]}")
            owner[run.device] = shard
        nightly = _shard_nightly(shard)
        if nightly is not None:
            nightlies.append(nightly)
    out.mkdir(parents=True, exist_ok=True)
    for shard in shards:
        for dev_dir in device_dirs(shard):
            shutil.copytree(dev_dir, out / dev_dir.name)
    summary = rebuild(out, absolute=absolute)
    merged_runs = load_results(out)[1]
    got = _counts(merged_runs)
    if got != expected:
        raise ReportError(f"{out}: merged counts {got} differ from the sum of the shards {expected}")
    n = merged_nightly(out.resolve().name, nightlies, summary, out)
    return n["exit_code"], write_report(out, n, summary, [], runs=merged_runs)


def merged_nightly(run: str, shards: list[dict[str, Any]], summary: dict[str, Any], out: Path) -> dict[str, Any]:
    """nightly.json of the merged report: the shards' lists concatenated, totals and agreement from
    the merged summary."""
    n: dict[str, Any] = {
        "schema": NIGHTLY_SCHEMA,
        "run": run,
        "pool": "+".join(s["pool"] for s in shards) or "merged",
        "shards": [s["run"] for s in shards],
        "started": summary["started"],
        "finished": summary["finished"],
        "git_commit": ",".join(sorted({s["git_commit"] for s in shards if s["git_commit"]})),
        "git_dirty": any(s["git_dirty"] for s in shards),
        "farm_sha256": "",
        # a shard's fault build makes the merged report a fault build: it must never read as the real engine
        "faults": sorted({f for s in shards for f in s.get("faults") or []} | set(summary.get("faults") or [])),
        "engine_builds": summary["engine_builds"],
        "verdicts": any(s["verdicts"] for s in shards) or not shards,
        "no_verdict_reason": "; ".join(s["no_verdict_reason"] for s in shards if s["no_verdict_reason"]),
        "totals": summary["totals"],
        "devices": device_facts_table(summary, out),
        "output_changes": [],
        "changed_archs": {},
        "mutation_score": None,
    }
    for key, _, _ in CLASSES:
        n[key] = [f for s in shards for f in s[key]]
    _merge_commit_range(n, shards)
    for s in shards:
        n["output_changes"] += s["output_changes"]
        for arch, d in s["changed_archs"].items():
            mine = n["changed_archs"].setdefault(arch, {"expected": [], "unexpected": []})
            for k in ("expected", "unexpected"):
                mine[k] = sorted(set(mine[k]) | set(d[k]))
    scores = [s["mutation_score"] for s in shards if s["mutation_score"]]
    if scores:
        n["mutation_score"] = {
            "caught": sum(m["caught"] for m in scores),
            "total": sum(m["total"] for m in scores),
            "devices": [d for m in scores for d in m["devices"]],
        }
    found = disagreements_from_summary(summary)
    if found is None:
        rows = [
            OutputRow(
                run=run,
                device=dev,
                arch=d["arch"],
                fixture=f,
                entry=GREEDY_ENTRY,
                sha256=sha,
                engine_build_id=d["engine_build_id"],
            )
            for dev, d in summary["devices"].items()
            for f, sha in d["outputs"].items()
        ]
        found = disagreements_from_outputs(rows)
        n["disagreement_source"] = "per-device outputs"
    else:
        n["disagreement_source"] = "summary.json disagreements"
    n["disagreements"] = [d.to_dict() for d in found]
    if not shards:  # plain gate runs: no history to compare with, so every failure counts
        n["exit_code"] = EXIT_NEW if summary["totals"]["failed"] or n["disagreements"] else EXIT_OK
    elif all(s["exit_code"] == EXIT_NO_VERDICT for s in shards):
        n["exit_code"] = EXIT_NO_VERDICT
    else:
        n["exit_code"] = decide_exit(n)
    return n


def _merge_commit_range(n: dict[str, Any], shards: list[dict[str, Any]]) -> None:
    """The shards' commit range when they agree on it (each shard has its own history, so its own previous
    run); when they do not, the merged report names the commits only."""
    if not shards or any("commit_range" not in s for s in shards):
        return
    ranges = [s["commit_range"] for s in shards]
    if all(r is None for r in ranges):
        n["commit_range"] = None
        return
    if any(r is None for r in ranges):
        return
    spans = {(r["from"], r["to"], r["count"]) for r in ranges}
    if len(spans) == 1:
        old, new, count = spans.pop()
        n["commit_range"] = {
            "previous_run": ", ".join(r["previous_run"] for r in ranges),
            "from": old,
            "to": new,
            "count": count,
        }
