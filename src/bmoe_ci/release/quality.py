"""Quality evidence: the engine's instruments (docs/engine-flags.md) on the quality model, the base
settings against the proposal, on one device (the engine's outputs are byte-identical across devices,
so one device's numbers are every device's).

* ``--ppl-step TEXT``: teacher-forced, one token per decode step, so the cache and the lossy knobs act
  as in decode; the base run also writes its logits (``--logits-out``), which the proposal's run takes
  as ``--ppl-ref``: the share of positions whose argmax equals the base's is the agreement;
* ``--ppl-choices JSONL``: multiple-choice accuracy.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bmoe_ci.farm import Device, InfraError, PushItem, open_session


@dataclass
class QualityEvidence:
    device: str
    run: str
    build_id: str
    base: dict[str, Any] = field(default_factory=dict)
    proposed: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


def _json(r: Any) -> dict[str, Any]:
    try:
        out = json.loads(r.stdout.decode("utf-8", "replace"))
        return out if isinstance(out, dict) else {}
    except ValueError:
        return {}


def _fail(r: Any, what: str) -> str:
    res = _json(r)
    why = (res.get("error") or {}).get("message") if res else None
    why = why or str(r.infra or "") or r.stderr.decode("utf-8", "replace").strip()[-300:]
    return f"{what}: {why or f'exit {r.exit_code}'}"


def pick(res: dict[str, Any], *names: str) -> Any:
    """The first of ``names`` present in the result, at the top level or in a ``ppl`` / ``quality`` object."""
    for scope in (res, res.get("quality") or {}, res.get("ppl") if isinstance(res.get("ppl"), dict) else {}):
        for n in names:
            if n in scope and not isinstance(scope[n], dict):
                return scope[n]
    return None


def quality_run(
    device: Device,
    engine: Path,
    build_id: str,
    model: Path,
    text: Path,
    choices: Path | None,
    base_flags: Sequence[str],
    proposed_flags: Sequence[str],
    run_id: str,
    say: Callable[[str], None],
) -> QualityEvidence:
    ev = QualityEvidence(device.name, run_id, build_id)
    items = [PushItem(model, name=f"quality/{model.name}"), PushItem(text, name=f"quality/{text.name}")]
    if choices is not None:
        items.append(PushItem(choices, name=f"quality/{choices.name}"))
    try:
        s = open_session(
            device,
            run_id=run_id,
            engine=engine,
            build_id=build_id,
            files=items,
            progress=lambda m: say(f"{device.name}: {m}"),
        )
    except InfraError as exc:
        ev.error = str(exc)
        return ev
    with s:
        m, t = s.file(f"quality/{model.name}"), s.file(f"quality/{text.name}")
        ref = s.file(f"quality/ref-{run_id}.f32")
        timeout = device.entry_timeout * 4
        r = s.run_engine(["run", "-m", m, "--ppl-step", t, "--logits-out", ref, "--json", *base_flags], timeout)
        if not r.ok:
            ev.error = _fail(r, "base --ppl-step run")
            return ev
        ev.base = _json(r)
        r = s.run_engine(["run", "-m", m, "--ppl-step", t, "--ppl-ref", ref, "--json", *proposed_flags], timeout)
        s.run(["rm", "-f", ref], 30.0)
        if not r.ok:
            ev.error = _fail(r, "proposed --ppl-step run")
            return ev
        ev.proposed = _json(r)
        if choices is not None:
            c = s.file(f"quality/{choices.name}")
            for flags, into in ((base_flags, ev.base), (proposed_flags, ev.proposed)):
                r = s.run_engine(["run", "-m", m, "--ppl-choices", c, "--json", *flags], timeout)
                if not r.ok:
                    ev.error = _fail(r, "--ppl-choices run")
                    return ev
                into["accuracy"] = pick(_json(r), "accuracy")
    return ev
