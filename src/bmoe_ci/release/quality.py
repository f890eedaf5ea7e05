"""Quality evidence: the engine's instruments (docs/engine-flags.md, scoring) on the quality model, the
base settings against the proposal, on one device (scores are byte-identical across devices and
architectures, so one device's numbers are every device's).

* a lossless reference run (``--mmap --ppl-step TEXT --logits-out REF``);
* base and proposal ``--ppl-step TEXT --ppl-ref REF``: teacher-forced, one token per decode step, so the
  cache and the lossy knobs act as in decode. They give ``ppl`` and ``ref_agreement``, the share of
  positions whose argmax equals the lossless reference's (the next-token agreement), and ``kl_mean``;
* base and proposal ``--ppl-choices JSONL``: multiple-choice ``accuracy``.
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
    reference: dict[str, Any] = field(default_factory=dict)
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
        r = s.run_engine(["run", "-m", m, "--mmap", "--ppl-step", t, "--logits-out", ref, "--json"], timeout)
        if not r.ok:
            ev.error = _fail(r, "lossless reference --ppl-step run")
            return ev
        ev.reference = _json(r)
        for flags, into in ((base_flags, ev.base), (proposed_flags, ev.proposed)):
            r = s.run_engine(["run", "-m", m, "--ppl-step", t, "--ppl-ref", ref, "--json", *flags], timeout)
            if not r.ok:
                s.run(["rm", "-f", ref], 30.0)
                ev.error = _fail(r, "--ppl-step run")
                return ev
            into.update(_scores(_json(r)))
        s.run(["rm", "-f", ref], 30.0)
        if choices is not None:
            c = s.file(f"quality/{choices.name}")
            for flags, into in ((base_flags, ev.base), (proposed_flags, ev.proposed)):
                r = s.run_engine(["run", "-m", m, "--ppl-choices", c, "--json", *flags], timeout)
                if not r.ok:
                    ev.error = _fail(r, "--ppl-choices run")
                    return ev
                res = _json(r)
                into.update({k: res.get(k) for k in ("accuracy", "correct", "questions_scored")})
    return ev


SCORES = ("ppl", "nll_mean", "tokens_scored", "top1_agreement", "ref_agreement", "kl_mean")


def _scores(res: dict[str, Any]) -> dict[str, Any]:
    return {k: res.get(k) for k in SCORES} | {"counters": res.get("counters", {})}
