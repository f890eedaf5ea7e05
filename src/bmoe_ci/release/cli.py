"""The `bmoe-ci release-gate` command (registered by bmoe_ci.cli)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from bmoe_ci.nightly.history import HistoryError
from bmoe_ci.release.evidence import EvidenceFileError
from bmoe_ci.release.gate import ReleaseOptions, ReleaseUsageError, rejudge, release_record, run_release
from bmoe_ci.release.report import verdict_line, write_release
from bmoe_ci.release.yamlfile import ReleaseConfigError

EXIT_USAGE = 2

# options that say how to gather; --rejudge gathers nothing, so giving one with it is a mistake
_GATHERING = ("base", "farm", "pool", "history", "evidence")


def cmd_release_gate(args: argparse.Namespace) -> int:
    from bmoe_ci.paths import ENV_REPO

    try:
        if args.rejudge:
            given = [f"--{k}" for k in _GATHERING if getattr(args, k) is not None]
            if given:
                raise ReleaseUsageError(f"--rejudge measures nothing: {', '.join(given)} do not apply")
            ev, verdict, out = rejudge(
                Path(args.rejudge),
                policy_file=Path(args.policy) if args.policy else None,
                proposed_file=Path(args.proposed) if args.proposed else None,
                out=Path(args.out) if args.out else None,
                places=args.places,
            )
            result = release_record(ev, verdict, policy_source=args.policy or None, rejudged=str(Path(args.rejudge)))
        else:
            if not args.proposed:
                raise ReleaseUsageError("give --proposed FILE (or --rejudge DIR)")
            repo = args.places.checkout()
            if repo is None:
                # the gate reads the base's defaults with git and writes results/ beside them: a wheel's
                # packaged tree has neither git history nor a place to write
                raise ReleaseUsageError(
                    f"release-gate needs a bmoe-ci git checkout: run it from an editable "
                    f"install of one, or set {ENV_REPO}"
                )
            opts = ReleaseOptions(
                proposed=Path(args.proposed),
                repo=repo,
                base=args.base or "HEAD",
                policy=Path(args.policy) if args.policy else None,
                farm=Path(args.farm) if args.farm else None,
                pool=args.pool or "release",
                history=Path(args.history) if args.history else None,
                out=Path(args.out) if args.out else None,
                evidence=args.evidence or "auto",
                places=args.places,
            )
            ev, verdict, out = run_release(opts)
            result = release_record(ev, verdict)
    except (ReleaseConfigError, ReleaseUsageError, EvidenceFileError, HistoryError, ValueError) as exc:
        print(f"bmoe-ci: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    page = write_release(out, result)
    print(verdict_line(result))
    for c in result["checks"]:
        if c["status"] != "pass":
            ev_ = c["evidence"] or {}
            trace = f" [run {ev_['run']}, device {ev_['device']}, build {ev_['build_id']}]" if ev_ else ""
            print(
                f"  {c['status'].upper()}: {c['setting']}: {c['requirement']}"
                f"{' on ' + c['device_class'] if c['device_class'] else ''}: "
                f"{c['value'] if c['value'] is not None else ''} {c['threshold']} {c['detail']}{trace}".rstrip()
            )
    if result["not_measured"]:
        print(f"  NOT MEASURED (a requirement had already failed): {', '.join(result['not_measured'])}")
    print(page)
    return int(result["exit_code"])


def add_release_command(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "release-gate",
        help="judge a proposed change of the app's engine defaults: GO, NO-GO or NO VERDICT",
        description=(
            "Diff a proposed ci/app-defaults.yaml against the base's, gather the evidence "
            "ci/release-policy.yaml requires for each changed setting (gate results, bmoe-ci ab speed, "
            "quality instruments, replay) on the pool's devices, and decide. Writes evidence.json, "
            "release.json, release.md and release.html; --rejudge DIR decides again on a saved "
            "evidence.json. Exit 0: GO; 1: NO-GO; 2: usage or invalid file; "
            "3: NO VERDICT."
        ),
    )
    p.add_argument("--proposed", metavar="FILE", help="the proposed settings file (required unless --rejudge)")
    p.add_argument(
        "--rejudge",
        metavar="DIR",
        help="judge the evidence an earlier run saved in DIR (evidence.json) again, without devices; "
        "under its own policy unless --policy is given; written to DIR/rejudged unless --out",
    )
    p.add_argument(
        "--base",
        default=None,
        metavar="GIT_REF",
        help="where the current defaults are read (git show REF:ci/app-defaults.yaml; default HEAD)",
    )
    p.add_argument("--policy", metavar="FILE", help="release policy (default ci/release-policy.yaml)")
    p.add_argument("--farm", metavar="FILE", help="farm YAML (default: the embedded local farm)")
    p.add_argument("--pool", default=None, help="the pool whose devices give evidence (default release)")
    p.add_argument(
        "--history",
        metavar="DIR",
        help="nightly history directory whose fresh gate results are reused (default results/nightly)",
    )
    p.add_argument(
        "--evidence",
        choices=("auto", "history", "run"),
        default=None,
        help="gate results: reuse fresh history else run (auto), history only, or always run",
    )
    p.add_argument("--out", metavar="DIR", help="output directory (default results/release-<run-id>)")
    p.set_defaults(func=cmd_release_gate)
