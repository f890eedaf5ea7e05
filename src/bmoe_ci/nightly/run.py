"""``bmoe-ci nightly``: run the gate suite on a pool, record it in the history, classify, report.

The gates run through the gate suite itself (``pytest gates --bmoe-device pool:P``, a subprocess started
by :func:`bmoe_ci.gaterun.suite.run_gate_suite`): there is no second implementation of any gate here.
Exit status: 0 nothing new failed and the devices agree, 1 a new failure or a cross-device
disagreement, 2 a usage or configuration error, 3 no verdicts.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from bmoe_ci.farm import FarmError, default_run_id, load_farm, select_devices
from bmoe_ci.faults import CatalogueError, load_catalogue
from bmoe_ci.gaterun.suite import SuiteCall, run_gate_suite, suite_command
from bmoe_ci.nightly.classify import (
    Classification,
    FlakyPolicy,
    changed_archs,
    classify,
    disagreements_from_outputs,
    disagreements_from_summary,
    output_changes,
)
from bmoe_ci.nightly.history import History, MutationScore, gave_verdict, run_record
from bmoe_ci.nightly.report import (
    CLASSES,
    NIGHTLY_JSON,
    NIGHTLY_SCHEMA,
    TREND_RUNS,
    import_matplotlib,
    verdict_line,
    write_index,
    write_report,
)
from bmoe_ci.nightly.testhistory import collect as collect_histories
from bmoe_ci.paths import Places
from bmoe_ci.reports import ReportError, load_results
from bmoe_ci.reports.junit import JUNIT_XML
from bmoe_ci.reports.records import RUN_JSON, DeviceRun, RunMeta, read_json
from bmoe_ci.reports.summary import SUMMARY_JSON

EXIT_OK, EXIT_NEW, EXIT_USAGE, EXIT_NO_VERDICT = 0, 1, 2, 3
MUTANTS_JSON = "mutants.json"
MUTANTS_SCHEMA = "bmoe-ci.mutants/1"


class NightlyUsageError(Exception):
    """Bad options or configuration: one line, exit 2."""


@dataclass(frozen=True, kw_only=True)
class NightlyOptions:
    history: Path
    pool: str = "nightly"
    # --device SEL (the gate suite's selector) instead of a pool: the history keeps it as the pool
    # `device:SEL,...`, so a night is compared with the nights of the same selection
    devices: tuple[str, ...] = ()
    farm: Path | None = None
    fixtures: tuple[str, ...] = ()
    faults: tuple[str, ...] = ()
    mutants: bool = False
    mutant_faults: tuple[str, ...] = ()  # with mutants: only these faults of the catalogue (default all)
    keep: int | None = None
    workers: int | None = None
    flaky: FlakyPolicy = field(default_factory=FlakyPolicy)
    places: Places = field(default_factory=Places)  # as the command line read them from the environment


@dataclass(frozen=True)
class NightlyResult:
    exit_code: int
    report: Path
    nightly: dict[str, Any]


def _log(msg: str) -> None:
    print(f"bmoe-ci nightly: {msg}", file=sys.stderr, flush=True)


def _git_state(repo: Path) -> tuple[str, bool]:
    try:
        commit = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, check=True, timeout=30
        ).stdout.strip()
        dirty = (
            subprocess.run(
                ["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                capture_output=True,
                text=True,
                check=True,
                timeout=30,
            ).stdout.strip()
            != ""
        )
    except (OSError, subprocess.SubprocessError):
        return "", False
    return commit, dirty


def _farm_path(opts: NightlyOptions) -> Path:
    if opts.farm is not None:
        return opts.farm
    from bmoe_ci.farm.embedded import farm_file

    return farm_file(places=opts.places)


def read_mutants(path: Path) -> MutationScore:
    """One ``mutants.json`` (schema bmoe-ci.mutants/1) as a score; ReportError names the file."""
    data = read_json(path)
    if not isinstance(data, dict) or data.get("schema") != MUTANTS_SCHEMA:
        raise ReportError(f"{path}: not a {MUTANTS_SCHEMA} file")
    try:
        score = data["score"]
        caught, total = int(score["caught"]), int(score["total"])
        device, arch = str(data["device"]), str(data["arch"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ReportError(f"{path}: missing or bad key {exc}") from None
    if not 0 <= caught <= total:
        raise ReportError(f"{path}: score {caught}/{total} is impossible")
    return MutationScore(device=device, arch=arch, caught=caught, total=total)


def _run_mutants(opts: NightlyOptions, run_dir: Path, devices: dict[str, str]) -> tuple[list[MutationScore], str]:
    """The mutation catalogue on one reached device per architecture (*devices*: arch -> device)."""
    scores, problems = [], []
    for arch, device in sorted(devices.items()):
        out = run_dir / "mutants" / device
        cmd = [sys.executable, "-m", "bmoe_ci.cli", "mutants", "--device", device, "--results", str(out)]
        if opts.farm:
            cmd += ["--farm", str(opts.farm)]
        for f in opts.fixtures:
            cmd += ["--fixture", f]
        for f in opts.mutant_faults:
            cmd += ["--fault", f]
        _log(f"mutants on {device} ({arch})")
        proc = subprocess.run(cmd, stdout=sys.stderr, check=False)
        if proc.returncode in (0, 1) and (out / MUTANTS_JSON).is_file():
            scores.append(read_mutants(out / MUTANTS_JSON))
        else:
            problems.append(f"{device}: bmoe-ci mutants exited {proc.returncode}")
            _log(f"mutation score incomplete: {problems[-1]}")
    return scores, "; ".join(problems)


def gate_call(opts: NightlyOptions, run_dir: Path, n_devices: int) -> SuiteCall:
    """The plain gate run the nightly drives, on the farm this nightly loaded and hashed."""
    workers = opts.workers if opts.workers is not None else min(n_devices, 4)
    return SuiteCall(
        tree=opts.places.source_tree(),
        farm=_farm_path(opts),
        devices=opts.devices or (f"pool:{opts.pool}",),
        results=run_dir,
        fixtures=opts.fixtures,
        faults=opts.faults,
        workers=workers,
        run_id=run_dir.name,  # the gate run is known by the nightly's own run id
    )


def pool_name(opts: NightlyOptions) -> str:
    """The name a night is recorded under: its pool, or ``device:SEL,...`` for a --device selection."""
    return "device:" + ",".join(opts.devices) if opts.devices else opts.pool


def gate_command(opts: NightlyOptions, run_dir: Path, n_devices: int) -> list[str]:
    """The gate run's command line (also what the overhead benchmark compares against)."""
    return suite_command(gate_call(opts, run_dir, n_devices))


def _empty_nightly(run_id: str, opts: NightlyOptions) -> dict[str, Any]:
    return {
        "schema": NIGHTLY_SCHEMA,
        "run": run_id,
        "pool": pool_name(opts),
        "started": None,
        "finished": None,
        "git_commit": "",
        "git_dirty": False,
        "farm_sha256": "",
        "faults": list(opts.faults),
        "engine_builds": {},
        "verdicts": False,
        "no_verdict_reason": "",
        "exit_code": EXIT_NO_VERDICT,
        "totals": {"devices": 0, "tests": 0, "passed": 0, "failed": 0, "errors": 0, "skipped": 0},
        "new_failures": [],
        "fixed": [],
        "flaky": [],
        "still_failing": [],
        "new_errors": [],
        "devices_missing": [],
        "disagreements": [],
        "disagreement_source": "none",
        "output_changes": [],
        "changed_archs": {},
        "mutation_score": None,
        "mutation_problem": "",
        "devices": {},
        "flaky_policy": {"window": opts.flaky.window, "flips": opts.flaky.flips},
    }


def device_facts_table(summary: dict[str, Any], run_dir: Path) -> dict[str, dict[str, Any]]:
    out = {}
    for name, d in summary["devices"].items():
        out[name] = {
            "arch": d["arch"],
            "os": d["os"],
            "kind": d["kind"],
            "target": d["target"],
            "engine_build_id": d["engine_build_id"],
            "pushed_bytes": d["pushed_bytes"],
            "engine_s": d["engine_s"],
            "wall_s": d["wall_s"],
            "infra_error": d["infra_error"],
            "junit": f"{name}/{JUNIT_XML}" if (run_dir / name / JUNIT_XML).is_file() else "",
            "artifacts": f"{name}/",
        }
    return out


def fill_classification(n: dict[str, Any], c: Classification) -> None:
    for key in ("new_failures", "fixed", "flaky", "still_failing", "new_errors", "devices_missing"):
        n[key] = [f.to_dict() for f in getattr(c, key)]


def decide_exit(n: dict[str, Any]) -> int:
    if not n["verdicts"]:
        return EXIT_NO_VERDICT
    return EXIT_NEW if n["new_failures"] or n["disagreements"] else EXIT_OK


def run_nightly(opts: NightlyOptions) -> NightlyResult:
    """One nightly; raises :class:`NightlyUsageError` before anything runs when the options are wrong."""
    if opts.keep is not None and opts.keep < 1:
        raise NightlyUsageError("--keep must be at least 1")
    if opts.mutant_faults:
        if not opts.mutants:
            raise NightlyUsageError("--mutants-fault needs --mutants")
        try:
            load_catalogue(places=opts.places).resolve(opts.mutant_faults)
        except CatalogueError as exc:
            raise NightlyUsageError(f"--mutants-fault: {exc}") from None
    try:
        farm = load_farm(opts.farm, opts.places)
        farm_path = _farm_path(opts)
        selected = [d.name for d in select_devices(farm, list(opts.devices))] if opts.devices else None
    except FarmError as exc:
        raise NightlyUsageError(f"--device: {exc}" if opts.devices else str(exc)) from None
    if selected is None and opts.pool not in farm.pools:
        raise NightlyUsageError(
            f"pool {opts.pool!r} is not defined in {farm_path} (pools: {', '.join(farm.pools) or 'none'})"
        )
    pool_devices = selected if selected is not None else list(farm.pools[opts.pool])
    pool = pool_name(opts)
    run_id = default_run_id()
    run_dir = opts.history / run_id
    started = time.monotonic()
    with History(opts.history) as hist:  # opened first: an unusable history stops us before the gates run
        n = _empty_nightly(run_id, opts)
        # a wheel has no git state (and git would answer for whatever repository encloses site-packages)
        tree = opts.places.checkout()
        n["git_commit"], n["git_dirty"] = _git_state(tree) if tree is not None else ("", False)
        n["farm_sha256"] = hashlib.sha256(farm_path.read_bytes()).hexdigest()
        gate_started = time.monotonic()
        meta, runs, summary = _gate_run(opts, run_dir, len(pool_devices), n)
        gate_s = time.monotonic() - gate_started
        # The history knows a run by its directory name (retention and links rely on it), which is
        # also the id the gate run was given ($BMOE_CI_RUN_ID: its run.json says the same)
        meta = replace(meta, run=run_id)
        scores: list[MutationScore] = []
        if opts.mutants and summary is not None:
            scores, n["mutation_problem"] = _run_mutants(opts, run_dir, _one_device_per_arch(runs))
        verdicts = summary is not None and any(r.outcome in ("pass", "fail") for d in runs for r in d.records)
        if summary is not None and not verdicts:
            n["no_verdict_reason"] = "no device of the pool gave a verdict"
        hist.record(
            run_record(
                meta,
                runs,
                pool=pool,
                pool_devices=pool_devices,
                git_commit=n["git_commit"],
                git_dirty=n["git_dirty"],
                farm_sha256=n["farm_sha256"],
                results_dir=str(run_dir),
                verdicts=verdicts,
                mutation_scores=tuple(scores),
                faults=tuple(sorted(set(meta.faults) | set(opts.faults))),
            )
        )
        n.update(
            started=meta.started, finished=meta.finished, engine_builds=dict(meta.engine_builds), verdicts=verdicts
        )
        if summary is not None:
            n["totals"] = summary["totals"]
            n["devices"] = device_facts_table(summary, run_dir)
            # the gate suite records the faults it built in (summary.json): never lose one from the report
            n["faults"] = sorted(set(n["faults"]) | set(summary.get("faults") or []))
        _compare_with_history(n, hist, pool, opts, summary)
        n["commit_range"] = commit_range(hist, pool, run_id, n["git_commit"], opts.places.checkout())
        if scores:
            n["mutation_score"] = {
                "caught": sum(s.caught for s in scores),
                "total": sum(s.total for s in scores),
                "devices": [vars(s) for s in scores],
            }
        n["exit_code"] = decide_exit(n)
        trend = hist.run_summaries(hist.run_ids(pool, limit=TREND_RUNS))
        histories = collect_histories(hist, pool, run_id, finding_keys(n, summary), TREND_RUNS)
        report = write_report(run_dir, n, summary, trend, runs=runs, histories=histories)
        if opts.keep is not None:
            for removed in apply_retention(opts.history, hist, opts.keep):
                _log(f"retention: removed {removed}")
        write_index(opts.history, report, _runs_on_disk(opts.history, hist))
    total_s = time.monotonic() - started
    _log(f"wall time: gate run {gate_s:.2f} s, the nightly's own work {total_s - gate_s:.2f} s")
    _log(verdict_line(n))
    return NightlyResult(n["exit_code"], report, n)


def _gate_run(
    opts: NightlyOptions, run_dir: Path, n_devices: int, n: dict[str, Any]
) -> tuple[RunMeta, list[DeviceRun], dict[str, Any] | None]:
    """Run the gate suite into *run_dir*; returns what it wrote (summary None: no verdicts, and
    ``n["no_verdict_reason"]`` says why)."""
    call = gate_call(opts, run_dir, n_devices)
    _log(f"run {run_dir.name}: {' '.join(suite_command(call))}")
    warm = threading.Thread(target=import_matplotlib, name="import-matplotlib", daemon=True)
    warm.start()  # overlaps the gate run: the report's chart then costs only its drawing
    run = run_gate_suite(call)  # its console goes to our stderr
    warm.join()
    _log(f"gate run exited {run.returncode}")
    if run.refused:
        raise NightlyUsageError(f"the gate suite refused the options (pytest exit 4, see above); run dir {run_dir}")
    run_dir.mkdir(parents=True, exist_ok=True)
    if not run.complete:
        # a summary that is there but cannot be read says so; anything else is a run that did not finish
        unreadable = run.returncode in (0, 1) and run.problem is not None and (run_dir / SUMMARY_JSON).is_file()
        n["no_verdict_reason"] = (
            str(run.problem) if unreadable else f"the gate run exited {run.returncode} without a summary"
        )
        return RunMeta(run=run_dir.name), [], None
    try:
        meta, runs = load_results(run_dir)
    except ReportError as exc:
        n["no_verdict_reason"] = str(exc)
        return RunMeta(run=run_dir.name), [], None
    return meta or RunMeta(run=run_dir.name), runs, run.summary


def _one_device_per_arch(runs: list[DeviceRun]) -> dict[str, str]:
    """The first reached device (by name) of each architecture: where the mutation catalogue runs."""
    chosen: dict[str, str] = {}
    for r in sorted(runs, key=lambda r: r.device):
        if gave_verdict(r):
            chosen.setdefault(r.arch, r.device)
    return chosen


def finding_keys(n: dict[str, Any], summary: dict[str, Any] | None) -> list[tuple[str, str]]:
    """(device, test name) of every finding of tonight and every failure or error of the gate run:
    the tests whose history the report shows."""
    keys = [(f["device"], f["name"]) for key, _, _ in CLASSES if key != "devices_missing" for f in n[key]]
    keys += [(p["device"], p["name"]) for p in (summary or {}).get("problems", [])]
    return list(dict.fromkeys(keys))


def _compare_with_history(
    n: dict[str, Any], hist: History, pool: str, opts: NightlyOptions, summary: dict[str, Any] | None
) -> None:
    """Classification and cross-device agreement of run ``n["run"]`` against the pool's earlier runs."""
    run_id = n["run"]
    previous = hist.run_ids(pool, before=run_id)
    fill_classification(
        n,
        classify(
            hist.results([run_id]),
            hist.results(previous),
            hist.devices(run_id),
            {rid: hist.devices(rid) for rid in previous},
            opts.flaky,
        ),
    )
    outs_now = hist.outputs([run_id])
    from_summary = disagreements_from_summary(summary) if summary is not None else None
    disagreements = from_summary if from_summary is not None else disagreements_from_outputs(outs_now)
    n["disagreement_source"] = "summary.json disagreements" if from_summary is not None else "per-device outputs"
    n["disagreements"] = [d.to_dict() for d in disagreements]
    changes = output_changes(outs_now, hist.outputs(previous))
    n["output_changes"] = [c.to_dict() for c in changes]
    n["changed_archs"] = changed_archs(changes)


def commit_range(hist: History, pool: str, run_id: str, commit: str, repo: Path | None) -> dict[str, Any] | None:
    """The commits since the pool's previous night: ``{previous_run, from, to, count}`` (count None when
    git cannot count them: a shallow clone lacks the older commit, or no checkout to ask, as from a
    wheel), or None on the first night."""
    previous = hist.run_ids(pool, before=run_id)
    if not previous:
        return None
    old = hist.git_commit(previous[-1])
    count = None
    if old and commit and old != commit and repo is not None:
        try:
            proc = subprocess.run(
                ["git", "-C", str(repo), "rev-list", "--count", f"{old}..{commit}"],
                capture_output=True,
                text=True,
                check=False,
                timeout=30,
            )
            if proc.returncode == 0 and proc.stdout.strip().isdigit():
                count = int(proc.stdout)
        except (OSError, subprocess.SubprocessError):
            pass
    elif old and old == commit:
        count = 0
    return {"previous_run": previous[-1], "from": old, "to": commit, "count": count}


def _runs_on_disk(history_dir: Path, hist: History) -> list[tuple[str, str]]:
    out = []
    for rid in reversed(hist.run_ids()):
        run_dir = run_dir_of(history_dir, rid)
        if run_dir is None:
            continue
        nightly = run_dir / NIGHTLY_JSON
        if nightly.is_file():
            try:
                out.append((rid, verdict_line(read_json(nightly))))
            except (ReportError, KeyError):
                out.append((rid, "(unreadable nightly.json)"))
    return out


_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,200}$")


def run_dir_of(history_dir: Path, run_id: str) -> Path | None:
    """The raw directory of a recorded run: a real directory (no symlink) directly inside the history
    directory, named by a run id of the usual characters; None for a history row that names anything
    else (``..``, a path, a symlink), which no retention ever follows."""
    if not _RUN_ID.match(run_id) or ".." in run_id:
        return None
    path = history_dir / run_id
    if path.is_symlink() or path.resolve().parent != history_dir.resolve():
        return None
    return path


def apply_retention(history_dir: Path, hist: History, keep: int) -> list[Path]:
    """Remove the raw directories of all but the newest *keep* recorded runs (history rows stay).

    Only a directory that is a direct child of *history_dir*, named after a recorded run and holding
    that run's run.json or nightly.json is removed: nothing else in the directory is touched, and a
    nightly still running (not yet recorded) is never a candidate."""
    removed = []
    ids = hist.run_ids()
    for rid in ids[: max(0, len(ids) - keep)]:
        path = run_dir_of(history_dir, rid)
        if path is None or not path.is_dir():
            continue
        if not ((path / RUN_JSON).is_file() or (path / NIGHTLY_JSON).is_file()):
            continue
        shutil.rmtree(path)
        hist.forget_results_dir(rid)
        removed.append(path)
    return removed


def import_results(history_dir: Path, results: Path, pool: str) -> str:
    """``bmoe-ci history import``: record an existing results directory (one run) in the history."""
    meta, runs = load_results(results)
    name = results.resolve().name
    meta = replace(meta, run=name) if meta else RunMeta(run=name)
    nightly = results / NIGHTLY_JSON
    if nightly.is_file():
        pool = str(read_json(nightly).get("pool", pool))
    with History(history_dir) as hist:
        hist.record(run_record(meta, runs, pool=pool, results_dir=str(results.resolve())))
    return meta.run
