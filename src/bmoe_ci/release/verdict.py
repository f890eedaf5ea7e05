"""Requirements checked against evidence, and the verdict they add up to.

Each :class:`Check` is one requirement of the policy for one changed setting (and one device class
where it applies), with the measured value, the threshold and the evidence it was decided on. The
verdict: NO-GO when any check failed; otherwise NO VERDICT when any check has no usable evidence
(missing device or class, infrastructure error, drifted device state, stale evidence); otherwise GO.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

GO, NO_GO, NO_VERDICT = "GO", "NO-GO", "NO VERDICT"
EXIT = {GO: 0, NO_GO: 1, NO_VERDICT: 3}
PASS, FAIL, MISSING = "pass", "fail", "missing"


@dataclass
class Check:
    setting: str
    requirement: str  # "class", "gate G", "speed", "quality ppl", "quality agreement", "quality accuracy", "replay"
    device_class: str | None
    status: str  # pass | fail | missing
    value: Any = None
    threshold: str = ""
    detail: str = ""
    evidence: dict[str, Any] = field(default_factory=dict)  # run, device, build_id, source

    def line(self) -> str:
        where = f" on {self.device_class}" if self.device_class else ""
        ev = self.evidence
        trace = (
            f" [run {ev.get('run', '?')}, device {ev.get('device', '?')}, build {ev.get('build_id', '?')}]"
            if ev
            else ""
        )
        val = "" if self.value is None else f": {self.value}"
        thr = f" (threshold {self.threshold})" if self.threshold else ""
        det = f" - {self.detail}" if self.detail else ""
        return f"{self.setting}: {self.requirement}{where}{val}{thr}{det}{trace}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def decide(checks: list[Check], changed: bool) -> tuple[str, str]:
    """(verdict, its one-line reason)."""
    if not changed:
        return GO, "no setting changed"
    failed = [c for c in checks if c.status == FAIL]
    missing = [c for c in checks if c.status == MISSING]
    if failed:
        return NO_GO, "; ".join(c.line() for c in failed)
    if missing:
        return NO_VERDICT, "; ".join(c.line() for c in missing)
    return GO, f"all {len(checks)} requirements met"
