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

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bmoe_ci.farm import Device, InfraError, PushItem, open_session
from bmoe_ci.gaterun.engine import EngineResult, run_engine


@dataclass
class QualityEvidence:
    device: str
    run: str
    build_id: str
    reference: dict[str, Any] = field(default_factory=dict)
    base: dict[str, Any] = field(default_factory=dict)
    proposed: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


def _fail(r: EngineResult, what: str) -> str:
    return f"{what}: {r.why()}"


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
        r = run_engine(s, ["run", "-m", m, "--mmap", "--ppl-step", t, "--logits-out", ref, "--json"], timeout)
        if not r.exited_0:
            ev.error = _fail(r, "lossless reference --ppl-step run")
            return ev
        ev.reference = r.data
        for flags, into in ((base_flags, ev.base), (proposed_flags, ev.proposed)):
            r = run_engine(s, ["run", "-m", m, "--ppl-step", t, "--ppl-ref", ref, "--json", *flags], timeout)
            if not r.exited_0:
                s.run(["rm", "-f", ref], 30.0)
                ev.error = _fail(r, "--ppl-step run")
                return ev
            into.update(_scores(r.data))
        s.run(["rm", "-f", ref], 30.0)
        if choices is not None:
            c = s.file(f"quality/{choices.name}")
            for flags, into in ((base_flags, ev.base), (proposed_flags, ev.proposed)):
                r = run_engine(s, ["run", "-m", m, "--ppl-choices", c, "--json", *flags], timeout)
                if not r.exited_0:
                    ev.error = _fail(r, "--ppl-choices run")
                    return ev
                res = r.data
                into.update({k: res.get(k) for k in ("accuracy", "correct", "questions_scored")})
    return ev


SCORES = ("ppl", "nll_mean", "tokens_scored", "top1_agreement", "ref_agreement", "kl_mean")


def _scores(res: dict[str, Any]) -> dict[str, Any]:
    return {k: res.get(k) for k in SCORES} | {"counters": res.get("counters", {})}
