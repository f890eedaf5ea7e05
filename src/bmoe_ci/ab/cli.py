"""The `bmoe-ci ab` command (registered by bmoe_ci.cli)."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any

from bmoe_ci.ab.devstate import DriftBounds
from bmoe_ci.ab.report import verdict_line, write_ab
from bmoe_ci.ab.run import DEFAULT_PROMPT, AbError, AbSpec, run_ab
from bmoe_ci.ab.stats import DEFAULT_SEED
from bmoe_ci.paths import Places

EXIT_OK, EXIT_USAGE, EXIT_NO_VERDICT = 0, 2, 3


def _error(msg: str, code: int = EXIT_USAGE) -> int:
    print(f"bmoe-ci: error: {msg}", file=sys.stderr)
    return code


def resolve_model(fixture: str | None, model: str | None, places: Places | None = None) -> Path:
    """--model FILE, or the named fixture generated into the cache (ValueError naming the problem)."""
    if model:
        p = Path(model)
        if not p.is_file():
            raise ValueError(f"--model: {model}: no such file")
        return p
    from bmoe_ci.models import SpecError, generate

    try:
        files = generate(None, names=[fixture or "qwen3moe"], places=places)
    except SpecError as exc:
        raise ValueError(f"--fixture: {exc}") from None
    return files[0].path


def parse_flags(option: str, text: str, places: Places | None = None) -> tuple[str, ...]:
    """Engine flags from a shell-quoted string, judged by the engine's validate() (`bmoe check`)."""
    from bmoe_ci.enginecheck import check_flags

    try:
        flags = tuple(shlex.split(text))
    except ValueError as exc:
        raise ValueError(f"{option}: {exc}") from None
    why = check_flags(flags, places=places)
    if why:
        raise ValueError(f"{option} {text!r}: the engine refuses it: {why}")
    return flags


def cmd_ab(args: argparse.Namespace) -> int:
    from bmoe_ci.farm import FarmError, load_farm, select_devices

    try:
        if args.rounds < 1 or args.n_predict < 2:
            raise ValueError("--rounds must be at least 1 and -n at least 2 (one decode step needs two tokens)")
        if not 0 < args.confidence < 1:
            raise ValueError(f"--confidence must be between 0 and 1 (got {args.confidence})")
        farm = load_farm(args.farm, args.places)
        devices = select_devices(farm, [args.device])
        if len(devices) != 1:
            raise ValueError(f"--device {args.device!r} selects {len(devices)} devices; an A/B runs on one")
        a, b = parse_flags("--a", args.a, args.places), parse_flags("--b", args.b, args.places)
        for k in args.sweep or ():
            if k < 1:
                raise ValueError(f"--sweep: {k} is not a width (at least 1)")
        spec = AbSpec(
            device=devices[0],
            model=resolve_model(args.fixture, args.model, args.places),
            a=a,
            b=b,
            sweep=tuple(args.sweep or ()),
            rounds=args.rounds,
            n_predict=args.n_predict,
            prompt=args.prompt,
            threads=args.threads,
            confidence=args.confidence,
            seed=args.seed,
            bounds=DriftBounds(
                max_thermal_rise_c=args.max_thermal_rise,
                max_load_per_cpu=args.max_load_per_cpu,
                max_battery_drop_pct=args.max_battery_drop,
            ),
        )
    except (FarmError, ValueError) as exc:
        return _error(str(exc))
    try:
        ab = run_ab(spec, places=args.places)
    except AbError as exc:
        return _error(f"no verdict: {exc}", EXIT_NO_VERDICT)
    out = Path(args.out) if args.out else Path("results") / f"ab-{ab['run']}"
    path = write_ab(out, ab)
    print(verdict_line(ab))
    for r in ab["refusals"]:
        print(f"  refused: {r}")
    print(path)
    return EXIT_OK if ab["verdict"] == "measured" else EXIT_NO_VERDICT


def add_ab_command(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "ab",
        help="decode speed of configurations A and B on one device, ABBA order, device state recorded",
        description=(
            "Run engine configurations A and B (and optionally A at other --n-expert-used widths) on one "
            "device in ABBA order for several rounds, reading CPU frequency and governor, thermal zones, "
            "load and battery before and after each cell. Writes ab.json and ab.md; prints the B/A speed "
            "ratio with its bootstrap interval. Exit 0: measured; 2: usage; 3: no verdict (device state "
            "drifted beyond a bound, or the device or engine failed)."
        ),
    )
    p.add_argument("--farm", metavar="FILE", help="farm YAML (default: the embedded local farm)")
    p.add_argument("--device", required=True, metavar="NAME", help="the one device to measure on")
    p.add_argument("--a", required=True, metavar="FLAGS", help="engine flags of A, one shell-quoted string")
    p.add_argument("--b", required=True, metavar="FLAGS", help="engine flags of B")
    p.add_argument(
        "--sweep",
        type=int,
        action="append",
        metavar="K",
        help="also run A with --n-expert-used K (repeatable): the matched-speed comparison",
    )
    p.add_argument("--fixture", metavar="NAME", help="fixture model (default qwen3moe)")
    p.add_argument("--model", metavar="FILE", help="a GGUF model file instead of a fixture")
    p.add_argument("--rounds", type=int, default=3, metavar="N", help="ABBA rounds (default 3)")
    p.add_argument("-n", "--n-predict", type=int, default=32, metavar="N", help="tokens per cell (default 32)")
    p.add_argument("--prompt", default=DEFAULT_PROMPT, help="the prompt text")
    p.add_argument("--threads", type=int, default=1, metavar="N", help="engine threads (default 1)")
    p.add_argument("--confidence", type=float, default=0.9, help="interval confidence (default 0.9)")
    p.add_argument("--seed", type=int, default=DEFAULT_SEED, help=f"bootstrap seed (default {DEFAULT_SEED})")
    p.add_argument(
        "--max-thermal-rise",
        type=float,
        default=DriftBounds.max_thermal_rise_c,
        metavar="C",
        help=f"°C a thermal zone may rise within a cell (default {DriftBounds.max_thermal_rise_c})",
    )
    p.add_argument(
        "--max-load-per-cpu",
        type=float,
        default=DriftBounds.max_load_per_cpu,
        metavar="X",
        help=f"1-minute load per CPU allowed (default {DriftBounds.max_load_per_cpu})",
    )
    p.add_argument(
        "--max-battery-drop",
        type=float,
        default=DriftBounds.max_battery_drop_pct,
        metavar="P",
        help=f"battery points a cell may use (default {DriftBounds.max_battery_drop_pct})",
    )
    p.add_argument("--out", metavar="DIR", help="output directory (default results/ab-<run-id>)")
    p.set_defaults(func=cmd_ab)
