"""The `bmoe-ci mutants` command: validate everything first, build, run, report.

Exit codes: 0 every fault caught, 1 a fault survived, 2 bad input (nothing was built or run),
3 no verdict (the clean engine does not pass, or a fault's run ended in an error and none survived).
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from bmoe_ci.builder import BuildError, target_for
from bmoe_ci.farm import FarmError, load_farm, select_devices
from bmoe_ci.faults import Catalogue, CatalogueError, Fault, load_catalogue
from bmoe_ci.models import SpecError, load_specs
from bmoe_ci.mutants.report import (
    MUTANTS_JSON,
    MUTANTS_SVG,
    MutantsFileError,
    compare_runs,
    console_table,
    mutants_doc,
    read_mutants,
    write_doc,
    write_mutants,
)
from bmoe_ci.mutants.run import (
    CLEAN,
    FaultResult,
    GateRunSpec,
    NoVerdict,
    build_all,
    check_clean,
    classify,
    gate_run,
)


def _say(msg: str) -> None:
    print(f"bmoe-ci mutants: {msg}", file=sys.stderr, flush=True)


def add_mutants_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("mutants", help="build each catalogued engine fault, run the gates, report which caught it")
    p.add_argument("--farm", metavar="FILE", help="farm YAML (default: the embedded local farm)")
    p.add_argument("--device", default="host", metavar="NAME", help="the one device to run on (default host)")
    p.add_argument("--fault", action="append", metavar="NAME", help="only this fault (repeatable; default: all)")
    p.add_argument(
        "--fixture",
        action="append",
        metavar="NAME",
        help="only this fixture (repeatable; default: every default fixture)",
    )
    p.add_argument(
        "--own-fixture",
        action="store_true",
        help="run each fault on its catalogue fixture only (the one that exposes it); the clean "
        "run covers all of them. For slow (emulated) devices; not with --fixture",
    )
    p.add_argument("--results", metavar="DIR", help="results directory (default results/mutants-<time>)")
    p.add_argument("--jobs", type=int, default=2, metavar="N", help="engine builds at a time (default 2)")
    p.add_argument("--rebuild", action="store_true", help="ignore the engine build cache")
    p.add_argument("--write-doc", metavar="FILE", help="also rewrite the generated fault table of FILE (docs/gates.md)")
    p.add_argument(
        "--from",
        dest="from_dir",
        metavar="DIR",
        help="run nothing: report (and --write-doc) from DIR/mutants.json of an earlier run",
    )
    p.add_argument(
        "--compare",
        metavar="DIR",
        help="with --from: the two runs side by side, fault by fault (exit 1 when a fault is caught "
        "differently, e.g. on another architecture)",
    )
    p.add_argument("--list", action="store_true", help="list the fault catalogue and exit")
    p.set_defaults(func=cmd_mutants)


def _exit_code(doc: dict) -> int:
    outcomes = [f["outcome"] for f in doc["faults"]]
    if "survived" in outcomes:
        return 1
    return 3 if "error" in outcomes else 0


def _usage(msg: str) -> int:
    print(f"bmoe-ci mutants: error: {msg}", file=sys.stderr)
    return 2


def _results_dir(raw: str | None) -> Path:
    path = Path(raw) if raw else Path("results") / time.strftime("mutants-%Y%m%d-%H%M%S")
    if path.exists() and not path.is_dir():
        raise ValueError(f"--results {path}: exists and is not a directory")
    path.mkdir(parents=True, exist_ok=True)
    probe = path / ".write-test"
    try:
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise ValueError(f"--results {path}: not writable: {exc.strerror or exc}") from None
    return path.resolve()


def cmd_mutants(args: argparse.Namespace) -> int:
    try:
        catalogue = load_catalogue(places=args.places)
        if args.list:
            for f in catalogue.faults:
                print(f"{f.name}\t{f.area}\t{f.file}\t{','.join(f.expected)}\t{f.breaks}")
            return 0
        if args.compare:
            if not args.from_dir:
                raise ValueError("--compare DIR needs --from DIR: it compares two earlier runs")
            table, same = compare_runs(read_mutants(Path(args.from_dir)), read_mutants(Path(args.compare)))
            print(table)
            return 0 if same else 1
        doc: dict[str, Any] | None
        if args.from_dir:
            doc = read_mutants(Path(args.from_dir))
        else:
            try:
                doc = _run(args, catalogue)
            except KeyboardInterrupt:
                _say("interrupted: the running gate run was stopped; no score")
                return 130
            if doc is None:
                return 3
        print(console_table(doc))
        if args.write_doc:
            write_doc(Path(args.write_doc), doc)
            _say(f"wrote the fault table of {args.write_doc}")
        return _exit_code(doc)
    except (CatalogueError, MutantsFileError, FarmError, SpecError, ValueError) as exc:
        return _usage(str(exc))


def _interrupted(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def _run(args: argparse.Namespace, catalogue: Catalogue) -> dict[str, Any] | None:
    # SIGTERM (a scheduler, `kill`) stops a run as Ctrl-C does: the gate run in progress is ended
    # cleanly (bmoe_ci.gaterun.suite), so its device lease is given back, not held until it expires
    signal.signal(signal.SIGTERM, _interrupted)
    # every input is checked before anything is built or any device is touched
    faults: list[Fault] = catalogue.resolve(args.fault) if args.fault else list(catalogue.faults)
    if args.jobs < 1:
        raise ValueError(f"--jobs {args.jobs}: must be at least 1")
    farm = load_farm(args.farm, args.places)
    devices = select_devices(farm, [args.device])
    if len(devices) != 1:
        raise ValueError(f"--device {args.device}: selects {len(devices)} devices; mutants runs on exactly one")
    device = devices[0]
    if args.own_fixture and args.fixture:
        raise ValueError("--own-fixture and --fixture: choose one (--own-fixture takes each fault's own)")
    # with --own-fixture, the clean run covers every fixture a fault will run on, in catalogue order
    fixtures = tuple(dict.fromkeys(f.fixture for f in faults)) if args.own_fixture else tuple(args.fixture or ())
    specs = load_specs(places=args.places)
    for name in fixtures:
        if name not in specs.specs:
            where = f"the catalogue's fixture {name}" if args.own_fixture else f"--fixture {name}"
            raise ValueError(f"{where}: no such fixture (known: {', '.join(specs.specs)})")
    results = _results_dir(args.results)
    spec = GateRunSpec(
        device=device.name,
        target=target_for(device),
        farm=farm.path,
        fixtures=fixtures,
        results=results,
        repo=args.places.source_tree(),
    )
    started_wall = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    started = time.monotonic()

    _say(f"{len(faults)} fault(s) on {device.name} ({device.arch}); results in {results}")
    runnable = [f for f in faults if f.runs_on(device.arch)]
    try:
        clean_build, builds = build_all(spec.target, runnable, args.jobs, args.rebuild, _say, args.places)
    except BuildError as exc:
        _say(f"no verdict: the clean engine does not build: {exc}")
        return None
    _say(f"building done in {time.monotonic() - started:.1f} s; gate run of the clean engine")
    clean_run = gate_run(spec, None, results / CLEAN)
    try:
        clean = check_clean(clean_run, device.name)
    except NoVerdict as exc:
        _say(f"no verdict: {exc}")
        return None
    _say(f"clean engine: {len(clean)} gates pass ({clean_run.seconds:.1f} s)")

    done: list[FaultResult] = []
    for i, fault in enumerate(faults, 1):
        b = builds.get(fault.name)
        if not fault.runs_on(device.arch):
            r = FaultResult(fault, "n/a", message=f"its code runs on {fault.arch} only; {device.name} is {device.arch}")
        elif isinstance(b, BuildError) or b is None:
            r = FaultResult(fault, "error", message=f"the fault does not build: {str(b).splitlines()[0]}")
        else:
            fault_spec = replace(spec, fixtures=(fault.fixture,)) if args.own_fixture else spec
            r = classify(fault, gate_run(fault_spec, fault.name, results / "faults" / fault.name), device.name)
            r.build_id = b.build_id
        done.append(r)
        caught = f" by {', '.join(r.caught_by)}" if r.caught_by else f": {r.message}"
        _say(f"[{i}/{len(faults)}] {fault.name}: {r.outcome}{caught} ({r.seconds:.1f} s)")

    doc = mutants_doc(
        device=device.name,
        arch=device.arch,
        engine_builds={
            CLEAN: {spec.target: clean_build.build_id},
            **{r.fault.name: {spec.target: r.build_id} for r in done if r.build_id},
        },
        fixtures=list(fixtures) or sorted((clean_run.summary or {}).get("fixtures", {})),
        faults=[
            {
                "name": r.fault.name,
                "area": r.fault.area,
                "caught_by": r.caught_by,
                "expected": list(r.fault.expected),
                "outcome": r.outcome,
                "message": r.message,
                "breaks": r.fault.breaks,
                "gates": r.gates,
                "seconds": round(r.seconds, 1),
                **({"fixtures": [r.fault.fixture]} if args.own_fixture else {}),
            }
            for r in done
        ],
        gates=list(clean),
        clean=clean,
        started=started_wall,
        seconds=time.monotonic() - started,
    )
    write_mutants(results, doc)
    _say(f"wrote {results / MUTANTS_JSON} and {results / MUTANTS_SVG}")
    return doc
