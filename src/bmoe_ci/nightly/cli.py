"""The `bmoe-ci nightly` and `bmoe-ci history` commands (registered by bmoe_ci.cli)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from bmoe_ci.nightly.classify import FlakyPolicy
from bmoe_ci.nightly.history import HistoryError
from bmoe_ci.nightly.run import EXIT_USAGE, NightlyOptions, NightlyUsageError, import_results, run_nightly
from bmoe_ci.reports import ReportError

DEFAULT_HISTORY = Path("results") / "nightly"
DEFAULT_POOL = "nightly"


def _error(msg: str) -> int:
    print(f"bmoe-ci: error: {msg}", file=sys.stderr)
    return EXIT_USAGE


def cmd_nightly(args: argparse.Namespace) -> int:
    try:
        if args.device and args.pool is not None:
            return _error("--device and --pool: give one (--device SEL runs those devices instead of a pool)")
        opts = NightlyOptions(
            history=Path(args.history),
            pool=args.pool or DEFAULT_POOL,
            devices=tuple(args.device or ()),
            farm=Path(args.farm) if args.farm else None,
            fixtures=tuple(args.fixture or ()),
            faults=tuple(args.fault or ()),
            mutants=args.mutants,
            mutant_faults=tuple(args.mutants_fault or ()),
            keep=args.keep,
            workers=args.workers,
            flaky=FlakyPolicy(window=args.flaky_window, flips=args.flaky_flips),
            places=args.places,
        )
        result = run_nightly(opts)
    except (NightlyUsageError, HistoryError, ValueError) as exc:
        return _error(str(exc))
    print(result.report)
    return result.exit_code


def cmd_history_import(args: argparse.Namespace) -> int:
    try:
        for results in args.results_dirs:
            run_id = import_results(Path(args.history), Path(results), args.pool)
            print(f"{run_id}\t{results}")
    except (ReportError, HistoryError) as exc:
        return _error(str(exc))
    return 0


def add_nightly_commands(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "nightly",
        help="run the gate suite on a pool, record it in the history, classify against earlier runs, report",
        description=(
            "Run every gate on every reachable device of a pool, or of a --device selection (the gate "
            "suite, as `pytest gates --bmoe-device pool:P`), store the run under DIR/<run-id>/, record it "
            "in DIR/history.sqlite, "
            "classify each result against earlier runs and write nightly.json, report.md and report.html. "
            "Prints the report's path last. Exit 0: no new failure and no cross-device disagreement; "
            "1: there is one; 2: usage or configuration error; 3: no verdicts."
        ),
    )
    p.add_argument("--farm", metavar="FILE", help="farm YAML (default: the embedded local farm)")
    p.add_argument("--pool", default=None, help=f"the pool to run (default: {DEFAULT_POOL})")
    p.add_argument(
        "--device",
        action="append",
        metavar="SEL",
        help="run these devices instead of a pool: NAME, a,b, pool:NAME, arch:A, label:L, kind:K, os:O or all, "
        "as the gate suite's --bmoe-device (repeatable); the history keeps the night as pool device:SEL",
    )
    p.add_argument(
        "--history",
        metavar="DIR",
        default=str(DEFAULT_HISTORY),
        help=f"history directory: runs, history.sqlite, index.html (default: {DEFAULT_HISTORY})",
    )
    p.add_argument(
        "--fixture",
        action="append",
        metavar="NAME",
        help="only this fixture (repeatable; default: every default fixture)",
    )
    p.add_argument(
        "--mutants",
        action="store_true",
        help="also run the mutation catalogue (bmoe-ci mutants) on one device per architecture",
    )
    p.add_argument(
        "--mutants-fault",
        action="append",
        metavar="NAME",
        help="with --mutants: only this fault of the catalogue (repeatable; default: every fault)",
    )
    p.add_argument("--keep", type=int, metavar="N", help="keep the raw directories of the last N runs only")
    p.add_argument(
        "--workers",
        "-n",
        type=int,
        metavar="N",
        help="pytest-xdist workers (default: one per device of the pool, at most 4)",
    )
    p.add_argument(
        "--fault",
        action="append",
        metavar="NAME",
        help="build the engine with fault BMOE_FAULT_<NAME> (to rehearse a failing night; recorded in nightly.json)",
    )
    p.add_argument(
        "--flaky-window",
        type=int,
        default=FlakyPolicy.window,
        metavar="N",
        help=f"runs looked at for flakiness (default {FlakyPolicy.window})",
    )
    p.add_argument(
        "--flaky-flips",
        type=int,
        default=FlakyPolicy.flips,
        metavar="K",
        help=f"pass/fail flips with one engine build that make a test flaky (default {FlakyPolicy.flips})",
    )
    p.set_defaults(func=cmd_nightly)

    h = subparsers.add_parser("history", help="the nightly history store")
    hsub = h.add_subparsers(dest="history_command", required=True, metavar="SUBCOMMAND")
    imp = hsub.add_parser("import", help="record existing results directories in the history")
    imp.add_argument("results_dirs", nargs="+", metavar="RESULTS_DIR", help="one run's directory each")
    imp.add_argument(
        "--history", metavar="DIR", default=str(DEFAULT_HISTORY), help=f"history directory (default: {DEFAULT_HISTORY})"
    )
    imp.add_argument("--pool", default="imported", help="pool recorded for runs without nightly.json")
    imp.set_defaults(func=cmd_history_import)
