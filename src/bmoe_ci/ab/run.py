"""Running an A/B on one device: lease it, push the engine and the model, run the cells in ABBA order
(round r runs the configurations forward, then backward: A B B A, or A B S1 S1 B A with a sweep), read
the device state before and after each cell, and summarise."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bmoe_ci.ab.devstate import DeviceState, DriftBounds, drift, read_state
from bmoe_ci.ab.stats import DEFAULT_SEED, RatioCI, ratio_ci, tok_s
from bmoe_ci.farm import Device, InfraError, PushItem, default_run_id, open_session
from bmoe_ci.gaterun.engine import run_engine
from bmoe_ci.paths import Places

AB_SCHEMA = "bmoe-ci.ab/1"
DEFAULT_PROMPT = "The quick brown fox jumps over the lazy dog. Once upon a time"


class AbError(Exception):
    """An A/B could not be measured (engine refused a configuration, device unreachable): no verdict."""


@dataclass(frozen=True)
class AbSpec:
    """What to measure. ``a`` and ``b`` are engine run flags; ``sweep`` are ``--n-expert-used`` values
    run as extra configurations ``A@kK`` (A with that width) for the matched-speed comparison."""

    device: Device
    model: Path
    a: tuple[str, ...]
    b: tuple[str, ...]
    sweep: tuple[int, ...] = ()
    rounds: int = 3
    n_predict: int = 32
    prompt: str = DEFAULT_PROMPT
    threads: int = 1
    bounds: DriftBounds = field(default_factory=DriftBounds)
    confidence: float = 0.9
    seed: int = DEFAULT_SEED


def configurations(spec: AbSpec) -> list[tuple[str, tuple[str, ...]]]:
    return [("A", spec.a), ("B", spec.b), *((f"A@k{k}", (*spec.a, "--n-expert-used", str(k))) for k in spec.sweep)]


def cell_order(names: Sequence[str], rounds: int) -> list[tuple[int, str]]:
    """(round, configuration) in run order: each round forward then backward (ABBA)."""
    order = [*names, *reversed(names)]
    return [(r, name) for r in range(rounds) for name in order]


def _say(msg: str) -> None:
    print(f"bmoe-ci ab: {msg}", file=sys.stderr, flush=True)


def run_ab(
    spec: AbSpec,
    *,
    run_id: str | None = None,
    results_dir: Path | None = None,
    build: Callable[[Device], Any] | None = None,
    say: Callable[[str], None] = _say,
    places: Places | None = None,
) -> dict[str, Any]:
    """Measure; return the ab.json content. Raises :class:`AbError` when nothing can be measured.
    ``build`` (default: the builder, with ``places``) gives the engine for the device."""
    from bmoe_ci.builder import build as build_target
    from bmoe_ci.builder import target_for

    run_id = run_id or default_run_id()
    b = build(spec.device) if build else build_target(target_for(spec.device), places=places)
    configs = configurations(spec)
    order = cell_order([n for n, _ in configs], spec.rounds)
    flags = dict(configs)
    cells: list[dict[str, Any]] = []
    try:
        session = open_session(
            spec.device,
            run_id=run_id,
            results_dir=results_dir,
            engine=b.path,
            build_id=b.build_id,
            files=[PushItem(spec.model, name=f"ab/{spec.model.name}")],
            progress=lambda m: say(f"{spec.device.name}: {m}"),
        )
    except InfraError as exc:
        raise AbError(f"{spec.device.name}: {exc}") from None
    with session:
        model = session.file(f"ab/{spec.model.name}")
        for i, (rnd, name) in enumerate(order):
            argv = [
                "run",
                "-m",
                model,
                "-p",
                spec.prompt,
                "-n",
                str(spec.n_predict),
                "-t",
                str(spec.threads),
                "--json",
                *flags[name],
            ]
            before = read_state(session.run)
            r = run_engine(session, argv, spec.device.entry_timeout)
            after = read_state(session.run)
            if r.infra is not None:
                raise AbError(f"{spec.device.name}: cell {i} ({name}, round {rnd + 1}): {r.infra}")
            if not r.clean:
                raise AbError(
                    f"{spec.device.name}: cell {i} ({name}, round {rnd + 1}): engine failed "
                    f"(exit {r.exit_code}, signal {r.crashed}): {r.why(500)}"
                )
            cells.append(_cell(i, rnd, name, flags[name], r.data, before, after, spec.bounds))
            say(f"cell {i + 1}/{len(order)} {name}: {cells[-1]['tok_s']:.1f} tok/s")
        engine_build = session.engine_version.build if session.engine_version else b.build_id
    return summarise(spec, cells, run_id=run_id, build_id=engine_build, target=b.target)


def _cell(
    i: int,
    rnd: int,
    name: str,
    flags: Sequence[str],
    res: dict[str, Any],
    before: DeviceState,
    after: DeviceState,
    bounds: DriftBounds,
) -> dict[str, Any]:
    steps = [float(x) for x in res["timing"].get("decode_step_s", [])]
    c = res["counters"]
    evaluated = len(res["prompt_tokens"]) + len(steps)
    looked_up = c["cache_hits"] + c["cache_misses"]
    return {
        "index": i,
        "round": rnd + 1,
        "config": name,
        "flags": list(flags),
        "decode_step_s": steps,
        "tok_s": tok_s(steps),
        "decode_steps": len(steps),
        "tokens": res["tokens"],
        "counters": c,
        "flash_bytes_per_token": c["flash_bytes"] / evaluated if evaluated else 0.0,
        "hit_rate": c["cache_hits"] / looked_up if looked_up else None,
        "before": before.to_dict(),
        "after": after.to_dict(),
        "drift": drift(before, after, bounds),
    }


def summarise(spec: AbSpec, cells: list[dict[str, Any]], *, run_id: str, build_id: str, target: str) -> dict[str, Any]:
    """ab.json: every cell, per-configuration figures, the ratio B/A with its interval (and each sweep
    configuration's ratio to A), and the verdict: ``measured``, or ``refused`` with the drifted cells."""
    names = [n for n, _ in configurations(spec)]
    per: dict[str, dict[str, Any]] = {}
    for name in names:
        mine = [c for c in cells if c["config"] == name]
        steps = [s for c in mine for s in c["decode_step_s"]]
        rates = [c["hit_rate"] for c in mine if c["hit_rate"] is not None]
        per[name] = {
            "flags": list(dict(configurations(spec))[name]),
            "cells": len(mine),
            "tok_s": [c["tok_s"] for c in mine],
            "tok_s_mean": sum(c["tok_s"] for c in mine) / len(mine) if mine else 0.0,
            "step_ms_median": 1000 * sorted(steps)[len(steps) // 2] if steps else None,
            "flash_bytes_per_token": sum(c["flash_bytes_per_token"] for c in mine) / len(mine) if mine else 0.0,
            "hit_rate": sum(rates) / len(rates) if rates else None,
        }
    refusals = [f"cell {c['index']} ({c['config']}, round {c['round']}): {why}" for c in cells for why in c["drift"]]
    ratios: dict[str, dict[str, Any]] = {}
    for name in names[1:]:
        try:
            ci: RatioCI = ratio_ci(per["A"]["tok_s"], per[name]["tok_s"], confidence=spec.confidence, seed=spec.seed)
            ratios[name] = ci.to_dict()
        except ValueError as exc:
            refusals.append(f"{name}: {exc}")
    matched = None
    if spec.sweep and "B" in per:
        matched = min(
            (n for n in names if n.startswith("A@k")), key=lambda n: abs(per[n]["tok_s_mean"] - per["B"]["tok_s_mean"])
        )
    missing = sorted({m for c in cells for s in (c["before"], c["after"]) for m in s["missing"]})
    return {
        "schema": AB_SCHEMA,
        "run": run_id,
        "device": spec.device.name,
        "kind": spec.device.kind,
        "arch": spec.device.arch,
        "target": target,
        "engine_build_id": build_id,
        "model": spec.model.name,
        "prompt": spec.prompt,
        "n_predict": spec.n_predict,
        "rounds": spec.rounds,
        "order": [c["config"] for c in cells],
        "bounds": vars(spec.bounds),
        "state_missing": missing,
        "configs": per,
        "ratios": ratios,
        "matched_speed": matched,
        "verdict": "refused" if refusals else "measured",
        "refusals": refusals,
        "cells": cells,
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
