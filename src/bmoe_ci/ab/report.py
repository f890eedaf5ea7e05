"""ab.json and ab.md of one A/B (ab.md is rendered from the same dict, so the two cannot disagree)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bmoe_ci.reports.records import atomic_write, write_json

AB_JSON = "ab.json"
AB_MD = "ab.md"


def verdict_line(ab: dict[str, Any]) -> str:
    if ab["verdict"] == "refused":
        return f"NO VERDICT: device state drifted or a ratio is missing ({len(ab['refusals'])} reason(s))"
    r = ab["ratios"]["B"]
    return (
        f"B/A decode speed {r['ratio']:.3f} ({r['confidence']:.0%} interval {r['low']:.3f} .. "
        f"{r['high']:.3f}) on {ab['device']}"
    )


def _fmt(v: Any, spec: str = ".3f") -> str:
    return "missing" if v is None else format(v, spec) if isinstance(v, float) else str(v)


def markdown(ab: dict[str, Any]) -> str:
    lines = [
        f"# bmoe-ci ab {ab['run']}",
        "",
        f"**{verdict_line(ab)}**",
        "",
        f"Device {ab['device']} ({ab['kind']}, {ab['arch']}), engine build {ab['engine_build_id']} "
        f"({ab['target']}), model {ab['model']}, -n {ab['n_predict']}, {ab['rounds']} rounds, order "
        f"{' '.join(ab['order'][: 2 * len(ab['configs'])])} ...",
        "",
    ]
    lines += [
        "| config | flags | cells | tok/s (mean) | median step ms | flash bytes/token | hit rate |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, c in ab["configs"].items():
        lines.append(
            f"| {name} | `{' '.join(c['flags']) or '(defaults)'}` | {c['cells']} | {c['tok_s_mean']:.2f} | "
            f"{_fmt(c['step_ms_median'])} | {c['flash_bytes_per_token']:.0f} | {_fmt(c['hit_rate'])} |"
        )
    lines += ["", "| ratio to A | value | interval | confidence | resamples | seed |", "|---|---|---|---|---|---|"]
    for name, r in ab["ratios"].items():
        lines.append(
            f"| {name} | {r['ratio']:.3f} | {r['low']:.3f} .. {r['high']:.3f} | {r['confidence']} | "
            f"{r['resamples']} | {r['seed']} |"
        )
    if ab["matched_speed"]:
        lines += ["", f"Matched speed: {ab['matched_speed']} is the width whose speed is closest to B's."]
    lines += [
        "",
        "## Device state",
        "",
        f"Bounds: {ab['bounds']}. Not exposed by the device (recorded as missing, not checked): "
        f"{', '.join(ab['state_missing']) or 'nothing'}.",
        "",
    ]
    lines += [
        "| cell | config | round | tok/s | load before → after | thermal max before → after | drift |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in ab["cells"]:
        tb, ta = c["before"]["thermal_c"], c["after"]["thermal_c"]
        therm = f"{max(tb.values()):.1f} → {max(ta.values()):.1f}" if tb and ta else "missing"
        lines.append(
            f"| {c['index']} | {c['config']} | {c['round']} | {c['tok_s']:.2f} | "
            f"{_fmt(c['before']['load1'], '.2f')} → {_fmt(c['after']['load1'], '.2f')} | {therm} | "
            f"{'; '.join(c['drift']) or 'none'} |"
        )
    if ab["refusals"]:
        lines += ["", "## Refused", ""] + [f"- {r}" for r in ab["refusals"]]
    return "\n".join(lines) + "\n"


def write_ab(out: Path, ab: dict[str, Any]) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / AB_JSON, ab)
    atomic_write(out / AB_MD, markdown(ab).encode("utf-8"))
    return out / AB_JSON
