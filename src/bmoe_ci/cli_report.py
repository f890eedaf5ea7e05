"""`bmoe-ci report RESULTS_DIR`: re-merge, re-derive XDEV and re-summarise a results directory from disk alone.

Exit status: 0 everything passed (skips allowed), 1 any failure or error, or a run that was killed
(reconciled with its plan.json: every planned test without a result is an error "run interrupted"),
2 a bad directory (missing, no devices, an unparsable junit.xml or device.json where there is no
plan to count what it lost against: the one-line reason names the file).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

from bmoe_ci.reports import ReportError, console_matrix, exit_code, markdown, rebuild
from bmoe_ci.reports.summary import CONSOLE_WIDTH


def cmd_merge(args: argparse.Namespace) -> int:
    from bmoe_ci.nightly.merge import merge_shards

    if args.results_dir is not None or not args.out:
        print("bmoe-ci: error: --merge takes shard directories and --out DIR, no RESULTS_DIR", file=sys.stderr)
        return 2
    try:
        code, report = merge_shards([Path(d) for d in args.merge], Path(args.out), absolute=args.absolute_attachments)
    except ReportError as exc:
        print(f"bmoe-ci: error: {exc}", file=sys.stderr)
        return 2
    print(report)
    return code


def cmd_report(args: argparse.Namespace) -> int:
    if args.merge:
        return cmd_merge(args)
    if args.results_dir is None:
        print("bmoe-ci: error: give RESULTS_DIR, or --merge SHARD... --out DIR", file=sys.stderr)
        return 2
    results_dir = Path(args.results_dir)
    try:
        data = rebuild(results_dir, absolute=args.absolute_attachments)
    except ReportError as exc:
        print(f"bmoe-ci: error: {exc}", file=sys.stderr)
        return 2
    if args.format == "json":
        print(json.dumps(data, indent=2))
    elif args.format == "markdown":
        print(markdown(data), end="")
    else:
        print(console_matrix(data, shutil.get_terminal_size((CONSOLE_WIDTH, 24)).columns))
        print(f"wrote {results_dir / 'junit.xml'}, summary.md, summary.json, matrix.svg", file=sys.stderr)
    return exit_code(data)


def add_report_command(subparsers: Any) -> argparse.ArgumentParser:
    """Register `report` on the `bmoe-ci` sub-command parser (``parser.add_subparsers(...)``)."""
    p = subparsers.add_parser(
        "report",
        help="merge per-device JUnit and write the summary (markdown, JSON, picture) of a results directory",
        description=(
            "Rebuild results/<run>/junit.xml, summary.md, summary.json and matrix.svg from the device "
            "directories (device.json, junit.xml) and print the device x gate matrix. A killed run is "
            "reconciled with its plan.json: every planned test without a result counts as an error "
            "'run interrupted'. Exit 0 when everything passed, 1 on any failure or error or an "
            "interrupted run, 2 on a bad directory."
        ),
    )
    p.add_argument("results_dir", metavar="RESULTS_DIR", nargs="?", help="one run's directory, e.g. results/<run-id>")
    p.add_argument(
        "--merge",
        nargs="+",
        metavar="SHARD",
        help="merge these shards' run directories (nightly or gate runs) into one report in --out; prints "
        "the report's path; exit as a nightly (0, 1 new failure or disagreement, 2 bad shard, 3 no verdicts)",
    )
    p.add_argument("--out", metavar="DIR", help="with --merge: the merged run's directory (new or empty)")
    p.add_argument(
        "--format",
        choices=("matrix", "markdown", "json"),
        default="matrix",
        help="what to print on stdout (default: the compact matrix); the files are written either way",
    )
    p.set_defaults(func=cmd_report)
    return p
