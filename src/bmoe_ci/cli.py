"""`bmoe-ci`: the command line scripts and CI call (README, Commands).

Every command exits non-zero with a one-line reason on bad input and shows progress on stderr.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from bmoe_ci.ab.cli import add_ab_command
from bmoe_ci.builder import TARGETS, BuildError, build
from bmoe_ci.cli_farm import add_farm_commands
from bmoe_ci.cli_report import add_report_command
from bmoe_ci.mutants.command import add_mutants_command
from bmoe_ci.nightly.cli import add_nightly_commands
from bmoe_ci.origin import foreign_checkout_warning, version_line
from bmoe_ci.paths import Places
from bmoe_ci.release.cli import add_release_command
from bmoe_ci.reports.junit import absolute_attachments


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit 2."""


class VersionAction(argparse.Action):
    """`--version`: computed only when asked (it may run git), printed on stdout, exit 0."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, **kwargs: object) -> None:
        super().__init__(
            option_strings,
            dest,
            nargs=0,
            default=argparse.SUPPRESS,
            help="print the version and where bmoe-ci runs from (checkout and commit, or wheel)",
        )

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        print(version_line(getattr(namespace, "places", Places())))
        parser.exit(0)


def cmd_build(args: argparse.Namespace) -> int:
    targets = args.target or ["host"]
    for target in targets:
        result = build(target, rebuild=args.rebuild, places=args.places)
        state = "compiled" if result.compiled else "cached"
        print(f"{result.target}\t{result.build_id}\t{result.path}\t{state}")
    return 0


def cmd_fixtures(args: argparse.Namespace) -> int:
    from bmoe_ci.models import SpecError, generate, load_specs

    try:
        specs = load_specs(args.specs, args.places)
        if args.list:
            for spec in specs.specs.values():
                flag = "default" if spec.default else "-"
                print(f"{spec.name}\t{spec.arch}\t{spec.dtype}\t{flag}\t{spec.description}")
            return 0
        names = list(specs.specs) if args.all else args.name or None
        out = Path(args.out) if args.out else None
        for fixture in generate(out, names=names, specs_path=args.specs, places=args.places):
            print(f"{fixture.name}\t{fixture.path}\t{fixture.sha256}")
    except SpecError as exc:
        raise UsageError(str(exc)) from exc
    return 0


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bmoe-ci", description="Test-and-gate CI for the bmoe on-device MoE engine.")
    parser.add_argument("--version", action=VersionAction)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("build", help="build the engine; prints target, build id, binary path")
    p.add_argument(
        "--target",
        action="append",
        choices=["host", *TARGETS],
        help="the target to build (default host); repeatable",
    )
    p.add_argument("--rebuild", action="store_true", help="ignore the build cache")
    p.set_defaults(func=cmd_build)

    p = sub.add_parser("fixtures", help="generate the fixture models; prints name, path, sha256")
    p.add_argument("--out", help="output directory (default: the cache)")
    p.add_argument("--name", action="append", help="only this fixture; repeatable")
    p.add_argument("--all", action="store_true", help="every specified fixture, not only the defaults")
    p.add_argument("--list", action="store_true", help="list the specified fixtures and exit")
    p.add_argument("--specs", help="specification file (default: <repo>/fixtures/fixtures.yaml)")
    p.set_defaults(func=cmd_fixtures)

    add_farm_commands(sub)
    add_report_command(sub)
    add_nightly_commands(sub)
    add_mutants_command(sub)
    add_ab_command(sub)
    add_release_command(sub)
    return parser


def warn_if_foreign_checkout() -> None:
    """The second-clone warning (bmoe_ci.origin), on stderr, before anything runs."""
    try:
        cwd = Path.cwd()
    except OSError:  # the working directory was removed
        return
    message = foreign_checkout_warning(cwd)
    if message:
        print(message, file=sys.stderr, flush=True)


def environment_defaults(environ: Mapping[str, str]) -> dict[str, object]:
    """What the environment says, as the argument values every command reads (``args.places``,
    ``args.absolute_attachments``): ``parser.set_defaults(**environment_defaults(os.environ))``."""
    return {"places": Places.from_environ(environ), "absolute_attachments": absolute_attachments(environ)}


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    """`bmoe-ci ARGV`. The environment (default ``os.environ``) is read here, once, and handed to every
    command as values on its arguments."""
    warn_if_foreign_checkout()
    parser = make_parser()
    parser.set_defaults(**environment_defaults(os.environ if environ is None else environ))
    args = parser.parse_args(argv)
    try:
        status = int(args.func(args))
        sys.stdout.flush()
        return status
    except BrokenPipeError:
        # `bmoe-ci farm status | head`: the reader left; stop quietly, like a tool killed by SIGPIPE
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except (UsageError, BuildError, ValueError, FileNotFoundError) as exc:
        print(f"bmoe-ci: error: {exc}", file=sys.stderr)
        return 2 if not isinstance(exc, BuildError) else 1


if __name__ == "__main__":
    sys.exit(main())
