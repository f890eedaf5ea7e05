"""The evidence of one release-gate run, as gathered and before it is judged (``evidence.json``).

Gathering (:mod:`~bmoe_ci.release.gather`) fills an :class:`Evidence`; :func:`~bmoe_ci.release.judge.judge`
reads only this record, so an earlier run's verdict can be re-derived from its file
(``bmoe-ci release-gate --rejudge DIR``). Every measurement says where it came from: the device, the
run id (a nightly's id and start for history rows, the gate run's, the A/B's, the traced run's, the
instruments'), the engine build and the fixture it was measured on.

Schema ``bmoe-ci.release-evidence/1``; a file of another schema is refused, never guessed at.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from bmoe_ci import inputs
from bmoe_ci.release.policy import PolicyFile
from bmoe_ci.release.settings import Settings

EVIDENCE_SCHEMA: Final = "bmoe-ci.release-evidence/1"
EVIDENCE_JSON = "evidence.json"


class _Record(BaseModel):
    # no NaN or infinity, as a number or as a string: a NaN compares false with every bound
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class GateRecord(_Record):
    """The gate outcomes of one device (gate -> pass / fail / error / skip) and where they come from."""

    device: str
    run: str
    build_id: str
    source: Literal["history", "gate run"]
    fixtures: tuple[str, ...]  # the fixtures the outcomes were measured on
    started: str | None = None  # the run's start: for history rows, the nightly's date
    gates: dict[str, str] = Field(default_factory=dict)
    infra_error: str | None = None


class Refusal(_Record):
    """Gate results found and not used (another build, too old, another fixture), with the reason."""

    device: str
    run: str
    reason: str


class SpeedRecord(_Record):
    """One `bmoe-ci ab` of the base's evaluation flags (A) against the proposal's (B)."""

    device_class: str
    device: str
    run: str = ""
    build_id: str = ""
    fixture: str
    verdict: Literal["measured", "refused", "error"]
    a_tok_s: tuple[float, ...] = ()
    b_tok_s: tuple[float, ...] = ()
    seed: int = 0
    refusals: tuple[str, ...] = ()  # drifted device state
    error: str | None = None  # nothing measured (AbError)
    ab: dict[str, Any] = Field(default_factory=dict)  # the whole ab.json, for the report


class ReplayRecord(_Record):
    device: str
    run: str
    build_id: str
    fixture: str
    mismatches: tuple[str, ...] = ()
    rows: int = 0
    error: str | None = None


class QualityRecord(_Record):
    """The instruments' scores; ``error`` when they could not be measured (``device`` is then empty when
    no run started, e.g. no reachable device or no held-out text)."""

    device: str = ""
    run: str = ""
    build_id: str = ""
    fixture: str
    reference: dict[str, Any] = Field(default_factory=dict)
    base: dict[str, Any] = Field(default_factory=dict)
    proposed: dict[str, Any] = Field(default_factory=dict)
    error: str | None = None


class FlagSets(_Record):
    """The engine flags compared (all from :func:`bmoe_ci.release.settings.flags`)."""

    base: tuple[str, ...]
    proposed: tuple[str, ...]
    base_eval: tuple[str, ...]
    proposed_eval: tuple[str, ...]


class Evidence(_Record):
    """Everything a verdict is derived from. Fields that gathering has not reached yet are empty; the
    names in ``not_measured`` were skipped because a requirement had already failed."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, allow_inf_nan=False)

    schema_: Literal["bmoe-ci.release-evidence/1"] = Field(EVIDENCE_SCHEMA, alias="schema")
    run: str
    started: str
    finished: str | None = None
    base: Settings
    base_source: str
    proposal: Settings
    proposal_source: str
    policy: PolicyFile  # the policy it was gathered for (a re-judge uses it unless given another)
    policy_source: str
    fixture: str  # the policy's evaluation.speed_fixture: gate results, A/Bs and replays are on it
    quality_fixture: str
    pool: str
    farm: str | None = None
    evidence_mode: str = "auto"
    flags: FlagSets
    engine_builds: dict[str, str] = Field(default_factory=dict)  # target -> build id
    classes: dict[str, tuple[str, ...]] = Field(default_factory=dict)  # required class -> pool devices
    reached: tuple[str, ...] = ()  # devices that answered (a gate run or a probe)
    unreachable: dict[str, str] = Field(default_factory=dict)  # device -> why not
    gates: dict[str, GateRecord] = Field(default_factory=dict)
    refused: tuple[Refusal, ...] = ()
    speed: dict[str, SpeedRecord] = Field(default_factory=dict)  # per class
    replay: dict[str, ReplayRecord] = Field(default_factory=dict)  # per class
    quality: QualityRecord | None = None
    not_measured: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)


class EvidenceFileError(ValueError):
    """An evidence file that cannot be read or is not of this schema (exit 2): one line."""


def save_evidence(out: Path, ev: Evidence) -> Path:
    from bmoe_ci.reports.records import write_json

    out.mkdir(parents=True, exist_ok=True)
    path = out / EVIDENCE_JSON
    write_json(path, ev.to_json())
    return path


def load_evidence(directory: Path) -> Evidence:
    """The evidence of an earlier run (``DIR/evidence.json``)."""
    path = directory / EVIDENCE_JSON
    try:
        raw = inputs.read_json(path, what="evidence file")  # no NaN or infinity: it would pass a bound
    except inputs.InputError as exc:
        raise EvidenceFileError(str(exc)) from None
    if not isinstance(raw, dict) or raw.get("schema") != EVIDENCE_SCHEMA:
        got = raw.get("schema") if isinstance(raw, dict) else type(raw).__name__
        raise EvidenceFileError(f"{path}: schema {got!r} is not {EVIDENCE_SCHEMA}")
    try:
        return Evidence.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise EvidenceFileError(f"{path}: {where}: {first['msg']} ({exc.error_count()} problem(s))") from None
